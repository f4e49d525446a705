//! A data directory written before formats carried versions still opens, with everything in
//! it: the backward-compatibility test of `baton_core::format` on real files (redb's habit).
//!
//! # The fixture (`tests/fixtures/datadir-v1/`, 6 KiB)
//! Written by `baton serve` built from commit acb9153 (a clean tree, `cargo build -p baton`,
//! debug), the last commit before the WAL's format version record and the peer envelope's
//! `format_version`; it is therefore WAL format 1 (a generation starting with
//! `GenerationStart`) and snapshot format 4. Made with:
//!
//! ```text
//! baton serve --name fixture --data-dir D --snapshot-count 8 \
//!   --listen-client-urls http://127.0.0.1:23791 --listen-peer-urls http://127.0.0.1:23792 \
//!   --listen-metrics-urls http://127.0.0.1:23793
//! etcdctl put fixture/k1..k6 value-1..value-6; put fixture/k2 value-2-rewritten
//! etcdctl put fixture/gone "to be deleted"; del fixture/gone
//! etcdctl lease grant 900000000            # 08511832cd0af1d2
//! etcdctl put --lease=08511832cd0af1d2 fixture/leased "with a lease"
//! etcdctl txn: value("fixture/k1") = "value-1" ? put fixture/txn "from a txn" : put … "txn failed"
//! etcdctl lock fixture-lock -- echo locked  # a lock enqueue, its own lease, a delete
//! etcdctl compaction 3
//! etcdctl put fixture/k7..k10 value-7..value-10
//! SIGTERM (a clean stop)
//! ```
//!
//! Two snapshots were taken (the newest, of index 15, is kept) and the log purged twice; the
//! WAL holds `GenerationStart`, `Entries`, `Committed` and `PurgeUpto` records. Its file
//! was preallocated to 1 MiB; it is cut at the end of its last record (offset 3803, found by
//! walking the records: cutting the trailing zeros alone would have cut the last record's
//! own zero bytes), which recovery reads as the log's end like the zeros it replaces. `LOCK`
//! was left out (it is created on open).

use crate::common::{etcdctl, Baton};

/// `(key, value)` of every key the fixture holds, in key order.
const KEYS: [(&str, &str); 12] = [
    ("fixture/k1", "value-1"),
    ("fixture/k10", "value-10"),
    ("fixture/k2", "value-2-rewritten"),
    ("fixture/k3", "value-3"),
    ("fixture/k4", "value-4"),
    ("fixture/k5", "value-5"),
    ("fixture/k6", "value-6"),
    ("fixture/k7", "value-7"),
    ("fixture/k8", "value-8"),
    ("fixture/k9", "value-9"),
    ("fixture/leased", "with a lease"),
    ("fixture/txn", "from a txn"),
];
/// The store revision when the fixture was stopped.
const REVISION: &str = "\"revision\":18";
const MEMBER_ID: &str = "2545c0340da4e4bd";
const LEASE: &str = "08511832cd0af1d2";

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl(endpoint, args, None);
    assert_eq!(out.code, 0, "etcdctl {args:?}: {}", out.stderr);
    out.stdout
}

/// What the fixture holds, read through etcd's own client.
fn assert_fixture_contents(endpoint: &str) {
    let expected: String = KEYS.iter().map(|(k, v)| format!("{k}\n{v}\n")).collect();
    assert_eq!(ok(endpoint, &["get", "--prefix", "fixture/"]), expected);
    let k2 = ok(endpoint, &["get", "fixture/k2", "-w", "json"]);
    assert!(
        k2.contains("\"create_revision\":3,\"mod_revision\":8,\"version\":2"),
        "{k2}"
    );
    // History above the compaction survives, below it is gone.
    assert_eq!(
        ok(endpoint, &["get", "fixture/k2", "--rev=4"]),
        "fixture/k2\nvalue-2\n"
    );
    let compacted = etcdctl(endpoint, &["get", "fixture/k1", "--rev=2"], None);
    assert!(
        compacted
            .stderr
            .contains("etcdserver: mvcc: required revision has been compacted"),
        "{compacted:?}"
    );
    let ttl = ok(endpoint, &["lease", "timetolive", LEASE]);
    assert!(ttl.contains("granted with TTL(900000000s)"), "{ttl}");
    assert!(ok(endpoint, &["member", "list"]).contains(&format!("{MEMBER_ID}, started, fixture")));
}

#[test]
fn a_version_1_data_directory_opens_with_everything_in_it() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datadir-v1");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("b");
    copy_dir(&fixture, &data);

    let mut baton = Baton::start_with(&data, &["--name", "fixture"]);
    let endpoint = baton.endpoint();
    let k1 = ok(&endpoint, &["get", "fixture/k1", "-w", "json"]);
    assert!(k1.contains(REVISION), "{k1}");
    assert!(k1.contains("\"member_id\":2685764082596111549"), "{k1}");
    assert_fixture_contents(&endpoint);

    // The new binary appends to the old generation and reads it back after a restart.
    ok(&endpoint, &["put", "upgraded/after", "yes"]);
    assert!(baton.terminate().success(), "{}", baton.log());
    baton.spawn();
    assert_fixture_contents(&endpoint);
    assert_eq!(
        ok(&endpoint, &["get", "upgraded/after"]),
        "upgraded/after\nyes\n"
    );
    assert!(baton.terminate().success(), "{}", baton.log());
}
