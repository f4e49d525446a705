//! etcd's JSON gateway on the client port: `POST /v3/kv/range` with `{"key":"Zm9v"}` and
//! the rest of etcd 3.4's grpc-gateway v1 mapping, answered as etcd answers.
//!
//! - **Routes** come from the `google.api.http` options of baton-proto's `.proto` files,
//!   read from its descriptor set at start ([`routes`]); `/v3beta/…` is `/v3/…`, as in
//!   etcd 3.4 (there is no `/v3alpha/`). A path that is not bound is 404 `Not Found`, a bound
//!   path with another method 405 `Method Not Allowed` (Go's `http.Error` text).
//! - **Requests** are read as etcd's `jsonpb` reads them ([`go_json`], [`decode`]): the
//!   first JSON value of the body (what follows is never read), Go's words for every
//!   refusal, with `InvalidArgument` (400).
//! - **Calls** go in process through the same tonic stack as gRPC ([`call`]), with the
//!   `Authorization` header as the token and the connection's client certificate, so
//!   auth, metrics, the learner guard and the receive limit apply as to gRPC. Gateway calls
//!   of one listener share `--max-concurrent-streams` (etcd's gateway reaches its server
//!   over one HTTP/2 connection, so a call beyond that many open streams waits).
//! - **Answers** ([`encode`]): the message as `jsonpb` writes it, or
//!   `{"error","message","code"}` with grpc-gateway's HTTP status for the code.
//! - **Streams** (`/v3/watch`, `/v3/lease/keepalive` both ways, `/v3/election/observe` and
//!   `/v3/maintenance/snapshot` from the server): the request body is a stream of JSON
//!   values, read as the server asks for them; each response is a line `{"result":…}`. The
//!   first response decides the HTTP status: an error before any is answered as a failed
//!   call (a trailers-only answer) or as `{"error":{"grpc_code",…}}` with its status (a
//!   stream that failed first thing), an error later ends the 200 stream with that chunk.
//!   A request that cannot be read ends the requests (the stream goes on), except the
//!   first, which fails the call with `Unknown` (500), as etcd's handler returns Go's
//!   error unwrapped there.

mod call;
mod decode;
mod encode;
mod go_base64;
mod go_json;
pub mod routes;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use futures::StreamExt;
use prost_reflect::{DynamicMessage, MessageDescriptor};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::codec::Streaming;
use tonic::Status;

use call::CallContext;
pub use call::GrpcService;
use go_json::{Next, StreamScanner};
use routes::{Lookup, Route, RouteTable, Shape};

use crate::conn::ClientConnectInfo;

/// The most of a request body held to read one JSON value: twice the gRPC receive limit,
/// room for a message at the limit in base64 and JSON. A larger value is refused with
/// `InvalidArgument` "http: request body too large" (Go's words for a body over a limit);
/// etcd reads without a bound, so between the limit and this, both give grpc-go's "received
/// message larger than max" for the encoded message.
pub const MAX_VALUE_BYTES: usize = 2 * crate::shared::MAX_GRPC_RECV_BYTES;

/// Go's words for a body over a limit (`http.MaxBytesReader`).
const TOO_LARGE: &str = "http: request body too large";

/// The gateway of one client listener.
#[derive(Clone)]
pub struct Gateway {
    grpc: GrpcService,
    table: &'static RouteTable,
    /// Calls open at once (etcd's gateway has one connection to its server, with
    /// `--max-concurrent-streams` streams).
    streams: Arc<Semaphore>,
}

impl Gateway {
    /// A gateway calling `grpc` (the client port's gRPC stack), at most
    /// `max_concurrent_streams` calls at once.
    pub fn new(grpc: GrpcService, max_concurrent_streams: u32) -> Gateway {
        let permits = (max_concurrent_streams as usize).min(Semaphore::MAX_PERMITS);
        Gateway {
            grpc,
            table: RouteTable::get(),
            streams: Arc::new(Semaphore::new(permits)),
        }
    }

    /// The routes under `/v3/` and `/v3beta/`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/v3", any(redirect_to_slash))
            .route("/v3/", any(handle))
            .route("/v3/{*rest}", any(handle))
            .route("/v3beta/", any(handle))
            .route("/v3beta/{*rest}", any(handle))
            .with_state(self)
    }
}

