//! Process-level chaos: three real `baton serve` processes under a concurrent workload while
//! members are killed and frozen, then every recorded observation is judged by
//! `baton-check`.
//!
//! Why processes and signals rather than the in-process simulator: kill -9 loses whatever
//! was not fsynced and drops every TCP connection at once, and SIGSTOP freezes a member with
//! all its timers, sockets and in-memory state (a GC pause, a VM migration) — the two faults
//! that break real coordination services (etcd#15247: a paused old leader expiring leases
//! when it wakes up). The simulator explores schedules; this test checks the real binary.
//!
//! The workload, all through the public gRPC API:
//! - KV clients spread over the members: puts, linearizable gets, deletes and
//!   compare-and-set txns on a handful of keys, every call recorded with its invocation,
//!   completion and result (errors and timeouts of writes are *unknown* outcomes);
//! - lock-and-put clients: `baton.v1.Lock/Acquire` with a kept-alive lease, a read of a
//!   counter, `FencedPut` of counter + 1 with the fencing token, `Release`;
//! - one watcher per member over the whole key space, resuming after errors from the next
//!   revision it has not seen.
//!
//! Faults, in order: kill -9 of the leader three times (each restarted with its data
//! directory), SIGSTOP of a follower for longer than the election timeout, SIGSTOP of the
//! leader for longer than the election timeout plus the lock leases' TTL — while a "victim"
//! client connected to it holds a lock, so a rival takes the lock over and the victim's late
//! fenced write must be refused.
//!
//! Then: liveness (a write through every member within a bound), linearizability of the KV
//! history, lock safety judged by the fence, every watch stream against the final history,
//! and convergence (HashKV of all three members at one revision).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{agreed_leader_of, kill, lazy_channel, member_status, within, Cluster};
use baton_check::{
    check_convergence, check_history, check_locks, check_watch, CheckOptions, EventKind, KeyRange,
    KvOp, KvResult, LockRecord, Recorder, ReplicaState, WatchEvent, WatchSpec,
};
use baton_proto::baton::v1::{
    lock_client::LockClient, AcquireRequest, FencedPutRequest, ReleaseRequest,
};
use baton_proto::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, maintenance_client::MaintenanceClient,
    request_op, watch_client::WatchClient, watch_request, Compare, DeleteRangeRequest,
    HashKvRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest,
};
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

/// KV clients; client `i` starts on member `i % 3`.
const KV_CLIENTS: u64 = 6;
/// Keys the KV clients share: few enough that they contend, enough that the per-key
/// linearizability search stays small.
const KEYS: usize = 5;
/// Lock-and-put clients on one lock, client `i` starting on member `i % 3`.
const LOCK_CLIENTS: u64 = 3;
/// The lock clients' lease TTL: the smallest a default member accepts (1.5 × the 1 s
/// election timeout, rounded up), so that the frozen leader outlives it by a margin.
const LOCK_TTL_S: i64 = 2;
/// The default election timeout of `baton serve` (what a leader change extends leases by).
const ELECTION_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a client waits for one answer before calling the outcome unknown: above the
/// server's own forwarding deadline would hide nothing, below it keeps clients moving.
const OP_TIMEOUT: Duration = Duration::from_secs(3);
const LOCK: &str = "chaos/lock";
const COUNTER: &str = "chaos/counter";
const VICTIM_LOCK: &str = "chaos/victim-lock";
const VICTIM_COUNTER: &str = "chaos/victim-counter";

fn kv_key(k: usize) -> String {
    format!("chaos/k{k}")
}

/// Everything the workload tasks record and count.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    history: Recorder,
    locks: Mutex<Vec<LockRecord>>,
    acquired: AtomicU64,
    acquire_errors: AtomicU64,
    fenced_accepted: AtomicU64,
    fenced_rejected: AtomicU64,
    fenced_unknown: AtomicU64,
    release_failures: AtomicU64,
    leases_lost: AtomicU64,
    /// Acquire errors by message, for the summary.
    acquire_error_kinds: Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

fn header_revision(h: &Option<baton_proto::etcdserverpb::ResponseHeader>) -> Option<u64> {
    h.as_ref().map(|h| h.revision as u64)
}

