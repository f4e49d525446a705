//! Connecting to the first reachable endpoint.

use std::time::Duration;

use anyhow::{anyhow, Result};
use tonic::transport::{Channel, Endpoint};

/// How long one endpoint gets before the next is tried. Short, because a member that does
/// not answer a TCP handshake on loopback or a LAN within seconds is down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Connects to the first endpoint in `endpoints` that accepts a connection.
///
/// Order matters (the first is preferred) so an operator can list the local member first.
/// Every failure is kept for the error message: "connection refused" on all of them reads
/// very differently from a DNS failure on one.
pub async fn connect(endpoints: &[String]) -> Result<(Channel, String)> {
    let mut failures = Vec::new();
    for raw in endpoints.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let uri = if raw.contains("://") {
            if raw.starts_with("https://") {
                failures.push(format!("{raw}: TLS is not supported yet; use http://"));
                continue;
            }
            raw.to_string()
        } else {
            format!("http://{raw}")
        };
        let endpoint = match Endpoint::from_shared(uri) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!("{raw}: not a valid endpoint ({e})"));
                continue;
            }
        };
        // TCP_NODELAY: lock hand-offs are single small messages; Nagle would add ~40 ms.
        match endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .connect()
            .await
        {
            Ok(channel) => return Ok((channel, raw.to_string())),
            Err(e) => failures.push(format!("{raw}: {}", error_chain(&e))),
        }
    }
    if failures.is_empty() {
        return Err(anyhow!("no endpoints given (use --endpoints host:port)"));
    }
    Err(anyhow!(
        "could not connect to any endpoint:\n  {}\n(is `baton serve` running? set --endpoints \
         or BATON_ENDPOINTS)",
        failures.join("\n  ")
    ))
}

/// An error and its sources as one line, without the repetitions hyper and tonic produce
/// ("tcp connect error: tcp connect error: Connection refused").
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if let Some(last) = parts.last_mut() {
            if *last == text || text.starts_with(last.as_str()) {
                *last = text;
                next = e.source();
                continue;
            }
            if last.ends_with(&text) {
                next = e.source();
                continue;
            }
        }
        parts.push(text);
        next = e.source();
    }
    parts.join(": ")
}
