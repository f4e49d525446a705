//! Every recipe, run with the same code against Baton (`baton.v1`), etcd 3.4, and Baton
//! driven through etcd's API only (see `common::Target`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{max_overlap, session, unique, Target};
use baton_client::{
    Barrier, DoubleBarrier, Election, Error, FencingToken, GetOptions, LockOptions, Mutex,
    PutOptions, Queue, RwLock, Semaphore,
};
use futures::StreamExt;

for_each_target!(
    mutex_exclusion,
    try_lock,
    acquire_timeout_and_cancel,
    acquire_survives_a_broken_connection,
    lock_many_sorted_release_all,
    fenced_put_and_release,
    key_deleted_is_noticed,
    lock_delay_and_fence_gate,
    semaphore_3_of_20,
    rwlock_writer_alone,
    election_handover,
    barrier,
    double_barrier,
    queue_fifo,
);

type Intervals = Arc<std::sync::Mutex<Vec<(Instant, Instant)>>>;

/// Keys under `name/`.
async fn queue_keys(t: Target, name: &str) -> Vec<String> {
    let c = t.client().await;
    c.get(
        format!("{name}/"),
        GetOptions::new().with_prefix().with_keys_only(),
    )
    .await
    .unwrap()
    .kvs
    .into_iter()
    .map(|kv| String::from_utf8(kv.key).unwrap())
    .collect()
}