/// Runs one KV operation against a member and translates the answer into the checker's
/// terms. `Err` is any error: the caller decides what it means for the history.
async fn run_kv(ch: &Channel, op: &KvOp) -> Result<KvResult, tonic::Status> {
    let mut kv = KvClient::new(ch.clone());
    match op {
        KvOp::Put { key, value } => {
            let r = within(
                OP_TIMEOUT,
                kv.put(PutRequest {
                    key: key.0.clone(),
                    value: value.0.clone(),
                    ..Default::default()
                }),
            )
            .await?;
            Ok(KvResult::Put {
                revision: header_revision(&r.header),
            })
        }
        KvOp::Get { key } => {
            let r = within(
                OP_TIMEOUT,
                kv.range(RangeRequest {
                    key: key.0.clone(),
                    ..Default::default()
                }),
            )
            .await?;
            let kv = r.kvs.first();
            Ok(KvResult::Get {
                value: kv.map(|kv| kv.value.clone().into()),
                revision: kv.map(|kv| kv.mod_revision as u64),
            })
        }
        KvOp::Delete { key } => {
            let r = within(
                OP_TIMEOUT,
                kv.delete_range(DeleteRangeRequest {
                    key: key.0.clone(),
                    ..Default::default()
                }),
            )
            .await?;
            Ok(KvResult::Delete {
                deleted: Some(r.deleted > 0),
                revision: header_revision(&r.header),
            })
        }
        KvOp::Cas { key, expected, new } => {
            let cmp = match expected {
                Some(v) => Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Value as i32,
                    key: key.0.clone(),
                    target_union: Some(compare::TargetUnion::Value(v.0.clone())),
                    ..Default::default()
                },
                None => Compare {
                    result: compare::CompareResult::Equal as i32,
                    target: compare::CompareTarget::Create as i32,
                    key: key.0.clone(),
                    target_union: Some(compare::TargetUnion::CreateRevision(0)),
                    ..Default::default()
                },
            };
            let r = within(
                OP_TIMEOUT,
                kv.txn(TxnRequest {
                    compare: vec![cmp],
                    success: vec![RequestOp {
                        request: Some(request_op::Request::RequestPut(PutRequest {
                            key: key.0.clone(),
                            value: new.0.clone(),
                            ..Default::default()
                        })),
                    }],
                    failure: Vec::new(),
                }),
            )
            .await?;
            Ok(KvResult::Cas {
                succeeded: r.succeeded,
                revision: header_revision(&r.header),
            })
        }
    }
}

