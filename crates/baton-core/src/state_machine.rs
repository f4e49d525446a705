//! The replicated state machine: a pure function of the log.
//!
//! `apply` follows etcd 3.5's applier (`server/etcdserver/apply.go`, `txn.go`): every command
//! is first *checked* against the state before it, and only then *executed*. Execution cannot
//! fail, so a failed command never leaves half its writes behind and no rollback is needed.
//! All writes of one entry go to revision `current + 1`; the revision is bumped at the end if
//! (and only if) something was written.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::clients::{CachedResponse, ClientSession, ClientTable, Decision};
use crate::command::{
    AlarmAction, AlarmType, Applied, Command, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, DeleteRangeResponse, Entry, KvError, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, Response, ResponseOp, SortOrder, SortTarget, TxnRequest, TxnResponse,
};
use crate::crc32::{crc32, Crc32};
use crate::locks::{
    lock_key, lock_names_of, lock_prefix, FenceDecision, FenceTable, ForceReleaseRecord, LockInfo,
    LockRecord, LockSummary, LockTable, Queue,
};
use crate::mvcc::{
    key_value, visible_at, ChangeMap, Changed, Key, KeyMap, KeyStore, Live, Version,
};
use crate::types::{Event, EventKind, KeyRange, KeyValue, LeaseId, LogIndex, Revision, Term};
use crate::validate;

/// What the core knows about a lease. Deadlines are not here: the leader keeps them in memory
/// (keep-alives are not replicated); the core keeps the granted TTL and the last checkpointed
/// remaining TTL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub id: LeaseId,
    pub granted_ttl_s: i64,
    /// Remaining TTL (ms) as of the last checkpoint, if any was taken.
    pub checkpoint_remaining_ms: Option<i64>,
    /// Keys attached to the lease, sorted.
    pub keys: Vec<Vec<u8>>,
}

/// Why a snapshot could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot is not decodable: {0}")]
    Decode(String),
}

/// Events from the history for a watcher catching up.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryBatch {
    /// Events with `from <= mod_revision`, in revision order; whole revisions only.
    pub events: Vec<Event>,
    /// The first revision not covered by this batch (`current + 1` when caught up).
    pub next: Revision,
}

/// A lease as stored. The key set is the reverse index of `Live::lease`, kept so revoking a
/// lease does not scan the store.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct LeaseRecord {
    granted_ttl_s: i64,
    checkpoint_remaining_ms: Option<i64>,
    keys: BTreeSet<Vec<u8>>,
}

/// Revision of the empty store; etcd starts here too, so the first write gets revision 2.
const FIRST_REVISION: i64 = 1;

/// Snapshot format version, the first byte of every snapshot. Bump it when `SnapshotBody`
/// changes shape; `restore` refuses versions it does not know instead of misreading them.
/// Formats 1 (before locks and fences), 2 (before de-duplication sessions) and 3 (before
/// alarms) are still read, as states without those tables.
const SNAPSHOT_FORMAT: u8 = 4;
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
    last_applied: Option<(LogIndex, Term)>,
    last_time_ms: u64,
    keys: &'a KeyMap,
    changes: &'a ChangeMap,
    leases: &'a BTreeMap<LeaseId, LeaseRecord>,
    locks: &'a BTreeMap<Vec<u8>, LockRecord>,
    fences: &'a BTreeMap<Vec<u8>, i64>,
    clients: &'a BTreeMap<u64, ClientSession>,
    alarms: &'a BTreeSet<(u64, AlarmType)>,
}

/// The owned twin of `SnapshotBodyRef`; bincode is positional, so the two must list the same
/// fields in the same order.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBody {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(LogIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, i64>,
    clients: BTreeMap<u64, ClientSession>,
    alarms: BTreeSet<(u64, AlarmType)>,
}

/// Format 3's body: `SnapshotBody` without alarms.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Deserialize)]
struct SnapshotBodyV3 {
    revision: i64,
    compact_revision: i64,
    last_applied: Option<(LogIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, i64>,
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
    last_applied: Option<(LogIndex, Term)>,
    last_time_ms: u64,
    keys: BTreeMap<Key, Vec<Version>>,
    changes: BTreeMap<i64, Changed>,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    locks: BTreeMap<Vec<u8>, LockRecord>,
    fences: BTreeMap<Vec<u8>, i64>,
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
    last_applied: Option<(LogIndex, Term)>,
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
        }
    }
}

/// The whole replicated state. See the crate docs for the invariants.
#[derive(Debug, Clone)]
pub struct StateMachine {
    store: KeyStore,
    leases: BTreeMap<LeaseId, LeaseRecord>,
    /// Lock registry (lock-delay, force-release history) and its queue index.
    locks: LockTable,
    fences: FenceTable,
    /// De-duplication sessions of `Deduplicated` commands.
    clients: ClientTable,
    /// Raised alarms, by member (etcd's alarm store; replicated, in snapshots).
    alarms: BTreeSet<(u64, AlarmType)>,
    revision: i64,
    /// 1 (the empty store) until the first compaction: nothing before it can be lost.
    compact_revision: i64,
    /// `None` until the first entry, so an entry at index 0 is accepted once.
    last_applied: Option<(LogIndex, Term)>,
    last_time_ms: u64,
}

impl Default for StateMachine {
    fn default() -> Self {
        Self::new()
    }
}

/// The per-entry write context: the revision every write of this entry goes to, and the
/// events in the order they happened.
struct Writes {
    rev: i64,
    events: Vec<Event>,
}

impl StateMachine {
    /// An empty store at revision 1 with nothing applied.
    pub fn new() -> Self {
        StateMachine {
            store: KeyStore::default(),
            leases: BTreeMap::new(),
            locks: LockTable::default(),
            fences: FenceTable::default(),
            clients: ClientTable::default(),
            alarms: BTreeSet::new(),
            revision: FIRST_REVISION,
            compact_revision: FIRST_REVISION,
            last_applied: None,
            last_time_ms: 0,
        }
    }

    /// Applies one log entry. Never fails: domain errors come back as `Response::Error`, and
    /// such an entry changes nothing (but its index still counts as applied).
    pub fn apply(&mut self, entry: &Entry) -> Applied {
        if let Some((index, _)) = self.last_applied {
            // Applying out of order or twice would silently fork this replica from the others.
            assert!(
                entry.index > index,
                "log entry {} applied after {}",
                entry.index.0,
                index.0
            );
        }
        self.last_applied = Some((entry.index, entry.term));
        self.last_time_ms = self.last_time_ms.max(entry.time_ms);

        let mut w = Writes {
            rev: self.revision + 1,
            events: Vec::new(),
        };
        let response = match self.apply_command(&entry.command, &mut w) {
            Ok(r) => {
                let cmd = match &entry.command {
                    Command::Deduplicated { command, .. } => command,
                    other => other,
                };
                self.collect_idle_locks(cmd, &w.events);
                r
            }
            Err(e) => {
                assert!(w.events.is_empty(), "a failed command wrote something");
                Response::Error(e)
            }
        };
        if !w.events.is_empty() {
            debug_assert!(w.events.iter().all(|e| e.kv.mod_revision.0 == w.rev));
            self.revision = w.rev;
        }
        Applied {
            revision: Revision(self.revision),
            response,
            events: w.events,
        }
    }

