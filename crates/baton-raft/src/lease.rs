//! The leader's lease clock: when each lease expires, in this process's monotonic time.
//!
//! Keep-alives are not replicated (DESIGN §3, etcd's choice: each would cost an fsync), so
//! deadlines live only here. The replicated state knows each lease's granted TTL (and its last
//! checkpointed remaining TTL); a new leader rebuilds deadlines from it, extended by the
//! election timeout so that leader changes never shorten a lease. Expiry itself is a log entry
//! (`Command::ExpireLeases`) proposed when a deadline passes: the state machine never reads a
//! clock.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use baton_core::{Command, LeaseId, Response, StateMachine};

#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// `None`: further away than `Instant` can represent (TTLs go up to 285 years).
    deadline: Option<Instant>,
    granted_ttl_s: i64,
    /// The replicated state holds a checkpointed remaining TTL below the granted TTL. A renewal
    /// must then reset it through the log, or a later leader would trust the stale, shorter
    /// value and expire a lease its client kept alive (etcd does the same on renew).
    checkpointed: bool,
}

impl Tracked {
    fn new(deadline: Option<Instant>, granted_ttl_s: i64) -> Self {
        Tracked {
            deadline,
            granted_ttl_s,
            checkpointed: false,
        }
    }
}

/// What a keep-alive did on the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Renewal {
    pub(crate) granted_ttl_s: i64,
    /// The caller must propose a checkpoint resetting the remaining TTL to the full TTL (and
    /// call `checkpoint_reset_failed` if that proposal fails).
    pub(crate) reset_checkpoint: bool,
}

fn deadline_after(now: Instant, d: Duration) -> Option<Instant> {
    now.checked_add(d)
}

fn secs(ttl_s: i64) -> Duration {
    Duration::from_secs(ttl_s.max(0) as u64)
}

#[derive(Debug, Default)]
pub(crate) struct LeaseClock {
    leases: HashMap<LeaseId, Tracked>,
    /// Leases whose `ExpireLeases` proposal is in flight: not proposed again, and keep-alives
    /// for them answer "not found" (the lease is going away; renewing it would be a lie).
    expiring: HashSet<LeaseId>,
    /// The term in which this node, as leader, rebuilt the deadlines from the state machine.
    /// Until then (`!= current term`) nothing is expired: the deadlines may be stale.
    ready_term: Option<u64>,
    /// No tracked deadline is earlier (`None`: no finite deadline is tracked). A lower bound,
    /// not the minimum: every deadline set lowers it, removals and later deadlines do not
    /// raise it, so it is exact only after a full scan (`rebuild`, and `take_expired`, which
    /// a leader runs every tick). It answers "does any lease expire soon?" without a scan
    /// ([`LeaseClock::all_alive_for`]), which the leader asks for every AppendEntries.
    earliest_deadline: Option<Instant>,
}

impl LeaseClock {
    pub(crate) fn ready_term(&self) -> Option<u64> {
        self.ready_term
    }

    /// Keeps the clock in step with what the log did. Runs on every replica (cheap), so a
    /// replica that becomes leader only has to extend, not discover.
    pub(crate) fn on_applied(&mut self, command: &Command, response: &Response, now: Instant) {
        match (command, response) {
            (_, Response::LeaseGrant { id, ttl_s }) => {
                let deadline = deadline_after(now, secs(*ttl_s));
                self.lower_earliest(deadline);
                self.leases.insert(*id, Tracked::new(deadline, *ttl_s));
            }
            (Command::LeaseCheckpoint { checkpoints }, _) => {
                for (id, remaining_ms) in checkpoints {
                    if let Some(t) = self.leases.get_mut(id) {
                        t.checkpointed = *remaining_ms < t.granted_ttl_s.saturating_mul(1000);
                    }
                }
            }
            (Command::LeaseRevoke { id }, _) => {
                self.leases.remove(id);
            }
            // What was actually expired (a term-fenced expiry of another term expires nothing).
            (_, Response::ExpireLeases { expired, .. }) => {
                for id in expired {
                    self.leases.remove(id);
                }
            }
            _ => {}
        }
    }

    /// Rebuilds every deadline on becoming leader: `now + remaining (checkpointed, else the
    /// granted TTL) + extension`. The extension (the election timeout) covers the time clients
    /// could not reach any leader to renew.
    pub(crate) fn rebuild(
        &mut self,
        sm: &StateMachine,
        now: Instant,
        extension: Duration,
        term: u64,
    ) {
        self.leases.clear();
        self.expiring.clear();
        self.earliest_deadline = None;
        for id in sm.lease_ids() {
            let Some(info) = sm.lease(id) else { continue };
            let remaining = match info.checkpoint_remaining_ms {
                Some(ms) => Duration::from_millis(ms.max(0) as u64),
                None => secs(info.granted_ttl_s),
            };
            let deadline = remaining
                .checked_add(extension)
                .and_then(|d| deadline_after(now, d));
            self.lower_earliest(deadline);
            let mut t = Tracked::new(deadline, info.granted_ttl_s);
            t.checkpointed = info
                .checkpoint_remaining_ms
                .is_some_and(|ms| ms < info.granted_ttl_s.saturating_mul(1000));
            self.leases.insert(id, t);
        }
        self.ready_term = Some(term);
    }

