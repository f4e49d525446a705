//! The bounded readers behind Baton's dashboard, against a real `baton serve`: namespaces
//! found by skipping past each one's keys, a saga overview and a page of open 2PC
//! transactions that read at most what they are asked for and count the rest.

use baton_client::testing::{Flavor, TestServer};
use baton_client::{Client, ClientConfig, PutOptions};
use baton_txn::coordination::namespaces;
use baton_txn::saga::{SagaDef, SagaLog, StepCtx};
use baton_txn::twopc::{BatonDecisionLog, BranchId, DecisionLog, Gid, Intent, IntentBranch, TxId};
use serde_json::{json, Value};

async fn client(server: &TestServer) -> Client {
    Client::connect(ClientConfig::new([server.endpoint()]))
        .await
        .unwrap()
}

#[tokio::test]
async fn namespaces_are_found_in_name_order_skipping_keys_no_namespace_has() {
    let server = TestServer::start(Flavor::Baton);
    let c = client(&server).await;
    let mut keys: Vec<String> = (0..50)
        .map(|i| format!("baton-txn/foo/saga/s{i:02}"))
        .collect();
    keys.extend(
        [
            "baton-txn/foo-bar/open/x",
            "baton-txn/a_1/saga/s",
            // Not a namespace (':' is not allowed in one): skipped.
            "baton-txn/bad:ns/x",
            "baton-txn/zz",
            // Outside the prefix.
            "baton-txo/x",
        ]
        .map(String::from),
    );
    for k in keys {
        c.put(k, "", PutOptions::new()).await.unwrap();
    }
    // Byte order: "a_1/" < "bad:ns/" < "foo-bar/" < "foo/" < "zz".
    let all = namespaces(&c, 10).await.unwrap();
    assert_eq!(all.names, ["a_1", "foo-bar", "foo", "zz"]);
    assert!(!all.more);
    let two = namespaces(&c, 2).await.unwrap();
    assert_eq!(two.names, ["a_1", "foo-bar"]);
    assert!(two.more);
    assert!(
        namespaces(&client(&TestServer::start(Flavor::Baton)).await, 5)
            .await
            .unwrap()
            .names
            .is_empty()
    );
}

#[tokio::test]
async fn the_saga_overview_reads_at_most_what_it_is_asked_and_counts_the_rest() {
    let server = TestServer::start(Flavor::Baton);
    let c = client(&server).await;
    let log = SagaLog::new(&c, "shop").unwrap();
    let def = SagaDef::<Value>::builder("order")
        .step("charge", |_cx: StepCtx<Value>| async { Ok(Value::Null) })
        .build()
        .unwrap();
    for i in 0..5 {
        log.start(&def, &format!("s{i}"), &json!({ "n": i }))
            .await
            .unwrap();
    }
    let o = log.overview(2, 3).await.unwrap();
    assert_eq!(o.open_total, 5);
    let open: Vec<&str> = o.open.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(open, ["s0", "s1"]);
    let recent: Vec<&str> = o.recent.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(recent, ["s4", "s3", "s2"], "newest first");
    let empty = SagaLog::new(&c, "none")
        .unwrap()
        .overview(5, 5)
        .await
        .unwrap();
    assert_eq!(
        (empty.open.len(), empty.open_total, empty.recent.len()),
        (0, 0, 0)
    );
}

#[tokio::test]
async fn a_page_of_open_2pc_transactions_is_bounded_and_counts_all() {
    let server = TestServer::start(Flavor::Baton);
    let c = client(&server).await;
    let log = BatonDecisionLog::new(&c, "bank").unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let tx = TxId::generate();
        let branch = BranchId::new("pg").unwrap();
        log.record_intent(&Intent {
            tx,
            branches: vec![IntentBranch {
                gid: Gid::new("bank", tx, branch.clone()).to_string(),
                branch,
            }],
            created_ms: tx.created_ms(),
            deadline_ms: tx.created_ms() + 30_000,
            coordinator: "test".into(),
        })
        .await
        .unwrap();
        ids.push(tx);
        // Ids carry their millisecond: keep them apart so their order is their age.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    let (page, total) = log.open_page(2).await.unwrap();
    assert_eq!(total, 3);
    let got: Vec<TxId> = page.iter().map(|r| r.tx).collect();
    assert_eq!(got, ids[..2], "oldest first");
    assert!(page.iter().all(|r| r.open && r.intent.is_some()));
}
