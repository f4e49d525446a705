//! Queries over the whole state that belong to no one domain: the revisions and the last
//! applied entry, the watch history a catching-up watcher reads, key counts and size, and
//! `hash_kv`, by which replicas compare their key spaces.
//!
//! Reads of one domain stay with it (`range` in `kv`, leases in `lease`, locks and fences in
//! `lock`). Nothing here changes the state.

use crate::command::KvError;
use crate::crc32::Crc32;
use crate::mvcc::key_value;
use crate::types::{CommandIndex, Event, EventShape, KeyRange, KeyValue, Revision, Term};

use super::store::{StateMachine, FIRST_REVISION};

/// Events from the history for a watcher catching up.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryBatch {
    /// The wanted events with `from <= mod_revision`, in revision order; whole revisions
    /// only.
    pub events: Vec<Event>,
    /// The first revision not covered by this batch (`current + 1` when caught up).
    pub next: Revision,
}

impl StateMachine {
    /// The fencing-token signing keys: the current pair (what this member signs grants
    /// with) and every public key kept.
    pub fn fencing_keys(&self) -> &crate::fencing_keys::FencingKeys {
        &self.fencing_keys
    }

    /// The current store revision.
    pub fn revision(&self) -> Revision {
        Revision(self.revision)
    }

    /// The revision history was compacted at (1 if never).
    pub fn compact_revision(&self) -> Revision {
        Revision(self.compact_revision)
    }

    /// The last log entry applied.
    pub fn last_applied(&self) -> (CommandIndex, Term) {
        self.last_applied.unwrap_or_default()
    }

    /// The last `time_ms` seen in an applied entry (0 before any).
    pub fn last_time_ms(&self) -> u64 {
        self.last_time_ms
    }

    /// Events in `range` with revision `>= from`, at most about `max_events` (a revision is
    /// never split). `Err(KvError::Compacted)` if `from` is at or below the compact revision
    /// (and `from` is not past it).
    ///
    /// A compaction at `c` keeps the state *as of* `c` but not the changes that led to it
    /// (a delete at `c` leaves no trace), so events are complete only for revisions `> c`.
    /// Before any compaction (`c == 1`, the empty store) nothing is lost and `from = 1` is
    /// fine. `from <= 0` means "everything still retained" (`c + 1`).
    ///
    /// Only the events `shape` wants are built (and their values read), but `max_events`
    /// counts every event in `range`, and at most `HISTORY_REVISIONS_PER_EVENT` times as
    /// many revisions are walked (`max_events` 0 counts as 1): they bound the work of one
    /// call.
    pub fn history(
        &self,
        range: &KeyRange,
        from: Revision,
        max_events: usize,
        shape: EventShape,
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
        let (events, stopped_at) = self.store.events_from(range, from, max_events, shape);
        Ok(HistoryBatch {
            events,
            next: Revision(stopped_at.unwrap_or(caught_up)),
        })
    }

    /// The live version of `key`, as a range of that one key at the current revision returns
    /// it, without a range's request handling: the lock engine reads its waiter key at every
    /// turn of every acquisition.
    pub fn live_key(&self, key: &[u8]) -> Option<KeyValue> {
        let (mod_revision, live) = self.store.latest(key)?;
        Some(key_value(key, mod_revision, live))
    }

    /// Live keys (latest revision).
    pub fn key_count(&self) -> usize {
        self.store.live_keys()
    }

    /// The key space's share of [`Self::approximate_size_bytes`] (every retained version),
    /// kept up to date by every write and compaction: `O(1)`, for a check after every apply.
    pub fn kv_size_bytes(&self) -> u64 {
        self.store.size_bytes()
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::state_machine::tests::{entry, put};

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
}
