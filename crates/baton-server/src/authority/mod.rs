//! Accepts an HTTP/2 `:authority` that is a URL with a scheme, as etcd's Go server does.
//!
//! **Why.** etcd 3.4's clientv3 dials each endpoint's Maintenance calls (`etcdctl endpoint
//! status`/`hashkv`, `defrag`, `move-leader`, `Client.Status(ctx, "http://…")`) with the whole
//! endpoint URL as `:authority`. h2 (under hyper and tonic) refuses such a request before any
//! handler runs (`malformed authority` → RST_STREAM PROTOCOL_ERROR); grpc-go accepts it.
//!
//! **What.** [`AuthorityRewrite`] sits on the read side of each client-port connection (plain
//! or TLS, after the handshake). For a connection that opens with the HTTP/2 client preface it
//! follows the client's frames ([`frames`]); each header block is held until it is complete
//! and decoded with h2's own HPACK decoder ([`blocks`]). A `:authority` of the form
//! `scheme://authority[/…]` is replaced by its authority and the block re-encoded; the
//! server's dynamic table is kept equal to the re-encoder's (see [`blocks`]). Everything else
//! passes as it came: other frames, blocks that need nothing (byte for byte, while no block of
//! the connection needed a rewrite), and whole connections that are not HTTP/2 (HTTP/1.1 on
//! the same port) or whose framing h2 would refuse anyway, which are no longer followed.
//!
//! **Cost.** Bytes that need no change stay where the socket read put them, in the server's
//! own read buffer; only a header block still incomplete at the end of a read is copied
//! aside until its remaining frames arrive (read exactly, so the next read is in place again).
//! Each header block is decoded once more than before (the server decodes it too), except a
//! lone HEADERS frame that leaves the HPACK dynamic table as it was and names `:authority`
//! only by index ([`neutral`]: most blocks of h2-style clients), which is walked, not decoded.
//! Measurements: ARCHITECTURE.md, "Libraries, and why these".
//!
//! **Bounds.** A held block is at most what h2 accepts (frames of `max_frame` bytes, at most
//! `max_continuations` CONTINUATIONs, checked before holding more); a block h2 would refuse
//! ends the following, or the connection once a block was rewritten. Nothing panics on a
//! client's bytes: every length is checked before it is used.

mod blocks;
mod frames;
mod neutral;

#[cfg(test)]
mod tests;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use blocks::url_authority;
use blocks::{Blocks, Decision};
use frames::{Frames, Step};

/// The HTTP/2 settings the server runs with, which the adaptor must agree with.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The server's SETTINGS_MAX_FRAME_SIZE (frames the server accepts).
    pub max_frame: usize,
    /// The server's SETTINGS_MAX_HEADER_LIST_SIZE.
    pub max_header_list: usize,
}

impl Limits {
    /// h2's bound on CONTINUATION frames without END_HEADERS in one block (its
    /// `calc_max_continuation_frames`: the frames a full header list needs, plus a quarter).
    fn max_continuations(&self) -> usize {
        let min_frames = (self.max_header_list / self.max_frame).max(1);
        min_frames.saturating_add(min_frames >> 2).max(5)
    }
}

/// A client connection whose HTTP/2 `:authority` URLs are reduced to their authority.
pub struct AuthorityRewrite<T> {
    inner: T,
    state: State,
}

enum State {
    /// Not followed: reads go straight to the connection.
    Pass,
    Follow(Box<Following>),
}

impl<T> AuthorityRewrite<T> {
    /// Follows `inner`'s HTTP/2 frames.
    pub fn new(inner: T, limits: Limits) -> Self {
        AuthorityRewrite {
            inner,
            state: State::Follow(Box::new(Following::new(limits))),
        }
    }

    /// Passes every byte of `inner` as it is (connections that need no rewriting).
    pub fn passthrough(inner: T) -> Self {
        AuthorityRewrite {
            inner,
            state: State::Pass,
        }
    }
}

