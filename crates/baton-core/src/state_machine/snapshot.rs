//! Snapshots: [`StateMachine::snapshot`] writes the whole state as format 6, and
//! [`StateMachine::restore`] reads it back, as well as formats 1 (before locks and fences),
//! 2 (before de-duplication sessions), 3 (before alarms), 4 (before the auth store) and 5
//! (before the fencing keys),
//! each as a state without the tables its format did not have.
//!
//! Every body here is persisted: bincode is positional, so the fields of each never reorder
//! (see [`crate::format`]; the current format's bytes are pinned by
//! `tests/golden/`). A new shape is a new format byte and a new body, and the old ones stay
//! readable.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::auth::{AuthState, PermCache};
use crate::clients::{ClientSession, ClientTable};
use crate::command::AlarmType;
use crate::crc32::{crc32, Crc32};
use crate::fencing_keys::FencingKeys;
use crate::locks::{FenceTable, LockRecord, LockTable, MAX_FENCE_RESOURCES, MAX_LOCKS};
use crate::mvcc::{ChangeMap, Changed, Key, KeyMap, KeyStore, Version};
use crate::types::{CommandIndex, FencingToken, LeaseId, Term};

use super::store::{LeaseRecord, StateMachine};

/// Why a snapshot could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is not decodable: {0}")]
    Decode(String),
}

/// Snapshot format version, the first byte of every snapshot. Bump it when `SnapshotBody`
/// changes shape; `restore` refuses versions it does not know instead of misreading them.
/// Formats 1 (before locks and fences), 2 (before de-duplication sessions), 3 (before
/// alarms), 4 (before the auth store) and 5 (before the fencing keys) are still read, as
/// states without those tables.
const SNAPSHOT_FORMAT: u8 = 6;
const SNAPSHOT_FORMAT_V5: u8 = 5;
const SNAPSHOT_FORMAT_V4: u8 = 4;
const SNAPSHOT_FORMAT_V3: u8 = 3;
const SNAPSHOT_FORMAT_V2: u8 = 2;
const SNAPSHOT_FORMAT_V1: u8 = 1;

/// Everything `snapshot` writes, borrowed (so snapshotting does not clone the store).
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Serialize)]
struct SnapshotBodyRef<'a> {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    keys: &'a KeyMap,
    changes: &'a ChangeMap,
    leases: &'a BTreeMap<LeaseId, LeaseRecord>,
    locks: &'a BTreeMap<Vec<u8>, LockRecord>,
    fences: &'a BTreeMap<Vec<u8>, FencingToken>,
    clients: &'a BTreeMap<u64, ClientSession>,
    alarms: &'a BTreeSet<(u64, AlarmType)>,
    auth: &'a AuthState,
    fencing_keys: &'a FencingKeys,
}

/// The owned twin of `SnapshotBodyRef`; bincode is positional, so the two must list the same
/// fields in the same order.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBody {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, FencingToken>,
    clients: BTreeMap<u64, ClientSession>,
    alarms: BTreeSet<(u64, AlarmType)>,
    auth: AuthState,
    fencing_keys: FencingKeys,
}

/// Format 5's body: `SnapshotBody` without the fencing keys.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBodyV5 {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, FencingToken>,
    clients: BTreeMap<u64, ClientSession>,
    alarms: BTreeSet<(u64, AlarmType)>,
    auth: AuthState,
}

impl From<SnapshotBodyV5> for SnapshotBody {
    fn from(b: SnapshotBodyV5) -> Self {
        SnapshotBody {
            revision: b.revision,
            compact_revision: b.compact_revision,
            last_applied: b.last_applied,
            last_time_ms: b.last_time_ms,
            keys: b.keys,
            changes: b.changes,
            leases: b.leases,
            locks: b.locks,
            fences: b.fences,
            clients: b.clients,
            alarms: b.alarms,
            auth: b.auth,
            fencing_keys: FencingKeys::default(),
        }
    }
}

/// Format 4's body: `SnapshotBody` without the auth store.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBodyV4 {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, FencingToken>,
    clients: BTreeMap<u64, ClientSession>,
    alarms: BTreeSet<(u64, AlarmType)>,
}