/// One KV client: a random mix of operations on the shared keys, each recorded. It starts
/// on its own member and moves to the next one after an error (as etcd clients fail over).
async fn kv_client(id: u64, chans: Vec<Channel>, shared: Arc<Shared>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(id ^ rand::random::<u64>());
    let mut member = id as usize % chans.len();
    // The last value this client saw per key: what its compare-and-sets expect.
    let mut seen: HashMap<usize, Option<Vec<u8>>> = HashMap::new();
    let mut seq = 0u64;
    while !shared.stopped() {
        seq += 1;
        let k = rng.gen_range(0..KEYS);
        let key = kv_key(k);
        let value = format!("c{id}-{seq}");
        let op = match rng.gen_range(0..20) {
            0..=7 => KvOp::Put {
                key: key.as_str().into(),
                value: value.as_str().into(),
            },
            8..=14 => KvOp::Get {
                key: key.as_str().into(),
            },
            15 => KvOp::Delete {
                key: key.as_str().into(),
            },
            _ => KvOp::Cas {
                key: key.as_str().into(),
                expected: seen.get(&k).cloned().flatten().map(Into::into),
                new: value.as_str().into(),
            },
        };
        let call = shared.history.invoke(id, op.clone());
        let result = match run_kv(&chans[member], &op).await {
            Ok(r) => r,
            Err(_) => {
                member = (member + 1) % chans.len();
                // A read that failed had no effect either way; a write may have.
                KvResult::Unknown
            }
        };
        match (&op, &result) {
            (KvOp::Get { .. }, KvResult::Get { value, .. }) => {
                seen.insert(k, value.as_ref().map(|v| v.0.clone()));
            }
            (KvOp::Put { value, .. }, KvResult::Put { .. })
            | (
                KvOp::Cas { new: value, .. },
                KvResult::Cas {
                    succeeded: true, ..
                },
            ) => {
                seen.insert(k, Some(value.0.clone()));
            }
            (KvOp::Delete { .. }, KvResult::Delete { .. }) => {
                seen.insert(k, None);
            }
            _ => {}
        }
        shared.history.complete(call, result).expect("recorder");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A lease kept alive in the background: a keep-alive every TTL/4, each on a fresh stream
/// (so a frozen member costs one timeout, not a stuck stream). `pinned`: always through the
/// same member (a client living next to that member, frozen with it); otherwise it moves to
/// the next member after an error.
struct KeptLease {
    id: i64,
    lost: Arc<AtomicBool>,
    /// When the last acknowledged keep-alive was *sent*: the client's own view of the lease
    /// is that it lives at least until this plus the TTL.
    last_ack_sent: Arc<Mutex<Instant>>,
    task: tokio::task::JoinHandle<()>,
}

impl KeptLease {
    fn start(
        id: i64,
        chans: Vec<Channel>,
        member: usize,
        pinned: bool,
        stop: Arc<AtomicBool>,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let last_ack_sent = Arc::new(Mutex::new(Instant::now()));
        let (l, a) = (lost.clone(), last_ack_sent.clone());
        let task = tokio::spawn(async move {
            let mut member = member;
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                match keep_alive_once(&chans[member], id).await {
                    Ok(ttl) if ttl > 0 => {
                        *a.lock().unwrap() = sent;
                        tokio::time::sleep(Duration::from_millis(LOCK_TTL_S as u64 * 250)).await
                    }
                    Ok(_) => {
                        l.store(true, Ordering::Relaxed);
                        return;
                    }
                    Err(_) => {
                        if !pinned {
                            member = (member + 1) % chans.len();
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        KeptLease {
            id,
            lost,
            last_ack_sent,
            task,
        }
    }

    fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }
}

impl Drop for KeptLease {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One keep-alive round trip; the TTL the server answered (0: the lease is gone).
async fn keep_alive_once(ch: &Channel, id: i64) -> Result<i64, tonic::Status> {
    let fut = async {
        let mut c = LeaseClient::new(ch.clone());
        let req = futures::stream::iter([LeaseKeepAliveRequest { id }]);
        let mut stream = c.lease_keep_alive(req).await?.into_inner();
        match stream.message().await? {
            Some(r) => Ok(r.ttl),
            None => Err(tonic::Status::unavailable("keep-alive stream ended")),
        }
    };
    tokio::time::timeout(Duration::from_secs(1), fut)
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("keep-alive")))
}

async fn grant(ch: &Channel, ttl: i64) -> Result<i64, tonic::Status> {
    let mut c = LeaseClient::new(ch.clone());
    let r = within(OP_TIMEOUT, c.lease_grant(LeaseGrantRequest { ttl, id: 0 })).await?;
    if r.error.is_empty() {
        Ok(r.id)
    } else {
        Err(tonic::Status::internal(r.error))
    }
}

async fn revoke(ch: &Channel, id: i64) -> Result<(), tonic::Status> {
    let mut c = LeaseClient::new(ch.clone());
    within(OP_TIMEOUT, c.lease_revoke(LeaseRevokeRequest { id }))
        .await
        .map(|_| ())
}

/// The counter's value `n/token/holder` → `(n, token)`; absent = 0.
fn parse_counter(v: Option<&[u8]>) -> (u64, u64) {
    let Some(v) = v else { return (0, 0) };
    let s = String::from_utf8_lossy(v);
    let mut it = s.split('/');
    let n = it
        .next()
        .and_then(|x| x.parse().ok())
        .expect("counter value");
    let t = it
        .next()
        .and_then(|x| x.parse().ok())
        .expect("counter token");
    (n, t)
}

async fn read_counter(ch: &Channel, key: &str) -> Result<u64, tonic::Status> {
    let mut kv = KvClient::new(ch.clone());
    let r = within(
        OP_TIMEOUT,
        kv.range(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }),
    )
    .await?;
    Ok(parse_counter(r.kvs.first().map(|kv| kv.value.as_slice())).0)
}

/// What a fenced write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fenced {
    /// Accepted at this revision.
    Accepted(u64),
    /// The fence refused the token.
    Rejected,
    /// No definite answer.
    Unknown,
}

async fn fenced_put(ch: &Channel, lock_key: &[u8], token: i64, key: &str, value: String) -> Fenced {
    let mut c = LockClient::new(ch.clone());
    let r = within(
        OP_TIMEOUT,
        c.fenced_put(FencedPutRequest {
            lock_key: lock_key.to_vec(),
            fencing_token: token,
            put: Some(PutRequest {
                key: key.as_bytes().to_vec(),
                value: value.into_bytes(),
                ..Default::default()
            }),
        }),
    )
    .await;
    match r {
        Ok(r) => Fenced::Accepted(header_revision(&r.header).expect("header")),
        Err(s)
            if s.code() == tonic::Code::FailedPrecondition
                && s.message().contains("fencing token rejected") =>
        {
            Fenced::Rejected
        }
        Err(_) => Fenced::Unknown,
    }
}

/// The lock client's record of one fenced write. Times are *revisions*: the store's
/// revision order is the exact order in which the fence accepted writes, so two holders
/// whose accepted writes interleave in it overlapped as judged by the fence — with no
/// false alarm from a slow response, which wall-clock intervals would give.
fn lock_record(lock: &str, holder: u64, token: i64, fenced: Fenced) -> Option<LockRecord> {
    let (at, accepted) = match fenced {
        Fenced::Accepted(rev) => (rev, true),
        Fenced::Rejected => (0, false),
        Fenced::Unknown => return None,
    };
    Some(LockRecord {
        lock: lock.into(),
        holder,
        token: token as u64,
        enter: at,
        exit: at,
        accepted,
    })
}

/// One lock-and-put client: with a kept-alive lease, acquire the lock, read the counter,
/// write counter + 1 and + 2 with the fencing token, release. Starts on its own member and
/// moves on after errors; a lost lease is replaced.
async fn lock_client(id: u64, chans: Vec<Channel>, shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let mut member = id as usize % chans.len();
    let mut lease: Option<KeptLease> = None;
    let mut rng = rand::rngs::StdRng::seed_from_u64(id ^ rand::random::<u64>());
    while !shared.stopped() {
        if lease.as_ref().is_none_or(KeptLease::lost) {
            if lease.take().is_some() {
                shared.leases_lost.fetch_add(1, Ordering::Relaxed);
            }
            match grant(&chans[member], LOCK_TTL_S).await {
                Ok(l) => {
                    lease = Some(KeptLease::start(
                        l,
                        chans.clone(),
                        member,
                        false,
                        stop.clone(),
                    ))
                }
                Err(_) => {
                    member = (member + 1) % chans.len();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let l = lease.as_ref().unwrap().id;
        let mut locks = LockClient::new(chans[member].clone());
        let acquired = within(
            OP_TIMEOUT + Duration::from_secs(2),
            locks.acquire(AcquireRequest {
                name: LOCK.as_bytes().to_vec(),
                lease: l,
                timeout_ms: OP_TIMEOUT.as_millis() as i64,
                ..Default::default()
            }),
        )
        .await;
        let a = match acquired {
            Ok(a) => a,
            Err(s) => {
                shared.acquire_errors.fetch_add(1, Ordering::Relaxed);
                *shared
                    .acquire_error_kinds
                    .lock()
                    .unwrap()
                    .entry(format!("{:?}: {}", s.code(), s.message()))
                    .or_default() += 1;
                if s.message().contains("lease") {
                    // Start over with a fresh lease (the old one's key goes with it).
                    let _ = revoke(&chans[member], l).await;
                    lease = None;
                } else if s.code() != tonic::Code::DeadlineExceeded
                    || s.message().contains("no answer")
                {
                    member = (member + 1) % chans.len();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        shared.acquired.fetch_add(1, Ordering::Relaxed);
        if let Ok(n) = read_counter(&chans[member], COUNTER).await {
            for i in 1..=2 {
                let value = format!("{}/{}/{id}", n + i, a.fencing_token);
                let f = fenced_put(&chans[member], &a.key, a.fencing_token, COUNTER, value).await;
                match f {
                    Fenced::Accepted(_) => shared.fenced_accepted.fetch_add(1, Ordering::Relaxed),
                    Fenced::Rejected => shared.fenced_rejected.fetch_add(1, Ordering::Relaxed),
                    Fenced::Unknown => shared.fenced_unknown.fetch_add(1, Ordering::Relaxed),
                };
                if let Some(r) = lock_record(LOCK, id, a.fencing_token, f) {
                    shared.locks.lock().unwrap().push(r);
                }
                if !matches!(f, Fenced::Accepted(_)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(rng.gen_range(5..30))).await;
            }
        }
        // Release, trying every member; if none confirms, drop the lease so the key goes
        // when it expires instead of blocking the lock forever.
        let mut released = false;
        for _ in 0..chans.len() {
            let mut c = LockClient::new(chans[member].clone());
            let r = within(
                OP_TIMEOUT,
                c.release(ReleaseRequest {
                    key: a.key.clone(),
                    fencing_token: a.fencing_token,
                }),
            )
            .await;
            if r.is_ok() {
                released = true;
                break;
            }
            member = (member + 1) % chans.len();
        }
        if !released {
            shared.release_failures.fetch_add(1, Ordering::Relaxed);
            let _ = revoke(&chans[member], l).await;
            lease = None;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..20))).await;
    }
    if let Some(l) = lease.take() {
        let _ = revoke(&chans[member], l.id).await;
    }
}

fn to_watch_event(e: &baton_proto::mvccpb::Event) -> WatchEvent {
    let kv = e.kv.as_ref().expect("event kv");
    WatchEvent {
        revision: kv.mod_revision as u64,
        key: kv.key.clone().into(),
        kind: if e.r#type == baton_proto::mvccpb::event::EventType::Delete as i32 {
            EventKind::Delete
        } else {
            EventKind::Put(kv.value.clone().into())
        },
    }
}

/// Everything one watcher received, and how often its stream had to be re-established.
#[derive(Default)]
struct WatchLog {
    events: Vec<WatchEvent>,
    reconnects: u64,
    /// A cancel or compaction notice: the stream cannot be trusted to be complete.
    broken: Option<String>,
}

/// Watches the whole key space on one member from `start`, resuming from the revision after
/// the last event received whenever the stream fails (the member was killed or restarted).
async fn watcher(ch: Channel, start: u64, log: Arc<Mutex<WatchLog>>, stop: Arc<AtomicBool>) {
    let mut next = start;
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        if !first {
            log.lock().unwrap().reconnects += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        first = false;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: vec![0],
                    range_end: vec![0],
                    start_revision: next as i64,
                    ..Default::default()
                },
            )),
        })
        .await
        .unwrap();
        let mut c = WatchClient::new(ch.clone());
        let opened = tokio::time::timeout(
            Duration::from_secs(2),
            c.watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await;
        let Ok(Ok(stream)) = opened else { continue };
        let mut stream = stream.into_inner();
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {
                    if stop.load(Ordering::Relaxed) { return; }
                    continue;
                }
            };
            let Ok(Some(r)) = msg else { break };
            if r.canceled || r.compact_revision != 0 {
                log.lock().unwrap().broken = Some(format!(
                    "canceled={} compact_revision={} reason={:?}",
                    r.canceled, r.compact_revision, r.cancel_reason
                ));
                return;
            }
            if r.events.is_empty() {
                continue;
            }
            let mut g = log.lock().unwrap();
            for e in &r.events {
                let e = to_watch_event(e);
                next = next.max(e.revision + 1);
                g.events.push(e);
            }
        }
        drop(tx);
    }
}

