//! What a scrape reads rather than what was counted as it happened: the replica's figures
//! (`Node::metrics`), the applied state (revisions, keys, size, lock queues) and the watch
//! hub, written into their families just before rendering. Counters kept as data elsewhere
//! (the apply tally, the replica's event counts) are set to their absolute values here.

use std::sync::atomic::Ordering;

use baton_core::{LockContention, WatchCensus};
use baton_raft::ReplicaMetrics;

use crate::Shared;

/// The etcd release whose API and metrics Baton reproduces (`etcd_server_version`), and its
/// cluster version (`etcd_cluster_version`: major.minor, as etcd reports it).
pub const ETCD_SERVER_VERSION: &str = "3.4.23";
pub const ETCD_CLUSTER_VERSION: &str = "3.4";

/// What the applied state says, read under one lock.
struct AppliedFigures {
    revision: i64,
    compact_revision: i64,
    keys: u64,
    leases: u64,
    size_in_use: u64,
    locks: u64,
    contention: LockContention,
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Refreshes every family read at scrape time.
pub(crate) async fn refresh(shared: &Shared) {
    let replica = shared.node.metrics().await;
    let status = shared.node.status();
    let applied = shared.node.read(|sm| AppliedFigures {
        revision: sm.revision().0,
        compact_revision: sm.compact_revision().0,
        keys: sm.key_count() as u64,
        leases: sm.lease_ids().len() as u64,
        size_in_use: sm.approximate_size_bytes(),
        locks: sm.lock_count() as u64,
        contention: sm.lock_contention(),
    });
    let watch = shared.node.with_watch_hub(|hub, _| hub.census());
    server(&replica);
    mvcc(&replica, &applied, &watch);
    leases(&replica, applied.leases);
    locks(&applied);
    metrics::gauge!("baton_raft_term").set(status.term as f64);
    metrics::gauge!("baton_raft_index").set(status.last_log_index as f64);
    metrics::gauge!("baton_raft_applied_index").set(status.applied_index as f64);
    metrics::gauge!("baton_is_leader").set(flag(replica.is_leader));
    metrics::gauge!("baton_db_size_bytes").set(replica.disk_bytes as f64);
    metrics::gauge!("baton_db_size_in_use_bytes").set(applied.size_in_use as f64);
}

fn server(r: &ReplicaMetrics) {
    metrics::gauge!("etcd_server_has_leader").set(flag(r.has_leader));
    metrics::gauge!("etcd_server_is_leader").set(flag(r.is_leader));
    metrics::gauge!("etcd_server_is_learner").set(flag(r.is_learner));
    metrics::counter!("etcd_server_leader_changes_seen_total").absolute(r.leader_changes);
    metrics::gauge!("etcd_server_proposals_committed_total").set(r.committed_index as f64);
    metrics::gauge!("etcd_server_proposals_applied_total").set(r.applied_index as f64);
    metrics::gauge!("etcd_server_proposals_pending").set(r.proposals_pending as f64);
    metrics::counter!("etcd_server_proposals_failed_total").absolute(r.proposals_failed);
    metrics::counter!("etcd_server_read_indexes_failed_total").absolute(r.read_indexes_failed);
    metrics::counter!("etcd_server_slow_read_indexes_total").absolute(r.slow_read_indexes);
    metrics::counter!("etcd_server_slow_apply_total").absolute(r.apply.slow_applies);
    metrics::gauge!("etcd_server_snapshot_apply_in_progress_total")
        .set(flag(r.snapshot_installing));
    metrics::gauge!("etcd_server_quota_backend_bytes").set(r.quota_bytes as f64);
    metrics::gauge!("etcd_server_id", "server_id" => format!("{:x}", r.member_id)).set(1.0);
    metrics::gauge!("etcd_server_version", "server_version" => ETCD_SERVER_VERSION).set(1.0);
    metrics::gauge!("etcd_cluster_version", "cluster_version" => ETCD_CLUSTER_VERSION).set(1.0);
    metrics::counter!("etcd_debugging_server_lease_expired_total").absolute(r.leases_expired);
    metrics::gauge!("etcd_disk_wal_write_bytes_total").set(r.wal_write_bytes as f64);
    // Registered even before the first heartbeat failure, so the family is always there.
    metrics::counter!("etcd_server_heartbeat_send_failures_total").increment(0);
}

fn mvcc(r: &ReplicaMetrics, a: &AppliedFigures, w: &WatchCensus) {
    let ops = &r.apply.mvcc;
    let ranges = ops.ranges + super::counts::RANGES_SERVED.load(Ordering::Relaxed);
    for prefix in ["etcd_mvcc", "etcd_debugging_mvcc"] {
        metrics::counter!(format!("{prefix}_put_total")).absolute(ops.puts);
        metrics::counter!(format!("{prefix}_delete_total")).absolute(ops.deletes);
        metrics::counter!(format!("{prefix}_range_total")).absolute(ranges);
        metrics::counter!(format!("{prefix}_txn_total")).absolute(ops.txns);
        metrics::gauge!(format!("{prefix}_db_total_size_in_bytes")).set(r.disk_bytes as f64);
    }
    metrics::gauge!("etcd_mvcc_db_total_size_in_use_in_bytes").set(a.size_in_use as f64);
    metrics::gauge!("etcd_debugging_mvcc_total_put_size_in_bytes").set(ops.put_bytes as f64);
    metrics::gauge!("etcd_debugging_mvcc_keys_total").set(a.keys as f64);
    metrics::gauge!("etcd_debugging_mvcc_current_revision").set(a.revision as f64);
    metrics::gauge!("etcd_debugging_mvcc_compact_revision").set(a.compact_revision as f64);
    metrics::gauge!("etcd_debugging_mvcc_watcher_total").set(w.watchers as f64);
    metrics::gauge!("etcd_debugging_mvcc_slow_watcher_total").set(w.unsynced as f64);
    metrics::gauge!("etcd_debugging_mvcc_pending_events_total").set(w.pending_events as f64);
    metrics::gauge!("etcd_debugging_mvcc_watch_stream_total")
        .set(super::counts::WATCH_STREAMS.load(Ordering::Relaxed) as f64);
    metrics::counter!("etcd_debugging_mvcc_events_total").increment(0);
    metrics::gauge!("baton_mvcc_revision").set(a.revision as f64);
    metrics::gauge!("baton_mvcc_compact_revision").set(a.compact_revision as f64);
    metrics::gauge!("baton_mvcc_keys").set(a.keys as f64);
}

fn leases(r: &ReplicaMetrics, live: u64) {
    metrics::counter!("etcd_debugging_lease_granted_total").absolute(r.apply.leases_granted);
    metrics::counter!("etcd_debugging_lease_revoked_total").absolute(r.apply.leases_revoked);
    metrics::counter!("etcd_debugging_lease_renewed_total").absolute(r.leases_renewed);
    metrics::gauge!("baton_leases").set(live as f64);
}

fn locks(a: &AppliedFigures) {
    let c = &a.contention;
    metrics::gauge!("baton_lock_registry_locks").set(a.locks as f64);
    metrics::gauge!("baton_lock_held").set(c.held as f64);
    metrics::gauge!("baton_lock_queued_waiters").set(c.waiters as f64);
    metrics::gauge!("baton_lock_waiters_max").set(c.max_waiters as f64);
    // Registered before the first of each, so rules and dashboards always find them.
    for name in [
        "baton_lock_wakeups_total",
        "baton_lock_expired_holders_total",
        "baton_lock_delay_refusals_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    for source in ["fenced_put", "fence_check"] {
        metrics::counter!("baton_fencing_rejections_total", "source" => source).increment(0);
    }
    for reason in ["not_found", "unavailable"] {
        metrics::counter!("baton_lease_renewal_failures_total", "reason" => reason).increment(0);
    }
}
