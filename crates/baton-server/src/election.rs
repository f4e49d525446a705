//! etcd's `v3electionpb.Election` over the lock engine: a campaign is a lock acquisition
//! whose waiter key carries the proposal, the leader is the queue's head.
//!
//! Errors are etcd's: `election: no leader`, `election: not leader` and `"leader" field must
//! be provided` are plain Go errors in etcd's server, which gRPC sends with code `Unknown`;
//! Baton sends the same code and text because clients match the text. As for locks,
//! `lease = 0` campaigns with a lease of the call's own ([`CallSession`], as etcd's server
//! opens a session) and the lease is re-checked before leadership is granted.

use std::pin::Pin;

use baton_core::{
    lock_prefix, KeyValue, KvError, LeaseId, RangeRequest, Revision, SortOrder, SortTarget,
    StateMachine, WatchOutput, WatchSpec, WatcherId,
};
use baton_proto::v3electionpb as pb;
use baton_raft::Node;
use futures::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Status};

use crate::call_session::CallSession;
use crate::convert::kv_to_pb;
use crate::errors::{kv_status, ELECTION_MISSING_LEADER, ELECTION_NOT_LEADER, ELECTION_NO_LEADER};
use crate::kv::check_size;
use crate::locks::{AcquireSpec, LockApi, LockEngine};
use crate::Shared;

/// Responses queued per Observe stream before the stream's task waits for the client.
const OBSERVE_QUEUE: usize = 16;
/// Events taken from the watch hub per turn.
const OBSERVE_BATCH: usize = 1000;

/// The etcd election service.
pub struct ElectionService {
    pub(crate) engine: LockEngine,
}

fn check_name(name: &[u8]) -> Result<(), Status> {
    if name.is_empty() {
        return Err(kv_status(&KvError::EmptyLockName));
    }
    Ok(())
}

/// The leader (head of the queue) as of revision `at`, from history; the current one if
/// `at` has been compacted away.
fn leader_at(sm: &StateMachine, name: &[u8], at: i64) -> Option<KeyValue> {
    let req = RangeRequest {
        range: lock_prefix(name),
        revision: at,
        limit: 1,
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Create,
        ..RangeRequest::default()
    };
    match sm.range(&req) {
        Ok(r) => r.kvs.into_iter().next(),
        Err(_) => sm.lock_head(name),
    }
}

/// Removes an Observe stream's hub watcher when the stream's task ends.
struct HubWatcher {
    node: Node,
    id: WatcherId,
}

impl Drop for HubWatcher {
    fn drop(&mut self) {
        let id = self.id;
        self.node.with_watch_hub(|hub, _| hub.remove(id));
    }
}

/// Registers a watcher on the election's prefix and reads the current leader, atomically.
fn watch_election(node: &Node, name: &[u8]) -> (HubWatcher, Option<KeyValue>, i64) {
    let spec = WatchSpec {
        range: lock_prefix(name),
        start_revision: Revision(0),
        no_put: false,
        no_delete: false,
        prev_kv: false,
    };
    let (id, leader, rev) = node.with_watch_hub(|hub, sm| {
        let id = hub.add(spec, sm.revision());
        (id, sm.lock_head(name), sm.revision().0)
    });
    let w = HubWatcher {
        node: node.clone(),
        id,
    };
    (w, leader, rev)
}

/// Sends the leader's kv unless it is what was sent last (same key, same mod revision).
async fn offer(
    shared: &Shared,
    tx: &mpsc::Sender<Result<pb::LeaderResponse, Status>>,
    last: &mut Option<(Vec<u8>, i64)>,
    leader: Option<KeyValue>,
    revision: i64,
) -> Result<(), ()> {
    let Some(kv) = leader else {
        // No leader: nothing to say (etcd waits for the next one silently).
        *last = None;
        return Ok(());
    };
    let id = (kv.key.clone(), kv.mod_revision.0);
    if last.as_ref() == Some(&id) {
        return Ok(());
    }
    *last = Some(id);
    let resp = pb::LeaderResponse {
        header: Some(shared.header_at(revision, shared.term())),
        kv: Some(kv_to_pb(kv)),
    };
    tx.send(Ok(resp)).await.map_err(|_| ())
}

/// Streams the current leader, then every change of leader or of its proclaimed value, in
/// revision order (each changed revision is judged on the state at that revision, so a
/// proclamation that is quickly superseded is still reported). Ends when the client goes.
async fn observe_loop(
    shared: Shared,
    name: Vec<u8>,
    tx: mpsc::Sender<Result<pb::LeaderResponse, Status>>,
) {
    let node = shared.node.clone();
    // Subscribed before the watcher exists, so no revision after it is missed.
    let mut revisions = node.subscribe_revision();
    let (mut watcher, leader, rev) = watch_election(&node, &name);
    let mut last = None;
    if offer(&shared, &tx, &mut last, leader, rev).await.is_err() {
        return;
    }
    loop {
        loop {
            let id = watcher.id;
            let out = node.with_watch_hub(|hub, sm| hub.take(id, sm, OBSERVE_BATCH));
            match out {
                None => break,
                Some(WatchOutput::Events(events)) => {
                    let mut revs: Vec<i64> = events.iter().map(|e| e.kv.mod_revision.0).collect();
                    revs.dedup();
                    for r in revs {
                        let leader = node.read(|sm| leader_at(sm, &name, r));
                        if offer(&shared, &tx, &mut last, leader, r).await.is_err() {
                            return;
                        }
                    }
                }
                // A stretch of history with no change to this election (its prefix is
                // narrow): take again, after the runtime's other tasks have had their turn.
                Some(WatchOutput::Skipped) => tokio::task::yield_now().await,
                Some(WatchOutput::Compacted { .. }) => {
                    // Fell behind past a compaction: start over from the current state.
                    // (The hub already dropped the old watcher; removing it again is a
                    // no-op.)
                    let (w, leader, rev) = watch_election(&node, &name);
                    watcher = w;
                    if offer(&shared, &tx, &mut last, leader, rev).await.is_err() {
                        return;
                    }
                }
            }
        }
        tokio::select! {
            changed = revisions.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tx.closed() => return,
        }
    }
}

