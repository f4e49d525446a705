//! `etcdserverpb.KV`: Range, Put, DeleteRange, Txn, Compact.

use baton_core::{Command, KvError, Response, StateMachine, MAX_REQUEST_BYTES};
use baton_proto::etcdserverpb as pb;
use prost::Message;
use tonic::{Request, Status};

use crate::access::Caller;
use crate::convert;
use crate::errors::{auth_status, kv_status, TOO_LARGE};
use crate::Shared;

// The decoder refuses txns nested deeper than this before they are built; etcd's deepest
// (one op a level, the budget `MAX_TXN_OPS` shared down the levels) must get through it.
const _: () = assert!(baton_proto::codec::MAX_TXN_LEVELS > baton_core::MAX_TXN_OPS + 1);

/// The KV service.
pub struct KvService {
    pub(crate) shared: Shared,
}

/// etcd refuses requests larger than `--max-request-bytes` before they reach the log.
pub(crate) fn check_size<M: Message>(m: &M) -> Result<(), Status> {
    if m.encoded_len() > MAX_REQUEST_BYTES {
        return Err(Status::invalid_argument(TOO_LARGE));
    }
    Ok(())
}

impl KvService {
    async fn propose(
        &self,
        caller: &Caller,
        command: Command,
    ) -> Result<(Response, pb::ResponseHeader), Status> {
        StateMachine::validate(&command).map_err(|e| kv_status(&e))?;
        // The answer (the leader's response, revision and term) is all a put, delete or
        // transaction returns: nothing here reads this member's state after it.
        let proposed = self.shared.propose_owing_apply_as(caller, command).await?;
        let header = self
            .shared
            .header_at(proposed.applied.revision.0, proposed.raft_term);
        match proposed.applied.response {
            Response::Error(e) => Err(kv_status(&e)),
            other => Ok((other, header)),
        }
    }
}

/// The unary calls' handlers, as inherent `async fn`s: the trait's (for tonic's router) box
/// each call's future (`async_trait`), which [`crate::kv_fast_path`] — nearly every call —
/// need not pay for; it polls these inside its own future.
impl KvService {
    pub(crate) async fn serve_range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<tonic::Response<pb::RangeResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        if req.key.is_empty() {
            return Err(kv_status(&KvError::EmptyKey));
        }
        if !req.serializable {
            // A learner serves only serializable reads (etcd's isRPCSupportedForLearner).
            if self.shared.node.is_learner() {
                return Err(Status::unavailable(
                    crate::errors::NOT_SUPPORTED_FOR_LEARNER,
                ));
            }
            self.shared.read_barrier().await?;
        }
        let req = convert::range_from_pb(req);
        // The check and the read see one state, so a revocation applied in between cannot
        // let this read through (etcd's `doSerialize` re-checks the revision instead).
        let (result, revision) = self.shared.node.read(|sm| {
            let permitted = sm.auth_permitted(
                caller.as_ref(),
                baton_core::PermType::Read,
                &req.range.key,
                &req.range.range_end,
            );
            match permitted {
                Ok(()) => {
                    crate::monitor::range_served();
                    (sm.range(&req).map_err(|e| kv_status(&e)), sm.revision())
                }
                Err(e) => (Err(auth_status(e)), sm.revision()),
            }
        });
        let resp = result?;
        let header = self.shared.header_at(revision.0, self.shared.term());
        Ok(tonic::Response::new(convert::range_resp_to_pb(
            resp, header,
        )))
    }

    pub(crate) async fn serve_put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<tonic::Response<pb::PutResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        check_size(&req)?;
        let (resp, header) = self
            .propose(&caller, Command::Put(convert::put_from_pb(req)?))
            .await?;
        match resp {
            Response::Put(p) => Ok(tonic::Response::new(convert::put_resp_to_pb(p, header))),
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn serve_delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<tonic::Response<pb::DeleteRangeResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        check_size(&req)?;
        let (resp, header) = self
            .propose(&caller, Command::DeleteRange(convert::delete_from_pb(req)))
            .await?;
        match resp {
            Response::DeleteRange(d) => {
                Ok(tonic::Response::new(convert::delete_resp_to_pb(d, header)))
            }
            other => Err(unexpected(other)),
        }
    }

    pub(crate) async fn serve_txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<tonic::Response<pb::TxnResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        check_size(&req)?;
        let txn = convert::txn_from_pb(req)?;
        let (resp, header) = self.propose(&caller, Command::Txn(txn)).await?;
        match resp {
            Response::Txn(t) => Ok(tonic::Response::new(convert::txn_resp_to_pb(t, &header))),
            other => Err(unexpected(other)),
        }
    }
}

#[tonic::async_trait]
impl pb::kv_server::Kv for KvService {
    async fn range(
        &self,
        request: Request<pb::RangeRequest>,
    ) -> Result<tonic::Response<pb::RangeResponse>, Status> {
        self.serve_range(request).await
    }

    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<tonic::Response<pb::PutResponse>, Status> {
        self.serve_put(request).await
    }

    async fn delete_range(
        &self,
        request: Request<pb::DeleteRangeRequest>,
    ) -> Result<tonic::Response<pb::DeleteRangeResponse>, Status> {
        self.serve_delete_range(request).await
    }

    async fn txn(
        &self,
        request: Request<pb::TxnRequest>,
    ) -> Result<tonic::Response<pb::TxnResponse>, Status> {
        self.serve_txn(request).await
    }

    async fn compact(
        &self,
        request: Request<pb::CompactionRequest>,
    ) -> Result<tonic::Response<pb::CompactionResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let (_, header) = self
            .propose(
                &caller,
                Command::Compact {
                    revision: baton_core::Revision(req.revision),
                },
            )
            .await?;
        Ok(tonic::Response::new(pb::CompactionResponse {
            header: Some(header),
        }))
    }
}

/// A response of the wrong kind for the command would be a core bug; refuse loudly.
pub(crate) fn unexpected(resp: Response) -> Status {
    tracing::error!(?resp, "core returned a response of the wrong kind");
    Status::internal("baton: internal error: unexpected response kind")
}
