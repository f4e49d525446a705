//! The client's `grpc-timeout` on the server: a call still unanswered when it runs out is
//! answered `CANCELLED` "Timeout expired" and its handler dropped, as tonic's server did
//! before Baton served its connections itself ([`crate::client_server`]); the code and
//! message are tonic's, so nothing a client sees changed.
//!
//! A call without the header (most of a benchmark's, and every one from a client without a
//! deadline) costs one header lookup; one with it, a timer.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use http_body_util::Either;
use tower::{Layer, Service};

/// gRPC over HTTP/2's timeout header.
const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// What a call whose deadline passed is answered (tonic's words for it).
const EXPIRED: &str = "Timeout expired";

/// See the module docs.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcDeadlineLayer;

impl<S> Layer<S> for GrpcDeadlineLayer {
    type Service = GrpcDeadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcDeadline { inner }
    }
}

/// The service [`GrpcDeadlineLayer`] makes.
#[derive(Clone, Debug)]
pub struct GrpcDeadline<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcDeadline<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<Either<ResBody, tonic::body::Body>>;
    type Error = S::Error;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        // A header that does not parse is ignored, as tonic did (grpc-go refuses the call
        // with INTERNAL "malformed grpc-timeout"; gRPC libraries never send one).
        let deadline = client_timeout(request.headers()).map(tokio::time::sleep);
        DeadlineFuture {
            inner: self.inner.call(request),
            deadline,
        }
    }
}

pin_project_lite::pin_project! {
    /// A call's answer, or `CANCELLED` once its deadline passed.
    pub struct DeadlineFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        deadline: Option<tokio::time::Sleep>,
    }
}

impl<F, ResBody, E> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<Either<ResBody, tonic::body::Body>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(answer) = this.inner.poll(cx) {
            return Poll::Ready(answer.map(|r| r.map(Either::Left)));
        }
        let Some(deadline) = this.deadline.as_pin_mut() else {
            return Poll::Pending;
        };
        if deadline.poll(cx).is_pending() {
            return Poll::Pending;
        }
        let expired = tonic::Status::cancelled(EXPIRED).into_http::<tonic::body::Body>();
        Poll::Ready(Ok(expired.map(Either::Right)))
    }
}

/// The `grpc-timeout` header's duration (gRPC over HTTP/2: at most 8 digits and a unit of
/// `H`, `M`, `S`, `m`, `u` or `n`), or `None` if absent or malformed.
fn client_timeout(headers: &HeaderMap<HeaderValue>) -> Option<Duration> {
    let value = headers.get(GRPC_TIMEOUT)?.to_str().ok()?;
    let unit_at = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(unit_at);
    // Eight digits at most: the spec's bound, and no multiplication below can overflow.
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_TIMEOUT, HeaderValue::from_str(value).unwrap());
        client_timeout(&headers)
    }

    #[test]
    fn the_header_parses_as_the_spec_says() {
        assert_eq!(timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout("4999m"), Some(Duration::from_millis(4999)));
        assert_eq!(timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in [
            "",
            "S",
            "5",
            "5s",
            "123456789S",
            "-5S",
            "+5S",
            "5 S",
            "1.5S",
        ] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(client_timeout(&HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_cancelled_and_its_handler_dropped() {
        let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
        let mut dropped_tx = Some(dropped_tx);
        let handler = tower::service_fn(move |_: http::Request<()>| {
            let guard = dropped_tx.take();
            async move {
                std::future::pending::<()>().await;
                drop(guard);
                Ok::<_, std::convert::Infallible>(http::Response::new(()))
            }
        });
        let mut service = GrpcDeadlineLayer.layer(handler);
        let request = http::Request::builder()
            .header("grpc-timeout", "100m")
            .body(())
            .unwrap();
        let started = tokio::time::Instant::now();
        let answer = Service::call(&mut service, request).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(answer.headers()["grpc-status"], "1");
        // Percent-encoded, as gRPC over HTTP/2 says.
        assert_eq!(answer.headers()["grpc-message"], "Timeout%20expired");
        assert!(dropped_rx.await.is_err(), "the handler was dropped");
    }

    #[tokio::test]
    async fn a_call_without_a_deadline_waits_for_its_answer() {
        let handler = tower::service_fn(|_: http::Request<()>| async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        });
        let mut service = GrpcDeadlineLayer.layer(handler);
        let answer = Service::call(&mut service, http::Request::new(())).await;
        assert!(matches!(answer.unwrap().into_body(), Either::Left(())));
    }
}
