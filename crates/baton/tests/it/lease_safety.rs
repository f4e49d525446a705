//! Lease safety when the leader itself misbehaves (etcd#15247): a leader whose lease duties
//! stalled must not expire leases whose clients did nothing wrong, and a leader that cannot
//! reach a quorum must not acknowledge keep-alives (its clients would believe leases live
//! that the rest of the cluster is about to expire).

use crate::common;

use std::time::{Duration, Instant};

use crate::common::{kill, Baton, Cluster};
use baton_client::{Client, ClientConfig, PutOptions};

async fn client(endpoint: &str, timeout: Duration) -> Client {
    Client::connect(ClientConfig::new([endpoint.to_string()]).with_request_timeout(timeout))
        .await
        .unwrap()
}

fn pid(b: &Baton) -> i32 {
    b.child.as_ref().expect("running").id() as i32
}

/// A single member is paused with SIGSTOP for longer than a lease's TTL while its client
/// keeps sending keep-alives; on SIGCONT the stall must be given back to the lease (the
/// client could not renew while the server was not running), so the lease and its key
/// survive and the next keep-alive renews it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_leader_does_not_expire_leases_it_could_not_renew() {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::start(&dir.path().join("data"));
    let ep = baton.endpoint();
    let c = client(&ep, Duration::from_secs(2)).await;
    let lease = c.lease_grant(Duration::from_secs(2)).await.unwrap().id;
    c.put("stall/key", "v", PutOptions::new().with_lease(lease))
        .await
        .unwrap();

    // The client keeps the lease alive every 500 ms (TTL/4); failures while the server is
    // stopped are expected. Each answer is recorded with when it came.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let keeper = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut answers: Vec<(Instant, Result<i64, String>)> = Vec::new();
            while !*stop_rx.borrow() {
                let r = c.lease_keep_alive_once(lease).await;
                answers.push((Instant::now(), r.map_err(|e| e.to_string())));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop_rx.changed() => {}
                }
            }
            answers
        })
    };

    tokio::time::sleep(Duration::from_millis(700)).await;
    kill(pid(&baton), libc::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(3)).await;
    kill(pid(&baton), libc::SIGCONT);
    let resumed = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_tx.send(true).unwrap();
    let answers = keeper.await.unwrap();
    assert!(
        answers.iter().all(|(_, r)| !matches!(r, Ok(0))),
        "the lease expired across the leader's stall: {answers:?}\n{}",
        baton.log()
    );
    assert!(
        answers
            .iter()
            .any(|(at, r)| *at > resumed && matches!(r, Ok(ttl) if *ttl > 0)),
        "no renewal after the stall: {answers:?}"
    );
    let got = c
        .get("stall/key", baton_client::GetOptions::new())
        .await
        .unwrap();
    assert_eq!(got.kvs.len(), 1, "the lease's key is still there");
    assert!(
        baton.log().contains("lease duties stalled"),
        "the stall was detected\n{}",
        baton.log()
    );
}

/// With both followers stopped, the leader cannot confirm its leadership: it must refuse
/// keep-alives (after trying) instead of acknowledging renewals no quorum knows of. Once the
/// followers are back, keep-alives are acknowledged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_a_quorum_refuses_keep_alives() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let leader = common::agreed_leader(&eps, Duration::from_secs(15)).await;
    let c = client(&eps[leader], Duration::from_secs(3)).await;
    let lease = c.lease_grant(Duration::from_secs(30)).await.unwrap().id;
    assert_eq!(c.lease_keep_alive_once(lease).await.unwrap(), 30);

    let followers: Vec<i32> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| pid(&cluster.members[i]))
        .collect();
    for p in &followers {
        kill(*p, libc::SIGSTOP);
    }
    // Past the last confirmation (one heartbeat interval), every keep-alive must fail.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let refused = c.lease_keep_alive_once(lease).await;
    let took = started.elapsed();
    for p in &followers {
        kill(*p, libc::SIGCONT);
    }
    assert!(
        refused.is_err(),
        "a leader that cannot reach a quorum acknowledged a keep-alive: {refused:?}"
    );
    eprintln!("keep-alive without a quorum refused after {took:?}: {refused:?}");

    // Back to normal: renewals are acknowledged again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = client(&eps[leader], Duration::from_secs(2)).await;
        if let Ok(ttl) = c.lease_keep_alive_once(lease).await {
            assert_eq!(ttl, 30);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "keep-alives do not recover\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lease checkpoints across a leader change, and "never early": a lease nobody keeps alive
/// is checkpointed by the leader (every 500 ms here instead of 5 min); after kill -9 of the
/// leader, the new leader continues the countdown from the checkpoint (plus at most the
/// election timeout) instead of restarting the full TTL — and never gives less than what
/// was left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_continues_the_lease_countdown() {
    const TTL: i64 = 30;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(
        dir.path(),
        3,
        &["--experimental-lease-checkpoint-interval", "500"],
    );
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let leader = common::agreed_leader(&eps, Duration::from_secs(15)).await;
    let c = client(&eps[leader], Duration::from_secs(3)).await;
    let lease = c
        .lease_grant(Duration::from_secs(TTL as u64))
        .await
        .unwrap()
        .id;
    let granted = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;

    cluster.members[leader].kill9();
    let survivors: Vec<String> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| eps[i].clone())
        .collect();
    let _ = common::agreed_leader(&survivors, Duration::from_secs(15)).await;
    let s = client(&survivors[0], Duration::from_secs(3)).await;
    let ttl = loop {
        match s.lease_time_to_live(lease).await {
            Ok(r) => break r.ttl,
            Err(e) => {
                assert!(
                    granted.elapsed() < Duration::from_secs(20),
                    "TimeToLive: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let elapsed = granted.elapsed().as_secs_f64();
    eprintln!("after {elapsed:.1} s the new leader gives the {TTL} s lease {ttl} s");
    // Never early: at least what was left since the grant (whole seconds, rounded down).
    assert!(
        ttl as f64 >= TTL as f64 - elapsed - 1.0,
        "the new leader shortened the lease: {ttl} s left after {elapsed:.1} s"
    );
    // Not restarted: the countdown continued from a checkpoint at most ~1 s old, plus the
    // election-timeout extension (1 s) and rounding.
    assert!(
        (ttl as f64) <= TTL as f64 - 6.0 + 3.0,
        "the new leader restarted the countdown: {ttl} s left after {elapsed:.1} s"
    );
}