impl From<SnapshotBodyV4> for SnapshotBody {
    fn from(b: SnapshotBodyV4) -> Self {
        SnapshotBody {
            revision: b.revision,
            compact_revision: b.compact_revision,
            last_applied: b.last_applied,
            last_time_ms: b.last_time_ms,
            keys: b.keys,
            changes: b.changes,
            leases: b.leases,
            locks: b.locks,
            fences: b.fences,
            clients: b.clients,
            alarms: b.alarms,
            auth: AuthState::default(),
            fencing_keys: FencingKeys::default(),
        }
    }
}

/// Format 3's body: `SnapshotBody` without alarms.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBodyV3 {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, FencingToken>,
    clients: BTreeMap<u64, ClientSession>,
}

impl From<SnapshotBodyV3> for SnapshotBody {
    fn from(b: SnapshotBodyV3) -> Self {
        SnapshotBody {
            revision: b.revision,
            compact_revision: b.compact_revision,
            last_applied: b.last_applied,
            last_time_ms: b.last_time_ms,
            keys: b.keys,
            changes: b.changes,
            leases: b.leases,
            locks: b.locks,
            fences: b.fences,
            clients: b.clients,
            alarms: BTreeSet::new(),
            auth: AuthState::default(),
            fencing_keys: FencingKeys::default(),
        }
    }
}

/// Format 2's body: `SnapshotBody` without de-duplication sessions.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBodyV2 {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, FencingToken>,
}

impl From<SnapshotBodyV2> for SnapshotBody {
    fn from(b: SnapshotBodyV2) -> Self {
        SnapshotBody {
            revision: b.revision,
            compact_revision: b.compact_revision,
            last_applied: b.last_applied,
            last_time_ms: b.last_time_ms,
            keys: b.keys,
            changes: b.changes,
            leases: b.leases,
            locks: b.locks,
            fences: b.fences,
            clients: BTreeMap::new(),
            alarms: BTreeSet::new(),
            auth: AuthState::default(),
            fencing_keys: FencingKeys::default(),
        }
    }
}

/// Format 1's body: `SnapshotBody` without locks and fences.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBodyV1 {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
}

impl From<SnapshotBodyV1> for SnapshotBody {
    fn from(b: SnapshotBodyV1) -> Self {
        SnapshotBody {
            revision: b.revision,
            compact_revision: b.compact_revision,
            last_applied: b.last_applied,
            last_time_ms: b.last_time_ms,
            keys: b.keys,
            changes: b.changes,
            leases: b.leases,
            locks: BTreeMap::new(),
            fences: BTreeMap::new(),
            clients: BTreeMap::new(),
            alarms: BTreeSet::new(),
            auth: AuthState::default(),
            fencing_keys: FencingKeys::default(),
        }
    }
}

