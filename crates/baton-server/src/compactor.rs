//! Auto-compaction (`--auto-compaction-mode`, `--auto-compaction-retention`), with etcd 3.4's
//! semantics (`etcdserver/api/v3compactor/periodic.go`, `revision.go`, and the flag parsing
//! of `embed/etcd.go`):
//!
//! - **periodic** keeps `retention` of history. A revision is recorded every
//!   `min(retention, 1h) / 10`; the first compaction comes `retention` after start, to the
//!   revision recorded `retention` before, then one every `min(retention, 1h)` after the last
//!   success, to the oldest revision recorded in the sliding window of
//!   `retention / (min(retention, 1h) / 10) + 1` samples; a failure is retried after one
//!   recording interval.
//! - **revision** keeps `retention` revisions: every 5 minutes, compacts to
//!   `current − retention` unless that is not positive or the revision compacted last time.
//!
//! Only the leader compacts (etcd pauses the compactor on followers; periodic keeps
//! recording revisions meanwhile). A compaction is a normal `Compact` proposed through the
//! log, as a client's, so every member applies it at the same index; "already compacted"
//! counts as done. Retention 0 (etcd's default) is off. The decisions are pure
//! ([`Periodic`], [`RevisionMode`], time passed in), the task around them ([`spawn`]) owns
//! the clock.

use std::collections::VecDeque;
use std::time::Duration;

use baton_core::{Command, KvError, Response, Revision};
use baton_raft::Node;

/// etcd's `retryDivisor`: a periodic compactor records a revision every tenth of its interval.
const RETRY_DIVISOR: u32 = 10;
/// etcd's cap of the periodic compaction interval.
const MAX_PERIODIC_INTERVAL: Duration = Duration::from_secs(3600);
/// etcd's `revInterval`: how often the revision compactor looks.
pub const REVISION_INTERVAL: Duration = Duration::from_secs(300);

/// What `--auto-compaction-mode` and `--auto-compaction-retention` ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Keep this much time of history.
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(i64),
}

/// A refused auto-compaction flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// etcd's words (`embed/config.go`).
    #[error("unknown auto-compaction-mode {0:?} (periodic or revision)")]
    UnknownMode(String),
    #[error(
        "--auto-compaction-retention={0:?}: periodic retention is a duration (\"1h\", \"30m\", \
         \"2s\") or a whole number of hours"
    )]
    BadDuration(String),
    /// etcd would read a duration as that many nanoseconds of revisions; refused instead.
    #[error(
        "--auto-compaction-retention={0:?}: revision retention is a whole number of revisions"
    )]
    BadRevisions(String),
}

impl Policy {
    /// The flags as etcd reads them: a non-negative integer is hours (periodic) or
    /// revisions (revision); anything else must be a Go duration, for periodic mode. `None`:
    /// retention 0, auto-compaction off.
    pub fn from_flags(mode: &str, retention: &str) -> Result<Option<Policy>, PolicyError> {
        let periodic = match mode {
            // etcd's default mode, also for an empty one.
            "periodic" | "" => true,
            "revision" => false,
            other => return Err(PolicyError::UnknownMode(other.to_string())),
        };
        let retention = retention.trim();
        let policy = match retention.parse::<u64>() {
            Ok(n) if periodic => Policy::Periodic(
                Duration::from_secs(3600)
                    .checked_mul(
                        u32::try_from(n)
                            .map_err(|_| PolicyError::BadDuration(retention.to_string()))?,
                    )
                    .ok_or_else(|| PolicyError::BadDuration(retention.to_string()))?,
            ),
            Ok(n) => Policy::Revision(
                i64::try_from(n).map_err(|_| PolicyError::BadRevisions(retention.to_string()))?,
            ),
            Err(_) if periodic => Policy::Periodic(
                crate::auth::parse_go_duration(retention)
                    .ok_or_else(|| PolicyError::BadDuration(retention.to_string()))?,
            ),
            Err(_) => return Err(PolicyError::BadRevisions(retention.to_string())),
        };
        Ok(match policy {
            Policy::Periodic(d) if d.is_zero() => None,
            Policy::Revision(0) => None,
            p => Some(p),
        })
    }
}

/// etcd's periodic compactor's state, driven by [`Periodic::step`] once per
/// [`Periodic::retry_interval`].
#[derive(Debug)]
pub struct Periodic {
    period: Duration,
    /// The revisions recorded, oldest first: `revs[0]` is the one `period` ago.
    revs: VecDeque<i64>,
    /// Time (since the compactor started) of the last success, or of the start.
    last_success: Duration,
    /// `period` until the first compaction, then `min(period, 1h)`.
    base_interval: Duration,
}

impl Periodic {
    pub fn new(period: Duration) -> Periodic {
        Periodic {
            period,
            revs: VecDeque::new(),
            last_success: Duration::ZERO,
            base_interval: period,
        }
    }

