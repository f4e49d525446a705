//! Starting, probing and stopping the two servers under test.
//!
//! Each server is a child process with its own temporary data directory and its own loopback
//! ports. Everything that must be undone (the process, the directory) is owned by a value whose
//! `Drop` undoes it, so an error, a panic or an interrupt anywhere in the benchmark never leaves a
//! server running or a data directory behind.

use std::fmt;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, ConnectOptions};
use serde::Serialize;

/// How long a server may take from spawn to answering its first Range. etcd 3.4 elects itself
/// leader after about one election timeout (1 s); Baton is similar. 30 s leaves room for a
/// loaded machine without making a broken binary hang the run for long.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a server gets after SIGTERM to exit before it is killed outright.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Which implementation a server is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Etcd,
    Baton,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Etcd => "etcd",
            Kind::Baton => "baton",
        })
    }
}

/// A running server: its endpoint, where its log goes, and the guards that stop it.
///
/// Field order matters: fields drop in declaration order, so the process is stopped before its
/// data directory is removed.
pub struct Server {
    pub kind: Kind,
    /// `127.0.0.1:PORT` of the etcd v3 gRPC API.
    pub endpoint: String,
    log_path: PathBuf,
    child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts etcd the way a single-member etcd 3.4 is usually started (fsync on, the
    /// default), on fresh loopback ports, and waits until it answers a Range.
    pub async fn start_etcd(bin: &Path, data_root: Option<&Path>) -> Result<Server> {
        ensure_binary(Kind::Etcd, bin)?;
        let dir = temp_dir("baton-bench-etcd-", data_root)?;
        let [client, peer] = free_ports()?;
        let peer_url = format!("http://127.0.0.1:{peer}");
        let client_url = format!("http://127.0.0.1:{client}");
        let mut cmd = Command::new(bin);
        cmd.arg("--name")
            .arg("default")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(format!("default={peer_url}"));
        Server::spawn(Kind::Etcd, cmd, dir, client).await
    }

    /// Starts `baton serve` on fresh loopback ports and waits until it answers a Range.
    pub async fn start_baton(bin: &Path, data_root: Option<&Path>) -> Result<Server> {
        ensure_binary(Kind::Baton, bin)?;
        let dir = temp_dir("baton-bench-baton-", data_root)?;
        let [client, metrics, peer] = free_ports()?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen-client-urls")
            .arg(format!("http://127.0.0.1:{client}"))
            .arg("--listen-metrics-urls")
            .arg(format!("http://127.0.0.1:{metrics}"))
            .arg("--listen-peer-urls")
            .arg(format!("http://127.0.0.1:{peer}"));
        Server::spawn(Kind::Baton, cmd, dir, client).await
    }

    async fn spawn(
        kind: Kind,
        mut cmd: Command,
        dir: tempfile::TempDir,
        port: u16,
    ) -> Result<Self> {
        // Server logs go to a file rather than our terminal: they would drown the progress
        // lines, and when startup fails their tail is what explains it.
        let log_path = dir.path().join(format!("{kind}.log"));
        let log =
            File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log file handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {kind} ({:?})", cmd.get_program()))?;
        let mut server = Server {
            kind,
            endpoint: format!("127.0.0.1:{port}"),
            log_path,
            child: ChildGuard { child, kind },
            _dir: dir,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    /// Waits until the server accepts TCP and then answers a Range. A listening socket alone
    /// is not enough: both servers listen before they have elected themselves leader, and a
    /// benchmark that starts then would measure the election.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_error = String::from("never tried");
        while Instant::now() < deadline {
            self.check_alive()?;
            match self.probe().await {
                Ok(()) => return Ok(()),
                Err(e) => last_error = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "{} at {} was not ready within {:?} (last error: {last_error})\n{}",
            self.kind,
            self.endpoint,
            READY_TIMEOUT,
            self.log_tail()
        )
    }

    async fn probe(&self) -> Result<()> {
        tokio::net::TcpStream::connect(&self.endpoint)
            .await
            .context("TCP connect")?;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(2));
        let mut client = Client::connect([self.endpoint.as_str()], Some(options))
            .await
            .context("gRPC connect")?;
        client
            .get("baton-bench/ready", None)
            .await
            .context("Range")?;
        Ok(())
    }

    /// Fails if the process has exited, with the tail of its log: a server that died in the
    /// middle of a run would otherwise show up only as a wall of request errors.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self
            .child
            .child
            .try_wait()
            .with_context(|| format!("checking on {}", self.kind))?
        {
            bail!("{} exited ({status})\n{}", self.kind, self.log_tail());
        }
        Ok(())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("last lines of {}:\n{tail}", self.log_path.display())
    }
}

/// Owns a child process and stops it when dropped: SIGTERM first, so the server can close its
/// files the way it would in production, then SIGKILL if it lingers.
struct ChildGuard {
    child: Child,
    kind: Kind,
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // std offers only SIGKILL; `kill -TERM` avoids a libc dependency for one call.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{} did not exit within {STOP_GRACE:?} of SIGTERM; killing it",
            self.kind
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fails with a message that says how to get the binary, rather than a bare ENOENT from spawn.
pub fn ensure_binary(kind: Kind, bin: &Path) -> Result<()> {
    if bin.is_file() {
        return Ok(());
    }
    let how = match kind {
        Kind::Etcd => {
            "Install Debian's etcd-server 3.4 (`apt-get install etcd-server`) or pass --etcd-bin."
        }
        Kind::Baton => "Build it with `cargo build --release -p baton` or pass --baton-bin.",
    };
    bail!("{kind} binary {} not found. {how}", bin.display())
}

fn temp_dir(prefix: &str, root: Option<&Path>) -> Result<tempfile::TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    match root {
        Some(root) => builder
            .tempdir_in(root)
            .with_context(|| format!("creating a data directory in {}", root.display())),
        None => builder.tempdir().context("creating a data directory"),
    }
}

/// `N` distinct free loopback ports. All listeners are held until every port is chosen so the
/// kernel cannot hand out the same port twice; the race with other programs between releasing
/// them and the server binding them is tiny and only ever makes startup fail loudly.
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").context("binding an ephemeral loopback port"))
        .collect::<Result<Vec<_>>>()?;
    let mut ports = [0u16; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}
