//! `baton serve`: one member speaking the etcd v3 API (etcd-style flags).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use baton_server::conn::{ClientListener, Security};
use baton_server::tls;
use clap::Args;

/// How often queued histogram samples are folded into their buckets (see `serve`).
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// `--initial-cluster-token` when none is given (etcd's is `etcd-cluster`; see docs/flags.md).
const DEFAULT_CLUSTER_TOKEN: &str = "baton-cluster";

/// The member's runtime worker count: `--worker-threads`, else one less than the cores.
pub fn worker_threads(args: &ServeArgs) -> usize {
    match args.worker_threads {
        Some(n) => n as usize,
        None => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .saturating_sub(1)
            .max(1),
    }
}

/// Turns tokio's LIFO slot off in the member's runtime; returns whether this build could
/// (the switch is tokio API only under `--cfg tokio_unstable`, which `.cargo/config.toml` sets).
///
/// Why: with the slot, a task woken by the running task runs next, ahead of every task
/// already queued. When an apply completes a batch of writes, each request's task sends its
/// response into its connection's HTTP/2 state and wakes the connection's task; through the
/// slot that task then ran at once and wrote that one response to the socket — one `writev`
/// per response, each also waking the client. Without the slot the woken connection task
/// queues behind the other responses of the batch and writes them all at once. Measured
/// (same build with and without the switch, alternating, 6 s windows, this 2-core VM): write
/// syscalls per put with 100 clients on 10 connections, single member 0.98 → 0.19, three
/// members (all servers) 1.23 → 0.35; single-member put 100 clients 29.0k / 36.3k → 38.2k /
/// 38.2k ops/s and server CPU 40.1 / 32.5 → 29.1 / 30.0 µs per put; three members against the
/// previous (stable-flag) build 17.9k / 19.7k / 15.5k → 20.5k / 19.8k / 19.0k ops/s; lease
/// keep-alives of 10k leases ~12 % less CPU on the members; a lone client's put (p50 0.57–0.60
/// ms via the leader, 0.32 ms on one member) and the lock handoff unchanged within noise — the
/// slot's point, a woken task run while its data is hot in the cache, buys nothing measurable
/// here next to the syscalls it costs.
pub fn without_lifo_slot(builder: &mut tokio::runtime::Builder) -> bool {
    #[cfg(tokio_unstable)]
    {
        builder.disable_lifo_slot();
        true
    }
    #[cfg(not(tokio_unstable))]
    {
        let _ = builder;
        false
    }
}

