//! `monitoring/` against real clusters: every metric the alert rules (etcd's upstream file,
//! unchanged, and Baton's) and the Grafana dashboard use is exported by real members, and a
//! real Prometheus (Debian's `prometheus`) loading etcd's upstream rules fires `etcdNoLeader`
//! when a three-member cluster loses its quorum, and not while it is healthy.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use promql_parser::parser::Expr;
use promql_parser::util::{walk_expr, ExprVisitor};
use yaml_rust2::YamlLoader;

use crate::common::{self, etcdctl, free_port_below_ephemeral, http_get, Cluster};
use crate::metrics::{contended_lock, samples, scrape};

/// etcd's upstream rules, unchanged (see `monitoring/etcd/README.md`).
const ETCD_RULES: &str = "monitoring/etcd/etcd3_alert.rules.yml";
const BATON_RULES: &str = "monitoring/baton/baton_locks.rules.yml";
const DASHBOARD: &str = "monitoring/grafana/baton.json";

/// Series no Baton member exports, and why. `up` is Prometheus' own (one per target). The
/// `etcd_http_*` families belong to etcd's v2 HTTP API, which etcd 3.4 serves only with
/// `--enable-v2` and Baton not at all; etcd 3.4.23 shows no series of them either
/// (`/work/shared/reference/etcd-3.4-parity-facts.md` §4), so upstream's two
/// `etcdHighNumberOfFailedHTTPRequests` rules and `etcdHTTPRequestsSlow` never fire on
/// either. Only etcd's file may use them.
const NOT_EXPORTED: [(&str, bool); 4] = [
    ("up", false),
    ("etcd_http_failed_total", true),
    ("etcd_http_received_total", true),
    ("etcd_http_successful_duration_seconds_bucket", true),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (alert name, expression) of every rule in a rules file.
fn rule_exprs(file: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap();
    let mut rules = Vec::new();
    for group in docs[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            rules.push((
                rule["alert"].as_str().expect("alert").to_string(),
                rule["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    assert!(!rules.is_empty(), "{file} has no rules");
    rules
}

/// (panel title, expression) of every query of the dashboard, and of its variables.
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join(DASHBOARD)).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    for panel in d["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((
                panel["title"].as_str().unwrap().to_string(),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    assert!(exprs.len() > 30, "{} queries", exprs.len());
    exprs
}

/// A dashboard query as Grafana sends it, for this test's job.
fn with_grafana_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$job", "baton-etcd")
        .replace("$instance", ".+")
}

/// The metric names an expression selects.
fn selected_names(expr: &str) -> BTreeSet<String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
            let vs = match e {
                Expr::VectorSelector(vs) => Some(vs),
                Expr::MatrixSelector(ms) => Some(&ms.vs),
                _ => None,
            };
            if let Some(vs) = vs {
                self.0
                    .insert(vs.name.clone().expect("selectors name their metric"));
            }
            Ok(true)
        }
    }
    let parsed = promql_parser::parser::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &parsed).unwrap();
    names.0
}

/// Series names on every member's `/metrics`.
async fn exported(c: &Cluster) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for m in &c.members {
        let body = scrape(m.metrics_port).await;
        for s in samples(&body) {
            names.insert(s.split(['{', ' ']).next().unwrap().to_string());
        }
    }
    names
}

/// Starts three members and puts them through what every family needs to show samples:
/// writes past a snapshot (the snapshot commit), a watch, leases, and a contended lock
/// whose holder expires.
async fn busy_cluster(dir: &Path) -> Cluster {
    let c = Cluster::start(dir, 3, &["--snapshot-count", "100"]);
    let endpoints: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    common::agreed_leader(&endpoints, Duration::from_secs(20)).await;
    let ep = c.members[0].endpoint();
    for i in 0..150 {
        assert_eq!(etcdctl(&ep, &["put", &format!("k{i}"), "v"], None).code, 0);
    }
    assert_eq!(
        etcdctl(&ep, &["get", "k", "--prefix", "--limit", "1"], None).code,
        0
    );
    assert_eq!(etcdctl(&ep, &["lease", "grant", "60"], None).code, 0);
    contended_lock(&ep, c.members[0].metrics_port).await;
    c
}

/// Every metric name the rules and the dashboard select is on a real member's `/metrics`,
/// but for [`NOT_EXPORTED`]; and every dashboard query parses as PromQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_use_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let c = busy_cluster(dir.path()).await;
    let have = exported(&c).await;
    let mut missing = Vec::new();
    let uses = rule_exprs(ETCD_RULES)
        .into_iter()
        .map(|(n, e)| (ETCD_RULES, n, e))
        .chain(
            rule_exprs(BATON_RULES)
                .into_iter()
                .map(|(n, e)| (BATON_RULES, n, e)),
        )
        .chain(
            dashboard_exprs()
                .into_iter()
                .map(|(n, e)| (DASHBOARD, n, with_grafana_variables(&e))),
        );
    let mut used = BTreeSet::new();
    for (file, what, expr) in uses {
        for name in selected_names(&expr) {
            used.insert(name.clone());
            match NOT_EXPORTED.iter().find(|(n, _)| *n == name) {
                Some((_, etcd_only)) => assert!(
                    !etcd_only || file == ETCD_RULES,
                    "{file} ({what}) uses {name}, which only etcd's v2 API has"
                ),
                None if have.contains(&name) => {}
                None => missing.push(format!("{file}: {what}: {name}")),
            }
        }
    }
    assert_eq!(missing, Vec::<String>::new(), "not exported by any member");
    // The exemptions are all still needed.
    for (name, _) in NOT_EXPORTED {
        assert!(used.contains(name), "{name} is exempt but no longer used");
        assert!(!have.contains(name), "{name} is exported after all");
    }
    eprintln!("{} metric names used, all exported", used.len());
}

