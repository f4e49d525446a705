//! Peer transport, server side: the `baton.raft.v1.Raft` service on `--listen-peer-urls`.
//!
//! Each handler checks the envelope (cluster and member), decodes the bincode payload, hands
//! it to openraft (or, for `Forward` and `ForwardBatch`, to the replica's leader-side
//! handlers) and encodes the result, errors included: openraft's and the replica's errors
//! travel inside a successful gRPC response, so a gRPC error always means the transport or
//! the envelope failed.

use std::net::SocketAddr;
use std::sync::Weak;
use std::time::Duration;

use baton_proto::baton::raft::v1::raft_server::{Raft as RaftService, RaftServer};
use baton_proto::baton::raft::v1::PeerMessage;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use tonic::{Request, Response, Status};

use crate::env::{PeerIncoming, PeerTransport};
use crate::membership::{JoinRequest, REMOVED_MESSAGE};
use crate::types::{Raft, TypeConfig};
use crate::wire::{self, LeaderRequest, LeaderResponse, MAX_PEER_MESSAGE_BYTES};
use crate::{Inner, ProposeError, StartError};

/// Concurrent calls per peer connection. Peers make a handful (one replication stream, votes,
/// ReadIndex heartbeats, forwarded requests bounded by their clients); the bound keeps a
/// misbehaving peer from spawning tasks without limit.
const MAX_CONCURRENT_STREAMS: u32 = 1024;

pub(crate) struct PeerService {
    pub(crate) cluster_id: u64,
    pub(crate) me: u64,
    pub(crate) raft: Raft,
    /// Weak: the server task must not keep a replica alive that was dropped without
    /// `shutdown`.
    pub(crate) node: Weak<Inner>,
}

impl PeerService {
    /// Checks the envelope; returns the sender and the payload.
    fn open(&self, req: Request<PeerMessage>) -> Result<(u64, Vec<u8>), Status> {
        let msg = req.into_inner();
        if msg.cluster_id != self.cluster_id || msg.to != self.me {
            // FailedPrecondition tells the sender "not delivered: wrong peer".
            return Err(Status::failed_precondition(format!(
                "baton: peer message for cluster {:x} member {:x} reached cluster {:x} member {:x}",
                msg.cluster_id, msg.to, self.cluster_id, self.me
            )));
        }
        Ok((msg.from, msg.payload))
    }

    fn reply<T: serde::Serialize>(
        &self,
        to: u64,
        value: &T,
    ) -> Result<Response<PeerMessage>, Status> {
        let payload = wire::encode(value).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(PeerMessage {
            cluster_id: self.cluster_id,
            from: self.me,
            to,
            payload,
        }))
    }
}

fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    wire::decode(payload).map_err(|e| Status::invalid_argument(e.to_string()))
}

#[tonic::async_trait]
impl RaftService for PeerService {
    async fn append_entries(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(&payload)?;
        let res = self.raft.append_entries(rpc).await;
        self.reply(from, &res)
    }

    async fn vote(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        self.refuse_removed(from)?;
        let rpc: VoteRequest<u64> = decode(&payload)?;
        let res = self.raft.vote(rpc).await;
        self.reply(from, &res)
    }

    async fn install_snapshot(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(&payload)?;
        let res = self.raft.install_snapshot(rpc).await;
        self.reply(from, &res)
    }

    async fn forward(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        self.refuse_removed(from)?;
        let req: LeaderRequest = decode(&payload)?;
        let Some(inner) = self.node.upgrade() else {
            return Err(Status::unavailable("baton: member is shutting down"));
        };
        let resp = inner.serve_leader_request(req).await;
        self.reply(from, &resp)
    }

    async fn forward_batch(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        self.refuse_removed(from)?;
        let reqs: Vec<LeaderRequest> = decode(&payload)?;
        let Some(inner) = self.node.upgrade() else {
            return Err(Status::unavailable("baton: member is shutting down"));
        };
        let resps = inner.serve_leader_batch(reqs).await;
        // Each answer on its own, so one too large for a peer message fails alone (as it
        // would in a `Forward` of its own) instead of taking the batch's answers with it. The
        // last MiB is left for such refusals (a batch has at most 1024 items).
        let budget = MAX_PEER_MESSAGE_BYTES - (1 << 20);
        let mut total = 8usize;
        let encoded: Vec<Vec<u8>> = resps
            .iter()
            .map(|r| {
                let bytes = wire::encode(r).ok().filter(|b| total + b.len() <= budget);
                let bytes = bytes.unwrap_or_else(|| {
                    let e =
                        ProposeError::LeaderFailed("answer above the peer message limit".into());
                    wire::encode(&LeaderResponse::Failed(e)).expect("small")
                });
                total += bytes.len();
                bytes
            })
            .collect();
        let payload = wire::encode_concatenated(encoded.iter().map(Vec::as_slice));
        Ok(Response::new(PeerMessage {
            cluster_id: self.cluster_id,
            from: self.me,
            to: from,
            payload,
        }))
    }

