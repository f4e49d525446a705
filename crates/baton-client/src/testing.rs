//! Test support (not part of the API; hidden from the docs): real servers on loopback
//! ports for the doc examples and the integration tests, and a TCP proxy that can stall a
//! connection.
//!
//! The Baton server is `target/debug/baton` (run `cargo build -p baton` first; `cargo
//! test --workspace` builds it anyway); override with `BATON_BIN`. etcd is Debian's
//! `/usr/bin/etcd` (package `etcd-server`); override with `ETCD_BIN`. A missing binary is
//! a test failure with a clear message, never a silent skip.
//!
//! Each server runs under a tiny `sh` supervisor reading our pipe: when this process exits
//! (even by a panic or SIGKILL) the pipe closes and the supervisor kills the server and
//! removes its data directory, so no server outlives its test binary.

use std::future::Future;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Which server to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `baton serve`.
    Baton,
    /// etcd 3.4.
    Etcd,
}

/// A free loopback port (bound, then released: a small race, acceptable in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("local addr")
        .port()
}

/// The `baton` binary: `$BATON_BIN`, else `<target dir>/debug/baton`.
pub fn baton_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("BATON_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("debug").join("baton")
}

/// The etcd binary: `$ETCD_BIN`, else `/usr/bin/etcd`.
pub fn etcd_binary() -> PathBuf {
    std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"))
}

