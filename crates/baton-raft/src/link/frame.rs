//! The link's bytes: the hello, and frames (a length, a kind, a body).

use std::io;

use baton_proto::baton::raft::v1::PipeFrame;
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncReadExt as _};

use crate::pipe::MAX_FRAME_BYTES;

/// The first bytes each way on a link, version 1.
pub(super) const HELLO: &[u8; 24] = b"baton.raft.v1 link 1\r\n\r\n";

/// Bytes of a frame's header: the length, then the kind.
const HEADER_BYTES: usize = 5;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Kind {
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
pub(super) enum LinkError {
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
pub(super) fn put_frame(out: &mut Vec<u8>, kind: Kind, frame: Option<&PipeFrame>) {
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
pub(super) struct FrameReader<R> {
    inner: R,
    pub(super) buf: Vec<u8>,
    /// Where the unconsumed bytes in `buf` start.
    pub(super) start: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(super) fn new(inner: R) -> Self {
        FrameReader {
            inner,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
        }
    }

    /// The next whole frame in what was read so far, if any.
    pub(super) fn next_buffered(&mut self) -> Result<Option<(Kind, Option<PipeFrame>)>, LinkError> {
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
    pub(super) async fn fill(&mut self) -> io::Result<usize> {
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
