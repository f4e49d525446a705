//! Peer transport, server side: the `baton.raft.v1.Raft` service on `--listen-peer-urls`.
//!
//! Each handler checks the envelope (cluster and member), decodes the bincode payload, hands
//! it to openraft (or, for `Forward` and `ForwardBatch`, to the replica's leader-side
//! handlers) and encodes the result, errors included: openraft's and the replica's errors
//! travel inside a successful gRPC response, so a gRPC error always means the transport or
//! the envelope failed.
//!
//! # What a peer may ask
//! Every request shows the credential of the sender's `--initial-cluster-token` in its
//! envelope (a joiner's `Members` question in its payload); without it nothing is served,
//! openraft's own methods included. Without peer TLS a secret token is the cluster's shared
//! secret; with peer mTLS (`baton-server`'s `peer_tls`, a transport this service does not
//! see) nothing reaches this service without a certificate of the peer CA either. For a
//! process that has both, a message's `from` is still only a claim (peer certificates name
//! hosts, not member ids), so the checks here bound what a false claim can do (issue 14),
//! and each refusal is counted in `baton_peer_refused_total{reason}`:
//! - no message may claim to come from its receiver (no member ever sends itself one);
//! - `Forward`/`ForwardBatch` come only from a member in the receiver's membership;
//! - a forwarded `Propose` carries only a command a client may cause ([`crate::origin`]):
//!   lease expiry, checkpoints and blank entries are the leader's own duties, whoever asks;
//!   a batch with one such item is refused whole, before any item is served (a real member
//!   never forwards one: `Node::propose` refuses it first);
//! - a forwarded `Publish` names its sender (a member publishes only its own attributes);
//! - the one leader duty a member asks for is a `NOSPACE` alarm (`Alarm(Activate)`), and
//!   only for itself: its own disk is full (a client may not raise one);
//! - `Members` answers only a request with the cluster token's credential, or a joiner that
//!   `member add` admits (`membership::admission`): the added member, not started yet,
//!   asking from an address of its peer URLs within 10 minutes of the add, once. That
//!   answer carries the cluster credential in its envelope.
//!
//! Before any of that, every request's envelope must announce this binary's payload format
//! (`wire::PEER_FORMAT_VERSION`; absent means 1): a member of another build is refused
//! before its payload is decoded, with both versions named (`format_version`).
//!
//! So a token holder's forged forwarded request can do at most what a client of the receiver
//! could. What these checks cannot bound is openraft's own messages from a token holder: a
//! forged `AppendEntries` or `InstallSnapshot` with a higher term is a leader as far as Raft
//! knows. Peer mTLS limits that to holders of a peer certificate.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use baton_proto::baton::raft::v1::raft_server::{Raft as RaftService, RaftServer};
use baton_proto::baton::raft::v1::{PeerMessage, PipeFrame, PipeMethod};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use tonic::{Request, Response, Status};

use crate::answer::ProposeError;
use crate::credential::ClusterCredential;
use crate::election::{Elector, PreVoteRequest};
use crate::env::{PeerIncoming, PeerTransport};
use crate::error::StartError;
use crate::leader_service::LeaderService;
use crate::lease_verdict::LeaseVerdicts;
use crate::membership::admission::AdmissionRefusal;
use crate::membership::change::{JoinRequest, SenderStanding, REMOVED_MESSAGE};
use crate::membership::Members;
use crate::origin::{self, LeaderDuty};
use crate::peer_meters::PeerMeters;
use crate::transfer;
use crate::types::{Raft, TypeConfig};
use crate::wire::{
    self, LeaderRequest, LeaderResponse, FORMAT_VERSION_METADATA, MAX_PEER_MESSAGE_BYTES,
    PEER_FORMAT_VERSION,
};