impl StateMachine {
    /// Serializes the whole state (including history and last applied index).
    ///
    /// Format: one format byte, the CRC-32 of the body (little endian), then the bincode body.
    /// The checksum lets `restore` tell a damaged snapshot from a valid one instead of
    /// trusting whatever bincode manages to decode.
    pub fn snapshot(&self) -> Vec<u8> {
        let payload =
            bincode::serialize(&self.snapshot_body()).expect("in-memory state always serializes");
        let mut out = Vec::with_capacity(payload.len() + 5);
        out.push(SNAPSHOT_FORMAT);
        out.extend_from_slice(&crc32(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Writes exactly the bytes of [`StateMachine::snapshot`] into `out` without holding them
    /// in memory: the body is encoded twice, once into a checksum (which comes first) and
    /// once into `out`. For writers of whole states too large to copy (a restored backup).
    pub fn snapshot_to(&self, out: &mut dyn std::io::Write) -> std::io::Result<()> {
        let mut summer = CrcSink(Crc32::new());
        bincode::serialize_into(&mut summer, &self.snapshot_body())
            .expect("in-memory state always serializes");
        out.write_all(&[SNAPSHOT_FORMAT])?;
        out.write_all(&summer.0.finish().to_le_bytes())?;
        bincode::serialize_into(out, &self.snapshot_body()).map_err(|e| match *e {
            bincode::ErrorKind::Io(e) => e,
            other => std::io::Error::other(other.to_string()),
        })
    }

    fn snapshot_body(&self) -> SnapshotBodyRef<'_> {
        SnapshotBodyRef {
            revision: self.revision,
            compact_revision: self.compact_revision,
            last_applied: self.last_applied,
            last_time_ms: self.last_time_ms,
            keys: self.store.keys(),
            changes: self.store.changes(),
            leases: &self.leases,
            locks: self.locks.records(),
            fences: self.fences.map(),
            clients: self.clients.map(),
            alarms: &self.alarms,
            auth: &self.auth,
            fencing_keys: &self.fencing_keys,
        }
    }

    /// Inverse of `snapshot`.
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let err = |m: String| SnapshotError::Decode(m);
        let (&format, rest) = bytes
            .split_first()
            .ok_or_else(|| err("empty snapshot".into()))?;
        if ![
            SNAPSHOT_FORMAT,
            SNAPSHOT_FORMAT_V5,
            SNAPSHOT_FORMAT_V4,
            SNAPSHOT_FORMAT_V3,
            SNAPSHOT_FORMAT_V2,
            SNAPSHOT_FORMAT_V1,
        ]
        .contains(&format)
        {
            return Err(err(format!("unknown snapshot format {format}")));
        }
        if rest.len() < 4 {
            return Err(err("truncated snapshot header".into()));
        }
        let (sum, payload) = rest.split_at(4);
        let sum = u32::from_le_bytes(sum.try_into().expect("4 bytes"));
        if crc32(payload) != sum {
            return Err(err("snapshot checksum mismatch".into()));
        }
        let body: SnapshotBody = if format == SNAPSHOT_FORMAT_V1 {
            bincode::deserialize::<SnapshotBodyV1>(payload)
                .map_err(|e| err(e.to_string()))?
                .into()
        } else if format == SNAPSHOT_FORMAT_V2 {
            bincode::deserialize::<SnapshotBodyV2>(payload)
                .map_err(|e| err(e.to_string()))?
                .into()
        } else if format == SNAPSHOT_FORMAT_V3 {
            bincode::deserialize::<SnapshotBodyV3>(payload)
                .map_err(|e| err(e.to_string()))?
                .into()
        } else if format == SNAPSHOT_FORMAT_V5 {
            bincode::deserialize::<SnapshotBodyV5>(payload)
                .map_err(|e| err(e.to_string()))?
                .into()
        } else if format == SNAPSHOT_FORMAT_V4 {
            bincode::deserialize::<SnapshotBodyV4>(payload)
                .map_err(|e| err(e.to_string()))?
                .into()
        } else {
            bincode::deserialize(payload).map_err(|e| err(e.to_string()))?
        };
        if body.locks.len() > MAX_LOCKS || body.fences.len() > MAX_FENCE_RESOURCES {
            return Err(err("lock registry or fence table over capacity".into()));
        }
        let mut sm = StateMachine {
            store: KeyStore::from_parts(body.keys, body.changes),
            leases: body.leases,
            locks: LockTable::default(),
            fences: FenceTable::from_map(body.fences),
            clients: ClientTable::from_map(body.clients),
            alarms: body.alarms,
            perms: PermCache::build(&body.auth),
            auth: body.auth,
            fencing_keys: body.fencing_keys,
            revision: body.revision,
            compact_revision: body.compact_revision,
            last_applied: body.last_applied,
            last_time_ms: body.last_time_ms,
            prev_values_in_events: true,
        };
        // The queue index is derived: rebuilt from the restored key space.
        sm.locks = LockTable::from_records(body.locks, |name| sm.scan_queue(name));
        sm.check_invariants().map_err(err)?;
        Ok(sm)
    }
}

/// Format of [`StateMachine::tables_snapshot`], its first byte. Bump it when `TablesBody`
/// changes shape (and keep reading the old one).
const TABLES_FORMAT: u8 = 1;

/// A lease without its key set: in a tables snapshot the keys are in the key space the
/// tables are restored with, and the set is rebuilt from it (a second copy could only
/// disagree).
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Serialize, Deserialize)]
struct LeaseTableRecord {
    granted_ttl_s: i64,
    checkpoint_remaining_ms: Option<i64>,
}

