//! Locks and fencing as replicated state: the lock registry (lock-delay and force-release
//! history per lock, plus a derived index of each registered lock's queue) and the fence
//! table.
//!
//! A lock named `N` is etcd's recipe: its queue is every live key under `N/`, ordered by
//! create revision; the head of the queue holds the lock and its create revision is the
//! fencing token. Waiter keys are `N/<lease id in lowercase hex>` ([`lock_key`]). None of
//! that needs the registry: it exists for what the key space cannot express.
//!
//! - **Lock-delay** (Chubby): when lease *expiry* deletes the head of a registered lock whose
//!   delay is non-zero, the lock is not granted again before `time_ms + delay_ms`. Only the
//!   core sees *why* a key disappeared (expiry vs. a clean release or a revoke), which is why
//!   this lives here and not in the server. The core only records the deadline; granting is
//!   the server's job (it waits on it).
//! - **Force-release history**: the last [`MAX_FORCE_RELEASE_RECORDS`] operator
//!   force-releases of each lock, with their reasons.
//! - **The queue index**: for registered locks, the live keys under `N/` by create revision,
//!   so finding the head or a waiter's predecessor is `O(log n)` instead of a scan over the
//!   prefix (which, before compaction, also walks every tombstone a busy lock left behind).
//!   Derived from the key space: maintained on every key creation and deletion, rebuilt on
//!   restore, checked by `check_invariants`.
//!
//! Bounds, and why: the registry holds at most [`MAX_LOCKS`] locks and the fence table at
//! most [`MAX_FENCE_RESOURCES`] resources; past them the command fails with a clear error
//! instead of growing the replicated state without limit. A registry entry is
//! garbage-collected when its lock is *idle* (no keys, no lock-delay pending, no
//! force-release in the last [`FORCE_RELEASE_RETENTION_MS`]): checked whenever an entry
//! deletes one of its keys or names it, and for all entries when the registry is full. Its
//! settings are forgotten with it (`baton.v1` acquires send the delay again). Fence entries
//! are never collected: a forgotten highest token would let a stale token through.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::types::{FencingToken, KeyRange, KeyValue, LeaseId};

/// Locks the registry holds at most.
pub const MAX_LOCKS: usize = 100_000;
/// Resources the fence table holds at most.
pub const MAX_FENCE_RESOURCES: usize = 100_000;
/// Force-release records kept per lock (oldest dropped first).
pub const MAX_FORCE_RELEASE_RECORDS: usize = 16;
/// Longest force-release reason, in bytes (records are replicated state: keep them small).
pub const MAX_REASON_BYTES: usize = 1024;
/// Longest lock-delay (Chubby allows up to a minute; an hour is already absurd, and a bound
/// keeps `time + delay` far from overflow).
pub const MAX_LOCK_DELAY_MS: u64 = 60 * 60 * 1000;
/// How long a force-release record keeps an otherwise idle lock in the registry.
pub const FORCE_RELEASE_RETENTION_MS: u64 = 60 * 60 * 1000;

/// etcd's waiter key for `name` and `lease`: `<name>/<lease id in lowercase hex>`, formatted
/// as Go's `%x` does for an `int64` (so a negative id gets a minus sign, not two's
/// complement), because etcd's clients and tools compute the same key.
pub fn lock_key(name: &[u8], lease: LeaseId) -> Vec<u8> {
    let hex = if lease.0 < 0 {
        format!("-{:x}", lease.0.unsigned_abs())
    } else {
        format!("{:x}", lease.0)
    };
    let mut key = Vec::with_capacity(name.len() + 1 + hex.len());
    key.extend_from_slice(name);
    key.push(b'/');
    key.extend_from_slice(hex.as_bytes());
    key
}

/// The key range of lock `name`'s queue: every key under `<name>/`.
pub fn lock_prefix(name: &[u8]) -> KeyRange {
    let mut key = name.to_vec();
    key.push(b'/');
    let range_end = prefix_end(&key);
    KeyRange { key, range_end }
}

