//! The lease `baton lock` and `baton elect` hold things with: a `baton-client` [`Session`],
//! so the CLI and every Rust program using the client share one implementation of the
//! lease-loss logic (keep-alives every TTL/3, a local expiry estimate from the *send* time
//! of the last acknowledged keep-alive on the monotonic clock, the loss signal), and the
//! CLI adds only what a command line needs: its safety margin and the words for a loss.
//!
//! The estimate must never be *later* than the server's, or the holder would keep working
//! after its lock went to someone else; see [`safety_margin`] and docs/locks.md. It is only
//! a best effort: a process paused between its check and its write cannot be stopped by
//! anything it runs itself. That is what fencing tokens are for.

use std::time::Duration;

use anyhow::{bail, Result};
use baton_client::{Client, LostReason, Session, SessionOptions};

use super::args::EndpointArgs;
use super::client::describe;
use super::output::hex;

/// How long one endpoint gets to accept a connection before the next is tried. Short,
/// because a member that does not answer a TCP handshake on loopback or a LAN within
/// seconds is down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How much earlier than the server the holder gives up on its lease (on top of the
/// client's clock-rate bound ρ).
///
/// It absorbs the time it takes to tell a command to stop. A sixth of the TTL leaves room
/// for one lost keep-alive (they go every TTL/3) before a false alarm; never less than
/// 200 ms.
pub fn safety_margin(ttl: Duration) -> Duration {
    (ttl / 6).max(Duration::from_millis(200)).min(ttl / 2)
}

/// Connects to the first reachable endpoint and grants a lease of `ttl_s` seconds, kept
/// alive until the session is closed or dropped.
pub async fn start(endpoint_args: &EndpointArgs, ttl_s: i64) -> Result<(Client, Session)> {
    if ttl_s <= 0 {
        bail!("--ttl must be at least 1 second");
    }
    let endpoints: Vec<String> = endpoint_args
        .endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();
    if endpoints.is_empty() {
        bail!("no endpoints given (use --endpoints host:port)");
    }
    let config = endpoint_args
        .config(endpoints)
        .with_connect_timeout(CONNECT_TIMEOUT);
    let client = Client::connect(config).await.map_err(describe)?;
    let ttl = Duration::from_secs(ttl_s as u64);
    let options = SessionOptions::new()
        .with_ttl(ttl)
        .with_margin(safety_margin(ttl));
    let session = Session::new(&client, options)
        .await
        .map_err(|e| describe(e).context("granting a lease"))?;
    Ok((client, session))
}

/// Why the lease (or what was held with it) is gone, in words a user can act on.
pub fn describe_loss(reason: LostReason, session: &Session) -> String {
    let ttl = session.ttl();
    match reason {
        LostReason::KeepAliveDeadline => format!(
            "no keep-alive was acknowledged in time (lease TTL {} s, minus a {:.1} s safety \
             margin); the lease may have expired on the server",
            ttl.as_secs(),
            safety_margin(ttl).as_secs_f64()
        ),
        LostReason::LeaseExpired => format!(
            "the server says lease {} has expired or was revoked",
            hex(session.lease())
        ),
        LostReason::KeyDeleted => "its key was deleted while the lease was still alive (an \
                                   operator's ForceRelease, a Release/Resign by someone \
                                   else, or a manual delete)"
            .to_string(),
        LostReason::Closed => "the session was closed".to_string(),
    }
}

/// Ends the session: stops the keep-alives and revokes the lease (deleting every key
/// attached to it). Best effort: if the server cannot be reached the lease simply expires
/// after its TTL, which is the same outcome, only later.
pub async fn close(session: &Session, who: &str, warn: bool) {
    if let Err(e) = session.close().await {
        if warn {
            eprintln!(
                "{who}: warning: revoking the lease: {:#} (it will expire)",
                describe(e)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::safety_margin;
    use std::time::Duration;

    #[test]
    fn margin_leaves_room_for_one_lost_keepalive() {
        for ttl in [2, 5, 10, 60] {
            let ttl = Duration::from_secs(ttl);
            let m = safety_margin(ttl);
            // Two keep-alive periods fit inside TTL × (1 − ρ) − margin, so one lost
            // keep-alive is not a false alarm (ρ = 0.01, the client's default).
            assert!(
                ttl.mul_f64(0.99) - m > 2 * (ttl / 3),
                "ttl {ttl:?} margin {m:?}"
            );
            assert!(m >= Duration::from_millis(200));
        }
    }
}
