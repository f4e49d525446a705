//! The unary KV calls — Range, Put, DeleteRange, Txn — handed to [`KvService`] without
//! tonic's router and codec in between; every other call, and every KV call whose body is
//! not one plain gRPC message, goes on to tonic unchanged.
//!
//! Why: these four are nearly every call a coordination store serves, and with one member
//! putting for 100 clients the runtime worker is the bound (bench/README.md). Between the
//! HTTP/2 stream and the handler, tonic's generic path routes by path through axum's router,
//! dispatches again in the generated `KvServer`, and decodes and encodes through its
//! streaming codec (a decoder and an encoder with their own buffers, and several boxed
//! futures) — about an eighth of the server's CPU samples per put in the profile (12 %),
//! against the handler's own twelfth (8 %). Here a call's path is matched once, its body collected, the
//! message decoded by the same decoder tonic's codec uses ([`baton_proto::codec`]), the
//! handler called with the same `tonic::Request` tonic would build, and the answer written
//! as tonic writes it: headers with `content-type: application/grpc`, one length-prefixed
//! message, trailers with `grpc-status: 0`; an error is the same trailers-only answer
//! ([`Status::into_http`]).
//!
//! What this does not decide, it leaves to tonic, by passing the call on with the body it
//! has read put back in front of the rest ([`Replayed`]): a compressed request (tonic
//! refuses it, no compression is enabled), a message announced larger than the receive
//! limit (tonic's refusal, which [`crate::recv_limit_layer`] rewrites into etcd's), a body
//! that is not exactly one message (none, several, or cut short), request trailers, and a
//! body that fails. So the answers to odd input are tonic's, byte for byte.
//!
//! This layer is the outermost of the gRPC layers, so the calls it serves skip the others
//! (metrics, the member guard, the receive-limit rewrite: three wrapped futures and bodies,
//! one of them boxed, per call; ~3 % of the worker's time at 100 clients, bench/README.md)
//! and it does their work itself: it counts a call as the metrics layer does
//! ([`Pending`]), admits it by the guard's own rule ([`admission`]), and has nothing to
//! rewrite (a message over the limit goes on to tonic). A call it hands on after reading its
//! body carries its start in the request ([`Pending::hand_over`]), so the metrics layer
//! counts it once, from when it came.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};

use baton_proto::etcdserverpb as pb;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Either;
use prost::Message;
use tonic::Status;
use tower::{Layer, Service};

use crate::kv::KvService;
use crate::member_guard::{admission, Admission};
use crate::metrics_layer::Pending;
use crate::monitor::grpc::{self, MethodMeters, OK_CODE};
use crate::MAX_GRPC_RECV_BYTES;

/// The gRPC message prefix: a compression flag byte and a big-endian `u32` length.
const PREFIX_LEN: usize = 5;

/// Wraps the gRPC router; see the module docs.
#[derive(Clone)]
pub struct KvFastPathLayer {
    kv: Arc<KvService>,
}

impl KvFastPathLayer {
    /// Calls `kv`, which must serve the same member as the router this layer wraps.
    pub(crate) fn new(kv: KvService) -> Self {
        KvFastPathLayer { kv: Arc::new(kv) }
    }
}

impl<S> Layer<S> for KvFastPathLayer {
    type Service = KvFastPath<S>;

    fn layer(&self, inner: S) -> Self::Service {
        KvFastPath {
            kv: self.kv.clone(),
            inner,
        }
    }
}

/// The service [`KvFastPathLayer`] wraps around the router.
#[derive(Clone)]
pub struct KvFastPath<S> {
    kv: Arc<KvService>,
    inner: S,
}

/// The KV calls served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UnaryKv {
    Range,
    Put,
    DeleteRange,
    Txn,
}

impl UnaryKv {
    const ALL: [UnaryKv; 4] = [
        UnaryKv::Range,
        UnaryKv::Put,
        UnaryKv::DeleteRange,
        UnaryKv::Txn,
    ];

