//! Lease safety across leader changes, on three real `baton serve` processes.
//!
//! Keep-alives are not replicated: only the leader's in-memory clock knows when a lease was
//! last renewed, and a new leader rebuilds every deadline from the replicated TTL, extended
//! by the election timeout. These tests pin down what a client relies on:
//! - a lease kept alive survives kill -9 of the leader (the keep-alives move to another
//!   member) — its key never disappears;
//! - a lease *not* kept alive after the kill does not expire before the deadline the client
//!   computed from its last acknowledged keep-alive (the new leader never shortens a lease),
//!   and it does expire eventually;
//! - etcd#15247: a leader frozen (SIGSTOP) past a lease's TTL while its client keeps the
//!   lease alive through the new leader must not revoke the lease when it wakes up.
//!
//! Every observation of "the key is gone" comes from a watch on a member that is never
//! faulted, so a DELETE at any time is caught, not just at sampling points.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{agreed_leader_of, kill, lazy_channel, within, Cluster};
use baton_proto::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, watch_client::WatchClient, watch_request,
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest,
    WatchCreateRequest, WatchRequest,
};
use tonic::transport::Channel;

const ELECTION_TIMEOUT: Duration = Duration::from_secs(1);
const CALL: Duration = Duration::from_secs(3);

struct Fixture {
    cluster: Cluster,
    chans: Vec<Channel>,
    _dir: tempfile::TempDir,
}

async fn start() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let chans: Vec<Channel> = cluster
        .members
        .iter()
        .map(|m| lazy_channel(&m.endpoint()))
        .collect();
    agreed_leader_of(&chans, &[0, 1, 2], Duration::from_secs(15)).await;
    Fixture {
        cluster,
        chans,
        _dir: dir,
    }
}

async fn grant(ch: &Channel, ttl: i64) -> i64 {
    let mut c = LeaseClient::new(ch.clone());
    within(CALL, c.lease_grant(LeaseGrantRequest { ttl, id: 0 }))
        .await
        .expect("grant")
        .id
}

async fn put(ch: &Channel, key: &str, lease: i64) -> i64 {
    let mut kv = KvClient::new(ch.clone());
    within(
        CALL,
        kv.put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        }),
    )
    .await
    .expect("put")
    .header
    .unwrap()
    .revision
}

/// Whether the key exists, by a linearizable read through `ch`.
async fn exists(ch: &Channel, key: &str) -> Result<bool, tonic::Status> {
    let mut kv = KvClient::new(ch.clone());
    let r = within(
        CALL,
        kv.range(RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }),
    )
    .await?;
    Ok(!r.kvs.is_empty())
}

async fn time_to_live(ch: &Channel, id: i64) -> Result<i64, tonic::Status> {
    let mut c = LeaseClient::new(ch.clone());
    Ok(within(
        CALL,
        c.lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false }),
    )
    .await?
    .ttl)
}

/// One keep-alive round trip on a fresh stream; the TTL answered (0: no such lease).
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

