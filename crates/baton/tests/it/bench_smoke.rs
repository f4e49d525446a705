//! `baton bench` end to end, briefly: a put run of about a second against a real
//! `baton serve`, in both output formats. A smoke test only: it checks that the command
//! runs and reports, never how fast anything is (benchmarks never run as timed tests).

use std::time::{Duration, Instant};

use crate::common::{baton, Baton};

/// Waits until the member takes writes (it listens before it has elected itself leader).
fn wait_writable(endpoint: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = baton(endpoint, &["kv", "put", "bench-smoke/ready", "1"], None);
        if out.code == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no leader within 30 s: {out:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn bench_put_reports_a_table_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let server = Baton::start(&dir.path().join("data"));
    let endpoint = server.endpoint();
    wait_writable(&endpoint);
    let common = [
        "bench",
        "put",
        "--endpoints",
        endpoint.as_str(),
        "--clients",
        "4",
        "--conns",
        "2",
        "--warmup",
        "0.2",
        "--duration",
        "1",
        "--no-progress",
    ];
    let out = baton(&endpoint, &common, None);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("put, 4 clients / 2 conns"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("throughput"), "{}", out.stdout);

    let mut json_args = common.to_vec();
    json_args.extend(["-o", "json"]);
    let out = baton(&endpoint, &json_args, None);
    assert_eq!(out.code, 0, "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON document");
    assert_eq!(v["workload"]["kind"], "kv");
    assert_eq!(v["workload"]["op"], "put");
    assert!(v["result"]["ops"].as_u64().unwrap() > 0, "{v}");
    assert!(v["result"]["p50_ms"].as_f64().is_some(), "{v}");

    // A server that is not there is an error with a message, not a hang or a panic.
    let out = baton(
        &endpoint,
        &[
            "bench",
            "range",
            "--endpoints",
            "127.0.0.1:1",
            "--duration",
            "1",
        ],
        None,
    );
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("baton bench:"), "{out:?}");
}
