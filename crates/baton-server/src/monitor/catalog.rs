//! Every metric family Baton exports, with its type and the HELP text Prometheus shows, and
//! the histogram buckets that are not the default. One table, so a family without HELP is a
//! missing row here (the process test `every_family_has_help_and_type` scrapes a member and
//! checks each `# TYPE` has its `# HELP`).
//!
//! etcd's families keep etcd's names, types, labels and buckets; their HELP texts are Baton's
//! own words and say what Baton measures where its design differs from etcd's
//! (`docs/metrics.md` has the whole mapping).

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

/// A family's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

use Kind::{Counter, Gauge, Histogram};

/// Name, type and HELP of every family (process_* come from `metrics-process`, which
/// describes its own).
pub(crate) const FAMILIES: &[(&str, Kind, &str)] = &[
    // ---- etcd_server_* -----------------------------------------------------------------
    ("etcd_server_has_leader", Gauge, "1 if this member knows a live leader (a follower heard from it, a leader from a quorum, within the election timeout), else 0."),
    ("etcd_server_is_leader", Gauge, "1 if this member is the Raft leader, else 0."),
    ("etcd_server_is_learner", Gauge, "1 if this member is a learner (receives the log, does not vote), else 0."),
    ("etcd_server_leader_changes_seen_total", Counter, "Times this member saw a new leader (the first one included) since it started."),
    ("etcd_server_proposals_committed_total", Gauge, "The Raft commit index this member knows."),
    ("etcd_server_proposals_applied_total", Gauge, "The Raft index this member has applied."),
    ("etcd_server_proposals_pending", Gauge, "Proposals made through this member (writes, lease grants, lock steps) not answered yet."),
    ("etcd_server_proposals_failed_total", Counter, "Proposals made through this member that failed after reaching Raft: no leader, leadership lost, timed out, the leader or the storage failed."),
    ("etcd_server_read_indexes_failed_total", Counter, "Linearizable reads whose ReadIndex round (leadership confirmed by a quorum) failed."),
    ("etcd_server_slow_read_indexes_total", Counter, "ReadIndex rounds that timed out."),
    ("etcd_server_slow_apply_total", Counter, "Raft entries (batches of commands) whose apply took longer than 100 ms."),
    ("etcd_server_snapshot_apply_in_progress_total", Gauge, "1 while this member installs a snapshot sent by the leader, else 0."),
    ("etcd_server_heartbeat_send_failures_total", Counter, "Heartbeats (AppendEntries without entries) this member, as leader, failed to deliver."),
    ("etcd_server_quota_backend_bytes", Gauge, "Current backend quota size in bytes (--quota-backend-bytes; without a quota, what the data takes on disk plus the free space above --disk-reserve-bytes)."),
    ("etcd_server_id", Gauge, "1, labelled with this member's id in hex."),
    ("etcd_server_version", Gauge, "1, labelled with the etcd server version whose API and metrics Baton reproduces."),
    ("etcd_server_health_success", Counter, "/health requests answered healthy."),
    ("etcd_server_health_failures", Counter, "/health requests answered unhealthy."),
    ("etcd_cluster_version", Gauge, "1, labelled with the etcd cluster version (major.minor) Baton's cluster speaks."),
    ("etcd_debugging_server_lease_expired_total", Counter, "Leases this member expired as the leader (their TTL passed without a keep-alive)."),
    // ---- etcd_disk_* -------------------------------------------------------------------
    ("etcd_disk_wal_fsync_duration_seconds", Histogram, "Time of each fdatasync of the Raft log (one per batch of appended entries)."),
    ("etcd_disk_backend_commit_duration_seconds", Histogram, "Time to write the applied state to disk: Baton keeps it in memory (durable through the Raft log) and commits it as a snapshot file (write, fsync, rename)."),
    ("etcd_disk_wal_write_bytes_total", Gauge, "Bytes written to the Raft log since this member started."),
    ("etcd_disk_backend_snapshot_duration_seconds", Histogram, "Time to stream a snapshot of the store to a client (Maintenance.Snapshot: etcd's backend layout, written from a copy of the state)."),
    // ---- etcd_mvcc_* and etcd_debugging_mvcc_* -------------------------------------------
    ("etcd_mvcc_put_total", Counter, "Puts this member applied, inside txns and lock steps too."),
    ("etcd_mvcc_delete_total", Counter, "Delete-range calls this member applied (one per request or txn op however many keys, one per key of a revoked or expired lease)."),
    ("etcd_mvcc_range_total", Counter, "Range reads: served to clients, txn compares and range ops, and reads of a previous value (prev_kv, ignore_value, ignore_lease)."),
    ("etcd_mvcc_txn_total", Counter, "Read or write views of the store that made more than one call (etcd's count of mvcc transactions)."),
    ("etcd_debugging_mvcc_put_total", Counter, "Same as etcd_mvcc_put_total (etcd 3.4 exports both)."),
    ("etcd_debugging_mvcc_delete_total", Counter, "Same as etcd_mvcc_delete_total (etcd 3.4 exports both)."),
    ("etcd_debugging_mvcc_range_total", Counter, "Same as etcd_mvcc_range_total (etcd 3.4 exports both)."),
    ("etcd_debugging_mvcc_txn_total", Counter, "Same as etcd_mvcc_txn_total (etcd 3.4 exports both)."),
    ("etcd_mvcc_db_total_size_in_bytes", Gauge, "Bytes this member's Raft log and snapshot take on disk."),
    ("etcd_debugging_mvcc_db_total_size_in_bytes", Gauge, "Same as etcd_mvcc_db_total_size_in_bytes (etcd 3.4 exports both)."),
    ("etcd_mvcc_db_total_size_in_use_in_bytes", Gauge, "Bytes the applied state holds: keys, values and history until compaction, leases, locks and fences."),
    ("etcd_debugging_mvcc_keys_total", Gauge, "Live keys (deleted ones not counted)."),
    ("etcd_debugging_mvcc_current_revision", Gauge, "The store's current revision."),
    ("etcd_debugging_mvcc_compact_revision", Gauge, "The revision of the last compaction."),
    ("etcd_debugging_mvcc_total_put_size_in_bytes", Gauge, "Key plus value bytes of every put this member applied."),
    ("etcd_debugging_mvcc_watch_stream_total", Gauge, "Open Watch streams on this member."),
    ("etcd_debugging_mvcc_watcher_total", Gauge, "Watchers registered on this member."),
    ("etcd_debugging_mvcc_slow_watcher_total", Gauge, "Watchers behind the store, being caught up from history."),
    ("etcd_debugging_mvcc_pending_events_total", Gauge, "Events queued for watchers, not yet sent."),
    ("etcd_debugging_mvcc_events_total", Counter, "Events sent to watchers."),
    // ---- etcd_debugging_lease_* ----------------------------------------------------------
    ("etcd_debugging_lease_granted_total", Counter, "Lease grants this member applied."),
    ("etcd_debugging_lease_revoked_total", Counter, "Leases revoked or expired, as this member applied them."),
    ("etcd_debugging_lease_renewed_total", Counter, "Keep-alives this member renewed as the leader."),
    ("etcd_debugging_lease_ttl_total", Histogram, "TTLs (seconds) of the leases granted."),
    // ---- etcd_network_* ------------------------------------------------------------------
    ("etcd_network_peer_sent_bytes_total", Counter, "Peer payload bytes sent to each member (requests this member made and answers it gave)."),
    ("etcd_network_peer_received_bytes_total", Counter, "Peer payload bytes received from each member (requests and answers)."),
    ("etcd_network_peer_sent_failures_total", Counter, "Peer calls to each member that failed or timed out."),
    ("etcd_network_peer_round_trip_time_seconds", Histogram, "Smoothed round trip of the leader's heartbeats to each member, observed every 30 s as etcd observes its prober's (measured by the leader only)."),
    ("etcd_network_client_grpc_received_bytes_total", Counter, "Bytes of gRPC messages received from clients (without gRPC's 5-byte message prefix)."),
    ("etcd_network_client_grpc_sent_bytes_total", Counter, "Bytes of gRPC messages sent to clients (without gRPC's 5-byte message prefix)."),
    // ---- go-grpc-prometheus ------------------------------------------------------------------
    ("grpc_server_started_total", Counter, "RPCs started on the client port."),
    ("grpc_server_handled_total", Counter, "RPCs completed on the client port, by status code (Canceled: the client went away first)."),
    ("grpc_server_msg_received_total", Counter, "gRPC messages received on the client port."),
    ("grpc_server_msg_sent_total", Counter, "gRPC messages sent on the client port."),
    ("grpc_server_handling_seconds", Histogram, "Time from an RPC's start until its status went out."),
    // ---- Baton: Raft, log, storage -------------------------------------------------------------
    ("baton_raft_term", Gauge, "This member's current Raft term."),
    ("baton_raft_index", Gauge, "The last Raft log index this member wrote."),
    ("baton_raft_applied_index", Gauge, "The last Raft log index this member applied."),
    ("baton_is_leader", Gauge, "1 if this member is the Raft leader, else 0."),
    ("baton_raft_pre_votes_total", Counter, "Pre-vote rounds this member ran before campaigning, by outcome."),
    ("baton_raft_proposal_batch_size", Histogram, "Commands per Raft entry (group commit)."),
    ("baton_proposals_refused_total", Counter, "Proposals refused because the queue in front of Raft was full."),
    ("baton_forward_batch_size", Histogram, "Requests per ForwardBatch call a follower sent to the leader."),
    ("baton_forward_refused_total", Counter, "Requests a follower refused because its forwarding queue was full."),
    ("baton_owed_apply_waits_total", Counter, "Client requests that waited for this member to apply a write it had already answered from the leader's apply (read-your-writes through a follower)."),
    ("baton_peer_refused_total", Counter, "Peer messages refused before acting on them, by reason."),
    ("baton_wal_fsync_seconds", Histogram, "Time of each fdatasync of the Raft log."),
    ("baton_wal_fsyncs_total", Counter, "fdatasyncs of the Raft log."),
    ("baton_wal_appended_entries_total", Counter, "Raft entries made durable in the log."),
    ("baton_wal_enospc_total", Counter, "Log writes held back because the file system was full."),
    ("baton_snapshots_deferred_total", Counter, "Snapshots not taken for lack of disk space."),
    ("baton_disk_space_low", Gauge, "1 while this member refuses writes that add data for lack of disk space, else 0."),
    ("baton_db_size_bytes", Gauge, "Bytes the Raft log and snapshot take on disk."),
    ("baton_db_size_in_use_bytes", Gauge, "Bytes the applied state holds."),
    ("baton_value_file_bytes", Gauge, "Bytes of the scratch files the key store keeps values in, out of memory (live values and garbage not yet evacuated)."),
    ("baton_value_file_held_bytes", Gauge, "Bytes of values the value file holds in memory because the disk had no room for them (full, or free space at the disk reserve, --disk-reserve-bytes, which is kept for the raft log); written out once there is room."),
    ("baton_mvcc_revision", Gauge, "The store's current revision."),
    ("baton_mvcc_compact_revision", Gauge, "The revision of the last compaction."),
    ("baton_mvcc_keys", Gauge, "Live keys."),
    // ---- Baton: client connections, watches, leases ------------------------------------------
    ("baton_accept_errors_total", Counter, "Failed accepts on the client port, by kind."),
    ("baton_tls_handshake_failures_total", Counter, "Failed TLS handshakes on the client port, by kind."),
    ("baton_http2_goaway_sent_total", Counter, "HTTP/2 GOAWAY frames sent to clients, by code and reason."),
    ("baton_watch_streams", Gauge, "Open Watch streams on this member."),
    ("baton_watchers", Gauge, "Watchers on this member's streams."),
    ("baton_watch_events_sent_total", Counter, "Events sent to watchers."),
    ("baton_leases", Gauge, "Live leases."),
    ("baton_leases_expired_total", Counter, "Leases this member expired as the leader."),
    ("baton_lease_stalls_total", Counter, "Times the leader's lease duties were stalled (the stall is added to every lease deadline)."),
    ("baton_lease_renewal_failures_total", Counter, "Keep-alives that did not renew their lease, by reason: not_found (the lease had expired or was revoked: its holder lost it) or unavailable (no leader could confirm it)."),
    // ---- Baton: locks and fencing ---------------------------------------------------------
    ("baton_lock_acquire_seconds", Histogram, "Time from asking for a lock (or campaigning) until it was granted, by API."),
    ("baton_lock_queue_length", Histogram, "Keys queued for the lock (its holder included) that each acquisition found when it joined: contention as a distribution, without a label per lock."),
    ("baton_lock_waiters", Gauge, "Acquisitions waiting on this member now."),
    ("baton_lock_queued_waiters", Gauge, "Keys queued behind a holder, over every registered lock (cluster-wide state)."),
    ("baton_lock_waiters_max", Gauge, "The longest queue behind one holder among the registered locks."),
    ("baton_lock_held", Gauge, "Registered locks with a holder."),
    ("baton_lock_registry_locks", Gauge, "Locks in the registry (held, waited for, or kept for a pending lock-delay or a recent force-release)."),
    ("baton_lock_wakeups_total", Counter, "Waiters woken because their predecessor's key was deleted (one per release: no herd)."),
    ("baton_lock_grant_checks_total", Counter, "Checks before a lock grant, by how they were confirmed: lease (on the leader, leadership confirmed within the last heartbeat interval), round (on the leader, after a ReadIndex round), verdict (on a follower, by the leader's lease verdict on its last AppendEntries, without a call)."),
    ("baton_lock_expired_holders_total", Counter, "Lock holders that lost their lock because their lease expired (expired owners; counted by the leader)."),
    ("baton_fencing_rejections_total", Counter, "Writes or checks refused because their fencing token was stale, by source (fenced_put, fence_check)."),
    ("baton_lock_delay_refusals_total", Counter, "Acquisitions that reached the head of the queue while the lock was in lock-delay (they waited it out, or were refused with try)."),
    ("baton_lock_delay_wait_seconds", Histogram, "Time acquisitions spent waiting out a lock-delay."),
];

