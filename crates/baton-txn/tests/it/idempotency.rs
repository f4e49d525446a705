//! Idempotency keys against a real PostgreSQL (`scripts/services`; fails when it is missing).

use std::sync::Arc;
use std::time::Duration;

use crate::common::{connect, count_effects, fresh_schema};
use baton_txn::pg::{
    Claim, IdempotencyConfig, IdempotencyStore, Outcome, RunError, Schema, Transaction,
};
use baton_txn::{Error, Fingerprint, IdempotencyKey, StoredResponse};

/// The "work" of a request: one row in `effects` (so executions can be counted) and a response
/// naming that row, so two executions could never produce the same response by accident.
async fn work(
    tx: &Transaction<'_>,
    schema: &Schema,
    tenant: &str,
    key: &str,
    body: &str,
    hold: Duration,
) -> Result<StoredResponse, Error> {
    let sql = format!(
        "INSERT INTO {}.effects (tenant, key, body) VALUES ($1, $2, $3) RETURNING id",
        schema.name()
    );
    let id: i64 = tx.query_one(&sql, &[&tenant, &key, &body]).await?.get(0);
    tokio::time::sleep(hold).await;
    Ok(StoredResponse::json(201, format!("{{\"order\":{id}}}"))
        .header("location", format!("/orders/{id}")))
}

fn config(lease_ms: u64, retention_ms: u64) -> IdempotencyConfig {
    IdempotencyConfig {
        lease: Duration::from_millis(lease_ms),
        retention: Duration::from_millis(retention_ms),
    }
}

