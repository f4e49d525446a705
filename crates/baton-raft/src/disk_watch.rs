//! The disk watch's tick on every member ([`DiskWatch`]): free space measured and judged (see
//! `space`), a stalled log writer poked, a snapshot that did not fit tried again, this
//! member's `NOSPACE` alarm raised or cleared through the leader, and the size-based
//! snapshot trigger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use baton_core::{AlarmAction, AlarmType, Command};

use crate::limits::SNAPSHOT_LOG_MIN_BYTES;
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
}

impl DiskWatch {
    pub(crate) fn new(replica: Arc<Replica>, router: Arc<Router>) -> Arc<DiskWatch> {
        Arc::new(DiskWatch {
            replica,
            router,
            alarm_in_flight: AtomicBool::new(false),
            alarm_log: space::RateLimit::default(),
        })
    }

    /// One tick (see the module docs). Both the alarm's raising and its clearing go through
    /// the leader from any member: a follower's full disk stops the cluster's writes as
    /// etcd's does (a follower that cannot log would otherwise fall behind silently), and
    /// the leader accepts an alarm raised over `Forward` only for its sender's own id
    /// (`peer_server::check_forwarded`).
    pub(crate) async fn tick(self: &Arc<Self>) {
        let replica = &self.replica;
        let shared = &replica.shared;
        let free = shared.measure_free();
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
        let me = replica.member_id;
        let raised = shared
            .state
            .read()
            .sm
            .alarms()
            .contains(&(me, AlarmType::NoSpace));
        let action = match (low, raised) {
            (true, false) => AlarmAction::Activate,
            (false, true) => AlarmAction::Deactivate,
            _ => return,
        };
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
                Ok(_) => tracing::info!(
                    member = format_args!("{me:x}"),
                    "NOSPACE alarm cleared: space is available again"
                ),
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
