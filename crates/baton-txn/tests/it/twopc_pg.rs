//! Two-phase commit over two real PostgreSQL databases (schemas of the test server) with the
//! decision in a real Baton (started here). Coordinators that crash are child processes
//! that SIGKILL themselves at a named fault point ([`FaultPoint`]), so the crash is a real
//! process death at exactly that step.
//!
//! - commit, and a NO vote (a deferred constraint failing at PREPARE) → abort everywhere;
//! - a coordinator killed at every fault point → the Recoverer aborts (before the decision)
//!   or commits (after it) every branch; nothing is left prepared;
//! - a coordinator paused (SIGSTOP) past its deadline: the Recoverer aborts; resumed, the
//!   coordinator's commit loses the compare-and-set and it follows the abort;
//! - a coordinator cut off from Baton (a proxy that goes silent) cannot decide, so nothing
//!   commits; recovery aborts after the deadline, and healed, the coordinator follows;
//! - a branch rolled back by hand after a commit decision → a heuristic outcome, reported
//!   once and never retried;
//! - a prepared branch with our prefix but no intent is aborted; a foreign one is left alone;
//! - the Recoverer's log writes are fenced by its election;
//! - the same crash with the decision kept only in the coordinator's memory leaves a branch in
//!   doubt (locks held), and resolving it without the decision breaks the bank's balance.

use crate::common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::bank::{
    fresh_pg_bank, pg_prepared, pg_resource, pg_state, pg_transfer, OPENING,
};
use crate::common::{connect, pg_url};
use baton_client::testing::{Flavor, TestServer};
use baton_client::{ClientConfig, Election, Session, SessionOptions};
use baton_txn::coordination::{LeaderFence, LogError};
use baton_txn::twopc::pg::PgResource;
use baton_txn::twopc::{
    BatonDecisionLog, BranchState, Coordinator, Decision, DecisionLog, FaultPoint,
    InMemoryDecisionLog, Outcome, Recoverer, RecovererConfig, TwoPcConfig, TxState,
};

const CHILD_ENV: &str = "BATON_TXN_2PC_CHILD";
const ACCOUNTS: i32 = 10;

async fn baton(endpoint: &str) -> baton_client::Client {
    baton_client::Client::connect(ClientConfig::new([endpoint.to_string()]))
        .await
        .unwrap()
}

fn fast() -> TwoPcConfig {
    TwoPcConfig {
        decision_timeout: Duration::from_secs(1),
        ..TwoPcConfig::default()
    }
}

fn recoverer(log: Arc<dyn DecisionLog>, a: &Arc<PgResource>, b: &Arc<PgResource>) -> Recoverer {
    Recoverer::new(log)
        .with_resource(a.clone())
        .with_resource(b.clone())
        .with_config(RecovererConfig {
            interval: Duration::from_millis(200),
            grace: Duration::ZERO,
            ..RecovererConfig::default()
        })
}

/// Runs recovery passes until nothing of `namespace` is open or prepared.
async fn recover_all(rec: &Recoverer, log: &dyn DecisionLog, namespace: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = rec.resolve_once(None).await.unwrap();
        if log.open().await.unwrap().is_empty() && pg_prepared(namespace).await.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "recovery did not finish: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Banks {
    a: Arc<PgResource>,
    b: Arc<PgResource>,
    a_schema: String,
    b_schema: String,
}

async fn open_banks(name: &str) -> Banks {
    let a_schema = format!("{name}_a");
    let b_schema = format!("{name}_b");
    Banks {
        a: fresh_pg_bank(&a_schema, ACCOUNTS).await,
        b: fresh_pg_bank(&b_schema, ACCOUNTS).await,
        a_schema,
        b_schema,
    }
}

impl Banks {
    fn coordinator(&self, log: Arc<dyn DecisionLog>) -> Coordinator {
        Coordinator::new(log)
            .with_resource(self.a.clone())
            .with_resource(self.b.clone())
            .with_config(fast())
    }

    async fn transfer(&self, coord: &Coordinator, amount: i64) -> Outcome {
        pg_transfer(
            coord,
            (&self.a, &self.a_schema),
            (&self.b, &self.b_schema),
            1,
            2,
            amount,
        )
        .await
        .unwrap()
    }

