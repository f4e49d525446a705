//! An etcd snapshot read back into a state: the `key` bucket version by version into
//! `baton_core::Importer` (so the store exists once, as it is built), the leases, the auth
//! store, the alarms and the compaction from `meta`. Works for what etcd 3.4 (or 3.5, whose
//! buckets are a superset) writes and for what Baton writes; anything else is refused with
//! what was found.

use std::collections::{BTreeMap, BTreeSet};

use baton_bbolt::{BucketRef, Db, ReadAt};
use baton_core::{
    AlarmType, AuthState, CommandIndex, ImportError, ImportSummary, Importer, PermType, Permission,
    Role, StateMachine, Term, User,
};
use baton_proto::{authpb, etcdserverpb, mvccpb};
use prost::Message;

use crate::layout::{self, parse_rev_key, LeasePb, MemberJson};

/// Why a snapshot cannot be read. Each says what was found.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Bbolt(#[from] baton_bbolt::Error),
    #[error("not an etcd snapshot: {0}")]
    Layout(String),
    #[error("bucket {bucket}: undecodable entry {key:?}: {why}")]
    Entry {
        bucket: &'static str,
        key: String,
        why: String,
    },
    #[error("snapshot of cluster version {0}: only etcd 3.x snapshots are read")]
    ClusterVersion(String),
    #[error(transparent)]
    Import(#[from] ImportError),
    /// Baton's own `member/snap/db` (`own.rs`): its `baton` bucket is missing or damaged.
    #[error("Baton's snapshot bucket: {0}")]
    Own(String),
    /// Baton's own `member/snap/db`: the `key` bucket does not import and does not match
    /// the checksum Baton wrote for it (it was changed outside Baton).
    #[error("the `key` bucket does not match its checksum and does not import: {0}")]
    KvChecksum(String),
}

/// What a snapshot said beside its state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportInfo {
    pub consistent_index: u64,
    pub cluster_version: Option<String>,
    /// `(id, name)` of the members the snapshot's cluster had.
    pub members: Vec<(u64, String)>,
    /// Buckets neither etcd 3.4 nor Baton writes (ignored).
    pub unknown_buckets: Vec<String>,
    /// Alarms of a type Baton does not know (etcd 3.4 raises only `NOSPACE` and
    /// `CORRUPT`, both carried over): not carried over.
    pub alarms_dropped: u64,
    pub summary: ImportSummary,
}

pub(crate) fn entry_err(bucket: &'static str, key: &[u8], why: impl ToString) -> ReadError {
    ReadError::Entry {
        bucket,
        key: String::from_utf8_lossy(key).into_owned(),
        why: why.to_string(),
    }
}

const KNOWN: &[&[u8]] = &[
    layout::ALARM,
    layout::AUTH,
    layout::AUTH_ROLES,
    layout::AUTH_USERS,
    layout::BATON,
    layout::CLUSTER,
    layout::KEY,
    layout::LEASE,
    layout::MEMBERS,
    layout::MEMBERS_REMOVED,
    layout::META,
];

/// How often `read_state` reports its progress, in versions read.
const PROGRESS_EVERY: u64 = 10_000;

