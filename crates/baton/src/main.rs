//! `baton`: the one binary. `baton serve` runs a member that speaks the etcd v3 API; the
//! other subcommands are its command-line client, all on `baton-client`: `baton kv`,
//! `baton lease`, `baton status`, `baton member` and `baton move-leader` for data and
//! operators, `baton bench` to benchmark any etcd-API server, `baton lock` and `baton elect` for Baton's locks and elections,
//! `baton saga` for the sagas of `baton-txn`'s orchestrator, `baton 2pc` for its
//! two-phase-commit decision log, `baton snapshot` for backups in etcd's format (and
//! `etcd_datadir`: a data directory `etcdctl snapshot restore` made is imported at start).

mod cli;
mod corrupt_check;
mod etcd_datadir;
mod etcd_flags;
mod gateway;
mod idle_memory;
mod log_output;
mod serve;
mod ui;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc rather than glibc's malloc: measured on this project's 2-core machine with
/// `baton bench` against fresh single-node servers, put at 100 clients +5–15 %, 50 distinct
/// locks +15 %, RSS after 100k keys of 256 B 118 → 97 MiB and after 1M keys 779 → 639 MiB
/// (glibc keeps freed snapshot copies in its arenas; `malloc_trim` returns only part).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for a serving member (`PR_SET_THP_DISABLE`: every later
/// page fault of the process gets small pages). With them, memory mimalloc commits is backed
/// in 2 MiB pages (14 MiB `AnonHugePages` in an idle member), so a page holding a few live
/// objects keeps 2 MiB resident. Measured with `baton-bench side-by-side --workloads rss`
/// (fresh single-node servers, THP off from the process's start): RSS idle 33.2 → 22.2 MiB,
/// after 100k keys of 256 B 99.1 → 79.1–80.5 MiB, after 1M keys 570 → 549–552 MiB; put with 100
/// clients not slower (3 members 13.2–13.7k → 15.6–17.2k ops/s, one node 22.9–24.7k →
/// 24.6–28.3k: fewer 2 MiB pages to fault and zero).
///
/// It runs as an ELF constructor, before Rust's runtime makes its first allocation: set in
/// `main`, the arena mimalloc had already faulted in kept two huge pages (4 MiB; 100k keys
/// then took 83.8 MiB). Only for `serve`: the flag is inherited by child processes, and
/// `baton lock -- CMD` runs the user's command. Failing is harmless (the system's default).
/// glibc only: it passes argc/argv to `.init_array` functions (musl passes nothing).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[used]
#[link_section = ".init_array"]
static TRANSPARENT_HUGE_PAGES_OFF_FOR_SERVE: extern "C" fn(
    libc::c_int,
    *const *const libc::c_char,
    *const *const libc::c_char,
) = transparent_huge_pages_off_for_serve;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn transparent_huge_pages_off_for_serve(
    argc: libc::c_int,
    argv: *const *const libc::c_char,
    _envp: *const *const libc::c_char,
) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: glibc calls `.init_array` functions with the program's argc/argv, whose first
    // `argc` entries are NUL-terminated strings; prctl takes plain integers.
    unsafe {
        let first = *argv.add(1);
        if !first.is_null() && std::ffi::CStr::from_ptr(first).to_bytes() == b"serve" {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

/// `baton --version`: Baton's own version and the etcd API release it reproduces.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (etcd API ", "3.4.23", ")");

#[derive(Parser)]
#[command(
    name = "baton",
    version = VERSION,
    about = "Baton: a coordination service that speaks the etcd v3 API",
    long_about = "Baton is a linearizable key-value store with leases, watches and transactions, \
                  replicated with Raft, that etcd clients (etcdctl, client libraries) talk to \
                  unchanged. On top of it Baton offers locks with fencing tokens and leader \
                  elections.\n\nStart a single local member with `baton serve`, then try \
                  `baton kv put greeting hello`, `baton status` or \
                  `baton lock nightly-report -- ./report.sh`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a Baton member (etcd's flags, `ETCD_*` variables and `--config-file`).
    ///
    /// Arguments are taken as etcd takes them (`-flag`, `--flag=value`, `--flag value`, a
    /// flag given twice takes its last value; `ETCD_<FLAG>` variables for flags not given;
    /// `--config-file` with etcd's YAML keys replaces both). Every flag of etcd 3.4 either
    /// does what it does in etcd or is refused with one line saying why. See docs/flags.md.
    #[command(args_override_self = true)]
    Serve(Box<serve::ServeArgs>),
    /// etcd's L4 gateway (`etcd gateway start`): a TCP proxy to the members' client URLs.
    Gateway(gateway::GatewayArgs),
    // No doc comments here: they would replace the subcommands' own (longer) help.
    Kv(cli::kv::KvArgs),
    Lease(cli::lease::LeaseArgs),
    Status(cli::status::StatusArgs),
    Lock(cli::lock::LockArgs),
    Elect(cli::elect::ElectArgs),
    Member(cli::member::MemberArgs),
    MoveLeader(cli::member::MoveLeaderArgs),
    Fence(cli::fence::FenceArgs),
    Snapshot(cli::snapshot::SnapshotArgs),
    Auth(cli::auth::AuthArgs),
    User(cli::auth::UserArgs),
    Role(cli::auth::RoleArgs),
    Bench(cli::bench::BenchArgs),
    Saga(cli::saga::SagaArgs),
    // Was `baton txn`: kept as a hidden alias for one release ("txn" is etcd's transaction).
    #[command(name = "2pc", alias = "txn")]
    TwoPc(cli::twopc::TwoPcArgs),
}

fn main() -> Result<()> {
    let mut warnings = Vec::new();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = if args.get(1).is_some_and(|a| a == "serve") {
        // etcd's flag syntax, environment and config file → clap's argv (`etcd_flags`).
        let rest: Vec<String> = args[2..]
            .iter()
            .map(|a| {
                a.to_str()
                    .map(String::from)
                    .with_context(|| format!("argument {a:?} is not UTF-8"))
            })
            .collect::<Result<_>>()?;
        let env: Vec<(String, String)> = std::env::vars().collect();
        let serve_cmd = Cli::command()
            .find_subcommand("serve")
            .expect("the serve subcommand")
            .clone();
        match etcd_flags::translate(&rest, &env, &serve_cmd, &|p| std::fs::read_to_string(p)) {
            Ok(etcd_flags::Outcome::Version) => {
                print!("{}", etcd_version_lines());
                return Ok(());
            }
            Ok(etcd_flags::Outcome::Serve { argv, warnings: w }) => {
                warnings = w;
                Cli::parse_from(argv)
            }
            Err(e) => {
                eprintln!("baton serve: {e}");
                std::process::exit(2);
            }
        }
    } else {
        Cli::parse()
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Command::Serve(args) = &cli.command {
        builder.worker_threads(serve::worker_threads(args));
        idle_memory::collect_when_parking(&mut builder);
        if !serve::without_lifo_slot(&mut builder) {
            warnings.push(serve::LIFO_SLOT_WARNING.to_owned());
        }
    }
    let runtime = builder.build().context("starting the async runtime")?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve::serve(*args, warnings)),
        Command::Gateway(args) => runtime.block_on(gateway::run(args)),
        // The client commands decide their own exit status (the command's, or one of the
        // documented codes), so they report errors themselves and exit here.
        Command::Kv(args) => std::process::exit(runtime.block_on(cli::kv::run(args))),
        Command::Lease(args) => std::process::exit(runtime.block_on(cli::lease::run(args))),
        Command::Status(args) => std::process::exit(runtime.block_on(cli::status::run(args))),
        Command::Lock(args) => {
            let code = runtime.block_on(cli::lock::run(args));
            std::process::exit(code)
        }
        Command::Elect(args) => {
            let code = runtime.block_on(cli::elect::run(args));
            std::process::exit(code)
        }
        Command::Member(args) => std::process::exit(runtime.block_on(cli::member::run(args))),
        Command::Fence(args) => std::process::exit(runtime.block_on(cli::fence::run(args))),
        Command::Snapshot(args) => std::process::exit(runtime.block_on(cli::snapshot::run(args))),
        Command::Auth(args) => std::process::exit(runtime.block_on(cli::auth::run_auth(args))),
        Command::User(args) => std::process::exit(runtime.block_on(cli::auth::run_user(args))),
        Command::Role(args) => std::process::exit(runtime.block_on(cli::auth::run_role(args))),
        Command::Bench(args) => std::process::exit(runtime.block_on(cli::bench::run(args))),
        Command::Saga(args) => std::process::exit(runtime.block_on(cli::saga::run(args))),
        Command::TwoPc(args) => std::process::exit(runtime.block_on(cli::twopc::run(args))),
        Command::MoveLeader(args) => {
            std::process::exit(runtime.block_on(cli::member::run_move_leader(args)))
        }
    }
}

