//! `baton gateway start`: etcd's L4 gateway (`etcd gateway start`, etcd's `proxy/tcpproxy`),
//! a TCP proxy that hands each client connection to one of the members' client addresses,
//! round robin over those that answer. It knows nothing of gRPC or TLS: bytes are copied both
//! ways, so TLS, auth and HTTP/2 stay end to end between the client and a member.
//!
//! As in etcd, an address a connection cannot reach is set aside and dialled again every
//! `--retry-delay`; while set aside no connection is sent to it. DNS SRV discovery
//! (`--discovery-srv`) is not provided: the members are listed with `--endpoints`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Client connections proxied at once (each holds two sockets and two copy buffers). At the
/// bound the gateway stops accepting until one closes: further clients wait in the
/// listener's backlog (and then get the kernel's refusal) instead of exhausting the
/// process's descriptors. etcd's gateway has no bound.
const MAX_CONNECTIONS: usize = 10_000;

/// etcd's gateway (`etcd gateway start`): a TCP proxy to the members' client URLs.
#[derive(Args, Debug)]
#[command(args_override_self = true)]
pub struct GatewayArgs {
    #[command(subcommand)]
    command: GatewayCommand,
    /// Comma-separated member client addresses (`host:port`; a URL's scheme is dropped, as
    /// etcd's gateway drops it).
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    endpoints: Vec<String>,
    /// The address to accept clients on.
    #[arg(long, global = true, default_value = "127.0.0.1:23790")]
    listen_addr: String,
    /// How long an address that could not be reached is set aside before it is dialled
    /// again (Go duration syntax, etcd's default 1m).
    #[arg(long, global = true, default_value = "1m", value_parser = parse_delay)]
    retry_delay: Duration,
    /// etcd's DNS SRV discovery of the members: not provided (refused when given).
    #[arg(long, global = true, default_value = "")]
    discovery_srv: String,
    /// etcd's SRV service name for `--discovery-srv`: not provided (refused when given).
    #[arg(long, global = true, default_value = "")]
    discovery_srv_name: String,
    /// Accept SRV records without TLS checks (etcd's, for `--discovery-srv`; no effect
    /// without it).
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    insecure_discovery: bool,
    /// CA to verify the endpoints `--discovery-srv` finds (etcd's; no effect without it:
    /// the gateway does not speak TLS itself).
    #[arg(long, global = true)]
    trusted_ca_file: Option<String>,
}

#[derive(Subcommand, Debug)]
enum GatewayCommand {
    /// Start the gateway.
    Start,
}

fn parse_delay(v: &str) -> Result<Duration, String> {
    crate::etcd_flags::go_duration_ns(v)
        .map(Duration::from_nanos)
        .ok_or_else(|| format!("invalid duration {v:?} (Go syntax: 30s, 1m)"))
}

/// `scheme://host:port` → `host:port` (etcd's `stripSchema`).
fn strip_scheme(ep: &str) -> String {
    let ep = ep.trim();
    match ep.split_once("://") {
        Some((_, rest)) => rest.trim_end_matches('/').to_string(),
        None => ep.to_string(),
    }
}

/// One member address and whether it is set aside.
struct Remote {
    addr: String,
    inactive: std::sync::atomic::AtomicBool,
}

struct Proxy {
    remotes: Vec<Remote>,
    next: AtomicUsize,
    retry_delay: Duration,
}

impl Proxy {
    /// Round robin over the addresses not set aside (etcd's `pick` for endpoints without
    /// SRV weights).
    fn pick(&self) -> Option<&Remote> {
        for _ in 0..self.remotes.len() {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.remotes.len();
            let r = &self.remotes[i];
            if !r.inactive.load(Ordering::Acquire) {
                return Some(r);
            }
        }
        None
    }

