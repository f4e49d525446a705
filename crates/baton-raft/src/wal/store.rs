//! The openraft adapter: [`LogStore`] (`RaftLogStorage`, driven by the Raft core task),
//! [`LogReader`] (replication's reads) and [`WalHandle`] (what the node keeps: status,
//! the disk watch's poke, shutdown).
//!
//! # Reclaiming space
//! Purged and truncated entries become dead bytes. When dead bytes reach
//! `max(RECLAIM_MIN_BYTES, live bytes)` the log is rewritten as a new generation (see
//! `wal/writer.rs`) and older generations are deleted. The rewrite copies only live entries
//! (those after the last snapshot), so the file stays below about twice the live log plus
//! `RECLAIM_MIN_BYTES`, and the copying costs at most as many bytes as were reclaimed
//! (amortized write amplification ≤ 2). A rewrite reads the live entries back from the file
//! (checked) to re-encode them; it follows a purge, when few are live.

use std::ops::RangeBounds;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, LogState, OptionalSend, RaftLogReader, StorageIOError};
use parking_lot::{Mutex, RwLock};
use tokio::sync::oneshot;

use super::handoff::{LoopJoin, Sink, WriterStopped};
use super::index::{encode_entries, MemLog, CACHE_BYTES};
use super::reader::fetch;
use super::record::{encode_record, entry_size, RecordRef};
use super::writer::{Durable, Op, WalStats};
use crate::early_append::EarlyAppend;
use crate::files::{self, VOTE_MAGIC};
use crate::types::{LogId, RaftEntry, StorageError, TypeConfig, Vote};

/// Rewrite the log once at least this many bytes are dead (and at least as many as are live).
const RECLAIM_MIN_BYTES: u64 = 4 << 20;

/// Handle to the writer kept by the node, to flush and stop it on shutdown.
pub(crate) struct WalHandle {
    pub(super) sink: Sink,
    pub(super) batch_loop: Mutex<Option<LoopJoin>>,
    pub(crate) stats: Arc<WalStats>,
    /// The in-memory log, read-only here: the committed id written at shutdown and the
    /// size-based snapshot trigger.
    pub(super) mem: Arc<RwLock<MemLog>>,
    /// The writer holds writes back because the file system is full.
    pub(super) stalled: Arc<AtomicBool>,
}

impl WalHandle {
    /// The id of the last entry in the log (appended, flushed or not): what a pre-vote
    /// compares, as a vote does.
    pub(crate) fn last_log_id(&self) -> Option<LogId> {
        self.mem.read().last_log_id()
    }

    /// The last committed index openraft saved (0 before any).
    pub(crate) fn committed_index(&self) -> u64 {
        self.mem.read().committed.map_or(0, |l| l.index)
    }

    /// Whether the writer holds writes back on a full file system (see `Writer::process`).
    pub(crate) fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// Makes a stalled writer try its held-back writes again (the disk watch's tick): an
    /// empty write, which queues behind nothing new and changes nothing.
    pub(crate) fn retry_stalled(&self) {
        if self.stalled() {
            let _ = self.sink.send(Op::Write { bytes: Vec::new() });
        }
    }

    /// Encoded bytes of the in-memory log after `index`.
    pub(crate) fn log_bytes_after(&self, index: Option<u64>) -> u64 {
        self.mem.read().bytes_after(index)
    }

    /// Flushes everything queued, stops the writer's batch loop and waits for it to exit.
    pub(crate) async fn stop(&self) {
        let committed = self.mem.read().committed;
        let mut bytes = Vec::new();
        encode_record(&mut bytes, &RecordRef::Committed(committed));
        let _ = self.sink.send(Op::Write { bytes });
        let (done, rx) = oneshot::channel();
        if self.sink.send(Op::Stop { done }).is_ok() {
            if let Ok(Err(e)) = rx.await {
                tracing::error!(error = %e, "raft log flush at shutdown failed");
            }
        }
        let batch_loop = self.batch_loop.lock().take();
        match batch_loop {
            Some(LoopJoin::Thread(t)) => {
                let _ = tokio::task::spawn_blocking(move || t.join()).await;
            }
            Some(LoopJoin::Task(t)) => {
                let _ = t.await;
            }
            None => {}
        }
    }
}

fn write_err(msg: impl ToString) -> StorageError {
    StorageIOError::write_logs(AnyError::error(msg)).into()
}

