//! Lease verdicts: the leader's answer to every grant check, sent ahead on its AppendEntries,
//! so that a follower grants a lock without asking.
//!
//! Why: before a lock goes to a waiter, the leader must have confirmed its leadership with a
//! quorum and judged the waiter's lease on its lease clock, the only clock that sees
//! keep-alives (`LeaseDuty::confirm_grant`, etcd#11456). A waiter whose client is on a
//! follower asked for that verdict with a call to the leader after its member applied the
//! release that made it the head of the queue: one more round trip in every handoff to a
//! follower's client (issue 19). The commit that wakes the waiter reaches the follower on an
//! AppendEntries from the leader anyway (openraft's commit heartbeat, or Baton's commit
//! notice); the leader now puts into that request's envelope what any grant check would hear
//! from it at that moment — as long as the answer is the same for every lease: "a quorum
//! confirmed my leadership in this term within the last heartbeat interval, I had committed
//! this index, and no lease I track is being expired or reaches its deadline within
//! `alive_for`" (`PeerMessage.lease_verdict`). When a lease is near its deadline or being
//! expired, no verdict is sent and followers ask as before.
//!
//! What a follower may conclude, and for how long: a verdict stands for a grant when it came
//! from the leader this member follows, in its current term; was heard less than one
//! heartbeat interval ago (and less than half its `alive_for`, which the leader makes two
//! heartbeat intervals), so the leases it vouches for are still alive unless the request
//! spent more than a heartbeat interval in flight; and its committed index is at least what
//! this member had applied when the waiter looked — the verdict is no older than the state
//! that made the waiter the head. The member then waits until it has applied that index, as
//! after a grant check, and the lease must exist in its state. A partitioned follower stops
//! hearing verdicts and falls back to the grant check, which fails without a leader.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, Weak};
use std::time::Duration;

use openraft::raft::AppendEntriesRequest;
use openraft::{LogId, Vote};
use parking_lot::Mutex;
use tokio::time::Instant;

use baton_proto::baton::raft::v1::LeaseVerdict;

use crate::types::TypeConfig;

/// The leader's side of a verdict: how long every lease stays alive, if it can vouch for that
/// now as leader in `term` (`ReadIndex::vouch_for_leases`). A trait so that this module, which
/// the network uses, does not reach back into the replica's parts above it.
pub(crate) trait VouchForLeases: Send + Sync {
    fn vouch_for_leases(&self, term: u64) -> Option<Duration>;
}

/// A verdict as heard by a follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Heard {
    leader: u64,
    term: u64,
    committed_index: u64,
    alive_for: Duration,
    at: Instant,
}

/// Both halves of the verdicts on one member: the leader issues them, a follower keeps the
/// last one heard. Shared by the peer client (issuing), the peer service (hearing) and the
/// lease duty (using).
#[derive(Default)]
pub(crate) struct LeaseVerdicts {
    /// Where the leader's confirmations and lease clock are; bound once the replica's parts
    /// exist (the peer client is made before them). Weak: the network must not keep them.
    reads: OnceLock<Weak<dyn VouchForLeases>>,
    heard: Mutex<Option<Heard>>,
    /// Grants that stood on a verdict instead of a grant check.
    used: AtomicU64,
}

impl LeaseVerdicts {
    pub(crate) fn bind(&self, reads: Weak<dyn VouchForLeases>) {
        let _ = self.reads.set(reads);
    }

    /// The leader's side: the verdict to put on an AppendEntries of `vote` carrying
    /// `leader_commit`, if this member can give one now.
    pub(crate) fn issue(
        &self,
        vote: &Vote<u64>,
        leader_commit: Option<LogId<u64>>,
    ) -> Option<LeaseVerdict> {
        let term = vote.leader_id().term;
        // Only once an entry of this term is committed does the committed index cover
        // everything earlier leaders committed (Raft's rule for ReadIndex; what
        // `ReadIndex::floor` ensures for grant checks).
        let committed = leader_commit.filter(|l| l.leader_id.term == term)?;
        if !vote.is_committed() {
            return None;
        }
        let reads = self.reads.get()?.upgrade()?;
        let alive_for = reads.vouch_for_leases(term)?;
        Some(LeaseVerdict {
            term,
            committed_index: committed.index,
            alive_for_ms: u32::try_from(alive_for.as_millis()).unwrap_or(u32::MAX),
        })
    }

    /// The follower's side: keeps the verdict on an AppendEntries from `from`, if the request
    /// is that leader's own and carries the committed id the verdict names, of the verdict's
    /// term. Called before the request is handed to Raft, so that the waiter its commit wakes
    /// finds it; whether Raft then accepts the request is checked when the verdict is used
    /// (term and leader).
    pub(crate) fn hear(
        &self,
        from: u64,
        verdict: &LeaseVerdict,
        rpc: &AppendEntriesRequest<TypeConfig>,
    ) {
        let leader = rpc.vote.leader_id();
        let carried = rpc
            .leader_commit
            .filter(|l| l.leader_id.term == verdict.term)
            .map(|l| l.index);
        if !rpc.vote.is_committed()
            || leader.voted_for() != Some(from)
            || leader.term != verdict.term
            || carried != Some(verdict.committed_index)
        {
            return;
        }
        let heard = Heard {
            leader: from,
            term: verdict.term,
            committed_index: verdict.committed_index,
            alive_for: Duration::from_millis(u64::from(verdict.alive_for_ms)),
            at: Instant::now(),
        };
        let mut last = self.heard.lock();
        // Requests may overtake each other: an older verdict heard later does not replace a
        // newer one.
        if last.is_none_or(|l| (l.term, l.committed_index) <= (heard.term, heard.committed_index)) {
            *last = Some(heard);
        }
    }

