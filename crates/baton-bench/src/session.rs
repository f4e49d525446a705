//! A session as etcd's Go `concurrency.NewSession` makes one: a lease, kept alive every
//! TTL/3 in the background, revoked at the end. Used by the lock and election workloads.
//!
//! It runs on the contender's own [`H2Conn`], like its lock calls. Each keep-alive is one
//! short LeaseKeepAlive stream carrying one request and one response (the server answers,
//! then sees the end of the stream and closes it): the same work for the server as a
//! long-lived stream, and one request every few seconds is no hot path.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use baton_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, LeaseRevokeResponse,
};
use tokio::task::JoinHandle;

use crate::engine::REQUEST_TIMEOUT;
use crate::grpc::H2Conn;

pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
pub const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";

pub struct Session {
    pub lease: i64,
    conn: H2Conn,
    keep_alive: JoinHandle<Result<()>>,
}

impl Session {
    pub async fn open(conn: H2Conn, ttl_secs: u64) -> Result<Session> {
        let grant = conn.unary::<_, LeaseGrantResponse>(
            LEASE_GRANT,
            &LeaseGrantRequest {
                ttl: ttl_secs as i64,
                id: 0,
            },
        );
        let lease = tokio::time::timeout(REQUEST_TIMEOUT, grant)
            .await
            .map_err(|_| anyhow!("granting the session lease timed out"))?
            .context("granting the session lease")?
            .id;
        let keep_alive = tokio::spawn(keep_alive(
            conn.clone(),
            lease,
            Duration::from_secs(ttl_secs) / 3,
        ));
        Ok(Session {
            lease,
            conn,
            keep_alive,
        })
    }

    /// Stops the keep-alive and revokes the lease (deleting whatever keys it holds), like
    /// Go's `Session.Close`. Reports a keep-alive that failed during the run.
    pub async fn close(self) -> Result<()> {
        let failed = if self.keep_alive.is_finished() {
            Some(self.keep_alive.await)
        } else {
            self.keep_alive.abort();
            None
        };
        let revoke = self
            .conn
            .unary::<_, LeaseRevokeResponse>(LEASE_REVOKE, &LeaseRevokeRequest { id: self.lease });
        let revoked = tokio::time::timeout(REQUEST_TIMEOUT, revoke)
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

/// Renews lease `id` every `every`. Returns only on failure.
async fn keep_alive(conn: H2Conn, id: i64, every: Duration) -> Result<()> {
    loop {
        tokio::time::sleep(every).await;
        let renew = conn
            .unary::<_, LeaseKeepAliveResponse>(LEASE_KEEP_ALIVE, &LeaseKeepAliveRequest { id });
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, renew)
            .await
            .map_err(|_| anyhow!("lease keep-alive timed out"))?
            .context("lease keep-alive")?;
        if resp.ttl <= 0 {
            bail!("lease {id:x} expired");
        }
    }
}
