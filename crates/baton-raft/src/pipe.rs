//! The peer pipe: many peer calls over one long-lived gRPC stream per pair of members
//! (`baton.raft.v1.Raft/Pipe`), both ends.
//!
//! Why: a unary gRPC call is a new HTTP/2 stream each time — the caller writes a HEADERS and a
//! DATA frame (in two writes: hyper sends the body from a task of its own), the callee
//! answers with HEADERS, DATA and trailers, and both ends set up and tear down stream state.
//! A 3-member write makes about a dozen such calls on the leader (early appends, openraft's
//! AppendEntries, the commit notice, to each follower), and on a small machine their CPU is
//! the write's latency. On an open stream a call is one frame each way, one write each.
//!
//! What does not change: every frame's `PeerMessage` passes the very checks and handler of
//! its method's unary call (`PeerService`), a refusal travels back as the status that call
//! would have ended with (so `network` reads both the same way), and the stream runs on the
//! peer channel, under peer TLS when it is on. InstallSnapshot (large chunks) and Members
//! (a joiner, before it has an id) stay unary. A peer that answers `Pipe` Unimplemented
//! (an older build) gets unary calls; the pipe is tried again after [`RETRY_UNSUPPORTED`].
//!
//! Calls on a pipe are independent, as unary calls are: the callee serves each frame in a
//! task of its own and answers in completion order. At most [`MAX_CALLS_IN_FLIGHT`] are
//! served at once per pipe (the callee stops reading the stream beyond that), the bound the
//! peer service puts on concurrent unary calls per connection.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use baton_proto::baton::raft::v1::raft_client::RaftClient;
use baton_proto::baton::raft::v1::{PeerMessage, PipeFrame, PipeMethod};
use futures::StreamExt as _;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::Status;

use crate::wire::{FORMAT_VERSION_METADATA, MAX_PEER_MESSAGE_BYTES};

/// Calls served at once on one pipe (as `peer_server::MAX_CONCURRENT_STREAMS` bounds unary
/// calls per connection).
pub(crate) const MAX_CALLS_IN_FLIGHT: usize = 1024;
/// How long a peer that does not know `Pipe` gets unary calls before the pipe is tried again
/// (it may have been upgraded meanwhile).
pub(crate) const RETRY_UNSUPPORTED: Duration = Duration::from_secs(60);
/// The largest frame the caller sends or accepts: the peer service's bound on a message
/// (`peer_server::spawn`), which a frame meets with its few bytes besides the message.
pub(crate) const MAX_FRAME_BYTES: usize = MAX_PEER_MESSAGE_BYTES + 4096;

/// The answer frame for call `call_id`: the message, or the status a unary call would have
/// ended with.
pub(crate) fn answer(call_id: u64, result: Result<PeerMessage, Status>) -> PipeFrame {
    match result {
        Ok(message) => PipeFrame {
            call_id,
            message: Some(message),
            ..Default::default()
        },
        Err(status) => PipeFrame {
            call_id,
            status_code: status.code() as u32,
            status_message: status.message().to_string(),
            refused_for_format: status
                .metadata()
                .get(FORMAT_VERSION_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            ..Default::default()
        },
    }
}

/// The caller's view of an answer frame: what the unary call would have returned.
fn outcome(frame: PipeFrame) -> Result<PeerMessage, Status> {
    if frame.status_code != 0 {
        let mut status = Status::new(
            tonic::Code::from_i32(frame.status_code as i32),
            frame.status_message,
        );
        if frame.refused_for_format != 0 {
            status.metadata_mut().insert(
                FORMAT_VERSION_METADATA,
                frame
                    .refused_for_format
                    .to_string()
                    .parse()
                    .expect("digits"),
            );
        }
        return Err(status);
    }
    frame
        .message
        .ok_or_else(|| Status::internal("baton: pipe answer without a message"))
}

// ---------------------------------------------------------------------------------------
// Callee

/// Serves one pipe: every request frame by `serve_call` (the peer service's method for the
/// frame, `peer_server`), each in a task of its own, answers in completion order. Ends when
/// the caller closes the stream.
pub(crate) fn serve<F, Fut>(
    serve_call: F,
    mut inbound: tonic::Streaming<PipeFrame>,
) -> mpsc::Receiver<Result<PipeFrame, Status>>
where
    F: Fn(PipeFrame) -> Fut + Send + 'static,
    Fut: Future<Output = Result<PeerMessage, Status>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(MAX_CALLS_IN_FLIGHT);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CALLS_IN_FLIGHT));
    tokio::spawn(async move {
        loop {
            // A slot before the next frame is read: beyond the bound the caller waits in
            // HTTP/2 flow control, not in this member's memory.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let frame = match inbound.next().await {
                Some(Ok(frame)) => frame,
                // The caller closed the stream or the connection went away: answers still
                // being served have nowhere to go.
                Some(Err(_)) | None => return,
            };
            let call_id = frame.call_id;
            let call = serve_call(frame);
            let tx = tx.clone();
            tokio::spawn(async move {
                let result = call.await;
                let _ = tx.send(Ok(answer(call_id, result))).await;
                drop(slot);
            });
        }
    });
    rx
}