    /// Pushes every deadline `by` later: the leader's lease duties did not run for that long
    /// (the process was paused, starved or stuck), and neither could its clients' keep-alives
    /// be served; the stall must not count against them.
    pub(crate) fn extend_all(&mut self, by: Duration) {
        for t in self.leases.values_mut() {
            t.deadline = t.deadline.and_then(|d| d.checked_add(by));
        }
        // Every deadline moved by `by`; so may their bound (`None` if that overflows: a
        // deadline beyond `Instant`'s range is no deadline).
        self.earliest_deadline = self.earliest_deadline.and_then(|d| d.checked_add(by));
    }

    /// Forgets leadership (on stepping down): a later term must rebuild.
    pub(crate) fn step_down(&mut self) {
        self.ready_term = None;
    }

    /// Renews a lease; `None` if unknown or being expired.
    pub(crate) fn keep_alive(&mut self, id: LeaseId, now: Instant) -> Option<Renewal> {
        if self.expiring.contains(&id) {
            return None;
        }
        let t = self.leases.get_mut(&id)?;
        let deadline = deadline_after(now, secs(t.granted_ttl_s));
        t.deadline = deadline;
        // Reset at most once per stale checkpoint: assume the reset lands.
        let reset_checkpoint = std::mem::replace(&mut t.checkpointed, false);
        let granted_ttl_s = t.granted_ttl_s;
        // A renewal may move a deadline earlier: one a new leader extended by the election
        // timeout.
        self.lower_earliest(deadline);
        Some(Renewal {
            granted_ttl_s,
            reset_checkpoint,
        })
    }

    /// The checkpoint reset for `id` was not committed; the next renewal retries it.
    pub(crate) fn checkpoint_reset_failed(&mut self, id: LeaseId) {
        if let Some(t) = self.leases.get_mut(&id) {
            t.checkpointed = true;
        }
    }

    /// Starts tracking a lease the clock did not know (a keep-alive arriving before the
    /// post-election rebuild); `now + granted TTL`. Returns the renewal like `keep_alive`.
    pub(crate) fn track(
        &mut self,
        id: LeaseId,
        info: &baton_core::LeaseInfo,
        now: Instant,
    ) -> Renewal {
        let ttl = info.granted_ttl_s;
        let t = Tracked::new(deadline_after(now, secs(ttl)), ttl);
        self.lower_earliest(t.deadline);
        let reset_checkpoint = info
            .checkpoint_remaining_ms
            .is_some_and(|ms| ms < ttl.saturating_mul(1000));
        self.leases.insert(id, t);
        Renewal {
            granted_ttl_s: ttl,
            reset_checkpoint,
        }
    }

    /// Remaining TTL in whole seconds as etcd reports it: truncated
    /// (`int64(l.Remaining().Seconds())` in etcd's lessor), never negative, never above the
    /// granted TTL (a new leader's extension is not shown as a longer lease).
    pub(crate) fn remaining_s(&self, id: LeaseId, now: Instant) -> Option<i64> {
        let t = self.leases.get(&id)?;
        let remaining = match t.deadline {
            None => return Some(t.granted_ttl_s),
            Some(d) => d.saturating_duration_since(now),
        };
        Some((remaining.as_secs() as i64).min(t.granted_ttl_s).max(0))
    }