/// `baton serve --version` (and `etcd --version` through the e2e wrapper): etcd's four
/// lines (`etcdmain/config.go`), for tools that read them, naming Baton where etcd names its
/// build: the version is the etcd API Baton reproduces, and there is no Go.
fn etcd_version_lines() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    };
    format!(
        "etcd Version: {}\nGit SHA: Not provided (this is Baton {}, which speaks etcd {}'s API; it is not etcd)\nGo Version: none (Baton is written in Rust)\nGo OS/Arch: {}/{}\n",
        baton_server::monitor::ETCD_SERVER_VERSION,
        env!("CARGO_PKG_VERSION"),
        baton_server::monitor::ETCD_SERVER_VERSION,
        std::env::consts::OS,
        arch
    )
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command};

    /// `baton --version` names the etcd API release that Status and `/version` report.
    #[test]
    fn version_names_the_etcd_api_served() {
        assert!(super::VERSION.ends_with(&format!(
            "(etcd API {})",
            baton_server::monitor::ETCD_SERVER_VERSION
        )));
        let lines = super::etcd_version_lines();
        assert!(lines.starts_with(&format!(
            "etcd Version: {}\nGit SHA: ",
            baton_server::monitor::ETCD_SERVER_VERSION
        )));
        assert!(lines.contains("Baton"), "{lines}");
        assert_eq!(lines.lines().count(), 4);
    }

    /// `baton 2pc` is the two-phase-commit log's command; its old name `baton txn` still
    /// parses (a hidden alias for one release) but is not offered in the help, where "txn"
    /// means etcd's transaction only (`baton kv txn`).
    #[test]
    fn two_phase_commit_is_2pc_and_txn_is_a_hidden_alias() {
        for name in ["2pc", "txn"] {
            let cli = Cli::try_parse_from(["baton", name, "list", "--namespace", "n"])
                .unwrap_or_else(|e| panic!("baton {name} list: {e}"));
            assert!(matches!(cli.command, Command::TwoPc(_)), "baton {name}");
        }
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("2pc"), "{help}");
        assert!(!help.contains("txn"), "{help}");
    }
}
