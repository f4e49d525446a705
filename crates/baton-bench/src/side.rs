//! `baton-bench side-by-side`: starts etcd and Baton with the same settings (single node
//! and/or 3 members on loopback, data on disk, fsync on), runs every workload against each
//! alternately, measures server CPU (lease keep-alive), RSS (after N distinct keys) and
//! failover (kill -9 of the leader), and writes `bench/RESULTS.md`, `bench/results.svg`
//! and, with `--json`, every raw run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::bench::{run_spec, Spec};
use crate::engine::process_rss_bytes;
use crate::failover::Writer;
use crate::kv::{ClientImpl, KvLoad, KvOp};
use crate::lease::LeaseLoad;
use crate::report::{self, Binary, Disk};
use crate::results::{Meta, Report, Row, RowSpec, Sample, Target};
use crate::server::{Deployment, Kind, Settings, Topology};
use crate::steal::{StealWindow, NOTABLE_STEAL_PCT};
use crate::v3lock::{ElectionLoad, LockLoad};
use crate::watch_create::WatchCreateLoad;

/// The workloads of the side-by-side run, in table order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Item {
    /// put, 1 client / 1 connection (in 3 members: through the leader).
    Put1,
    /// 3 members: put, 1 client / 1 connection through a follower (which forwards it).
    Put1Follower,
    /// put, 100 clients / 10 connections.
    Put100,
    /// txn-put, 100 clients / 10 connections.
    TxnPut100,
    /// range linearizable, 100 clients / 10 connections.
    RangeL100,
    /// range serializable, 100 clients / 10 connections.
    RangeS100,
    /// 10k leases, TTL 10 s, kept alive; the leader's CPU.
    LeaseKeepalive,
    /// watch latency, 1 writer / 1 watcher.
    WatchLatency,
    /// 10,000 watchers on one key created over 10 streams (etcd's `benchmark watch`).
    WatchCreate,
    /// v3lock, 10 contenders on one lock.
    LockContended,
    /// v3lock, 50 contenders on 50 locks.
    LockDistinct,
    /// v3election, 10 contenders campaign → resign.
    ElectionHandoff,
    /// RSS after 100k (and 1M) distinct 256 B keys, fresh single-node servers.
    Rss,
    /// 3 members: kill -9 of the leader → next successful write.
    Failover,
}

impl Item {
    pub const ALL: [Item; 14] = [
        Item::Put1,
        Item::Put1Follower,
        Item::Put100,
        Item::TxnPut100,
        Item::RangeL100,
        Item::RangeS100,
        Item::LeaseKeepalive,
        Item::WatchLatency,
        Item::WatchCreate,
        Item::LockContended,
        Item::LockDistinct,
        Item::ElectionHandoff,
        Item::Rss,
        Item::Failover,
    ];

    fn id(self) -> String {
        self.to_possible_value()
            .expect("no skipped variants")
            .get_name()
            .to_string()
    }

    /// The client workload of a throughput item (`None`: RSS and failover).
    fn spec(self, c: &SideBySideArgs) -> Option<Spec> {
        let kv = |op, clients, conns| {
            Spec::Kv(KvLoad {
                op,
                clients,
                conns,
                key_space: 100_000,
                value_size: 256,
                total: None,
                key_offset: 0,
                client: ClientImpl::H2,
            })
        };
        Some(match self {
            Item::Put1 | Item::Put1Follower => kv(KvOp::Put, 1, 1),
            Item::Put100 => kv(KvOp::Put, c.clients, c.conns),
            Item::TxnPut100 => kv(KvOp::TxnPut, c.clients, c.conns),
            Item::RangeL100 => kv(
                KvOp::Range {
                    serializable: false,
                },
                c.clients,
                c.conns,
            ),
            Item::RangeS100 => kv(KvOp::Range { serializable: true }, c.clients, c.conns),
            Item::LeaseKeepalive => Spec::LeaseKeepalive(LeaseLoad {
                leases: c.leases,
                ttl_secs: 10,
                streams: c.conns,
            }),
            Item::WatchLatency => Spec::WatchLatency { value_size: 256 },
            Item::WatchCreate => Spec::WatchCreate(WatchCreateLoad {
                streams: 10,
                watchers_per_stream: 1000,
                conns: 1,
            }),
            Item::LockContended => Spec::Lock(LockLoad {
                contenders: 10,
                locks: 1,
                ttl_secs: 10,
            }),
            Item::LockDistinct => Spec::Lock(LockLoad {
                contenders: 50,
                locks: 50,
                ttl_secs: 10,
            }),
            Item::ElectionHandoff => Spec::ElectionHandoff(ElectionLoad {
                contenders: 10,
                ttl_secs: 10,
            }),
            Item::Rss | Item::Failover => return None,
        })
    }

