//! etcd's layout both ways: a snapshot etcd 3.4.23 wrote read into a state, that state
//! written back and read by etcd's own tool with the same numbers, and etcdctl's status
//! computed for the same file.

use std::io::Write;

use baton_bbolt::Db;
use baton_core::{CommandIndex, KeyRange, LeaseId, RangeRequest, StateMachine, Term};
use baton_snapshot::{read_state, status, verify_trailer, HashingWriter, SnapshotSource, Status};

/// The fixture of baton-bbolt: `etcdctl snapshot save` from etcd 3.4.23 after puts (`a`
/// twice, a 9000-byte `c`), a delete, a lease with key `leased`, users root and u1 (role r1
/// over [a, z)), 100 puts to 20 `hist*` keys, `compact 5`, auth enabled, a txn of 30 puts
/// `k1..k30` and `del k3`.
const FIXTURE: &str = "../baton-bbolt/tests/fixtures/etcd-3.4.23-snapshot.db";

fn fixture_state() -> (StateMachine, baton_snapshot::ImportInfo) {
    let mut f = std::fs::File::open(FIXTURE).unwrap();
    verify_trailer(&mut f, false).unwrap();
    let db = Db::open(f).unwrap();
    read_state(&db, (CommandIndex(0), Term(1)), &mut |_| {}).unwrap()
}

fn get(sm: &StateMachine, key: &str) -> Option<baton_core::KeyValue> {
    let r = sm
        .range(&RangeRequest {
            range: KeyRange {
                key: key.into(),
                range_end: Vec::new(),
            },
            ..RangeRequest::default()
        })
        .unwrap();
    r.kvs.into_iter().next()
}

#[test]
fn status_is_etcdctls() {
    // What `etcdctl snapshot status -w json` printed for the fixture.
    assert_eq!(
        status(std::path::Path::new(FIXTURE)).unwrap(),
        Status {
            hash: 121796997,
            revision: 110,
            total_key: 146,
            total_size: 69632
        }
    );
}

#[test]
fn a_snapshot_etcd_wrote_reads_into_the_same_store() {
    let (sm, info) = fixture_state();
    assert_eq!(sm.revision().0, 110);
    assert_eq!(sm.compact_revision().0, 5);
    assert_eq!(info.cluster_version.as_deref(), Some("3.4.0"));
    assert_eq!(info.consistent_index, 128);
    assert_eq!(info.members.len(), 1);
    let a = get(&sm, "a").unwrap();
    assert_eq!(
        (a.create_revision.0, a.mod_revision.0, a.version),
        (2, 3, 2)
    );
    assert_eq!(a.value, b"2");
    assert_eq!(get(&sm, "c").unwrap().value.len(), 9000);
    assert!(get(&sm, "b").is_none());
    assert!(get(&sm, "k3").is_none());
    let k1 = get(&sm, "k1").unwrap();
    let k30 = get(&sm, "k30").unwrap();
    assert_eq!(k1.mod_revision, k30.mod_revision, "one txn, one revision");
    let leased = get(&sm, "leased").unwrap();
    let lease = sm.lease(leased.lease).unwrap();
    assert_eq!(lease.granted_ttl_s, 600);
    assert_eq!(lease.keys, vec![b"leased".to_vec()]);
    let auth = sm.auth_state();
    assert!(auth.enabled);
    assert_eq!(auth.revision, 7);
    assert!(auth.users["root"].roles.contains("root"));
    assert!(auth.users["u1"]
        .password_hash
        .as_deref()
        .unwrap()
        .starts_with("$2a$10$"));
    assert_eq!(auth.roles["r1"].perms[0].key, b"a");
    assert_eq!(info.summary.keys_without_their_lease, 0);
    assert_eq!(sm.lease_ids(), vec![LeaseId(leased.lease.0)]);
}

/// Baton's writer, from the state read out of etcd's file: etcd's own tool reads it
/// (integrity, hash, revision, keys, size), and it reads back into the same key space.
#[test]
fn the_state_written_back_is_read_by_etcdctl_and_by_baton_alike() {
    let (sm, _) = fixture_state();
    let source = SnapshotSource {
        state: sm.clone(),
        consistent_index: 42,
        members: vec![baton_snapshot::Member {
            id: 0xabc,
            name: "m".into(),
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            client_urls: vec!["http://127.0.0.1:2379".into()],
            is_learner: false,
        }],
    };
    let layout = source.plan().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.db");
    let file = std::fs::File::create(&path).unwrap();
    let hashing = source.write(HashingWriter::new(file), layout).unwrap();
    let (sha, mut file) = hashing.finish();
    file.write_all(&sha).unwrap();
    drop(file);

    let ours = status(&path).unwrap();
    let out = std::process::Command::new("etcdctl")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&path)
        .output()
        .expect("etcdctl (etcd 3.4's client) must be installed: scripts/install-deps");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(theirs["hash"], ours.hash);
    assert_eq!(theirs["revision"], 110);
    assert_eq!(theirs["totalKey"], ours.total_key);
    assert_eq!(theirs["totalSize"], layout.file_bytes());

    let mut f = std::fs::File::open(&path).unwrap();
    verify_trailer(&mut f, false).unwrap();
    let (back, info) = read_state(
        &Db::open(f).unwrap(),
        (CommandIndex(0), Term(1)),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(info.consistent_index, 42);
    assert_eq!(info.members, vec![(0xabc, "m".to_string())]);
    assert_eq!(back.hash_kv(0), sm.hash_kv(0));
    assert_eq!(back.revision(), sm.revision());
    assert_eq!(back.compact_revision(), sm.compact_revision());
    assert_eq!(back.auth_state(), sm.auth_state());
    assert_eq!(back.lease_ids(), sm.lease_ids());
}

#[test]
fn a_flipped_byte_fails_the_trailer_check() {
    let raw = std::fs::read(FIXTURE).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.db");
    let mut bad = raw.clone();
    bad[5000] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let err = verify_trailer(&mut std::fs::File::open(&path).unwrap(), false)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("expected sha256 "), "{err}");
    // without its trailer: refused unless told to skip the check
    std::fs::write(&path, &raw[..raw.len() - 32]).unwrap();
    let mut f = std::fs::File::open(&path).unwrap();
    assert_eq!(
        verify_trailer(&mut f, false).unwrap_err().to_string(),
        "snapshot missing hash but --skip-hash-check=false"
    );
    assert_eq!(verify_trailer(&mut f, true).unwrap(), raw.len() as u64 - 32);
}
