//! Disaster recovery on real `baton serve` processes (issue 18 item 4): a cluster that lost
//! its quorum for good restarted from one member with `--force-new-cluster`, then grown
//! again with `member add`; `--force-new-cluster` on a member without data refused; a
//! member whose data was changed offline found by the initial corruption check (it refuses
//! to start) and by the leader's periodic one (the CORRUPT alarm); a member whose snapshot
//! (`member/snap/db`) was changed offline refused with its checksum, or found by the initial
//! check when that is on (etcd's `TestEtcdCorruptHash`).

use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::GetOptions;

use crate::cluster::client;
use crate::common::{free_port_below_ephemeral, Baton, Cluster};
use crate::membership::{
    agreed_leader, all_started, ctl_ok, member_add, member_list, start_joiner, status,
};

/// Every `k/NNNN` key with its value, by a serializable read of `endpoint` alone.
async fn keys_on(endpoint: &str) -> Vec<(String, String)> {
    let mut c = client(endpoint).await;
    let got = c
        .get(
            "k/",
            Some(GetOptions::new().with_prefix().with_serializable()),
        )
        .await
        .unwrap_or_else(|e| panic!("get from {endpoint}: {e}"));
    got.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn expected(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("k/{i:04}"), format!("v{i}")))
        .collect()
}

/// Three members; every write is acknowledged by the leader; then both followers are
/// killed for good and the leader too (kill -9: whatever it had not made durable is lost,
/// and Baton writes its commit index lazily, so its last acknowledged entries lie after the
/// persisted one). Restarted alone with `--force-new-cluster` it serves every acknowledged
/// key, reads and writes, as a one-member cluster; it stays one after a restart without the
/// flag; a member added with `member add` and started with `--initial-cluster-state
/// existing` on an empty directory catches up; a member of the old cluster that comes back
/// with its old data is told it was removed and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_restarts_a_survivor_alone_then_grows_again() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshots every 100 entries: the survivor starts from a snapshot plus a log tail.
    let mut cluster = Cluster::start(dir.path(), 3, &["--snapshot-count", "100"]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let (leader, leader_id) = agreed_leader(&eps, Duration::from_secs(10)).await;
    all_started(&cluster.endpoints(), 3).await;

    const N: usize = 250;
    let mut c = client(&eps[leader]).await;
    for (k, v) in expected(N) {
        c.put(k, v, None).await.expect("an acknowledged write");
    }
    drop(c);
    for i in (0..3).filter(|i| *i != leader) {
        cluster.members[i].kill9();
    }
    cluster.members[leader].kill9();

    // Restarted with its data as a one-member cluster.
    let survivor = &mut cluster.members[leader];
    survivor.extra_args.push("--force-new-cluster".into());
    survivor.spawn();
    let ep = survivor.endpoint();
    assert!(
        survivor
            .log()
            .contains("--force-new-cluster: this member is now the only voter"),
        "{}",
        survivor.log()
    );
    let listed = member_list(&ep).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, leader_id, "{listed:?}");
    assert!(listed[0].started && !listed[0].learner, "{listed:?}");
    let (me, leads, _) = status(&ep).await.unwrap();
    assert_eq!((me, leads), (leader_id, leader_id));
    assert_eq!(keys_on(&ep).await, expected(N), "acknowledged keys lost");
    // Linearizable reads and writes: it commits on its own.
    ctl_ok(&ep, &["put", "k/after-force", "1"]).await;
    let got = ctl_ok(&ep, &["get", "k/after-force", "--print-value-only"]).await;
    assert_eq!(got.trim(), "1");

    // The forced configuration is in its log: a restart without the flag stays alone.
    survivor.terminate();
    survivor.extra_args.retain(|a| a != "--force-new-cluster");
    survivor.spawn();
    assert_eq!(member_list(&ep).await.len(), 1);
    ctl_ok(&ep, &["put", "k/after-restart", "2"]).await;

    // Grown again: `member add`, then the new member joins with an empty directory.
    let peer_port = free_port_below_ephemeral();
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let (new_id, initial) = member_add(&ep, "m4", &peer_url, false).await;
    let joiner = start_joiner(dir.path(), "m4", peer_port, &initial, &cluster.token);
    let both = format!("{ep},{}", joiner.endpoint());
    let members = all_started(&both, 2).await;
    assert!(members.iter().any(|m| m.id == new_id), "{members:?}");
    ctl_ok(&both, &["put", "k/after-grow", "3"]).await;
    let mut want = expected(N);
    want.extend([
        ("k/after-force".to_string(), "1".to_string()),
        ("k/after-grow".to_string(), "3".to_string()),
        ("k/after-restart".to_string(), "2".to_string()),
    ]);
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = keys_on(&joiner.endpoint()).await;
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new member did not catch up: {} of {} keys",
            got.len(),
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A member of the old cluster back with its old data: the leader refuses it as removed
    // and it stops; the new cluster goes on.
    let old = &mut cluster.members[(leader + 1) % 3];
    old.spawn();
    let deadline = Instant::now() + Duration::from_secs(15);
    while old.child.as_mut().unwrap().try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the old member still runs: {}",
            old.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    old.child = None;
    assert!(
        old.log()
            .contains("the member has been permanently removed from the cluster"),
        "{}",
        old.log()
    );
    ctl_ok(&both, &["put", "k/end", "4"]).await;
    assert_eq!(member_list(&both).await.len(), 2);
}