    /// The row this item's runs make in `topology`.
    fn row(self, topology: Topology, c: &SideBySideArgs) -> RowSpec {
        let spec = self.spec(c);
        let label = spec.as_ref().map(Spec::label).unwrap_or_default();
        let (unit, lower, target) = match self {
            Item::Put1 | Item::Put1Follower => ("ops/s", false, Some(Target::RatioAtLeast(1.5))),
            Item::Put100 => (
                "ops/s",
                false,
                Some(Target::RatioAtLeast(match topology {
                    Topology::Single => 3.0,
                    Topology::Cluster => 2.0,
                })),
            ),
            Item::TxnPut100 | Item::RangeS100 => ("ops/s", false, None),
            Item::RangeL100 => ("ops/s", false, Some(Target::RatioAtLeast(2.0))),
            Item::LeaseKeepalive => ("% of a core", true, Some(Target::BatonBelow(5.0))),
            Item::WatchLatency => ("ms", true, None),
            Item::WatchCreate => ("watchers/s", false, Some(Target::RatioAtLeast(1.0))),
            Item::LockContended => ("cycles/s", false, Some(Target::RatioAtLeast(10.0))),
            Item::LockDistinct => ("cycles/s", false, Some(Target::RatioAtLeast(3.0))),
            Item::ElectionHandoff => ("handoffs/s", false, None),
            Item::Rss | Item::Failover => unreachable!("rows of their own"),
        };
        let label = match self {
            Item::LeaseKeepalive => format!("{label}: leader CPU"),
            Item::WatchLatency => format!("{label}: write sent → event, p50"),
            Item::Put1 if topology == Topology::Cluster => format!("{label}, via the leader"),
            Item::Put1Follower => format!("{label}, via a follower"),
            _ => label,
        };
        RowSpec {
            id: self.id(),
            label,
            unit: unit.into(),
            lower_is_better: lower,
            target,
        }
    }

