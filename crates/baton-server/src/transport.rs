//! The client port's connections: the HTTP/2 settings gRPC is served with, the accept loop,
//! and a record of every GOAWAY the server sends.
//!
//! **Why these settings.** etcd's own Go client keeps every lease of a process alive on one
//! `LeaseKeepAlive` stream: with 10,000 leases that is a burst of 10,000 DATA frames of ~15
//! bytes every 500 ms. h2 (0.4.20) charges each DATA frame under 256 bytes against a
//! per-connection budget until the application reads it, and when the budget runs out it
//! sends `GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`, which kills every stream of the
//! connection — keep-alives, watches, lock waits — so a client that did everything right
//! loses its leases. The budget is half the connection's receive window (hyper reaches no
//! other knob of it), and h2 charges a whole socket read's worth of frames before any handler
//! runs, so the window is what decides how large a burst survives:
//! [`CONNECTION_WINDOW_BYTES`] (32 MiB) leaves room for ~69,000 unread tiny frames. It is
//! also the bound on what one connection can make the server hold unread (flow control),
//! the same order as grpc-go's (etcd's) 16 MiB BDP ceiling. The handlers of the streams
//! that see such bursts (keep-alives, watch creates) read ahead of their work, so frames do
//! not sit in h2 while requests wait their turn.
//!
//! **Accept errors back off.** tonic's accept loop retries a failed `accept` at once; out of
//! descriptors (`EMFILE`), the pending connection stays in the backlog and every retry fails
//! again: a core spun at 99 % until the clients left. [`Incoming`] sleeps 5 ms, doubling to
//! 1 s, as Go's `net/http` does, logs once per episode and counts every failure.
//!
//! **GOAWAYs are counted and logged.** Whatever layer decides to end a connection (h2's
//! flood protections, a protocol error, a graceful shutdown), its GOAWAY frame passes
//! through the connection's writes; [`GoAwayRecorder`] reads the frame headers of what the
//! server writes (it never changes a byte) and logs each GOAWAY with its error code and debug
//! text at WARN (NO_ERROR, an orderly close, at DEBUG), counted in
//! `baton_http2_goaway_sent_total{code, reason}`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::server::Connected;

use crate::authority::{AuthorityRewrite, Limits};
use crate::conn::{self, ClientConnectInfo, ClientIo, Dialer, Security};

/// HTTP/2 connection-level receive window (and so, through h2's automatic budget of half of
/// it, the room for unread tiny DATA frames; see the module documentation).
pub const CONNECTION_WINDOW_BYTES: u32 = 32 << 20;
/// HTTP/2 stream-level receive window: a request of etcd's maximum size (1.5 MiB) arrives
/// without waiting for a window update.
pub const STREAM_WINDOW_BYTES: u32 = 4 << 20;
/// The largest header block accepted: tokens and metadata are a few KiB; hyper's default of
/// 16 MiB per request would let one stream hold that much before any limit applies.
pub const MAX_HEADER_LIST_BYTES: u32 = 1 << 20;
/// The largest frame payload the server accepts (SETTINGS_MAX_FRAME_SIZE): HTTP/2's initial
/// value, set explicitly because the `:authority` adaptor must refuse exactly the frames h2
/// refuses ([`AUTHORITY_LIMITS`]).
pub const MAX_FRAME_BYTES: u32 = 16_384;
/// The settings the client port's `:authority` adaptor follows connections with.
pub const AUTHORITY_LIMITS: Limits = Limits {
    max_frame: MAX_FRAME_BYTES as usize,
    max_header_list: MAX_HEADER_LIST_BYTES as usize,
};
/// Streams open at once per connection by default: etcd's `--max-concurrent-streams`
/// default (`math.MaxUint32`). Memory stays bounded per connection by the windows above.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = u32::MAX;
/// HTTP/2 PING interval on idle connections, and how long an answer may take before the
/// connection is closed (etcd: `--grpc-keepalive-timeout` 20 s). The defaults of
/// [`Keepalive`]; `baton serve` sets them with etcd's `--grpc-keepalive-interval` and
/// `--grpc-keepalive-timeout`.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The server's HTTP/2 keep-alive pings to clients (etcd's `--grpc-keepalive-interval` and
/// `--grpc-keepalive-timeout`; zero turns each off, as in etcd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            interval: KEEPALIVE_INTERVAL,
            timeout: KEEPALIVE_TIMEOUT,
        }
    }
}
/// The first and the longest pause after a failed accept (Go's `net/http`: 5 ms to 1 s).
const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// TLS handshakes in progress per listener; beyond it no connection is accepted until one
/// completes (the backlog holds the rest), so silent clients cannot pile up without bound.
const MAX_PENDING_HANDSHAKES: usize = 1024;

