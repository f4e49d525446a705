//! `baton-bench`: runs Baton and etcd 3.4 side by side on this machine, with the same client
//! (the `etcd-client` crate) and the same workloads, and prints throughput, p50/p99 latency and
//! the Baton/etcd throughput ratio.
//!
//! Why side by side rather than against published etcd numbers: absolute numbers depend on
//! the machine (cores, disk, fsync latency) far more than on either server, so the only figure
//! that means something is the ratio measured on one machine, in one session, with one client.
//!
//! This is deliberately a binary and not a `#[test]` or `cargo bench` target: it starts real
//! servers, takes minutes, and its numbers are for people to read, not for CI to assert on.
//! See `bench/README.md` for how to run it and how to read the results.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use baton_bench::report::{self, Binary, Meta, Report, Sample};
use baton_bench::server::{self, Kind, Server};
use baton_bench::workload::{self, Group, LoadConfig, Selection, Workload};
use baton_bench::{kv, locks};

#[derive(Parser)]
#[command(
    name = "baton-bench",
    about = "Benchmark Baton against etcd 3.4 on this machine, with the same client and workloads"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start etcd and Baton, run every workload against each alternately, print a table.
    SideBySide(SideBySideArgs),
}

#[derive(Args, Debug)]
struct SideBySideArgs {
    /// Measured seconds per run, after the warm-up [default: 10 for kv workloads, 5 for lock
    /// workloads]. Given explicitly, it applies to every workload.
    #[arg(long)]
    duration_secs: Option<u64>,
    /// Unmeasured seconds at the start of each run, so that connection setup and the first
    /// requests' one-off costs do not count.
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Runs per workload per server; the table shows the median over rounds.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Also write every run's raw numbers and the machine facts to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The Baton binary (default: target/release/baton in the workspace; build it with
    /// `cargo build --release -p baton`).
    #[arg(long)]
    baton_bin: Option<PathBuf>,
    /// The etcd 3.4 binary (Debian's etcd-server).
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd_bin: PathBuf,
    /// Benchmark only one of the two servers.
    #[arg(long, value_enum)]
    only: Option<Kind>,
    /// Comma-separated workloads or groups to run (default: all). `kv` and `locks` name the two
    /// groups. Workloads always run (and are tabled) in the order of the possible values
    /// below, whatever the order given, so each baton.v1 row sits under its v3lock row.
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Selection>,
    /// Concurrent clients in the multi-client workloads.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    clients: u64,
    /// gRPC connections (`Client` instances) the multi-client workloads share.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    conns: u64,
    /// Number of distinct keys the put workloads choose from at random.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    key_space: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 256)]
    value_size: usize,
    /// TTL of each lock contender's session lease, kept alive in the background. It only
    /// matters if the benchmark stalls: it is what ends a contender that stopped renewing.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    lock_ttl_secs: u64,
    /// Directory in which to create the servers' temporary data directories (default: the
    /// system temp dir). Point it at a real disk if /tmp is a tmpfs, or fsync costs nothing.
    #[arg(long)]
    data_root: Option<PathBuf>,
}

