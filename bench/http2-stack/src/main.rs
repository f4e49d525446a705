//! How much server CPU a unary gRPC call costs in each HTTP/2 server stack Baton could
//! serve its KV calls with, measured apart from everything else Baton does per call.
//!
//! Every stack answers `etcdserverpb.KV/Put` from the same stand-in for the log and apply:
//! a thread that completes the waiting calls every 600 µs, as a group commit does, so the
//! answers leave in batches as Baton's do. One runtime worker, tokio's LIFO slot off and
//! mimalloc, as `baton serve` runs on a 2-core machine. Stacks (the first argument):
//! - `tonic`: tonic's `Server` and its generated `KvServer` (tonic's router and codec);
//! - `hyper-routes`: hyper-util's server with tonic's `Routes`, without tonic's `Server`;
//! - `hyper-fast`: hyper-util's server with a hand-written service that collects the body,
//!   decodes the message and answers with one data frame and trailers — the shape of
//!   Baton's `kv_fast_path` today;
//! - `h2-task`: the `h2` crate directly, one task per stream;
//! - `h2-inline`: the `h2` crate directly, every stream of a connection polled by the
//!   connection's own task.
//!
//! `bench/http2-stack/run` runs them under `baton bench put`; bench/README.md has the numbers.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use baton_proto::etcdserverpb::{
    kv_server, CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse,
    PutRequest, PutResponse, RangeRequest, RangeResponse, ResponseHeader, TxnRequest, TxnResponse,
};
use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use prost::Message;
use tokio::sync::oneshot;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ADDR: &str = "127.0.0.1:2379";

/// Calls waiting for the next group commit.
type Waiters = Arc<Mutex<Vec<oneshot::Sender<i64>>>>;

/// The group commit's stand-in: every 600 µs, answers every call that arrived before it.
fn committer(waiters: Waiters) {
    let mut revision = 0;
    loop {
        std::thread::sleep(Duration::from_micros(600));
        for call in std::mem::take(&mut *waiters.lock().unwrap()) {
            revision += 1;
            let _ = call.send(revision);
        }
    }
}

/// Waits for the next group commit; the call's revision.
async fn committed(waiters: &Waiters) -> i64 {
    let (tx, rx) = oneshot::channel();
    waiters.lock().unwrap().push(tx);
    rx.await.expect("the committer runs forever")
}

fn put_response(revision: i64) -> PutResponse {
    PutResponse {
        header: Some(ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision,
            raft_term: 3,
        }),
        prev_kv: None,
    }
}

/// One length-prefixed gRPC message.
fn framed(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(len as u32);
    message.encode(&mut out).expect("sized");
    out.freeze()
}

fn ok_trailers() -> http::HeaderMap {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    trailers
}

/// The KV service for tonic's generated server: Put only.
struct Kv {
    waiters: Waiters,
}

#[tonic::async_trait]
impl kv_server::Kv for Kv {
    async fn range(
        &self,
        _: tonic::Request<RangeRequest>,
    ) -> Result<tonic::Response<RangeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("put only"))
    }
    async fn put(
        &self,
        request: tonic::Request<PutRequest>,
    ) -> Result<tonic::Response<PutResponse>, tonic::Status> {
        let _put = request.into_inner();
        let revision = committed(&self.waiters).await;
        Ok(tonic::Response::new(put_response(revision)))
    }
    async fn delete_range(
        &self,
        _: tonic::Request<DeleteRangeRequest>,
    ) -> Result<tonic::Response<DeleteRangeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("put only"))
    }
    async fn txn(
        &self,
        _: tonic::Request<TxnRequest>,
    ) -> Result<tonic::Response<TxnResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("put only"))
    }
    async fn compact(
        &self,
        _: tonic::Request<CompactionRequest>,
    ) -> Result<tonic::Response<CompactionResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("put only"))
    }
}

async fn serve_tonic(waiters: Waiters) {
    tonic::transport::Server::builder()
        .add_service(kv_server::KvServer::new(Kv { waiters }))
        .serve(ADDR.parse().unwrap())
        .await
        .unwrap();
}

