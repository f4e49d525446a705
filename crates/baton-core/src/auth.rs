//! The auth store (etcd's `auth/store.go`): users, roles with key-range permissions, the
//! enabled flag, the auth revision and the simple tokens, all replicated; and the pure
//! permission check over them (etcd's `range_perm_cache.go`).
//!
//! What is *not* here, so the core stays deterministic: bcrypt hashing and password checks
//! (the server hashes before proposing and compares against [`User::password_hash`]), the
//! random part of a simple token (the server draws it, the entry's index completes it), JWT
//! signing and every clock (a simple token's TTL is kept by each member's server).
//!
//! Permission checks go through [`UserPerms`], a per-user union of every granted interval,
//! merged and sorted, rebuilt whenever users or roles change (as etcd refreshes its cache on
//! every auth write). A check is two binary searches, never a scan over roles or keys.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// etcd's root user and role: the root role may do everything, and auth can only be enabled
/// while a root user holding it exists.
pub const ROOT: &str = "root";

/// Simple tokens kept at most; the oldest is dropped beyond it (its holder gets etcd's
/// "invalid auth token" and authenticates again, as etcd's clients do on their own). Each
/// `Authenticate` adds one, and etcdctl authenticates once per invocation, so the bound is
/// what keeps the table (and every snapshot) from growing without end.
pub const MAX_SIMPLE_TOKENS: usize = 100_000;

/// etcd's `authpb.Permission.Type` (READ = 0, WRITE = 1, READWRITE = 2).
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PermType {
    Read,
    Write,
    ReadWrite,
}

impl PermType {
    fn reads(self) -> bool {
        matches!(self, PermType::Read | PermType::ReadWrite)
    }
    fn writes(self) -> bool {
        matches!(self, PermType::Write | PermType::ReadWrite)
    }
}

/// One key permission of a role, with etcd's range conventions: an empty `range_end` is the
/// single key, `[0]` is every key from `key` on, anything else `[key, range_end)`.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permission {
    pub perm_type: PermType,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

impl Permission {
    /// Whether the range is one etcd 3.5 accepts in a grant: a key, from-key, or a range
    /// whose end lies after its start (a reversed range would silently grant nothing).
    pub fn is_valid_range(&self) -> bool {
        self.range_end.is_empty()
            || self.range_end.as_slice() == [0]
            || self.key.as_slice() < self.range_end.as_slice()
    }
}

/// A user. `password_hash` is bcrypt's output (made by the server); `None` is etcd's
/// `no_password` option: such a user cannot authenticate with a password, only by a client
/// certificate's common name.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub password_hash: Option<String>,
    pub roles: BTreeSet<String>,
}

/// A role: its permissions sorted by key (etcd's order in `RoleGet`), at most one per
/// `(key, range_end)`.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Role {
    pub perms: Vec<Permission>,
}

/// A simple token as stored: the token is `<prefix>.<index>`, where `index` (the key of the
/// token table) is the command index of the `Authenticate` that issued it.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimpleToken {
    pub prefix: String,
    pub user: String,
}

/// Everything of the auth store that snapshots hold.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    pub enabled: bool,
    /// etcd's auth revision: 1 for a new store, +1 per change of users, roles or the flag
    /// (enabling excepted, as in etcd).
    pub revision: u64,
    pub users: BTreeMap<String, User>,
    pub roles: BTreeMap<String, Role>,
    pub tokens: BTreeMap<u64, SimpleToken>,
}

impl Default for AuthState {
    fn default() -> Self {
        AuthState {
            enabled: false,
            revision: 1,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
            tokens: BTreeMap::new(),
        }
    }
}

/// A change of the auth store, as replicated (etcd's `InternalRaftRequest` auth members).
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthCommand {
    Enable,
    Disable,
    /// The password was checked by the proposing server; `simple_token_prefix` is the
    /// random part of a simple token (`None` with JWT tokens, which the server signs).
    Authenticate {
        name: String,
        simple_token_prefix: Option<String>,
    },
    /// `password_hash: None` is etcd's `no_password`.
    UserAdd {
        name: String,
        password_hash: Option<String>,
    },
    UserDelete {
        name: String,
    },
    UserChangePassword {
        name: String,
        password_hash: String,
    },
    UserGrantRole {
        user: String,
        role: String,
    },
    UserRevokeRole {
        name: String,
        role: String,
    },
    RoleAdd {
        name: String,
    },
    RoleDelete {
        name: String,
    },
    RoleGrantPermission {
        name: String,
        perm: Permission,
    },
    RoleRevokePermission {
        role: String,
        key: Vec<u8>,
        range_end: Vec<u8>,
    },
}

impl AuthCommand {
    /// Whether etcd requires the root role for it once auth is enabled
    /// (`needAdminPermission`): everything but `Authenticate`.
    pub fn needs_admin(&self) -> bool {
        !matches!(self, AuthCommand::Authenticate { .. })
    }

