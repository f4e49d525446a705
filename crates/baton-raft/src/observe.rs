//! What a replica counts about itself for monitoring, kept as data ([`Observed`]) and handed
//! out whole ([`ReplicaMetrics`], `Node::metrics`): the server turns it into etcd's
//! `etcd_server_*`, `etcd_mvcc_*` and `etcd_debugging_lease_*` families when it is scraped.
//!
//! Counting is a relaxed atomic add where the event happens (no registry lookup, no label
//! strings on the request path); what is state rather than an event (leader, indexes, the
//! applied state's size) is read at scrape time. Each field says which etcd metric it feeds
//! and how Baton's design maps onto etcd's meaning.

use std::sync::atomic::{AtomicU64, Ordering};

use baton_core::{Applied, MvccOps, Response};

use crate::answer::ProposeError;

/// etcd's "slow apply" threshold (`--warning-apply-duration`'s default, 100 ms).
pub(crate) const SLOW_APPLY: std::time::Duration = std::time::Duration::from_millis(100);

/// Event counters of one replica (since it started).
#[derive(Debug, Default)]
pub(crate) struct Observed {
    /// Proposals of this member's callers not answered yet (`etcd_server_proposals_pending`).
    pending_proposals: AtomicU64,
    /// `etcd_server_proposals_failed_total`: see [`counts_as_failed_proposal`].
    proposals_failed: AtomicU64,
    /// `etcd_server_read_indexes_failed_total`: linearizable reads whose ReadIndex failed.
    read_indexes_failed: AtomicU64,
    /// `etcd_server_slow_read_indexes_total`: ReadIndex rounds that timed out.
    slow_read_indexes: AtomicU64,
    /// `etcd_server_leader_changes_seen_total`: see [`LeaderSeen`].
    leader_changes: AtomicU64,
    /// `etcd_debugging_lease_renewed_total`: keep-alives this member renewed as the leader.
    leases_renewed: AtomicU64,
    /// `etcd_debugging_server_lease_expired_total`: leases this member expired as the leader.
    leases_expired: AtomicU64,
}

/// Counts a proposal from its start until it is answered.
pub(crate) struct PendingProposal<'a>(&'a Observed);

