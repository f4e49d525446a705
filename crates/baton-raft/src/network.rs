//! Peer transport, client side: openraft's `RaftNetworkFactory`/`RaftNetwork` over the
//! `baton.raft.v1.Raft` gRPC service, and the channel a follower forwards requests through.
//!
//! One tonic `Channel` per peer, shared by Raft replication, elections, ReadIndex heartbeats
//! and forwarded requests (openraft asks for a new client per election and per ReadIndex, so
//! channels are cached here, not per client). Channels connect lazily, reconnect by
//! themselves and multiplex concurrent calls over one HTTP/2 connection. A call to a peer
//! that is down fails at once (connection refused) or after `CONNECT_TIMEOUT`; openraft then
//! backs off (`backoff`) instead of retrying in a loop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use baton_proto::baton::raft::v1::raft_client::RaftClient;
use baton_proto::baton::raft::v1::{LeaseVerdict, PeerMessage};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftNetwork, RaftNetworkFactory};
use parking_lot::Mutex;
use tonic::transport::{Channel, Endpoint};

use crate::credential::ClusterCredential;
use crate::early_acks::EarlyAcks;
use crate::env::PeerTransport;
use crate::lease_verdict::LeaseVerdicts;
use crate::peer_meters::PeerMeters;
use crate::pipe::{self, PipeClient};
use crate::types::{Member, MemberMap, TypeConfig};
use crate::wire::{
    self, WireError, FORMAT_VERSION_METADATA, MAX_PEER_MESSAGE_BYTES, PEER_FORMAT_VERSION,
};
use baton_proto::baton::raft::v1::PipeMethod;

/// How long establishing a TCP connection to a peer may take. Loopback and LAN peers answer
/// in microseconds; a peer that does not is treated as down rather than waited for.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// HTTP/2 pings on idle peer connections, so a peer that vanished without a FIN/RST (power
/// loss, partition) is noticed and the connection re-established.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Replication to an unreachable peer pauses this long between attempts (growing to the
/// last value), instead of retrying at heartbeat rate. Short at first so a restarted member
/// catches up quickly.
const BACKOFF_MS: [u64; 4] = [100, 250, 500, 1000];

/// The peer-service methods.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Method {
    AppendEntries,
    Vote,
    InstallSnapshot,
    Forward,
    ForwardBatch,
    TimeoutNow,
    PreVote,
}

/// The pipe method of `method`; `None`: the method is only called unary.
fn pipe_method(method: Method) -> Option<PipeMethod> {
    Some(match method {
        Method::AppendEntries => PipeMethod::AppendEntries,
        Method::Vote => PipeMethod::Vote,
        Method::Forward => PipeMethod::Forward,
        Method::ForwardBatch => PipeMethod::ForwardBatch,
        Method::TimeoutNow => PipeMethod::TimeoutNow,
        Method::PreVote => PipeMethod::PreVote,
        Method::InstallSnapshot => return None,
    })
}

/// Why a call to a peer failed. What matters to callers is whether the request may have been
/// processed: only then is retrying a non-idempotent request unsafe.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum PeerError {
    /// Not delivered: no connection could be made (refused, connect timeout), or the member
    /// has no peer URL.
    #[error("member {target:x} is unreachable: {reason}")]
    Unreachable { target: u64, reason: String },
    /// Not delivered: the process at that address is not the member meant (another cluster,
    /// another member), and refused the message before looking at it.
    #[error("member {target:x}: {reason}")]
    WrongPeer { target: u64, reason: String },
    /// Sent (perhaps), but no valid answer came back: the request may have been processed.
    #[error("call to member {target:x} failed: {reason}")]
    Failed { target: u64, reason: String },
    /// No answer within the time given: the request may have been processed.
    #[error("call to member {target:x} timed out after {after:?}")]
    Timeout { target: u64, after: Duration },
    /// Not delivered: the peer speaks another payload format (another Baton build), so
    /// neither end can read the other's messages. Retrying does not help; an operator must
    /// run one build on every member.
    #[error(
        "member {target:x} speaks peer format {theirs}, this member peer format {ours}: \
         every member of a cluster must run a Baton of the same peer format"
    )]
    IncompatibleFormat { target: u64, theirs: u32, ours: u32 },
}

impl PeerError {
    /// The request certainly did not reach the peer's handler.
    pub(crate) fn not_delivered(&self) -> bool {
        matches!(
            self,
            PeerError::Unreachable { .. }
                | PeerError::WrongPeer { .. }
                | PeerError::IncompatibleFormat { .. }
        )
    }
}

/// The refusing peer's payload format, if `status` is a format refusal
/// (`peer_server::Refusal::FormatVersion`, which names it in the metadata).
fn format_refusal(status: &tonic::Status) -> Option<u32> {
    status
        .metadata()
        .get(FORMAT_VERSION_METADATA)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Whether a transport failure is a refused connection (nothing was sent). tonic reports
/// connect errors as `Unavailable` with the I/O error somewhere in the source chain.
fn connection_refused(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        source = e.source();
    }
    false
}

