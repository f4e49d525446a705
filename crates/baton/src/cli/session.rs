//! A lease kept alive for as long as the holder runs, and the holder's own conservative
//! estimate of when it has lost it.
//!
//! The server decides when a lease expires; the client can only estimate. The estimate must
//! never be *later* than the server's, or the holder would keep working after its lock went
//! to someone else. So every acknowledged keep-alive moves the local deadline to
//! `send time + TTL − margin`, where the send time is when the request left (the server
//! renewed the lease no earlier than that), measured on the monotonic clock (wall-clock
//! jumps from NTP must not stretch a lease). If no acknowledgement moves the deadline before
//! it passes — a network partition, an overloaded server, or this process being paused
//! (SIGSTOP, a VM freeze) — the session is declared lost.
//!
//! This is only a best effort: a process paused between its check and its write cannot be
//! stopped by anything it runs itself. That is what fencing tokens are for (docs/locks.md).

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{bail, Result};
use baton_proto::etcdserverpb::{
    lease_client::LeaseClient, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// A granted lease plus the task that keeps it alive.
pub struct Session {
    /// The lease id (etcd prints it in lowercase hex).
    pub lease_id: i64,
    /// The TTL the server granted (it may raise a too-small request to its minimum).
    pub ttl: Duration,
    lost: watch::Receiver<Option<String>>,
    keepalive: JoinHandle<()>,
    client: LeaseClient<Channel>,
}

/// How much earlier than the server the holder gives up on its lease.
///
/// It absorbs clock-rate differences between client and server (tiny) and the time it takes
/// to tell a command to stop (larger). A sixth of the TTL leaves room for one lost
/// keep-alive (they go every TTL/3) before a false alarm; never less than 200 ms.
pub fn safety_margin(ttl: Duration) -> Duration {
    (ttl / 6).max(Duration::from_millis(200)).min(ttl / 2)
}

impl Session {
    /// Grants a lease of `ttl_s` seconds and starts keeping it alive every TTL/3.
    pub async fn grant(channel: Channel, ttl_s: i64) -> Result<Session> {
        if ttl_s <= 0 {
            bail!("--ttl must be at least 1 second");
        }
        let mut client = LeaseClient::new(channel);
        let sent = Instant::now();
        let resp = client
            .lease_grant(LeaseGrantRequest { ttl: ttl_s, id: 0 })
            .await
            .map_err(|s| anyhow::anyhow!(super::describe_status("granting a lease", &s)))?
            .into_inner();
        if !resp.error.is_empty() {
            bail!("granting a lease: {}", resp.error);
        }
        let ttl = Duration::from_secs(resp.ttl.max(1) as u64);
        let first_deadline = sent + ttl - safety_margin(ttl);
        let (lost_tx, lost_rx) = watch::channel(None);
        let keepalive = tokio::spawn(keep_alive(
            client.clone(),
            resp.id,
            ttl,
            first_deadline,
            lost_tx,
        ));
        Ok(Session {
            lease_id: resp.id,
            ttl,
            lost: lost_rx,
            keepalive,
            client,
        })
    }

    /// Resolves once the lease is (or must be assumed) lost, with the reason.
    pub async fn lost(&mut self) -> String {
        match self.lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            // The keep-alive task ended without a reason: it only does that when lost.
            Err(_) => "the keep-alive task stopped".to_string(),
        }
    }

    /// Stops the keep-alives and revokes the lease (deleting every key attached to it).
    ///
    /// Best effort with a short deadline: if the server cannot be reached the lease simply
    /// expires after its TTL, which is the same outcome, only later.
    pub async fn revoke(mut self) -> Result<()> {
        self.keepalive.abort();
        let call = self
            .client
            .lease_revoke(LeaseRevokeRequest { id: self.lease_id });
        match tokio::time::timeout(Duration::from_secs(3), call).await {
            Ok(Ok(_)) => Ok(()),
            // Already gone (expired or revoked from outside): nothing left to clean up.
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => Ok(()),
            Ok(Err(s)) => bail!(super::describe_status("revoking the lease", &s)),
            Err(_) => bail!("revoking the lease: no answer within 3 s (it will expire)"),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

/// Keeps `lease` alive until it is lost; reports why through `lost`.
async fn keep_alive(
    mut client: LeaseClient<Channel>,
    lease: i64,
    ttl: Duration,
    mut deadline: Instant,
    lost: watch::Sender<Option<String>>,
) {
    let margin = safety_margin(ttl);
    let period = ttl / 3;
    let mut reopening = false;
    let reason = 'outer: loop {
        if reopening {
            // The server or connection is down; retry soon, the deadline decides.
            tokio::select! {
                biased;
                _ = sleep_until(deadline) => break 'outer no_ack(ttl, margin),
                _ = tokio::time::sleep(retry_pause(ttl)) => {}
            }
        }
        reopening = true;
        let (tx, rx) = mpsc::channel::<LeaseKeepAliveRequest>(4);
        // The first keep-alive goes out with the stream: grpc-go servers (etcd) send the
        // response headers only with the first response, so waiting for the stream to open
        // before sending would wait forever.
        let mut in_flight: VecDeque<Instant> = VecDeque::from([Instant::now()]);
        let _ = tx.try_send(LeaseKeepAliveRequest { id: lease });
        let open = client.lease_keep_alive(ReceiverStream::new(rx));
        let mut inbound = tokio::select! {
            biased;
            _ = sleep_until(deadline) => break 'outer no_ack(ttl, margin),
            r = open => match r {
                Ok(r) => r.into_inner(),
                Err(_) => continue,
            },
        };
        let mut ticks = tokio::time::interval_at(Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            // Checked explicitly as well as by the timer: after a pause (SIGSTOP) a stale
            // response and the overdue timer become ready together.
            if Instant::now() >= deadline {
                break 'outer no_ack(ttl, margin);
            }
            tokio::select! {
                biased;
                _ = sleep_until(deadline) => break 'outer no_ack(ttl, margin),
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        let Some(sent) = in_flight.pop_front() else { continue };
                        if resp.ttl <= 0 {
                            break 'outer format!(
                                "the server says lease {lease:x} has expired or was revoked"
                            );
                        }
                        let until = sent + Duration::from_secs(resp.ttl as u64) - margin;
                        deadline = deadline.max(until);
                    }
                    // Reopen; the next stream starts with a keep-alive at once.
                    Ok(None) | Err(_) => break,
                },
                _ = ticks.tick() => {
                    // Never block here (the deadline must stay watched): if the server is not
                    // even reading our requests, skipping one changes nothing.
                    match tx.try_send(LeaseKeepAliveRequest { id: lease }) {
                        Ok(()) => in_flight.push_back(Instant::now()),
                        Err(mpsc::error::TrySendError::Full(_)) => {}
                        Err(mpsc::error::TrySendError::Closed(_)) => break,
                    }
                }
            }
        }
    };
    let _ = lost.send(Some(reason));
}

fn no_ack(ttl: Duration, margin: Duration) -> String {
    format!(
        "no keep-alive was acknowledged for {:.1} s (lease TTL {} s minus a {:.1} s safety \
         margin); the lease may have expired on the server",
        (ttl - margin).as_secs_f64(),
        ttl.as_secs(),
        margin.as_secs_f64()
    )
}

/// Pause between attempts to reopen a broken keep-alive stream.
fn retry_pause(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1))
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
            // Two keep-alive periods fit inside TTL − margin, so one lost keep-alive is
            // not a false alarm.
            assert!(ttl - m > 2 * (ttl / 3), "ttl {ttl:?} margin {m:?}");
            assert!(m >= Duration::from_millis(200));
        }
    }
}
