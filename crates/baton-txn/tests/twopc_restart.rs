//! Prepared branches survive a restart of their database, and recovery finishes them after
//! it: a coordinator is SIGKILLed with both branches prepared (before the decision, and after
//! a commit decision), then PostgreSQL and MariaDB are stopped and started again
//! (`scripts/services stop|start pg mariadb`), and the Recoverer aborts or commits both.
//!
//! It restarts the servers of `scripts/services`, so it runs in a test binary of its own, an
//! exception to tests/it/ (the binaries of a `cargo test` run one after another), and needs
//! the default URLs.

// The shared helpers of tests/it/, compiled into this binary too (only some are used here).
#[path = "it/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use baton_client::testing::{Flavor, TestServer};
use baton_txn::twopc::{BatonDecisionLog, DecisionLog};
use common::bank::pg_prepared;
use common::bank2::{baton, maria_url, run_child, Banks, DEFAULT_MARIADB_URL};

/// Starts the databases again if the test fails while they are stopped, so the test
/// binaries after this one find them running.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            common::services(&["start", "pg", "mariadb"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_child_process() {
    common::bank2::child_main().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_branches_survive_a_database_restart_and_are_recovered() {
    assert_eq!(
        common::pg_url(),
        common::DEFAULT_PG_URL,
        "needs the servers of scripts/services"
    );
    assert_eq!(
        maria_url(),
        DEFAULT_MARIADB_URL,
        "needs the servers of scripts/services"
    );
    let _restart = RestartOnDrop;
    let server = TestServer::start(Flavor::Baton);
    let client = baton(&server.endpoint()).await;
    let name = "t2pc_restart";
    for (i, (point, commits)) in [("after_all_prepared", false), ("after_decision", true)]
        .into_iter()
        .enumerate()
    {
        let namespace = format!("t-restart-{i}");
        let banks = Banks::create(name, &namespace).await;
        let log: Arc<dyn DecisionLog> =
            Arc::new(BatonDecisionLog::new(&client, &namespace).unwrap());
        let run = run_child(
            "bank_child_process",
            format!("{namespace}|{}|{name}|0|1|0|{point}", server.endpoint()),
        );
        assert_eq!(run.killed_at.expect("killed").1, point);
        let before = (
            pg_prepared(&namespace).await,
            banks.maria_prepared(&namespace).await,
        );
        assert_eq!(
            (before.0.len(), before.1.len()),
            (1, 1),
            "{point}: {before:?}"
        );

        common::services(&["stop", "pg", "mariadb"]);
        common::services(&["start", "pg", "mariadb"]);
        // A fresh pool: the old connections died with the server.
        let banks = Banks::attach(name);
        let after = (
            pg_prepared(&namespace).await,
            banks.maria_prepared(&namespace).await,
        );
        assert_eq!(
            after, before,
            "{point}: prepared branches survive the restart"
        );

        let recoverer = banks.recoverer(log.clone());
        banks
            .wait_resolved(
                log.as_ref(),
                &namespace,
                Duration::from_secs(30),
                Some(&recoverer),
            )
            .await;
        assert_eq!(banks.assert_consistent().await, commits as usize, "{point}");
    }
}
