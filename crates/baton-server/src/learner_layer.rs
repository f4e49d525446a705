//! A tower layer that refuses client RPCs on a learner, as etcd does
//! (`ErrGRPCNotSupportedForLearner`): a learner is not a voter, its state may lag, and
//! clients must not treat it as a full member. Only `Maintenance.Status` passes (and
//! `KV.Range`, which `kv.rs` refuses unless it is serializable, etcd's one other
//! exception).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::Status;
use tower::{Layer, Service};

use crate::errors::NOT_SUPPORTED_FOR_LEARNER;

/// See the module docs.
#[derive(Clone)]
pub struct LearnerGuardLayer {
    pub(crate) node: baton_raft::Node,
}

impl<S> Layer<S> for LearnerGuardLayer {
    type Service = LearnerGuard<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LearnerGuard {
            inner,
            node: self.node.clone(),
        }
    }
}

/// The service [`LearnerGuardLayer`] wraps around the router.
#[derive(Clone)]
pub struct LearnerGuard<S> {
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

impl<S, B, RB> Service<http::Request<B>> for LearnerGuard<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if !allowed_on_learner(req.uri().path()) && self.node.is_learner() {
            let resp = Status::unavailable(NOT_SUPPORTED_FOR_LEARNER).into_http();
            return Box::pin(async move { Ok(resp) });
        }
        Box::pin(self.inner.call(req))
    }
}