    fn runs_in(self, topology: Topology) -> bool {
        match self {
            Item::Rss => topology == Topology::Single,
            Item::Failover | Item::Put1Follower => topology == Topology::Cluster,
            _ => true,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct SideBySideArgs {
    /// Which deployments: single node, 3 members, or both.
    #[arg(long, value_enum, default_value = "both")]
    pub topology: TopologyArg,
    /// Comma-separated workloads (default: all), run and tabled in the order listed below.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub workloads: Vec<Item>,
    /// Short runs: 3 s measured per run, 1 round, RSS after 100k keys only, 3 kills.
    #[arg(long)]
    pub quick: bool,
    /// Runs per workload per server (alternating etcd, baton, …); tables show medians
    /// [default: 2, --quick 1].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: Option<u64>,
    /// Measured seconds per run, after the warm-up [default: 8, --quick 3]. lease-keepalive
    /// runs at least 7 s (two keep-alive periods).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Unmeasured seconds at the start of each run.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Clients and connections of the multi-client key-value workloads.
    #[arg(long, default_value_t = 100)]
    pub clients: usize,
    #[arg(long, default_value_t = 10)]
    pub conns: usize,
    /// Leases of lease-keepalive (TTL 10 s).
    #[arg(long, default_value_t = 10_000)]
    pub leases: usize,
    /// Key counts after which RSS is read (cumulative: the second fill adds new keys)
    /// [default: 100000,1000000; --quick 100000].
    #[arg(long, value_delimiter = ',')]
    pub rss_keys: Vec<u64>,
    /// Leader kills per server for failover [default: 5, --quick 3].
    #[arg(long)]
    pub kills: Option<usize>,
    /// Also write every raw run and the machine facts as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The markdown report [default: bench/RESULTS.md in the workspace]; `-` for stdout only.
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// The Baton binary [default: target/release/baton in the workspace].
    #[arg(long)]
    pub baton_bin: Option<PathBuf>,
    /// The etcd 3.4 binary (Debian's etcd-server).
    #[arg(long, default_value = "/usr/bin/etcd")]
    pub etcd_bin: PathBuf,
    /// Benchmark one server only.
    #[arg(long, value_enum)]
    pub only: Option<Kind>,
    /// Where the data directories go [default: target/bench-data in the workspace]. Must
    /// be a real disk: on a tmpfs fsync is free and the numbers mean nothing.
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// `--snapshot-count` for both servers [default: each server's own].
    #[arg(long)]
    pub snapshot_count: Option<u64>,
    /// Raft heartbeat and election timeout (ms) for both servers.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,
    #[arg(long, default_value_t = 1000)]
    pub election_ms: u64,
    /// TLS on every port of both servers, client and peer certificates required (etcd's
    /// test certificates; `security`), and this process's clients over TLS.
    #[arg(long)]
    pub tls: bool,
    /// Authentication on in both servers (etcd's simple tokens, each server's default), the
    /// key-value clients a user with read-write on every key (not root, so every request
    /// takes the permission check). Only the put, txn-put workloads.
    #[arg(long)]
    pub auth: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopologyArg {
    Single,
    Cluster,
    Both,
}

/// The workspace root, found from this crate's manifest directory (crates/baton-bench).
pub fn workspace_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Where `cargo build --release -p baton` puts the binary, honouring CARGO_TARGET_DIR.
fn default_baton_bin(root: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| if t.is_relative() { root.join(t) } else { t })
        .unwrap_or_else(|| root.join("target"));
    target.join("release").join("baton")
}

/// A relative path is taken relative to the current directory if it exists there, else to
/// the workspace root.
fn resolve(path: PathBuf, root: &Path) -> PathBuf {
    if path.is_relative() && !path.exists() && root.join(&path).exists() {
        root.join(path)
    } else {
        path
    }
}

struct Plan {
    kinds: Vec<Kind>,
    topologies: Vec<Topology>,
    items: Vec<Item>,
    rounds: usize,
    warmup: Duration,
    duration: Duration,
    rss_keys: Vec<u64>,
    kills: usize,
}

/// The endpoints `item` runs against. A lone client's connection goes to one member, and in
/// 3 members whether that is the leader or a follower (which forwards the write) changes its
/// latency by a hop: `put1` goes to the leader and `put1-follower` to a follower, for both
/// servers alike, rather than to whichever member happens to come first.
fn via(item: Item, all: Vec<String>, leader: usize) -> Vec<String> {
    let pick = match item {
        Item::Put1 if all.len() > 1 => leader,
        Item::Put1Follower => (leader + 1) % all.len(),
        _ => return all,
    };
    vec![all[pick].clone()]
}

fn plan(a: &SideBySideArgs) -> Result<Plan> {
    let kinds = match a.only {
        Some(k) => vec![k],
        None => vec![Kind::Etcd, Kind::Baton],
    };
    let topologies = match a.topology {
        TopologyArg::Single => vec![Topology::Single],
        TopologyArg::Cluster => vec![Topology::Cluster],
        TopologyArg::Both => vec![Topology::Single, Topology::Cluster],
    };
    let mut items = if a.workloads.is_empty() {
        Item::ALL.to_vec()
    } else {
        a.workloads.clone()
    };
    items.sort();
    items.dedup();
    if a.auth {
        // The other workloads' clients (tonic: leases, watches, locks, the range key's
        // preparation, failover's restarts) show no token.
        if let Some(other) = items.iter().find(|i| {
            !matches!(
                i,
                Item::Put1 | Item::Put1Follower | Item::Put100 | Item::TxnPut100
            )
        }) {
            bail!("--auth runs only put1, put1-follower, put100 and txn-put100, not {other:?}");
        }
    }
    let duration = a.duration.unwrap_or(if a.quick { 3.0 } else { 8.0 });
    let mut rss_keys = if a.rss_keys.is_empty() {
        if a.quick {
            vec![100_000]
        } else {
            vec![100_000, 1_000_000]
        }
    } else {
        a.rss_keys.clone()
    };
    rss_keys.sort();
    rss_keys.dedup();
    Ok(Plan {
        kinds,
        topologies,
        items,
        rounds: a.rounds.map_or(if a.quick { 1 } else { 2 }, |r| r as usize),
        warmup: Duration::try_from_secs_f64(a.warmup).context("--warmup")?,
        duration: Duration::try_from_secs_f64(duration)
            .ok()
            .filter(|d| !d.is_zero())
            .context("--duration must be a positive number of seconds")?,
        rss_keys,
        kills: a.kills.unwrap_or(if a.quick { 3 } else { 5 }),
    })
}

/// The whole side-by-side run.
pub async fn side_by_side(args: SideBySideArgs) -> Result<()> {
    let root = workspace_root();
    let plan = plan(&args)?;
    let baton_bin = resolve(
        args.baton_bin
            .clone()
            .unwrap_or_else(|| default_baton_bin(&root)),
        &root,
    );
    let etcd_bin = args.etcd_bin.clone();
    for &kind in &plan.kinds {
        crate::server::ensure_binary(kind, bin(kind, &etcd_bin, &baton_bin))?;
    }
    let data_root = match &args.data_root {
        Some(d) => d.clone(),
        None => root.join("target").join("bench-data"),
    };
    std::fs::create_dir_all(&data_root)
        .with_context(|| format!("creating {}", data_root.display()))?;
    let disk = Disk::probe(&data_root);
    let mut notes = Vec::new();
    if disk.is_tmpfs() {
        eprintln!(
            "warning: {} is a tmpfs: fsync is free there and the numbers mean nothing",
            data_root.display()
        );
        notes.push(format!(
            "**The data was on a tmpfs ({}): fsync cost nothing; these numbers do not \
             reflect a disk.**",
            data_root.display()
        ));
    }
    let tls = if args.tls {
        let files = crate::security::TlsFiles::etcd_fixtures()?;
        crate::security::install(&files)?;
        Some(files)
    } else {
        None
    };
    let settings = Settings {
        heartbeat_ms: args.heartbeat_ms,
        election_ms: args.election_ms,
        snapshot_count: args.snapshot_count,
        tls,
        auth: args.auth,
    };
    let load_average = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    let started = Instant::now();
    let whole_run_steal = StealWindow::start();
    let mut samples: Vec<Sample> = Vec::new();

    for &topology in &plan.topologies {
        let items: Vec<Item> = plan
            .items
            .iter()
            .copied()
            .filter(|i| i.runs_in(topology))
            .collect();
        let client_items: Vec<Item> = items
            .iter()
            .copied()
            .filter(|i| i.spec(&args).is_some())
            .collect();
        if !client_items.is_empty() || items.contains(&Item::Failover) {
            // Both deployments stay up for all client workloads of this topology (the idle one
            // costs next to nothing); restarting per run would make every run a cold start.
            let mut deployments = BTreeMap::new();
            for &kind in &plan.kinds {
                eprintln!("starting {kind}, {topology} …");
                let d = Deployment::start(
                    kind,
                    bin(kind, &etcd_bin, &baton_bin),
                    topology,
                    &data_root,
                    &settings,
                )
                .await?;
                deployments.insert(kind, d);
            }
            for &item in &client_items {
                let spec = item.spec(&args).expect("client item");
                let mut duration = plan.duration;
                if item == Item::LeaseKeepalive {
                    duration = duration.max(Duration::from_secs(7));
                }
                for round in 0..plan.rounds {
                    let mut order = plan.kinds.clone();
                    if round % 2 == 1 {
                        order.reverse();
                    }
                    for kind in order {
                        let d = deployments.get_mut(&kind).expect("started");
                        eprint!(
                            "[{:>4.0} s] {topology} | {} | {kind} | round {}/{} … ",
                            started.elapsed().as_secs_f64(),
                            spec.label(),
                            round + 1,
                            plan.rounds
                        );
                        let leader = d.wait_ready().await?;
                        let mut pids: Vec<u32> = d.pid(leader).into_iter().collect();
                        pids.extend(
                            (0..topology.members())
                                .filter(|&i| i != leader)
                                .filter_map(|i| d.pid(i)),
                        );
                        let endpoints = via(item, d.endpoints(), leader);
                        let steal = StealWindow::start();
                        let run = run_spec(&spec, &endpoints, plan.warmup, duration, false, &pids)
                            .await
                            .with_context(|| {
                                format!("{} against {kind} ({topology})", spec.label())
                            });
                        let steal_pct = steal.pct();
                        d.check_alive()?;
                        // Logs of a run that failed or saw errors outlive the deployment.
                        let logs_note = match &run {
                            Ok(r) if r.errors == 0 => String::new(),
                            _ => {
                                let dest = data_root.join(format!(
                                    "logs-{kind}-{}-{}-round{}",
                                    topology.members(),
                                    item.id(),
                                    round + 1
                                ));
                                match d.save_logs(&dest) {
                                    Ok(()) => format!(" (logs: {})", dest.display()),
                                    Err(e) => format!(" (logs not saved: {e:#})"),
                                }
                            }
                        };
                        // A run that fails (no request succeeded: a stalled server, or a
                        // stalled disk on a shared machine) costs a note, not the benchmark.
                        let run = match run {
                            Ok(run) => run,
                            Err(e) => {
                                eprintln!("failed: {e:#}");
                                notes.push(format!(
                                    "{topology}, {}, {kind}, round {}: **the run failed**: \
                                     {e:#}{logs_note}",
                                    spec.label(),
                                    round + 1
                                ));
                                continue;
                            }
                        };
                        let (value, p50, p99) = match item {
                            Item::LeaseKeepalive => (
                                run.extra("server_cpu_pct").unwrap_or(f64::NAN),
                                Some(run.p50_ms),
                                Some(run.p99_ms),
                            ),
                            Item::WatchLatency => (
                                run.extra("send_to_event_p50_ms").unwrap_or(f64::NAN),
                                Some(run.p50_ms),
                                Some(run.p99_ms),
                            ),
                            _ => (run.ops_per_sec, Some(run.p50_ms), Some(run.p99_ms)),
                        };
                        let errors = if run.errors > 0 {
                            notes.push(format!(
                                "{topology}, {}, {kind}, round {}: {} errors (first: {}){logs_note}",
                                spec.label(),
                                round + 1,
                                run.errors,
                                run.first_error.as_deref().unwrap_or("?")
                            ));
                            format!(", {} errors", run.errors)
                        } else {
                            String::new()
                        };
                        // The CPU figure means something only if the load was delivered.
                        if let Some(expected) = run.extra("expected_keep_alives_per_sec") {
                            if run.ops_per_sec < 0.9 * expected {
                                notes.push(format!(
                                    "{topology}, {}, {kind}, round {}: **only {:.0} of the \
                                     expected {expected:.0} keep-alives/s were answered**, so \
                                     its CPU figure is not that of the full load (a stalled \
                                     server or disk?)",
                                    spec.label(),
                                    round + 1,
                                    run.ops_per_sec
                                ));
                            }
                        }
                        let setup = match (run.extra("grant_secs"), run.extra("revoke_secs")) {
                            (Some(g), Some(r)) => {
                                format!(", leases granted in {g:.1} s, revoked in {r:.1} s")
                            }
                            _ => String::new(),
                        };
                        let stolen = match steal_pct {
                            Some(pct) if pct >= NOTABLE_STEAL_PCT => {
                                notes.push(format!(
                                    "{topology}, {}, {kind}, round {}: the hypervisor stole \
                                     {pct:.1} % of the CPU time during the run",
                                    spec.label(),
                                    round + 1
                                ));
                                format!(", {pct:.1} % stolen")
                            }
                            _ => String::new(),
                        };
                        eprintln!(
                            "{} {}, p50 {:.3} ms, p99 {:.3} ms, client {:.1} µs/op{setup}{errors}{stolen}",
                            crate::results::fmt_value(value, &item.row(topology, &args).unit),
                            item.row(topology, &args).unit,
                            run.p50_ms,
                            run.p99_ms,
                            run.client_cpu_us_per_op.unwrap_or(f64::NAN)
                        );
                        samples.push(Sample {
                            topology,
                            row: item.id(),
                            server: kind,
                            round,
                            value,
                            p50_ms: p50,
                            p99_ms: p99,
                            run: Some(run),
                            steal_pct,
                        });
                    }
                }
            }
            if items.contains(&Item::Failover) {
                failover(&mut deployments, &plan, &mut samples, &mut notes, started).await?;
            }
        }
        if items.contains(&Item::Rss) {
            rss(
                &plan,
                &etcd_bin,
                &baton_bin,
                &data_root,
                &settings,
                &args,
                &mut samples,
                started,
            )
            .await?;
        }
    }

    // The rows, in item order, per topology.
    let mut rows = Vec::new();
    for &topology in &plan.topologies {
        for &item in &plan.items {
            if !item.runs_in(topology) {
                continue;
            }
            let specs: Vec<RowSpec> = match item {
                Item::Rss => plan
                    .rss_keys
                    .iter()
                    .map(|&n| RowSpec {
                        id: format!("rss-{n}"),
                        label: format!("RSS after {} distinct 256 B keys", count(n)),
                        unit: "MiB".into(),
                        lower_is_better: true,
                        target: (n == 100_000).then_some(Target::RatioAtMost(1.0 / 3.0)),
                    })
                    .collect(),
                Item::Failover => vec![RowSpec {
                    id: "failover".into(),
                    label: "failover: kill -9 leader → next successful write, median".into(),
                    unit: "ms".into(),
                    lower_is_better: true,
                    target: Some(Target::BatonAtMost(1000.0)),
                }],
                _ => vec![item.row(topology, &args)],
            };
            for spec in specs {
                let mine: Vec<&Sample> = samples
                    .iter()
                    .filter(|s| s.topology == topology && s.row == spec.id)
                    .collect();
                if !mine.is_empty() {
                    rows.push(Row::from_samples(topology, spec, &mine));
                }
            }
        }
    }
    if plan.items.contains(&Item::Failover) {
        for kind in &plan.kinds {
            let v: Vec<f64> = samples
                .iter()
                .filter(|s| s.row == "failover" && s.server == *kind)
                .map(|s| s.value)
                .collect();
            if !v.is_empty() {
                notes.push(format!(
                    "failover, {kind}: {} kills, median {:.0} ms, max {:.0} ms (all: {})",
                    v.len(),
                    report::median(v.iter().copied()),
                    v.iter().copied().fold(0.0, f64::max),
                    v.iter()
                        .map(|x| format!("{x:.0}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    let mut settings_text = vec![
        format!(
            "both servers: fsync on (their default), heartbeat {} ms, election timeout {} ms, \
             snapshot count {}; --quota-backend-bytes 8 GiB; members on loopback; {}",
            settings.heartbeat_ms,
            settings.election_ms,
            settings
                .snapshot_count
                .map_or("each server's default".to_string(), |c| c.to_string()),
            match (settings.tls.is_some(), settings.auth) {
                (true, true) =>
                    "TLS on every port, client and peer certificates required \
                     (--tls: etcd's test certificates, RSA 2048); authentication on (--auth: \
                     simple tokens, a non-root user with read-write on every key)",
                (true, false) =>
                    "TLS on every port, client and peer certificates required \
                     (--tls: etcd's test certificates, RSA 2048)",
                (false, true) =>
                    "plain text; authentication on (--auth: simple tokens, a \
                     non-root user with read-write on every key)",
                (false, false) => "plain text, no authentication",
            }
        ),
        format!(
            "runs: {:.0} s warm-up + {:.0} s measured (lease keep-alive ≥7 s), {} round(s) per \
             server alternating etcd/baton (order flipped every round); client: `baton bench` \
             engine in-process (key-value, lock and election calls: hand-rolled gRPC over h2; \
             lease keep-alive streams, watch and failover writer: tonic), {} clients / {} \
             connections for the multi-client key-value rows; in 3-member runs the \
             connections are spread over all members, except the lone client of put, 1 \
             client (to the leader, or to a follower in its own row)",
            plan.warmup.as_secs_f64(),
            plan.duration.as_secs_f64(),
            plan.rounds,
            args.clients,
            args.conns
        ),
    ];
    if plan.items.contains(&Item::Rss) {
        settings_text.push(format!(
            "RSS: fresh single-node servers, keys written once each by put at {} clients / {} \
             connections, VmRSS read 2 s after the last write; counts cumulative ({})",
            args.clients,
            args.conns,
            plan.rss_keys
                .iter()
                .map(|&n| count(n))
                .collect::<Vec<_>>()
                .join(", then ")
        ));
    }
    if plan.items.contains(&Item::Failover) {
        settings_text.push(
            "failover: 3 members; a writer sends a put every 5 ms round-robin to all members \
             (2 s timeout each); time from kill -9 of the leader (found with \
             Maintenance.Status) to the completion of the first successful write sent after \
             the kill; the member is restarted and the cluster settles between kills"
                .into(),
        );
    }
    let (head, dirty) = report::git_state(&root);
    let commit = match (head, dirty) {
        (Some(h), Some(true)) => format!("{}-dirty", &h[..h.len().min(12)]),
        (Some(h), _) => h[..h.len().min(12)].to_string(),
        (None, _) => "unknown".into(),
    };
    let command = std::iter::once("baton-bench side-by-side".to_string())
        .chain(std::env::args().skip(2))
        .collect::<Vec<_>>()
        .join(" ");
    let report = Report {
        meta: Meta {
            date_utc: report::utc_now(),
            commit,
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model: report::cpu_model(),
            mem_total_bytes: report::mem_total_bytes(),
            load_average,
            steal_pct: whole_run_steal.pct(),
            disk,
            etcd: plan
                .kinds
                .contains(&Kind::Etcd)
                .then(|| Binary::describe(&etcd_bin)),
            baton: plan
                .kinds
                .contains(&Kind::Baton)
                .then(|| Binary::describe(&baton_bin)),
            settings: settings_text,
            command,
        },
        rows,
        notes,
        samples,
    };
    let results = args
        .results
        .clone()
        .unwrap_or_else(|| root.join("bench").join("RESULTS.md"));
    write_report(&report, &results)?;
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("encoding the JSON report")?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
        eprintln!("raw runs written to {}", path.display());
    }
    Ok(())
}

/// Writes the markdown report and the SVG next to it (or the markdown to stdout for `-`).
fn write_report(report: &Report, results: &Path) -> Result<()> {
    if results.as_os_str() == "-" {
        print!("{}", report.markdown(None));
        return Ok(());
    }
    let svg_path = results.with_file_name("results.svg");
    std::fs::write(&svg_path, report.svg())
        .with_context(|| format!("writing {}", svg_path.display()))?;
    let md = report.markdown(Some("results.svg"));
    std::fs::write(results, &md).with_context(|| format!("writing {}", results.display()))?;
    print!("{md}");
    eprintln!(
        "report written to {} and {}",
        results.display(),
        svg_path.display()
    );
    Ok(())
}

/// `baton-bench render`: the markdown report and the SVG again from a `--json` file, e.g.
/// after a change to how they are drawn, without running anything.
pub fn render(json: &Path, results: Option<PathBuf>) -> Result<()> {
    let text =
        std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    let report: Report = serde_json::from_str(&text).context("decoding the JSON report")?;
    let results = results.unwrap_or_else(|| workspace_root().join("bench").join("RESULTS.md"));
    write_report(&report, &results)
}

fn bin<'a>(kind: Kind, etcd: &'a Path, baton: &'a Path) -> &'a Path {
    match kind {
        Kind::Etcd => etcd,
        Kind::Baton => baton,
    }
}

/// `100k`, `1M`, or the plain number.
fn count(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// Failover on the 3-member deployments: kills alternate between the servers.
async fn failover(
    deployments: &mut BTreeMap<Kind, Deployment>,
    plan: &Plan,
    samples: &mut Vec<Sample>,
    notes: &mut Vec<String>,
    started: Instant,
) -> Result<()> {
    for k in 0..plan.kills {
        let mut order = plan.kinds.clone();
        if k % 2 == 1 {
            order.reverse();
        }
        for kind in order {
            let d = deployments.get_mut(&kind).expect("started");
            eprint!(
                "[{:>4.0} s] 3 members | failover | {kind} | kill {}/{} … ",
                started.elapsed().as_secs_f64(),
                k + 1,
                plan.kills
            );
            let leader = d.wait_ready().await?;
            let endpoints = d.endpoints();
            let writer = Writer::start(&endpoints)?;
            // The writer round-robins over the members: two successes per member since it
            // started mean it is connected everywhere and writing before the kill.
            let since = Instant::now();
            let settle_by = since + Duration::from_secs(10);
            while writer.successes_sent_after(since) < 2 * endpoints.len() {
                if Instant::now() > settle_by {
                    bail!("{kind}: the failover writer got no steady successes within 10 s");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let killed_at = d.kill9(leader);
            let deadline = killed_at + Duration::from_secs(30);
            let recovered = loop {
                if let Some(done) = writer.first_success_sent_after(killed_at) {
                    break Some(done);
                }
                if Instant::now() > deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            drop(writer.stop());
            match recovered {
                Some(done) => {
                    let ms = (done - killed_at).as_secs_f64() * 1000.0;
                    eprintln!("next write {ms:.0} ms after the kill");
                    samples.push(Sample {
                        topology: Topology::Cluster,
                        row: "failover".into(),
                        server: kind,
                        round: k,
                        value: ms,
                        p50_ms: None,
                        p99_ms: None,
                        run: None,
                        steal_pct: None,
                    });
                }
                None => {
                    eprintln!("no successful write within 30 s");
                    notes.push(format!(
                        "failover, {kind}, kill {}: no successful write within 30 s",
                        k + 1
                    ));
                }
            }
            d.restart(leader)?;
            d.wait_ready().await?;
            // The restarted member catches up before the next kill.
            d.wait_caught_up().await?;
        }
    }
    Ok(())
}

/// RSS after writing exactly N distinct keys once, on fresh single-node servers.
#[allow(clippy::too_many_arguments)]
async fn rss(
    plan: &Plan,
    etcd_bin: &Path,
    baton_bin: &Path,
    data_root: &Path,
    settings: &Settings,
    args: &SideBySideArgs,
    samples: &mut Vec<Sample>,
    started: Instant,
) -> Result<()> {
    for &kind in &plan.kinds {
        let mut d = Deployment::start(
            kind,
            bin(kind, etcd_bin, baton_bin),
            Topology::Single,
            data_root,
            settings,
        )
        .await?;
        let pid = d.pid(0).context("just started")?;
        let mut written = 0u64;
        for &n in &plan.rss_keys {
            eprint!(
                "[{:>4.0} s] single node | RSS | {kind} | writing keys {written}..{n} … ",
                started.elapsed().as_secs_f64()
            );
            let load = KvLoad {
                op: KvOp::Put,
                clients: args.clients,
                conns: args.conns,
                key_space: n,
                value_size: 256,
                total: Some(n - written),
                key_offset: written,
                client: ClientImpl::H2,
            };
            let endpoints = d.endpoints();
            let run = crate::kv::run(&endpoints, &load, Duration::ZERO, Duration::ZERO, false)
                .await
                .with_context(|| format!("filling {kind} with keys {written}..{n}"))?;
            written = n;
            tokio::time::sleep(Duration::from_secs(2)).await;
            d.check_alive()?;
            let rss = process_rss_bytes(pid).context("reading VmRSS")?;
            let mib = rss as f64 / (1u64 << 20) as f64;
            eprintln!("{:.0} puts/s, VmRSS {mib:.0} MiB", run.ops_per_sec);
            samples.push(Sample {
                topology: Topology::Single,
                row: format!("rss-{n}"),
                server: kind,
                round: 0,
                value: mib,
                p50_ms: None,
                p99_ms: None,
                run: Some(run),
                steal_pct: None,
            });
        }
        if written > 0 {
            let du = dir_size(d.data_dir());
            eprintln!(
                "{kind} data directory after {}: {:.0} MiB",
                count(written),
                du as f64 / (1u64 << 20) as f64
            );
        }
    }
    Ok(())
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SideBySideArgs,
    }

    fn plan_of(argv: &[&str]) -> Plan {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(argv.iter().copied())).unwrap();
        plan(&cli.args).unwrap()
    }

    #[test]
    fn quick_and_full_plans() {
        let full = plan_of(&[]);
        assert_eq!(full.rounds, 2);
        assert_eq!(full.duration, Duration::from_secs(8));
        assert_eq!(full.rss_keys, vec![100_000, 1_000_000]);
        assert_eq!(full.kills, 5);
        assert_eq!(full.items, Item::ALL.to_vec());
        assert_eq!(full.topologies, vec![Topology::Single, Topology::Cluster]);
        let quick = plan_of(&[
            "--quick",
            "--topology",
            "single",
            "--workloads",
            "rss,put1,put1",
        ]);
        assert_eq!(quick.rounds, 1);
        assert_eq!(quick.duration, Duration::from_secs(3));
        assert_eq!(quick.rss_keys, vec![100_000]);
        assert_eq!(quick.kills, 3);
        assert_eq!(quick.items, vec![Item::Put1, Item::Rss]);
        assert_eq!(quick.topologies, vec![Topology::Single]);
        let only = plan_of(&["--only", "baton", "--rounds", "3", "--duration", "1.5"]);
        assert_eq!(only.kinds, vec![Kind::Baton]);
        assert_eq!(only.rounds, 3);
        assert_eq!(only.duration, Duration::from_millis(1500));
    }

    #[test]
    fn a_lone_client_goes_to_the_leader_or_a_follower_as_its_row_says() {
        let all: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(via(Item::Put1, all.clone(), 2), vec!["c"]);
        assert_eq!(via(Item::Put1Follower, all.clone(), 2), vec!["a"]);
        assert_eq!(via(Item::Put100, all.clone(), 2), all);
        assert_eq!(via(Item::Put1, vec!["x".into()], 0), vec!["x"]);
    }

    #[test]
    fn rows_have_the_targets_of_the_issue() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        let t = |item: Item, topo| item.row(topo, &cli.args).target;
        assert_eq!(
            t(Item::Put100, Topology::Single),
            Some(Target::RatioAtLeast(3.0))
        );
        assert_eq!(
            t(Item::Put100, Topology::Cluster),
            Some(Target::RatioAtLeast(2.0))
        );
        assert_eq!(
            t(Item::Put1, Topology::Single),
            Some(Target::RatioAtLeast(1.5))
        );
        assert_eq!(
            t(Item::RangeL100, Topology::Single),
            Some(Target::RatioAtLeast(2.0))
        );
        assert_eq!(
            t(Item::LockContended, Topology::Single),
            Some(Target::RatioAtLeast(10.0))
        );
        assert_eq!(
            t(Item::LockDistinct, Topology::Single),
            Some(Target::RatioAtLeast(3.0))
        );
        assert_eq!(
            t(Item::LeaseKeepalive, Topology::Single),
            Some(Target::BatonBelow(5.0))
        );
        assert!(Item::Rss.runs_in(Topology::Single) && !Item::Rss.runs_in(Topology::Cluster));
        assert!(!Item::Failover.runs_in(Topology::Single));
        assert_eq!(count(100_000), "100k");
        assert_eq!(count(1_000_000), "1M");
        assert_eq!(count(1234), "1234");
    }
}