/// Everything of the state but the key space (`keys` and `changes` of `SnapshotBody`), in
/// `SnapshotBody`'s order. The key space travels separately, as etcd's `key` bucket in
/// Baton's `member/snap/db`, and comes back through an [`crate::Importer`].
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Serialize)]
struct TablesBodyRef<'a> {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    leases: BTreeMap<LeaseId, LeaseTableRecord>,
    locks: &'a BTreeMap<Vec<u8>, LockRecord>,
    fences: &'a BTreeMap<Vec<u8>, FencingToken>,
    clients: &'a BTreeMap<u64, ClientSession>,
    alarms: &'a BTreeSet<(u64, AlarmType)>,
    auth: &'a AuthState,
    fencing_keys: &'a FencingKeys,
}

/// The owned twin of `TablesBodyRef` (same fields, same order).
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct TablesBody {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(CommandIndex, Term)>,
    last_time_ms: u64,
    leases: BTreeMap<LeaseId, LeaseTableRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, FencingToken>,
    clients: BTreeMap<u64, ClientSession>,
    alarms: BTreeSet<(u64, AlarmType)>,
    auth: AuthState,
    fencing_keys: FencingKeys,
}

/// A decoded [`StateMachine::tables_snapshot`]: the state without its key space, waiting
/// for one ([`crate::Importer::finish_with_tables`]).
pub struct Tables(TablesBody);

impl Tables {
    /// Decodes and verifies (format byte, CRC-32) what `tables_snapshot` wrote.
    pub fn decode(bytes: &[u8]) -> Result<Tables, SnapshotError> {
        let err = |m: String| SnapshotError::Decode(m);
        let (&format, rest) = bytes
            .split_first()
            .ok_or_else(|| err("empty tables snapshot".into()))?;
        if format != TABLES_FORMAT {
            return Err(err(format!("unknown tables snapshot format {format}")));
        }
        if rest.len() < 4 {
            return Err(err("truncated tables snapshot header".into()));
        }
        let (sum, payload) = rest.split_at(4);
        let sum = u32::from_le_bytes(sum.try_into().expect("4 bytes"));
        if crc32(payload) != sum {
            return Err(err("tables snapshot checksum mismatch".into()));
        }
        let body: TablesBody = bincode::deserialize(payload).map_err(|e| err(e.to_string()))?;
        if body.locks.len() > MAX_LOCKS || body.fences.len() > MAX_FENCE_RESOURCES {
            return Err(err("lock registry or fence table over capacity".into()));
        }
        Ok(Tables(body))
    }

    /// The compact revision of the state: an importer of its key space is made for it
    /// ([`crate::Importer::compacted_at`]).
    pub fn compact_revision(&self) -> i64 {
        self.0.compact_revision
    }

    /// The state's revision.
    pub fn revision(&self) -> i64 {
        self.0.revision
    }

    /// The state with `store` as its key space: leases learn their keys from it, the lock
    /// queues are rebuilt from it, and every invariant is checked.
    pub(super) fn restore_with(self, store: KeyStore) -> Result<StateMachine, String> {
        let b = self.0;
        let mut leases: BTreeMap<LeaseId, LeaseRecord> = b
            .leases
            .into_iter()
            .map(|(id, l)| {
                let record = LeaseRecord {
                    granted_ttl_s: l.granted_ttl_s,
                    checkpoint_remaining_ms: l.checkpoint_remaining_ms,
                    keys: BTreeSet::new(),
                };
                (id, record)
            })
            .collect();
        for (key, versions) in store.keys() {
            let Some(live) = versions.last().and_then(|v| v.live.as_ref()) else {
                continue;
            };
            if live.lease == 0 {
                continue;
            }
            match leases.get_mut(&LeaseId(live.lease)) {
                Some(l) => {
                    l.keys.insert(key.to_vec());
                }
                None => {
                    return Err(format!(
                        "key {:?} names lease {:x}, which the tables do not hold",
                        String::from_utf8_lossy(key),
                        live.lease
                    ))
                }
            }
        }
        let mut sm = StateMachine {
            store,
            leases,
            locks: LockTable::default(),
            fences: FenceTable::from_map(b.fences),
            clients: ClientTable::from_map(b.clients),
            alarms: b.alarms,
            perms: PermCache::build(&b.auth),
            auth: b.auth,
            fencing_keys: b.fencing_keys,
            revision: b.revision,
            compact_revision: b.compact_revision,
            last_applied: b.last_applied,
            last_time_ms: b.last_time_ms,
            prev_values_in_events: true,
        };
        sm.locks = LockTable::from_records(b.locks, |name| sm.scan_queue(name));
        sm.check_invariants()?;
        Ok(sm)
    }
}

