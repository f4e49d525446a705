//! `baton bench`: one workload against any etcd-API server, with a progress line on stderr
//! and a table (or JSON) on stdout. The orchestrator (`baton-bench side-by-side`) runs the
//! very same [`Spec`]s in-process.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::engine::RunResult;
use crate::kv::{self, ClientImpl, KvLoad, KvOp};
use crate::v3lock::{self, ElectionLoad, LockLoad};
use crate::watch_create::{self, WatchCreateLoad};
use crate::{failover, lease, watch};

/// The workloads `baton bench` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BenchWorkload {
    /// KV.Put of random keys from --key-space, --value-size bytes each.
    Put,
    /// KV.Txn with one Put in its success branch (no compare).
    TxnPut,
    /// KV.Range of one key (--consistency l: linearizable, s: serializable).
    Range,
    /// --leases leases of --ttl seconds, each kept alive every TTL/3 over a few streams.
    LeaseKeepalive,
    /// One writer puts one key after another; a watcher receives the events.
    WatchLatency,
    /// --streams watch streams on --conns connections, --watchers-per-stream watchers each on
    /// one key, created back to back; repeated until the window closes (etcd's `benchmark watch`).
    WatchCreate,
    /// v3lock Lock/Unlock cycles: --contenders on one lock, or on one lock each (--distinct).
    Lock,
    /// v3election Campaign → Resign cycles among --contenders on one election.
    ElectionHandoff,
    /// One writer that keeps writing over all endpoints and reports the gaps between
    /// successful writes (kill the leader meanwhile to see a failover).
    Failover,
}

/// `--consistency` of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
pub enum Consistency {
    /// Linearizable (the default): the server confirms leadership (ReadIndex) first.
    L,
    /// Serializable: served from the member's local state.
    S,
}

/// `-o` of `baton bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Args, Debug, Clone)]
#[command(
    about = "Benchmark one workload against any etcd-API server (Baton or etcd)",
    long_about = "Run one workload against --endpoints (Baton, etcd, anything that speaks the \
                  etcd v3 API), with a progress line on stderr, and print the result as a \
                  table (default) or JSON (-o json).\n\nThe client is lean and the same for \
                  every server: the generated tonic clients on --conns HTTP/2 connections, \
                  many requests in flight on each. Throughput counts requests that complete \
                  inside the measured window (after --warmup); latency is per request.\n\n\
                  To compare Baton with etcd on one machine, use `baton-bench side-by-side` \
                  or scripts/bench (see bench/README.md).",
    after_help = "Examples:\n  \
                  baton bench put --clients 100 --conns 10\n  \
                  baton bench put --clients 1 --conns 1 --duration 5\n  \
                  baton bench range --consistency s -o json\n  \
                  baton bench lock --contenders 10\n  \
                  baton bench lock --contenders 50 --distinct\n  \
                  baton bench lease-keepalive --leases 10000 --ttl 10\n  \
                  baton bench put --total 100000 --clients 100   # exactly 100k distinct keys"
)]
pub struct BenchArgs {
    /// What to run.
    #[arg(value_enum)]
    pub workload: BenchWorkload,
    /// Comma-separated gRPC endpoints (host:port or http://host:port); connections are spread
    /// over them round-robin.
    #[arg(long, default_value = "127.0.0.1:2379", value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Concurrent closed-loop clients (put, txn-put, range).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub clients: u64,
    /// HTTP/2 connections the clients share (put, txn-put, range, lease-keepalive streams).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub conns: u64,
    /// Measured seconds, after the warm-up.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Unmeasured seconds at the start.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Puts choose keys at random among this many (8-byte keys, as etcd's benchmark).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub key_space: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// put/txn-put: write keys 0..N exactly once each and stop (no warm-up, no duration).
    #[arg(long, value_name = "N")]
    pub total: Option<u64>,
    /// range: l (linearizable) or s (serializable).
    #[arg(long, value_enum, default_value = "l")]
    pub consistency: Consistency,
    /// lease-keepalive: number of leases.
    #[arg(long, default_value_t = 10_000)]
    pub leases: u64,
    /// lease-keepalive, lock, election-handoff: lease TTL in seconds.
    #[arg(long, default_value_t = 10)]
    pub ttl: u64,
    /// lock, election-handoff: contenders, each with its own connection and session.
    #[arg(long, default_value_t = 10)]
    pub contenders: u64,
    /// lock: each contender on a lock of its own (uncontended cycles) instead of one lock.
    #[arg(long)]
    pub distinct: bool,
    /// watch-create: watch streams per round.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub streams: u64,
    /// watch-create: watchers created on each stream per round.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub watchers_per_stream: u64,
    /// put, txn-put, range: the gRPC client (h2: the lean hand-rolled one; tonic: the
    /// generated one, for comparing client costs).
    #[arg(long, value_enum, default_value = "h2", hide = true)]
    pub client: ClientImpl,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
    /// No progress line on stderr.
    #[arg(long)]
    pub no_progress: bool,
}