/// Buckets of the histograms whose buckets are not the default (etcd's for etcd's families).
pub(crate) fn buckets() -> Vec<(&'static str, Vec<f64>)> {
    let exponential = |start: f64, factor: f64, n: i32| -> Vec<f64> {
        (0..n).map(|i| start * factor.powi(i)).collect()
    };
    let lock_wait = vec![
        0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
    ];
    vec![
        (
            "etcd_disk_wal_fsync_duration_seconds",
            exponential(0.001, 2.0, 14),
        ),
        (
            "etcd_disk_backend_commit_duration_seconds",
            exponential(0.001, 2.0, 14),
        ),
        (
            "etcd_network_peer_round_trip_time_seconds",
            exponential(0.0001, 2.0, 16),
        ),
        // etcd's: 10 ms to 5.5 min (a snapshot of a large store takes seconds to minutes).
        (
            "etcd_disk_backend_snapshot_duration_seconds",
            exponential(0.01, 2.0, 16),
        ),
        ("etcd_debugging_lease_ttl_total", exponential(1.0, 2.0, 14)),
        // prometheus' DefBuckets, go-grpc-prometheus' default.
        (
            "grpc_server_handling_seconds",
            vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        ),
        ("baton_lock_acquire_seconds", lock_wait.clone()),
        ("baton_lock_delay_wait_seconds", lock_wait),
    ]
}