/// etcd's `GetPrefixRangeEnd`: the smallest key greater than every key starting with `p`.
pub fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("non-empty") += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

/// The name of the lock `key` was enqueued in: everything before its last `/` (`None` when
/// there is no `/`). Deeper keys also belong to the queues of their other ancestors; see
/// [`lock_names_of`].
pub fn lock_name_of(key: &[u8]) -> Option<&[u8]> {
    let i = key.iter().rposition(|&b| b == b'/')?;
    Some(&key[..i])
}

/// Every lock name whose queue contains `key`: each prefix `p` with `key` starting with
/// `p/` (etcd's prefix semantics: `a/b/c` is in the queues of `a` and `a/b`).
pub(crate) fn lock_names_of(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    key.iter()
        .enumerate()
        .filter(|(_, &b)| b == b'/')
        .map(move |(i, _)| &key[..i])
}

/// One operator force-release, as recorded.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForceReleaseRecord {
    /// The released holder's key.
    pub key: Vec<u8>,
    /// Its fencing token (create revision).
    pub token: FencingToken,
    pub reason: String,
    /// Leader time (`Entry::time_ms`) of the release.
    pub at_ms: u64,
}

/// What the registry knows about one lock (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// Lock-delay applied when the holder's lease expires; 0 = none.
    pub delay_ms: u64,
    /// Leader time before which the lock must not be granted (0 = never delayed).
    pub delayed_until_ms: u64,
    /// Newest last.
    pub force_releases: Vec<ForceReleaseRecord>,
}

/// One registered lock as [`crate::StateMachine::lock_list`] reports it: enough for an
/// overview of every lock (who holds it, how many wait) without one `lock_queue` call per
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockSummary {
    pub name: Vec<u8>,
    /// The head of the queue: the holder, unless a lock-delay is still running (then it is
    /// the next to be granted). `None` when the queue is empty.
    pub head: Option<KeyValue>,
    /// Keys in the queue, the head included.
    pub queue_len: usize,
    /// Lock-delay applied when the holder's lease expires; 0 = none.
    pub delay_ms: u64,
    /// Leader time before which the lock must not be granted (0 = never delayed).
    pub delayed_until_ms: u64,
}

/// A registry entry as stored (and snapshotted).
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct LockRecord {
    pub(crate) delay_ms: u64,
    pub(crate) delayed_until_ms: u64,
    pub(crate) force_releases: VecDeque<ForceReleaseRecord>,
}

impl LockRecord {
    /// Idle apart from keys: nothing pending at `now_ms` that the record must remember.
    pub(crate) fn expired_at(&self, now_ms: u64) -> bool {
        self.delayed_until_ms <= now_ms
            && self
                .force_releases
                .back()
                .is_none_or(|r| r.at_ms.saturating_add(FORCE_RELEASE_RETENTION_MS) <= now_ms)
    }

    pub(crate) fn push_force_release(&mut self, record: ForceReleaseRecord) {
        if self.force_releases.len() == MAX_FORCE_RELEASE_RECORDS {
            self.force_releases.pop_front();
        }
        self.force_releases.push_back(record);
    }

    pub(crate) fn info(&self) -> LockInfo {
        LockInfo {
            delay_ms: self.delay_ms,
            delayed_until_ms: self.delayed_until_ms,
            force_releases: self.force_releases.iter().cloned().collect(),
        }
    }

    fn size_bytes(&self) -> u64 {
        64 + self
            .force_releases
            .iter()
            .map(|r| 32 + r.key.len() as u64 + r.reason.len() as u64)
            .sum::<u64>()
    }
}

/// A lock's queue: live keys under `<name>/` as `(create revision, key)`, in queue order.
/// The key breaks ties: a txn can create several keys under one prefix at one revision, and
/// a range sorted by create revision keeps key order among them.
pub(crate) type Queue = BTreeSet<(i64, Vec<u8>)>;

/// The registered locks' queues at one moment (`StateMachine::lock_contention`): contention
/// without a label per lock name, whose values would be unbounded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockContention {
    /// Locks with a holder (a non-empty queue).
    pub held: u64,
    /// Keys queued behind a holder, over all locks.
    pub waiters: u64,
    /// The longest queue behind one holder.
    pub max_waiters: u64,
}

