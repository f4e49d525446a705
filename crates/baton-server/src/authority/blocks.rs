//! One connection's header blocks, decoded with h2's own HPACK decoder (the one the server
//! runs after this adaptor) and, once a block needed its `:authority` rewritten, re-encoded
//! with h2's encoder.
//!
//! **The downstream decoder's dynamic table stays right.** Until a block needs a rewrite,
//! every block passes byte for byte: the server's decoder and [`Blocks`]' decoder are the same
//! code with the same settings fed the same header frames — but for blocks that change no
//! table ([`neutral`]), which [`Blocks`]' decoder is spared — so their tables are equal to each
//! other and to the client's encoder's. The first block that needs a rewrite is re-encoded by
//! [`Blocks`]' encoder (fresh: empty table, 4096 bytes), which opens it with two dynamic-table
//! size updates, to 0 and back to 4096: the server's decoder drops every entry the client put
//! there and is then equal to that encoder. From then on every block is decoded (tracking the
//! client's table) and re-encoded (tracking the server's), so the two never meet again.
//!
//! **h2 decides what is malformed.** A block the decoder refuses as a stream error (h2 resets
//! that stream and goes on) passes unchanged while nothing was rewritten, since the server
//! will refuse it the same way; a connection error ends the following (the server closes the
//! connection on the same bytes). After a rewrite no client byte can reach the server's
//! decoder any more, so such a block closes the connection instead ([`Decision::Refuse`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use futures::Stream;
use h2::frame::{BytesStr, Frame, Headers};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::neutral;

/// h2's default SETTINGS_HEADER_TABLE_SIZE, which the server keeps (hyper sets none): the
/// most a client's dynamic table may hold, and what the re-encoder's table grows back to.
pub const HEADER_TABLE_BYTES: usize = 4096;

/// What to hand the server for one complete header block.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// The client's bytes, unchanged.
    Unchanged,
    /// These frames instead (HEADERS, then CONTINUATION as needed).
    Rewritten(Vec<u8>),
    /// The server would end the connection on this block: stop following, pass it unchanged.
    Abandon,
    /// After a rewrite, a block that cannot be re-encoded faithfully: close the connection.
    Refuse(&'static str),
}

/// The decoder (client → here) and encoder (here → server) of one connection.
pub struct Blocks {
    codec: h2::Codec<Pipe, Bytes>,
    /// A block was rewritten: every later one is re-encoded.
    rewriting: bool,
    /// Every block the decoder has read decoded whole, in the header list limit, with no
    /// URL `:authority`: so no dynamic entry holds one, and a [`neutral::table_neutral`]
    /// block can pass without being decoded (see there).
    vouched: bool,
}

impl Blocks {
    /// `max_frame` and `max_header_list` must be the server's own settings, so that this
    /// decoder refuses exactly what the server's refuses.
    pub fn new(max_frame: usize, max_header_list: usize) -> Self {
        let mut codec = h2::Codec::with_max_recv_frame_size(Pipe::default(), max_frame);
        codec.set_max_recv_header_list_size(max_header_list);
        Blocks {
            codec,
            rewriting: false,
            vouched: true,
        }
    }

    /// Whether the server's decoder no longer sees the client's bytes.
    pub fn rewriting(&self) -> bool {
        self.rewriting
    }

