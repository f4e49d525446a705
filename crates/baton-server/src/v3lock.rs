//! etcd's `v3lockpb.Lock` (Lock, Unlock) over the lock engine.
//!
//! Differences from etcd, on purpose: `lease = 0` is refused (etcd's server silently grants
//! and orphans a 60 s lease, so the lock vanishes a minute later with nobody told:
//! dotnet-etcd#321); an empty name is refused; the waiter's lease is re-checked before the
//! lock is granted (etcd 3.4 does not: etcd#11456). The fencing token is the returned key's
//! create revision, which etcd's response does not carry: read it with a Range of the key,
//! or use `baton.v1.Lock`, which returns it by name.

use baton_core::{Command, DeleteRangeRequest, KeyRange, LeaseId, Response};
use baton_proto::v3lockpb as pb;
use tonic::{Request, Status};

use crate::errors::kv_status;
use crate::kv::unexpected;
use crate::locks::{AcquireSpec, LockEngine};

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
        let held = self
            .engine
            .acquire(AcquireSpec {
                name: req.name,
                lease: LeaseId(req.lease),
                value: Vec::new(),
                timeout: None,
                try_only: false,
                delay_ms: None,
                proclaim_existing: false,
                api: "v3lock",
            })
            .await?;
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
        let p = shared.propose_as(&caller, command).await?;
        match p.applied.response {
            Response::DeleteRange(_) => Ok(tonic::Response::new(pb::UnlockResponse {
                header: Some(shared.header_at(p.applied.revision.0, p.raft_term)),
            })),
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }
}
