//! Locks, elections and fencing over real gRPC: a `baton_raft::Node` on a tempdir, the full
//! `baton_server` on a loopback port, and the generated tonic clients.
//!
//! Timing-sensitive tests use 1 s leases (the server is configured with a 1 s minimum TTL)
//! and assert bounds with generous slack; none sleeps longer than it must.

use std::time::{Duration, Instant};

use baton_proto::baton::v1 as bv1;
use baton_proto::etcdserverpb as epb;
use baton_proto::v3electionpb as elpb;
use baton_proto::v3lockpb as lpb;
use tonic::transport::Channel;
use tonic::Code;

use crate::common::{eventually, Server};

impl Server {
    fn v3lock(&self) -> lpb::lock_client::LockClient<Channel> {
        lpb::lock_client::LockClient::new(self.channel.clone())
    }

    fn election(&self) -> elpb::election_client::ElectionClient<Channel> {
        elpb::election_client::ElectionClient::new(self.channel.clone())
    }

    async fn get(&self, key: &[u8]) -> Option<epb::RangeResponse> {
        let r = epb::kv_client::KvClient::new(self.channel.clone())
            .range(epb::RangeRequest {
                key: key.to_vec(),
                ..Default::default()
            })
            .await
            .expect("range")
            .into_inner();
        (!r.kvs.is_empty()).then_some(r)
    }

    /// Every key under `prefix`.
    async fn get_prefix(&self, prefix: &[u8]) -> epb::RangeResponse {
        epb::kv_client::KvClient::new(self.channel.clone())
            .range(epb::RangeRequest {
                key: prefix.to_vec(),
                range_end: baton_core::prefix_end(prefix),
                ..Default::default()
            })
            .await
            .expect("range")
            .into_inner()
    }

    async fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.get(key).await.map(|r| r.kvs[0].value.clone())
    }
}

/// The lease a lock key `<prefix><lease in hex>` names.
fn lease_of_key(key: &[u8], prefix: &[u8]) -> i64 {
    let hex = key
        .strip_prefix(prefix)
        .expect("a key under the lock's prefix");
    i64::from_str_radix(std::str::from_utf8(hex).unwrap(), 16).unwrap()
}

fn acquire(name: &str, lease: i64) -> bv1::AcquireRequest {
    bv1::AcquireRequest {
        name: name.into(),
        lease,
        ..Default::default()
    }
}

/// The herd test: 200 waiters on one lock, drained one by one. Each waiter is woken only by
/// its predecessor's deletion, so the drain makes exactly 199 wake-ups, and the grants come
/// in create-revision (FIFO) order with strictly increasing fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_waiters_drain_with_199_wakeups_in_fifo_order() {
    const N: usize = 200;
    let s = Server::start().await;
    let lease = s.lease(60).await;
    let mut leases = Vec::new();
    for _ in 0..N {
        leases.push(s.lease(60).await);
    }
    let (tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    // 25 waiters per connection stays under HTTP/2's concurrent stream limit.
    for chunk in leases.chunks(25) {
        let channel = s.connection().await;
        for &l in chunk {
            let mut c = bv1::lock_client::LockClient::new(channel.clone());
            let tx = tx.clone();
            tokio::spawn(async move {
                let r = c.acquire(acquire("herd", l)).await.expect("acquire");
                let _ = tx.send(r.into_inner());
            });
        }
    }
    let _ = lease;
    eventually(Duration::from_secs(20), "199 waiters queued", || async {
        s.inspect("herd").await.waiter_count == (N - 1) as u64
    })
    .await;
    let queue = s.inspect("herd").await;
    let mut expected: Vec<Vec<u8>> = vec![queue.holder.expect("holder").key];
    expected.extend(queue.waiters.iter().map(|w| w.key.clone()));
    assert_eq!(expected.len(), N);
    let before = s.engine.stats();
    assert_eq!(before.wakeups, 0, "nobody woken while the holder holds");

    let mut locks = s.locks();
    let mut last_token = 0;
    let mut order = Vec::new();
    for _ in 0..N {
        let g = tokio::time::timeout(Duration::from_secs(10), granted.recv())
            .await
            .expect("next grant in time")
            .expect("grant");
        assert!(g.fencing_token > last_token, "tokens strictly increase");
        last_token = g.fencing_token;
        // Exactly one holder: the head of the queue is the one just granted.
        let head = s.inspect("herd").await.holder.expect("holder");
        assert_eq!(head.key, g.key);
        assert_eq!(head.create_revision, g.fencing_token);
        order.push(g.key.clone());
        locks
            .release(bv1::ReleaseRequest {
                key: g.key,
                fencing_token: g.fencing_token,
            })
            .await
            .expect("release");
    }
    assert_eq!(order, expected, "grants in create-revision order");
    let stats = s.engine.stats();
    assert_eq!(
        stats.wakeups,
        (N - 1) as u64,
        "exactly one wake-up per handoff"
    );
    assert_eq!(stats.grants, N as u64);
    eventually(Duration::from_secs(2), "watches released", || async {
        s.node.deletion_watch_count() == 0 && s.engine.stats().waiting == 0
    })
    .await;
    s.stop().await;
}