    fn apply_command(&mut self, cmd: &Command, w: &mut Writes) -> Result<Response, KvError> {
        validate::validate(cmd)?;
        // Before any de-duplication decision: a refused exactly-once write leaves its
        // sequence unused, so the client's retry once space is back is applied, not answered
        // from a cache with this refusal.
        if self.no_space() && cmd.adds_data() {
            return Err(KvError::NoSpace);
        }
        match cmd {
            Command::Noop => Ok(Response::Noop),
            Command::Put(p) => {
                // etcd's top-level Put looks the lease up before the key (apply.go `Put`).
                self.check_put_lease(p)?;
                self.check_put_key(p)?;
                Ok(Response::Put(self.exec_put(p, w)))
            }
            Command::DeleteRange(d) => Ok(Response::DeleteRange(self.exec_delete(d, w))),
            Command::Txn(t) => {
                // Compares of the txn and of every nested txn on the chosen path are evaluated
                // against the state *before* the txn, as etcd's `compareToPath` does; so are
                // the per-op checks. Only then does anything get written.
                let mut path = Vec::new();
                self.compare_path(t, &mut path);
                self.check_txn(t, &path, &mut 0)?;
                Ok(Response::Txn(self.exec_txn(t, &path, &mut 0, w)))
            }
            Command::Compact { revision } => {
                self.compact(revision.0)?;
                Ok(Response::Compact)
            }
            Command::LeaseGrant { id, ttl_s } => {
                if id.is_none() || self.leases.contains_key(id) {
                    return Err(KvError::LeaseExists);
                }
                self.leases.insert(
                    *id,
                    LeaseRecord {
                        granted_ttl_s: *ttl_s,
                        checkpoint_remaining_ms: None,
                        keys: BTreeSet::new(),
                    },
                );
                Ok(Response::LeaseGrant {
                    id: *id,
                    ttl_s: *ttl_s,
                })
            }
            Command::LeaseRevoke { id } => {
                let lease = self.leases.remove(id).ok_or(KvError::LeaseNotFound)?;
                self.delete_lease_keys(*id, lease, w);
                Ok(Response::LeaseRevoke)
            }
            Command::ExpireLeases { ids } => self.expire_leases(ids, w),
            Command::ExpireLeasesInTerm { term, ids } => {
                let (_, entry_term) = self.last_applied.expect("set before apply_command");
                if entry_term != *term {
                    return Ok(Response::ExpireLeases {
                        expired: Vec::new(),
                        expired_holders: Vec::new(),
                    });
                }
                self.expire_leases(ids, w)
            }
            Command::LeaseCheckpoint { checkpoints } => {
                for (id, remaining_ms) in checkpoints {
                    if let Some(lease) = self.leases.get_mut(id) {
                        lease.checkpoint_remaining_ms = Some(*remaining_ms);
                    }
                }
                Ok(Response::LeaseCheckpoint)
            }
            Command::LockEnqueue {
                name,
                lease,
                value,
                delay_ms,
            } => {
                let key = lock_key(name, *lease);
                let exists = self.store.latest(&key).is_some();
                // etcd's `If create_revision(key) == 0 Then Put(key, value, lease)`: the lease
                // is checked only when the put runs.
                if !exists && !self.leases.contains_key(lease) {
                    return Err(KvError::LeaseNotFound);
                }
                self.ensure_registered(name)?;
                if let Some(d) = delay_ms {
                    self.locks
                        .record_mut(name)
                        .expect("just registered")
                        .delay_ms = *d;
                }
                if !exists {
                    let put = PutRequest {
                        key: key.clone(),
                        value: value.clone(),
                        lease: *lease,
                        ..PutRequest::default()
                    };
                    self.exec_put(&put, w);
                }
                let (m, live) = self.store.latest(&key).expect("waiter key exists");
                Ok(Response::LockEnqueue {
                    kv: key_value(&key, m, live),
                    created: !exists,
                })
            }
            Command::LockForceRelease {
                name,
                token,
                reason,
            } => {
                let head = self.lock_head(name);
                if *token != 0 && head.as_ref().map(|h| h.create_revision.0) != Some(*token) {
                    return Err(KvError::NotHolder);
                }
                let Some(head) = head else {
                    return Ok(Response::LockForceRelease { released: None });
                };
                self.ensure_registered(name)?;
                let at_ms = self.last_time_ms;
                self.locks
                    .record_mut(name)
                    .expect("just registered")
                    .push_force_release(ForceReleaseRecord {
                        key: head.key.clone(),
                        token: head.create_revision.0,
                        reason: reason.clone(),
                        at_ms,
                    });
                self.delete_key(head.clone(), w);
                Ok(Response::LockForceRelease {
                    released: Some(head),
                })
            }
            Command::FenceCheck { resource, token } => match self.fences.decide(resource, *token) {
                Err(()) => Err(KvError::FenceTableFull),
                Ok(FenceDecision::Reject { highest }) => Ok(Response::FenceCheck {
                    accepted: false,
                    highest,
                }),
                Ok(FenceDecision::Accept) => {
                    self.fences.record(resource, *token);
                    Ok(Response::FenceCheck {
                        accepted: true,
                        highest: *token,
                    })
                }
            },
            Command::RegisterClient { timeout_ms } => {
                let (index, _) = self.last_applied.expect("set before apply_command");
                // Index 0 never carries a client command in practice (openraft starts at 1);
                // keep ids non-zero regardless, 0 meaning "no session" on the wire.
                let client_id = index.0.max(1);
                let timeout_ms = self
                    .clients
                    .register(client_id, *timeout_ms, self.last_time_ms);
                Ok(Response::ClientRegistered {
                    client_id,
                    timeout_ms,
                })
            }
            Command::UnregisterClient { client_id } => Ok(Response::ClientUnregistered {
                existed: self.clients.unregister(*client_id),
            }),
            Command::Alarm {
                action,
                member_id,
                alarm,
            } => {
                let member = (*member_id, *alarm);
                let changed = match action {
                    AlarmAction::Activate => self.alarms.insert(member),
                    AlarmAction::Deactivate => self.alarms.remove(&member),
                };
                Ok(Response::Alarm {
                    changed: changed.then_some(member),
                })
            }
            Command::Deduplicated {
                client_id,
                sequence,
                acknowledged_below,
                command,
            } => {
                let decision = self.clients.decide(
                    *client_id,
                    *sequence,
                    *acknowledged_below,
                    self.last_time_ms,
                );
                match decision {
                    Decision::UnknownClient => Err(KvError::UnknownClient),
                    Decision::Stale => Err(KvError::StaleSequence),
                    Decision::Replay(cached) => Ok(Response::Deduplicated {
                        replayed: true,
                        revision: Revision(cached.revision),
                        response: Box::new(cached.response),
                    }),
                    Decision::Apply => {
                        // The wrapped command's own failure is an answer like any other: it is
                        // cached, so a retry gets the same error instead of a second attempt.
                        let response = self
                            .apply_command(command, w)
                            .unwrap_or_else(Response::Error);
                        let revision = if w.events.is_empty() {
                            self.revision
                        } else {
                            w.rev
                        };
                        self.clients.record(
                            *client_id,
                            *sequence,
                            CachedResponse {
                                revision,
                                response: response.clone(),
                            },
                        );
                        Ok(Response::Deduplicated {
                            replayed: false,
                            revision: Revision(revision),
                            response: Box::new(response),
                        })
                    }
                }
            }
        }
    }

