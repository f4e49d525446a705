//! `baton.v1.Lock` and `baton.v1.Fence`: what etcd's lock API lacks (the fencing token by
//! name, try-lock, timeouts, lock-delay, multi-lock, inspection, operator force-release,
//! fenced writes, a fence gate for outside resources), over the same lock engine and the
//! same queues as etcd's `v3lock` and `v3election`.

use std::time::Duration;

use baton_core::{Command, FencingToken, KeyValue, KvError, LeaseId, Response};
use baton_proto::baton::v1 as pb;
use tonic::{Request, Status};

use crate::convert;
use crate::errors::{kv_status, rotate_key_status};
use crate::kv::{check_size, unexpected};
use crate::locks::{AcquireSpec, Held, LockApi, LockEngine};

/// Names one `AcquireMany` may take (each is a sequential acquisition).
pub const MAX_ACQUIRE_MANY: usize = 64;
/// Waiters `Inspect` lists (it reports the total in `waiter_count`).
pub const MAX_INSPECT_WAITERS: usize = 1000;
/// Locks `List` returns when the request names no limit.
pub const DEFAULT_LIST_LOCKS: usize = 1000;
/// The most locks one `List` returns, whatever the request asks: an answer is built under
/// the state machine's read lock, so its size must stay bounded (page with `after`).
pub const MAX_LIST_LOCKS: usize = 10_000;

/// The Baton lock service.
pub struct LockService {
    engine: LockEngine,
    signer: GrantSigner,
}

impl LockService {
    pub fn new(engine: LockEngine) -> Self {
        LockService {
            engine,
            signer: GrantSigner::default(),
        }
    }
}

/// Signs grants with the cluster's current fencing key, deriving its key pair once per key
/// id: an Ed25519 pair from its seed costs a SHA-512 and a scalar multiplication (tens of
/// microseconds), which every grant paid, and under the state lock, before this cache.
/// Only the seed is copied out under the lock; deriving and signing happen outside it.
#[derive(Default)]
struct GrantSigner {
    current: std::sync::Mutex<Option<std::sync::Arc<baton_fencing::SigningKey>>>,
}

impl GrantSigner {
    /// The signature of `grant` and the id of the key that made it; `None` while the
    /// cluster has no key yet.
    fn sign(
        &self,
        shared: &crate::Shared,
        grant: &baton_fencing::Grant<'_>,
    ) -> Option<(baton_fencing::Signature, baton_fencing::KeyId)> {
        let (id, seed) = shared.node.read(|sm| {
            sm.fencing_keys()
                .current()
                .map(|k| (baton_fencing::KeyId::new(k.id.0), k.secret.0))
        })?;
        let key = {
            let mut cached = self.current.lock().unwrap_or_else(|p| p.into_inner());
            match cached.as_ref() {
                Some(key) if key.id() == id => key.clone(),
                _ => {
                    let key = std::sync::Arc::new(baton_fencing::SigningKey::from_seed(id, &seed));
                    *cached = Some(key.clone());
                    key
                }
            }
        };
        Some((key.sign(grant), id))
    }
}

/// The fence gate.
pub struct FenceService {
    pub(crate) engine: LockEngine,
}

fn spec(
    name: Vec<u8>,
    lease: i64,
    timeout_ms: i64,
    try_only: bool,
    lock_delay_ms: i64,
) -> Result<AcquireSpec, Status> {
    if timeout_ms < 0 {
        return Err(Status::invalid_argument(
            "baton: timeout_ms must not be negative",
        ));
    }
    if lock_delay_ms < 0 {
        return Err(Status::invalid_argument(
            "baton: lock_delay_ms must not be negative",
        ));
    }
    Ok(AcquireSpec {
        name,
        lease: LeaseId(lease),
        value: Vec::new(),
        timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms as u64)),
        try_only,
        // 0 leaves the lock's setting as it is (an idle lock forgets it): a client that
        // does not care must not switch off a delay another client asked for.
        delay_ms: (lock_delay_ms > 0).then_some(lock_delay_ms as u64),
        proclaim_existing: false,
        api: LockApi::Baton,
    })
}