// ---------------------------------------------------------------------------------------
// Caller

type Waiter = oneshot::Sender<Result<PeerMessage, Status>>;

/// Where a pipe's request frames go: the gRPC stream's queue, or a link's outbox.
pub(crate) trait Outbound: Send + Sync + 'static {
    /// Sends one request frame; false: what carried the pipe is gone.
    fn send(&self, frame: PipeFrame) -> bool;
}

impl Outbound for mpsc::UnboundedSender<PipeFrame> {
    fn send(&self, frame: PipeFrame) -> bool {
        mpsc::UnboundedSender::send(self, frame).is_ok()
    }
}

/// The caller's end of one pipe to one peer: frames go out through `outbound`; a task reads
/// the answers and hands each to the call waiting for its id.
pub(crate) struct PipeClient {
    outbound: Box<dyn Outbound>,
    next_call: AtomicU64,
    /// An answer came back: the peer serves pipes (until then a caller keeps a copy of its
    /// message, to send it unary should the peer not know `Pipe`).
    confirmed: AtomicBool,
    /// The peer answered `Pipe` Unimplemented: nothing sent on this pipe was served.
    unsupported: AtomicBool,
    /// Calls in flight; `None` once the pipe closed (calls then fail at once).
    /// Ordered by call id, so a closing pipe fails its calls in the order they were made
    /// (a hash map's order differs run to run, which a simulation replay would see).
    waiting: Mutex<Option<BTreeMap<u64, Waiter>>>,
}

impl PipeClient {
    /// A pipe whose request frames go to `outbound`; its engine hands each answer to
    /// [`PipeClient::deliver`] and ends with [`PipeClient::close`]. Engines:
    /// [`PipeClient::open`] (the gRPC stream) and `link::open` (the peer link).
    pub(crate) fn with_outbound(outbound: Box<dyn Outbound>) -> Arc<PipeClient> {
        Arc::new(PipeClient {
            outbound,
            next_call: AtomicU64::new(1),
            confirmed: AtomicBool::new(false),
            unsupported: AtomicBool::new(false),
            waiting: Mutex::new(Some(BTreeMap::new())),
        })
    }

    /// Opens a pipe on `channel` (lazily connected: the stream opens with the first frame).
    pub(crate) fn open(channel: Channel) -> Arc<PipeClient> {
        let (outbound, frames) = mpsc::unbounded_channel();
        let pipe = PipeClient::with_outbound(Box::new(outbound));
        let reader = Arc::downgrade(&pipe);
        tokio::spawn(async move {
            let mut client = RaftClient::new(channel)
                .max_decoding_message_size(MAX_FRAME_BYTES)
                .max_encoding_message_size(MAX_FRAME_BYTES);
            let frames = tokio_stream::wrappers::UnboundedReceiverStream::new(frames);
            let ended = match client.pipe(frames).await {
                Err(status) => status,
                Ok(answers) => {
                    let mut answers = answers.into_inner();
                    loop {
                        match answers.message().await {
                            Ok(Some(frame)) => match reader.upgrade() {
                                Some(pipe) => pipe.deliver(frame),
                                None => return,
                            },
                            Ok(None) => {
                                break Status::unavailable("baton: the peer closed the pipe")
                            }
                            Err(status) => break status,
                        }
                    }
                }
            };
            if let Some(pipe) = reader.upgrade() {
                // An older build answers the method Unimplemented.
                let unsupported = ended.code() == tonic::Code::Unimplemented;
                pipe.close(ended, unsupported);
            }
        });
        pipe
    }

    /// Whether the pipe can still carry calls.
    pub(crate) fn is_open(&self) -> bool {
        self.waiting.lock().is_some()
    }

    /// Whether the peer has answered on this pipe (it serves pipes).
    pub(crate) fn confirmed(&self) -> bool {
        self.confirmed.load(Ordering::Acquire)
    }

    /// Whether the peer refused the pipe as an unknown method (an older build): the calls
    /// made on it were not delivered.
    pub(crate) fn unsupported(&self) -> bool {
        self.unsupported.load(Ordering::Acquire)
    }

