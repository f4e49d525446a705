//! `baton.v1.ExactlyOnce`: key-value writes applied at most once per (session, sequence), so a
//! client may retry a write whose outcome it does not know — after a timeout, a leader change,
//! a broken connection — through any member, without applying it twice. The decision is made
//! by the replicated state machine (`Command::Deduplicated`), never by this member alone:
//! the member that sees the retry may not be the one that saw the first attempt.

use baton_core::{Command, Response, StateMachine, DEFAULT_CLIENT_TIMEOUT_MS};
use baton_proto::baton::v1 as pb;
use baton_proto::etcdserverpb as etcd;
use tonic::{Request, Status};

use crate::convert;
use crate::errors::kv_status;
use crate::kv::{check_size, unexpected};
use crate::Shared;

/// The exactly-once write service.
pub struct ExactlyOnceService {
    pub(crate) shared: Shared,
}

/// A de-duplicated answer: the wrapped command's response, a header with the revision of
/// its first application (and the term of this answer), and whether this was a replay.
struct Answer {
    response: Response,
    header: etcd::ResponseHeader,
    replayed: bool,
}

impl ExactlyOnceService {
    async fn propose(
        &self,
        caller: &crate::Caller,
        id: Option<pb::RequestId>,
        acknowledged_below: u64,
        command: Command,
    ) -> Result<Answer, Status> {
        let id = id.ok_or_else(|| Status::invalid_argument("baton: request id is required"))?;
        if id.client_id == 0 {
            return Err(Status::invalid_argument(
                "baton: client_id is required (open a session first)",
            ));
        }
        let command = Command::Deduplicated {
            client_id: id.client_id,
            sequence: id.sequence,
            acknowledged_below,
            command: Box::new(command),
        };
        StateMachine::validate(&command).map_err(|e| kv_status(&e))?;
        let proposed = self.shared.propose_as(caller, command).await?;
        match proposed.applied.response {
            Response::Deduplicated {
                replayed,
                revision,
                response,
            } => {
                if let Response::Error(e) = *response {
                    return Err(kv_status(&e));
                }
                Ok(Answer {
                    response: *response,
                    header: self.shared.header_at(revision.0, proposed.raft_term),
                    replayed,
                })
            }
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }
}

#[tonic::async_trait]
impl pb::exactly_once_server::ExactlyOnce for ExactlyOnceService {
    async fn open_session(
        &self,
        request: Request<pb::OpenSessionRequest>,
    ) -> Result<tonic::Response<pb::OpenSessionResponse>, Status> {
        let req = request.into_inner();
        let timeout_ms = match req.timeout_ms {
            0 => DEFAULT_CLIENT_TIMEOUT_MS,
            t => t,
        };
        let proposed = self
            .shared
            .propose(Command::RegisterClient { timeout_ms })
            .await?;
        match proposed.applied.response {
            Response::ClientRegistered {
                client_id,
                timeout_ms,
            } => Ok(tonic::Response::new(pb::OpenSessionResponse {
                header: Some(
                    self.shared
                        .header_at(proposed.applied.revision.0, proposed.raft_term),
                ),
                client_id,
                timeout_ms,
            })),
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }

    async fn close_session(
        &self,
        request: Request<pb::CloseSessionRequest>,
    ) -> Result<tonic::Response<pb::CloseSessionResponse>, Status> {
        let client_id = request.into_inner().client_id;
        let proposed = self
            .shared
            .propose(Command::UnregisterClient { client_id })
            .await?;
        match proposed.applied.response {
            Response::ClientUnregistered { existed } => {
                Ok(tonic::Response::new(pb::CloseSessionResponse {
                    header: Some(
                        self.shared
                            .header_at(proposed.applied.revision.0, proposed.raft_term),
                    ),
                    existed,
                }))
            }
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }

    async fn put(
        &self,
        request: Request<pb::ExactlyOncePutRequest>,
    ) -> Result<tonic::Response<pb::ExactlyOncePutResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let put = req.request.unwrap_or_default();
        check_size(&put)?;
        let a = self
            .propose(
                &caller,
                req.id,
                req.acknowledged_below,
                Command::Put(convert::put_from_pb(put)?),
            )
            .await?;
        match a.response {
            Response::Put(p) => Ok(tonic::Response::new(pb::ExactlyOncePutResponse {
                response: Some(convert::put_resp_to_pb(p, a.header)),
                replayed: a.replayed,
            })),
            other => Err(unexpected(other)),
        }
    }

    async fn delete_range(
        &self,
        request: Request<pb::ExactlyOnceDeleteRangeRequest>,
    ) -> Result<tonic::Response<pb::ExactlyOnceDeleteRangeResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let del = req.request.unwrap_or_default();
        check_size(&del)?;
        let a = self
            .propose(
                &caller,
                req.id,
                req.acknowledged_below,
                Command::DeleteRange(convert::delete_from_pb(del)),
            )
            .await?;
        match a.response {
            Response::DeleteRange(d) => {
                Ok(tonic::Response::new(pb::ExactlyOnceDeleteRangeResponse {
                    response: Some(convert::delete_resp_to_pb(d, a.header)),
                    replayed: a.replayed,
                }))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn txn(
        &self,
        request: Request<pb::ExactlyOnceTxnRequest>,
    ) -> Result<tonic::Response<pb::ExactlyOnceTxnResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let txn = req.request.unwrap_or_default();
        check_size(&txn)?;
        let a = self
            .propose(
                &caller,
                req.id,
                req.acknowledged_below,
                Command::Txn(convert::txn_from_pb(txn)?),
            )
            .await?;
        match a.response {
            Response::Txn(t) => Ok(tonic::Response::new(pb::ExactlyOnceTxnResponse {
                response: Some(convert::txn_resp_to_pb(t, &a.header)),
                replayed: a.replayed,
            })),
            other => Err(unexpected(other)),
        }
    }
}
