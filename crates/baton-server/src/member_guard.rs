//! A tower layer for what this member's standing decides about every client RPC, before the
//! call reaches its service: a learner refuses it, and a follower holds it until it has
//! applied every write it already answered.
//!
//! **A learner refuses client RPCs**, as etcd does (`ErrGRPCNotSupportedForLearner`): a
//! learner is not a voter, its state may lag, and clients must not treat it as a full
//! member. Only `Maintenance.Status` passes (and `KV.Range`, which `kv.rs` refuses unless it
//! is serializable, etcd's one other exception).
//!
//! **A follower catches up first** (`baton_raft::Node::caught_up`). On a follower a put,
//! delete or transaction is answered as soon as the leader's answer is here
//! (`Shared::propose_owing_apply_as`), before this member has applied it itself; what a
//! client (this one or another) asks this member next must still find it — a serializable
//! read, a watch from the current revision, the auth check of its next request. Holding the
//! next request is what waiting before the answer did, minus the wait for a write nobody
//! reads here. Writes served by the leader alone pass at once (`served_by_the_leader`).
//! Nearly always nothing is owed: one atomic load and one watch read per call. Watches
//! created on a stream that is already open wait in `watch.rs` (a stream is one call).
//!
//! Why one layer and not two: both read the member's state and either answer at once or
//! pass the call on, and every client call crosses this code — one boxed future per call
//! instead of two. The unary KV calls cross it as a function ([`admission`]): their own
//! path (`kv_fast_path`) sits outside this layer and applies the same rule.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::Status;
use tower::{Layer, Service};

use crate::errors::NOT_SUPPORTED_FOR_LEARNER;

/// See the module docs.
#[derive(Clone)]
pub struct MemberGuardLayer {
    pub(crate) node: baton_raft::Node,
}

impl<S> Layer<S> for MemberGuardLayer {
    type Service = MemberGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MemberGuard {
            inner,
            node: self.node.clone(),
        }
    }
}

/// The service [`MemberGuardLayer`] wraps around the router.
#[derive(Clone)]
pub struct MemberGuard<S> {
    inner: S,
    node: baton_raft::Node,
}

/// The methods a learner serves (etcd's `isRPCSupportedForLearner`).
fn allowed_on_learner(path: &str) -> bool {
    matches!(
        path,
        "/etcdserverpb.Maintenance/Status" | "/etcdserverpb.KV/Range"
    )
}

/// The calls that need not wait for an owed apply: a write's effect and answer come from the
/// leader's apply (a transaction's reads included: it is applied, not read here), and this
/// member's state is read only after this call's own proposal is applied here, which comes
/// after every write answered before it (the lock engine's enqueue). What they check here
/// before proposing, the caller's permission, the leader checks again as it applies. A
/// client writing in a loop through a follower thus never waits for the follower's apply.
fn served_by_the_leader(path: &str) -> bool {
    matches!(
        path,
        "/etcdserverpb.KV/Put"
            | "/etcdserverpb.KV/DeleteRange"
            | "/etcdserverpb.KV/Txn"
            | "/v3lockpb.Lock/Lock"
            | "/v3lockpb.Lock/Unlock"
    )
}

/// What this member's standing says about a call to `path`.
pub(crate) enum Admission {
    /// Answer this status instead of serving the call (a learner).
    Refused(Status),
    /// Serve it once [`baton_raft::Node::caught_up`] returns.
    CatchUpFirst,
    /// Serve it now.
    Now,
}

/// The guard's decision, shared with the unary KV calls' own path
/// (`kv_fast_path`), which serves those calls outside this layer.
pub(crate) fn admission(node: &baton_raft::Node, path: &str) -> Admission {
    if !allowed_on_learner(path) && node.is_learner() {
        return Admission::Refused(Status::unavailable(NOT_SUPPORTED_FOR_LEARNER));
    }
    if !node.owes_apply() || served_by_the_leader(path) {
        return Admission::Now;
    }
    Admission::CatchUpFirst
}

impl<S, B, RB> Service<http::Request<B>> for MemberGuard<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match admission(&self.node, req.uri().path()) {
            Admission::Refused(status) => {
                let resp = status.into_http();
                return Box::pin(async move { Ok(resp) });
            }
            Admission::Now => return Box::pin(self.inner.call(req)),
            Admission::CatchUpFirst => {}
        }
        // The service that was made ready goes into the future; a fresh clone stays.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let node = self.node.clone();
        Box::pin(async move {
            if let Err(e) = node.caught_up().await {
                return Ok(crate::errors::propose_status(&e).into_http());
            }
            inner.call(req).await
        })
    }
}
