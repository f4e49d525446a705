//! `etcdserverpb.Lease`: grant, revoke, keep-alive, time-to-live, list.
//!
//! Keep-alives are answered from the leader's in-memory lease clock and never written to
//! the log (etcd's choice: a replicated keep-alive would cost an fsync each). On a follower,
//! keep-alives and TimeToLive go to the leader (`Node::renew_lease`,
//! `Node::lease_time_to_live`).

use std::collections::VecDeque;
use std::pin::Pin;

use baton_core::{Command, KvError, LeaseId, Response, MAX_LEASE_TTL_S};
use baton_proto::etcdserverpb as pb;
use baton_raft::KeepAlive;
use std::future::Future;

use futures::stream::FuturesOrdered;
use futures::{Stream, StreamExt};
use tonic::{Request, Status, Streaming};

use crate::errors::{kv_status, propose_status};
use crate::kv::unexpected;
use crate::Shared;

/// Keep-alives of one stream renewed at once, at most.
const KEEP_ALIVES_IN_FLIGHT: usize = 256;
/// Keep-alives of one stream read ahead of their renewal, at most (8 bytes each): a client
/// keeping 50,000 leases alive sends them in one burst, and what is not read stays in h2,
/// which counts it against the connection's budget for small frames (`crate::transport`).
/// Beyond this the stream waits for renewals, and flow control holds the client back.
const KEEP_ALIVES_READ_AHEAD: usize = 1 << 17;

type Renewal = Pin<Box<dyn Future<Output = Result<pb::LeaseKeepAliveResponse, Status>> + Send>>;

/// The state of one `LeaseKeepAlive` stream: requests still to come, read but not yet
/// renewing, and renewals in flight.
struct KeepAliveStream {
    inbound: Option<Streaming<pb::LeaseKeepAliveRequest>>,
    queued: VecDeque<i64>,
    pending: FuturesOrdered<Renewal>,
    /// Why receiving failed, sent once everything before it is answered.
    failure: Option<Status>,
    shared: Shared,
}

/// The next request of a stream that is still open (`select!` evaluates the branch's future
/// even when its condition is false, so it must not need the stream to exist).
async fn next_request(
    inbound: &mut Option<Streaming<pb::LeaseKeepAliveRequest>>,
) -> Option<Result<pb::LeaseKeepAliveRequest, Status>> {
    inbound.as_mut()?.next().await
}

/// Renews one lease and builds its answer (etcd's: `ttl` 0 for a lease that is gone).
async fn renew(shared: Shared, id: i64) -> Result<pb::LeaseKeepAliveResponse, Status> {
    // The header is taken before the renewal so a keep-alive can never look newer than a
    // revoke it raced with (etcd does the same).
    let header = shared.header();
    match shared.node.renew_lease(LeaseId(id)).await {
        Ok(KeepAlive::Renewed { ttl_s }) => Ok(pb::LeaseKeepAliveResponse {
            header: Some(header),
            id,
            ttl: ttl_s,
        }),
        Ok(KeepAlive::NotFound) => {
            // The lease expired or was revoked: its holder has lost it.
            metrics::counter!("baton_lease_renewal_failures_total", "reason" => "not_found")
                .increment(1);
            Ok(pb::LeaseKeepAliveResponse {
                header: Some(header),
                id,
                ttl: 0,
            })
        }
        Err(e) => {
            metrics::counter!("baton_lease_renewal_failures_total", "reason" => "unavailable")
                .increment(1);
            Err(propose_status(&e))
        }
    }
}

/// The Lease service.
pub struct LeaseService {
    pub(crate) shared: Shared,
}