/// How long until a write through `ch` first succeeds: a fresh attempt every 100 ms, each
/// with its own timeout, so the number measures when the cluster took writes again rather
/// than how long one attempt stuck on a dead leader waited for its deadline.
async fn next_write(ch: &Channel, key: &str, bound: Duration) -> Option<Duration> {
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut attempt = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if start.elapsed() > bound {
                    return None;
                }
                attempt += 1;
                let (ch, tx) = (ch.clone(), tx.clone());
                let key = format!("{key}/{attempt}").into_bytes();
                tokio::spawn(async move {
                    let mut kv = KvClient::new(ch);
                    let put = kv.put(PutRequest { key, value: b"x".to_vec(), ..Default::default() });
                    if within(OP_TIMEOUT, put).await.is_ok() {
                        let _ = tx.try_send(start.elapsed());
                    }
                });
            }
            Some(took) = rx.recv() => return Some(took),
        }
    }
}

/// Sequential writes through `ch` until `stop`: the longest one and how many there were.
async fn longest_write(ch: Channel, key: &'static str, stop: Arc<AtomicBool>) -> (Duration, u64) {
    let mut longest = Duration::ZERO;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let started = Instant::now();
        let mut kv = KvClient::new(ch.clone());
        let put = kv.put(PutRequest {
            key: format!("{key}/{n}").into_bytes(),
            value: b"x".to_vec(),
            ..Default::default()
        });
        let _ = within(Duration::from_secs(10), put).await;
        longest = longest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (longest, n)
}

