//! The dialing end of a link: a [`PipeClient`] whose frames travel on a dialed stream.

use std::sync::{Arc, Weak};
use std::time::Duration;

use baton_proto::baton::raft::v1::PipeFrame;
use tokio::io::AsyncWriteExt as _;
use tokio::time::Instant;
use tonic::Status;

use super::frame::{FrameReader, Kind, LinkError, HELLO};
use super::outbox::Outbox;
use crate::env::{DialFuture, PeerStream};
use crate::pipe::{Outbound, PipeClient};

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

/// The stream's writing half, as the outbox holds it.
type WriteHalf = tokio::io::WriteHalf<Box<dyn PeerStream>>;

/// A pipe's request frames into a link's outbox.
struct LinkOutbound(Arc<Outbox<WriteHalf>>);

impl Outbound for LinkOutbound {
    fn send(&self, frame: PipeFrame) -> bool {
        self.0.send(Kind::Call, Some(&frame)).is_ok()
    }
}

/// Opens a link on the stream `dial` makes: calls queue until the hello is answered.
pub(crate) fn open(dial: DialFuture) -> Arc<PipeClient> {
    let outbox = Outbox::new();
    let pipe = PipeClient::with_outbound(Box::new(LinkOutbound(outbox.clone())));
    let weak = Arc::downgrade(&pipe);
    tokio::spawn(async move {
        let ended = run(dial, outbox, &weak).await;
        if let Some(pipe) = weak.upgrade() {
            pipe.close(ended.why, ended.unsupported);
        }
    });
    pipe
}

async fn run(dial: DialFuture, outbox: Arc<Outbox<WriteHalf>>, pipe: &Weak<PipeClient>) -> Ended {
    let stream = match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Ended::closed(io_status("connect", e)),
        Err(_) => {
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
            return Ended::closed(io_status("connect", e));
        }
    };
    let (read, mut write) = tokio::io::split(stream);
    let hello = async {
        write.write_all(HELLO).await?;
        write.flush().await
    };
    if let Err(e) = hello.await {
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
    // The calls queued meanwhile leave now.
    let mut writer = outbox.start(write);
    let ended = read_answers(&mut reader, &mut writer, &outbox, pipe).await;
    writer.abort();
    outbox.shut();
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

/// Hands each answer to its call, pings an idle peer, and says why the link ended.
async fn read_answers<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    writer: &mut tokio::task::JoinHandle<std::io::Error>,
    outbox: &Outbox<WriteHalf>,
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
                    let e = LinkError::Unexpected(kind);
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
            failed = &mut *writer => {
                return Ended::closed(match failed {
                    Ok(e) => io_status("write", e),
                    Err(_) => Status::cancelled("baton: peer link writer ended"),
                });
            }
            _ = tick.tick() => match pinged {
                Some(at) if at.elapsed() >= KEEPALIVE => {
                    return Ended::closed(Status::unavailable(
                        "baton: peer link: no answer to a keep-alive ping",
                    ));
                }
                Some(_) => {}
                None if heard.elapsed() >= KEEPALIVE => {
                    // A failed write ends the writer task, seen above.
                    let _ = outbox.send(Kind::Ping, None);
                    pinged = Some(Instant::now());
                }
                None => {}
            },
        }
    }
}

/// A status for a link that failed on `error`, with the error as its source, so that the
/// caller's reading of a transport failure (a refused connection: not delivered; a TLS
/// alert: the transport's explanation) sees it as it sees tonic's.
pub(super) fn io_status(what: &str, error: std::io::Error) -> tonic::Status {
    let mut status = tonic::Status::unavailable(format!("baton: peer link: {what}: {error}"));
    status.set_source(std::sync::Arc::new(error));
    status
}