/// Go's `ServeMux` sends `/v3` to the subtree `/v3/` it serves.
async fn redirect_to_slash() -> Response {
    (
        http::StatusCode::MOVED_PERMANENTLY,
        [(http::header::LOCATION, "/v3/")],
    )
        .into_response()
}

/// Go's `http.Error`: the text and a newline, as plain text.
pub fn go_http_error(status: http::StatusCode, text: &str) -> Response {
    (
        status,
        [
            (http::header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

async fn handle(State(gw): State<Gateway>, request: Request) -> Response {
    let path = request.uri().path();
    let path = match path.strip_prefix("/v3beta/") {
        Some(rest) => format!("/v3/{rest}"),
        None => path.to_string(),
    };
    match gw.table.lookup(request.method(), &path) {
        Lookup::NotFound => go_http_error(http::StatusCode::NOT_FOUND, "Not Found"),
        Lookup::WrongMethod => {
            go_http_error(http::StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")
        }
        Lookup::Found(route) => gw.serve(route, request).await,
    }
}

impl Gateway {
    async fn serve(&self, route: &Route, request: Request) -> Response {
        let connection = request.extensions().get::<ClientConnectInfo>().cloned();
        let ctx = match CallContext::from_headers(request.headers(), connection) {
            Ok(ctx) => ctx,
            Err(status) => return failed(&status),
        };
        let mut values = JsonValues::new(request.into_body());
        match route.shape {
            Shape::Unary => {
                let message = match values.first(&route.input).await {
                    Ok(m) => m,
                    Err(e) => return failed(&Status::invalid_argument(e)),
                };
                let _permit = self.permit().await;
                match call::unary(&self.grpc, &ctx, &route.grpc_path, &route.output, message).await
                {
                    Ok(response) => {
                        let headers = metadata_headers(response.metadata());
                        json(
                            http::StatusCode::OK,
                            headers,
                            encode::message(response.get_ref()),
                        )
                    }
                    Err(status) => failed(&status),
                }
            }
            Shape::ServerStream => {
                let message = match values.first(&route.input).await {
                    Ok(m) => m,
                    Err(e) => return failed(&Status::invalid_argument(e)),
                };
                let permit = self.permit().await;
                let requests = futures::stream::once(async move { message });
                let answer =
                    call::streaming(&self.grpc, &ctx, &route.grpc_path, &route.output, requests)
                        .await;
                respond_with_stream(answer, permit).await
            }
            Shape::Bidi => {
                // The first request is read before the call: one that cannot be read fails
                // the call (etcd returns the decoder's error as is: Unknown).
                let first = match values.next_message(&route.input).await {
                    Ok(first) => first,
                    Err(e) => return failed(&Status::unknown(e)),
                };
                let input = route.input.clone();
                let rest = futures::stream::unfold(
                    first.is_some().then_some((values, input)),
                    |state| async move {
                        let (mut values, input) = state?;
                        // A later request that cannot be read ends the requests, as etcd's
                        // handler stops sending (the responses go on).
                        match values.next_message(&input).await {
                            Ok(Some(m)) => Some((m, Some((values, input)))),
                            Ok(None) | Err(_) => None,
                        }
                    },
                );
                let requests = futures::stream::iter(first).chain(rest);
                let permit = self.permit().await;
                let answer =
                    call::streaming(&self.grpc, &ctx, &route.grpc_path, &route.output, requests)
                        .await;
                respond_with_stream(answer, permit).await
            }
        }
    }

    async fn permit(&self) -> OwnedSemaphorePermit {
        self.streams
            .clone()
            .acquire_owned()
            .await
            .expect("the gateway never closes its semaphore")
    }
}

/// The values of a request body, read as Go's `json.Decoder` reads them, as far as asked.
struct JsonValues {
    body: axum::body::BodyDataStream,
    buf: Vec<u8>,
    scanner: StreamScanner,
    ended: bool,
}

impl JsonValues {
    fn new(body: Body) -> JsonValues {
        JsonValues {
            body: body.into_data_stream(),
            buf: Vec::new(),
            scanner: StreamScanner::default(),
            ended: false,
        }
    }

    /// The next value's bytes; `None` once only whitespace is left. `Err`: Go's error.
    async fn next_value(&mut self) -> Result<Option<Vec<u8>>, String> {
        loop {
            match self.scanner.next(&self.buf, self.ended) {
                Next::Value(range) => {
                    let value = self.buf[range.clone()].to_vec();
                    self.buf.drain(..range.end);
                    return Ok(Some(value));
                }
                Next::End => return Ok(None),
                Next::Error(e) => return Err(e),
                Next::NeedMore => {
                    if self.buf.len() > MAX_VALUE_BYTES {
                        return Err(TOO_LARGE.into());
                    }
                    match self.body.next().await {
                        Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                        Some(Err(e)) => return Err(e.to_string()),
                        None => self.ended = true,
                    }
                }
            }
        }
    }

    /// The next value as a `desc` message; `None` at the end.
    async fn next_message(
        &mut self,
        desc: &MessageDescriptor,
    ) -> Result<Option<DynamicMessage>, String> {
        match self.next_value().await? {
            None => Ok(None),
            Some(json) => decode::decode(desc, &json).map(Some).map_err(|e| e.0),
        }
    }

    /// A unary request: the body's first value (an empty body is the empty request).
    async fn first(&mut self, desc: &MessageDescriptor) -> Result<DynamicMessage, String> {
        Ok(self
            .next_message(desc)
            .await?
            .unwrap_or_else(|| DynamicMessage::new(desc.clone())))
    }
}

/// The response headers grpc-gateway adds for the call's header metadata:
/// `Grpc-Metadata-Content-Type: application/grpc` and any other (gRPC's own `grpc-*` keys
/// are not metadata).
fn metadata_headers(metadata: &tonic::metadata::MetadataMap) -> http::HeaderMap {
    let mut out = http::HeaderMap::new();
    for (key, value) in metadata.clone().into_headers() {
        let Some(key) = key else { continue };
        if key.as_str().starts_with("grpc-") {
            continue;
        }
        if let Ok(name) = http::HeaderName::try_from(format!("grpc-metadata-{key}")) {
            out.append(name, value);
        }
    }
    out
}

fn json(status: http::StatusCode, mut headers: http::HeaderMap, body: Vec<u8>) -> Response {
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    (status, headers, body).into_response()
}

/// A call that failed: grpc-gateway's error body with the HTTP status for its code.
fn failed(status: &Status) -> Response {
    json(
        encode::http_status(status.code()),
        http::HeaderMap::new(),
        encode::error_body(status),
    )
}

/// A streaming call's answer: the first response decides the status (see the module docs);
/// every response is a line; the permit is held until the stream ends or the client goes.
async fn respond_with_stream(
    answer: Result<tonic::Response<Streaming<DynamicMessage>>, Status>,
    permit: OwnedSemaphorePermit,
) -> Response {
    let response = match answer {
        Ok(r) => r,
        Err(status) => return failed(&status),
    };
    let headers = metadata_headers(response.metadata());
    let mut stream = response.into_inner();
    let first = match stream.message().await {
        Ok(None) => return json(http::StatusCode::OK, headers, Vec::new()),
        Err(status) => {
            return json(
                encode::http_status(status.code()),
                headers,
                encode::error_chunk(&status),
            )
        }
        Ok(Some(first)) => first,
    };
    let mut line = encode::result_chunk(&first);
    line.push(b'\n');
    let rest = futures::stream::unfold(Some((stream, permit)), |state| async move {
        let (mut stream, permit) = state?;
        match stream.message().await {
            Ok(Some(m)) => {
                let mut line = encode::result_chunk(&m);
                line.push(b'\n');
                Some((line, Some((stream, permit))))
            }
            Ok(None) => None,
            Err(status) => Some((encode::error_chunk(&status), None)),
        }
    });
    let lines = futures::stream::once(async move { line })
        .chain(rest)
        .map(|line| Ok::<_, std::convert::Infallible>(prost::bytes::Bytes::from(line)));
    json(http::StatusCode::OK, headers, Vec::new()).map(|_| Body::from_stream(lines))
}