/// A client keeping a lease alive every TTL/4 through `chans`, moving to the next member
/// after an error, as etcd's client does. Records the longest time between two acks and
/// any answer saying the lease is gone.
struct Keeper {
    stop: Arc<AtomicBool>,
    gone: Arc<AtomicBool>,
    longest_gap_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Keeper {
    fn start(id: i64, ttl_s: i64, chans: Vec<Channel>, first: usize) -> Keeper {
        let stop = Arc::new(AtomicBool::new(false));
        let gone = Arc::new(AtomicBool::new(false));
        let longest = Arc::new(AtomicU64::new(0));
        let (s, g, l) = (stop.clone(), gone.clone(), longest.clone());
        let task = tokio::spawn(async move {
            let mut member = first;
            let mut last_ack = Instant::now();
            while !s.load(Ordering::Relaxed) {
                match keep_alive_once(&chans[member], id).await {
                    Ok(ttl) if ttl > 0 => {
                        l.fetch_max(last_ack.elapsed().as_millis() as u64, Ordering::Relaxed);
                        last_ack = Instant::now();
                        tokio::time::sleep(Duration::from_millis(ttl_s as u64 * 250)).await;
                    }
                    Ok(_) => {
                        g.store(true, Ordering::Relaxed);
                        return;
                    }
                    Err(_) => {
                        member = (member + 1) % chans.len();
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Keeper {
            stop,
            gone,
            longest_gap_ms: longest,
            task,
        }
    }

    async fn stop(self) -> (bool, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        (
            self.gone.load(Ordering::Relaxed),
            Duration::from_millis(self.longest_gap_ms.load(Ordering::Relaxed)),
        )
    }
}

/// Watches one key from `from` on one member; records when a DELETE arrived. Resumes after
/// errors from the next revision.
struct DeleteWatch {
    deleted_at: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl DeleteWatch {
    async fn start(ch: Channel, key: &str, from: i64) -> DeleteWatch {
        let deleted_at = Arc::new(Mutex::new(None));
        let d = deleted_at.clone();
        let key = key.as_bytes().to_vec();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut next = from;
            loop {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                tx.send(WatchRequest {
                    request_union: Some(watch_request::RequestUnion::CreateRequest(
                        WatchCreateRequest {
                            key: key.clone(),
                            start_revision: next,
                            ..Default::default()
                        },
                    )),
                })
                .await
                .unwrap();
                let mut c = WatchClient::new(ch.clone());
                if let Ok(stream) = c
                    .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
                {
                    let mut stream = stream.into_inner();
                    while let Ok(Some(r)) = stream.message().await {
                        if r.created {
                            if let Some(t) = ready.take() {
                                let _ = t.send(());
                            }
                        }
                        for e in &r.events {
                            let rev = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                            next = next.max(rev + 1);
                            if e.r#type == baton_proto::mvccpb::event::EventType::Delete as i32 {
                                d.lock().unwrap().get_or_insert(Instant::now());
                            }
                        }
                    }
                }
                drop(tx);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        tokio::time::timeout(Duration::from_secs(5), ready_rx)
            .await
            .expect("watch created")
            .unwrap();
        DeleteWatch { deleted_at, task }
    }

    fn deleted_at(&self) -> Option<Instant> {
        *self.deleted_at.lock().unwrap()
    }
}

impl Drop for DeleteWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// (a) A lease kept alive through the leader survives kill -9 of that leader: the keeper
/// moves to another member and the key is never deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_alive_lease_survives_leader_kill9() {
    const TTL: i64 = 2;
    let mut f = start().await;
    let all = [0, 1, 2];
    let leader = agreed_leader_of(&f.chans, &all, Duration::from_secs(10)).await;
    let observer = (leader + 1) % 3;
    let lease = grant(&f.chans[leader], TTL).await;
    let rev = put(&f.chans[leader], "kept", lease).await;
    let watch = DeleteWatch::start(f.chans[observer].clone(), "kept", rev + 1).await;
    let keeper = Keeper::start(lease, TTL, f.chans.clone(), leader);
    tokio::time::sleep(Duration::from_secs(1)).await;

    f.cluster.members[leader].kill9();
    let killed = Instant::now();
    // Three TTLs without the old leader, then the member comes back, then one more TTL.
    tokio::time::sleep(Duration::from_secs(3 * TTL as u64)).await;
    tokio::task::block_in_place(|| f.cluster.members[leader].spawn());
    agreed_leader_of(&f.chans, &all, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_secs(TTL as u64)).await;

    let ttl_now = time_to_live(&f.chans[observer], lease)
        .await
        .expect("TimeToLive");
    let present = exists(&f.chans[observer], "kept").await.expect("read");
    let (gone, gap) = keeper.stop().await;
    eprintln!(
        "kept-alive lease across kill -9 ({:?} observed): longest gap between keep-alive acks {gap:?}, TTL now {ttl_now}",
        killed.elapsed()
    );
    assert!(!gone, "a keep-alive answered that the lease is gone");
    assert_eq!(
        watch.deleted_at(),
        None,
        "the key was deleted\n{}",
        f.cluster.logs()
    );
    assert!(present, "the key is there");
    assert!(ttl_now > 0, "TimeToLive {ttl_now}");
}

/// (b) A lease renewed once just before kill -9 of the leader, then left alone: the new
/// leader must not expire it before `last ack + TTL` (what the client computes), and must
/// expire it eventually (within the TTL, the election timeout extension and a margin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_lease_expires_on_time_after_leader_kill9() {
    const TTL: i64 = 4;
    let mut f = start().await;
    let all = [0, 1, 2];
    let leader = agreed_leader_of(&f.chans, &all, Duration::from_secs(10)).await;
    let survivors = [(leader + 1) % 3, (leader + 2) % 3];
    let lease = grant(&f.chans[leader], TTL).await;
    let rev = put(&f.chans[leader], "abandoned", lease).await;
    let watch = DeleteWatch::start(f.chans[survivors[0]].clone(), "abandoned", rev + 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ttl = keep_alive_once(&f.chans[leader], lease)
        .await
        .expect("keep-alive");
    let acked = Instant::now();
    assert_eq!(ttl, TTL);
    let client_deadline = acked + Duration::from_secs(TTL as u64);
    f.cluster.members[leader].kill9();

    // Until just before the client's deadline the key must be readable (each read is
    // linearizable, so "present" proves the lease alive at some point after the read was
    // sent) and no DELETE may have arrived.
    let mut reads = 0;
    while Instant::now() + Duration::from_millis(300) < client_deadline {
        let sent = Instant::now();
        // An error is a read during the election (no leader yet): no observation.
        if let Ok(present) = exists(&f.chans[survivors[reads % 2]], "abandoned").await {
            assert!(
                present,
                "the key was gone {:?} before the client's deadline\n{}",
                client_deadline - sent,
                f.cluster.logs()
            );
        }
        reads += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(d) = watch.deleted_at() {
        assert!(
            d >= client_deadline,
            "DELETE {:?} before the client's deadline",
            client_deadline - d
        );
    }
    // It does expire: within TTL + election timeout extension + failover + tick margins.
    let bound = client_deadline + ELECTION_TIMEOUT * 4;
    while watch.deleted_at().is_none() {
        assert!(
            Instant::now() < bound,
            "the abandoned lease never expired\n{}",
            f.cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let d = watch.deleted_at().unwrap();
    eprintln!(
        "abandoned lease (TTL {TTL}s) after kill -9: expired {:?} after the client's deadline ({reads} reads before it saw it alive)",
        d - client_deadline
    );
    assert!(d >= client_deadline);
    let ttl = time_to_live(&f.chans[survivors[0]], lease)
        .await
        .expect("TimeToLive");
    assert_eq!(ttl, -1, "the lease is gone");
}

/// (c) etcd#15247: freeze the leader while a client keeps its lease alive; the client moves
/// to the new leader; after more than the TTL the old leader wakes up (with every deadline
/// in its stale clock passed). It must not revoke the lease: the key stays, TimeToLive stays
/// positive on every member, no DELETE event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn woken_old_leader_does_not_revoke_a_kept_alive_lease() {
    const TTL: i64 = 2;
    let f = start().await;
    let all = [0, 1, 2];
    let leader = agreed_leader_of(&f.chans, &all, Duration::from_secs(10)).await;
    let observer = (leader + 1) % 3;
    let lease = grant(&f.chans[leader], TTL).await;
    let rev = put(&f.chans[leader], "paused", lease).await;
    let watch = DeleteWatch::start(f.chans[observer].clone(), "paused", rev + 1).await;
    let keeper = Keeper::start(lease, TTL, f.chans.clone(), leader);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pid = f.cluster.members[leader].child.as_ref().unwrap().id() as i32;
    kill(pid, libc::SIGSTOP);
    let stopped = Instant::now();
    let others = [(leader + 1) % 3, (leader + 2) % 3];
    let new_leader = agreed_leader_of(&f.chans, &others, Duration::from_secs(10)).await;
    // Frozen well past the TTL (and the new leader's extension of it).
    tokio::time::sleep(Duration::from_secs(TTL as u64) * 2 + ELECTION_TIMEOUT).await;
    // A keep-alive a client sent to the frozen member meanwhile (queued in its socket) is
    // served right as it wakes, still believing it leads, with every deadline passed.
    let queued = queued_keep_alive(f.chans[leader].clone(), lease).await;
    kill(pid, libc::SIGCONT);
    let frozen = stopped.elapsed();
    let queued = queued.await.unwrap();
    // Give the woken member time to act on its stale clock, and to rejoin.
    tokio::time::sleep(Duration::from_secs(TTL as u64)).await;
    agreed_leader_of(&f.chans, &all, Duration::from_secs(10)).await;
    let mut ttls = Vec::new();
    for ch in &f.chans {
        ttls.push(time_to_live(ch, lease).await.expect("TimeToLive"));
    }
    let present = exists(&f.chans[leader], "paused")
        .await
        .expect("read via the old leader");
    let (gone, gap) = keeper.stop().await;
    eprintln!(
        "leader m{} frozen for {frozen:?} (new leader m{}): longest gap between keep-alive acks {gap:?}; TimeToLive on m1..m3 afterwards {ttls:?}",
        leader + 1,
        new_leader + 1
    );
    assert_eq!(
        watch.deleted_at(),
        None,
        "the woken old leader revoked the lease\n{}",
        f.cluster.logs()
    );
    assert!(!gone, "a keep-alive answered that the lease is gone");
    assert!(present, "the key is there");
    assert!(ttls.iter().all(|t| *t > 0), "TimeToLive {ttls:?}");
    eprintln!("keep-alive queued at the frozen old leader answered {queued:?}");
    assert!(
        !matches!(queued, Ok(0)),
        "the woken old leader told a client its live lease is gone"
    );
}

/// Sends a keep-alive to a frozen member and returns the pending answer (5 s deadline),
/// once the request has had time to reach the member's socket.
async fn queued_keep_alive(
    ch: Channel,
    lease: i64,
) -> tokio::task::JoinHandle<Result<i64, tonic::Status>> {
    let task = tokio::spawn(async move {
        let fut = async {
            let mut c = LeaseClient::new(ch);
            let req = futures::stream::iter([LeaseKeepAliveRequest { id: lease }]);
            let mut stream = c.lease_keep_alive(req).await?.into_inner();
            match stream.message().await? {
                Some(r) => Ok(r.ttl),
                None => Err(tonic::Status::unavailable("keep-alive stream ended")),
            }
        };
        tokio::time::timeout(Duration::from_secs(5), fut)
            .await
            .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("keep-alive")))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    task
}

/// The converse of (c): a lease nobody keeps alive, whose leader is frozen past its TTL,
/// is expired by the new leader. A keep-alive that reaches the old leader as it wakes (it
/// still believes it leads, and its clock still tracks the lease) must not renew it: the
/// client would believe it holds a lease the cluster has already expired, and act on a lock
/// that another client now holds (etcd#15247's other half; etcd confirms leadership before
/// renewing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn woken_old_leader_does_not_renew_an_expired_lease() {
    const TTL: i64 = 2;
    let f = start().await;
    let all = [0, 1, 2];
    let leader = agreed_leader_of(&f.chans, &all, Duration::from_secs(10)).await;
    let observer = (leader + 1) % 3;
    let lease = grant(&f.chans[leader], TTL).await;
    let rev = put(&f.chans[leader], "expired", lease).await;
    let watch = DeleteWatch::start(f.chans[observer].clone(), "expired", rev + 1).await;

    let pid = f.cluster.members[leader].child.as_ref().unwrap().id() as i32;
    kill(pid, libc::SIGSTOP);
    let stopped = Instant::now();
    let bound = Duration::from_secs(TTL as u64) + ELECTION_TIMEOUT * 5;
    while watch.deleted_at().is_none() {
        if stopped.elapsed() > bound {
            kill(pid, libc::SIGCONT);
            panic!(
                "the new leader never expired the lease\n{}",
                f.cluster.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let expired_after = watch.deleted_at().unwrap() - stopped;
    let queued = queued_keep_alive(f.chans[leader].clone(), lease).await;
    kill(pid, libc::SIGCONT);
    let answer = queued.await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    agreed_leader_of(&f.chans, &all, Duration::from_secs(10)).await;
    let mut ttls = Vec::new();
    for ch in &f.chans {
        ttls.push(time_to_live(ch, lease).await.expect("TimeToLive"));
    }
    eprintln!(
        "lease expired by the new leader {expired_after:?} after freezing the old one; keep-alive queued at the old leader answered {answer:?}; TimeToLive afterwards {ttls:?}"
    );
    assert!(
        !matches!(answer, Ok(ttl) if ttl > 0),
        "the woken old leader renewed a lease the cluster had expired: {answer:?}\n{}",
        f.cluster.logs()
    );
    assert!(ttls.iter().all(|t| *t == -1), "TimeToLive {ttls:?}");
}
