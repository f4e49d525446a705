//! Compatibility through the `etcd-client` crate (a client nobody here wrote), over real
//! gRPC against a real `baton serve` process.

use std::time::Duration;

use crate::common::{http_get, Baton};
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, Error, EventType, GetOptions, LeaseGrantOptions,
    LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};

async fn connect(b: &Baton) -> Client {
    Client::connect([b.url()], None).await.expect("connect")
}

fn status_of(err: Error) -> tonic_like::Status {
    match err {
        Error::GRpcStatus(s) => tonic_like::Status {
            code: format!("{:?}", s.code()),
            message: s.message().to_string(),
        },
        other => panic!("expected a gRPC status, got {other:?}"),
    }
}

mod tonic_like {
    #[derive(Debug, PartialEq, Eq)]
    pub struct Status {
        pub code: String,
        pub message: String,
    }
}

fn st(code: &str, message: &str) -> tonic_like::Status {
    tonic_like::Status {
        code: code.into(),
        message: message.into(),
    }
}

async fn revision(c: &mut Client) -> i64 {
    c.get("any", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_range_put_delete() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut c = connect(&b).await;

    assert_eq!(revision(&mut c).await, 1, "an empty store is at revision 1");
    for (i, k) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let r = c.put(*k, format!("v{i}"), None).await.unwrap();
        assert_eq!(r.header().unwrap().revision(), i as i64 + 2);
    }
    let r = c
        .put("b", "v1-new", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(r.prev_key().unwrap().value(), b"v1");
    assert_eq!(r.header().unwrap().revision(), 7);

    let r = c.get("b", None).await.unwrap();
    let kv = &r.kvs()[0];
    assert_eq!(
        (kv.create_revision(), kv.mod_revision(), kv.version()),
        (3, 7, 2)
    );

    // count is taken before limit; more says there is more.
    let r = c
        .get("", Some(GetOptions::new().with_all_keys().with_limit(2)))
        .await
        .unwrap();
    assert_eq!((r.kvs().len(), r.count(), r.more()), (2, 5, true));

    let r = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_sort(SortTarget::Mod, SortOrder::Descend)
                    .with_limit(1),
            ),
        )
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].key(), b"b");

    let r = c
        .get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_min_create_revision(4)
                    .with_max_create_revision(5),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<&[u8]> = r.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, vec![b"c".as_slice(), b"d".as_slice()]);
    assert_eq!(r.count(), 5);

    let r = c
        .get(
            "a",
            Some(GetOptions::new().with_range("c").with_keys_only()),
        )
        .await
        .unwrap();
    assert_eq!(r.kvs().len(), 2);
    assert!(r.kvs().iter().all(|kv| kv.value().is_empty()));

    let r = c
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!((r.kvs().len(), r.count()), (0, 5));

    // A historical read: the header still names the current revision.
    let r = c
        .get("b", Some(GetOptions::new().with_revision(4)))
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value(), b"v1");
    assert_eq!(r.header().unwrap().revision(), 7);

    let r = c
        .get("b", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value(), b"v1-new");

    let r = c
        .delete(
            "a",
            Some(DeleteOptions::new().with_range("c").with_prev_key()),
        )
        .await
        .unwrap();
    assert_eq!(r.deleted(), 2);
    assert_eq!(r.prev_kvs().len(), 2);
    assert_eq!(r.header().unwrap().revision(), 8);
    // Deleting nothing does not bump the revision.
    let r = c.delete("zzz", None).await.unwrap();
    assert_eq!((r.deleted(), r.header().unwrap().revision()), (0, 8));

    // Re-creating a deleted key starts a new life.
    c.put("a", "again", None).await.unwrap();
    let r = c.get("a", None).await.unwrap();
    assert_eq!((r.kvs()[0].create_revision(), r.kvs()[0].version()), (9, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_compares_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut c = connect(&b).await;
    c.put("k1", "v1", None).await.unwrap(); // rev 2
    c.put("k2", "v2", None).await.unwrap(); // rev 3

    let txn = Txn::new()
        .when([
            Compare::value("k1", CompareOp::Equal, "v1"),
            Compare::version("k2", CompareOp::Greater, 0),
            Compare::create_revision("k2", CompareOp::Less, 4),
            Compare::mod_revision("k1", CompareOp::NotEqual, 3),
            Compare::lease("k1", CompareOp::Equal, 0),
            Compare::version("k", CompareOp::Equal, 1).with_prefix(),
        ])
        .and_then([
            TxnOp::put("k3", "v3", None),
            TxnOp::delete("k2", None),
            TxnOp::get("k3", None),
            TxnOp::txn(Txn::new().and_then([TxnOp::put("k4", "nested", None)])),
        ])
        .or_else([TxnOp::put("never", "x", None)]);
    let r = c.txn(txn).await.unwrap();
    assert!(r.succeeded());
    assert_eq!(r.header().unwrap().revision(), 4, "a txn is one revision");
    match &r.op_responses()[2] {
        TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].value(), b"v3", "reads see earlier writes"),
        other => panic!("{other:?}"),
    }
    let r = c.get("k4", None).await.unwrap();
    assert_eq!(r.kvs()[0].mod_revision(), 4);

    let r = c
        .txn(
            Txn::new()
                .when([Compare::value("k1", CompareOp::Equal, "nope")])
                .or_else([TxnOp::get("k1", None)]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded());
    assert_eq!(
        r.header().unwrap().revision(),
        4,
        "a read-only txn does not bump"
    );

    // Bad input gets etcd's error and changes nothing.
    let before = revision(&mut c).await;
    let err = c
        .txn(Txn::new().and_then([TxnOp::put("dup", "1", None), TxnOp::put("dup", "2", None)]))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st(
            "InvalidArgument",
            "etcdserver: duplicate key given in txn request"
        )
    );
    let ops: Vec<TxnOp> = (0..129)
        .map(|i| TxnOp::put(format!("m{i}"), "x", None))
        .collect();
    let err = c.txn(Txn::new().and_then(ops)).await.unwrap_err();
    assert_eq!(
        status_of(err),
        st(
            "InvalidArgument",
            "etcdserver: too many operations in txn request"
        )
    );
    let ops: Vec<TxnOp> = (0..128)
        .map(|i| TxnOp::put(format!("m{i}"), "x", None))
        .collect();
    c.txn(Txn::new().and_then(ops))
        .await
        .expect("128 ops are allowed");
    let before = before + 1;
    let err = c.put("", "x", None).await.unwrap_err();
    assert_eq!(
        status_of(err),
        st("InvalidArgument", "etcdserver: key is not provided")
    );
    let err = c
        .put("big", vec![b'x'; 1600 * 1024], None)
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st("InvalidArgument", "etcdserver: request is too large")
    );
    let err = c
        .put("k", "v", Some(PutOptions::new().with_lease(12345)))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st("NotFound", "etcdserver: requested lease not found")
    );
    let err = c
        .put("k1", "v", Some(PutOptions::new().with_ignore_value()))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st("InvalidArgument", "etcdserver: value is provided")
    );
    let err = c
        .put(
            "k1",
            "",
            Some(PutOptions::new().with_ignore_lease().with_lease(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st("InvalidArgument", "etcdserver: lease is provided")
    );
    let err = c
        .put("nokey", "v", Some(PutOptions::new().with_ignore_lease()))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st("InvalidArgument", "etcdserver: key not found")
    );
    let err = c
        .txn(Txn::new().and_then([
            TxnOp::put("t1", "v", None),
            TxnOp::put("t2", "v", Some(PutOptions::new().with_lease(999))),
        ]))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st("NotFound", "etcdserver: requested lease not found")
    );
    assert!(
        c.get("t1", None).await.unwrap().kvs().is_empty(),
        "a failed txn changes nothing"
    );
    assert_eq!(
        revision(&mut c).await,
        before,
        "bad input changed the revision"
    );

    let err = c
        .get("k1", Some(GetOptions::new().with_revision(1000)))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st(
            "OutOfRange",
            "etcdserver: mvcc: required revision is a future revision"
        )
    );
    c.compact(3, None).await.unwrap();
    let err = c
        .get("k1", Some(GetOptions::new().with_revision(2)))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st(
            "OutOfRange",
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    let r = c
        .get("k1", Some(GetOptions::new().with_revision(3)))
        .await
        .unwrap();
    assert_eq!(r.kvs()[0].value(), b"v1");
    let err = c.compact(2, None).await.unwrap_err();
    assert_eq!(
        status_of(err),
        st(
            "OutOfRange",
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut c = connect(&b).await;

    let g = c.lease_grant(1, None).await.unwrap();
    assert!(g.id() > 0);
    assert_eq!(
        g.ttl(),
        2,
        "TTL is raised to the minimum, ceil(1.5 × election timeout)"
    );
    let g2 = c
        .lease_grant(60, Some(LeaseGrantOptions::new().with_id(7)))
        .await
        .unwrap();
    assert_eq!(g2.id(), 7);
    let err = c
        .lease_grant(60, Some(LeaseGrantOptions::new().with_id(7)))
        .await
        .unwrap_err();
    assert_eq!(
        status_of(err),
        st("FailedPrecondition", "etcdserver: lease already exists")
    );
    let err = c.lease_grant(9_000_000_001, None).await.unwrap_err();
    assert_eq!(
        status_of(err),
        st("OutOfRange", "etcdserver: too large lease TTL")
    );

    c.put("l/a", "1", Some(PutOptions::new().with_lease(7)))
        .await
        .unwrap();
    c.put("l/b", "2", Some(PutOptions::new().with_lease(7)))
        .await
        .unwrap();
    let t = c
        .lease_time_to_live(7, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(t.granted_ttl(), 60);
    assert!(t.ttl() > 55 && t.ttl() <= 60, "{}", t.ttl());
    assert_eq!(t.keys(), &[b"l/a".to_vec(), b"l/b".to_vec()]);
    let t = c.lease_time_to_live(424242, None).await.unwrap();
    assert_eq!(t.ttl(), -1, "an unknown lease has TTL -1");

    let ids: Vec<i64> = c
        .leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    assert!(ids.contains(&7) && ids.contains(&g.id()));

    let (mut keeper, mut stream) = c.lease_keep_alive(7).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let r = stream.message().await.unwrap().unwrap();
    assert_eq!((r.id(), r.ttl()), (7, 60));
    // An unknown lease is answered with TTL 0, not a gRPC error; the crate turns exactly
    // that answer (ttl <= 0) into this error.
    match c.lease_keep_alive(5555).await {
        Err(Error::LeaseKeepAliveError(m)) => assert_eq!(m, "lease not found"),
        Err(other) => panic!("expected a TTL 0 answer, got {other:?}"),
        Ok(_) => panic!("keep-alive of an unknown lease succeeded"),
    }

    // Revoke deletes every attached key in one revision.
    let before = revision(&mut c).await;
    let r = c.lease_revoke(7).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), before + 1);
    assert!(c
        .get("l/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap()
        .kvs()
        .is_empty());
    let err = c.lease_revoke(7).await.unwrap_err();
    assert_eq!(
        status_of(err),
        st("NotFound", "etcdserver: requested lease not found")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_timing() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut c = connect(&b).await;

    // No keep-alive: a key on a 2 s lease is gone within 2.5 s.
    let short = c.lease_grant(2, None).await.unwrap().id();
    c.put("short", "x", Some(PutOptions::new().with_lease(short)))
        .await
        .unwrap();
    let start = std::time::Instant::now();
    loop {
        if c.get("short", None).await.unwrap().kvs().is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_millis(2500),
            "key outlived its 2 s lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "expired early: {:?}",
        start.elapsed()
    );

    // With keep-alives a 2 s lease keeps its key for 10 s.
    let kept = c.lease_grant(2, None).await.unwrap().id();
    c.put("kept", "y", Some(PutOptions::new().with_lease(kept)))
        .await
        .unwrap();
    let (mut keeper, mut stream) = c.lease_keep_alive(kept).await.unwrap();
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        keeper.keep_alive().await.unwrap();
        let r = stream.message().await.unwrap().unwrap();
        assert_eq!(r.ttl(), 2);
        assert_eq!(
            c.get("kept", None).await.unwrap().kvs().len(),
            1,
            "lost the key at {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut c = connect(&b).await;
    c.put("w/a", "1", None).await.unwrap(); // 2
    c.put("w/b", "1", None).await.unwrap(); // 3
    c.put("w/a", "2", None).await.unwrap(); // 4
    c.delete("w/b", None).await.unwrap(); // 5

    // From a past revision: history first, in order, with prev_kv.
    let mut ws = c
        .watch(
            "w/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(3)
                    .with_prev_key(),
            ),
        )
        .await
        .unwrap();
    let created = ws.message().await.unwrap().unwrap();
    assert!(created.created());
    let id = created.watch_id();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let r = ws.message().await.unwrap().unwrap();
        assert_eq!(r.watch_id(), id);
        for e in r.events() {
            seen.push((
                e.event_type(),
                e.kv().unwrap().mod_revision(),
                e.prev_kv().map(|p| p.value().to_vec()),
            ));
        }
    }
    assert_eq!(
        seen,
        vec![
            (EventType::Put, 3, None),
            (EventType::Put, 4, Some(b"1".to_vec())),
            (EventType::Delete, 5, Some(b"1".to_vec())),
        ]
    );
    // Live events.
    c.put("w/c", "live", None).await.unwrap(); // 6
    let r = ws.message().await.unwrap().unwrap();
    assert_eq!(r.events()[0].kv().unwrap().key(), b"w/c");
    assert_eq!(r.events()[0].kv().unwrap().mod_revision(), 6);

    // A second watcher on the same stream with a NOPUT filter, and a progress request.
    ws.watch(
        "w/",
        Some(
            WatchOptions::new()
                .with_prefix()
                .with_filters([WatchFilterType::NoPut]),
        ),
    )
    .await
    .unwrap();
    let r = ws.message().await.unwrap().unwrap();
    assert!(r.created());
    let id2 = r.watch_id();
    assert_ne!(id, id2);
    c.put("w/d", "x", None).await.unwrap(); // 7: only watcher 1
    c.delete("w/d", None).await.unwrap(); // 8: both
    let mut got = Vec::new();
    while got.len() < 3 {
        let r = ws.message().await.unwrap().unwrap();
        for e in r.events() {
            got.push((r.watch_id(), e.event_type(), e.kv().unwrap().mod_revision()));
        }
    }
    got.sort_by_key(|g| (g.2, g.0));
    assert_eq!(
        got,
        vec![
            (id, EventType::Put, 7),
            (id, EventType::Delete, 8),
            (id2, EventType::Delete, 8)
        ]
    );
    ws.request_progress().await.unwrap();
    let r = ws.message().await.unwrap().unwrap();
    assert_eq!(r.watch_id(), -1);
    assert!(r.events().is_empty());
    assert_eq!(r.header().unwrap().revision(), 8);

    ws.cancel(id2).await.unwrap();
    let r = ws.message().await.unwrap().unwrap();
    assert!(r.canceled());
    assert_eq!(r.watch_id(), id2);

    // A compacted start revision cancels with compact_revision.
    c.compact(6, None).await.unwrap();
    let mut ws2 = c
        .watch(
            "w/",
            Some(WatchOptions::new().with_prefix().with_start_revision(2)),
        )
        .await
        .unwrap();
    let mut r = ws2.message().await.unwrap().unwrap();
    if r.created() && !r.canceled() {
        r = ws2.message().await.unwrap().unwrap();
    }
    assert!(r.canceled(), "{r:?}");
    assert_eq!(r.compact_revision(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut c = connect(&b).await;
    let p = c.put("x", "y", None).await.unwrap();
    let ph = p.header().unwrap().clone();
    let s = c.status().await.unwrap();
    let sh = s.header().unwrap();
    let m = c.member_list().await.unwrap();
    let mh = m.header().unwrap();
    assert_ne!(ph.cluster_id(), 0);
    assert_ne!(ph.member_id(), 0);
    assert_eq!(
        (sh.cluster_id(), sh.member_id()),
        (ph.cluster_id(), ph.member_id())
    );
    assert_eq!(
        (mh.cluster_id(), mh.member_id()),
        (ph.cluster_id(), ph.member_id())
    );
    assert_eq!(s.leader(), ph.member_id());
    assert_eq!(m.members().len(), 1);
    assert_eq!(m.members()[0].id(), ph.member_id());
    assert!(ph.raft_term() >= 1);
    assert_eq!(s.raft_term(), ph.raft_term());
    assert!(s.raft_index() >= s.raft_applied_index());
    assert_eq!(sh.revision(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut c = connect(&b).await;
    c.put("m", "1", None).await.unwrap();
    c.get("m", None).await.unwrap();
    let _ = c.get("m", Some(GetOptions::new().with_revision(99))).await;
    let mut ws = c.watch("m", None).await.unwrap();
    assert!(ws.message().await.unwrap().unwrap().created());
    c.lease_grant(30, None).await.unwrap();

    let (code, body) = tokio::task::spawn_blocking({
        let port = b.metrics_port;
        move || http_get(port, "/health")
    })
    .await
    .unwrap();
    assert_eq!((code, body.as_str()), (200, r#"{"health":"true"}"#));
    // The client port answers HTTP too, beside gRPC.
    let (code, body) = tokio::task::spawn_blocking({
        let port = b.client_port;
        move || http_get(port, "/health")
    })
    .await
    .unwrap();
    assert_eq!((code, body.as_str()), (200, r#"{"health":"true"}"#));

    let (code, body) = tokio::task::spawn_blocking({
        let port = b.metrics_port;
        move || http_get(port, "/metrics")
    })
    .await
    .unwrap();
    assert_eq!(code, 200);
    for needle in [
        r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"} 1"#,
        r#"grpc_server_handled_total{grpc_code="OutOfRange",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 1"#,
        r#"grpc_server_handling_seconds_bucket{grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary",le="#,
        "baton_raft_term ",
        "baton_raft_index ",
        "baton_db_size_bytes ",
        "baton_watchers 1",
        "baton_leases 1",
        "baton_mvcc_revision 2",
        "baton_wal_fsyncs_total",
    ] {
        assert!(
            body.contains(needle),
            "missing {needle:?} in /metrics:\n{body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_progress_notify_and_fragments() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start_with(
        &dir.path().join("b"),
        &["--watch-progress-notify-interval", "1"],
    );
    let mut c = connect(&b).await;
    c.put("p/a", "1", None).await.unwrap(); // 2

    // A watcher that asked for progress notifications gets an empty response naming its id
    // and the current revision when nothing happened for an interval.
    let mut ws = c
        .watch(
            "p/",
            Some(WatchOptions::new().with_prefix().with_progress_notify()),
        )
        .await
        .unwrap();
    let created = ws.message().await.unwrap().unwrap();
    assert!(created.created());
    let r = tokio::time::timeout(Duration::from_secs(5), ws.message())
        .await
        .expect("a progress notification within 5 s")
        .unwrap()
        .unwrap();
    assert_eq!(r.watch_id(), created.watch_id());
    assert!(r.events().is_empty());
    assert_eq!(r.header().unwrap().revision(), 2);

    // Two 1 MiB values: replayed together they exceed the 1.5 MiB limit, so a watcher that
    // asked for fragments gets them split, every piece but the last marked `fragment`.
    let big = vec![b'v'; 1024 * 1024];
    c.put("f/1", big.clone(), None).await.unwrap(); // 3
    c.put("f/2", big.clone(), None).await.unwrap(); // 4
                                                    // etcd-client does not expose `fragment`, so this part speaks the generated API.
    use baton_proto::etcdserverpb::{
        watch_client::WatchClient, watch_request::RequestUnion, WatchCreateRequest, WatchRequest,
    };
    let mut raw = WatchClient::connect(b.url())
        .await
        .unwrap()
        .max_decoding_message_size(16 << 20);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"f/".to_vec(),
            range_end: b"f0".to_vec(),
            start_revision: 3,
            fragment: true,
            ..Default::default()
        })),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(create).await.unwrap();
    let mut stream = raw
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().unwrap().created);
    let mut pieces = Vec::new();
    let mut events = 0;
    while events < 2 {
        let r = stream.message().await.unwrap().unwrap();
        events += r.events.len();
        pieces.push(r.fragment);
    }
    assert_eq!(pieces, vec![true, false], "fragments: {pieces:?}");
}
