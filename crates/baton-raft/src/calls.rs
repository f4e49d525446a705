//! The operations only the leader serves, one type each, and the trait that pairs each with
//! its answer ([`LeaderCall`]).
//!
//! A call travels as a `wire::LeaderRequest` variant and comes back as a
//! `wire::LeaderResponse` variant: those enums are pinned formats (`golden`), so they stay as
//! they are, and this trait is the one place that says which request goes with which answer.
//! `routing::Router::route` is generic over it: a caller routes a [`KeepAliveCall`] and gets
//! a `KeepAlive` back, checked when the crate compiles; only a leader of another build could
//! send a mismatched answer, and that is reported as `InternalError::UnexpectedAnswer`. The
//! leader's side (`leader_service`) answers each request through [`LeaderCall::respond`], so
//! the pairing is the same in both directions.
//!
//! A new operation is a pair of wire variants, one struct and one impl here, and its
//! leader-side handler in `leader_service`.

use baton_core::{Command, LeaseId};

use crate::answer::KeepAlive;
use crate::membership::change::{MemberChange, MemberChanged, MemberError};
use crate::types::Member;
use crate::wire::{ForwardedProposal, LeaderRequestRef, LeaderResponse};

/// An operation only the leader can serve: what it sends, what it gets back, and how the
/// router may treat it.
pub(crate) trait LeaderCall: Send + Sized {
    /// What the leader's answer carries (errors of the leader itself come as
    /// `LeaderResponse::Failed` and are the router's business).
    type Answer: Send;
    /// Sending it twice is harmless, so a failed attempt may be retried blindly even when
    /// it may have reached the leader. A proposal is not: it could be applied twice; nor is a
    /// membership change (a second MemberAdd would add a second member).
    const IDEMPOTENT: bool;
    /// It travels in a `ForwardBatch` (see `forward`). Membership changes and publishing
    /// go alone in a `Forward`: they are rare, and may take the leader seconds (joint
    /// consensus, a learner catching up) — a batch is answered when its slowest item is
    /// done, so they would hold up every request batched with them.
    const BATCHED: bool;
    /// It may wait a moment for more to batch with (`forward`'s linger): keep-alives, which
    /// arrive in bursts and are not latency-critical.
    const LINGERS: bool = false;

    /// Its wire form, borrowed (encoded as the `LeaderRequest` variant would be).
    fn request(&self) -> LeaderRequestRef<'_>;
    /// Its answer from the leader's response; the response back if it is another kind.
    fn answer(resp: LeaderResponse) -> Result<Self::Answer, LeaderResponse>;
    /// The response that carries `answer` (the leader's side).
    fn respond(answer: Self::Answer) -> LeaderResponse;
}

/// Replicate and apply a command.
pub(crate) struct ProposeCall(pub(crate) Command);

impl LeaderCall for ProposeCall {
    type Answer = ForwardedProposal;
    const IDEMPOTENT: bool = false;
    const BATCHED: bool = true;
    fn request(&self) -> LeaderRequestRef<'_> {
        LeaderRequestRef::Propose(&self.0)
    }
    fn answer(resp: LeaderResponse) -> Result<ForwardedProposal, LeaderResponse> {
        match resp {
            LeaderResponse::Proposed(p) => Ok(p),
            other => Err(other),
        }
    }
    fn respond(answer: ForwardedProposal) -> LeaderResponse {
        LeaderResponse::Proposed(answer)
    }
}

/// Confirm leadership with a quorum; the index a linearizable read must wait for.
pub(crate) struct ReadIndexCall;

impl LeaderCall for ReadIndexCall {
    type Answer = u64;
    const IDEMPOTENT: bool = true;
    const BATCHED: bool = true;
    fn request(&self) -> LeaderRequestRef<'_> {
        LeaderRequestRef::ReadIndex
    }
    fn answer(resp: LeaderResponse) -> Result<u64, LeaderResponse> {
        match resp {
            LeaderResponse::ReadIndex(index) => Ok(index),
            other => Err(other),
        }
    }
    fn respond(answer: u64) -> LeaderResponse {
        LeaderResponse::ReadIndex(answer)
    }
}

/// Renew a lease on the leader's lease clock.
pub(crate) struct KeepAliveCall(pub(crate) LeaseId);

impl LeaderCall for KeepAliveCall {
    type Answer = KeepAlive;
    const IDEMPOTENT: bool = true;
    const BATCHED: bool = true;
    const LINGERS: bool = true;
    fn request(&self) -> LeaderRequestRef<'_> {
        LeaderRequestRef::KeepAlive(self.0)
    }
    fn answer(resp: LeaderResponse) -> Result<KeepAlive, LeaderResponse> {
        match resp {
            LeaderResponse::KeepAlive(k) => Ok(k),
            other => Err(other),
        }
    }
    fn respond(answer: KeepAlive) -> LeaderResponse {
        LeaderResponse::KeepAlive(answer)
    }
}

/// Remaining TTL of a lease on the leader's lease clock, in seconds.
pub(crate) struct TimeToLiveCall(pub(crate) LeaseId);