/// The following of one connection.
struct Following {
    frames: Frames,
    limits: Limits,
    /// Created at the first header block.
    blocks: Option<Blocks>,
    /// Bytes read but not yet released, from a unit boundary on; `held_at` is where the
    /// unreleased part starts.
    held: Vec<u8>,
    held_at: usize,
    /// Bytes for the server before any other (rewritten blocks, released held bytes).
    ready: Vec<u8>,
    ready_at: usize,
    /// Following ended: once `ready` is delivered, the connection passes.
    abandoned: bool,
}

/// What scanning fresh bytes in place decided.
enum Scan {
    /// The first `n` bytes go to the server as they are; the rest was taken aside.
    Release(usize),
    /// Stop following: everything goes as it is.
    Abandon,
    /// Close the connection.
    Refuse(&'static str),
}

/// What working through held bytes decided.
enum Held {
    /// Something is ready, or nothing is held any more.
    Progress,
    /// At least `n` more bytes are needed to finish the frame being held.
    NeedMore(usize),
    Refuse(&'static str),
}

impl Following {
    fn new(limits: Limits) -> Self {
        Following {
            frames: Frames::new(limits.max_frame, limits.max_continuations()),
            limits,
            blocks: None,
            held: Vec::new(),
            held_at: 0,
            ready: Vec::new(),
            ready_at: 0,
            abandoned: false,
        }
    }

    fn rewriting(&self) -> bool {
        self.blocks.as_ref().is_some_and(Blocks::rewriting)
    }

    fn decide(&mut self, block: &[u8]) -> Decision {
        let limits = self.limits;
        self.blocks
            .get_or_insert_with(|| Blocks::new(limits.max_frame, limits.max_header_list))
            .decide(block)
    }

    /// What a step that ends the following means for the connection.
    fn end(&mut self) -> Result<(), &'static str> {
        if self.rewriting() {
            Err("a header block the server would refuse, after a rewrite")
        } else {
            self.abandoned = true;
            Ok(())
        }
    }

    /// Scans bytes fresh from the socket where they lie (nothing is held or ready).
    fn scan(&mut self, bytes: &[u8]) -> Scan {
        debug_assert!(self.held.is_empty() && self.ready.is_empty());
        let mut at = 0;
        while at < bytes.len() {
            match self.frames.step(&bytes[at..]) {
                Step::Pass(n) => at += n,
                Step::Block(n) => match self.decide(&bytes[at..at + n]) {
                    Decision::Unchanged => at += n,
                    Decision::Rewritten(frames) => {
                        self.ready = frames;
                        self.held.extend_from_slice(&bytes[at + n..]);
                        return Scan::Release(at);
                    }
                    Decision::Abandon => return Scan::Abandon,
                    Decision::Refuse(why) => return Scan::Refuse(why),
                },
                Step::More(_) => {
                    self.held.extend_from_slice(&bytes[at..]);
                    return Scan::Release(at);
                }
                Step::NotHttp2 | Step::Malformed => {
                    return match self.end() {
                        Ok(()) => Scan::Abandon,
                        Err(why) => Scan::Refuse(why),
                    };
                }
            }
        }
        Scan::Release(at)
    }

    /// Moves what is settled at the front of the held bytes to `ready`.
    fn settle_held(&mut self) -> Held {
        while self.held_at < self.held.len() {
            let unreleased = &self.held[self.held_at..];
            match self.frames.step(unreleased) {
                Step::Pass(n) => self.release_held(n),
                Step::Block(n) => match self.decide_held(n) {
                    Decision::Unchanged => self.release_held(n),
                    Decision::Rewritten(frames) => {
                        self.ready.extend_from_slice(&frames);
                        self.held_at += n;
                    }
                    Decision::Abandon => {
                        self.abandoned = true;
                        self.release_held(self.held.len() - self.held_at);
                    }
                    Decision::Refuse(why) => return Held::Refuse(why),
                },
                Step::More(n) => return Held::NeedMore(n),
                Step::NotHttp2 | Step::Malformed => match self.end() {
                    Ok(()) => self.release_held(self.held.len() - self.held_at),
                    Err(why) => return Held::Refuse(why),
                },
            }
            if self.abandoned {
                break;
            }
        }
        clear(&mut self.held);
        self.held_at = 0;
        Held::Progress
    }

