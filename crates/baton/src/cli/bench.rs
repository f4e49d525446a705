//! `baton bench`: one benchmark workload against any etcd-API server (Baton or etcd). The
//! workloads, the client engine and the output live in the `baton-bench` crate, which also
//! has the side-by-side orchestrator; this is only the subcommand.

pub use baton_bench::bench::BenchArgs;

/// Runs `baton bench`; returns the process exit status.
pub async fn run(args: BenchArgs) -> i32 {
    match baton_bench::bench::run(args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("baton bench: {e:#}");
            super::exit::EXIT_ERROR
        }
    }
}
