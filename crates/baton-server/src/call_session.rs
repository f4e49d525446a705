//! etcd's `v3lock.Lock` and `v3election.Campaign` with `lease = 0`: the server opens a session
//! of its own for the call, as etcd 3.4 does.
//!
//! **What etcd does.** Both services call `concurrency.NewSession` with the request's lease;
//! with none, that grants a lease of the session's default TTL (60 s) and keeps it alive for
//! as long as the call runs. The answer names the lease (the lock key and the election's
//! leader key are `<name>/<lease in hex>`); once the call has answered nobody keeps it alive,
//! so the lock or the leadership ends about a minute later unless the caller keeps that lease
//! alive itself. etcd's own e2e suite campaigns this way over the JSON gateway
//! (`TestV3CurlCampaignNoTLS`), as do clients that never pass a lease.
//!
//! **What Baton adds.** A call that fails or is abandoned (the client went away, a timeout)
//! revokes the lease it opened, so no waiter key of a caller that is gone blocks the queue
//! for a minute; the lock engine already deletes such a waiter's key. Baton's own
//! `baton.v1.Lock` still refuses `lease = 0`: it exists to make the safe path the easy one.

use std::time::Duration;

use baton_core::{Command, LeaseId, Response};
use tonic::Status;

use crate::errors::kv_status;
use crate::kv::unexpected;
use crate::Shared;

/// The TTL of a lease a call opens: `concurrency.NewSession`'s default.
pub const CALL_SESSION_TTL_S: i64 = 60;
/// How often the lease is renewed while the call runs: clientv3's keep-alive sends at a
/// third of the TTL.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(CALL_SESSION_TTL_S as u64 / 3);

/// A lease opened for one call and kept alive while the call runs. Dropped without
/// [`CallSession::hand_over`], it is revoked.
pub struct CallSession {
    shared: Shared,
    lease: LeaseId,
    keep_alive: tokio::task::JoinHandle<()>,
    handed_over: bool,
}

impl CallSession {
    /// Grants the call's lease and starts keeping it alive.
    pub async fn open(shared: &Shared) -> Result<CallSession, Status> {
        let ttl_s = CALL_SESSION_TTL_S.max(shared.config.min_lease_ttl_s);
        let proposed = shared
            .propose(Command::LeaseGrant {
                id: shared.node.new_lease_id(),
                ttl_s,
            })
            .await?;
        let lease = match proposed.applied.response {
            Response::LeaseGrant { id, .. } => id,
            Response::Error(e) => return Err(kv_status(&e)),
            other => return Err(unexpected(other)),
        };
        let node = shared.node.clone();
        let keep_alive = tokio::spawn(async move {
            loop {
                tokio::time::sleep(KEEP_ALIVE_EVERY).await;
                if let Err(e) = node.renew_lease(lease).await {
                    tracing::debug!(lease = lease.0, error = %e, "renewing a call's own lease failed; retrying at the next interval");
                }
            }
        });
        Ok(CallSession {
            shared: shared.clone(),
            lease,
            keep_alive,
            handed_over: false,
        })
    }

    /// The lease the call uses.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// The call answered with the lease: it stops being kept alive and is left to the caller.
    pub fn hand_over(mut self) {
        self.handed_over = true;
    }
}

impl Drop for CallSession {
    fn drop(&mut self) {
        self.keep_alive.abort();
        if self.handed_over {
            return;
        }
        let (shared, lease) = (self.shared.clone(), self.lease);
        tokio::spawn(async move {
            if let Err(e) = shared.propose(Command::LeaseRevoke { id: lease }).await {
                tracing::debug!(lease = lease.0, error = %e, "revoking an abandoned call's own lease failed; it expires by its TTL");
            }
        });
    }
}