impl LockService {
    /// The grant's answer, signed with the cluster's current fencing key (every member
    /// holds it, so a follower signs the grants it serves as the leader does).
    fn acquired(&self, held: Held) -> pb::AcquireResponse {
        let header = self
            .engine
            .shared()
            .header_at(held.revision, held.raft_term);
        let name = baton_core::lock_name_of(&held.kv.key).unwrap_or_default();
        let grant = baton_fencing::Grant {
            name,
            token: held.token().0,
            lease: held.kv.lease.0,
            revision: held.revision,
        };
        let (signature, key_id) = match self.signer.sign(self.engine.shared(), &grant) {
            Some((sig, id)) => (sig.as_bytes().to_vec(), id.get()),
            None => {
                tracing::warn!("lock granted before the cluster has a fencing key: unsigned");
                (Vec::new(), 0)
            }
        };
        pb::AcquireResponse {
            header: Some(header),
            fencing_token: held.token().0,
            lease: held.kv.lease.0,
            key: held.kv.key,
            signature,
            key_id,
            revision: held.revision,
        }
    }

    fn entry(&self, kv: &KeyValue) -> pb::LockEntry {
        let remaining = if kv.lease.is_none() {
            -1
        } else {
            self.engine
                .shared()
                .node
                .lease_remaining_s(kv.lease)
                .unwrap_or(-1)
        };
        pb::LockEntry {
            key: kv.key.clone(),
            create_revision: kv.create_revision.0,
            lease: kv.lease.0,
            lease_remaining_s: remaining,
        }
    }
}

/// Releases locks taken by an `AcquireMany` that did not finish (an error, or the caller
/// going away: then the release runs in a spawned task).
struct ReleaseOnDrop {
    engine: LockEngine,
    held: Vec<Held>,
}

impl ReleaseOnDrop {
    async fn release_all(&mut self) {
        for h in std::mem::take(&mut self.held) {
            if let Err(e) = self
                .engine
                .delete_if(&h.kv.key, h.kv.create_revision.0)
                .await
            {
                tracing::warn!(error = %e.message(), "releasing after a failed AcquireMany");
            }
        }
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut rest = ReleaseOnDrop {
            engine: self.engine.clone(),
            held: std::mem::take(&mut self.held),
        };
        rt.spawn(async move { rest.release_all().await });
    }
}

