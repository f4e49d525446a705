//! What operators see and do, against a real `baton serve`, the real PostgreSQL and the real
//! `baton` binary (`target/debug/baton`, built by `cargo build -p baton`):
//!
//! - a refund that always fails parks the saga as stuck (the cancel never starts); the
//!   `baton_txn_saga_stuck` gauge counts it; `baton saga list` and `show` show the state, the
//!   step, its attempts and last error; `baton saga skip` with a reason lets it finish
//!   compensating, and `show` has the reason in the audit trail;
//! - `baton saga retry` after the cause was fixed: the refund runs and the saga compensates;
//! - a deposed orchestrator (an older leadership's fence) cannot write the record, so it
//!   cannot start a step; the current leader's fence can;
//! - an orchestrator whose leadership is taken away mid-step stops, and the next one finishes
//!   the saga with the step's effect applied once.

use crate::common;
use crate::saga_common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::saga_common::{
    calls, clear_outage, effect_count, fresh_services, orchestrator, set_outage, spawn_running,
    step_key, undo_key, Order, Policies, IN_STOCK, OUT_OF_STOCK,
};
use baton_client::testing::{baton_binary, Flavor, TestServer};
use baton_client::{Election, Session, SessionOptions};
use baton_txn::coordination::LeaderFence;
use baton_txn::saga::{OperatorAction, PhaseState, SagaEvent, SagaStatus};
use serde_json::Value;

const SETTLE: Duration = Duration::from_secs(30);

// ---- the `baton saga` command ---------------------------------------------------------------

