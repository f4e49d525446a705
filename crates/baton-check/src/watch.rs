//! Watch-stream integrity.
//!
//! etcd promises that a watch from revision `r` delivers every change to the watched keys at
//! revisions `>= r`, in revision order, each exactly once — across leader changes and
//! reconnects. Coordination recipes (caches, elections, queues) are built on that promise,
//! and a missed or repeated event silently corrupts them. This checker compares what one
//! watcher received with the authoritative change history (e.g. read back from the store, or
//! the simulator's record of committed revisions) and reports the first place the stream
//! departs from it.

use crate::bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// What happened to a key at a revision.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// The key was set to this value.
    Put(Bytes),
    /// The key was deleted.
    Delete,
}

/// One change, as delivered to a watcher or as recorded authoritatively. Within one
/// revision (a txn touching several keys) events come in the txn's order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WatchEvent {
    /// The revision of the change (the event's `kv.mod_revision`).
    pub revision: u64,
    /// The key changed.
    pub key: Bytes,
    /// What changed.
    pub kind: EventKind,
}

impl fmt::Display for WatchEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            EventKind::Put(v) => write!(f, "rev {} put {} = {v}", self.revision, self.key),
            EventKind::Delete => write!(f, "rev {} delete {}", self.revision, self.key),
        }
    }
}

/// The keys a watch covers, in etcd's terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyRange {
    /// Exactly one key (empty `range_end`).
    Key(Bytes),
    /// Every key with this prefix (`--prefix`).
    Prefix(Bytes),
    /// Keys in `[start, end)`; `end: None` means no upper bound (`range_end = "\0"`).
    Range {
        /// Inclusive lower bound.
        start: Bytes,
        /// Exclusive upper bound, if any.
        end: Option<Bytes>,
    },
}

impl KeyRange {
    /// Whether the watch covers `key`.
    pub fn contains(&self, key: &Bytes) -> bool {
        match self {
            KeyRange::Key(k) => key == k,
            KeyRange::Prefix(p) => key.starts_with(p.as_slice()),
            KeyRange::Range { start, end } => key >= start && end.as_ref().is_none_or(|e| key < e),
        }
    }
}

/// What one watcher asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchSpec {
    /// The keys watched.
    pub range: KeyRange,
    /// The first revision the watch must deliver (etcd's `start_revision`; resolve "0 =
    /// from now" to the concrete revision before checking).
    pub start_revision: u64,
    /// If set, the stream must have delivered every matching change up to and including this
    /// revision (e.g. the store's revision when the watcher was stopped after a quiet
    /// period). If `None`, a stream that simply ends early passes: it may have been
    /// cancelled.
    pub through_revision: Option<u64>,
}

/// A stream that passed: how much it covered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSummary {
    /// Events received (all matched).
    pub received: usize,
    /// Matching events in the authoritative history from the start revision on.
    pub expected: usize,
    /// Revision of the last event received.
    pub last_revision: Option<u64>,
}

/// The first way a watch stream departs from the authoritative history.
/// `index` is the position in the received stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchViolation {
    /// The authoritative history itself is malformed (revisions decreasing, or a key changed
    /// twice in one revision): a harness bug, reported so it is not blamed on the watcher.
    BadHistory {
        /// Position in the authoritative history.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The event was already delivered.
    Duplicate {
        /// Position of the repeat.
        index: usize,
        /// Position of the first delivery.
        first_index: usize,
        /// The event.
        event: WatchEvent,
    },
    /// The event was delivered after one that follows it in the history (a lower revision,
    /// or an earlier position in the same txn, arrived late).
    OutOfOrder {
        /// Position of the late event.
        index: usize,
        /// The late event.
        event: WatchEvent,
        /// Position of the event that overtook it.
        after_index: usize,
        /// The event that overtook it.
        after: WatchEvent,
    },
    /// Matching changes were skipped: `received` arrived while these were still owed.
    Gap {
        /// Position of the event that arrived too early.
        index: usize,
        /// That event.
        received: WatchEvent,
        /// The first skipped changes (at most ten).
        missing: Vec<WatchEvent>,
        /// How many were skipped in all.
        missing_count: usize,
    },
    /// The event names a real change (same revision and key) but with different content.
    Mismatch {
        /// Position of the event.
        index: usize,
        /// What the watcher got.
        received: WatchEvent,
        /// What actually happened.
        expected: WatchEvent,
    },
    /// The event does not belong in this stream at all.
    Unexpected {
        /// Position of the event.
        index: usize,
        /// The event.
        event: WatchEvent,
        /// Why: no such change, outside the range, or before the start revision.
        why: String,
    },
    /// The stream ended before delivering everything up to `through_revision`.
    Incomplete {
        /// The required revision.
        through: u64,
        /// The first changes never delivered (at most ten).
        missing: Vec<WatchEvent>,
        /// How many were never delivered in all.
        missing_count: usize,
    },
}

fn fmt_missing(f: &mut fmt::Formatter<'_>, missing: &[WatchEvent], count: usize) -> fmt::Result {
    for (i, m) in missing.iter().enumerate() {
        f.write_str(if i == 0 { "" } else { ", " })?;
        write!(f, "{m}")?;
    }
    if count > missing.len() {
        write!(f, " and {} more", count - missing.len())?;
    }
    Ok(())
}

