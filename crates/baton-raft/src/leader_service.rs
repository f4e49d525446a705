//! The leader's side of forwarded requests ([`LeaderService`]): each `LeaderRequest` served
//! by the component whose operation it is, its answer wrapped by its own
//! [`LeaderCall::respond`] (so the answer's type is checked against the call's when the
//! crate compiles). Everything runs locally: a member that is not the leader answers
//! `NotLeader` and the follower tries again, so requests never hop twice.

use std::future::Future;
use std::sync::Arc;

use baton_core::Command;
use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, LogId};
use tokio::time::Instant;

use crate::answer::{ProposeError, Proposed};
use crate::calls::{
    ChangeMembersCall, GrantCheckCall, KeepAliveCall, LeaderCall, ProposeCall, PublishCall,
    ReadIndexCall, TimeToLiveCall,
};
use crate::lease_duty::LeaseDuty;
use crate::limits::REQUEST_TIMEOUT;
use crate::membership::change::MemberError;
use crate::membership::Members;
use crate::network::Peers;
use crate::publish::publish_local;
use crate::read_index::ReadIndex;
use crate::replica::Replica;
use crate::wire::{ForwardedProposal, LeaderRequest, LeaderResponse};

pub(crate) struct LeaderService {
    pub(crate) replica: Arc<Replica>,
    pub(crate) reads: Arc<ReadIndex>,
    pub(crate) leases: Arc<LeaseDuty>,
    pub(crate) members: Arc<Members>,
    /// For the commit notice that follows a forwarded batch (`notify_commit`).
    pub(crate) peers: Arc<Peers>,
}

/// Serves `call` with `serve` and wraps the outcome as `C`'s response (or `Failed`).
async fn answer<C, F, Fut>(call: C, serve: F) -> LeaderResponse
where
    C: LeaderCall,
    F: FnOnce(C) -> Fut,
    Fut: Future<Output = Result<C::Answer, ProposeError>>,
{
    serve(call)
        .await
        .map(C::respond)
        .unwrap_or_else(LeaderResponse::Failed)
}

impl LeaderService {
    /// Tells `follower` that the entry of term `term` at `index`, which this leader has
    /// applied, is committed — before the answer to the forwarded batch that holds it goes.
    ///
    /// Why: the follower answers its client only once it has applied that entry itself
    /// (read-your-writes on the member written through), and it learns the entry is
    /// committed from a commit notice. openraft's own notice to it waits for that
    /// follower's early answer (`PeerClient::append_entries`), and so for its fsync, though
    /// the entry was committed by the leader and the other follower. In a syscall trace of
    /// a put through a follower (1 client) the batch's answer reached it 34 µs before that
    /// notice, and its client's answer went 87 µs after the batch's answer.
    /// Sent only if news to it, like openraft's; one it cannot take yet (its log does not
    /// hold the entry) is given back and openraft's goes as before.
    pub(crate) fn notify_commit(&self, follower: u64, term: u64, index: u64) {
        let me = self.replica.member_id;
        let vote = self.replica.raft.metrics().borrow().vote;
        let leader = vote.leader_id();
        if !vote.is_committed() || leader.voted_for() != Some(me) || leader.term != term {
            return;
        }
        let Some(node) = self.replica.membership_node(follower) else {
            return;
        };
        let committed = Some(LogId::new(CommittedLeaderId::new(term, me), index));
        if !self
            .peers
            .early_acks
            .commit_news(follower, &vote, committed)
        {
            return;
        }
        let notice = AppendEntriesRequest {
            vote,
            prev_log_id: committed,
            entries: Vec::new(),
            leader_commit: committed,
        };
        self.peers.clone().notify_commit(follower, node, notice);
    }

    /// Serves one request forwarded by a follower.
    pub(crate) async fn serve(&self, req: LeaderRequest) -> LeaderResponse {
        match req {
            LeaderRequest::Propose(command) => {
                answer(ProposeCall(command), |c| async move {
                    self.replica.propose(c.0).await.map(forwarded)
                })
                .await
            }
            LeaderRequest::ReadIndex => answer(ReadIndexCall, |_| self.reads.shared_local()).await,
            LeaderRequest::KeepAlive(id) => {
                answer(KeepAliveCall(id), |c| self.leases.keep_alive_confirmed(c.0)).await
            }
            LeaderRequest::TimeToLive(id) => {
                answer(TimeToLiveCall(id), |c| async move {
                    self.leases.time_to_live_local(c.0)
                })
                .await
            }
            LeaderRequest::Publish { id, member } => {
                answer(PublishCall { id, member }, |c| {
                    publish_local(&self.replica, c.id, c.member)
                })
                .await
            }
            LeaderRequest::GrantCheck(lease) => {
                answer(GrantCheckCall(lease), |c| {
                    self.leases.grant_check_local(c.0)
                })
                .await
            }
            LeaderRequest::ChangeMembers(change) => {
                answer(ChangeMembersCall(change), |c| async move {
                    let deadline = Instant::now() + REQUEST_TIMEOUT;
                    match self.members.change_local(c.0, deadline).await {
                        // Leadership and the like: the follower retries elsewhere.
                        Err(MemberError::Propose(e)) => Err(e),
                        res => Ok(res),
                    }
                })
                .await
            }
        }
    }

    /// Serves a follower's batch of forwarded requests: every item as [`LeaderService::serve`]
    /// would serve it alone, all at once, the proposals handed to the proposer together (one
    /// Raft entry for the batch, not one per proposer wake-up). One answer per item, in
    /// order.
    pub(crate) async fn serve_batch(&self, reqs: Vec<LeaderRequest>) -> Vec<LeaderResponse> {
        let n = reqs.len();
        let mut proposal_at = Vec::new();
        let mut commands: Vec<Command> = Vec::new();
        let mut others = Vec::new();
        for (i, req) in reqs.into_iter().enumerate() {
            match req {
                LeaderRequest::Propose(command) => {
                    proposal_at.push(i);
                    commands.push(command);
                }
                other => others.push((i, other)),
            }
        }
        let proposals = async {
            if commands.is_empty() {
                Vec::new()
            } else {
                self.replica.propose_many(commands).await
            }
        };
        let served = futures::future::join_all(
            others
                .into_iter()
                .map(|(i, req)| async move { (i, self.serve(req).await) }),
        );
        let (proposed, served) = futures::join!(proposals, served);
        assert_eq!(proposed.len(), proposal_at.len(), "one result per proposal");
        let mut out: Vec<Option<LeaderResponse>> = (0..n).map(|_| None).collect();
        for (i, res) in proposal_at.into_iter().zip(proposed) {
            let res = res.map(forwarded).map(ProposeCall::respond);
            out[i] = Some(res.unwrap_or_else(LeaderResponse::Failed));
        }
        for (i, resp) in served {
            out[i] = Some(resp);
        }
        out.into_iter()
            .map(|r| r.expect("every item is answered"))
            .collect()
    }
}

/// A leader's proposal outcome as sent back to the follower that forwarded it.
fn forwarded(p: Proposed) -> ForwardedProposal {
    ForwardedProposal {
        revision: p.applied.revision,
        response: p.applied.response,
        raft_term: p.raft_term,
        raft_index: p.raft_index,
    }
}