/// What `baton serve` says at start when [`without_lifo_slot`] could not turn the slot off.
pub const LIFO_SLOT_WARNING: &str = "built without --cfg tokio_unstable (a RUSTFLAGS in the \
     environment replaces .cargo/config.toml's): the runtime keeps tokio's LIFO slot, so \
     responses are written one syscall each (see serve::without_lifo_slot)";

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Human-readable name of this member.
    #[arg(long, default_value = "default")]
    name: String,
    /// Directory for the Raft log, snapshots and member identity. Created if missing.
    #[arg(long, default_value = "./baton-data")]
    data_dir: PathBuf,
    /// Comma-separated URLs to serve the etcd gRPC API, its JSON gateway (`/v3/…`) and
    /// `/health`, `/metrics` and `/version` on: `http://` in plain text, `https://` with TLS
    /// (`--cert-file` and `--key-file`, or `--auto-tls`); one host:port may be given with
    /// both schemes and then serves both, as etcd's does.
    #[arg(long, default_value = "http://127.0.0.1:2379")]
    listen_client_urls: String,
    /// Comma-separated client URLs to advertise in the member list (default: the listen URLs).
    #[arg(long)]
    advertise_client_urls: Option<String>,
    /// Comma-separated URLs of more listeners for HTTP /metrics, /health and /version alone
    /// (the client URLs serve them too) [default: none, as etcd's]; `https://` ones use the
    /// client TLS flags (`--cert-file`, `--trusted-ca-file`, `--client-cert-auth`, …), as
    /// etcd's do.
    #[arg(long, default_value = "")]
    listen_metrics_urls: String,
    /// Comma-separated URLs to serve the peer service (Raft, forwarding) on. Bound only in a
    /// cluster (`--initial-cluster`); a lone member just records them in the member list.
    #[arg(long, default_value = "http://127.0.0.1:2380")]
    listen_peer_urls: String,
    /// Comma-separated peer URLs to advertise (default: the listen peer URLs). In a cluster
    /// they must be this member's URLs in `--initial-cluster`.
    #[arg(long)]
    initial_advertise_peer_urls: Option<String>,
    /// The cluster's members at creation, `name1=http://host:port,name2=...` (etcd's
    /// syntax). Member and cluster ids are derived from it (with the token), so every member
    /// must get the same list. Without it the member is a cluster of its own.
    #[arg(long)]
    initial_cluster: Option<String>,
    /// `new`: create the cluster (a member with an empty data directory joins the creation;
    /// the one with the smallest id initializes it). `existing`: the cluster exists; with an
    /// empty data directory the member joins it after `member add` (it asks the other listed
    /// members for the membership and finds itself by its advertised peer URLs). A member
    /// with data ignores this, as etcd does.
    #[arg(long, value_enum, default_value_t = ClusterState::New)]
    initial_cluster_state: ClusterState,
    /// Distinguishes clusters created from the same member list: part of every id, and peers
    /// refuse messages from another cluster. Every peer request shows a digest of it, and
    /// members hear nobody without it: without peer TLS, make it a secret (a random string) to
    /// keep strangers who can reach the peer port out of the cluster [default: baton-cluster].
    /// A member added with `member add` may be started without it: the add admits it and it
    /// keeps the cluster's credential (ARCHITECTURE.md, "Admission by member add").
    #[arg(long, value_name = "TOKEN")]
    initial_cluster_token: Option<String>,
    /// Raft heartbeat interval in milliseconds.
    #[arg(long, default_value_t = 100)]
    heartbeat_interval: u64,
    /// Raft election timeout in milliseconds; the smallest lease TTL is 1.5× this, rounded up
    /// to whole seconds (as etcd).
    #[arg(long, default_value_t = 1000)]
    election_timeout: u64,
    /// Take a snapshot and trim the log after this many entries (or once the log since the
    /// last snapshot is as large as that snapshot).
    ///
    /// etcd's default. Why not fewer: a Baton snapshot writes the whole state (etcd's only
    /// commits its bbolt file), so with a large state a count of 10,000 made small writes
    /// (lock handoffs, one command per entry) rewrite hundreds of MB every few seconds —
    /// 3 members after 300k puts: 850–880 lock handoffs/s with p99 33–39 ms and stalls up to
    /// 205 ms, against 920–1040/s and p99 11–13 ms at 100,000. The size trigger still bounds
    /// the log (and a restart's replay) by the state's size.
    #[arg(long, default_value_t = 100_000)]
    snapshot_count: u64,
    /// Free bytes to keep on the data directory's file system (default 64 MiB). Below it
    /// the member refuses writes that add data with etcd's "database space exceeded" and
    /// raises the NOSPACE alarm; reads, deletes and compaction go on, and the alarm clears
    /// itself once a quarter more than this is free again. 0 disables the check (a full
    /// disk still raises the alarm).
    #[arg(long, default_value_t = baton_raft::DEFAULT_SPACE_RESERVE_BYTES)]
    disk_reserve_bytes: u64,
    /// etcd's backend quota in bytes: when the store's size estimate (every retained
    /// version's key and value plus a fixed overhead, leases, locks; history counts until
    /// compacted, see docs/quota.md) reaches it, NOSPACE is raised and writes that add data
    /// are refused until an operator compacts and disarms. 0: etcd's default, 2 GiB;
    /// negative: no quota, as etcd's.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    quota_backend_bytes: i64,
    /// How `--auto-compaction-retention` is read: `periodic` (a duration of history to
    /// keep) or `revision` (a number of revisions to keep), as etcd's.
    #[arg(long, default_value = "periodic")]
    auto_compaction_mode: String,
    /// History the leader keeps when it compacts by itself [default: 0, off, as etcd's]:
    /// periodic, a duration (`1h`, `30m`, `2s`) or a whole number of hours, compacting every
    /// min(retention, 1h) to the revision of one retention ago; revision, a number of
    /// revisions, compacting every 5 minutes to the current revision minus it. See
    /// docs/quota.md.
    #[arg(long, default_value = "0")]
    auto_compaction_retention: String,
    /// How often (milliseconds) the leader writes the remaining TTL of leases longer than
    /// this interval to the log, so a new leader continues their countdown (etcd's lease
    /// checkpoints, always on here). Lower it only to test failovers.
    #[arg(long, default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(100..))]
    experimental_lease_checkpoint_interval: u64,
    /// Threads that run requests and Raft (the async runtime's workers) [default: one less
    /// than the cores available, at least one]. The spare core is for the log writer's fsyncs
    /// and the kernel's network work: on a 2-core machine one worker served a lone client's
    /// put in 0.29 ms instead of 0.38 ms (no cross-thread wake-ups between the request, Raft
    /// and apply tasks) and 100 clients' puts ~15% faster. `TOKIO_WORKER_THREADS` is ignored.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub worker_threads: Option<u64>,
    /// Interval of progress notifications to watchers that ask for them, in seconds.
    #[arg(long, default_value_t = 600)]
    watch_progress_notify_interval: u64,
    /// HTTP/2 streams one client connection may have open at once (etcd's flag and default,
    /// 2^32 − 1). What one connection can make the server buffer is bounded by its receive
    /// windows whatever the stream count (`baton_server::transport`).
    #[arg(long, default_value_t = baton_server::transport::DEFAULT_MAX_CONCURRENT_STREAMS, value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrent_streams: u32,
    /// How often the server pings an idle client connection (etcd's flag, Go duration
    /// syntax such as `30s` or `2h`; 0 turns pings off) [Baton's default 30s, etcd's 2h].
    #[arg(long, default_value = "30s", value_parser = parse_go_duration)]
    grpc_keepalive_interval: Duration,
    /// How long a ping's answer may take before the connection is closed (etcd's flag and
    /// default; 0 waits forever).
    #[arg(long, default_value = "20s", value_parser = parse_go_duration)]
    grpc_keepalive_timeout: Duration,
    /// etcd's `--auth-token`: `simple` (etcd's default: random tokens kept by the cluster,
    /// `--auth-token-ttl`), or `jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256|PS256|
    /// ES256|…[,ttl=5m]` (signed tokens; `pub-key` may be a certificate).
    #[arg(long, default_value = "simple")]
    auth_token: String,
    /// Seconds a simple token stays valid while unused (etcd's `--auth-token-ttl`).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    auth_token_ttl: u64,
    /// bcrypt's cost for user passwords, 4 to 31 (etcd's `--bcrypt-cost`).
    #[arg(long, default_value_t = 10)]
    bcrypt_cost: u32,
    /// The client port's TLS certificate (PEM), for `https://` client URLs.
    #[arg(long)]
    cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// CAs (PEM) that client certificates must chain to. Given, clients of `https://` URLs
    /// must present a certificate of one (as etcd requires, `--client-cert-auth` or not).
    #[arg(long)]
    trusted_ca_file: Option<PathBuf>,
    /// Require a client certificate signed by `--trusted-ca-file` on `https://` client URLs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    client_cert_auth: bool,
    /// Serve `https://` client URLs with a self-signed certificate made at start (kept in
    /// `<data-dir>/fixtures/client`), when `--cert-file`/`--key-file` are not given.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    auto_tls: bool,
    /// Revoked client certificates (a CRL, DER or PEM), with `--client-cert-auth`.
    #[arg(long)]
    client_crl_file: Option<PathBuf>,
    /// Comma-separated TLS 1.2 cipher suites (Go's names, as etcd's flag) to allow on the
    /// client port; given, the port speaks TLS 1.2 only, with exactly these.
    #[arg(long)]
    cipher_suites: Option<String>,
    /// The peer port's TLS certificate (PEM), for `https://` peer URLs; also what this
    /// member shows the peers it dials.
    #[arg(long)]
    peer_cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    peer_key_file: Option<PathBuf>,
    /// CAs (PEM) that peers' certificates must chain to. Given, a peer dialing this member
    /// must present a certificate of one (as etcd), and the peers this member dials are
    /// checked against them.
    #[arg(long)]
    peer_trusted_ca_file: Option<PathBuf>,
    /// Require a peer certificate signed by `--peer-trusted-ca-file` on `https://` peer URLs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    peer_client_cert_auth: bool,
    /// Serve `https://` peer URLs with a self-signed certificate made at start (kept in
    /// `<data-dir>/fixtures/peer`), when `--peer-cert-file`/`--peer-key-file` are not given.
    /// As etcd, peers' certificates are then not checked (nothing signed them): only the
    /// cluster token keeps strangers out.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    peer_auto_tls: bool,
    /// Revoked peer certificates (a CRL, DER or PEM).
    #[arg(long)]
    peer_crl_file: Option<PathBuf>,
    /// A peer's certificate must also have this Common Name.
    #[arg(long)]
    peer_cert_allowed_cn: Option<String>,
    /// A peer's certificate must also be valid for this host name.
    #[arg(long)]
    peer_cert_allowed_hostname: Option<String>,
    /// Refuse membership changes that would leave fewer started voters than a quorum
    /// (etcd's flag and default). `false` lets `member add`/`remove`/`promote` through
    /// whatever the other members' state, as etcd's `--strict-reconfig-check=false`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = true, action = clap::ArgAction::Set)]
    strict_reconfig_check: bool,
    /// Before serving, compare this member's key-space hash with every reachable member's
    /// at this member's revision and refuse to start on a mismatch (etcd's initial
    /// corruption check). Members that cannot be asked are logged and skipped, as etcd does.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    experimental_initial_corrupt_check: bool,
    /// Restart this member, with its data, as the only voter of its cluster (etcd's flag):
    /// the path when a quorum is lost for good (docs/disaster-recovery.md). The other
    /// members are removed; grow the cluster again with `member add`. Refused on a member
    /// without data.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    force_new_cluster: bool,
    /// How often the leader compares every member's key-space hash with its own and raises
    /// the CORRUPT alarm on a mismatch (etcd's periodic corruption check; a Go duration such
    /// as `5m`). `0s`, the default as etcd's, disables it.
    #[arg(long, default_value = "0s", value_parser = parse_go_duration)]
    experimental_corrupt_check_time: Duration,
    /// Log filter (tracing's env-filter syntax), e.g. `info` or `baton_raft=debug`.
    #[arg(long, default_value = "info,openraft=warn")]
    log_level: String,
    /// Where log lines go (etcd's `--log-outputs`): comma-separated `default` or `stderr`,
    /// `stdout`, or file paths (appended to). systemd's journal is reached through stderr.
    #[arg(long, default_value = "default")]
    log_outputs: String,
}