    /// Decides about the block of `n` bytes at the front of the held bytes.
    fn decide_held(&mut self, n: usize) -> Decision {
        let held = std::mem::take(&mut self.held);
        let decision = self.decide(&held[self.held_at..self.held_at + n]);
        self.held = held;
        decision
    }

    fn release_held(&mut self, n: usize) {
        self.ready
            .extend_from_slice(&self.held[self.held_at..self.held_at + n]);
        self.held_at += n;
    }

    /// Copies ready bytes into `buf`; false if there were none.
    fn deliver(&mut self, buf: &mut ReadBuf<'_>) -> bool {
        if self.ready_at == self.ready.len() {
            return false;
        }
        let n = (self.ready.len() - self.ready_at).min(buf.remaining());
        buf.put_slice(&self.ready[self.ready_at..self.ready_at + n]);
        self.ready_at += n;
        if self.ready_at == self.ready.len() {
            clear(&mut self.ready);
            self.ready_at = 0;
        }
        true
    }

    /// The connection ended with `held` unfinished: the server gets the client's bytes as
    /// they are while it still decodes them (it then fails on the cut frame, as it would
    /// have), none after a rewrite.
    fn ended(&mut self) {
        if !self.rewriting() {
            let n = self.held.len() - self.held_at;
            self.release_held(n);
        }
        clear(&mut self.held);
        self.held_at = 0;
        self.abandoned = true;
    }
}

/// Capacity an emptied buffer keeps: a few header blocks' worth; what one large block grew
/// it to is given back.
const KEPT_CAPACITY: usize = 16 * 1024;

fn clear(buf: &mut Vec<u8>) {
    if buf.capacity() > KEPT_CAPACITY {
        *buf = Vec::new();
    } else {
        buf.clear();
    }
}

fn refused(why: &'static str) -> io::Error {
    tracing::debug!(
        why,
        "closing a client connection the :authority adaptor cannot follow"
    );
    io::Error::new(io::ErrorKind::InvalidData, why)
}

impl<T: AsyncRead + Unpin> AsyncRead for AuthorityRewrite<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let following = match &mut this.state {
                State::Pass => return Pin::new(&mut this.inner).poll_read(cx, buf),
                State::Follow(following) => following,
            };
            if following.deliver(buf) {
                return Poll::Ready(Ok(()));
            }
            if following.abandoned {
                this.state = State::Pass;
                continue;
            }
            if following.held_at < following.held.len() {
                match following.settle_held() {
                    Held::Progress => continue,
                    Held::Refuse(why) => return Poll::Ready(Err(refused(why))),
                    // What is settled goes first: the client may wait for its answer.
                    Held::NeedMore(_) if following.ready_at < following.ready.len() => continue,
                    Held::NeedMore(n) => {
                        let held = &mut following.held;
                        let old = held.len();
                        held.resize(old + n, 0);
                        let mut more = ReadBuf::new(&mut held[old..]);
                        let polled = Pin::new(&mut this.inner).poll_read(cx, &mut more);
                        let got = more.filled().len();
                        held.truncate(old + got);
                        std::task::ready!(polled)?;
                        if got == 0 {
                            following.ended();
                        }
                        continue;
                    }
                }
            }
            // Nothing held or ready: read straight into the server's buffer.
            let start = buf.filled().len();
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            if buf.filled().len() == start {
                return Poll::Ready(Ok(()));
            }
            match following.scan(&buf.filled()[start..]) {
                Scan::Release(n) => {
                    buf.set_filled(start + n);
                    if n > 0 {
                        return Poll::Ready(Ok(()));
                    }
                }
                Scan::Abandon => {
                    this.state = State::Pass;
                    return Poll::Ready(Ok(()));
                }
                Scan::Refuse(why) => return Poll::Ready(Err(refused(why))),
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for AuthorityRewrite<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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
