//! The backend quota and alarms (issue 18), with real `baton serve` processes:
//! `--quota-backend-bytes` of a few MiB on a 3-member cluster is filled by a writer; the
//! member that refuses the write that would reach the quota raises its `NOSPACE` through the
//! log, so `etcdctl alarm list` on each member lists it; writes that add data are refused with etcd's message while reads and
//! deletes are served; a member killed with -9 meanwhile comes back with every
//! acknowledged write; after compaction, defragment and `alarm disarm` writes succeed, and
//! HashKV agrees on every member. `CORRUPT` raised by request (on a follower, for another
//! member) refuses writes with etcd's `corrupt cluster` on every member and serves reads.
//! A watch may start exactly at the compact revision (etcd accepts it). A quota out of
//! range is refused with the flag named.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_proto::etcdserverpb::{
    alarm_request::AlarmAction, kv_client::KvClient, maintenance_client::MaintenanceClient,
    watch_client::WatchClient, watch_request::RequestUnion, AlarmRequest, AlarmType,
    CompactionRequest, HashKvRequest, LeaseGrantRequest, PutRequest, RangeRequest,
    WatchCreateRequest, WatchRequest,
};
use tonic::transport::Channel;

use crate::common::{agreed_leader, etcdctl, http_get, lazy_channel, within, Baton, Cluster};

const MIB: u64 = 1 << 20;
const QUOTA: u64 = 4 * MIB;
const VALUE_BYTES: usize = 16 << 10;
/// Keys the writer cycles through: history piles up behind them until compacted.
const KEYS: usize = 40;
const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
const CORRUPT: &str = "etcdserver: corrupt cluster";
const CALL: Duration = Duration::from_secs(5);

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn alarm_list(endpoint: &str) -> String {
    let out = etcdctl(endpoint, &["alarm", "list"], None);
    assert_eq!(out.code, 0, "alarm list on {endpoint}: {out:?}");
    out.stdout
}

async fn put(ch: &Channel, key: &str, value: Vec<u8>) -> Result<i64, tonic::Status> {
    let r = within(
        CALL,
        KvClient::new(ch.clone()).put(PutRequest {
            key: key.as_bytes().to_vec(),
            value,
            ..Default::default()
        }),
    )
    .await?;
    Ok(r.header.unwrap().revision)
}

async fn get(ch: &Channel, key: &str, revision: i64) -> Result<Option<Vec<u8>>, tonic::Status> {
    let r = within(
        CALL,
        KvClient::new(ch.clone()).range(RangeRequest {
            key: key.as_bytes().to_vec(),
            revision,
            ..Default::default()
        }),
    )
    .await?;
    Ok(r.kvs.into_iter().next().map(|kv| kv.value))
}

async fn alarm(ch: &Channel, action: AlarmAction, member_id: u64, alarm: AlarmType) {
    within(
        CALL,
        MaintenanceClient::new(ch.clone()).alarm(AlarmRequest {
            action: action as i32,
            member_id,
            alarm: alarm as i32,
        }),
    )
    .await
    .unwrap_or_else(|e| panic!("alarm {action:?} {alarm:?}: {e}"));
}

/// Every acknowledged key has its last acknowledged value on the member behind `ch`.
async fn check_acked(ch: &Channel, acked: &BTreeMap<String, Vec<u8>>, who: &str) {
    for (key, value) in acked {
        let got = get(ch, key, 0)
            .await
            .unwrap_or_else(|e| panic!("get {key} on {who}: {e}"));
        assert!(
            got.as_deref() == Some(value.as_slice()),
            "{key} on {who}: an acknowledged write is lost"
        );
    }
}

async fn member_ids(ch: &Channel) -> Vec<u64> {
    use baton_proto::etcdserverpb::{cluster_client::ClusterClient, MemberListRequest};
    let r = within(
        CALL,
        ClusterClient::new(ch.clone()).member_list(MemberListRequest {
            linearizable: false,
        }),
    )
    .await
    .unwrap();
    let mut ids: Vec<u64> = r.members.iter().map(|m| m.id).collect();
    ids.sort();
    ids
}

