//! The lock engine behind every lock-like service: etcd's `v3lock` and `v3election` and
//! `baton.v1.Lock`. One algorithm, so an etcd lock, an election and a Baton lock on the same
//! name are the same queue.
//!
//! **Queue.** A lock `N` is etcd's recipe: waiter keys `N/<lease hex>`, FIFO by create
//! revision; the head holds the lock and its create revision is the fencing token (strictly
//! increasing across holders, because later waiters have later revisions). Joining is one
//! `Command::LockEnqueue` (etcd's `If create_revision(key) == 0 Then Put`), which also
//! registers the lock for lock-delay and force-release bookkeeping in the core.
//!
//! **Waiting without a herd.** A waiter looks up only its immediate predecessor (the key
//! just ahead of it by create revision) and sleeps on a one-shot deletion watch for that
//! single key, registered atomically with the lookup (`Node::read_and_watch_deletions`), so
//! no deletion can slip between them. A release therefore wakes exactly one task: draining
//! `n` waiters costs `n - 1` wake-ups, counted in `baton_lock_wakeups_total`. The waiter
//! also watches its own key, so it gives up at once when that key disappears (lease expiry,
//! revoke, force-release) instead of waiting for everyone ahead (etcd#19597).
//!
//! **Granting.** At the head, before answering: the lock-delay recorded by the core is
//! respected (sleep until it passes, then re-check everything), the waiter's lease must be
//! alive on the leader's clock (etcd#11456: etcd 3.4 granted locks to expired sessions), and
//! the key must still be the head.
//!
//! **Giving up.** Each acquisition runs in its own task that answers through a oneshot. A
//! timeout, a `try_only` refusal, an error, or the caller going away (tonic drops the
//! handler future when the client cancels; the task sees the receiver close) all end with
//! the waiter key deleted, if this call created it, *before* the task ends, so the queue
//! moves on. Enqueueing itself is not cancellable (a proposal cannot be taken back), so the
//! task waits for it and cleans up after it.
//!
//! Not here: multi-member concerns. A grant trusts this replica's applied state and lease
//! clock, which is exact on a single member (the only kind today); with followers, a grant
//! must first confirm leadership (a read barrier).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_core::{
    Command, Compare, CompareResult, CompareTarget, DeleteRangeRequest, FencingToken, KeyRange,
    KeyValue, LeaseId, PutRequest, RequestOp, Response, Revision, StateMachine, TxnRequest,
    TxnResponse,
};
use tokio::sync::oneshot;
use tonic::Status;

use crate::errors::{kv_status, lock_status, LockError, ELECTION_NOT_LEADER};
use crate::kv::unexpected;
use crate::Shared;

/// Acquisitions that may wait on one member at once. Each holds a task, two deletion
/// watches and a little memory; past this, new ones are refused rather than queued.
pub const MAX_WAITERS: usize = 100_000;

/// The engine; cheap to clone.
#[derive(Clone)]
pub struct LockEngine {
    inner: Arc<Engine>,
}

struct Engine {
    shared: Shared,
    waiting: AtomicUsize,
    wakeups: AtomicU64,
    grants: AtomicU64,
    delay_refusals: AtomicU64,
    fencing_rejections: AtomicU64,
}

/// Counters of one engine (the same events as the process-wide metrics, but per server, so
/// tests can assert exact numbers without a global recorder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockStats {
    /// Acquisitions in progress (enqueueing, waiting or being granted).
    pub waiting: usize,
    /// Waiters woken by their predecessor's deletion.
    pub wakeups: u64,
    /// Locks granted.
    pub grants: u64,
    /// Grants deferred by lock-delay, and `try_only` attempts refused by it.
    pub delay_refusals: u64,
    /// Fenced puts and fence checks rejected.
    pub fencing_rejections: u64,
}

/// What to acquire, and how.
#[derive(Debug, Clone)]
pub struct AcquireSpec {
    pub name: Vec<u8>,
    pub lease: LeaseId,
    /// The waiter key's value (empty for locks, the proposal for elections).
    pub value: Vec<u8>,
    pub timeout: Option<Duration>,
    pub try_only: bool,
    /// `Some` sets the lock's lock-delay (`baton.v1`); `None` leaves it (etcd's APIs).
    pub delay_ms: Option<u64>,
    /// etcd's Campaign: when the key already exists with another value, proclaim `value`
    /// before waiting.
    pub proclaim_existing: bool,
    /// Which API asked (a metrics label).
    pub api: LockApi,
}