/// `--quota-backend-bytes` as etcd reads it (`etcdserver.NewBackendQuota`): 0 is the
/// default (2 GiB), a negative value disables the quota, and above 8 GiB a warning says the
/// quota exceeds what etcd suggests (for Baton: the store is held in memory, about that much
/// plus the allocator's share).
fn backend_quota(flag: i64) -> Option<u64> {
    match flag {
        ..0 => {
            tracing::info!(quota_size_bytes = flag, "disabled backend quota");
            None
        }
        0 => {
            let quota = baton_raft::DEFAULT_QUOTA_BACKEND_BYTES;
            tracing::info!(
                quota_size_bytes = quota,
                "enabled backend quota with default value"
            );
            Some(quota)
        }
        _ => {
            let quota = flag as u64;
            if quota > baton_raft::MAX_SUGGESTED_QUOTA_BACKEND_BYTES {
                tracing::warn!(
                    quota_size_bytes = quota,
                    quota_maximum_size_bytes = baton_raft::MAX_SUGGESTED_QUOTA_BACKEND_BYTES,
                    "quota exceeds the maximum value"
                );
            }
            tracing::info!(quota_size_bytes = quota, "enabled backend quota");
            Some(quota)
        }
    }
}

/// `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ClusterState {
    New,
    Existing,
}

