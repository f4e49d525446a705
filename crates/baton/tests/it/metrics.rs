//! `/metrics` of a real `baton serve`: etcd's e2e metrics sequence (`TestV3Metrics*`'s
//! expectations, driven by the real etcdctl), HELP and TYPE on every family, label values
//! bounded for paths clients make up, and Baton's lock metrics under a contended lock with a
//! holder that loses its lease.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;
use std::time::{Duration, Instant};

use baton_proto::baton::v1::{lock_client::LockClient, AcquireRequest, FencedPutRequest};
use baton_proto::etcdserverpb::{
    lease_client::LeaseClient, LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest, PutResponse,
    RangeRequest, RangeResponse,
};
use prost::Message as _;
use tonic::codegen::http::uri::PathAndQuery;

use crate::common::{self, etcdctl, etcdctl_cmd, http_get, Baton, Cluster, Proc};

/// Everything `/metrics` says.
pub(crate) async fn scrape(port: u16) -> String {
    let (code, body) = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    body
}

/// The value of the sample written exactly `sample` (name and labels as rendered).
pub(crate) fn value(body: &str, sample: &str) -> Option<f64> {
    let prefix = format!("{sample} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

/// The samples (not comments) of the page.
pub(crate) fn samples(body: &str) -> Vec<&str> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect()
}

/// etcd 3.4's `metricsTest` (tests/e2e/metrics_test.go), step by step with the real etcdctl:
/// put `k`, then six rounds of put `i`, delete `i`, a watch of `k` from revision 1 that is
/// killed once it has printed `k`, and at once a look at `/metrics` for one line each round.
/// Lines must be whole: `etcd_mvcc_put_total 2` is not `etcd_mvcc_put_total 20`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_e2e_metrics_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let ep = b.endpoint();
    assert_eq!(etcdctl(&ep, &["put", "k", "v"], None).code, 0);
    let expected = [
        "etcd_mvcc_put_total 2".to_string(),
        "etcd_debugging_mvcc_keys_total 1".to_string(),
        "etcd_mvcc_delete_total 3".to_string(),
        r#"etcd_server_version{server_version="3.4.23"} 1"#.to_string(),
        r#"etcd_cluster_version{cluster_version="3.4"} 1"#.to_string(),
        r#"grpc_server_handled_total{grpc_code="Canceled",grpc_method="Watch",grpc_service="etcdserverpb.Watch",grpc_type="bidi_stream"} 6"#.to_string(),
    ];
    for (i, line) in (1..).zip(expected) {
        let key = i.to_string();
        assert_eq!(etcdctl(&ep, &["put", &key, "v"], None).code, 0);
        assert_eq!(etcdctl(&ep, &["del", &key], None).stdout.trim(), "1");
        let mut cmd = etcdctl_cmd(&ep);
        cmd.args(["watch", "k", "--rev", "1"]);
        let mut watch = Proc::spawn("etcdctl watch", cmd);
        watch.expect_stdout("k\nv", Duration::from_secs(10));
        // What etcd's harness does to it (`ExpectProcess.Stop`: SIGKILL, wait), and then at
        // once a look at `/metrics`, as the harness's curl does: no second chance.
        watch.signal(libc::SIGKILL);
        watch.wait_exit(Duration::from_secs(10));
        let body = scrape(b.metrics_port).await;
        assert!(
            body.lines().any(|l| l == line),
            "round {i}: no line {line:?} in /metrics:\n{}",
            body.lines()
                .filter(|l| l.starts_with(line.split([' ', '{']).next().unwrap()))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Every family on the page has `# HELP` and `# TYPE` (each once), every sample belongs to
/// a typed family, and the families etcd's dashboards and alert rules are built on are
/// there with etcd's types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_has_help_and_type() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let ep = b.endpoint();
    assert_eq!(etcdctl(&ep, &["put", "a", "1"], None).code, 0);
    assert_eq!(etcdctl(&ep, &["get", "a"], None).code, 0);
    assert_eq!(etcdctl(&ep, &["lease", "grant", "60"], None).code, 0);
    let body = scrape(b.metrics_port).await;

    let mut help: BTreeMap<&str, usize> = BTreeMap::new();
    let mut types: BTreeMap<&str, &str> = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            *help.entry(name).or_default() += 1;
            assert!(
                rest.len() > name.len() + 1,
                "empty HELP for {name}: {line:?}"
            );
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(types.insert(name, kind).is_none(), "{name} typed twice");
        }
    }
    let typed: BTreeSet<&str> = types.keys().copied().collect();
    let helped: BTreeSet<&str> = help.keys().copied().collect();
    assert_eq!(
        typed.difference(&helped).collect::<Vec<_>>(),
        Vec::<&&str>::new(),
        "families without HELP"
    );
    assert!(help.values().all(|n| *n == 1), "HELP twice: {help:?}");
    for sample in samples(&body) {
        let name = sample.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(f) == Some(&"histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "untyped sample {sample:?}");
    }
    for (name, kind) in [
        ("etcd_server_has_leader", "gauge"),
        ("etcd_server_is_leader", "gauge"),
        ("etcd_server_is_learner", "gauge"),
        ("etcd_server_leader_changes_seen_total", "counter"),
        ("etcd_server_proposals_committed_total", "gauge"),
        ("etcd_server_proposals_applied_total", "gauge"),
        ("etcd_server_proposals_pending", "gauge"),
        ("etcd_server_proposals_failed_total", "counter"),
        ("etcd_server_slow_apply_total", "counter"),
        ("etcd_server_read_indexes_failed_total", "counter"),
        ("etcd_server_quota_backend_bytes", "gauge"),
        ("etcd_server_id", "gauge"),
        ("etcd_server_version", "gauge"),
        ("etcd_server_health_success", "counter"),
        ("etcd_server_health_failures", "counter"),
        ("etcd_cluster_version", "gauge"),
        ("etcd_disk_wal_fsync_duration_seconds", "histogram"),
        ("etcd_disk_wal_write_bytes_total", "gauge"),
        ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
        ("etcd_mvcc_db_total_size_in_use_in_bytes", "gauge"),
        ("etcd_mvcc_put_total", "counter"),
        ("etcd_mvcc_range_total", "counter"),
        ("etcd_mvcc_txn_total", "counter"),
        ("etcd_mvcc_delete_total", "counter"),
        ("etcd_debugging_mvcc_keys_total", "gauge"),
        ("etcd_debugging_mvcc_current_revision", "gauge"),
        ("etcd_debugging_mvcc_compact_revision", "gauge"),
        ("etcd_debugging_mvcc_watcher_total", "gauge"),
        ("etcd_debugging_mvcc_watch_stream_total", "gauge"),
        ("etcd_debugging_lease_granted_total", "counter"),
        ("etcd_debugging_lease_ttl_total", "histogram"),
        ("etcd_network_client_grpc_received_bytes_total", "counter"),
        ("etcd_network_client_grpc_sent_bytes_total", "counter"),
        ("grpc_server_started_total", "counter"),
        ("grpc_server_handled_total", "counter"),
        ("grpc_server_msg_received_total", "counter"),
        ("grpc_server_msg_sent_total", "counter"),
        ("grpc_server_handling_seconds", "histogram"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_cpu_seconds_total", "counter"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
        ("baton_raft_term", "gauge"),
        ("baton_wal_fsync_seconds", "histogram"),
    ] {
        assert_eq!(types.get(name), Some(&kind), "{name}");
    }
    // What the workload did, by etcd's counting: one put, one range served, one grant.
    assert_eq!(value(&body, "etcd_mvcc_put_total"), Some(1.0));
    assert_eq!(value(&body, "etcd_mvcc_range_total"), Some(1.0));
    assert_eq!(
        value(&body, "etcd_debugging_lease_granted_total"),
        Some(1.0)
    );
    assert_eq!(value(&body, "etcd_server_has_leader"), Some(1.0));
    assert_eq!(value(&body, "etcd_server_is_leader"), Some(1.0));
    assert_eq!(
        value(&body, "etcd_server_leader_changes_seen_total"),
        Some(1.0)
    );
    let put_ok = r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"}"#;
    assert_eq!(value(&body, put_ok), Some(1.0));
    let received = value(&body, "etcd_network_client_grpc_received_bytes_total").unwrap();
    // The put's request alone: key "a" and value "1" in a PutRequest.
    assert!(received >= 6.0, "{received}");
}

/// The unary KV calls are served on their own path past tonic's router, which counts them
/// itself; a call it hands to tonic after reading its body (here a `Put` whose body holds two
/// messages) is counted by the metrics layer there. Either way each call is counted once:
/// started, handled with its code, and its messages and bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_calls_are_counted_once_whichever_path_serves_them() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let bytes_received =
        |body: &str| value(body, "etcd_network_client_grpc_received_bytes_total").unwrap();
    let before = bytes_received(&scrape(b.metrics_port).await);
    let ch = common::channel(&b.endpoint()).await;
    let put = |key: &str| PutRequest {
        key: key.into(),
        value: b"value".to_vec(),
        ..Default::default()
    };
    let path = PathAndQuery::from_static("/etcdserverpb.KV/Put");
    let codec = || baton_proto::codec::Codec::<PutRequest, PutResponse>::default();
    for key in ["a", "b", "c"] {
        let mut grpc = tonic::client::Grpc::new(ch.clone());
        grpc.ready().await.unwrap();
        grpc.unary(tonic::Request::new(put(key)), path.clone(), codec())
            .await
            .unwrap();
    }
    // A refusal on the fast path: an empty key.
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.unwrap();
    let refused = grpc
        .unary(tonic::Request::new(put("")), path.clone(), codec())
        .await
        .expect_err("an empty key");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    // Two messages where one is expected: read by the fast path, then handed to tonic.
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.unwrap();
    let two = futures::stream::iter([put("d"), put("e")]);
    // tonic serves the first message (as it did before the fast path existed).
    let handed_on = grpc
        .client_streaming(tonic::Request::new(two), path.clone(), codec())
        .await
        .expect("tonic's answer");
    assert_eq!(handed_on.get_ref().header.as_ref().unwrap().revision, 5);
    let body = scrape(b.metrics_port).await;
    let labels = r#"grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary""#;
    let counted = |family: &str| value(&body, &format!("{family}{{{labels}}}")).unwrap_or(0.0);
    let handled = |code: &str| {
        value(
            &body,
            &format!(r#"grpc_server_handled_total{{grpc_code="{code}",{labels}}}"#),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(counted("grpc_server_started_total"), 5.0);
    assert_eq!(handled("InvalidArgument"), 1.0);
    assert_eq!(handled("OK"), 4.0);
    assert_eq!(
        value(
            &body,
            &format!(r#"grpc_server_handling_seconds_count{{{labels}}}"#)
        ),
        Some(5.0)
    );
    // Received: one message per call, two in the last; sent: one per answer with a message.
    assert_eq!(counted("grpc_server_msg_received_total"), 6.0);
    assert_eq!(counted("grpc_server_msg_sent_total"), 4.0);
    let payload = put("a").encoded_len() as f64;
    assert_eq!(
        bytes_received(&body) - before,
        5.0 * payload + put("").encoded_len() as f64
    );
}

/// Five calls to made-up paths (services and methods Baton does not serve) add no series:
/// they are counted under the one `unknown` method, whose series exist from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_grpc_paths_add_no_series() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let before = scrape(b.metrics_port).await;
    let ch = common::channel(&b.endpoint()).await;
    for i in 0..5u64 {
        let path = format!(
            "/probe{:x}.Service{i}/Method{:x}",
            rand::random::<u32>(),
            rand::random::<u32>()
        );
        let mut grpc = tonic::client::Grpc::new(ch.clone());
        grpc.ready().await.unwrap();
        let status = grpc
            .unary(
                tonic::Request::new(RangeRequest::default()),
                PathAndQuery::from_str(&path).unwrap(),
                baton_proto::codec::Codec::<RangeRequest, RangeResponse>::default(),
            )
            .await
            .expect_err("no such method");
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{path}");
    }
    let after = scrape(b.metrics_port).await;
    let names = |body: &str| -> BTreeSet<String> {
        samples(body)
            .into_iter()
            .map(|s| s.rsplit_once(' ').unwrap().0.to_string())
            .collect()
    };
    let new: Vec<String> = names(&after)
        .difference(&names(&before))
        .filter(|s| s.contains("grpc_"))
        .cloned()
        .collect();
    assert_eq!(new, Vec::<String>::new(), "series added by made-up paths");
    let unknown = |body: &str, code: &str| {
        value(
            body,
            &format!(
                r#"grpc_server_handled_total{{grpc_code="{code}",grpc_method="unknown",grpc_service="unknown",grpc_type="unknown"}}"#
            ),
        )
    };
    assert_eq!(unknown(&before, "Unimplemented"), Some(0.0));
    assert_eq!(unknown(&after, "Unimplemented"), Some(5.0));
}

/// A lock with two waiters whose holder's lease expires, driven through `endpoint`: the
/// holder's lease (2 s) is never kept alive, the lock has a 1.5 s lock-delay. Returns
/// `/metrics` of `metrics_port` while both waiters queue behind the holder; by the time it
/// returns, the holder has expired, the first waiter has waited out the lock-delay and
/// holds the lock, the old holder's keep-alive has found its lease gone and its fenced
/// write has been refused.
pub(crate) async fn contended_lock(endpoint: &str, metrics_port: u16) -> String {
    let ch = common::channel(endpoint).await;
    let mut leases = LeaseClient::new(ch.clone());
    let grant = |ttl: i64| {
        let mut leases = leases.clone();
        async move {
            leases
                .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                .await
                .unwrap()
                .into_inner()
                .id
        }
    };
    let (short, long1, long2) = (grant(2).await, grant(60).await, grant(60).await);
    let mut locks = LockClient::new(ch.clone());
    let acquire = |lease: i64| AcquireRequest {
        name: b"jobs".to_vec(),
        lease,
        timeout_ms: 30_000,
        lock_delay_ms: 1500,
        ..AcquireRequest::default()
    };
    let holder = locks.acquire(acquire(short)).await.unwrap().into_inner();
    let waiters: Vec<_> = [long1, long2]
        .into_iter()
        .map(|lease| {
            let mut locks = locks.clone();
            let req = acquire(lease);
            tokio::spawn(async move { locks.acquire(req).await.map(|r| r.into_inner()) })
        })
        .collect();
    // Both waiters queued behind the holder, and each of the three acquisitions recorded the
    // queue it found: the gauge is read from the applied state when scraped, the histogram
    // written by the request's task after its enqueue was applied, so one scrape can see the
    // gauge at 2 before the last acquisition's sample (CI saw count 2).
    let deadline = Instant::now() + Duration::from_secs(5);
    let queued = loop {
        let body = scrape(metrics_port).await;
        if value(&body, "baton_lock_queued_waiters") == Some(2.0)
            && value(&body, "baton_lock_queue_length_count").is_some_and(|n| n >= 3.0)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "no queue:\n{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The waiter first in the queue (they raced to join it) gets the lock once the holder's
    // lease has expired and the lock-delay has passed; the other waits on behind it.
    let (first, _, _) = futures::future::select_all(waiters).await;
    let next = first.unwrap().expect("granted after the expiry");
    assert!(next.fencing_token > holder.fencing_token);
    let mut keep_alive = leases
        .lease_keep_alive(futures::stream::iter([LeaseKeepAliveRequest { id: short }]))
        .await
        .unwrap()
        .into_inner();
    let answer = keep_alive.message().await.unwrap().unwrap();
    assert_eq!(answer.ttl, 0, "the holder's lease is gone");
    let stale = locks
        .fenced_put(FencedPutRequest {
            lock_key: holder.key.clone(),
            fencing_token: holder.fencing_token,
            put: Some(PutRequest {
                key: b"jobs-output".to_vec(),
                value: b"late".to_vec(),
                ..PutRequest::default()
            }),
        })
        .await
        .expect_err("a stale token is refused");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{stale:?}");
    queued
}

/// Baton's lock metrics under [`contended_lock`]: the queue's contention while it waits,
/// then the expired owner, the lock-delay waited out, the failed renewal and the fencing
/// rejection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_metrics_follow_a_contended_lock() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let body = contended_lock(&b.endpoint(), b.metrics_port).await;
    assert_eq!(value(&body, "baton_lock_waiters_max"), Some(2.0));
    assert_eq!(value(&body, "baton_lock_held"), Some(1.0));
    assert_eq!(value(&body, "baton_lock_waiters"), Some(2.0));
    assert_eq!(value(&body, "baton_lock_queue_length_count"), Some(3.0));

    let body = scrape(b.metrics_port).await;
    for (sample, want) in [
        ("baton_lock_expired_holders_total", 1.0),
        ("baton_lock_delay_refusals_total", 1.0),
        ("baton_lock_delay_wait_seconds_count", 1.0),
        (r#"baton_lock_acquire_seconds_count{api="baton"}"#, 2.0),
        (
            r#"baton_lease_renewal_failures_total{reason="not_found"}"#,
            1.0,
        ),
        (
            r#"baton_fencing_rejections_total{source="fenced_put"}"#,
            1.0,
        ),
        ("baton_lock_queued_waiters", 1.0),
        ("etcd_debugging_server_lease_expired_total", 1.0),
    ] {
        assert_eq!(value(&body, sample), Some(want), "{sample}");
    }
    // The wait for the delay is about the delay (from the expiry, so at most it).
    let waited = value(&body, "baton_lock_delay_wait_seconds_sum").unwrap();
    assert!((0.5..=1.6).contains(&waited), "waited {waited} s");
}

/// `etcd_server_has_leader` follows Raft, not the last leader id: a leader whose followers
/// are gone reports no leader within about the election timeout (etcd's CheckQuorum), while
/// it still calls itself leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_a_quorum_has_no_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 3, &[]);
    let endpoints: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    let leader = common::agreed_leader(&endpoints, Duration::from_secs(20)).await;
    for m in &c.members {
        assert_eq!(
            value(&scrape(m.metrics_port).await, "etcd_server_has_leader"),
            Some(1.0)
        );
    }
    for (i, m) in c.members.iter_mut().enumerate() {
        if i != leader {
            m.kill9();
        }
    }
    let port = c.members[leader].metrics_port;
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(10);
    loop {
        let body = scrape(port).await;
        if value(&body, "etcd_server_has_leader") == Some(0.0) {
            eprintln!("no leader reported {:?} after the kill", killed.elapsed());
            break;
        }
        assert!(Instant::now() < deadline, "still a leader:\n{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A serving member runs with transparent huge pages off (`PR_SET_THP_DISABLE`, see
/// `transparent_huge_pages_off_for_serve` in main.rs): with them, mimalloc's memory was held resident
/// in 2 MiB pages (idle 33 MiB RSS instead of 22).
#[test]
fn a_serving_member_runs_without_transparent_huge_pages() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(dir.path());
    let pid = b.child.as_ref().expect("running").id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(thp, Some("0"), "{status}");
}
