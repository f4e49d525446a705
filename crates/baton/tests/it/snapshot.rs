//! Backups in etcd's format with real processes (issue 18): migrations both ways between a
//! real etcd 3.4 and Baton, `baton snapshot save|status|restore`, and damaged files refused.
//!
//! The same data goes into each source ([`load`], through etcdctl, as an operator's would):
//! 10,000 keys written by txns of 100 puts (sub revisions), 3,000 of them rewritten, 200
//! more by single puts, 1,000 deleted by one prefix delete and 100 of those created again, a
//! compaction in the middle of that history, 4 leases with 25 keys each, users `root` and
//! `alice` (role `reader`: read on `key/0`), auth enabled. Each side is then read back with
//! etcdctl ([`dump`]) and compared field by field: every key's value, create and mod
//! revision, version and lease, the store revision, every lease's granted TTL and keys,
//! users with their roles, roles with their permissions; and `alice` logs in and is held to
//! her permissions.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, baton_cmd, etcdctl, free_port_below_ephemeral, Baton, Out};

const ROOT: &str = "--user=root:rootpw";

fn ok(out: Out, what: &str) -> String {
    assert_eq!(out.code, 0, "{what}: {}{}", out.stdout, out.stderr);
    out.stdout
}

/// A txn of puts through etcdctl's txn format (no compares, all in the success branch).
fn txn_puts(endpoint: &str, puts: &[String]) {
    // compares (none), a blank line, the success ops, a blank line, the failure ops (none)
    let body = format!("\n{}\n\n\n", puts.join("\n"));
    let out = ok(etcdctl(endpoint, &["txn"], Some(&body)), "txn");
    assert!(out.starts_with("SUCCESS"), "{out}");
}

/// Writes the test data (see the module docs) into `endpoint`, etcd or Baton alike.
fn load(endpoint: &str) {
    for batch in 0..100 {
        let puts: Vec<String> = (0..100)
            .map(|i| format!("put key/{:05} v1-{}", batch * 100 + i, batch * 100 + i))
            .collect();
        txn_puts(endpoint, &puts);
    }
    for batch in 0..30 {
        let puts: Vec<String> = (0..100)
            .map(|i| format!("put key/{:05} v2-{}", batch * 100 + i, batch * 100 + i))
            .collect();
        txn_puts(endpoint, &puts);
    }
    let header = ok(
        etcdctl(endpoint, &["get", "key/00000", "-w", "json"], None),
        "get",
    );
    let mid: Value = serde_json::from_str(&header).unwrap();
    let mid = mid["header"]["revision"].as_i64().unwrap() - 10;
    for i in 3000..3200 {
        ok(
            etcdctl(
                endpoint,
                &["put", &format!("key/{i:05}"), &format!("v3-{i}")],
                None,
            ),
            "put",
        );
    }
    ok(
        etcdctl(endpoint, &["compact", &mid.to_string()], None),
        "compact",
    );
    let deleted = ok(
        etcdctl(endpoint, &["del", "key/09", "--prefix"], None),
        "del",
    );
    assert_eq!(deleted.trim(), "1000");
    let again: Vec<String> = (9000..9100)
        .map(|i| format!("put key/{i:05} again-{i}"))
        .collect();
    txn_puts(endpoint, &again);
    for l in 0..4 {
        let granted = ok(
            etcdctl(endpoint, &["lease", "grant", "3600"], None),
            "grant",
        );
        let id = granted.split_whitespace().nth(1).unwrap().to_string();
        let puts: Vec<String> = (0..25)
            .map(|k| format!("put lease/{l}/{k:02} held --lease={id}"))
            .collect();
        txn_puts(endpoint, &puts);
    }
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "grant-role", "root", "root"],
        &["role", "add", "reader"],
        &[
            "role",
            "grant-permission",
            "reader",
            "read",
            "key/0",
            "--prefix",
        ],
        &["user", "add", "alice:alicepw"],
        &["user", "grant-role", "alice", "reader"],
        &["auth", "enable"],
    ] {
        ok(etcdctl(endpoint, args, None), &args.join(" "));
    }
}