    /// Decides about one complete header block: `raw` is its frames, HEADERS (or
    /// PUSH_PROMISE) through the CONTINUATION with END_HEADERS.
    pub fn decide(&mut self, raw: &[u8]) -> Decision {
        if !self.rewriting && self.vouched && neutral::table_neutral(raw) {
            return Decision::Unchanged;
        }
        self.codec.get_mut().input.extend_from_slice(raw);
        let mut cx = Context::from_waker(Waker::noop());
        let polled = Pin::new(&mut self.codec).poll_next(&mut cx);
        // Fed one whole block, the codec reads all of it; a byte it left in the pipe would be
        // taken as the start of the next block, so such a block is not trusted.
        let leftover = !self.codec.get_ref().input.is_empty();
        self.codec.get_mut().input.clear();
        let whole = !leftover
            && matches!(&polled, Poll::Ready(Some(Ok(Frame::Headers(h)))) if !h.is_over_size());
        if !whole {
            // What the decoder read of a block it refused may have entered the table unseen:
            // from now on every block is decoded.
            self.vouched = false;
        }
        let mut decoded = match polled {
            Poll::Ready(Some(Ok(Frame::Headers(h)))) if whole => h,
            // A stream error: the server decodes and refuses the same block the same way.
            Poll::Ready(Some(Err(h2::proto::Error::Reset(..)))) if !self.rewriting => {
                return Decision::Unchanged;
            }
            // A PUSH_PROMISE from a client, a header list over the limit, a connection error:
            // the server refuses the stream or the connection on these bytes.
            Poll::Ready(Some(Ok(_))) if !self.rewriting => return Decision::Unchanged,
            _ if !self.rewriting => return Decision::Abandon,
            _ => return Decision::Refuse("a header block that cannot be re-encoded"),
        };
        if !self.rewriting {
            // h2's `unstable` API reads the pseudo-header fields through `pseudo_mut` only.
            let authority = decoded.pseudo_mut().authority.as_deref();
            if authority.and_then(url_authority).is_none() {
                return Decision::Unchanged;
            }
            self.rewriting = true;
            // Empties the server's dynamic table and restores its size (see the module doc).
            self.codec.set_send_header_table_size(0);
            self.codec.set_send_header_table_size(HEADER_TABLE_BYTES);
        }
        self.reencode(decoded)
    }

    /// Encodes `decoded`, its `:authority` reduced to the URL's authority, as frames.
    fn reencode(&mut self, decoded: Headers) -> Decision {
        let stream = decoded.stream_id();
        let end_stream = decoded.is_end_stream();
        let (mut pseudo, fields) = decoded.into_parts();
        if let Some(url) = pseudo.authority.as_deref() {
            if let Some(authority) = url_authority(url) {
                pseudo.authority = if authority.is_empty() {
                    None
                } else {
                    let bytes = Bytes::copy_from_slice(authority.as_bytes());
                    Some(BytesStr::try_from(bytes).expect("a &str is UTF-8"))
                };
            }
        }
        let mut headers = Headers::new(stream, pseudo, fields);
        if end_stream {
            headers.set_end_stream();
        }
        let mut cx = Context::from_waker(Waker::noop());
        // The pipe never refuses a write, so neither step can wait.
        let encoded = match self.codec.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => self
                .codec
                .buffer(Frame::Headers(headers))
                .is_ok()
                .then(|| self.codec.flush(&mut cx)),
            _ => None,
        };
        match encoded {
            Some(Poll::Ready(Ok(()))) => {
                Decision::Rewritten(std::mem::take(&mut self.codec.get_mut().output))
            }
            _ => Decision::Refuse("re-encoding a header block failed"),
        }
    }
}

/// The authority of `value` when it is a URL with a scheme (`scheme://authority[/…]`,
/// RFC 3986 §3), the way etcd's Go clients send an endpoint as `:authority`; `None` for
/// anything else. A value with `://` in it is never a valid authority (`/` is not allowed
/// there), so every value this changes is one h2 would refuse as it is.
pub fn url_authority(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once("://")?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')) {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The codec's transport: it reads what [`Blocks::decide`] puts in, and writes into a
/// buffer [`Blocks::reencode`] takes out. Never waits.
#[derive(Default)]
pub struct Pipe {
    input: BytesMut,
    output: Vec<u8>,
}

impl AsyncRead for Pipe {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.input.is_empty() {
            // Nothing more of this block: the codec stops here (its waker is a no-op).
            return Poll::Pending;
        }
        let n = this.input.len().min(buf.remaining());
        buf.put_slice(&this.input.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().output.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