    fn path(self) -> &'static str {
        match self {
            UnaryKv::Range => "/etcdserverpb.KV/Range",
            UnaryKv::Put => "/etcdserverpb.KV/Put",
            UnaryKv::DeleteRange => "/etcdserverpb.KV/DeleteRange",
            UnaryKv::Txn => "/etcdserverpb.KV/Txn",
        }
    }

    /// The method's metric handles, looked up by path once (the table's lookup hashes the
    /// path: ~300 instructions a call). Made on the first call, as the table itself is, so
    /// after the metrics recorder is installed.
    fn meters(self) -> &'static MethodMeters {
        static METERS: OnceLock<[&'static MethodMeters; 4]> = OnceLock::new();
        METERS.get_or_init(|| UnaryKv::ALL.map(|m| grpc::meters().method(m.path())))[self as usize]
    }

    fn of_path(path: &str) -> Option<UnaryKv> {
        UnaryKv::ALL.into_iter().find(|m| m.path() == path)
    }
}

/// `grpc-encoding`, parsed once: a lookup by `&str` parses the name on every call.
const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");
/// `grpc-status`, the answer's trailer.
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");

/// A request tonic would decode without compression: no `grpc-encoding`, or `identity`.
fn uncompressed<B>(request: &http::Request<B>) -> bool {
    match request.headers().get(GRPC_ENCODING) {
        None => true,
        Some(v) => v.as_bytes() == b"identity",
    }
}

/// An answer: this path's own (left), or the router's (right).
type Answer<RB> = http::Response<Either<OneMessage, RB>>;

impl<S, B, RB> Service<http::Request<B>> for KvFastPath<S>
where
    S: Service<http::Request<Replayed<B>>, Response = http::Response<RB>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Send,
    RB: Send + 'static,
{
    type Response = Answer<RB>;
    type Error = Infallible;
    type Future = KvFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = UnaryKv::of_path(request.uri().path()).filter(|_| uncompressed(&request));
        let Some(method) = method else {
            return KvFuture::Router {
                future: self.inner.call(request.map(Replayed::untouched)),
            };
        };
        // Counted from here, as the metrics layer counts a call from when it sees it.
        let pending = Pending::begin(grpc::meters(), method.meters());
        // The router was made ready for this call; the clone left behind is the one asked
        // for readiness next time (tower's rule for services called from a future).
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        KvFuture::Here {
            future: Box::pin(serve(self.kv.clone(), inner, method, request, pending)),
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of a call served here, or the router's.
    #[project = KvFutureProj]
    pub enum KvFuture<F, RB> {
        Here {
            future: Pin<Box<dyn Future<Output = Answer<RB>> + Send>>,
        },
        Router { #[pin] future: F },
    }
}

impl<F, RB> Future for KvFuture<F, RB>
where
    F: Future<Output = Result<http::Response<RB>, Infallible>>,
{
    type Output = Result<Answer<RB>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            KvFutureProj::Here { future } => future.as_mut().poll(cx).map(Ok),
            KvFutureProj::Router { future } => future
                .poll(cx)
                .map(|r| r.map(|answer| answer.map(Either::Right))),
        }
    }
}

/// What reading a request body came to.
enum Collected<E> {
    /// Exactly one uncompressed message (without its prefix), and nothing after it.
    Message(Bytes),
    /// Anything else: what was read, and how the body went on.
    Other { read: Bytes, rest: Rest<E> },
}

/// How a body went on after what was read of it.
enum Rest<E> {
    /// It had ended.
    Ended,
    /// It had trailers next.
    Trailers(HeaderMap),
    /// It failed.
    Failed(E),
    /// Its reading stopped (more than one message's worth); the body continues.
    Unread,
}

/// Reads `body` to its end if it is one message within the receive limit; stops at the
/// first sign that it is not.
async fn collect<B>(body: &mut B) -> Collected<B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    use http_body_util::BodyExt as _;
    let mut read = BytesMut::new();
    let mut first: Option<Bytes> = None;
    let other = |first: Option<Bytes>, read: BytesMut, rest| Collected::Other {
        read: first.unwrap_or_else(|| read.freeze()),
        rest,
    };
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return other(first, read, Rest::Failed(e)),
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => {
                let trailers = frame.into_trailers().unwrap_or_default();
                return other(first, read, Rest::Trailers(trailers));
            }
        };
        // The common case, a whole message in one DATA frame, is kept without a copy.
        match first.take() {
            None if read.is_empty() => first = Some(data),
            None => read.put(data),
            Some(earlier) => {
                read.reserve(earlier.len() + data.len());
                read.put(earlier);
                read.put(data);
            }
        }
        let so_far = first.as_ref().map_or(&read[..], |b| &b[..]);
        if so_far.len() >= PREFIX_LEN {
            let announced = (&so_far[1..PREFIX_LEN]).get_u32() as usize;
            if so_far[0] != 0
                || announced > MAX_GRPC_RECV_BYTES
                || so_far.len() > PREFIX_LEN + announced
            {
                return other(first, read, Rest::Unread);
            }
        }
    }
    let whole = first.unwrap_or_else(|| read.freeze());
    if whole.len() < PREFIX_LEN
        || (&whole[1..PREFIX_LEN]).get_u32() as usize != whole.len() - PREFIX_LEN
    {
        return Collected::Other {
            read: whole,
            rest: Rest::Ended,
        };
    }
    Collected::Message(whole.slice(PREFIX_LEN..))
}