    /// Up to `max` leases past their deadline and not already being expired, marked as being
    /// expired. Ordered by id so a backlog is worked through deterministically.
    pub(crate) fn take_expired(&mut self, now: Instant, max: usize) -> Vec<LeaseId> {
        // The scan is made anyway: it also makes the bound exact again.
        self.earliest_deadline = self.leases.values().filter_map(|t| t.deadline).min();
        let mut ids: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(id, t)| t.deadline.is_some_and(|d| d <= now) && !self.expiring.contains(id))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids.truncate(max);
        self.expiring.extend(ids.iter().copied());
        ids
    }

    /// The `ExpireLeases` proposal for `ids` finished (either way). On success `on_applied`
    /// already removed them; on failure they stay tracked and are retried next tick.
    pub(crate) fn finish_expiring(&mut self, ids: &[LeaseId]) {
        for id in ids {
            self.expiring.remove(id);
        }
    }

    /// `(id, remaining ms)` for leases granted more than `min_ttl_s`, for a `LeaseCheckpoint`
    /// entry. Short leases are skipped: a new leader renewing them in full costs at most their
    /// short TTL.
    pub(crate) fn checkpoints(&self, now: Instant, min_ttl_s: i64) -> Vec<(LeaseId, i64)> {
        let mut out: Vec<(LeaseId, i64)> = self
            .leases
            .iter()
            .filter(|(id, t)| t.granted_ttl_s > min_ttl_s && !self.expiring.contains(id))
            .filter_map(|(id, t)| {
                let d = t.deadline?;
                Some((
                    *id,
                    d.saturating_duration_since(now)
                        .as_millis()
                        .min(i64::MAX as u128) as i64,
                ))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Whether every lease the clock tracks stays alive for `margin` from `now`: none is being
    /// expired and none reaches its deadline before `now + margin`. What the leader vouches
    /// for in a lease verdict (`lease_verdict`). Leases the clock does not track are not
    /// covered: only a clock rebuilt for the current term tracks every lease.
    pub(crate) fn all_alive_for(&self, now: Instant, margin: Duration) -> bool {
        self.expiring.is_empty()
            && self
                .earliest_deadline
                .is_none_or(|d| now.checked_add(margin).is_some_and(|end| d > end))
    }

    /// Keeps `earliest_deadline` a lower bound when a deadline is set.
    fn lower_earliest(&mut self, deadline: Option<Instant>) {
        if let Some(d) = deadline {
            self.earliest_deadline = Some(self.earliest_deadline.map_or(d, |e| e.min(d)));
        }
    }

    pub(crate) fn contains(&self, id: LeaseId) -> bool {
        self.leases.contains_key(&id)
    }

    /// Whether the clock considers the lease alive at `now`: tracked, deadline not passed,
    /// not being expired. `None` when the clock does not track it (the state machine is then
    /// the only authority).
    pub(crate) fn alive(&self, id: LeaseId, now: Instant) -> Option<bool> {
        if self.expiring.contains(&id) {
            return Some(false);
        }
        let t = self.leases.get(&id)?;
        Some(t.deadline.is_none_or(|d| d > now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_extends_every_deadline() {
        let mut c = LeaseClock::default();
        let t0 = Instant::now();
        let id = LeaseId(9);
        c.on_applied(
            &Command::LeaseGrant { id, ttl_s: 2 },
            &Response::LeaseGrant { id, ttl_s: 2 },
            t0,
        );
        let after_deadline = t0 + Duration::from_secs(3);
        assert_eq!(c.alive(id, after_deadline), Some(false));
        c.extend_all(Duration::from_secs(2));
        assert_eq!(c.alive(id, after_deadline), Some(true));
        assert!(c.take_expired(after_deadline, 10).is_empty());
    }

    /// The bound behind lease verdicts: it must never be later than a tracked deadline —
    /// a renewal after a rebuild moves a deadline earlier — and a scan makes it exact.
    #[test]
    fn all_alive_for_sees_the_earliest_deadline() {
        let mut c = LeaseClock::default();
        let t0 = Instant::now();
        let margin = Duration::from_millis(200);
        assert!(c.all_alive_for(t0, margin), "no lease: nothing expires");
        let grant = |c: &mut LeaseClock, id, ttl_s, at| {
            c.on_applied(
                &Command::LeaseGrant {
                    id: LeaseId(id),
                    ttl_s,
                },
                &Response::LeaseGrant {
                    id: LeaseId(id),
                    ttl_s,
                },
                at,
            )
        };
        grant(&mut c, 1, 10, t0);
        assert!(c.all_alive_for(t0, margin));
        assert!(c.all_alive_for(t0 + Duration::from_millis(9_700), margin));
        assert!(!c.all_alive_for(t0 + Duration::from_millis(9_800), margin));
        // A renewal moves the deadline later; the bound stays (conservative) until a scan.
        assert!(c
            .keep_alive(LeaseId(1), t0 + Duration::from_secs(5))
            .is_some());
        assert!(!c.all_alive_for(t0 + Duration::from_millis(9_800), margin));
        assert!(c.take_expired(t0 + Duration::from_secs(6), 10).is_empty());
        assert!(c.all_alive_for(t0 + Duration::from_millis(9_800), margin));
        // A shorter lease granted later lowers it.
        grant(&mut c, 2, 1, t0 + Duration::from_secs(6));
        assert!(!c.all_alive_for(t0 + Duration::from_millis(6_900), margin));
        // Being expired is not alive, whatever the deadlines.
        assert_eq!(
            c.take_expired(t0 + Duration::from_secs(8), 10),
            vec![LeaseId(2)]
        );
        assert!(!c.all_alive_for(t0 + Duration::from_secs(8), Duration::ZERO));
        c.finish_expiring(&[LeaseId(2)]);

        // After a rebuild (deadlines extended by the election timeout) a renewal sets an
        // earlier deadline: the bound follows it down.
        let mut sm = StateMachine::new();
        sm.apply(&baton_core::Entry {
            index: baton_core::CommandIndex(0),
            term: baton_core::Term(1),
            time_ms: 1,
            command: Command::LeaseGrant {
                id: LeaseId(3),
                ttl_s: 10,
            },
        });
        let mut c = LeaseClock::default();
        c.rebuild(&sm, t0, Duration::from_secs(5), 2);
        assert!(c.all_alive_for(t0 + Duration::from_millis(14_700), margin));
        assert!(c.keep_alive(LeaseId(3), t0).is_some());
        assert!(!c.all_alive_for(t0 + Duration::from_millis(9_900), margin));
        assert!(c.all_alive_for(t0 + Duration::from_millis(9_700), margin));
        // A stall moves deadlines and the bound together.
        c.extend_all(Duration::from_secs(1));
        assert!(c.all_alive_for(t0 + Duration::from_millis(10_700), margin));
    }

    #[test]
    fn grant_renew_expire() {
        let mut c = LeaseClock::default();
        let t0 = Instant::now();
        let id = LeaseId(7);
        c.on_applied(
            &Command::LeaseGrant { id, ttl_s: 10 },
            &Response::LeaseGrant { id, ttl_s: 10 },
            t0,
        );
        assert_eq!(c.remaining_s(id, t0), Some(10));
        assert_eq!(c.remaining_s(id, t0 + Duration::from_millis(1)), Some(9));
        assert!(c.take_expired(t0 + Duration::from_secs(9), 10).is_empty());
        assert_eq!(c.alive(id, t0 + Duration::from_secs(9)), Some(true));
        assert_eq!(c.alive(id, t0 + Duration::from_secs(10)), Some(false));
        assert_eq!(c.alive(LeaseId(99), t0), None);
        assert_eq!(
            c.keep_alive(id, t0 + Duration::from_secs(9)),
            Some(Renewal {
                granted_ttl_s: 10,
                reset_checkpoint: false
            })
        );
        assert!(c.take_expired(t0 + Duration::from_secs(11), 10).is_empty());
        let later = t0 + Duration::from_secs(20);
        assert_eq!(c.take_expired(later, 10), vec![id]);
        // In flight: not proposed twice, not renewable, not alive.
        assert!(c.take_expired(later, 10).is_empty());
        assert_eq!(c.alive(id, t0), Some(false));
        assert_eq!(c.keep_alive(id, later), None);
        assert_eq!(c.remaining_s(id, later), Some(0));
        c.on_applied(
            &Command::ExpireLeases { ids: vec![id] },
            &Response::ExpireLeases {
                expired: vec![id],
                expired_holders: Vec::new(),
            },
            later,
        );
        c.finish_expiring(&[id]);
        assert_eq!(c.remaining_s(id, later), None);
        assert_eq!(c.keep_alive(id, later), None);
    }

    #[test]
    fn huge_ttl_does_not_overflow() {
        let mut c = LeaseClock::default();
        let now = Instant::now();
        let ttl = baton_core::MAX_LEASE_TTL_S;
        c.on_applied(
            &Command::LeaseGrant {
                id: LeaseId(1),
                ttl_s: ttl,
            },
            &Response::LeaseGrant {
                id: LeaseId(1),
                ttl_s: ttl,
            },
            now,
        );
        assert!(c.remaining_s(LeaseId(1), now).unwrap() > 0);
        assert!(c.take_expired(now, 10).is_empty());
    }

    #[test]
    fn renewal_resets_a_stale_checkpoint_once() {
        let mut c = LeaseClock::default();
        let now = Instant::now();
        let id = LeaseId(3);
        c.on_applied(
            &Command::LeaseGrant { id, ttl_s: 600 },
            &Response::LeaseGrant { id, ttl_s: 600 },
            now,
        );
        assert_eq!(c.checkpoints(now, 300), vec![(id, 600_000)]);
        assert!(
            c.checkpoints(now, 600).is_empty(),
            "short leases are not checkpointed"
        );
        let cp = Command::LeaseCheckpoint {
            checkpoints: vec![(id, 100_000)],
        };
        c.on_applied(&cp, &Response::LeaseCheckpoint, now);
        assert!(c.keep_alive(id, now).unwrap().reset_checkpoint);
        assert!(!c.keep_alive(id, now).unwrap().reset_checkpoint);
        c.checkpoint_reset_failed(id);
        assert!(c.keep_alive(id, now).unwrap().reset_checkpoint);
        // The reset itself, applied: nothing stale any more.
        let reset = Command::LeaseCheckpoint {
            checkpoints: vec![(id, 600_000)],
        };
        c.on_applied(&reset, &Response::LeaseCheckpoint, now);
        assert!(!c.keep_alive(id, now).unwrap().reset_checkpoint);
    }
}