    /// Both banks' sums and transfer ids.
    async fn state(&self) -> ((i64, Vec<String>), (i64, Vec<String>)) {
        (
            pg_state(&self.a_schema).await,
            pg_state(&self.b_schema).await,
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_and_a_no_vote() {
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&client, "t-commit").unwrap());
    let banks = open_banks("t2pc_commit").await;
    let metrics = common::recorder::recorded();
    let coord = banks.coordinator(log.clone());
    assert_eq!(coord.preflight().await.unwrap(), Vec::<String>::new());

    let outcome = banks.transfer(&coord, 30).await;
    assert_eq!(outcome, Outcome::Committed);
    let ((sum_a, ids_a), (sum_b, ids_b)) = banks.state().await;
    assert_eq!(
        (sum_a, sum_b),
        (
            ACCOUNTS as i64 * OPENING - 30,
            ACCOUNTS as i64 * OPENING + 30
        )
    );
    assert_eq!(ids_a, ids_b);
    let rec = &log.list(10).await.unwrap()[0];
    assert_eq!(rec.state(), TxState::Committed);
    assert!(!rec.open, "a finished transaction leaves the open set");
    assert_eq!(rec.intent.as_ref().unwrap().branches.len(), 2);

    // A NO vote: bank b's transfers get a deferred check that fails at PREPARE.
    connect()
        .await
        .batch_execute(&format!(
            "ALTER TABLE {s}.transfers ADD CONSTRAINT small CHECK (amount < 100);
             ALTER TABLE {s}.transfers DROP CONSTRAINT small;
             CREATE TABLE {s}.limits (amount bigint,
                 CONSTRAINT one UNIQUE (amount) DEFERRABLE INITIALLY DEFERRED);
             INSERT INTO {s}.limits VALUES (500);
             CREATE FUNCTION {s}.limit_check() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO {s}.limits VALUES (NEW.amount); RETURN NEW; END $$;
             CREATE TRIGGER limit_check AFTER INSERT ON {s}.transfers
               FOR EACH ROW EXECUTE FUNCTION {s}.limit_check();",
            s = banks.b_schema
        ))
        .await
        .unwrap();
    match banks.transfer(&coord, 500).await {
        Outcome::Aborted { reason, pending } => {
            assert!(reason.contains("voted no"), "{reason}");
            assert!(pending.is_empty());
        }
        other => panic!("expected an abort, got {other:?}"),
    }
    let ((sum_a2, ids_a2), (sum_b2, _)) = banks.state().await;
    assert_eq!((sum_a2, sum_b2), (sum_a, sum_b), "nothing moved");
    assert_eq!(ids_a2, ids_a);
    assert!(pg_prepared("t-commit").await.is_empty());
    assert_eq!(log.list(1).await.unwrap()[0].state(), TxState::Aborted);
    // Finished transactions are purged after their retention; open ones are kept.
    let open = baton_txn::twopc::Intent {
        tx: baton_txn::twopc::TxId::generate(),
        branches: Vec::new(),
        created_ms: 0,
        deadline_ms: u64::MAX,
        coordinator: "test".into(),
    };
    log.record_intent(&open).await.unwrap();
    assert_eq!(
        log.purge(Duration::from_secs(3600), None).await.unwrap(),
        0,
        "too young"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(log.purge(Duration::ZERO, None).await.unwrap(), 2);
    let left = log.list(10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].tx, open.tx);
    // Markers likewise: bank a holds the committed transfer's (the aborted one's rolled back).
    use baton_txn::twopc::Resource;
    assert_eq!(
        banks
            .a
            .purge_markers(Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(banks.a.purge_markers(Duration::ZERO).await.unwrap(), 1);
    // Decision latency, one value per transaction; outcomes counted.
    let ns = "namespace=t-commit";
    assert_eq!(
        metrics.observations(&format!("baton_txn_2pc_decision_seconds{{{ns}}}")),
        2
    );
    for outcome in ["committed", "aborted"] {
        let key = format!("baton_txn_2pc_outcomes_total{{{ns},outcome={outcome}}}");
        assert_eq!(metrics.observations(&key), 1, "{key}");
    }
}

/// The child's side: one transfer by a coordinator that SIGKILLs itself at `point` (or is
/// paused there by the parent, with `pause`), over the banks and Baton named in the
/// environment; prints its outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // only a child process does anything
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [mode, point, namespace, endpoint, name] = parts[..] else {
        panic!("bad child spec {spec}");
    };
    let log: Arc<dyn DecisionLog> = if mode == "memory" {
        Arc::new(InMemoryDecisionLog::new(namespace).unwrap())
    } else {
        Arc::new(BatonDecisionLog::new(&baton(endpoint).await, namespace).unwrap())
    };
    let banks = Banks {
        a: Arc::new(pg_resource(
            &format!("{name}_a"),
            &baton_txn::pg::Schema::new(format!("{name}_a")).unwrap(),
        )),
        b: Arc::new(pg_resource(
            &format!("{name}_b"),
            &baton_txn::pg::Schema::new(format!("{name}_b")).unwrap(),
        )),
        a_schema: format!("{name}_a"),
        b_schema: format!("{name}_b"),
    };
    let point = point.to_string();
    let pause = mode == "pause";
    let coord = banks
        .coordinator(log)
        .with_fault_hook(move |p: &FaultPoint| {
            if p.name() == point {
                println!("REACHED {point}");
                if pause {
                    // The parent stops this process now; it resumes long after the deadline.
                    std::thread::sleep(Duration::from_millis(500));
                } else {
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                }
            }
        });
    let outcome = banks.transfer(&coord, 70).await;
    println!("OUTCOME {outcome:?}");
}

/// Spawns the child coordinator; returns it with its stdout lines.
fn spawn_child(
    mode: &str,
    point: &str,
    namespace: &str,
    endpoint: &str,
    name: &str,
) -> (
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "twopc_pg::coordinator_child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(
            CHILD_ENV,
            format!("{mode}|{point}|{namespace}|{endpoint}|{name}"),
        )
        .env("BATON_TEST_PG_URL", pg_url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// Runs a child that kills itself at `point`; checks that it died of SIGKILL there.
fn run_killed_child(mode: &str, point: &str, namespace: &str, endpoint: &str, name: &str) {
    let (mut child, lines) = spawn_child(mode, point, namespace, endpoint, name);
    let out: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "child output: {out:?}"
    );
    assert!(
        out.iter().any(|l| l.contains(&format!("REACHED {point}"))),
        "the child died before {point}: {out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_killed_at_every_fault_point_is_finished_by_recovery() {
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let cases = [
        ("after_intent", false),
        ("after_prepare:t2pc-kill-a", false),
        ("after_all_prepared", false),
        ("after_decision", true),
        ("after_phase2:t2pc-kill-a", true),
    ];
    for (i, (point, commits)) in cases.into_iter().enumerate() {
        let namespace = format!("t-kill-{i}");
        let log: Arc<dyn DecisionLog> =
            Arc::new(BatonDecisionLog::new(&client, &namespace).unwrap());
        let banks = open_banks("t2pc_kill").await;
        run_killed_child("baton", point, &namespace, &server.endpoint(), "t2pc_kill");

        let prepared = pg_prepared(&namespace).await;
        println!("{point}: prepared after the kill: {prepared:?}");
        if point == "after_all_prepared" || point == "after_decision" {
            assert_eq!(prepared.len(), 2, "both branches in doubt");
        }
        // Intent before PREPARE: every prepared branch's exact GID is already in the log.
        let tx = &log.list(1).await.unwrap()[0];
        let logged: Vec<&str> = tx
            .intent
            .as_ref()
            .expect("the intent is logged first")
            .branches
            .iter()
            .map(|b| b.gid.as_str())
            .collect();
        for gid in &prepared {
            assert!(
                logged.contains(&gid.as_str()),
                "{point}: {gid} not in {logged:?}"
            );
        }
        let rec = recoverer(log.clone(), &banks.a, &banks.b);
        let in_doubt = format!("baton_txn_2pc_in_doubt_branches{{namespace={namespace}}}");
        let metrics = common::recorder::recorded();
        rec.resolve_once(None).await.unwrap();
        assert_eq!(
            metrics.gauge(&in_doubt),
            Some(prepared.len() as f64),
            "{point}"
        );
        recover_all(&rec, log.as_ref(), &namespace).await;
        rec.resolve_once(None).await.unwrap();
        assert_eq!(
            metrics.gauge(&in_doubt),
            Some(0.0),
            "{point}: nothing in doubt"
        );

        let ((sum_a, ids_a), (sum_b, ids_b)) = banks.state().await;
        let total = ACCOUNTS as i64 * OPENING;
        if commits {
            assert_eq!(
                (sum_a, sum_b),
                (total - 70, total + 70),
                "{point}: committed"
            );
            assert_eq!(ids_a.len(), 1);
        } else {
            assert_eq!((sum_a, sum_b), (total, total), "{point}: aborted");
            assert!(ids_a.is_empty());
        }
        assert_eq!(ids_a, ids_b, "{point}: all or nothing");
        assert!(pg_prepared(&namespace).await.is_empty());
        let tx = &log.list(1).await.unwrap()[0];
        let expect = if commits {
            TxState::Committed
        } else {
            TxState::Aborted
        };
        assert_eq!(tx.state(), expect, "{point}: {tx:?}");
        if !commits {
            assert!(
                tx.decision.as_ref().unwrap().by.contains("recoverer"),
                "{tx:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_coordinator_follows_the_recoverers_abort() {
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let namespace = "t-pause";
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&client, namespace).unwrap());
    let banks = open_banks("t2pc_pause").await;
    let (mut child, mut lines) = spawn_child(
        "pause",
        "after_all_prepared",
        namespace,
        &server.endpoint(),
        "t2pc_pause",
    );
    loop {
        let line = lines.next().expect("child output").unwrap();
        if line.contains("REACHED after_all_prepared") {
            break;
        }
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    // Past its deadline, recovery aborts it and rolls both prepared branches back.
    assert_eq!(pg_prepared(namespace).await.len(), 2);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let rec = recoverer(log.clone(), &banks.a, &banks.b);
    let report = rec.resolve_once(None).await.unwrap();
    assert_eq!(report.aborted.len(), 1, "{report:?}");
    assert_eq!(report.rolled_back.len(), 2, "{report:?}");
    // Resumed, the coordinator tries to decide commit, loses, and follows the abort.
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let out: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(child.wait().unwrap().success());
    let outcome = out
        .iter()
        .find(|l| l.starts_with("OUTCOME"))
        .expect("an outcome");
    assert!(
        outcome.contains("Aborted") && outcome.contains("recoverer"),
        "{outcome}"
    );
    let ((sum_a, ids_a), (sum_b, _)) = banks.state().await;
    assert_eq!(
        (sum_a, sum_b),
        (ACCOUNTS as i64 * OPENING, ACCOUNTS as i64 * OPENING)
    );
    assert!(ids_a.is_empty());
    assert!(pg_prepared(namespace).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_rolled_back_by_hand_after_commit_is_a_heuristic_outcome() {
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let namespace = "t-heur";
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&client, namespace).unwrap());
    let banks = open_banks("t2pc_heur").await;
    run_killed_child(
        "baton",
        "after_decision",
        namespace,
        &server.endpoint(),
        "t2pc_heur",
    );
    let prepared = pg_prepared(namespace).await;
    let a_gid = prepared
        .iter()
        .find(|g| g.ends_with(":t2pc-heur-a"))
        .unwrap();
    // An operator "cleans up" one prepared transaction by hand.
    connect()
        .await
        .batch_execute(&format!("ROLLBACK PREPARED '{a_gid}'"))
        .await
        .unwrap();

    let metrics = common::recorder::recorded();
    let rec = recoverer(log.clone(), &banks.a, &banks.b);
    let report = rec.resolve_once(None).await.unwrap();
    assert_eq!(report.heuristic.len(), 1, "{report:?}");
    assert_eq!(
        metrics.observations("baton_txn_2pc_heuristic_total{namespace=t-heur}"),
        1
    );
    assert_eq!(report.heuristic[0].1, BranchState::HeuristicRollback);
    assert_eq!(report.committed.len(), 1, "{report:?}");
    let tx = &log.list(1).await.unwrap()[0];
    assert_eq!(tx.state(), TxState::Heuristic);
    assert!(!tx.open, "reported once, not retried");
    // The next pass has nothing to do.
    let again = rec.resolve_once(None).await.unwrap();
    assert!(
        again.heuristic.is_empty() && again.committed.is_empty(),
        "{again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_prefixed_branches_are_aborted_and_foreign_ones_left_alone() {
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let namespace = "t-orphan";
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&client, namespace).unwrap());
    // A failed earlier run may have left its foreign transaction prepared (holding a lock
    // on the schema this test drops).
    let c = connect().await;
    for r in c
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, 'foreign-t2pc-')",
            &[],
        )
        .await
        .unwrap()
    {
        let gid: String = r.get(0);
        c.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
            .await
            .unwrap();
    }
    let banks = open_banks("t2pc_orphan").await;
    let ours = format!(
        "bt1:{namespace}:{}:t2pc-orphan-a",
        baton_txn::twopc::TxId::generate()
    );
    let foreign = format!("foreign-t2pc-{}", std::process::id());
    for (gid, account) in [(&ours, 3), (&foreign, 4)] {
        c.batch_execute(&format!(
            "BEGIN; UPDATE t2pc_orphan_a.accounts SET balance = balance + 1 WHERE id = {account};
             PREPARE TRANSACTION '{gid}'"
        ))
        .await
        .unwrap();
    }
    let rec = recoverer(log.clone(), &banks.a, &banks.b);
    let report = rec.resolve_once(None).await.unwrap();
    assert_eq!(report.aborted.len(), 1, "{report:?}");
    assert_eq!(report.rolled_back.len(), 1);
    let left: Vec<String> = c
        .query("SELECT gid FROM pg_prepared_xacts", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!left.contains(&ours));
    assert!(
        left.contains(&foreign),
        "a foreign prepared transaction is not ours to touch"
    );
    c.batch_execute(&format!("ROLLBACK PREPARED '{foreign}'"))
        .await
        .unwrap();
    let tx = log
        .get(ours.split(':').nth(2).unwrap().parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tx.decision.unwrap().decision, Decision::Abort);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_recoverer_cannot_write_the_log() {
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let log = BatonDecisionLog::new(&client, "t-fence").unwrap();
    let election = Election::new(&client, "t-fence/recoverer");
    let old_session = Session::new(&client, SessionOptions::new()).await.unwrap();
    let old = election.campaign(&old_session, "old").await.unwrap();
    let old_fence = LeaderFence::of(&old);
    // The old leader's session ends (as if it was paused past its TTL); a new one is elected.
    client.lease_revoke(old_session.lease()).await.unwrap();
    let new_session = Session::new(&client, SessionOptions::new()).await.unwrap();
    let new = election.campaign(&new_session, "new").await.unwrap();
    let new_fence = LeaderFence::of(&new);

    let tx = baton_txn::twopc::TxId::generate();
    let stale = log
        .decide(tx, Decision::Abort, "old", Some(&old_fence))
        .await;
    assert!(matches!(stale, Err(LogError::Fenced { .. })), "{stale:?}");
    assert!(log.get(tx).await.unwrap().is_none(), "nothing written");
    let d = log
        .decide(tx, Decision::Abort, "new", Some(&new_fence))
        .await
        .unwrap();
    assert_eq!(d.by, "new");
    // Write-once: a later commit attempt gets the abort back.
    let again = log
        .decide(tx, Decision::Commit, "late", None)
        .await
        .unwrap();
    assert_eq!(
        (again.decision, again.by.as_str()),
        (Decision::Abort, "new")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_kept_in_memory_leaves_branches_in_doubt() {
    let server = TestServer::start(Flavor::Baton);
    let total = ACCOUNTS as i64 * OPENING;

    // The coordinator keeps its log in memory; it commits bank a, then dies before bank b.
    let banks = open_banks("t2pc_mem").await;
    run_killed_child(
        "memory",
        "after_phase2:t2pc-mem-a",
        "t-mem",
        &server.endpoint(),
        "t2pc_mem",
    );
    let prepared = pg_prepared("t-mem").await;
    assert_eq!(
        prepared.len(),
        1,
        "bank b's branch is in doubt: {prepared:?}"
    );
    // In doubt means blocked: the branch holds its row lock.
    let c = connect().await;
    let blocked = c
        .batch_execute(
            "BEGIN; SET LOCAL lock_timeout = '300ms';
             UPDATE t2pc_mem_b.accounts SET balance = balance WHERE id = 2; COMMIT",
        )
        .await;
    assert!(blocked.is_err(), "the in-doubt branch holds its lock");
    let _ = c.batch_execute("ROLLBACK").await;
    // Nobody else knows the decision: the decision died with the process. A new process
    // can only guess. Presuming abort — the usual guess — breaks atomicity here: bank a
    // committed, so the money leaves a and never arrives in b.
    let fresh: Arc<dyn DecisionLog> = Arc::new(InMemoryDecisionLog::new("t-mem").unwrap());
    let guess = recoverer(fresh, &banks.a, &banks.b);
    guess.resolve_once(None).await.unwrap();
    let ((sum_a, _), (sum_b, _)) = banks.state().await;
    println!(
        "in-memory decision, guessed: a {sum_a} + b {sum_b} = {}",
        sum_a + sum_b
    );
    assert_eq!(sum_a + sum_b, 2 * total - 70, "70 vanished");

    // The same crash with the decision in Baton: recovery reads it and commits bank b.
    let client = baton(&server.endpoint()).await;
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&client, "t-mem2").unwrap());
    let banks = open_banks("t2pc_mem").await;
    run_killed_child(
        "baton",
        "after_phase2:t2pc-mem-a",
        "t-mem2",
        &server.endpoint(),
        "t2pc_mem",
    );
    assert_eq!(pg_prepared("t-mem2").await.len(), 1);
    recover_all(
        &recoverer(log.clone(), &banks.a, &banks.b),
        log.as_ref(),
        "t-mem2",
    )
    .await;
    let ((sum_a, ids_a), (sum_b, ids_b)) = banks.state().await;
    assert_eq!((sum_a, sum_b), (total - 70, total + 70));
    assert_eq!(ids_a, ids_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_cut_off_from_baton_cannot_commit() {
    let server = TestServer::start(Flavor::Baton);
    let namespace = "t-cut";
    // The coordinator reaches Baton through a proxy that goes silent once every branch is
    // prepared (a partition between it and the Raft group); recovery talks to Baton directly.
    let proxy = Arc::new(baton_client::testing::Proxy::start(server.endpoint()).await);
    let cut_off = baton_client::Client::connect(
        ClientConfig::new([proxy.endpoint()]).with_request_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let direct = baton(&server.endpoint()).await;
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&direct, namespace).unwrap());
    let banks = open_banks("t2pc_cut").await;
    let hook_proxy = proxy.clone();
    let coord = banks
        .coordinator(Arc::new(
            BatonDecisionLog::new(&cut_off, namespace).unwrap(),
        ))
        .with_fault_hook(move |p: &FaultPoint| {
            if *p == FaultPoint::AfterAllPrepared {
                hook_proxy.pause();
            }
        });
    let coordinating = tokio::spawn(async move { banks_transfer(coord).await });

    // Cut off, the coordinator cannot decide: past the deadline recovery aborts, and both
    // branches roll back. Nothing was committed in the meantime.
    let rec = recoverer(log.clone(), &banks.a, &banks.b);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let report = rec.resolve_once(None).await.unwrap();
        if report.aborted.len() == 1 {
            assert_eq!(report.rolled_back.len(), 2, "{report:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "recovery never aborted: {report:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ((sum_a, ids_a), (sum_b, _)) = banks.state().await;
    assert_eq!(
        (sum_a, sum_b),
        (ACCOUNTS as i64 * OPENING, ACCOUNTS as i64 * OPENING)
    );
    assert!(ids_a.is_empty());

    // Healed, the coordinator learns the decision it lost and follows it (or, if its retries
    // ran out first, reports that the log failed: recovery has finished the transaction
    // either way).
    proxy.resume();
    match coordinating.await.unwrap() {
        Ok(Outcome::Aborted { reason, .. }) => assert!(reason.contains("recoverer"), "{reason}"),
        Err(baton_txn::twopc::TxError::Log(e)) => println!("the coordinator gave up: {e}"),
        other => panic!("a cut-off coordinator must not commit: {other:?}"),
    }
    assert!(pg_prepared(namespace).await.is_empty());
    assert_eq!(log.list(1).await.unwrap()[0].state(), TxState::Aborted);
}

/// One transfer of 70 from bank a to bank b (the banks of `t2pc_cut`).
async fn banks_transfer(coord: Coordinator) -> Result<Outcome, baton_txn::twopc::TxError> {
    let banks = Banks {
        a: Arc::new(pg_resource(
            "t2pc_cut_a",
            &baton_txn::pg::Schema::new("t2pc_cut_a").unwrap(),
        )),
        b: Arc::new(pg_resource(
            "t2pc_cut_b",
            &baton_txn::pg::Schema::new("t2pc_cut_b").unwrap(),
        )),
        a_schema: "t2pc_cut_a".into(),
        b_schema: "t2pc_cut_b".into(),
    };
    pg_transfer(
        &coord,
        (&banks.a, &banks.a_schema),
        (&banks.b, &banks.b_schema),
        1,
        2,
        70,
    )
    .await
}
