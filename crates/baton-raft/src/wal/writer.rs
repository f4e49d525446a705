//! The writer: owns the open log file and carries out the log's operations in order, each
//! batch with one write and at most one fdatasync, acknowledging appends only after it.
//! Where it runs — inline on the calling task, or in the batch loop on a thread or task — is
//! `wal/handoff.rs`'s business; what it writes to is a [`LogFile`] of the replica's
//! [`LogDisk`] (the real file system, or the simulation's model of one).
//!
//! # Reclaiming space
//! A rewrite (`Op::Rewrite`, decided by the log store) switches to a new generation holding
//! the whole live log: written to a temporary file, fsynced, renamed, directory fsynced, and
//! older generations deleted. Crash-safe at every step, and because a generation appears
//! atomically and complete, recovery never has to stitch several files together.
//!
//! # A full disk, a failed disk
//! `ENOSPC` holds writes back in order (see [`Writer::process`]); any other I/O error makes
//! the writer refuse everything after it (see `Writer::failed`).

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use openraft::storage::LogFlushed;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::dir::{generation_path, list_generations};
use crate::env::{LogDisk, LogFile};
use crate::files;
use crate::space;
use crate::types::TypeConfig;

/// Log files grow in steps of this size, allocated ahead by writing zeros (`wal/disk.rs`
/// says why not fallocate). An fdatasync after an append that grows the file must also make
/// the new file size and its blocks durable; within allocated space it flushes only the
/// data. Measured on this project's machine (ext4): 0.18 ms per append + fdatasync growing
/// the file, 0.11 ms within allocated space — and that fsync is the floor under every
/// acknowledged write.
pub(super) const PREALLOCATE_BYTES: u64 = 1 << 20;

/// Counters shared by the writer, the hand-off and the node (for `status()` and tests).
#[derive(Default)]
pub(crate) struct WalStats {
    pub(crate) fsyncs: AtomicU64,
    pub(crate) file_bytes: AtomicU64,
    /// Bytes written to the log since start (`etcd_disk_wal_write_bytes_total`).
    pub(crate) written_bytes: AtomicU64,
    /// How long the last fdatasync took, in nanoseconds (the hand-off's slow-disk rule).
    pub(crate) last_fsync_nanos: AtomicU64,
    /// Operations carried out inline on the calling task (see `wal/handoff.rs`).
    pub(crate) inline_ops: AtomicU64,
    /// Batches carried out by the batch loop (thread or task), and the operations in them.
    pub(crate) loop_batches: AtomicU64,
    pub(crate) loop_ops: AtomicU64,
}

/// Generation and length of the log file known to be on disk (fsynced): entries within it can
/// be dropped from memory and read back. Written by the writer, read by the log store.
pub(super) type Durable = Arc<Mutex<(u64, u64)>>;

/// Work for the writer thread, processed strictly in order.
pub(super) enum Op {
    Append {
        bytes: Vec<u8>,
        entries: u64,
        /// `None` only in tests (openraft's callback cannot be made outside openraft).
        done: Option<LogFlushed<TypeConfig>>,
    },
    /// A record that needs no acknowledgement (truncate, purge, committed); made durable by
    /// the next fsync, and ordered before every later append.
    Write {
        bytes: Vec<u8>,
    },
    Rewrite {
        generation: u64,
        bytes: Vec<u8>,
    },
    SaveVote {
        bytes: Vec<u8>,
        done: oneshot::Sender<io::Result<()>>,
    },
    /// Flushes, then ends the thread.
    Stop {
        done: oneshot::Sender<io::Result<()>>,
    },
    /// A batch whose write failed with `ENOSPC`, put back in front of the backlog to be
    /// written again (see [`Writer::backlog`]).
    Retry(Pending),
}

impl Op {
    pub(super) fn len(&self) -> usize {
        match self {
            Op::Append { bytes, .. }
            | Op::Write { bytes }
            | Op::Rewrite { bytes, .. }
            | Op::SaveVote { bytes, .. } => bytes.len(),
            Op::Retry(p) => p.buf.len(),
            Op::Stop { .. } => 0,
        }
    }
}

