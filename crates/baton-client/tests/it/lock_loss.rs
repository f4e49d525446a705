//! Lock loss is never silent: the holder's keep-alives are cut off by a proxy that stalls
//! all its traffic. The test records when the holder's `lost()` fires and when the server
//! grants the lock to the next waiter, and asserts that the first comes first, that the
//! guarded work stopped, and that a fenced write with the old token is rejected once the
//! holder can reach the server again. The same code runs against Baton and etcd 3.4.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{unique, Target};
use baton_client::testing::Proxy;
use baton_client::{
    Client, Error, GetOptions, LostReason, Mutex, PutOptions, Session, SessionOptions, SessionState,
};

for_each_target!(lost_fires_before_the_next_grant);

async fn lost_fires_before_the_next_grant(t: Target) {
    let name = unique("loss");
    let data = unique("loss-data");
    let proxy = Proxy::start(t.server().endpoint()).await;
    // A talks through the proxy; B directly.
    let a_client = Client::connect(
        t.config(vec![proxy.endpoint()])
            .with_request_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let b_client = t.client().await;
    let ttl = Duration::from_secs(2);
    // A margin above the 100 ms default: two cores run many tests at once here, and a timer
    // that fires later than the margin is a paused process — which only fencing can handle
    // (checked below), not the loss signal.
    let a = Session::new(
        &a_client,
        SessionOptions::new()
            .with_ttl(ttl)
            .with_margin(Duration::from_millis(250)),
    )
    .await
    .unwrap();
    let b = Session::new(&b_client, SessionOptions::new().with_ttl(ttl))
        .await
        .unwrap();
    assert_eq!(a.ttl(), ttl);

    let guard = Mutex::new(&a).acquire(name.as_str()).await.unwrap();
    guard
        .fenced_put(data.as_str(), "a", PutOptions::new())
        .await
        .unwrap();

    // The guarded work: ticks until the lock is lost.
    let last_tick = Arc::new(std::sync::Mutex::new(Instant::now()));
    let work = tokio::spawn({
        let lost = guard.lost();
        let last_tick = last_tick.clone();
        async move {
            tokio::pin!(lost);
            loop {
                tokio::select! {
                    reason = &mut lost => return (reason, Instant::now()),
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {
                        *last_tick.lock().unwrap() = Instant::now();
                    }
                }
            }
        }
    });

    // B waits in line.
    let b_wait = tokio::spawn({
        let locks = Mutex::new(&b);
        let name = name.clone();
        async move {
            let g = locks.acquire(name.as_str()).await;
            (Instant::now(), g)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b_wait.is_finished());

    // Partition A: nothing moves between A and the server any more.
    let paused_at = Instant::now();
    proxy.pause();
    let mut saw_uncertain = false;
    while !work.is_finished() {
        saw_uncertain |= a.state() == SessionState::Uncertain;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (reason, lost_at) = work.await.unwrap();
    assert_eq!(reason, LostReason::KeepAliveDeadline);
    assert_eq!(a.state(), SessionState::Expired);
    assert!(saw_uncertain, "Uncertain comes before Expired");

    let (granted_at, gb) = tokio::time::timeout(Duration::from_secs(10), b_wait)
        .await
        .expect("B gets the lock once A's lease expires")
        .unwrap();
    let gb = gb.unwrap();
    println!(
        "{t:?}: paused at 0, A lost() at {:?}, B granted at {:?}",
        lost_at - paused_at,
        granted_at - paused_at
    );
    assert!(
        lost_at < granted_at,
        "lost() must fire before the next grant: lost {:?} vs granted {:?} after the pause",
        lost_at - paused_at,
        granted_at - paused_at
    );
    let stopped = *last_tick.lock().unwrap();
    assert!(
        stopped <= lost_at && stopped < granted_at,
        "the guarded work stopped"
    );
    assert!(gb.fencing_token() > guard.fencing_token());

    // A reaches the server again: its late write is refused.
    proxy.resume();
    let late = guard
        .fenced_put(data.as_str(), "a-late", PutOptions::new())
        .await;
    assert!(
        matches!(late, Err(Error::FencingTokenRejected { .. })),
        "{late:?}"
    );
    gb.fenced_put(data.as_str(), "b", PutOptions::new())
        .await
        .unwrap();
    let v = b_client
        .get(data.as_str(), GetOptions::new())
        .await
        .unwrap();
    assert_eq!(v.kvs[0].value, b"b");
    gb.release().await.unwrap();
}
