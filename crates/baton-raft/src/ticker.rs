//! Every member's periodic duties, every `LEASE_TICK`: the leader's lease duties
//! (`lease_duty`), the disk watch and the size-based snapshot trigger (`disk_watch`), and the
//! bootstrap fencing key (`fencing_duty`).

use std::sync::Weak;

use tokio::time::Instant;

use crate::disk_watch::DiskWatch;
use crate::fencing_duty::FencingKeyDuty;
use crate::lease_duty::LeaseDuty;
use crate::limits::{LEASE_STALL, LEASE_TICK};

/// Runs the duties until the replica is dropped or shuts down. Holds only weak references,
/// so a replica that is dropped without `shutdown` does not live on through its own task.
pub(crate) async fn run(
    leases: Weak<LeaseDuty>,
    disk: Weak<DiskWatch>,
    fencing: Weak<FencingKeyDuty>,
) {
    let mut tick = tokio::time::interval(LEASE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_checkpoint = Instant::now();
    let mut last_tick = Instant::now();
    loop {
        tick.tick().await;
        let (Some(leases), Some(disk), Some(fencing)) =
            (leases.upgrade(), disk.upgrade(), fencing.upgrade())
        else {
            return;
        };
        if leases.is_shutting_down() {
            return;
        }
        let gap = last_tick.elapsed();
        if gap > LEASE_STALL {
            // Nothing ran for `gap`: neither expiry nor the keep-alives that would have
            // renewed. Give the clients that time back before judging any deadline.
            leases.extend_all(gap - LEASE_TICK);
            tracing::warn!(stalled = ?gap, "lease duties stalled; extended every lease deadline by the stall");
            metrics::counter!("baton_lease_stalls_total").increment(1);
        }
        leases.tick(&mut last_checkpoint).await;
        disk.tick().await;
        disk.snapshot_if_log_large().await;
        fencing.tick();
        last_tick = Instant::now();
    }
}
