//! A tower layer that counts every gRPC call and times it, labelled by full method path and
//! gRPC status code — etcd's `grpc_server_handled_total` and `grpc_server_handling_seconds`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Layer, Service};

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

/// The service [`GrpcMetricsLayer`] wraps around the router.
#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

/// gRPC status codes by number, as Prometheus label values.
fn code_name(code: &str) -> &'static str {
    match code {
        "0" => "OK",
        "1" => "Canceled",
        "2" => "Unknown",
        "3" => "InvalidArgument",
        "4" => "DeadlineExceeded",
        "5" => "NotFound",
        "6" => "AlreadyExists",
        "7" => "PermissionDenied",
        "8" => "ResourceExhausted",
        "9" => "FailedPrecondition",
        "10" => "Aborted",
        "11" => "OutOfRange",
        "12" => "Unimplemented",
        "13" => "Internal",
        "14" => "Unavailable",
        "15" => "DataLoss",
        "16" => "Unauthenticated",
        _ => "Unknown",
    }
}

impl<S, B, RB> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.uri().path().to_owned();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            // A unary error is a trailers-only response: its status is in the headers. A
            // success (or a stream) carries it in trailers, which we do not wait for.
            let code = match &res {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .map(code_name)
                    .unwrap_or("OK"),
                Err(_) => "Unknown",
            };
            metrics::counter!("baton_grpc_requests_total", "method" => method.clone(), "code" => code)
                .increment(1);
            metrics::histogram!("baton_grpc_request_duration_seconds", "method" => method)
                .record(start.elapsed().as_secs_f64());
            res
        })
    }
}