/// The registry with its derived queue index. Every registered name has a queue (possibly
/// empty) and vice versa.
#[derive(Debug, Clone)]
pub(crate) struct LockTable {
    records: BTreeMap<Vec<u8>, LockRecord>,
    queues: BTreeMap<Vec<u8>, Queue>,
    capacity: usize,
}

impl Default for LockTable {
    fn default() -> Self {
        LockTable {
            records: BTreeMap::new(),
            queues: BTreeMap::new(),
            capacity: MAX_LOCKS,
        }
    }
}

impl LockTable {
    /// A table from its persisted records; `queue_of` rebuilds each registered lock's queue
    /// from the key space.
    pub(crate) fn from_records(
        records: BTreeMap<Vec<u8>, LockRecord>,
        mut queue_of: impl FnMut(&[u8]) -> Queue,
    ) -> Self {
        let queues = records
            .keys()
            .map(|name| (name.clone(), queue_of(name)))
            .collect();
        LockTable {
            records,
            queues,
            capacity: MAX_LOCKS,
        }
    }

    #[cfg(test)]
    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    pub(crate) fn records(&self) -> &BTreeMap<Vec<u8>, LockRecord> {
        &self.records
    }

    pub(crate) fn record(&self, name: &[u8]) -> Option<&LockRecord> {
        self.records.get(name)
    }

    pub(crate) fn record_mut(&mut self, name: &[u8]) -> Option<&mut LockRecord> {
        self.records.get_mut(name)
    }

    /// See [`LockContention`].
    pub(crate) fn contention(&self) -> LockContention {
        let mut c = LockContention::default();
        for q in self.queues.values().filter(|q| !q.is_empty()) {
            let waiters = q.len() as u64 - 1;
            c.held += 1;
            c.waiters += waiters;
            c.max_waiters = c.max_waiters.max(waiters);
        }
        c
    }

    pub(crate) fn queue(&self, name: &[u8]) -> Option<&Queue> {
        self.queues.get(name)
    }

