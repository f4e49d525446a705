//! The leader's log write in parallel with replication ([`EarlyAppend`]): when the leader
//! appends entries to its own log, the same entries go to every follower at once, as an
//! ordinary AppendEntries of the leader's term, instead of after the leader's fsync.
//!
//! Why: openraft 0.9 sends AppendEntries only once the leader's own append is flushed
//! (`RaftCore::append_to_log` awaits the flush before the engine's `Replicate` commands run),
//! so a 3-member write paid the leader's fsync and then a follower's fsync, one after the
//! other. The Raft dissertation (§10.2.1) allows the leader to write its log in parallel with
//! replicating it, counting itself in the quorum only once its own write is durable — which
//! is what openraft still does here: nothing about the leader's own flush or its commit rule
//! changes. What changes is that a follower has usually appended and fsynced the entries by
//! the time openraft's own AppendEntries for them arrives; it then finds them in its log
//! (openraft skips entries it already holds) and answers without a disk write. The critical
//! path of a write becomes max(leader fsync, follower fsync) + one round trip, not their sum.
//!
//! Safety: the early request is exactly one the leader's replication could send (its vote,
//! the entry before them as `prev_log_id`, its committed id), so a follower handles it by
//! the ordinary rules — it refuses it if the vote is stale or the previous entry is missing,
//! and a refusal changes nothing that openraft's next request would not change too. A success
//! answer is recorded (`early_acks`): openraft's own request for entries a follower already
//! acknowledged is answered from it instead of travelling again (see `early_acks` for why
//! that is safe). The leader's own flush and its commit rule stay openraft's. An early
//! request that is lost, late, refused or reordered costs nothing but the bytes: openraft's
//! request then travels as before. The simulation runs with it on every seed.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::{EntryPayload, RaftMetrics};

use crate::network::{Method, Peers};
use crate::types::{LogId, Member, RaftEntry, TypeConfig, Vote};
use crate::wire;

/// How long an early AppendEntries may take before it is given up (openraft's own request,
/// which waits for it only briefly, then travels itself).
const EARLY_TIMEOUT: Duration = Duration::from_secs(1);
/// Early requests in flight to one follower at most. A follower that is slow or gone gets
/// no more until some finish: openraft's replication (with its backoff) carries on alone.
const MAX_IN_FLIGHT_PER_PEER: usize = 4;
/// A follower whose matching entry is further behind than this is catching up through
/// openraft's replication; early requests would only be refused (missing previous entry).
const MAX_LAG_ENTRIES: u64 = 256;
/// A follower that answered no call within this long is presumed down: nothing early.
const ACTIVE_WITHIN: Duration = Duration::from_secs(2);

type Metrics = tokio::sync::watch::Receiver<RaftMetrics<u64, Member>>;

/// Sends the leader's appends to its followers before they are durable locally.
pub(crate) struct EarlyAppend {
    me: u64,
    peers: Arc<Peers>,
    /// openraft's metrics: whether this member leads, its replication targets and how far
    /// each has matched, and the members' addresses. Set once Raft runs ([`EarlyAppend::bind`]).
    metrics: OnceLock<Metrics>,
}

impl EarlyAppend {
    pub(crate) fn new(me: u64, peers: Arc<Peers>) -> Arc<EarlyAppend> {
        Arc::new(EarlyAppend {
            me,
            peers,
            metrics: OnceLock::new(),
        })
    }

    /// Connects it to the running Raft (the log store exists before Raft does).
    pub(crate) fn bind(&self, metrics: Metrics) {
        let _ = self.metrics.set(metrics);
    }

    /// Offers entries the log store is about to append after `prev` under `vote`, with the
    /// committed id it holds: sent to every follower close enough behind, if this member is
    /// the leader of `vote`. Never blocks and never fails (the sends run in their own tasks).
    /// Returns whether any was sent.
    pub(crate) fn offer(
        &self,
        vote: Option<Vote>,
        prev: Option<LogId>,
        entries: &[RaftEntry],
        committed: Option<LogId>,
    ) -> bool {
        let Some(vote) = vote else { return false };
        if entries.is_empty()
            || !vote.is_committed()
            || vote.leader_id().voted_for() != Some(self.me)
        {
            return false;
        }
        // A membership entry goes only through openraft's replication, which sends it to the
        // members of the configuration it makes effective. Sent early to a member it removes,
        // that member would hold a configuration without itself that it never learns is
        // committed (nobody replicates to it any more) and, as a non-voter, never campaign
        // either — so it would never hear that it was removed.
        if entries
            .iter()
            .any(|e| matches!(e.payload, EntryPayload::Membership(_)))
        {
            return false;
        }
        let Some(metrics) = self.metrics.get() else {
            return false;
        };
        let targets: Vec<(u64, Member)> = {
            let m = metrics.borrow();
            let Some(replication) = &m.replication else {
                return false;
            };
            let prev_index = prev.map_or(0, |l| l.index);
            replication
                .iter()
                .filter(|(id, _)| **id != self.me)
                .filter(|(_, matched)| {
                    matched.map_or(0, |l| l.index) + MAX_LAG_ENTRIES >= prev_index
                })
                .filter_map(|(id, _)| {
                    let node = m.membership_config.membership().get_node(id)?;
                    Some((*id, node.clone()))
                })
                .filter(|(id, _)| self.peers.active_within(*id, ACTIVE_WITHIN))
                .collect()
        };
        if targets.is_empty() {
            return false;
        }
        let request = AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: prev,
            entries: entries.to_vec(),
            leader_commit: committed,
        };
        // Too large for one message: openraft's replication splits it; nothing early.
        let Ok(payload) = wire::encode(&request) else {
            return false;
        };
        let last = entries[entries.len() - 1].log_id;
        let mut sent = false;
        for (target, node) in targets {
            let counter = self.peers.early_slots(target);
            if counter.fetch_add(1, Ordering::AcqRel) >= MAX_IN_FLIGHT_PER_PEER {
                counter.fetch_sub(1, Ordering::AcqRel);
                cached_counter!("baton_raft_early_appends_total", "outcome" => "skipped")
                    .increment(1);
                continue;
            }
            sent = true;
            let ticket = self.peers.early_acks.sent(target, vote, last, committed);
            let peers = self.peers.clone();
            let payload = payload.clone();
            tokio::spawn(async move {
                let res = peers
                    .call(target, &node, Method::AppendEntries, payload, EARLY_TIMEOUT)
                    .await;
                counter.fetch_sub(1, Ordering::AcqRel);
                ticket.answered(res.as_deref().is_ok_and(acknowledged));
                let outcome = if res.is_ok() {
                    cached_counter!("baton_raft_early_appends_total", "outcome" => "sent")
                } else {
                    cached_counter!("baton_raft_early_appends_total", "outcome" => "failed")
                };
                outcome.increment(1);
            });
        }
        sent
    }
}

/// Whether an answer to an AppendEntries is a success: the follower durably holds every
/// entry of the request, its log matching the leader's up to the last of them.
fn acknowledged(answer: &[u8]) -> bool {
    matches!(
        wire::decode::<Result<AppendEntriesResponse<u64>, RaftError<u64>>>(answer),
        Ok(Ok(AppendEntriesResponse::Success))
    )
}