fn split_urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// `http(s)://host:port` → (TLS?, the socket address, the host as written).
fn parse_url(url: &str) -> Result<(bool, SocketAddr, String)> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else {
        bail!("{url}: expected a URL like http://127.0.0.1:2379");
    };
    let hostport = rest.trim_end_matches('/');
    let addr = hostport
        .to_socket_addrs()
        .with_context(|| format!("{url}: cannot resolve"))?
        .next()
        .with_context(|| format!("{url}: no address"))?;
    let host = match hostport.rsplit_once(':') {
        Some((host, _)) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        None => hostport.to_string(),
    };
    Ok((tls, addr, host))
}

/// The listeners of `--listen-client-urls` and of `--listen-metrics-urls`: each address
/// plain, TLS or both, with the one client TLS configuration the flags describe (built only
/// if some URL of either is `https://`; etcd's metrics listeners use the client TLS
/// settings too).
fn client_and_metrics_listeners(
    args: &ServeArgs,
    client_urls: &[String],
    metrics_urls: &[String],
) -> Result<(Vec<ClientListener>, Vec<ClientListener>)> {
    let client = by_address(client_urls)?;
    let metrics = by_address(metrics_urls)?;
    let tls_hosts: Vec<String> = client
        .iter()
        .chain(&metrics)
        .flat_map(|a| a.tls_hosts.iter().cloned())
        .collect();
    let config = if tls_hosts.is_empty() {
        None
    } else {
        Some(client_tls(args, &tls_hosts)?)
    };
    let listeners = |addrs: Vec<AddressSchemes>| -> Vec<ClientListener> {
        addrs
            .into_iter()
            .map(|a| {
                let security = match (&config, a.plain, !a.tls_hosts.is_empty()) {
                    (Some(c), true, true) => Security::Both(c.clone()),
                    (Some(c), false, true) => Security::Tls(c.clone()),
                    _ => Security::Plain,
                };
                ClientListener {
                    addr: a.addr,
                    security,
                }
            })
            .collect()
    };
    Ok((listeners(client), listeners(metrics)))
}

