//! What a replica takes from its environment: the peer network, the wall clock, randomness
//! and the disk's durability. [`Environment::default`] is the real world (TCP, the system
//! clock, OS randomness, the log writer on its own OS thread) and is what `baton serve`
//! uses; a deterministic simulation (`baton-sim`) injects its own so that N members run in
//! one process, on simulated time and network, reproducibly from a seed.
//!
//! Why each hook exists:
//! - **transport**: the peer gRPC service and its client channels are the real tonic code
//!   in every world; only how bytes move (a TCP socket, TLS over one — `baton serve`
//!   injects `baton-server`'s peer TLS transport for `https://` peer URLs — or a simulated
//!   socket) is swapped.
//! - **wall clock**: the leader stamps entries with wall-clock time (`Entry::time_ms`); a
//!   simulated clock makes that reproducible and lets a test jump one member's clock.
//! - **seed**: lease ids, the restart hold and the election timeout are random; seeded,
//!   they are reproducible (the election timeout becomes a fixed per-member value drawn from
//!   the seed instead of openraft's own `thread_rng` draw).
//! - **disk**: the log writer writes its files through [`LogDisk`] and [`LogFile`]; the real
//!   ones are files allocated ahead with zeros and synced with fdatasync(2) (`wal/disk.rs`). An injected disk sits
//!   *below* the real writer, so everything above it — the inline path on the Raft core
//!   task, group commit, the ENOSPC backlog — is the code production runs. It models
//!   durability (a simulated crash drops what was written but not synced) and can be slow.
//!   With one injected, the writer's batch loop runs as a task on the replica's runtime
//!   instead of on its own OS thread (the same loop: `wal/handoff.rs`), because no
//!   simulation controls an OS thread's timing.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::{Channel, Endpoint};

/// A replica's environment; the default is the real one.
#[derive(Clone, Default)]
pub struct Environment {
    /// How peer connections are made and accepted; `None`: plain TCP.
    pub transport: Option<Arc<dyn PeerTransport>>,
    /// The wall clock entries are stamped with; `None`: the system clock.
    pub wall_clock: Option<Arc<dyn WallClock>>,
    /// Seed of this replica's randomness; `None`: OS randomness.
    pub seed: Option<u64>,
    /// The disk under the log writer; `None`: the real one, with the writer's batch loop on
    /// its own OS thread.
    pub disk: Option<Arc<dyn LogDisk>>,
}

impl fmt::Debug for Environment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Environment")
            .field("transport", &self.transport.as_ref().map(|_| "injected"))
            .field("wall_clock", &self.wall_clock.as_ref().map(|_| "injected"))
            .field("seed", &self.seed)
            .field("disk", &self.disk.as_ref().map(|_| "injected"))
            .finish()
    }
}

impl Environment {
    /// Wall-clock milliseconds since the Unix epoch.
    #[allow(clippy::disallowed_methods)] // The seam itself: the real world's clock.
    pub(crate) fn wall_ms(&self) -> u64 {
        match &self.wall_clock {
            Some(c) => c.now_ms(),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// A clock handle for tasks that outlive a borrow of the config.
    pub(crate) fn clock(&self) -> Arc<dyn WallClock> {
        match &self.wall_clock {
            Some(c) => c.clone(),
            None => Arc::new(SystemClock),
        }
    }

    /// This replica's random number generator.
    #[allow(clippy::disallowed_methods)] // The seam itself: the real world's randomness.
    pub(crate) fn rng(&self) -> rand::rngs::StdRng {
        use rand::SeedableRng;
        match self.seed {
            Some(seed) => rand::rngs::StdRng::seed_from_u64(seed),
            None => rand::rngs::StdRng::from_entropy(),
        }
    }
}

/// Wall-clock time in milliseconds since the Unix epoch.
pub trait WallClock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// The system clock.
struct SystemClock;

impl WallClock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The seam itself: the real world's clock.
    fn now_ms(&self) -> u64 {
        Environment::default().wall_ms()
    }
}

/// Accepted peer connections, in order; the sender side is fed by the transport.
pub type PeerIncoming = tokio::sync::mpsc::Receiver<io::Result<PeerIo>>;

/// A future returned by [`PeerTransport::listen`].
pub type ListenFuture = Pin<Box<dyn Future<Output = io::Result<PeerIncoming>> + Send>>;

/// A future returned by [`PeerTransport::dial`]: a connected byte stream to a peer.
pub type DialFuture = Pin<Box<dyn Future<Output = io::Result<Box<dyn PeerStream>>> + Send>>;

/// How peer connections are made and accepted when not over real TCP.
pub trait PeerTransport: Send + Sync + 'static {
    /// A lazily connecting channel for `endpoint` (its URL names the peer).
    fn connect_lazy(&self, endpoint: Endpoint) -> Channel;
    /// Dials the peer at `url` for the peer link (`link`): a byte stream secured as the
    /// URL's scheme asks, as [`PeerTransport::connect_lazy`]'s connections are. `None`: this
    /// transport makes no such streams for that URL, and calls to the peer travel on the
    /// gRPC pipe instead.
    fn dial(&self, _url: &str) -> Option<DialFuture> {
        None
    }
    /// Starts accepting connections on `addr`; fails like a TCP bind would.
    fn listen(&self, addr: SocketAddr) -> ListenFuture;
    /// Why a call failed, in the operator's terms, when the transport knows better than the
    /// status's message (a TLS alert from the peer, say); `None`: nothing to add. A reason
    /// given here is logged at WARN (once per peer until it changes), since it means the
    /// members' configurations disagree rather than that a peer is down.
    fn explain(&self, _status: &tonic::Status) -> Option<String> {
        None
    }
}

/// The disk under the log writer (see the module docs): it opens the log files the writer
/// appends to. Other files (the vote, a rewrite's new generation before it is opened) are
/// written atomically (temporary file, fsync, rename) and are durable once they exist.
pub trait LogDisk: Send + Sync + 'static {
    /// Opens the log file at `path` for writing. Its first `durable` bytes are on disk: it
    /// was recovered at start, or written atomically by a rewrite.
    fn open(&self, path: &Path, durable: u64) -> io::Result<Box<dyn LogFile>>;
    /// How long each batch of the writer's batch loop waits before it is written (a slow
    /// disk); zero for none. Only an injected disk's loop waits (it runs as a task); a real
    /// disk's time is spent in the calls themselves.
    fn latency(&self) -> Duration {
        Duration::ZERO
    }
}

/// One log file opened by a [`LogDisk`]: the four things the log writer does to it.
pub trait LogFile: Send + 'static {
    /// The file's length, space allocated ahead included.
    fn file_len(&self) -> io::Result<u64>;
    /// Allocates `[offset, offset + len)`; the new space reads as zeros and is made durable
    /// by the next [`LogFile::sync`]. `ENOSPC` means the disk is full.
    fn allocate(&mut self, offset: u64, len: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes everything written so far durable (fdatasync(2)) and returns how long that
    /// took: a slow sync sends the next small appends to the batch loop instead of running
    /// them inline (`wal/handoff.rs`).
    fn sync(&mut self) -> io::Result<Duration>;
}

/// Object-safe byte stream of an injected peer connection.
pub trait PeerStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PeerStream for T {}

/// One accepted peer connection of an injected transport.
pub struct PeerIo(pub Box<dyn PeerStream>);

impl tonic::transport::server::Connected for PeerIo {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for PeerIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
