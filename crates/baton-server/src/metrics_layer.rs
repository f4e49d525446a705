//! The tower layer that counts every gRPC call of the client port into go-grpc-prometheus'
//! families and etcd's client byte counters (`monitor::grpc` says what is counted when).
//!
//! It wraps the request body (messages and bytes received), the response future (a trailers-
//! only status, or `Canceled` if the call is dropped before answering) and the response body
//! (messages and bytes sent, the status in the trailers, or `Canceled` if the body is dropped
//! before them). The method's handles are looked up once per call, by path, in a table made
//! at start; nothing is allocated per call.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::Bytes;
use tower::{Layer, Service};

use crate::monitor::grpc::{self, GrpcMeters, MethodMeters, CANCELED, UNKNOWN_CODE};

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

/// A call not yet counted as handled: counted exactly once, with the status it ends with,
/// or as `Canceled` if it is dropped first.
pub struct Pending {
    meters: &'static GrpcMeters,
    method: &'static MethodMeters,
    start: Instant,
    done: bool,
}

impl Pending {
    /// Counts a call of `method` (its handles in `meters`) as started, now.
    pub(crate) fn begin(meters: &'static GrpcMeters, method: &'static MethodMeters) -> Pending {
        method.started();
        #[allow(clippy::disallowed_methods)] // Real latency for /metrics, not a deadline.
        let start = Instant::now();
        Pending::started_at(meters, method, start)
    }

    fn started_at(
        meters: &'static GrpcMeters,
        method: &'static MethodMeters,
        start: Instant,
    ) -> Pending {
        Pending {
            meters,
            method,
            start,
            done: false,
        }
    }

    /// Counts `messages` whole messages of `bytes` payload bytes received.
    pub(crate) fn received(&self, messages: u64, bytes: u64) {
        self.meters.received(self.method, messages, bytes);
    }

    /// Counts `messages` whole messages of `bytes` payload bytes sent.
    pub(crate) fn sent(&self, messages: u64, bytes: u64) {
        self.meters.sent(self.method, messages, bytes);
    }

    /// Counts the call as handled with the status code `code` (its number); only the first
    /// count of a call counts.
    pub(crate) fn handled(&mut self, code: usize) {
        if !self.done {
            self.done = true;
            self.method
                .handled(code, self.start.elapsed().as_secs_f64());
        }
    }

    /// Hands the call on to the [`GrpcMetrics`] layer further in, to be counted there to
    /// its end: the mark goes in the request's extensions; nothing is counted here any
    /// more.
    pub(crate) fn hand_over(mut self) -> AlreadyStarted {
        self.done = true;
        AlreadyStarted { start: self.start }
    }
}

/// In a request's extensions: the call was counted as started, at `start`, by a path
/// outside this layer (`kv_fast_path`, which serves the unary KV calls itself and passes
/// on the rest), so [`GrpcMetrics`] goes on from there instead of counting it again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AlreadyStarted {
    start: Instant,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.handled(CANCELED);
    }
}

impl<S, B, RB> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<CountedRequest<B>>, Response = http::Response<RB>>,
{
    type Response = http::Response<CountedResponse<RB>>;
    type Error = S::Error;
    type Future = MetricsFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let meters = grpc::meters();
        let method = meters.method(req.uri().path());
        let pending = match req.extensions_mut().remove::<AlreadyStarted>() {
            Some(started) => Pending::started_at(meters, method, started.start),
            None => Pending::begin(meters, method),
        };
        let req = req.map(|inner| CountedRequest {
            inner,
            frames: grpc::Frames::default(),
            meters,
            method,
        });
        MetricsFuture {
            inner: self.inner.call(req),
            pending: Some(pending),
        }
    }
}

pin_project_lite::pin_project! {
    /// The inner call's future; hands the pending count to the response body.
    pub struct MetricsFuture<F> {
        #[pin]
        inner: F,
        pending: Option<Pending>,
    }
}

impl<F, RB, E> Future for MetricsFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<CountedResponse<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let res = ready!(this.inner.poll(cx));
        let mut pending = this.pending.take().expect("polled after completion");
        Poll::Ready(match res {
            Ok(resp) => {
                // A trailers-only answer (an error before any message) has its status here.
                if let Some(status) = resp.headers().get(tonic::Status::GRPC_STATUS) {
                    pending.handled(grpc::code_index(status.as_bytes()));
                }
                Ok(resp.map(|inner| CountedResponse {
                    inner,
                    frames: grpc::Frames::default(),
                    pending,
                }))
            }
            Err(e) => {
                pending.handled(UNKNOWN_CODE);
                Err(e)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A request body that counts the messages passing through it.
    pub struct CountedRequest<B> {
        #[pin]
        inner: B,
        frames: grpc::Frames,
        meters: &'static GrpcMeters,
        method: &'static MethodMeters,
    }
}

impl<B: Body<Data = Bytes>> Body for CountedRequest<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(Ok(f)) = &frame {
            if let Some(data) = f.data_ref() {
                let (messages, bytes) = this.frames.feed(data);
                this.meters.received(this.method, messages, bytes);
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

pin_project_lite::pin_project! {
    /// A response body that counts the messages passing through it and the call as handled
    /// when its trailers go out (or as `Canceled` when it is dropped before).
    pub struct CountedResponse<B> {
        #[pin]
        inner: B,
        frames: grpc::Frames,
        pending: Pending,
    }
}

impl<B: Body<Data = Bytes>> Body for CountedResponse<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(data) = f.data_ref() {
                    let (messages, bytes) = this.frames.feed(data);
                    let p = &this.pending;
                    p.meters.sent(p.method, messages, bytes);
                } else if let Some(trailers) = f.trailers_ref() {
                    let code = trailers
                        .get(tonic::Status::GRPC_STATUS)
                        .map_or(UNKNOWN_CODE, |s| grpc::code_index(s.as_bytes()));
                    this.pending.handled(code);
                }
            }
            // The stream failed while being sent: the client does not get its status.
            Some(Err(_)) => this.pending.handled(UNKNOWN_CODE),
            // Ended without trailers (only a trailers-only answer, counted already).
            None => this.pending.handled(UNKNOWN_CODE),
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