/// The API an acquisition came through: `baton_lock_acquire_seconds{api}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockApi {
    /// etcd's `v3lockpb.Lock`.
    V3Lock,
    /// etcd's `v3electionpb.Election` (Campaign).
    Election,
    /// `baton.v1`.
    Baton,
}

impl LockApi {
    /// The acquisition-time histogram of this API (a handle per label, looked up once).
    fn acquire_seconds(self) -> &'static metrics::Histogram {
        match self {
            LockApi::V3Lock => {
                baton_raft::cached_histogram!("baton_lock_acquire_seconds", "api" => "v3lock")
            }
            LockApi::Election => {
                baton_raft::cached_histogram!("baton_lock_acquire_seconds", "api" => "election")
            }
            LockApi::Baton => {
                baton_raft::cached_histogram!("baton_lock_acquire_seconds", "api" => "baton")
            }
        }
    }
}

/// A granted lock.
#[derive(Debug, Clone)]
pub struct Held {
    /// The holder key as of the grant; `create_revision` is the fencing token.
    pub kv: KeyValue,
    /// Store revision and term at the grant (for the response header).
    pub revision: i64,
    pub raft_term: u64,
}

impl Held {
    pub fn token(&self) -> FencingToken {
        FencingToken::of_create_revision(self.kv.create_revision)
    }
}

/// Where a waiter stands, read in one critical section.
enum Turn {
    /// Its key is gone (or was re-created: another waiter as far as we are concerned).
    Gone,
    /// Someone is ahead; `predecessor` is the key just ahead, `holder` the head.
    Wait {
        predecessor: KeyValue,
        holder: KeyValue,
    },
    /// It is the head.
    Head {
        me: KeyValue,
        delayed_until_ms: u64,
        revision: i64,
    },
}

fn single(key: &[u8]) -> KeyRange {
    KeyRange {
        key: key.to_vec(),
        range_end: Vec::new(),
    }
}

fn turn(sm: &StateMachine, name: &[u8], key: &[u8], rev: Revision) -> Turn {
    let Some(me) = sm.live_key(key).filter(|kv| kv.create_revision == rev) else {
        return Turn::Gone;
    };
    match sm.lock_predecessor(name, rev, key) {
        Some(predecessor) => Turn::Wait {
            holder: sm.lock_head(name).unwrap_or_else(|| predecessor.clone()),
            predecessor,
        },
        None => Turn::Head {
            me,
            delayed_until_ms: sm.lock_info(name).map_or(0, |i| i.delayed_until_ms),
            revision: sm.revision().0,
        },
    }
}

/// `If create_revision(key) == rev`: the compare that makes a release, a proclaim or a
/// fenced write apply only to the key (and incarnation of it) the caller was granted.
pub(crate) fn created_at(key: &[u8], rev: i64) -> Compare {
    Compare {
        range: single(key),
        result: CompareResult::Equal,
        target: CompareTarget::Create(rev),
    }
}

/// Counts a slot in the waiter bound for as long as it lives.
struct Slot(Arc<Engine>);

