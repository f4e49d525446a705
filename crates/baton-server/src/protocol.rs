//! One client port for every protocol etcd serves on it (what etcd's cmux and its
//! `grpcHandlerFunc` decide): a request is gRPC when it comes over HTTP/2 with a
//! `content-type` of `application/grpc…`, and goes to the gRPC stack; every other request —
//! HTTP/1.1 (curl, load balancers' health checks, the JSON gateway's clients) and HTTP/2
//! without that content type — goes to the HTTP router (`/health`, `/metrics`, `/version`,
//! the gateway). The connection underneath is hyper's ([`crate::client_server`]): it tells
//! HTTP/1.1 from HTTP/2 by the connection preface (TLS offers both through ALPN), and the
//! client port's HTTP/2 settings, keep-alive, GOAWAY records and client certificates
//! (`ClientConnectInfo`, in every request's extensions) hold for both. HTTP answers carry a
//! `date` on both versions (hyper writes HTTP/1.1's; HTTP/2's is added here), gRPC answers
//! none, as from etcd.
//!
//! The layer sits outside the gRPC layers (metrics, learner guard, receive limit), so those
//! see gRPC calls only. Per request it costs a version compare and a header prefix check;
//! the response body is an enum of the two, not a box.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::Either;
use tower::{Layer, Service};

/// See the module docs.
#[derive(Clone)]
pub struct ProtocolSplitLayer {
    http: axum::Router,
    serve_grpc: bool,
}

impl ProtocolSplitLayer {
    /// gRPC to the wrapped stack, the rest to `http`: a client port.
    pub fn new(http: axum::Router) -> Self {
        ProtocolSplitLayer {
            http,
            serve_grpc: true,
        }
    }

    /// Everything to `http`: a `--listen-metrics-urls` listener, which serves no gRPC (a
    /// gRPC request there gets the HTTP router's 404, as from etcd's metrics listener).
    pub fn http_only(http: axum::Router) -> Self {
        ProtocolSplitLayer {
            http,
            serve_grpc: false,
        }
    }
}

impl<S> Layer<S> for ProtocolSplitLayer {
    type Service = ProtocolSplit<S>;

    fn layer(&self, grpc: S) -> Self::Service {
        ProtocolSplit {
            grpc,
            http: self.http.clone(),
            serve_grpc: self.serve_grpc,
        }
    }
}

/// The service [`ProtocolSplitLayer`] puts in front of the gRPC stack.
#[derive(Clone)]
pub struct ProtocolSplit<S> {
    grpc: S,
    http: axum::Router,
    serve_grpc: bool,
}

/// Whether a request is a gRPC call (etcd: HTTP/2 and `application/grpc` in the content
/// type).
pub fn is_grpc<B>(request: &http::Request<B>) -> bool {
    request.version() == http::Version::HTTP_2
        && request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"))
}

impl<S, ReqBody, B> Service<http::Request<ReqBody>> for ProtocolSplit<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<B>>,
    ReqBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    ReqBody::Error: Into<axum::BoxError>,
{
    type Response = http::Response<Either<B, axum::body::Body>>;
    type Error = S::Error;
    type Future = SplitFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The HTTP router is always ready (axum's `Router`).
        self.grpc.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        if self.serve_grpc && is_grpc(&request) {
            SplitFuture::Grpc {
                future: self.grpc.call(request),
            }
        } else {
            SplitFuture::Http {
                dated: request.version() != http::Version::HTTP_2,
                future: Service::call(&mut self.http, request),
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of one side.
    #[project = SplitProjection]
    pub enum SplitFuture<G> {
        Grpc { #[pin] future: G },
        Http {
            #[pin]
            future: axum::routing::future::RouteFuture<Infallible>,
            // Whether hyper adds the answer's `date` (HTTP/1.1; see `client_server`).
            dated: bool,
        },
    }
}

impl<G, B, E> Future for SplitFuture<G>
where
    G: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<Either<B, axum::body::Body>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            SplitProjection::Grpc { future } => future
                .poll(cx)
                .map(|r| r.map(|response| response.map(Either::Left))),
            SplitProjection::Http { future, dated } => future.poll(cx).map(|r| match r {
                Ok(mut response) => {
                    if !*dated {
                        add_date(response.headers_mut());
                    }
                    Ok(response.map(Either::Right))
                }
                Err(never) => match never {},
            }),
        }
    }
}

/// An HTTP answer's `date` (RFC 9110 §6.6.1: an origin server with a clock sends one; Go's
/// server does on HTTP/1.1 and HTTP/2 alike), unless the handler set its own.
#[allow(
    clippy::disallowed_methods,
    reason = "the transport's clock, as hyper's own `date` on HTTP/1.1: no state depends on it"
)]
fn add_date(headers: &mut http::HeaderMap) {
    if !headers.contains_key(http::header::DATE) {
        let now = httpdate::fmt_http_date(std::time::SystemTime::now());
        if let Ok(value) = http::HeaderValue::from_str(&now) {
            headers.insert(http::header::DATE, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: http::Version, content_type: Option<&str>) -> http::Request<()> {
        let mut r = http::Request::builder()
            .version(version)
            .uri("/etcdserverpb.KV/Range");
        if let Some(ct) = content_type {
            r = r.header(http::header::CONTENT_TYPE, ct);
        }
        r.body(()).unwrap()
    }

    #[test]
    fn grpc_is_http2_with_a_grpc_content_type() {
        use http::Version as V;
        assert!(is_grpc(&request(V::HTTP_2, Some("application/grpc"))));
        assert!(is_grpc(&request(V::HTTP_2, Some("application/grpc+proto"))));
        assert!(!is_grpc(&request(V::HTTP_2, Some("application/json"))));
        assert!(!is_grpc(&request(V::HTTP_2, None)));
        assert!(!is_grpc(&request(V::HTTP_11, Some("application/grpc"))));
    }
}