    /// One call: `message` as `method`, answered as the unary call would be. The caller
    /// bounds the wait; a call given up on is forgotten here too.
    pub(crate) async fn call(
        &self,
        method: PipeMethod,
        message: PeerMessage,
    ) -> Result<PeerMessage, Status> {
        let call_id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut waiting = self.waiting.lock();
            let Some(waiting) = waiting.as_mut() else {
                return Err(Status::unavailable("baton: the peer pipe is closed"));
            };
            // The callee serves at most this many at once; more would only queue in this
            // member's memory (the outbound queue itself has no bound of its own).
            if waiting.len() >= MAX_CALLS_IN_FLIGHT {
                return Err(Status::resource_exhausted(format!(
                    "baton: {MAX_CALLS_IN_FLIGHT} calls already in flight on the peer pipe"
                )));
            }
            waiting.insert(call_id, tx);
        }
        let forget = Forget {
            pipe: self,
            call_id,
        };
        let frame = PipeFrame {
            call_id,
            method: method as i32,
            message: Some(message),
            ..Default::default()
        };
        if !self.outbound.send(frame) {
            return Err(Status::unavailable("baton: the peer pipe is closed"));
        }
        let result = rx
            .await
            .unwrap_or_else(|_| Err(Status::unavailable("baton: the peer pipe is closed")));
        drop(forget);
        result
    }

    /// Hands an answer frame to the call waiting for it.
    pub(crate) fn deliver(&self, frame: PipeFrame) {
        self.confirmed.store(true, Ordering::Release);
        let waiter = self
            .waiting
            .lock()
            .as_mut()
            .and_then(|w| w.remove(&frame.call_id));
        // No waiter: the call timed out meanwhile.
        if let Some(waiter) = waiter {
            let _ = waiter.send(outcome(frame));
        }
    }

    /// The stream ended: every call in flight fails with why, and later calls at once.
    /// `unsupported`: the peer refused the pipe itself as something it does not speak (an
    /// older build), which counts only before any answer came back.
    pub(crate) fn close(&self, why: Status, unsupported: bool) {
        if unsupported && !self.confirmed() {
            self.unsupported.store(true, Ordering::Release);
        }
        let waiting = self.waiting.lock().take();
        for (_, waiter) in waiting.into_iter().flatten() {
            let _ = waiter.send(Err(why.clone()));
        }
    }
}

/// Removes a call's waiter when the call ends, answered or given up on (its future dropped
/// by the caller's timeout).
struct Forget<'a> {
    pipe: &'a PipeClient,
    call_id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some(waiting) = self.pipe.waiting.lock().as_mut() {
            waiting.remove(&self.call_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_reads_back_as_the_unary_status() {
        let mut status = Status::failed_precondition("baton: other format");
        status
            .metadata_mut()
            .insert(FORMAT_VERSION_METADATA, "7".parse().unwrap());
        let back = outcome(answer(9, Err(status))).unwrap_err();
        assert_eq!(back.code(), tonic::Code::FailedPrecondition);
        assert_eq!(back.message(), "baton: other format");
        assert_eq!(back.metadata().get(FORMAT_VERSION_METADATA).unwrap(), "7");
        let plain = outcome(answer(1, Err(Status::permission_denied("no")))).unwrap_err();
        assert_eq!(plain.code(), tonic::Code::PermissionDenied);
        assert!(plain.metadata().get(FORMAT_VERSION_METADATA).is_none());
    }

    #[test]
    fn an_answer_reads_back_as_the_message() {
        let msg = PeerMessage {
            cluster_id: 1,
            from: 2,
            to: 3,
            payload: vec![4, 5],
            credential: Vec::new(),
            format_version: 2,
            lease_verdict: None,
        };
        let frame = answer(5, Ok(msg.clone()));
        assert_eq!(frame.call_id, 5);
        assert_eq!(outcome(frame).unwrap(), msg);
        let empty = PipeFrame {
            call_id: 5,
            ..Default::default()
        };
        assert_eq!(outcome(empty).unwrap_err().code(), tonic::Code::Internal);
    }

    /// Calls beyond the callee's bound are refused at once rather than queued.
    #[tokio::test]
    async fn calls_beyond_the_bound_are_refused() {
        let (outbound, _frames) = mpsc::unbounded_channel();
        let pipe = PipeClient {
            outbound: Box::new(outbound),
            next_call: AtomicU64::new(1),
            confirmed: AtomicBool::new(true),
            unsupported: AtomicBool::new(false),
            waiting: Mutex::new(Some(
                (0..MAX_CALLS_IN_FLIGHT as u64)
                    .map(|id| (id + 1_000_000, oneshot::channel().0))
                    .collect(),
            )),
        };
        let refused = pipe
            .call(PipeMethod::Vote, PeerMessage::default())
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            pipe.waiting.lock().as_ref().unwrap().len(),
            MAX_CALLS_IN_FLIGHT
        );
    }
}