/// The tonic server builder with the client port's HTTP/2 settings.
pub fn server_builder(
    max_concurrent_streams: u32,
    keepalive: Keepalive,
) -> tonic::transport::Server {
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    tonic::transport::Server::builder()
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .http2_adaptive_window(Some(false))
        .max_concurrent_streams(max_concurrent_streams)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .http2_keepalive_interval(nonzero(keepalive.interval))
        .http2_keepalive_timeout(nonzero(keepalive.timeout))
}

type Handshake = Pin<Box<dyn Future<Output = Option<RecordedStream>> + Send>>;

/// Accepted connections of one listener, for tonic's `serve_with_incoming*`: TCP_NODELAY and
/// keep-alive set, accept errors backed off, TLS established where the listener's
/// [`Security`] asks for it (handshakes run concurrently, polled here beside `accept`), each
/// connection's GOAWAYs recorded.
pub struct Incoming {
    listener: TcpListener,
    security: Security,
    handshakes: FuturesUnordered<Handshake>,
    /// Set while backing off after a failed accept.
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    backoff: Duration,
    /// Failed accepts in the current episode (0: none).
    failures: u64,
    /// Who connects (how refused handshakes are logged).
    dialer: Dialer,
}

impl Incoming {
    pub fn with_security(listener: TcpListener, security: Security) -> Self {
        Incoming {
            listener,
            security,
            handshakes: FuturesUnordered::new(),
            pause: None,
            backoff: ACCEPT_BACKOFF_FIRST,
            failures: 0,
            dialer: Dialer::Client,
        }
    }

    /// The listener is a peer port: its refused handshakes are logged at INFO
    /// ([`Dialer::Peer`]).
    pub fn for_peers(mut self) -> Self {
        self.dialer = Dialer::Peer;
        self
    }

    /// Configures an accepted socket; a plain one is ready at once, a TLS one after its
    /// handshake (queued).
    fn accepted(&mut self, stream: TcpStream, peer: SocketAddr) -> Option<RecordedStream> {
        if self.failures > 0 {
            tracing::warn!(
                failures = self.failures,
                "accepting connections again after failed accepts"
            );
            self.failures = 0;
            self.backoff = ACCEPT_BACKOFF_FIRST;
        }
        // Without TCP_NODELAY, Nagle's algorithm meets the client's delayed ACKs and small
        // responses wait ~40 ms.
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream)
            .set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(Duration::from_secs(60)));
        let dialer = self.dialer;
        if let Security::Plain = self.security {
            return Some(RecordedStream::new(ClientIo::Plain(stream), peer, dialer));
        }
        let security = self.security.clone();
        self.handshakes.push(Box::pin(
            conn::establish(stream, peer, security, dialer)
                .map(move |io| io.map(|io| RecordedStream::new(io, peer, dialer))),
        ));
        None
    }

    fn failed(&mut self, error: &io::Error) -> Duration {
        let kind = accept_error_kind(error);
        metrics::counter!("baton_accept_errors_total", "kind" => kind).increment(1);
        if self.failures == 0 {
            tracing::warn!(
                %error,
                kind,
                "accepting a connection failed; retrying with backoff (5 ms doubling to 1 s) until it succeeds"
            );
        }
        self.failures += 1;
        let pause = self.backoff;
        self.backoff = (self.backoff * 2).min(ACCEPT_BACKOFF_MAX);
        pause
    }
}