    /// The follower's side: the committed index to wait for before granting, if the last
    /// verdict heard stands for a grant by a member following `leader` in `term` that had
    /// applied `applied` when the waiter looked (see the module docs).
    pub(crate) fn standing(
        &self,
        leader: Option<u64>,
        term: u64,
        applied: u64,
        heartbeat: Duration,
    ) -> Option<u64> {
        let heard = (*self.heard.lock())?;
        let window = heartbeat.min(heard.alive_for / 2);
        let stands = Some(heard.leader) == leader
            && heard.term == term
            && heard.committed_index >= applied
            && heard.at.elapsed() < window;
        stands.then_some(heard.committed_index)
    }

    /// A grant stood on a verdict.
    pub(crate) fn used(&self) {
        self.used.fetch_add(1, Ordering::Relaxed);
        cached_counter!("baton_lock_grant_checks_total", "confirmed_by" => "verdict").increment(1);
    }

    pub(crate) fn used_total(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    const HEARTBEAT: Duration = Duration::from_millis(100);

    fn request(term: u64, leader: u64, committed: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(term, leader),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: Some(LogId::new(CommittedLeaderId::new(term, leader), committed)),
        }
    }

    fn verdict(term: u64, committed_index: u64) -> LeaseVerdict {
        LeaseVerdict {
            term,
            committed_index,
            alive_for_ms: 200,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_verdict_stands_briefly_for_its_leader_term_and_state() {
        let v = LeaseVerdicts::default();
        assert_eq!(v.standing(Some(1), 3, 0, HEARTBEAT), None, "none heard");
        v.hear(1, &verdict(3, 10), &request(3, 1, 10));
        assert_eq!(v.standing(Some(1), 3, 10, HEARTBEAT), Some(10));
        assert_eq!(v.standing(Some(1), 3, 7, HEARTBEAT), Some(10));
        // Applied beyond what the verdict saw: it may predate the state the waiter saw.
        assert_eq!(v.standing(Some(1), 3, 11, HEARTBEAT), None);
        // Another leader or term: not this verdict's.
        assert_eq!(v.standing(Some(2), 3, 10, HEARTBEAT), None);
        assert_eq!(v.standing(Some(1), 4, 10, HEARTBEAT), None);
        assert_eq!(v.standing(None, 3, 10, HEARTBEAT), None);
        // Stale after a heartbeat interval.
        tokio::time::advance(HEARTBEAT).await;
        assert_eq!(v.standing(Some(1), 3, 10, HEARTBEAT), None);
        // and after half of what the leader vouched for, if that is shorter.
        v.hear(1, &verdict(3, 12), &request(3, 1, 12));
        let long_heartbeat = Duration::from_secs(1);
        tokio::time::advance(Duration::from_millis(60)).await;
        assert_eq!(v.standing(Some(1), 3, 12, long_heartbeat), Some(12));
        tokio::time::advance(Duration::from_millis(40)).await;
        assert_eq!(v.standing(Some(1), 3, 12, long_heartbeat), None);
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_senders_own_request_carries_a_verdict() {
        let v = LeaseVerdicts::default();
        // Sent by another member than the request's leader.
        v.hear(2, &verdict(3, 10), &request(3, 1, 10));
        // For another term than the request's.
        v.hear(1, &verdict(4, 10), &request(3, 1, 10));
        // Naming a commit the request does not carry.
        v.hear(1, &verdict(3, 11), &request(3, 1, 10));
        // Over a committed id of an earlier term (the leader's first entry not yet
        // committed): it may not cover what earlier leaders committed.
        let mut earlier = request(3, 1, 10);
        earlier.leader_commit = Some(LogId::new(CommittedLeaderId::new(2, 1), 10));
        v.hear(1, &verdict(3, 10), &earlier);
        // From a candidate's (uncommitted) vote.
        let mut uncommitted = request(3, 1, 10);
        uncommitted.vote = Vote::new(3, 1);
        v.hear(1, &verdict(3, 10), &uncommitted);
        assert_eq!(v.standing(Some(1), 3, 0, HEARTBEAT), None);
        assert_eq!(v.standing(Some(2), 3, 0, HEARTBEAT), None);
        assert_eq!(v.standing(Some(1), 4, 0, HEARTBEAT), None);

        // An older verdict heard after a newer one does not replace it.
        v.hear(1, &verdict(3, 20), &request(3, 1, 20));
        v.hear(1, &verdict(3, 15), &request(3, 1, 15));
        assert_eq!(v.standing(Some(1), 3, 0, HEARTBEAT), Some(20));
        // A new term's does.
        v.hear(5, &verdict(4, 2), &request(4, 5, 2));
        assert_eq!(v.standing(Some(5), 4, 0, HEARTBEAT), Some(2));
    }
}