/// HashKV of every member at `revision`: all equal.
async fn hash_kv_agrees(chans: &[Channel], revision: i64) {
    let mut hashes = Vec::new();
    for ch in chans {
        let r = within(
            CALL,
            MaintenanceClient::new(ch.clone()).hash_kv(HashKvRequest { revision }),
        )
        .await
        .unwrap();
        hashes.push((r.hash, r.compact_revision));
    }
    assert!(
        hashes.windows(2).all(|w| w[0] == w[1]),
        "HashKV at {revision} differs between members: {hashes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_quota_raises_nospace_on_every_member_and_recovers_after_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let quota = QUOTA.to_string();
    let mut c = Cluster::start(dir.path(), 3, &["--quota-backend-bytes", &quota]);
    let endpoints: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    let chans: Vec<Channel> = endpoints.iter().map(|e| lazy_channel(e)).collect();
    let leader = agreed_leader(&endpoints, Duration::from_secs(20)).await;
    let follower = (leader + 1) % 3;
    let ids = member_ids(&chans[leader]).await;

    put(
        &chans[leader],
        "scratch",
        b"deleted under the alarm".to_vec(),
    )
    .await
    .unwrap();
    let lease = within(
        CALL,
        baton_proto::etcdserverpb::lease_client::LeaseClient::new(chans[leader].clone())
            .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 }),
    )
    .await
    .unwrap()
    .id;
    // The writer, spread over the members (followers forward): until refused.
    let mut acked: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let started = Instant::now();
    let mut refused = None;
    for i in 0usize.. {
        assert!(i < 10_000, "4 MiB of quota never filled");
        let key = format!("k{:02}", i % KEYS);
        let value = vec![b'a' + (i % 26) as u8; VALUE_BYTES];
        match put(&chans[i % 3], &key, value.clone()).await {
            Ok(_) => {
                acked.insert(key, value);
            }
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
                assert_eq!(e.message(), NO_SPACE);
                refused = Some(i);
                break;
            }
        }
    }
    let written = refused.unwrap() as u64 * VALUE_BYTES as u64;
    eprintln!(
        "refused after {} puts ({} MiB of values) in {:?}",
        refused.unwrap(),
        written / MIB,
        started.elapsed()
    );
    assert!(
        (QUOTA / 2..=QUOTA + 2 * MIB).contains(&written),
        "the quota counts what is kept: {written} bytes written for a {QUOTA}-byte quota"
    );

    // The member that refused the write (it would have reached the quota: etcd's
    // `size + cost >= quota`) raised its own alarm through the log: every member lists it.
    let refuser = within(
        CALL,
        MaintenanceClient::new(chans[refused.unwrap() % 3].clone())
            .status(baton_proto::etcdserverpb::StatusRequest {}),
    )
    .await
    .unwrap()
    .header
    .unwrap()
    .member_id;
    assert!(ids.contains(&refuser));
    for e in &endpoints {
        wait_until(
            "the refusing member's NOSPACE is listed on every member",
            Duration::from_secs(10),
            || alarm_list(e).contains(&format!("memberID:{refuser} alarm:NOSPACE")),
        );
    }
    for m in &c.members {
        let (code, body) = http_get(m.client_port, "/health");
        assert_eq!(code, 503, "/health with an alarm: {body}");
    }
    // Writes that add data are refused on every member; reads and deletes are served.
    for ch in &chans {
        let e = put(ch, "more", b"x".to_vec()).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (tonic::Code::ResourceExhausted, NO_SPACE)
        );
        let e = within(
            CALL,
            baton_proto::etcdserverpb::lease_client::LeaseClient::new(ch.clone())
                .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 }),
        )
        .await
        .unwrap_err();
        assert_eq!(e.message(), NO_SPACE);
        check_acked(ch, &acked, "a member under the alarm").await;
    }
    let del = etcdctl(&endpoints[follower], &["del", "scratch"], None);
    assert_eq!((del.code, del.stdout.trim()), (0, "1"), "{del:?}");
    let revoke = etcdctl(
        &endpoints[follower],
        &["lease", "revoke", &format!("{lease:x}")],
        None,
    );
    assert_eq!(
        revoke.code, 0,
        "a revoke is served under NOSPACE: {revoke:?}"
    );

    // kill -9 a follower under the alarm: it comes back with everything acknowledged, and
    // the alarms (replicated state) with it.
    let victim = (leader + 2) % 3;
    c.members[victim].kill9();
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.members[victim].spawn();
    let restarted = lazy_channel(&endpoints[victim]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&restarted, "k00", 0).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the restarted member serves reads"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_acked(&restarted, &acked, "the member restarted after kill -9").await;
    assert!(alarm_list(&endpoints[victim]).contains("alarm:NOSPACE"));

    // etcd's runbook: compact, defragment, disarm.
    let rev = within(
        CALL,
        KvClient::new(chans[leader].clone()).range(RangeRequest {
            key: b"k00".to_vec(),
            ..Default::default()
        }),
    )
    .await
    .unwrap()
    .header
    .unwrap()
    .revision;
    let compact = etcdctl(
        &endpoints[leader],
        &["compact", &rev.to_string(), "--physical"],
        None,
    );
    assert_eq!(compact.code, 0, "{compact:?}");
    let db_size = |ch: Channel| async move {
        within(
            CALL,
            MaintenanceClient::new(ch).status(baton_proto::etcdserverpb::StatusRequest {}),
        )
        .await
        .unwrap()
        .db_size
    };
    let before = db_size(chans[follower].clone()).await;
    let defrag = etcdctl(&c.endpoints(), &["defrag"], None);
    assert_eq!(defrag.code, 0, "{defrag:?}");
    let after = db_size(chans[follower].clone()).await;
    eprintln!("db size {before} -> {after} bytes after compaction and defragment");
    // Under the quota now, but a quota alarm waits for the operator, as etcd's.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = alarm_list(&endpoints[leader]);
    assert!(
        listed.contains(&format!("memberID:{refuser} alarm:NOSPACE")),
        "a quota alarm does not clear itself: {listed}"
    );
    let disarm = etcdctl(&endpoints[follower], &["alarm", "disarm"], None);
    assert_eq!(disarm.code, 0, "{disarm:?}");
    assert_eq!(
        disarm.stdout.matches("alarm:NOSPACE").count(),
        listed.matches("alarm:NOSPACE").count(),
        "every listed alarm disarmed: {disarm:?}"
    );
    for e in &endpoints {
        assert_eq!(alarm_list(e).trim(), "", "no alarm left on {e}");
    }
    for (i, ch) in chans.iter().enumerate() {
        let key = format!("after-{i}");
        let value = format!("written after disarm via {i}").into_bytes();
        put(ch, &key, value.clone())
            .await
            .unwrap_or_else(|e| panic!("a write after disarm on member {i}: {e}"));
        acked.insert(key, value);
    }
    for (i, ch) in chans.iter().enumerate() {
        check_acked(ch, &acked, &format!("member {i} after recovery")).await;
        let e = get(ch, "k00", rev - 1).await.unwrap_err();
        assert_eq!(
            e.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
    }
    // Every member applied the same log: the same hash at the same revision.
    let now = put(&chans[leader], "last", b"1".to_vec()).await.unwrap();
    for ch in &chans {
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(ch, "last", 0).await.ok().flatten().is_none() {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    hash_kv_agrees(&chans, now).await;

    // CORRUPT by request, on a follower, for any member: listed everywhere, refuses writes
    // (and compaction) with etcd's words on every member, serves reads.
    let target = ids[0];
    alarm(
        &chans[follower],
        AlarmAction::Activate,
        target,
        AlarmType::Corrupt,
    )
    .await;
    for e in &endpoints {
        wait_until("CORRUPT is listed", Duration::from_secs(10), || {
            alarm_list(e).contains(&format!("memberID:{target} alarm:CORRUPT"))
        });
    }
    for ch in &chans {
        let e = put(ch, "k00", b"no".to_vec()).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::DataLoss, CORRUPT));
        let e = within(
            CALL,
            KvClient::new(ch.clone()).compact(CompactionRequest {
                revision: now,
                physical: false,
            }),
        )
        .await
        .unwrap_err();
        assert_eq!(e.message(), CORRUPT);
        check_acked(ch, &acked, "a member under CORRUPT").await;
    }
    let (code, _) = http_get(c.members[follower].client_port, "/health");
    assert_eq!(code, 503);
    alarm(
        &chans[leader],
        AlarmAction::Deactivate,
        target,
        AlarmType::Corrupt,
    )
    .await;
    put(&chans[follower], "k00", b"yes".to_vec())
        .await
        .expect("writes again once CORRUPT is cleared");
    drop(c);
}