    /// Whether applying it can grow the store (what a `NoSpace` alarm refuses). Deletions,
    /// revocations, the flag and `Authenticate` stay allowed: an operator must be able to
    /// log in to make room, and tokens are bounded by [`MAX_SIMPLE_TOKENS`].
    pub fn adds_data(&self) -> bool {
        matches!(
            self,
            AuthCommand::UserAdd { .. }
                | AuthCommand::UserChangePassword { .. }
                | AuthCommand::UserGrantRole { .. }
                | AuthCommand::RoleAdd { .. }
                | AuthCommand::RoleGrantPermission { .. }
        )
    }
}

/// What an [`AuthCommand`] returns.
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthResponse {
    /// Every change but `Authenticate`: the auth revision after it.
    Changed { revision: u64 },
    /// `token`: the simple token issued (`None` with JWT); `revision`: the auth revision the
    /// token was issued at (what a JWT carries).
    Authenticated {
        token: Option<String>,
        revision: u64,
    },
}

/// The auth store's refusals, each one of etcd's `rpctypes` errors (the server's table says
/// them in etcd's words).
///
/// Persisted: see [`crate::format`] (variants append-only; answers cached in snapshots hold
/// them inside `KvError::Auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AuthError {
    #[error("user name is empty")]
    UserEmpty,
    #[error("authentication failed, invalid user ID or password")]
    AuthFailed,
    #[error("user name already exists")]
    UserAlreadyExist,
    #[error("user name not found")]
    UserNotFound,
    #[error("role name already exists")]
    RoleAlreadyExist,
    #[error("role name not found")]
    RoleNotFound,
    #[error("role name is empty")]
    RoleEmpty,
    #[error("permission denied")]
    PermissionDenied,
    #[error("role is not granted to the user")]
    RoleNotGranted,
    #[error("permission is not granted to the role")]
    PermissionNotGranted,
    #[error("root user does not exist")]
    RootUserNotExist,
    #[error("root user does not have root role")]
    RootRoleNotExist,
    #[error("authentication is not enabled")]
    AuthNotEnabled,
    #[error("revision of auth store is old")]
    AuthOldRevision,
    #[error("invalid auth management")]
    InvalidAuthMgmt,
}

/// The end of an interval: a key (exclusive), or past every key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Key(Vec<u8>),
    Infinite,
}

/// A union of key intervals `[start, end)`, merged: sorted by start, none overlapping or
/// touching another.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct IntervalSet {
    intervals: Vec<(Vec<u8>, End)>,
}

impl IntervalSet {
    fn from_unsorted(mut all: Vec<(Vec<u8>, End)>) -> Self {
        all.sort();
        let mut intervals: Vec<(Vec<u8>, End)> = Vec::with_capacity(all.len());
        for (start, end) in all {
            if let Some(last) = intervals.last_mut() {
                // Overlapping or touching: [a, b) ∪ [c, d) with c <= b is [a, max(b, d)).
                if End::Key(start.clone()) <= last.1 {
                    if end > last.1 {
                        last.1 = end;
                    }
                    continue;
                }
            }
            intervals.push((start, end));
        }
        IntervalSet { intervals }
    }

    /// The merged interval holding `key`, if any.
    fn holding(&self, key: &[u8]) -> Option<&End> {
        let i = self
            .intervals
            .partition_point(|(start, _)| start.as_slice() <= key);
        let (_, end) = self.intervals.get(i.checked_sub(1)?)?;
        let inside = match end {
            End::Infinite => true,
            End::Key(e) => key < e.as_slice(),
        };
        inside.then_some(end)
    }

    /// Whether every key of `[key, end)` is in the union (one merged interval covers it:
    /// merged intervals never touch, so a range spanning two has a gap).
    fn covers(&self, key: &[u8], end: &End) -> bool {
        self.holding(key).is_some_and(|held| held >= end)
    }
}

/// The interval a permission or request range stands for, under etcd's conventions.
fn interval(key: &[u8], range_end: &[u8]) -> (Vec<u8>, End) {
    let end = if range_end.is_empty() {
        let mut point = key.to_vec();
        point.push(0);
        End::Key(point)
    } else if range_end == [0] {
        End::Infinite
    } else {
        End::Key(range_end.to_vec())
    };
    (key.to_vec(), end)
}

/// One user's permissions, every role's merged (etcd's `unifiedRangePermissions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserPerms {
    root: bool,
    read: IntervalSet,
    write: IntervalSet,
}

impl UserPerms {
    fn of(user: &User, roles: &BTreeMap<String, Role>) -> Self {
        let mut read = Vec::new();
        let mut write = Vec::new();
        for perm in user
            .roles
            .iter()
            .filter_map(|r| roles.get(r))
            .flat_map(|r| &r.perms)
        {
            let ivl = interval(&perm.key, &perm.range_end);
            if perm.perm_type.reads() {
                read.push(ivl.clone());
            }
            if perm.perm_type.writes() {
                write.push(ivl);
            }
        }
        UserPerms {
            root: user.roles.contains(ROOT),
            read: IntervalSet::from_unsorted(read),
            write: IntervalSet::from_unsorted(write),
        }
    }