/// A bounded label for an accept error.
fn accept_error_kind(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::EMFILE) => "emfile",
        Some(libc::ENFILE) => "enfile",
        Some(libc::ENOBUFS) => "enobufs",
        Some(libc::ENOMEM) => "enomem",
        _ => "other",
    }
}

impl Stream for Incoming {
    type Item = io::Result<RecordedStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            // Finished handshakes first (a failed one was dropped and counted).
            while let Poll::Ready(Some(done)) = this.handshakes.poll_next_unpin(cx) {
                if let Some(stream) = done {
                    return Poll::Ready(Some(Ok(stream)));
                }
            }
            if this.handshakes.len() >= MAX_PENDING_HANDSHAKES {
                return Poll::Pending;
            }
            if let Some(pause) = this.pause.as_mut() {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.pause = None;
            }
            match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, peer))) => {
                    if let Some(ready) = this.accepted(stream, peer) {
                        return Poll::Ready(Some(Ok(ready)));
                    }
                }
                Poll::Ready(Err(e)) => {
                    let pause = this.failed(&e);
                    this.pause = Some(Box::pin(tokio::time::sleep(pause)));
                }
            }
        }
    }
}

/// An accepted connection whose outgoing HTTP/2 frames are watched for GOAWAY (read above
/// TLS, where the frames are plain) and, from a client, whose incoming `:authority` URLs are
/// reduced to their authority ([`AuthorityRewrite`]; peers send none).
pub struct RecordedStream {
    inner: AuthorityRewrite<ClientIo>,
    recorder: GoAwayRecorder,
    info: ClientConnectInfo,
}

impl RecordedStream {
    fn new(inner: ClientIo, peer: SocketAddr, dialer: Dialer) -> Self {
        let info = inner.connect_info();
        let inner = match dialer {
            Dialer::Client => AuthorityRewrite::new(inner, AUTHORITY_LIMITS),
            Dialer::Peer => AuthorityRewrite::passthrough(inner),
        };
        RecordedStream {
            info,
            inner,
            recorder: GoAwayRecorder::new(peer),
        }
    }
}

impl Connected for RecordedStream {
    type ConnectInfo = ClientConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for RecordedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for RecordedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = std::task::ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.recorder.wrote(&buf[..written]);
        Poll::Ready(Ok(written))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = std::task::ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        let mut left = written;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let n = left.min(buf.len());
            this.recorder.wrote(&buf[..n]);
            left -= n;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Logs and counts the GOAWAY frames among the bytes a connection writes.
pub struct GoAwayRecorder {
    peer: SocketAddr,
    frames: FrameScanner,
}

impl GoAwayRecorder {
    pub fn new(peer: SocketAddr) -> Self {
        GoAwayRecorder {
            peer,
            frames: FrameScanner::default(),
        }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        let peer = self.peer;
        self.frames
            .scan(bytes, |goaway| record_goaway(peer, &goaway));
    }
}

fn record_goaway(peer: SocketAddr, goaway: &GoAway) {
    let code = error_code_name(goaway.error_code);
    let reason = bounded_reason(&goaway.debug);
    metrics::counter!("baton_http2_goaway_sent_total", "code" => code, "reason" => reason)
        .increment(1);
    let detail = String::from_utf8_lossy(&goaway.debug);
    if goaway.error_code == 0 {
        tracing::debug!(%peer, code, last_stream_id = goaway.last_stream_id, "HTTP/2 GOAWAY sent (orderly close)");
    } else {
        tracing::warn!(
            %peer,
            code,
            detail = %detail,
            last_stream_id = goaway.last_stream_id,
            "HTTP/2 GOAWAY sent: the connection and every stream on it (keep-alives, watches, lock waits) end"
        );
    }
}

/// RFC 9113 §7 error code names; unknown codes are one label.
fn error_code_name(code: u32) -> &'static str {
    match code {
        0x0 => "NO_ERROR",
        0x1 => "PROTOCOL_ERROR",
        0x2 => "INTERNAL_ERROR",
        0x3 => "FLOW_CONTROL_ERROR",
        0x4 => "SETTINGS_TIMEOUT",
        0x5 => "STREAM_CLOSED",
        0x6 => "FRAME_SIZE_ERROR",
        0x7 => "REFUSED_STREAM",
        0x8 => "CANCEL",
        0x9 => "COMPRESSION_ERROR",
        0xa => "CONNECT_ERROR",
        0xb => "ENHANCE_YOUR_CALM",
        0xc => "INADEQUATE_SECURITY",
        0xd => "HTTP_1_1_REQUIRED",
        _ => "unknown",
    }
}