/// Serves one call of `method`, or hands it to `router` as read so far (and the counting
/// of it, `pending`, to the metrics layer there).
///
/// Served here, a call gets what the layers around the router give every other call: it is
/// counted as the metrics layer counts it (`pending`: started, one message received, one
/// sent and `OK` as the answer's trailers go out, a refusal's code at once, `Canceled` if
/// dropped first) and admitted as the member guard admits it ([`admission`]). The receive
/// limit's rewrite has nothing to do here: a message over the limit goes to the router.
async fn serve<S, B, RB>(
    kv: Arc<KvService>,
    mut router: S,
    method: UnaryKv,
    request: http::Request<B>,
    pending: Pending,
) -> Answer<RB>
where
    S: Service<http::Request<Replayed<B>>, Response = http::Response<RB>, Error = Infallible>,
    B: Body<Data = Bytes> + Unpin,
{
    let (parts, mut body) = request.into_parts();
    let message = match collect(&mut body).await {
        Collected::Message(message) => message,
        Collected::Other { read, rest } => {
            let replayed = Replayed::after(read, rest, body);
            let mut request = http::Request::from_parts(parts, replayed);
            request.extensions_mut().insert(pending.hand_over());
            return match router.call(request).await {
                Ok(answer) => answer.map(Either::Right),
                Err(never) => match never {},
            };
        }
    };
    pending.received(1, message.len() as u64);
    match admission(&kv.shared.node, parts.uri.path()) {
        Admission::Now => {}
        Admission::Refused(status) => return refused(status, pending),
        Admission::CatchUpFirst => {
            if let Err(e) = kv.shared.node.caught_up().await {
                return refused(crate::errors::propose_status(&e), pending);
            }
        }
    }
    let metadata = tonic::metadata::MetadataMap::from_headers(parts.headers);
    let extensions = parts.extensions;
    macro_rules! call {
        ($request:ty, $handler:ident) => {{
            match baton_proto::codec::decode_message::<$request>(message) {
                Ok(m) => {
                    let request = tonic::Request::from_parts(metadata, extensions, m);
                    answer(kv.$handler(request).await, pending)
                }
                Err(status) => refused(status, pending),
            }
        }};
    }
    match method {
        UnaryKv::Range => call!(pb::RangeRequest, serve_range),
        UnaryKv::Put => call!(pb::PutRequest, serve_put),
        UnaryKv::DeleteRange => call!(pb::DeleteRangeRequest, serve_delete_range),
        UnaryKv::Txn => call!(pb::TxnRequest, serve_txn),
    }
}

/// A refusal as tonic writes it (trailers only), counted with its code at once.
fn refused<RB>(status: Status, mut pending: Pending) -> Answer<RB> {
    pending.handled(status.code() as usize);
    status.into_http().map(Either::Left)
}

/// A handler's outcome as tonic's unary path writes it, counted by `pending` as it goes out.
fn answer<M: Message, RB>(
    outcome: Result<tonic::Response<M>, Status>,
    pending: Pending,
) -> Answer<RB> {
    let response = match outcome {
        Ok(response) => response,
        Err(status) => return refused(status, pending),
    };
    let (metadata, message, extensions) = response.into_parts();
    // The KV handlers set no response metadata; tonic would strip gRPC's reserved headers
    // from it, so none may be set here either.
    debug_assert!(metadata.is_empty(), "KV handlers answer without metadata");
    let len = message.encoded_len();
    let mut framed = BytesMut::with_capacity(PREFIX_LEN + len);
    framed.put_u8(0);
    framed.put_u32(u32::try_from(len).expect("an answer under 4 GiB"));
    message
        .encode(&mut framed)
        .expect("the buffer was sized to the message");
    let mut answer = http::Response::new(Either::Left(OneMessage {
        message: Some(framed.freeze()),
        pending: Some(pending),
    }));
    *answer.version_mut() = http::Version::HTTP_2;
    *answer.extensions_mut() = extensions;
    answer.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    answer
}