/// Baton's default buckets (seconds), and those of counts.
const DEFAULT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
const LENGTH_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1024.0];

/// A Prometheus builder with every family's buckets.
pub(crate) fn builder() -> Result<PrometheusBuilder, BuildError> {
    let mut b = PrometheusBuilder::new()
        .set_buckets(DEFAULT_BUCKETS)?
        // Counts, not seconds: queue lengths and proposal batch sizes.
        .set_buckets_for_metric(Matcher::Suffix("_length".into()), LENGTH_BUCKETS)?
        .set_buckets_for_metric(Matcher::Suffix("_batch_size".into()), BATCH_BUCKETS)?;
    for (name, buckets) in buckets() {
        b = b.set_buckets_for_metric(Matcher::Full(name.into()), &buckets)?;
    }
    Ok(b)
}

/// Gives every family its HELP (the recorder must be installed).
pub(crate) fn describe() {
    for (name, kind, help) in FAMILIES {
        match kind {
            Counter => metrics::describe_counter!(*name, *help),
            Gauge => metrics::describe_gauge!(*name, *help),
            Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for (name, kind, help) in FAMILIES {
            assert!(seen.insert(*name), "{name} twice");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
            assert!(!help.is_empty() && !help.contains('\n'), "{name}");
            if *kind == Counter {
                // etcd's health counters and a few debugging gauges break the rule; Baton's
                // own counters keep it.
                assert!(
                    name.ends_with("_total") || name.starts_with("etcd_server_health_"),
                    "counter {name} without _total"
                );
            }
        }
        for (name, _) in buckets() {
            assert!(
                FAMILIES
                    .iter()
                    .any(|(n, k, _)| *n == name && *k == Histogram),
                "buckets for {name}, which is no histogram in the table"
            );
        }
    }
}
