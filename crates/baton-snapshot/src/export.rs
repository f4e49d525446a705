//! Baton's state written as etcd's backend: the buckets of the crate docs' table, in name
//! order, each in key order, through `baton_bbolt::Writer` (into a stream: run twice, the
//! plan then the bytes; into a file, Baton's own snapshot: once, `own.rs`).
//!
//! The source is a frozen copy of the state (`StateMachine`'s clone is O(1) in the key
//! store), so writing takes no lock and applies go on meanwhile; both runs read the same
//! copy, so they give the same file.

use std::io::Write;

use baton_bbolt::{Layout, Writer, DEFAULT_PAGE_SIZE};
use baton_core::{AlarmType, PermType, StateMachine};
use baton_proto::{authpb, etcdserverpb, mvccpb};
use prost::Message;

use crate::layout::{self, LeasePb, MemberJson};

/// A member of the cluster, for the `members` bucket (informational: etcdctl's restore
/// replaces it with the members it is given, as Baton's does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// What a snapshot is made of. See the module docs.
pub struct SnapshotSource {
    pub state: StateMachine,
    /// The last applied log index (etcd's `consistent_index`).
    pub consistent_index: u64,
    pub members: Vec<Member>,
}

fn perm_type(p: PermType) -> i32 {
    match p {
        PermType::Read => authpb::permission::Type::Read as i32,
        PermType::Write => authpb::permission::Type::Write as i32,
        PermType::ReadWrite => authpb::permission::Type::Readwrite as i32,
    }
}

fn alarm_type(a: AlarmType) -> i32 {
    match a {
        AlarmType::NoSpace => etcdserverpb::AlarmType::Nospace as i32,
        AlarmType::Corrupt => etcdserverpb::AlarmType::Corrupt as i32,
    }
}

impl SnapshotSource {
    /// The dry run: where the file ends (its size is `layout.file_bytes()`).
    pub fn plan(&self) -> Result<Layout, baton_bbolt::Error> {
        let mut w = Writer::plan(DEFAULT_PAGE_SIZE);
        self.buckets(&mut w, &mut |_| Ok(()), &mut |_, _| {})?;
        Ok(w.finish()?.0)
    }

    /// The bbolt bytes into `out`, for the layout `plan` gave; returns `out`.
    pub fn write<W: Write>(&self, out: W, layout: Layout) -> Result<W, baton_bbolt::Error> {
        let mut w = Writer::with_layout(out, layout)?;
        self.buckets(&mut w, &mut |_| Ok(()), &mut |_, _| {})?;
        Ok(w.finish()?.1)
    }