type ObserveStream =
    Pin<Box<dyn Stream<Item = Result<pb::LeaderResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::election_server::Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<pb::CampaignRequest>,
    ) -> Result<tonic::Response<pb::CampaignResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let req = request.into_inner();
        self.engine
            .shared()
            .check_lock(&caller, baton_core::PermType::Write, &req.name)?;
        check_size(&req)?;
        let session = match req.lease {
            0 => Some(CallSession::open(self.engine.shared()).await?),
            _ => None,
        };
        let held = self
            .engine
            .acquire(AcquireSpec {
                name: req.name.clone(),
                lease: session
                    .as_ref()
                    .map_or(LeaseId(req.lease), CallSession::lease),
                value: req.value,
                timeout: None,
                try_only: false,
                delay_ms: None,
                proclaim_existing: true,
                api: LockApi::Election,
            })
            .await?;
        if let Some(session) = session {
            session.hand_over();
        }
        let shared = self.engine.shared();
        Ok(tonic::Response::new(pb::CampaignResponse {
            header: Some(shared.header_at(held.revision, held.raft_term)),
            leader: Some(pb::LeaderKey {
                name: req.name,
                rev: held.kv.create_revision.0,
                lease: held.kv.lease.0,
                key: held.kv.key,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<pb::ProclaimRequest>,
    ) -> Result<tonic::Response<pb::ProclaimResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let req = request.into_inner();
        if let Some(l) = &req.leader {
            self.engine
                .shared()
                .check_lock(&caller, baton_core::PermType::Write, &l.name)?;
        }
        check_size(&req)?;
        let leader = req
            .leader
            .ok_or_else(|| Status::unknown(ELECTION_MISSING_LEADER))?;
        let (ok, revision, term) = self
            .engine
            .proclaim(&leader.key, leader.rev, LeaseId(leader.lease), req.value)
            .await?;
        if !ok {
            return Err(Status::unknown(ELECTION_NOT_LEADER));
        }
        Ok(tonic::Response::new(pb::ProclaimResponse {
            header: Some(self.engine.shared().header_at(revision, term)),
        }))
    }

    async fn leader(
        &self,
        request: Request<pb::LeaderRequest>,
    ) -> Result<tonic::Response<pb::LeaderResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let req = request.into_inner();
        self.engine
            .shared()
            .check_lock(&caller, baton_core::PermType::Read, &req.name)?;
        check_name(&req.name)?;
        let shared = self.engine.shared();
        shared.read_barrier().await?;
        let (leader, revision) = shared
            .node
            .read(|sm| (sm.lock_head(&req.name), sm.revision().0));
        let kv = leader.ok_or_else(|| Status::unknown(ELECTION_NO_LEADER))?;
        Ok(tonic::Response::new(pb::LeaderResponse {
            header: Some(shared.header_at(revision, shared.term())),
            kv: Some(kv_to_pb(kv)),
        }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        request: Request<pb::LeaderRequest>,
    ) -> Result<tonic::Response<Self::ObserveStream>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let req = request.into_inner();
        self.engine
            .shared()
            .check_lock(&caller, baton_core::PermType::Read, &req.name)?;
        check_name(&req.name)?;
        let shared = self.engine.shared().clone();
        shared.read_barrier().await?;
        let (tx, rx) = mpsc::channel(OBSERVE_QUEUE);
        tokio::spawn(observe_loop(shared, req.name, tx));
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    /// etcd's Resign deletes the key only if it is still the one granted (same create
    /// revision), and succeeds either way.
    async fn resign(
        &self,
        request: Request<pb::ResignRequest>,
    ) -> Result<tonic::Response<pb::ResignResponse>, Status> {
        let caller = self.engine.shared().caller(&request)?;
        let req = request.into_inner();
        if let Some(l) = &req.leader {
            self.engine
                .shared()
                .check_lock(&caller, baton_core::PermType::Write, &l.name)?;
        }
        let leader = req
            .leader
            .ok_or_else(|| Status::unknown(ELECTION_MISSING_LEADER))?;
        let (_, revision, term) = self.engine.delete_if(&leader.key, leader.rev).await?;
        Ok(tonic::Response::new(pb::ResignResponse {
            header: Some(self.engine.shared().header_at(revision, term)),
        }))
    }
}