    /// Expires `ids`: deletes every key of every listed lease in one revision and starts the
    /// lock-delay of the locks whose holders go with them.
    fn expire_leases(&mut self, ids: &[LeaseId], w: &mut Writes) -> Result<Response, KvError> {
        // Which of the doomed keys head a registered lock, judged on the state before
        // the entry: a waiter behind an expiring holder never held the lock, even if
        // its own lease expires in the same entry.
        let holders = self.expiring_holders(ids);
        let mut expired = Vec::new();
        for id in ids {
            // Unknown (already revoked, or listed twice) ids are ignored: the leader's
            // clock may have raced a revoke.
            if let Some(lease) = self.leases.remove(id) {
                self.delete_lease_keys(*id, lease, w);
                expired.push(*id);
            }
        }
        let now = self.last_time_ms;
        let mut expired_holders = Vec::with_capacity(holders.len());
        for (key, names) in holders {
            for name in names {
                let record = self
                    .locks
                    .record_mut(&name)
                    .expect("a lock with a key is registered until idle");
                if record.delay_ms > 0 {
                    let until = now.saturating_add(record.delay_ms);
                    record.delayed_until_ms = record.delayed_until_ms.max(until);
                }
            }
            expired_holders.push(key);
        }
        Ok(Response::ExpireLeases {
            expired,
            expired_holders,
        })
    }

    /// Number of open de-duplication sessions (for status and metrics).
    pub fn client_sessions(&self) -> usize {
        self.clients.len()
    }

    /// Registers lock `name` (with its current queue) unless it is; when the registry is
    /// full, first drops every idle lock. Fails (changing nothing: if nothing was idle,
    /// nothing was dropped) when that frees no room.
    fn ensure_registered(&mut self, name: &[u8]) -> Result<(), KvError> {
        if self.locks.is_registered(name) {
            return Ok(());
        }
        if self.locks.is_full() {
            self.locks.collect_all_idle(self.last_time_ms);
            if self.locks.is_full() {
                return Err(KvError::LockRegistryFull);
            }
        }
        let queue = self.scan_queue(name);
        self.locks.register(name, queue);
        Ok(())
    }