/// etcd's lock and election services with `lease = 0` open a 60 s lease of the call's own
/// (etcd's server makes a `concurrency.Session`), named by the answer's key; Baton's own
/// `baton.v1.Lock` refuses it. A call that is abandoned revokes the lease it opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_zero_opens_a_call_lease_on_etcds_apis_and_unknown_leases_are_refused() {
    let s = Server::start().await;
    let locked = s
        .v3lock()
        .lock(lpb::LockRequest {
            name: b"l".to_vec(),
            lease: 0,
        })
        .await
        .expect("etcd's lock with lease 0")
        .into_inner();
    let lease = lease_of_key(&locked.key, b"l/");
    assert!(
        s.node
            .read(|sm| sm.lease_ids().contains(&baton_core::LeaseId(lease))),
        "the lock's key names a live lease"
    );
    let ttl = s
        .node
        .lease_remaining_s(baton_core::LeaseId(lease))
        .unwrap();
    assert!((55..=60).contains(&ttl), "a 60 s lease, {ttl} s left");

    let campaign = s
        .election()
        .campaign(elpb::CampaignRequest {
            name: b"e".to_vec(),
            lease: 0,
            value: b"v".to_vec(),
        })
        .await
        .expect("etcd's campaign with lease 0")
        .into_inner();
    let leader = campaign.leader.unwrap();
    assert_ne!(leader.lease, 0);
    assert_eq!(lease_of_key(&leader.key, b"e/"), leader.lease);

    // A second campaign waits behind the leader; abandoned, its own lease is revoked and
    // its key deleted.
    let leases_before = s.node.read(|sm| sm.lease_ids().len());
    let waiting = tokio::time::timeout(
        Duration::from_millis(500),
        s.election().campaign(elpb::CampaignRequest {
            name: b"e".to_vec(),
            lease: 0,
            value: b"w".to_vec(),
        }),
    )
    .await;
    assert!(waiting.is_err(), "the second campaign waits");
    eventually(
        Duration::from_secs(5),
        "the abandoned call's lease revoked",
        || async { s.node.read(|sm| sm.lease_ids().len()) == leases_before },
    )
    .await;
    let under = s.get_prefix(b"e/").await;
    assert_eq!(under.count, 1, "only the leader's key: {under:?}");

    // Baton's own lock API refuses lease 0.
    let e = s
        .locks()
        .acquire(acquire("l2", 0))
        .await
        .expect_err("lease 0");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("lease is required"), "{}", e.message());
    // An unknown lease: etcd's own error.
    let e = s
        .v3lock()
        .lock(lpb::LockRequest {
            name: b"l".to_vec(),
            lease: 0x1234,
        })
        .await
        .expect_err("unknown lease");
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(e.message(), "etcdserver: requested lease not found");
    assert!(s.get(b"l/1234").await.is_none());
    // An empty name.
    let lease = s.lease(60).await;
    let e = s
        .locks()
        .acquire(acquire("", lease))
        .await
        .expect_err("no name");
    assert_eq!(e.code(), Code::InvalidArgument);
    s.stop().await;
}