/// A unary answer's body: the message, then trailers with `grpc-status: 0`; the call is
/// counted as it goes (as `Canceled` if the body is dropped before its trailers). Empty
/// (the default) under a refusal's trailers-only headers. Not boxed into tonic's body: hyper
/// polls it through two enums, not a vtable.
#[derive(Default)]
pub struct OneMessage {
    message: Option<Bytes>,
    /// Until the trailers are sent.
    pending: Option<Pending>,
}

impl Body for OneMessage {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(message) = self.message.take() {
            if let Some(pending) = &self.pending {
                pending.sent(1, (message.len() - PREFIX_LEN) as u64);
            }
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        let Some(mut pending) = self.pending.take() else {
            return Poll::Ready(None);
        };
        pending.handled(OK_CODE);
        // What tonic writes for an OK status (`Status::add_header`: no message, no details,
        // no metadata), without building a `Status` and percent-encoding its empty message
        // (~600 instructions per call in callgrind, 1 % of a put's).
        let mut trailers = HeaderMap::with_capacity(1);
        trailers.insert(GRPC_STATUS, http::HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.pending.is_none()
    }

    /// A lower bound only: an exact size makes hyper add `content-length` to the answer's
    /// headers, which neither grpc-go (etcd) nor tonic's own bodies send, and which HPACK
    /// encodes anew whenever an answer's size differs from the last.
    fn size_hint(&self) -> SizeHint {
        let mut hint = SizeHint::new();
        hint.set_lower(self.message.as_ref().map_or(0, |m| m.len() as u64));
        hint
    }
}

/// A request body as the router gets it: untouched, or what [`collect`] read put back in
/// front of how the body went on.
pub struct Replayed<B: Body> {
    read: Option<Bytes>,
    rest: Option<Rest<B::Error>>,
    body: B,
}

impl<B: Body> Replayed<B> {
    fn untouched(body: B) -> Self {
        Replayed {
            read: None,
            rest: Some(Rest::Unread),
            body,
        }
    }