    /// Whether the user holds the root role (which may do everything).
    pub fn is_root(&self) -> bool {
        self.root
    }

    /// Whether `perm` is granted on every key of the request range `(key, range_end)`
    /// (etcd's conventions; a reversed range is checked as its first key).
    pub fn allows(&self, perm: PermType, key: &[u8], range_end: &[u8]) -> bool {
        if self.root {
            return true;
        }
        let (start, mut end) = interval(key, range_end);
        if matches!(&end, End::Key(e) if e.as_slice() <= key) {
            end = interval(key, &[]).1;
        }
        let sets: &[&IntervalSet] = match perm {
            PermType::Read => &[&self.read],
            PermType::Write => &[&self.write],
            PermType::ReadWrite => &[&self.read, &self.write],
        };
        sets.iter().all(|s| s.covers(&start, &end))
    }
}

/// The derived permission cache: one [`UserPerms`] per user, rebuilt from the state after
/// every change (never persisted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PermCache {
    users: BTreeMap<String, UserPerms>,
}

impl PermCache {
    pub fn build(state: &AuthState) -> Self {
        PermCache {
            users: state
                .users
                .iter()
                .map(|(name, u)| (name.clone(), UserPerms::of(u, &state.roles)))
                .collect(),
        }
    }

    pub fn user(&self, name: &str) -> Option<&UserPerms> {
        self.users.get(name)
    }
}

/// Who a request comes from, as the server resolved it: a user name and the auth revision
/// it was checked against (etcd's `AuthInfo`).
///
/// Persisted: see [`crate::format`] (fields never reorder; inside `Command::Authorized`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthInfo {
    pub user: String,
    pub revision: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perms(grants: &[(PermType, &str, &str)]) -> UserPerms {
        let mut roles = BTreeMap::new();
        roles.insert(
            "r".to_string(),
            Role {
                perms: grants
                    .iter()
                    .map(|(t, k, e)| Permission {
                        perm_type: *t,
                        key: k.as_bytes().to_vec(),
                        range_end: e.as_bytes().to_vec(),
                    })
                    .collect(),
            },
        );
        let user = User {
            password_hash: None,
            roles: BTreeSet::from(["r".to_string()]),
        };
        UserPerms::of(&user, &roles)
    }

    #[test]
    fn keys_ranges_prefixes_and_from_key() {
        let p = perms(&[
            (PermType::Read, "a", ""),
            (PermType::ReadWrite, "/a", "/b"),
            (PermType::Write, "m", "\0"),
        ]);
        assert!(p.allows(PermType::Read, b"a", b""));
        assert!(!p.allows(PermType::Read, b"a0", b""));
        assert!(!p.allows(PermType::Write, b"a", b""));
        assert!(p.allows(PermType::Read, b"/a/x", b""));
        assert!(p.allows(PermType::Read, b"/a", b"/b"));
        assert!(p.allows(PermType::ReadWrite, b"/a1", b"/a2"));
        assert!(!p.allows(PermType::Read, b"/a", b"/c"));
        assert!(!p.allows(PermType::Read, b"/b", b""));
        assert!(p.allows(PermType::Write, b"zzz", b""));
        assert!(p.allows(PermType::Write, b"m", b"\0"));
        assert!(!p.allows(PermType::Write, b"l", b"\0"));
        assert!(!p.allows(PermType::Read, b"m", b""));
    }

    #[test]
    fn touching_and_overlapping_grants_merge() {
        let p = perms(&[
            (PermType::Read, "a", "c"),
            (PermType::Read, "c", "e"),
            (PermType::Read, "b", "d"),
            (PermType::Read, "x", "y"),
        ]);
        assert!(p.allows(PermType::Read, b"a", b"e"));
        assert!(!p.allows(PermType::Read, b"a", b"f"));
        assert!(
            !p.allows(PermType::Read, b"d", b"y"),
            "a gap between e and x"
        );
        assert!(p.allows(PermType::Read, b"x", b"y"));
        let point_and_range = perms(&[(PermType::Read, "k", ""), (PermType::Read, "k\0", "l")]);
        assert!(point_and_range.allows(PermType::Read, b"k", b"l"));
    }

    #[test]
    fn root_allows_all_and_reversed_ranges_are_invalid() {
        let user = User {
            password_hash: None,
            roles: BTreeSet::from([ROOT.to_string()]),
        };
        let root = UserPerms::of(&user, &BTreeMap::new());
        assert!(root.allows(PermType::Write, b"", b"\0"));
        let reversed = Permission {
            perm_type: PermType::Read,
            key: b"b".to_vec(),
            range_end: b"a".to_vec(),
        };
        assert!(!reversed.is_valid_range());
        let from_key = Permission {
            range_end: vec![0],
            ..reversed.clone()
        };
        assert!(from_key.is_valid_range());
    }
}
