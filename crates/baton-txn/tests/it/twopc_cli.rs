//! `baton 2pc list|show` — what an operator sees of the 2PC decision log — against a real
//! `baton serve`, the real PostgreSQL and the real `baton` binary (`target/debug/baton`, built
//! by `cargo build -p baton`).
//!
//! One namespace holds a transaction in each state the CLI must tell apart, each made the
//! way it happens in production:
//!
//! - committed: a transfer by a [`Coordinator`];
//! - aborted: an intent whose coordinator died after preparing one branch, past its
//!   deadline, aborted by the [`Recoverer`] (which rolls the prepared branch back);
//! - committing: decided commit, one branch's database unreachable (the Recoverer commits
//!   the other and records the failure as the last error);
//! - heuristic: decided commit, one prepared branch rolled back by hand before the
//!   Recoverer came (it finds the branch gone without its marker row);
//! - preparing: an intent with no decision, within its deadline.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::bank::{fresh_pg_bank, pg_prepared, pg_transfer};
use crate::common::connect;
use baton_client::testing::{baton_binary, Flavor, TestServer};
use baton_client::ClientConfig;
use baton_txn::twopc::pg::PgResource;
use baton_txn::twopc::{
    gid_of, BatonDecisionLog, BranchId, BranchState, Coordinator, Decision, DecisionLog, Intent,
    IntentBranch, Outcome, Recoverer, RecovererConfig, Resource, TxId, TxState,
};
use serde_json::Value;

const NS: &str = "t-cli";