#[tonic::async_trait]
impl pb::lock_server::Lock for LockService {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<tonic::Response<pb::AcquireResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        self.engine
            .shared()
            .check_lock(&caller, baton_core::PermType::Write, &r.name)?;
        let spec = spec(r.name, r.lease, r.timeout_ms, r.try_only, r.lock_delay_ms)?;
        let held = self.engine.acquire(spec).await?;
        Ok(tonic::Response::new(self.acquired(held)))
    }

    async fn acquire_many(
        &self,
        request: Request<pb::AcquireManyRequest>,
    ) -> Result<tonic::Response<pb::AcquireManyResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        for name in &r.names {
            self.engine
                .shared()
                .check_lock(&caller, baton_core::PermType::Write, name)?;
        }
        let mut names = r.names;
        // Sorted order is what makes multi-lock deadlock free: everyone takes locks in the
        // same order.
        names.sort();
        names.dedup();
        if names.is_empty() {
            return Err(Status::invalid_argument("baton: no lock names given"));
        }
        if names.len() > MAX_ACQUIRE_MANY {
            return Err(Status::invalid_argument(format!(
                "baton: too many lock names (limit {MAX_ACQUIRE_MANY})"
            )));
        }
        let template = spec(
            Vec::new(),
            r.lease,
            r.timeout_ms,
            r.try_only,
            r.lock_delay_ms,
        )?;
        let deadline = template.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut held = ReleaseOnDrop {
            engine: self.engine.clone(),
            held: Vec::new(),
        };
        for name in names {
            let mut s = template.clone();
            s.name = name;
            if let Some(d) = deadline {
                // What is left of the overall timeout (at least 1 ms: 0 would mean none).
                let left = d.saturating_duration_since(tokio::time::Instant::now());
                s.timeout = Some(left.max(Duration::from_millis(1)));
            }
            match self.engine.acquire(s).await {
                Ok(h) => held.held.push(h),
                Err(e) => {
                    held.release_all().await;
                    return Err(e);
                }
            }
        }
        let locks: Vec<Held> = std::mem::take(&mut held.held);
        let header = locks
            .last()
            .map(|h| self.engine.shared().header_at(h.revision, h.raft_term));
        Ok(tonic::Response::new(pb::AcquireManyResponse {
            header,
            locks: locks.into_iter().map(|h| self.acquired(h)).collect(),
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<tonic::Response<pb::ReleaseResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        self.engine
            .shared()
            .check_perm(&caller, baton_core::PermType::Write, &r.key, &[])?;
        let (revision, term) = self
            .engine
            .release(&r.key, FencingToken(r.fencing_token))
            .await?;
        Ok(tonic::Response::new(pb::ReleaseResponse {
            header: Some(self.engine.shared().header_at(revision, term)),
        }))
    }

    async fn inspect(
        &self,
        request: Request<pb::InspectRequest>,
    ) -> Result<tonic::Response<pb::InspectResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        self.engine
            .shared()
            .check_lock(&caller, baton_core::PermType::Read, &r.name)?;
        if r.name.is_empty() {
            return Err(kv_status(&KvError::EmptyLockName));
        }
        let shared = self.engine.shared();
        shared.read_barrier().await?;
        let ((queue, len), info, revision) = shared.node.read(|sm| {
            (
                sm.lock_queue(&r.name, MAX_INSPECT_WAITERS + 1),
                sm.lock_info(&r.name),
                sm.revision().0,
            )
        });
        let info = info.unwrap_or(baton_core::LockInfo {
            delay_ms: 0,
            delayed_until_ms: 0,
            force_releases: Vec::new(),
        });
        // While a lock-delay runs, the head of the queue has not been granted the lock yet:
        // nobody holds it, and the head is shown as the first waiter.
        let delaying = info.delayed_until_ms > shared.node.time_ms();
        let mut entries = queue.iter().map(|kv| self.entry(kv));
        let holder = if delaying { None } else { entries.next() };
        let waiters: Vec<pb::LockEntry> = entries.collect();
        let waiter_count = if delaying {
            len as u64
        } else {
            len.saturating_sub(1) as u64
        };
        Ok(tonic::Response::new(pb::InspectResponse {
            header: Some(shared.header_at(revision, shared.term())),
            holder,
            waiters,
            lock_delay_ms: info.delay_ms as i64,
            delayed_until_ms: info.delayed_until_ms,
            force_releases: info
                .force_releases
                .into_iter()
                .map(|f| pb::ForceReleaseRecord {
                    key: f.key,
                    fencing_token: f.token.0,
                    reason: f.reason,
                    at_ms: f.at_ms,
                })
                .collect(),
            waiter_count,
        }))
    }

    async fn list(
        &self,
        request: Request<pb::ListLocksRequest>,
    ) -> Result<tonic::Response<pb::ListLocksResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        self.engine.shared().require_admin(&caller)?;
        check_size(&r)?;
        if r.limit < 0 {
            return Err(Status::invalid_argument(
                "baton: limit must not be negative",
            ));
        }
        let limit = match r.limit {
            0 => DEFAULT_LIST_LOCKS,
            n => (n as usize).min(MAX_LIST_LOCKS),
        };
        let shared = self.engine.shared();
        shared.read_barrier().await?;
        let ((locks, more), total, revision) = shared.node.read(|sm| {
            (
                sm.lock_list(&r.after, &r.prefix, limit),
                sm.lock_count(),
                sm.revision().0,
            )
        });
        let now = shared.node.time_ms();
        let locks = locks
            .into_iter()
            .map(|l| {
                // As in Inspect: while a lock-delay runs the head has not been granted the
                // lock, so nobody holds it and the head counts as waiting.
                let delaying = l.delayed_until_ms > now;
                let holder = if delaying {
                    None
                } else {
                    l.head.as_ref().map(|kv| self.entry(kv))
                };
                let waiter_count = if holder.is_some() {
                    l.queue_len - 1
                } else {
                    l.queue_len
                };
                pb::LockSummary {
                    name: l.name,
                    holder,
                    waiter_count: waiter_count as u64,
                    lock_delay_ms: l.delay_ms as i64,
                    delayed_until_ms: l.delayed_until_ms,
                }
            })
            .collect();
        Ok(tonic::Response::new(pb::ListLocksResponse {
            header: Some(shared.header_at(revision, shared.term())),
            locks,
            more,
            total: total as u64,
        }))
    }

    async fn force_release(
        &self,
        request: Request<pb::ForceReleaseRequest>,
    ) -> Result<tonic::Response<pb::ForceReleaseResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        self.engine
            .shared()
            .check_lock(&caller, baton_core::PermType::Write, &r.name)?;
        let command = Command::LockForceRelease {
            name: r.name,
            token: FencingToken(r.fencing_token),
            reason: r.reason,
        };
        baton_core::StateMachine::validate(&command).map_err(|e| kv_status(&e))?;
        let shared = self.engine.shared();
        let p = shared.propose(command).await?;
        let released = match p.applied.response {
            Response::LockForceRelease { released } => released,
            Response::Error(e) => return Err(kv_status(&e)),
            other => return Err(unexpected(other)),
        };
        if let Some(kv) = &released {
            tracing::warn!(
                key = %String::from_utf8_lossy(&kv.key),
                token = kv.create_revision.0,
                "lock force-released by an operator"
            );
        }
        Ok(tonic::Response::new(pb::ForceReleaseResponse {
            header: Some(shared.header_at(p.applied.revision.0, p.raft_term)),
            released: released.as_ref().map(|kv| self.entry(kv)),
        }))
    }

    async fn fenced_put(
        &self,
        request: Request<pb::FencedPutRequest>,
    ) -> Result<tonic::Response<pb::FencedPutResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        self.engine
            .shared()
            .check_perm(&caller, baton_core::PermType::Write, &r.lock_key, &[])?;
        check_size(&r)?;
        let put = r
            .put
            .ok_or_else(|| Status::invalid_argument("baton: put is not provided"))?;
        let put = convert::put_from_pb(put)?;
        let (resp, revision, term) = self
            .engine
            .fenced_put(&r.lock_key, FencingToken(r.fencing_token), put)
            .await?;
        let header = self.engine.shared().header_at(revision, term);
        Ok(tonic::Response::new(pb::FencedPutResponse {
            header: Some(header),
            put: Some(convert::put_resp_to_pb(resp, header)),
        }))
    }
}

