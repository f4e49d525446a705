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
    /// Extra `baton serve` flags, kept across restarts.
    pub extra_args: Vec<String>,
    /// `ulimit -n` of the server process (None: inherited).
    pub nofile_limit: Option<u64>,
    /// `--listen-client-urls` with `{port}` for the client port (None: plain http).
    pub client_urls: Option<String>,
    /// The peer URL's scheme: `http` (plain) or `https` (peer TLS, with the `--peer-*`
    /// flags among `extra_args`).
    pub peer_scheme: &'static str,
}

impl Baton {
    /// Starts a member on fresh ports with `data_dir` and waits until it serves.
    pub fn start(data_dir: &Path) -> Baton {
        Baton::start_with(data_dir, &[])
    }

    /// Like [`Baton::start`], with extra `baton serve` flags. If a port was taken between
    /// choosing it and the server binding it (another process on this machine may listen on
    /// any free port meanwhile), starts again on fresh ports.
    pub fn start_with(data_dir: &Path, extra_args: &[&str]) -> Baton {
        Baton::start_limited(data_dir, extra_args, None)
    }

    /// Like [`Baton::start_with`], with the server's descriptor limit (`ulimit -n`) set.
    pub fn start_limited(data_dir: &Path, extra_args: &[&str], nofile_limit: Option<u64>) -> Baton {
        Baton::start_full(data_dir, extra_args, nofile_limit, None)
    }

    /// Like [`Baton::start_with`], serving the client port on `client_urls` (`{port}`
    /// stands for the port), e.g. `https://127.0.0.1:{port}`.
    pub fn start_on(data_dir: &Path, client_urls: &str, extra_args: &[&str]) -> Baton {
        Baton::start_full(data_dir, extra_args, None, Some(client_urls.to_string()))
    }

