//! A link's sending side: frames are written by whoever sends them, at once, when no write
//! is under way; a write the socket cannot take whole is finished by a writer task.
//!
//! Why: handing every frame to a writer task costs a wake-up of that task — on this kind of
//! machine a cross-CPU wake-up is ~28 µs, a fair part of a replicated write. Written by the
//! sender, a frame leaves with one syscall on the thread that made it. Frames sent while a
//! write is under way are appended to the same buffer and leave with the writer's next
//! write, so order is kept and bursts are coalesced.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use baton_proto::baton::raft::v1::PipeFrame;
use parking_lot::Mutex;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::sync::Notify;

use super::frame::{put_frame, Kind};
use crate::pipe::MAX_FRAME_BYTES;

/// Bytes of frames an outbox holds unwritten at most. Calls and answers in flight are each
/// bounded (`pipe::MAX_CALLS_IN_FLIGHT`), but a peer that stops reading while it keeps
/// sending calls would have answers pile up here: beyond this the link is ended instead.
const MAX_PENDING_BYTES: usize = 4 * MAX_FRAME_BYTES;

/// Who holds the stream's writing half.
enum Holder<W> {
    /// Nobody: a sender may write.
    Idle(W),
    /// Handed to the writer task, which has not taken it yet.
    Handed(W),
    /// The writer task (or, before the link is up, nobody yet): senders only append.
    Writer,
    /// A write failed: the link is over.
    Failed,
}

struct State<W> {
    /// Bytes of frames not written yet, in order.
    pending: Vec<u8>,
    holder: Holder<W>,
}

pub(super) struct Outbox<W> {
    state: Mutex<State<W>>,
    wake_writer: Notify,
    /// Notified when a sender ends the outbox, so a writer task stuck in a write to a peer
    /// that does not read gives up too.
    ended: Notify,
}

/// The outbox is over: a write failed.
#[derive(Debug)]
pub(super) struct Closed;

impl<W: AsyncWrite + Unpin + Send + 'static> Outbox<W> {
    /// An outbox whose stream is not connected yet: frames wait until [`Outbox::start`].
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Outbox {
            state: Mutex::new(State {
                pending: Vec::with_capacity(16 * 1024),
                holder: Holder::Writer,
            }),
            wake_writer: Notify::new(),
            ended: Notify::new(),
        })
    }

    /// Gives the outbox its stream and starts the writer task, which first writes what was
    /// sent meanwhile. The task ends with the first failed write (or when aborted).
    pub(super) fn start(self: &Arc<Self>, write: W) -> tokio::task::JoinHandle<io::Error> {
        self.state.lock().holder = Holder::Handed(write);
        let outbox = self.clone();
        let task = tokio::spawn(async move { outbox.run_writer().await });
        self.wake_writer.notify_one();
        task
    }

    /// Sends one frame: written now if no write is under way and the socket takes it,
    /// else left to the writer task.
    pub(super) fn send(&self, kind: Kind, frame: Option<&PipeFrame>) -> Result<(), Closed> {
        let mut state = self.state.lock();
        if matches!(state.holder, Holder::Failed) {
            return Err(Closed);
        }
        if state.pending.len() > MAX_PENDING_BYTES {
            // The peer has not read for a long while: give up on the link.
            state.holder = Holder::Failed;
            self.wake_writer.notify_one();
            self.ended.notify_one();
            return Err(Closed);
        }
        put_frame(&mut state.pending, kind, frame);
        if !matches!(state.holder, Holder::Idle(_)) {
            // The writer task holds it (or will): it writes `pending` before it lets go.
            return Ok(());
        }
        let Holder::Idle(mut write) = std::mem::replace(&mut state.holder, Holder::Writer) else {
            unreachable!("matched above, under the same lock")
        };
        match write_now(&mut write, &state.pending) {
            Ok((n, flushed)) => {
                state.pending.drain(..n);
                if flushed && state.pending.is_empty() {
                    state.holder = Holder::Idle(write);
                } else {
                    state.holder = Holder::Handed(write);
                    self.wake_writer.notify_one();
                }
                Ok(())
            }
            Err(_) => {
                state.holder = Holder::Failed;
                // The writer task ends on seeing it: the link's reader learns from it.
                self.wake_writer.notify_one();
                Err(Closed)
            }
        }
    }

    /// Ends the outbox: the writing half is dropped (closing the stream once the reading
    /// half is gone too), and later sends fail.
    pub(super) fn shut(&self) {
        self.state.lock().holder = Holder::Failed;
        self.ended.notify_one();
    }

    async fn run_writer(&self) -> io::Error {
        loop {
            self.wake_writer.notified().await;
            let mut write = {
                let mut state = self.state.lock();
                match std::mem::replace(&mut state.holder, Holder::Writer) {
                    Holder::Handed(write) => write,
                    Holder::Failed => {
                        state.holder = Holder::Failed;
                        return io::Error::new(io::ErrorKind::BrokenPipe, "peer link ended");
                    }
                    other => {
                        state.holder = other;
                        continue;
                    }
                }
            };
            let mut buf = Vec::with_capacity(16 * 1024);
            loop {
                std::mem::swap(&mut buf, &mut self.state.lock().pending);
                let written = tokio::select! {
                    written = async {
                        write.write_all(&buf).await?;
                        write.flush().await
                    } => written,
                    _ = self.ended.notified() => {
                        return io::Error::new(io::ErrorKind::BrokenPipe, "peer link ended");
                    }
                };
                buf.clear();
                if let Err(e) = written {
                    self.state.lock().holder = Holder::Failed;
                    return e;
                }
                let mut state = self.state.lock();
                if matches!(state.holder, Holder::Failed) {
                    // A sender ended the outbox meanwhile (`shut`, or too much unwritten).
                    return io::Error::new(io::ErrorKind::BrokenPipe, "peer link ended");
                }
                if state.pending.is_empty() {
                    state.holder = Holder::Idle(write);
                    break;
                }
            }
        }
    }
}

/// Writes `buf` without waiting: how much the socket took, and whether it was all flushed.
fn write_now<W: AsyncWrite + Unpin>(write: &mut W, buf: &[u8]) -> io::Result<(usize, bool)> {
    // A waker nobody listens to: on `Pending` the writer task takes over and polls with its
    // own, which replaces this one in the socket's registration.
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    let mut n = 0;
    while n < buf.len() {
        match Pin::new(&mut *write).poll_write(&mut cx, &buf[n..]) {
            Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(k)) => n += k,
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok((n, false)),
        }
    }
    match Pin::new(&mut *write).poll_flush(&mut cx) {
        Poll::Ready(Ok(())) => Ok((n, true)),
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Ok((n, false)),
    }
}