/// Concurrent calls per peer connection. Peers make a handful (one replication stream, votes,
/// ReadIndex heartbeats, forwarded requests bounded by their clients); the bound keeps a
/// misbehaving peer from spawning tasks without limit.
const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Clone: a pipe (`pipe::serve`) serves each of its frames in a task of its own.
#[derive(Clone)]
pub(crate) struct PeerService {
    pub(crate) cluster_id: u64,
    pub(crate) me: u64,
    /// What every request must show (in its envelope; a joiner's `Members` question in its
    /// payload): the credential of this member's `--initial-cluster-token`. `None` (no
    /// cluster flags): nothing is served.
    pub(crate) cluster_credential: Option<ClusterCredential>,
    pub(crate) raft: Raft,
    /// Weak: the server task must not keep a replica alive that was dropped without
    /// `shutdown`.
    pub(crate) handlers: Weak<Handlers>,
    /// Traffic per peer (shared with the peer client).
    pub(crate) meters: Arc<PeerMeters>,
    /// Where a lease verdict from the leader is kept (shared with the peer client).
    pub(crate) verdicts: Arc<LeaseVerdicts>,
}

/// What serves the peer methods beyond openraft's own: requests for the leader, joiners,
/// pre-votes and leader transfer.
pub(crate) struct Handlers {
    pub(crate) leader: LeaderService,
    pub(crate) members: Arc<Members>,
    pub(crate) elector: Arc<Elector>,
}

/// Why the peer service refused a message before acting on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// The sender claims the receiver's own id: no member sends itself a message.
    #[error("baton: peer message claims to come from its receiver {0:x}")]
    FromReceiver(u64),
    /// The leader does not know the sender: it was removed (or never added). The message
    /// is etcd's, and tells a removed member to stop (`network`).
    #[error("{}", REMOVED_MESSAGE)]
    Removed(u64),
    /// A follower does not know the sender (yet: a lagging follower may not have applied
    /// a MemberAdd). Sent as "wrong peer", so a real member retries elsewhere.
    #[error("baton: sender {0:x} is not in this member's membership")]
    UnknownSender(u64),
    /// A forwarded proposal of a command only the leader's own duties propose.
    #[error("baton: a forwarded {0} is refused: only the leader itself proposes it")]
    LeaderOnly(LeaderDuty),
    /// A forwarded `Publish` of another member's attributes.
    #[error("baton: member {from:x} may publish only its own attributes, not {id:x}'s")]
    PublishForAnother { from: u64, id: u64 },
    /// A request without the cluster token's credential: in the envelope (every method but
    /// `Members`) or in a joiner's request (`Members`, also when undecodable).
    #[error("baton: peer requests need the credential of this cluster's --initial-cluster-token")]
    NoClusterToken,
    /// A joiner's `Members` request without the cluster token's credential that admission
    /// by `member add` did not let in either (`membership::admission`).
    #[error(
        "baton: peer requests need the credential of this cluster's --initial-cluster-token, \
         and admission by member add does not apply: {0}"
    )]
    NotAdmitted(AdmissionRefusal),
    /// The envelope announces a payload format this binary does not speak: the sender runs
    /// another Baton build, and its payload would be misread.
    #[error(
        "baton: peer message in peer format {theirs}, but this member speaks peer format \
         {ours}: every member of a cluster must run a Baton of the same peer format"
    )]
    FormatVersion { theirs: u32, ours: u32 },
}

impl Refusal {
    /// The `reason` label of `baton_peer_refused_total`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refusal::FromReceiver(_) => "from_receiver",
            Refusal::Removed(_) | Refusal::UnknownSender(_) => "not_a_member",
            Refusal::LeaderOnly(_) => "leader_only_command",
            Refusal::PublishForAnother { .. } => "publish_for_another",
            Refusal::NoClusterToken => "no_cluster_token",
            Refusal::NotAdmitted(_) => "not_admitted",
            Refusal::FormatVersion { .. } => "format_version",
        }
    }

    /// Counts the refusal and makes the sender's status. PermissionDenied, except
    /// `UnknownSender`: FailedPrecondition means "not delivered: wrong peer" to a sender
    /// (`network`), which then retries with whoever leads.
    pub(crate) fn into_status(self) -> Status {
        metrics::counter!("baton_peer_refused_total", "reason" => self.reason()).increment(1);
        // Debug, not warn: the sender decides how often this happens; the counter is the
        // operator's signal.
        tracing::debug!(refusal = %self, "peer message refused");
        match self {
            Refusal::UnknownSender(_) => Status::failed_precondition(self.to_string()),
            // Not delivered, and said so in a form the sender reads back (`network`).
            Refusal::FormatVersion { ours, .. } => {
                let mut status = Status::failed_precondition(self.to_string());
                status.metadata_mut().insert(
                    FORMAT_VERSION_METADATA,
                    ours.to_string().parse().expect("digits"),
                );
                status
            }
            Refusal::FromReceiver(_)
            | Refusal::Removed(_)
            | Refusal::LeaderOnly(_)
            | Refusal::PublishForAnother { .. }
            | Refusal::NoClusterToken
            | Refusal::NotAdmitted(_) => Status::permission_denied(self.to_string()),
        }
    }
}