    /// `min(period, 1h)`: how often it compacts after the first one.
    fn compact_interval(&self) -> Duration {
        self.period.min(MAX_PERIODIC_INTERVAL)
    }

    /// A tenth of the compaction interval: how often a revision is recorded (and a failure
    /// retried).
    pub fn retry_interval(&self) -> Duration {
        self.compact_interval() / RETRY_DIVISOR
    }

    /// How many recorded revisions span `period`.
    fn retentions(&self) -> usize {
        let retry = self.retry_interval().as_nanos().max(1);
        (self.period.as_nanos() / retry) as usize + 1
    }

    /// Records the current revision (etcd does it before waiting a retry interval).
    pub fn record(&mut self, revision: i64) {
        self.revs.push_back(revision);
        if self.revs.len() > self.retentions() {
            self.revs.pop_front();
        }
    }

    /// After a retry interval, at `now` since start: the revision to compact to, if this
    /// member leads and a compaction is due.
    pub fn due(&mut self, now: Duration, leader: bool) -> Option<i64> {
        if !leader || now.saturating_sub(self.last_success) < self.base_interval {
            return None;
        }
        if self.base_interval == self.period {
            self.base_interval = self.compact_interval();
        }
        self.revs.front().copied()
    }

    /// The compaction proposed by [`Periodic::due`] succeeded (or was compacted already).
    pub fn succeeded(&mut self, now: Duration) {
        self.last_success = now;
    }
}

/// etcd's revision compactor's state: what it compacted last.
#[derive(Debug, Default)]
pub struct RevisionMode {
    retention: i64,
    prev: i64,
}

impl RevisionMode {
    pub fn new(retention: i64) -> RevisionMode {
        RevisionMode { retention, prev: 0 }
    }

    /// Every [`REVISION_INTERVAL`]: the revision to compact to, if this member leads.
    pub fn due(&self, current: i64, leader: bool) -> Option<i64> {
        let rev = current - self.retention;
        (leader && rev > 0 && rev != self.prev).then_some(rev)
    }

    pub fn succeeded(&mut self, rev: i64) {
        self.prev = rev;
    }
}

/// Whether this member leads, and its revision.
fn observe(node: &Node) -> (bool, i64) {
    let st = node.status();
    let leader = st.leader_id == Some(st.member_id) && !node.is_learner();
    (leader, node.read(|sm| sm.revision().0))
}

/// Proposes `Compact { rev }`; "already compacted" is success, as etcd's `ErrCompacted`.
async fn compact(node: &Node, rev: i64) -> Result<(), String> {
    match node
        .propose(Command::Compact {
            revision: Revision(rev),
        })
        .await
    {
        Ok(p) => match p.applied.response {
            Response::Compact | Response::Error(KvError::Compacted) => Ok(()),
            Response::Error(e) => Err(e.to_string()),
            other => Err(format!("unexpected answer {other:?}")),
        },
        Err(e) => Err(e.to_string()),
    }
}