impl Drop for PendingProposal<'_> {
    fn drop(&mut self) {
        self.0.pending_proposals.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Observed {
    pub(crate) fn proposal(&self) -> PendingProposal<'_> {
        self.pending_proposals.fetch_add(1, Ordering::Relaxed);
        PendingProposal(self)
    }

    pub(crate) fn proposal_failed(&self, e: &ProposeError) {
        if counts_as_failed_proposal(e) {
            self.proposals_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn read_index_failed(&self, e: &ProposeError) {
        if matches!(e, ProposeError::ShuttingDown) {
            return;
        }
        self.read_indexes_failed.fetch_add(1, Ordering::Relaxed);
        if matches!(e, ProposeError::Timeout) {
            self.slow_read_indexes.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn leader_changed(&self) {
        self.leader_changes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn lease_renewed(&self) {
        self.leases_renewed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn leases_expired(&self, n: u64) {
        self.leases_expired.fetch_add(n, Ordering::Relaxed);
    }
}

/// Whether a proposal's failure is one etcd counts in `proposals_failed_total`: the ones
/// that happen once a proposal is handed to Raft — no leader to take it, leadership lost,
/// timed out, the leader or the storage failed. Refusals before that (too many requests,
/// no space, a leader-only command, a refused membership change) and a member shutting
/// down are not (etcd returns those before `raft.Propose`, or stops).
pub(crate) fn counts_as_failed_proposal(e: &ProposeError) -> bool {
    match e {
        ProposeError::NoLeader
        | ProposeError::NotLeader { .. }
        | ProposeError::LeaderChanged
        | ProposeError::Timeout
        | ProposeError::LeaderFailed(_)
        | ProposeError::Storage(_)
        | ProposeError::Halted(_) => true,
        ProposeError::ShuttingDown
        | ProposeError::MembershipChange(_)
        | ProposeError::TooManyRequests
        | ProposeError::LeaderOnly(_)
        | ProposeError::NoSpace
        | ProposeError::Internal(_) => false,
    }
}

/// What applying the log did, added up since the replica started (not replicated, not in
/// snapshots: a restarted member counts from zero, as etcd's counters do). Kept beside the
/// applied state, under its lock, so adding to it costs a few integer additions per entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyTally {
    /// The key-space calls, by etcd's counting rules (`baton_core::MvccOps`).
    pub mvcc: MvccOps,
    /// `etcd_debugging_lease_granted_total`: lease grants applied.
    pub leases_granted: u64,
    /// `etcd_debugging_lease_revoked_total`: leases revoked or expired, as applied.
    pub leases_revoked: u64,
    /// `etcd_server_slow_apply_total`: Raft entries whose apply took longer than 100 ms
    /// (Baton applies a batch of commands as one entry; etcd counts per request).
    pub slow_applies: u64,
}

impl ApplyTally {
    /// Adds one applied command.
    pub(crate) fn add(&mut self, applied: &Applied) {
        self.mvcc.add(&applied.ops);
        match &applied.response {
            Response::LeaseGrant { .. } => self.leases_granted += 1,
            Response::LeaseRevoke => self.leases_revoked += 1,
            Response::ExpireLeases { expired, .. } => self.leases_revoked += expired.len() as u64,
            _ => {}
        }
    }
}

/// A replica's monitoring figures at one moment (`Node::metrics`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaMetrics {
    /// `etcd_server_has_leader`: this member knows a leader that is alive by Raft's rules,
    /// not just a leader id. A follower or learner must have heard from it within the
    /// election timeout (etcd's follower loses its leader when its election timer fires);
    /// a leader must have heard from a quorum within the election timeout (etcd's
    /// CheckQuorum makes it step down then). Without this, a member cut off from a dead
    /// leader would report one forever (openraft keeps the last leader's id).
    pub has_leader: bool,
    /// `etcd_server_is_leader`.
    pub is_leader: bool,
    /// `etcd_server_is_learner`.
    pub is_learner: bool,
    pub member_id: u64,
    /// `etcd_server_leader_changes_seen_total`.
    pub leader_changes: u64,
    /// `etcd_server_proposals_committed_total` (a gauge in etcd: the commit index).
    pub committed_index: u64,
    /// `etcd_server_proposals_applied_total` (a gauge in etcd: the applied index).
    pub applied_index: u64,
    pub proposals_pending: u64,
    pub proposals_failed: u64,
    pub read_indexes_failed: u64,
    pub slow_read_indexes: u64,
    pub leases_renewed: u64,
    pub leases_expired: u64,
    /// `etcd_server_snapshot_apply_in_progress_total`: installing a leader's snapshot now.
    pub snapshot_installing: bool,
    /// `etcd_disk_wal_write_bytes_total`: bytes written to the Raft log.
    pub wal_write_bytes: u64,
    /// `etcd_mvcc_db_total_size_in_bytes`: what the data directory's log and snapshot take
    /// on disk (etcd: its bbolt file).
    pub disk_bytes: u64,
    /// `etcd_server_quota_backend_bytes`: `--quota-backend-bytes` (2 GiB by default), the
    /// size estimate of the state above which `NOSPACE` is raised, as etcd's. Without a
    /// quota (a negative flag), what the data takes on disk now plus the free space above
    /// `--disk-reserve-bytes` (the disk's own limit; `disk_bytes` alone before the first
    /// measurement).
    pub quota_bytes: u64,
    pub apply: ApplyTally,
}

/// Tells leader changes as etcd counts them (`leader_changes_seen_total`): each time the
/// leader this member knows becomes a member other than the one it knew before, the first
/// leader included; losing the leader (none known) is no change by itself. Fed from
/// openraft's server metrics, which change only with the leader, the vote, the role or the
/// membership — never per request (`start::watch_leader_changes`).
#[derive(Debug, Default)]
pub(crate) struct LeaderSeen(Option<u64>);

impl LeaderSeen {
    /// Whether `leader` (known now) is a change from the last leader known.
    pub(crate) fn saw(&mut self, leader: Option<u64>) -> bool {
        match leader {
            Some(id) if self.0 != Some(id) => {
                self.0 = Some(id);
                true
            }
            _ => false,
        }
    }
}

impl Observed {
    /// The counters' part of [`ReplicaMetrics`].
    pub(crate) fn fill(&self, m: &mut ReplicaMetrics) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        m.leader_changes = get(&self.leader_changes);
        m.proposals_pending = get(&self.pending_proposals);
        m.proposals_failed = get(&self.proposals_failed);
        m.read_indexes_failed = get(&self.read_indexes_failed);
        m.slow_read_indexes = get(&self.slow_read_indexes);
        m.leases_renewed = get(&self.leases_renewed);
        m.leases_expired = get(&self.leases_expired);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_proposal_is_counted_until_dropped() {
        let o = Observed::default();
        let a = o.proposal();
        let b = o.proposal();
        assert_eq!(o.pending_proposals.load(Ordering::Relaxed), 2);
        drop(a);
        drop(b);
        assert_eq!(o.pending_proposals.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_leader_change_is_a_new_leader_not_a_lost_one() {
        let mut seen = LeaderSeen::default();
        let changes: Vec<bool> = [
            None,
            Some(1),
            Some(1),
            None,
            Some(1),
            Some(2),
            None,
            Some(3),
        ]
        .into_iter()
        .map(|l| seen.saw(l))
        .collect();
        assert_eq!(
            changes,
            [false, true, false, false, false, true, false, true]
        );
    }

    #[test]
    fn only_failures_after_the_hand_off_to_raft_count() {
        let o = Observed::default();
        o.proposal_failed(&ProposeError::Timeout);
        o.proposal_failed(&ProposeError::NoLeader);
        o.proposal_failed(&ProposeError::TooManyRequests);
        o.proposal_failed(&ProposeError::NoSpace);
        o.proposal_failed(&ProposeError::ShuttingDown);
        assert_eq!(o.proposals_failed.load(Ordering::Relaxed), 2);
        o.read_index_failed(&ProposeError::Timeout);
        o.read_index_failed(&ProposeError::LeaderChanged);
        o.read_index_failed(&ProposeError::ShuttingDown);
        assert_eq!(o.read_indexes_failed.load(Ordering::Relaxed), 2);
        assert_eq!(o.slow_read_indexes.load(Ordering::Relaxed), 1);
    }
}
