//! A bank split between a PostgreSQL database and a MariaDB database, for the 2PC tests that
//! span both: accounts on each side, transfers committed by 2PC, the checks that prove
//! atomicity, and the child coordinator process that SIGKILLs itself at fault points.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton_client::ClientConfig;
use baton_txn::twopc::mariadb::mysql_async::prelude::Queryable;
use baton_txn::twopc::mariadb::mysql_async::Pool;
use baton_txn::twopc::mariadb::{MariaDbBranch, MariaDbResource};
use baton_txn::twopc::pg::PgResource;
use baton_txn::twopc::{
    BatonDecisionLog, BranchId, Coordinator, DecisionLog, FaultPoint, InMemoryDecisionLog, Outcome,
    Recoverer, RecovererConfig, Resource, TwoPcConfig,
};

use super::bank::{fresh_pg_bank, pg_prepared, pg_resource, pg_state, pg_work, OPENING};
use super::pg_url;

pub const CHILD_ENV: &str = "BATON_TXN_BANK_CHILD";
pub const ACCOUNTS: i32 = 20;
pub const DEFAULT_MARIADB_URL: &str = "mysql://baton:baton@127.0.0.1:53306/baton";

pub fn maria_url() -> String {
    std::env::var("BATON_TEST_MARIADB_URL").unwrap_or_else(|_| DEFAULT_MARIADB_URL.to_string())
}

pub fn maria_pool() -> Pool {
    Pool::from_url(maria_url()).expect("BATON_TEST_MARIADB_URL is a mysql:// URL")
}

pub async fn baton(endpoint: &str) -> baton_client::Client {
    baton_client::Client::connect(ClientConfig::new([endpoint.to_string()]))
        .await
        .unwrap()
}

/// The two banks of a test named `name`: PostgreSQL schema `<name>` and MariaDB tables
/// `<name>_accounts` / `<name>_transfers`.
pub struct Banks {
    pub name: String,
    pub pg: Arc<PgResource>,
    pub maria: Arc<MariaDbResource>,
}

pub fn pg_branch(name: &str) -> String {
    name.replace('_', "-")
}
pub fn maria_branch(name: &str) -> BranchId {
    BranchId::new(format!("{}-m", name.replace('_', "-"))).unwrap()
}

impl Banks {
    /// The resources only (a child process: the banks exist).
    pub fn attach(name: &str) -> Banks {
        Banks {
            name: name.to_string(),
            pg: Arc::new(pg_resource(
                name,
                &baton_txn::pg::Schema::new(name).unwrap(),
            )),
            maria: Arc::new(MariaDbResource::new(maria_branch(name), maria_pool())),
        }
    }

