//! The dashboard (`/ui`) in a real browser: Debian's Chromium driven by playwright-core
//! (`tests/ui/*.mjs`, installed by `scripts/install-deps` with `npm ci`) against real
//! members. A missing node, chromium or playwright-core fails these tests.
//!
//! - A 3-member cluster with a contended lock (a holder and three waiters, lock-delay set),
//!   an election, a lease with keys, a running and a stuck saga and an overdue 2PC
//!   transaction: the page shows the holder, the queue in order, the token and the rest;
//!   it fits a phone; when the holder releases, the open page shows the next holder, its
//!   token and the shorter queue without a reload.
//! - Auth on: the anonymous visitor gets the login page and nothing else; root logs in and
//!   sees the lock; a user without the root role is refused the lock registry.
//! - Without a browser: a TLS client port read with the member's own settings; one page
//!   lists a bounded number of locks, waiters and leases and counts the rest; at most 16
//!   live pages per member.
//!
//! The page is read on the client port, beside gRPC; the TLS test reads it through the
//! member's plain `--listen-metrics-urls` listener (every test member has one), which serves
//! the same router. Screenshots go to `target/ui-artifacts/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use baton_client::{
    Client, ClientConfig, Election, Guard, LockOptions, Mutex, PutOptions, Session, SessionOptions,
    WatchOptions,
};
use baton_txn::saga::{SagaDef, SagaLog, SagaRecord, SagaStatus, StepCtx};
use baton_txn::twopc::{BatonDecisionLog, BranchId, DecisionLog, Gid, Intent, IntentBranch, TxId};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::common::{self, Baton, Cluster};

const CHROMIUM: &str = "/usr/bin/chromium";

/// `tests/ui`: the scripts, and their `node_modules`.
fn ui_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/ui")
}

/// `target/ui-artifacts` (the test binary's `target/<profile>/baton` is two levels down).
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_baton"))
        .ancestors()
        .nth(2)
        .expect("target directory")
        .join("ui-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Fails (never skips) when what the browser test needs is missing, saying how to get it.
fn require_browser() {
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "node is needed for the dashboard's browser test (scripts/install-deps): {node:?}"
    );
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is needed for the dashboard's browser test: apt-get install chromium \
         (scripts/install-deps)"
    );
    assert!(
        ui_dir()
            .join("node_modules/playwright-core/package.json")
            .exists(),
        "tests/ui/node_modules is missing: npm ci --prefix tests/ui (scripts/install-deps)"
    );
}

/// A browser script running, its stdout read line by line.
struct Script {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stderr: tokio::task::JoinHandle<String>,
}

