//! Starting, probing, killing, restarting and stopping the servers under test: one member
//! or a 3-member cluster of etcd or Baton, on loopback, each member with its own data
//! directory.
//!
//! Everything that must be undone (the processes, the directory) is owned by a value whose
//! `Drop` undoes it, so an error, a panic or an interrupt anywhere in the benchmark never
//! leaves a server running or a data directory behind.

use std::fmt;
use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use baton_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use baton_proto::etcdserverpb::{StatusRequest, StatusResponse};
use serde::{Deserialize, Serialize};

use crate::engine;

/// How long a deployment may take from spawn to an agreed leader that answers a Range.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a server gets after SIGTERM to exit before it is killed outright.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Which implementation a server is.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
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

/// One member or three.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// One member.
    Single,
    /// Three members on loopback.
    Cluster,
}

impl Topology {
    pub fn members(self) -> usize {
        match self {
            Topology::Single => 1,
            Topology::Cluster => 3,
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Topology::Single => "single node",
            Topology::Cluster => "3 members",
        })
    }
}

/// Settings given to both servers alike.
#[derive(Clone, Debug, Serialize)]
pub struct Settings {
    pub heartbeat_ms: u64,
    pub election_ms: u64,
    /// `--snapshot-count` for both, or each server's own default.
    pub snapshot_count: Option<u64>,
    /// TLS on every port, certificates required (`--tls`); `None`: plain text.
    pub tls: Option<crate::security::TlsFiles>,
    /// Authentication on (`--auth`, `security::enable_auth`) once the deployment is ready.
    pub auth: bool,
}

/// One member process and how to start it again.
struct Member {
    name: String,
    client_port: u16,
    args: Vec<String>,
    log_path: PathBuf,
    child: Option<ChildGuard>,
}

/// A running deployment: one or three members of one kind.
///
/// Field order matters: fields drop in declaration order, so the processes are stopped
/// before their data directory is removed.
pub struct Deployment {
    pub kind: Kind,
    pub topology: Topology,
    bin: PathBuf,
    members: Vec<Member>,
    /// `http`, or `https` with `--tls`.
    scheme: &'static str,
    dir: tempfile::TempDir,
}

impl Deployment {
    /// Starts `topology` of `kind` on fresh loopback ports under a new directory in
    /// `data_root`, and waits until the members agree on a leader that answers a Range.
    pub async fn start(
        kind: Kind,
        bin: &Path,
        topology: Topology,
        data_root: &Path,
        settings: &Settings,
    ) -> Result<Deployment> {
        ensure_binary(kind, bin)?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("baton-bench-{kind}-"))
            .tempdir_in(data_root)
            .with_context(|| format!("creating a data directory in {}", data_root.display()))?;
        let n = topology.members();
        // Ports below the ephemeral range: a killed member restarts on its ports, and an
        // ephemeral port could meanwhile be taken as the source port of a peer's reconnect.
        let ports = free_ports_below_ephemeral(n * 3)?;
        let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
        let scheme = if settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let peer_url = |i: usize| format!("{scheme}://127.0.0.1:{}", ports[3 * i + 1]);
        let initial = names
            .iter()
            .enumerate()
            .map(|(i, name)| format!("{name}={}", peer_url(i)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("bench-{}-{}", std::process::id(), ports[0]);
        let mut members = Vec::with_capacity(n);
        for (i, name) in names.iter().enumerate() {
            let client_url = format!("{scheme}://127.0.0.1:{}", ports[3 * i]);
            let data = dir.path().join(name);
            let mut args: Vec<String> = Vec::new();
            if kind == Kind::Baton {
                args.push("serve".into());
            }
            let mut flag = |f: &str, v: String| {
                args.push(format!("--{f}"));
                args.push(v);
            };
            flag("name", name.clone());
            flag("data-dir", data.display().to_string());
            flag("listen-client-urls", client_url.clone());
            flag("advertise-client-urls", client_url.clone());
            flag("listen-peer-urls", peer_url(i));
            flag("initial-advertise-peer-urls", peer_url(i));
            flag("initial-cluster", initial.clone());
            flag("initial-cluster-state", "new".into());
            flag("initial-cluster-token", token.clone());
            flag("heartbeat-interval", settings.heartbeat_ms.to_string());
            flag("election-timeout", settings.election_ms.to_string());
            if let Some(count) = settings.snapshot_count {
                flag("snapshot-count", count.to_string());
            }

            if kind == Kind::Baton {
                flag(
                    "listen-metrics-urls",
                    format!("http://127.0.0.1:{}", ports[3 * i + 2]),
                );
            }
            // 1M keys of 256 B outgrow the default 2 GiB backend quota with history (etcd's
            // file and Baton's estimate alike): both get the same larger one.
            flag("quota-backend-bytes", (8u64 << 30).to_string());
            if let Some(tls) = &settings.tls {
                for (f, v) in tls.server_flags() {
                    // Boolean flags as `--flag=true`, the one form Go's flag package (etcd)
                    // and Baton's parser both take.
                    args.push(format!("--{f}={v}"));
                }
            }
            members.push(Member {
                name: name.clone(),
                client_port: ports[3 * i],
                args,
                log_path: dir.path().join(format!("{name}.log")),
                child: None,
            });
        }
        let mut deployment = Deployment {
            kind,
            topology,
            bin: bin.to_path_buf(),
            members,
            scheme,
            dir,
        };
        for i in 0..n {
            deployment.spawn(i)?;
        }
        let leader = deployment.wait_ready().await?;
        if settings.auth {
            let endpoints = deployment.endpoints();
            let token = enable_auth(&endpoints[leader]).await?;
            crate::security::set_token(&endpoints, &token);
        }
        Ok(deployment)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let kind = self.kind;
        let m = &mut self.members[i];
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log_path)
            .with_context(|| format!("opening {}", m.log_path.display()))?;
        let child = Command::new(&self.bin)
            .args(&m.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log file handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning {kind} {} ({})", m.name, self.bin.display()))?;
        m.child = Some(ChildGuard { child, kind });
        Ok(())
    }

    /// Every member's client endpoint (`http://127.0.0.1:PORT`, `https://` with `--tls`).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("{}://127.0.0.1:{}", self.scheme, m.client_port))
            .collect()
    }

