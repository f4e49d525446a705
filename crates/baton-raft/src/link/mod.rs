//! The peer link: the peer pipe's calls as length-prefixed frames on a plain byte stream
//! (TCP, or TLS under peer TLS), one connection per pair of members, no HTTP/2.
//!
//! Why: the gRPC pipe (`pipe`) made a call one frame each way, but every frame still
//! crossed the whole HTTP/2 stack on both ends — tonic's encoder and body, h2's stream and
//! flow-control state, its connection task, WINDOW_UPDATEs — and the profile of a 3-member
//! put with 100 clients put hyper/h2/tonic at 42–51 % of every member's CPU, a good part of
//! it the peer port (issue 19, item 4). Here a call is a 5-byte header and the protobuf
//! `PipeFrame` the gRPC pipe sends; frames queued meanwhile leave in one write.
//!
//! What does not change: each call frame is served exactly as the gRPC pipe's frame and as
//! its method's unary call (`PeerService::serve_frame`: the same envelope checks — format,
//! cluster, receiver, cluster-token credential, sender — and the same handler), a refusal
//! comes back as the status that call would have ended with, and the stream is the one the
//! peer transport makes, so under peer TLS the link exists only after the TLS handshake
//! checked the peer's certificate. InstallSnapshot and Members stay unary gRPC.
//!
//! # Wire format (version 1; pinned by `golden` tests)
//! - The dialer opens with [`HELLO`] (24 bytes, as long as HTTP/2's client preface, which
//!   it cannot be mistaken for); the listener answers the same 24 bytes before any frame.
//!   The peer port tells a link from gRPC by these bytes (`sniff`), so both share
//!   `--listen-peer-urls`. A peer that answers anything else, or closes the connection
//!   instead (an older build: its HTTP/2 server answers with its SETTINGS frame), does not
//!   speak the link: nothing sent on it was served, and its calls take the gRPC pipe
//!   (`client`), the link being tried again after `pipe::RETRY_UNSUPPORTED`.
//! - Then frames both ways: a big-endian `u32` length of what follows, a kind byte, and
//!   the body. [`Kind::Call`] (dialer → listener) and [`Kind::Answer`] (back) carry a
//!   protobuf `PipeFrame`, answers in completion order under their call's id;
//!   [`Kind::Ping`]/[`Kind::Pong`] are empty, the keep-alive that HTTP/2 pings were.
//!   A length of zero, or above `pipe::MAX_FRAME_BYTES` + 1, or an unknown kind ends the
//!   connection.
//!
//! A new version gets a new hello: an older listener refuses it as above and the dialer
//! falls back, so members of two versions still talk.

mod client;
mod outbox;
mod server;
mod sniff;

use std::io;

use baton_proto::baton::raft::v1::PipeFrame;
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use crate::env::{DialFuture, PeerStream};
use crate::pipe::MAX_FRAME_BYTES;

pub(crate) use client::open;
pub(crate) use sniff::{accept_incoming, accept_tcp};

/// The first bytes each way on a link, version 1.
pub(crate) const HELLO: &[u8; 24] = b"baton.raft.v1 link 1\r\n\r\n";

/// Bytes of a frame's header: the length, then the kind.
const HEADER_BYTES: usize = 5;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A call: a `PipeFrame` with its call id, method and request.
    Call = 1,
    /// An answer: a `PipeFrame` with the call's id and the answer or the status.
    Answer = 2,
    /// Keep-alive question (the dialer asks when it heard nothing for a while).
    Ping = 3,
    /// Keep-alive answer.
    Pong = 4,
}

impl Kind {
    fn of(byte: u8) -> Option<Kind> {
        Some(match byte {
            1 => Kind::Call,
            2 => Kind::Answer,
            3 => Kind::Ping,
            4 => Kind::Pong,
            _ => return None,
        })
    }
}

