//! A state built from a backup of another store (etcd's snapshot, or Baton's own in etcd's
//! layout): [`Importer`] takes the versions in revision order as the backup lists them, the
//! leases, the auth store and the alarms, then compacts as the backup's compact revision says
//! and checks every invariant before handing out a [`StateMachine`].
//!
//! Why a builder and not a snapshot body: a backup lists history version by version, and a
//! store of a million keys should not exist twice (once decoded, once built); each version
//! goes straight into the key store.

use std::collections::{BTreeMap, BTreeSet};

use crate::auth::{AuthState, PermCache};
use crate::command::AlarmType;
use crate::mvcc::{KeyStore, Live};
use crate::types::{CommandIndex, LeaseId, Term};

use super::snapshot::Tables;
use super::store::{LeaseRecord, StateMachine, FIRST_REVISION};

/// Why a backup cannot become a state. Each names what is wrong, for the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    #[error("revision {revision} of key {key:?} comes after revision {after}: the history is out of order")]
    OutOfOrder {
        key: String,
        revision: i64,
        after: i64,
    },
    #[error("key {key:?} changes twice at revision {revision}")]
    Twice { key: String, revision: i64 },
    #[error("a version of key {key:?} at revision {revision} is impossible: {why}")]
    Impossible {
        key: String,
        revision: i64,
        why: &'static str,
    },
    #[error("lease {0:x} is listed twice, or has id 0")]
    Lease(i64),
    #[error("the imported state is inconsistent: {0}")]
    Inconsistent(String),
}

/// What became of a backup: counts an operator can compare with the source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportSummary {
    pub versions: u64,
    pub live_keys: u64,
    pub leases: u64,
    /// Keys that named a lease the backup does not hold (etcd keeps such a key and logs
    /// "failed to attach a lease"); imported without the lease.
    pub keys_without_their_lease: u64,
    /// Versions dropped by the backup's pending compaction (etcd compacts in the background
    /// and resumes a compaction it had not finished when it restarts).
    pub compacted_versions: u64,
}

/// See the module docs.
pub struct Importer {
    store: KeyStore,
    /// Versions at or below it keep only the newest live one per key (see `version`).
    compact_revision: i64,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    auth: AuthState,
    alarms: BTreeSet<(u64, AlarmType)>,
    last_revision: i64,
    summary: ImportSummary,
}

impl Default for Importer {
    fn default() -> Self {
        Self::new()
    }
}