    /// The process id of member `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(|c| c.child.id())
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until every running member names the same leader, which is one of them, and a
    /// Range through the leader succeeds; returns the leader's index.
    pub async fn wait_ready(&mut self) -> Result<usize> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            let last = match self.leader().await {
                Ok(i) => {
                    let ep = self.endpoints()[i].clone();
                    match crate::kv::prepare(&[ep], 16).await {
                        Ok(()) => return Ok(i),
                        Err(e) => format!("{e:#}"),
                    }
                }
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!(
                    "{} ({}) had no agreed, working leader within {READY_TIMEOUT:?} (last: {last})\n{}",
                    self.kind,
                    self.topology,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every running member reports the same revision (Maintenance.Status): with
    /// no writes in flight, a restarted member has then caught up with the others.
    pub async fn wait_caught_up(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            let mut revisions = Vec::new();
            for (i, ep) in self.endpoints().iter().enumerate() {
                if self.members[i].child.is_none() {
                    continue;
                }
                match member_status(ep).await {
                    Ok(s) => revisions.push(s.header.map_or(0, |h| h.revision)),
                    Err(_) => revisions.push(-1),
                }
            }
            if revisions.iter().all(|&r| r >= 0 && r == revisions[0]) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} ({}) members did not converge within {READY_TIMEOUT:?} (revisions {revisions:?})",
                    self.kind,
                    self.topology
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The index of the member every running member names as leader (Maintenance.Status).
    pub async fn leader(&self) -> Result<usize> {
        let mut ids = Vec::new();
        let mut leaders = Vec::new();
        for (i, ep) in self.endpoints().iter().enumerate() {
            if self.members[i].child.is_none() {
                continue;
            }
            let s = member_status(ep).await?;
            ids.push((i, s.header.map_or(0, |h| h.member_id)));
            leaders.push(s.leader);
        }
        let leader = *leaders.first().context("no member runs")?;
        if leader == 0 || leaders.iter().any(|&l| l != leader) {
            bail!("no agreed leader yet: {leaders:x?}");
        }
        ids.iter()
            .find(|(_, id)| *id == leader)
            .map(|(i, _)| *i)
            .context("the leader is not a running member")
    }

    /// kill -9 of member `i`; returns when it was sent.
    pub fn kill9(&mut self, i: usize) -> Instant {
        let at = Instant::now();
        if let Some(mut guard) = self.members[i].child.take() {
            let _ = guard.child.kill();
            let _ = guard.child.wait();
        }
        at
    }

    /// Starts member `i` again on its ports and data directory.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.spawn(i)
    }

    /// Fails if a member that should run has exited, with the tail of its log.
    pub fn check_alive(&mut self) -> Result<()> {
        for m in &mut self.members {
            if let Some(guard) = &mut m.child {
                if let Some(status) = guard.child.try_wait().context("checking on a member")? {
                    let tail = tail(&m.log_path);
                    bail!("{} {} exited ({status})\n{tail}", self.kind, m.name);
                }
            }
        }
        Ok(())
    }

    /// Copies every member's log into `dest` (created), so a run that went wrong can be
    /// investigated after the deployment and its data directory are gone.
    pub fn save_logs(&self, dest: &Path) -> Result<()> {
        std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        for m in &self.members {
            let to = dest.join(format!("{}-{}.log", self.kind, m.name));
            std::fs::copy(&m.log_path, &to)
                .with_context(|| format!("copying {} to {}", m.log_path.display(), to.display()))?;
        }
        Ok(())
    }

    fn log_tail(&self) -> String {
        self.members
            .iter()
            .map(|m| tail(&m.log_path))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Maintenance.Status of one member, within 2 s (1 s to connect).
async fn member_status(ep: &str) -> Result<StatusResponse> {
    let status = async {
        let ch = engine::channel(ep, Duration::from_secs(1)).await?;
        let s = MaintenanceClient::new(ch)
            .status(StatusRequest {})
            .await?
            .into_inner();
        Ok::<_, anyhow::Error>(s)
    };
    tokio::time::timeout(Duration::from_secs(2), status)
        .await
        .map_err(|_| anyhow::anyhow!("Status of {ep} timed out"))?
        .with_context(|| format!("Status of {ep}"))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(15)..].join("\n");
    format!("last lines of {}:\n{tail}", path.display())
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

/// `n` distinct free loopback ports below Linux's ephemeral range (32768+). All listeners are
/// held until every port is chosen so none is handed out twice.
fn free_ports_below_ephemeral(n: usize) -> Result<Vec<u16>> {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let mut held = Vec::with_capacity(n);
    let mut tries = 0;
    while held.len() < n {
        tries += 1;
        if tries > 10_000 {
            bail!("no free loopback ports in 20000..32000");
        }
        let port: u16 = rng.gen_range(20_000..32_000);
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    held.iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect::<Result<Vec<u16>>>()
}

/// `--auth`: the user the bench's key-value clients are, and its password. Not root: a
/// user whose role grants read-write on every key, so each request takes the permission
/// check a real application's does.
pub const AUTH_USER: &str = "bench";
const AUTH_PASSWORD: &str = "bench-password";
const ROOT_PASSWORD: &str = "bench-root-password";

/// Turns authentication on at `endpoint` with etcd's API alone, identically for etcd and
/// Baton: a root user with the root role, a role `bench` with read-write on every key
/// (from-key ""), the user [`AUTH_USER`] with it; then authenticates as that user and
/// returns the token.
pub async fn enable_auth(endpoint: &str) -> Result<String> {
    use baton_proto::authpb::{permission::Type as PermType, Permission};
    use baton_proto::etcdserverpb::auth_client::AuthClient;
    use baton_proto::etcdserverpb::{
        AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest, AuthenticateRequest,
    };

    let ch = crate::engine::channel(endpoint, crate::engine::REQUEST_TIMEOUT).await?;
    let mut auth = AuthClient::new(ch);
    let user = |name: &str, password: &str| AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        ..Default::default()
    };
    auth.user_add(user("root", ROOT_PASSWORD))
        .await
        .context("adding user root")?;
    auth.user_grant_role(AuthUserGrantRoleRequest {
        user: "root".into(),
        role: "root".into(),
    })
    .await
    .context("granting root the root role")?;
    auth.role_add(AuthRoleAddRequest {
        name: AUTH_USER.into(),
    })
    .await
    .context("adding the bench role")?;
    auth.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: AUTH_USER.into(),
        perm: Some(Permission {
            perm_type: PermType::Readwrite as i32,
            key: vec![0],
            range_end: vec![0],
        }),
    })
    .await
    .context("granting the bench role every key")?;
    auth.user_add(user(AUTH_USER, AUTH_PASSWORD))
        .await
        .context("adding the bench user")?;
    auth.user_grant_role(AuthUserGrantRoleRequest {
        user: AUTH_USER.into(),
        role: AUTH_USER.into(),
    })
    .await
    .context("granting the bench user its role")?;
    auth.auth_enable(AuthEnableRequest {})
        .await
        .context("enabling authentication")?;
    let token = auth
        .authenticate(AuthenticateRequest {
            name: AUTH_USER.into(),
            password: AUTH_PASSWORD.into(),
        })
        .await
        .context("authenticating as the bench user")?
        .into_inner()
        .token;
    Ok(token)
}