fn fp(body: &str) -> Fingerprint {
    Fingerprint::of_http("POST", "/orders", body.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_requests_with_waiting_run_the_work_once_and_get_one_response() {
    let schema = fresh_schema("t_idem_fifty_wait").await;
    let store = IdempotencyStore::new(&schema, IdempotencyConfig::default());
    let key = IdempotencyKey::new("order-1").unwrap();
    let start = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (store, schema, key, start) =
            (store.clone(), schema.clone(), key.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = connect().await;
            start.wait().await;
            let wait = Some(Duration::from_secs(30));
            store
                .run(
                    &mut client,
                    "acme",
                    &key,
                    &fp("qty=1"),
                    wait,
                    async |tx: &Transaction<'_>| {
                        work(
                            tx,
                            &schema,
                            "acme",
                            "order-1",
                            "qty=1",
                            Duration::from_millis(300),
                        )
                        .await
                    },
                )
                .await
                .unwrap()
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let executed = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Executed(_)))
        .count();
    let replayed = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Replayed(_)))
        .count();
    assert_eq!((executed, replayed), (1, 49), "{outcomes:?}");
    let first = outcomes[0].response().unwrap();
    assert!(
        outcomes.iter().all(|o| o.response() == Some(first)),
        "{outcomes:?}"
    );
    assert_eq!(first.status, 201);
    assert_eq!(
        count_effects(&connect().await, &schema, "acme", "order-1").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_requests_without_waiting_are_in_flight_then_replay_one_response() {
    let schema = fresh_schema("t_idem_fifty_409").await;
    let store = IdempotencyStore::new(&schema, IdempotencyConfig::default());
    let key = IdempotencyKey::new("order-1").unwrap();
    let start = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let (store, schema, key, start) =
            (store.clone(), schema.clone(), key.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            let mut client = connect().await;
            start.wait().await;
            let outcome = store
                .run(
                    &mut client,
                    "acme",
                    &key,
                    &fp("qty=1"),
                    None,
                    async |tx: &Transaction<'_>| {
                        // Long enough that every duplicate arrives while this one is in flight.
                        work(
                            tx,
                            &schema,
                            "acme",
                            "order-1",
                            "qty=1",
                            Duration::from_millis(1500),
                        )
                        .await
                    },
                )
                .await
                .unwrap();
            (client, outcome)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let executed: Vec<StoredResponse> = results
        .iter()
        .filter_map(|(_, o)| match o {
            Outcome::Executed(r) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(executed.len(), 1);
    let in_flight = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::InFlight { .. }))
        .count();
    let replayed = results
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Replayed(_)))
        .count();
    assert_eq!(in_flight + replayed, 49);
    // All of them should come while the first runs (it holds for 1.5 s); a very slow machine
    // may let a few in after its commit, and those get the replay at once.
    assert!(
        in_flight >= 40,
        "only {in_flight} requests saw the first one in flight"
    );
    for (mut client, outcome) in results {
        if let Outcome::Replayed(r) = &outcome {
            assert_eq!(r, &executed[0]);
        }
        if let Outcome::InFlight { retry_after } = outcome {
            assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(30));
            let retry = store
                .run(
                    &mut client,
                    "acme",
                    &key,
                    &fp("qty=1"),
                    None,
                    async |_: &Transaction<'_>| {
                        panic!("a retry after completion must not run the work")
                    },
                )
                .await;
            let retry: Outcome = retry.map_err(|e: RunError<Error>| e).unwrap();
            assert_eq!(retry, Outcome::Replayed(executed[0].clone()));
        }
    }
    assert_eq!(
        count_effects(&connect().await, &schema, "acme", "order-1").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_work_and_the_response_runs_the_retry_once() {
    let schema = fresh_schema("t_idem_crash_drop").await;
    let store = IdempotencyStore::new(&schema, config(2000, 3_600_000));
    let key = IdempotencyKey::new("k").unwrap();

    // The first attempt claims, does the work, and "crashes" before storing the response:
    // its transaction is dropped without commit, and nobody releases the claim.
    let mut first = connect().await;
    let Claim::Execute(exec) = store.claim(&first, "t", &key, &fp("a")).await.unwrap() else {
        panic!("first claim must execute")
    };
    let tx = exec.begin(&mut first).await.unwrap();
    work(&tx, &schema, "t", "k", "a", Duration::ZERO)
        .await
        .unwrap();
    drop(tx);
    let observer = connect().await;
    assert_eq!(
        count_effects(&observer, &schema, "t", "k").await,
        0,
        "the work rolled back"
    );

    // Within the lease the key is in flight; after it, the retry runs the work exactly once.
    let mut retry = connect().await;
    match store.claim(&retry, "t", &key, &fp("a")).await.unwrap() {
        Claim::InFlight { retry_after } => assert!(retry_after <= Duration::from_millis(2000)),
        other => panic!("expected InFlight, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let out = store
        .run(
            &mut retry,
            "t",
            &key,
            &fp("a"),
            None,
            async |tx: &Transaction<'_>| work(tx, &schema, "t", "k", "a", Duration::ZERO).await,
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)), "{out:?}");
    assert_eq!(count_effects(&observer, &schema, "t", "k").await, 1);
    let again = store
        .run(
            &mut retry,
            "t",
            &key,
            &fp("a"),
            None,
            async |_: &Transaction<'_>| -> Result<StoredResponse, Error> { unreachable!() },
        )
        .await
        .unwrap();
    assert_eq!(again, Outcome::Replayed(out.response().unwrap().clone()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_task_aborted_mid_work_runs_once_on_retry() {
    let schema = fresh_schema("t_idem_crash_abort").await;
    let store = IdempotencyStore::new(&schema, config(500, 3_600_000));
    let key = IdempotencyKey::new("k").unwrap();
    let in_work = Arc::new(tokio::sync::Notify::new());
    let task = {
        let (store, schema, key, in_work) =
            (store.clone(), schema.clone(), key.clone(), in_work.clone());
        tokio::spawn(async move {
            let mut client = connect().await;
            store
                .run(
                    &mut client,
                    "t",
                    &key,
                    &fp("a"),
                    None,
                    async |tx: &Transaction<'_>| {
                        let r = work(tx, &schema, "t", "k", "a", Duration::ZERO).await;
                        in_work.notify_one();
                        std::future::pending::<()>().await;
                        r
                    },
                )
                .await
        })
    };
    in_work.notified().await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());

    let mut retry = connect().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let out = store
        .run(
            &mut retry,
            "t",
            &key,
            &fp("a"),
            None,
            async |tx: &Transaction<'_>| work(tx, &schema, "t", "k", "a", Duration::ZERO).await,
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)), "{out:?}");
    assert_eq!(count_effects(&retry, &schema, "t", "k").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_live_request_keeps_its_claim_past_the_lease() {
    let schema = fresh_schema("t_idem_slow_live").await;
    let store = IdempotencyStore::new(&schema, config(200, 3_600_000));
    let key = IdempotencyKey::new("k").unwrap();
    let mut slow = connect().await;
    let Claim::Execute(exec) = store.claim(&slow, "t", &key, &fp("a")).await.unwrap() else {
        panic!()
    };
    let tx = exec.begin(&mut slow).await.unwrap();
    let response = work(&tx, &schema, "t", "k", "a", Duration::from_millis(600))
        .await
        .unwrap();
    // The lease ran out long ago, but the work transaction holds the row: no takeover.
    let other = connect().await;
    assert!(matches!(
        store.claim(&other, "t", &key, &fp("a")).await.unwrap(),
        Claim::InFlight { .. }
    ));
    exec.commit(tx, &response).await.unwrap();
    match store.claim(&other, "t", &key, &fp("a")).await.unwrap() {
        Claim::Replay(r) => assert_eq!(r, response),
        c => panic!("expected Replay, got {c:?}"),
    }
    assert_eq!(count_effects(&other, &schema, "t", "k").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_taken_over_after_its_lease_cannot_commit_its_work() {
    let schema = fresh_schema("t_idem_takeover").await;
    let store = IdempotencyStore::new(&schema, config(200, 3_600_000));
    let key = IdempotencyKey::new("k").unwrap();
    let mut a = connect().await;
    let Claim::Execute(exec_a) = store.claim(&a, "t", &key, &fp("x")).await.unwrap() else {
        panic!()
    };
    // A stalls before opening its work transaction; its lease runs out and B takes over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut b = connect().await;
    let out = store
        .run(
            &mut b,
            "t",
            &key,
            &fp("x"),
            None,
            async |tx: &Transaction<'_>| work(tx, &schema, "t", "k", "x", Duration::ZERO).await,
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)));
    // A wakes up: locking its claim fails, and so does storing a response without the lock
    // (the token fences it), so A's work never commits.
    assert!(matches!(exec_a.begin(&mut a).await, Err(Error::ClaimLost)));
    let tx = a.transaction().await.unwrap();
    let r = work(&tx, &schema, "t", "k", "x", Duration::ZERO)
        .await
        .unwrap();
    assert!(matches!(exec_a.commit(tx, &r).await, Err(Error::ClaimLost)));
    assert!(
        !exec_a.release(&a).await.unwrap(),
        "A's release must not touch B's key"
    );
    assert_eq!(count_effects(&a, &schema, "t", "k").await, 1);
    assert!(matches!(
        store.claim(&a, "t", &key, &fp("x")).await.unwrap(),
        Claim::Replay(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_a_different_body_is_a_mismatch() {
    let schema = fresh_schema("t_idem_mismatch").await;
    let store = IdempotencyStore::new(&schema, IdempotencyConfig::default());
    let key = IdempotencyKey::new("k").unwrap();
    let mut client = connect().await;
    let out = store
        .run(
            &mut client,
            "t",
            &key,
            &fp("qty=1"),
            None,
            async |tx: &Transaction<'_>| work(tx, &schema, "t", "k", "qty=1", Duration::ZERO).await,
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)));
    let other = store
        .run(
            &mut client,
            "t",
            &key,
            &fp("qty=2"),
            Some(Duration::from_secs(1)),
            async |tx: &Transaction<'_>| work(tx, &schema, "t", "k", "qty=2", Duration::ZERO).await,
        )
        .await
        .unwrap();
    assert_eq!(other, Outcome::Mismatch);
    // Also while the first request is still in flight.
    let k2 = IdempotencyKey::new("k2").unwrap();
    let Claim::Execute(_running) = store.claim(&client, "t", &k2, &fp("qty=1")).await.unwrap()
    else {
        panic!()
    };
    assert!(matches!(
        store.claim(&client, "t", &k2, &fp("qty=2")).await.unwrap(),
        Claim::Mismatch
    ));
    assert_eq!(count_effects(&client, &schema, "t", "k").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_isolated() {
    let schema = fresh_schema("t_idem_tenants").await;
    let store = IdempotencyStore::new(&schema, IdempotencyConfig::default());
    let key = IdempotencyKey::new("same-key").unwrap();
    let mut client = connect().await;
    let mut responses = Vec::new();
    for tenant in ["alpha", "beta"] {
        // A different body per tenant: no Mismatch across tenants either.
        let body = format!("from {tenant}");
        let out = store
            .run(
                &mut client,
                tenant,
                &key,
                &fp(&body),
                None,
                async |tx: &Transaction<'_>| {
                    work(tx, &schema, tenant, "same-key", &body, Duration::ZERO).await
                },
            )
            .await
            .unwrap();
        let Outcome::Executed(r) = out else {
            panic!("{tenant}: {out:?}")
        };
        responses.push(r);
    }
    assert_ne!(responses[0], responses[1]);
    for (tenant, expected) in ["alpha", "beta"].into_iter().zip(&responses) {
        let body = format!("from {tenant}");
        match store
            .claim(&client, tenant, &key, &fp(&body))
            .await
            .unwrap()
        {
            Claim::Replay(r) => assert_eq!(&r, expected),
            c => panic!("{tenant}: {c:?}"),
        }
        assert_eq!(count_effects(&client, &schema, tenant, "same-key").await, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_work_stores_nothing_and_the_retry_runs_at_once() {
    let schema = fresh_schema("t_idem_work_error").await;
    let store = IdempotencyStore::new(&schema, IdempotencyConfig::default());
    let key = IdempotencyKey::new("k").unwrap();
    let mut client = connect().await;
    let failed = store
        .run(
            &mut client,
            "t",
            &key,
            &fp("a"),
            None,
            async |tx: &Transaction<'_>| {
                work(tx, &schema, "t", "k", "a", Duration::ZERO).await?;
                Err::<StoredResponse, Error>(Error::Connection("payment provider said no".into()))
            },
        )
        .await;
    assert!(matches!(failed, Err(RunError::Work(_))));
    assert_eq!(count_effects(&client, &schema, "t", "k").await, 0);
    // No lease to wait out: the claim was released.
    let out = store
        .run(
            &mut client,
            "t",
            &key,
            &fp("a"),
            None,
            async |tx: &Transaction<'_>| work(tx, &schema, "t", "k", "a", Duration::ZERO).await,
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Executed(_)));
    assert_eq!(count_effects(&client, &schema, "t", "k").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_makes_old_keys_new_and_purge_deletes_them() {
    let schema = fresh_schema("t_idem_retention").await;
    let short = IdempotencyStore::new(&schema, config(100, 400));
    let long = IdempotencyStore::new(&schema, IdempotencyConfig::default());
    let mut client = connect().await;
    for (store, k) in [(&short, "old-1"), (&short, "old-2"), (&long, "young")] {
        let key = IdempotencyKey::new(k).unwrap();
        let out = store
            .run(
                &mut client,
                "t",
                &key,
                &fp("a"),
                None,
                async |tx: &Transaction<'_>| work(tx, &schema, "t", k, "a", Duration::ZERO).await,
            )
            .await
            .unwrap();
        assert!(matches!(out, Outcome::Executed(_)));
    }
    // An in-flight claim left by a crash is purged too once its retention is over.
    let crashed = IdempotencyKey::new("crashed").unwrap();
    assert!(matches!(
        short.claim(&client, "t", &crashed, &fp("a")).await.unwrap(),
        Claim::Execute(_)
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Past retention, a key is a new request — even with a different body, and before any
    // purge ran (Stripe: a pruned key is a new request).
    let old1 = IdempotencyKey::new("old-1").unwrap();
    let Claim::Execute(exec) = short.claim(&client, "t", &old1, &fp("b")).await.unwrap() else {
        panic!("a retired key must be claimable afresh")
    };
    assert!(exec.release(&client).await.unwrap());

    let purged = short.purge(&client, 1).await.unwrap();
    assert_eq!(purged, 2, "old-2 and crashed (old-1 was released)");
    let left: Vec<String> = client
        .query(
            &format!(
                "SELECT key FROM {}.idempotency_keys ORDER BY key",
                schema.name()
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, ["young"]);
    assert_eq!(short.purge(&client, 100).await.unwrap(), 0);
}
