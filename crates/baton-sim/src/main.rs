//! `baton-sim`: run a swarm of seeds, or replay one.
//!
//! ```text
//! cargo run --release -p baton-sim -- swarm --seeds 1000 [--start S] [--members 3|5]
//! cargo run --release -p baton-sim -- replay --seed N [--members M] [--trace]
//! cargo run --release -p baton-sim -- determinism --seeds 20
//! ```

use std::time::Instant;

use anyhow::{bail, Result};
use baton_sim::{run, SimConfig};
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
    /// The flags of this invocation, for a child `replay`.
    fn args(&self) -> Vec<String> {
        let mut args = vec!["--members".to_string(), self.members.to_string()];
        if self.quick {
            args.push("--quick".into());
        }
        if self.lying_disks {
            args.push("--lying-disks".into());
        }
        args
    }

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

/// What a passing seed's replay reports on its first line: the trace hash, and which way its
/// log writes went (inline ops, batch-loop batches, batch-loop ops).
#[derive(Debug, PartialEq, Eq)]
struct Passed {
    hash: String,
    wal: [u64; 3],
    answered_early: u64,
}

impl Passed {
    fn parse(line: &str) -> Passed {
        let hash = line
            .split("trace hash ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or("")
            .to_string();
        // "..., wal 12 inline, 3 in 2 loop batches"
        let numbers: Vec<u64> = line
            .split(", wal ")
            .nth(1)
            .unwrap_or("")
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        let wal = match numbers[..] {
            [inline, ops, batches] => [inline, batches, ops],
            _ => [0; 3],
        };
        // "..., 5 appends answered early, wal ..."
        let answered_early = line
            .split(" appends answered early")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Passed {
            hash,
            wal,
            answered_early,
        }
    }
}

/// Runs `replay --seed N` in a child process of this binary: `Ok` if the seed passed,
/// `Err(first line of its report)` if it failed.
fn replay_in_child(common: &Common, seed: u64) -> Result<std::result::Result<Passed, String>> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .arg("replay")
        .arg("--seed")
        .arg(seed.to_string())
        .args(common.args())
        .env("RUST_BACKTRACE", "0")
        .stderr(std::process::Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let first = stdout.lines().next().unwrap_or("").to_string();
    if out.status.success() {
        Ok(Ok(Passed::parse(&first)))
    } else if first.is_empty() {
        Ok(Err(format!(
            "seed {seed} FAILED: the replay process exited with {}",
            out.status
        )))
    } else {
        Ok(Err(stdout.trim_end().to_string()))
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
            let t0 = Instant::now();
            let (mut passed, mut failed) = (0usize, 0usize);
            let mut wal = [0u64; 3];
            let mut answered_early = 0;
            for seed in start..start + seeds {
                // Each seed in a fresh process, exactly as `replay` runs it: process-wide
                // state (tokio's task ids) would otherwise differ from the replay's.
                match replay_in_child(&common, seed)? {
                    Ok(p) => {
                        passed += 1;
                        for (sum, n) in wal.iter_mut().zip(p.wal) {
                            *sum += n;
                        }
                        answered_early += p.answered_early;
                    }
                    Err(first_line) => {
                        failed += 1;
                        let mut c = base.clone();
                        c.seed = seed;
                        println!("{first_line}");
                        println!("replay: {}", c.replay_command());
                        if !keep_going {
                            break;
                        }
                    }
                }
            }
            let elapsed = t0.elapsed().as_secs_f64();
            println!(
                "{passed} passed, {failed} failed ({} members, {elapsed:.1} s, {:.2} s/seed)",
                base.members,
                elapsed / (passed + failed).max(1) as f64
            );
            println!(
                "log writes: {} inline on the Raft core task, {} in {} batches of the \
                 writer's batch loop (a task under simulation)",
                wal[0], wal[2], wal[1]
            );
            println!(
                "openraft AppendEntries answered from followers' early answers: {answered_early}"
            );
            if failed > 0 {
                bail!("{failed} seed(s) failed");
            }
        }
        Command::Determinism {
            seeds,
            start,
            common,
        } => {
            common.init_tracing();
            let mut differing = 0;
            for seed in start..start + seeds {
                let a = replay_in_child(&common, seed)?;
                let b = replay_in_child(&common, seed)?;
                if a != b {
                    println!("seed {seed}: {a:?}\n   then {b:?}");
                    differing += 1;
                }
            }
            println!("{} of {seeds} seeds identical on replay", seeds - differing);
            if differing > 0 {
                bail!("{differing} seed(s) not reproducible");
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
                         recovered in {:?}, trace hash {:016x}, {:?} simulated in {:.1} s, \
                         {} appends answered early, wal {} inline, {} in {} loop batches",
                        o.ops,
                        o.watch_events,
                        o.lock_holdings,
                        o.recovery,
                        o.trace_hash,
                        o.sim_time,
                        t0.elapsed().as_secs_f64(),
                        o.answered_early,
                        o.wal.inline_ops,
                        o.wal.loop_ops,
                        o.wal.loop_batches
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
