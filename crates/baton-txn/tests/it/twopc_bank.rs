//! A bank transfer between a PostgreSQL database and a MariaDB database, committed with 2PC
//! whose decision lives in a real Baton (started here). Coordinators are child processes that
//! SIGKILL themselves at named fault points; the Recoverer runs under a Baton election in this
//! process, as it would in production.
//!
//! - Every fault point, once each: before the decision every branch is rolled back, after it
//!   every branch is committed; afterwards nothing is left in `pg_prepared_xacts` or
//!   `XA RECOVER`.
//! - 1,000 transfers with random kills: the sum of all balances never changes, both banks
//!   record exactly the same transfers, and no branch stays in doubt.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::bank::pg_prepared;
use crate::common::bank2::{baton, fault_points, run_child, Banks};
use baton_client::testing::{Flavor, TestServer};
use baton_txn::twopc::{BatonDecisionLog, DecisionLog};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_child_process() {
    common::bank2::child_main().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_point_across_postgresql_and_mariadb() {
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let name = "t2pc_points";
    for (i, point) in fault_points(name).into_iter().enumerate() {
        let namespace = format!("t-points-{i}");
        let banks = Banks::create(name, &namespace).await;
        let log: Arc<dyn DecisionLog> =
            Arc::new(BatonDecisionLog::new(&client, &namespace).unwrap());
        let run = run_child(
            "twopc_bank::bank_child_process",
            format!("{namespace}|{}|{name}|0|1|0|{point}", server.endpoint()),
        );
        let (_, reached) = run.killed_at.expect("killed");
        assert_eq!(reached, point);
        let in_doubt =
            pg_prepared(&namespace).await.len() + banks.maria_prepared(&namespace).await.len();
        println!("{point}: {in_doubt} branches prepared after the kill");

        let recoverer = banks.recoverer(log.clone());
        banks
            .wait_resolved(
                log.as_ref(),
                &namespace,
                Duration::from_secs(20),
                Some(&recoverer),
            )
            .await;
        let moved = banks.assert_consistent().await;
        let committed = point.starts_with("after_decision") || point.starts_with("after_phase2");
        assert_eq!(moved, committed as usize, "{point}");
        let tx = &log.list(1).await.unwrap()[0];
        println!(
            "{point}: {:?} by {}",
            tx.state(),
            tx.decision.as_ref().unwrap().by
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_transfers_with_random_coordinator_kills() {
    const TRANSFERS: u64 = 1_000;
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let namespace = "t-bank";
    let name = "t2pc_bank";
    let banks = Banks::create(name, namespace).await;
    let log: Arc<dyn DecisionLog> = Arc::new(BatonDecisionLog::new(&client, namespace).unwrap());

    // The Recoverer as in production: under a Baton election, its log writes fenced.
    let recoverer = banks.recoverer(log.clone());
    let recovery_client = client.clone();
    let recovery =
        tokio::spawn(async move { recoverer.run(&recovery_client, "t-bank/recoverer").await });

    let started = Instant::now();
    let mut next = 0;
    let mut kills = Vec::new();
    let mut outcomes = 0;
    while next < TRANSFERS {
        let run = run_child(
            "twopc_bank::bank_child_process",
            format!(
                "{namespace}|{}|{name}|{next}|{TRANSFERS}|40|-",
                server.endpoint()
            ),
        );
        outcomes += run.outcomes.len();
        match run.killed_at {
            Some((i, point)) => {
                kills.push((i, point));
                next = i + 1;
            }
            None => next = TRANSFERS,
        }
    }
    println!(
        "{TRANSFERS} transfers in {:.1}s, {} coordinator kills at {:?}",
        started.elapsed().as_secs_f64(),
        kills.len(),
        {
            let mut by_point = std::collections::BTreeMap::new();
            for (_, p) in &kills {
                *by_point.entry(p.clone()).or_insert(0) += 1;
            }
            by_point
        }
    );
    assert!(
        kills.len() >= 10,
        "the run should kill coordinators often: {kills:?}"
    );
    assert_eq!(outcomes + kills.len(), TRANSFERS as usize);

    banks
        .wait_resolved(log.as_ref(), namespace, Duration::from_secs(30), None)
        .await;
    let moved = banks.assert_consistent().await;
    let records = log.list(2 * TRANSFERS as usize).await.unwrap();
    assert_eq!(
        records.len(),
        TRANSFERS as usize,
        "every transfer has a record"
    );
    let committed = records
        .iter()
        .filter(|r| r.state() == baton_txn::twopc::TxState::Committed)
        .count();
    println!("{moved} transfers moved money in both banks; {committed} committed in the log");
    assert_eq!(moved, committed, "the log and the banks agree");
    assert!(records.iter().all(|r| !r.open), "nothing left open");
    // Every committed transfer left a marker in MariaDB; purged once they are old enough.
    use baton_txn::twopc::Resource;
    let purged = banks.maria.purge_markers(Duration::ZERO).await.unwrap();
    assert!(
        purged >= committed as u64,
        "{purged} markers purged, {committed} committed"
    );
    assert_eq!(banks.maria.purge_markers(Duration::ZERO).await.unwrap(), 0);
    recovery.abort();
}
