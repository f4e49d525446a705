//! `baton-sim`: run a swarm of seeds, or replay one.
//!
//! ```text
//! cargo run --release -p baton-sim -- swarm --seeds 1000 [--start S] [--members 3|5]
//! cargo run --release -p baton-sim -- replay --seed N [--members M] [--trace]
//! cargo run --release -p baton-sim -- determinism --seeds 20
//! ```

use std::time::Instant;

use anyhow::{bail, Result};
use baton_sim::{run, swarm, SimConfig};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Deterministic simulation of a Baton cluster")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run seeds `start..start+seeds`; print the pass count, the time, and a replay command
    /// for each failing seed.
    Swarm {
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        #[arg(long, default_value_t = 0)]
        start: u64,
        /// Keep going after a failure.
        #[arg(long)]
        keep_going: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Run each seed twice and compare the trace hashes (determinism check).
    Determinism {
        #[arg(long, default_value_t = 20)]
        seeds: u64,
        #[arg(long, default_value_t = 0)]
        start: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Run one seed and print its outcome (with `--trace`, every observation).
    Replay {
        #[arg(long)]
        seed: u64,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(Args)]
struct Common {
    #[arg(long, default_value_t = 3)]
    members: usize,
    /// Plant a bug: disks ignore fsync (the checkers must find lost writes).
    #[arg(long)]
    lying_disks: bool,
    /// The shorter CI configuration (`SimConfig::quick`).
    #[arg(long)]
    quick: bool,
    /// Log the trace (every client result, fault and final state) to stderr.
    #[arg(long)]
    trace: bool,
}

impl Common {
    fn config(&self, seed: u64) -> SimConfig {
        let mut c = if self.quick {
            SimConfig::quick(seed)
        } else {
            SimConfig::new(seed)
        };
        c.members = self.members;
        c.lying_disks = self.lying_disks;
        c
    }

    fn init_tracing(&self) {
        let filter = if self.trace {
            "baton_sim::trace=debug"
        } else {
            "off"
        };
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| filter.into()),
            )
            .with_writer(std::io::stderr)
            .without_time()
            .init();
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Swarm {
            seeds,
            start,
            keep_going,
            common,
        } => {
            common.init_tracing();
            let base = common.config(start);
            let report = swarm(&base, start, seeds, !keep_going, |seed, res| {
                if let Err(e) = res {
                    let mut c = base.clone();
                    c.seed = seed;
                    println!("seed {seed} FAILED: {e}");
                    println!("replay: {}", c.replay_command());
                }
            });
            println!(
                "{} passed, {} failed ({} members, {:.1} s, {:.2} s/seed)",
                report.passed,
                report.failed.len(),
                base.members,
                report.elapsed.as_secs_f64(),
                report.elapsed.as_secs_f64() / (report.passed + report.failed.len()).max(1) as f64
            );
            if !report.failed.is_empty() {
                bail!("{} seed(s) failed", report.failed.len());
            }
        }
        Command::Determinism {
            seeds,
            start,
            common,
        } => {
            common.init_tracing();
            let mut differing = Vec::new();
            for seed in start..start + seeds {
                let config = common.config(seed);
                let a = run(&config).map(|o| o.trace_hash);
                let b = run(&config).map(|o| o.trace_hash);
                match (a, b) {
                    (Ok(a), Ok(b)) if a == b => {}
                    (Ok(a), Ok(b)) => {
                        println!("seed {seed}: trace {a:016x} then {b:016x}");
                        differing.push(seed);
                    }
                    (a, b) => {
                        println!("seed {seed}: {:?} then {:?}", a.err(), b.err());
                        differing.push(seed);
                    }
                }
            }
            println!(
                "{} of {seeds} seeds identical on replay",
                seeds as usize - differing.len()
            );
            if !differing.is_empty() {
                bail!("{} seed(s) not reproducible", differing.len());
            }
        }
        Command::Replay { seed, common } => {
            common.init_tracing();
            let config = common.config(seed);
            let t0 = Instant::now();
            match run(&config) {
                Ok(o) => {
                    println!(
                        "seed {seed} passed: {} ops, {} watch events, {} lock holdings, \
                         recovered in {:?}, trace hash {:016x}, {:?} simulated in {:.1} s",
                        o.ops,
                        o.watch_events,
                        o.lock_holdings,
                        o.recovery,
                        o.trace_hash,
                        o.sim_time,
                        t0.elapsed().as_secs_f64()
                    );
                    for f in &o.faults {
                        println!("  fault {f}");
                    }
                }
                Err(e) => {
                    println!("seed {seed} FAILED: {e}");
                    bail!("seed {seed} failed");
                }
            }
        }
    }
    Ok(())
}
