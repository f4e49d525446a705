//! The seed's order saga against a real `baton serve` (started here) and the real PostgreSQL
//! (`scripts/services`), one orchestrator in this process:
//!
//! - the happy path: every step once, completed; starting again is the same saga;
//! - reserve stock fails (no stock): refund, then cancel — reverse order, each exactly once;
//! - the refund fails three times, then succeeds: retried with backoff, and the order is not
//!   cancelled before the refund went through;
//! - reserve times out and its request arrives late: the saga compensates (an empty release,
//!   which leaves a tombstone), and the late reservation is rejected by the step fence;
//! - the saga is cancelled while the charge is in flight: the charge finishes, then refund and
//!   cancel run.

use crate::common;
use crate::saga_common;

use std::time::{Duration, SystemTime};

use crate::saga_common::{
    calls, effect_count, effects_in_order, fresh_services, orchestrator, set_outage, spawn_running,
    step_key, undo_key, Order, Policies, IN_STOCK, OUT_OF_STOCK,
};
use baton_client::testing::{Flavor, TestServer};
use baton_txn::saga::{PhaseState, SagaError, SagaStatus, StepFence};

const SETTLE: Duration = Duration::from_secs(30);

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_runs_once_and_the_saga_completes() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_services("t_saga_happy").await;
    let ns = "happy";
    let orch = orchestrator(&server.endpoint(), ns, &schema, &Policies::default(), "a").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &Policies::default());
    let order = Order::new("o-1", IN_STOCK);
    let started = orch.start(&def, "o-1", &order).await.unwrap();
    assert_eq!(started.status, SagaStatus::Running);
    let (stop, task) = spawn_running(orch.clone());

    let rec = orch.log().wait_settled("o-1", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Completed);
    for (i, s) in rec.steps.iter().enumerate() {
        assert_eq!(s.action.state, PhaseState::Done, "step {i}");
        assert_eq!(s.action.attempts, 1, "step {i}");
        assert!(s.compensation.is_none());
        assert_eq!(
            effect_count(&schema, &step_key(ns, "o-1", i), "action").await,
            1
        );
    }
    assert_eq!(
        rec.steps[1].action.output.as_ref().unwrap()["verdict"],
        "applied"
    );
    assert_eq!(
        effects_in_order(&schema, &format!("{ns}/o-1/")).await,
        pairs(&[
            ("orders", "action"),
            ("payments", "action"),
            ("stock", "action"),
            ("shipments", "action"),
        ])
    );
    assert!(rec.orchestrator.unwrap().starts_with("a (token "));

    // Starting it again is the same saga (nothing runs again); other data is refused.
    let again = orch.start(&def, "o-1", &order).await.unwrap();
    assert_eq!(again.status, SagaStatus::Completed);
    let other = orch.start(&def, "o-1", &Order::new("o-1", "gadget")).await;
    assert!(matches!(other, Err(SagaError::Conflict(_))), "{other:?}");
    assert!(orch.cancel("o-1", "too late").await.is_err());
    assert_eq!(
        effect_count(&schema, &step_key(ns, "o-1", 0), "action").await,
        1
    );

    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_at_the_third_step_refunds_then_cancels() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_services("t_saga_fail3").await;
    let ns = "fail3";
    let p = Policies::default();
    let orch = orchestrator(&server.endpoint(), ns, &schema, &p, "a").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    let (stop, task) = spawn_running(orch.clone());
    orch.start(&def, "o-2", &Order::new("o-2", OUT_OF_STOCK))
        .await
        .unwrap();

    let rec = orch.log().wait_settled("o-2", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Compensated);
    println!("reason: {:?}", rec.reason);
    assert!(rec
        .reason
        .as_deref()
        .unwrap()
        .contains("insufficient stock"));
    // A fatal error is not retried.
    assert_eq!(rec.steps[2].action.state, PhaseState::Failed);
    assert_eq!(rec.steps[2].action.attempts, 1);
    assert!(!rec.steps[2].outcome_unknown);
    // Its effect never happened, so it is not compensated; the shipment never started.
    assert!(rec.steps[2].compensation.is_none());
    assert_eq!(rec.steps[3].action.state, PhaseState::Pending);
    assert_eq!(rec.steps[3].action.attempts, 0);
    assert_eq!(
        effects_in_order(&schema, &format!("{ns}/o-2/")).await,
        pairs(&[
            ("orders", "action"),
            ("payments", "action"),
            ("payments", "compensation"),
            ("orders", "compensation"),
        ]),
        "refund, then cancel: reverse order, each once"
    );
    for step in [0, 1] {
        assert_eq!(
            effect_count(&schema, &undo_key(ns, "o-2", step), "compensation").await,
            1
        );
    }
    let client = common::connect().await;
    let cancelled: String = client
        .query_one(
            "SELECT state FROM t_saga_fail3.orders WHERE order_id = 'o-2'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(cancelled, "cancelled");
    let balance: i64 = client
        .query_one(
            "SELECT sum(cents)::bigint FROM t_saga_fail3.payments WHERE order_id = 'o-2'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 0, "charged and refunded");
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_failing_three_times_is_retried_with_backoff_before_the_cancel() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_services("t_saga_refund3").await;
    let ns = "refund3";
    let p = Policies::default();
    let orch = orchestrator(&server.endpoint(), ns, &schema, &p, "a").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    let (stop, task) = spawn_running(orch.clone());
    // Refunds fail three times (charges go through).
    set_outage(&schema, "payments/compensation", 3).await;
    let order = Order::new("o-3", OUT_OF_STOCK);
    orch.start(&def, "o-3", &order).await.unwrap();

    let rec = orch.log().wait_settled("o-3", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Compensated);
    let refund = rec.steps[1].compensation.as_ref().unwrap();
    assert_eq!(refund.attempts, 4);
    assert_eq!(refund.failures, 3);
    assert!(refund
        .last_error
        .as_deref()
        .unwrap()
        .contains("payments is unavailable"));

    let refund_calls = calls(&schema, &undo_key(ns, "o-3", 1)).await;
    let outcomes: Vec<&str> = refund_calls.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(
        outcomes,
        vec![
            "error: payments is unavailable",
            "error: payments is unavailable",
            "error: payments is unavailable",
            "applied"
        ]
    );
    // Equal jitter: each pause is at least half its ceiling (20, 40, 80 ms).
    let gaps: Vec<Duration> = refund_calls
        .windows(2)
        .map(|w| w[1].2.duration_since(w[0].2).unwrap())
        .collect();
    println!("refund attempts {:?} apart", gaps);
    for (gap, ceiling) in gaps.iter().zip([20u64, 40, 80]) {
        assert!(
            *gap >= Duration::from_millis(ceiling / 2),
            "pause {gap:?} shorter than half of {ceiling} ms"
        );
    }
    // The cancel started only after the refund succeeded.
    let cancel_calls = calls(&schema, &undo_key(ns, "o-3", 0)).await;
    assert_eq!(cancel_calls.len(), 1);
    assert!(cancel_calls[0].2 > refund_calls[3].2);
    assert_eq!(
        effect_count(&schema, &undo_key(ns, "o-3", 1), "compensation").await,
        1
    );
    assert_eq!(
        effect_count(&schema, &undo_key(ns, "o-3", 0), "compensation").await,
        1
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_step_is_compensated_and_its_late_arrival_rejected() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_services("t_saga_late").await;
    let ns = "late";
    let p = Policies {
        reserve_timeout: Some(Duration::from_millis(300)),
        retry: baton_txn::saga::RetryPolicy {
            max_attempts: 1,
            ..Policies::default().retry
        },
        ..Policies::default()
    };
    let orch = orchestrator(&server.endpoint(), ns, &schema, &p, "a").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    let (stop, task) = spawn_running(orch.clone());
    let order = Order {
        late_reserve_ms: Some(1500),
        ..Order::new("o-4", IN_STOCK)
    };
    let sent = SystemTime::now();
    orch.start(&def, "o-4", &order).await.unwrap();

    let rec = orch.log().wait_settled("o-4", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Compensated);
    let reserve = &rec.steps[2];
    assert!(reserve.outcome_unknown);
    assert!(reserve
        .action
        .last_error
        .as_deref()
        .unwrap()
        .contains("timed out"));
    // The outcome was unknown, so the release ran: an empty compensation.
    let release = reserve.compensation.as_ref().unwrap();
    assert_eq!(
        release.output.as_ref().unwrap()["verdict"],
        "nothing_to_undo"
    );
    assert!(
        sent.elapsed().unwrap() < Duration::from_millis(1500),
        "compensated before the late request arrived ({:?})",
        sent.elapsed()
    );

    // The late reservation arrives and is refused by the tombstone.
    let fence = StepFence::new(&schema);
    let client = common::connect().await;
    let key = step_key(ns, "o-4", 2);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row = fence.get(&client, &key).await.unwrap().unwrap();
        if row.rejected == 1 {
            assert_eq!(row.state, "tombstone");
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "no late arrival: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(effect_count(&schema, &key, "action").await, 0);
    let available: i32 = client
        .query_one(
            "SELECT available FROM t_saga_late.stock WHERE sku = $1",
            &[&IN_STOCK],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(available, 1_000_000, "nothing reserved");
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_cancelled_while_a_step_is_in_flight_still_compensates() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_services("t_saga_cancel").await;
    let ns = "cancel";
    let p = Policies::default();
    let orch = orchestrator(&server.endpoint(), ns, &schema, &p, "a").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    // Hold the gate the charge waits on.
    let gate = common::connect().await;
    gate.execute("SELECT pg_advisory_lock(hashtext('gate:o-5'))", &[])
        .await
        .unwrap();
    let (stop, task) = spawn_running(orch.clone());
    let order = Order {
        gate_charge: true,
        ..Order::new("o-5", IN_STOCK)
    };
    orch.start(&def, "o-5", &order).await.unwrap();
    orch.log()
        .wait_for("o-5", SETTLE, |r| {
            r.steps[1].action.state == PhaseState::Running
        })
        .await
        .unwrap();

    let rec = orch
        .cancel("o-5", "customer changed their mind")
        .await
        .unwrap();
    assert!(rec.cancel_requested);
    assert_eq!(
        rec.status,
        SagaStatus::Running,
        "the charge is still in flight"
    );
    gate.execute("SELECT pg_advisory_unlock(hashtext('gate:o-5'))", &[])
        .await
        .unwrap();

    let rec = orch.log().wait_settled("o-5", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Compensated);
    assert!(rec
        .reason
        .as_deref()
        .unwrap()
        .contains("customer changed their mind"));
    assert_eq!(
        rec.steps[1].action.state,
        PhaseState::Done,
        "the charge finished"
    );
    assert_eq!(
        rec.steps[2].action.attempts, 0,
        "nothing started after the cancel"
    );
    assert_eq!(
        effects_in_order(&schema, &format!("{ns}/o-5/")).await,
        pairs(&[
            ("orders", "action"),
            ("payments", "action"),
            ("payments", "compensation"),
            ("orders", "compensation"),
        ])
    );
    assert_eq!(rec.audit.len(), 1);
    assert_eq!(rec.audit[0].reason, "customer changed their mind");
    stop.send(()).unwrap();
    task.await.unwrap();
}