/// 5 contenders × 4 rounds: no two hold at once (recorded intervals never overlap) and
/// tokens grow with every grant.
async fn mutex_exclusion(t: Target) {
    let name = unique("excl");
    let held: Intervals = Default::default();
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let client = t.client().await;
        let (name, held, tokens) = (name.clone(), held.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let s = session(&client).await;
            let locks = Mutex::new(&s);
            for _ in 0..4 {
                let g = locks.acquire(name.as_str()).await.unwrap();
                let start = Instant::now();
                tokens.lock().unwrap().push((start, g.fencing_token()));
                tokio::time::sleep(Duration::from_millis(5)).await;
                let end = Instant::now();
                held.lock().unwrap().push((start, end));
                g.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let held = held.lock().unwrap().clone();
    assert_eq!(held.len(), 20);
    assert_eq!(max_overlap(&held), 1, "two holders at once: {held:?}");
    let mut tokens = tokens.lock().unwrap().clone();
    tokens.sort();
    assert!(
        tokens.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens must grow with each grant: {tokens:?}"
    );
    assert!(queue_keys(t, &name).await.is_empty());
}

async fn try_lock(t: Target) {
    let name = unique("try");
    let client = t.client().await;
    let (a, b) = (session(&client).await, session(&client).await);
    let held = Mutex::new(&a).try_lock(name.as_str()).await.unwrap();
    match Mutex::new(&b).try_lock(name.as_str()).await {
        Err(Error::WouldBlock { holder }) => {
            assert_eq!(
                holder,
                String::from_utf8_lossy(held.key()),
                "names the holder"
            )
        }
        other => panic!("expected WouldBlock, got {other:?}"),
    }
    // The refused attempt left no key behind.
    assert_eq!(
        queue_keys(t, &name).await,
        vec![String::from_utf8_lossy(held.key()).into_owned()]
    );
    let first = held.fencing_token();
    held.release().await.unwrap();
    let g = Mutex::new(&b).try_lock(name.as_str()).await.unwrap();
    assert!(g.fencing_token() > first);
    g.release().await.unwrap();
}

async fn acquire_timeout_and_cancel(t: Target) {
    let name = unique("timeout");
    let client = t.client().await;
    let (a, b) = (session(&client).await, session(&client).await);
    let held = Mutex::new(&a).acquire(name.as_str()).await.unwrap();

    let started = Instant::now();
    let r = Mutex::new(&b)
        .acquire_with(
            name.as_str(),
            LockOptions::new().with_timeout(Duration::from_millis(300)),
        )
        .await;
    let took = started.elapsed();
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    assert!(took >= Duration::from_millis(290), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(
        queue_keys(t, &name).await.len(),
        1,
        "the waiter key is gone"
    );

    // Cancellation: drop the acquiring future while it waits.
    let waiting = tokio::time::timeout(
        Duration::from_millis(200),
        Mutex::new(&b).acquire(name.as_str()),
    )
    .await;
    assert!(waiting.is_err(), "still held, so it must have been waiting");
    let deadline = Instant::now() + Duration::from_secs(3);
    while queue_keys(t, &name).await.len() != 1 {
        assert!(
            Instant::now() < deadline,
            "cancelled waiter's key not deleted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
}

/// The waiting acquirer's connection breaks: it retries (jittered backoff) and still gets
/// the lock once the holder releases.
async fn acquire_survives_a_broken_connection(t: Target) {
    let name = unique("retry");
    let client = t.client().await;
    let a = session(&client).await;
    let held = Mutex::new(&a).acquire(name.as_str()).await.unwrap();

    let proxy = baton_client::testing::Proxy::start(t.server().endpoint()).await;
    let via_proxy = baton_client::Client::connect(t.config(vec![proxy.endpoint()]))
        .await
        .unwrap();
    let b = session(&via_proxy).await;
    let waiting = tokio::spawn({
        let name = name.clone();
        async move { Mutex::new(&b).acquire(name.as_str()).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(300)).await;
    if waiting.is_finished() {
        panic!("acquire ended: {:?}", waiting.await);
    }
    let token_a = held.fencing_token();
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("acquired after the retry")
        .unwrap()
        .unwrap();
    assert!(g.fencing_token() > token_a);
    g.release().await.unwrap();
}

async fn lock_many_sorted_release_all(t: Target) {
    let (x, y, z) = (unique("many-x"), unique("many-y"), unique("many-z"));
    let client = t.client().await;
    let (a, b, c) = (
        session(&client).await,
        session(&client).await,
        session(&client).await,
    );
    let guards = Mutex::new(&a)
        .lock_many([y.as_str(), x.as_str()], LockOptions::new())
        .await
        .unwrap();
    let names: Vec<&[u8]> = guards.iter().map(|g| g.name()).collect();
    assert_eq!(names, vec![x.as_bytes(), y.as_bytes()], "sorted order");

    // B wants y and z; y is held, so it times out — and must not keep z.
    let r = Mutex::new(&b)
        .lock_many(
            [z.as_str(), y.as_str()],
            LockOptions::new().with_timeout(Duration::from_millis(300)),
        )
        .await;
    assert!(matches!(r, Err(Error::Timeout(_))), "{r:?}");
    let zg = Mutex::new(&c).try_lock(z.as_str()).await.unwrap();
    zg.release().await.unwrap();
    for g in guards {
        g.release().await.unwrap();
    }
}

async fn fenced_put_and_release(t: Target) {
    let name = unique("fenced");
    let data = unique("fenced-data");
    let client = t.client().await;
    let (a, b) = (session(&client).await, session(&client).await);
    let ga = Mutex::new(&a).acquire(name.as_str()).await.unwrap();
    ga.fenced_put(data.as_str(), "a", PutOptions::new())
        .await
        .unwrap();
    let lost = ga.lost();

    // B queues; A's lease is revoked from outside (as if it expired): B gets the lock.
    let b_locks = Mutex::new(&b);
    let name_b = name.clone();
    let gb = tokio::spawn(async move { b_locks.acquire(name_b.as_str()).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    client.lease_revoke(a.lease()).await.unwrap();
    let gb = gb.await.unwrap().unwrap();
    assert!(gb.fencing_token() > ga.fencing_token());
    let reason = tokio::time::timeout(Duration::from_secs(5), lost)
        .await
        .expect("A notices the loss");
    assert!(
        matches!(
            reason,
            baton_client::LostReason::LeaseExpired | baton_client::LostReason::KeyDeleted
        ),
        "{reason:?}"
    );

    // A's late write is refused; B's goes through.
    let late = ga
        .fenced_put(data.as_str(), "late", PutOptions::new())
        .await;
    assert!(
        matches!(late, Err(Error::FencingTokenRejected { .. })),
        "{late:?}"
    );
    gb.fenced_put(data.as_str(), "b", PutOptions::new())
        .await
        .unwrap();
    let v = client.get(data.as_str(), GetOptions::new()).await.unwrap();
    assert_eq!(v.kvs[0].value, b"b");

    // Release compares the token: A's stale guard cannot release B's lock.
    assert!(matches!(ga.release().await, Err(Error::NotHolder)));
    let token_b = gb.fencing_token();
    gb.release().await.unwrap();
    let gc = Mutex::new(&b).acquire(name.as_str()).await.unwrap();
    assert!(gc.fencing_token() > token_b);
    gc.release().await.unwrap();
}

/// A force-release (Baton) or a manual delete (etcd) of the holder's key: the guard's
/// `lost()` fires with `KeyDeleted` while the session lives on.
async fn key_deleted_is_noticed(t: Target) {
    let name = unique("forced");
    let client = t.client().await;
    let s = session(&client).await;
    let g = Mutex::new(&s).acquire(name.as_str()).await.unwrap();
    if t.baton_v1() {
        use baton_client::proto::baton::v1::{lock_client::LockClient, ForceReleaseRequest};
        let ch =
            tonic::transport::Endpoint::from_shared(format!("http://{}", t.server().endpoint()))
                .unwrap()
                .connect()
                .await
                .unwrap();
        LockClient::new(ch)
            .force_release(ForceReleaseRequest {
                name: name.clone().into_bytes(),
                reason: "test".into(),
                fencing_token: 0,
            })
            .await
            .unwrap();
    } else {
        client
            .delete(g.key().to_vec(), baton_client::DeleteOptions::new())
            .await
            .unwrap();
    }
    let reason = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("loss noticed");
    assert_eq!(reason, baton_client::LostReason::KeyDeleted);
    assert_eq!(s.state(), baton_client::SessionState::Alive);
    assert!(matches!(g.release().await, Err(Error::NotHolder)));
}

async fn lock_delay_and_fence_gate(t: Target) {
    let name = unique("delay");
    let client = t.client().await;
    let s = session(&client).await;
    let r = Mutex::new(&s)
        .acquire_with(
            name.as_str(),
            LockOptions::new().with_lock_delay(Duration::from_millis(100)),
        )
        .await;
    let gate = baton_client::FenceGate::new(&client);
    let resource = unique("printer");
    if t.baton_v1() {
        r.unwrap().release().await.unwrap();
        let token = FencingToken::new;
        assert!(
            gate.check(resource.as_str(), token(5))
                .await
                .unwrap()
                .accepted
        );
        let c = gate.check(resource.as_str(), token(4)).await.unwrap();
        assert_eq!((c.accepted, c.highest_token), (false, token(5)));
    } else {
        assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
        assert!(matches!(
            gate.check(resource.as_str(), FencingToken::new(5)).await,
            Err(Error::Unsupported(_))
        ));
    }
}

/// 20 contenders for 3 permits: never more than 3 holders (from recorded intervals), and
/// every holder has its own token.
async fn semaphore_3_of_20(t: Target) {
    let name = unique("sem");
    let held: Intervals = Default::default();
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let client = t.client().await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (client, name, held, tokens) =
            (client.clone(), name.clone(), held.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let s = session(&client).await;
            let p = Semaphore::new(&s, name.as_str(), 3)
                .acquire()
                .await
                .unwrap();
            let start = Instant::now();
            tokens.lock().unwrap().push(p.fencing_token());
            tokio::time::sleep(Duration::from_millis(20)).await;
            held.lock().unwrap().push((start, Instant::now()));
            p.release().await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let held = held.lock().unwrap().clone();
    assert_eq!(held.len(), 20);
    let max = max_overlap(&held);
    assert!(max <= 3, "{max} holders at once");
    assert!(
        max >= 2,
        "permits were never shared ({max}): the test proves nothing"
    );
    let mut tokens = tokens.lock().unwrap().clone();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 20, "each holder has its own token");
}

/// 4 readers and 2 writers, 3 rounds each: a writer never holds beside anyone.
async fn rwlock_writer_alone(t: Target) {
    let name = unique("rw");
    let reads: Intervals = Default::default();
    let writes: Intervals = Default::default();
    let client = t.client().await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        let writer = i < 2;
        let (client, name) = (client.clone(), name.clone());
        let log = if writer {
            writes.clone()
        } else {
            reads.clone()
        };
        tasks.push(tokio::spawn(async move {
            let s = session(&client).await;
            let rw = RwLock::new(&s, name.as_str());
            for _ in 0..3 {
                let p = if writer {
                    rw.write().await.unwrap()
                } else {
                    rw.read().await.unwrap()
                };
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                log.lock().unwrap().push((start, Instant::now()));
                p.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let reads = reads.lock().unwrap().clone();
    let writes = writes.lock().unwrap().clone();
    assert_eq!((reads.len(), writes.len()), (12, 6));
    for &w in &writes {
        for &other in writes.iter().chain(&reads) {
            if other == w {
                continue;
            }
            let overlap = w.0 < other.1 && other.0 < w.1;
            assert!(!overlap, "writer {w:?} overlaps {other:?}");
        }
    }
}

async fn election_handover(t: Target) {
    let name = unique("elect");
    let client = t.client().await;
    let election = Election::new(&client, name.as_str());
    assert_eq!(election.leader().await.unwrap(), None);
    let mut observed = election.observe();

    let a = session(&client).await;
    let leader_a = election.campaign(&a, "a").await.unwrap();
    assert_eq!(observed.next().await.unwrap().unwrap().value, b"a");

    let b = session(&client).await;
    let e = election.clone();
    let campaign_b = tokio::spawn(async move { e.campaign(&b, "b").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!campaign_b.is_finished(), "b must wait while a leads");
    leader_a.proclaim("a2").await.unwrap();
    assert_eq!(observed.next().await.unwrap().unwrap().value, b"a2");

    let token_a = leader_a.fencing_token();
    leader_a.resign().await.unwrap();
    let leader_b = tokio::time::timeout(Duration::from_secs(5), campaign_b)
        .await
        .expect("b elected after a resigned")
        .unwrap()
        .unwrap();
    assert!(leader_b.fencing_token() > token_a);
    assert_eq!(observed.next().await.unwrap().unwrap().value, b"b");
    assert_eq!(election.leader().await.unwrap().unwrap().value, b"b");
    leader_b.resign().await.unwrap();
}

async fn barrier(t: Target) {
    let name = unique("barrier");
    let client = t.client().await;
    let b = Barrier::new(&client, name.as_str());
    b.wait().await.unwrap(); // not up: returns at once
    b.hold().await.unwrap();
    assert!(matches!(b.hold().await, Err(Error::AlreadyHeld { .. })));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move { b.wait().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    b.release().await.unwrap();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("released")
            .unwrap()
            .unwrap();
    }
}

async fn double_barrier(t: Target) {
    let name = unique("dbarrier");
    let client = t.client().await;
    let entered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3u64 {
        let (client, name, entered) = (client.clone(), name.clone(), entered.clone());
        tasks.push(tokio::spawn(async move {
            let s = session(&client).await;
            // Arrive one after the other.
            tokio::time::sleep(Duration::from_millis(100 * i)).await;
            let arrived = Instant::now();
            let b = DoubleBarrier::new(&s, name.as_str(), 3);
            b.enter().await.unwrap();
            entered.lock().unwrap().push((arrived, Instant::now()));
            tokio::time::sleep(Duration::from_millis(30 * i)).await;
            b.leave().await.unwrap();
            Instant::now()
        }));
    }
    let mut left = Vec::new();
    for task in tasks {
        left.push(
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("double barrier finished")
                .unwrap(),
        );
    }
    let entered = entered.lock().unwrap().clone();
    let last_arrival = entered.iter().map(|e| e.0).max().unwrap();
    assert!(
        entered.iter().all(|e| e.1 >= last_arrival),
        "nobody enters before everyone arrived"
    );
    let last_entry = entered.iter().map(|e| e.1).max().unwrap();
    assert!(left.iter().all(|&l| l >= last_entry));
    assert!(queue_keys(t, &name).await.is_empty(), "cleaned up");
}

async fn queue_fifo(t: Target) {
    let name = unique("queue");
    let client = t.client().await;
    let q = Queue::new(&client, name.as_str());
    for i in 0..10 {
        q.enqueue(format!("item-{i}")).await.unwrap();
    }
    for i in 0..10 {
        assert_eq!(q.dequeue().await.unwrap(), format!("item-{i}").into_bytes());
    }
    assert_eq!(q.try_dequeue().await.unwrap(), None);
    // A blocked consumer gets an item enqueued later.
    let consumer = tokio::spawn({
        let q = q.clone();
        async move { q.dequeue().await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    q.enqueue("late").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), consumer)
        .await
        .expect("dequeued")
        .unwrap()
        .unwrap();
    assert_eq!(got, b"late");
}
