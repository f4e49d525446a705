//! What the client commands (`baton kv`, `baton lease`, `baton status`) share: the global
//! flags, connecting through `baton-client`, and turning an error into the one line the
//! user sees.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use baton_client::{Client, ClientConfig};
use clap::Args;

use super::args::{parse_duration, CredentialArgs, TlsArgs};
use super::exit::EXIT_ERROR;
use super::output::Format;

/// The flags every client command takes. They are global within their command group, so
/// `baton kv --output json get k` and `baton kv get k --output json` mean the same.
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// Comma-separated gRPC endpoints (host:port or http://host:port). The first that
    /// accepts a connection is used; on failure the next one is tried.
    #[arg(
        long,
        env = "BATON_ENDPOINTS",
        default_value = "127.0.0.1:2379",
        value_delimiter = ',',
        global = true
    )]
    pub endpoints: Vec<String>,
    /// Deadline of each request (and of connecting to one endpoint): 5, 500ms, 2s, 1m.
    #[arg(
        long,
        value_parser = parse_duration,
        default_value = "5s",
        value_name = "DURATION",
        global = true
    )]
    pub timeout: Duration,
    /// Output format: `table` for people, `simple` (tab-separated, no header) for shell
    /// scripts, `json` (one object per line) for programs.
    #[arg(
        short = 'o',
        long,
        value_enum,
        default_value_t = Format::Table,
        visible_alias = "write-out",
        short_alias = 'w',
        global = true
    )]
    pub output: Format,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub user: CredentialArgs,
}

impl ClientArgs {
    /// A client configuration for `endpoints` with these flags' TLS settings and user.
    pub fn config(&self, endpoints: Vec<String>) -> ClientConfig {
        self.user
            .apply(self.tls.apply(ClientConfig::new(endpoints)))
    }
}

/// The longest a connection attempt to one endpoint may take, however long `--timeout` is:
/// a member that does not complete a TCP handshake within seconds is down, and the next
/// endpoint deserves its turn.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to the first reachable endpoint of `args.endpoints`.
pub async fn connect(args: &ClientArgs) -> Result<Client> {
    let endpoints: Vec<String> = args
        .endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();
    if endpoints.is_empty() {
        return Err(anyhow!("no endpoints given (use --endpoints host:port)"));
    }
    if args.timeout.is_zero() {
        return Err(anyhow!("--timeout must be positive"));
    }
    let config = args
        .config(endpoints)
        .with_request_timeout(args.timeout)
        .with_connect_timeout(args.timeout.min(MAX_CONNECT_TIMEOUT));
    Client::connect(config).await.map_err(describe)
}

/// A client error as a sentence the user can act on.
///
/// The server's own message (etcd's text or Baton's `baton: …`) is what users search for,
/// so it comes first; the gRPC code follows in parentheses. An unreachable cluster gets a
/// hint, because the usual cause is a server that is not running or a wrong address.
pub fn describe(e: baton_client::Error) -> anyhow::Error {
    use baton_client::Error;
    match e {
        Error::Server { code, message } => anyhow!("{message} ({code:?})"),
        Error::Unreachable { last_error, .. } => anyhow!(
            "no endpoint reachable ({last_error}); is `baton serve` running? set --endpoints \
             or BATON_ENDPOINTS"
        ),
        // Usually a plain etcd (or an older Baton) behind the endpoint, not a fault.
        Error::Unsupported(what) => {
            anyhow!("{what} is not supported by this server (is it etcd, or an older Baton?)")
        }
        Error::DeadlineExceeded { what, after } => anyhow!(
            "{what}: no answer within {:.1} s (raise --timeout?)",
            after.as_secs_f64()
        ),
        other => anyhow!("{other}"),
    }
}

/// Reports the outcome of client command `name`: its exit status, or the error as one line
/// on stderr (`baton kv get: …`) and [`EXIT_ERROR`].
pub fn finish(name: &str, result: Result<i32>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            let text = format!("{e:#}");
            let one_line: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            eprintln!("baton {name}: {}", one_line.join("; "));
            EXIT_ERROR
        }
    }
}

/// Parses a lease id as the commands print it: hex, with or without `0x`.
pub fn parse_lease(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    i64::from_str_radix(digits, 16)
        .map_err(|_| format!("'{text}' is not a lease id (hex, as `baton lease grant` prints it)"))
}

/// A client of the leader among `args`' endpoints, and the leader's member id: for the calls
/// only the leader serves (MoveLeader, fencing-key rotation). Asks every endpoint for its
/// status, so the leader's endpoint must be among them.
pub async fn connect_leader(args: &ClientArgs) -> Result<(Client, u64)> {
    let mut errors = Vec::new();
    for ep in &args.endpoints {
        let ep = ep.trim();
        if ep.is_empty() {
            continue;
        }
        let config = args
            .config(vec![ep.to_string()])
            .with_request_timeout(args.timeout)
            .with_connect_timeout(args.timeout.min(Duration::from_secs(3)));
        let client = match Client::connect(config).await {
            Ok(c) => c,
            Err(e) => {
                errors.push(format!("{ep}: {e}"));
                continue;
            }
        };
        match client.status().await {
            Ok(s) => {
                let me = s.header.map_or(0, |h| h.member_id);
                if s.leader != 0 && s.leader == me {
                    return Ok((client, me));
                }
            }
            Err(e) => errors.push(format!("{ep}: {e}")),
        }
    }
    bail!(
        "no leader among the endpoints {:?}{}",
        args.endpoints,
        if errors.is_empty() {
            String::new()
        } else {
            format!(" ({})", errors.join("; "))
        }
    )
}

#[cfg(test)]
mod tests {
    use super::parse_lease;

    #[test]
    fn lease_ids_are_hex() {
        assert_eq!(parse_lease("694d8c4f2a1b3c04"), Ok(0x694d8c4f2a1b3c04));
        assert_eq!(parse_lease("0x10"), Ok(16));
        assert_eq!(parse_lease("-ff"), Ok(-255));
        assert!(parse_lease("lease").is_err());
        assert!(parse_lease("").is_err());
    }
}