/// Owns the open log file. Runs inline for a lone small operation, else in the batch loop
/// (its own OS thread, because fsync blocks for milliseconds and must not stall the async
/// runtime; a task under simulation): see `wal/handoff.rs`.
pub(super) struct Writer {
    pub(super) wal_dir: PathBuf,
    pub(super) vote_path: PathBuf,
    /// What the log files are opened on.
    pub(super) disk: Arc<dyn LogDisk>,
    /// The current generation's file.
    pub(super) file: Box<dyn LogFile>,
    pub(super) generation: u64,
    /// Where the next record goes: the end of the valid log (the file may extend further,
    /// zero-filled, up to `allocated`).
    pub(super) pos: u64,
    /// The file's length, preallocated space included.
    pub(super) allocated: u64,
    /// Bytes written since the last fsync.
    pub(super) dirty: bool,
    /// Set by the first I/O error; from then on every operation fails. After a failed fsync
    /// the page cache can no longer be trusted to hold what we wrote (PostgreSQL's
    /// "fsyncgate"), so the only safe answer is to stop acknowledging anything.
    pub(super) failed: Option<(io::ErrorKind, String)>,
    pub(super) stats: Arc<WalStats>,
    /// Updated after every fsync and rewrite.
    pub(super) durable: Durable,
    /// Operations not carried out yet because the file system was full, in order; the
    /// first is retried before anything newer (see [`Writer::process`]).
    pub(super) backlog: VecDeque<Op>,
    /// `backlog` is not empty; shared with the hand-off (nothing runs inline meanwhile) and
    /// the disk watch.
    pub(super) stalled: Arc<AtomicBool>,
    /// When the writer last warned about a full disk (at most every `space::LOG_EVERY`).
    pub(super) stall_warned: Option<Instant>,
}

/// What a batch accumulates before its single write + fsync.
#[derive(Default)]
pub(super) struct Pending {
    buf: Vec<u8>,
    appended: Vec<(Option<LogFlushed<TypeConfig>>, u64)>,
}

impl Writer {
    /// Writes one batch of operations (one write and at most one fsync unless the batch
    /// holds a vote or a rewrite); returns whether the writer was told to stop.
    ///
    /// A full file system (`ENOSPC`) is not an error here: the batch that failed goes back
    /// in front of [`Writer::backlog`] with everything after it, nothing of it is
    /// acknowledged, and the next call (new work, or the disk watch's empty poke) tries again
    /// in the same order. The bytes are written again at the same offset, so a partial write
    /// before the failure is simply overwritten. openraft waits for the acknowledgements
    /// meanwhile instead of being handed an error, which would stop its core for good.
    pub(super) fn process(&mut self, batch: Vec<Op>) -> bool {
        self.backlog.extend(batch);
        let mut pending = Pending::default();
        while let Some(op) = self.backlog.pop_front() {
            match op {
                Op::Append {
                    bytes,
                    entries,
                    done,
                } => {
                    pending.buf.extend_from_slice(&bytes);
                    pending.appended.push((done, entries));
                }
                Op::Write { bytes } => pending.buf.extend_from_slice(&bytes),
                Op::Retry(p) => {
                    pending.buf.extend_from_slice(&p.buf);
                    pending.appended.extend(p.appended);
                }
                Op::Stop { done } => {
                    let flushed = self.commit(std::mem::take(&mut pending), true);
                    let res = if flushed {
                        self.check()
                    } else {
                        // Shutting down on a full disk: what is not written was never
                        // acknowledged, and openraft is stopping anyway.
                        Err(io::Error::from_raw_os_error(libc::ENOSPC))
                    };
                    let _ = done.send(res);
                    return true;
                }
                Op::Rewrite { generation, bytes } => {
                    if !self.commit(std::mem::take(&mut pending), false) {
                        self.backlog.insert(1, Op::Rewrite { generation, bytes });
                        return false;
                    }
                    match self.rewrite(generation, &bytes) {
                        Ok(()) => {}
                        Err(e) if space::is_enospc(&e) => {
                            self.stall(&e, Op::Rewrite { generation, bytes });
                            return false;
                        }
                        Err(e) => self.fail(&e),
                    }
                }
                Op::SaveVote { bytes, done } => {
                    // Serialized with the log as openraft requires: earlier appends are made
                    // durable first.
                    if !self.commit(std::mem::take(&mut pending), true) {
                        self.backlog.insert(1, Op::SaveVote { bytes, done });
                        return false;
                    }
                    let res = self
                        .check()
                        .and_then(|()| files::write_atomic(&self.vote_path, &bytes));
                    match res {
                        Err(e) if space::is_enospc(&e) => {
                            self.stall(&e, Op::SaveVote { bytes, done });
                            return false;
                        }
                        Err(e) => {
                            self.fail(&e);
                            let _ = done.send(Err(e));
                        }
                        Ok(()) => {
                            let _ = done.send(Ok(()));
                        }
                    }
                }
            }
        }
        self.commit(pending, false);
        if self.backlog.is_empty() && self.stalled.swap(false, Ordering::AcqRel) {
            tracing::info!("raft log writable again; the writes held back are durable");
        }
        false
    }