    async fn members(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        // The joiner knows neither the cluster id nor its id: no envelope check; what it gets
        // is the membership, which every member shows its clients anyway.
        let msg = request.into_inner();
        let req: JoinRequest = decode(&msg.payload)?;
        let Some(inner) = self.node.upgrade() else {
            return Err(Status::unavailable("baton: member is shutting down"));
        };
        let resp = inner.serve_join(req);
        self.reply(0, &resp)
    }

    async fn timeout_now(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        let term: u64 = decode(&payload)?;
        let Some(inner) = self.node.upgrade() else {
            return Err(Status::unavailable("baton: member is shutting down"));
        };
        let resp = inner.serve_timeout_now(from, term).await;
        self.reply(from, &resp)
    }
}

impl PeerService {
    /// A leader refuses votes and forwarded requests from members that are not in its
    /// membership, telling them they were removed (etcd answers a removed member's messages
    /// with "the member has been permanently removed from the cluster"). Only the leader
    /// decides: it holds every configuration ever proposed, while a lagging follower may not
    /// yet know a member that was just added.
    fn refuse_removed(&self, from: u64) -> Result<(), Status> {
        let Some(inner) = self.node.upgrade() else {
            return Ok(());
        };
        if inner.sender_was_removed(from) {
            return Err(Status::permission_denied(REMOVED_MESSAGE));
        }
        Ok(())
    }
}

/// A bound peer address: a TCP listener, or an injected transport's accepted connections.
pub(crate) enum PeerListener {
    Tcp(tokio::net::TcpListener),
    Injected(SocketAddr, PeerIncoming),
}

/// Binds every peer address (before Raft starts, so a port conflict fails the start).
pub(crate) async fn bind(
    addrs: &[SocketAddr],
    transport: Option<&dyn PeerTransport>,
) -> Result<Vec<PeerListener>, StartError> {
    let mut out = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let bind_err = |source| StartError::Bind {
            addr: *addr,
            source,
        };
        out.push(match transport {
            None => PeerListener::Tcp(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(bind_err)?,
            ),
            Some(t) => PeerListener::Injected(*addr, t.listen(*addr).await.map_err(bind_err)?),
        });
    }
    Ok(out)
}

/// Serves `service` on every listener until the returned tasks are aborted.
pub(crate) fn spawn(
    listeners: Vec<PeerListener>,
    service: PeerService,
) -> Vec<tokio::task::JoinHandle<()>> {
    let service = std::sync::Arc::new(service);
    listeners
        .into_iter()
        .map(|listener| {
            let svc = RaftServer::from_arc(service.clone())
                .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES + 4096)
                .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES + 4096);
            let router = tonic::transport::Server::builder()
                .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS))
                .http2_keepalive_interval(Some(Duration::from_secs(5)))
                .add_service(svc);
            match listener {
                PeerListener::Tcp(listener) => {
                    let addr = listener.local_addr().ok();
                    let incoming = tonic::transport::server::TcpIncoming::from(listener)
                        .with_nodelay(Some(true))
                        .with_keepalive(Some(Duration::from_secs(60)));
                    tokio::spawn(async move {
                        if let Err(e) = router.serve_with_incoming(incoming).await {
                            tracing::error!(?addr, error = %e, "peer service stopped");
                        }
                    })
                }
                PeerListener::Injected(addr, incoming) => {
                    let incoming = tokio_stream::wrappers::ReceiverStream::new(incoming);
                    tokio::spawn(async move {
                        if let Err(e) = router.serve_with_incoming(incoming).await {
                            tracing::error!(?addr, error = %e, "peer service stopped");
                        }
                    })
                }
            }
        })
        .collect()
}