fn shown(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

impl Importer {
    /// An importer for a backup that was never compacted (or whose compact revision is
    /// given later, to `finish`).
    pub fn new() -> Importer {
        Importer::compacted_at(FIRST_REVISION)
    }

    /// An importer for a backup compacted at `compact_revision`: versions at or below it
    /// go straight into the compacted shape (the newest live one per key), and `finish`
    /// must be given the same revision (or a later one).
    pub fn compacted_at(compact_revision: i64) -> Importer {
        Importer {
            store: KeyStore::default(),
            compact_revision: compact_revision.max(FIRST_REVISION),
            leases: BTreeMap::new(),
            auth: AuthState::default(),
            alarms: BTreeSet::new(),
            last_revision: FIRST_REVISION,
            summary: ImportSummary::default(),
        }
    }

    /// The next version, in `(revision, sub)` order: a live value, or a tombstone (`None`).
    pub fn version(
        &mut self,
        key: &[u8],
        mod_revision: i64,
        live: Option<(i64, i64, i64, &[u8])>,
    ) -> Result<(), ImportError> {
        let impossible = |why| ImportError::Impossible {
            key: shown(key),
            revision: mod_revision,
            why,
        };
        if key.is_empty() {
            return Err(impossible("an empty key"));
        }
        if mod_revision <= FIRST_REVISION {
            return Err(impossible("revisions of changes start at 2"));
        }
        if mod_revision < self.last_revision {
            return Err(ImportError::OutOfOrder {
                key: shown(key),
                revision: mod_revision,
                after: self.last_revision,
            });
        }
        if self
            .store
            .keys()
            .get(key)
            .and_then(|vs| vs.last())
            .is_some_and(|v| v.mod_revision == mod_revision)
        {
            return Err(ImportError::Twice {
                key: shown(key),
                revision: mod_revision,
            });
        }
        self.last_revision = mod_revision;
        self.summary.versions += 1;
        if mod_revision <= self.compact_revision && self.compact_revision > FIRST_REVISION {
            if let Some((create_revision, version, _, _)) = live {
                if version < 1 || create_revision < 2 || create_revision > mod_revision {
                    return Err(impossible("its create revision or version"));
                }
            }
            let before = self.store.keys().get(key).map_or(0, |vs| vs.len() as u64);
            self.summary.compacted_versions += before;
            if live.is_none() {
                self.summary.compacted_versions += 1;
            }
            self.store.set_compacted(
                key,
                mod_revision,
                live.map(|(create_revision, version, lease, value)| Live {
                    create_revision,
                    version,
                    lease,
                    value: value.into(),
                }),
            );
            return Ok(());
        }
        match live {
            Some((create_revision, version, lease, value)) => {
                if version < 1 || create_revision < 2 || create_revision > mod_revision {
                    return Err(impossible("its create revision or version"));
                }
                self.store.put(
                    key,
                    mod_revision,
                    Live {
                        create_revision,
                        version,
                        lease,
                        value: value.into(),
                    },
                );
            }
            None => {
                // A tombstone of a key whose live version is not in the backup (compacted
                // away) deletes nothing visible: skipped, as etcd's index does.
                if self.store.latest(key).is_some() {
                    self.store.delete(key, mod_revision);
                }
            }
        }
        Ok(())
    }

    /// A lease: its granted TTL and, if the backup has one, the checkpointed remaining TTL.
    pub fn lease(
        &mut self,
        id: i64,
        granted_ttl_s: i64,
        remaining_ttl_s: Option<i64>,
    ) -> Result<(), ImportError> {
        let record = LeaseRecord {
            granted_ttl_s,
            checkpoint_remaining_ms: remaining_ttl_s.filter(|s| *s > 0).map(|s| s * 1000),
            keys: BTreeSet::new(),
        };
        if id == 0 || self.leases.insert(LeaseId(id), record).is_some() {
            return Err(ImportError::Lease(id));
        }
        self.summary.leases += 1;
        Ok(())
    }

    /// The auth store (users with their bcrypt hashes, roles, the flag and revision). Simple
    /// tokens are never in a backup: etcd keeps them in memory only.
    pub fn auth(&mut self, auth: AuthState) {
        self.auth = auth;
    }

    pub fn alarm(&mut self, member_id: u64, alarm: AlarmType) {
        self.alarms.insert((member_id, alarm));
    }

    /// The state: at `revision` (the backup's, at least the newest version's), compacted at
    /// `compact_revision` (1: never), with `last_applied` as its log position. Leases learn
    /// their keys from the live versions; every invariant is checked.
    pub fn finish(
        mut self,
        revision: i64,
        compact_revision: i64,
        last_applied: (CommandIndex, Term),
    ) -> Result<(StateMachine, ImportSummary), ImportError> {
        let compact = compact_revision.max(FIRST_REVISION);
        if compact < self.compact_revision {
            return Err(ImportError::Inconsistent(format!(
                "compact revision {compact} is below the {} the versions were imported for",
                self.compact_revision
            )));
        }
        let revision = revision.max(self.last_revision).max(compact);
        if compact > FIRST_REVISION {
            let retained = |s: &KeyStore| s.keys().values().map(|vs| vs.len() as u64).sum::<u64>();
            let before = retained(&self.store);
            self.store.compact(compact);
            self.summary.compacted_versions += before - retained(&self.store);
        }
        // Attach each live key to its lease; a key naming a missing lease keeps its value
        // and loses the lease (rewritten in place: the same version, lease 0).
        let mut orphans = Vec::new();
        for (key, versions) in self.store.keys() {
            let Some(live) = versions.last().and_then(|v| v.live.as_ref()) else {
                continue;
            };
            if live.lease == 0 {
                continue;
            }
            match self.leases.get_mut(&LeaseId(live.lease)) {
                Some(l) => {
                    l.keys.insert(key.to_vec());
                }
                None => orphans.push(key.clone()),
            }
        }
        self.summary.keys_without_their_lease = orphans.len() as u64;
        for key in orphans {
            self.store.detach_lease(&key);
        }
        self.summary.live_keys = self.store.live_keys() as u64;
        let mut sm = StateMachine::new();
        sm.store = self.store;
        sm.leases = self.leases;
        sm.alarms = self.alarms;
        sm.perms = PermCache::build(&self.auth);
        sm.auth = self.auth;
        sm.revision = revision;
        sm.compact_revision = compact;
        sm.last_applied = Some(last_applied);
        sm.check_invariants().map_err(ImportError::Inconsistent)?;
        Ok((sm, self.summary))
    }
}

impl Importer {
    /// The state of a Baton snapshot split in two (`member/snap/db`): this importer's key
    /// space (made with [`Importer::compacted_at`] the tables' compact revision) and
    /// everything else, `tables` ([`crate::StateMachine::tables_snapshot`]). Unlike
    /// [`Importer::finish`], nothing is repaired: a key naming a lease the tables do not
    /// hold, or a version above the tables' revision, is an inconsistency, since Baton wrote
    /// both halves from one state. Leases, lock queues and permissions are rebuilt and every
    /// invariant is checked.
    pub fn finish_with_tables(
        mut self,
        tables: Tables,
    ) -> Result<(StateMachine, ImportSummary), ImportError> {
        let compact = tables.compact_revision().max(FIRST_REVISION);
        if compact < self.compact_revision {
            return Err(ImportError::Inconsistent(format!(
                "compact revision {compact} is below the {} the versions were imported for",
                self.compact_revision
            )));
        }
        if self.last_revision > tables.revision() {
            return Err(ImportError::Inconsistent(format!(
                "a version at revision {} is newer than the state's revision {}",
                self.last_revision,
                tables.revision()
            )));
        }
        if compact > FIRST_REVISION {
            self.store.compact(compact);
        }
        self.summary.live_keys = self.store.live_keys() as u64;
        let sm = tables
            .restore_with(self.store)
            .map_err(ImportError::Inconsistent)?;
        self.summary.leases = sm.leases.len() as u64;
        Ok((sm, self.summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};
    use crate::state_machine::tests::{entry, put};
    use crate::types::{EventShape, KeyRange, Revision};

    fn put_leased(key: &str, lease: i64) -> Command {
        Command::Put(PutRequest {
            key: key.into(),
            value: b"leased".to_vec(),
            lease: LeaseId(lease),
            ..PutRequest::default()
        })
    }

    fn del(key: &str) -> Command {
        Command::DeleteRange(DeleteRangeRequest {
            range: KeyRange {
                key: key.into(),
                range_end: Vec::new(),
            },
            ..DeleteRangeRequest::default()
        })
    }

    /// A store with history, a txn of several puts (sub revisions), deletes, a lease with
    /// keys, and a compaction in the middle.
    fn sample() -> StateMachine {
        let mut sm = StateMachine::new();
        let mut i = 0;
        let mut next = |sm: &mut StateMachine, c: Command| {
            i += 1;
            sm.apply(&entry(i, c));
        };
        for round in 0..5 {
            for k in 0..20 {
                next(&mut sm, put(&format!("k{k:02}"), &format!("v{round}")));
            }
        }
        next(&mut sm, del("k03"));
        next(
            &mut sm,
            Command::LeaseGrant {
                id: LeaseId(0x77),
                ttl_s: 60,
            },
        );
        next(&mut sm, put_leased("with-lease", 0x77));
        let ops = (0..5)
            .map(|n| {
                let Command::Put(p) = put(&format!("t{n}"), "txn") else {
                    unreachable!()
                };
                RequestOp::Put(p)
            })
            .collect();
        next(
            &mut sm,
            Command::Txn(TxnRequest {
                success: ops,
                ..TxnRequest::default()
            }),
        );
        next(
            &mut sm,
            Command::Compact {
                revision: Revision(60),
            },
        );
        next(&mut sm, del("k04"));
        next(&mut sm, put("k05", "after"));
        sm
    }

    fn import(sm: &StateMachine) -> (StateMachine, ImportSummary) {
        let mut im = Importer::new();
        for v in sm.versions_in_revision_order() {
            im.version(
                v.key,
                v.mod_revision,
                v.live
                    .as_ref()
                    .map(|l| (l.create_revision, l.version, l.lease, &*l.value)),
            )
            .unwrap();
        }
        for l in sm.leases_for_export() {
            im.lease(l.id.0, l.granted_ttl_s, l.remaining_ttl_s)
                .unwrap();
        }
        im.auth(sm.auth_state().clone());
        im.finish(sm.revision().0, sm.compact_revision().0, sm.last_applied())
            .unwrap()
    }

    /// The order as the change index gives it, one key map lookup per version (what
    /// `versions_in_revision_order` computed before it sorted instead).
    fn by_lookups(sm: &StateMachine) -> Vec<(Vec<u8>, i64, i64)> {
        let compact = sm.compact_revision;
        let mut below: Vec<(i64, Vec<u8>)> = sm
            .store
            .keys()
            .iter()
            .filter_map(|(k, vs)| {
                let v = vs.first()?;
                (v.mod_revision <= compact).then(|| (v.mod_revision, k.to_vec()))
            })
            .collect();
        below.sort_by_key(|(rev, _)| *rev);
        let mut out = Vec::new();
        for (i, (rev, key)) in below.iter().enumerate() {
            let sub = below[..i].iter().filter(|(r, _)| r == rev).count() as i64;
            out.push((key.clone(), *rev, sub));
        }
        for (&rev, changed) in sm.store.changes().iter() {
            for (sub, key) in changed.as_slice().iter().enumerate() {
                let versions = sm.store.keys().get(key).expect("a changed key");
                assert!(versions.iter().any(|v| v.mod_revision == rev));
                out.push((key.to_vec(), rev, sub as i64));
            }
        }
        out
    }

    #[test]
    fn versions_come_in_revision_then_operation_order() {
        let mut sm = sample();
        // A txn whose operations are not in key order: its sub revisions follow them.
        let ops = ["z2", "a9", "z0", "m5"]
            .iter()
            .map(|k| {
                let Command::Put(p) = put(k, "txn") else {
                    unreachable!()
                };
                RequestOp::Put(p)
            })
            .collect();
        sm.apply(&entry(
            sm.last_applied().0 .0 + 1,
            Command::Txn(TxnRequest {
                success: ops,
                ..TxnRequest::default()
            }),
        ));
        let got: Vec<(Vec<u8>, i64, i64)> = sm
            .versions_in_revision_order()
            .map(|v| (v.key.to_vec(), v.mod_revision, v.sub))
            .collect();
        assert_eq!(got, by_lookups(&sm));
        let last: Vec<(&[u8], i64)> = got
            .iter()
            .filter(|(_, rev, _)| *rev == sm.revision().0)
            .map(|(k, _, sub)| (k.as_slice(), *sub))
            .collect();
        assert_eq!(
            last,
            [
                (&b"z2"[..], 0),
                (&b"a9"[..], 1),
                (&b"z0"[..], 2),
                (&b"m5"[..], 3)
            ]
        );
    }

    #[test]
    fn an_exported_state_imports_as_the_same_key_space() {
        let sm = sample();
        let order: Vec<(i64, i64)> = sm
            .versions_in_revision_order()
            .map(|v| (v.mod_revision, v.sub))
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(order, sorted, "strictly increasing (revision, sub)");
        assert!(
            order.iter().any(|(_, sub)| *sub == 4),
            "the txn's five puts"
        );
        let (back, summary) = import(&sm);
        assert_eq!(back.hash_kv(0), sm.hash_kv(0));
        assert_eq!(back.revision(), sm.revision());
        assert_eq!(back.compact_revision(), sm.compact_revision());
        assert_eq!(back.key_count(), sm.key_count());
        assert_eq!(back.lease(LeaseId(0x77)), sm.lease(LeaseId(0x77)));
        assert_eq!(summary.leases, 1);
        assert_eq!(summary.keys_without_their_lease, 0);
        let all = KeyRange {
            key: vec![0],
            range_end: vec![0],
        };
        assert_eq!(
            back.history(&all, Revision(61), 10_000, EventShape::ALL),
            sm.history(&all, Revision(61), 10_000, EventShape::ALL)
        );
    }

    #[test]
    fn a_pending_compaction_is_finished_and_a_missing_lease_detached() {
        let sm = sample();
        let mut im = Importer::new();
        for v in sm.versions_in_revision_order() {
            im.version(
                v.key,
                v.mod_revision,
                v.live
                    .as_ref()
                    .map(|l| (l.create_revision, l.version, l.lease, &*l.value)),
            )
            .unwrap();
        }
        let (back, summary) = im
            .finish(sm.revision().0, sm.revision().0, (CommandIndex(0), Term(1)))
            .unwrap();
        assert_eq!(summary.keys_without_their_lease, 1);
        assert!(summary.compacted_versions > 0);
        assert_eq!(back.key_count(), sm.key_count());
        assert!(back.lease_ids().is_empty());
    }

    /// Knowing the compact revision up front gives the same state as compacting at the end.
    #[test]
    fn compacted_at_is_the_same_as_compacting_at_the_end() {
        let sm = sample();
        let (late, _) = import(&sm);
        let mut im = Importer::compacted_at(sm.compact_revision().0);
        for v in sm.versions_in_revision_order() {
            im.version(
                v.key,
                v.mod_revision,
                v.live
                    .as_ref()
                    .map(|l| (l.create_revision, l.version, l.lease, &*l.value)),
            )
            .unwrap();
        }
        for l in sm.leases_for_export() {
            im.lease(l.id.0, l.granted_ttl_s, l.remaining_ttl_s)
                .unwrap();
        }
        let (early, _) = im
            .finish(sm.revision().0, sm.compact_revision().0, sm.last_applied())
            .unwrap();
        assert_eq!(early.hash_kv(0), late.hash_kv(0));
        assert_eq!(early.key_count(), late.key_count());
        assert_eq!(
            early.approximate_size_bytes(),
            late.approximate_size_bytes()
        );
        // and from a full history (a compaction etcd had not finished), too
        let mut full = StateMachine::new();
        let mut i = 0;
        for round in 0..3 {
            for k in 0..10 {
                i += 1;
                full.apply(&entry(i, put(&format!("k{k}"), &format!("v{round}"))));
            }
            i += 1;
            full.apply(&entry(i, del("k3")));
        }
        let mut im = Importer::compacted_at(20);
        for v in full.versions_in_revision_order() {
            im.version(
                v.key,
                v.mod_revision,
                v.live
                    .as_ref()
                    .map(|l| (l.create_revision, l.version, l.lease, &*l.value)),
            )
            .unwrap();
        }
        let (early, summary) = im
            .finish(full.revision().0, 20, full.last_applied())
            .unwrap();
        full.apply(&entry(
            i + 1,
            Command::Compact {
                revision: Revision(20),
            },
        ));
        assert_eq!(early.hash_kv(0), full.hash_kv(0));
        assert!(summary.compacted_versions > 0);
    }

    /// A state split as Baton's `member/snap/db` holds it (tables, plus the versions the
    /// `key` bucket lists) comes back as the same state, byte for byte of its snapshot.
    #[test]
    fn tables_and_versions_restore_the_same_state() {
        let mut sm = sample();
        sm.apply(&entry(
            1000,
            Command::LeaseCheckpoint {
                checkpoints: vec![(LeaseId(0x77), 12_345)],
            },
        ));
        let tables = Tables::decode(&sm.tables_snapshot()).unwrap();
        let mut im = Importer::compacted_at(tables.compact_revision());
        for v in sm.versions_in_revision_order() {
            im.version(
                v.key,
                v.mod_revision,
                v.live
                    .as_ref()
                    .map(|l| (l.create_revision, l.version, l.lease, &*l.value)),
            )
            .unwrap();
        }
        let (back, summary) = im.finish_with_tables(tables).unwrap();
        assert_eq!(back.snapshot(), sm.snapshot());
        assert_eq!(summary.leases, 1);
        // A key naming a lease the tables lack is refused, not repaired.
        let mut other = StateMachine::new();
        other.apply(&entry(1, put("x", "1")));
        let tables = Tables::decode(&other.tables_snapshot()).unwrap();
        let mut im = Importer::compacted_at(tables.compact_revision());
        im.version(b"x", 2, Some((2, 1, 0x99, b"1"))).unwrap();
        assert!(matches!(
            im.finish_with_tables(tables),
            Err(ImportError::Inconsistent(_))
        ));
        // and damaged tables are refused
        let mut bytes = sm.tables_snapshot();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(Tables::decode(&bytes).is_err());
    }

    #[test]
    fn history_out_of_order_or_twice_is_refused() {
        let mut im = Importer::new();
        im.version(b"a", 5, Some((5, 1, 0, b"x"))).unwrap();
        assert!(matches!(
            im.version(b"b", 4, Some((4, 1, 0, b"x"))),
            Err(ImportError::OutOfOrder { .. })
        ));
        assert!(matches!(
            im.version(b"a", 5, Some((5, 1, 0, b"y"))),
            Err(ImportError::Twice { .. })
        ));
        assert!(matches!(
            im.version(b"c", 6, Some((7, 1, 0, b"x"))),
            Err(ImportError::Impossible { .. })
        ));
        assert!(im.lease(0, 10, None).is_err());
    }
}