/// openraft's log storage. Lives in the Raft core task; all mutation goes through `&mut self`,
/// so the in-memory log and the queued records always agree on order.
pub(crate) struct LogStore {
    pub(super) mem: Arc<RwLock<MemLog>>,
    pub(super) sink: Sink,
    pub(super) generation: u64,
    /// Bytes of the current generation once everything queued is written (mirrors the writer).
    pub(super) file_bytes: u64,
    /// The writer's durable position (see [`Durable`]).
    pub(super) durable: Durable,
    /// A committed id openraft saved that is not yet queued for the file. openraft saves it
    /// after every commit; writing it at once cost a record, a write(2) and a wake-up of the
    /// writer thread per batch. It is optional state (a restart that finds an older one just
    /// applies less before the first election), so it is written in front of the next record
    /// and at shutdown ([`WalHandle::stop`]) instead.
    pub(super) unwritten_committed: Option<Option<LogId>>,
    /// Sends the leader's appends to followers in parallel with its own fsync (see
    /// `early_append`); `None` in tests of the log alone.
    pub(super) early: Option<Arc<EarlyAppend>>,
}

impl From<WriterStopped> for StorageError {
    fn from(_: WriterStopped) -> Self {
        write_err("raft log writer has stopped")
    }
}

impl LogStore {
    /// Makes the leader's appends go to its followers as they are queued (`early_append`).
    pub(crate) fn send_appends_early(&mut self, early: Arc<EarlyAppend>) {
        self.early = Some(early);
    }

    /// Puts the latest committed id, if it changed since it was last written, in front of the
    /// record about to be queued.
    fn encode_unwritten_committed(&mut self, out: &mut Vec<u8>) {
        if let Some(c) = self.unwritten_committed.take() {
            encode_record(out, &RecordRef::Committed(c));
        }
    }

    fn send(&mut self, op: Op) -> Result<(), WriterStopped> {
        self.send_with(op, true)
    }

    fn send_with(&mut self, op: Op, inline_ok: bool) -> Result<(), WriterStopped> {
        self.file_bytes += op.len() as u64;
        self.sink.send_with(op, inline_ok)
    }

    fn record(&mut self, rec: RecordRef<'_>) -> Result<(), LogError> {
        let mut bytes = Vec::new();
        self.encode_unwritten_committed(&mut bytes);
        encode_record(&mut bytes, &rec);
        self.send(Op::Write { bytes })?;
        self.maybe_rewrite()
    }

    /// `append` without openraft's types in the way (tests pass no callback).
    pub(super) fn append_entries(
        &mut self,
        entries: Vec<RaftEntry>,
        callback: Option<LogFlushed<TypeConfig>>,
    ) -> Result<(), LogError> {
        self.append_entries_with(entries, callback, true)
    }

    /// [`LogStore::append_entries`]; `inline_ok: false` keeps the write off the calling task
    /// (see `Sink::send_with`).
    fn append_entries_with(
        &mut self,
        entries: Vec<RaftEntry>,
        callback: Option<LogFlushed<TypeConfig>>,
        inline_ok: bool,
    ) -> Result<(), LogError> {
        if entries.is_empty() {
            if let Some(callback) = callback {
                callback.log_io_completed(Ok(()));
            }
            return Ok(());
        }
        let sizes: Vec<u64> = entries.iter().map(entry_size).collect();
        let mut bytes = Vec::new();
        self.encode_unwritten_committed(&mut bytes);
        let locs = encode_entries(
            &mut bytes,
            &entries,
            &sizes,
            self.generation,
            self.file_bytes,
        );
        let n = entries.len() as u64;
        let located = entries
            .into_iter()
            .zip(sizes)
            .zip(locs)
            .map(|((e, b), l)| (e, b, l))
            .collect();
        self.mem
            .write()
            .append(located, true)
            .map_err(LogError::Write)?;
        self.send_with(
            Op::Append {
                bytes,
                entries: n,
                done: callback,
            },
            inline_ok,
        )?;
        self.maybe_rewrite()?;
        self.evict();
        Ok(())
    }

    /// Appends `entry` before openraft runs (`force`: `--force-new-cluster`'s membership
    /// entry). Like every append it is checksummed and fsynced; nobody waits for it here: the
    /// caller's next `save_vote` is written only after it is durable (`Writer::process`).
    pub(crate) fn append_before_start(&mut self, entry: RaftEntry) -> Result<(), String> {
        self.append_entries(vec![entry], None)
            .map_err(|e| StorageError::from(e).to_string())
    }