/// One address of a URL list, and which schemes name it.
struct AddressSchemes {
    addr: SocketAddr,
    plain: bool,
    /// The hosts of its `https://` URLs (for `--auto-tls`'s certificate).
    tls_hosts: Vec<String>,
}

fn by_address(urls: &[String]) -> Result<Vec<AddressSchemes>> {
    let mut out: Vec<AddressSchemes> = Vec::new();
    for url in urls {
        let (tls, addr, host) = parse_url(url)?;
        let at = match out.iter().position(|a| a.addr == addr) {
            Some(at) => at,
            None => {
                out.push(AddressSchemes {
                    addr,
                    plain: false,
                    tls_hosts: Vec::new(),
                });
                out.len() - 1
            }
        };
        if tls {
            out[at].tls_hosts.push(host);
        } else {
            out[at].plain = true;
        }
    }
    Ok(out)
}

/// The client port's TLS configuration from etcd's flags.
fn client_tls(args: &ServeArgs, hosts: &[String]) -> Result<Arc<tls::ServerConfig>> {
    let (cert_file, key_file) = match (&args.cert_file, &args.key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        (None, None) if args.auto_tls => {
            let dir = args.data_dir.join("fixtures").join("client");
            let (c, k) = tls::self_signed(tls::TlsPort::Client, &dir, hosts)?;
            tracing::info!(cert = %c.display(), "--auto-tls: serving https client URLs with a self-signed certificate");
            (c, k)
        }
        _ => {
            bail!("https client or metrics URLs need --cert-file and --key-file (or --auto-tls without them)")
        }
    };
    let settings = tls::TlsSettings {
        port: tls::TlsPort::Client,
        cert_file: Some(cert_file),
        key_file: Some(key_file),
        trusted_ca_file: args.trusted_ca_file.clone(),
        client_cert_auth: args.client_cert_auth,
        crl_file: args.client_crl_file.clone(),
        cipher_suites: args
            .cipher_suites
            .as_deref()
            .map(split_urls)
            .unwrap_or_default(),
        allowed_cn: None,
        allowed_hostname: None,
    };
    Ok(tls::server_config(&settings)?)
}

/// A Go duration (`500ms`, `2h`, `0`), as etcd's duration flags take them.
fn parse_go_duration(v: &str) -> std::result::Result<Duration, String> {
    crate::etcd_flags::go_duration_ns(v)
        .map(Duration::from_nanos)
        .ok_or_else(|| format!("invalid duration {v:?} (Go syntax: 300ms, 30s, 2h45m)"))
}

