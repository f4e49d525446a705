//! `baton serve` started the way etcd is started: from etcd's YAML config file, from `ETCD_*`
//! environment variables, with refused flags answered in one line; `baton gateway start`
//! (etcd's TCP proxy) in front of a member; ids derived as etcd derives them.

use std::time::{Duration, Instant};

use crate::common::{baton_cmd, etcdctl, free_port_below_ephemeral, Proc};

/// Waits until `etcdctl endpoint health` at `endpoint` answers (a linearizable read: a
/// leader exists), or panics with what `proc` said.
fn wait_healthy(endpoint: &str, proc: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if etcdctl(endpoint, &["endpoint", "health"], None).code == 0 {
            return;
        }
        if Instant::now() > deadline {
            panic!("{endpoint} never became healthy\n{}", proc.said());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `member list -w json`'s only member: (id, name, peer URLs).
fn only_member(endpoint: &str) -> (u64, String, Vec<String>, u64) {
    let out = etcdctl(endpoint, &["member", "list", "-w", "json"], None);
    assert_eq!(out.code, 0, "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let m = &v["members"][0];
    assert_eq!(v["members"].as_array().unwrap().len(), 1, "{v}");
    (
        m["ID"].as_u64().unwrap(),
        m["name"].as_str().unwrap_or_default().to_string(),
        m["peerURLs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap().to_string())
            .collect(),
        v["header"]["cluster_id"].as_u64().unwrap(),
    )
}

#[test]
fn serve_from_etcds_config_file_ignoring_flags_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port_below_ephemeral(), free_port_below_ephemeral());
    let log_file = dir.path().join("member.log");
    let config = dir.path().join("etcd.conf.yml");
    // etcd's keys and layout (etcd.conf.yml.sample), with values that ask nothing Baton lacks.
    std::fs::write(
        &config,
        format!(
            "name: 'from-file'
data-dir: {data}
wal-dir:
snapshot-count: 10000
heartbeat-interval: 100
election-timeout: 1000
listen-peer-urls: http://127.0.0.1:{peer}
listen-client-urls: http://127.0.0.1:{client}
max-snapshots: 5
max-wals: 5
cors:
initial-advertise-peer-urls: http://127.0.0.1:{peer}
advertise-client-urls: http://127.0.0.1:{client}
discovery:
discovery-fallback: 'proxy'
initial-cluster: from-file=http://127.0.0.1:{peer}
initial-cluster-token: 'etcd-cluster'
initial-cluster-state: 'new'
strict-reconfig-check: false
enable-v2: false
enable-pprof: false
proxy: 'off'
proxy-failure-wait: 5000
client-transport-security:
  cert-file:
  key-file:
  client-cert-auth: false
  trusted-ca-file:
  auto-tls: false
peer-transport-security:
  client-cert-auth: false
  auto-tls: false
debug: false
logger: zap
log-outputs: [stderr, {log}]
grpc-keepalive-interval: 7200000000000
",
            data = dir.path().join("data").display(),
            log = log_file.display(),
        ),
    )
    .unwrap();
    let mut cmd = baton_cmd();
    cmd.args(["serve", "--config-file"])
        .arg(&config)
        .args(["--name", "from-flag"])
        .env("ETCD_NAME", "from-env");
    let p = Proc::spawn("baton serve --config-file", cmd);
    let endpoint = format!("127.0.0.1:{client}");
    wait_healthy(&endpoint, &p);
    let (id, name, peers, cluster) = only_member(&endpoint);
    assert_eq!(
        name, "from-file",
        "the file wins over flags and variables, as in etcd"
    );
    let peer_url = format!("http://127.0.0.1:{peer}");
    assert_eq!(peers, vec![peer_url.clone()]);
    // etcd's ids: SHA-1 of the peer URLs and the token; the cluster's of the member ids.
    assert_eq!(
        id,
        baton_raft::etcd_member_id(&[peer_url], "etcd-cluster", None)
    );
    assert_eq!(cluster, baton_raft::cluster_id(&[id]));
    assert!(
        p.stderr().contains("these command-line flags are ignored"),
        "{}",
        p.said()
    );
    // --log-outputs: the file gets the same lines as stderr.
    let logged = std::fs::read_to_string(&log_file).unwrap();
    assert!(logged.contains("serving client="), "{logged}");
}

#[test]
fn serve_from_etcd_environment_variables() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port_below_ephemeral(), free_port_below_ephemeral());
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut cmd = baton_cmd();
    cmd.args(["serve", "-initial-cluster-token", "unit-file"])
        .env("ETCD_NAME", "env-member")
        .env("ETCD_DATA_DIR", dir.path().join("data"))
        .env(
            "ETCD_LISTEN_CLIENT_URLS",
            format!("http://127.0.0.1:{client}"),
        )
        .env(
            "ETCD_ADVERTISE_CLIENT_URLS",
            format!("http://127.0.0.1:{client}"),
        )
        .env("ETCD_LISTEN_PEER_URLS", &peer_url)
        .env("ETCD_INITIAL_ADVERTISE_PEER_URLS", &peer_url)
        .env("ETCD_INITIAL_CLUSTER", format!("env-member={peer_url}"))
        .env("ETCD_LISTEN_METRICS_URLS", "")
        .env("ETCD_ENABLE_V2", "false")
        .env("ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL", "5s")
        .env("ETCD_NOT_A_FLAG", "x");
    let p = Proc::spawn("baton serve (ETCD_*)", cmd);
    let endpoint = format!("127.0.0.1:{client}");
    wait_healthy(&endpoint, &p);
    let (id, name, _, _) = only_member(&endpoint);
    assert_eq!(name, "env-member");
    assert_eq!(
        id,
        baton_raft::etcd_member_id(&[peer_url], "unit-file", None)
    );
    assert!(
        p.stderr()
            .contains("unrecognized environment variable ETCD_NOT_A_FLAG=x"),
        "{}",
        p.said()
    );
}

