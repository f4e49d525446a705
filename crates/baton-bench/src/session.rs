//! A session as etcd's Go `concurrency.NewSession` makes one: a lease, kept alive every
//! TTL/3 in the background, revoked at the end. Used by the lock and election workloads.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use baton_proto::etcdserverpb::lease_client::LeaseClient;
use baton_proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest};
use futures::StreamExt as _;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::engine::REQUEST_TIMEOUT;

pub struct Session {
    pub lease: i64,
    leases: LeaseClient<Channel>,
    keep_alive: JoinHandle<Result<()>>,
}

impl Session {
    pub async fn open(channel: Channel, ttl_secs: u64) -> Result<Session> {
        let mut leases = LeaseClient::new(channel);
        let lease = leases
            .lease_grant(LeaseGrantRequest {
                ttl: ttl_secs as i64,
                id: 0,
            })
            .await
            .context("granting the session lease")?
            .into_inner()
            .id;
        let keep_alive = tokio::spawn(keep_alive(
            leases.clone(),
            lease,
            Duration::from_secs(ttl_secs) / 3,
        ));
        Ok(Session {
            lease,
            leases,
            keep_alive,
        })
    }

    /// Stops the keep-alive and revokes the lease (deleting whatever keys it holds), like
    /// Go's `Session.Close`. Reports a keep-alive that failed during the run.
    pub async fn close(mut self) -> Result<()> {
        let failed = if self.keep_alive.is_finished() {
            Some(self.keep_alive.await)
        } else {
            self.keep_alive.abort();
            None
        };
        let revoked = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.leases
                .lease_revoke(LeaseRevokeRequest { id: self.lease }),
        )
        .await
        .map_err(|_| anyhow!("revoking the session lease took over {REQUEST_TIMEOUT:?}"))
        .and_then(|r| r.context("revoking the session lease"));
        if let Some(failed) = failed {
            failed
                .context("the keep-alive task panicked")?
                .context("keeping the session lease alive")?;
        }
        revoked.map(drop)
    }
}

/// Renews lease `id` every `every` on one LeaseKeepAlive stream. Returns only on failure.
async fn keep_alive(mut leases: LeaseClient<Channel>, id: i64, every: Duration) -> Result<()> {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(LeaseKeepAliveRequest { id })
        .map_err(|_| anyhow!("keep-alive channel closed"))?;
    let mut responses = leases
        .lease_keep_alive(rx)
        .await
        .context("opening the keep-alive stream")?
        .into_inner();
    loop {
        match responses.next().await {
            Some(Ok(resp)) if resp.ttl > 0 => {}
            Some(Ok(_)) => bail!("lease {id:x} expired"),
            Some(Err(status)) => return Err(status).context("lease keep-alive"),
            None => bail!("the server closed the keep-alive stream"),
        }
        tokio::time::sleep(every).await;
        tx.unbounded_send(LeaseKeepAliveRequest { id })
            .map_err(|_| anyhow!("keep-alive channel closed"))?;
    }
}