/// A fully resolved workload: what the CLI and the orchestrator both run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Spec {
    Kv(KvLoad),
    LeaseKeepalive(lease::LeaseLoad),
    WatchLatency { value_size: usize },
    WatchCreate(WatchCreateLoad),
    Lock(LockLoad),
    ElectionHandoff(ElectionLoad),
    Failover,
}

impl Spec {
    pub fn from_args(a: &BenchArgs) -> Result<Spec> {
        let kv = |op| {
            Spec::Kv(KvLoad {
                op,
                clients: a.clients as usize,
                conns: a.conns as usize,
                key_space: a.key_space,
                value_size: a.value_size,
                total: a.total,
                key_offset: 0,
                client: a.client,
            })
        };
        if a.total.is_some() && !matches!(a.workload, BenchWorkload::Put | BenchWorkload::TxnPut) {
            bail!("--total applies to put and txn-put only");
        }
        if a.ttl == 0 {
            bail!("--ttl must be at least 1");
        }
        Ok(match a.workload {
            BenchWorkload::Put => kv(KvOp::Put),
            BenchWorkload::TxnPut => kv(KvOp::TxnPut),
            BenchWorkload::Range => kv(KvOp::Range {
                serializable: a.consistency == Consistency::S,
            }),
            BenchWorkload::LeaseKeepalive => Spec::LeaseKeepalive(lease::LeaseLoad {
                leases: a.leases as usize,
                ttl_secs: a.ttl,
                streams: a.conns as usize,
            }),
            BenchWorkload::WatchLatency => Spec::WatchLatency {
                value_size: a.value_size,
            },
            BenchWorkload::WatchCreate => Spec::WatchCreate(WatchCreateLoad {
                streams: a.streams as usize,
                watchers_per_stream: a.watchers_per_stream as usize,
                conns: a.conns as usize,
            }),
            BenchWorkload::Lock => Spec::Lock(LockLoad {
                contenders: a.contenders as usize,
                locks: if a.distinct { a.contenders as usize } else { 1 },
                ttl_secs: a.ttl,
            }),
            BenchWorkload::ElectionHandoff => Spec::ElectionHandoff(ElectionLoad {
                contenders: a.contenders as usize,
                ttl_secs: a.ttl,
            }),
            BenchWorkload::Failover => Spec::Failover,
        })
    }

    /// A one-line description, e.g. `put, 100 clients / 10 conns`.
    pub fn label(&self) -> String {
        match self {
            Spec::Kv(load) => kv::label(load),
            Spec::LeaseKeepalive(l) => format!(
                "lease keep-alive, {} leases, TTL {} s",
                l.leases, l.ttl_secs
            ),
            Spec::WatchLatency { .. } => "watch latency, 1 writer / 1 watcher".into(),
            Spec::WatchCreate(w) => w.label(),
            Spec::Lock(l) => l.label(),
            Spec::ElectionHandoff(e) => format!("election handoff, {} contenders", e.contenders),
            Spec::Failover => "failover writer".into(),
        }
    }

    /// What one operation is.
    pub fn unit(&self) -> &'static str {
        match self {
            Spec::Kv(_) | Spec::Failover => "ops",
            Spec::LeaseKeepalive(_) => "keep-alives",
            Spec::WatchLatency { .. } => "events",
            Spec::WatchCreate(_) => "watchers",
            Spec::Lock(_) => "cycles",
            Spec::ElectionHandoff(_) => "handoffs",
        }
    }
}

/// Runs `spec` against `endpoints`. `server_pids` (the leader first), if given, are the
/// server processes whose CPU use lease-keepalive reports.
pub async fn run_spec(
    spec: &Spec,
    endpoints: &[String],
    warmup: Duration,
    duration: Duration,
    progress: bool,
    server_pids: &[u32],
) -> Result<RunResult> {
    match spec {
        Spec::Kv(load) => kv::run(endpoints, load, warmup, duration, progress).await,
        Spec::LeaseKeepalive(load) => {
            lease::run(endpoints, load, warmup, duration, progress, server_pids).await
        }
        Spec::WatchLatency { value_size } => {
            watch::run(endpoints, *value_size, warmup, duration, progress).await
        }
        Spec::WatchCreate(load) => {
            watch_create::run(endpoints, load, warmup, duration, progress).await
        }
        Spec::Lock(load) => v3lock::run_lock(endpoints, load, warmup, duration, progress).await,
        Spec::ElectionHandoff(load) => {
            v3lock::run_election(endpoints, load, warmup, duration, progress).await
        }
        Spec::Failover => failover::run(endpoints, warmup, duration, progress).await,
    }
}

