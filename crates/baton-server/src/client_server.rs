//! The client and metrics listeners' connections, served by hyper directly: HTTP/1.1 and
//! HTTP/2 told apart by the connection preface (TLS offers both through ALPN), with the
//! client port's HTTP/2 settings ([`connection_builder`]).
//!
//! Why not tonic's `Server`, which served them before: around every request it put a boxed
//! clone of the service, a boxed response body and its own timeout layer, and its hyper
//! builder adds a `date` header to every response, HPACK-encoded once per gRPC answer although
//! neither grpc-go (etcd) nor any gRPC client sends or reads it. Here hyper sends `date`
//! on HTTP/1.1 only, and the HTTP router adds it to its HTTP/2 answers
//! ([`crate::protocol`]), so what curl and browsers see is unchanged. The rest of what tonic
//! did is done here: each request carries its connection's [`ClientConnectInfo`] (auth reads
//! the client certificate from it), the client's `grpc-timeout` is honoured by
//! [`crate::grpc_deadline`], and on shutdown the listener closes, every connection gets a
//! GOAWAY and [`serve`] returns once they have all finished (the caller bounds the wait).

use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tonic::transport::server::Connected as _;
use tower::Service;

use crate::conn::ClientConnectInfo;
use crate::transport::{
    Incoming, Keepalive, CONNECTION_WINDOW_BYTES, MAX_FRAME_BYTES, MAX_HEADER_LIST_BYTES,
    STREAM_WINDOW_BYTES,
};

/// hyper's connection builder with the client port's settings: etcd's windows, frame and
/// header-list sizes, `--max-concurrent-streams`, the server's keep-alive pings, no `date`
/// on HTTP/2 (see the module docs), and hyper's own limits on reset streams.
pub fn connection_builder(
    max_concurrent_streams: u32,
    keepalive: Keepalive,
) -> auto::Builder<TokioExecutor> {
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .timer(TokioTimer::new())
        .auto_date_header(false)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .adaptive_window(false)
        .max_concurrent_streams(max_concurrent_streams)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .keep_alive_interval(nonzero(keepalive.interval));
    // Zero keeps hyper's default (20 s, etcd's too): the timeout means nothing without pings.
    if let Some(timeout) = nonzero(keepalive.timeout) {
        builder.http2().keep_alive_timeout(timeout);
    }
    // hyper enforces its HTTP/1 header read timeout (30 s) only with a timer.
    builder.http1().timer(TokioTimer::new());
    builder
}

/// Serves every connection `incoming` accepts with `service` until `stop` turns true, then
/// closes the listener, sends each connection a GOAWAY and returns when all have finished.
pub async fn serve<S, B>(
    mut incoming: Incoming,
    service: S,
    builder: auto::Builder<TokioExecutor>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    S: Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // Every connection task holds a receiver; `closed()` resolves when the last is gone.
    let (open_tx, open_rx) = tokio::sync::watch::channel(false);
    loop {
        tokio::select! {
            () = stopped(&mut stop) => break,
            accepted = incoming.next() => {
                let io = match accepted {
                    Some(Ok(io)) => io,
                    // `Incoming` retries failed accepts itself (backing off); an error that
                    // reaches here is one connection's, not the listener's.
                    Some(Err(error)) => {
                        tracing::debug!(%error, "a connection could not be accepted");
                        continue;
                    }
                    None => break,
                };
                let service = TowerToHyperService::new(WithConnectInfo {
                    info: io.connect_info(),
                    inner: service.clone(),
                });
                let builder = builder.clone();
                let mut stop = stop.clone();
                let open = open_rx.clone();
                tokio::spawn(async move {
                    let connection = builder.serve_connection(TokioIo::new(io), service);
                    tokio::pin!(connection);
                    let finished = tokio::select! {
                        finished = connection.as_mut() => finished,
                        () = stopped(&mut stop) => {
                            connection.as_mut().graceful_shutdown();
                            connection.await
                        }
                    };
                    if let Err(error) = finished {
                        tracing::debug!(%error, "a client connection ended with an error");
                    }
                    drop(open);
                });
            }
        }
    }
    drop(incoming);
    drop(open_rx);
    open_tx.closed().await;
}

/// Resolves once `stop` is true (or its sender is gone). The watch's read guard is dropped
/// inside: it is not `Send`, and `select!` would keep it across the branch's awaits.
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The service of one connection: each request gets the connection's [`ClientConnectInfo`].
/// Its body stays hyper's own (not boxed): the KV calls' own path reads it directly.
#[derive(Clone)]
struct WithConnectInfo<S> {
    info: ClientConnectInfo,
    inner: S,
}

impl<S> Service<http::Request<hyper::body::Incoming>> for WithConnectInfo<S>
where
    S: Service<http::Request<hyper::body::Incoming>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.info.clone());
        self.inner.call(request)
    }
}