/// The workspace root, found from this crate's manifest directory (crates/baton-bench).
fn workspace_root() -> PathBuf {
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

/// A relative `--baton-bin` is taken relative to the current directory if it exists there,
/// else relative to the workspace root, so the documented `--baton-bin target/release/baton`
/// works from anywhere inside the workspace.
fn resolve_bin(path: PathBuf, root: &Path) -> PathBuf {
    if path.is_relative() && !path.exists() && root.join(&path).exists() {
        root.join(path)
    } else {
        path
    }
}

async fn side_by_side(args: SideBySideArgs) -> Result<()> {
    let root = workspace_root();
    let kinds: Vec<Kind> = match args.only {
        Some(kind) => vec![kind],
        None => vec![Kind::Etcd, Kind::Baton],
    };
    let workloads = workload::resolve(&args.workloads);
    let baton_bin = resolve_bin(
        args.baton_bin
            .clone()
            .unwrap_or_else(|| default_baton_bin(&root)),
        &root,
    );
    let etcd_bin = args.etcd_bin.clone();
    let data_root = args.data_root.clone().unwrap_or_else(std::env::temp_dir);
    let cfg = LoadConfig {
        clients: args.clients as usize,
        conns: args.conns.min(args.clients) as usize,
        key_space: args.key_space,
        value_size: args.value_size,
        warmup: Duration::try_from_secs_f64(args.warmup_secs).context("--warmup-secs")?,
        duration: Duration::from_secs(args.duration_secs.unwrap_or(10)),
        lock_duration: Duration::from_secs(args.duration_secs.unwrap_or(5)),
        lock_ttl: Duration::from_secs(args.lock_ttl_secs),
    };
    if args.duration_secs == Some(0) {
        bail!("--duration-secs must be at least 1");
    }

    // Start everything before measuring anything: a missing binary should fail in seconds, not
    // after the first server's runs. Both servers stay up for the whole benchmark; the idle
    // one costs next to nothing, and restarting per run would make every run a cold start.
    for &kind in &kinds {
        match kind {
            Kind::Etcd => server::ensure_binary(kind, &etcd_bin)?,
            Kind::Baton => server::ensure_binary(kind, &baton_bin)?,
        }
    }
    let mut servers = BTreeMap::new();
    // Runs that cannot happen, and why: printed under the table so a missing row is explained.
    let mut notes = Vec::new();
    // (server, lock API) pairs the server answered UNIMPLEMENTED for.
    let mut unsupported = Vec::new();
    for &kind in &kinds {
        eprintln!("starting {kind} …");
        let server = match kind {
            Kind::Etcd => Server::start_etcd(&etcd_bin, args.data_root.as_deref()).await?,
            Kind::Baton => Server::start_baton(&baton_bin, args.data_root.as_deref()).await?,
        };
        kv::prepare(std::slice::from_ref(&server.endpoint), cfg.value_size)
            .await
            .with_context(|| format!("preparing {kind}"))?;
        // Probe each lock API once before measuring, so that a server without it (Baton
        // before its lock service exists) costs a note instead of the whole benchmark.
        let mut apis = Vec::new();
        for shape in workloads
            .iter()
            .filter(|w| w.runs_on(kind))
            .filter_map(|w| w.lock_shape())
        {
            if !apis.contains(&shape.api) {
                apis.push(shape.api);
            }
        }
        for api in apis {
            let probe = locks::probe(&server.endpoint, api, cfg.lock_ttl)
                .await
                .with_context(|| format!("probing {kind}'s {api} lock service"))?;
            if let Some(why) = probe {
                eprintln!("{kind} does not serve {api}; skipping its {api} runs ({why})");
                notes.push(format!(
                    "{kind} does not implement {api} (UNIMPLEMENTED); its {api} rows were not run"
                ));
                unsupported.push((kind, api));
            }
        }
        eprintln!("{kind} is serving on {}", server.endpoint);
        servers.insert(kind, server);
    }
    let runnable = |w: Workload, kind: Kind| {
        w.runs_on(kind)
            && !w
                .lock_shape()
                .is_some_and(|s| unsupported.contains(&(kind, s.api)))
    };
    if args.only == Some(Kind::Etcd) && workloads.iter().any(|w| !w.runs_on(Kind::Etcd)) {
        notes.push("baton.v1 rows were not run: --only etcd, and etcd has no baton.v1".into());
    }

    let rounds = args.rounds as usize;
    let total = rounds
        * workloads
            .iter()
            .map(|&w| kinds.iter().filter(|&&k| runnable(w, k)).count())
            .sum::<usize>();
    let mut samples = Vec::with_capacity(total);
    for &workload in &workloads {
        let label = workload.label(&cfg);
        for round in 0..rounds {
            // Alternate which server goes first (etcd, baton, then baton, etcd, …) so neither
            // always runs on the warmer or the more fragmented disk, page cache, or CPU clock.
            let mut order = kinds.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for kind in order.into_iter().filter(|&k| runnable(workload, k)) {
                let server = servers.get_mut(&kind).expect("started above");
                eprint!(
                    "[{}/{total}] {label} | {kind} | round {}/{rounds} … ",
                    samples.len() + 1,
                    round + 1
                );
                let result = workload::run(&server.endpoint, workload, &cfg)
                    .await
                    .with_context(|| format!("{label} against {kind}"))?;
                server.check_alive()?;
                let errors = if result.errors > 0 {
                    format!(
                        ", {} errors (first: {})",
                        result.errors,
                        result.first_error.as_deref().unwrap_or("?")
                    )
                } else {
                    String::new()
                };
                let latency = match workload.group() {
                    Group::Kv => "",
                    Group::Locks => "acquire ",
                };
                eprintln!(
                    "{:.0} {}, {latency}p50 {:.3} ms, p99 {:.3} ms{errors}",
                    result.ops_per_sec,
                    workload.unit(),
                    result.p50_ms,
                    result.p99_ms
                );
                samples.push(Sample {
                    workload,
                    server: kind,
                    round,
                    result,
                });
            }
        }
    }
    // Stop the servers (their guards do) before printing, so nothing runs on after the table.
    drop(servers);

    let (git_head, git_dirty) = report::git_state(&root);
    let meta = Meta {
        date_utc: report::utc_now(),
        git_head,
        git_dirty,
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model: report::cpu_model(),
        mem_total_bytes: report::mem_total_bytes(),
        etcd: kinds
            .contains(&Kind::Etcd)
            .then(|| Binary::describe(&etcd_bin)),
        baton: kinds
            .contains(&Kind::Baton)
            .then(|| Binary::describe(&baton_bin)),
        rounds,
        load: cfg,
        data_root,
    };
    let report = Report::new(meta, &workloads, samples, notes);
    print!("{}", report.markdown());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).context("encoding the JSON report")?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
        eprintln!("raw numbers written to {}", path.display());
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM. Returning from `main` then drops the benchmark future and
/// with it the servers' guards, which stop the child processes; dying on the signal's default
/// action would leave them running.
async fn interrupted() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Printed by hand rather than returned from `main`: the error chain is the useful
            // part, and a backtrace (RUST_BACKTRACE is often set) would bury it. The leading
            // newline ends a progress line that the failure interrupted.
            eprintln!("\nerror: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    // Default worker count (one per core): the client gets the same cores as the servers, which
    // is the honest setting on a small shared machine; see bench/README.md.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match cli.command {
        Command::SideBySide(args) => runtime.block_on(async {
            tokio::select! {
                result = side_by_side(args) => result,
                signal = interrupted() => {
                    signal?;
                    bail!("interrupted; servers stopped")
                }
            }
        }),
    }
}