/// A GET to Prometheus' HTTP API, as JSON.
fn api(port: u16, path_and_query: &str) -> serde_json::Value {
    let (code, body) = http_get(port, path_and_query);
    assert_eq!(code, 200, "{path_and_query}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path_and_query}: {e}: {body}"))
}

/// `s` percent-encoded for a query string.
fn query_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The alerts Prometheus holds now (pending and firing), as (name, state, instance).
fn alerts(port: u16) -> Vec<(String, String, String)> {
    let v = api(port, "/api/v1/alerts");
    v["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap().to_string(),
                a["state"].as_str().unwrap().to_string(),
                a["labels"]["instance"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Debian's Prometheus on loopback, scraping `targets` every second as job `baton-etcd` and
/// evaluating etcd's upstream rules and Baton's every second. Killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, targets: &[String]) -> Prometheus {
        let bin = "/usr/bin/prometheus";
        assert!(
            Path::new(bin).exists(),
            "{bin} is missing: install Debian's prometheus (scripts/install-deps does)"
        );
        let port = free_port_below_ephemeral();
        let config = dir.join("prometheus.yml");
        let rules = |f: &str| repo().join(f).canonicalize().unwrap();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n  - {}\n\
                 scrape_configs:\n  - job_name: baton-etcd\n    static_configs:\n      - targets: [{}]\n",
                rules(ETCD_RULES).display(),
                rules(BATON_RULES).display(),
                targets
                    .iter()
                    .map(|t| format!("'{t}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while common::wait_for_port(port, Duration::from_millis(100)).is_none()
            || http_get(port, "/-/ready").0 != 200
        {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready:\n{}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The instant vector of `query`, as (instance, value).
    fn query(&self, query: &str) -> Vec<(String, f64)> {
        let v = api(
            self.port,
            &format!("/api/v1/query?query={}", query_encode(query)),
        );
        assert_eq!(v["status"], "success", "{query}: {v}");
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["metric"]["instance"].as_str().unwrap_or("").to_string(),
                    r["value"][1].as_str().unwrap().parse().unwrap(),
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// etcd's upstream `etcdNoLeader` (`etcd_server_has_leader == 0` for 1 m) on a Baton
/// cluster, through a real Prometheus: not raised while the cluster is healthy; pending, then
/// firing for the survivor once the leader and another member are killed (kill -9).
/// Upstream's `for:` applies, so this takes a little over a minute. On the way, every rule
/// and every dashboard query evaluates without error in Prometheus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_no_leader_alert_fires_when_the_cluster_loses_quorum() {
    let dir = tempfile::tempdir().unwrap();
    let cluster_dir = dir.path().join("cluster");
    std::fs::create_dir_all(&cluster_dir).unwrap();
    let mut c = Cluster::start(&cluster_dir, 3, &[]);
    let endpoints: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    let leader = common::agreed_leader(&endpoints, Duration::from_secs(20)).await;
    let targets: Vec<String> = c
        .members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.metrics_port))
        .collect();
    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let p = tokio::task::block_in_place(|| Prometheus::start(&prom_dir, &targets));

    // Healthy: every member scraped and reporting a leader...
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let has_leader = p.query(r#"etcd_server_has_leader{job="baton-etcd"} == 1"#);
        if has_leader.len() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "not all healthy: {has_leader:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // ...and over several evaluations no etcd alert at all, pending or firing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..5 {
        let raised: Vec<_> = alerts(p.port)
            .into_iter()
            .filter(|(name, _, _)| name.starts_with("etcd"))
            .collect();
        assert_eq!(raised, Vec::new(), "alerts on a healthy cluster");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for (rule, expr) in rule_exprs(ETCD_RULES)
        .into_iter()
        .chain(rule_exprs(BATON_RULES))
    {
        p.query(&expr);
        eprintln!("evaluates: {rule}");
    }
    for (_, expr) in dashboard_exprs() {
        p.query(&with_grafana_variables(&expr));
    }

    // Quorum lost: the leader and one follower are killed.
    let survivor = (leader + 1) % 3;
    for (i, m) in c.members.iter_mut().enumerate() {
        if i != survivor {
            m.kill9();
        }
    }
    let killed = Instant::now();
    let instance = targets[survivor].clone();
    let mut pending_at = None;
    let deadline = killed + Duration::from_secs(150);
    loop {
        let now = alerts(p.port);
        let no_leader: Vec<_> = now
            .iter()
            .filter(|(name, _, _)| name == "etcdNoLeader")
            .collect();
        assert!(
            no_leader.iter().all(|(_, _, i)| *i == instance),
            "etcdNoLeader for a member that is gone: {no_leader:?}"
        );
        match no_leader.first().map(|(_, state, _)| state.as_str()) {
            Some("firing") => break,
            Some("pending") if pending_at.is_none() => pending_at = Some(killed.elapsed()),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "etcdNoLeader did not fire: {now:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let fired = killed.elapsed();
    let pending_at = pending_at.expect("pending before firing");
    eprintln!("etcdNoLeader pending {pending_at:?} and firing {fired:?} after the kill");
    // `for: 1m` from the first evaluation that saw no leader.
    assert!(fired >= pending_at + Duration::from_secs(59), "{fired:?}");
    // etcd's member count rule sees it too (its `for:` is 3 m: still pending here).
    assert!(
        alerts(p.port)
            .iter()
            .any(|(name, state, _)| name == "etcdInsufficientMembers" && state == "pending"),
        "{:?}",
        alerts(p.port)
    );
}