/// Channels to peers and this member's identity for the envelope.
pub(crate) struct Peers {
    cluster_id: u64,
    me: u64,
    /// The cluster token's credential, shown on every request (`PeerMessage::credential`).
    credential: Vec<u8>,
    /// Per peer: the URLs the channel was made for (a membership change of a peer's URLs
    /// makes a new channel) and the channel.
    channels: Mutex<MemberMap<(Vec<String>, Channel)>>,
    /// When each peer last answered a call (any method): the leader heartbeats every voter
    /// and learner, so this is etcd's "active since" used by the reconfiguration checks.
    last_answer: Mutex<MemberMap<Instant>>,
    /// Set once a peer told this member it has been removed from the cluster (see
    /// `membership`); the embedder stops serving then.
    removed: tokio::sync::watch::Sender<bool>,
    /// Injected transport (peer TLS, simulation); `None`: plain TCP.
    transport: Option<Arc<dyn PeerTransport>>,
    /// Per peer, the foreign payload format last reported in the log, so a mismatch is
    /// logged once per peer and version rather than at every heartbeat.
    format_reported: Mutex<MemberMap<u32>>,
    /// Per peer, the transport's explanation of the last failed call that had one (a TLS
    /// refusal), so it is logged once per peer until it changes or the peer answers.
    explained: Mutex<MemberMap<String>>,
    /// Traffic per peer (shared with the peer service).
    pub(crate) meters: Arc<PeerMeters>,
    /// Per peer, the leader's early AppendEntries in flight (`early_append`).
    early_in_flight: Mutex<MemberMap<Arc<AtomicUsize>>>,
    /// Per peer, what its answers to early AppendEntries acknowledged (`early_acks`).
    pub(crate) early_acks: EarlyAcks,
    /// Lease verdicts: issued on this member's AppendEntries as leader, kept as heard from
    /// the leader as follower (shared with the peer service and the lease duty).
    pub(crate) verdicts: Arc<LeaseVerdicts>,
    /// Per peer, the pipe most calls travel on (`pipe`), or since when the peer is known
    /// not to serve pipes.
    pipes: Mutex<MemberMap<PipeSlot>>,
    /// Per peer, since when it is known not to speak the peer link (`link`): its calls take
    /// the gRPC pipe until `pipe::RETRY_UNSUPPORTED` later.
    links_unsupported: Mutex<MemberMap<Instant>>,
}

/// A peer's pipe, or why it has none.
enum PipeSlot {
    /// Open for these peer URLs (or closed since: replaced at the next call).
    Open(Vec<String>, Arc<PipeClient>, Carrier),
    /// The peer answered `Pipe` Unimplemented at this time: unary calls until
    /// `pipe::RETRY_UNSUPPORTED` later.
    Unsupported(Instant),
}

/// What a pipe's frames travel on, in the order tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    /// The peer link: frames on a plain (or TLS) stream of their own (`link`).
    Link,
    /// The gRPC stream `baton.raft.v1.Raft/Pipe` on the peer channel (`pipe`).
    Grpc,
}

impl Peers {
    pub(crate) fn new(
        cluster_id: u64,
        me: u64,
        credential: Option<ClusterCredential>,
        transport: Option<Arc<dyn PeerTransport>>,
    ) -> Self {
        Peers {
            cluster_id,
            me,
            // A member without cluster flags has no peers to show it to.
            credential: credential
                .map(ClusterCredential::to_vec)
                .unwrap_or_default(),
            channels: Mutex::new(MemberMap::default()),
            last_answer: Mutex::new(MemberMap::default()),
            removed: tokio::sync::watch::channel(false).0,
            transport,
            format_reported: Mutex::new(MemberMap::default()),
            explained: Mutex::new(MemberMap::default()),
            meters: Arc::new(PeerMeters::default()),
            early_in_flight: Mutex::new(MemberMap::default()),
            early_acks: EarlyAcks::default(),
            verdicts: Arc::new(LeaseVerdicts::default()),
            pipes: Mutex::new(MemberMap::default()),
            links_unsupported: Mutex::new(MemberMap::default()),
        }
    }

    /// The pipe to `target`, opened if there is none (or it closed): on the peer link
    /// unless the peer is known not to speak it, else on the gRPC stream; `None` while the
    /// peer is known to serve neither.
    fn pipe(
        &self,
        target: u64,
        node: &Member,
    ) -> Result<Option<(Arc<PipeClient>, Carrier)>, PeerError> {
        {
            let pipes = self.pipes.lock();
            match pipes.get(&target) {
                Some(PipeSlot::Open(urls, pipe, carrier))
                    if *urls == node.peer_urls && pipe.is_open() =>
                {
                    return Ok(Some((pipe.clone(), *carrier)));
                }
                Some(PipeSlot::Unsupported(since)) if since.elapsed() < pipe::RETRY_UNSUPPORTED => {
                    return Ok(None);
                }
                _ => {}
            }
        }
        let channel = self.channel(target, node)?;
        let link_known_unsupported = self
            .links_unsupported
            .lock()
            .get(&target)
            .is_some_and(|since| since.elapsed() < pipe::RETRY_UNSUPPORTED);
        let mut pipes = self.pipes.lock();
        // Another call may have opened one meanwhile.
        if let Some(PipeSlot::Open(urls, pipe, carrier)) = pipes.get(&target) {
            if *urls == node.peer_urls && pipe.is_open() {
                return Ok(Some((pipe.clone(), *carrier)));
            }
        }
        let dial = (!link_known_unsupported).then(|| self.dial(node)).flatten();
        let (pipe, carrier) = match dial {
            Some(dial) => (crate::link::open(dial), Carrier::Link),
            None => (PipeClient::open(channel), Carrier::Grpc),
        };
        pipes.insert(
            target,
            PipeSlot::Open(node.peer_urls.clone(), pipe.clone(), carrier),
        );
        Ok(Some((pipe, carrier)))
    }

