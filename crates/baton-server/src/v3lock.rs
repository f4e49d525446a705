//! etcd's `v3lockpb.Lock` (Lock, Unlock) over the lock engine.
//!
//! `lease = 0` locks with a 60 s lease of the call's own, as etcd's server does
//! ([`CallSession`]: kept alive while the call waits, named in the answer's key, left to
//! expire once answered unless the caller keeps it alive — the lock then vanishes a minute
//! later, dotnet-etcd#321; Baton's own `baton.v1.Lock` refuses `lease = 0` for that reason).
//! Differences from etcd, on purpose: a call that fails or is abandoned revokes the lease it
//! opened; an empty name is refused; the waiter's lease is re-checked before the
//! lock is granted (etcd 3.4 does not: etcd#11456). The fencing token is the returned key's
//! create revision, which etcd's response does not carry: read it with a Range of the key,
//! or use `baton.v1.Lock`, which returns it by name.

use baton_core::{Command, DeleteRangeRequest, KeyRange, LeaseId, Response};
use baton_proto::v3lockpb as pb;
use tonic::{Request, Status};

use crate::call_session::CallSession;
use crate::errors::kv_status;
use crate::kv::unexpected;
use crate::locks::{AcquireSpec, LockApi, LockEngine};

/// The etcd lock service.
pub struct V3LockService {
    pub(crate) engine: LockEngine,
}

#[tonic::async_trait]
impl pb::lock_server::Lock for V3LockService {
    async fn lock(
        &self,
        request: Request<pb::LockRequest>,
    ) -> Result<tonic::Response<pb::LockResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let req = request.into_inner();
        self.engine
            .shared()
            .check_lock(&caller, baton_core::PermType::Write, &req.name)?;
        let session = match req.lease {
            0 => Some(CallSession::open(self.engine.shared()).await?),
            _ => None,
        };
        let held = self
            .engine
            .acquire(AcquireSpec {
                name: req.name,
                lease: session
                    .as_ref()
                    .map_or(LeaseId(req.lease), CallSession::lease),
                value: Vec::new(),
                timeout: None,
                try_only: false,
                delay_ms: None,
                proclaim_existing: false,
                api: LockApi::V3Lock,
            })
            .await?;
        if let Some(session) = session {
            session.hand_over();
        }
        let shared = self.engine.shared();
        Ok(tonic::Response::new(pb::LockResponse {
            header: Some(shared.header_at(held.revision, held.raft_term)),
            key: held.kv.key,
        }))
    }

    /// etcd's Unlock is a plain delete of the key, whoever holds it.
    async fn unlock(
        &self,
        request: Request<pb::UnlockRequest>,
    ) -> Result<tonic::Response<pb::UnlockResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let req = request.into_inner();

        let command = Command::DeleteRange(DeleteRangeRequest {
            range: KeyRange {
                key: req.key,
                range_end: Vec::new(),
            },
            prev_kv: false,
        });
        baton_core::StateMachine::validate(&command).map_err(|e| kv_status(&e))?;
        let shared = self.engine.shared();
        // Like a KV delete, answered from the leader's apply on a follower.
        let p = shared.propose_owing_apply_as(&caller, command).await?;
        match p.applied.response {
            Response::DeleteRange(_) => Ok(tonic::Response::new(pb::UnlockResponse {
                header: Some(shared.header_at(p.applied.revision.0, p.raft_term)),
            })),
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }
}