    fn start_full(
        data_dir: &Path,
        extra_args: &[&str],
        nofile_limit: Option<u64>,
        client_urls: Option<String>,
    ) -> Baton {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut b = Baton {
                child: None,
                data_dir: data_dir.to_path_buf(),
                client_port: free_port_below_ephemeral(),
                metrics_port: free_port_below_ephemeral(),
                peer_port: free_port_below_ephemeral(),
                extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
                nofile_limit,
                client_urls: client_urls.clone(),
                peer_scheme: "http",
            };
            match b.try_spawn() {
                Ok(()) => return b,
                Err(log) if attempt < 3 && log.contains("Address already in use") => {
                    let _ = std::fs::remove_dir_all(data_dir);
                    continue;
                }
                Err(log) => panic!("baton did not start serving; log: {log}"),
            }
        }
    }

    /// Starts (again) on the same ports and data directory.
    pub fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("baton did not start serving; log: {log}");
        }
    }

    /// Spawns `baton serve` and waits until *this* process serves its client port: its log
    /// says so and the port accepts. A connect alone could reach some other process that
    /// briefly listens on the port; then the server itself fails to bind and exits, and the
    /// test would go on against nothing. Err(log) if it exits or does not serve in 20 s.
    fn try_spawn(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "already running");
        let log_path = self.data_dir.with_extension("log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open log file");
        // The log is appended to across restarts: only what this run writes counts.
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0) as usize;
        let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
        if let Some(limit) = self.nofile_limit {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(match &self.client_urls {
                Some(urls) => urls.replace("{port}", &self.client_port.to_string()),
                None => format!("http://127.0.0.1:{}", self.client_port),
            })
            .arg("--listen-metrics-urls")
            .arg(format!("http://127.0.0.1:{}", self.metrics_port))
            .arg("--listen-peer-urls")
            .arg(format!(
                "{}://127.0.0.1:{}",
                self.peer_scheme, self.peer_port
            ))
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn baton serve");
        self.child = Some(child);
        let serving = format!("serving client=[127.0.0.1:{}]", self.client_port);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let exited = self
                .child
                .as_mut()
                .expect("just spawned")
                .try_wait()
                .expect("check on baton serve")
                .is_some();
            let text = std::fs::read(&log_path).unwrap_or_default();
            let ours = String::from_utf8_lossy(text.get(log_start..).unwrap_or_default());
            if exited {
                self.child = None;
                return Err(ours.into_owned());
            }
            if ours.contains(&serving)
                && std::net::TcpStream::connect(("127.0.0.1", self.client_port)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(ours.into_owned());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
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

/// A free loopback port below Linux's ephemeral range (32768+), never handed out twice in
/// this test process. Members that are killed and restarted on their ports need both: while a
/// member is down its peers keep reconnecting to its port, and a port inside the ephemeral
/// range can meanwhile be taken as the source port of some outgoing connection (even a TCP
/// self-connect to that very port); and a test running in parallel that picks ports while the
/// member is down would find its ports free and take them (seen in CI: a restarted member
/// failed with "Address already in use").
pub fn free_port_below_ephemeral() -> u16 {
    use rand::Rng;
    use std::collections::HashSet;
    use std::sync::Mutex;
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut rng = rand::thread_rng();
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    loop {
        let port = rng.gen_range(20_000..32_000);
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
}

/// Members of one multi-member cluster on loopback, each a `baton serve` process with its own
/// data directory (`dir/<name>`) and log (`dir/<name>.log`).
pub struct Cluster {
    /// The `--initial-cluster-token` every member was given.
    pub token: String,
    pub members: Vec<Baton>,
    pub names: Vec<String>,
}

impl Cluster {
    /// Starts `n` members named `m1..mN` as a new cluster (every member gets the same
    /// `--initial-cluster` and a token unique to this cluster), with `extra_args` for each.
    /// Returns once every member listens on its client port (not once a leader is elected).
    pub fn start(dir: &Path, n: usize, extra_args: &[&str]) -> Cluster {
        Cluster::start_with_peer_scheme(dir, n, "http", extra_args)
    }

    /// [`Cluster::start`] with `https` peer URLs when `peer_scheme` says so (the peer TLS
    /// flags go in `extra_args`).
    pub fn start_with_peer_scheme(
        dir: &Path,
        n: usize,
        peer_scheme: &'static str,
        extra_args: &[&str],
    ) -> Cluster {
        let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
        let peer_ports: Vec<u16> = (0..n).map(|_| free_port_below_ephemeral()).collect();
        let initial = names
            .iter()
            .zip(&peer_ports)
            .map(|(name, port)| format!("{name}={peer_scheme}://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("test-{:016x}", rand::random::<u64>());
        let mut members: Vec<Baton> = names
            .iter()
            .zip(&peer_ports)
            .map(|(name, port)| {
                let mut args: Vec<String> = vec![
                    "--name".into(),
                    name.clone(),
                    "--initial-cluster".into(),
                    initial.clone(),
                    "--initial-cluster-token".into(),
                    token.clone(),
                ];
                args.extend(extra_args.iter().map(|a| a.to_string()));
                Baton {
                    child: None,
                    data_dir: dir.join(name),
                    client_port: free_port_below_ephemeral(),
                    metrics_port: free_port_below_ephemeral(),
                    peer_port: *port,
                    extra_args: args,
                    nofile_limit: None,
                    client_urls: None,
                    peer_scheme,
                }
            })
            .collect();
        // Start all before waiting for any: a member serves its client port without a leader,
        // but starting them together is what a real deployment does.
        for m in &mut members {
            m.spawn();
        }
        Cluster {
            token,
            members,
            names,
        }
    }

    /// Every member's client endpoint (`127.0.0.1:port`), comma-separated, for etcdctl.
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.endpoint())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every member's log, for failure messages.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .zip(&self.names)
            .map(|(m, n)| format!("===== {n} =====\n{}", m.log()))
            .collect()
    }
}

/// A running etcd 3.4 (Debian's `etcd-server`) for side-by-side comparisons.
pub struct Etcd {
    pub child: Child,
    pub client_port: u16,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts etcd on fresh ports (see [`start_etcd`]). The ports come from below the
    /// ephemeral range, as [`Baton`]'s do, so no outgoing connection takes one as its source
    /// port meanwhile.
    pub fn start() -> Etcd {
        let dir = tempfile::tempdir().unwrap();
        let (child, client_port) = start_etcd(
            "default",
            &dir.path().join("etcd"),
            free_port_below_ephemeral,
            "etcd",
        );
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

/// Starts Debian's etcd 3.4 as the single member `name` over `data_dir`, on a fresh client
/// port and the peer port `peer_port` gives, and waits until it listens; returns it and its
/// client port. Tried up to three times: ports are picked before etcd binds them, and
/// another process of the test run can take one in between (seen in CI: etcd exited at
/// once). etcd binds its listeners before it opens the data directory, so a failed attempt
/// leaves `data_dir` as it was — a restored one included. `what` names it in messages.
pub fn start_etcd(
    name: &str,
    data_dir: &Path,
    peer_port: impl Fn() -> u16,
    what: &str,
) -> (Child, u16) {
    let bin = "/usr/bin/etcd";
    assert!(
        Path::new(bin).exists(),
        "{bin} is missing: install Debian's etcd-server (.ci/run does)"
    );
    for attempt in 1..=3 {
        let client = free_port_below_ephemeral();
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{}", peer_port());
        let mut child = Command::new(bin)
            .args(["--name", name, "--data-dir"])
            .arg(data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("{name}={peer_url}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        if wait_for_child_port(&mut child, client, Duration::from_secs(20)) {
            return (child, client);
        }
        let _ = child.kill();
        let _ = child.wait();
        eprintln!("{what} did not listen on {client} (attempt {attempt} of 3)");
    }
    panic!("{what} did not listen in 3 attempts");
}

/// Waits until `child` accepts TCP connections on the loopback port; false if it exits
/// first (another process had the port) or `timeout` passes. Checking that the child is
/// still running matters: a connect alone could reach whoever took the port.
pub fn wait_for_child_port(child: &mut Child, port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return matches!(child.try_wait(), Ok(None));
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
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

/// A `baton` subcommand (the binary under test) ready to be given arguments.
pub fn baton_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_baton"))
}

/// Sends `signal` to `pid` (negative: to a process group).
pub fn kill(pid: i32, signal: i32) {
    // SAFETY: plain syscall; errors (already gone) are irrelevant to the tests.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Every live descendant of `pid` (children, grandchildren, …), from /proc.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // "pid (comm) state ppid …"; comm may contain spaces and parentheses.
            let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, pp) in &parent_of {
            if pp == parent && !found.contains(&p) {
                found.push(p);
                frontier.push(p);
            }
        }
    }
    found
}

/// A long-running process with its stdout and stderr collected as they arrive, so a test
/// can wait for a line, signal it, and read everything it said when something fails.
/// Dropping it kills the process and everything it started.
pub struct Proc {
    pub name: String,
    child: Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
    err: std::sync::Arc<std::sync::Mutex<String>>,
    status: Option<std::process::ExitStatus>,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        use std::io::Read;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let collect = |mut pipe: Box<dyn Read + Send>| {
            let buf = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let b = buf.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    b.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            });
            buf
        };
        let out = collect(Box::new(child.stdout.take().unwrap()));
        let err = collect(Box::new(child.stderr.take().unwrap()));
        Proc {
            name: name.to_string(),
            child,
            out,
            err,
            status: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> String {
        self.err.lock().unwrap().clone()
    }

    /// Everything the process said, for failure messages.
    pub fn said(&self) -> String {
        format!(
            "[{}] stdout:\n{}\n[{}] stderr:\n{}",
            self.name,
            self.stdout(),
            self.name,
            self.stderr()
        )
    }

    pub fn signal(&self, signal: i32) {
        kill(self.pid(), signal);
    }

    /// Waits until stdout contains `needle`; panics with the output after `timeout`.
    pub fn expect_stdout(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.stdout().contains(needle) {
            if Instant::now() > deadline {
                panic!(
                    "{}: {needle:?} not on stdout within {timeout:?}\n{}",
                    self.name,
                    self.said()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exit status if the process has exited.
    pub fn try_status(&mut self) -> Option<std::process::ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    /// Waits for the exit; panics with the output after `timeout`. Returns the shell-style
    /// code (128 + N for a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        use std::os::unix::process::ExitStatusExt;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_status() {
                // Give the reader threads a moment to drain the pipes.
                std::thread::sleep(Duration::from_millis(20));
                return st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: still running after {timeout:?}\n{}",
                    self.name,
                    self.said()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_status().is_none() {
            let family = descendants(self.pid());
            let _ = self.child.kill();
            for p in family {
                kill(p, libc::SIGKILL);
            }
            let _ = self.child.wait();
        }
    }
}

/// `etcdctl` (API v3) aimed at `endpoint`, for long-running commands used with [`Proc`].
pub fn etcdctl_cmd(endpoint: &str) -> Command {
    let bin = "/usr/bin/etcdctl";
    assert!(
        Path::new(bin).exists(),
        "{bin} is missing: install Debian's etcd-client (.ci/run does)"
    );
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"));
    cmd
}

/// A gRPC connection to a member over its own HTTP/2 connection.
pub async fn channel(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {endpoint}: {e}"))
}

/// Blocking wrappers for the few RPCs the process-level tests make from outside (inspect a
/// lock, revoke a lease, force-release), so those tests can stay plain threads.
pub struct Rpc {
    rt: tokio::runtime::Runtime,
    ch: tonic::transport::Channel,
}

impl Rpc {
    pub fn connect(endpoint: &str) -> Rpc {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ch = rt.block_on(channel(endpoint));
        Rpc { rt, ch }
    }

    pub fn inspect(&self, name: &str) -> baton_proto::baton::v1::InspectResponse {
        use baton_proto::baton::v1::{lock_client::LockClient, InspectRequest};
        let mut c = LockClient::new(self.ch.clone());
        self.rt
            .block_on(c.inspect(InspectRequest {
                name: name.as_bytes().to_vec(),
            }))
            .unwrap_or_else(|s| panic!("Inspect({name}): {s:?}"))
            .into_inner()
    }

    pub fn force_release(&self, name: &str, reason: &str) {
        use baton_proto::baton::v1::{lock_client::LockClient, ForceReleaseRequest};
        let mut c = LockClient::new(self.ch.clone());
        self.rt
            .block_on(c.force_release(ForceReleaseRequest {
                name: name.as_bytes().to_vec(),
                reason: reason.to_string(),
                fencing_token: 0,
            }))
            .unwrap_or_else(|s| panic!("ForceRelease({name}): {s:?}"));
    }

    pub fn revoke(&self, lease: i64) {
        use baton_proto::etcdserverpb::{lease_client::LeaseClient, LeaseRevokeRequest};
        let mut c = LeaseClient::new(self.ch.clone());
        self.rt
            .block_on(c.lease_revoke(LeaseRevokeRequest { id: lease }))
            .unwrap_or_else(|s| panic!("LeaseRevoke({lease:x}): {s:?}"));
    }

    /// The lease's remaining TTL in seconds; -1 if it does not exist (any more).
    pub fn lease_ttl(&self, lease: i64) -> i64 {
        use baton_proto::etcdserverpb::{lease_client::LeaseClient, LeaseTimeToLiveRequest};
        let mut c = LeaseClient::new(self.ch.clone());
        self.rt
            .block_on(c.lease_time_to_live(LeaseTimeToLiveRequest {
                id: lease,
                keys: false,
            }))
            .unwrap_or_else(|s| panic!("LeaseTimeToLive({lease:x}): {s:?}"))
            .into_inner()
            .ttl
    }

    /// Keys under `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        use baton_proto::etcdserverpb::{kv_client::KvClient, RangeRequest};
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let mut c = KvClient::new(self.ch.clone());
        self.rt
            .block_on(c.range(RangeRequest {
                key: prefix.as_bytes().to_vec(),
                range_end: end,
                keys_only: true,
                ..Default::default()
            }))
            .unwrap()
            .into_inner()
            .kvs
            .into_iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect()
    }
}

/// Runs `baton ARGS` (a client command) against `endpoint` (given as `BATON_ENDPOINTS`, so
/// it works for every command shape), with `stdin` piped in if given.
pub fn baton(endpoint: &str, args: &[&str], stdin: Option<&[u8]>) -> Out {
    use std::io::Write;
    let mut child = baton_cmd()
        .env("BATON_ENDPOINTS", endpoint)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn baton");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// [`baton`] that must succeed; returns its stdout.
pub fn baton_ok(endpoint: &str, args: &[&str]) -> String {
    let out = baton(endpoint, args, None);
    assert_eq!(out.code, 0, "baton {args:?} failed: {out:?}");
    out.stdout
}

/// [`baton`] with `--output json` that must succeed; returns its (one) JSON document.
pub fn baton_json(endpoint: &str, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let stdout = baton_ok(endpoint, &all);
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout:?}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout:?}"))
}

/// The cells of the table row of `table` whose first cell is `first` (columns are
/// separated by two or more spaces).
pub fn table_row(table: &str, first: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .find(|cells| cells.first().map(String::as_str) == Some(first))
        .unwrap_or_else(|| panic!("no row starting with {first:?} in:\n{table}"))
}

/// A channel to a member that connects on first use and reconnects by itself, so one
/// channel per member outlives kill -9 and restarts. No per-call timeout here: wrap unary
/// calls in [`within`] (a channel-wide timeout would also cut long-lived streams).
pub fn lazy_channel(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy()
}

/// `fut` with a deadline; running out of time is `DEADLINE_EXCEEDED`, like a gRPC deadline.
pub async fn within<T>(
    d: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    match tokio::time::timeout(d, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within {d:?}"
        ))),
    }
}

/// What `Maintenance.Status` says about one member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: u64,
    /// The leader this member knows of (0: none).
    pub leader: u64,
    pub raft_term: u64,
    pub raft_applied_index: u64,
    /// The member's own store revision (its header).
    pub revision: i64,
}

