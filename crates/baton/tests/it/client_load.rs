//! Real clients' load patterns against a real `baton serve`, with etcd's own Go client
//! (clientv3 3.4 from Debian's `golang-etcd-server-dev`, `load/clientv3`): counts, never
//! timings. `scripts/load` runs the same program against Baton and etcd side by side.
//!
//! - 10,000 leases kept alive over one connection for 3 × TTL: clientv3 sends every
//!   keep-alive on one stream, a burst of 10,000 tiny DATA frames every 500 ms, which h2's
//!   small-frame budget once answered with GOAWAY (every channel closed, leases expired).
//! - 10,000 watch creates pipelined on one stream: all created.
//! - Out of descriptors (`ulimit -n 256`, 300 connections held): the accept loop backs off
//!   instead of spinning.
//! - A GOAWAY the server sends is counted in `/metrics` and logged.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::{http_get, Baton};

/// Builds `load/clientv3` once per test process (GOPATH mode against Debian's Go sources).
fn clientv3load() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let gopath = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gopath");
        let src = gopath.join("src");
        std::fs::create_dir_all(&src).unwrap();
        let link = src.join("clientv3load");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(repo.join("load/clientv3").canonicalize().unwrap(), &link)
            .unwrap();
        let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("clientv3load");
        assert!(
            Path::new("/usr/share/gocode/src/go.etcd.io/etcd/clientv3").exists(),
            "etcd's Go client is missing: install Debian's golang-go and golang-etcd-server-dev \
             (scripts/install-deps does)"
        );
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg("clientv3load")
            .env("GO111MODULE", "off")
            .env("GOPATH", format!("{}:/usr/share/gocode", gopath.display()))
            .output()
            .expect("run go (install Debian's golang-go: scripts/install-deps does)");
        assert!(
            out.status.success(),
            "go build load/clientv3 failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

/// Runs one workload and returns its JSON report.
fn run_load(args: &[&str]) -> serde_json::Value {
    let out = Command::new(clientv3load())
        .args(args)
        .output()
        .expect("run clientv3load");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "clientv3load {args:?} failed:\n{stderr}"
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("clientv3load printed no report ({e}):\n{stdout}\n{stderr}"))
}

fn count(report: &serde_json::Value, field: &str) -> i64 {
    report[field]
        .as_i64()
        .unwrap_or_else(|| panic!("no {field} in {report}"))
}

/// The sum of a counter over all its label sets in `/metrics` (0 when absent).
fn counter_total(metrics_port: u16, name: &str) -> f64 {
    let (_, body) = http_get(metrics_port, "/metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn clientv3_keeps_10000_leases_alive_over_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    // 3 × TTL once all are granted: every lease is renewed about nine times.
    let report = run_load(&[
        "leases",
        "-endpoints",
        &b.endpoint(),
        "-n",
        "10000",
        "-ttl",
        "10",
        "-hold",
        "30s",
        "-sample",
        "20",
    ]);
    assert_eq!(count(&report, "grant_errors"), 0, "{report}");
    assert_eq!(count(&report, "channels_closed"), 0, "{report}");
    assert_eq!(count(&report, "sampled"), 20, "{report}");
    assert_eq!(count(&report, "sampled_alive"), 20, "{report}");
    assert_eq!(
        counter_total(b.metrics_port, "baton_http2_goaway_sent_total"),
        0.0,
        "the server sent a GOAWAY; log:\n{}",
        b.log()
    );
}

#[test]
fn pipelined_watch_creates_on_one_stream_are_all_created() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let report = run_load(&["watches", "-endpoints", &b.endpoint(), "-n", "10000"]);
    assert_eq!(count(&report, "send_errors"), 0, "{report}");
    assert_eq!(report["stream_error"], "", "{report}");
    assert_eq!(count(&report, "created"), 10000, "{report}");
    assert_eq!(count(&report, "canceled"), 0, "{report}");
}

/// CPU seconds (user + system) the process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn out_of_descriptors_the_server_backs_off_instead_of_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start_limited(&dir.path().join("b"), &[], Some(256));
    let pid = b.child.as_ref().unwrap().id();
    let mut held = Vec::new();
    for _ in 0..300 {
        match std::net::TcpStream::connect(("127.0.0.1", b.client_port)) {
            Ok(s) => held.push(s),
            Err(e) => panic!("connect: {e}"),
        }
    }
    // The kernel completes handshakes into the backlog whatever the server's descriptors;
    // wait until the server has failed on them (its log says so: its metrics port cannot
    // accept either meanwhile), then measure while all 300 stay open.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.log().contains("accepting a connection failed") {
        assert!(
            Instant::now() < deadline,
            "no failed accept logged; log:\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = cpu_seconds(pid);
    let window = Duration::from_secs(3);
    std::thread::sleep(window);
    let used = cpu_seconds(pid) - before;
    let share = used / window.as_secs_f64();
    assert!(
        share < 0.05,
        "server used {:.1} % of a core while out of descriptors",
        share * 100.0
    );
    drop(held);
    // Once descriptors are free again it serves, and the failures were counted.
    let report = run_load(&[
        "conns",
        "-endpoints",
        &b.endpoint(),
        "-n",
        "10",
        "-hold",
        "0s",
    ]);
    assert_eq!(count(&report, "served"), 10, "{report}");
    assert_eq!(report["fresh_client"], "ok", "{report}");
    assert!(counter_total(b.metrics_port, "baton_accept_errors_total") > 0.0);
}

#[test]
fn a_goaway_the_server_sends_is_counted_and_logged() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", b.client_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The client preface and an empty SETTINGS, then a DATA frame on stream 0, which
    // RFC 9113 §6.1 makes a connection error: the server answers GOAWAY PROTOCOL_ERROR.
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).unwrap();
    s.write_all(&[0, 0, 1, 0x0, 0, 0, 0, 0, 0, b'x']).unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = http_get(b.metrics_port, "/metrics");
        if body.contains(r#"baton_http2_goaway_sent_total{code="PROTOCOL_ERROR",reason="#) {
            break;
        }
        assert!(Instant::now() < deadline, "GOAWAY not counted:\n{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        b.log().contains("HTTP/2 GOAWAY sent") && b.log().contains("PROTOCOL_ERROR"),
        "GOAWAY not logged:\n{}",
        b.log()
    );
}