impl Drop for Slot {
    fn drop(&mut self) {
        let n = self.0.waiting.fetch_sub(1, Ordering::AcqRel) - 1;
        baton_raft::cached_gauge!("baton_lock_waiters").set(n as f64);
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl LockEngine {
    pub fn new(shared: Shared) -> Self {
        LockEngine {
            inner: Arc::new(Engine {
                shared,
                waiting: AtomicUsize::new(0),
                wakeups: AtomicU64::new(0),
                grants: AtomicU64::new(0),
                delay_refusals: AtomicU64::new(0),
                fencing_rejections: AtomicU64::new(0),
            }),
        }
    }

    pub fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    pub fn stats(&self) -> LockStats {
        let e = &self.inner;
        LockStats {
            waiting: e.waiting.load(Ordering::Acquire),
            wakeups: e.wakeups.load(Ordering::Relaxed),
            grants: e.grants.load(Ordering::Relaxed),
            delay_refusals: e.delay_refusals.load(Ordering::Relaxed),
            fencing_rejections: e.fencing_rejections.load(Ordering::Relaxed),
        }
    }

    /// Joins the queue and returns once the caller holds the lock (see the module docs for
    /// every way it can end otherwise, and the cleanup each gets).
    pub async fn acquire(&self, spec: AcquireSpec) -> Result<Held, Status> {
        let check = Command::LockEnqueue {
            name: spec.name.clone(),
            lease: spec.lease,
            value: Vec::new(),
            delay_ms: spec.delay_ms,
        };
        StateMachine::validate(&check).map_err(|e| kv_status(&e))?;
        let slot = self.inner.take_slot()?;
        let (tx, rx) = oneshot::channel();
        // Boxed: the acquisition's future (enqueue, wait, grant check) is large, and tokio
        // moves a spawned future by value through several calls before it rests in its task;
        // a box moves as a pointer (callgrind: ~2.4k instructions of copying a lock cycle).
        tokio::spawn(Box::pin(self.inner.clone().run(spec, slot, tx)));
        rx.await
            .unwrap_or_else(|_| Err(Status::internal("baton: lock task ended without an answer")))
    }

    /// Releases `key` only if it still exists with create revision `token` (one txn, so the
    /// check and the delete are atomic). Returns the header revision and term.
    pub async fn release(&self, key: &[u8], token: FencingToken) -> Result<(i64, u64), Status> {
        if key.is_empty() {
            return Err(kv_status(&baton_core::KvError::EmptyKey));
        }
        if token.0 <= 0 {
            return Err(kv_status(&baton_core::KvError::InvalidFencingToken));
        }
        let (resp, revision, term) = self.inner.delete_if(key, token.create_revision().0).await?;
        if !resp.succeeded {
            return Err(kv_status(&baton_core::KvError::NotHolder));
        }
        Ok((revision, term))
    }

    /// A put that applies only while `lock_key` heads its queue with create revision `token`:
    /// `If create_revision(lock_key) == token AND every key under the lock's prefix has
    /// create_revision >= token Then Put`. The second compare makes "still the holder"
    /// exact (a waiter's own key and token are not enough).
    pub async fn fenced_put(
        &self,
        lock_key: &[u8],
        token: FencingToken,
        put: PutRequest,
    ) -> Result<(baton_core::PutResponse, i64, u64), Status> {
        let Some(name) = baton_core::lock_name_of(lock_key) else {
            return Err(Status::invalid_argument(
                "baton: lock_key is not a lock key (<name>/<lease hex>)",
            ));
        };
        if token.0 <= 0 {
            return Err(kv_status(&baton_core::KvError::InvalidFencingToken));
        }
        let created = token.create_revision().0;
        let head = Compare {
            range: baton_core::lock_prefix(name),
            result: CompareResult::Greater,
            target: CompareTarget::Create(created - 1),
        };
        let txn = TxnRequest {
            compare: vec![created_at(lock_key, created), head],
            success: vec![RequestOp::Put(put)],
            failure: Vec::new(),
        };
        let (resp, revision, term) = self.inner.txn(txn).await?;
        if !resp.succeeded {
            self.count_fencing_rejection("fenced_put");
            return Err(lock_status(&LockError::FencingTokenRejected));
        }
        match resp.responses.into_iter().next() {
            Some(baton_core::ResponseOp::Put(p)) => Ok((p, revision, term)),
            _ => Err(Status::internal(
                "baton: fenced put returned no put response",
            )),
        }
    }

    /// Counts a fencing rejection (`source`: which API rejected).
    pub fn count_fencing_rejection(&self, source: &'static str) {
        self.inner
            .fencing_rejections
            .fetch_add(1, Ordering::Relaxed);
        metrics::counter!("baton_fencing_rejections_total", "source" => source).increment(1);
    }

    /// etcd's Proclaim: `If create_revision(key) == rev Then Put(key, value, lease)`; false
    /// when the compare failed (not the leader any more).
    pub async fn proclaim(
        &self,
        key: &[u8],
        rev: i64,
        lease: LeaseId,
        value: Vec<u8>,
    ) -> Result<(bool, i64, u64), Status> {
        self.inner.proclaim(key, rev, lease, value).await
    }

    /// `If create_revision(key) == rev Then Delete(key)` (etcd's Resign); whether it deleted.
    pub async fn delete_if(&self, key: &[u8], rev: i64) -> Result<(bool, i64, u64), Status> {
        let (resp, revision, term) = self.inner.delete_if(key, rev).await?;
        Ok((resp.succeeded, revision, term))
    }
}

impl Engine {
    fn take_slot(self: &Arc<Self>) -> Result<Slot, Status> {
        let n = self.waiting.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(self.clone());
        if n >= MAX_WAITERS {
            return Err(lock_status(&LockError::TooManyWaiters {
                limit: MAX_WAITERS,
            }));
        }
        baton_raft::cached_gauge!("baton_lock_waiters").set((n + 1) as f64);
        Ok(slot)
    }

    async fn txn(&self, txn: TxnRequest) -> Result<(TxnResponse, i64, u64), Status> {
        let command = Command::Txn(txn);
        StateMachine::validate(&command).map_err(|e| kv_status(&e))?;
        let p = self.shared.propose(command).await?;
        match p.applied.response {
            Response::Txn(t) => Ok((t, p.applied.revision.0, p.raft_term)),
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }

    async fn delete_if(&self, key: &[u8], rev: i64) -> Result<(TxnResponse, i64, u64), Status> {
        self.txn(TxnRequest {
            compare: vec![created_at(key, rev)],
            success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
                range: single(key),
                prev_kv: false,
            })],
            failure: Vec::new(),
        })
        .await
    }