/// `Defragment` has etcd's meaning on disk: after a compaction, `etcdctl defrag` makes the
/// member write a snapshot of what is left and drop the log it covers, so the data
/// directory (`Status.dbSize`) shrinks, as etcd's file does after its rewrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragment_after_compaction_shrinks_the_data_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("m"));
    let ch = lazy_channel(&b.endpoint());
    let mut rev = 0;
    for i in 0..600 {
        rev = put(&ch, "big", vec![b'a' + (i % 26) as u8; VALUE_BYTES])
            .await
            .unwrap();
    }
    let db_size = || async {
        within(
            CALL,
            MaintenanceClient::new(ch.clone()).status(baton_proto::etcdserverpb::StatusRequest {}),
        )
        .await
        .unwrap()
        .db_size
    };
    let before = db_size().await;
    assert!(
        before > 9 * MIB as i64,
        "the log holds the history: {before}"
    );
    let compact = etcdctl(&b.endpoint(), &["compact", &rev.to_string()], None);
    assert_eq!(compact.code, 0, "{compact:?}");
    let defrag = etcdctl(&b.endpoint(), &["defrag"], None);
    assert_eq!(defrag.code, 0, "{defrag:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = db_size().await;
    while after > before / 2 {
        assert!(
            Instant::now() < deadline,
            "db size {before} -> {after}: defragment gave nothing back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = db_size().await;
    }
    eprintln!("db size {before} -> {after} bytes after compaction and defragment");
    assert_eq!(
        get(&ch, "big", 0).await.unwrap().unwrap().len(),
        VALUE_BYTES
    );
}

/// etcd accepts a watch that starts at the compact revision (it refuses only a start below
/// it). Baton starts it after that revision: the record of what changed at the compact
/// revision itself is gone (docs/quota.md), so its events are not sent in part; every
/// later revision is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_exactly_the_compact_revision_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("m"));
    let ch = lazy_channel(&b.endpoint());
    let mut compact_rev = 0;
    for i in 0..5 {
        compact_rev = put(&ch, "w", format!("v{i}").into_bytes()).await.unwrap();
    }
    within(
        CALL,
        KvClient::new(ch.clone()).compact(CompactionRequest {
            revision: compact_rev,
            physical: true,
        }),
    )
    .await
    .unwrap();

    let watch_from = |start: i64, prefix: bool| {
        let ch = ch.clone();
        async move {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: b"w".to_vec(),
                    range_end: if prefix { b"x".to_vec() } else { Vec::new() },
                    start_revision: start,
                    ..Default::default()
                })),
            })
            .await
            .unwrap();
            let stream = within(
                CALL,
                WatchClient::new(ch).watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
            )
            .await
            .unwrap();
            (tx, stream)
        }
    };
    // Below the compact revision: compacted, as etcd.
    let (_tx, mut below) = watch_from(compact_rev - 1, false).await;
    let mut compacted = false;
    while let Some(r) = tokio::time::timeout(CALL, below.message())
        .await
        .unwrap()
        .unwrap()
    {
        if r.compact_revision != 0 {
            assert_eq!(r.compact_revision, compact_rev);
            assert!(r.canceled);
            compacted = true;
            break;
        }
    }
    assert!(compacted, "a start below the compact revision is compacted");

    // At it, for one key and for a range: accepted, and the next events arrive.
    let (_tx1, mut one) = watch_from(compact_rev, false).await;
    let (_tx2, mut range) = watch_from(compact_rev, true).await;
    let next = put(&ch, "w", b"after".to_vec()).await.unwrap();
    for stream in [&mut one, &mut range] {
        let mut events = Vec::new();
        while events.is_empty() {
            let r = tokio::time::timeout(CALL, stream.message())
                .await
                .expect("an answer")
                .unwrap()
                .expect("the stream stays open");
            assert_eq!(r.compact_revision, 0, "not compacted: {r:?}");
            assert!(!r.canceled, "{r:?}");
            events.extend(r.events);
        }
        let revs: Vec<i64> = events
            .iter()
            .map(|e| e.kv.as_ref().unwrap().mod_revision)
            .collect();
        assert_eq!(revs, vec![next], "only the revisions after the compact one");
        assert_eq!(events[0].kv.as_ref().unwrap().value, b"after");
    }
}