/// Whether an envelope's payload format is this binary's (an absent field is 1: see
/// `wire::announced_format`).
pub(crate) fn check_format(field: u32) -> Result<(), Refusal> {
    let theirs = wire::announced_format(field);
    if theirs == PEER_FORMAT_VERSION {
        Ok(())
    } else {
        Err(Refusal::FormatVersion {
            theirs,
            ours: PEER_FORMAT_VERSION,
        })
    }
}

/// What a member may forward on `from`'s behalf (see the module docs): the check of one
/// forwarded request's content, apart from who sent it.
pub(crate) fn check_forwarded(from: u64, req: &LeaderRequest) -> Result<(), Refusal> {
    match req {
        // Alarms, raised or cleared, are a client's request since etcd's `Maintenance.Alarm`
        // ACTIVATE is served (issue 18): a member's own watch raises its alarm this way,
        // and a client on a follower may raise one for any member, as on etcd.
        LeaderRequest::Propose(command) => {
            origin::client_may_propose(command).map_err(Refusal::LeaderOnly)
        }
        LeaderRequest::Publish { id, .. } if *id != from => {
            Err(Refusal::PublishForAnother { from, id: *id })
        }
        LeaderRequest::Publish { .. }
        | LeaderRequest::ReadIndex
        | LeaderRequest::KeepAlive(_)
        | LeaderRequest::TimeToLive(_)
        | LeaderRequest::GrantCheck(_)
        | LeaderRequest::ChangeMembers(_) => Ok(()),
    }
}

impl PeerService {
    /// The handlers, unless the replica is gone.
    fn handlers(&self) -> Result<Arc<Handlers>, Status> {
        self.handlers
            .upgrade()
            .ok_or_else(|| Status::unavailable("baton: member is shutting down"))
    }

    /// Checks the envelope; returns the sender and the payload.
    fn open(&self, req: Request<PeerMessage>) -> Result<(u64, Vec<u8>), Status> {
        // Peer mTLS happened before this (the transport's handshake); certificates name
        // hosts, not member ids, so `from` is taken at its word here, and the checks after
        // this one bound what a false word can do.
        let msg = req.into_inner();
        // First: the version says how everything else in the message is to be read.
        check_format(msg.format_version).map_err(Refusal::into_status)?;
        if msg.cluster_id != self.cluster_id || msg.to != self.me {
            // FailedPrecondition tells the sender "not delivered: wrong peer".
            return Err(Status::failed_precondition(format!(
                "baton: peer message for cluster {:x} member {:x} reached cluster {:x} member {:x}",
                msg.cluster_id, msg.to, self.cluster_id, self.me
            )));
        }
        // Only a process given the cluster token is heard as a member: without it, no
        // method (openraft's own included) acts on the message.
        if !self
            .cluster_credential
            .is_some_and(|mine| mine.matches_bytes(&msg.credential))
        {
            return Err(Refusal::NoClusterToken.into_status());
        }
        if msg.from == self.me {
            return Err(Refusal::FromReceiver(msg.from).into_status());
        }
        // Counted under the sender's id only if the membership lists it (a label value
        // per claimed id would let a token holder add series without bound).
        let meter = self.meters.known(msg.from).or_else(|| {
            let listed = self
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&msg.from)
                .is_some();
            listed.then(|| self.meters.of_member(msg.from)).flatten()
        });
        if let Some(m) = meter {
            m.received_bytes.increment(msg.payload.len() as u64);
        }
        Ok((msg.from, msg.payload))
    }

    fn reply<T: serde::Serialize>(
        &self,
        to: u64,
        value: &T,
    ) -> Result<Response<PeerMessage>, Status> {
        let payload = wire::encode(value).map_err(|e| Status::internal(e.to_string()))?;
        if let Some(m) = self.meters.known(to) {
            m.sent_bytes.increment(payload.len() as u64);
        }
        Ok(Response::new(PeerMessage {
            cluster_id: self.cluster_id,
            from: self.me,
            to,
            payload,
            credential: Vec::new(),
            format_version: PEER_FORMAT_VERSION,
            lease_verdict: None,
        }))
    }
}