/// etcd's v3lock: the key layout, locking twice with one lease is a no-op returning the same
/// key, Unlock is a delete and hands the lock on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3lock_layout_relock_and_unlock() {
    let s = Server::start().await;
    let (a, b) = (s.lease(60).await, s.lease(60).await);
    let mut c = s.v3lock();
    let key = c
        .lock(lpb::LockRequest {
            name: b"v3".to_vec(),
            lease: a,
        })
        .await
        .expect("lock")
        .into_inner()
        .key;
    assert_eq!(key, format!("v3/{a:x}").into_bytes());
    let again = c
        .lock(lpb::LockRequest {
            name: b"v3".to_vec(),
            lease: a,
        })
        .await
        .expect("relock")
        .into_inner();
    assert_eq!(again.key, key);
    let mut other = s.v3lock();
    let waiter = tokio::spawn(async move {
        other
            .lock(lpb::LockRequest {
                name: b"v3".to_vec(),
                lease: b,
            })
            .await
    });
    eventually(Duration::from_secs(5), "b queued", || async {
        s.inspect("v3").await.waiter_count == 1
    })
    .await;
    c.unlock(lpb::UnlockRequest { key: key.clone() })
        .await
        .expect("unlock");
    let got = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("b granted after the unlock")
        .expect("task")
        .expect("lock b")
        .into_inner();
    assert_eq!(got.key, format!("v3/{b:x}").into_bytes());
    assert!(got.header.expect("header").revision > 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_only_fails_fast_and_leaves_no_key() {
    let s = Server::start().await;
    let (a, b) = (s.lease(60).await, s.lease(60).await);
    let held = s
        .locks()
        .acquire(acquire("t", a))
        .await
        .expect("a")
        .into_inner();
    let e = s
        .locks()
        .acquire(bv1::AcquireRequest {
            try_only: true,
            ..acquire("t", b)
        })
        .await
        .expect_err("held");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("baton: lock is held"),
        "{}",
        e.message()
    );
    assert!(
        e.message()
            .contains(&String::from_utf8_lossy(&held.key).to_string())
            && e.message().contains(&held.fencing_token.to_string()),
        "names the holder: {}",
        e.message()
    );
    assert!(s.get(format!("t/{b:x}").as_bytes()).await.is_none());
    assert_eq!(s.inspect("t").await.waiter_count, 0);
    // Free: try_only takes it.
    s.locks()
        .release(bv1::ReleaseRequest {
            key: held.key,
            fencing_token: held.fencing_token,
        })
        .await
        .expect("release");
    let got = s
        .locks()
        .acquire(bv1::AcquireRequest {
            try_only: true,
            ..acquire("t", b)
        })
        .await
        .expect("free lock")
        .into_inner();
    assert!(got.fencing_token > held.fencing_token);
    s.stop().await;
}

/// A timed-out waiter's key is deleted before the error is returned, and the waiter behind
/// it moves up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_deletes_the_waiter_key_and_the_queue_moves_on() {
    let s = Server::start().await;
    let (a, b, c) = (s.lease(60).await, s.lease(60).await, s.lease(60).await);
    let held = s
        .locks()
        .acquire(acquire("to", a))
        .await
        .expect("a")
        .into_inner();
    let mut lb = s.locks();
    let b_task = tokio::spawn(async move {
        let t0 = Instant::now();
        let r = lb
            .acquire(bv1::AcquireRequest {
                timeout_ms: 400,
                ..acquire("to", b)
            })
            .await;
        (r, t0.elapsed())
    });
    eventually(Duration::from_secs(5), "b queued", || async {
        s.inspect("to").await.waiter_count == 1
    })
    .await;
    let mut lc = s.locks();
    let c_task = tokio::spawn(async move { lc.acquire(acquire("to", c)).await });
    eventually(Duration::from_secs(5), "c queued", || async {
        s.inspect("to").await.waiter_count == 2
    })
    .await;
    let (r, took) = b_task.await.expect("b task");
    let e = r.expect_err("b times out");
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(
        took >= Duration::from_millis(350) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(
        s.get(format!("to/{b:x}").as_bytes()).await.is_none(),
        "deleted before the answer"
    );
    let q = s.inspect("to").await;
    assert_eq!(q.waiter_count, 1);
    assert_eq!(q.waiters[0].key, format!("to/{c:x}").into_bytes());
    s.locks()
        .release(bv1::ReleaseRequest {
            key: held.key,
            fencing_token: held.fencing_token,
        })
        .await
        .expect("release");
    let got = tokio::time::timeout(Duration::from_secs(2), c_task)
        .await
        .expect("c granted")
        .expect("task")
        .expect("c")
        .into_inner();
    assert_eq!(got.key, format!("to/{c:x}").into_bytes());
    s.stop().await;
}