pub async fn serve(args: ServeArgs, warnings: Vec<String>) -> Result<()> {
    let outputs = crate::log_output::LogOutputs::open(&args.log_outputs)?;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log_level))
        // Colour codes only for a terminal; log files and journald get plain text.
        .with_ansi(outputs.is_terminal())
        .with_writer(outputs)
        .init();
    for w in warnings {
        tracing::warn!("{w}");
    }

    // Before anything is bound or created: a refused flag changes nothing.
    let compaction = baton_server::compactor::Policy::from_flags(
        &args.auto_compaction_mode,
        &args.auto_compaction_retention,
    )?;
    let listen_client = split_urls(&args.listen_client_urls);
    let (client_listeners, metrics_listeners) = client_and_metrics_listeners(
        &args,
        &listen_client,
        &split_urls(&args.listen_metrics_urls),
    )?;
    let peer_listen = peer_listeners(&args)?;
    let peer_urls = split_urls(
        args.initial_advertise_peer_urls
            .as_deref()
            .unwrap_or(&args.listen_peer_urls),
    );
    let cluster = match &args.initial_cluster {
        None => None,
        Some(spec) => Some(baton_raft::ClusterConfig {
            initial_members: baton_raft::parse_initial_cluster(spec)?,
            state: match args.initial_cluster_state {
                ClusterState::New => baton_raft::InitialClusterState::New,
                ClusterState::Existing => baton_raft::InitialClusterState::Existing,
            },
            token: args
                .initial_cluster_token
                .clone()
                .unwrap_or_else(|| DEFAULT_CLUSTER_TOKEN.to_string()),
            token_given: args.initial_cluster_token.is_some(),
            listen_peer_addrs: peer_listen.addrs.clone(),
        }),
    };
    let advertise_client = args
        .advertise_client_urls
        .as_deref()
        .map(split_urls)
        .unwrap_or(listen_client);

    // etcd's families and Baton's, with their buckets and HELP (`baton_server::monitor`).
    let metrics =
        baton_server::monitor::install_recorder().context("installing the metrics recorder")?;
    // `install_recorder` leaves upkeep to us: without it every histogram sample recorded
    // between two scrapes stays queued in memory (metrics-rs/metrics#467), so a member nobody
    // scrapes grows by a few bytes per request forever. Upkeep folds them into the buckets.
    {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                metrics.run_upkeep();
            }
        });
    }

    let election_timeout = Duration::from_millis(args.election_timeout);
    let mut node_config = baton_raft::NodeConfig::new(args.name.clone(), args.data_dir.clone());
    let dashboard_endpoints = advertise_client.clone();
    node_config.client_urls = advertise_client;
    node_config.peer_urls = peer_urls;
    node_config.heartbeat_interval = Duration::from_millis(args.heartbeat_interval);
    node_config.election_timeout = election_timeout;
    node_config.snapshot_every_entries = args.snapshot_count;
    node_config.disk_reserve_bytes = args.disk_reserve_bytes;
    node_config.quota_backend_bytes = backend_quota(args.quota_backend_bytes);
    node_config.lease_checkpoint_interval =
        Duration::from_millis(args.experimental_lease_checkpoint_interval);
    node_config.cluster = cluster;
    node_config.env.transport = peer_listen.transport;
    node_config.strict_reconfig_check = args.strict_reconfig_check;
    node_config.force_new_cluster = args.force_new_cluster;
    node_config.snapshot_kv_checked_by_peers = args.experimental_initial_corrupt_check;

    crate::etcd_datadir::adopt(
        &args.data_dir,
        &args.name,
        &node_config.peer_urls,
        node_config.cluster.as_ref(),
    )?;
    let node = baton_raft::Node::start(node_config)
        .await
        .with_context(|| format!("starting the member in {}", args.data_dir.display()))?;

    if args.experimental_initial_corrupt_check {
        if let Err(e) = crate::corrupt_check::initial(&node, client_tls_for_peers(&args)).await {
            node.shutdown().await;
            return Err(e);
        }
        if let Some(path) = node.snapshot_kv_changed() {
            // No member had a different hash (or none could be asked): serving on, as etcd
            // would, but the file's checksum says it was changed outside Baton.
            tracing::warn!(
                path = %path.display(),
                "SERVING A SNAPSHOT WHOSE `key` BUCKET FAILED ITS CHECKSUM: the initial \
                 corruption check found no member with a different key space, but the file \
                 was changed after Baton wrote it; compare the members (`etcdctl endpoint \
                 hashkv --cluster`) or re-add this member from the others"
            );
            node.release_snapshots();
        }
    }

    if !args.experimental_corrupt_check_time.is_zero() {
        tokio::spawn(crate::corrupt_check::periodic(
            node.clone(),
            client_tls_for_peers(&args),
            args.experimental_corrupt_check_time,
        ));
    }
    if let Some(policy) = compaction {
        tracing::info!(
            auto_compaction_mode = %args.auto_compaction_mode,
            auto_compaction_retention = %args.auto_compaction_retention,
            ?policy,
            "auto-compaction on (the leader compacts)"
        );
        baton_server::compactor::spawn(node.clone(), policy);
    }

    let auth = baton_server::auth::Authenticator::from_flags(
        &args.auth_token,
        Duration::from_secs(args.auth_token_ttl),
        args.bcrypt_cost,
    );
    let auth = match auth {
        Ok(auth) => auth,
        Err(e) => {
            node.shutdown().await;
            return Err(e.into());
        }
    };
    let dashboard = crate::ui::router(crate::ui::DashboardConfig {
        endpoints: dashboard_endpoints,
        tls: client_tls_for_peers(&args),
        auth_enabled: {
            let node = node.clone();
            Arc::new(move || node.read(|sm| sm.auth_enabled()))
        },
        secure_cookie: client_listeners
            .iter()
            .any(|l| !matches!(l.security, Security::Plain)),
    });
    // etcd: minTTL = ceil(1.5 × election timeout).
    let min_lease_ttl_s = ((election_timeout.as_millis() as u64 * 3).div_ceil(2000) as i64).max(1);
    let shared = baton_server::Shared {
        node: node.clone(),
        config: baton_server::ServerConfig {
            client_listeners,
            metrics_listeners,
            min_lease_ttl_s,
            watch_progress_interval: Duration::from_secs(
                args.watch_progress_notify_interval.max(1),
            ),
            max_concurrent_streams: args.max_concurrent_streams,
            keepalive: baton_server::transport::Keepalive {
                interval: args.grpc_keepalive_interval,
                timeout: args.grpc_keepalive_timeout,
            },
            auth,
            http_extension: Some(dashboard),
        },
    };
    // A member removed from the cluster stops serving (as etcd does): it would otherwise
    // answer serializable reads and watches from a state nobody updates any more.
    let removed = Arc::new(AtomicBool::new(false));
    let stop = {
        let node = node.clone();
        let removed = removed.clone();
        async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                _ = node.removed() => {
                    tracing::error!("{}; stopping", baton_raft::REMOVED_MESSAGE);
                    removed.store(true, Ordering::Release);
                }
            }
        }
    };
    let result = baton_server::serve(shared, metrics, stop).await;
    tracing::info!("shutting down");
    node.shutdown().await;
    result.context("serving")?;
    if removed.load(Ordering::Acquire) {
        anyhow::bail!(baton_raft::REMOVED_MESSAGE);
    }
    Ok(())
}