    /// Lets the oldest cached entries go once they are durable (see [`MemLog::evict`]).
    pub(super) fn evict(&mut self) {
        let durable = *self.durable.lock();
        let mut mem = self.mem.write();
        if mem.cache_bytes > CACHE_BYTES {
            mem.evict(durable);
        }
    }

    /// Starts a new generation once enough of the file is dead (see the module docs). The
    /// live entries are read back (verified) and re-encoded; this runs right after a purge,
    /// when the live log is short.
    fn maybe_rewrite(&mut self) -> Result<(), LogError> {
        let plan = {
            let mem = self.mem.read();
            let dead = self.file_bytes.saturating_sub(mem.live_bytes);
            if dead < RECLAIM_MIN_BYTES.max(mem.live_bytes) {
                return Ok(());
            }
            mem.plan(..).map_err(LogError::Read)?
        };
        // Only this task changes the log, so it cannot change between the plan and here.
        let entries = fetch(plan).map_err(LogError::Read)?;
        let generation = self.generation + 1;
        let bytes = {
            let mut mem = self.mem.write();
            let (bytes, locs) = mem.encode_generation(generation, &entries);
            mem.relocate(entries, locs);
            bytes
        };
        self.generation = generation;
        let len = bytes.len() as u64;
        self.send(Op::Rewrite { generation, bytes })?;
        // The new generation holds just the rewrite.
        self.file_bytes = len;
        Ok(())
    }
}

/// Errors of the log store's own helpers, kept small (openraft's error is over 200 bytes) and
/// converted at the trait boundary.
pub(super) enum LogError {
    Stopped,
    Read(String),
    Write(String),
}

impl From<WriterStopped> for LogError {
    fn from(_: WriterStopped) -> Self {
        LogError::Stopped
    }
}

impl From<LogError> for StorageError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Stopped => WriterStopped.into(),
            LogError::Read(msg) => read_err(msg),
            LogError::Write(msg) => write_err(msg),
        }
    }
}

fn read_err(msg: impl ToString) -> StorageError {
    StorageIOError::read_logs(AnyError::error(msg)).into()
}

/// Read-only view for openraft's replication tasks.
#[derive(Clone)]
pub(crate) struct LogReader {
    mem: Arc<RwLock<MemLog>>,
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RaftEntry>, StorageError> {
        let plan = self.mem.read().plan(range).map_err(read_err)?;
        fetch(plan).map_err(read_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<RaftEntry>, StorageError> {
        let plan = self.mem.read().plan(range).map_err(read_err)?;
        fetch(plan).map_err(read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let mem = self.mem.read();
        Ok(LogState {
            last_purged_log_id: mem.purged,
            last_log_id: mem.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            mem: self.mem.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let payload = bincode::serialize(vote).expect("votes serialize");
        let bytes = files::encode_framed(VOTE_MAGIC, &payload);
        let (done, rx) = oneshot::channel();
        self.sink.send(Op::SaveVote { bytes, done }).map_err(|_| {
            StorageError::from(StorageIOError::write_vote(AnyError::error(
                "raft log writer has stopped",
            )))
        })?;
        match rx.await {
            Ok(Ok(())) => {
                self.mem.write().vote = Some(*vote);
                Ok(())
            }
            Ok(Err(e)) => Err(StorageIOError::write_vote(AnyError::new(&e)).into()),
            Err(_) => Err(StorageIOError::write_vote(AnyError::error(
                "raft log writer has stopped",
            ))
            .into()),
        }
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.mem.read().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.mem.write().committed = committed;
        // Called after every commit, i.e. soon after the appends became durable.
        self.evict();
        // Not written now: it rides along with the next record (see `unwritten_committed`).
        self.unwritten_committed = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.mem.read().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<RaftEntry> = entries.into_iter().collect();
        let sent_early = self.early.as_ref().is_some_and(|early| {
            let (vote, prev, committed) = {
                let mem = self.mem.read();
                (mem.vote, mem.last_log_id(), mem.committed)
            };
            early.offer(vote, prev, &entries, committed)
        });
        // Entries on their way to followers: the fsync goes to the writer thread so this
        // runtime worker (often the only one) sends them meanwhile instead of blocking in it.
        Ok(self.append_entries_with(entries, Some(callback), !sent_early)?)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.mem
            .write()
            .truncate_since(log_id.index)
            .map_err(write_err)?;
        self.record(RecordRef::TruncateSince(log_id.index))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.mem.write().purge_upto(log_id).map_err(write_err)?;
        self.record(RecordRef::PurgeUpto(log_id))?;
        Ok(())
    }
}