impl PeerService {
    /// One pipe frame, served as its method's unary call.
    pub(crate) async fn serve_frame(
        self: Arc<Self>,
        frame: PipeFrame,
    ) -> Result<PeerMessage, Status> {
        let method = PipeMethod::try_from(frame.method)
            .map_err(|_| Status::unimplemented(format!("baton: pipe method {}", frame.method)))?;
        let message = frame
            .message
            .ok_or_else(|| Status::invalid_argument("baton: pipe frame without a message"))?;
        let request = Request::new(message);
        let response = match method {
            PipeMethod::AppendEntries => self.append_entries(request).await,
            PipeMethod::Vote => self.vote(request).await,
            PipeMethod::Forward => self.forward(request).await,
            PipeMethod::ForwardBatch => self.forward_batch(request).await,
            PipeMethod::TimeoutNow => self.timeout_now(request).await,
            PipeMethod::PreVote => self.pre_vote(request).await,
            PipeMethod::Unspecified => {
                Err(Status::unimplemented("baton: pipe frame without a method"))
            }
        };
        response.map(Response::into_inner)
    }
}

fn decode<T: serde::de::DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    wire::decode(payload).map_err(|e| Status::invalid_argument(e.to_string()))
}

type PipeAnswers =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<PipeFrame, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl RaftService for PeerService {
    type PipeStream = PipeAnswers;

    /// Each frame is served as its method's unary call below (`pipe`).
    async fn pipe(
        &self,
        request: Request<tonic::Streaming<PipeFrame>>,
    ) -> Result<Response<Self::PipeStream>, Status> {
        let service = Arc::new(self.clone());
        let answers = crate::pipe::serve(
            move |frame| service.clone().serve_frame(frame),
            request.into_inner(),
        );
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(answers),
        )))
    }

    async fn append_entries(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let verdict = request.get_ref().lease_verdict;
        let (from, payload) = self.open(request)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(&payload)?;
        if let Some(verdict) = &verdict {
            self.verdicts.hear(from, verdict, &rpc);
        }
        let res = self.raft.append_entries(rpc).await;
        self.reply(from, &res)
    }

    async fn vote(&self, request: Request<PeerMessage>) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        // Only "removed" refuses a vote: a lagging follower must still hear a candidate it
        // does not know yet.
        if let Some(handlers) = self.handlers.upgrade() {
            if handlers.members.sender_standing(from) == SenderStanding::Removed {
                return Err(Refusal::Removed(from).into_status());
            }
        }
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
        let handlers = self.handlers()?;
        check_member(&handlers.members, from)?;
        let req: LeaderRequest = decode(&payload)?;
        check_forwarded(from, &req).map_err(Refusal::into_status)?;
        let resp = handlers.leader.serve(req).await;
        if let LeaderResponse::Proposed(p) = &resp {
            handlers
                .leader
                .notify_commit(from, p.raft_term, p.raft_index);
        }
        self.reply(from, &resp)
    }

    async fn forward_batch(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        let handlers = self.handlers()?;
        check_member(&handlers.members, from)?;
        let reqs: Vec<LeaderRequest> = decode(&payload)?;
        // Every item before any is served: a batch with a forged item is forged whole.
        for req in &reqs {
            check_forwarded(from, req).map_err(Refusal::into_status)?;
        }
        let resps = handlers.leader.serve_batch(reqs).await;
        let last_entry = resps
            .iter()
            .filter_map(|r| match r {
                LeaderResponse::Proposed(p) => Some((p.raft_term, p.raft_index)),
                _ => None,
            })
            .max_by_key(|&(_, index)| index);
        if let Some((term, index)) = last_entry {
            handlers.leader.notify_commit(from, term, index);
        }
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
            credential: Vec::new(),
            format_version: PEER_FORMAT_VERSION,
            lease_verdict: None,
        }))
    }

    async fn members(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        // The joiner knows neither the cluster id nor its id: no envelope check. It shows
        // the credential of the token it was given instead; anyone else learns neither the
        // ids nor the peer URLs a forger would need (an undecodable request shows none),
        // unless `member add` admits it (`membership::admission`).
        let source = request.remote_addr();
        let msg = request.into_inner();
        check_format(msg.format_version).map_err(Refusal::into_status)?;
        let (Some(mine), Ok(req)) = (self.cluster_credential, decode::<JoinRequest>(&msg.payload))
        else {
            return Err(Refusal::NoClusterToken.into_status());
        };
        let members = self.handlers()?.members.clone();
        if mine.matches(&req.credential) {
            let resp = members.serve_join(req);
            return self.reply(0, &resp);
        }
        let resp = members
            .admit(req, source)
            .await
            .map_err(|why| Refusal::NotAdmitted(why).into_status())?;
        // The admitted joiner is handed the cluster's credential (the digest, never the
        // token) in the envelope, a field replies otherwise leave empty.
        let mut reply = self.reply(0, &resp)?;
        reply.get_mut().credential = mine.to_vec();
        Ok(reply)
    }

    async fn timeout_now(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        let term: u64 = decode(&payload)?;
        let handlers = self.handlers()?;
        let resp = transfer::serve_timeout_now(&handlers.leader.replica, from, term).await;
        self.reply(from, &resp)
    }

    async fn pre_vote(
        &self,
        request: Request<PeerMessage>,
    ) -> Result<Response<PeerMessage>, Status> {
        let (from, payload) = self.open(request)?;
        let handlers = self.handlers()?;
        // As for votes: only "removed" refuses; a lagging voter must still hear a member it
        // does not know yet.
        if handlers.members.sender_standing(from) == SenderStanding::Removed {
            return Err(Refusal::Removed(from).into_status());
        }
        let req: PreVoteRequest = decode(&payload)?;
        let resp = handlers.elector.serve_pre_vote(from, req).await;
        self.reply(from, &resp)
    }
}