async fn accept(listener: &tokio::net::TcpListener) -> tokio::net::TcpStream {
    let (stream, _) = listener.accept().await.unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

async fn serve_hyper_routes(waiters: Waiters) {
    let routes = tonic::service::Routes::new(kv_server::KvServer::new(Kv { waiters })).prepare();
    let listener = tokio::net::TcpListener::bind(ADDR).await.unwrap();
    loop {
        let stream = accept(&listener).await;
        let service = hyper_util::service::TowerToHyperService::new(routes.clone());
        let conn =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .into_owned();
        tokio::spawn(conn);
    }
}

/// One data frame, then trailers: a unary answer as Baton's `kv_fast_path` writes it.
struct OneMessage {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl http_body::Body for OneMessage {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }
}

async fn serve_hyper_fast(waiters: Waiters) {
    use http_body_util::BodyExt as _;
    let listener = tokio::net::TcpListener::bind(ADDR).await.unwrap();
    loop {
        let stream = accept(&listener).await;
        let waiters = waiters.clone();
        let service = hyper::service::service_fn(move |request: http::Request<_>| {
            let waiters = waiters.clone();
            async move {
                let body: hyper::body::Incoming = request.into_body();
                let body = body.collect().await.unwrap().to_bytes();
                let _put = PutRequest::decode(&body[5..]).unwrap();
                let revision = committed(&waiters).await;
                let answer = OneMessage {
                    data: Some(framed(&put_response(revision))),
                    trailers: Some(ok_trailers()),
                };
                let response = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(answer)
                    .unwrap();
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let conn =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .into_owned();
        tokio::spawn(conn);
    }
}

/// One Put on an `h2` stream: the body read, the message decoded, the answer sent.
async fn h2_put(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    waiters: Waiters,
) {
    let mut body = request.into_body();
    let mut read = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        read.extend_from_slice(&chunk);
    }
    let _put = PutRequest::decode(&read[5..]).unwrap();
    let revision = committed(&waiters).await;
    let response = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut send = respond.send_response(response, false).unwrap();
    send.send_data(framed(&put_response(revision)), false)
        .unwrap();
    send.send_trailers(ok_trailers()).unwrap();
}

type Stream = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Polls `streams` until none is ready; ready once at least one finished.
async fn ready_streams(streams: &mut FuturesUnordered<Stream>) {
    std::future::poll_fn(|cx| {
        let mut finished = false;
        while let Poll::Ready(Some(())) = streams.poll_next_unpin(cx) {
            finished = true;
        }
        if finished {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

async fn serve_h2(waiters: Waiters, inline: bool) {
    let listener = tokio::net::TcpListener::bind(ADDR).await.unwrap();
    loop {
        let stream = accept(&listener).await;
        let waiters = waiters.clone();
        tokio::spawn(async move {
            let mut conn = h2::server::handshake(stream).await.unwrap();
            let mut streams = FuturesUnordered::<Stream>::new();
            loop {
                tokio::select! {
                    // The streams first, all that are ready: their answers are queued in
                    // the connection before it is polled again and writes them, together.
                    biased;
                    () = ready_streams(&mut streams), if !streams.is_empty() => {}
                    accepted = conn.accept() => {
                        let Some(Ok((request, respond))) = accepted else { return };
                        let call = h2_put(request, respond, waiters.clone());
                        if inline {
                            streams.push(Box::pin(call));
                        } else {
                            tokio::spawn(call);
                        }
                    }
                }
            }
        });
    }
}

fn main() {
    let stack = std::env::args().nth(1).unwrap_or_default();
    let waiters = Waiters::default();
    let committing = waiters.clone();
    std::thread::spawn(move || committer(committing));
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(1).enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    let runtime = builder.build().unwrap();
    runtime.block_on(async move {
        match stack.as_str() {
            "tonic" => serve_tonic(waiters).await,
            "hyper-routes" => serve_hyper_routes(waiters).await,
            "hyper-fast" => serve_hyper_fast(waiters).await,
            "h2-task" => serve_h2(waiters, false).await,
            "h2-inline" => serve_h2(waiters, true).await,
            other => {
                eprintln!(
                    "unknown stack {other:?}: tonic, hyper-routes, hyper-fast, h2-task, h2-inline"
                );
                std::process::exit(2);
            }
        }
    });
}