    async fn proclaim(
        &self,
        key: &[u8],
        rev: i64,
        lease: LeaseId,
        value: Vec<u8>,
    ) -> Result<(bool, i64, u64), Status> {
        let (resp, revision, term) = self
            .txn(TxnRequest {
                compare: vec![created_at(key, rev)],
                success: vec![RequestOp::Put(PutRequest {
                    key: key.to_vec(),
                    value,
                    lease,
                    ..PutRequest::default()
                })],
                failure: Vec::new(),
            })
            .await?;
        Ok((resp.succeeded, revision, term))
    }

    /// Deletes a waiter key this acquisition created; failures are logged (the key then
    /// goes with its lease).
    async fn abandon(&self, kv: &KeyValue) {
        if let Err(e) = self.delete_if(&kv.key, kv.create_revision.0).await {
            tracing::warn!(
                key = %String::from_utf8_lossy(&kv.key),
                error = %e.message(),
                "could not delete an abandoned lock waiter key; it goes with its lease"
            );
        }
    }

    async fn run(
        self: Arc<Self>,
        spec: AcquireSpec,
        _slot: Slot,
        mut tx: oneshot::Sender<Result<Held, Status>>,
    ) {
        let started = tokio::time::Instant::now();
        let deadline = spec.timeout.map(|t| started + t);
        let (mine, created) = match self.enqueue(&spec).await {
            Ok(x) => x,
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        };
        let outcome = tokio::select! {
            r = self.wait_turn(&spec, &mine) => r,
            _ = tx.closed() => Err(Status::cancelled("baton: lock acquisition cancelled")),
            _ = sleep_until(deadline) => Err(lock_status(&LockError::TimedOut {
                after_ms: spec.timeout.map_or(0, |t| t.as_millis() as u64),
            })),
        };
        match outcome {
            Ok(held) => {
                self.grants.fetch_add(1, Ordering::Relaxed);
                spec.api
                    .acquire_seconds()
                    .record(started.elapsed().as_secs_f64());
                if let Err(Ok(held)) = tx.send(Ok(held)) {
                    // The caller left between the grant and the answer: nobody holds it.
                    if created {
                        self.abandon(&held.kv).await;
                    }
                }
            }
            Err(e) => {
                if created {
                    self.abandon(&mine).await;
                }
                let _ = tx.send(Err(e));
            }
        }
    }

    /// Joins the queue: returns the waiter key and whether this call created it.
    async fn enqueue(&self, spec: &AcquireSpec) -> Result<(KeyValue, bool), Status> {
        let p = self
            .shared
            .propose(Command::LockEnqueue {
                name: spec.name.clone(),
                lease: spec.lease,
                value: spec.value.clone(),
                delay_ms: spec.delay_ms,
            })
            .await?;
        let (mut kv, created) = match p.applied.response {
            Response::LockEnqueue { kv, created } => (kv, created),
            Response::Error(e) => return Err(kv_status(&e)),
            other => return Err(unexpected(other)),
        };
        // "Waiters per lock" without a label per lock name (unbounded cardinality): the
        // queue length each newcomer finds, as a distribution.
        let (_, queue_len) = self.shared.node.read(|sm| sm.lock_queue(&spec.name, 0));
        baton_raft::cached_histogram!("baton_lock_queue_length").record(queue_len as f64);
        if spec.proclaim_existing && !created && kv.value != spec.value {
            let rev = kv.create_revision.0;
            let (ok, _, _) = self
                .proclaim(&kv.key, rev, kv.lease, spec.value.clone())
                .await?;
            if !ok {
                return Err(Status::unknown(ELECTION_NOT_LEADER));
            }
            kv.value = spec.value.clone();
        }
        Ok((kv, created))
    }

