//! Integration tests of one replica on a real disk (tempdirs): durability across restarts,
//! group commit, torn-tail recovery, corruption detection, snapshots and lease expiry.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use baton_core::{Command, KeyRange, LeaseId, PutRequest, RangeRequest, Response, Revision};
use baton_raft::{KeepAlive, Node, NodeConfig, StartError};

fn config(dir: &Path) -> NodeConfig {
    let mut c = NodeConfig::new("n1", dir);
    c.heartbeat_interval = Duration::from_millis(50);
    c.election_timeout = Duration::from_millis(300);
    c
}

fn put(key: &str, value: &[u8]) -> Command {
    Command::Put(PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.to_vec(),
        ..Default::default()
    })
}

fn put_with_lease(key: &str, lease: LeaseId) -> Command {
    Command::Put(PutRequest {
        key: key.as_bytes().to_vec(),
        value: b"v".to_vec(),
        lease,
        ..Default::default()
    })
}

fn get(node: &Node, key: &str) -> Option<Vec<u8>> {
    let req = RangeRequest {
        range: KeyRange {
            key: key.as_bytes().to_vec(),
            range_end: vec![],
        },
        ..Default::default()
    };
    let resp = node.read(|sm| sm.range(&req)).expect("range");
    resp.kvs.into_iter().next().map(|kv| kv.value)
}