    /// Puts `op` back in front of the backlog after `ENOSPC`, marks the writer stalled and
    /// warns (at most every `space::LOG_EVERY`: the disk watch retries every tick).
    #[allow(clippy::disallowed_methods)] // Rate-limits a log line on the writer thread; no deadline.
    fn stall(&mut self, e: &io::Error, op: Op) {
        self.backlog.push_front(op);
        let first = !self.stalled.swap(true, Ordering::AcqRel);
        let now = Instant::now();
        if first
            || self
                .stall_warned
                .is_none_or(|t| now - t >= space::LOG_EVERY)
        {
            self.stall_warned = Some(now);
            tracing::warn!(
                error = %e,
                held_back = self.backlog.len(),
                "raft log cannot grow: the file system is full; holding its writes back \
                 (nothing of them is acknowledged) and retrying until space is freed"
            );
        }
        metrics::counter!("baton_wal_enospc_total").increment(1);
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some((kind, msg)) => Err(io::Error::new(
                *kind,
                format!("raft log unusable after earlier error: {msg}"),
            )),
        }
    }

    fn fail(&mut self, e: &io::Error) {
        if self.failed.is_none() {
            tracing::error!(error = %e, "raft log I/O failed; refusing all further writes");
            self.failed = Some((e.kind(), e.to_string()));
        }
    }

    /// Writes the batch, fsyncs if anyone waits (or `force`), then acknowledges. Returns
    /// `false` if the file system was full: the batch is then back in front of the backlog,
    /// unacknowledged (see [`Writer::process`]).
    pub(super) fn commit(&mut self, p: Pending, force: bool) -> bool {
        let need_sync = force || !p.appended.is_empty();
        if let Err(e) = self.write(&p.buf) {
            if space::is_enospc(&e) {
                self.stall(&e, Op::Retry(p));
                return false;
            }
            self.fail(&e);
        }
        // A failed fsync stays fatal, ENOSPC or not: after it the page cache no longer
        // tells what is on disk (see `failed`). Writes go to preallocated space, so a full
        // file system shows up at the allocation, above, not here.
        let res = self.check().and_then(|()| {
            if need_sync && self.dirty {
                self.fsync()
            } else {
                Ok(())
            }
        });
        if let Err(e) = &res {
            self.fail(e);
        }
        for (done, n) in p.appended {
            match &res {
                Ok(()) => {
                    cached_counter!("baton_wal_appended_entries_total").increment(n);
                    if let Some(done) = done {
                        done.log_io_completed(Ok(()));
                    }
                }
                Err(e) => {
                    if let Some(done) = done {
                        done.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())))
                    }
                }
            }
        }
        true
    }

    fn write(&mut self, buf: &[u8]) -> io::Result<()> {
        self.check()?;
        if buf.is_empty() {
            return Ok(());
        }
        let end = self.pos + buf.len() as u64;
        if end > self.allocated {
            self.preallocate(end)?;
        }
        self.file.write_at(self.pos, buf)?;
        self.pos = end;
        self.dirty = true;
        self.stats
            .file_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.stats
            .written_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Allocates the file through `end` and a step beyond (see [`PREALLOCATE_BYTES`]). The new
    /// space reads as zeros, which recovery recognizes as the end of the log. Made durable by
    /// the fsync that follows the write needing it.
    fn preallocate(&mut self, end: u64) -> io::Result<()> {
        let target = (end / PREALLOCATE_BYTES + 1) * PREALLOCATE_BYTES;
        let Err(e) = self.file.allocate(self.allocated, target - self.allocated) else {
            self.allocated = target;
            return Ok(());
        };
        if space::is_enospc(&e) && end > self.allocated {
            // No room for a whole step: allocate just what this write needs, so the last
            // megabyte of a nearly full disk still takes deletes and the alarm.
            if self
                .file
                .allocate(self.allocated, end - self.allocated)
                .is_ok()
            {
                self.allocated = end;
                return Ok(());
            }
        }
        Err(e)
    }

    fn fsync(&mut self) -> io::Result<()> {
        let took = self.file.sync()?;
        self.stats.last_fsync_nanos.store(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        cached_histogram!("baton_wal_fsync_seconds").record(took.as_secs_f64());
        cached_histogram!("etcd_disk_wal_fsync_duration_seconds").record(took.as_secs_f64());
        cached_counter!("baton_wal_fsyncs_total").increment(1);
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.dirty = false;
        *self.durable.lock() = (self.generation, self.pos);
        Ok(())
    }

    /// Switches to a new generation holding `bytes` (the whole live log), then deletes the old
    /// ones. Crash-safe at every step: until the rename the old generation is the newest, after
    /// it the new one is, and each is complete in itself.
    fn rewrite(&mut self, generation: u64, bytes: &[u8]) -> io::Result<()> {
        self.check()?;
        assert!(generation > self.generation, "log generations only grow");
        let path = generation_path(&self.wal_dir, generation);
        files::write_atomic(&path, bytes)?;
        self.stats
            .written_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        cached_counter!("baton_wal_fsyncs_total").increment(1);
        self.file = self.disk.open(&path, bytes.len() as u64)?;
        self.generation = generation;
        self.pos = bytes.len() as u64;
        self.allocated = self.pos;
        self.dirty = false;
        self.stats
            .file_bytes
            .store(bytes.len() as u64, Ordering::Relaxed);
        for g in list_generations(&self.wal_dir)? {
            if g < generation {
                fs::remove_file(generation_path(&self.wal_dir, g))?;
            }
        }
        files::fsync_dir(&self.wal_dir)?;
        *self.durable.lock() = (generation, self.pos);
        Ok(())
    }
}
