//! The auth store's commands (etcd's `authStore` methods, same checks in the same order)
//! and the permission check of `Command::Authorized` (etcd's `authApplierV3`), plus the
//! queries the server answers reads and token checks with.

use crate::auth::{
    AuthCommand, AuthError, AuthInfo, AuthResponse, AuthState, PermCache, PermType, Permission,
    Role, SimpleToken, User, UserPerms, MAX_SIMPLE_TOKENS, ROOT,
};
use crate::command::{Command, KvError, RequestOp, Response, TxnRequest};
use crate::types::LeaseId;

use super::store::StateMachine;

impl StateMachine {
    pub(super) fn apply_auth(
        &mut self,
        cmd: &AuthCommand,
        index: u64,
    ) -> Result<Response, KvError> {
        let a = &mut self.auth;
        match cmd {
            AuthCommand::Enable => {
                if a.enabled {
                    return Ok(changed(a.revision));
                }
                let root = a.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
                if !root.roles.contains(ROOT) {
                    return Err(AuthError::RootRoleNotExist.into());
                }
                // etcd does not commit a revision when enabling.
                a.enabled = true;
                return Ok(changed(a.revision));
            }
            AuthCommand::Disable => {
                if a.enabled {
                    a.enabled = false;
                    a.tokens.clear();
                    a.revision += 1;
                }
                return Ok(changed(a.revision));
            }
            AuthCommand::Authenticate {
                name,
                simple_token_prefix,
            } => {
                if !a.enabled {
                    return Err(AuthError::AuthNotEnabled.into());
                }
                let user = a.users.get(name).ok_or(AuthError::AuthFailed)?;
                if user.password_hash.is_none() {
                    return Err(AuthError::AuthFailed.into());
                }
                let token = simple_token_prefix.as_ref().map(|prefix| {
                    while a.tokens.len() >= MAX_SIMPLE_TOKENS {
                        a.tokens.pop_first();
                    }
                    a.tokens.insert(
                        index,
                        SimpleToken {
                            prefix: prefix.clone(),
                            user: name.clone(),
                        },
                    );
                    format!("{prefix}.{index}")
                });
                return Ok(Response::Auth(AuthResponse::Authenticated {
                    token,
                    revision: a.revision,
                }));
            }
            AuthCommand::UserAdd {
                name,
                password_hash,
            } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty.into());
                }
                if a.users.contains_key(name) {
                    return Err(AuthError::UserAlreadyExist.into());
                }
                let user = User {
                    password_hash: password_hash.clone(),
                    roles: Default::default(),
                };
                a.users.insert(name.clone(), user);
            }
            AuthCommand::UserDelete { name } => {
                if a.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt.into());
                }
                a.users.remove(name).ok_or(AuthError::UserNotFound)?;
                a.tokens.retain(|_, t| t.user != *name);
            }
            AuthCommand::UserChangePassword {
                name,
                password_hash,
            } => {
                let user = a.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                user.password_hash = Some(password_hash.clone());
                a.tokens.retain(|_, t| t.user != *name);
            }
            AuthCommand::UserGrantRole { user, role } => {
                if role != ROOT && !a.roles.contains_key(role) {
                    // etcd looks the user up first.
                    if !a.users.contains_key(user) {
                        return Err(AuthError::UserNotFound.into());
                    }
                    return Err(AuthError::RoleNotFound.into());
                }
                let u = a.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                if !u.roles.insert(role.clone()) {
                    // Already granted: etcd answers success and commits no revision.
                    return Ok(changed(a.revision));
                }
            }
            AuthCommand::UserRevokeRole { name, role } => {
                if a.enabled && name == ROOT && role == ROOT {
                    return Err(AuthError::InvalidAuthMgmt.into());
                }
                let u = a.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                if !u.roles.remove(role) {
                    return Err(AuthError::RoleNotGranted.into());
                }
            }
            AuthCommand::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty.into());
                }
                if a.roles.contains_key(name) {
                    return Err(AuthError::RoleAlreadyExist.into());
                }
                a.roles.insert(name.clone(), Role::default());
            }
            AuthCommand::RoleDelete { name } => {
                if a.enabled && name == ROOT {
                    return Err(AuthError::InvalidAuthMgmt.into());
                }
                a.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
                for u in a.users.values_mut() {
                    u.roles.remove(name);
                }
            }
            AuthCommand::RoleGrantPermission { name, perm } => {
                if !perm.is_valid_range() {
                    return Err(AuthError::InvalidAuthMgmt.into());
                }
                let role = a.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
                grant(role, perm);
            }
            AuthCommand::RoleRevokePermission {
                role,
                key,
                range_end,
            } => {
                let r = a.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let before = r.perms.len();
                r.perms
                    .retain(|p| p.key != *key || p.range_end != *range_end);
                if r.perms.len() == before {
                    return Err(AuthError::PermissionNotGranted.into());
                }
            }
        }
        a.revision += 1;
        self.perms = PermCache::build(&self.auth);
        Ok(changed(self.auth.revision))
    }

    /// etcd's `authApplierV3` for `Command::Authorized`: with auth off everything passes;
    /// with it on, an admin command needs the root role, anything else the permission on
    /// every key it touches, checked against the auth revision the server resolved the
    /// user at.
    pub(super) fn authorize(&self, auth: &AuthInfo, cmd: &Command) -> Result<(), AuthError> {
        if !self.auth.enabled {
            return Ok(());
        }
        if let Command::Auth(a) = cmd {
            if a.needs_admin() {
                return self.admin_permitted(&auth.user);
            }
            return Ok(());
        }
        if !checked(cmd) {
            return Ok(());
        }
        let perms = self.user_perms(auth)?;
        self.command_permitted(perms, cmd)
    }

    /// etcd's `isOpPermitted` prologue: the user named, the revision current, the user
    /// known.
    fn user_perms(&self, auth: &AuthInfo) -> Result<&UserPerms, AuthError> {
        if auth.revision == 0 || auth.user.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        if auth.revision < self.auth.revision {
            return Err(AuthError::AuthOldRevision);
        }
        self.perms
            .user(&auth.user)
            .ok_or(AuthError::PermissionDenied)
    }

    fn command_permitted(&self, p: &UserPerms, cmd: &Command) -> Result<(), AuthError> {
        let ok = |b: bool| {
            if b {
                Ok(())
            } else {
                Err(AuthError::PermissionDenied)
            }
        };
        match cmd {
            Command::Put(put) => {
                ok(p.allows(PermType::Write, &put.key, &[]))?;
                self.lease_puts_permitted(p, put.lease)?;
                ok(!put.prev_kv || p.allows(PermType::Read, &put.key, &[]))
            }
            Command::DeleteRange(d) => {
                ok(p.allows(PermType::Write, &d.range.key, &d.range.range_end))?;
                ok(!d.prev_kv || p.allows(PermType::Read, &d.range.key, &d.range.range_end))
            }
            Command::Txn(t) => self.txn_permitted(p, t),
            Command::LeaseRevoke { id } => self.lease_puts_permitted(p, *id),
            Command::Deduplicated { command, .. } => self.command_permitted(p, command),
            Command::LockEnqueue { name, lease, .. } => {
                let key = crate::locks::lock_key(name, *lease);
                ok(p.allows(PermType::Write, &key, &[]))?;
                self.lease_puts_permitted(p, *lease)
            }
            Command::LockForceRelease { name, .. } => {
                let range = crate::locks::lock_prefix(name);
                ok(p.allows(PermType::Write, &range.key, &range.range_end))
            }
            // Not checked by etcd either (leases, compaction) or checked by the server
            // before proposing (Baton's fences, sessions and alarms); the leader's duties
            // are never wrapped.
            Command::Noop
            | Command::Compact { .. }
            | Command::LeaseGrant { .. }
            | Command::ExpireLeases { .. }
            | Command::ExpireLeasesInTerm { .. }
            | Command::LeaseCheckpoint { .. }
            | Command::FenceCheck { .. }
            | Command::RegisterClient { .. }
            | Command::UnregisterClient { .. }
            | Command::Alarm { .. }
            | Command::FencingKey { .. }
            | Command::Auth(_)
            | Command::Authorized { .. } => Ok(()),
        }
    }

    /// Every compare and every op of both branches, nested txns included (etcd 3.4 skips
    /// nested txns; a txn is allowed only if everything it might touch is).
    fn txn_permitted(&self, p: &UserPerms, t: &TxnRequest) -> Result<(), AuthError> {
        let ok = |b: bool| {
            if b {
                Ok(())
            } else {
                Err(AuthError::PermissionDenied)
            }
        };
        for c in &t.compare {
            ok(p.allows(PermType::Read, &c.range.key, &c.range.range_end))?;
        }
        for op in t.success.iter().chain(&t.failure) {
            match op {
                RequestOp::Range(r) => {
                    ok(p.allows(PermType::Read, &r.range.key, &r.range.range_end))?
                }
                RequestOp::Put(put) => {
                    ok(p.allows(PermType::Write, &put.key, &[]))?;
                    ok(!put.prev_kv || p.allows(PermType::Read, &put.key, &[]))?;
                }
                RequestOp::DeleteRange(d) => {
                    ok(!d.prev_kv || p.allows(PermType::Read, &d.range.key, &d.range.range_end))?;
                    ok(p.allows(PermType::Write, &d.range.key, &d.range.range_end))?;
                }
                RequestOp::Txn(nested) => self.txn_permitted(p, nested)?,
            }
        }
        Ok(())
    }

    /// etcd's `checkLeasePuts`: revoking a lease (or attaching one to a key) deletes its
    /// keys, so it needs write on every key the lease holds.
    fn lease_puts_permitted(&self, p: &UserPerms, id: LeaseId) -> Result<(), AuthError> {
        let Some(lease) = self.leases.get(&id) else {
            return Ok(());
        };
        if lease.keys.iter().all(|k| p.allows(PermType::Write, k, &[])) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    // ---- queries (the server's reads, token checks and non-replicated checks) ----

    /// The auth store as replicated.
    pub fn auth_state(&self) -> &AuthState {
        &self.auth
    }

    pub fn auth_enabled(&self) -> bool {
        self.auth.enabled
    }

    pub fn auth_revision(&self) -> u64 {
        self.auth.revision
    }

    /// The user a simple token `<prefix>.<index>` was issued to, if it is still valid.
    pub fn simple_token_user(&self, token: &str) -> Option<&str> {
        let (prefix, index) = token.rsplit_once('.')?;
        let stored = self.auth.tokens.get(&index.parse::<u64>().ok()?)?;
        (stored.prefix == prefix).then_some(stored.user.as_str())
    }

    /// etcd's `IsAdminPermitted` (with auth on): the user named, known, and holding root.
    pub fn admin_permitted(&self, user: &str) -> Result<(), AuthError> {
        if !self.auth.enabled {
            return Ok(());
        }
        if user.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        match self.perms.user(user) {
            None => Err(AuthError::UserNotFound),
            Some(p) if p.is_root() => Ok(()),
            Some(_) => Err(AuthError::PermissionDenied),
        }
    }

    /// etcd's `isOpPermitted` for a read or write the server checks itself (ranges,
    /// watches, lock and election requests): `Ok` with auth off.
    pub fn auth_permitted(
        &self,
        auth: Option<&AuthInfo>,
        perm: PermType,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        if !self.auth.enabled {
            return Ok(());
        }
        let empty = AuthInfo {
            user: String::new(),
            revision: 0,
        };
        let p = self.user_perms(auth.unwrap_or(&empty))?;
        if p.allows(perm, key, range_end) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// [`Self::authorize`] for a command the server is about to propose, so a refusal
    /// costs no log entry (apply checks again).
    pub fn auth_precheck(&self, auth: Option<&AuthInfo>, cmd: &Command) -> Result<(), AuthError> {
        let empty = AuthInfo {
            user: String::new(),
            revision: 0,
        };
        self.authorize(auth.unwrap_or(&empty), cmd)
    }

    /// Whether `user` holds `role` (etcd's `HasRole`: a user may read its own roles).
    pub fn user_has_role(&self, user: &str, role: &str) -> bool {
        self.auth
            .users
            .get(user)
            .is_some_and(|u| u.roles.contains(role))
    }
}

/// Whether `authorize` looks at the user for `cmd` at all: etcd checks KV writes, txns and
/// lease revokes (and Baton its lock queue commands); a lease grant or a compaction passes
/// without a user, as in etcd.
fn checked(cmd: &Command) -> bool {
    match cmd {
        Command::Put(_)
        | Command::DeleteRange(_)
        | Command::Txn(_)
        | Command::LeaseRevoke { .. }
        | Command::LockEnqueue { .. }
        | Command::LockForceRelease { .. } => true,
        Command::Deduplicated { command, .. } => checked(command),
        Command::Noop
        | Command::Compact { .. }
        | Command::LeaseGrant { .. }
        | Command::ExpireLeases { .. }
        | Command::ExpireLeasesInTerm { .. }
        | Command::LeaseCheckpoint { .. }
        | Command::FenceCheck { .. }
        | Command::RegisterClient { .. }
        | Command::UnregisterClient { .. }
        | Command::Alarm { .. }
        | Command::FencingKey { .. }
        | Command::Auth(_)
        | Command::Authorized { .. } => false,
    }
}

fn changed(revision: u64) -> Response {
    Response::Auth(AuthResponse::Changed { revision })
}

/// etcd's `RoleGrantPermission`: an existing `(key, range_end)` gets the new type, else the
/// permission is added in key order.
fn grant(role: &mut Role, perm: &Permission) {
    if let Some(p) = role
        .perms
        .iter_mut()
        .find(|p| p.key == perm.key && p.range_end == perm.range_end)
    {
        p.perm_type = perm.perm_type;
        return;
    }
    let at = role.perms.partition_point(|p| p.key <= perm.key);
    role.perms.insert(at, perm.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, PutRequest, RangeRequest, RequestOp, TxnRequest};
    use crate::state_machine::tests::{entry, put};
    use crate::types::KeyRange;

    struct T {
        sm: StateMachine,
        index: u64,
    }

    impl T {
        fn new() -> Self {
            T {
                sm: StateMachine::new(),
                index: 0,
            }
        }
        fn apply(&mut self, c: Command) -> Response {
            self.index += 1;
            self.sm.apply(&entry(self.index, c)).response
        }
        fn auth(&mut self, c: AuthCommand) -> Response {
            self.apply(Command::Auth(c))
        }
        fn as_user(&mut self, user: &str, c: Command) -> Response {
            let auth = AuthInfo {
                user: user.into(),
                revision: self.sm.auth_revision(),
            };
            self.apply(Command::Authorized {
                auth,
                command: Box::new(c),
            })
        }
    }

    fn err(e: AuthError) -> Response {
        Response::Error(KvError::Auth(e))
    }

    /// root (with the root role) and `alice` with read on prefix `/a`, auth enabled.
    fn setup() -> T {
        let mut t = T::new();
        for c in [
            AuthCommand::UserAdd {
                name: ROOT.into(),
                password_hash: Some("h".into()),
            },
            AuthCommand::UserAdd {
                name: "alice".into(),
                password_hash: Some("h".into()),
            },
            AuthCommand::RoleAdd { name: "ra".into() },
            AuthCommand::RoleGrantPermission {
                name: "ra".into(),
                perm: Permission {
                    perm_type: PermType::ReadWrite,
                    key: b"/a".to_vec(),
                    range_end: b"/b".to_vec(),
                },
            },
            AuthCommand::UserGrantRole {
                user: "alice".into(),
                role: "ra".into(),
            },
        ] {
            assert!(matches!(t.auth(c), Response::Auth(_)));
        }
        assert_eq!(
            t.auth(AuthCommand::Enable),
            err(AuthError::RootRoleNotExist)
        );
        t.auth(AuthCommand::UserGrantRole {
            user: ROOT.into(),
            role: ROOT.into(),
        });
        assert!(matches!(t.auth(AuthCommand::Enable), Response::Auth(_)));
        t
    }

    #[test]
    fn management_follows_etcd() {
        let mut t = T::new();
        assert_eq!(
            t.auth(AuthCommand::Enable),
            err(AuthError::RootUserNotExist)
        );
        let add = AuthCommand::UserAdd {
            name: "u".into(),
            password_hash: None,
        };
        assert!(matches!(t.auth(add.clone()), Response::Auth(_)));
        assert_eq!(t.auth(add), err(AuthError::UserAlreadyExist));
        let rev = t.sm.auth_revision();
        assert_eq!(
            t.auth(AuthCommand::UserRevokeRole {
                name: "u".into(),
                role: "x".into()
            }),
            err(AuthError::RoleNotGranted)
        );
        assert_eq!(t.sm.auth_revision(), rev, "a refusal commits no revision");
        let reversed = AuthCommand::RoleGrantPermission {
            name: "x".into(),
            perm: Permission {
                perm_type: PermType::Read,
                key: b"b".to_vec(),
                range_end: b"a".to_vec(),
            },
        };
        assert_eq!(t.auth(reversed), err(AuthError::InvalidAuthMgmt));
        let mut t = setup();
        assert_eq!(
            t.as_user(
                ROOT,
                Command::Auth(AuthCommand::UserDelete { name: ROOT.into() })
            ),
            err(AuthError::InvalidAuthMgmt)
        );
        assert_eq!(
            t.as_user(
                "alice",
                Command::Auth(AuthCommand::RoleAdd { name: "n".into() })
            ),
            err(AuthError::PermissionDenied)
        );
        assert_eq!(
            t.as_user("", Command::Auth(AuthCommand::RoleAdd { name: "n".into() })),
            err(AuthError::UserEmpty)
        );
    }

    #[test]
    fn writes_are_checked_key_by_key_and_a_txn_as_a_whole() {
        let mut t = setup();
        assert!(matches!(
            t.as_user("alice", put("/a/1", "v")),
            Response::Put(_)
        ));
        assert_eq!(
            t.as_user("alice", put("/b/1", "v")),
            err(AuthError::PermissionDenied)
        );
        let before = t.sm.hash_kv(0).unwrap();
        let txn = Command::Txn(TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp::Put(PutRequest {
                key: b"/a/2".to_vec(),
                ..Default::default()
            })],
            failure: vec![RequestOp::Range(RangeRequest {
                range: KeyRange {
                    key: b"/b".to_vec(),
                    range_end: Vec::new(),
                },
                ..Default::default()
            })],
        });
        assert_eq!(t.as_user("alice", txn), err(AuthError::PermissionDenied));
        assert_eq!(
            t.sm.hash_kv(0).unwrap(),
            before,
            "the denied txn wrote nothing"
        );
        assert!(matches!(
            t.as_user(ROOT, put("/b/1", "v")),
            Response::Put(_)
        ));
        // A revision older than the store's is etcd's retry signal.
        let stale = AuthInfo {
            user: "alice".into(),
            revision: t.sm.auth_revision() - 1,
        };
        let r = t.apply(Command::Authorized {
            auth: stale,
            command: Box::new(put("/a/3", "v")),
        });
        assert_eq!(r, err(AuthError::AuthOldRevision));
    }

    #[test]
    fn revoking_a_lease_needs_write_on_its_keys() {
        let mut t = setup();
        // A grant needs no user, as in etcd.
        let anonymous = AuthInfo {
            user: String::new(),
            revision: 0,
        };
        assert_eq!(
            t.sm.auth_precheck(
                Some(&anonymous),
                &Command::LeaseGrant {
                    id: LeaseId(6),
                    ttl_s: 60
                }
            ),
            Ok(())
        );
        t.apply(Command::LeaseGrant {
            id: LeaseId(5),
            ttl_s: 60,
        });
        t.as_user(
            ROOT,
            Command::Put(PutRequest {
                key: b"/b/leased".to_vec(),
                lease: LeaseId(5),
                ..Default::default()
            }),
        );
        assert_eq!(
            t.as_user("alice", Command::LeaseRevoke { id: LeaseId(5) }),
            err(AuthError::PermissionDenied)
        );
        assert_eq!(
            t.as_user(ROOT, Command::LeaseRevoke { id: LeaseId(5) }),
            Response::LeaseRevoke
        );
    }

    #[test]
    fn tokens_are_issued_and_dropped_with_their_user() {
        let mut t = setup();
        let Response::Auth(AuthResponse::Authenticated {
            token: Some(token), ..
        }) = t.auth(AuthCommand::Authenticate {
            name: "alice".into(),
            simple_token_prefix: Some("pfx".into()),
        })
        else {
            panic!("no token")
        };
        assert_eq!(token, format!("pfx.{}", t.index));
        assert_eq!(t.sm.simple_token_user(&token), Some("alice"));
        assert_eq!(t.sm.simple_token_user("other.1"), None);
        let restored = StateMachine::restore(&t.sm.snapshot()).unwrap();
        assert_eq!(restored.simple_token_user(&token), Some("alice"));
        assert!(restored
            .auth_permitted(
                Some(&AuthInfo {
                    user: "alice".into(),
                    revision: restored.auth_revision()
                }),
                PermType::Read,
                b"/a/x",
                b""
            )
            .is_ok());
        t.as_user(
            ROOT,
            Command::Auth(AuthCommand::UserChangePassword {
                name: "alice".into(),
                password_hash: "h2".into(),
            }),
        );
        assert_eq!(t.sm.simple_token_user(&token), None);
        assert_eq!(
            t.auth(AuthCommand::Authenticate {
                name: "nobody".into(),
                simple_token_prefix: None
            }),
            err(AuthError::AuthFailed)
        );
    }
}