impl LeaderCall for TimeToLiveCall {
    type Answer = Option<i64>;
    const IDEMPOTENT: bool = true;
    const BATCHED: bool = true;
    fn request(&self) -> LeaderRequestRef<'_> {
        LeaderRequestRef::TimeToLive(self.0)
    }
    fn answer(resp: LeaderResponse) -> Result<Option<i64>, LeaderResponse> {
        match resp {
            LeaderResponse::TimeToLive(ttl) => Ok(ttl),
            other => Err(other),
        }
    }
    fn respond(answer: Option<i64>) -> LeaderResponse {
        LeaderResponse::TimeToLive(answer)
    }
}

/// Record member `id`'s name and client URLs in the membership (its peer URLs are kept).
pub(crate) struct PublishCall {
    pub(crate) id: u64,
    pub(crate) member: Member,
}

impl LeaderCall for PublishCall {
    type Answer = ();
    // Publishing the same attributes twice records them once.
    const IDEMPOTENT: bool = true;
    const BATCHED: bool = false;
    fn request(&self) -> LeaderRequestRef<'_> {
        LeaderRequestRef::Publish {
            id: self.id,
            member: &self.member,
        }
    }
    fn answer(resp: LeaderResponse) -> Result<(), LeaderResponse> {
        match resp {
            LeaderResponse::Published => Ok(()),
            other => Err(other),
        }
    }
    fn respond((): ()) -> LeaderResponse {
        LeaderResponse::Published
    }
}

/// Before a lock grant: confirm leadership, then judge the lease on the leader's clock.
pub(crate) struct GrantCheckCall(pub(crate) LeaseId);

/// [`GrantCheckCall`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrantCheck {
    /// The index the grant must wait for (as a linearizable read).
    pub(crate) read_index: u64,
    pub(crate) lease_alive: bool,
}

impl LeaderCall for GrantCheckCall {
    type Answer = GrantCheck;
    const IDEMPOTENT: bool = true;
    const BATCHED: bool = true;
    fn request(&self) -> LeaderRequestRef<'_> {
        LeaderRequestRef::GrantCheck(self.0)
    }
    fn answer(resp: LeaderResponse) -> Result<GrantCheck, LeaderResponse> {
        match resp {
            LeaderResponse::GrantCheck {
                read_index,
                lease_alive,
            } => Ok(GrantCheck {
                read_index,
                lease_alive,
            }),
            other => Err(other),
        }
    }
    fn respond(answer: GrantCheck) -> LeaderResponse {
        LeaderResponse::GrantCheck {
            read_index: answer.read_index,
            lease_alive: answer.lease_alive,
        }
    }
}

/// A membership change (etcd's MemberAdd/Remove/Update/Promote), checked and made by the
/// leader. Refusals that are not about leadership are part of the answer.
pub(crate) struct ChangeMembersCall(pub(crate) MemberChange);

impl LeaderCall for ChangeMembersCall {
    type Answer = Result<MemberChanged, MemberError>;
    const IDEMPOTENT: bool = false;
    const BATCHED: bool = false;
    fn request(&self) -> LeaderRequestRef<'_> {
        LeaderRequestRef::ChangeMembers(&self.0)
    }
    fn answer(resp: LeaderResponse) -> Result<Self::Answer, LeaderResponse> {
        match resp {
            LeaderResponse::MembersChanged(res) => Ok(res),
            other => Err(other),
        }
    }
    fn respond(answer: Self::Answer) -> LeaderResponse {
        LeaderResponse::MembersChanged(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::put;
    use crate::wire::{self, LeaderRequest};

    /// The borrowed form of each call encodes exactly as the owned `LeaderRequest` the
    /// leader decodes (whose bytes `golden` pins), and answers pair up both ways.
    #[test]
    fn calls_encode_as_their_wire_requests() {
        fn same<C: LeaderCall>(call: &C, owned: LeaderRequest) {
            let borrowed = wire::encode(&call.request()).unwrap();
            assert_eq!(borrowed, wire::encode(&owned).unwrap(), "{owned:?}");
        }
        same(&ProposeCall(put()), LeaderRequest::Propose(put()));
        same(&ReadIndexCall, LeaderRequest::ReadIndex);
        same(
            &KeepAliveCall(LeaseId(5)),
            LeaderRequest::KeepAlive(LeaseId(5)),
        );
        same(
            &TimeToLiveCall(LeaseId(6)),
            LeaderRequest::TimeToLive(LeaseId(6)),
        );
        let member = Member {
            name: "a".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec!["http://127.0.0.1:2379".into()],
        };
        same(
            &PublishCall {
                id: 7,
                member: member.clone(),
            },
            LeaderRequest::Publish { id: 7, member },
        );
        same(
            &GrantCheckCall(LeaseId(8)),
            LeaderRequest::GrantCheck(LeaseId(8)),
        );
        let change = MemberChange::Promote { id: 9 };
        same(
            &ChangeMembersCall(change.clone()),
            LeaderRequest::ChangeMembers(change),
        );

        let check = GrantCheck {
            read_index: 3,
            lease_alive: true,
        };
        assert_eq!(
            GrantCheckCall::answer(GrantCheckCall::respond(check)).ok(),
            Some(check)
        );
        assert_eq!(
            TimeToLiveCall::answer(TimeToLiveCall::respond(Some(4))).ok(),
            Some(Some(4))
        );
        // Another kind of answer is handed back, not misread.
        assert!(ReadIndexCall::answer(TimeToLiveCall::respond(Some(4))).is_err());
        assert!(KeepAliveCall::answer(LeaderResponse::Published).is_err());
    }
}