    /// Fresh banks with every account at `OPENING`; leftovers of an earlier failed run
    /// (prepared branches of `namespace`) are aborted first so they release their locks.
    pub async fn create(name: &str, namespace: &str) -> Banks {
        let banks = Banks::attach(name);
        banks.maria.migrate().await.unwrap();
        let leftovers: Arc<dyn DecisionLog> =
            Arc::new(InMemoryDecisionLog::new(namespace).unwrap());
        Recoverer::new(leftovers)
            .with_resource(banks.maria.clone())
            .resolve_once(None)
            .await
            .unwrap();
        let pg = fresh_pg_bank(name, ACCOUNTS).await;
        let mut conn = banks.maria.pool().get_conn().await.unwrap_or_else(|e| {
            panic!(
                "MariaDB is not reachable at {}: {e}; run scripts/services (scripts/test does)",
                maria_url()
            )
        });
        conn.query_drop(format!(
            "DROP TABLE IF EXISTS {name}_accounts, {name}_transfers;
             CREATE TABLE {name}_accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL) ENGINE=InnoDB;
             CREATE TABLE {name}_transfers (id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL) ENGINE=InnoDB;"
        ))
        .await
        .unwrap();
        let values: Vec<String> = (1..=ACCOUNTS)
            .map(|i| format!("({i}, {OPENING})"))
            .collect();
        conn.query_drop(format!(
            "INSERT INTO {name}_accounts VALUES {}",
            values.join(",")
        ))
        .await
        .unwrap();
        Banks { pg, ..banks }
    }

    pub fn coordinator(&self, log: Arc<dyn DecisionLog>) -> Coordinator {
        Coordinator::new(log)
            .with_resource(self.pg.clone())
            .with_resource(self.maria.clone())
            .with_config(TwoPcConfig {
                decision_timeout: Duration::from_secs(1),
                ..TwoPcConfig::default()
            })
    }

    pub fn recoverer(&self, log: Arc<dyn DecisionLog>) -> Recoverer {
        Recoverer::new(log)
            .with_resource(self.pg.clone())
            .with_resource(self.maria.clone())
            .with_config(RecovererConfig {
                interval: Duration::from_millis(200),
                grace: Duration::ZERO,
                session_ttl: Duration::from_secs(3),
                ..RecovererConfig::default()
            })
    }

    pub async fn maria_work(
        &self,
        tx: &baton_txn::twopc::GlobalTx<'_>,
        account: i32,
        delta: i64,
    ) -> MariaDbBranch {
        let gid = tx.gid(self.maria.id());
        let mut b = self.maria.begin(&gid).await.unwrap();
        let name = &self.name;
        b.conn()
            .exec_drop(
                format!("UPDATE {name}_accounts SET balance = balance + ? WHERE id = ?"),
                (delta, account),
            )
            .await
            .unwrap();
        b.conn()
            .exec_drop(
                format!("INSERT INTO {name}_transfers (id, amount) VALUES (?, ?)"),
                (tx.id().to_string(), delta),
            )
            .await
            .unwrap();
        b
    }

    /// Moves `amount` from PostgreSQL account `from` to MariaDB account `to` (a negative
    /// amount moves the other way).
    pub async fn transfer(&self, coord: &Coordinator, from: i32, to: i32, amount: i64) -> Outcome {
        let mut tx = coord.begin();
        let id = tx.id().to_string();
        let pg = pg_work(&self.pg, &self.name, &id, from, -amount).await;
        tx.enlist(pg).unwrap();
        let maria = self.maria_work(&tx, to, amount).await;
        tx.enlist(maria).unwrap();
        tx.commit().await.unwrap()
    }

    pub async fn maria_state(&self) -> (i64, Vec<String>) {
        let mut conn = self.maria.pool().get_conn().await.unwrap();
        let name = &self.name;
        let sum: Option<i64> = conn
            .query_first(format!(
                "SELECT CAST(SUM(balance) AS SIGNED) FROM {name}_accounts"
            ))
            .await
            .unwrap();
        let mut ids: Vec<String> = conn
            .query(format!("SELECT id FROM {name}_transfers"))
            .await
            .unwrap();
        ids.sort();
        (sum.unwrap(), ids)
    }

    pub async fn maria_prepared(&self, namespace: &str) -> Vec<String> {
        self.maria
            .list_prepared(namespace)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.gid.to_string())
            .collect()
    }

    /// Waits until nothing of `namespace` is open in the log or prepared in either database.
    /// With `recoverer`, runs one of its passes each round (else one runs elsewhere).
    pub async fn wait_resolved(
        &self,
        log: &dyn DecisionLog,
        namespace: &str,
        within: Duration,
        recoverer: Option<&Recoverer>,
    ) {
        let deadline = Instant::now() + within;
        loop {
            if let Some(r) = recoverer {
                r.resolve_once(None).await.unwrap();
            }
            let open = log.open().await.unwrap();
            let pg = pg_prepared(namespace).await;
            let maria = self.maria_prepared(namespace).await;
            if open.is_empty() && pg.is_empty() && maria.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still in doubt: {} open, pg {pg:?}, mariadb {maria:?}",
                open.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Both sums and both transfer lists; panics unless the banks agree.
    pub async fn assert_consistent(&self) -> usize {
        let (pg_sum, pg_ids) = pg_state(&self.name).await;
        let (maria_sum, maria_ids) = self.maria_state().await;
        assert_eq!(
            pg_sum + maria_sum,
            2 * ACCOUNTS as i64 * OPENING,
            "the sum of all balances changed (pg {pg_sum}, mariadb {maria_sum})"
        );
        assert_eq!(pg_ids, maria_ids, "a transfer landed in one bank only");
        pg_ids.len()
    }
}

/// A tiny deterministic generator (xorshift), so a child's choices follow from its seed.
pub struct Rng(u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn fault_points(name: &str) -> Vec<String> {
    let pg = pg_branch(name);
    let maria = maria_branch(name);
    vec![
        "after_intent".into(),
        format!("after_prepare:{pg}"),
        format!("after_prepare:{maria}"),
        "after_all_prepared".into(),
        "after_decision".into(),
        format!("after_phase2:{pg}"),
        format!("after_phase2:{maria}"),
    ]
}

/// The child's side (call it from a test named `bank_child_process`): transfers `first..last`, killing itself at the fault point chosen for a
/// transfer (`kill_every` = one transfer in n gets one, at random; 0 = `point` at the first).
pub async fn child_main() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return; // only a child process does anything
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [namespace, endpoint, name, first, last, kill_every, point] = parts[..] else {
        panic!("bad child spec {spec}");
    };
    let (first, last, kill_every): (u64, u64, u64) = (
        first.parse().unwrap(),
        last.parse().unwrap(),
        kill_every.parse().unwrap(),
    );
    let log: Arc<dyn DecisionLog> =
        Arc::new(BatonDecisionLog::new(&baton(endpoint).await, namespace).unwrap());
    let banks = Banks::attach(name);
    let armed: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let hook_armed = armed.clone();
    let coord = banks
        .coordinator(log)
        .with_fault_hook(move |p: &FaultPoint| {
            if hook_armed.lock().unwrap().as_deref() == Some(p.name().as_str()) {
                println!("REACHED {}", p.name());
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
        });
    let points = fault_points(name);
    for i in first..last {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let from = 1 + rng.below(ACCOUNTS as u64) as i32;
        let to = 1 + rng.below(ACCOUNTS as u64) as i32;
        let amount = rng.below(200) as i64 - 100;
        *armed.lock().unwrap() = if kill_every == 0 {
            (i == first).then(|| point.to_string())
        } else if rng.below(kill_every) == 0 {
            Some(points[rng.below(points.len() as u64) as usize].clone())
        } else {
            None
        };
        println!("BEGIN {i}");
        let outcome = banks.transfer(&coord, from, to, amount).await;
        println!("DONE {i} {outcome:?}");
    }
}

pub struct ChildRun {
    /// The transfer the child was working on when it died, if it was killed.
    pub killed_at: Option<(u64, String)>,
    pub outcomes: Vec<String>,
}

/// Runs this test binary's test `child_test` (its full name, `module::fn`: the tests share
/// one binary) as the bank's child process with `spec`.
pub fn run_child(child_test: &str, spec: String) -> ChildRun {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, spec)
        .env("BATON_TEST_PG_URL", pg_url())
        .env("BATON_TEST_MARIADB_URL", maria_url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut current = None;
    let mut reached = String::new();
    let mut outcomes = Vec::new();
    // libtest prints "test bank_child_process ... " without a newline before the test runs,
    // so a marker may start in the middle of the first line.
    let after = |line: &str, mark: &str| {
        line.find(mark)
            .map(|at| line[at + mark.len()..].to_string())
    };
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        if let Some(i) = after(&line, "BEGIN ") {
            current = Some(i.parse::<u64>().unwrap());
        } else if let Some(p) = after(&line, "REACHED ") {
            reached = p;
        } else if line.contains("DONE ") {
            outcomes.push(line);
            current = None;
        }
    }
    let status = child.wait().unwrap();
    match status.signal() {
        Some(libc::SIGKILL) => ChildRun {
            killed_at: Some((current.expect("killed inside a transfer"), reached)),
            outcomes,
        },
        _ => {
            assert!(
                status.success(),
                "the child failed: {status:?}; last transfer {current:?}"
            );
            ChildRun {
                killed_at: None,
                outcomes,
            }
        }
    }
}