/// A refused flag, from the command line or the environment, stops `baton serve` at once
/// with one line naming it and why, and exit status 2 (Go's flag package's).
#[test]
fn refused_flags_are_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 5] = [
        (&["--enable-v2"], &[], "baton serve: --enable-v2: the v2 API is not provided"),
        (&[], &[("ETCD_ENABLE_V2", "true")], "baton serve: --enable-v2: the v2 API is not provided"),
        (&["--wal-dir", "/tmp/w"], &[], "baton serve: --wal-dir: Baton keeps its Raft log inside --data-dir (raft/); a separate WAL directory is not provided"),
        (&["--name", "a"], &[("ETCD_NAME", "b")], "baton serve: conflicting environment variable \"ETCD_NAME\" is shadowed by the command-line flag --name (unset one of them; etcd refuses both too)"),
        (&["--no-such-flag"], &[], "baton serve: flag provided but not defined: -no-such-flag"),
    ];
    for (args, env, line) in cases {
        let mut cmd = baton_cmd();
        cmd.arg("serve")
            .args(["--data-dir"])
            .arg(dir.path().join("never"))
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), format!("{line}\n"));
        assert!(
            !dir.path().join("never").exists(),
            "a refused start created nothing"
        );
    }
}

#[test]
fn gateway_proxies_clients_to_the_members() {
    let dir = tempfile::tempdir().unwrap();
    let member = crate::common::Baton::start(&dir.path().join("m"));
    let listen = free_port_below_ephemeral();
    let mut cmd = baton_cmd();
    // etcd's e2e suite gives --endpoints before `start`.
    cmd.args([
        "gateway",
        &format!("--endpoints=http://127.0.0.1:1,{}", member.url()),
        "start",
        "--listen-addr",
        &format!("127.0.0.1:{listen}"),
    ]);
    let p = Proc::spawn("baton gateway start", cmd);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !p.stderr().contains("ready to proxy client requests") {
        assert!(Instant::now() < deadline, "{}", p.said());
        std::thread::sleep(Duration::from_millis(20));
    }
    let via = format!("127.0.0.1:{listen}");
    // The first address refuses: it is set aside and the connections go to the member.
    for i in 0..3 {
        let out = etcdctl(&via, &["put", &format!("k{i}"), "v"], None);
        assert_eq!(out.code, 0, "{out:?}\n{}", p.said());
    }
    let out = etcdctl(
        &member.endpoint(),
        &["get", "k2", "--print-value-only"],
        None,
    );
    assert_eq!(out.stdout.trim(), "v");
    assert!(p.stderr().contains("deactivated endpoint"), "{}", p.said());
}

#[test]
fn etcd_version_lines() {
    let out = baton_cmd().args(["serve", "--version"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "etcd Version: 3.4.23");
    assert!(
        lines[1].starts_with("Git SHA: ") && lines[1].contains("Baton"),
        "{text}"
    );
    assert!(lines[2].starts_with("Go Version: "), "{text}");
    assert!(lines[3].starts_with("Go OS/Arch: linux/"), "{text}");
    let own = baton_cmd().arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8(own.stdout).unwrap(),
        format!("baton {} (etcd API 3.4.23)\n", env!("CARGO_PKG_VERSION"))
    );
}
