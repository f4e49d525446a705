//! The orchestrator killed at every step boundary — a real SIGKILL of an orchestrator
//! process — against a real `baton serve` (started here) and the real PostgreSQL.
//!
//! For every boundary (`before_step`: the attempt recorded as running, the action not called;
//! `after_step`: the action returned, its result not recorded; `step_recorded`; and the same
//! three for compensations) and every step it applies to, a child process (this test binary
//! re-run with `BATON_TXN_SAGA_CHILD=<boundary>:<step>`) drives the order saga as the only
//! orchestrator of a namespace of its own and SIGKILLs itself there. This process then runs
//! an orchestrator in the same namespace; it is elected once the dead one's lease expires and
//! must finish the saga — completed, or compensated when reserve stock fails — with every
//! step's effect and every compensation's effect applied exactly once per idempotency key
//! (counted in the services' tables).

use crate::common;
use crate::saga_common;

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::saga_common::{
    effect_count, fresh_services, orchestrator, spawn_running, step_key, undo_key, Order, Policies,
    IN_STOCK, OUT_OF_STOCK,
};
use baton_client::testing::{Flavor, TestServer};
use baton_txn::pg::Schema;
use baton_txn::saga::{SagaStatus, StepFence};
use futures_util::StreamExt;

const CHILD_ENV: &str = "BATON_TXN_SAGA_CHILD";
const SAGA: &str = "o";
/// Cases run at once (each mostly waits for a lease to expire).
const PARALLEL: usize = 6;

/// The child's side: drives the saga until the named boundary, then SIGKILLs itself. Does
/// nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saga_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (point, step) = spec.split_once(':').unwrap();
    let (point, step): (String, usize) = (point.to_string(), step.parse().unwrap());
    let endpoint = std::env::var("BATON_TXN_SAGA_ENDPOINT").unwrap();
    let ns = std::env::var("BATON_TXN_SAGA_NS").unwrap();
    let schema = Schema::new(std::env::var("BATON_TXN_SAGA_SCHEMA").unwrap()).unwrap();
    let orch = orchestrator(&endpoint, &ns, &schema, &Policies::default(), "child")
        .await
        .on_event(move |e| {
            if e.boundary() == Some((point.as_str(), SAGA, step)) {
                println!("KILLED AT {point}:{step}");
                let _ = std::io::stdout().flush();
                // SAFETY: plain libc calls; this process ends here.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
            }
        });
    orch.run(std::future::pending()).await;
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// Every step succeeds: completed.
    Completes,
    /// Reserve stock fails (no stock): refund, cancel.
    Compensates,
}

async fn case(endpoint: String, schema: Schema, scenario: Scenario, point: &str, step: usize) {
    let short: String = point.split('_').map(|w| &w[..1]).collect();
    let tag = match scenario {
        Scenario::Completes => "ok",
        Scenario::Compensates => "cp",
    };
    let ns = format!("{tag}-{short}-{step}");
    let p = Policies::default();
    let def = saga_common::order_saga(&saga_common::Services::new(&schema), &p);
    let sku = match scenario {
        Scenario::Completes => IN_STOCK,
        Scenario::Compensates => OUT_OF_STOCK,
    };
    let log = baton_txn::saga::SagaLog::new(&saga_common::baton(&endpoint).await, &ns).unwrap();
    log.start(&def, SAGA, &Order::new(&format!("{ns}-order"), sku))
        .await
        .unwrap();

    // The first orchestrator, killed at the boundary.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "saga_crash::saga_child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, format!("{point}:{step}"))
        .env("BATON_TXN_SAGA_ENDPOINT", &endpoint)
        .env("BATON_TXN_SAGA_NS", &ns)
        .env("BATON_TXN_SAGA_SCHEMA", schema.name())
        .env("BATON_TEST_PG_URL", common::pg_url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("{ns}: the child never reached {point}:{step}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{ns}: {stdout}");
    assert!(
        stdout.contains(&format!("KILLED AT {point}:{step}")),
        "{ns}"
    );
    let left = log.get(SAGA).await.unwrap().unwrap();
    assert!(
        !left.status.is_settled(),
        "{ns}: the child left it unfinished"
    );

    // The second orchestrator takes over after the lease and finishes.
    let killed = Instant::now();
    let orch = orchestrator(&endpoint, &ns, &schema, &p, "parent").await;
    let (stop, task) = spawn_running(orch);
    let rec = log
        .wait_settled(SAGA, Duration::from_secs(30))
        .await
        .unwrap();
    stop.send(()).unwrap();
    task.await.unwrap();
    println!(
        "{ns}: killed at {point}:{step}, {} {:?} later",
        rec.status,
        killed.elapsed()
    );

    let client = common::connect().await;
    let fence = StepFence::new(&schema);
    let (expected, applied, compensated): (SagaStatus, &[usize], &[usize]) = match scenario {
        Scenario::Completes => (SagaStatus::Completed, &[0, 1, 2, 3], &[]),
        Scenario::Compensates => (SagaStatus::Compensated, &[0, 1], &[0, 1]),
    };
    assert_eq!(rec.status, expected, "{ns}");
    for s in 0..4 {
        let want = i64::from(applied.contains(&s));
        let got = effect_count(&schema, &step_key(&ns, SAGA, s), "action").await;
        assert_eq!(got, want, "{ns}: effects of step {s}");
        let want = i64::from(compensated.contains(&s));
        let got = effect_count(&schema, &undo_key(&ns, SAGA, s), "compensation").await;
        assert_eq!(got, want, "{ns}: compensations of step {s}");
    }
    // The cases that re-deliver with the same key did: the fence saw the repeat.
    let row = fence
        .get(&client, &step_key(&ns, SAGA, step))
        .await
        .unwrap();
    match point {
        "after_step" if applied.contains(&step) => {
            assert!(row.unwrap().repeats >= 1, "{ns}: the re-run found it done")
        }
        "after_compensation" => {
            assert!(
                row.unwrap().undo_repeats >= 1,
                "{ns}: the re-run found it compensated"
            )
        }
        _ => {}
    }
}

async fn run_cases(scenario: Scenario, schema_name: &str, cases: Vec<(&'static str, usize)>) {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_services(schema_name).await;
    let started = Instant::now();
    let n = cases.len();
    futures_util::stream::iter(cases)
        .map(|(point, step)| case(server.endpoint(), schema.clone(), scenario, point, step))
        .buffer_unordered(PARALLEL)
        .collect::<Vec<()>>()
        .await;
    println!("{n} kills in {:?}", started.elapsed());
}

const FORWARD: [&str; 3] = ["before_step", "after_step", "step_recorded"];
const BACKWARD: [&str; 3] = [
    "before_compensation",
    "after_compensation",
    "compensation_recorded",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_step_boundary_the_saga_completes_with_each_effect_once() {
    let cases = FORWARD
        .iter()
        .flat_map(|p| (0..4).map(move |s| (*p, s)))
        .collect();
    run_cases(Scenario::Completes, "t_saga_crash_ok", cases).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_boundary_of_a_failing_saga_it_compensates_each_step_once() {
    // Forward boundaries up to the failing step (reserve stock, 2), then every compensation
    // boundary of the refund (1) and the cancel (0).
    let cases = FORWARD
        .iter()
        .flat_map(|p| (0..3).map(move |s| (*p, s)))
        .chain(BACKWARD.iter().flat_map(|p| [1, 0].map(|s| (*p, s))))
        .collect();
    run_cases(Scenario::Compensates, "t_saga_crash_cp", cases).await;
}