    /// A dialer of `node`'s first peer URL for the peer link: the transport's, or plain TCP
    /// for an `http://` URL when there is no transport; `None` when neither makes one.
    fn dial(&self, node: &Member) -> Option<crate::env::DialFuture> {
        let url = node.peer_urls.first()?;
        match &self.transport {
            Some(t) => t.dial(url),
            None if url.starts_with("http://") => Some(crate::link::dial_plain(url)),
            None => None,
        }
    }

    /// Records that `target` does not serve pipes on `carrier` (an older build), as `pipe`
    /// found out. Calls that were on the same pipe find out too: the first one records it.
    fn pipe_unsupported(&self, target: u64, pipe: &Arc<PipeClient>, carrier: Carrier) {
        let mut pipes = self.pipes.lock();
        let current = matches!(
            pipes.get(&target),
            Some(PipeSlot::Open(_, open, _)) if Arc::ptr_eq(open, pipe)
        );
        if !current {
            return;
        }
        match carrier {
            Carrier::Link => {
                tracing::info!(
                    peer = format_args!("{target:x}"),
                    "peer does not speak the peer link (an older build): calls on the gRPC pipe"
                );
                self.links_unsupported.lock().insert(target, Instant::now());
                pipes.remove(&target);
            }
            Carrier::Grpc => {
                tracing::info!(
                    peer = format_args!("{target:x}"),
                    "peer does not serve the peer pipe (an older build): unary peer calls"
                );
                pipes.insert(target, PipeSlot::Unsupported(Instant::now()));
            }
        }
    }

    /// The count of early AppendEntries in flight to `target` (`early_append` keeps it).
    pub(crate) fn early_slots(&self, target: u64) -> Arc<AtomicUsize> {
        self.early_in_flight
            .lock()
            .entry(target)
            .or_default()
            .clone()
    }

    /// Whether an early AppendEntries to `target` is in flight: a heartbeat's answer may then
    /// wait for `target`'s fsync of those entries, so its round trip times the disk.
    fn early_in_flight(&self, target: u64) -> bool {
        self.early_in_flight
            .lock()
            .get(&target)
            .is_some_and(|n| n.load(Ordering::Acquire) > 0)
    }

    /// The transport's explanation of `status`, logged at WARN when it is new for `target`
    /// (a refused TLS handshake is a configuration problem the operator must see, not a
    /// peer being down).
    fn explain(&self, target: u64, status: &tonic::Status) -> Option<String> {
        let why = self.transport.as_ref()?.explain(status)?;
        if self.explained.lock().insert(target, why.clone()).as_ref() != Some(&why) {
            tracing::warn!(
                peer = format_args!("{target:x}"),
                "peer connection failed: {why}"
            );
        }
        Some(why)
    }

    /// The error for a peer of another payload format, logged (once per peer and version)
    /// as the operator's problem it is.
    fn incompatible(&self, target: u64, theirs: u32) -> PeerError {
        let e = PeerError::IncompatibleFormat {
            target,
            theirs,
            ours: PEER_FORMAT_VERSION,
        };
        if self.format_reported.lock().insert(target, theirs) != Some(theirs) {
            tracing::error!(peer = format_args!("{target:x}"), "{e}");
        }
        e
    }

    /// Whether `target` answered a call within `within`.
    pub(crate) fn active_within(&self, target: u64, within: Duration) -> bool {
        self.last_answer
            .lock()
            .get(&target)
            .is_some_and(|t| t.elapsed() <= within)
    }

    /// Records that this member has been removed from the cluster (first time: `true`).
    pub(crate) fn mark_removed(&self) -> bool {
        !self.removed.send_replace(true)
    }