/// Requests are forwarded only by members: the leader tells a non-member it was removed
/// (etcd answers a removed member's messages with "the member has been permanently removed
/// from the cluster"); a follower that does not know the sender refuses it as the wrong
/// peer, which a real member (just added, ahead of this follower) retries with the leader.
fn check_member(members: &Members, from: u64) -> Result<(), Status> {
    match members.sender_standing(from) {
        SenderStanding::Member => Ok(()),
        SenderStanding::Removed => Err(Refusal::Removed(from).into_status()),
        SenderStanding::Unknown => Err(Refusal::UnknownSender(from).into_status()),
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
    let service = Arc::new(service);
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
            // Each connection is looked at first: a peer link is served by `link`, the
            // rest (gRPC: unary calls, the gRPC pipe) by tonic.
            let links = service.clone();
            let serve_call = move |frame| links.clone().serve_frame(frame);
            match listener {
                PeerListener::Tcp(listener) => {
                    let addr = listener.local_addr().ok();
                    let incoming = crate::link::accept_tcp(listener, serve_call);
                    tokio::spawn(async move {
                        if let Err(e) = router.serve_with_incoming(incoming).await {
                            tracing::error!(?addr, error = %e, "peer service stopped");
                        }
                    })
                }
                PeerListener::Injected(addr, incoming) => {
                    let incoming = crate::link::accept_incoming(incoming, serve_call);
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

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::{AlarmAction, Command, LeaseId, PutRequest};

    use crate::types::Member;

    #[test]
    fn forwarded_requests_are_checked_by_content() {
        let put = Command::Put(PutRequest {
            key: b"k".to_vec(),
            ..Default::default()
        });
        assert_eq!(check_forwarded(2, &LeaderRequest::Propose(put)), Ok(()));
        let expiry = LeaderRequest::Propose(Command::ExpireLeases {
            ids: vec![LeaseId(7)],
        });
        assert_eq!(
            check_forwarded(2, &expiry),
            Err(Refusal::LeaderOnly(LeaderDuty::ExpireLeases))
        );
        let publish = |id| LeaderRequest::Publish {
            id,
            member: Member::default(),
        };
        assert_eq!(check_forwarded(2, &publish(2)), Ok(()));
        assert_eq!(
            check_forwarded(2, &publish(3)),
            Err(Refusal::PublishForAnother { from: 2, id: 3 })
        );
        let alarm = |member_id| {
            LeaderRequest::Propose(Command::Alarm {
                action: AlarmAction::Activate,
                member_id,
                alarm: baton_core::AlarmType::NoSpace,
            })
        };
        // A client's ACTIVATE on a follower may name any member, as on etcd.
        assert_eq!(check_forwarded(2, &alarm(2)), Ok(()));
        assert_eq!(check_forwarded(2, &alarm(3)), Ok(()));
        for req in [
            LeaderRequest::ReadIndex,
            LeaderRequest::KeepAlive(LeaseId(1)),
            LeaderRequest::TimeToLive(LeaseId(1)),
            LeaderRequest::GrantCheck(LeaseId(1)),
        ] {
            assert_eq!(check_forwarded(2, &req), Ok(()), "{req:?}");
        }
    }

    /// An envelope of this binary's format, or without the field (a binary from before it:
    /// format 1), is heard; any other is refused naming both versions, and the status tells
    /// the sender this member's version in its metadata (read back in `network`).
    #[test]
    fn envelopes_of_another_format_are_refused_naming_both_versions() {
        assert_eq!(PEER_FORMAT_VERSION, 1, "update this test with the version");
        assert_eq!(check_format(0), Ok(()));
        assert_eq!(check_format(PEER_FORMAT_VERSION), Ok(()));
        let refusal = check_format(2).unwrap_err();
        assert_eq!(refusal, Refusal::FormatVersion { theirs: 2, ours: 1 });
        let status = refusal.into_status();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "baton: peer message in peer format 2, but this member speaks peer format 1: \
             every member of a cluster must run a Baton of the same peer format"
        );
        assert_eq!(status.metadata().get(FORMAT_VERSION_METADATA).unwrap(), "1");
    }

    #[test]
    fn refusals_have_their_status_and_label() {
        let cases = [
            (
                Refusal::FromReceiver(1),
                tonic::Code::PermissionDenied,
                "from_receiver",
            ),
            (
                Refusal::Removed(1),
                tonic::Code::PermissionDenied,
                "not_a_member",
            ),
            (
                Refusal::UnknownSender(1),
                tonic::Code::FailedPrecondition,
                "not_a_member",
            ),
            (
                Refusal::LeaderOnly(LeaderDuty::LeaseCheckpoint),
                tonic::Code::PermissionDenied,
                "leader_only_command",
            ),
            (
                Refusal::PublishForAnother { from: 1, id: 2 },
                tonic::Code::PermissionDenied,
                "publish_for_another",
            ),
            (
                Refusal::NoClusterToken,
                tonic::Code::PermissionDenied,
                "no_cluster_token",
            ),
            (
                Refusal::NotAdmitted(AdmissionRefusal::SourceUnknown),
                tonic::Code::PermissionDenied,
                "not_admitted",
            ),
            (
                Refusal::FormatVersion { theirs: 2, ours: 1 },
                tonic::Code::FailedPrecondition,
                "format_version",
            ),
        ];
        for (refusal, code, reason) in cases {
            assert_eq!(refusal.reason(), reason);
            let message = refusal.to_string();
            let status = refusal.into_status();
            assert_eq!((status.code(), status.message()), (code, message.as_str()));
        }
        // A removed member recognizes its refusal by etcd's exact words (`network`).
        assert_eq!(Refusal::Removed(1).to_string(), REMOVED_MESSAGE);
    }
}