/// A client that goes away while waiting (tonic drops the handler) leaves no key behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiter_key_is_deleted() {
    let s = Server::start().await;
    let (a, b) = (s.lease(60).await, s.lease(60).await);
    s.v3lock()
        .lock(lpb::LockRequest {
            name: b"c".to_vec(),
            lease: a,
        })
        .await
        .expect("a");
    let mut other = lpb::lock_client::LockClient::new(s.connection().await);
    let waiter = tokio::spawn(async move {
        other
            .lock(lpb::LockRequest {
                name: b"c".to_vec(),
                lease: b,
            })
            .await
    });
    eventually(Duration::from_secs(5), "b queued", || async {
        s.inspect("c").await.waiter_count == 1
    })
    .await;
    waiter.abort();
    let key = format!("c/{b:x}").into_bytes();
    eventually(Duration::from_secs(5), "b's key deleted", || async {
        s.get(&key).await.is_none()
    })
    .await;
    assert_eq!(s.inspect("c").await.waiter_count, 0);
    eventually(Duration::from_secs(2), "no acquisition left", || async {
        s.engine.stats().waiting == 0 && s.node.deletion_watch_count() == 0
    })
    .await;
    s.stop().await;
}

/// A queued waiter whose lease expires leaves the queue at once (its own key's deletion wakes
/// it) and gets an error, not the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiter_whose_lease_expires_is_removed() {
    let s = Server::start().await;
    let (a, short) = (s.lease(60).await, s.lease(1).await);
    s.locks().acquire(acquire("x", a)).await.expect("a");
    let t0 = Instant::now();
    let e = tokio::time::timeout(
        Duration::from_secs(5),
        s.locks().acquire(acquire("x", short)),
    )
    .await
    .expect("the waiter gives up by itself")
    .expect_err("never granted");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("key was deleted"), "{}", e.message());
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(s.inspect("x").await.waiter_count, 0);
    s.stop().await;
}

/// etcd#11456: a waiter whose lease is dead by the time the holder lets go must not be told
/// it holds the lock. The holder releases right after the waiter's deadline, racing the
/// expiry: whichever check catches it (the lease re-check before the grant, or the deletion
/// of its key), the waiter must fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_dead_lease_is_never_granted() {
    let s = Server::start().await;
    let a = s.lease(60).await;
    let held = s
        .locks()
        .acquire(acquire("pg", a))
        .await
        .expect("a")
        .into_inner();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let short = s.lease(1).await;
        let mut c = s.locks();
        waiters.push(tokio::spawn(async move {
            c.acquire(acquire("pg", short)).await
        }));
    }
    eventually(Duration::from_secs(5), "3 waiters", || async {
        s.inspect("pg").await.waiter_count == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1010)).await;
    s.locks()
        .release(bv1::ReleaseRequest {
            key: held.key,
            fencing_token: held.fencing_token,
        })
        .await
        .expect("release");
    for w in waiters {
        let r = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("answer")
            .expect("task");
        let e = r.expect_err("a dead lease is never granted the lock");
        assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    }
    s.stop().await;
}

