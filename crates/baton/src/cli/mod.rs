//! The client side of the `baton` binary.
//!
//! - `baton kv`, `baton lease`, `baton status` ([`kv`], [`txn`], [`lease`], [`status`]):
//!   thin commands over `baton-client`, sharing the global flags and the error line of
//!   [`client`] and the three output formats of [`output`] (aligned tables for people,
//!   tab-separated lines for shell scripts, JSON for programs).
//! - `baton member list|add|remove|update|promote` and `baton move-leader` ([`member`]):
//!   etcd's membership calls and leader transfer, in the same formats.
//! - `baton lock` and `baton elect` ([`lock`], [`elect`]): a `baton-client` session
//!   ([`session`]) and its `Mutex` or `Election`, so the lease-loss logic is the client's,
//!   shared with every Rust program using it; the CLI adds running the command in its own
//!   process group ([`child`]) and stopping it when the lock is lost. Everything the user
//!   needs to act on goes to stderr prefixed with `baton lock:` / `baton elect:`; stdout
//!   carries only machine-readable results so scripts can capture it.
//! - `baton saga list|show|retry|skip|cancel` ([`saga`]): the saga log of `baton-txn`'s
//!   orchestrator (kept in Baton), read and acted on directly, in the same three formats.
//! - `baton 2pc list|show` ([`twopc`]): the two-phase-commit decision log of `baton-txn`
//!   (kept in Baton), read only: finishing transactions is the Recoverer's job.

pub mod bench;
pub mod child;
pub mod client;
pub mod elect;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod member;
pub mod ops;
pub mod output;
pub mod saga;
pub mod session;
pub mod status;
pub mod twopc;
pub mod txn;

use std::time::Duration;

use clap::Args;

/// Exit status when the lock (or leadership) was not obtained: `--try` found it held, or
/// `--timeout` passed (sysexits' EX_CANTCREAT: "could not create" — here, the lock).
pub const EXIT_NOT_ACQUIRED: i32 = 73;
/// Exit status when the lock or leadership was lost while held (lease expired or revoked,
/// key force-released). sysexits' EX_TEMPFAIL: the work was interrupted; retrying is
/// reasonable.
pub const EXIT_LOST: i32 = 75;
/// Exit status for every other failure of `baton` itself (cannot connect, server refused).
pub const EXIT_ERROR: i32 = 1;

/// Where to find Baton. Shared by the client commands.
#[derive(Args, Debug, Clone)]
pub struct EndpointArgs {
    /// Comma-separated gRPC endpoints (host:port or http://host:port), tried in order until
    /// one accepts a connection.
    #[arg(
        long,
        env = "BATON_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ','
    )]
    pub endpoints: Vec<String>,
}

/// Parses a human duration: `10` or `1.5` (seconds), `500ms`, `2s`, `1m`.
///
/// Plain numbers are seconds so `--timeout 30` means what etcdctl users expect; the suffixes
/// exist because lock-delays and grace periods are often sub-second.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 10, 1.5, 500ms, 2s, 1m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("'{text}': a duration cannot be negative"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// Resolves on SIGINT or SIGTERM and says which (for the conventional 128+N exit status).
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers. Done before anything is acquired, so a Ctrl-C at any point is
    /// handled by us (and the lock released) rather than killing the process mid-way.
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM; returns the signal number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("").is_err());
    }
}