fn pid(cluster: &Cluster, i: usize) -> i32 {
    cluster.members[i].child.as_ref().expect("running").id() as i32
}

/// The chaos run described in the module docs. Prints a summary (operations, unknown
/// outcomes, failover times) whether or not it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_kill_and_pause_members_under_load() {
    let t_start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let chans: Vec<Channel> = eps.iter().map(|e| lazy_channel(e)).collect();
    let all = [0, 1, 2];
    let leader0 = agreed_leader_of(&chans, &all, Duration::from_secs(15)).await;
    let start_rev = member_status(&chans[leader0]).await.unwrap().revision as u64 + 1;

    let shared = Arc::new(Shared::default());
    let watch_stop = Arc::new(AtomicBool::new(false));
    let lease_stop = Arc::new(AtomicBool::new(false));
    let watch_logs: Vec<Arc<Mutex<WatchLog>>> = (0..3)
        .map(|_| Arc::new(Mutex::new(WatchLog::default())))
        .collect();
    let mut watchers = Vec::new();
    for (i, log) in watch_logs.iter().enumerate() {
        watchers.push(tokio::spawn(watcher(
            chans[i].clone(),
            start_rev,
            log.clone(),
            watch_stop.clone(),
        )));
    }
    let mut workers = Vec::new();
    for id in 0..KV_CLIENTS {
        workers.push(tokio::spawn(kv_client(id, chans.clone(), shared.clone())));
    }
    for id in 0..LOCK_CLIENTS {
        workers.push(tokio::spawn(lock_client(
            100 + id,
            chans.clone(),
            shared.clone(),
            lease_stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 1. kill -9 of the leader, three times, each restarted with its data directory.
    let mut failovers = Vec::new();
    for round in 0..3 {
        let leader = agreed_leader_of(&chans, &all, Duration::from_secs(10)).await;
        let survivor = (leader + 1) % 3;
        cluster.members[leader].kill9();
        let took = next_write(
            &chans[survivor],
            &format!("chaos/probe/kill{round}"),
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|| {
            panic!(
                "no write within 10 s of killing the leader\n{}",
                cluster.logs()
            )
        });
        eprintln!(
            "kill -9 #{round}: leader m{} killed; next write through m{} after {took:?}",
            leader + 1,
            survivor + 1
        );
        failovers.push(("kill -9", took));
        tokio::time::sleep(Duration::from_millis(500)).await;
        tokio::task::block_in_place(|| cluster.members[leader].spawn());
        // Back in the cluster (everyone agrees on a leader again) before the next fault.
        agreed_leader_of(&chans, &all, Duration::from_secs(15)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // 2. SIGSTOP a follower for longer than the election timeout. Writes through the other
    // follower must go on; a probe measures the longest one (an election the woken member
    // forces would show up there and in the term).
    let leader = agreed_leader_of(&chans, &all, Duration::from_secs(10)).await;
    let term_before = member_status(&chans[leader]).await.unwrap().raft_term;
    let follower = (leader + 1) % 3;
    let probe_stop = Arc::new(AtomicBool::new(false));
    let probe = tokio::spawn(longest_write(
        chans[(leader + 2) % 3].clone(),
        "chaos/probe/pause",
        probe_stop.clone(),
    ));
    let fpid = pid(&cluster, follower);
    kill(fpid, libc::SIGSTOP);
    tokio::time::sleep(ELECTION_TIMEOUT * 5 / 2).await;
    kill(fpid, libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(2)).await;
    probe_stop.store(true, Ordering::Relaxed);
    let (longest, probes) = probe.await.unwrap();
    let leader_after = agreed_leader_of(&chans, &all, Duration::from_secs(10)).await;
    let term_after = member_status(&chans[leader_after]).await.unwrap().raft_term;
    eprintln!(
        "SIGSTOP follower m{} for {:?}: leader m{} (term {term_before}) -> m{} (term {term_after}); longest of {probes} writes through m{}: {longest:?}",
        follower + 1,
        ELECTION_TIMEOUT * 5 / 2,
        leader + 1,
        leader_after + 1,
        (leader + 2) % 3 + 1
    );
    let follower_pause = (term_after - term_before, leader_after != leader, longest);

    // 3. SIGSTOP the leader past the election timeout and the lock leases' TTL, while a
    // victim connected to it holds a lock. A rival through a follower must get the lock once
    // the victim's lease expires on the new leader, and the victim's fenced write after
    // SIGCONT must be refused.
    let leader = agreed_leader_of(&chans, &all, Duration::from_secs(10)).await;
    let rival_member = (leader + 1) % 3;
    let victim_lease = grant(&chans[leader], LOCK_TTL_S)
        .await
        .expect("victim lease");
    let victim_keep = KeptLease::start(
        victim_lease,
        chans.clone(),
        leader,
        true,
        lease_stop.clone(),
    );
    let mut lc = LockClient::new(chans[leader].clone());
    let victim = within(
        OP_TIMEOUT,
        lc.acquire(AcquireRequest {
            name: VICTIM_LOCK.as_bytes().to_vec(),
            lease: victim_lease,
            ..Default::default()
        }),
    )
    .await
    .expect("victim acquires");
    let f = fenced_put(
        &chans[leader],
        &victim.key,
        victim.fencing_token,
        VICTIM_COUNTER,
        format!("1/{}/victim", victim.fencing_token),
    )
    .await;
    assert!(
        matches!(f, Fenced::Accepted(_)),
        "victim's first write: {f:?}"
    );
    let mut victim_records = vec![lock_record(VICTIM_LOCK, 1, victim.fencing_token, f).unwrap()];

    let lpid = pid(&cluster, leader);
    kill(lpid, libc::SIGSTOP);
    let stopped_at = Instant::now();
    let rival_eps = [(leader + 1) % 3, (leader + 2) % 3];
    let took = next_write(
        &chans[rival_eps[0]],
        "chaos/probe/sigstop",
        Duration::from_secs(10),
    )
    .await
    .unwrap_or_else(|| {
        panic!(
            "no write within 10 s of stopping the leader\n{}",
            cluster.logs()
        )
    });
    failovers.push(("SIGSTOP", took));
    // The rival keeps its lease alive through the two live members only.
    let rival_chans: Vec<Channel> = rival_eps.iter().map(|i| chans[*i].clone()).collect();
    let rival_lease = grant(&chans[rival_member], LOCK_TTL_S)
        .await
        .expect("rival lease");
    let rival_keep = KeptLease::start(rival_lease, rival_chans, 0, false, lease_stop.clone());
    let mut rc = LockClient::new(chans[rival_member].clone());
    let rival = within(
        Duration::from_secs(20),
        rc.acquire(AcquireRequest {
            name: VICTIM_LOCK.as_bytes().to_vec(),
            lease: rival_lease,
            timeout_ms: 15_000,
            ..Default::default()
        }),
    )
    .await
    .unwrap_or_else(|s| panic!("rival never got the lock: {s:?}\n{}", cluster.logs()));
    let rival_after = stopped_at.elapsed();
    let victim_deadline =
        *victim_keep.last_ack_sent.lock().unwrap() + Duration::from_secs(LOCK_TTL_S as u64);
    assert!(
        Instant::now() > victim_deadline,
        "the rival got the lock {:?} before the victim's lease could have expired",
        victim_deadline - Instant::now()
    );
    assert!(rival.fencing_token > victim.fencing_token);
    let f = fenced_put(
        &chans[rival_member],
        &rival.key,
        rival.fencing_token,
        VICTIM_COUNTER,
        format!("2/{}/rival", rival.fencing_token),
    )
    .await;
    assert!(matches!(f, Fenced::Accepted(_)), "rival's write: {f:?}");
    victim_records.push(lock_record(VICTIM_LOCK, 2, rival.fencing_token, f).unwrap());
    // Keep the old leader frozen past the lock leases' TTL plus the new leader's extension.
    let frozen_for = Duration::from_secs(LOCK_TTL_S as u64) + ELECTION_TIMEOUT * 2;
    if stopped_at.elapsed() < frozen_for {
        tokio::time::sleep(frozen_for - stopped_at.elapsed()).await;
    }
    kill(lpid, libc::SIGCONT);
    let frozen = stopped_at.elapsed();
    eprintln!(
        "SIGSTOP leader m{} for {frozen:?}: next write after {took:?}; rival took the victim's lock after {rival_after:?} (tokens {} -> {})",
        leader + 1,
        victim.fencing_token,
        rival.fencing_token
    );
    // The victim wakes up believing it holds the lock; its write must be refused. Retry
    // until the answer is definite (the woken member may first time out).
    let deadline = Instant::now() + Duration::from_secs(15);
    let late = loop {
        let f = fenced_put(
            &chans[leader],
            &victim.key,
            victim.fencing_token,
            VICTIM_COUNTER,
            format!("2/{}/victim", victim.fencing_token),
        )
        .await;
        if f != Fenced::Unknown || Instant::now() > deadline {
            break f;
        }
    };
    assert_eq!(
        late,
        Fenced::Rejected,
        "the stale holder's write after SIGCONT\n{}",
        cluster.logs()
    );
    victim_records.push(lock_record(VICTIM_LOCK, 1, victim.fencing_token, late).unwrap());
    // Its lease is gone everywhere, including on the member it was frozen with.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !victim_keep.lost() {
        assert!(
            Instant::now() < deadline,
            "the victim's keep-alive never learned its lease is gone"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !rival_keep.lost(),
        "the rival's kept-alive lease survived the old leader's return"
    );
    let mut rc = LockClient::new(chans[rival_member].clone());
    within(
        OP_TIMEOUT,
        rc.release(ReleaseRequest {
            key: rival.key.clone(),
            fencing_token: rival.fencing_token,
        }),
    )
    .await
    .expect("rival releases");
    let _ = revoke(&chans[rival_member], rival_lease).await;
    drop((victim_keep, rival_keep));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 4. Liveness: with every fault healed, a write through every member succeeds promptly.
    for (i, ch) in chans.iter().enumerate() {
        let took = next_write(ch, &format!("chaos/probe/live{i}"), Duration::from_secs(5)).await;
        assert!(
            took.is_some(),
            "no write through m{} within 5 s after the faults\n{}",
            i + 1,
            cluster.logs()
        );
    }

    // Stop the workload; clients finish their current call (bounded by OP_TIMEOUT).
    shared.stop.store(true, Ordering::Relaxed);
    for w in workers {
        tokio::time::timeout(Duration::from_secs(15), w)
            .await
            .expect("worker stops")
            .unwrap();
    }
    lease_stop.store(true, Ordering::Relaxed);

    // The final revision, then every member at or past it.
    let leader = agreed_leader_of(&chans, &all, Duration::from_secs(10)).await;
    let mut kv = KvClient::new(chans[leader].clone());
    let fin = within(
        OP_TIMEOUT,
        kv.put(PutRequest {
            key: b"chaos/final".to_vec(),
            value: b"x".to_vec(),
            ..Default::default()
        }),
    )
    .await
    .expect("final write");
    let final_rev = fin.header.unwrap().revision as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    for ch in &chans {
        while member_status(ch)
            .await
            .is_none_or(|s| (s.revision as u64) < final_rev)
        {
            assert!(
                Instant::now() < deadline,
                "a member never reached revision {final_rev}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Watchers: every stream must have delivered everything through the final revision.
    let deadline = Instant::now() + Duration::from_secs(10);
    for log in &watch_logs {
        while log
            .lock()
            .unwrap()
            .events
            .last()
            .is_none_or(|e| e.revision < final_rev)
            && log.lock().unwrap().broken.is_none()
        {
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    watch_stop.store(true, Ordering::Relaxed);
    for w in watchers {
        let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
    }

    // The authoritative history: a fresh watch from the start revision on one member
    // (convergence below shows every member holds the same history).
    let auth_log = Arc::new(Mutex::new(WatchLog::default()));
    let auth_stop = Arc::new(AtomicBool::new(false));
    let auth = tokio::spawn(watcher(
        chans[0].clone(),
        start_rev,
        auth_log.clone(),
        auth_stop.clone(),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    while auth_log
        .lock()
        .unwrap()
        .events
        .last()
        .is_none_or(|e| e.revision < final_rev)
    {
        assert!(Instant::now() < deadline, "could not read the history back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    auth_stop.store(true, Ordering::Relaxed);
    let _ = auth.await;
    let authoritative: Vec<WatchEvent> = auth_log
        .lock()
        .unwrap()
        .events
        .iter()
        .filter(|e| e.revision <= final_rev)
        .cloned()
        .collect();

    // Convergence: HashKV of every member at the final revision.
    let mut replicas = Vec::new();
    for ch in &chans {
        let st = member_status(ch).await.expect("status");
        let mut m = MaintenanceClient::new(ch.clone());
        let h = within(
            OP_TIMEOUT,
            m.hash_kv(HashKvRequest {
                revision: final_rev as i64,
            }),
        )
        .await
        .expect("HashKV");
        replicas.push(ReplicaState {
            replica: st.member_id,
            applied_index: final_rev,
            state_hash: h.hash as u64,
        });
    }

    // ---- Judgement. Everything is computed before anything is asserted, so the summary is
    // printed even for a failing run.
    let history = shared.history.history().expect("well-formed history");
    let ops = history.len();
    let unknown = history
        .ops()
        .iter()
        .filter(|o| o.result == KvResult::Unknown)
        .count();
    let unknown_writes = history
        .ops()
        .iter()
        .filter(|o| o.result == KvResult::Unknown && !matches!(o.op, KvOp::Get { .. }))
        .count();
    let check_started = Instant::now();
    let h2 = history.clone();
    let lin = tokio::task::spawn_blocking(move || {
        check_history(
            &h2,
            &CheckOptions {
                max_steps_per_key: 10_000_000,
                timeout: Some(Duration::from_secs(30)),
            },
        )
    })
    .await
    .unwrap();
    let lin_took = check_started.elapsed();

    let mut records = shared.locks.lock().unwrap().clone();
    records.extend(victim_records);
    let lock_report = check_locks(&records);

    let spec = WatchSpec {
        range: KeyRange::Range {
            start: vec![0u8].into(),
            end: None,
        },
        start_revision: start_rev,
        through_revision: Some(final_rev),
    };
    let mut watch_results = Vec::new();
    for (i, log) in watch_logs.iter().enumerate() {
        let g = log.lock().unwrap();
        let received: Vec<WatchEvent> = g
            .events
            .iter()
            .filter(|e| e.revision <= final_rev)
            .cloned()
            .collect();
        let r = check_watch(&spec, &received, &authoritative).map_err(|v| v.to_string());
        watch_results.push((i, r, g.reconnects, g.broken.clone()));
    }
    let convergence = check_convergence(&replicas);

    // Every acknowledged write is in the history at the revision it was acknowledged with.
    let mut at: HashMap<(u64, Vec<u8>), &WatchEvent> = HashMap::new();
    for e in &authoritative {
        at.insert((e.revision, e.key.0.clone()), e);
    }
    let mut unacknowledged = Vec::new();
    for o in history.ops() {
        let expect = match (&o.op, &o.result) {
            (KvOp::Put { key, value }, KvResult::Put { revision: Some(r) })
            | (
                KvOp::Cas {
                    key, new: value, ..
                },
                KvResult::Cas {
                    succeeded: true,
                    revision: Some(r),
                },
            ) => Some((*r, key, EventKind::Put(value.clone()))),
            (
                KvOp::Delete { key },
                KvResult::Delete {
                    deleted: Some(true),
                    revision: Some(r),
                },
            ) => Some((*r, key, EventKind::Delete)),
            _ => None,
        };
        if let Some((r, key, kind)) = expect {
            if at.get(&(r, key.0.clone())).is_none_or(|e| e.kind != kind) {
                unacknowledged.push(o.to_string());
            }
        }
    }
    // The fenced counter: its applied writes count up by one, in token order. A lost update
    // (two holders writing from the same read) or a stale holder's write shows up here even
    // when the client never learned the outcome.
    let mut counter_errors = Vec::new();
    let (mut last_n, mut last_token) = (0u64, 0u64);
    let mut counter_writes = 0;
    for e in authoritative
        .iter()
        .filter(|e| e.key.0 == COUNTER.as_bytes())
    {
        let EventKind::Put(v) = &e.kind else {
            counter_errors.push(format!("counter deleted at {}", e.revision));
            continue;
        };
        counter_writes += 1;
        let (n, token) = parse_counter(Some(&v.0));
        if n != last_n + 1 || token < last_token {
            counter_errors.push(format!(
                "rev {}: counter {n} with token {token} after {last_n} with token {last_token}",
                e.revision
            ));
        }
        (last_n, last_token) = (n, token);
    }

    eprintln!("===== chaos summary ({:?} in all) =====", t_start.elapsed());
    eprintln!("KV: {ops} operations, {unknown} unknown outcomes ({unknown_writes} writes) over {} revisions", final_rev - start_rev + 1);
    eprintln!(
        "linearizability ({lin_took:?}): {}",
        lin.to_string().trim_end()
    );
    eprintln!(
        "locks: {} acquisitions, {} acquire errors, fenced writes {} accepted / {} rejected / {} unknown, {} releases failed, {} leases lost; counter written {counter_writes} times, reached {last_n}",
        shared.acquired.load(Ordering::Relaxed),
        shared.acquire_errors.load(Ordering::Relaxed),
        shared.fenced_accepted.load(Ordering::Relaxed),
        shared.fenced_rejected.load(Ordering::Relaxed),
        shared.fenced_unknown.load(Ordering::Relaxed),
        shared.release_failures.load(Ordering::Relaxed),
        shared.leases_lost.load(Ordering::Relaxed),
    );
    eprintln!(
        "acquire errors: {:?}",
        shared.acquire_error_kinds.lock().unwrap()
    );
    eprint!("lock check: {lock_report}");
    for (i, r, reconnects, broken) in &watch_results {
        eprintln!(
            "watch m{}: {} reconnects, {:?}{}",
            i + 1,
            reconnects,
            r.as_ref().map(|s| (s.received, s.expected)),
            broken
                .as_ref()
                .map(|b| format!(" BROKEN: {b}"))
                .unwrap_or_default()
        );
    }
    eprintln!("convergence at revision {final_rev}: {convergence:?}");
    for (what, took) in &failovers {
        eprintln!("failover ({what} of the leader -> next successful write): {took:?}");
    }
    let (terms, changed, longest) = follower_pause;
    eprintln!(
        "follower SIGSTOP: term +{terms}, leader changed: {changed}, longest write meanwhile {longest:?}"
    );

    assert!(lin.is_linearizable(), "KV history: {lin}");
    assert!(
        unacknowledged.is_empty(),
        "acknowledged writes missing from the history: {unacknowledged:#?}"
    );
    assert!(lock_report.is_ok(), "{lock_report}");
    assert!(
        lock_report.rejected >= 1,
        "the victim's stale write was counted as rejected"
    );
    assert!(
        counter_errors.is_empty(),
        "fenced counter: {counter_errors:#?}"
    );
    assert!(
        shared.fenced_accepted.load(Ordering::Relaxed) > 0,
        "lock clients made progress"
    );
    for (i, r, _, broken) in &watch_results {
        assert!(broken.is_none(), "watch on m{}: {broken:?}", i + 1);
        if let Err(v) = r {
            panic!("watch on m{}: {v}", i + 1);
        }
    }
    convergence.expect("replicas converge");
    assert!(
        t_start.elapsed() < Duration::from_secs(120),
        "the run took {:?}",
        t_start.elapsed()
    );
}
