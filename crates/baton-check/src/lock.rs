//! Lock safety as judged by the fence.
//!
//! A distributed lock cannot by itself guarantee mutual exclusion: a client that paused
//! (GC, SIGSTOP) or was partitioned may still believe it holds a lock whose lease expired.
//! What Baton guarantees is that the *fence* (the resource's token check) accepts writes from
//! at most one holder at a time, in token order. So the judge is the fence: a holding counts
//! only if at least one of its fenced writes was accepted, and
//! - the accepted holdings of one lock never overlap in time, and
//! - their fencing tokens strictly increase over time.
//!
//! Rejected holdings (the fence turned the writes down) are exactly the stale holders the
//! fence exists to stop; they are counted but cannot violate safety.

use crate::bytes::Bytes;
use crate::history::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One period during which a client believed it held a lock, with its fenced-write outcome.
///
/// Record `enter` when the acquire returned and `exit` when the client released the lock,
/// gave up, or was killed (use the kill time). Several records with the same lock, holder
/// and token are one holding (a fence accepts repeated writes with the current token), and
/// are merged into the interval spanning them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    /// The lock (its name or key prefix).
    pub lock: Bytes,
    /// Which client held it, for reports and for merging repeated writes of one holding.
    pub holder: u64,
    /// The fencing token the client was given (in Baton, its lock key's create revision).
    pub token: u64,
    /// When the client started acting as holder.
    pub enter: Time,
    /// When the client stopped acting as holder.
    pub exit: Time,
    /// Whether the fence accepted the client's write(s) under this token.
    pub accepted: bool,
}

impl fmt::Display for LockRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "holder {} token {} [{}, {}]{}",
            self.holder,
            self.token,
            self.enter,
            self.exit,
            if self.accepted { "" } else { " (rejected)" }
        )
    }
}

/// A breach of lock safety.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockViolation {
    /// `exit < enter`: the recorder is broken; the record is skipped.
    InvalidInterval(LockRecord),
    /// Two holdings accepted by the fence overlap in time: two holders at once.
    Overlap {
        /// The holding that started first.
        first: LockRecord,
        /// The holding that started while `first` was still active.
        second: LockRecord,
    },
    /// A later accepted holding had a token not above an earlier one's: the fence let a
    /// stale (or duplicated) token through.
    TokenNotIncreasing {
        /// The earlier holding.
        earlier: LockRecord,
        /// The later holding, with a token `<=` the earlier one's.
        later: LockRecord,
    },
}

impl fmt::Display for LockViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockViolation::InvalidInterval(r) => {
                write!(f, "lock {}: record ends before it starts: {r}", r.lock)
            }
            LockViolation::Overlap { first, second } => write!(
                f,
                "lock {}: two holders accepted by the fence at once: {first} and {second}",
                first.lock
            ),
            LockViolation::TokenNotIncreasing { earlier, later } => write!(
                f,
                "lock {}: token did not increase: {earlier}, then {later}",
                earlier.lock
            ),
        }
    }
}

/// The result of [`check_locks`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockReport {
    /// Distinct locks seen.
    pub locks: usize,
    /// Accepted holdings after merging (the ones that count).
    pub accepted_holdings: usize,
    /// Records the fence rejected.
    pub rejected: usize,
    /// Every violation found, per lock in time order. Empty means safe.
    pub violations: Vec<LockViolation>,
}

impl LockReport {
    /// Whether no violation was found.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for LockReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "locks: {} locks, {} accepted holdings, {} rejected, {} violations",
            self.locks,
            self.accepted_holdings,
            self.rejected,
            self.violations.len()
        )?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        Ok(())
    }
}

/// Checks that, per lock, the fence accepted at most one holder at any time and in strictly
/// increasing token order.
///
/// Intervals are closed-open for this purpose: a holding that starts at the instant the
/// previous one ended does not overlap it (coarse clocks make such ties common).
pub fn check_locks(records: &[LockRecord]) -> LockReport {
    let mut report = LockReport::default();
    let mut holdings: BTreeMap<(&Bytes, u64, u64), LockRecord> = BTreeMap::new();
    let mut locks: BTreeMap<&Bytes, ()> = BTreeMap::new();
    for r in records {
        locks.insert(&r.lock, ());
        if r.exit < r.enter {
            report
                .violations
                .push(LockViolation::InvalidInterval(r.clone()));
            continue;
        }
        if !r.accepted {
            report.rejected += 1;
            continue;
        }
        holdings
            .entry((&r.lock, r.holder, r.token))
            .and_modify(|h| {
                h.enter = h.enter.min(r.enter);
                h.exit = h.exit.max(r.exit);
            })
            .or_insert_with(|| r.clone());
    }
    report.locks = locks.len();
    report.accepted_holdings = holdings.len();

    let mut per_lock: BTreeMap<&Bytes, Vec<LockRecord>> = BTreeMap::new();
    for ((lock, _, _), h) in holdings {
        per_lock.entry(lock).or_default().push(h);
    }
    for (_, mut hs) in per_lock {
        hs.sort_by_key(|h| (h.enter, h.exit, h.token, h.holder));
        // `latest` reaches furthest in time so far; `top` has the highest token so far.
        let mut latest: Option<&LockRecord> = None;
        let mut top: Option<&LockRecord> = None;
        for h in &hs {
            if let (Some(l), Some(t)) = (latest, top) {
                if h.enter < l.exit {
                    report.violations.push(LockViolation::Overlap {
                        first: l.clone(),
                        second: h.clone(),
                    });
                } else if h.token <= t.token {
                    report.violations.push(LockViolation::TokenNotIncreasing {
                        earlier: t.clone(),
                        later: h.clone(),
                    });
                }
            }
            if latest.is_none_or(|l| h.exit > l.exit) {
                latest = Some(h);
            }
            if top.is_none_or(|t| h.token > t.token) {
                top = Some(h);
            }
        }
    }
    report
}
