//! The peer port's first look at each accepted connection: a link's hello goes to
//! `server::serve`, anything else — with the bytes looked at given back — to tonic.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use baton_proto::baton::raft::v1::{PeerMessage, PipeFrame};
use futures::StreamExt as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tonic::Status;

use super::frame::HELLO;
use crate::env::{PeerIncoming, PeerIo};

/// Connections accepted and looked at, waiting for tonic (it takes them at once).
const ACCEPTED_QUEUE: usize = 64;
/// How long a new connection may take to send its first bytes. Both of Baton's dialers
/// send theirs at once (the hello, HTTP/2's preface); a connection that sends nothing is
/// not a member and is closed.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

/// A stream whose first bytes were read already and are read again first.
pub(crate) struct Rewind<T> {
    prefix: Vec<u8>,
    pos: usize,
    inner: T,
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.pos);
            buf.put_slice(&this.prefix[this.pos..this.pos + n]);
            this.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Rewind<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// tonic reads the peer's address from here (`Members` admits a joiner by it).
impl<T: Connected> Connected for Rewind<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// What a connection turned out to be.
pub(crate) enum Sniffed<T> {
    /// A link: its hello was read, frames follow.
    Link(T),
    /// Anything else, its first bytes to be read again.
    Other(Rewind<T>),
}

/// Reads as much of the hello as the connection's first bytes match, never beyond it.
pub(crate) async fn sniff<T: AsyncRead + Unpin>(mut io: T) -> io::Result<Sniffed<T>> {
    let mut seen = Vec::with_capacity(HELLO.len());
    let mut chunk = [0u8; HELLO.len()];
    while seen.len() < HELLO.len() {
        let n = io.read(&mut chunk[..HELLO.len() - seen.len()]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        seen.extend_from_slice(&chunk[..n]);
        if !HELLO.starts_with(&seen) {
            return Ok(Sniffed::Other(Rewind {
                prefix: seen,
                pos: 0,
                inner: io,
            }));
        }
    }
    Ok(Sniffed::Link(io))
}

/// Looks at `io` and serves it as a link, or hands it to tonic through `grpc`.
fn route<T, F, Fut>(io: T, grpc: mpsc::Sender<io::Result<Rewind<T>>>, serve_call: F)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    F: Fn(PipeFrame) -> Fut + Send + 'static,
    Fut: Future<Output = Result<PeerMessage, Status>> + Send + 'static,
{
    tokio::spawn(async move {
        match tokio::time::timeout(FIRST_BYTES_TIMEOUT, sniff(io)).await {
            Ok(Ok(Sniffed::Link(io))) => {
                // The peer service stopped (tonic's incoming gone): so does the link.
                tokio::select! {
                    _ = super::server::serve(io, serve_call) => {}
                    _ = grpc.closed() => {}
                }
            }
            Ok(Ok(Sniffed::Other(io))) => {
                let _ = grpc.send(Ok(io)).await;
            }
            Ok(Err(_)) | Err(_) => {}
        }
    });
}

/// Accepts on a TCP listener: links are served here, the rest go to tonic through the
/// returned stream. Stops accepting when tonic drops the stream.
pub(crate) fn accept_tcp<F, Fut>(
    listener: TcpListener,
    serve_call: F,
) -> ReceiverStream<io::Result<Rewind<TcpStream>>>
where
    F: Fn(PipeFrame) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<PeerMessage, Status>> + Send + 'static,
{
    let accepted = futures::stream::poll_fn(move |cx| {
        listener.poll_accept(cx).map(|accepted| {
            Some(accepted.map(|(stream, _)| {
                // Small frames, each awaited by someone: no Nagle delay.
                let _ = stream.set_nodelay(true);
                stream
            }))
        })
    });
    accept(accepted, serve_call)
}

/// As [`accept_tcp`], for an injected transport's accepted connections.
pub(crate) fn accept_incoming<F, Fut>(
    incoming: PeerIncoming,
    serve_call: F,
) -> ReceiverStream<io::Result<Rewind<PeerIo>>>
where
    F: Fn(PipeFrame) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<PeerMessage, Status>> + Send + 'static,
{
    accept(ReceiverStream::new(incoming), serve_call)
}

/// Routes each accepted connection (`route`) until the accepting ends or tonic drops the
/// returned stream.
fn accept<T, S, F, Fut>(mut accepted: S, serve_call: F) -> ReceiverStream<io::Result<Rewind<T>>>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    S: futures::Stream<Item = io::Result<T>> + Send + Unpin + 'static,
    F: Fn(PipeFrame) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<PeerMessage, Status>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE);
    tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = tx.closed() => return,
                next = accepted.next() => next,
            };
            match next {
                None => return,
                Some(Ok(io)) => route(io, tx.clone(), serve_call.clone()),
                Some(Err(e)) => {
                    // Out of file descriptors, say: pause rather than spin.
                    tracing::warn!(error = %e, "peer port: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}
