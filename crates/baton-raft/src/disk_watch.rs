//! The disk watch's tick on every member ([`DiskWatch`]): free space measured and judged (see
//! `space`), the state's size compared with the backend quota, a stalled log writer poked, a
//! snapshot that did not fit tried again, values the value file held in memory for lack of
//! room written out once there is room, this member's `NOSPACE` alarm raised (for either
//! cause) or cleared (for the disk's only) through the leader, and the size-based snapshot
//! trigger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use baton_core::{AlarmAction, AlarmType, Command};
use tokio::time::Instant;

use crate::limits::{LEASE_TICK, SNAPSHOT_LOG_MIN_BYTES};
use crate::replica::Replica;
use crate::routing::Router;
use crate::space;

pub(crate) struct DiskWatch {
    replica: Arc<Replica>,
    router: Arc<Router>,
    /// An alarm proposal is in flight (one at a time: on a stalled log it waits out the
    /// request timeout, and the tick comes every 100 ms).
    alarm_in_flight: AtomicBool,
    /// Warnings of the alarm proposals.
    alarm_log: space::RateLimit,
    /// This member's raised `NOSPACE` has a low disk among its causes (seen low while it
    /// was raised, in this process: after a restart on a full disk the first tick sees it
    /// again). Only such an alarm clears itself once the disk has room and the state is
    /// under the quota; one raised for the quota alone waits for `alarm disarm`, as etcd's.
    disk_cause: AtomicBool,
    /// When the quota is judged next: the size estimate walks the lease, lock and fence
    /// tables under the state's read lock, so a check that took `d` waits
    /// [`QUOTA_CHECK_COST_FACTOR`]`× d` (at least a tick) before the next one, keeping the
    /// applies it holds up below 2% on any store.
    quota_next: parking_lot::Mutex<Instant>,
}

/// What to do with this member's `NOSPACE`, pure: its disk is `low`, its store `over` the
/// quota, the alarm `raised` (replicated state), and `disk_cause` says a low disk was seen
/// while it was raised. Returns the action and the new `disk_cause`. Raised for either
/// cause; cleared by the watch only when a low disk was among its causes and neither cause
/// is left — a quota alarm waits for `alarm disarm`, as etcd's. When no alarm is raised,
/// the causes start from now (whoever cleared the last one: the watch, or a disarm).
fn alarm_action(
    low: bool,
    over: bool,
    raised: bool,
    disk_cause: bool,
) -> (Option<AlarmAction>, bool) {
    let disk_cause = if raised { disk_cause || low } else { low };
    let action = match (low || over, raised) {
        (true, false) => Some(AlarmAction::Activate),
        (false, true) if disk_cause => Some(AlarmAction::Deactivate),
        _ => None,
    };
    (action, disk_cause)
}

/// See [`DiskWatch::quota_next`].
const QUOTA_CHECK_COST_FACTOR: u32 = 50;

impl DiskWatch {
    pub(crate) fn new(replica: Arc<Replica>, router: Arc<Router>) -> Arc<DiskWatch> {
        Arc::new(DiskWatch {
            replica,
            router,
            alarm_in_flight: AtomicBool::new(false),
            alarm_log: space::RateLimit::default(),
            disk_cause: AtomicBool::new(false),
            quota_next: parking_lot::Mutex::new(Instant::now()),
        })
    }