/// The metric label for a GOAWAY's debug data: h2's own reasons by name (a fixed set),
/// anything else as one label, so a label never takes arbitrary values.
fn bounded_reason(debug: &[u8]) -> &'static str {
    const KNOWN: [&str; 5] = [
        "too_many_data_frames",
        "too_many_resets",
        "too_many_internal_resets",
        "too_many_continuations",
        "too_many_empty_frames",
    ];
    if debug.is_empty() {
        return "";
    }
    KNOWN
        .iter()
        .find(|k| k.as_bytes() == debug)
        .copied()
        .unwrap_or("other")
}

/// One GOAWAY frame's payload (RFC 9113 §6.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoAway {
    pub last_stream_id: u32,
    pub error_code: u32,
    /// At most [`MAX_DEBUG_BYTES`] of the debug data.
    pub debug: Vec<u8>,
}

/// Debug data kept from a GOAWAY (h2's reasons are short).
pub const MAX_DEBUG_BYTES: usize = 256;
const FRAME_HEADER_BYTES: usize = 9;
const FRAME_TYPE_GOAWAY: u8 = 0x7;

/// Follows HTTP/2 frame boundaries through a server's outgoing byte stream, however the
/// writes split it, and hands over each GOAWAY. A server writes no connection preface of its
/// own (its first frame is SETTINGS), so the stream is frames from its first byte. A
/// connection whose first bytes are not a SETTINGS frame speaks HTTP/1.1 (the client port
/// serves both) and is not scanned at all.
#[derive(Debug, Default)]
pub struct FrameScanner {
    header: [u8; FRAME_HEADER_BYTES],
    header_len: usize,
    /// Payload bytes of the current frame still to pass.
    payload_left: usize,
    /// The GOAWAY being read, when the current frame is one.
    goaway: Option<Vec<u8>>,
    /// The first frame header was read (and was SETTINGS).
    started: bool,
    /// Not HTTP/2: nothing to scan.
    not_http2: bool,
}

const FRAME_TYPE_SETTINGS: u8 = 0x4;

impl FrameScanner {
    /// Feeds the next bytes written; `found` is called for every GOAWAY completed.
    pub fn scan(&mut self, mut bytes: &[u8], mut found: impl FnMut(GoAway)) {
        while !bytes.is_empty() && !self.not_http2 {
            if self.payload_left == 0 && self.goaway.is_none() {
                let take = (FRAME_HEADER_BYTES - self.header_len).min(bytes.len());
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&bytes[..take]);
                self.header_len += take;
                bytes = &bytes[take..];
                if self.header_len < FRAME_HEADER_BYTES {
                    return;
                }
                self.header_len = 0;
                let h = &self.header;
                if !self.started {
                    self.started = true;
                    // SETTINGS on stream 0 opens every HTTP/2 server's output.
                    if h[3] != FRAME_TYPE_SETTINGS || h[5..9] != [0, 0, 0, 0] {
                        self.not_http2 = true;
                        return;
                    }
                }
                self.payload_left = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
                if h[3] == FRAME_TYPE_GOAWAY {
                    self.goaway = Some(Vec::new());
                }
            }
            let take = self.payload_left.min(bytes.len());
            if let Some(payload) = self.goaway.as_mut() {
                let room = (8 + MAX_DEBUG_BYTES).saturating_sub(payload.len());
                payload.extend_from_slice(&bytes[..take.min(room)]);
            }
            self.payload_left -= take;
            bytes = &bytes[take..];
            if self.payload_left == 0 {
                if let Some(payload) = self.goaway.take() {
                    if let Some(goaway) = parse_goaway(&payload) {
                        found(goaway);
                    }
                }
            }
        }
    }
}