/// Why a link ended because of what the other end sent.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("peer link frame of {0} bytes (at most {max} allowed)", max = MAX_FRAME_BYTES + 1)]
    Length(usize),
    #[error("peer link frame of unknown kind {0}")]
    UnknownKind(u8),
    #[error("peer link frame {0:?} where it has no place")]
    Unexpected(Kind),
    #[error("peer link frame does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// Appends one frame of `kind` to `out`.
pub(crate) fn put_frame(out: &mut Vec<u8>, kind: Kind, frame: Option<&PipeFrame>) {
    let body = frame.map_or(0, |f| f.encoded_len());
    let len = u32::try_from(1 + body).expect("a frame fits the peer message bound");
    out.reserve(HEADER_BYTES + body);
    out.extend_from_slice(&len.to_be_bytes());
    out.push(kind as u8);
    if let Some(f) = frame {
        f.encode(out).expect("reserved above");
    }
}

/// Reads frames from a byte stream, keeping what a read brought beyond a whole frame.
pub(crate) struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Where the unconsumed bytes in `buf` start.
    start: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        FrameReader {
            inner,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
        }
    }

    /// The next whole frame in what was read so far, if any.
    pub(crate) fn next_buffered(&mut self) -> Result<Option<(Kind, Option<PipeFrame>)>, LinkError> {
        let have = &self.buf[self.start..];
        if have.len() < HEADER_BYTES {
            return Ok(None);
        }
        let len = u32::from_be_bytes(have[..4].try_into().expect("4 bytes")) as usize;
        if len == 0 || len > MAX_FRAME_BYTES + 1 {
            return Err(LinkError::Length(len));
        }
        if have.len() < 4 + len {
            return Ok(None);
        }
        let kind = Kind::of(have[4]).ok_or(LinkError::UnknownKind(have[4]))?;
        let body = &have[HEADER_BYTES..4 + len];
        let frame = match kind {
            Kind::Call | Kind::Answer => Some(PipeFrame::decode(body)?),
            Kind::Ping | Kind::Pong if body.is_empty() => None,
            Kind::Ping | Kind::Pong => return Err(LinkError::Unexpected(kind)),
        };
        self.start += 4 + len;
        Ok(Some((kind, frame)))
    }

    /// Reads more bytes; `Ok(0)` at the end of the stream.
    pub(crate) async fn fill(&mut self) -> io::Result<usize> {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > self.buf.capacity() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.inner.read_buf(&mut self.buf).await
    }
}

/// The host and port of a peer URL (`http://host:port`, `https://[::1]:port`), as a socket
/// connect takes them; a URL without a port gets its scheme's.
pub fn peer_host_port(url: &str) -> io::Result<(String, u16)> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let uri: tonic::transport::Uri = url
        .parse()
        .map_err(|e| invalid(format!("bad peer URL {url}: {e}")))?;
    let host = uri
        .host()
        .ok_or_else(|| invalid(format!("no host in peer URL {url}")))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("https")) => 443,
        (None, _) => 80,
    };
    Ok((host, port))
}

/// Dials an `http://` peer URL over plain TCP (no delay: small frames, each awaited).
pub fn dial_plain(url: &str) -> DialFuture {
    let url = url.to_string();
    Box::pin(async move {
        let (host, port) = peer_host_port(&url)?;
        let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        stream.set_nodelay(true)?;
        Ok(Box::new(stream) as Box<dyn PeerStream>)
    })
}

/// A status for a link that failed on `error`, with the error as its source, so that the
/// caller's reading of a transport failure (a refused connection: not delivered; a TLS
/// alert: the transport's explanation) sees it as it sees tonic's.
pub(crate) fn io_status(what: &str, error: io::Error) -> tonic::Status {
    let mut status = tonic::Status::unavailable(format!("baton: peer link: {what}: {error}"));
    status.set_source(std::sync::Arc::new(error));
    status
}

#[cfg(test)]
mod tests;