    /// One tick (see the module docs). Both the alarm's raising and its clearing go through
    /// the leader from any member: a follower's full disk stops the cluster's writes as
    /// etcd's does (a follower that cannot log would otherwise fall behind silently). Each
    /// member judges its own quota, so with one quota on all members each raises its own
    /// alarm, as each etcd member does after applying the write that crossed it.
    pub(crate) async fn tick(self: &Arc<Self>) {
        let replica = &self.replica;
        let shared = &replica.shared;
        let free = shared.measure_free();
        if let Some(values) = &shared.values {
            metrics::gauge!("baton_value_file_bytes").set(values.bytes() as f64);
        }
        replica.wal.retry_stalled();
        let mut snapshot_blocked = shared.space.snapshot_blocked();
        if snapshot_blocked && shared.snapshot_fits() {
            // Room again: try now rather than after the next apply (none may come).
            shared.space.set_snapshot_blocked(false);
            snapshot_blocked = false;
            if let Err(e) = replica.raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "snapshot after space came back not started");
            }
        }
        let stalled = replica.wal.stalled();
        let was_low = shared.space.is_low();
        let low = space::judge(
            free,
            shared.space.reserve,
            was_low,
            stalled || snapshot_blocked,
        );
        if shared.space.set_low(low) != low {
            metrics::gauge!("baton_disk_space_low").set(if low { 1.0 } else { 0.0 });
            if low {
                tracing::warn!(
                    free_bytes = ?free,
                    reserve_bytes = shared.space.reserve,
                    log_stalled = stalled,
                    snapshot_blocked,
                    "disk space low: refusing writes that add data (NOSPACE); reads, deletes \
                     and compaction are served"
                );
            } else {
                tracing::info!(free_bytes = ?free, "disk space available again: writes accepted");
            }
        }
        if let Some(values) = &shared.values {
            let mut held = values.held_bytes();
            if held > 0 && !low {
                // Room again: what the value file kept in memory goes out (a restart on a
                // nearly full disk holds every value there). Blocking: off the runtime.
                let values = values.clone();
                held = tokio::task::spawn_blocking(move || values.write_held())
                    .await
                    .unwrap_or(held);
            }
            metrics::gauge!("baton_value_file_held_bytes").set(held as f64);
        }
        let over = self.judge_quota(false);
        self.update_alarm(low, over);
    }

    /// Judges the quota now (`force`), or if its pacing allows (see
    /// [`DiskWatch::quota_next`]); else the last judgement.
    fn judge_quota(&self, force: bool) -> bool {
        let space = &self.replica.shared.space;
        let quota = space.quota;
        if quota.is_none() {
            return false;
        }
        if !force && Instant::now() < *self.quota_next.lock() {
            let compacted = self.replica.shared.state.read().sm.compact_revision().0;
            return space.over_quota_at(compacted);
        }
        let started = Instant::now();
        let (size, kv, compacted) = {
            let st = self.replica.shared.state.read();
            (
                st.sm.approximate_size_bytes(),
                st.sm.kv_size_bytes(),
                st.sm.compact_revision().0,
            )
        };
        let cost = started.elapsed();
        *self.quota_next.lock() = Instant::now() + (cost * QUOTA_CHECK_COST_FACTOR).max(LEASE_TICK);
        let refused_a_write = space.take_write_refused_for_quota();
        let over = space::over_quota(size, quota) || refused_a_write;
        if space.set_over_quota(over, compacted, size.saturating_sub(kv)) != over {
            if refused_a_write {
                tracing::warn!(
                    size_bytes = size,
                    quota_bytes = ?quota,
                    "a write would have taken the store to the backend quota \
                     (--quota-backend-bytes): refused it, raising NOSPACE; writes that add data \
                     are refused until an operator compacts, defragments and runs \
                     `etcdctl alarm disarm`"
                );
            } else if over {
                tracing::warn!(
                    size_bytes = size,
                    quota_bytes = ?quota,
                    "the store outgrew the backend quota (--quota-backend-bytes): raising \
                     NOSPACE; writes that add data are refused until an operator compacts, \
                     defragments and runs `etcdctl alarm disarm`"
                );
            } else {
                tracing::info!(size_bytes = size, quota_bytes = ?quota, "the store is under the backend quota again");
            }
        }
        over
    }

    /// Raises this member's `NOSPACE` when its disk is `low` or its store `over` the quota,
    /// and clears one the disk watch raised for the disk once neither holds.
    fn update_alarm(self: &Arc<Self>, low: bool, over: bool) {
        let me = self.replica.member_id;
        let raised = self
            .replica
            .shared
            .state
            .read()
            .sm
            .alarms()
            .contains(&(me, AlarmType::NoSpace));
        let (action, disk_cause) =
            alarm_action(low, over, raised, self.disk_cause.load(Ordering::Acquire));
        self.disk_cause.store(disk_cause, Ordering::Release);
        let Some(action) = action else { return };
        if self.alarm_in_flight.swap(true, Ordering::AcqRel) {
            return;
        }
        let watch = self.clone();
        tokio::spawn(async move {
            let command = Command::Alarm {
                action,
                member_id: me,
                alarm: AlarmType::NoSpace,
            };
            // Routed: a follower's own alarm is raised and cleared through the leader.
            match watch.router.propose(command).await {
                Ok(_) if action == AlarmAction::Activate => {
                    tracing::warn!(member = format_args!("{me:x}"), "NOSPACE alarm raised")
                }
                Ok(_) => {
                    watch.disk_cause.store(false, Ordering::Release);
                    tracing::info!(
                        member = format_args!("{me:x}"),
                        "NOSPACE alarm cleared: space is available again"
                    )
                }
                Err(e) => {
                    if watch.alarm_log.allow() {
                        tracing::warn!(error = %e, ?action, "proposing the NOSPACE alarm failed; will retry");
                    }
                }
            }
            watch.alarm_in_flight.store(false, Ordering::Release);
        });
    }

    /// The size-based snapshot trigger (see [`SNAPSHOT_LOG_MIN_BYTES`]). openraft ignores
    /// the trigger while a snapshot is being built.
    pub(crate) async fn snapshot_if_log_large(&self) {
        let replica = &self.replica;
        let since = replica.raft.metrics().borrow().snapshot.map(|l| l.index);
        let log = replica.wal.log_bytes_after(since);
        let last = replica.shared.snapshot_bytes.load(Ordering::Relaxed);
        if log >= SNAPSHOT_LOG_MIN_BYTES.max(last) {
            if let Err(e) = replica.raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "size-triggered snapshot not started");
            }
        }
    }
}