    async fn wait_turn(&self, spec: &AcquireSpec, mine: &KeyValue) -> Result<Held, Status> {
        let node = &self.shared.node;
        let rev = mine.create_revision;
        // When this acquisition first found the lock in lock-delay (for the wait's histogram).
        let mut deferred: Option<tokio::time::Instant> = None;
        loop {
            // One reading of the clock for the whole turn: the head's delay is judged by it
            // both here and below, so a head found undelayed needs (and gets) no watch.
            let now_ms = node.time_ms();
            let (now, watches) = node.read_and_watch_deletions(|sm| {
                let t = turn(sm, &spec.name, &mine.key, rev);
                let keys = match &t {
                    _ if spec.try_only => Vec::new(),
                    Turn::Gone => Vec::new(),
                    Turn::Wait { predecessor, .. } => {
                        vec![predecessor.key.clone(), mine.key.clone()]
                    }
                    // Waits out the delay unless its own key goes meanwhile.
                    Turn::Head {
                        delayed_until_ms, ..
                    } if *delayed_until_ms > now_ms => vec![mine.key.clone()],
                    Turn::Head { .. } => Vec::new(),
                };
                (t, keys)
            });
            match now {
                Turn::Gone => return Err(lock_status(&LockError::WaiterKeyDeleted)),
                Turn::Wait { holder, .. } if spec.try_only => {
                    return Err(lock_status(&LockError::Held {
                        holder_key: holder.key,
                        token: FencingToken::of_create_revision(holder.create_revision),
                    }))
                }
                Turn::Wait { .. } => {
                    let (predecessor, own) = (&watches[0], &watches[1]);
                    tokio::select! {
                        _ = predecessor.deleted() => {
                            self.wakeups.fetch_add(1, Ordering::Relaxed);
                            baton_raft::cached_counter!("baton_lock_wakeups_total").increment(1);
                        }
                        // Loops back to `Gone`.
                        _ = own.deleted() => {}
                    }
                }
                Turn::Head {
                    delayed_until_ms, ..
                } => {
                    if delayed_until_ms > now_ms {
                        if deferred.is_none() {
                            deferred = Some(tokio::time::Instant::now());
                            self.delay_refusals.fetch_add(1, Ordering::Relaxed);
                            baton_raft::cached_counter!("baton_lock_delay_refusals_total")
                                .increment(1);
                        }
                        if spec.try_only {
                            return Err(lock_status(&LockError::Delayed {
                                until_ms: delayed_until_ms,
                            }));
                        }
                        let wait = Duration::from_millis(delayed_until_ms - now_ms);
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = watches[0].deleted() => {}
                        }
                        // Re-check everything: the delay may have been extended meanwhile.
                        continue;
                    }
                    if let Some(since) = deferred.take() {
                        baton_raft::cached_histogram!("baton_lock_delay_wait_seconds")
                            .record(since.elapsed().as_secs_f64());
                    }
                    // Leadership confirmed by a quorum and the lease judged by the leader's
                    // clock, so neither a follower nor a deposed leader grants to a lease
                    // the cluster has expired (etcd#11456).
                    if !node
                        .confirm_grant(spec.lease)
                        .await
                        .map_err(|e| crate::errors::propose_status(&e))?
                    {
                        return Err(lock_status(&LockError::LeaseExpired));
                    }
                    // The check waited; confirm the head once more so what is granted is
                    // what is there after it.
                    match node.read(|sm| turn(sm, &spec.name, &mine.key, rev)) {
                        Turn::Head {
                            me,
                            delayed_until_ms,
                            revision,
                        } if delayed_until_ms <= now_ms => {
                            return Ok(Held {
                                kv: me,
                                revision,
                                raft_term: self.shared.term(),
                            });
                        }
                        _ => continue,
                    }
                }
            }
        }
    }
}