/// Lock-delay: after the holder's lease EXPIRES the lock is not granted again before the
/// delay; after a clean release it is granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_after_expiry_but_not_after_release() {
    const DELAY_MS: i64 = 1500;
    let s = Server::start().await;
    // Before the grant: the 1 s lease counts from its grant, so a start taken after it
    // could be up to that call's duration late (a CI run saw the grant 0.1 ms short of it).
    let t0 = Instant::now();
    let (short, b) = (s.lease(1).await, s.lease(60).await);
    s.locks()
        .acquire(bv1::AcquireRequest {
            lock_delay_ms: DELAY_MS,
            ..acquire("d", short)
        })
        .await
        .expect("a");
    let mut lb = s.locks();
    let b_task = tokio::spawn(async move {
        let r = lb.acquire(acquire("d", b)).await;
        (r, Instant::now())
    });
    // The holder's key goes with its lease (~1 s)...
    let holder_key = format!("d/{short:x}").into_bytes();
    eventually(Duration::from_secs(4), "holder expired", || async {
        s.get(&holder_key).await.is_none()
    })
    .await;
    let expired_at = Instant::now();
    let q = s.inspect("d").await;
    assert_eq!(q.lock_delay_ms, DELAY_MS);
    assert!(q.delayed_until_ms > 0, "delay recorded");
    // ...try_only is refused during the delay...
    let c = s.lease(60).await;
    let e = s
        .locks()
        .acquire(bv1::AcquireRequest {
            try_only: true,
            ..acquire("d", c)
        })
        .await
        .expect_err("delayed or held");
    assert_eq!(e.code(), Code::FailedPrecondition);
    // ...and B is granted no earlier than the delay after the expiry.
    let (r, granted_at) = tokio::time::timeout(Duration::from_secs(5), b_task)
        .await
        .expect("b granted eventually")
        .expect("task");
    let got = r.expect("b").into_inner();
    let after = granted_at - expired_at;
    // Less 5 ms: the leader stamps time in whole milliseconds (a granted lock without the
    // delay would come ~1.5 s earlier).
    assert!(
        granted_at - t0 >= Duration::from_millis(1000 + DELAY_MS as u64 - 5),
        "granted {:?} after start",
        granted_at - t0
    );
    assert!(
        after >= Duration::from_millis(DELAY_MS as u64 - 150),
        "granted {after:?} after the expiry was seen"
    );
    assert!(s.engine.stats().delay_refusals >= 1);

    // A clean release: the next waiter is granted at once.
    let c_lease = s.lease(60).await;
    let mut lc = s.locks();
    let c_task = tokio::spawn(async move {
        let r = lc.acquire(acquire("d", c_lease)).await;
        (r, Instant::now())
    });
    eventually(Duration::from_secs(5), "c queued", || async {
        s.inspect("d").await.waiter_count == 1
    })
    .await;
    let released_at = Instant::now();
    s.locks()
        .release(bv1::ReleaseRequest {
            key: got.key,
            fencing_token: got.fencing_token,
        })
        .await
        .expect("release");
    let (r, granted_at) = c_task.await.expect("task");
    r.expect("c");
    assert!(
        granted_at - released_at < Duration::from_millis(500),
        "{:?}",
        granted_at - released_at
    );
    s.stop().await;
}

