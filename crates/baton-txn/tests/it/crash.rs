//! Real process kills at named fault points: a child process (this test binary, re-run with
//! `BATON_TXN_FAULT` set) claims a key, does the work and stops at the fault point; the parent
//! kills it with SIGKILL and retries. The work must end up applied exactly once.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{connect, count_effects, fresh_schema};
use baton_txn::pg::{Claim, IdempotencyConfig, IdempotencyStore, Outcome, Schema, Transaction};
use baton_txn::{Error, Fingerprint, IdempotencyKey, StoredResponse};

const SCHEMA: &str = "t_crash_kill";
const LEASE: Duration = Duration::from_millis(2000);

fn store(schema: &Schema) -> IdempotencyStore {
    IdempotencyStore::new(
        schema,
        IdempotencyConfig {
            lease: LEASE,
            ..IdempotencyConfig::default()
        },
    )
}

async fn work(tx: &Transaction<'_>, schema: &Schema, key: &str) -> Result<StoredResponse, Error> {
    let sql = format!(
        "INSERT INTO {}.effects (tenant, key, body) VALUES ('t', $1, '') RETURNING id",
        schema.name()
    );
    let id: i64 = tx.query_one(&sql, &[&key]).await?.get(0);
    Ok(StoredResponse::json(201, format!("{{\"order\":{id}}}")))
}

/// The child's side. Does nothing in a normal test run.
#[tokio::test]
async fn fault_child_process() {
    let Ok(fault) = std::env::var("BATON_TXN_FAULT") else {
        return;
    };
    let schema = Schema::new(SCHEMA).unwrap();
    let store = store(&schema);
    let key = IdempotencyKey::new(fault.clone()).unwrap();
    let mut client = connect().await;
    let Claim::Execute(exec) = store
        .claim(&client, "t", &key, &Fingerprint::of_parts(&[b"x"]))
        .await
        .unwrap()
    else {
        panic!("the child must be first")
    };
    let tx = exec.begin(&mut client).await.unwrap();
    let response = work(&tx, &schema, &fault).await.unwrap();
    match fault.as_str() {
        // The work is done in the transaction, the response not yet stored.
        "after_work" => {}
        // Work and response committed; the caller never got the answer.
        "after_commit" => exec.commit(tx, &response).await.unwrap(),
        other => panic!("unknown fault point {other}"),
    }
    println!(
        "REACHED {fault} {}",
        String::from_utf8(response.body).unwrap()
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    panic!("the parent should have killed this process");
}

/// Runs the child up to `fault`, kills it with SIGKILL, and returns the body it had.
fn run_child_until_killed(fault: &str) -> String {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash::fault_child_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("BATON_TXN_FAULT", fault)
        .env("BATON_TEST_PG_URL", common::pg_url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let prefix = format!("REACHED {fault} ");
    let body = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| {
                panic!(
                    "the child exited before reaching {fault}: {:?}",
                    child.wait()
                )
            })
            .unwrap();
        // libtest prints "test fault_child_process ... " on the same line first.
        if let Some(at) = line.find(&prefix) {
            break line[at + prefix.len()..].to_string();
        }
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_at_a_fault_point_leaves_the_effect_exactly_once() {
    let schema = fresh_schema(SCHEMA).await;
    let store = store(&schema);
    let fp = Fingerprint::of_parts(&[b"x"]);
    let mut client = connect().await;

    // Killed after the work, before the response: the work rolled back with the process's
    // connection; the key is in flight until the lease runs out, then the retry runs once.
    let body = tokio::task::spawn_blocking(|| run_child_until_killed("after_work"))
        .await
        .unwrap();
    let key = IdempotencyKey::new("after_work").unwrap();
    assert_eq!(count_effects(&client, &schema, "t", "after_work").await, 0);
    assert!(matches!(
        store.claim(&client, "t", &key, &fp).await.unwrap(),
        Claim::InFlight { .. }
    ));
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let out = store
        .run(
            &mut client,
            "t",
            &key,
            &fp,
            None,
            async |tx: &Transaction<'_>| work(tx, &schema, "after_work").await,
        )
        .await
        .unwrap();
    let Outcome::Executed(r) = out else {
        panic!("{out:?}")
    };
    assert_ne!(
        r.body,
        body.as_bytes(),
        "the child's execution never became visible"
    );
    assert_eq!(count_effects(&client, &schema, "t", "after_work").await, 1);

    // Killed after the commit, before answering: the retry replays what the child stored.
    let body = tokio::task::spawn_blocking(|| run_child_until_killed("after_commit"))
        .await
        .unwrap();
    let key = IdempotencyKey::new("after_commit").unwrap();
    let out = store
        .run(
            &mut client,
            "t",
            &key,
            &fp,
            None,
            async |_: &Transaction<'_>| -> Result<StoredResponse, Error> {
                panic!("the work was committed by the killed process and must not run again")
            },
        )
        .await
        .unwrap();
    let Outcome::Replayed(r) = out else {
        panic!("{out:?}")
    };
    assert_eq!(r.body, body.as_bytes());
    assert_eq!(
        count_effects(&client, &schema, "t", "after_commit").await,
        1
    );
}