/// A backup restored (`baton snapshot restore`) as one member of a three-member cluster
/// whose other members will never run: its data is a snapshot and no log at all, and
/// `--force-new-cluster` starts it alone (the forced entry follows the snapshot) with every
/// key of the backup, writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_on_a_restored_backup_alone() {
    let dir = tempfile::tempdir().unwrap();
    let source = Baton::start(&dir.path().join("source"));
    let mut c = client(&source.endpoint()).await;
    for (k, v) in expected(30) {
        c.put(k, v, None).await.unwrap();
    }
    drop(c);
    let file = dir.path().join("backup.db");
    let saved = crate::common::etcdctl(
        &source.endpoint(),
        &["snapshot", "save", file.to_str().unwrap()],
        None,
    );
    assert_eq!(saved.code, 0, "{saved:?}");
    drop(source);

    let ports: Vec<u16> = (0..3).map(|_| free_port_below_ephemeral()).collect();
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("m{}=http://127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let data_dir = dir.path().join("m1");
    let out = crate::common::baton_cmd()
        .args(["snapshot", "restore"])
        .arg(&file)
        .args(["--name", "m1", "--initial-cluster", &initial])
        .args(["--initial-cluster-token", "restored"])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{}", ports[0]),
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut m1 = Baton {
        child: None,
        data_dir,
        client_port: free_port_below_ephemeral(),
        metrics_port: free_port_below_ephemeral(),
        peer_port: ports[0],
        extra_args: [
            "--name",
            "m1",
            "--initial-cluster",
            &initial,
            "--initial-cluster-token",
            "restored",
            "--force-new-cluster",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        nofile_limit: None,
        client_urls: None,
        peer_scheme: "http",
    };
    m1.spawn();
    let ep = m1.endpoint();
    assert_eq!(member_list(&ep).await.len(), 1);
    assert_eq!(keys_on(&ep).await, expected(30));
    ctl_ok(&ep, &["put", "k/after", "1"]).await;
}

/// `--force-new-cluster` on a member without data is refused with one clear line, and
/// nothing is created.
#[test]
fn force_new_cluster_without_data_is_refused_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("none");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("serve")
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--listen-client-urls")
        .arg(format!("http://127.0.0.1:{}", free_port_below_ephemeral()))
        .arg("--listen-peer-urls")
        .arg(format!("http://127.0.0.1:{}", free_port_below_ephemeral()))
        .arg("--listen-metrics-urls")
        .arg(format!("http://127.0.0.1:{}", free_port_below_ephemeral()))
        .arg("--force-new-cluster")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--force-new-cluster needs this member's data, but the data directory holds none"
        ),
        "{stderr}"
    );
    assert!(!data_dir.exists(), "{stderr}");
    // An existing but empty directory stays empty.
    std::fs::create_dir(&data_dir).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["serve", "--force-new-cluster", "--data-dir"])
        .arg(&data_dir)
        .arg("--listen-client-urls")
        .arg(format!("http://127.0.0.1:{}", free_port_below_ephemeral()))
        .arg("--listen-metrics-urls")
        .arg(format!("http://127.0.0.1:{}", free_port_below_ephemeral()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(std::fs::read_dir(&data_dir).unwrap().count(), 0);
}

/// Replaces `from` by `to` (as long) in every record of a stopped member's Raft log that
/// holds it, and recomputes the record's checksum: a valid record of other data, as etcd's
/// `TestEtcdCorruptHash` writes a valid bbolt transaction into a stopped member's database.
/// Nothing in the member can tell: this is the silent corruption the checks are for (a
/// bit flip the checksum catches is refused at start instead). Returns the records changed.
fn plant_in_log(data_dir: &Path, from: &[u8], to: &[u8]) -> usize {
    assert_eq!(from.len(), to.len());
    let mut changed = 0;
    for file in std::fs::read_dir(data_dir.join("raft").join("wal")).unwrap() {
        let path = file.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        // `[len u32 LE][crc32(len ‖ payload) u32 LE][payload]`, then zeros (wal/record.rs).
        let mut at = 0;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            if len == 0 {
                break;
            }
            let payload = at + 8..at + 8 + len;
            if let Some(i) = bytes[payload.clone()]
                .windows(from.len())
                .position(|w| w == from)
            {
                let start = payload.start + i;
                bytes[start..start + to.len()].copy_from_slice(to);
                let mut crc = crc32fast::Hasher::new();
                crc.update(&(len as u32).to_le_bytes());
                crc.update(&bytes[payload.clone()]);
                bytes[at + 4..at + 8].copy_from_slice(&crc.finalize().to_le_bytes());
                changed += 1;
            }
            at = payload.end;
        }
        std::fs::write(&path, &bytes).unwrap();
    }
    changed
}