/// The peer addresses to listen on and, for `https://` ones, the TLS transport.
struct PeerListen {
    addrs: Vec<SocketAddr>,
    transport: Option<Arc<dyn baton_raft::PeerTransport>>,
}

/// `--listen-peer-urls` and the `--peer-*` TLS flags. The URLs are all `http://` or all
/// `https://`: a member that served some peers in plain text would give away what TLS is
/// for.
fn peer_listeners(args: &ServeArgs) -> Result<PeerListen> {
    let mut addrs = Vec::new();
    let mut hosts = Vec::new();
    let mut schemes = (false, false);
    for url in split_urls(&args.listen_peer_urls) {
        let (tls, addr, host) = parse_url(&url)?;
        if tls {
            schemes.1 = true;
        } else {
            schemes.0 = true;
        }
        addrs.push(addr);
        hosts.push(host);
    }
    let has_peer_tls_flags = args.peer_cert_file.is_some()
        || args.peer_key_file.is_some()
        || args.peer_trusted_ca_file.is_some()
        || args.peer_auto_tls;
    match schemes {
        (true, true) => bail!(
            "--listen-peer-urls {}: all http:// or all https://, not both",
            args.listen_peer_urls
        ),
        (_, false) => {
            if has_peer_tls_flags {
                // etcd too ignores them for http:// URLs (and says so).
                tracing::warn!(
                    "the --peer-* TLS flags are ignored: every --listen-peer-urls is http://"
                );
            }
            return Ok(PeerListen {
                addrs,
                transport: None,
            });
        }
        (false, true) => {}
    }
    let (cert_file, key_file, auto) = match (&args.peer_cert_file, &args.peer_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone(), false),
        (None, None) if args.peer_auto_tls => {
            let dir = args.data_dir.join("fixtures").join("peer");
            let (c, k) = tls::self_signed(tls::TlsPort::Peer, &dir, &hosts)?;
            tracing::info!(cert = %c.display(), "--peer-auto-tls: serving https peer URLs with a self-signed certificate");
            (c, k, true)
        }
        _ => bail!(
            "https peer URLs need --peer-cert-file and --peer-key-file (or --peer-auto-tls \
             without them)"
        ),
    };
    let settings = tls::TlsSettings {
        port: tls::TlsPort::Peer,
        cert_file: Some(cert_file),
        key_file: Some(key_file),
        trusted_ca_file: args.peer_trusted_ca_file.clone(),
        client_cert_auth: args.peer_client_cert_auth,
        crl_file: args.peer_crl_file.clone(),
        // etcd's --cipher-suites applies to both ports.
        cipher_suites: args
            .cipher_suites
            .as_deref()
            .map(split_urls)
            .unwrap_or_default(),
        allowed_cn: args.peer_cert_allowed_cn.clone(),
        allowed_hostname: args.peer_cert_allowed_hostname.clone(),
    };
    let server = tls::server_config(&settings)?;
    let client = tls::peer_client(&settings, auto)?;
    Ok(PeerListen {
        addrs,
        transport: Some(Arc::new(baton_server::peer_tls::TlsPeerTransport::new(
            server, client,
        ))),
    })
}