/// A quota out of range is refused before anything starts, with the flag named.
#[test]
fn a_quota_out_of_range_is_refused_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["18446744073709551616", "2GiB", "1e9"] {
        let out = crate::common::baton_cmd()
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join("m"))
            .arg(format!("--quota-backend-bytes={bad}"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--quota-backend-bytes") && stderr.contains(bad),
            "{bad}: {stderr}"
        );
        assert!(
            !dir.path().join("m").exists(),
            "nothing was created for a refused flag"
        );
    }
}

/// Periodic auto-compaction with a short retention (etcd accepts a Go duration, `2s`): the
/// leader compacts through the log, so old revisions answer "compacted" on every member,
/// recent ones stay readable, HashKV agrees on all members at one revision, and the log
/// says so in etcd's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_auto_compaction_compacts_history_on_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(
        dir.path(),
        3,
        &[
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=2s",
        ],
    );
    let endpoints: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    let chans: Vec<Channel> = endpoints.iter().map(|e| lazy_channel(e)).collect();
    let leader = agreed_leader(&endpoints, Duration::from_secs(20)).await;
    let first = put(&chans[leader], "h", b"first".to_vec()).await.unwrap();
    // History accumulates; the compactor keeps about the last 2 s of it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut compacted_everywhere = false;
    let mut i = 0;
    while Instant::now() < deadline {
        put(&chans[i % 3], "h", format!("v{i}").into_bytes())
            .await
            .unwrap();
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut all = true;
        for ch in &chans {
            match get(ch, "h", first).await {
                Err(e) => assert_eq!(
                    e.message(),
                    "etcdserver: mvcc: required revision has been compacted"
                ),
                Ok(_) => all = false,
            }
        }
        if all {
            compacted_everywhere = true;
            break;
        }
    }
    assert!(
        compacted_everywhere,
        "revision {first} never compacted on every member:\n{}",
        c.logs()
    );
    // Recent history is kept: the revision of a put just made is readable on the leader.
    let recent = put(&chans[leader], "h", b"recent".to_vec()).await.unwrap();
    assert_eq!(
        get(&chans[leader], "h", recent).await.unwrap().as_deref(),
        Some(&b"recent"[..])
    );
    // Every member applied the same compactions: one hash at one revision.
    for ch in &chans {
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(ch, "h", 0).await.ok().flatten().as_deref() != Some(&b"recent"[..]) {
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    hash_kv_agrees(&chans, recent).await;
    let logs = c.logs();
    assert!(logs.contains("starting auto periodic compaction"), "{logs}");
    assert!(
        logs.contains("completed auto periodic compaction"),
        "{logs}"
    );
}

/// Auto-compaction flags etcd refuses (an unknown mode) or Baton refuses (a retention that
/// is neither hours nor a duration, revisions given as a duration) stop the start with the
/// flag named.
#[test]
fn bad_auto_compaction_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (args, said) in [
        (
            &[
                "--auto-compaction-mode=hourly",
                "--auto-compaction-retention=1",
            ][..],
            "unknown auto-compaction-mode \"hourly\"",
        ),
        (
            &["--auto-compaction-retention=1d"][..],
            "--auto-compaction-retention=\"1d\"",
        ),
        (
            &["--auto-compaction-retention=-1"][..],
            "--auto-compaction-retention=\"-1\"",
        ),
        (
            &[
                "--auto-compaction-mode=revision",
                "--auto-compaction-retention=5m",
            ][..],
            "revision retention is a whole number of revisions",
        ),
    ] {
        let out = crate::common::baton_cmd()
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join("m"))
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{}", crate::common::free_port()))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        assert!(
            !dir.path().join("m").exists(),
            "nothing was created for {args:?}"
        );
    }
}