/// Runs `baton saga <args> --endpoints <endpoint> --namespace <ns>`; returns (status, stdout,
/// stderr).
fn baton_saga(endpoint: &str, ns: &str, args: &[&str]) -> (i32, String, String) {
    let bin = baton_binary();
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p baton` first",
        bin.display()
    );
    let out = Command::new(bin)
        .arg("saga")
        .args(args)
        .args(["--endpoints", endpoint, "--namespace", ns])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    println!("$ baton saga {}\n{stdout}{stderr}", args.join(" "));
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

fn line_of<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_failing_refund_parks_the_saga_stuck_until_an_operator_skips_it() {
    let metrics = common::recorder::recorded();
    let server = TestServer::start(Flavor::Baton);
    let endpoint = server.endpoint();
    let schema = fresh_services("t_saga_stuck").await;
    let ns = "stuck";
    let mut p = Policies::default();
    p.compensation.park_after = 3;
    set_outage(&schema, "payments/compensation", -1).await;
    let orch = orchestrator(&endpoint, ns, &schema, &p, "a").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    let (stop, task) = spawn_running(orch.clone());
    orch.start(&def, "o-6", &Order::new("o-6", OUT_OF_STOCK))
        .await
        .unwrap();

    let rec = orch.log().wait_settled("o-6", SETTLE).await.unwrap();
    let SagaStatus::Stuck {
        step,
        attempts,
        last_error,
    } = &rec.status
    else {
        panic!("not stuck: {:?}", rec.status)
    };
    assert_eq!((*step, *attempts), (1, 3));
    assert_eq!(last_error, "payments is unavailable");
    assert!(
        calls(&schema, &undo_key(ns, "o-6", 0)).await.is_empty(),
        "the cancel never started while the refund was stuck"
    );
    // The leader counts it on its next scan.
    let gauge = format!("baton_txn_saga_stuck{{namespace={ns}}}");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while metrics.gauge(&gauge) != Some(1.0) {
        assert!(
            std::time::Instant::now() < until,
            "{gauge} = {:?}",
            metrics.gauge(&gauge)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // What an operator sees.
    let (code, out, _) = baton_saga(&endpoint, ns, &["list"]);
    assert_eq!(code, 0);
    let row = line_of(&out, "o-6");
    for cell in [
        "order",
        "stuck",
        "1 charge_card",
        " 3 ",
        "payments is unavailable",
    ] {
        assert!(row.contains(cell), "{cell:?} missing from {row:?}");
    }
    let (_, out, _) = baton_saga(&endpoint, ns, &["list", "--state", "stuck", "-o", "json"]);
    let listed: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(listed["id"], "o-6");
    assert_eq!(listed["status"]["state"], "stuck");
    assert_eq!(listed["status"]["attempts"], 3);
    let (_, out, _) = baton_saga(&endpoint, ns, &["show", "o-6"]);
    assert!(out.contains(
        "stuck on the compensation of step 1 (charge_card) after 3 attempts: payments is unavailable"
    ));
    let charge = line_of(&out, "charge_card  ");
    assert!(
        charge.contains("done")
            && charge.contains("retrying")
            && charge.contains("attempt 3: payments is unavailable"),
        "{charge:?}"
    );
    assert!(
        out.contains("insufficient stock"),
        "the reason it compensates"
    );
    assert!(out.contains("audit: no operator actions"));

    // Wrong step, and a retry without fixing the cause, are refused or park it again.
    let (code, _, err) = baton_saga(
        &endpoint,
        ns,
        &["skip", "o-6", "--step", "0", "--reason", "x"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("stuck on step 1"), "{err}");

    let reason = "refunded by hand, ticket 1234";
    let (code, out, _) = baton_saga(
        &endpoint,
        ns,
        &["skip", "o-6", "--step", "charge_card", "--reason", reason],
    );
    assert_eq!(code, 0);
    assert!(out.contains("skipped saga o-6"));

    let rec = orch.log().wait_settled("o-6", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Compensated);
    let refund = rec.steps[1].compensation.as_ref().unwrap();
    assert_eq!(refund.state, PhaseState::Skipped);
    assert_eq!(
        effect_count(&schema, &undo_key(ns, "o-6", 1), "compensation").await,
        0
    );
    assert_eq!(
        effect_count(&schema, &undo_key(ns, "o-6", 0), "compensation").await,
        1
    );
    assert_eq!(rec.audit.len(), 1);
    assert_eq!(rec.audit[0].action, OperatorAction::Skip);
    assert_eq!(rec.audit[0].step, Some(1));
    assert_eq!(rec.audit[0].reason, reason);
    let (_, out, _) = baton_saga(&endpoint, ns, &["show", "o-6"]);
    let audit = line_of(&out, reason);
    assert!(audit.contains("skip"), "{audit:?}");
    assert!(line_of(&out, "charge_card  ").contains("skipped"));
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while metrics.gauge(&gauge) != Some(0.0) {
        assert!(
            std::time::Instant::now() < until,
            "{gauge} = {:?}",
            metrics.gauge(&gauge)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Finished sagas cannot be retried or skipped.
    let (code, _, err) = baton_saga(&endpoint, ns, &["retry", "o-6"]);
    assert_eq!(code, 1);
    assert!(err.contains("compensated"), "{err}");
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_saga_retried_after_the_cause_is_fixed_compensates() {
    let server = TestServer::start(Flavor::Baton);
    let endpoint = server.endpoint();
    let schema = fresh_services("t_saga_retry").await;
    let ns = "retry";
    let mut p = Policies::default();
    p.compensation.park_after = 2;
    set_outage(&schema, "payments/compensation", -1).await;
    let orch = orchestrator(&endpoint, ns, &schema, &p, "a").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    let (stop, task) = spawn_running(orch.clone());
    orch.start(&def, "o-7", &Order::new("o-7", OUT_OF_STOCK))
        .await
        .unwrap();
    let rec = orch.log().wait_settled("o-7", SETTLE).await.unwrap();
    assert!(
        matches!(
            rec.status,
            SagaStatus::Stuck {
                step: 1,
                attempts: 2,
                ..
            }
        ),
        "{:?}",
        rec.status
    );

    clear_outage(&schema, "payments/compensation").await;
    let (code, out, _) = baton_saga(
        &endpoint,
        ns,
        &["retry", "o-7", "--reason", "payment gateway is back"],
    );
    assert_eq!(code, 0, "{out}");
    let rec = orch.log().wait_settled("o-7", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Compensated);
    let refund = rec.steps[1].compensation.as_ref().unwrap();
    assert_eq!(refund.state, PhaseState::Done);
    assert_eq!(refund.attempts, 3);
    assert_eq!(
        effect_count(&schema, &undo_key(ns, "o-7", 1), "compensation").await,
        1
    );
    assert_eq!(
        effect_count(&schema, &undo_key(ns, "o-7", 0), "compensation").await,
        1
    );
    assert_eq!(rec.audit[0].action, OperatorAction::Retry);
    assert_eq!(rec.audit[0].reason, "payment gateway is back");
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_orchestrator_cannot_write_the_saga() {
    let server = TestServer::start(Flavor::Baton);
    let endpoint = server.endpoint();
    let schema = fresh_services("t_saga_deposed").await;
    let ns = "deposed";
    let p = Policies::default();
    let orch = orchestrator(&endpoint, ns, &schema, &p, "old").await;
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    orch.start(&def, "o-8", &Order::new("o-8", IN_STOCK))
        .await
        .unwrap();

    let client = saga_common::baton(&endpoint).await;
    let election = Election::new(&client, orch.log().election_name());
    let old_session = Session::new(&client, SessionOptions::new()).await.unwrap();
    let old = election.campaign(&old_session, "old").await.unwrap();
    let old_fence = LeaderFence::of(&old);
    // The old leader is replaced (its key gone, as after its lease expired).
    old.resign().await.unwrap();
    let new_session = Session::new(&client, SessionOptions::new()).await.unwrap();
    let new = election.campaign(&new_session, "new").await.unwrap();
    let new_fence = LeaderFence::of(&new);
    assert!(new_fence.token() > old_fence.token());

    let refused = orch.drive("o-8", &old_fence).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.is_fenced()),
        "{refused:?}"
    );
    let rec = orch.status("o-8").await.unwrap().unwrap();
    assert_eq!(rec.status, SagaStatus::Running);
    assert_eq!(
        rec.steps[0].action.attempts, 0,
        "not even the first attempt was recorded"
    );
    assert_eq!(
        effect_count(&schema, &step_key(ns, "o-8", 0), "action").await,
        0
    );
    assert!(
        calls(&schema, &step_key(ns, "o-8", 0)).await.is_empty(),
        "nothing was called"
    );

    let done = orch.drive("o-8", &new_fence).await.unwrap();
    assert_eq!(done, SagaStatus::Completed);
    let rec = orch.status("o-8").await.unwrap().unwrap();
    assert_eq!(
        rec.orchestrator.as_deref(),
        Some(format!("old (token {})", new_fence.token()).as_str()),
        "the writer's name and its (new) token"
    );
    new.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orchestrator_losing_its_leadership_mid_step_stops_and_the_next_finishes() {
    let server = TestServer::start(Flavor::Baton);
    let endpoint = server.endpoint();
    let schema = fresh_services("t_saga_handover").await;
    let ns = "handover";
    let p = Policies::default();
    let events: Arc<Mutex<Vec<(String, SagaEvent)>>> = Arc::default();
    let observed = |name: &'static str| {
        let events = events.clone();
        move |e: &SagaEvent| events.lock().unwrap().push((name.to_string(), e.clone()))
    };
    let a = orchestrator(&endpoint, ns, &schema, &p, "a")
        .await
        .on_event(observed("a"));
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    // The charge waits on a gate the test holds: a step in flight.
    let gate = common::connect().await;
    gate.execute("SELECT pg_advisory_lock(hashtext('gate:o-9'))", &[])
        .await
        .unwrap();
    let (stop_a, task_a) = spawn_running(a.clone());
    let order = Order {
        gate_charge: true,
        ..Order::new("o-9", IN_STOCK)
    };
    a.start(&def, "o-9", &order).await.unwrap();
    a.log()
        .wait_for("o-9", SETTLE, |r| {
            r.steps[1].action.state == PhaseState::Running
        })
        .await
        .unwrap();

    // b waits behind a; a's lease is revoked under it (what its expiry would do).
    let b = orchestrator(&endpoint, ns, &schema, &p, "b")
        .await
        .on_event(observed("b"));
    let (stop_b, task_b) = spawn_running(b.clone());
    let client = saga_common::baton(&endpoint).await;
    let leader = Election::new(&client, a.log().election_name())
        .leader()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader.value, b"a");
    client.lease_revoke(leader.lease).await.unwrap();

    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen = events.lock().unwrap().clone();
        let a_lost = seen
            .iter()
            .any(|(who, e)| who == "a" && matches!(e, SagaEvent::Lost { .. }));
        let b_leads = seen
            .iter()
            .any(|(who, e)| who == "b" && matches!(e, SagaEvent::Leading { .. }));
        if a_lost && b_leads {
            break;
        }
        assert!(std::time::Instant::now() < until, "events: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.execute("SELECT pg_advisory_unlock(hashtext('gate:o-9'))", &[])
        .await
        .unwrap();
    let rec = b.log().wait_settled("o-9", SETTLE).await.unwrap();
    assert_eq!(rec.status, SagaStatus::Completed);
    assert!(rec.orchestrator.unwrap().starts_with("b "));
    // a's charge was cut short (its transaction rolled back with its task); b ran it again
    // with the same key: one charge.
    assert!(rec.steps[1].action.attempts >= 2, "{:?}", rec.steps[1]);
    assert_eq!(
        effect_count(&schema, &step_key(ns, "o-9", 1), "action").await,
        1
    );
    for step in 0..4 {
        assert_eq!(
            effect_count(&schema, &step_key(ns, "o-9", step), "action").await,
            1
        );
    }
    let by_a_after_loss = {
        let seen = events.lock().unwrap();
        let lost_at = seen
            .iter()
            .position(|(who, e)| who == "a" && matches!(e, SagaEvent::Lost { .. }))
            .unwrap();
        seen[lost_at..]
            .iter()
            .filter(|(who, e)| who == "a" && e.boundary().is_some())
            .count()
    };
    assert_eq!(by_a_after_loss, 0, "a did nothing more after losing");
    stop_a.send(()).unwrap();
    stop_b.send(()).unwrap();
    task_a.await.unwrap();
    task_b.await.unwrap();
}