    /// Resolves once this member is known to have been removed.
    pub(crate) fn removed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.removed.subscribe()
    }

    fn channel(&self, target: u64, node: &Member) -> Result<Channel, PeerError> {
        let mut channels = self.channels.lock();
        if let Some((urls, ch)) = channels.get(&target) {
            if *urls == node.peer_urls {
                return Ok(ch.clone());
            }
        }
        let unreachable = |reason: String| PeerError::Unreachable { target, reason };
        let url = node
            .peer_urls
            .first()
            .ok_or_else(|| unreachable("no peer URL in the membership".into()))?;
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| unreachable(format!("bad peer URL {url}: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let ch = match &self.transport {
            Some(t) => t.connect_lazy(endpoint),
            None => endpoint.connect_lazy(),
        };
        channels.insert(target, (node.peer_urls.clone(), ch.clone()));
        Ok(ch)
    }

    /// One call to `target`'s peer service, bounded by `timeout`. Returns the response
    /// payload after checking the envelope.
    pub(crate) async fn call(
        &self,
        target: u64,
        node: &Member,
        method: Method,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, PeerError> {
        self.call_with_verdict(target, node, method, payload, None, timeout)
            .await
    }

    /// [`Peers::call`] with a lease verdict in the envelope (an AppendEntries from the
    /// leader: `lease_verdict`).
    pub(crate) async fn call_with_verdict(
        &self,
        target: u64,
        node: &Member,
        method: Method,
        payload: Vec<u8>,
        lease_verdict: Option<LeaseVerdict>,
        timeout: Duration,
    ) -> Result<Vec<u8>, PeerError> {
        let ch = self.channel(target, node)?;
        let meter = self.meters.of_member(target);
        if let Some(m) = &meter {
            m.sent_bytes.increment(payload.len() as u64);
        }
        let mut piped = match pipe_method(method) {
            Some(m) => self.pipe(target, node)?.map(|(p, c)| (m, p, c)),
            None => None,
        };
        let mut client = RaftClient::new(ch)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES + 4096)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES + 4096);
        let mut msg = PeerMessage {
            cluster_id: self.cluster_id,
            from: self.me,
            to: target,
            payload,
            credential: self.credential.clone(),
            format_version: PEER_FORMAT_VERSION,
            lease_verdict,
        };
        let call = async move {
            while let Some((pipe_method, pipe, carrier)) = piped.take() {
                // Until the peer has answered on a pipe, a copy is kept for a retry on the
                // next carrier (the gRPC pipe, then unary) should it turn out not to speak
                // this one (then nothing was delivered).
                let copy = (!pipe.confirmed()).then(|| msg.clone());
                match (pipe.call(pipe_method, msg).await, copy) {
                    (Err(_), Some(copy)) if pipe.unsupported() => {
                        self.pipe_unsupported(target, &pipe, carrier);
                        msg = copy;
                        piped = self
                            .pipe(target, node)
                            .ok()
                            .flatten()
                            .map(|(p, c)| (pipe_method, p, c));
                    }
                    (answer, _) => return answer.map(tonic::Response::new),
                }
            }
            match method {
                Method::AppendEntries => client.append_entries(msg).await,
                Method::Vote => client.vote(msg).await,
                Method::InstallSnapshot => client.install_snapshot(msg).await,
                Method::Forward => client.forward(msg).await,
                Method::ForwardBatch => client.forward_batch(msg).await,
                Method::TimeoutNow => client.timeout_now(msg).await,
                Method::PreVote => client.pre_vote(msg).await,
            }
        };
        let answer = tokio::time::timeout(timeout, call).await;
        if let Some(m) = &meter {
            match &answer {
                Ok(Ok(resp)) => m
                    .received_bytes
                    .increment(resp.get_ref().payload.len() as u64),
                _ => m.sent_failures.increment(1),
            }
        }
        let resp = match answer {
            Err(_) => {
                return Err(PeerError::Timeout {
                    target,
                    after: timeout,
                })
            }
            Ok(Err(status)) => {
                if let Some(theirs) = format_refusal(&status) {
                    return Err(self.incompatible(target, theirs));
                }
                let reason = match self.explain(target, &status) {
                    Some(why) => format!("{method:?}: {why}"),
                    None => format!("{method:?}: {}", status.message()),
                };
                if status.code() == tonic::Code::PermissionDenied
                    && status.message() == crate::membership::change::REMOVED_MESSAGE
                {
                    if self.mark_removed() {
                        tracing::error!(
                            peer = format_args!("{target:x}"),
                            "{}",
                            crate::membership::change::REMOVED_MESSAGE
                        );
                    }
                    return Err(PeerError::WrongPeer { target, reason });
                }
                return Err(match status.code() {
                    tonic::Code::FailedPrecondition => PeerError::WrongPeer { target, reason },
                    tonic::Code::Unavailable if connection_refused(&status) => {
                        PeerError::Unreachable { target, reason }
                    }
                    _ => PeerError::Failed { target, reason },
                });
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };
        self.last_answer.lock().insert(target, Instant::now());
        self.explained.lock().remove(&target);
        let theirs = wire::announced_format(resp.format_version);
        if theirs != PEER_FORMAT_VERSION {
            return Err(self.incompatible(target, theirs));
        }
        if resp.cluster_id != self.cluster_id || resp.from != target || resp.to != self.me {
            return Err(PeerError::Failed {
                target,
                reason: format!(
                    "answer from cluster {:x} member {:x} to {:x}",
                    resp.cluster_id, resp.from, resp.to
                ),
            });
        }
        Ok(resp.payload)
    }
}

