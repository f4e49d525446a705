//! The leader's side of forwarded requests ([`LeaderService`]): each `LeaderRequest` served
//! by the component whose operation it is, its answer wrapped by its own
//! [`LeaderCall::respond`] (so the answer's type is checked against the call's when the
//! crate compiles). Everything runs locally: a member that is not the leader answers
//! `NotLeader` and the follower tries again, so requests never hop twice.

use std::future::Future;
use std::sync::Arc;

use baton_core::Command;
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
use crate::publish::publish_local;
use crate::read_index::ReadIndex;
use crate::replica::Replica;
use crate::wire::{ForwardedProposal, LeaderRequest, LeaderResponse};

pub(crate) struct LeaderService {
    pub(crate) replica: Arc<Replica>,
    pub(crate) reads: Arc<ReadIndex>,
    pub(crate) leases: Arc<LeaseDuty>,
    pub(crate) members: Arc<Members>,
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