/// A running server.
pub struct TestServer {
    /// What it is.
    pub flavor: Flavor,
    /// Its client port on 127.0.0.1.
    pub port: u16,
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TestServer({:?} on {})", self.flavor, self.port)
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl TestServer {
    /// Starts a server on fresh ports with a fresh data directory and waits until it
    /// serves. Panics (with the reason) if the binary is missing or it does not come up.
    pub fn start(flavor: Flavor) -> TestServer {
        // Ports are picked free but may be taken by someone else before the server binds
        // them; then it exits at once and we try again with new ones.
        for _ in 0..4 {
            match Self::try_start(flavor) {
                Ok(s) => return s,
                Err(log) if log.contains("in use") => continue,
                Err(log) => panic!("{flavor:?} exited early; log:\n{log}"),
            }
        }
        panic!("{flavor:?}: could not find free ports")
    }

    fn try_start(flavor: Flavor) -> Result<TestServer, String> {
        let dir = std::env::temp_dir().join(format!(
            "baton-client-test-{}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).expect("create the test data directory");
        let port = free_port();
        let peer = free_port();
        let url = |p: u16| format!("http://127.0.0.1:{p}");
        let (bin, args): (PathBuf, Vec<String>) = match flavor {
            Flavor::Baton => {
                let bin = baton_binary();
                assert!(
                    bin.exists(),
                    "{} is missing: run `cargo build -p baton` first (or set BATON_BIN); \
                     `cargo test --workspace` builds it",
                    bin.display()
                );
                let args = vec![
                    "serve".into(),
                    "--data-dir".into(),
                    dir.join("data").display().to_string(),
                    "--listen-client-urls".into(),
                    url(port),
                    "--listen-metrics-urls".into(),
                    url(free_port()),
                    "--listen-peer-urls".into(),
                    url(peer),
                ];
                (bin, args)
            }
            Flavor::Etcd => {
                let bin = etcd_binary();
                assert!(
                    bin.exists(),
                    "{} is missing: install Debian's etcd-server (scripts/install-deps does), \
                     or set ETCD_BIN",
                    bin.display()
                );
                let args = vec![
                    "--name".into(),
                    "default".into(),
                    "--data-dir".into(),
                    dir.join("data").display().to_string(),
                    "--listen-client-urls".into(),
                    url(port),
                    "--advertise-client-urls".into(),
                    url(port),
                    "--listen-peer-urls".into(),
                    url(peer),
                    "--initial-advertise-peer-urls".into(),
                    url(peer),
                    "--initial-cluster".into(),
                    format!("default={}", url(peer)),
                ];
                (bin, args)
            }
        };
        let log = std::fs::File::create(dir.join("log")).expect("create the log file");
        // The supervisor: run the server, wait for our pipe to close, kill it, clean up.
        // It exits with the server, so an early death shows; the reader cleans up.
        // (Background jobs get /dev/null as stdin unless told otherwise, hence fd 3.)
        let script = r#"exec 3<&0
"$@" </dev/null & pid=$!
( read _ignored <&3; kill -9 $pid 2>/dev/null; sleep 0.2; rm -rf "$BATON_TEST_DIR" ) &
exec 3<&-
wait $pid"#;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&bin)
            .args(&args)
            .env("BATON_TEST_DIR", &dir)
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stdin = child.stdin.take();
        let mut server = TestServer {
            flavor,
            port,
            child,
            stdin,
            dir,
        };
        server.wait_ready(Duration::from_secs(30))?;
        Ok(server)
    }

    /// Waits until the server serves; `Err(log)` if it exited first.
    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let listening = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
            let ready = match self.flavor {
                // Our own server's word, not just any listener on the port.
                Flavor::Baton => listening && self.log().contains("INFO baton_server: serving"),
                // etcd accepts connections before it has elected itself.
                Flavor::Etcd => listening && self.log().contains("ready to serve client requests"),
            };
            if ready {
                return Ok(());
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return Err(self.log());
            }
            if Instant::now() > deadline {
                panic!(
                    "{:?} not ready within {timeout:?}; log:\n{}",
                    self.flavor,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.join("log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Closing the pipe tells the supervisor to kill the server and clean up.
        drop(self.stdin.take());
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a Baton server, runs `f(endpoint)` on a fresh multi-threaded runtime, and panics
/// if it fails: the harness of the doc examples.
pub fn doctest<F, Fut>(f: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), crate::Error>>,
{
    let server = TestServer::start(Flavor::Baton);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let r = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), f(server.endpoint()))
            .await
            .expect("doc example timed out")
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    if let Err(e) = r {
        panic!("doc example failed: {e}\nserver log:\n{}", server.log());
    }
}

/// A TCP proxy on loopback that forwards to `upstream` and can be made to stall: while
/// paused, no byte moves in either direction on any connection (they stay open, as in a
/// network partition that drops nothing yet delivers nothing), and new connections are
/// accepted but not forwarded.
pub struct Proxy {
    port: u16,
    paused: Arc<watch::Sender<bool>>,
    cuts: Arc<watch::Sender<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts forwarding from a fresh port to `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("addr").port();
        let (tx, _) = watch::channel(false);
        let paused = Arc::new(tx);
        let p = paused.clone();
        let (cut_tx, _) = watch::channel(0u64);
        let cuts = Arc::new(cut_tx);
        let c = cuts.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let _ = down.set_nodelay(true);
                let upstream = upstream.clone();
                let gate = p.subscribe();
                let cut = c.subscribe();
                tokio::spawn(async move {
                    let mut g = gate.clone();
                    if g.wait_for(|paused| !paused).await.is_err() {
                        return;
                    }
                    let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = up.set_nodelay(true);
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::spawn(pump(dr, uw, gate.clone(), cut.clone()));
                    tokio::spawn(pump(ur, dw, gate, cut));
                });
            }
        });
        Proxy {
            port,
            paused,
            cuts,
            task,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops all traffic (connections stay open).
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Lets traffic flow again (what was held is delivered late).
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Closes every current connection (both sides see the TCP connection end); new ones
    /// are forwarded as usual.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    gate: watch::Receiver<bool>,
    mut cut: watch::Receiver<u64>,
) {
    cut.mark_unchanged();
    tokio::select! {
        _ = forward(from, to, gate) => {}
        _ = cut.changed() => {}
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if gate.wait_for(|paused| !paused).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