/// The TLS settings for asking other members over their client URLs: the member's own
/// trusted CA and certificate (etcd members present their server certificate as a client).
fn client_tls_for_peers(args: &ServeArgs) -> Option<baton_client::TlsConfig> {
    if args.trusted_ca_file.is_none() && args.cert_file.is_none() && !args.auto_tls {
        return None;
    }
    let mut tls = baton_client::TlsConfig::new();
    tls.ca_file = args.trusted_ca_file.clone();
    tls.cert_file = args.cert_file.clone();
    tls.key_file = args.key_file.clone();
    // With --auto-tls every member's certificate is self-signed: nothing could verify it
    // (etcd skips verification of self-signed certificates too).
    tls.insecure_skip_verify = args.auto_tls && args.cert_file.is_none();
    Some(tls)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::without_lifo_slot;

    /// The order in which a one-worker runtime runs two tasks spawned one after the other
    /// by a task on that worker.
    fn order_of_two_spawns(builder: &mut tokio::runtime::Builder) -> Vec<&'static str> {
        let rt = builder.worker_threads(1).build().expect("a runtime");
        let order = Arc::new(Mutex::new(Vec::new()));
        let (first, second) = (order.clone(), order.clone());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            // Both are scheduled from the worker itself, as a request task wakes its
            // connection's task: with the LIFO slot the one scheduled last runs first.
            let a = tokio::spawn(async move { first.lock().unwrap().push("first") });
            let b = tokio::spawn(async move { second.lock().unwrap().push("second") });
            let _ = (a.await, b.await);
            done_tx.send(()).expect("the test waits");
        });
        done_rx.recv().expect("the tasks ran");
        let got = order.lock().unwrap().clone();
        got
    }

    #[test]
    fn the_member_runtime_runs_woken_tasks_in_order() {
        // The control: tokio's default runs the task scheduled last first (its LIFO slot).
        let mut default = tokio::runtime::Builder::new_multi_thread();
        assert_eq!(order_of_two_spawns(&mut default), ["second", "first"]);
        let mut member = tokio::runtime::Builder::new_multi_thread();
        assert!(
            without_lifo_slot(&mut member),
            "{}",
            super::LIFO_SLOT_WARNING
        );
        assert_eq!(order_of_two_spawns(&mut member), ["first", "second"]);
    }
}