impl StateMachine {
    /// Everything of the state but its key space, in the format [`Tables::decode`] reads:
    /// one format byte, the CRC-32 of the body (little endian), the bincode body. The key
    /// space is written beside it by the caller (Baton's `member/snap/db`: etcd's `key`
    /// bucket), each version from [`StateMachine::versions_in_revision_order`].
    pub fn tables_snapshot(&self) -> Vec<u8> {
        let leases = self
            .leases
            .iter()
            .map(|(id, l)| {
                let record = LeaseTableRecord {
                    granted_ttl_s: l.granted_ttl_s,
                    checkpoint_remaining_ms: l.checkpoint_remaining_ms,
                };
                (*id, record)
            })
            .collect();
        let body = TablesBodyRef {
            revision: self.revision,
            compact_revision: self.compact_revision,
            last_applied: self.last_applied,
            last_time_ms: self.last_time_ms,
            leases,
            locks: self.locks.records(),
            fences: self.fences.map(),
            clients: self.clients.map(),
            alarms: &self.alarms,
            auth: &self.auth,
            fencing_keys: &self.fencing_keys,
        };
        let payload = bincode::serialize(&body).expect("in-memory state always serializes");
        let mut out = Vec::with_capacity(payload.len() + 5);
        out.push(TABLES_FORMAT);
        out.extend_from_slice(&crc32(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }
}

/// A `Write` that only checksums what it is given.
struct CrcSink(Crc32);

impl std::io::Write for CrcSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_to_writes_the_snapshots_bytes() {
        let mut sm = StateMachine::new();
        for i in 0..50 {
            sm.apply(&entry(i, put(&format!("k{i}"), "v")));
        }
        let mut streamed = Vec::new();
        sm.snapshot_to(&mut streamed).unwrap();
        assert_eq!(streamed, sm.snapshot());
    }

    use crate::command::{Command, DeleteRangeRequest};
    use crate::state_machine::tests::{entry, put};
    use crate::types::KeyRange;

    #[test]
    fn restore_rejects_garbage_and_damage() {
        assert!(StateMachine::restore(&[]).is_err());
        assert!(StateMachine::restore(&[1, 2, 3]).is_err());
        assert!(StateMachine::restore(&[9; 64]).is_err());
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        let snap = sm.snapshot();
        for i in 0..snap.len() {
            let mut bad = snap.clone();
            bad[i] ^= 0x40;
            assert!(StateMachine::restore(&bad).is_err(), "flip at byte {i}");
        }
        assert!(StateMachine::restore(&snap[..snap.len() - 1]).is_err());
        let restored = StateMachine::restore(&snap).expect("valid snapshot");
        assert_eq!(restored.snapshot(), snap);
    }

    #[test]
    fn restore_rejects_a_consistent_checksum_over_an_inconsistent_state() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        // Claim a revision older than the data.
        sm.revision = 1;
        assert!(StateMachine::restore(&sm.snapshot()).is_err());
    }