/// Reads the state out of an etcd-layout snapshot, to be applied as of `last_applied`;
/// `progress(versions read)` is called every 10,000 versions of the `key` bucket.
pub fn read_state<R: ReadAt>(
    db: &Db<R>,
    last_applied: (CommandIndex, Term),
    progress: &mut dyn FnMut(u64),
) -> Result<(StateMachine, ImportInfo), ReadError> {
    let buckets: BTreeMap<Vec<u8>, BucketRef> = db.buckets()?.into_iter().collect();
    let get = |name: &[u8]| buckets.get(name);
    let (Some(key_bucket), Some(meta_bucket)) = (get(layout::KEY), get(layout::META)) else {
        let names: Vec<String> = buckets
            .keys()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        return Err(ReadError::Layout(format!(
            "no `key` and `meta` buckets (found {names:?})"
        )));
    };
    let mut info = ImportInfo {
        unknown_buckets: buckets
            .keys()
            .filter(|n| !KNOWN.contains(&n.as_slice()))
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect(),
        ..ImportInfo::default()
    };
    if let Some(b) = get(layout::CLUSTER) {
        db.for_each(b, "cluster", &mut |k, v, _| {
            if k == layout::CLUSTER_VERSION_KEY {
                info.cluster_version = Some(String::from_utf8_lossy(v).into_owned());
            }
            Ok(())
        })?;
    }
    if let Some(v) = &info.cluster_version {
        if !v.starts_with("3.") {
            return Err(ReadError::ClusterVersion(v.clone()));
        }
    }

    let mut compact = 1;
    db.for_each(meta_bucket, "meta", &mut |k, v, _| {
        let rev = || parse_rev_key(v).map(|(m, _, _)| m);
        match k {
            _ if k == layout::CONSISTENT_INDEX && v.len() == 8 => {
                info.consistent_index = u64::from_be_bytes(v.try_into().expect("8 bytes"));
            }
            _ if k == layout::FINISHED_COMPACT || k == layout::SCHEDULED_COMPACT => {
                // etcd resumes a scheduled compaction it had not finished on restore.
                compact = compact.max(rev().unwrap_or(1));
            }
            _ => {}
        }
        Ok(())
    })?;
    // Known before the versions: history at or below it goes straight into its compacted
    // shape instead of into an index that compaction would drop.
    let mut im = Importer::compacted_at(compact);
    let last_main = read_key_bucket(db, key_bucket, &mut im, &mut |_, _| {}, progress)?;

    if let Some(b) = get(layout::LEASE) {
        let mut leases = Vec::new();
        db.for_each(b, "lease", &mut |k, v, _| {
            leases.push((k.to_vec(), v.to_vec()));
            Ok(())
        })?;
        for (k, v) in leases {
            let l = LeasePb::decode(v.as_slice()).map_err(|e| entry_err("lease", &k, e))?;
            let remaining = (l.remaining_ttl > 0).then_some(l.remaining_ttl);
            im.lease(l.id, l.ttl, remaining)?;
        }
    }

    im.auth(read_auth(db, &buckets)?);

    if let Some(b) = get(layout::ALARM) {
        let mut alarms = Vec::new();
        db.for_each(b, "alarm", &mut |k, _, _| {
            alarms.push(k.to_vec());
            Ok(())
        })?;
        for k in alarms {
            let a = etcdserverpb::AlarmMember::decode(k.as_slice())
                .map_err(|e| entry_err("alarm", &k, e))?;
            if a.alarm == etcdserverpb::AlarmType::Nospace as i32 {
                im.alarm(a.member_id, AlarmType::NoSpace);
            } else if a.alarm == etcdserverpb::AlarmType::Corrupt as i32 {
                im.alarm(a.member_id, AlarmType::Corrupt);
            } else {
                info.alarms_dropped += 1;
            }
        }
    }

    if let Some(b) = get(layout::MEMBERS) {
        db.for_each(b, "members", &mut |_, v, _| {
            if let Ok(m) = serde_json::from_slice::<MemberJson>(v) {
                info.members.push((m.id, m.name));
            }
            Ok(())
        })?;
    }

    let (sm, summary) = im.finish(last_main, compact, last_applied)?;
    info.summary = summary;
    Ok((sm, info))
}