    /// `(key, lock names it heads)` for every key the listed leases would delete that heads
    /// at least one registered lock, in deletion order.
    fn expiring_holders(&self, ids: &[LeaseId]) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
        let mut holders = Vec::new();
        if self.locks.is_empty() {
            return holders;
        }
        let mut seen = BTreeSet::new();
        for id in ids {
            if !seen.insert(*id) {
                continue;
            }
            let Some(lease) = self.leases.get(id) else {
                continue;
            };
            for key in &lease.keys {
                let (_, live) = self
                    .store
                    .latest(key)
                    .expect("a lease lists only live keys");
                let names: Vec<Vec<u8>> = lock_names_of(key)
                    .filter(|name| {
                        self.locks
                            .queue(name)
                            .and_then(|q| q.first())
                            .is_some_and(|(rev, k)| {
                                *rev == live.create_revision && k.as_slice() == key.as_slice()
                            })
                    })
                    .map(<[u8]>::to_vec)
                    .collect();
                if !names.is_empty() {
                    holders.push((key.clone(), names));
                }
            }
        }
        holders
    }

    /// Registry garbage collection after a successful command: every registered lock that
    /// lost a key in this entry, or that the command named, is dropped if now idle.
    fn collect_idle_locks(&mut self, cmd: &Command, events: &[Event]) {
        if self.locks.is_empty() {
            return;
        }
        let mut touched: BTreeSet<Vec<u8>> = BTreeSet::new();
        for e in events.iter().filter(|e| e.kind == EventKind::Delete) {
            for name in lock_names_of(&e.kv.key) {
                if self.locks.is_registered(name) {
                    touched.insert(name.to_vec());
                }
            }
        }
        if let Command::LockForceRelease { name, .. } = cmd {
            touched.insert(name.clone());
        }
        let now = self.last_time_ms;
        for name in touched {
            self.locks.collect_if_idle(&name, now);
        }
    }

    /// Lock `name`'s queue read from the key space (for unregistered locks and to build the
    /// index): `O(keys under the prefix, tombstones included)`.
    fn scan_queue(&self, name: &[u8]) -> Queue {
        let range = lock_prefix(name);
        self.store
            .range(&range)
            .filter_map(|(k, vs)| {
                let live = vs.last()?.live.as_ref()?;
                Some((live.create_revision, k.to_vec()))
            })
            .collect()
    }

    fn with_queue<R>(&self, name: &[u8], f: impl FnOnce(&Queue) -> R) -> R {
        match self.locks.queue(name) {
            Some(q) => f(q),
            None => f(&self.scan_queue(name)),
        }
    }

    fn live_kv(&self, key: &[u8]) -> KeyValue {
        let (m, live) = self.store.latest(key).expect("queued keys are live");
        key_value(key, m, live)
    }

    /// Stateless checks the server runs before proposing, so bad input is refused without a
    /// log entry: empty keys, too many txn ops, a key modified twice in one txn, a TTL too
    /// large. `apply` repeats every check (the log may hold entries from older versions).
    ///
    /// Request size (`RequestTooLarge`) is not checked here: only the server knows the
    /// encoded protobuf size etcd's limit is defined on.
    pub fn validate(cmd: &Command) -> Result<(), KvError> {
        validate::validate(cmd)
    }

    /// A read at the current or a historical revision.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, KvError> {
        if req.range.key.is_empty() {
            return Err(KvError::EmptyKey);
        }
        let at = self.check_read_revision(req.revision)?;
        Ok(self.range_at(req, at))
    }

    /// The current store revision.
    /// Raised alarms as `(member id, alarm)`, in member order (etcd's `AlarmStore.Get`).
    pub fn alarms(&self) -> Vec<(u64, AlarmType)> {
        self.alarms.iter().copied().collect()
    }

    /// Whether a `NoSpace` alarm is raised for any member: commands that add data are
    /// refused ([`Command::adds_data`]).
    pub fn no_space(&self) -> bool {
        self.alarms.iter().any(|(_, a)| *a == AlarmType::NoSpace)
    }

    pub fn revision(&self) -> Revision {
        Revision(self.revision)
    }

    /// The revision history was compacted at (1 if never).
    pub fn compact_revision(&self) -> Revision {
        Revision(self.compact_revision)
    }

    /// The last log entry applied.
    pub fn last_applied(&self) -> (LogIndex, Term) {
        self.last_applied.unwrap_or_default()
    }

    /// The last `time_ms` seen in an applied entry (0 before any).
    pub fn last_time_ms(&self) -> u64 {
        self.last_time_ms
    }

    pub fn lease(&self, id: LeaseId) -> Option<LeaseInfo> {
        self.leases.get(&id).map(|l| LeaseInfo {
            id,
            granted_ttl_s: l.granted_ttl_s,
            checkpoint_remaining_ms: l.checkpoint_remaining_ms,
            keys: l.keys.iter().cloned().collect(),
        })
    }

    /// All live leases, ordered by id.
    pub fn lease_ids(&self) -> Vec<LeaseId> {
        self.leases.keys().copied().collect()
    }

    /// Whether the lease exists (cheaper than `lease`, which copies its key list).
    pub fn lease_exists(&self, id: LeaseId) -> bool {
        self.leases.contains_key(&id)
    }

    /// The head of lock `name`'s queue: the first live key under `<name>/` by create
    /// revision (ties in key order). Its create revision is the fencing token.
    /// `O(log n)` for registered locks, a prefix scan otherwise.
    pub fn lock_head(&self, name: &[u8]) -> Option<KeyValue> {
        self.with_queue(name, |q| q.first().map(|(_, k)| self.live_kv(k)))
    }

    /// The key just ahead of `(create_revision, key)` in lock `name`'s queue: what that
    /// waiter must see deleted before it can hold the lock. `None` means it is the head.
    pub fn lock_predecessor(
        &self,
        name: &[u8],
        create_revision: Revision,
        key: &[u8],
    ) -> Option<KeyValue> {
        self.with_queue(name, |q| {
            q.range(..(create_revision.0, key.to_vec()))
                .next_back()
                .map(|(_, k)| self.live_kv(k))
        })
    }

    /// The first `max` keys of lock `name`'s queue in order, and the queue's length.
    pub fn lock_queue(&self, name: &[u8], max: usize) -> (Vec<KeyValue>, usize) {
        self.with_queue(name, |q| {
            let kvs = q.iter().take(max).map(|(_, k)| self.live_kv(k)).collect();
            (kvs, q.len())
        })
    }

    /// The registry's record of lock `name` (`None` if it is not registered: never enqueued
    /// through `LockEnqueue`, or idle and collected).
    pub fn lock_info(&self, name: &[u8]) -> Option<LockInfo> {
        self.locks.record(name).map(LockRecord::info)
    }

    /// Number of locks in the registry.
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// Up to `max` registered locks in name order, after `after` (empty: from the first)
    /// and starting with `prefix`, plus whether more follow (page on with the last name).
    ///
    /// Only the registry is listed: every lock taken through the server's lock services is
    /// registered, while keys written by etcd's client-side recipes (`etcdctl lock`) under
    /// some prefix are not locks the core knows of until a server-side acquisition names
    /// them. Idle locks kept for a pending lock-delay or a recent force-release are listed
    /// with an empty queue.
    pub fn lock_list(&self, after: &[u8], prefix: &[u8], max: usize) -> (Vec<LockSummary>, bool) {
        let mut out = Vec::new();
        let mut more = false;
        for (name, record, queue) in self.locks.list(after, prefix) {
            if out.len() == max {
                more = true;
                break;
            }
            let (head, queue_len) = match queue {
                Some(q) => (q.first().map(|(_, k)| self.live_kv(k)), q.len()),
                None => (None, 0),
            };
            out.push(LockSummary {
                name: name.clone(),
                head,
                queue_len,
                delay_ms: record.delay_ms,
                delayed_until_ms: record.delayed_until_ms,
            });
        }
        (out, more)
    }

    /// The highest fencing token recorded for `resource` by `FenceCheck`.
    pub fn fence_highest(&self, resource: &[u8]) -> Option<i64> {
        self.fences.get(resource)
    }

    /// Events in `range` with revision `>= from`, at most about `max_events` (a revision is
    /// never split). `Err(KvError::Compacted)` if `from` is at or below the compact revision
    /// (and `from` is not past it).
    ///
    /// A compaction at `c` keeps the state *as of* `c` but not the changes that led to it
    /// (a delete at `c` leaves no trace), so events are complete only for revisions `> c`.
    /// Before any compaction (`c == 1`, the empty store) nothing is lost and `from = 1` is
    /// fine. `from <= 0` means "everything still retained" (`c + 1`).
    pub fn history(
        &self,
        range: &KeyRange,
        from: Revision,
        max_events: usize,
    ) -> Result<HistoryBatch, KvError> {
        let compacted = self.compact_revision > FIRST_REVISION;
        let from = if from.0 <= 0 {
            self.compact_revision + 1
        } else {
            from.0
        };
        if compacted && from <= self.compact_revision {
            return Err(KvError::Compacted);
        }
        let caught_up = from.max(self.revision + 1);
        if from > self.revision {
            return Ok(HistoryBatch {
                events: Vec::new(),
                next: Revision(caught_up),
            });
        }
        let (events, stopped_at) = self.store.events_from(range, from, max_events);
        Ok(HistoryBatch {
            events,
            next: Revision(stopped_at.unwrap_or(caught_up)),
        })
    }

    /// Live keys (latest revision).
    pub fn key_count(&self) -> usize {
        self.store.live_keys()
    }

    /// Rough bytes held by keys, values and history, for `dbSize` and metrics: key and value
    /// lengths of every retained version plus a fixed per-version overhead, and the lease
    /// table's key sets.
    pub fn approximate_size_bytes(&self) -> u64 {
        let leases: u64 = self
            .leases
            .values()
            .map(|l| 64 + l.keys.iter().map(|k| k.len() as u64 + 16).sum::<u64>())
            .sum();
        self.store.size_bytes() + leases + self.locks.size_bytes() + self.fences.size_bytes()
    }

    /// A deterministic hash of the key space at `revision` (0 = current), as etcd's HashKV:
    /// CRC-32 over every retained version (tombstones included) up to `revision`, plus the
    /// compact revision. Replicas that applied the same log agree on it; any divergence in
    /// keys, values, revisions, versions or leases changes it.
    pub fn hash_kv(&self, revision: i64) -> Result<u32, KvError> {
        let at = self.check_read_revision(revision)?;
        let mut crc = Crc32::new();
        crc.update_i64(self.compact_revision);
        self.store.hash_into(&mut crc, at);
        Ok(crc.finish())
    }

    /// Serializes the whole state (including history and last applied index).
    ///
    /// Format: one format byte, the CRC-32 of the body (little endian), then the bincode body.
    /// The checksum lets `restore` tell a damaged snapshot from a valid one instead of
    /// trusting whatever bincode manages to decode.
    pub fn snapshot(&self) -> Vec<u8> {
        let body = SnapshotBodyRef {
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
        };
        let payload = bincode::serialize(&body).expect("in-memory state always serializes");
        let mut out = Vec::with_capacity(payload.len() + 5);
        out.push(SNAPSHOT_FORMAT);
        out.extend_from_slice(&crc32(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// Inverse of `snapshot`.
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let err = |m: String| SnapshotError::Decode(m);
        let (&format, rest) = bytes
            .split_first()
            .ok_or_else(|| err("empty snapshot".into()))?;
        if ![
            SNAPSHOT_FORMAT,
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
        } else {
            bincode::deserialize(payload).map_err(|e| err(e.to_string()))?
        };
        if body.locks.len() > crate::locks::MAX_LOCKS
            || body.fences.len() > crate::locks::MAX_FENCE_RESOURCES
        {
            return Err(err("lock registry or fence table over capacity".into()));
        }
        let mut sm = StateMachine {
            store: KeyStore::from_parts(body.keys, body.changes),
            leases: body.leases,
            locks: LockTable::default(),
            fences: FenceTable::from_map(body.fences),
            clients: ClientTable::from_map(body.clients),
            alarms: body.alarms,
            revision: body.revision,
            compact_revision: body.compact_revision,
            last_applied: body.last_applied,
            last_time_ms: body.last_time_ms,
        };
        // The queue index is derived: rebuilt from the restored key space.
        sm.locks = LockTable::from_records(body.locks, |name| sm.scan_queue(name));
        sm.check_invariants().map_err(err)?;
        Ok(sm)
    }

    /// Verifies the internal invariants (revision order of every key's versions, the change
    /// index, compaction, lease key sets matching the store). `O(size of the store)`: meant
    /// for tests, the simulator and `restore` (the checksum catches damage; this catches a
    /// well-formed snapshot of a broken state), not for the apply path.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.revision < FIRST_REVISION
            || self.compact_revision < FIRST_REVISION
            || self.compact_revision > self.revision
        {
            return Err("impossible revisions".into());
        }
        self.store
            .check_invariants(self.revision, self.compact_revision)?;
        let mut attached = 0;
        for (id, lease) in &self.leases {
            if id.is_none() {
                return Err("lease id 0 in the lease table".into());
            }
            for key in &lease.keys {
                match self.store.latest(key) {
                    Some((_, live)) if live.lease == id.0 => attached += 1,
                    _ => return Err("lease key set out of sync with the store".into()),
                }
            }
        }
        let with_lease = self
            .store
            .keys()
            .values()
            .filter_map(|vs| vs.last()?.live.as_ref())
            .filter(|l| l.lease != 0)
            .count();
        if with_lease != attached {
            return Err("a live key names a lease that does not list it".into());
        }
        self.locks.check_invariants(|name| self.scan_queue(name))?;
        self.fences.check_invariants()?;
        self.clients.check_invariants()?;
        Ok(())
    }

    // ---- reads -------------------------------------------------------------------------

    /// Resolves a requested read revision (`<= 0` = current) and refuses the future and the
    /// compacted past. `revision == compact_revision` is readable: compaction keeps that state.
    fn check_read_revision(&self, revision: i64) -> Result<i64, KvError> {
        let at = if revision <= 0 {
            self.revision
        } else {
            revision
        };
        if at > self.revision {
            return Err(KvError::FutureRevision);
        }
        if at < self.compact_revision {
            return Err(KvError::Compacted);
        }
        Ok(at)
    }

    /// etcd's `Range` (apply.go) over the state at `at`, which the caller has checked.
    ///
    /// Mirrors etcd exactly, including a quirk: only an explicit sort order or a min/max
    /// filter makes it fetch everything before truncating. A non-key `sort_target` with
    /// `sort_order = None` sorts ascending, but only the first `limit + 1` keys in key order
    /// (what etcd does). Ties in the sort target keep key order in both directions (Go's sort
    /// is unstable there; a replicated state machine cannot be).
    fn range_at(&self, req: &RangeRequest, at: i64) -> RangeResponse {
        let fetch_all = req.sort_order != SortOrder::None
            || req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        let fetch_limit = if fetch_all || req.limit <= 0 {
            usize::MAX
        } else {
            usize::try_from(req.limit)
                .unwrap_or(usize::MAX)
                .saturating_add(1)
        };

        let mut count: i64 = 0;
        let mut kvs: Vec<KeyValue> = Vec::new();
        for (key, versions) in self.store.range(&req.range) {
            let Some((v, live)) = visible_at(versions, at) else {
                continue;
            };
            count += 1;
            if req.count_only || kvs.len() >= fetch_limit {
                continue;
            }
            let mut kv = KeyValue {
                key: key.to_vec(),
                create_revision: Revision(live.create_revision),
                mod_revision: Revision(v.mod_revision),
                version: live.version,
                value: Vec::new(),
                lease: LeaseId(live.lease),
            };
            // keys_only clears values only after sorting (etcd), so sorting by value
            // still needs them; otherwise do not copy them at all.
            if !req.keys_only || req.sort_target == SortTarget::Value {
                kv.value = live.value.to_vec();
            }
            kvs.push(kv);
        }

        kvs.retain(|kv| {
            (req.max_mod_revision == 0 || kv.mod_revision.0 <= req.max_mod_revision)
                && (req.min_mod_revision == 0 || kv.mod_revision.0 >= req.min_mod_revision)
                && (req.max_create_revision == 0 || kv.create_revision.0 <= req.max_create_revision)
                && (req.min_create_revision == 0 || kv.create_revision.0 >= req.min_create_revision)
        });

        let order = match (req.sort_target, req.sort_order) {
            (SortTarget::Key, SortOrder::None | SortOrder::Ascend) => SortOrder::None,
            (_, SortOrder::None) => SortOrder::Ascend,
            (_, o) => o,
        };
        if order != SortOrder::None {
            let target = req.sort_target;
            let cmp = |a: &KeyValue, b: &KeyValue| -> Ordering {
                match target {
                    SortTarget::Key => a.key.cmp(&b.key),
                    SortTarget::Version => a.version.cmp(&b.version),
                    SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                    SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                    SortTarget::Value => a.value.cmp(&b.value),
                }
            };
            if order == SortOrder::Descend {
                kvs.sort_by(|a, b| cmp(b, a));
            } else {
                kvs.sort_by(cmp);
            }
        }

        let mut more = false;
        if req.limit > 0 {
            let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
            if kvs.len() > limit {
                kvs.truncate(limit);
                more = true;
            }
        }
        if req.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value.clear());
        }
        RangeResponse { kvs, more, count }
    }

    /// etcd's `applyCompare`: every key of the range must satisfy the compare; a range with
    /// no keys compares as one all-zero key, except for `Value`, which then always fails
    /// (there is no way to tell a missing value from an empty one).
    fn compare(&self, c: &Compare) -> bool {
        let at = self.revision;
        let mut any = false;
        for (key, versions) in self.store.range(&c.range) {
            let Some((v, live)) = visible_at(versions, at) else {
                continue;
            };
            any = true;
            if !compare_kv(c, &key_value(key, v.mod_revision, live)) {
                return false;
            }
        }
        if any {
            return true;
        }
        if matches!(c.target, CompareTarget::Value(_)) {
            return false;
        }
        compare_kv(c, &KeyValue::default())
    }

    /// etcd's `compareToPath`: the compare outcome of this txn, then of each nested txn on the
    /// chosen branch, depth first. Consumed in the same order by `check_txn` and `exec_txn`.
    fn compare_path(&self, t: &TxnRequest, path: &mut Vec<bool>) {
        let ok = t.compare.iter().all(|c| self.compare(c));
        path.push(ok);
        let ops = if ok { &t.success } else { &t.failure };
        for op in ops {
            if let RequestOp::Txn(nested) = op {
                self.compare_path(nested, path);
            }
        }
    }

    // ---- checks (against the state before the entry; nothing is written yet) -----------

    fn check_put_lease(&self, p: &PutRequest) -> Result<(), KvError> {
        // With `ignore_lease` the request's lease is not used, so it need not exist.
        if !p.ignore_lease && !p.lease.is_none() && !self.leases.contains_key(&p.lease) {
            return Err(KvError::LeaseNotFound);
        }
        Ok(())
    }

    fn check_put_key(&self, p: &PutRequest) -> Result<(), KvError> {
        if (p.ignore_value || p.ignore_lease) && self.store.latest(&p.key).is_none() {
            return Err(KvError::KeyNotFound);
        }
        Ok(())
    }

    /// etcd's `checkTxn`: the ops on the chosen path, in order. Checking against the state
    /// before the txn is exact because validation forbids a put on a key the same txn
    /// deletes or puts, so an earlier op can never change the outcome of a later check.
    fn check_txn(&self, t: &TxnRequest, path: &[bool], cursor: &mut usize) -> Result<(), KvError> {
        let ok = path[*cursor];
        *cursor += 1;
        let ops = if ok { &t.success } else { &t.failure };
        for op in ops {
            match op {
                RequestOp::Range(r) => {
                    if r.revision > 0 {
                        self.check_read_revision(r.revision)?;
                    }
                }
                RequestOp::Put(p) => {
                    // In a txn etcd checks the key before the lease (`checkPut`).
                    self.check_put_key(p)?;
                    self.check_put_lease(p)?;
                }
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(nested) => self.check_txn(nested, path, cursor)?,
            }
        }
        Ok(())
    }

    fn compact(&mut self, revision: i64) -> Result<(), KvError> {
        if revision > self.revision {
            return Err(KvError::FutureRevision);
        }
        if revision <= self.compact_revision {
            return Err(KvError::Compacted);
        }
        self.store.compact(revision);
        self.compact_revision = revision;
        Ok(())
    }

    // ---- execution (cannot fail: everything was checked) -------------------------------

    fn exec_txn(
        &mut self,
        t: &TxnRequest,
        path: &[bool],
        cursor: &mut usize,
        w: &mut Writes,
    ) -> TxnResponse {
        let succeeded = path[*cursor];
        *cursor += 1;
        let ops = if succeeded { &t.success } else { &t.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let resp = match op {
                RequestOp::Range(r) => {
                    // Latest = including this txn's earlier writes (they are already in the
                    // store at `w.rev`); an explicit revision was checked against the state
                    // before the txn, so it can only see the past.
                    let at = if r.revision <= 0 { w.rev } else { r.revision };
                    ResponseOp::Range(self.range_at(r, at))
                }
                RequestOp::Put(p) => ResponseOp::Put(self.exec_put(p, w)),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.exec_delete(d, w)),
                RequestOp::Txn(nested) => ResponseOp::Txn(self.exec_txn(nested, path, cursor, w)),
            };
            responses.push(resp);
        }
        TxnResponse {
            succeeded,
            responses,
        }
    }

    fn exec_put(&mut self, p: &PutRequest, w: &mut Writes) -> PutResponse {
        let rev = w.rev;
        let (prev, kv) = self.store.put_with(&p.key, rev, |prev| {
            let live = Live {
                create_revision: prev.map_or(rev, |(_, l)| l.create_revision),
                version: prev.map_or(1, |(_, l)| l.version + 1),
                lease: match prev {
                    Some((_, l)) if p.ignore_lease => l.lease,
                    _ => p.lease.0,
                },
                value: match prev {
                    Some((_, l)) if p.ignore_value => l.value.clone(),
                    _ => p.value.as_slice().into(),
                },
            };
            let prev = prev.map(|(m, l)| key_value(&p.key, m, l));
            let kv = key_value(&p.key, rev, &live);
            (live, (prev, kv))
        });
        let lease = kv.lease;
        match &prev {
            Some(prev) => self.detach(prev.lease, &p.key),
            None => self.locks.key_created(&p.key, kv.create_revision.0),
        }
        if !lease.is_none() {
            let record = self
                .leases
                .get_mut(&lease)
                .expect("put's lease was checked to exist");
            record.keys.insert(p.key.clone());
        }
        w.events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: prev.clone(),
        });
        PutResponse {
            prev_kv: if p.prev_kv { prev } else { None },
        }
    }

    fn exec_delete(&mut self, d: &DeleteRangeRequest, w: &mut Writes) -> DeleteRangeResponse {
        let doomed: Vec<KeyValue> = self
            .store
            .range(&d.range)
            .filter_map(|(k, vs)| {
                let v = vs.last()?;
                v.live.as_ref().map(|l| key_value(k, v.mod_revision, l))
            })
            .collect();
        for kv in &doomed {
            self.delete_key(kv.clone(), w);
        }
        DeleteRangeResponse {
            deleted: doomed.len() as i64,
            prev_kvs: if d.prev_kv { doomed } else { Vec::new() },
        }
    }

    /// Tombstones one live key at `w.rev` and records its delete event.
    fn delete_key(&mut self, prev: KeyValue, w: &mut Writes) {
        self.detach(prev.lease, &prev.key);
        self.locks.key_deleted(&prev.key, prev.create_revision.0);
        self.store.delete(&prev.key, w.rev);
        w.events.push(Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: prev.key.clone(),
                mod_revision: Revision(w.rev),
                ..KeyValue::default()
            },
            prev_kv: Some(prev),
        });
    }

    /// Deletes every key of a lease that has just been removed from the table, in key order
    /// (etcd sorts them too), all at `w.rev`.
    fn delete_lease_keys(&mut self, id: LeaseId, lease: LeaseRecord, w: &mut Writes) {
        for key in lease.keys {
            let (m, live) = self
                .store
                .latest(&key)
                .expect("a lease lists only live keys");
            assert_eq!(live.lease, id.0, "lease key set out of sync with the store");
            let prev = key_value(&key, m, live);
            self.delete_key(prev, w);
        }
    }

    fn detach(&mut self, lease: LeaseId, key: &[u8]) {
        if lease.is_none() {
            return;
        }
        // The lease may already be gone when its own keys are being deleted.
        if let Some(record) = self.leases.get_mut(&lease) {
            record.keys.remove(key);
        }
    }
}