    /// The `key` bucket's entries in order: revision key, `mvccpb.KeyValue` (a tombstone's
    /// holds only the key).
    pub(crate) fn key_entries(&self) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
        self.state.versions_in_revision_order().map(|v| {
            let key = layout::rev_key(v.mod_revision, v.sub, v.live.is_none());
            let kv = match v.live {
                Some(l) => mvccpb::KeyValue {
                    key: v.key.to_vec(),
                    create_revision: l.create_revision,
                    mod_revision: v.mod_revision,
                    version: l.version,
                    value: l.value.to_vec(),
                    lease: l.lease,
                },
                None => mvccpb::KeyValue {
                    key: v.key.to_vec(),
                    ..Default::default()
                },
            };
            (key, kv.encode_to_vec())
        })
    }

    /// Every bucket into `w`: `own` writes the `baton` bucket (Baton's own snapshot) or
    /// nothing (an export), in its place between `authUsers` and `cluster`; every `key`
    /// bucket entry is also given to `seen`.
    pub(crate) fn buckets<W: Write>(
        &self,
        w: &mut Writer<W>,
        own: &mut dyn FnMut(&mut Writer<W>) -> Result<(), baton_bbolt::Error>,
        seen: &mut dyn FnMut(&[u8], &[u8]),
    ) -> Result<(), baton_bbolt::Error> {
        let sm = &self.state;

        let mut alarms: Vec<Vec<u8>> = sm
            .alarms()
            .into_iter()
            .map(|(member_id, a)| {
                etcdserverpb::AlarmMember {
                    member_id,
                    alarm: alarm_type(a),
                }
                .encode_to_vec()
            })
            .collect();
        alarms.sort();
        bucket(
            w,
            layout::ALARM,
            alarms.iter().map(|k| (k.clone(), Vec::new())),
        )?;

        let auth = sm.auth_state();
        bucket(
            w,
            layout::AUTH,
            [
                (layout::AUTH_ENABLED.to_vec(), vec![u8::from(auth.enabled)]),
                (
                    layout::AUTH_REVISION.to_vec(),
                    auth.revision.to_be_bytes().to_vec(),
                ),
            ],
        )?;
        let roles = auth.roles.iter().map(|(name, role)| {
            let pb = authpb::Role {
                name: name.as_bytes().to_vec(),
                key_permission: role
                    .perms
                    .iter()
                    .map(|p| authpb::Permission {
                        perm_type: perm_type(p.perm_type),
                        key: p.key.clone(),
                        range_end: p.range_end.clone(),
                    })
                    .collect(),
            };
            (name.as_bytes().to_vec(), pb.encode_to_vec())
        });
        bucket(w, layout::AUTH_ROLES, roles)?;
        let users = auth.users.iter().map(|(name, user)| {
            let pb = authpb::User {
                name: name.as_bytes().to_vec(),
                password: user
                    .password_hash
                    .as_deref()
                    .unwrap_or_default()
                    .as_bytes()
                    .to_vec(),
                roles: user.roles.iter().cloned().collect(),
                options: Some(authpb::UserAddOptions {
                    no_password: user.password_hash.is_none(),
                }),
            };
            (name.as_bytes().to_vec(), pb.encode_to_vec())
        });
        bucket(w, layout::AUTH_USERS, users)?;

        // `baton` sorts between `authUsers` and `cluster`: buckets go in name order.
        own(w)?;

        bucket(
            w,
            layout::CLUSTER,
            [(
                layout::CLUSTER_VERSION_KEY.to_vec(),
                layout::CLUSTER_VERSION.as_bytes().to_vec(),
            )],
        )?;

        w.begin_bucket(layout::KEY)?;
        for (key, value) in self.key_entries() {
            seen(&key, &value);
            w.put(&key, &value)?;
        }
        w.end_bucket()?;

        // Lease ids are int64s; the bucket orders their big-endian bytes, i.e. as u64s.
        let mut leases: Vec<(u64, LeasePb)> = sm
            .leases_for_export()
            .map(|l| {
                let pb = LeasePb {
                    id: l.id.0,
                    ttl: l.granted_ttl_s,
                    remaining_ttl: l.remaining_ttl_s.unwrap_or(0),
                };
                (l.id.0 as u64, pb)
            })
            .collect();
        leases.sort_by_key(|(k, _)| *k);
        bucket(
            w,
            layout::LEASE,
            leases
                .into_iter()
                .map(|(k, pb)| (k.to_be_bytes().to_vec(), pb.encode_to_vec())),
        )?;

        let mut members: Vec<(Vec<u8>, Vec<u8>)> = self
            .members
            .iter()
            .map(|m| {
                let json = MemberJson {
                    id: m.id,
                    peer_urls: m.peer_urls.clone(),
                    is_learner: m.is_learner,
                    name: m.name.clone(),
                    client_urls: m.client_urls.clone(),
                };
                let value = serde_json::to_vec(&json).expect("a member always serializes");
                (format!("{:x}", m.id).into_bytes(), value)
            })
            .collect();
        members.sort();
        bucket(w, layout::MEMBERS, members)?;
        bucket(w, layout::MEMBERS_REMOVED, [])?;

        let mut meta = vec![(
            layout::CONSISTENT_INDEX.to_vec(),
            self.consistent_index.to_be_bytes().to_vec(),
        )];
        let compact = sm.compact_revision().0;
        if compact > 1 {
            // etcd writes both when a compaction is scheduled and has finished it; Baton's
            // compaction is done when it is applied.
            let rev = layout::rev_key(compact, 0, false);
            meta.push((layout::FINISHED_COMPACT.to_vec(), rev.clone()));
            meta.push((layout::SCHEDULED_COMPACT.to_vec(), rev));
        }
        bucket(w, layout::META, meta)
    }
}

fn bucket<W: Write>(
    w: &mut Writer<W>,
    name: &[u8],
    entries: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
) -> Result<(), baton_bbolt::Error> {
    w.begin_bucket(name)?;
    for (k, v) in entries {
        w.put(&k, &v)?;
    }
    w.end_bucket()
}