    fn after(read: Bytes, rest: Rest<B::Error>, body: B) -> Self {
        Replayed {
            read: (!read.is_empty()).then_some(read),
            rest: Some(rest),
            body,
        }
    }
}

// Nothing of `Replayed` is ever pinned but `body`, which is `Unpin` itself: the read bytes,
// trailers and error are moved out freely.
impl<B: Body + Unpin> Unpin for Replayed<B> {}

impl<B> Body for Replayed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(read) = this.read.take() {
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        if let Some(Rest::Unread) = this.rest {
            let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
            if frame.is_none() {
                this.rest = Some(Rest::Ended);
            }
            return Poll::Ready(frame);
        }
        match this.rest.take() {
            None | Some(Rest::Ended | Rest::Unread) => Poll::Ready(None),
            Some(Rest::Trailers(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Some(Rest::Failed(e)) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match (&self.read, &self.rest) {
            (Some(_), _) => false,
            (None, None | Some(Rest::Ended)) => true,
            (None, Some(Rest::Unread)) => self.body.is_end_stream(),
            (None, Some(Rest::Trailers(_) | Rest::Failed(_))) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.read.as_ref().map_or(0, |r| r.len() as u64);
        match &self.rest {
            Some(Rest::Unread) => {
                let body = self.body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(body.lower() + read);
                if let Some(upper) = body.upper() {
                    hint.set_upper(upper + read);
                }
                hint
            }
            _ => SizeHint::with_exact(read),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt as _, StreamBody};

    use super::*;

    type Frames = Vec<Result<Frame<Bytes>, &'static str>>;
    type TestBody = Stutter<
        StreamBody<futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, &'static str>>>>,
    >;

    /// A body that is not ready on every other poll, as a body from the network often is not.
    struct Stutter<B> {
        body: B,
        ready: bool,
    }

    impl<B: Body + Unpin> Body for Stutter<B> {
        type Data = B::Data;
        type Error = B::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
            self.ready = !self.ready;
            if !self.ready {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Pin::new(&mut self.body).poll_frame(cx)
        }
    }

    fn body(frames: Frames) -> TestBody {
        Stutter {
            body: StreamBody::new(futures::stream::iter(frames)),
            ready: false,
        }
    }

    fn data(bytes: &[u8]) -> Result<Frame<Bytes>, &'static str> {
        Ok(Frame::data(Bytes::copy_from_slice(bytes)))
    }

    /// `message` with gRPC's prefix: `flag`, then its length.
    fn prefixed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&(message.len() as u32).to_be_bytes());
        v.extend_from_slice(message);
        v
    }

    /// Everything the router would read from `collect`'s leftovers: the bytes, the trailers
    /// and the error, in that order of the body.
    async fn replayed(
        read: Bytes,
        rest: Rest<&'static str>,
        body: TestBody,
    ) -> (Vec<u8>, Option<HeaderMap>, Option<&'static str>) {
        let mut replayed = Replayed::after(read, rest, body);
        let (mut bytes, mut trailers, mut error) = (Vec::new(), None, None);
        while let Some(frame) = replayed.frame().await {
            match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(d) => bytes.extend_from_slice(&d),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                },
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        assert!(replayed.is_end_stream() || error.is_some());
        (bytes, trailers, error)
    }

    /// A body that must go to tonic: what tonic then reads is the body as it was sent.
    async fn goes_to_tonic(frames: Frames) -> (Vec<u8>, Option<HeaderMap>, Option<&'static str>) {
        let sent: Vec<u8> = frames
            .iter()
            .filter_map(|f| f.as_ref().ok().and_then(|f| f.data_ref()).cloned())
            .flat_map(|d| d.to_vec())
            .collect();
        let mut b = body(frames);
        match collect(&mut b).await {
            Collected::Message(m) => panic!("served here: {m:?}"),
            Collected::Other { read, rest } => {
                let got = replayed(read, rest, b).await;
                assert_eq!(got.0, sent, "tonic reads the bytes sent");
                got
            }
        }
    }

    #[tokio::test]
    async fn one_message_is_served_here_however_it_is_split() {
        let whole = prefixed(0, b"a put request");
        for cuts in [vec![], vec![1], vec![5], vec![2, 9], vec![1, 2, 3, 4, 5, 6]] {
            let mut frames = Vec::new();
            let mut from = 0;
            for &cut in cuts.iter().chain(std::iter::once(&whole.len())) {
                frames.push(data(&whole[from..cut]));
                from = cut;
            }
            match collect(&mut body(frames)).await {
                Collected::Message(m) => assert_eq!(&m[..], b"a put request", "{cuts:?}"),
                Collected::Other { .. } => panic!("{cuts:?}: not served here"),
            }
        }
        // An empty message is a message (every field at its default).
        assert!(
            matches!(collect(&mut body(vec![data(&prefixed(0, b""))])).await, Collected::Message(m) if m.is_empty())
        );
    }

    #[tokio::test]
    async fn every_other_body_reaches_tonic_as_sent() {
        let msg = prefixed(0, b"request");
        // Nothing at all: tonic's "Missing request message."
        goes_to_tonic(vec![]).await;
        // Compressed, or a flag gRPC does not define.
        goes_to_tonic(vec![data(&prefixed(1, b"gzipped"))]).await;
        goes_to_tonic(vec![data(&prefixed(7, b"request"))]).await;
        // Cut short: in the prefix, and in the message.
        goes_to_tonic(vec![data(&msg[..3])]).await;
        goes_to_tonic(vec![data(&msg[..8])]).await;
        // Two messages, in one frame and in two.
        let two = [msg.clone(), msg.clone()].concat();
        goes_to_tonic(vec![data(&two)]).await;
        goes_to_tonic(vec![data(&msg), data(&msg)]).await;
        // Announced over the receive limit: reading stops at the prefix, the rest follows.
        let mut big = vec![0u8];
        big.extend_from_slice(&((MAX_GRPC_RECV_BYTES + 1) as u32).to_be_bytes());
        goes_to_tonic(vec![data(&big), data(&[0; 64]), data(&[0; 64])]).await;
        // Trailers after the message, and a body that fails: both kept, in place.
        let mut trailers = HeaderMap::new();
        trailers.insert("x-trailer", http::HeaderValue::from_static("1"));
        let (_, got, _) = goes_to_tonic(vec![data(&msg), Ok(Frame::trailers(trailers))]).await;
        assert_eq!(got.expect("trailers")["x-trailer"], "1");
        let (_, _, error) = goes_to_tonic(vec![data(&msg[..4]), Err("reset")]).await;
        assert_eq!(error, Some("reset"));
    }

    #[tokio::test]
    async fn an_answer_is_one_message_then_grpc_status_zero() {
        let put = pb::PutResponse {
            header: Some(pb::ResponseHeader {
                revision: 7,
                ..Default::default()
            }),
            prev_kv: None,
        };
        let pending = Pending::begin(grpc::meters(), UnaryKv::Put.meters());
        let answer = answer::<_, ()>(Ok(tonic::Response::new(put.clone())), pending);
        assert_eq!(answer.headers()["content-type"], "application/grpc");
        let Either::Left(body) = answer.into_body() else {
            panic!("an answer of the fast path's own")
        };
        let collected = body.collect().await.expect("a body");
        let trailers = collected.trailers().cloned().expect("trailers");
        let mut tonics = HeaderMap::new();
        Status::ok("")
            .add_header(&mut tonics)
            .expect("an OK status");
        assert_eq!(trailers, tonics, "the trailers tonic writes for OK");
        assert_eq!(trailers["grpc-status"], "0");
        assert!(trailers.get("grpc-message").is_none());
        let bytes = collected.to_bytes();
        assert_eq!(&bytes[..], &prefixed(0, &put.encode_to_vec())[..]);
        // An error is tonic's trailers-only answer.
        let refused = super::answer::<pb::PutResponse, ()>(
            Err(Status::invalid_argument("no")),
            Pending::begin(grpc::meters(), UnaryKv::Put.meters()),
        );
        assert_eq!(refused.headers()["grpc-status"], "3");
        assert_eq!(refused.headers()["grpc-message"], "no");
    }

    #[test]
    fn each_unary_kv_call_has_its_own_path_and_meters() {
        for method in UnaryKv::ALL {
            assert_eq!(UnaryKv::of_path(method.path()), Some(method));
            assert!(std::ptr::eq(
                method.meters(),
                grpc::meters().method(method.path())
            ));
        }
    }

    #[test]
    fn only_the_four_unary_kv_paths_are_served_here() {
        assert_eq!(UnaryKv::of_path("/etcdserverpb.KV/Put"), Some(UnaryKv::Put));
        assert_eq!(
            UnaryKv::of_path("/etcdserverpb.KV/Range"),
            Some(UnaryKv::Range)
        );
        assert_eq!(
            UnaryKv::of_path("/etcdserverpb.KV/DeleteRange"),
            Some(UnaryKv::DeleteRange)
        );
        assert_eq!(UnaryKv::of_path("/etcdserverpb.KV/Txn"), Some(UnaryKv::Txn));
        for other in [
            "/etcdserverpb.KV/Compact",
            "/etcdserverpb.Lease/LeaseGrant",
            "/etcdserverpb.KV/Put/",
            "/etcdserverpb.KVX/Put",
            "/",
        ] {
            assert_eq!(UnaryKv::of_path(other), None, "{other}");
        }
        let with = |v: Option<&'static str>| {
            let mut r = http::Request::new(());
            if let Some(v) = v {
                r.headers_mut()
                    .insert("grpc-encoding", http::HeaderValue::from_static(v));
            }
            uncompressed(&r)
        };
        assert!(with(None));
        assert!(with(Some("identity")));
        assert!(!with(Some("gzip")));
    }
}

#[cfg(test)]
mod future_sizes {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_size<A, F, C: FnOnce(A) -> F>(_: &C) -> usize {
        std::mem::size_of::<F>()
    }

    type Stack = crate::metrics_layer::GrpcMetrics<
        crate::member_guard::MemberGuard<
            crate::recv_limit_layer::RecvLimit<tonic::service::Routes>,
        >,
    >;

    /// A call's future is boxed once and copied whole as it is (see baton-raft's
    /// `a_proposals_future_stays_small`): 5248 bytes before the rare waits under it were
    /// boxed, 2704 after (debug build, 2026-12-07).
    #[test]
    fn a_calls_future_stays_small() {
        let serve = future_size(&|(kv, router, method, request, pending): (
            Arc<KvService>,
            Stack,
            UnaryKv,
            http::Request<tonic::body::Body>,
            Pending,
        )| serve(kv, router, method, request, pending));
        assert!(serve <= 3584, "serve: {serve} bytes");
    }
}