/// etcd's `compareKV`.
fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.0.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.0.cmp(v),
        CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
        CompareTarget::Lease(v) => kv.lease.0.cmp(v),
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::NotEqual => ord != Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, command: Command) -> Entry {
        Entry {
            index: LogIndex(index),
            term: Term(1),
            time_ms: index * 10,
            command,
        }
    }

    fn put(key: &str, value: &str) -> Command {
        Command::Put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..PutRequest::default()
        })
    }

    /// etcd's deepest txn with a put at the bottom (one op a level, 128 in all) is
    /// validated, applied, and written to and read from the log (bincode) like any other;
    /// one level more runs out of op budget.
    #[test]
    fn a_txn_nested_128_deep_applies_and_round_trips_through_bincode() {
        let nested = |levels: usize| {
            let Command::Put(leaf) = put("deep", "v") else {
                unreachable!()
            };
            let mut t = TxnRequest {
                success: vec![RequestOp::Put(leaf)],
                ..TxnRequest::default()
            };
            for _ in 1..levels {
                t = TxnRequest {
                    success: vec![RequestOp::Txn(t)],
                    ..TxnRequest::default()
                };
            }
            Command::Txn(t)
        };
        assert_eq!(
            StateMachine::validate(&nested(129)),
            Err(KvError::TooManyOps)
        );
        let cmd = nested(128);
        StateMachine::validate(&cmd).unwrap();
        let e = entry(1, cmd);
        let bytes = bincode::serialize(&e).unwrap();
        let back: Entry = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, e);
        let mut sm = StateMachine::new();
        let applied = sm.apply(&back);
        assert_eq!(applied.revision, Revision(2));
        let Response::Txn(mut r) = applied.response else {
            panic!("{:?}", applied.response)
        };
        let mut depth = 1;
        while let Some(ResponseOp::Txn(inner)) = r.responses.pop() {
            depth += 1;
            r = inner;
        }
        assert_eq!(depth, 128);
        assert_eq!(sm.key_count(), 1);
    }

    #[test]
    fn empty_store_is_at_revision_one() {
        let sm = StateMachine::new();
        assert_eq!(sm.revision(), Revision(1));
        assert_eq!(sm.compact_revision(), Revision(1));
        assert_eq!(sm.last_applied(), (LogIndex(0), Term(0)));
        assert_eq!(sm.key_count(), 0);
        assert_eq!(StateMachine::default().revision(), Revision(1));
    }

    #[test]
    #[should_panic(expected = "applied after")]
    fn out_of_order_apply_panics() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(5, Command::Noop));
        sm.apply(&entry(5, Command::Noop));
    }

    #[test]
    fn index_zero_is_accepted_once_at_the_start() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(0, Command::Noop));
        sm.apply(&entry(1, Command::Noop));
        assert_eq!(sm.last_applied(), (LogIndex(1), Term(1)));
        assert_eq!(sm.last_time_ms(), 10);
    }

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

    #[test]
    fn hash_kv_tracks_content_and_revision() {
        let mut a = StateMachine::new();
        let mut b = StateMachine::new();
        a.apply(&entry(1, put("k", "v1")));
        b.apply(&entry(1, put("k", "v2")));
        assert_ne!(a.hash_kv(0), b.hash_kv(0));
        let h2 = a.hash_kv(0).expect("current");
        a.apply(&entry(2, put("k", "v3")));
        assert_eq!(a.hash_kv(2), Ok(h2), "hash at a past revision is stable");
        assert_ne!(a.hash_kv(0), Ok(h2));
        assert_eq!(a.hash_kv(9), Err(KvError::FutureRevision));
        a.apply(&entry(
            3,
            Command::Compact {
                revision: Revision(3),
            },
        ));
        assert_eq!(a.hash_kv(2), Err(KvError::Compacted));
        let restored = StateMachine::restore(&a.snapshot()).expect("restore");
        assert_eq!(restored.hash_kv(0), a.hash_kv(0));
    }

    fn enqueue(name: &str, lease: i64) -> Command {
        Command::LockEnqueue {
            name: name.into(),
            lease: LeaseId(lease),
            value: Vec::new(),
            delay_ms: None,
        }
    }

    #[test]
    fn full_lock_registry_collects_idle_locks_or_refuses() {
        let mut sm = StateMachine::new();
        sm.locks.set_capacity(2);
        let mut i = 0;
        let mut at = |sm: &mut StateMachine, time_ms: u64, command: Command| {
            i += 1;
            sm.apply(&Entry {
                index: LogIndex(i),
                term: Term(1),
                time_ms,
                command,
            })
        };
        at(
            &mut sm,
            0,
            Command::LeaseGrant {
                id: LeaseId(1),
                ttl_s: 60,
            },
        );
        assert!(matches!(
            at(&mut sm, 0, enqueue("a", 1)).response,
            Response::LockEnqueue { .. }
        ));
        assert!(matches!(
            at(&mut sm, 0, enqueue("b", 1)).response,
            Response::LockEnqueue { .. }
        ));
        let before = sm.snapshot();
        let full = at(&mut sm, 0, enqueue("c", 1));
        assert_eq!(full.response, Response::Error(KvError::LockRegistryFull));
        assert!(full.events.is_empty());
        // Nothing changed but the applied index and time.
        let mut cmp = StateMachine::restore(&before).expect("restore");
        cmp.last_applied = sm.last_applied;
        assert_eq!(cmp.snapshot(), sm.snapshot());
        // A force-release keeps "a" registered (its record) after its only key is gone...
        let fr = at(
            &mut sm,
            10,
            Command::LockForceRelease {
                name: "a".into(),
                token: 0,
                reason: "test".into(),
            },
        );
        assert!(matches!(
            fr.response,
            Response::LockForceRelease { released: Some(_) }
        ));
        assert_eq!(sm.lock_count(), 2);
        assert_eq!(
            at(&mut sm, 20, enqueue("c", 1)).response,
            Response::Error(KvError::LockRegistryFull)
        );
        // ...until the record ages out; then a registration at capacity sweeps it away.
        let later = 10 + crate::locks::FORCE_RELEASE_RETENTION_MS;
        assert!(matches!(
            at(&mut sm, later, enqueue("c", 1)).response,
            Response::LockEnqueue { .. }
        ));
        assert_eq!(sm.lock_info(b"a"), None);
        assert!(sm.lock_info(b"c").is_some());
        // Deleting a lock's last key collects it at once when nothing else is pending.
        at(
            &mut sm,
            later,
            Command::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: b"b/1".to_vec(),
                    range_end: Vec::new(),
                },
                prev_kv: false,
            }),
        );
        assert_eq!(sm.lock_info(b"b"), None);
        assert_eq!(sm.lock_count(), 1);
        sm.check_invariants().expect("invariants");
    }

    #[test]
    fn lock_list_pages_through_the_registry_in_name_order() {
        let mut sm = StateMachine::new();
        let mut i = 0;
        let mut apply = |sm: &mut StateMachine, command: Command| {
            i += 1;
            sm.apply(&entry(i, command))
        };
        for lease in [1, 2] {
            apply(
                &mut sm,
                Command::LeaseGrant {
                    id: LeaseId(lease),
                    ttl_s: 60,
                },
            );
        }
        for (name, lease) in [("jobs/b", 1), ("jobs/a", 1), ("jobs/a", 2), ("other", 2)] {
            assert!(matches!(
                apply(&mut sm, enqueue(name, lease)).response,
                Response::LockEnqueue { .. }
            ));
        }
        let names = |list: &[LockSummary]| {
            list.iter()
                .map(|l| String::from_utf8(l.name.clone()).unwrap())
                .collect::<Vec<_>>()
        };
        let (all, more) = sm.lock_list(b"", b"", 10);
        assert_eq!(names(&all), ["jobs/a", "jobs/b", "other"]);
        assert!(!more);
        let a = &all[0];
        assert_eq!(a.queue_len, 2);
        let head = a.head.as_ref().expect("held");
        assert_eq!(head.key, lock_key(b"jobs/a", LeaseId(1)));
        assert_eq!(Some(head.clone()), sm.lock_head(b"jobs/a"));

        // Bounded, with `more`; the next page starts after the last name seen.
        let (page, more) = sm.lock_list(b"", b"", 2);
        assert_eq!(
            (names(&page), more),
            (vec!["jobs/a".into(), "jobs/b".into()], true)
        );
        let (rest, more) = sm.lock_list(b"jobs/b", b"", 2);
        assert_eq!((names(&rest), more), (vec!["other".to_string()], false));

        // A prefix narrows the walk; `after` before the prefix starts at the prefix.
        let (jobs, _) = sm.lock_list(b"a", b"jobs/", 10);
        assert_eq!(names(&jobs), ["jobs/a", "jobs/b"]);
        let (none, more) = sm.lock_list(b"jobs/b", b"jobs/", 10);
        assert!(none.is_empty() && !more);

        // An empty but still registered lock is listed without a head.
        apply(&mut sm, Command::LeaseRevoke { id: LeaseId(2) });
        let (after_revoke, _) = sm.lock_list(b"", b"", 10);
        assert_eq!(after_revoke[0].queue_len, 1);
        assert!(
            after_revoke.iter().all(|l| l.name != b"other"),
            "idle lock collected"
        );
    }

    #[test]
    fn full_fence_table_refuses_new_resources_only() {
        let mut sm = StateMachine::new();
        sm.fences.set_capacity(1);
        let fence = |r: &str, token: i64| Command::FenceCheck {
            resource: r.into(),
            token,
        };
        sm.apply(&entry(1, fence("r", 5)));
        assert_eq!(
            sm.apply(&entry(2, fence("s", 5))).response,
            Response::Error(KvError::FenceTableFull)
        );
        assert_eq!(
            sm.apply(&entry(3, fence("r", 7))).response,
            Response::FenceCheck {
                accepted: true,
                highest: 7
            }
        );
        assert_eq!(sm.fence_highest(b"s"), None);
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
            last_applied: Option<(LogIndex, Term)>,
            last_time_ms: u64,
            keys: BTreeMap<Vec<u8>, Vec<OldVersion>>,
            changes: BTreeMap<i64, Vec<Vec<u8>>>,
            leases: &'a BTreeMap<LeaseId, LeaseRecord>,
            locks: &'a BTreeMap<Vec<u8>, LockRecord>,
            fences: &'a BTreeMap<Vec<u8>, i64>,
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
        assert!(sm.store.changes().values().any(|c| c.as_slice().len() == 2));
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
        // Format 4 is format 3 plus the alarm set (here empty: a zero length).
        let mut now = payload.clone();
        now.extend_from_slice(&0u64.to_le_bytes());
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
        };
        // Format 1 is format 4 without the four trailing collections (bincode is positional).
        let full = bincode::serialize(&body).expect("serialize");
        let payload = &full[..full.len() - 32];
        let mut v1 = vec![SNAPSHOT_FORMAT_V1];
        v1.extend_from_slice(&crc32(payload).to_le_bytes());
        v1.extend_from_slice(payload);
        let restored = StateMachine::restore(&v1).expect("format 1 restores");
        assert_eq!(restored.hash_kv(0), sm.hash_kv(0));
        assert_eq!(restored.snapshot(), sm.snapshot());
    }

    #[test]
    fn size_grows_with_history_and_shrinks_with_compaction() {
        let mut sm = StateMachine::new();
        assert_eq!(sm.approximate_size_bytes(), 0);
        sm.apply(&entry(1, put("key", &"x".repeat(1000))));
        let one = sm.approximate_size_bytes();
        assert!(one >= 1003);
        sm.apply(&entry(2, put("key", &"y".repeat(1000))));
        assert!(sm.approximate_size_bytes() >= 2 * 1003);
        sm.apply(&entry(
            3,
            Command::Compact {
                revision: Revision(3),
            },
        ));
        assert_eq!(sm.approximate_size_bytes(), one);
    }

    fn alarm(action: AlarmAction, member_id: u64) -> Command {
        Command::Alarm {
            action,
            member_id,
            alarm: AlarmType::NoSpace,
        }
    }

    /// The NOSPACE alarm refuses exactly what adds data, changes nothing when it refuses,
    /// and lets deletes, compaction and revokes through; clearing it lets writes in again.
    #[test]
    fn no_space_alarm_refuses_what_adds_data_only() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        sm.apply(&entry(
            2,
            Command::LeaseGrant {
                id: LeaseId(7),
                ttl_s: 60,
            },
        ));
        let raised = sm.apply(&entry(3, alarm(AlarmAction::Activate, 42)));
        assert_eq!(
            raised.response,
            Response::Alarm {
                changed: Some((42, AlarmType::NoSpace))
            }
        );
        assert!(raised.events.is_empty(), "an alarm is no revision");
        assert_eq!(sm.alarms(), vec![(42, AlarmType::NoSpace)]);
        // Raising it twice changes nothing.
        let again = sm.apply(&entry(4, alarm(AlarmAction::Activate, 42)));
        assert_eq!(again.response, Response::Alarm { changed: None });

        let before = sm.hash_kv(0).unwrap();
        let txn_with_put = Command::Txn(TxnRequest {
            compare: Vec::new(),
            success: Vec::new(),
            failure: vec![RequestOp::Txn(TxnRequest {
                compare: Vec::new(),
                success: vec![RequestOp::Put(PutRequest {
                    key: b"n".to_vec(),
                    ..Default::default()
                })],
                failure: Vec::new(),
            })],
        });
        let refused = [
            put("b", "2"),
            txn_with_put,
            Command::LeaseGrant {
                id: LeaseId(8),
                ttl_s: 60,
            },
            enqueue("lock", 7),
            Command::RegisterClient { timeout_ms: 60_000 },
            Command::Deduplicated {
                client_id: 1,
                sequence: 1,
                acknowledged_below: 0,
                command: Box::new(put("c", "3")),
            },
        ];
        for (i, cmd) in refused.into_iter().enumerate() {
            assert!(cmd.adds_data(), "{cmd:?}");
            let a = sm.apply(&entry(10 + i as u64, cmd));
            assert_eq!(a.response, Response::Error(KvError::NoSpace));
            assert!(a.events.is_empty());
        }
        assert_eq!(sm.hash_kv(0).unwrap(), before, "refusals changed nothing");
        assert_eq!(sm.client_sessions(), 0);
        assert_eq!(sm.lease_ids(), vec![LeaseId(7)]);

        // A read-only txn, deletes, compaction and revokes go through.
        let read_txn = Command::Txn(TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp::Range(RangeRequest {
                range: KeyRange {
                    key: b"a".to_vec(),
                    range_end: Vec::new(),
                },
                ..Default::default()
            })],
            failure: Vec::new(),
        });
        assert!(!read_txn.adds_data());
        assert!(matches!(
            sm.apply(&entry(20, read_txn)).response,
            Response::Txn(_)
        ));
        let del = sm.apply(&entry(
            21,
            Command::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: b"a".to_vec(),
                    range_end: Vec::new(),
                },
                prev_kv: false,
            }),
        ));
        assert!(matches!(del.response, Response::DeleteRange(ref d) if d.deleted == 1));
        let rev = sm.revision();
        assert_eq!(
            sm.apply(&entry(22, Command::Compact { revision: rev }))
                .response,
            Response::Compact
        );
        assert_eq!(
            sm.apply(&entry(23, Command::LeaseRevoke { id: LeaseId(7) }))
                .response,
            Response::LeaseRevoke
        );

        // The alarm survives a snapshot, and clearing it lets writes in again.
        let mut sm = StateMachine::restore(&sm.snapshot()).expect("restores");
        assert!(sm.no_space());
        let other = sm.apply(&entry(24, alarm(AlarmAction::Deactivate, 41)));
        assert_eq!(other.response, Response::Alarm { changed: None });
        assert!(sm.no_space(), "another member's alarm is not this one");
        let cleared = sm.apply(&entry(25, alarm(AlarmAction::Deactivate, 42)));
        assert_eq!(
            cleared.response,
            Response::Alarm {
                changed: Some((42, AlarmType::NoSpace))
            }
        );
        assert!(!sm.no_space());
        assert!(matches!(
            sm.apply(&entry(26, put("b", "2"))).response,
            Response::Put(_)
        ));
    }

    #[test]
    fn format_three_snapshots_restore_without_alarms() {
        let mut sm = StateMachine::new();
        sm.apply(&entry(1, put("a", "1")));
        let snap = sm.snapshot();
        assert_eq!(snap[0], SNAPSHOT_FORMAT);
        // Format 3 is format 4 without the trailing alarm set.
        let payload = &snap[5..snap.len() - 8];
        let mut v3 = vec![SNAPSHOT_FORMAT_V3];
        v3.extend_from_slice(&crc32(payload).to_le_bytes());
        v3.extend_from_slice(payload);
        let restored = StateMachine::restore(&v3).expect("format 3 restores");
        assert!(restored.alarms().is_empty());
        assert_eq!(restored.snapshot(), snap);
    }
}