impl Script {
    fn start(name: &str, url: &str, expect: &Value) -> Script {
        require_browser();
        let mut child = tokio::process::Command::new("node")
            .arg(ui_dir().join(name))
            .current_dir(ui_dir())
            .env("BATON_UI_URL", url)
            .env("BATON_UI_ARTIFACTS", artifacts())
            .env("BATON_UI_EXPECT", expect.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start node");
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut err = child.stderr.take().unwrap();
        let stderr = tokio::spawn(async move {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s).await;
            s
        });
        Script {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for the script to print `line`; anything else it prints first is passed on.
    async fn expect_line(&mut self, line: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let next = tokio::time::timeout_at(deadline, self.stdout.next_line()).await;
            match next {
                Ok(Ok(Some(l))) if l == line => return,
                Ok(Ok(Some(l))) => println!("{l}"),
                Ok(Ok(None)) | Ok(Err(_)) => self.fail(&format!("ended before {line}")).await,
                Err(_) => self.fail(&format!("no {line} within {within:?}")).await,
            }
        }
    }

    async fn send(&mut self, value: &Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{value}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    async fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.start_kill();
        let status = self.child.wait().await;
        let stderr = (&mut self.stderr).await.unwrap_or_default();
        panic!("browser script {what} ({status:?}):\n{stderr}");
    }

    /// The script's `OK`, then its exit status 0.
    async fn finish(mut self) {
        self.expect_line("OK", Duration::from_secs(60)).await;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the script exits")
            .unwrap();
        if !status.success() {
            self.fail("failed").await;
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn session(client: &Client) -> Session {
    Session::new(
        client,
        SessionOptions::new().with_ttl(Duration::from_secs(30)),
    )
    .await
    .unwrap()
}

/// Waits until lock `name` has `n` waiters (so the next one queues behind them).
async fn wait_waiters(client: &Client, name: &str, n: u64) {
    for _ in 0..200 {
        if client.inspect_lock(name).await.unwrap().waiter_count == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{name} never had {n} waiters");
}

/// A running saga (through the log), a stuck one (its record as an orchestrator leaves it
/// after a compensation kept failing) and an overdue 2PC transaction, in namespace `shop`.
/// Returns (running saga, [stuck ids]).
async fn sagas_and_2pc(client: &Client) -> (String, Vec<String>) {
    let log = SagaLog::new(client, "shop").unwrap();
    let def = SagaDef::<Value>::builder("order")
        .step("charge_card", |_cx: StepCtx<Value>| async {
            Ok(Value::Null)
        })
        .build()
        .unwrap();
    let running = log
        .start(&def, "order-1002", &json!({ "amount": 12 }))
        .await
        .unwrap();
    let mut stuck: SagaRecord = running.clone();
    stuck.id = "order-1001".into();
    stuck.status = SagaStatus::Stuck {
        step: 0,
        attempts: 5,
        last_error: "payment gateway: 503 Service Unavailable".into(),
    };
    stuck.created_ms -= 120_000;
    for (key, value) in [
        (
            "baton-txn/shop/saga/order-1001",
            serde_json::to_vec(&stuck).unwrap(),
        ),
        ("baton-txn/shop/saga-open/order-1001", Vec::new()),
    ] {
        client.put(key, value, PutOptions::new()).await.unwrap();
    }
    let decisions = BatonDecisionLog::new(client, "shop").unwrap();
    let tx = TxId::generate();
    let branch = BranchId::new("pg-ledger").unwrap();
    let now = tx.created_ms();
    decisions
        .record_intent(&Intent {
            tx,
            branches: vec![IntentBranch {
                gid: Gid::new("shop", tx, branch.clone()).to_string(),
                branch,
            }],
            created_ms: now,
            // Already past: undecided past its deadline, a Recoverer should have aborted it.
            deadline_ms: now - 1,
            coordinator: "billing-7 (pid 4242)".into(),
        })
        .await
        .unwrap();
    (running.id, vec![stuck.id, tx.to_string()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_contended_lock_and_follows_a_release_in_a_browser() {
    require_browser();
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    common::agreed_leader(&eps, Duration::from_secs(10)).await;
    let client = Client::connect(ClientConfig::new(eps.clone()))
        .await
        .unwrap();

    // The contended lock: A holds it (with a lock-delay), B, C and D queue in that order.
    let lock = "orders/payments";
    let sessions = [
        session(&client).await,
        session(&client).await,
        session(&client).await,
        session(&client).await,
    ];
    let holder = Mutex::new(&sessions[0])
        .acquire_with(
            lock,
            LockOptions::new().with_lock_delay(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let mut waiting: Vec<tokio::task::JoinHandle<Guard>> = Vec::new();
    for (i, s) in sessions[1..].iter().enumerate() {
        let s = s.clone();
        waiting.push(tokio::spawn(async move {
            Mutex::new(&s).acquire(lock).await.unwrap()
        }));
        wait_waiters(&client, lock, i as u64 + 1).await;
    }
    let waiter_keys: Vec<String> = sessions[1..]
        .iter()
        .map(|s| format!("{lock}/{:x}", s.lease()))
        .collect();

    // An election, a lease with two keys, sagas and 2PC, a watcher on the member viewed.
    let candidate = session(&client).await;
    let leadership = Election::new(&client, "leader/reports")
        .campaign(&candidate, "reporter-1 (10.0.0.7)")
        .await
        .unwrap();
    // The watch is on the member whose page is viewed; its two events show it registered.
    let viewed = &cluster.members[0];
    let on_viewed = Client::connect(ClientConfig::new([viewed.endpoint()]))
        .await
        .unwrap();
    // From the current revision on, so the events come whenever the watch is registered.
    let from = on_viewed.status().await.unwrap().header.unwrap().revision + 1;
    let mut watch = on_viewed.watch(
        "service/",
        WatchOptions::new().with_prefix().with_start_revision(from),
    );
    let lease = client
        .lease_grant(Duration::from_secs(300))
        .await
        .unwrap()
        .id;
    for key in ["service/web-1", "service/web-2"] {
        client
            .put(key, "10.0.0.1:8080", PutOptions::new().with_lease(lease))
            .await
            .unwrap();
    }
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("the watch sees the lease's keys")
            .unwrap()
            .unwrap();
    }
    let (running_saga, stuck) = sagas_and_2pc(&client).await;

    let expect = json!({
        "members": cluster.names,
        "viewedMember": cluster.names[0],
        "lock": lock,
        "holder": text(holder.key()),
        "token": holder.fencing_token().get(),
        "waiters": waiter_keys,
        "lockDelay": "5s",
        "election": "leader/reports",
        "electionLeaderKey": text(leadership.key()),
        "electionValue": "reporter-1 (10.0.0.7)",
        "lease": format!("{lease:x}"),
        "leaseKeys": ["service/web-1", "service/web-2"],
        "stuckTxns": stuck,
        "runningSaga": running_saga,
    });
    let url = format!("http://127.0.0.1:{}", viewed.client_port);
    let mut script = Script::start("live.mjs", &url, &expect);
    script.expect_line("RELEASE", Duration::from_secs(90)).await;

    // The holder lets go: B is granted the lock, C and D move up.
    holder.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiting.remove(0))
        .await
        .expect("B is granted the lock")
        .unwrap();
    assert_eq!(text(next.key()), waiter_keys[0]);
    script
        .send(&json!({
            "holder": text(next.key()),
            "token": next.fencing_token().get(),
            "waiters": waiter_keys[1..],
        }))
        .await;
    script.finish().await;
    for shot in [
        "dashboard-desktop.png",
        "dashboard-phone.png",
        "dashboard-after-release.png",
    ] {
        let len = std::fs::metadata(artifacts().join(shot)).unwrap().len();
        assert!(len > 10_000, "{shot}: {len} bytes");
    }
    drop((next, waiting, leadership, watch, cluster));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_the_dashboard_shows_nothing_before_a_login() {
    require_browser();
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let admin = Client::connect(ClientConfig::new([b.endpoint()]))
        .await
        .unwrap();
    for (user, password) in [("root", "rootpw"), ("viewer", "viewerpw")] {
        admin.user_add(user, Some(password)).await.unwrap();
    }
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let root = Client::connect(ClientConfig::new([b.endpoint()]).with_user("root", "rootpw"))
        .await
        .unwrap();
    let s = session(&root).await;
    let holder = Mutex::new(&s).acquire("payroll").await.unwrap();

    // Without a session: the page sends to the login, the stream refuses, the login page
    // says nothing of the cluster.
    let port = b.client_port;
    let (code, _) = tokio::task::spawn_blocking(move || common::http_get(port, "/ui"))
        .await
        .unwrap();
    assert_eq!(code, 303);
    let (code, body) = tokio::task::spawn_blocking(move || common::http_get(port, "/ui/events"))
        .await
        .unwrap();
    assert_eq!((code, body.as_str()), (401, "log in at /ui/login"));
    let (code, body) = tokio::task::spawn_blocking(move || common::http_get(port, "/ui/login"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains("Log in") && !body.contains("payroll"),
        "{body}"
    );

    let expect = json!({
        "members": ["default"],
        "lock": "payroll",
        "holder": text(holder.key()),
        "token": holder.fencing_token().get(),
        "rootPassword": "rootpw",
        "viewer": "viewer",
        "viewerPassword": "viewerpw",
    });
    let url = format!("http://127.0.0.1:{port}");
    Script::start("auth.mjs", &url, &expect).finish().await;
    drop((holder, b));
}

/// With TLS on the client port, the dashboard reads the cluster with the member's own TLS
/// settings (here `--auto-tls`: a self-signed certificate nothing can verify, as etcd's
/// members treat each other's): the page shows the member healthy and the lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_reads_a_tls_client_port_with_the_members_settings() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start_on(
        &dir.path().join("b"),
        "https://127.0.0.1:{port}",
        &["--auto-tls"],
    );
    let mut tls = baton_client::TlsConfig::new();
    tls.insecure_skip_verify = true;
    let client =
        Client::connect(ClientConfig::new([format!("https://{}", b.endpoint())]).with_tls(tls))
            .await
            .unwrap();
    let s = session(&client).await;
    let holder = Mutex::new(&s).acquire("tls/lock").await.unwrap();
    let port = b.metrics_port;
    let (code, body) = tokio::task::spawn_blocking(move || common::http_get(port, "/ui"))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(r#"data-role="leader""#) && body.contains(">healthy<"),
        "{body}"
    );
    assert!(
        body.contains(&format!(r#"data-holder-key="{}""#, text(holder.key()))),
        "{body}"
    );
    drop((holder, b));
}

/// One page lists a bounded number of locks, waiters and leases and counts the rest: 55
/// locks (one with 12 waiters) and 133 leases show as 50 locks, 10 waiters and 50 leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_a_bounded_number_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let client = Client::connect(ClientConfig::new([b.endpoint()]))
        .await
        .unwrap();
    let owner = session(&client).await;
    let mut guards = Vec::new();
    for i in 0..55 {
        let name = if i == 0 {
            "a-contended".to_string()
        } else {
            format!("lock-{i:02}")
        };
        guards.push(Mutex::new(&owner).acquire(name).await.unwrap());
    }
    let mut waiting = Vec::new();
    for i in 0..12u64 {
        let s = session(&client).await;
        waiting.push(tokio::spawn(async move {
            Mutex::new(&s).acquire("a-contended").await.unwrap()
        }));
        wait_waiters(&client, "a-contended", i + 1).await;
    }
    for _ in 0..120 {
        client.lease_grant(Duration::from_secs(300)).await.unwrap();
    }
    let port = b.client_port;
    let (code, body) = tokio::task::spawn_blocking(move || common::http_get(port, "/ui"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert_eq!(body.matches(r#"<article class="lock""#).count(), 50);
    assert!(
        body.contains("5 more locks and elections not shown (55 in the registry)"),
        "{body}"
    );
    assert_eq!(body.matches("data-waiter-key=").count(), 10);
    assert!(body.contains("and 2 more"), "{body}");
    assert_eq!(body.matches("data-lease=").count(), 50);
    // 120 leases, the owner's session and the 12 waiters'.
    assert!(
        body.contains("83 more leases not shown (133 in all)"),
        "{body}"
    );
    drop((guards, waiting, b));
}

/// `GET /ui/events` on `port`: the status code, and the connection (an event stream stays
/// open while it is held).
fn open_stream(port: u16) -> (u16, std::net::TcpStream) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /ui/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    let code = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
    (code, s)
}

/// A member serves at most 16 live pages at once; the next is refused with 503 until one
/// closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_pages_are_bounded_per_member() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let port = b.client_port;
    tokio::task::spawn_blocking(move || {
        let mut open = Vec::new();
        for i in 0..16 {
            let (code, s) = open_stream(port);
            assert_eq!(code, 200, "stream {i}");
            open.push(s);
        }
        assert_eq!(open_stream(port).0, 503);
        drop(open.pop());
        // The server notices the closed stream at its next write (a refresh or keep-alive).
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (code, s) = open_stream(port);
            if code == 200 {
                open.push(s);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no slot came free");
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    drop(b);
}
