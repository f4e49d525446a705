//! The dialing end of a link: a [`PipeClient`] whose frames travel on a dialed stream.

use std::sync::{Arc, Weak};
use std::time::Duration;

use baton_proto::baton::raft::v1::PipeFrame;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tonic::Status;

use super::{io_status, put_frame, FrameReader, Kind, HELLO};
use crate::env::DialFuture;
use crate::pipe::PipeClient;

/// How long connecting (TCP, and TLS under peer TLS) may take: as the gRPC channel's.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the listener's hello may take once connected. A member answers it at once; one
/// that does not is hung, and the calls queued behind the hello time out by their own
/// bound before this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Nothing heard for this long: a ping goes out (HTTP/2's keep-alive on the gRPC channel
/// has the same period), and with no byte back within as long again the link is dropped,
/// so a peer gone without a FIN (power loss, partition) is noticed and dialed anew.
pub(super) const KEEPALIVE: Duration = Duration::from_secs(5);
/// Frames written at once at most (more wait for the next write).
const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// How the link ended, for the calls on it.
struct Ended {
    why: Status,
    /// The peer does not speak the link: nothing sent on it was served.
    unsupported: bool,
}

impl Ended {
    fn closed(why: Status) -> Self {
        Ended {
            why,
            unsupported: false,
        }
    }

    fn unsupported(why: &str) -> Self {
        Ended {
            why: Status::unavailable(format!("baton: peer link: {why}")),
            unsupported: true,
        }
    }
}

/// Opens a link on the stream `dial` makes: calls queue until the hello is answered.
pub(crate) fn open(dial: DialFuture) -> Arc<PipeClient> {
    let (pipe, frames) = PipeClient::new();
    let weak = Arc::downgrade(&pipe);
    tokio::spawn(async move {
        let ended = run(dial, frames, &weak).await;
        if let Some(pipe) = weak.upgrade() {
            pipe.close(ended.why, ended.unsupported);
        }
    });
    pipe
}

async fn run(
    dial: DialFuture,
    frames: mpsc::UnboundedReceiver<PipeFrame>,
    pipe: &Weak<PipeClient>,
) -> Ended {
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Ended::closed(io_status("connect", e)),
        Err(_) => {
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
            return Ended::closed(io_status("connect", e));
        }
    };
    let (read, mut write) = tokio::io::split(stream);
    if let Err(e) = write_all(&mut write, HELLO).await {
        return Ended::closed(io_status("hello", e));
    }
    let mut reader = FrameReader::new(read);
    match tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut reader)).await {
        Err(_) => {
            return Ended::closed(Status::unavailable(
                "baton: peer link: no answer to the hello",
            ))
        }
        Ok(Err(e)) => return Ended::closed(io_status("hello", e)),
        Ok(Ok(Hello::Closed)) => {
            return Ended::unsupported("the peer closed the connection at the hello")
        }
        Ok(Ok(Hello::Other)) => return Ended::unsupported("the peer answered something else"),
        Ok(Ok(Hello::Answered)) => {}
    }
    let ping = Arc::new(Notify::new());
    let mut writer = tokio::spawn(write_frames(write, frames, ping.clone()));
    let ended = read_answers(&mut reader, &mut writer, &ping, pipe).await;
    writer.abort();
    ended
}

enum Hello {
    Answered,
    Other,
    Closed,
}

/// Reads the listener's hello.
async fn read_hello<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
) -> std::io::Result<Hello> {
    while reader.buf.len() < HELLO.len() {
        if !HELLO.starts_with(&reader.buf) {
            return Ok(Hello::Other);
        }
        if reader.fill().await? == 0 {
            return Ok(Hello::Closed);
        }
    }
    if reader.buf[..HELLO.len()] != HELLO[..] {
        return Ok(Hello::Other);
    }
    reader.start = HELLO.len();
    Ok(Hello::Answered)
}

async fn write_all<W: AsyncWrite + Unpin>(write: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    write.write_all(bytes).await?;
    write.flush().await
}

/// Writes the calls the pipe queues, every call queued meanwhile in the same write, and a
/// ping when the reader asks. Ends when the pipe is dropped or a write fails.
async fn write_frames<W: AsyncWrite + Unpin>(
    mut write: W,
    mut frames: mpsc::UnboundedReceiver<PipeFrame>,
    ping: Arc<Notify>,
) -> Status {
    let mut out = Vec::with_capacity(16 * 1024);
    loop {
        tokio::select! {
            biased;
            frame = frames.recv() => {
                let Some(frame) = frame else {
                    return Status::cancelled("baton: peer link no longer used");
                };
                put_frame(&mut out, Kind::Call, Some(&frame));
                while out.len() < WRITE_BATCH_BYTES {
                    let Ok(frame) = frames.try_recv() else { break };
                    put_frame(&mut out, Kind::Call, Some(&frame));
                }
            }
            _ = ping.notified() => put_frame(&mut out, Kind::Ping, None),
        }
        if let Err(e) = write_all(&mut write, &out).await {
            return io_status("write", e);
        }
        out.clear();
    }
}

/// Hands each answer to its call, pings an idle peer, and says why the link ended.
async fn read_answers<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    writer: &mut tokio::task::JoinHandle<Status>,
    ping: &Notify,
    pipe: &Weak<PipeClient>,
) -> Ended {
    let mut heard = Instant::now();
    let mut pinged: Option<Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        loop {
            match reader.next_buffered() {
                Ok(None) => break,
                Ok(Some((Kind::Answer, Some(frame)))) => match pipe.upgrade() {
                    Some(pipe) => pipe.deliver(frame),
                    None => return Ended::closed(Status::cancelled("baton: pipe dropped")),
                },
                Ok(Some((Kind::Pong, _))) => {}
                Ok(Some((kind, _))) => {
                    let e = super::LinkError::Unexpected(kind);
                    return Ended::closed(Status::internal(format!("baton: {e}")));
                }
                Err(e) => return Ended::closed(Status::internal(format!("baton: {e}"))),
            }
        }
        tokio::select! {
            read = reader.fill() => match read {
                Ok(0) => {
                    return Ended::closed(Status::unavailable("baton: the peer closed the link"))
                }
                Ok(_) => {
                    heard = Instant::now();
                    pinged = None;
                }
                Err(e) => return Ended::closed(io_status("read", e)),
            },
            why = &mut *writer => {
                return Ended::closed(why.unwrap_or_else(|_| Status::cancelled("baton: link writer ended")));
            }
            _ = tick.tick() => match pinged {
                Some(at) if at.elapsed() >= KEEPALIVE => {
                    return Ended::closed(Status::unavailable(
                        "baton: peer link: no answer to a keep-alive ping",
                    ));
                }
                Some(_) => {}
                None if heard.elapsed() >= KEEPALIVE => {
                    ping.notify_one();
                    pinged = Some(Instant::now());
                }
                None => {}
            },
        }
    }
}