fn parse_goaway(payload: &[u8]) -> Option<GoAway> {
    let last = payload.get(0..4)?;
    let code = payload.get(4..8)?;
    Some(GoAway {
        last_stream_id: u32::from_be_bytes([last[0], last[1], last[2], last[3]]) & 0x7fff_ffff,
        error_code: u32::from_be_bytes([code[0], code[1], code[2], code[3]]),
        debug: payload[8..].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            0,
        ];
        f.extend_from_slice(payload);
        f
    }

    fn goaway(last: u32, code: u32, debug: &[u8]) -> Vec<u8> {
        let mut p = last.to_be_bytes().to_vec();
        p.extend_from_slice(&code.to_be_bytes());
        p.extend_from_slice(debug);
        frame(FRAME_TYPE_GOAWAY, &p)
    }

    fn scan_in_pieces(bytes: &[u8], piece: usize) -> Vec<GoAway> {
        let mut scanner = FrameScanner::default();
        let mut found = Vec::new();
        for chunk in bytes.chunks(piece) {
            scanner.scan(chunk, |g| found.push(g));
        }
        found
    }

    #[test]
    fn finds_goaway_between_other_frames_however_the_writes_split() {
        let mut stream = frame(0x4, &[0; 18]); // SETTINGS
        stream.extend(frame(0x0, &[7; 300])); // DATA
        stream.extend(goaway(41, 0xb, b"too_many_data_frames"));
        stream.extend(frame(0x6, &[0; 8])); // PING
        stream.extend(goaway(43, 0, b""));
        let want = vec![
            GoAway {
                last_stream_id: 41,
                error_code: 0xb,
                debug: b"too_many_data_frames".to_vec(),
            },
            GoAway {
                last_stream_id: 43,
                error_code: 0,
                debug: Vec::new(),
            },
        ];
        for piece in [1, 2, 5, 9, 10, 64, stream.len()] {
            assert_eq!(scan_in_pieces(&stream, piece), want, "pieces of {piece}");
        }
    }

    #[test]
    fn an_http1_connection_is_not_scanned() {
        // HTTP/1.1 answers read as frame headers could take any type; none is reported.
        let mut scanner = FrameScanner::default();
        let mut found = Vec::new();
        let mut stream = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n".to_vec();
        stream.extend(goaway(1, 2, b"looks like one"));
        scanner.scan(&stream, |g| found.push(g));
        assert!(found.is_empty());
    }

    #[test]
    fn long_debug_data_is_cut_and_the_next_frame_still_found() {
        let mut stream = frame(0x4, &[]);
        stream.extend(goaway(1, 2, &[b'x'; 5000]));
        stream.extend(goaway(3, 0xb, b"too_many_resets"));
        let found = scan_in_pieces(&stream, 700);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].debug.len(), MAX_DEBUG_BYTES);
        assert_eq!(found[1].debug, b"too_many_resets");
    }

    #[test]
    fn a_truncated_goaway_payload_is_ignored() {
        // A GOAWAY shorter than its fixed 8 bytes is malformed; it must not be reported or
        // derail the frames after it.
        let mut stream = frame(FRAME_TYPE_SETTINGS, &[]);
        stream.extend(frame(FRAME_TYPE_GOAWAY, &[0, 0, 0]));
        stream.extend(goaway(9, 1, b""));
        assert_eq!(scan_in_pieces(&stream, 4).len(), 1);
    }

    #[test]
    fn labels_stay_bounded() {
        assert_eq!(
            bounded_reason(b"too_many_data_frames"),
            "too_many_data_frames"
        );
        assert_eq!(bounded_reason(b"anything a peer could say"), "other");
        assert_eq!(bounded_reason(b""), "");
        assert_eq!(error_code_name(0xb), "ENHANCE_YOUR_CALM");
        assert_eq!(error_code_name(0x99), "unknown");
    }

    #[test]
    fn accept_errors_are_classified() {
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        assert_eq!(accept_error_kind(&emfile), "emfile");
        assert_eq!(accept_error_kind(&io::Error::other("boom")), "other");
    }
}