/// Runs `baton 2pc <args> --endpoints <endpoint>` (plus `--namespace <ns>` unless `args`
/// names one); returns (status, stdout, stderr).
fn baton_2pc(endpoint: &str, ns: &str, args: &[&str]) -> (i32, String, String) {
    let bin = baton_binary();
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p baton` first",
        bin.display()
    );
    let mut cmd = Command::new(bin);
    cmd.arg("2pc").args(args).args(["--endpoints", endpoint]);
    if !args.contains(&"--namespace") {
        cmd.args(["--namespace", ns]);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    println!("$ baton 2pc {}\n{stdout}{stderr}", args.join(" "));
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

fn line_of<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
}

fn assert_cells(row: &str, cells: &[&str]) {
    for cell in cells {
        assert!(row.contains(cell), "{cell:?} missing from {row:?}");
    }
}

/// A table row's cells (columns are two or more spaces apart; no cell holds two spaces).
fn cells(row: &str) -> Vec<&str> {
    row.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// The value of `key` in `show`'s head (a two-column table).
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once("  ")?;
            (k == key).then_some(v.trim())
        })
        .unwrap_or_else(|| panic!("no field {key:?} in:\n{text}"))
}

/// The transaction ids of a `list` table (its first column), in order.
fn listed_ids(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What a coordinator does before its first PREPARE: the intent, with every branch's GID.
async fn record_intent(
    log: &dyn DecisionLog,
    branches: &[&BranchId],
    created_ms: u64,
    deadline_ms: u64,
    coordinator: &str,
) -> TxId {
    let tx = TxId::generate();
    let intent = Intent {
        tx,
        branches: branches
            .iter()
            .map(|b| IntentBranch {
                branch: (*b).clone(),
                gid: gid_of(log, tx, b).to_string(),
            })
            .collect(),
        created_ms,
        deadline_ms,
        coordinator: coordinator.into(),
    };
    log.record_intent(&intent).await.unwrap();
    tx
}

/// What a participant does at PREPARE (`PgBranch::prepare`), done by hand: the work and the
/// marker row in one transaction, then `PREPARE TRANSACTION` under the branch's GID.
async fn prepare_by_hand(schema: &str, gid: &str, account: i32) {
    connect()
        .await
        .batch_execute(&format!(
            "BEGIN;
             UPDATE {schema}.accounts SET balance = balance + 1 WHERE id = {account};
             INSERT INTO {schema}.twopc_marker (gid) VALUES ('{gid}');
             PREPARE TRANSACTION '{gid}'"
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_every_state_and_heuristic_branches_loudly() {
    let server = TestServer::start(Flavor::Baton);
    let endpoint = server.endpoint();
    let client = baton_client::Client::connect(ClientConfig::new([endpoint.clone()]))
        .await
        .unwrap();
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&client, NS).unwrap());
    // A failed earlier run may have left branches prepared; they would hold locks on the
    // schemas dropped below.
    let c = connect().await;
    for gid in pg_prepared(NS).await {
        c.batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
            .await
            .unwrap();
    }
    let (a_schema, b_schema) = ("t2pc_cli_a", "t2pc_cli_b");
    let a = fresh_pg_bank(a_schema, 10).await;
    let b = fresh_pg_bank(b_schema, 10).await;
    let (a_id, b_id) = (a.id().clone(), b.id().clone());
    // A database nobody can reach (nothing listens on port 1): phase 2 fails there.
    let down_id = BranchId::new("t2pc-cli-down").unwrap();
    let down = Arc::new(PgResource::new(
        down_id.clone(),
        "postgres://baton@127.0.0.1:1/baton".parse().unwrap(),
        baton_txn::pg::Schema::new("t2pc_cli_down").unwrap(),
    ));

    // Committed, by a coordinator.
    let coord = Coordinator::new(log.clone())
        .with_resource(a.clone())
        .with_resource(b.clone());
    let outcome = pg_transfer(&coord, (&a, a_schema), (&b, b_schema), 1, 2, 30)
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Committed);
    let committed = log.list(1).await.unwrap()[0].tx;

    let now = now_ms();
    // Aborted: its coordinator prepared branch a and died; the deadline has passed.
    let dead = "coordinator crashed-host/42";
    let aborted = record_intent(
        log.as_ref(),
        &[&a_id, &b_id],
        now - 60_000,
        now - 30_000,
        dead,
    )
    .await;
    prepare_by_hand(
        a_schema,
        &gid_of(log.as_ref(), aborted, &a_id).to_string(),
        3,
    )
    .await;

    // Committing: decided commit; branch a prepared, the other branch's database down.
    let committing =
        record_intent(log.as_ref(), &[&a_id, &down_id], now, now + 600_000, dead).await;
    prepare_by_hand(
        a_schema,
        &gid_of(log.as_ref(), committing, &a_id).to_string(),
        4,
    )
    .await;
    let by = format!("{dead}: every branch voted yes");
    log.decide(committing, Decision::Commit, &by, None)
        .await
        .unwrap();

    // Heuristic: decided commit with both branches prepared, then someone "cleans up" branch
    // a with ROLLBACK PREPARED before phase 2 reached it.
    let heuristic = record_intent(log.as_ref(), &[&a_id, &b_id], now, now + 600_000, dead).await;
    let heur_a = gid_of(log.as_ref(), heuristic, &a_id).to_string();
    let heur_b = gid_of(log.as_ref(), heuristic, &b_id).to_string();
    prepare_by_hand(a_schema, &heur_a, 5).await;
    prepare_by_hand(b_schema, &heur_b, 5).await;
    log.decide(heuristic, Decision::Commit, &by, None)
        .await
        .unwrap();
    c.batch_execute(&format!("ROLLBACK PREPARED '{heur_a}'"))
        .await
        .unwrap();

    // Preparing: intent recorded, no decision, deadline ten minutes away.
    let alive = "coordinator busy-host/7";
    let preparing = record_intent(log.as_ref(), &[&a_id, &b_id], now, now + 600_000, alive).await;

    let recoverer = Recoverer::new(log.clone())
        .with_resource(a.clone())
        .with_resource(b.clone())
        .with_resource(down.clone())
        .with_config(RecovererConfig {
            grace: Duration::ZERO,
            ..RecovererConfig::default()
        });
    let report = recoverer.resolve_once(None).await.unwrap();
    assert_eq!(report.aborted, vec![aborted], "{report:?}");
    assert_eq!(report.waiting, vec![preparing], "{report:?}");
    assert_eq!(report.heuristic.len(), 1, "{report:?}");
    assert_eq!(report.heuristic[0].0.to_string(), heur_a);
    assert_eq!(report.heuristic[0].1, BranchState::HeuristicRollback);
    for (tx, state) in [
        (committed, TxState::Committed),
        (aborted, TxState::Aborted),
        (committing, TxState::Committing),
        (heuristic, TxState::Heuristic),
        (preparing, TxState::Preparing),
    ] {
        let rec = log.get(tx).await.unwrap().unwrap();
        assert_eq!(rec.state(), state, "{rec:?}");
    }
    assert!(log.list(0).await.unwrap().is_empty(), "a limit of 0 is 0");
    let mut newest_first = [committed, aborted, committing, heuristic, preparing];
    newest_first.sort_by(|x, y| y.cmp(x));
    let newest_first: Vec<String> = newest_first.iter().map(|t| t.to_string()).collect();
    let id = |tx: TxId| tx.to_string();

    // ---- list ----------------------------------------------------------------------------
    let (code, out, _) = baton_2pc(&endpoint, NS, &["list"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("ID "), "{out}");
    assert_cells(
        out.lines().next().unwrap(),
        &[
            "STATE",
            "DECISION",
            "BRANCHES",
            "CREATED",
            "DEADLINE",
            "COORDINATOR",
        ],
    );
    assert_eq!(listed_ids(&out), newest_first, "newest first");
    // ID, STATE, DECISION, BRANCHES, CREATED, AGE, DEADLINE, COORDINATOR
    let row = |tx: TxId| cells(line_of(&out, &id(tx)));
    let committed_row = row(committed);
    assert_eq!(committed_row[1..4], ["committed", "commit", "2"]);
    assert_eq!(committed_row[6], "-", "no deadline once decided");
    assert!(committed_row[7].starts_with("coordinator "));
    assert_eq!(row(aborted)[1..4], ["aborted", "abort", "2"]);
    assert_eq!(row(aborted)[6..], ["-", dead]);
    assert!(row(aborted)[5].starts_with("1m0"), "age from the intent");
    assert_eq!(row(committing)[1..4], ["committing", "commit", "1/2 final"]);
    assert_eq!(row(heuristic)[1..4], ["heuristic", "commit", "2"]);
    let preparing_row = row(preparing);
    assert_eq!(preparing_row[1..4], ["preparing", "-", "2"]);
    assert_eq!(preparing_row[7], alive);
    let left = preparing_row[6];
    assert!(
        left.ends_with("s left") && (left.starts_with("9m") || left == "10m00s left"),
        "time left to the deadline: {left:?}"
    );

    let (code, out, _) = baton_2pc(&endpoint, NS, &["list", "--limit", "2"]);
    assert_eq!(code, 0);
    assert_eq!(listed_ids(&out), newest_first[..2]);

    let (code, out, _) = baton_2pc(&endpoint, NS, &["list", "--state", "heuristic"]);
    assert_eq!(code, 0);
    assert_eq!(listed_ids(&out), vec![id(heuristic)]);
    let (_, out, _) = baton_2pc(
        &endpoint,
        NS,
        &["list", "--state", "heuristic", "-o", "json"],
    );
    let listed: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(listed["tx"], id(heuristic));
    assert_eq!(listed["state"], "heuristic");

    let (code, out, _) = baton_2pc(&endpoint, NS, &["list", "--open"]);
    assert_eq!(code, 0);
    let mut open = vec![id(committing), id(preparing)];
    open.sort_by(|x, y| y.cmp(x));
    assert_eq!(listed_ids(&out), open);
    let (_, out, _) = baton_2pc(&endpoint, NS, &["list", "--open", "-o", "simple"]);
    assert_eq!(out.lines().count(), 2, "{out}");
    let simple = line_of(&out, &id(committing));
    assert!(
        simple.starts_with(&format!("{}\tcommitting\tcommit\t1/2\t", id(committing))),
        "{simple:?}"
    );

    let (code, _, err) = baton_2pc(&endpoint, NS, &["list", "--state", "stuck"]);
    assert_eq!(code, 1);
    assert!(
        err.starts_with("baton 2pc list: unknown state \"stuck\"; use one of preparing,"),
        "{err}"
    );
    let (code, out, _) = baton_2pc(&endpoint, NS, &["list", "--namespace", "t-cli-none"]);
    assert_eq!((code, out.trim()), (0, "no transactions"));

    // ---- show ----------------------------------------------------------------------------
    let (code, out, _) = baton_2pc(&endpoint, NS, &["show", &id(heuristic)]);
    assert_eq!(code, 0);
    assert_eq!(field(&out, "transaction"), id(heuristic));
    assert_eq!(field(&out, "state"), "heuristic");
    assert_eq!(field(&out, "coordinator"), dead);
    assert_eq!(field(&out, "decision"), "commit");
    assert_eq!(field(&out, "decided by"), by);
    assert!(
        field(&out, "decided").ends_with(" after the intent)"),
        "{out}"
    );
    assert!(field(&out, "created").ends_with(" ago)"), "{out}");
    assert_eq!(field(&out, "open"), "no");
    assert_cells(
        line_of(&out, &format!("{heur_a} ")),
        &["t2pc-cli-a", " heuristic_rollback ", " 1 "],
    );
    assert_cells(
        line_of(&out, &format!("{heur_b} ")),
        &["t2pc-cli-b", " committed ", " 1 "],
    );
    let warning = line_of(&out, "HEURISTIC:");
    assert!(
        warning.starts_with("HEURISTIC: branch t2pc-cli-a"),
        "{warning}"
    );
    assert_cells(
        warning,
        &[
            &heur_a,
            "rolled back although the decision was commit",
            "by hand",
            "a human must look",
        ],
    );
    assert_eq!(out.matches("HEURISTIC:").count(), 1, "only branch a");

    let (code, out, _) = baton_2pc(&endpoint, NS, &["show", &id(heuristic), "-o", "json"]);
    assert_eq!(code, 0);
    let rec: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(rec["tx"], id(heuristic));
    assert_eq!(rec["state"], "heuristic");
    assert_eq!(rec["open"], false);
    assert_eq!(rec["intent"]["coordinator"], dead);
    assert_eq!(rec["intent"]["branches"][0]["gid"], heur_a);
    assert_eq!(rec["decision"]["decision"], "commit");
    assert_eq!(rec["decision"]["by"], by);
    assert_eq!(rec["branches"]["t2pc-cli-a"]["state"], "heuristic_rollback");
    assert_eq!(rec["branches"]["t2pc-cli-b"]["state"], "committed");
    assert_eq!(rec["branches"]["t2pc-cli-b"]["attempts"], 1);
    // The JSON is the record: it reads back as one.
    let mut back = rec.clone();
    back.as_object_mut().unwrap().remove("state");
    let back: baton_txn::twopc::TxRecord = serde_json::from_value(back).unwrap();
    assert_eq!(back, log.get(heuristic).await.unwrap().unwrap());

    // A branch's GID, as pg_prepared_xacts shows it, finds its transaction.
    let (code, out, _) = baton_2pc(&endpoint, NS, &["show", &heur_b]);
    assert_eq!(code, 0);
    assert_eq!(field(&out, "transaction"), id(heuristic));

    let (code, out, _) = baton_2pc(&endpoint, NS, &["show", &id(committing)]);
    assert_eq!(code, 0);
    assert_eq!(field(&out, "state"), "committing");
    assert!(out.contains("the Recoverer finishes"), "{out}");
    assert!(field(&out, "open").starts_with("yes"));
    // BRANCH, GID, STATE, ATTEMPTS, UPDATED, LAST ERROR
    let down_row = cells(line_of(&out, "t2pc-cli-down "));
    assert_eq!(down_row[2..4], ["pending", "2"], "{down_row:?}");
    assert!(
        down_row[5].contains("error connecting to server"),
        "the last error is shown: {down_row:?}"
    );
    let a_row = cells(line_of(
        &out,
        &gid_of(log.as_ref(), committing, &a_id).to_string(),
    ));
    assert_eq!(a_row[2..], ["committed", "1", a_row[4], "-"]);

    let (code, out, _) = baton_2pc(&endpoint, NS, &["show", &id(aborted)]);
    assert_eq!(code, 0);
    assert_eq!(field(&out, "decision"), "abort");
    assert_cells(
        field(&out, "decided by"),
        &["recoverer", "undecided past its deadline"],
    );
    assert!(!out.contains("HEURISTIC"));
    assert_eq!(out.matches(" rolled_back ").count(), 2, "{out}");

    let (code, out, _) = baton_2pc(&endpoint, NS, &["show", &id(preparing)]);
    assert_eq!(code, 0);
    assert_eq!(field(&out, "decision"), "none yet");
    assert!(field(&out, "deadline").ends_with(" left)"), "{out}");
    assert!(out.contains("still within its deadline"), "{out}");

    // Unknown ids: a clear message on stderr, nothing on stdout, status 1.
    let unknown = id(TxId::generate());
    let (code, out, err) = baton_2pc(&endpoint, NS, &["show", &unknown]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err.trim(),
        format!("baton 2pc show: no transaction {unknown} in namespace {NS} (wrong --namespace?)")
    );
    let (code, _, err) = baton_2pc(
        &endpoint,
        NS,
        &["show", &id(heuristic), "--namespace", "t-cli-none"],
    );
    assert_eq!(code, 1);
    assert!(err.contains("no transaction"), "{err}");
    let (code, _, err) = baton_2pc(&endpoint, NS, &["show", "order-42"]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid transaction id \"order-42\""), "{err}");

    // Nothing of this namespace is left prepared (a leftover would hold its locks).
    assert!(
        pg_prepared(NS).await.is_empty(),
        "{:?}",
        pg_prepared(NS).await
    );
}