/// `Maintenance.Status` of one member, `None` if it does not answer within a second.
pub async fn member_status(ch: &tonic::transport::Channel) -> Option<MemberStatus> {
    use baton_proto::etcdserverpb::{maintenance_client::MaintenanceClient, StatusRequest};
    let mut c = MaintenanceClient::new(ch.clone());
    let s = within(Duration::from_secs(1), c.status(StatusRequest {}))
        .await
        .ok()?;
    let h = s.header?;
    Some(MemberStatus {
        member_id: h.member_id,
        leader: s.leader,
        raft_term: s.raft_term,
        raft_applied_index: s.raft_applied_index,
        revision: h.revision,
    })
}

/// Waits until every member in `members` (indexes into `chans`) answers `Status` naming the
/// same leader, which is one of them; returns the leader's index in `chans`.
pub async fn agreed_leader_of(
    chans: &[tonic::transport::Channel],
    members: &[usize],
    within_d: Duration,
) -> usize {
    let deadline = Instant::now() + within_d;
    loop {
        let mut st = Vec::new();
        for &i in members {
            st.push((i, member_status(&chans[i]).await));
        }
        if let Some((_, Some(first))) = st.first() {
            let leader = first.leader;
            let agreed = st
                .iter()
                .all(|(_, s)| s.is_some_and(|s| s.leader == leader));
            let index = st
                .iter()
                .find(|(_, s)| s.is_some_and(|s| s.member_id == leader))
                .map(|(i, _)| *i);
            if leader != 0 && agreed {
                if let Some(i) = index {
                    return i;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader among members {members:?} within {within_d:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`agreed_leader_of`] over client endpoints (`host:port`): waits until every endpoint
/// names the same leader, which is one of them; returns its index in `endpoints`.
pub async fn agreed_leader(endpoints: &[String], within_d: Duration) -> usize {
    let chans: Vec<_> = endpoints.iter().map(|e| lazy_channel(e)).collect();
    let all: Vec<usize> = (0..chans.len()).collect();
    agreed_leader_of(&chans, &all, within_d).await
}

/// A plain HTTP/1.0 GET over loopback (no HTTP client dependency needed for `/metrics` and
/// `/health`): the status code and the body.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let code = buf[9..12].parse().unwrap();
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}

/// The value of one Prometheus sample (`name{labels}` exactly as rendered) on a member's
/// `/metrics`; `None` if it is not there (a counter appears once first incremented).
pub async fn metric(metrics_port: u16, sample: &str) -> Option<f64> {
    let (code, body) = tokio::task::spawn_blocking(move || http_get(metrics_port, "/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let prefix = format!("{sample} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
}

/// Raw calls to a member's peer service (`baton.raft.v1.Raft`), as a forger who knows the
/// (public) wire format would make them: bincode payloads built from mirrors of Baton's
/// private request types, in a `PeerMessage` envelope with whatever ids it likes.
pub mod peer {
    use baton_proto::baton::raft::v1::raft_client::RaftClient;
    use baton_proto::baton::raft::v1::PeerMessage;
    use bincode::Options;

    /// baton-raft's `wire` options (fixint), as every member encodes.
    pub fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
        bincode::DefaultOptions::new()
            .with_fixint_encoding()
            .serialize(value)
            .unwrap()
    }

    /// Mirror of baton-raft's `LeaderRequest` up to the variants used here (bincode encodes
    /// a variant by its position, so the order matters and is the real enum's).
    #[derive(serde::Serialize)]
    pub enum LeaderRequest {
        Propose(baton_core::Command),
        ReadIndex,
    }

    /// Mirror of baton-raft's `JoinRequest`.
    #[derive(serde::Serialize)]
    pub struct JoinRequest {
        pub peer_urls: Vec<String>,
        pub credential: [u8; 32],
    }

    /// What a member or joiner given `token` shows (`membership::ClusterCredential`).
    pub fn cluster_credential(token: &str) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"baton-join-credential-v1\0");
        h.update(token.as_bytes());
        h.finalize().into()
    }

    #[derive(Clone, Copy, Debug)]
    pub enum Method {
        Forward,
        ForwardBatch,
        Members,
        Vote,
        AppendEntries,
    }

    /// One call to the peer service on `127.0.0.1:peer_port`, with the envelope's ids and
    /// the credential of `token` (None: no credential, as a stranger sends).
    pub async fn call(
        peer_port: u16,
        method: Method,
        envelope: (u64, u64, u64),
        token: Option<&str>,
        payload: Vec<u8>,
    ) -> Result<PeerMessage, tonic::Status> {
        let ch = super::channel(&format!("127.0.0.1:{peer_port}")).await;
        call_on(ch, method, envelope, token, payload).await
    }

    /// [`call`] over a channel the caller made (TLS, say).
    pub async fn call_on(
        ch: tonic::transport::Channel,
        method: Method,
        envelope: (u64, u64, u64),
        token: Option<&str>,
        payload: Vec<u8>,
    ) -> Result<PeerMessage, tonic::Status> {
        let mut c = RaftClient::new(ch);
        let (cluster_id, from, to) = envelope;
        let msg = PeerMessage {
            cluster_id,
            from,
            to,
            payload,
            credential: token
                .map(|t| cluster_credential(t).to_vec())
                .unwrap_or_default(),
            // Absent, as a binary from before the field sends it: read as peer format 1.
            format_version: 0,
            lease_verdict: None,
        };
        let d = std::time::Duration::from_secs(10);
        match method {
            Method::Forward => super::within(d, c.forward(msg)).await,
            Method::ForwardBatch => super::within(d, c.forward_batch(msg)).await,
            Method::Members => super::within(d, c.members(msg)).await,
            Method::Vote => super::within(d, c.vote(msg)).await,
            Method::AppendEntries => super::within(d, c.append_entries(msg)).await,
        }
    }
}

/// etcd's test certificates (`integration/fixtures` of Debian's golang-etcd-server-dev,
/// which `scripts/install-deps` installs).
pub const FIXTURES: &str = "/usr/share/gocode/src/go.etcd.io/etcd/integration/fixtures";

/// The path of one of etcd's test certificates; a missing one fails the test, saying how
/// to install them.
pub fn fixture(name: &str) -> String {
    let path = Path::new(FIXTURES).join(name);
    assert!(
        path.exists(),
        "{} is missing: install Debian's golang-etcd-server-dev (scripts/install-deps does)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}
