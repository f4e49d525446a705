//! The listening end of a link: each call frame served as the gRPC pipe serves it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::baton::raft::v1::{PeerMessage, PipeFrame};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::Semaphore;
use tonic::Status;

use super::frame::{FrameReader, Kind, HELLO};
use super::outbox::Outbox;
use crate::pipe::{answer, MAX_CALLS_IN_FLIGHT};

/// A dialer that sent nothing for this long is gone: it pings after
/// `client::KEEPALIVE` of silence, so a live one is heard at least that often.
const IDLE: Duration = Duration::from_secs(6 * super::client::KEEPALIVE.as_secs());

/// Serves one link whose hello was read (`sniff`): answers the hello, then every call
/// frame by `serve_call` (the peer service's method for the frame), each in a task of its
/// own, at most `MAX_CALLS_IN_FLIGHT` at once (beyond that the link is not read, and the
/// dialer waits in TCP flow control, not in this member's memory). Ends when the dialer
/// closes the link, goes quiet, or sends what a link does not carry.
pub(super) async fn serve<S, F, Fut>(stream: S, serve_call: F)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
    F: Fn(PipeFrame) -> Fut + Send + 'static,
    Fut: Future<Output = Result<PeerMessage, Status>> + Send + 'static,
{
    let (read, mut write) = tokio::io::split(stream);
    if write.write_all(HELLO).await.is_err() || write.flush().await.is_err() {
        return;
    }
    let outbox = Outbox::new();
    let mut writer = outbox.start(write);
    let slots = Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT));
    let mut reader = FrameReader::new(read);
    'link: loop {
        loop {
            match reader.next_buffered() {
                Ok(None) => break,
                Ok(Some((Kind::Call, Some(frame)))) => {
                    let slot = tokio::select! {
                        slot = slots.clone().acquire_owned() => slot.expect("never closed"),
                        _ = &mut writer => break 'link,
                    };
                    let call_id = frame.call_id;
                    let call = serve_call(frame);
                    let outbox = outbox.clone();
                    // Boxed: a call's future (any peer method's handler) is large, and tokio
                    // moves a spawned future by value through several calls before it rests
                    // in its task; a box moves as a pointer.
                    tokio::spawn(Box::pin(async move {
                        let result = call.await;
                        // A failed write ends the writer task: the link closes below.
                        let _ = outbox.send(Kind::Answer, Some(&answer(call_id, result)));
                        drop(slot);
                    }));
                }
                Ok(Some((Kind::Ping, _))) => {
                    let _ = outbox.send(Kind::Pong, None);
                }
                Ok(Some((kind, _))) => {
                    tracing::debug!(?kind, "peer link: frame of the wrong direction; closed");
                    break 'link;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "peer link closed");
                    break 'link;
                }
            }
        }
        tokio::select! {
            read = tokio::time::timeout(IDLE, reader.fill()) => match read {
                Ok(Ok(n)) if n > 0 => {}
                // Closed, failed, or silent for too long.
                _ => break,
            },
            _ = &mut writer => break,
        }
    }
    writer.abort();
    outbox.shut();
}
