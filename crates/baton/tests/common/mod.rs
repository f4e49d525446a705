//! Helpers shared by the process-level tests: start real `baton serve` (and etcd) processes
//! on loopback ports with their own data directories.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound then released; the tiny race is acceptable in tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .unwrap()
        .port()
}

/// A running `baton serve` process.
pub struct Baton {
    pub child: Option<Child>,
    pub data_dir: PathBuf,
    pub client_port: u16,
    pub metrics_port: u16,
    pub peer_port: u16,
}

impl Baton {
    /// Starts a member on fresh ports with `data_dir` and waits until it serves.
    pub fn start(data_dir: &Path) -> Baton {
        let mut b = Baton {
            child: None,
            data_dir: data_dir.to_path_buf(),
            client_port: free_port(),
            metrics_port: free_port(),
            peer_port: free_port(),
        };
        b.spawn();
        b
    }

    /// Starts (again) on the same ports and data directory.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data_dir.with_extension("log"))
            .expect("open log file");
        let child = Command::new(env!("CARGO_BIN_EXE_baton"))
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{}", self.client_port))
            .arg("--listen-metrics-urls")
            .arg(format!("http://127.0.0.1:{}", self.metrics_port))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{}", self.peer_port))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn baton serve");
        self.child = Some(child);
        wait_for_port(self.client_port, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("baton did not listen; log: {}", self.log()));
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// kill -9: no chance to flush anything that was not already durable.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(c.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("baton did not exit within 10 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A running etcd 3.4 (Debian's `etcd-server`) for side-by-side comparisons.
pub struct Etcd {
    pub child: Child,
    pub client_port: u16,
    _dir: tempfile::TempDir,
}

impl Etcd {
    pub fn start() -> Etcd {
        let bin = "/usr/bin/etcd";
        assert!(
            Path::new(bin).exists(),
            "{bin} is missing: install Debian's etcd-server (.ci/run does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let client_port = free_port();
        let peer_port = free_port();
        let child = Command::new(bin)
            .arg("--name")
            .arg("default")
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{client_port}"))
            .arg("--advertise-client-urls")
            .arg(format!("http://127.0.0.1:{client_port}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{peer_port}"))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://127.0.0.1:{peer_port}"))
            .arg("--initial-cluster")
            .arg(format!("default=http://127.0.0.1:{peer_port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        wait_for_port(client_port, Duration::from_secs(20)).expect("etcd did not listen");
        Etcd {
            child,
            client_port,
            _dir: dir,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until something accepts TCP connections on the loopback port.
pub fn wait_for_port(port: u16, timeout: Duration) -> Option<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    None
}

/// Output of one etcdctl run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs Debian's `etcdctl` (API v3) against `endpoint`.
pub fn etcdctl(endpoint: &str, args: &[&str], stdin: Option<&str>) -> Out {
    use std::io::Write;
    let bin = "/usr/bin/etcdctl";
    assert!(
        Path::new(bin).exists(),
        "{bin} is missing: install Debian's etcd-client (.ci/run does)"
    );
    let mut child = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=10s")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn etcdctl");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