/// The quota check woken by an apply that took the store over the quota
/// (`Space::quota_wake`), between the disk watch's ticks. Weak, as the ticker.
pub(crate) async fn quota_wakeups(watch: std::sync::Weak<DiskWatch>) {
    loop {
        let Some(w) = watch.upgrade() else { return };
        let shared = w.replica.shared.clone();
        drop(w);
        shared.space.quota_wake.notified().await;
        let Some(w) = watch.upgrade() else { return };
        let over = w.judge_quota(true);
        w.update_alarm(w.replica.shared.space.is_low(), over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_alarm_waits_for_disarm_and_a_disk_alarm_clears_itself() {
        use AlarmAction::{Activate, Deactivate};
        // Nothing raised: raise for either cause.
        assert_eq!(
            alarm_action(true, false, false, false),
            (Some(Activate), true)
        );
        assert_eq!(
            alarm_action(false, true, false, false),
            (Some(Activate), false)
        );
        assert_eq!(alarm_action(false, false, false, true), (None, false));
        // Raised for the disk: cleared once the disk has room and the store is under quota.
        assert_eq!(alarm_action(true, false, true, true), (None, true));
        assert_eq!(alarm_action(false, true, true, true), (None, true));
        assert_eq!(
            alarm_action(false, false, true, true),
            (Some(Deactivate), true)
        );
        // Raised for the quota alone: never cleared by the watch, compacted or not.
        assert_eq!(alarm_action(false, true, true, false), (None, false));
        assert_eq!(alarm_action(false, false, true, false), (None, false));
        // A restart on a full disk: the first tick sees the disk low, so the alarm is the
        // disk's again and clears itself later.
        assert_eq!(alarm_action(true, false, true, false), (None, true));
    }
}
