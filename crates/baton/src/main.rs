//! `baton`: the one binary. `baton serve` runs a member that speaks the etcd v3 API;
//! `baton lock` and `baton elect` are the client side of Baton's locks and elections.

mod cli;
mod serve;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "baton",
    version,
    about = "Baton: a coordination service that speaks the etcd v3 API",
    long_about = "Baton is a linearizable key-value store with leases, watches and transactions, \
                  replicated with Raft, that etcd clients (etcdctl, client libraries) talk to \
                  unchanged. On top of it Baton offers locks with fencing tokens and leader \
                  elections.\n\nStart a single local member with `baton serve`, then try \
                  `etcdctl --endpoints=127.0.0.1:2379 put greeting hello` or \
                  `baton lock nightly-report -- ./report.sh`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a Baton member (etcd-style flags).
    Serve(serve::ServeArgs),
    // No doc comments here: they would replace the subcommands' own (longer) help.
    Lock(cli::lock::LockArgs),
    Elect(cli::elect::ElectArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve::serve(args)),
        // The client commands decide their own exit status (the command's, or one of the
        // documented codes), so they report errors themselves and exit here.
        Command::Lock(args) => {
            let code = runtime.block_on(cli::lock::run(args));
            std::process::exit(code)
        }
        Command::Elect(args) => {
            let code = runtime.block_on(cli::elect::run(args));
            std::process::exit(code)
        }
    }
}
