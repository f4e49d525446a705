//! What a replica reports about itself: [`NodeStatus`] for `Status`, headers and metrics,
//! and [`WalWritePaths`] for the log's diagnostics.

/// Which way the Raft log's writes went since start (see `wal/handoff.rs`): operations
/// carried out inline on the Raft core task, and batches (with their operations) carried out
/// by the writer's batch loop (its OS thread, or its task under simulation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalWritePaths {
    pub inline_ops: u64,
    pub loop_batches: u64,
    pub loop_ops: u64,
}

/// A replica's view of itself, for `Status`, headers and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub cluster_id: u64,
    pub member_id: u64,
    /// The current leader's member id, if one is known.
    pub leader_id: Option<u64>,
    pub term: u64,
    /// Last log index written (not necessarily committed).
    pub last_log_index: u64,
    /// Last log index applied to the state machine.
    pub applied_index: u64,
    /// Bytes on disk used by the log and snapshots.
    pub disk_bytes: u64,
}
