//! The listening end of a link: each call frame served as the gRPC pipe serves it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use baton_proto::baton::raft::v1::{PeerMessage, PipeFrame};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{mpsc, Semaphore};
use tonic::Status;

use super::{put_frame, FrameReader, Kind, HELLO};
use crate::pipe::{answer, MAX_CALLS_IN_FLIGHT};

/// A dialer that sent nothing for this long is gone: it pings after
/// `client::KEEPALIVE` of silence, so a live one is heard at least that often.
const IDLE: Duration = Duration::from_secs(6 * super::client::KEEPALIVE.as_secs());
/// Frames written at once at most (more wait for the next write).
const WRITE_BATCH_BYTES: usize = 256 * 1024;

enum Outgoing {
    Answer(PipeFrame),
    Pong,
}

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
    let (tx, rx) = mpsc::unbounded_channel();
    let mut writer = tokio::spawn(write_answers(write, rx));
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
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let result = call.await;
                        let _ = tx.send(Outgoing::Answer(answer(call_id, result)));
                        drop(slot);
                    });
                }
                Ok(Some((Kind::Ping, _))) => {
                    let _ = tx.send(Outgoing::Pong);
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
}

/// Writes answers and pongs, everything queued meanwhile in one write; ends when a write
/// fails (or the link is done).
async fn write_answers<W: AsyncWrite + Unpin>(
    mut write: W,
    mut queue: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut out = Vec::with_capacity(16 * 1024);
    let put = |out: &mut Vec<u8>, next: Outgoing| match next {
        Outgoing::Answer(frame) => put_frame(out, Kind::Answer, Some(&frame)),
        Outgoing::Pong => put_frame(out, Kind::Pong, None),
    };
    while let Some(next) = queue.recv().await {
        put(&mut out, next);
        while out.len() < WRITE_BATCH_BYTES {
            let Ok(next) = queue.try_recv() else { break };
            put(&mut out, next);
        }
        if write.write_all(&out).await.is_err() || write.flush().await.is_err() {
            return;
        }
        out.clear();
    }
}