/// Tokens grow across holders; a stale holder's fenced write and release are refused; a
/// waiter's own key and token are not enough either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_and_stale_holders_are_refused() {
    let s = Server::start().await;
    let (a, b, c) = (s.lease(60).await, s.lease(60).await, s.lease(60).await);
    let mut l = s.locks();
    let first = l.acquire(acquire("f", a)).await.expect("a").into_inner();
    let put = |v: &str| epb::PutRequest {
        key: b"stock".to_vec(),
        value: v.into(),
        ..Default::default()
    };
    l.fenced_put(bv1::FencedPutRequest {
        lock_key: first.key.clone(),
        fencing_token: first.fencing_token,
        put: Some(put("10")),
    })
    .await
    .expect("holder writes");
    // Losing the lock (here: an operator force-release stands in for a lost lease).
    l.force_release(bv1::ForceReleaseRequest {
        name: b"f".to_vec(),
        reason: "test".into(),
        fencing_token: 0,
    })
    .await
    .expect("force");
    let second = l.acquire(acquire("f", b)).await.expect("b").into_inner();
    assert!(second.fencing_token > first.fencing_token);
    let e = l
        .fenced_put(bv1::FencedPutRequest {
            lock_key: first.key.clone(),
            fencing_token: first.fencing_token,
            put: Some(put("9")),
        })
        .await
        .expect_err("stale write");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(e.message(), "baton: fencing token rejected");
    // A waiter behind B, with its own (valid) key and token: not the holder.
    let mut lc = s.locks();
    let c_task = tokio::spawn(async move { lc.acquire(acquire("f", c)).await });
    let ckey = format!("f/{c:x}").into_bytes();
    eventually(Duration::from_secs(5), "c queued", || async {
        s.get(&ckey).await.is_some()
    })
    .await;
    let ctoken = s.get(&ckey).await.expect("c key").kvs[0].create_revision;
    let e = l
        .fenced_put(bv1::FencedPutRequest {
            lock_key: ckey.clone(),
            fencing_token: ctoken,
            put: Some(put("7")),
        })
        .await
        .expect_err("a waiter is not the holder");
    assert_eq!(e.code(), Code::FailedPrecondition);
    l.fenced_put(bv1::FencedPutRequest {
        lock_key: second.key.clone(),
        fencing_token: second.fencing_token,
        put: Some(put("8")),
    })
    .await
    .expect("the holder writes");
    assert_eq!(s.value(b"stock").await, Some(b"8".to_vec()));
    // Release with the wrong token, or by the old holder, is refused.
    let e = l
        .release(bv1::ReleaseRequest {
            key: second.key.clone(),
            fencing_token: first.fencing_token,
        })
        .await
        .expect_err("wrong token");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(e.message(), "baton: not the holder");
    let e = l
        .release(bv1::ReleaseRequest {
            key: first.key.clone(),
            fencing_token: first.fencing_token,
        })
        .await
        .expect_err("old holder");
    assert_eq!(e.code(), Code::FailedPrecondition);
    l.release(bv1::ReleaseRequest {
        key: second.key.clone(),
        fencing_token: second.fencing_token,
    })
    .await
    .expect("release");
    let third = c_task.await.expect("task").expect("c").into_inner();
    assert_eq!(third.fencing_token, ctoken);
    assert!(third.fencing_token > second.fencing_token);
    assert_eq!(s.engine.stats().fencing_rejections, 2);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_check_rejects_lower_tokens_only() {
    let s = Server::start().await;
    let mut f = bv1::fence_client::FenceClient::new(s.channel.clone());
    let check = |token: i64| {
        let req = bv1::FenceCheckRequest {
            resource: b"db".to_vec(),
            fencing_token: token,
        };
        let mut f = f.clone();
        async move { f.check(req).await.map(|r| r.into_inner()) }
    };
    let r = check(5).await.expect("first");
    assert!(r.accepted && r.highest_token == 5);
    let r = check(4).await.expect("lower");
    assert!(!r.accepted && r.highest_token == 5, "lower is rejected");
    let r = check(5).await.expect("equal");
    assert!(r.accepted && r.highest_token == 5, "equal is accepted");
    let r = check(9).await.expect("higher");
    assert!(r.accepted && r.highest_token == 9);
    let r = check(5).await.expect("now lower");
    assert!(!r.accepted && r.highest_token == 9);
    let e = check(0).await.expect_err("token 0");
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = f
        .check(bv1::FenceCheckRequest {
            resource: Vec::new(),
            fencing_token: 3,
        })
        .await
        .expect_err("no resource");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(s.engine.stats().fencing_rejections, 2);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_is_sorted_and_all_or_nothing() {
    let s = Server::start().await;
    let (a, b) = (s.lease(60).await, s.lease(60).await);
    let mut l = s.locks();
    let many = l
        .acquire_many(bv1::AcquireManyRequest {
            names: vec![
                b"m/c".to_vec(),
                b"m/a".to_vec(),
                b"m/b".to_vec(),
                b"m/a".to_vec(),
            ],
            lease: a,
            ..Default::default()
        })
        .await
        .expect("acquire many")
        .into_inner();
    let keys: Vec<Vec<u8>> = many.locks.iter().map(|h| h.key.clone()).collect();
    let expected: Vec<Vec<u8>> = ["m/a", "m/b", "m/c"]
        .iter()
        .map(|n| format!("{n}/{a:x}").into_bytes())
        .collect();
    assert_eq!(keys, expected, "distinct names, sorted");
    let tokens: Vec<i64> = many.locks.iter().map(|h| h.fencing_token).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "taken in order");
    // Another client holds m/b: an all-or-nothing try fails and keeps nothing.
    for h in &many.locks {
        if h.key.starts_with(b"m/a") || h.key.starts_with(b"m/c") {
            l.release(bv1::ReleaseRequest {
                key: h.key.clone(),
                fencing_token: h.fencing_token,
            })
            .await
            .expect("release");
        }
    }
    let e = l
        .acquire_many(bv1::AcquireManyRequest {
            names: vec![b"m/a".to_vec(), b"m/b".to_vec(), b"m/c".to_vec()],
            lease: b,
            try_only: true,
            ..Default::default()
        })
        .await
        .expect_err("m/b is held");
    assert_eq!(e.code(), Code::FailedPrecondition);
    for n in ["m/a", "m/c"] {
        let q = s.inspect(n).await;
        assert!(q.holder.is_none(), "{n} released after the failure");
        assert_eq!(q.waiter_count, 0);
    }
    let q = s.inspect("m/b").await;
    assert_eq!(q.holder.expect("holder").lease, a);
    assert_eq!(q.waiter_count, 0, "the failed try left no waiter on m/b");
    let e = l
        .acquire_many(bv1::AcquireManyRequest {
            names: Vec::new(),
            lease: b,
            ..Default::default()
        })
        .await
        .expect_err("no names");
    assert_eq!(e.code(), Code::InvalidArgument);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_is_recorded_and_visible_in_inspect() {
    let s = Server::start().await;
    let (a, b) = (s.lease(60).await, s.lease(60).await);
    let mut l = s.locks();
    let held = l.acquire(acquire("fr", a)).await.expect("a").into_inner();
    let mut lb = s.locks();
    let b_task = tokio::spawn(async move { lb.acquire(acquire("fr", b)).await });
    eventually(Duration::from_secs(5), "b queued", || async {
        s.inspect("fr").await.waiter_count == 1
    })
    .await;
    let q = s.inspect("fr").await;
    let holder = q.holder.expect("holder");
    assert_eq!(holder.key, held.key);
    assert_eq!(holder.create_revision, held.fencing_token);
    assert!(holder.lease_remaining_s > 50 && holder.lease_remaining_s <= 60);
    let force = |reason: &str, token: i64| bv1::ForceReleaseRequest {
        name: b"fr".to_vec(),
        reason: reason.into(),
        fencing_token: token,
    };
    let e = l.force_release(force("", 0)).await.expect_err("no reason");
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = l
        .force_release(force("stuck", held.fencing_token + 1000))
        .await
        .expect_err("wrong token");
    assert_eq!(e.code(), Code::FailedPrecondition);
    let released = l
        .force_release(force("holder wedged in GC", held.fencing_token))
        .await
        .expect("force")
        .into_inner()
        .released
        .expect("released");
    assert_eq!(released.key, held.key);
    let got = tokio::time::timeout(Duration::from_secs(2), b_task)
        .await
        .expect("b granted")
        .expect("task")
        .expect("b")
        .into_inner();
    let q = s.inspect("fr").await;
    assert_eq!(q.holder.expect("holder").key, got.key);
    assert_eq!(q.force_releases.len(), 1);
    let rec = &q.force_releases[0];
    assert_eq!(rec.key, held.key);
    assert_eq!(rec.fencing_token, held.fencing_token);
    assert_eq!(rec.reason, "holder wedged in GC");
    assert!(
        rec.at_ms > 1_600_000_000_000,
        "leader wall-clock ms: {}",
        rec.at_ms
    );
    // The old holder finds out when it tries to release.
    let e = l
        .release(bv1::ReleaseRequest {
            key: held.key,
            fencing_token: held.fencing_token,
        })
        .await
        .expect_err("not the holder any more");
    assert_eq!(e.code(), Code::FailedPrecondition);
    s.stop().await;
}

async fn next_leader(
    o: &mut tonic::Streaming<elpb::LeaderResponse>,
) -> baton_proto::mvccpb::KeyValue {
    tokio::time::timeout(Duration::from_secs(3), o.message())
        .await
        .expect("observe event in time")
        .expect("stream ok")
        .expect("stream open")
        .kv
        .expect("kv")
}

/// Campaign, Leader, Proclaim, Observe and Resign, and the handover to the next candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_campaign_proclaim_observe_resign_handover() {
    let s = Server::start().await;
    let (a, b) = (s.lease(60).await, s.lease(60).await);
    let mut el = s.election();
    let e = el
        .leader(elpb::LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .expect_err("nobody yet");
    assert_eq!(e.code(), Code::Unknown);
    assert_eq!(e.message(), "election: no leader");
    let la = el
        .campaign(elpb::CampaignRequest {
            name: b"el".to_vec(),
            lease: a,
            value: b"alpha".to_vec(),
        })
        .await
        .expect("campaign a")
        .into_inner()
        .leader
        .expect("leader key");
    assert_eq!(la.key, format!("el/{a:x}").into_bytes());
    assert_eq!(la.lease, a);
    let mut observe = el
        .observe(elpb::LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .expect("observe")
        .into_inner();
    let kv = next_leader(&mut observe).await;
    assert_eq!(
        (kv.key.clone(), kv.value.clone()),
        (la.key.clone(), b"alpha".to_vec())
    );
    // B campaigns and waits.
    let mut elb = elpb::election_client::ElectionClient::new(s.connection().await);
    let b_task = tokio::spawn(async move {
        elb.campaign(elpb::CampaignRequest {
            name: b"el".to_vec(),
            lease: b,
            value: b"beta".to_vec(),
        })
        .await
    });
    eventually(Duration::from_secs(5), "b queued", || async {
        s.inspect("el").await.waiter_count == 1
    })
    .await;
    el.proclaim(elpb::ProclaimRequest {
        leader: Some(la.clone()),
        value: b"alpha-2".to_vec(),
    })
    .await
    .expect("proclaim");
    let kv = next_leader(&mut observe).await;
    assert_eq!(kv.value, b"alpha-2".to_vec());
    let leader = el
        .leader(elpb::LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .expect("leader")
        .into_inner()
        .kv
        .expect("kv");
    assert_eq!(leader.value, b"alpha-2".to_vec());
    let e = el
        .proclaim(elpb::ProclaimRequest {
            leader: Some(elpb::LeaderKey {
                rev: la.rev + 1000,
                ..la.clone()
            }),
            value: b"x".to_vec(),
        })
        .await
        .expect_err("wrong rev");
    assert_eq!(e.code(), Code::Unknown);
    assert_eq!(e.message(), "election: not leader");
    let e = el
        .proclaim(elpb::ProclaimRequest {
            leader: None,
            value: b"x".to_vec(),
        })
        .await
        .expect_err("no leader field");
    assert_eq!(e.message(), "\"leader\" field must be provided");
    // Resign hands over to B.
    el.resign(elpb::ResignRequest {
        leader: Some(la.clone()),
    })
    .await
    .expect("resign");
    let lb = tokio::time::timeout(Duration::from_secs(2), b_task)
        .await
        .expect("b elected")
        .expect("task")
        .expect("campaign b")
        .into_inner()
        .leader
        .expect("leader key");
    assert!(lb.rev > la.rev);
    let kv = next_leader(&mut observe).await;
    assert_eq!((kv.key, kv.value), (lb.key.clone(), b"beta".to_vec()));
    // Resign with a stale key succeeds and changes nothing (etcd).
    el.resign(elpb::ResignRequest { leader: Some(la) })
        .await
        .expect("stale resign is a no-op");
    let leader = el
        .leader(elpb::LeaderRequest {
            name: b"el".to_vec(),
        })
        .await
        .expect("leader")
        .into_inner()
        .kv
        .expect("kv");
    assert_eq!(leader.key, lb.key);
    s.stop().await;
}