    /// Registered names in order, starting after `after` (empty: from the start), that
    /// begin with `prefix`, each with its queue. A range walk over the ordered map, so a
    /// page costs `O(log n + page)` however many locks there are.
    pub(crate) fn list<'a>(
        &'a self,
        after: &[u8],
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a Vec<u8>, &'a LockRecord, Option<&'a Queue>)> + 'a {
        use std::ops::Bound;
        let start = if !after.is_empty() && after >= prefix {
            Bound::Excluded(after.to_vec())
        } else {
            Bound::Included(prefix.to_vec())
        };
        self.records
            .range::<Vec<u8>, _>((start, Bound::Unbounded))
            .take_while(move |(name, _)| name.starts_with(prefix))
            .map(|(name, record)| (name, record, self.queues.get(name)))
    }

    pub(crate) fn is_registered(&self, name: &[u8]) -> bool {
        self.records.contains_key(name)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn is_full(&self) -> bool {
        self.records.len() >= self.capacity
    }

    /// Registers `name` with its current queue. The caller checked capacity.
    pub(crate) fn register(&mut self, name: &[u8], queue: Queue) {
        assert!(!self.is_registered(name), "lock registered twice");
        assert!(!self.is_full(), "lock registry over capacity");
        self.records.insert(name.to_vec(), LockRecord::default());
        self.queues.insert(name.to_vec(), queue);
    }

    /// Index maintenance: `key` was created at `create_revision`.
    pub(crate) fn key_created(&mut self, key: &[u8], create_revision: i64) {
        if self.queues.is_empty() {
            return;
        }
        for name in lock_names_of(key) {
            if let Some(q) = self.queues.get_mut(name) {
                let fresh = q.insert((create_revision, key.to_vec()));
                assert!(fresh, "lock queue index out of sync (key created twice)");
            }
        }
    }

    /// Index maintenance: `key`, created at `create_revision`, was deleted.
    pub(crate) fn key_deleted(&mut self, key: &[u8], create_revision: i64) {
        if self.queues.is_empty() {
            return;
        }
        for name in lock_names_of(key) {
            if let Some(q) = self.queues.get_mut(name) {
                let found = q.remove(&(create_revision, key.to_vec()));
                assert!(found, "lock queue index out of sync (unknown key deleted)");
            }
        }
    }

    /// Drops `name` if it is idle at `now_ms`; true if it did.
    pub(crate) fn collect_if_idle(&mut self, name: &[u8], now_ms: u64) -> bool {
        let idle = match (self.records.get(name), self.queues.get(name)) {
            (Some(r), Some(q)) => q.is_empty() && r.expired_at(now_ms),
            _ => false,
        };
        if idle {
            self.records.remove(name);
            self.queues.remove(name);
        }
        idle
    }

    /// Drops every idle lock (used only when the registry is full, so the `O(n)` walk is
    /// paid at most once per registration attempt at capacity).
    pub(crate) fn collect_all_idle(&mut self, now_ms: u64) {
        let idle: Vec<Vec<u8>> = self
            .records
            .iter()
            .filter(|(name, r)| {
                r.expired_at(now_ms) && self.queues.get(*name).is_some_and(Queue::is_empty)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in idle {
            self.records.remove(&name);
            self.queues.remove(&name);
        }
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.records
            .iter()
            .map(|(name, r)| name.len() as u64 + r.size_bytes())
            .sum::<u64>()
            + self
                .queues
                .values()
                .flat_map(|q| q.iter())
                .map(|(_, k)| k.len() as u64 + 16)
                .sum::<u64>()
    }

    /// Structural checks; `scan` recomputes a queue from the key space.
    pub(crate) fn check_invariants(
        &self,
        mut scan: impl FnMut(&[u8]) -> Queue,
    ) -> Result<(), String> {
        if self.records.len() > self.capacity {
            return Err("lock registry over capacity".into());
        }
        if self.records.len() != self.queues.len() {
            return Err("lock registry and queue index disagree".into());
        }
        for (name, r) in &self.records {
            if name.is_empty() {
                return Err("empty lock name in the registry".into());
            }
            if r.force_releases.len() > MAX_FORCE_RELEASE_RECORDS {
                return Err("too many force-release records".into());
            }
            let Some(q) = self.queues.get(name) else {
                return Err("registered lock without a queue".into());
            };
            if *q != scan(name) {
                return Err(format!(
                    "lock queue index out of sync for {}",
                    String::from_utf8_lossy(name)
                ));
            }
        }
        Ok(())
    }
}

/// The fence table: the highest token seen per resource.
#[derive(Debug, Clone)]
pub(crate) struct FenceTable {
    highest: BTreeMap<Vec<u8>, FencingToken>,
    capacity: usize,
}

impl Default for FenceTable {
    fn default() -> Self {
        FenceTable {
            highest: BTreeMap::new(),
            capacity: MAX_FENCE_RESOURCES,
        }
    }
}

/// What a fence check decided, before it is applied.
pub(crate) enum FenceDecision {
    /// Accept and record `token` (it is the new highest).
    Accept,
    /// Reject: `highest` stays.
    Reject { highest: FencingToken },
}

impl FenceTable {
    pub(crate) fn from_map(highest: BTreeMap<Vec<u8>, FencingToken>) -> Self {
        FenceTable {
            highest,
            capacity: MAX_FENCE_RESOURCES,
        }
    }

    #[cfg(test)]
    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    pub(crate) fn map(&self) -> &BTreeMap<Vec<u8>, FencingToken> {
        &self.highest
    }

    pub(crate) fn get(&self, resource: &[u8]) -> Option<FencingToken> {
        self.highest.get(resource).copied()
    }

    /// Decides without changing anything (so a refused check leaves no trace).
    pub(crate) fn decide(&self, resource: &[u8], token: FencingToken) -> Result<FenceDecision, ()> {
        match self.highest.get(resource) {
            Some(&h) if token < h => Ok(FenceDecision::Reject { highest: h }),
            Some(_) => Ok(FenceDecision::Accept),
            None if self.highest.len() >= self.capacity => Err(()),
            None => Ok(FenceDecision::Accept),
        }
    }

    /// Records `token` as `resource`'s highest, after `decide` accepted it.
    pub(crate) fn record(&mut self, resource: &[u8], token: FencingToken) {
        match self.highest.get_mut(resource) {
            Some(highest) => {
                // The pair: the recorded token never goes below the one before it, or a
                // holder already fenced off would pass the fence again.
                assert!(
                    token >= *highest,
                    "fence token {token} recorded below the highest {highest}"
                );
                *highest = token;
            }
            None => {
                assert!(
                    self.highest.len() < self.capacity,
                    "fence table over capacity"
                );
                self.highest.insert(resource.to_vec(), token);
            }
        }
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.highest.keys().map(|k| k.len() as u64 + 24).sum()
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        if self.highest.len() > self.capacity {
            return Err("fence table over capacity".into());
        }
        if self.highest.iter().any(|(r, &t)| r.is_empty() || t.0 <= 0) {
            return Err("malformed fence table entry".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_etcds_layout() {
        assert_eq!(lock_key(b"job", LeaseId(0x694d)), b"job/694d".to_vec());
        assert_eq!(lock_key(b"a/b", LeaseId(255)), b"a/b/ff".to_vec());
        // Go's %x on a negative int64.
        assert_eq!(lock_key(b"x", LeaseId(-26)), b"x/-1a".to_vec());
        assert_eq!(
            lock_key(b"x", LeaseId(i64::MIN)),
            b"x/-8000000000000000".to_vec()
        );
        let p = lock_prefix(b"job");
        assert_eq!(p.key, b"job/".to_vec());
        assert_eq!(p.range_end, b"job0".to_vec());
        assert_eq!(prefix_end(&[0xff, 0xff]), vec![0]);
        assert_eq!(lock_name_of(b"a/b/c"), Some(&b"a/b"[..]));
        assert_eq!(lock_name_of(b"abc"), None);
        let names: Vec<&[u8]> = lock_names_of(b"a/b/c").collect();
        assert_eq!(names, vec![&b"a"[..], &b"a/b"[..]]);
        assert_eq!(lock_names_of(b"/x").collect::<Vec<_>>(), vec![&b""[..]]);
    }

    #[test]
    fn force_release_history_is_bounded() {
        let mut r = LockRecord::default();
        for i in 0..(MAX_FORCE_RELEASE_RECORDS as u64 + 5) {
            r.push_force_release(ForceReleaseRecord {
                key: b"k".to_vec(),
                token: FencingToken(i as i64 + 2),
                reason: "r".into(),
                at_ms: i,
            });
        }
        assert_eq!(r.force_releases.len(), MAX_FORCE_RELEASE_RECORDS);
        assert_eq!(r.force_releases.front().map(|x| x.at_ms), Some(5));
        assert!(!r.expired_at(100));
        assert!(r.expired_at(20 + FORCE_RELEASE_RETENTION_MS));
    }

    #[test]
    fn fence_decisions() {
        let mut f = FenceTable::default();
        f.set_capacity(1);
        let t = FencingToken;
        assert!(matches!(f.decide(b"r", t(5)), Ok(FenceDecision::Accept)));
        f.record(b"r", t(5));
        assert!(matches!(
            f.decide(b"r", t(4)),
            Ok(FenceDecision::Reject {
                highest: FencingToken(5)
            })
        ));
        assert!(matches!(f.decide(b"r", t(5)), Ok(FenceDecision::Accept)));
        assert!(f.decide(b"other", t(9)).is_err(), "full");
    }

    #[test]
    #[should_panic(expected = "recorded below the highest")]
    fn a_fence_never_records_a_lower_token() {
        let mut f = FenceTable::default();
        f.record(b"r", FencingToken(5));
        f.record(b"r", FencingToken(4));
    }
}