/// One key as etcdctl's JSON shows it (key and value in base64, as printed).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Kv {
    key: String,
    value: String,
    create_revision: i64,
    mod_revision: i64,
    version: i64,
    lease: i64,
}

/// Everything compared between two stores.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dump {
    revision: i64,
    kvs: Vec<Kv>,
    /// granted TTL and attached keys, by lease id
    leases: BTreeMap<i64, (i64, Vec<String>)>,
    /// roles, by user
    users: BTreeMap<String, Value>,
    /// permissions, by role
    roles: BTreeMap<String, Value>,
}

fn json(endpoint: &str, args: &[&str]) -> Value {
    let mut all = vec![ROOT];
    all.extend_from_slice(args);
    let out = ok(etcdctl(endpoint, &all, None), &args.join(" "));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// Reads everything [`Dump`] holds from `endpoint`, as root.
fn dump(endpoint: &str) -> Dump {
    let all = json(endpoint, &["get", "", "--from-key", "-w", "json"]);
    let kvs = all["kvs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| Kv {
            key: kv["key"].as_str().unwrap().to_string(),
            value: kv["value"].as_str().unwrap_or("").to_string(),
            create_revision: int(&kv["create_revision"]),
            mod_revision: int(&kv["mod_revision"]),
            version: int(&kv["version"]),
            lease: int(&kv["lease"]),
        })
        .collect();
    let list = ok(
        etcdctl(endpoint, &[ROOT, "lease", "list"], None),
        "lease list",
    );
    let mut leases = BTreeMap::new();
    for hex in list.lines().skip(1) {
        let ttl = json(
            endpoint,
            &["lease", "timetolive", hex, "--keys", "-w", "json"],
        );
        let mut keys: Vec<String> = ttl["keys"]
            .as_array()
            .map(|a| a.iter().map(|k| k.as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        keys.sort();
        leases.insert(int(&ttl["id"]), (int(&ttl["granted-ttl"]), keys));
    }
    let mut users = BTreeMap::new();
    let names = ok(
        etcdctl(endpoint, &[ROOT, "user", "list"], None),
        "user list",
    );
    for name in names.lines() {
        let u = json(endpoint, &["user", "get", name, "-w", "json"]);
        users.insert(name.to_string(), u["roles"].clone());
    }
    let mut roles = BTreeMap::new();
    let names = ok(
        etcdctl(endpoint, &[ROOT, "role", "list"], None),
        "role list",
    );
    for name in names.lines().filter(|n| *n != "root") {
        let r = json(endpoint, &["role", "get", name, "-w", "json"]);
        roles.insert(name.to_string(), r["perm"].clone());
    }
    Dump {
        revision: int(&all["header"]["revision"]),
        kvs,
        leases,
        users,
        roles,
    }
}

/// Field by field, so a failure names the first difference instead of two huge structs.
fn assert_same(source: &Dump, restored: &Dump, what: &str) {
    assert_eq!(
        source.kvs.len(),
        9_200,
        "the source holds what `load` wrote"
    );
    assert_eq!(restored.kvs.len(), source.kvs.len(), "{what}: key count");
    for (a, b) in source.kvs.iter().zip(&restored.kvs) {
        assert_eq!(a, b, "{what}: a key differs");
    }
    assert_eq!(restored.revision, source.revision, "{what}: store revision");
    assert_eq!(source.leases.len(), 4);
    assert_eq!(
        restored.leases, source.leases,
        "{what}: leases (granted TTL, keys)"
    );
    assert_eq!(
        restored.users, source.users,
        "{what}: users and their roles"
    );
    assert_eq!(
        restored.roles, source.roles,
        "{what}: roles and their permissions"
    );
}

/// `alice` logs in with her password and is held to her role: she reads `key/0…`, nothing
/// else, and writes nothing; a wrong password is refused.
fn assert_logins(endpoint: &str, what: &str) {
    let read = etcdctl(
        endpoint,
        &[
            "--user=alice:alicepw",
            "get",
            "key/00042",
            "--print-value-only",
        ],
        None,
    );
    assert_eq!(read.code, 0, "{what}: alice reads: {}", read.stderr);
    assert_eq!(read.stdout.trim(), "v2-42", "{what}");
    let refused = etcdctl(
        endpoint,
        &["--user=alice:alicepw", "put", "key/00042", "x"],
        None,
    );
    assert!(
        refused.stderr.contains("permission denied"),
        "{what}: {refused:?}"
    );
    let outside = etcdctl(
        endpoint,
        &["--user=alice:alicepw", "get", "lease/0/00"],
        None,
    );
    assert!(
        outside.stderr.contains("permission denied"),
        "{what}: {outside:?}"
    );
    let wrong = etcdctl(endpoint, &["--user=alice:nope", "get", "key/00042"], None);
    assert!(
        wrong.stderr.contains("authentication failed"),
        "{what}: {wrong:?}"
    );
}

/// Waits until `endpoint` answers a linearizable read as root (a leader is elected).
fn wait_ready(endpoint: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = etcdctl(endpoint, &[ROOT, "get", "key/00000"], None);
        if out.code == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{endpoint} never answered: {}",
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn run(mut cmd: Command, what: &str) -> Out {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A real etcd 3.4 started on `data_dir` (as `etcdctl snapshot restore` made it for
/// `name` at `peer_port`); killed when dropped.
struct RestoredEtcd {
    child: Child,
    client_port: u16,
}

impl RestoredEtcd {
    /// The peer port is the restore's; the client port is fresh (`common::start_etcd`).
    fn start(data_dir: &Path, name: &str, peer_port: u16) -> RestoredEtcd {
        let (child, client_port) =
            common::start_etcd(name, data_dir, || peer_port, "restored etcd");
        RestoredEtcd { child, client_port }
    }

    fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
}

impl Drop for RestoredEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `baton snapshot restore` of `file` into `n` members under `dir`, then those members
/// started as a new cluster with the same flags.
fn restore_baton_cluster(dir: &Path, file: &Path, n: usize) -> Vec<Baton> {
    let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
    let peer_ports: Vec<u16> = (0..n).map(|_| free_port_below_ephemeral()).collect();
    let initial = names
        .iter()
        .zip(&peer_ports)
        .map(|(name, port)| format!("{name}=http://127.0.0.1:{port}"))
        .collect::<Vec<_>>()
        .join(",");
    let token = format!("restored-{:016x}", rand::random::<u64>());
    let mut members = Vec::new();
    for (name, port) in names.iter().zip(&peer_ports) {
        let data_dir = dir.join(name);
        let mut cmd = baton_cmd();
        cmd.args(["snapshot", "restore"])
            .arg(file)
            .args(["--name", name, "--initial-cluster", &initial])
            .args(["--initial-cluster-token", &token])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{port}"),
            ])
            .arg("--data-dir")
            .arg(&data_dir);
        let out = run(cmd, "baton snapshot restore");
        assert_eq!(out.code, 0, "restore {name}: {}{}", out.stdout, out.stderr);
        assert!(out.stdout.contains("9200 keys"), "{}", out.stdout);
        members.push(Baton {
            child: None,
            data_dir,
            client_port: free_port_below_ephemeral(),
            metrics_port: free_port_below_ephemeral(),
            peer_port: *port,
            extra_args: vec![
                "--name".into(),
                name.clone(),
                "--initial-cluster".into(),
                initial.clone(),
                "--initial-cluster-token".into(),
                token.clone(),
            ],
            nofile_limit: None,
            client_urls: None,
            peer_scheme: "http",
        });
    }
    for m in &mut members {
        m.spawn();
    }
    members
}

/// etcd 3.4 → `etcdctl snapshot save` → `baton snapshot restore` into 3 members → the Baton
/// cluster serves the same keys, revisions, versions, leases and users, on every member.
#[test]
fn an_etcd_snapshot_restores_into_a_three_member_baton_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = common::Etcd::start();
    load(&etcd.endpoint());
    let source = dump(&etcd.endpoint());
    let file = dir.path().join("from-etcd.db");
    let saved = etcdctl(
        &etcd.endpoint(),
        &[ROOT, "snapshot", "save", file.to_str().unwrap()],
        None,
    );
    assert_eq!(saved.code, 0, "{}", saved.stderr);
    drop(etcd);

    let members = restore_baton_cluster(dir.path(), &file, 3);
    for m in &members {
        wait_ready(&m.endpoint());
    }
    for (i, m) in members.iter().enumerate() {
        let what = format!("baton member {} restored from etcd", i + 1);
        assert_same(&source, &dump(&m.endpoint()), &what);
        assert_logins(&m.endpoint(), &what);
    }
    // The restored cluster is a cluster: a write through one member is read on another,
    // at the next revision.
    ok(
        etcdctl(
            &members[0].endpoint(),
            &[ROOT, "put", "after", "restore"],
            None,
        ),
        "put",
    );
    let after = json(&members[2].endpoint(), &["get", "after", "-w", "json"]);
    assert_eq!(int(&after["kvs"][0]["mod_revision"]), source.revision + 1);
}

/// Baton → `etcdctl snapshot save` → `etcdctl snapshot restore` → a real etcd 3.4 serves
/// the same; and the same Baton → `baton snapshot save` → `baton snapshot status` (equal to
/// etcdctl's) → `baton snapshot restore` → Baton serves the same.
#[test]
fn a_baton_snapshot_restores_into_etcd_and_into_baton() {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::start(&dir.path().join("source"));
    load(&baton.endpoint());
    let source = dump(&baton.endpoint());

    // (b) into etcd, with etcd's own tools
    let file = dir.path().join("by-etcdctl.db");
    let saved = etcdctl(
        &baton.endpoint(),
        &[ROOT, "snapshot", "save", file.to_str().unwrap()],
        None,
    );
    assert_eq!(saved.code, 0, "{}", saved.stderr);
    let peer_port = free_port_below_ephemeral();
    let etcd_dir = dir.path().join("etcd-restored");
    let restored = etcdctl(
        &baton.endpoint(),
        &[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--name",
            "e1",
            "--data-dir",
            etcd_dir.to_str().unwrap(),
            "--initial-cluster",
            &format!("e1=http://127.0.0.1:{peer_port}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
        ],
        None,
    );
    assert_eq!(restored.code, 0, "{}", restored.stderr);
    let etcd = RestoredEtcd::start(&etcd_dir, "e1", peer_port);
    wait_ready(&etcd.endpoint());
    assert_same(&source, &dump(&etcd.endpoint()), "etcd restored from Baton");
    assert_logins(&etcd.endpoint(), "etcd restored from Baton");
    drop(etcd);

    // (c) `baton snapshot save|status|restore`
    let file = dir.path().join("by-baton.db");
    let mut cmd = baton_cmd();
    cmd.args(["snapshot", "save"])
        .arg(&file)
        .args(["--endpoints", &baton.endpoint(), ROOT]);
    let out = run(cmd, "baton snapshot save");
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout.trim(),
        format!("Snapshot saved at {}", file.display())
    );
    let mut cmd = baton_cmd();
    cmd.args(["snapshot", "status", "-w", "json"]).arg(&file);
    let ours: Value =
        serde_json::from_str(&ok(run(cmd, "baton snapshot status"), "status")).unwrap();
    let theirs: Value = serde_json::from_str(&ok(
        etcdctl(
            &baton.endpoint(),
            &["snapshot", "status", "-w", "json", file.to_str().unwrap()],
            None,
        ),
        "etcdctl snapshot status",
    ))
    .unwrap();
    assert_eq!(ours, theirs, "baton and etcdctl read the same status");
    assert_eq!(int(&ours["revision"]), source.revision);
    let members = restore_baton_cluster(&dir.path().join("restored"), &file, 1);
    wait_ready(&members[0].endpoint());
    assert_same(
        &source,
        &dump(&members[0].endpoint()),
        "baton restored from baton",
    );
    assert_logins(&members[0].endpoint(), "baton restored from baton");
}

/// A snapshot with one byte flipped is refused by both restores, with etcdctl's words, and
/// leaves no data directory behind; a torn page restored without the hash check is refused
/// by the page checks; a restore into a directory that holds anything is refused.
#[test]
fn damaged_snapshots_are_refused_by_both_restores() {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::start(&dir.path().join("source"));
    for i in 0..200 {
        ok(
            etcdctl(&baton.endpoint(), &["put", &format!("k{i:03}"), "v"], None),
            "put",
        );
    }
    let file = dir.path().join("good.db");
    let out = common::baton(
        &baton.endpoint(),
        &["snapshot", "save", file.to_str().unwrap()],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let good = std::fs::read(&file).unwrap();

    let flipped = dir.path().join("flipped.db");
    let mut bytes = good.clone();
    bytes[3 * 4096 + 100] ^= 0x01;
    std::fs::write(&flipped, &bytes).unwrap();
    let target = dir.path().join("never");
    let out = common::baton(
        &baton.endpoint(),
        &[
            "snapshot",
            "restore",
            flipped.to_str().unwrap(),
            "--data-dir",
            target.to_str().unwrap(),
        ],
        None,
    );
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("expected sha256"), "{}", out.stderr);
    assert!(
        !target.exists(),
        "nothing is written for a refused snapshot"
    );
    let etcd_target = dir.path().join("never-etcd");
    let out = etcdctl(
        &baton.endpoint(),
        &[
            "snapshot",
            "restore",
            flipped.to_str().unwrap(),
            "--data-dir",
            etcd_target.to_str().unwrap(),
        ],
        None,
    );
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("expected sha256"), "{}", out.stderr);

    // Without the trailer check a torn page is still caught (its header names another page).
    let torn = dir.path().join("torn.db");
    let mut bytes = good[..good.len() - 32].to_vec();
    bytes[5 * 4096..5 * 4096 + 8].copy_from_slice(&77u64.to_le_bytes());
    std::fs::write(&torn, &bytes).unwrap();
    let out = common::baton(
        &baton.endpoint(),
        &[
            "snapshot",
            "restore",
            torn.to_str().unwrap(),
            "--skip-hash-check",
            "--data-dir",
            target.to_str().unwrap(),
        ],
        None,
    );
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("page 5"), "{}", out.stderr);
    assert!(!target.exists());

    // Truncated: refused before anything is read.
    let short = dir.path().join("short.db");
    std::fs::write(&short, &good[..good.len() / 2]).unwrap();
    let out = common::baton(
        &baton.endpoint(),
        &[
            "snapshot",
            "restore",
            short.to_str().unwrap(),
            "--data-dir",
            target.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.stderr.contains("snapshot missing hash"),
        "{}",
        out.stderr
    );

    // Into a directory that holds anything: etcdctl's words, nothing touched.
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("keep"), b"x").unwrap();
    let out = common::baton(
        &baton.endpoint(),
        &[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            taken.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.stderr.contains("exists"), "{}", out.stderr);
    assert_eq!(std::fs::read_dir(&taken).unwrap().count(), 1);

    // The good one restores.
    let out = common::baton(
        &baton.endpoint(),
        &[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            target.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("200 keys"), "{}", out.stdout);
}

/// The server's resident memory in bytes (`VmRSS`).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A snapshot of a 1M-key store streams from a frozen copy with bounded memory: the server's
/// RSS while `baton snapshot save` runs stays within a bound far below a second copy of the
/// store, writes go on during the stream, and etcd's tool reads the file. Slow (loads 1M
/// keys): `cargo test -p baton --test it snapshot::a_million -- --ignored --nocapture`, with
/// `BATON_BIN=target/release/baton` for the numbers the docs quote.
#[test]
#[ignore = "1M keys; run with --ignored (see the doc comment)"]
fn a_million_key_snapshot_streams_with_bounded_memory() {
    use baton_proto::etcdserverpb as pb;
    let dir = tempfile::tempdir().unwrap();
    let bin = std::env::var("BATON_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_baton").into());
    let port = free_port_below_ephemeral();
    let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
    let mut server = Command::new(&bin)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", &format!("http://127.0.0.1:{port}")])
        .args([
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    common::wait_for_port(port, Duration::from_secs(20)).expect("baton serves");
    let endpoint = format!("127.0.0.1:{port}");
    const KEYS: usize = 1_000_000;
    const PER_TXN: usize = 128;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let started = Instant::now();
    rt.block_on(async {
        let ch = common::channel(&endpoint).await;
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let ch = ch.clone();
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                let mut kv = pb::kv_client::KvClient::new(ch);
                loop {
                    let first = next.fetch_add(PER_TXN, std::sync::atomic::Ordering::Relaxed);
                    if first >= KEYS {
                        return;
                    }
                    let success = (first..(first + PER_TXN).min(KEYS))
                        .map(|i| pb::RequestOp {
                            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                                key: format!("key/{i:07}").into_bytes(),
                                value: vec![b'v'; 100],
                                ..Default::default()
                            })),
                        })
                        .collect();
                    kv.txn(pb::TxnRequest {
                        success,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    eprintln!(
        "loaded {KEYS} keys in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Compacted: every version is at or below the compact revision, the path that sorts.
    let out = etcdctl(&endpoint, &["get", "key/0000000", "-w", "json"], None);
    let head: Value = serde_json::from_str(&out.stdout).unwrap();
    let rev = head["header"]["revision"].as_i64().unwrap();
    ok(
        etcdctl(&endpoint, &["compact", &rev.to_string()], None),
        "compact",
    );
    std::thread::sleep(Duration::from_secs(2));
    let before = rss_bytes(server.id());

    let file = dir.path().join("million.db");
    let save_started = Instant::now();
    let mut save = Command::new(&bin)
        .args(["snapshot", "save"])
        .arg(&file)
        .args(["--endpoints", &endpoint])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut peak = before;
    let mut writes = 0;
    while save.try_wait().unwrap().is_none() {
        peak = peak.max(rss_bytes(server.id()));
        // Applies go on while the snapshot streams (nothing holds the state lock).
        if writes < 20 {
            ok(
                etcdctl(&endpoint, &["put", &format!("during/{writes}"), "x"], None),
                "put during",
            );
            writes += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = save_started.elapsed();
    assert!(save.wait().unwrap().success());
    let size = std::fs::metadata(&file).unwrap().len();
    eprintln!(
        "snapshot of {KEYS} keys: {} bytes in {:.1} s ({:.0} MB/s); server RSS {} MB before, \
         peak {} MB during (+{} MB); {writes} writes applied meanwhile",
        size,
        took.as_secs_f64(),
        size as f64 / 1e6 / took.as_secs_f64(),
        before / 1_000_000,
        peak / 1_000_000,
        (peak - before) / 1_000_000
    );
    assert_eq!(writes, 20);
    // A second copy of the store would be at least its size again; the stream's own memory
    // is the writer's page and page index, the chunk queue, and one sort index of 24 bytes
    // a key (the compacted versions).
    assert!(
        peak - before < before / 4,
        "RSS grew by {} MB over {} MB during the snapshot",
        (peak - before) / 1_000_000,
        before / 1_000_000
    );
    let st = etcdctl(
        &endpoint,
        &["snapshot", "status", "-w", "json", file.to_str().unwrap()],
        None,
    );
    let st: Value = serde_json::from_str(&ok(st, "status")).unwrap();
    // The keys, the writes that came before the copy was taken, and 7 entries of the other
    // buckets (auth 2, cluster 1, members 1, meta 3).
    let total = int(&st["totalKey"]) as usize;
    assert!((KEYS + 7..=KEYS + 7 + 20).contains(&total), "{st}");
    let _ = server.kill();
    let _ = server.wait();

    // The restore reads page by page into the store it builds: its peak is about the
    // restored store, not the file plus the store.
    let restore_started = Instant::now();
    let mut restore = Command::new(&bin)
        .args(["snapshot", "restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("restored"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut restore_peak = 0;
    while restore.try_wait().unwrap().is_none() {
        restore_peak = restore_peak.max(rss_bytes(restore.id()));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(restore.wait().unwrap().success());
    eprintln!(
        "restore of {KEYS} keys: {:.1} s, peak RSS {} MB (the file: {} MB)",
        restore_started.elapsed().as_secs_f64(),
        restore_peak / 1_000_000,
        size / 1_000_000
    );
    assert!(restore_peak < before, "the restore holds the store once");
}

/// `baton serve` on a data directory `etcdctl snapshot restore` made (etcd's layout) imports
/// etcd's database at its first start and serves it (etcd's `TestIssue6361` runbook); on the
/// data directory of an etcd that has run, it refuses to start and says what to do instead.
#[test]
fn baton_serve_takes_a_data_directory_etcdctl_restored() {
    let dir = tempfile::tempdir().unwrap();
    let etcd_dir = dir.path().join("etcd-ran");
    let peer_port = free_port_below_ephemeral();
    let etcd = RestoredEtcd::start(&etcd_dir, "e1", peer_port);
    wait_ready_plain(&etcd.endpoint());
    for i in 0..50 {
        ok(
            etcdctl(
                &etcd.endpoint(),
                &["put", &format!("k{i:02}"), &format!("v{i}")],
                None,
            ),
            "put",
        );
    }
    let file = dir.path().join("from-etcd.db");
    ok(
        etcdctl(
            &etcd.endpoint(),
            &["snapshot", "save", file.to_str().unwrap()],
            None,
        ),
        "save",
    );
    drop(etcd);

    let restored = dir.path().join("restored");
    let peer_port = free_port_below_ephemeral();
    let peer = format!("http://127.0.0.1:{peer_port}");
    let initial = format!("r1={peer}");
    ok(
        etcdctl(
            "127.0.0.1:1",
            &[
                "snapshot",
                "restore",
                file.to_str().unwrap(),
                "--name",
                "r1",
                "--data-dir",
                restored.to_str().unwrap(),
                "--initial-cluster",
                &initial,
                "--initial-advertise-peer-urls",
                &peer,
            ],
            None,
        ),
        "etcdctl snapshot restore",
    );
    let mut baton = Baton {
        child: None,
        data_dir: restored.clone(),
        client_port: free_port_below_ephemeral(),
        metrics_port: free_port_below_ephemeral(),
        peer_port,
        extra_args: vec![
            "--name".into(),
            "r1".into(),
            "--initial-cluster".into(),
            initial,
        ],
        nofile_limit: None,
        client_urls: None,
        peer_scheme: "http",
    };
    baton.spawn();
    wait_ready_plain(&baton.endpoint());
    let got = ok(
        etcdctl(
            &baton.endpoint(),
            &["get", "k42", "--print-value-only"],
            None,
        ),
        "get",
    );
    assert_eq!(got.trim(), "v42");
    assert!(restored.join("member.meta").exists() && restored.join("member/snap/db").exists());
    // A restart uses Baton's files (the import happens once).
    baton.kill9();
    baton.spawn();
    wait_ready_plain(&baton.endpoint());
    ok(
        etcdctl(&baton.endpoint(), &["put", "after", "x"], None),
        "put after restart",
    );

    // The directory etcd itself ran on: its WAL may hold entries the database has not.
    let mut cmd = baton_cmd();
    cmd.args(["serve", "--name", "e1", "--data-dir"])
        .arg(&etcd_dir)
        .args([
            "--listen-client-urls",
            &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
        ])
        .args([
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
        ]);
    let out = run(cmd, "baton serve on etcd's own data directory");
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("an etcd that has run")
            && out.stderr.contains("baton snapshot restore"),
        "{}",
        out.stderr
    );
    assert!(!etcd_dir.join("member.meta").exists(), "nothing written");
}

/// [`wait_ready`] without auth.
fn wait_ready_plain(endpoint: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = etcdctl(endpoint, &["get", "k00"], None);
        if out.code == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{endpoint} never answered: {}",
            out.stderr
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A copy of a Baton member's own `member/snap/db` is a valid etcd backend file: `etcdctl
/// snapshot status` and `snapshot restore` (with `--skip-hash-check`, as for etcd's own
/// file) take it. `baton serve` on what etcdctl restored refuses it with the way that
/// works (its `baton` bucket would be taken for the new member's own snapshot of the old
/// cluster), and `baton snapshot restore` of the copy serves the keys it held.
#[test]
fn a_members_db_copy_restores_through_baton_not_etcdctl() {
    let dir = tempfile::tempdir().unwrap();
    let mut source = Baton::start_with(&dir.path().join("source"), &["--snapshot-count", "3"]);
    wait_ready_plain(&source.endpoint());
    for i in 0..12 {
        ok(
            etcdctl(
                &source.endpoint(),
                &["put", &format!("k{i:02}"), &format!("v{i}")],
                None,
            ),
            "put",
        );
    }
    let db = dir.path().join("source/member/snap/db");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read(&db)
        .unwrap_or_default()
        .windows(3)
        .any(|w| w == b"k08")
    {
        assert!(Instant::now() < deadline, "no snapshot holds k08");
        std::thread::sleep(Duration::from_millis(50));
    }
    source.terminate();
    let copy = dir.path().join("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    let status = ok(
        etcdctl(
            "127.0.0.1:1",
            &["snapshot", "status", copy.to_str().unwrap(), "-w", "json"],
            None,
        ),
        "etcdctl snapshot status",
    );
    assert!(status.contains("\"revision\""), "{status}");

    let by_etcdctl = dir.path().join("by-etcdctl");
    ok(
        etcdctl(
            "127.0.0.1:1",
            &[
                "snapshot",
                "restore",
                copy.to_str().unwrap(),
                "--skip-hash-check",
                "--data-dir",
                by_etcdctl.to_str().unwrap(),
            ],
            None,
        ),
        "etcdctl snapshot restore",
    );
    let mut cmd = baton_cmd();
    cmd.args(["serve", "--data-dir"])
        .arg(&by_etcdctl)
        .args([
            "--listen-client-urls",
            &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
        ])
        .args([
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
        ])
        .args([
            "--listen-metrics-urls",
            &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
        ]);
    let out = run(cmd, "baton serve on etcdctl's restore of a member's db");
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("is a Baton member's own snapshot")
            && out.stderr.contains("baton snapshot restore"),
        "{}",
        out.stderr
    );
    assert!(!by_etcdctl.join("member.meta").exists(), "nothing written");

    let by_baton = dir.path().join("by-baton");
    let mut cmd = baton_cmd();
    cmd.args(["snapshot", "restore"])
        .arg(&copy)
        .arg("--skip-hash-check")
        .arg("--data-dir")
        .arg(&by_baton);
    let out = run(cmd, "baton snapshot restore of a member's db");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut restored = Baton::start(&by_baton);
    wait_ready_plain(&restored.endpoint());
    let got = ok(
        etcdctl(
            &restored.endpoint(),
            &["get", "k08", "--print-value-only"],
            None,
        ),
        "get",
    );
    assert_eq!(got.trim(), "v8");
    restored.terminate();
}