fn wal_files(data_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(data_dir.join("raft/wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    v.sort();
    v
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

async fn start(dir: &Path) -> Node {
    Node::start(config(dir)).await.expect("start")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_keeps_state_and_identity() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    let status = node.status();
    assert_eq!(
        status.leader_id,
        Some(status.member_id),
        "a single member leads itself after start"
    );
    for i in 0..20 {
        let p = node
            .propose(put(&format!("k{i}"), format!("v{i}").as_bytes()))
            .await
            .unwrap();
        assert!(p.raft_term >= 1);
    }
    let revision = node.read(|sm| sm.revision());
    assert_eq!(
        revision,
        Revision(21),
        "20 puts on the empty store (revision 1)"
    );
    let time_before = node.read(|sm| sm.last_time_ms());
    let members = node.members();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].id, status.member_id);
    assert_eq!(members[0].name, "n1");
    node.shutdown().await;
    assert!(matches!(
        node.propose(put("x", b"y")).await,
        Err(baton_raft::ProposeError::ShuttingDown)
    ));

    let term_before = node.status().term;
    let node = start(tmp.path()).await;
    // A restarted leader leads again only after an election in the next term, as etcd's
    // does (`wal::recovery::as_restarted`); the sole member wins it at once.
    assert_eq!(node.status().term, term_before + 1);
    assert_eq!(node.status().member_id, status.member_id);
    assert_eq!(node.status().cluster_id, status.cluster_id);
    assert_eq!(node.read(|sm| sm.revision()), revision);
    for i in 0..20 {
        assert_eq!(
            get(&node, &format!("k{i}")),
            Some(format!("v{i}").into_bytes())
        );
    }
    assert!(node.read(|sm| sm.last_time_ms()) >= time_before);
    node.read(|sm| sm.check_invariants())
        .expect("restored state is consistent");
    let p = node.propose(put("after", b"restart")).await.unwrap();
    assert_eq!(p.applied.revision, Revision(22));
    node.read_barrier().await.unwrap();
    let st = node.status();
    assert!(st.applied_index >= 21 && st.last_log_index >= st.applied_index);
    assert!(st.disk_bytes > 0);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_proposals_share_fsyncs() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    let before = node.wal_fsync_count();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let node = node.clone();
            tokio::spawn(async move { node.propose(put(&format!("k{i}"), b"v")).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("proposal");
    }
    let fsyncs = node.wal_fsync_count() - before;
    assert!(fsyncs > 0);
    assert!(
        fsyncs < 200,
        "200 concurrent proposals took {fsyncs} fsyncs: no group commit"
    );
    assert_eq!(node.read(|sm| sm.revision()), Revision(201));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn torn_tail_is_truncated() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    for i in 0..10 {
        node.propose(put(&format!("k{i}"), b"v")).await.unwrap();
    }
    node.shutdown().await;
    // The log file is allocated ahead (zero-filled); what follows lands after that space, and
    // recovery must still find the log's true end and cut the tail.
    let wal = wal_files(tmp.path()).pop().unwrap();

    // A record header announcing 100 bytes of which only a few made it to disk.
    let mut f = OpenOptions::new().append(true).open(&wal).unwrap();
    f.write_all(&100u32.to_le_bytes()).unwrap();
    f.write_all(&[0xAB; 4]).unwrap();
    f.write_all(b"partial").unwrap();
    drop(f);
    let node = start(tmp.path()).await;
    for i in 0..10 {
        assert_eq!(
            get(&node, &format!("k{i}")),
            Some(b"v".to_vec()),
            "acknowledged write k{i} lost"
        );
    }
    node.propose(put("k10", b"v")).await.unwrap();
    node.shutdown().await;

    // Plain garbage (and a zero-filled tail) after valid records.
    let wal = wal_files(tmp.path()).pop().unwrap();
    let mut f = OpenOptions::new().append(true).open(&wal).unwrap();
    f.write_all(&[0u8; 512]).unwrap();
    f.write_all(b"\xff\xfe garbage").unwrap();
    drop(f);
    let node = start(tmp.path()).await;
    for i in 0..=10 {
        assert_eq!(get(&node, &format!("k{i}")), Some(b"v".to_vec()));
    }
    assert_eq!(node.read(|sm| sm.revision()), Revision(12));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corruption_in_the_middle_refuses_start() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    for i in 0..10 {
        node.propose(put(&format!("k{i}"), b"some value"))
            .await
            .unwrap();
    }
    node.shutdown().await;
    let wal = wal_files(tmp.path()).pop().unwrap();
    let mut bytes = fs::read(&wal).unwrap();
    // Skip the generation header record, then flip a byte inside the next record's payload.
    let first_len = u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
    let second = 8 + first_len;
    bytes[second + 8 + 3] ^= 0x01;
    fs::write(&wal, &bytes).unwrap();

    match Node::start(config(tmp.path())).await {
        Err(StartError::CorruptLog { path, offset, .. }) => {
            assert_eq!(path, wal);
            assert_eq!(offset, second as u64);
        }
        Err(e) => panic!("expected CorruptLog, got {e}"),
        Ok(_) => panic!("started on a corrupt log"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_bound_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.snapshot_every_entries = 50;
    let node = Node::start(cfg.clone()).await.unwrap();
    let value = vec![7u8; 16 * 1024];
    let mut written = 0u64;
    // Sequential proposals, so each is its own Raft entry (concurrent ones share entries).
    for round in 0..40 {
        for i in 0..25 {
            node.propose(put(&format!("k{}", i % 10), &value))
                .await
                .unwrap();
            written += value.len() as u64;
        }
        // Compaction keeps the snapshots small; the log is what this test is about.
        let rev = node.read(|sm| sm.revision());
        node.propose(Command::Compact { revision: rev })
            .await
            .unwrap();
        if round == 39 {
            node.propose(put("last", b"x")).await.unwrap();
        }
    }
    assert!(written >= 15 << 20);
    let revision = node.read(|sm| sm.revision());
    let status = node.status();
    assert!(
        status.disk_bytes < written / 2,
        "disk use {} not bounded after writing {written} bytes",
        status.disk_bytes
    );
    node.shutdown().await;

    let wal_dir = tmp.path().join("raft/wal");
    let wals = wal_files(tmp.path());
    assert_eq!(wals.len(), 1, "old log generations were not deleted");
    assert!(
        !wals[0].ends_with("0000000000000001.wal"),
        "the log was never rewritten"
    );
    assert!(
        dir_bytes(&wal_dir) < 6 << 20,
        "log holds {} bytes",
        dir_bytes(&wal_dir)
    );
    // Snapshots are `member/snap/db`, one file replaced in place; `snap/` holds only what
    // older Batons wrote.
    let snaps: Vec<_> = fs::read_dir(tmp.path().join("snap")).unwrap().collect();
    assert_eq!(snaps.len(), 0, "no .snap is written any more");
    let snap_dir: Vec<_> = fs::read_dir(tmp.path().join("member/snap"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(snap_dir, ["db"], "exactly one snapshot is kept");

    let node = Node::start(cfg).await.unwrap();
    assert_eq!(node.read(|sm| sm.revision()), revision);
    for i in 0..10 {
        assert_eq!(get(&node, &format!("k{i}")), Some(value.clone()));
    }
    assert_eq!(get(&node, "last"), Some(b"x".to_vec()));
    node.read(|sm| sm.check_invariants())
        .expect("snapshot + tail state is consistent");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn corrupt_snapshot_refuses_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.snapshot_every_entries = 10;
    let node = Node::start(cfg.clone()).await.unwrap();
    for i in 0..30 {
        node.propose(put(&format!("k{i}"), b"v")).await.unwrap();
    }
    // Snapshots are built in the background; wait for one to exist.
    let deadline = Instant::now() + Duration::from_secs(5);
    let db = tmp.path().join("member/snap/db");
    while !db.exists() {
        assert!(Instant::now() < deadline, "no snapshot written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    node.shutdown().await;
    // Damage Baton's own bucket: the name of the key bucket's checksum record.
    let mut bytes = fs::read(&db).unwrap();
    let at = bytes
        .windows(9)
        .position(|w| w == b"kv_sha256")
        .expect("the record is in the file");
    bytes[at + 8] = b'7';
    fs::write(&db, &bytes).unwrap();
    match Node::start(cfg).await {
        Err(StartError::CorruptSnapshot { .. }) => {}
        Err(e) => panic!("expected CorruptSnapshot, got {e}"),
        Ok(_) => panic!("started on a corrupt snapshot"),
    }
}

async fn grant(node: &Node, ttl_s: i64) -> LeaseId {
    let id = node.new_lease_id();
    let p = node
        .propose(Command::LeaseGrant { id, ttl_s })
        .await
        .unwrap();
    assert_eq!(p.applied.response, Response::LeaseGrant { id, ttl_s });
    id
}

fn lease_exists(node: &Node, id: LeaseId) -> bool {
    node.read(|sm| sm.lease(id).is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_expire_without_keep_alive() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    let id = grant(&node, 1).await;
    node.propose(put_with_lease("owned", id)).await.unwrap();
    assert_eq!(
        node.lease_remaining_s(id),
        Some(0),
        "a fresh 1 s lease shows 0 whole seconds left, as etcd"
    );
    let t0 = Instant::now();
    while lease_exists(&node, id) {
        assert!(
            t0.elapsed() < Duration::from_millis(2500),
            "lease not expired after {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "lease expired early: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        get(&node, "owned"),
        None,
        "the expired lease's key must be deleted"
    );
    assert_eq!(node.lease_keep_alive(id), Ok(KeepAlive::NotFound));
    assert_eq!(node.lease_remaining_s(id), None);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keep_alives_hold_a_lease() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    let id = grant(&node, 1).await;
    node.propose(put_with_lease("owned", id)).await.unwrap();
    let long = grant(&node, 10).await;
    assert!(matches!(node.lease_remaining_s(long), Some(9 | 10)));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            node.lease_keep_alive(id),
            Ok(KeepAlive::Renewed { ttl_s: 1 })
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(lease_exists(&node, id));
    assert_eq!(get(&node, "owned"), Some(b"v".to_vec()));
    assert_eq!(
        node.lease_keep_alive(LeaseId(12345)),
        Ok(KeepAlive::NotFound)
    );
    // Revoking removes it from the clock at once.
    node.propose(Command::LeaseRevoke { id: long })
        .await
        .unwrap();
    assert_eq!(node.lease_keep_alive(long), Ok(KeepAlive::NotFound));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_survive_restart_with_extension() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    let id = grant(&node, 5).await;
    node.shutdown().await;
    let node = start(tmp.path()).await;
    assert!(lease_exists(&node, id));
    // Rebuilt from the replicated TTL plus the election timeout, shown capped at the grant.
    assert_eq!(node.lease_remaining_s(id), Some(5));
    assert_eq!(
        node.lease_keep_alive(id),
        Ok(KeepAlive::Renewed { ttl_s: 5 })
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watchers_are_notified_of_new_revisions() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    let mut rx = node.subscribe_revision();
    let before = *rx.borrow_and_update();
    node.propose(put("a", b"1")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*rx.borrow(), Revision(before.0 + 1));
    let watchers = node.with_watch_hub(|hub, _sm| hub.len());
    assert_eq!(watchers, 0);
    node.shutdown().await;
}

/// A lease past its deadline is not alive even while it still exists (the expiry entry is
/// not applied yet): a lock must never be granted to it. A live, renewed lease is alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_alive_follows_the_clock_not_just_existence() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    let id = grant(&node, 1).await;
    assert!(node.lease_alive(id));
    assert!(!node.lease_alive(LeaseId(424242)));
    tokio::time::sleep(Duration::from_millis(1050)).await;
    // Deadline passed: whether or not the expiry has been applied yet, it is not alive.
    assert!(!node.lease_alive(id));
    let kept = grant(&node, 1).await;
    for _ in 0..6 {
        node.lease_keep_alive(kept).unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(node.lease_alive(kept));
    }
    assert!(node.time_ms() >= node.read(|sm| sm.last_time_ms()));
    node.shutdown().await;
}

/// Deletion watches fire on the delete of their key only (not on puts, not on other keys),
/// once, and unregister when dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deletion_watches_fire_once_on_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let node = start(tmp.path()).await;
    node.propose(put("a", b"1")).await.unwrap();
    node.propose(put("b", b"1")).await.unwrap();
    let (live, watches) = node.read_and_watch_deletions(|sm| {
        let live = sm.range(&RangeRequest {
            range: KeyRange {
                key: b"a".to_vec(),
                range_end: vec![],
            },
            ..Default::default()
        });
        (live.unwrap().count, vec![b"a".to_vec(), b"b".to_vec()])
    });
    assert_eq!(live, 1);
    assert_eq!(node.deletion_watch_count(), 2);
    let (wa, wb) = (&watches[0], &watches[1]);
    assert_eq!(wa.key(), b"a");
    node.propose(put("a", b"2")).await.unwrap();
    let quick = Duration::from_millis(100);
    assert!(
        tokio::time::timeout(quick, wa.deleted()).await.is_err(),
        "a put is not a delete"
    );
    let del = Command::DeleteRange(baton_core::DeleteRangeRequest {
        range: KeyRange {
            key: b"a".to_vec(),
            range_end: vec![],
        },
        prev_kv: false,
    });
    node.propose(del).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), wa.deleted())
        .await
        .expect("the delete wakes the watch");
    assert!(
        tokio::time::timeout(quick, wb.deleted()).await.is_err(),
        "other keys do not"
    );
    assert_eq!(node.deletion_watch_count(), 1, "a fired watch is forgotten");
    drop(watches);
    assert_eq!(
        node.deletion_watch_count(),
        0,
        "a dropped watch unregisters"
    );
    node.shutdown().await;
}

/// Two replicas on one data directory would interleave their logs; the second is refused.
#[tokio::test]
async fn a_data_directory_is_used_by_one_replica_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = Node::start(NodeConfig::new("a", dir.path())).await.unwrap();
    match Node::start(NodeConfig::new("b", dir.path())).await {
        Err(StartError::Locked { .. }) => {}
        Err(other) => panic!("expected Locked, got {other}"),
        Ok(_) => panic!("a second replica started on a locked data directory"),
    }
    first.shutdown().await;
    drop(first);
}

/// A data directory from before clusters (member identity format 1, magic `BTNMEMB1`) is
/// refused with a message that says so, not misread: its log format cannot be read either.
#[tokio::test]
async fn a_data_directory_from_before_clusters_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = b"BTNMEMB1".to_vec();
    old.extend_from_slice(&[0u8; 24]);
    fs::write(dir.path().join("member.meta"), &old).unwrap();
    match Node::start(config(dir.path())).await {
        Err(e @ StartError::Io { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("member.meta") && text.contains("written by an earlier Baton"),
                "{text}"
            );
        }
        Err(other) => panic!("expected the old-format refusal, got {other}"),
        Ok(_) => panic!("a data directory from before clusters was opened"),
    }
}

/// Waits until the leader's bootstrap duty has installed a fencing key.
async fn fencing_keys(node: &Node) -> baton_core::FencingKeys {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let keys = node.read(|sm| sm.fencing_keys().clone());
        if keys.current().is_some() {
            return keys;
        }
        assert!(Instant::now() < deadline, "no bootstrap fencing key");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader makes the cluster's fencing key at bootstrap; a rotation makes a new current
/// one and keeps the old public key; nobody can propose a key of their choice; the keys
/// survive a restart from the log and one from a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_keys_bootstrap_rotate_and_survive_restarts() {
    use baton_core::{FencingKeyId, FencingKeyMode, FencingPublicKey, FencingSecret};
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.snapshot_every_entries = 50;
    let node = Node::start(cfg.clone()).await.unwrap();
    let first = fencing_keys(&node).await;
    assert_eq!(first.current().unwrap().id, FencingKeyId(1));
    // The public key is the seed's: what baton-fencing derives from the replicated secret.
    let c = first.current().unwrap();
    let derived = baton_fencing::SigningKey::from_seed(baton_fencing::KeyId::new(1), &c.secret.0)
        .public_key();
    assert_eq!(derived.as_bytes(), &c.public.0);

    let forged = Command::FencingKey {
        mode: FencingKeyMode::Rotate,
        public: FencingPublicKey([1; 32]),
        secret: FencingSecret([2; 32]),
    };
    assert!(matches!(
        node.propose(forged).await,
        Err(baton_raft::ProposeError::LeaderOnly(
            baton_raft::LeaderDuty::FencingKey
        ))
    ));
    assert_eq!(node.read(|sm| sm.fencing_keys().clone()), first);

    assert_eq!(node.rotate_fencing_key().await.unwrap(), FencingKeyId(2));
    let rotated = node.read(|sm| sm.fencing_keys().clone());
    assert_eq!(rotated.public_keys().len(), 2);
    assert_eq!(rotated.public_keys()[&FencingKeyId(1)], c.public);
    assert_ne!(rotated.current().unwrap().secret, c.secret);
    node.shutdown().await;

    // Log replay.
    let node = Node::start(cfg.clone()).await.unwrap();
    assert_eq!(node.read(|sm| sm.fencing_keys().clone()), rotated);
    // Past a snapshot: enough entries that the log before them is gone.
    for i in 0..120 {
        node.propose(put(&format!("k{}", i % 5), b"v"))
            .await
            .unwrap();
    }
    node.shutdown().await;
    let node = Node::start(cfg).await.unwrap();
    assert_eq!(node.read(|sm| sm.fencing_keys().clone()), rotated);
    assert!(
        tmp.path().join("member/snap/db").exists(),
        "restarted from a snapshot"
    );
    node.shutdown().await;
}

/// Unnamed files this process holds open in `dir` (the value file's segments: `O_TMPFILE`,
/// shown by `/proc` as `dir/#inode (deleted)`).
fn unnamed_files_in(dir: &Path) -> usize {
    let prefix = format!("{}/#", dir.display());
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.to_string_lossy().starts_with(&prefix))
        .count()
}

/// Values of 64 bytes and more live in the member's value file (an unnamed file in the data
/// directory) and read back exactly, across overwrites, compaction, snapshots and a
/// restart; short ones stay in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_values_live_in_the_value_file_and_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg = config(tmp.path());
    cfg.snapshot_every_entries = 50;
    let value = |i: usize, round: usize| -> Vec<u8> {
        (0..100 + i % 900)
            .map(|j| (i * 7 + j * 13 + round) as u8)
            .collect()
    };
    let node = Node::start(cfg.clone()).await.unwrap();
    assert_eq!(unnamed_files_in(tmp.path()), 0, "nothing spilled yet");
    for round in 0..3 {
        for i in 0..200 {
            node.propose(put(&format!("k{i:03}"), &value(i, round)))
                .await
                .unwrap();
        }
    }
    node.propose(put("short", b"s")).await.unwrap();
    assert!(unnamed_files_in(tmp.path()) >= 1, "a value file is open");
    let rev = node.read(|sm| sm.revision());
    node.propose(Command::Compact { revision: rev })
        .await
        .unwrap();
    for i in 0..200 {
        assert_eq!(
            get(&node, &format!("k{i:03}")),
            Some(value(i, 2)),
            "k{i:03}"
        );
    }
    assert_eq!(get(&node, "short"), Some(b"s".to_vec()));
    node.read(|sm| sm.check_invariants()).expect("consistent");
    let hash = node.read(|sm| sm.hash_kv(0).map(|h| (h, sm.revision())));
    node.shutdown().await;
    drop(node);

    let node = Node::start(cfg).await.unwrap();
    for i in 0..200 {
        assert_eq!(
            get(&node, &format!("k{i:03}")),
            Some(value(i, 2)),
            "k{i:03}"
        );
    }
    assert_eq!(
        node.read(|sm| sm.hash_kv(0).map(|h| (h, sm.revision()))),
        hash,
        "the same store after a restart"
    );
    assert!(unnamed_files_in(tmp.path()) >= 1, "values spilled again");
    node.shutdown().await;
}