    async fn serve(&self, mut client: TcpStream) {
        let mut member = None;
        while let Some(remote) = self.pick() {
            match TcpStream::connect(&remote.addr).await {
                Ok(s) => {
                    member = Some(s);
                    break;
                }
                Err(e) => {
                    remote.inactive.store(true, Ordering::Release);
                    tracing::warn!(address = %remote.addr, interval = ?self.retry_delay, error = %e, "deactivated endpoint");
                }
            }
        }
        // No address answers: the client's connection is closed, as etcd's gateway does.
        let Some(mut member) = member else { return };
        let _ = client.set_nodelay(true);
        let _ = member.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut member).await;
    }

    /// Every `retry_delay`, dials each address set aside; one that answers is used again.
    async fn monitor(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.retry_delay).await;
            for r in self
                .remotes
                .iter()
                .filter(|r| r.inactive.load(Ordering::Acquire))
            {
                match TcpStream::connect(&r.addr).await {
                    Ok(_) => {
                        r.inactive.store(false, Ordering::Release);
                        tracing::info!(address = %r.addr, "activated");
                    }
                    Err(e) => {
                        tracing::warn!(address = %r.addr, interval = ?self.retry_delay, error = %e, "failed to activate endpoint (stay inactive for another interval)")
                    }
                }
            }
        }
    }
}

pub async fn run(args: GatewayArgs) -> Result<()> {
    let GatewayCommand::Start = args.command;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if !args.discovery_srv.is_empty() || !args.discovery_srv_name.is_empty() {
        bail!(
            "--discovery-srv: DNS SRV discovery is not provided; list the members with --endpoints"
        );
    }
    let endpoints: Vec<String> = args
        .endpoints
        .iter()
        .map(|e| strip_scheme(e))
        .filter(|e| !e.is_empty())
        .collect();
    if endpoints.is_empty() {
        bail!("no endpoints found");
    }
    // etcd refuses an endpoint that resolves to the gateway's own address: it would proxy
    // to itself.
    let listen: SocketAddr = tokio::net::lookup_host(&args.listen_addr)
        .await
        .with_context(|| format!("failed to resolve listen address {}", args.listen_addr))?
        .next()
        .with_context(|| format!("no address for {}", args.listen_addr))?;
    for ep in &endpoints {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(ep)
            .await
            .with_context(|| format!("failed to resolve endpoint {ep}"))?
            .collect();
        if addrs.contains(&listen) {
            bail!(
                "endpoint {ep} should not resolve to the gateway listen addr ({})",
                args.listen_addr
            );
        }
    }
    let listener = TcpListener::bind(&args.listen_addr)
        .await
        .with_context(|| format!("listening on {}", args.listen_addr))?;
    let proxy = Arc::new(Proxy {
        remotes: endpoints
            .iter()
            .map(|addr| Remote {
                addr: addr.clone(),
                inactive: Default::default(),
            })
            .collect(),
        next: AtomicUsize::new(0),
        retry_delay: args.retry_delay,
    });
    tracing::info!(endpoints = ?endpoints, "ready to proxy client requests");
    tokio::spawn(proxy.clone().monitor());
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        tokio::select! {
            accepted = listener.accept() => {
                match accepted {
                    Ok((client, _)) => {
                        let proxy = proxy.clone();
                        tokio::spawn(async move {
                            proxy.serve(client).await;
                            drop(slot);
                        });
                    }
                    Err(e) => {
                        // Out of descriptors and the like: pause rather than spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_are_dropped() {
        assert_eq!(strip_scheme("http://127.0.0.1:2379"), "127.0.0.1:2379");
        assert_eq!(strip_scheme("https://h:1/"), "h:1");
        assert_eq!(strip_scheme("h:1"), "h:1");
    }

    #[test]
    fn pick_skips_set_aside_addresses_round_robin() {
        let p = Proxy {
            remotes: ["a", "b", "c"]
                .iter()
                .map(|a| Remote {
                    addr: a.to_string(),
                    inactive: Default::default(),
                })
                .collect(),
            next: AtomicUsize::new(0),
            retry_delay: Duration::from_secs(1),
        };
        p.remotes[1].inactive.store(true, Ordering::Release);
        let picks: Vec<&str> = (0..4).map(|_| p.pick().unwrap().addr.as_str()).collect();
        assert_eq!(picks, ["a", "c", "a", "c"]);
        for r in &p.remotes {
            r.inactive.store(true, Ordering::Release);
        }
        assert!(p.pick().is_none());
    }
}