/// openraft's factory: hands out [`PeerClient`]s sharing the cached channels.
pub(crate) struct PeerNetwork {
    pub(crate) peers: Arc<Peers>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &Member) -> Self::Network {
        PeerClient {
            peers: self.peers.clone(),
            target,
            node: node.clone(),
        }
    }
}

/// openraft's connection to one peer.
pub(crate) struct PeerClient {
    peers: Arc<Peers>,
    target: u64,
    node: Member,
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<u64, Member, RaftError<u64, E>>>;

impl PeerClient {
    /// Sends `payload` (with `lease_verdict` in the envelope) and decodes openraft's
    /// `Result<Resp, RaftError<E>>` from the answer.
    async fn roundtrip<Resp, E>(
        &self,
        method: Method,
        action: RPCTypes,
        payload: Vec<u8>,
        lease_verdict: Option<LeaseVerdict>,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Resp: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let ttl = option.hard_ttl();
        let bytes = self
            .peers
            .call_with_verdict(self.target, &self.node, method, payload, lease_verdict, ttl)
            .await
            .map_err(|e| match e {
                PeerError::Timeout { .. } => RPCError::Timeout(Timeout {
                    action,
                    id: self.peers.me,
                    target: self.target,
                    timeout: ttl,
                }),
                // Everything else suggests the peer is down, restarting or not the one meant:
                // `Unreachable` makes openraft back off (it may retry a `NetworkError` at
                // once, which against a dead peer is a busy loop).
                _ => RPCError::Unreachable(Unreachable::new(&e)),
            })?;
        let res: Result<Resp, RaftError<u64, E>> =
            wire::decode(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl PeerClient {
    fn notify_commit(&self, notice: AppendEntriesRequest<TypeConfig>) {
        self.peers
            .clone()
            .notify_commit(self.target, self.node.clone(), notice);
    }
}

impl Peers {
    /// Sends `target` a commit notice (an AppendEntries without entries that the follower
    /// answers without a disk write) and forgets it: if it is lost, openraft's next request
    /// or heartbeat carries the committed id again. The caller has claimed the committed id
    /// as sent (`EarlyAcks::commit_news`); a notice the follower did not take (its log does
    /// not hold `prev_log_id` yet) gives the claim back, so the next notice goes.
    pub(crate) fn notify_commit(
        self: Arc<Self>,
        target: u64,
        node: Member,
        notice: AppendEntriesRequest<TypeConfig>,
    ) {
        let verdict = self.verdicts.issue(&notice.vote, notice.leader_commit);
        let Ok(payload) = wire::encode(&notice) else {
            return;
        };
        tokio::spawn(async move {
            let res = self
                .call_with_verdict(
                    target,
                    &node,
                    Method::AppendEntries,
                    payload,
                    verdict,
                    COMMIT_NOTICE_TIMEOUT,
                )
                .await;
            let taken = res.as_ref().is_ok_and(|bytes| {
                matches!(
                    wire::decode::<Result<AppendEntriesResponse<u64>, RaftError<u64>>>(bytes),
                    Ok(Ok(AppendEntriesResponse::Success))
                )
            });
            if !taken {
                self.early_acks
                    .commit_not_taken(target, &notice.vote, notice.leader_commit);
            }
            let outcome = match (&res, taken) {
                (Err(_), _) => {
                    cached_counter!("baton_raft_commit_notices_total", "outcome" => "failed")
                }
                (Ok(_), true) => {
                    cached_counter!("baton_raft_commit_notices_total", "outcome" => "sent")
                }
                (Ok(_), false) => {
                    cached_counter!("baton_raft_commit_notices_total", "outcome" => "refused")
                }
            };
            outcome.increment(1);
        });
    }
}

/// How long a commit notice may take before it is given up (see `notify_commit`).
const COMMIT_NOTICE_TIMEOUT: Duration = Duration::from_secs(1);

/// Encodes a message that has no size to give up (a vote, one snapshot chunk).
fn encode_whole<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, NetworkError> {
    wire::encode(value).map_err(|e| NetworkError::new(&e))
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        let entries = rpc.entries.len() as u64;
        // The follower already acknowledged these entries, durably, in its answer to the
        // early AppendEntries of this vote (`early_acks`): that answer stands in for this
        // request's, which would be a second round trip on the write's critical path. Only
        // the committed id it carries still goes, if it is news, without waiting for it.
        if let Some(last) = rpc.entries.last() {
            let last = last.log_id;
            let wait = option.soft_ttl() / 2;
            let acks = &self.peers.early_acks;
            if acks.covers(self.target, &rpc.vote, last, wait).await {
                acks.stood_in();
                cached_counter!("baton_raft_appends_answered_early_total").increment(1);
                if acks.commit_news(self.target, &rpc.vote, rpc.leader_commit) {
                    self.notify_commit(AppendEntriesRequest {
                        vote: rpc.vote,
                        prev_log_id: Some(last),
                        entries: Vec::new(),
                        leader_commit: rpc.leader_commit,
                    });
                }
                return Ok(AppendEntriesResponse::Success);
            }
        }
        let payload = match wire::encode(&rpc) {
            Ok(p) => p,
            // openraft resends fewer entries at once; a single entry always fits (an entry is
            // at most a 4 MiB proposal batch).
            Err(WireError::TooLarge) if entries > 1 => {
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(entries / 2),
                ));
            }
            Err(e) => return Err(RPCError::Network(NetworkError::new(&e))),
        };
        // A heartbeat (no entries, so no disk write at the follower) times the network:
        // etcd's `peer_round_trip_time_seconds` — unless an early AppendEntries was in flight
        // to the same follower meanwhile: the follower's answer to the heartbeat can wait for
        // its fsync of those entries (its Raft core task handles one request at a time, and
        // a small append is fsynced on it), so that sample may time the follower's disk,
        // which `etcd_disk_wal_fsync_duration_seconds` reports, not the network.
        #[allow(clippy::disallowed_methods)] // A duration to report, not a deadline.
        let started = std::time::Instant::now();
        let overlapped_early = self.peers.early_in_flight(self.target);
        // The commit heartbeat after a write wakes the follower's lock waiters: it carries
        // the verdict their grants need (`lease_verdict`).
        let verdict = self.peers.verdicts.issue(&rpc.vote, rpc.leader_commit);
        // Without entries this is openraft's commit heartbeat: the committed id it carries is
        // claimed as sent, so the commit notice for a forwarded write that is about to follow
        // it (`LeaderService::notify_commit`) does not carry the same id again. In a syscall
        // trace of a put through a follower (1 client) that follower got both, one after the
        // other, for every write, and answered each (2.0 notices per write to it; 1.5 with
        // this, the rest being notices that went first). 3 members, 50 distinct locks, six
        // alternating pairs: 11.3k vs 10.6k cycles/s; put with 1 client through a follower
        // within the noise. Claimed only when the heartbeat's `prev_log_id` reaches the
        // committed id: from a follower further behind, a success answer does not mean it
        // took that commit (it commits only what its log matched), and the notice must go.
        let acks = &self.peers.early_acks;
        let claimed = entries == 0
            && rpc.prev_log_id >= rpc.leader_commit
            && acks.commit_news(self.target, &rpc.vote, rpc.leader_commit);
        let res = self
            .roundtrip(
                Method::AppendEntries,
                RPCTypes::AppendEntries,
                payload,
                verdict,
                &option,
            )
            .await;
        if claimed && !matches!(res, Ok(AppendEntriesResponse::Success)) {
            // Not taken: the next notice must carry it.
            acks.commit_not_taken(self.target, &rpc.vote, rpc.leader_commit);
        }
        if entries == 0 {
            match &res {
                Ok(_) if overlapped_early || self.peers.early_in_flight(self.target) => {}
                Ok(_) => {
                    if let Some(m) = self.peers.meters.known(self.target) {
                        m.timed_round_trip(started.elapsed());
                    }
                }
                Err(_) => {
                    metrics::counter!("etcd_server_heartbeat_send_failures_total").increment(1)
                }
            }
        }
        res
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        let payload = encode_whole(&rpc).map_err(RPCError::Network)?;
        self.roundtrip(
            Method::InstallSnapshot,
            RPCTypes::InstallSnapshot,
            payload,
            None,
            &option,
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>> {
        let payload = encode_whole(&rpc).map_err(RPCError::Network)?;
        self.roundtrip(Method::Vote, RPCTypes::Vote, payload, None, &option)
            .await
    }

    fn backoff(&self) -> Backoff {
        let last = BACKOFF_MS[BACKOFF_MS.len() - 1];
        Backoff::new(
            BACKOFF_MS
                .into_iter()
                .chain(std::iter::repeat(last))
                .map(Duration::from_millis),
        )
    }
}

/// Why [`ask_members`] got no membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AskError {
    /// The member refused to answer (PermissionDenied: the join credential is not the
    /// cluster's).
    Refused(String),
    /// No answer (unreachable, timed out, bad URL, another error).
    Failed(String),
    /// No connection: the transport refused it or was refused (TLS), as explained by
    /// [`PeerTransport::explain`]. Unlike a peer that is down, this does not pass by itself.
    Transport(String),
}

/// What a member answered [`ask_members`].
#[derive(Debug)]
pub(crate) struct MembersAnswer {
    /// The asked member's cluster id (from the envelope).
    pub(crate) cluster_id: u64,
    /// A `JoinResponse`, encoded.
    pub(crate) payload: Vec<u8>,
    /// The cluster's credential when the member admitted the joiner by `member add`
    /// (`membership::admission`); empty when the joiner showed the right one itself.
    pub(crate) credential: Vec<u8>,
}

/// Asks the member at `url` for the cluster's membership on behalf of a member that joins
/// with an empty data directory and knows neither the cluster id nor its own member id yet
/// (the envelope carries zeros for both; the answer's envelope names the cluster).
pub(crate) async fn ask_members(
    transport: Option<&dyn PeerTransport>,
    url: &str,
    payload: Vec<u8>,
    timeout: Duration,
) -> Result<MembersAnswer, AskError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| AskError::Failed(format!("bad peer URL {url}: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(timeout);
    let call = async {
        let ch = match transport {
            Some(t) => t.connect_lazy(endpoint),
            None => endpoint
                .connect()
                .await
                .map_err(|e| AskError::Failed(e.to_string()))?,
        };
        let mut client = RaftClient::new(ch)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES + 4096)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES + 4096);
        // The joiner's credential travels in the request itself (`JoinRequest`).
        let msg = PeerMessage {
            cluster_id: 0,
            from: 0,
            to: 0,
            payload,
            credential: Vec::new(),
            format_version: PEER_FORMAT_VERSION,
            lease_verdict: None,
        };
        let resp = client
            .members(msg)
            .await
            .map_err(|s| match s.code() {
                tonic::Code::PermissionDenied => AskError::Refused(s.message().to_string()),
                _ => match transport.and_then(|t| t.explain(&s)) {
                    Some(why) => AskError::Transport(why),
                    None => AskError::Failed(s.message().to_string()),
                },
            })?
            .into_inner();
        // A member of another build answered (one of this build refuses first, naming both
        // versions in its message): its payload would be misread.
        let theirs = wire::announced_format(resp.format_version);
        if theirs != PEER_FORMAT_VERSION {
            return Err(AskError::Failed(format!(
                "{url} speaks peer format {theirs}, this member peer format \
                 {PEER_FORMAT_VERSION}: every member of a cluster must run a Baton of the same \
                 peer format"
            )));
        }
        Ok(MembersAnswer {
            cluster_id: resp.cluster_id,
            payload: resp.payload,
            credential: resp.credential,
        })
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| AskError::Failed(format!("no answer within {timeout:?}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer_server::check_format;

    /// A receiver's format refusal reaches the sender as `IncompatibleFormat` with both
    /// versions, counted as not delivered (it was refused before being decoded); other
    /// refusals are not mistaken for it.
    #[test]
    fn a_format_refusal_is_surfaced_with_both_versions() {
        let status = check_format(7).unwrap_err().into_status();
        assert_eq!(format_refusal(&status), Some(PEER_FORMAT_VERSION));
        let wrong_peer = tonic::Status::failed_precondition("baton: peer message for cluster 1");
        assert_eq!(format_refusal(&wrong_peer), None);

        // What the receiver of format 1 tells a sender of format 7, seen from that sender.
        let peers = Peers::new(1, 2, None, None);
        let e = peers.incompatible(3, 7);
        assert!(e.not_delivered());
        assert_eq!(
            e.to_string(),
            format!(
                "member 3 speaks peer format 7, this member peer format {PEER_FORMAT_VERSION}: \
                 every member of a cluster must run a Baton of the same peer format"
            )
        );
        // Logged once per peer and version.
        assert_eq!(peers.format_reported.lock().get(&3), Some(&7));
    }

    /// A stand-in peer service: answers `Vote` with `b"yes"` (unary or on a pipe); its pipe
    /// is refused as unknown when `knows_pipe` is false, as an older build's would be.
    #[derive(Clone, Default)]
    struct StandIn {
        knows_pipe: bool,
        /// Its peer port serves the peer link as well (as `peer_server::spawn` does).
        knows_link: bool,
        unary_votes: Arc<AtomicUsize>,
        pipes_opened: Arc<AtomicUsize>,
        link_calls: Arc<AtomicUsize>,
    }

    fn yes(to: u64) -> PeerMessage {
        PeerMessage {
            cluster_id: 1,
            from: 3,
            to,
            payload: b"yes".to_vec(),
            credential: Vec::new(),
            format_version: PEER_FORMAT_VERSION,
            lease_verdict: None,
        }
    }

    type Answers = std::pin::Pin<
        Box<
            dyn futures::Stream<
                    Item = Result<baton_proto::baton::raft::v1::PipeFrame, tonic::Status>,
                > + Send,
        >,
    >;

    #[tonic::async_trait]
    impl baton_proto::baton::raft::v1::raft_server::Raft for StandIn {
        type PipeStream = Answers;

        async fn pipe(
            &self,
            request: tonic::Request<tonic::Streaming<baton_proto::baton::raft::v1::PipeFrame>>,
        ) -> Result<tonic::Response<Answers>, tonic::Status> {
            use futures::StreamExt as _;
            if !self.knows_pipe {
                return Err(tonic::Status::unimplemented(""));
            }
            self.pipes_opened.fetch_add(1, Ordering::SeqCst);
            let answers = request.into_inner().map(|frame| {
                let frame = frame?;
                let to = frame.message.as_ref().map_or(0, |m| m.from);
                Ok(baton_proto::baton::raft::v1::PipeFrame {
                    call_id: frame.call_id,
                    message: Some(yes(to)),
                    ..Default::default()
                })
            });
            Ok(tonic::Response::new(Box::pin(answers)))
        }

        async fn vote(
            &self,
            request: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            self.unary_votes.fetch_add(1, Ordering::SeqCst);
            Ok(tonic::Response::new(yes(request.get_ref().from)))
        }

        async fn append_entries(
            &self,
            _: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("stand-in"))
        }

        async fn install_snapshot(
            &self,
            _: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("stand-in"))
        }

        async fn forward(
            &self,
            _: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("stand-in"))
        }

        async fn forward_batch(
            &self,
            _: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("stand-in"))
        }