#[tonic::async_trait]
impl pb::fence_server::Fence for FenceService {
    async fn check(
        &self,
        request: Request<pb::FenceCheckRequest>,
    ) -> Result<tonic::Response<pb::FenceCheckResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let r = request.into_inner();
        self.engine
            .shared()
            .check_perm(&caller, baton_core::PermType::Write, &r.resource, &[])?;
        check_size(&r)?;
        let command = Command::FenceCheck {
            resource: r.resource,
            token: FencingToken(r.fencing_token),
        };
        baton_core::StateMachine::validate(&command).map_err(|e| kv_status(&e))?;
        let shared = self.engine.shared();
        let p = shared.propose(command).await?;
        match p.applied.response {
            Response::FenceCheck { accepted, highest } => {
                if !accepted {
                    self.engine.count_fencing_rejection("fence_check");
                }
                Ok(tonic::Response::new(pb::FenceCheckResponse {
                    header: Some(shared.header_at(p.applied.revision.0, p.raft_term)),
                    accepted,
                    highest_token: highest.0,
                }))
            }
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }

    async fn public_keys(
        &self,
        _request: Request<pb::FencePublicKeysRequest>,
    ) -> Result<tonic::Response<pb::FencePublicKeysResponse>, Status> {
        let shared = self.engine.shared();
        let keys = shared.node.read(|sm| {
            let ring = sm.fencing_keys();
            let current = ring.current().map(|c| c.id);
            ring.public_keys()
                .iter()
                .map(|(id, key)| pb::FencePublicKey {
                    id: id.0,
                    algorithm: baton_fencing::ALGORITHM.into(),
                    public_key: key.0.to_vec(),
                    current: Some(*id) == current,
                })
                .collect()
        });
        Ok(tonic::Response::new(pb::FencePublicKeysResponse {
            header: Some(shared.header()),
            keys,
        }))
    }

    async fn rotate_key(
        &self,
        request: Request<pb::FenceRotateKeyRequest>,
    ) -> Result<tonic::Response<pb::FenceRotateKeyResponse>, Status> {
        let shared = self.engine.shared();
        let caller = shared.caller(&request)?;
        // Whoever rotates decides when every holder's resource must learn a new key: an
        // operator's act, as etcd's maintenance calls are (root only with auth on).
        shared.require_admin(&caller)?;
        let id = shared
            .node
            .rotate_fencing_key()
            .await
            .map_err(|e| rotate_key_status(&e))?;
        Ok(tonic::Response::new(pb::FenceRotateKeyResponse {
            header: Some(shared.header()),
            key_id: id.0,
        }))
    }
}