#[tonic::async_trait]
impl pb::lease_server::Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<tonic::Response<pb::LeaseGrantResponse>, Status> {
        let req = request.into_inner();
        if req.ttl > MAX_LEASE_TTL_S {
            return Err(kv_status(&KvError::LeaseTtlTooLarge));
        }
        let ttl_s = req.ttl.max(self.shared.config.min_lease_ttl_s);
        let id = if req.id == 0 {
            self.shared.node.new_lease_id()
        } else {
            LeaseId(req.id)
        };
        let proposed = self
            .shared
            .propose(Command::LeaseGrant { id, ttl_s })
            .await?;
        let header = self
            .shared
            .header_at(proposed.applied.revision.0, proposed.raft_term);
        match proposed.applied.response {
            Response::LeaseGrant { id, ttl_s } => {
                Ok(tonic::Response::new(pb::LeaseGrantResponse {
                    header: Some(header),
                    id: id.0,
                    ttl: ttl_s,
                    error: String::new(),
                }))
            }
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<tonic::Response<pb::LeaseRevokeResponse>, Status> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        // Revoking deletes the lease's keys: write on each of them (etcd's checkLeasePuts).
        let proposed = self
            .shared
            .propose_as(
                &caller,
                Command::LeaseRevoke {
                    id: LeaseId(req.id),
                },
            )
            .await?;
        let header = self
            .shared
            .header_at(proposed.applied.revision.0, proposed.raft_term);
        match proposed.applied.response {
            Response::LeaseRevoke => Ok(tonic::Response::new(pb::LeaseRevokeResponse {
                header: Some(header),
            })),
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }

    type LeaseKeepAliveStream =
        Pin<Box<dyn Stream<Item = Result<pb::LeaseKeepAliveResponse, Status>> + Send + 'static>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<tonic::Response<Self::LeaseKeepAliveStream>, Status> {
        self.shared.require_leader()?;
        let inbound = request.into_inner();
        // The response stream renews as it is polled, in the task that already serves this
        // gRPC stream: no task of its own and no channel in between. With 10k leases kept
        // alive the leader answers thousands of keep-alives a second, each arriving alone,
        // and the extra task's wake-up per keep-alive (a futex and often a thread switch) was
        // a large share of the cost. A client that stops reading responses stalls only its
        // own stream, through HTTP/2 flow control.
        //
        // Requests are read as they arrive (up to `KEEP_ALIVES_READ_AHEAD` queued) and
        // renewed concurrently (up to `KEEP_ALIVES_IN_FLIGHT`), answered in order: on a follower each renewal is a trip to the leader, batched with
        // other keep-alives after a short linger (`baton_raft` forwarding), and one at a time
        // a stream could renew only a few hundred leases a second.
        let state = KeepAliveStream {
            inbound: Some(inbound),
            queued: VecDeque::new(),
            pending: FuturesOrdered::new(),
            failure: None,
            shared: self.shared.clone(),
        };
        let stream = futures::stream::unfold(Some(state), |state| async move {
            let mut st = state?;
            loop {
                while st.pending.len() < KEEP_ALIVES_IN_FLIGHT {
                    let Some(id) = st.queued.pop_front() else {
                        break;
                    };
                    st.pending.push_back(Box::pin(renew(st.shared.clone(), id)));
                }
                let may_read = st.inbound.is_some() && st.queued.len() < KEEP_ALIVES_READ_AHEAD;
                let reply = tokio::select! {
                    // Reading comes first: every request already received is taken out of
                    // the HTTP/2 layer before the next answer goes out (module docs).
                    biased;
                    req = next_request(&mut st.inbound), if may_read => {
                        match req {
                            Some(Ok(req)) => st.queued.push_back(req.id),
                            // Receiving failed (a message over the receive limit):
                            // answer what is queued and pending, then end with that
                            // error, as etcd's handler returns it.
                            Some(Err(status)) => {
                                st.failure = Some(status);
                                st.inbound = None;
                            }
                            // The client closed its side: answer what is queued and
                            // pending, then end.
                            None => st.inbound = None,
                        }
                        continue;
                    }
                    Some(reply) = st.pending.next(), if !st.pending.is_empty() => reply,
                    // Nothing left to read, queue or answer.
                    else => return st.failure.take().map(|status| (Err(status), None)),
                };
                // An error ends the stream after it is sent.
                let next = reply.is_ok().then_some(st);
                return Some((reply, next));
            }
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<tonic::Response<pb::LeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        self.shared.read_barrier().await?;
        let id = LeaseId(req.id);
        let (info, revision) = self.shared.node.read(|sm| (sm.lease(id), sm.revision()));
        let header = self.shared.header_at(revision.0, self.shared.term());
        let remaining = match info {
            None => None,
            Some(_) => self
                .shared
                .node
                .lease_time_to_live(id)
                .await
                .map_err(|e| propose_status(&e))?,
        };
        let resp = match info {
            None => pb::LeaseTimeToLiveResponse {
                header: Some(header),
                id: req.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
            Some(info) => pb::LeaseTimeToLiveResponse {
                header: Some(header),
                id: req.id,
                ttl: remaining.unwrap_or(-1),
                granted_ttl: info.granted_ttl_s,
                keys: if req.keys { info.keys } else { Vec::new() },
            },
        };
        Ok(tonic::Response::new(resp))
    }

    async fn lease_leases(
        &self,
        _request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<tonic::Response<pb::LeaseLeasesResponse>, Status> {
        self.shared.read_barrier().await?;
        let (ids, revision) = self.shared.node.read(|sm| (sm.lease_ids(), sm.revision()));
        Ok(tonic::Response::new(pb::LeaseLeasesResponse {
            header: Some(self.shared.header_at(revision.0, self.shared.term())),
            leases: ids
                .into_iter()
                .map(|id| pb::LeaseStatus { id: id.0 })
                .collect(),
        }))
    }
}
