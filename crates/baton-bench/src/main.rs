//! `baton-bench side-by-side`: runs Baton and etcd 3.4 side by side on this machine, with the
//! same client (the `baton bench` engine, in-process) and the same workloads, single node
//! and 3 members, and writes `bench/RESULTS.md` with medians, Baton/etcd ratios and the
//! targets they must meet, plus `bench/results.svg`.
//!
//! Why side by side rather than against published etcd numbers: absolute numbers depend on
//! the machine (cores, disk, fsync latency) far more than on either server, so the only figure
//! that means something is the ratio measured on one machine, in one session, with one client.
//!
//! This is deliberately a binary and not a `#[test]` or `cargo bench` target: it starts real
//! servers, takes minutes, and its numbers are for people to read, not for CI to assert on.
//! See `bench/README.md` for how to run it and how to read the results.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use baton_bench::side::{render, side_by_side, SideBySideArgs};

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
    /// Start etcd and Baton (single node and/or 3 members), run every workload against each
    /// alternately, write bench/RESULTS.md and bench/results.svg.
    SideBySide(Box<SideBySideArgs>),
    /// Write bench/RESULTS.md and bench/results.svg again from a side-by-side --json file.
    Render {
        /// The JSON file a side-by-side run wrote.
        json: std::path::PathBuf,
        /// The markdown report [default: bench/RESULTS.md]; `-` for stdout only.
        #[arg(long)]
        results: Option<std::path::PathBuf>,
    },
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
        Command::Render { json, results } => render(&json, results),
        Command::SideBySide(args) => runtime.block_on(async {
            tokio::select! {
                result = side_by_side(*args) => result,
                signal = interrupted() => {
                    signal?;
                    bail!("interrupted; servers stopped")
                }
            }
        }),
    }
}
