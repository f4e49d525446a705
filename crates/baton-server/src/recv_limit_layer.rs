//! A tower layer that answers a message over the receive limit as etcd does.
//!
//! grpc-go refuses it with `RESOURCE_EXHAUSTED` and "grpc: received message larger than max
//! (N vs. M)"; tonic's decoder says `OUT_OF_RANGE` and "Error, decoded message length too
//! large: found N bytes, the limit is: M bytes", and gives no hook to change either (the
//! check runs on the frame header, before any codec sees the message). So this layer
//! rewrites exactly that status on the way out: in the headers of a trailers-only answer
//! (a unary or server-streaming call refused before its handler ran) and in the trailers of
//! a stream (`Watch`, `LeaseKeepAlive`: the handler ends the stream with the error it
//! received, as etcd's handlers return it). Every other status passes untouched, including
//! etcd's own `OUT_OF_RANGE` ("mvcc: required revision is a future revision").

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tonic::codegen::Bytes;
use tonic::Status;
use tower::{Layer, Service};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecvLimitLayer;

impl<S> Layer<S> for RecvLimitLayer {
    type Service = RecvLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RecvLimit { inner }
    }
}

/// The service [`RecvLimitLayer`] wraps around the router.
#[derive(Debug, Clone)]
pub struct RecvLimit<S> {
    inner: S,
}

/// tonic's words for a message over `max_decoding_message_size` (tonic 0.14 `codec/decode.rs`).
const TONIC_PREFIX: &str = "Error, decoded message length too large: found ";

/// grpc-go's status for tonic's, if `status` is tonic's refusal of a message over the limit.
fn grpc_go_status(status: &Status) -> Option<Status> {
    if status.code() != tonic::Code::OutOfRange {
        return None;
    }
    let rest = status.message().strip_prefix(TONIC_PREFIX)?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    let found: u64 = found.parse().ok()?;
    let limit: u64 = limit.parse().ok()?;
    Some(Status::resource_exhausted(format!(
        "grpc: received message larger than max ({found} vs. {limit})"
    )))
}

/// Rewrites the status carried in `headers` (response headers or trailers) if it is
/// tonic's over-limit refusal. The code is compared first: nearly every call ends here
/// after one byte comparison.
fn rewrite(headers: &mut HeaderMap) {
    if headers.get(Status::GRPC_STATUS).map(|v| v.as_bytes()) != Some(b"11") {
        return;
    }
    let Some(etcd) = Status::from_header_map(headers).and_then(|s| grpc_go_status(&s)) else {
        return;
    };
    headers.remove(Status::GRPC_MESSAGE);
    // Only fails on a message that is not a valid header value; ours is ASCII.
    let _ = etcd.add_header(headers);
}

impl<S, B, RB> Service<http::Request<B>> for RecvLimit<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = RecvLimitFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        RecvLimitFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner call's future; its response rewritten by [`rewrite`].
    pub struct RecvLimitFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, RB, E> Future for RecvLimitFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<tonic::codegen::StdError>,
{
    type Output = Result<http::Response<tonic::body::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (mut parts, body) = ready!(self.project().inner.poll(cx))?.into_parts();
        let body = if parts.headers.contains_key(Status::GRPC_STATUS) {
            // Trailers-only: the status is here and the body is empty (`Body::new` re-uses
            // a tonic body as it is, so the common case allocates nothing).
            rewrite(&mut parts.headers);
            tonic::body::Body::new(body)
        } else {
            tonic::body::Body::new(RewriteTrailers { inner: body })
        };
        Poll::Ready(Ok(http::Response::from_parts(parts, body)))
    }
}

pin_project_lite::pin_project! {
    /// A streamed response body whose trailers go through [`rewrite`].
    struct RewriteTrailers<B> {
        #[pin]
        inner: B,
    }
}

impl<B: Body<Data = Bytes>> Body for RewriteTrailers<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut frame = ready!(self.project().inner.poll_frame(cx));
        if let Some(Ok(f)) = &mut frame {
            if let Some(trailers) = f.trailers_mut() {
                rewrite(trailers);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_over_limit_status_becomes_grpc_gos() {
        // The message tonic 0.14 writes (pinned: if tonic rewords it, this fails first).
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 3145733 bytes, the limit is: \
             2097152 bytes",
        );
        let mut headers = HeaderMap::new();
        tonic.add_header(&mut headers).unwrap();
        rewrite(&mut headers);
        let st = Status::from_header_map(&headers).unwrap();
        assert_eq!(st.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            st.message(),
            "grpc: received message larger than max (3145733 vs. 2097152)"
        );
    }

    #[test]
    fn every_other_status_passes_untouched() {
        for st in [
            Status::out_of_range("etcdserver: mvcc: required revision is a future revision"),
            Status::out_of_range("Error, decoded message length too large: found many bytes"),
            Status::invalid_argument(
                "Error, decoded message length too large: found 3 bytes, the limit is: 2 bytes",
            ),
            Status::ok(""),
        ] {
            let mut headers = HeaderMap::new();
            st.add_header(&mut headers).unwrap();
            let before = headers.clone();
            rewrite(&mut headers);
            assert_eq!(headers, before, "{st:?}");
        }
        let mut empty = HeaderMap::new();
        rewrite(&mut empty);
        assert!(empty.is_empty());
    }
}