/// Feeds the `key` bucket version by version into `im`, each entry also to `seen` (as
/// read, for a checksum); `progress(versions read)` every 10,000 versions. Returns the newest
/// main revision read (1 if none).
pub(crate) fn read_key_bucket<R: ReadAt>(
    db: &Db<R>,
    key_bucket: &BucketRef,
    im: &mut Importer,
    seen: &mut dyn FnMut(&[u8], &[u8]),
    progress: &mut dyn FnMut(u64),
) -> Result<i64, ReadError> {
    let mut failed: Option<ReadError> = None;
    let mut last_main = 1;
    let mut versions = 0u64;
    db.for_each(key_bucket, "key", &mut |k, v, _| {
        seen(k, v);
        let res = (|| {
            let (main, _, tombstone) =
                parse_rev_key(k).ok_or_else(|| entry_err("key", k, "not a revision key"))?;
            let kv = mvccpb::KeyValue::decode(v).map_err(|e| entry_err("key", k, e))?;
            let live = if tombstone {
                None
            } else {
                if kv.mod_revision != main {
                    return Err(entry_err(
                        "key",
                        k,
                        format!("its value says mod revision {}", kv.mod_revision),
                    ));
                }
                Some((
                    kv.create_revision,
                    kv.version,
                    kv.lease,
                    kv.value.as_slice(),
                ))
            };
            im.version(&kv.key, main, live)?;
            last_main = main;
            versions += 1;
            if versions.is_multiple_of(PROGRESS_EVERY) {
                progress(versions);
            }
            Ok(())
        })();
        if let Err(e) = res {
            failed = Some(e);
            return Err(baton_bbolt::Error::Input("stopped".into()));
        }
        Ok(())
    })
    .map_err(|e| failed.take().unwrap_or_else(|| ReadError::from(e)))?;
    Ok(last_main)
}

fn perm_type(key: &[u8], t: i32) -> Result<PermType, ReadError> {
    use authpb::permission::Type;
    match Type::try_from(t) {
        Ok(Type::Read) => Ok(PermType::Read),
        Ok(Type::Write) => Ok(PermType::Write),
        Ok(Type::Readwrite) => Ok(PermType::ReadWrite),
        Err(_) => Err(entry_err("authRoles", key, format!("permission type {t}"))),
    }
}

fn read_auth<R: ReadAt>(
    db: &Db<R>,
    buckets: &BTreeMap<Vec<u8>, BucketRef>,
) -> Result<AuthState, ReadError> {
    let mut auth = AuthState::default();
    let mut raw: Vec<(&'static str, Vec<u8>, Vec<u8>)> = Vec::new();
    for (name, shown) in [
        (layout::AUTH, "auth"),
        (layout::AUTH_ROLES, "authRoles"),
        (layout::AUTH_USERS, "authUsers"),
    ] {
        if let Some(b) = buckets.get(name) {
            db.for_each(b, shown, &mut |k, v, _| {
                raw.push((shown, k.to_vec(), v.to_vec()));
                Ok(())
            })?;
        }
    }
    for (bucket, k, v) in raw {
        match bucket {
            "auth" if k == layout::AUTH_ENABLED => auth.enabled = v == [1],
            "auth" if k == layout::AUTH_REVISION && v.len() == 8 => {
                auth.revision = u64::from_be_bytes(v.as_slice().try_into().expect("8 bytes"));
            }
            "authRoles" => {
                let r = authpb::Role::decode(v.as_slice())
                    .map_err(|e| entry_err("authRoles", &k, e))?;
                let mut perms = r
                    .key_permission
                    .into_iter()
                    .map(|p| {
                        Ok(Permission {
                            perm_type: perm_type(&k, p.perm_type)?,
                            key: p.key,
                            range_end: p.range_end,
                        })
                    })
                    .collect::<Result<Vec<_>, ReadError>>()?;
                perms.sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
                auth.roles
                    .insert(String::from_utf8_lossy(&k).into_owned(), Role { perms });
            }
            "authUsers" => {
                let u = authpb::User::decode(v.as_slice())
                    .map_err(|e| entry_err("authUsers", &k, e))?;
                let no_password = u.options.is_some_and(|o| o.no_password) || u.password.is_empty();
                let password_hash = (!no_password)
                    .then(|| String::from_utf8(u.password))
                    .transpose()
                    .map_err(|e| entry_err("authUsers", &k, e))?;
                auth.users.insert(
                    String::from_utf8_lossy(&k).into_owned(),
                    User {
                        password_hash,
                        roles: u.roles.into_iter().collect::<BTreeSet<_>>(),
                    },
                );
            }
            _ => {}
        }
    }
    Ok(auth)
}