    /// Keys and values were `Vec<u8>` in the store (and so in snapshots) before they became
    /// `Box<[u8]>`; serde encodes both as the same sequence, so a snapshot written by the old
    /// types must read back as the same state, and the new types must write the same bytes.
    #[test]
    fn snapshots_with_vec_keys_and_values_still_restore() {
        #[derive(Serialize)]
        struct OldLive {
            create_revision: i64,
            version: i64,
            lease: i64,
            value: Vec<u8>,
        }
        #[derive(Serialize)]
        struct OldVersion {
            mod_revision: i64,
            live: Option<OldLive>,
        }
        #[derive(Serialize)]
        struct OldBody<'a> {
            revision: i64,
            compact_revision: i64,
            last_applied: Option<(CommandIndex, Term)>,
            last_time_ms: u64,
            keys: BTreeMap<Vec<u8>, Vec<OldVersion>>,
            changes: BTreeMap<i64, Vec<Vec<u8>>>,
            leases: &'a BTreeMap<LeaseId, LeaseRecord>,
            locks: &'a BTreeMap<Vec<u8>, LockRecord>,
            fences: &'a BTreeMap<Vec<u8>, FencingToken>,
            clients: &'a BTreeMap<u64, ClientSession>,
        }
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        sm.apply(&entry(2, put("b", "22")));
        sm.apply(&entry(3, put("a", "333")));
        // One revision changing two keys (a change list of more than one key).
        sm.apply(&entry(
            4,
            Command::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: b"a".to_vec(),
                    range_end: b"c".to_vec(),
                },
                prev_kv: false,
            }),
        ));
        assert!(sm
            .store
            .changes()
            .iter()
            .any(|(_, c)| c.as_slice().len() == 2));
        let keys = sm
            .store
            .keys()
            .iter()
            .map(|(k, vs)| {
                let vs = vs
                    .iter()
                    .map(|v| OldVersion {
                        mod_revision: v.mod_revision,
                        live: v.live.as_ref().map(|l| OldLive {
                            create_revision: l.create_revision,
                            version: l.version,
                            lease: l.lease,
                            value: l.value.to_vec(),
                        }),
                    })
                    .collect();
                (k.to_vec(), vs)
            })
            .collect();
        let changes = sm
            .store
            .changes()
            .iter()
            .map(|(r, ks)| (*r, ks.as_slice().iter().map(|k| k.to_vec()).collect()))
            .collect();
        let body = OldBody {
            revision: sm.revision,
            compact_revision: sm.compact_revision,
            last_applied: sm.last_applied,
            last_time_ms: sm.last_time_ms,
            keys,
            changes,
            leases: &sm.leases,
            locks: sm.locks.records(),
            fences: sm.fences.map(),
            clients: sm.clients.map(),
        };
        let payload = bincode::serialize(&body).expect("serialize");
        let mut old = vec![SNAPSHOT_FORMAT_V3];
        old.extend_from_slice(&crc32(&payload).to_le_bytes());
        old.extend_from_slice(&payload);
        // Format 5 is format 3 plus the alarm set (here empty: a zero length) and the auth
        // store (here a new one).
        let mut now = payload.clone();
        now.extend_from_slice(&0u64.to_le_bytes());
        now.extend_from_slice(&bincode::serialize(&AuthState::default()).unwrap());
        now.extend_from_slice(&bincode::serialize(&FencingKeys::default()).unwrap());
        let mut expected = vec![SNAPSHOT_FORMAT];
        expected.extend_from_slice(&crc32(&now).to_le_bytes());
        expected.extend_from_slice(&now);
        assert_eq!(
            sm.snapshot(),
            expected,
            "same bytes as before, plus no alarms"
        );
        let restored = StateMachine::restore(&old).expect("old encoding restores");
        assert_eq!(restored.hash_kv(0), sm.hash_kv(0));
    }

    #[test]
    fn format_one_snapshots_still_restore() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        let body = SnapshotBodyRef {
            revision: sm.revision,
            compact_revision: sm.compact_revision,
            last_applied: sm.last_applied,
            last_time_ms: sm.last_time_ms,
            keys: sm.store.keys(),
            changes: sm.store.changes(),
            leases: &sm.leases,
            locks: &BTreeMap::new(),
            fences: &BTreeMap::new(),
            clients: &BTreeMap::new(),
            alarms: &BTreeSet::new(),
            auth: &AuthState::default(),
            fencing_keys: &FencingKeys::default(),
        };
        // Format 1 is format 5 without the four trailing collections and the auth store
        // (bincode is positional).
        let full = bincode::serialize(&body).expect("serialize");
        let auth_len = bincode::serialize(&AuthState::default()).unwrap().len();
        let keys_len = bincode::serialize(&FencingKeys::default()).unwrap().len();
        let payload = &full[..full.len() - 32 - auth_len - keys_len];
        let mut v1 = vec![SNAPSHOT_FORMAT_V1];
        v1.extend_from_slice(&crc32(payload).to_le_bytes());
        v1.extend_from_slice(payload);
        let restored = StateMachine::restore(&v1).expect("format 1 restores");
        assert_eq!(restored.hash_kv(0), sm.hash_kv(0));
        assert_eq!(restored.snapshot(), sm.snapshot());
    }

    #[test]
    fn format_three_snapshots_restore_without_alarms() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        let snap = sm.snapshot();
        assert_eq!(snap[0], SNAPSHOT_FORMAT);
        // Format 3 is format 5 without the trailing alarm set and auth store.
        let auth_len = bincode::serialize(&AuthState::default()).unwrap().len();
        let keys_len = bincode::serialize(&FencingKeys::default()).unwrap().len();
        let payload = &snap[5..snap.len() - 8 - auth_len - keys_len];
        let mut v3 = vec![SNAPSHOT_FORMAT_V3];
        v3.extend_from_slice(&crc32(payload).to_le_bytes());
        v3.extend_from_slice(payload);
        let restored = StateMachine::restore(&v3).expect("format 3 restores");
        assert!(restored.alarms().is_empty());
        assert_eq!(restored.snapshot(), snap);
    }

    #[test]
    fn format_four_snapshots_restore_without_the_auth_store() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        let snap = sm.snapshot();
        assert_eq!(snap[0], SNAPSHOT_FORMAT);
        let auth_len = bincode::serialize(&AuthState::default()).unwrap().len();
        let keys_len = bincode::serialize(&FencingKeys::default()).unwrap().len();
        let payload = &snap[5..snap.len() - auth_len - keys_len];
        let mut v4 = vec![SNAPSHOT_FORMAT_V4];
        v4.extend_from_slice(&crc32(payload).to_le_bytes());
        v4.extend_from_slice(payload);
        let restored = StateMachine::restore(&v4).expect("format 4 restores");
        assert_eq!(restored.auth_state(), &AuthState::default());
        assert_eq!(restored.snapshot(), snap);
    }

    #[test]
    fn format_five_snapshots_restore_without_fencing_keys() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        let snap = sm.snapshot();
        assert_eq!(snap[0], SNAPSHOT_FORMAT);
        let keys_len = bincode::serialize(&FencingKeys::default()).unwrap().len();
        let payload = &snap[5..snap.len() - keys_len];
        let mut v5 = vec![SNAPSHOT_FORMAT_V5];
        v5.extend_from_slice(&crc32(payload).to_le_bytes());
        v5.extend_from_slice(payload);
        let restored = StateMachine::restore(&v5).expect("format 5 restores");
        assert!(restored.fencing_keys().current().is_none());
        assert_eq!(restored.snapshot(), snap);
    }

    #[test]
    fn fencing_keys_survive_a_snapshot() {
        use crate::fencing_keys::{FencingKeyMode, FencingPublicKey, FencingSecret};
        let mut sm = StateMachine::new();
        let key = |mode, b| Command::FencingKey {
            mode,
            public: FencingPublicKey([b; 32]),
            secret: FencingSecret([b + 100; 32]),
        };
        sm.apply(&entry(1, key(FencingKeyMode::Bootstrap, 1)));
        sm.apply(&entry(2, key(FencingKeyMode::Rotate, 2)));
        let restored = StateMachine::restore(&sm.snapshot()).expect("restores");
        assert_eq!(restored.fencing_keys(), sm.fencing_keys());
        let current = restored.fencing_keys().current().unwrap();
        assert_eq!(current.secret, FencingSecret([102; 32]));
        assert_eq!(restored.fencing_keys().public_keys().len(), 2);
    }
}
