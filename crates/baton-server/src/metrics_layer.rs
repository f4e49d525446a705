//! A tower layer that counts every gRPC call and times it, labelled by full method path and
//! gRPC status code — etcd's `grpc_server_handled_total` and `grpc_server_handling_seconds`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use metrics::{Counter, Histogram};
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

/// The handles of one method's series. Registering a labelled series costs a registry lookup
/// keyed by freshly allocated label strings; at tens of thousands of requests a second that
/// was a measurable share of a request's CPU, so each method's handles are made once and
/// reused. Only the OK counter is cached: error codes are rare and go through the registry.
struct MethodMetrics {
    path: String,
    ok: Counter,
    duration: Histogram,
}

fn method_metrics(path: &str) -> Arc<MethodMetrics> {
    static CACHE: OnceLock<RwLock<HashMap<String, Arc<MethodMetrics>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(m) = cache.read().expect("metrics cache poisoned").get(path) {
        return m.clone();
    }
    // Unknown paths (a client probing methods we do not serve) would each add an entry; the
    // router answers them Unimplemented, and the set of paths a client can send is not
    // bounded, so past a generous bound they are counted without caching.
    const MAX_CACHED_METHODS: usize = 512;
    let m = Arc::new(MethodMetrics {
        path: path.to_owned(),
        ok: metrics::counter!("baton_grpc_requests_total", "method" => path.to_owned(), "code" => "OK"),
        duration: metrics::histogram!("baton_grpc_request_duration_seconds", "method" => path.to_owned()),
    });
    let mut w = cache.write().expect("metrics cache poisoned");
    if w.len() < MAX_CACHED_METHODS {
        w.entry(path.to_owned()).or_insert_with(|| m.clone());
    }
    m
}

impl<S, B, RB> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = MetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let metrics = method_metrics(req.uri().path());
        #[allow(clippy::disallowed_methods)] // Real latency for /metrics, not a deadline.
        let start = Instant::now();
        MetricsFuture {
            inner: self.inner.call(req),
            metrics,
            start,
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner call's future, timed and counted when it completes.
    pub struct MetricsFuture<F> {
        #[pin]
        inner: F,
        metrics: Arc<MethodMetrics>,
        start: Instant,
    }
}

impl<F, RB, E> Future for MetricsFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx));
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
        if code == "OK" {
            this.metrics.ok.increment(1);
        } else {
            metrics::counter!("baton_grpc_requests_total", "method" => this.metrics.path.clone(), "code" => code)
                .increment(1);
        }
        this.metrics
            .duration
            .record(this.start.elapsed().as_secs_f64());
        Poll::Ready(res)
    }
}
