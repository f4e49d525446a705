//! Lease operations. Most code wants a [`crate::Session`], which grants a lease, keeps it
//! alive and says when it is lost; these are the raw calls underneath.

use std::time::Duration;

use baton_proto::etcdserverpb as pb;
use baton_proto::etcdserverpb::lease_client::LeaseClient;
use futures::StreamExt as _;

use crate::client::{request, write_request, Client, Deadline, Retry};
use crate::error::{Error, Result};

pub use pb::{LeaseGrantResponse, LeaseTimeToLiveResponse};

impl Client {
    /// Grants a lease of `ttl` (rounded up to whole seconds; the server may raise it to its
    /// minimum, so read the granted TTL from the response) and a server-chosen id.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<LeaseGrantResponse> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let req = pb::LeaseGrantRequest {
            ttl: secs.max(1) as i64,
            id: 0,
        };
        let id = self.next_request_id();
        self.call(
            "Lease/LeaseGrant",
            Retry::Once,
            Deadline::Default,
            |ch, t| {
                let r = write_request(req, t, id);
                async move { LeaseClient::new(ch).lease_grant(r).await }
            },
        )
        .await
    }

    /// Revokes a lease, deleting every key attached to it. Revoking twice is harmless to
    /// the store, so this is retried on failover; a lease that is already gone is `Ok`.
    pub async fn lease_revoke(&self, lease: i64) -> Result<()> {
        let req = pb::LeaseRevokeRequest { id: lease };
        let id = self.next_request_id();
        let r = self
            .call(
                "Lease/LeaseRevoke",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = write_request(req, t, id);
                    async move { LeaseClient::new(ch).lease_revoke(r).await }
                },
            )
            .await;
        match r {
            Ok(_) | Err(Error::SessionLost(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Renews a lease once; returns the TTL in seconds it was renewed for, `0` if the lease
    /// no longer exists (expired or revoked).
    pub async fn lease_keep_alive_once(&self, lease: i64) -> Result<i64> {
        self.keep_alive_once(lease, Deadline::Default).await
    }

    pub(crate) async fn keep_alive_once(&self, lease: i64, deadline: Deadline) -> Result<i64> {
        self.call(
            "Lease/LeaseKeepAlive",
            Retry::Idempotent,
            deadline,
            |ch, _| async move {
                // LeaseKeepAlive is a bidirectional stream; one request, one answer. The
                // request stream stays open until the answer is read (no half-close race).
                let out = futures::stream::iter([pb::LeaseKeepAliveRequest { id: lease }])
                    .chain(futures::stream::pending());
                let resp = LeaseClient::new(ch).lease_keep_alive(out).await?;
                let mut stream = resp.into_inner();
                match stream.message().await? {
                    Some(m) => Ok(tonic::Response::new(m.ttl)),
                    None => Err(tonic::Status::unavailable(
                        "keep-alive stream ended without an answer",
                    )),
                }
            },
        )
        .await
    }

    /// The lease's remaining and granted TTL (remaining `-1`: the lease does not exist).
    pub async fn lease_time_to_live(&self, lease: i64) -> Result<LeaseTimeToLiveResponse> {
        self.time_to_live(lease, false).await
    }

    /// Like [`Client::lease_time_to_live`], plus the keys attached to the lease.
    pub async fn lease_time_to_live_with_keys(
        &self,
        lease: i64,
    ) -> Result<LeaseTimeToLiveResponse> {
        self.time_to_live(lease, true).await
    }

    /// Every live lease's id (etcd's `LeaseLeases`), in the server's order.
    pub async fn lease_list(&self) -> Result<Vec<i64>> {
        let resp = self
            .call(
                "Lease/LeaseLeases",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = request(pb::LeaseLeasesRequest {}, t);
                    async move { LeaseClient::new(ch).lease_leases(r).await }
                },
            )
            .await?;
        Ok(resp.leases.into_iter().map(|l| l.id).collect())
    }

    async fn time_to_live(&self, lease: i64, keys: bool) -> Result<LeaseTimeToLiveResponse> {
        let req = pb::LeaseTimeToLiveRequest { id: lease, keys };
        self.call(
            "Lease/LeaseTimeToLive",
            Retry::Idempotent,
            Deadline::Default,
            |ch, t| {
                let r = request(req, t);
                async move { LeaseClient::new(ch).lease_time_to_live(r).await }
            },
        )
        .await
    }
}