/// Runs the compactor of `policy` on `node` for as long as the runtime runs (the process:
/// `baton serve` spawns it once).
pub fn spawn(node: Node, policy: Policy) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        match policy {
            Policy::Periodic(period) => {
                let mut p = Periodic::new(period);
                let retry = p.retry_interval();
                loop {
                    p.record(observe(&node).1);
                    tokio::time::sleep(retry).await;
                    let (leader, _) = observe(&node);
                    let Some(rev) = p.due(start.elapsed(), leader) else {
                        continue;
                    };
                    tracing::info!(revision = rev, compact_period = ?period, "starting auto periodic compaction");
                    match compact(&node, rev).await {
                        Ok(()) => {
                            tracing::info!(revision = rev, compact_period = ?period, "completed auto periodic compaction");
                            p.succeeded(start.elapsed());
                        }
                        Err(e) => tracing::warn!(
                            revision = rev,
                            compact_period = ?period,
                            retry_interval = ?retry,
                            error = %e,
                            "failed auto periodic compaction"
                        ),
                    }
                }
            }
            Policy::Revision(retention) => {
                let mut r = RevisionMode::new(retention);
                loop {
                    tokio::time::sleep(REVISION_INTERVAL).await;
                    let (leader, current) = observe(&node);
                    let Some(rev) = r.due(current, leader) else {
                        continue;
                    };
                    tracing::info!(
                        revision = rev,
                        revision_compaction_retention = retention,
                        "starting auto revision compaction"
                    );
                    match compact(&node, rev).await {
                        Ok(()) => {
                            r.succeeded(rev);
                            tracing::info!(
                                revision = rev,
                                revision_compaction_retention = retention,
                                "completed auto revision compaction"
                            );
                        }
                        Err(e) => tracing::warn!(
                            revision = rev,
                            revision_compaction_retention = retention,
                            retry_interval = ?REVISION_INTERVAL,
                            error = %e,
                            "failed auto revision compaction"
                        ),
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn flags_are_read_as_etcd_reads_them() {
        let p = |m, r| Policy::from_flags(m, r);
        assert_eq!(p("periodic", "0"), Ok(None), "etcd's default: off");
        assert_eq!(p("revision", "0"), Ok(None));
        assert_eq!(
            p("periodic", "1"),
            Ok(Some(Policy::Periodic(H))),
            "a number is hours"
        );
        assert_eq!(p("", "72"), Ok(Some(Policy::Periodic(72 * H))));
        assert_eq!(
            p("periodic", "2s"),
            Ok(Some(Policy::Periodic(Duration::from_secs(2))))
        );
        assert_eq!(
            p("periodic", "1h30m"),
            Ok(Some(Policy::Periodic(Duration::from_secs(5400))))
        );
        assert_eq!(p("revision", "1000"), Ok(Some(Policy::Revision(1000))));
        assert_eq!(
            p("hourly", "1"),
            Err(PolicyError::UnknownMode("hourly".into()))
        );
        assert_eq!(
            p("periodic", "-1"),
            Err(PolicyError::BadDuration("-1".into()))
        );
        assert_eq!(
            p("periodic", "1d"),
            Err(PolicyError::BadDuration("1d".into()))
        );
        assert_eq!(
            p("revision", "5m"),
            Err(PolicyError::BadRevisions("5m".into()))
        );
        assert_eq!(
            p("revision", "-3"),
            Err(PolicyError::BadRevisions("-3".into()))
        );
        assert!(
            p("periodic", "99999999999").is_err(),
            "hours beyond a Duration"
        );
    }

    #[test]
    fn periodic_intervals_are_etcds() {
        let p = Periodic::new(H);
        assert_eq!(
            p.retry_interval(),
            Duration::from_secs(360),
            "6 minutes for 1 h"
        );
        assert_eq!(p.retentions(), 11);
        let p = Periodic::new(24 * H);
        assert_eq!(
            p.retry_interval(),
            Duration::from_secs(360),
            "capped at 1 h / 10"
        );
        assert_eq!(p.retentions(), 241);
        let p = Periodic::new(Duration::from_secs(5));
        assert_eq!(p.retry_interval(), Duration::from_millis(500));
    }

    /// etcd's `TestPeriodicHourly` shape: nothing for the first period, then the revision of
    /// one period ago, then one compaction per interval; followers record but never compact.
    #[test]
    fn periodic_compacts_to_the_revision_one_period_ago() {
        let period = Duration::from_secs(10);
        let mut p = Periodic::new(period);
        let step = p.retry_interval();
        let mut rev = 100;
        let mut compacted = Vec::new();
        for i in 1..=30u32 {
            p.record(rev);
            rev += 7;
            let now = step * i;
            if let Some(r) = p.due(now, true) {
                compacted.push((i, r));
                p.succeeded(now);
            }
        }
        // Ticks 10, 20, 30: each to the revision recorded 10 ticks (one period) earlier.
        assert_eq!(
            compacted,
            vec![(10, 100), (20, 100 + 7 * 9), (30, 100 + 7 * 19)]
        );

        let mut follower = Periodic::new(period);
        for i in 1..=30u32 {
            follower.record(i64::from(i));
            assert_eq!(follower.due(step * i, false), None);
        }
        // Leading later: due at once, to the revision one period back.
        assert_eq!(follower.due(step * 31, true), Some(20));
    }

    #[test]
    fn a_failed_periodic_compaction_is_retried_next_interval() {
        let mut p = Periodic::new(Duration::from_secs(10));
        let step = p.retry_interval();
        for i in 1..=10u32 {
            p.record(i64::from(i));
        }
        assert_eq!(p.due(step * 10, true), Some(1));
        // No success: due again at the next step (the window holds 11 samples).
        p.record(11);
        assert_eq!(p.due(step * 11, true), Some(1));
        p.record(12);
        assert_eq!(p.due(step * 12, true), Some(2), "the window moved on");
        p.succeeded(step * 12);
        p.record(13);
        assert_eq!(
            p.due(step * 13, true),
            None,
            "next one an interval after the success"
        );
    }

    #[test]
    fn revision_mode_keeps_retention_revisions() {
        let mut r = RevisionMode::new(100);
        assert_eq!(r.due(50, true), None, "not positive");
        assert_eq!(r.due(100, true), None);
        assert_eq!(r.due(250, false), None, "followers do not compact");
        assert_eq!(r.due(250, true), Some(150));
        r.succeeded(150);
        assert_eq!(r.due(250, true), None, "the same revision again");
        assert_eq!(r.due(251, true), Some(151));
    }
}