impl fmt::Display for WatchViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchViolation::BadHistory { index, reason } => {
                write!(f, "authoritative history entry {index}: {reason}")
            }
            WatchViolation::Duplicate {
                index,
                first_index,
                event,
            } => write!(
                f,
                "watch event {index} ({event}) duplicates event {first_index}"
            ),
            WatchViolation::OutOfOrder {
                index,
                event,
                after_index,
                after,
            } => write!(
                f,
                "watch event {index} ({event}) was delivered after event {after_index} ({after}), which follows it"
            ),
            WatchViolation::Gap {
                index,
                received,
                missing,
                missing_count,
            } => {
                write!(f, "watch event {index} ({received}) skipped ")?;
                fmt_missing(f, missing, *missing_count)
            }
            WatchViolation::Mismatch {
                index,
                received,
                expected,
            } => write!(
                f,
                "watch event {index} is ({received}) but the change was ({expected})"
            ),
            WatchViolation::Unexpected { index, event, why } => {
                write!(f, "watch event {index} ({event}) should not be there: {why}")
            }
            WatchViolation::Incomplete {
                through,
                missing,
                missing_count,
            } => {
                write!(f, "watch stream stopped short of revision {through}: never got ")?;
                fmt_missing(f, missing, *missing_count)
            }
        }
    }
}

impl std::error::Error for WatchViolation {}

const MISSING_SHOWN: usize = 10;

/// Checks that `received` is exactly the authoritative changes matching `spec`, in order,
/// without gaps or duplicates — a prefix of them, or all of them through
/// `spec.through_revision` when that is set.
///
/// `authoritative` is every committed change (any keys), in revision order. The violation
/// is boxed because it carries events and the happy path should stay small.
pub fn check_watch(
    spec: &WatchSpec,
    received: &[WatchEvent],
    authoritative: &[WatchEvent],
) -> Result<WatchSummary, Box<WatchViolation>> {
    // Index the authoritative history by (revision, key); position in `expected` if matching.
    let mut by_id: HashMap<(u64, &Bytes), (usize, Option<usize>)> = HashMap::new();
    let mut expected: Vec<&WatchEvent> = Vec::new();
    for (i, e) in authoritative.iter().enumerate() {
        if i > 0 && e.revision < authoritative[i - 1].revision {
            return Err(Box::new(WatchViolation::BadHistory {
                index: i,
                reason: format!(
                    "revision {} follows revision {}",
                    e.revision,
                    authoritative[i - 1].revision
                ),
            }));
        }
        let wanted = e.revision >= spec.start_revision && spec.range.contains(&e.key);
        let pos = wanted.then_some(expected.len());
        if by_id.insert((e.revision, &e.key), (i, pos)).is_some() {
            return Err(Box::new(WatchViolation::BadHistory {
                index: i,
                reason: format!("key {} changed twice in revision {}", e.key, e.revision),
            }));
        }
        if wanted {
            expected.push(e);
        }
    }

    let missing_from = |from: usize, to: usize| -> (Vec<WatchEvent>, usize) {
        let missing = expected[from..to]
            .iter()
            .take(MISSING_SHOWN)
            .map(|e| (*e).clone())
            .collect();
        (missing, to - from)
    };
    // received_at[k] = where expected[k] was delivered.
    let mut received_at: Vec<Option<usize>> = vec![None; expected.len()];
    let mut next = 0usize;
    for (index, ev) in received.iter().enumerate() {
        if next < expected.len() && ev == expected[next] {
            received_at[next] = Some(index);
            next += 1;
            continue;
        }
        let found = by_id.get(&(ev.revision, &ev.key)).copied();
        let Some((auth_index, pos)) = found else {
            return Err(Box::new(WatchViolation::Unexpected {
                index,
                event: ev.clone(),
                why: "no such change in the authoritative history".to_string(),
            }));
        };
        let Some(k) = pos else {
            let why = if ev.revision < spec.start_revision {
                format!(
                    "revision {} is before the start revision {}",
                    ev.revision, spec.start_revision
                )
            } else {
                format!("key {} is outside the watched range", ev.key)
            };
            return Err(Box::new(WatchViolation::Unexpected {
                index,
                event: ev.clone(),
                why,
            }));
        };
        if ev != &authoritative[auth_index] {
            return Err(Box::new(WatchViolation::Mismatch {
                index,
                received: ev.clone(),
                expected: authoritative[auth_index].clone(),
            }));
        }
        if let Some(first_index) = received_at[k] {
            return Err(Box::new(WatchViolation::Duplicate {
                index,
                first_index,
                event: ev.clone(),
            }));
        }
        // k > next: expected[next] is owed. If it shows up later it was overtaken, not lost.
        if let Some(late) = received[index + 1..]
            .iter()
            .position(|e| e == expected[next])
        {
            return Err(Box::new(WatchViolation::OutOfOrder {
                index: index + 1 + late,
                event: expected[next].clone(),
                after_index: index,
                after: ev.clone(),
            }));
        }
        // Otherwise everything from expected[next] up to this event was skipped.
        let (missing, missing_count) = missing_from(next, k);
        return Err(Box::new(WatchViolation::Gap {
            index,
            received: ev.clone(),
            missing,
            missing_count,
        }));
    }

    if let Some(through) = spec.through_revision {
        let owed = expected[next..]
            .iter()
            .take_while(|e| e.revision <= through)
            .count();
        if owed > 0 {
            let (missing, missing_count) = missing_from(next, next + owed);
            return Err(Box::new(WatchViolation::Incomplete {
                through,
                missing,
                missing_count,
            }));
        }
    }
    Ok(WatchSummary {
        received: received.len(),
        expected: expected.len(),
        last_revision: received.last().map(|e| e.revision),
    })
}