        async fn members(
            &self,
            _: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("stand-in"))
        }

        async fn timeout_now(
            &self,
            _: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("stand-in"))
        }

        async fn pre_vote(
            &self,
            _: tonic::Request<PeerMessage>,
        ) -> Result<tonic::Response<PeerMessage>, tonic::Status> {
            Err(tonic::Status::unimplemented("stand-in"))
        }
    }

    /// Serves `service` on a loopback port; returns member 3 at that address.
    async fn serve(service: StandIn) -> Member {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = tonic::transport::Server::builder().add_service(
            baton_proto::baton::raft::v1::raft_server::RaftServer::new(service.clone()),
        );
        if service.knows_link {
            let calls = service.link_calls.clone();
            let serve_call = move |frame: baton_proto::baton::raft::v1::PipeFrame| {
                calls.fetch_add(1, Ordering::SeqCst);
                let to = frame.message.as_ref().map_or(0, |m| m.from);
                async move { Ok(yes(to)) }
            };
            let incoming = crate::link::accept_tcp(listener, serve_call);
            tokio::spawn(router.serve_with_incoming(incoming));
        } else {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            tokio::spawn(router.serve_with_incoming(incoming));
        }
        Member {
            name: "m3".into(),
            peer_urls: vec![format!("http://{addr}")],
            client_urls: Vec::new(),
        }
    }

    #[test]
    fn install_snapshot_stays_unary() {
        assert_eq!(pipe_method(Method::InstallSnapshot), None);
        assert_eq!(
            pipe_method(Method::AppendEntries),
            Some(PipeMethod::AppendEntries)
        );
    }

    /// Serves `peer` and asks it for four votes, three at once and then one; returns the
    /// caller's side.
    async fn four_votes(peer: &StandIn) -> Peers {
        let member = serve(peer.clone()).await;
        let peers = Peers::new(1, 2, None, None);
        let second = Duration::from_secs(5);
        let calls = (0..3).map(|_| peers.call(3, &member, Method::Vote, b"q".to_vec(), second));
        for answer in futures::future::join_all(calls).await {
            assert_eq!(answer.unwrap(), b"yes");
        }
        let last = peers.call(3, &member, Method::Vote, vec![], second).await;
        assert_eq!(last.unwrap(), b"yes");
        peers
    }

    /// Calls travel on one link per peer: neither a gRPC pipe nor a unary call.
    #[tokio::test]
    async fn calls_to_a_peer_share_one_link() {
        let peer = StandIn {
            knows_pipe: true,
            knows_link: true,
            ..Default::default()
        };
        let peers = four_votes(&peer).await;
        assert_eq!(peer.link_calls.load(Ordering::SeqCst), 4);
        assert_eq!(peer.pipes_opened.load(Ordering::SeqCst), 0);
        assert_eq!(peer.unary_votes.load(Ordering::SeqCst), 0);
        assert!(peers.links_unsupported.lock().is_empty());
    }

    /// A peer that serves the gRPC pipe but not the link (an older build): the first call
    /// finds out (nothing was delivered on the link) and goes on the pipe, as do the calls
    /// after it, on one pipe.
    #[tokio::test]
    async fn calls_to_a_peer_without_links_share_one_pipe() {
        let peer = StandIn {
            knows_pipe: true,
            ..Default::default()
        };
        let peers = four_votes(&peer).await;
        assert_eq!(peer.pipes_opened.load(Ordering::SeqCst), 1);
        assert_eq!(peer.unary_votes.load(Ordering::SeqCst), 0);
        assert!(peers.links_unsupported.lock().contains_key(&3));
    }

    /// A peer of an older build refuses the pipe as an unknown method: the call is made
    /// unary instead (nothing was delivered), and so are the calls after it.
    #[tokio::test]
    async fn a_peer_without_pipes_gets_unary_calls() {
        let peer = StandIn::default();
        let member = serve(peer.clone()).await;
        let peers = Peers::new(1, 2, None, None);
        let second = Duration::from_secs(5);
        assert_eq!(
            peers
                .call(3, &member, Method::Vote, b"q".to_vec(), second)
                .await
                .unwrap(),
            b"yes"
        );
        assert!(matches!(
            peers.pipes.lock().get(&3),
            Some(PipeSlot::Unsupported(_))
        ));
        assert_eq!(
            peers
                .call(3, &member, Method::Vote, b"q".to_vec(), second)
                .await
                .unwrap(),
            b"yes"
        );
        assert_eq!(peer.unary_votes.load(Ordering::SeqCst), 2);
    }
}