/// `baton bench`: runs the workload and prints the result; the error is the caller's to show.
pub async fn run(args: BenchArgs) -> Result<()> {
    let spec = Spec::from_args(&args)?;
    let warmup = secs(args.warmup, "--warmup")?;
    let duration = secs(args.duration, "--duration")?;
    if duration.is_zero() {
        bail!("--duration must be above 0");
    }
    let result = run_spec(
        &spec,
        &args.endpoints,
        warmup,
        duration,
        !args.no_progress,
        &[],
    )
    .await?;
    match args.output {
        Output::Table => print!("{}", render_table(&spec, &args.endpoints, &result)),
        Output::Json => {
            let json = serde_json::json!({
                "workload": spec,
                "label": spec.label(),
                "endpoints": args.endpoints,
                "warmup_secs": warmup.as_secs_f64(),
                "result": result,
            });
            println!("{json}");
        }
    }
    Ok(())
}

fn secs(v: f64, flag: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| anyhow::anyhow!("{flag}: {v} is not a duration in seconds"))
}

/// The result as two aligned columns.
pub fn render_table(spec: &Spec, endpoints: &[String], r: &RunResult) -> String {
    let unit = spec.unit();
    let mut rows: Vec<(String, String)> = vec![
        ("workload".into(), spec.label()),
        ("endpoints".into(), endpoints.join(",")),
        ("measured".into(), format!("{:.1} s", r.seconds)),
        (unit.into(), r.ops.to_string()),
        (
            "throughput".into(),
            format!("{:.0} {unit}/s", r.ops_per_sec),
        ),
        (
            "latency".into(),
            format!(
                "p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
                fmt_ms(r.p50_ms),
                fmt_ms(r.p90_ms),
                fmt_ms(r.p99_ms),
                fmt_ms(r.max_ms)
            ),
        ),
        ("errors".into(), r.errors.to_string()),
    ];
    if let Some(e) = &r.first_error {
        rows.push(("first error".into(), e.clone()));
    }
    if let Some(cpu) = r.client_cpu_us_per_op {
        rows.push((
            "client CPU".into(),
            format!("{cpu:.1} µs/{}", unit.trim_end_matches('s')),
        ));
    }
    for (name, value) in &r.extra {
        rows.push((name.replace('_', " "), format_extra(name, *value)));
    }
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<width$}  {v}");
    }
    out
}

fn format_extra(name: &str, v: f64) -> String {
    if name.ends_with("_ms") {
        fmt_ms(v)
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Sub-millisecond latencies need a third decimal to be told apart; larger ones don't.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(argv: &[&str]) -> Result<Spec> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(argv.iter().copied()))?;
        Spec::from_args(&cli.args)
    }

    #[test]
    fn arguments_resolve_to_specs() {
        match parse(&["put", "--clients", "1", "--conns", "1"]).unwrap() {
            Spec::Kv(l) => assert_eq!((l.op, l.clients, l.conns, l.total), (KvOp::Put, 1, 1, None)),
            s => panic!("{s:?}"),
        }
        match parse(&["range", "--consistency", "s"]).unwrap() {
            Spec::Kv(l) => assert_eq!(l.op, KvOp::Range { serializable: true }),
            s => panic!("{s:?}"),
        }
        match parse(&["lock", "--contenders", "50", "--distinct"]).unwrap() {
            Spec::Lock(l) => assert_eq!((l.contenders, l.locks), (50, 50)),
            s => panic!("{s:?}"),
        }
        match parse(&["lock"]).unwrap() {
            Spec::Lock(l) => assert_eq!((l.contenders, l.locks), (10, 1)),
            s => panic!("{s:?}"),
        }
        match parse(&["lease-keepalive"]).unwrap() {
            Spec::LeaseKeepalive(l) => assert_eq!((l.leases, l.ttl_secs), (10_000, 10)),
            s => panic!("{s:?}"),
        }
        assert!(parse(&["range", "--total", "5"]).is_err());
        assert!(parse(&["put", "--clients", "0"]).is_err());
        assert!(parse(&["nope"]).is_err());
    }

    #[test]
    fn table_rendering() {
        let spec = parse(&["put", "--clients", "100", "--conns", "10"]).unwrap();
        let r = RunResult {
            ops: 1000,
            seconds: 2.0,
            ops_per_sec: 500.0,
            p50_ms: 0.5,
            p90_ms: 1.0,
            p99_ms: 12.345,
            max_ms: 20.0,
            client_cpu_us_per_op: Some(9.87),
            extra: vec![("ack_to_event_p50_ms".into(), 0.25)],
            ..Default::default()
        };
        let t = render_table(&spec, &["a:1".into()], &r);
        assert!(
            t.contains("workload             put, 100 clients / 10 conns\n"),
            "{t}"
        );
        assert!(t.contains("throughput           500 ops/s\n"), "{t}");
        assert!(t.contains("p50 0.500 ms, p90 1.00 ms, p99 12.35 ms"), "{t}");
        assert!(t.contains("client CPU           9.9 µs/op"), "{t}");
        assert!(t.contains("ack to event p50 ms  0.250"), "{t}");
    }
}