/// Runs `baton serve` for `member` with `extra` flags until it exits (it must, within
/// 30 s); returns its exit success and its output.
fn serve_until_exit(member: &Baton, extra: &[&str]) -> (bool, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("serve")
        .arg("--data-dir")
        .arg(&member.data_dir)
        .arg("--listen-client-urls")
        .arg(member.url())
        .arg("--listen-metrics-urls")
        .arg(format!("http://127.0.0.1:{}", member.metrics_port))
        .arg("--listen-peer-urls")
        .arg(format!("http://127.0.0.1:{}", member.peer_port))
        .args(&member.extra_args)
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "baton serve {extra:?} still runs after 30 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Three members with the periodic check every second raise no alarm while they agree.
/// Then one member's copy of a value is changed offline in its log (a valid record, see
/// [`plant_in_log`]): restarted with `--experimental-initial-corrupt-check` it refuses to
/// start with etcd's line; restarted without, it serves its diverged value, and the
/// leader's periodic check raises the CORRUPT alarm for exactly that member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_member_is_found_at_start_and_by_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--experimental-corrupt-check-time", "1s"]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let (leader, _) = agreed_leader(&eps, Duration::from_secs(10)).await;
    all_started(&cluster.endpoints(), 3).await;
    let mut c = client(&eps[leader]).await;
    for i in 0..20 {
        c.put(format!("k/{i:04}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    c.put("k/planted", "value-before-0001", None).await.unwrap();
    drop(c);
    for ep in &eps {
        let deadline = Instant::now() + Duration::from_secs(10);
        while keys_on(ep).await.len() < 21 {
            assert!(Instant::now() < deadline, "{ep} did not apply the writes");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Several rounds of the check while all agree: no alarm.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let alarms = ctl_ok(&eps[leader], &["alarm", "list"]).await;
    assert_eq!(alarms.trim(), "", "an alarm while the members agree");

    let victim = (leader + 1) % 3;
    let (victim_id, _, _) = status(&eps[victim]).await.unwrap();
    cluster.members[victim].terminate();
    let member = &cluster.members[victim];
    let snaps = std::fs::read_dir(member.data_dir.join("snap"))
        .unwrap()
        .count();
    assert_eq!(snaps, 0, "a snapshot holds the value too: plant it there");
    assert!(
        !member.data_dir.join("member/snap/db").exists(),
        "a snapshot holds the value too: plant it there"
    );
    let planted = plant_in_log(&member.data_dir, b"value-before-0001", b"value-AFTER!-0001");
    assert!(planted >= 1, "the value is not in the log as written");

    // The initial check: refused, with etcd's words.
    let (ok, said) = serve_until_exit(member, &["--experimental-initial-corrupt-check"]);
    assert!(!ok, "{said}");
    assert!(
        said.contains(&format!(
            "etcdmain: {victim_id:016x} found data inconsistency with peers"
        )),
        "{said}"
    );

    // Without it, it serves its diverged value, and the leader raises CORRUPT for it.
    cluster.members[victim].spawn();
    let got = ctl_ok(
        &eps[victim],
        &["get", "k/planted", "--consistency=s", "--print-value-only"],
    )
    .await;
    assert_eq!(got.trim(), "value-AFTER!-0001", "the plant took no effect");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let alarms = ctl_ok(&eps[leader], &["alarm", "list"]).await;
        if !alarms.trim().is_empty() {
            assert_eq!(
                alarms.trim(),
                format!("memberID:{victim_id} alarm:CORRUPT"),
                "{}",
                cluster.logs()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no CORRUPT alarm: {}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cluster.members[leader]
            .log()
            .contains(&format!("{victim_id:016x}'s hash")),
        "{}",
        cluster.members[leader].log()
    );
    // Later rounds find it raised and propose nothing more.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let log = cluster.members[leader].log();
    assert_eq!(
        log.matches("corruption check: raised the CORRUPT alarm")
            .count(),
        1,
        "{log}"
    );
}

/// Replaces every `from` by `to` (as long) in a stopped member's `member/snap/db`, in place:
/// a value in a leaf page of the `key` bucket, and bbolt has no page checksums, so the file
/// stays a valid database of other data (what etcd's `TestEtcdCorruptHash` does with a bbolt
/// transaction). Returns how many were replaced.
fn plant_in_db(data_dir: &Path, from: &[u8], to: &[u8]) -> usize {
    assert_eq!(from.len(), to.len());
    let path = data_dir.join("member").join("snap").join("db");
    let mut bytes = std::fs::read(&path).unwrap();
    let mut changed = 0;
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(from.len()).position(|w| w == from) {
        let start = at + i;
        bytes[start..start + to.len()].copy_from_slice(to);
        changed += 1;
        at = start + to.len();
    }
    std::fs::write(&path, &bytes).unwrap();
    changed
}

/// Three members snapshotting every 3 entries (as etcd's `TestEtcdCorruptHash`): their
/// state is in `member/snap/db`. One member's copy of a value is changed there offline.
/// Restarted without the initial corruption check it refuses to start with one line
/// naming the file, the failed checksum and the ways out; with the check it loads the
/// changed key space, finds it differs from the others' and refuses with etcd's line. The
/// file is left as it was (no new snapshot laundered the change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_changed_offline_is_refused_or_found_by_the_initial_check() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &["--snapshot-count", "3"]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let (leader, _) = agreed_leader(&eps, Duration::from_secs(10)).await;
    all_started(&cluster.endpoints(), 3).await;
    let mut c = client(&eps[leader]).await;
    c.put("k/planted", "value-before-0001", None).await.unwrap();
    for i in 0..10 {
        c.put(format!("k/{i:04}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    drop(c);
    let victim = (leader + 1) % 3;
    let (victim_id, _, _) = status(&eps[victim]).await.unwrap();
    let db = cluster.members[victim].data_dir.join("member/snap/db");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read(&db)
        .unwrap_or_default()
        .windows(17)
        .any(|w| w == b"value-before-0001")
    {
        assert!(Instant::now() < deadline, "no snapshot holds the value");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.members[victim].terminate();
    let member = &cluster.members[victim];
    assert!(
        std::fs::read_dir(member.data_dir.join("snap"))
            .unwrap()
            .next()
            .is_none(),
        "the db replaced the .snap files"
    );
    let planted = plant_in_db(&member.data_dir, b"value-before-0001", b"value-AFTER!-0001");
    assert_eq!(planted, 1, "the value is once in the key bucket");
    let edited = std::fs::read(&db).unwrap();

    let (ok, said) = serve_until_exit(member, &[]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("member/snap/db: the `key` bucket does not match the checksum Baton wrote")
            && said.contains("--experimental-initial-corrupt-check")
            && said.contains("add the member back"),
        "{said}"
    );

    let (ok, said) = serve_until_exit(member, &["--experimental-initial-corrupt-check"]);
    assert!(!ok, "{said}");
    assert!(
        said.contains(&format!(
            "etcdmain: {victim_id:016x} found data inconsistency with peers"
        )),
        "{said}"
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        edited,
        "no snapshot was written"
    );
}
