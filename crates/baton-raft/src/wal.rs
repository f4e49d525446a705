//! The Raft log on disk: a checksummed append-only file with group commit.
//!
//! # Layout
//! `data_dir/raft/wal/<generation:016x>.wal`. Each file is a sequence of records
//! `[len u32 LE][crc32(len ‖ payload) u32 LE][payload = bincode(Record)]`. A generation starts
//! with a `FormatVersion` record (see below), then a `GenerationStart` record (purge point
//! and committed id) followed by every
//! not-yet-purged entry, so **the newest generation alone describes the whole log**; it is then
//! extended with `Entries`, `TruncateSince`, `PurgeUpto` and `Committed` records. The file is
//! allocated ahead in [`PREALLOCATE_BYTES`] steps, so the records are followed by zeros (an
//! all-zero header is never a valid record: its CRC does not match).
//!
//! # Format version
//! The first record of every generation written by this code is `FormatVersion(2)`
//! ([`WAL_FORMAT_VERSION`]). A generation that starts with `GenerationStart` instead was
//! written before versions existed: format 1, whose records are the same, read as they are.
//! Such a generation is extended with records as usual and carries a version only once a
//! rewrite replaces it. Recovery refuses a generation whose version is above what this binary
//! knows (`StartError::UnsupportedLogFormat`, naming both) instead of misreading it. So the
//! version record's encoding is the one thing every future format keeps: `Record` tag 5 and a
//! `u32`, as the very first record. (A binary from before versions meets tag 5 at offset 0
//! and refuses the file as a bad generation header: a downgrade is refused, never misread.)
//! The record types themselves follow `baton_core::format` and are pinned by
//! `tests::golden_records`.
//!
//! # Reclaiming space
//! Purged and truncated entries become dead bytes. When dead bytes reach
//! `max(RECLAIM_MIN_BYTES, live bytes)` the log is rewritten as a new generation (written to a
//! temporary file, fsynced, renamed, directory fsynced) and older generations are deleted. The
//! rewrite copies only live entries (those after the last snapshot), so the file stays below
//! about twice the live log plus `RECLAIM_MIN_BYTES`, and the copying costs at most as many
//! bytes as were reclaimed (amortized write amplification ≤ 2). A rewrite reads the live entries
//! back from the file (checked) to re-encode them; it follows a purge, when few are live. Because a generation appears
//! atomically and complete, recovery never has to stitch several files together.
//!
//! # What stays in memory
//! Per entry only its id, size and position (generation, record offset and length, slot in
//! the record); the entries themselves only while they are among the newest
//! ([`CACHE_BYTES`]) or not yet durable. Older entries (a lagging follower's replication, the
//! re-apply after a restart) are read back from the file, and every record read back is
//! checked like recovery checks it (length, CRC, decoding, the expected entry id). Durable
//! bytes of a generation are never overwritten (records are only appended, and a rewrite
//! writes a new file), and a reader holds an open handle, so a location stays valid for as
//! long as its entry is live. A rewrite moves every live entry into the new generation: they
//! are kept in memory until that generation is durable, then read from it.
//!
//! # Group commit
//! `append` updates the in-memory log (readable at once, as openraft requires), encodes the
//! records and hands them with openraft's `LogFlushed` callback to one writer thread. The
//! thread drains everything queued, writes it with one `write`, issues one `fdatasync`, and
//! only then acknowledges every callback. A small append with nothing queued ahead of it is
//! written and fsynced right away on the calling task instead (see `INLINE_MAX_BYTES`: for a
//! lone writer the two thread hand-offs cost more than the thread saves). Note that openraft
//! 0.9 waits for each append's callback before issuing the next append, so on the leader this
//! queue rarely holds more than one append; proposals share fsyncs because the `proposer`
//! packs concurrent commands into one entry. The writer-side batching still matters for
//! records that need no acknowledgement (truncate, purge) and becomes effective as is with an
//! openraft that pipelines log I/O (0.10).
//!
//! # Recovery
//! Records are verified one by one; the log ends where only zeros follow (preallocated space,
//! reused by the next writes). A bad record (short, implausible length, CRC mismatch,
//! undecodable) with no valid record anywhere after it is a torn tail from a crash mid-write:
//! it is cut off with a warning (nothing in it was ever acknowledged, since acknowledgement
//! follows fsync; a bit flip inside the very last record is indistinguishable from a torn
//! write and is treated as one, as etcd's WAL does). A bad record followed by a valid one, or records describing an impossible
//! log (index gaps, terms going backwards, purges going backwards), mean the file is corrupt:
//! start is refused with `StartError::CorruptLog`. Serving a log with a hole would be worse.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{AnyError, LogState, OptionalSend, RaftLogReader, StorageIOError};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::env::DiskHooks;
use crate::files::{self, VOTE_MAGIC};
use crate::space;
use crate::types::{LogId, RaftEntry, StorageError, TypeConfig, Vote};
use crate::StartError;

const RECORD_HEADER_BYTES: usize = 8;
/// No record is bigger: a length above this is corruption, not data. An entry is at most
/// `MAX_REQUEST_BYTES` (1.5 MiB) plus overhead, and entries records are split well below this.
const MAX_RECORD_BYTES: usize = 64 << 20;
/// Entries records are split at about this size so one huge append does not make one huge
/// record: recovery reads records whole, and so does reading one entry back (which decodes
/// its whole record), so a rewrite packing thousands of entries per record would make every
/// single-entry read decode them all.
const RECORD_TARGET_BYTES: u64 = 256 << 10;
/// Rewrite the log once at least this many bytes are dead (and at least as many as are live).
const RECLAIM_MIN_BYTES: u64 = 4 << 20;
/// Log files grow in steps of this size, allocated ahead with fallocate(2). An fdatasync
/// after an append that grows the file must also make the new file size durable (a journal
/// commit); within allocated space it flushes only the data. Measured on this project's
/// machine (ext4): 0.18 ms per append + fdatasync growing the file, 0.11 ms within allocated
/// space — and that fsync is the floor under every acknowledged write.
const PREALLOCATE_BYTES: u64 = 1 << 20;
/// Bounds on one group-commit batch, so a flood of appends cannot starve acknowledgements.
const MAX_BATCH_OPS: usize = 4096;
const MAX_BATCH_BYTES: usize = 32 << 20;

/// The log format this binary writes (see the module docs): 1 = generations without a
/// version record (before versions existed), 2 = a `FormatVersion` record first. Bump it when
/// a record changes in a way an older binary would misread.
pub(crate) const WAL_FORMAT_VERSION: u32 = 2;
/// The format of a generation that starts without a version record.
const WAL_FORMAT_UNVERSIONED: u32 = 1;

/// What a record says. Decoding side; see [`RecordRef`] for the encoding side. Persisted:
/// variants append-only (`baton_core::format`).
#[derive(Deserialize)]
enum Record {
    /// First record of every generation: the log is empty after `purged`.
    GenerationStart {
        purged: Option<LogId>,
        committed: Option<LogId>,
    },
    /// Consecutive entries appended after the current last one.
    Entries(Vec<RaftEntry>),
    /// Entries with index `>=` this are removed (a follower's conflicting suffix).
    TruncateSince(u64),
    /// Entries up to and including this id are removed (covered by a snapshot).
    PurgeUpto(LogId),
    /// openraft's committed pointer (optional state; lets a restart apply before an election).
    Committed(Option<LogId>),
    /// The generation's log format ([`WAL_FORMAT_VERSION`]); only ever its very first record,
    /// before `GenerationStart`. Absent in format 1.
    FormatVersion(u32),
}

/// Encoding twin of [`Record`] that borrows the entries. Same variants in the same order, so
/// bincode produces identical bytes (a unit test checks).
#[derive(Debug, Serialize)]
enum RecordRef<'a> {
    GenerationStart {
        purged: Option<LogId>,
        committed: Option<LogId>,
    },
    Entries(&'a [RaftEntry]),
    TruncateSince(u64),
    PurgeUpto(LogId),
    Committed(Option<LogId>),
    FormatVersion(u32),
}

fn record_crc(len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends one framed record to `out`.
fn encode_record(out: &mut Vec<u8>, rec: &RecordRef<'_>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_BYTES]);
    bincode::serialize_into(&mut *out, rec).expect("log records always serialize");
    let len = (out.len() - start - RECORD_HEADER_BYTES) as u32;
    let crc = record_crc(len, &out[start + RECORD_HEADER_BYTES..]);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Encodes entries as one or more `Entries` records of about `RECORD_TARGET_BYTES` each and
/// returns where each entry lands, given that `out[0]` will be at offset `base` of
/// `generation`.
fn encode_entries(
    out: &mut Vec<u8>,
    entries: &[RaftEntry],
    sizes: &[u64],
    generation: u64,
    base: u64,
) -> Vec<Loc> {
    debug_assert_eq!(entries.len(), sizes.len());
    let mut locs = Vec::with_capacity(entries.len());
    let mut start = 0;
    while start < entries.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < entries.len() && (end == start || bytes + sizes[end] <= RECORD_TARGET_BYTES) {
            bytes += sizes[end];
            end += 1;
        }
        let offset = out.len();
        encode_record(out, &RecordRef::Entries(&entries[start..end]));
        let len = u32::try_from(out.len() - offset).expect("records are far below 4 GiB");
        locs.extend((0..end - start).map(|slot| Loc {
            generation,
            offset: base + offset as u64,
            len,
            slot: slot as u32,
        }));
        start = end;
    }
    locs
}

/// Parses the record at `pos`: the record and the offset after it, or why it is not valid.
fn parse_record(bytes: &[u8], pos: usize) -> Result<(Record, usize), String> {
    let rest = &bytes[pos..];
    if rest.len() < RECORD_HEADER_BYTES {
        return Err(format!("truncated record header ({} bytes)", rest.len()));
    }
    let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    // Length 0 is never written (every payload has an enum tag); rejecting it matters because
    // a zero-filled tail (preallocated or lost pages) would otherwise parse as valid records.
    if len == 0 || len as usize > MAX_RECORD_BYTES {
        return Err(format!("implausible record length {len}"));
    }
    let end = RECORD_HEADER_BYTES + len as usize;
    if rest.len() < end {
        return Err(format!(
            "truncated record: {len} bytes announced, {} present",
            rest.len() - RECORD_HEADER_BYTES
        ));
    }
    let payload = &rest[RECORD_HEADER_BYTES..end];
    if record_crc(len, payload) != crc {
        return Err("record checksum mismatch".into());
    }
    let rec = bincode::deserialize(payload).map_err(|e| format!("undecodable record: {e}"))?;
    Ok((rec, pos + end))
}

/// The first offset at or after `from` where a valid record starts, if any. Only used after a
/// bad record, to tell a torn tail (nothing valid follows) from corruption in the middle.
fn find_valid_record_after(bytes: &[u8], from: usize) -> Option<usize> {
    (from..bytes.len().saturating_sub(RECORD_HEADER_BYTES))
        .find(|&off| parse_record(bytes, off).is_ok())
}

/// Where an entry's bytes are on disk: slot `slot` of the `Entries` record that starts at
/// `offset` in generation `generation` and is `len` bytes long (header included). Reading an
/// entry back reads and CRC-checks that whole record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    generation: u64,
    offset: u64,
    len: u32,
    slot: u32,
}

/// What the log keeps in memory of every entry: its id, its encoded size (for the dead/live
/// byte accounting and the snapshot trigger) and where it is on disk.
#[derive(Clone, Copy, Debug)]
struct Meta {
    log_id: LogId,
    bytes: u64,
    loc: Loc,
}

/// The most recent entries kept decoded, beyond those not yet durable: openraft reads every
/// entry back right after appending it (to apply it, and on a leader to replicate it), so the
/// newest entries are served from memory and only older ones (a lagging follower, a restart's
/// re-apply) come from the file. Counted in encoded bytes.
const CACHE_BYTES: u64 = 1 << 20;

/// The log as openraft sees it. Every entry after the purge point has a [`Meta`] in memory;
/// the entries themselves are kept only while they are among the newest (see
/// [`CACHE_BYTES`]) or not yet durable, and are otherwise read back from the log file (with
/// their record's checksum verified). Before this the whole log since the last snapshot was
/// held decoded — a second copy of every value written since (about 25 MB of the 92 MB RSS at
/// 100k keys of 256 B, and as much as the store itself once the snapshot trigger, which grows
/// with the snapshot, let the log grow to hundreds of MB at 1M keys).
#[derive(Default)]
pub(crate) struct MemLog {
    /// One per entry, consecutive indexes from `first_index()`.
    metas: VecDeque<Meta>,
    /// The entries of the last `cache.len()` metas (always a suffix of the log), decoded.
    cache: VecDeque<RaftEntry>,
    /// Sum of `Meta::bytes` over the cached entries.
    cache_bytes: u64,
    purged: Option<LogId>,
    committed: Option<LogId>,
    vote: Option<Vote>,
    /// Sum of `Meta::bytes`.
    live_bytes: u64,
    /// Where the generation files are; read handles are opened on demand.
    wal_dir: PathBuf,
    /// Read handles of the generations that metas point into. A reader clones the handle it
    /// needs, so a generation deleted by a rewrite meanwhile stays readable through it.
    files: BTreeMap<u64, Arc<File>>,
}

/// How `read` gets one entry: from memory or from a record on disk.
enum Source {
    Cached(RaftEntry),
    Disk {
        file: Arc<File>,
        loc: Loc,
        log_id: LogId,
    },
}

impl MemLog {
    pub(crate) fn last_log_id(&self) -> Option<LogId> {
        self.metas.back().map(|m| m.log_id).or(self.purged)
    }

    fn first_index(&self) -> u64 {
        self.purged.map_or(0, |p| p.index + 1)
    }

    fn next_index(&self) -> u64 {
        self.first_index() + self.metas.len() as u64
    }

    fn meta(&self, index: u64) -> Option<&Meta> {
        let pos = index.checked_sub(self.first_index())?;
        self.metas.get(usize::try_from(pos).ok()?)
    }

    /// Index of the first cached entry.
    fn cache_first(&self) -> u64 {
        self.next_index() - self.cache.len() as u64
    }

    pub(crate) fn purged_index(&self) -> Option<u64> {
        self.purged.map(|p| p.index)
    }

    /// Encoded bytes of the entries after `index` (of all of them for `None`).
    pub(crate) fn bytes_after(&self, index: Option<u64>) -> u64 {
        let from = index
            .map_or(0, |i| i + 1)
            .saturating_sub(self.first_index());
        let from = usize::try_from(from).unwrap_or(usize::MAX);
        self.metas.iter().skip(from).map(|m| m.bytes).sum()
    }

    pub(crate) fn is_pristine(&self) -> bool {
        self.metas.is_empty() && self.purged.is_none() && self.vote.is_none()
    }

    fn reset(&mut self, purged: Option<LogId>, committed: Option<LogId>) {
        self.metas.clear();
        self.cache.clear();
        self.cache_bytes = 0;
        self.live_bytes = 0;
        self.purged = purged;
        self.committed = committed;
    }

    /// Appends consecutive entries; refuses gaps, overlaps and terms going backwards (openraft
    /// truncates explicitly before overwriting, so an overlap here is a bug or corruption).
    /// `cached` entries are also kept in memory (appends: they are not durable yet); recovered
    /// ones are not (they are in the file).
    fn append(&mut self, entries: Vec<(RaftEntry, u64, Loc)>, cached: bool) -> Result<(), String> {
        for (entry, bytes, loc) in entries {
            let id = entry.log_id;
            let expected = self.next_index();
            if id.index != expected {
                return Err(format!("entry {id} where index {expected} was expected"));
            }
            if let Some(last) = self.last_log_id() {
                if id.leader_id.term < last.leader_id.term {
                    return Err(format!(
                        "entry {id} has a lower term than the previous entry {last}"
                    ));
                }
            }
            self.live_bytes += bytes;
            self.metas.push_back(Meta {
                log_id: id,
                bytes,
                loc,
            });
            if cached {
                self.cache_bytes += bytes;
                self.cache.push_back(entry);
            } else {
                // The cache stays a suffix of the log.
                self.cache.clear();
                self.cache_bytes = 0;
            }
        }
        Ok(())
    }

    fn truncate_since(&mut self, index: u64) -> Result<(), String> {
        let first_kept = self.first_index();
        if index < first_kept || index > self.next_index() {
            return Err(format!(
                "truncate at {index} outside the log [{first_kept}, {})",
                self.next_index()
            ));
        }
        while self.next_index() > index {
            let cached = !self.cache.is_empty();
            let m = self.metas.pop_back().expect("index below next_index");
            self.live_bytes -= m.bytes;
            if cached {
                self.cache.pop_back();
                self.cache_bytes -= m.bytes;
            }
        }
        Ok(())
    }

    fn purge_upto(&mut self, id: LogId) -> Result<(), String> {
        if let Some(p) = self.purged {
            if id.index < p.index {
                return Err(format!(
                    "purge to {id} goes back before the previous purge {p}"
                ));
            }
        }
        if let Some(m) = self.meta(id.index) {
            if m.log_id != id {
                return Err(format!("purge to {id} but the entry there is {}", m.log_id));
            }
        }
        while self
            .metas
            .front()
            .is_some_and(|m| m.log_id.index <= id.index)
        {
            let cached = self.cache.len() == self.metas.len();
            let m = self.metas.pop_front().expect("checked");
            self.live_bytes -= m.bytes;
            if cached {
                self.cache.pop_front();
                self.cache_bytes -= m.bytes;
            }
        }
        self.purged = Some(id);
        Ok(())
    }

    /// Replays one record found at `offset` (`len` bytes) of generation `generation`.
    fn apply(&mut self, rec: Record, generation: u64, offset: u64, len: u32) -> Result<(), String> {
        match rec {
            Record::GenerationStart { purged, committed } => self.reset(purged, committed),
            Record::Entries(v) => {
                let located = v
                    .into_iter()
                    .enumerate()
                    .map(|(slot, e)| {
                        let bytes = entry_size(&e);
                        let loc = Loc {
                            generation,
                            offset,
                            len,
                            slot: slot as u32,
                        };
                        (e, bytes, loc)
                    })
                    .collect();
                self.append(located, false)?;
            }
            Record::TruncateSince(i) => self.truncate_since(i)?,
            Record::PurgeUpto(id) => self.purge_upto(id)?,
            Record::Committed(c) => self.committed = c,
            Record::FormatVersion(v) => {
                return Err(format!(
                    "a format version record ({v}) after the start of the generation"
                ))
            }
        }
        Ok(())
    }

    /// A committed pointer only means something if it names an entry we hold (or purged).
    /// After a crash it could in principle name an entry whose record did not survive; then
    /// forget it and let openraft recommit (committed is optional state).
    fn sanitize_committed(&mut self) {
        let Some(c) = self.committed else { return };
        let ok = match self.meta(c.index) {
            Some(m) => m.log_id == c,
            None => self.purged.is_some_and(|p| c.index <= p.index),
        };
        if !ok {
            tracing::warn!(committed = %c, "dropping saved committed id not backed by the log");
            self.committed = None;
        }
    }

    /// The read handle of `generation`, opened on first use.
    fn file(&mut self, generation: u64) -> io::Result<Arc<File>> {
        if let Some(f) = self.files.get(&generation) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(generation_path(&self.wal_dir, generation))?);
        self.files.insert(generation, f.clone());
        Ok(f)
    }

    /// Drops the oldest cached entries beyond [`CACHE_BYTES`], as far as they are durable
    /// (`durable` = generation and length of the file known to be on disk): an entry leaves
    /// memory only once it can be read back.
    fn evict(&mut self, durable: (u64, u64)) {
        while self.cache_bytes > CACHE_BYTES {
            let first = self.cache_first();
            let m = *self.meta(first).expect("cached entries have metas");
            let loc = m.loc;
            if loc.generation != durable.0 || loc.offset + u64::from(loc.len) > durable.1 {
                return;
            }
            if let Err(e) = self.file(loc.generation) {
                tracing::warn!(error = %e, "cannot open the raft log for reading; keeping entries in memory");
                return;
            }
            self.cache.pop_front();
            self.cache_bytes -= m.bytes;
        }
    }

    /// How to get the entries in `range`: cached ones cloned, the others as disk locations.
    /// Cheap; the disk reads happen in [`fetch`], outside any lock.
    fn plan(&self, range: impl RangeBounds<u64>) -> Result<Vec<Source>, String> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        }
        .max(self.first_index());
        let end = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        }
        .min(self.next_index());
        let cache_first = self.cache_first();
        let mut out = Vec::with_capacity(end.saturating_sub(start).min(4096) as usize);
        for index in start..end {
            if index >= cache_first {
                out.push(Source::Cached(
                    self.cache[(index - cache_first) as usize].clone(),
                ));
            } else {
                let m = self.meta(index).expect("index inside the log");
                let file = self.files.get(&m.loc.generation).cloned().ok_or_else(|| {
                    format!(
                        "entry {} is neither in memory nor in an open log file",
                        m.log_id
                    )
                })?;
                out.push(Source::Disk {
                    file,
                    loc: m.loc,
                    log_id: m.log_id,
                });
            }
        }
        Ok(out)
    }

    /// The entries in `range` (those after the purge point and up to the last entry).
    #[cfg(test)]
    fn read(&self, range: impl RangeBounds<u64>) -> Result<Vec<RaftEntry>, String> {
        fetch(self.plan(range)?)
    }

    /// Encodes a fresh generation: format version, header, then `entries` (every live entry,
    /// in order), with where each entry lands in it.
    fn encode_generation(&self, generation: u64, entries: &[RaftEntry]) -> (Vec<u8>, Vec<Loc>) {
        debug_assert_eq!(entries.len(), self.metas.len());
        let mut out = Vec::with_capacity(self.live_bytes as usize + 4096);
        encode_record(&mut out, &RecordRef::FormatVersion(WAL_FORMAT_VERSION));
        encode_record(
            &mut out,
            &RecordRef::GenerationStart {
                purged: self.purged,
                committed: self.committed,
            },
        );
        let sizes: Vec<u64> = self.metas.iter().map(|m| m.bytes).collect();
        let locs = encode_entries(&mut out, entries, &sizes, generation, 0);
        (out, locs)
    }

    /// After a rewrite into `generation`: every entry is now at `locs` there, and all of them
    /// are kept in memory until that generation is durable (it is written by the writer
    /// thread; until then the file is not there to read).
    fn relocate(&mut self, entries: Vec<RaftEntry>, locs: Vec<Loc>) {
        debug_assert_eq!(locs.len(), self.metas.len());
        for (m, loc) in self.metas.iter_mut().zip(locs) {
            m.loc = loc;
        }
        self.cache = entries.into();
        self.cache_bytes = self.live_bytes;
        // No meta points into older generations any more; readers that hold one of these
        // handles keep their (possibly deleted) file readable until they are done.
        self.files.clear();
    }
}

/// Reads the planned entries: cached ones as they are, the others from their records, each
/// record read once per call and checked (length, CRC, decodable, the expected entry).
fn fetch(plan: Vec<Source>) -> Result<Vec<RaftEntry>, String> {
    let mut out = Vec::with_capacity(plan.len());
    // The last record read: (file, offset) and its entries.
    let mut current: Option<((*const File, u64), Vec<RaftEntry>)> = None;
    for source in plan {
        let (file, loc, log_id) = match source {
            Source::Cached(e) => {
                out.push(e);
                continue;
            }
            Source::Disk { file, loc, log_id } => (file, loc, log_id),
        };
        let key = (Arc::as_ptr(&file), loc.offset);
        if current.as_ref().map(|c| c.0) != Some(key) {
            let entries = read_entries_record(&file, loc)?;
            current = Some((key, entries));
        }
        let entries = &current.as_ref().expect("just set").1;
        let entry = entries.get(loc.slot as usize).ok_or_else(|| {
            format!(
                "log record at offset {} holds {} entries, entry {log_id} expected in slot {}",
                loc.offset,
                entries.len(),
                loc.slot
            )
        })?;
        if entry.log_id != log_id {
            return Err(format!(
                "log record at offset {} holds entry {} where {log_id} was expected",
                loc.offset, entry.log_id
            ));
        }
        out.push(entry.clone());
    }
    Ok(out)
}

/// Reads the `Entries` record at `loc` and verifies it like recovery does (length, CRC,
/// decoding).
fn read_entries_record(file: &File, loc: Loc) -> Result<Vec<RaftEntry>, String> {
    let mut buf = vec![0u8; loc.len as usize];
    file.read_exact_at(&mut buf, loc.offset)
        .map_err(|e| format!("reading the log record at offset {}: {e}", loc.offset))?;
    match parse_record(&buf, 0) {
        Ok((Record::Entries(v), end)) if end == buf.len() => Ok(v),
        Ok(_) => Err(format!(
            "the log record at offset {} is not the entries record expected",
            loc.offset
        )),
        Err(reason) => Err(format!(
            "corrupt log record at offset {}: {reason}",
            loc.offset
        )),
    }
}

fn entry_size(e: &RaftEntry) -> u64 {
    bincode::serialized_size(e).expect("log entries always serialize")
}

fn generation_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{generation:016x}.wal"))
}

fn parse_generation(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Generation numbers of the `.wal` files in `dir`, ascending; removes leftover temporaries
/// of an interrupted rewrite (they were never renamed into place, so they hold nothing needed).
fn list_generations(dir: &Path) -> io::Result<Vec<u64>> {
    let mut gens = Vec::new();
    for ent in fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            fs::remove_file(ent.path())?;
        } else if let Some(g) = parse_generation(&name) {
            gens.push(g);
        }
    }
    gens.sort_unstable();
    Ok(gens)
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The log recovered from disk, ready to be served.
pub(crate) struct Recovered {
    pub(crate) mem: MemLog,
    generation: u64,
    file_len: u64,
}

/// Reads the vote file and the newest log generation (see the module docs for the rules).
pub(crate) fn recover(raft_dir: &Path) -> Result<Recovered, StartError> {
    let wal_dir = raft_dir.join("wal");
    fs::create_dir_all(&wal_dir).map_err(io_err(&wal_dir))?;

    let mut mem = MemLog {
        wal_dir: wal_dir.clone(),
        ..MemLog::default()
    };
    let vote_path = raft_dir.join("vote");
    if let Some(res) = files::read_framed(&vote_path, VOTE_MAGIC).map_err(io_err(&vote_path))? {
        let payload = res.map_err(|reason| StartError::CorruptLog {
            path: vote_path.clone(),
            offset: 0,
            reason,
        })?;
        let vote = bincode::deserialize(&payload).map_err(|e| StartError::CorruptLog {
            path: vote_path.clone(),
            offset: 0,
            reason: format!("undecodable vote: {e}"),
        })?;
        mem.vote = Some(vote);
    }

    let gens = list_generations(&wal_dir).map_err(io_err(&wal_dir))?;
    let Some(&newest) = gens.last() else {
        let path = generation_path(&wal_dir, 1);
        let (bytes, _) = mem.encode_generation(1, &[]);
        files::write_atomic(&path, &bytes).map_err(io_err(&path))?;
        return Ok(Recovered {
            mem,
            generation: 1,
            file_len: bytes.len() as u64,
        });
    };

    let path = generation_path(&wal_dir, newest);
    let bytes = fs::read(&path).map_err(io_err(&path))?;
    let corrupt = |offset: usize, reason: String| StartError::CorruptLog {
        path: path.clone(),
        offset: offset as u64,
        reason,
    };
    if bytes.is_empty() {
        return Err(corrupt(
            0,
            "empty log file (generations are created complete)".into(),
        ));
    }
    let mut pos = 0;
    // Where `GenerationStart` must be: first, or right after a format version record.
    let mut header_at = 0;
    let mut format = WAL_FORMAT_UNVERSIONED;
    while pos < bytes.len() {
        match parse_record(&bytes, pos) {
            Ok((Record::FormatVersion(v), next)) if pos == 0 => {
                if v > WAL_FORMAT_VERSION {
                    return Err(StartError::UnsupportedLogFormat {
                        path: path.clone(),
                        found: v,
                        supported: WAL_FORMAT_VERSION,
                    });
                }
                if v <= WAL_FORMAT_UNVERSIONED {
                    return Err(corrupt(0, format!("format version {v} is never written")));
                }
                format = v;
                header_at = next;
                pos = next;
            }
            Ok((rec, next)) => {
                let is_start = matches!(rec, Record::GenerationStart { .. });
                if (pos == header_at) != is_start {
                    return Err(corrupt(pos, "generation header misplaced".into()));
                }
                let len = u32::try_from(next - pos).expect("records are below MAX_RECORD_BYTES");
                mem.apply(rec, newest, pos as u64, len)
                    .map_err(|reason| corrupt(pos, format!("impossible log: {reason}")))?;
                pos = next;
            }
            Err(reason) if pos <= header_at => {
                // The header is written with the whole file before the rename, so it cannot be
                // torn by a crash.
                return Err(corrupt(pos, format!("bad generation header: {reason}")));
            }
            Err(_) if bytes[pos..].iter().all(|&b| b == 0) => {
                // Preallocated space (see `PREALLOCATE_BYTES`), or a crash before anything of
                // the next record reached it: the log ends here. Kept for the next writes.
                break;
            }
            Err(reason) => {
                if let Some(valid) = find_valid_record_after(&bytes, pos + 1) {
                    return Err(corrupt(
                        pos,
                        format!("{reason}, yet a valid record follows at offset {valid}"),
                    ));
                }
                tracing::warn!(
                    path = %path.display(),
                    offset = pos,
                    dropped_bytes = bytes.len() - pos,
                    %reason,
                    "torn tail in the raft log (crash during a write); truncating it"
                );
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err(&path))?;
                f.set_len(pos as u64).map_err(io_err(&path))?;
                f.sync_all().map_err(io_err(&path))?;
                break;
            }
        }
    }
    if header_at > 0 && pos == header_at {
        return Err(corrupt(
            pos,
            "a format version record and no generation header".into(),
        ));
    }
    if format == WAL_FORMAT_UNVERSIONED {
        tracing::info!(
            path = %path.display(),
            "raft log generation of format 1 (written before format versions); read as is, \
             its next rewrite writes format {WAL_FORMAT_VERSION}"
        );
    }
    mem.sanitize_committed();
    // Entries are read back from this file from now on; it is only ever appended to (and
    // replaced as a whole by a rewrite), so what was read here stays valid.
    mem.file(newest).map_err(io_err(&path))?;

    // Older generations are superseded by the newest one's header; they only survive a crash
    // between a rewrite's rename and its cleanup.
    for g in gens.iter().filter(|&&g| g < newest) {
        let old = generation_path(&wal_dir, *g);
        fs::remove_file(&old).map_err(io_err(&old))?;
    }
    files::fsync_dir(&wal_dir).map_err(io_err(&wal_dir))?;
    Ok(Recovered {
        mem,
        generation: newest,
        file_len: pos as u64,
    })
}

/// Counters shared by the writer thread and the node (for `status()` and tests).
#[derive(Default)]
pub(crate) struct WalStats {
    pub(crate) fsyncs: AtomicU64,
    pub(crate) file_bytes: AtomicU64,
}

/// Generation and length of the log file known to be on disk (fsynced): entries within it can
/// be dropped from memory and read back. Written by the writer, read by the log store.
type Durable = Arc<Mutex<(u64, u64)>>;

/// Work for the writer thread, processed strictly in order.
enum Op {
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
    fn len(&self) -> usize {
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

/// Owns the open log file. Runs on its own OS thread because fsync blocks for milliseconds and
/// must not stall the async runtime.
struct Writer {
    wal_dir: PathBuf,
    vote_path: PathBuf,
    file: File,
    generation: u64,
    /// Where the next record goes: the end of the valid log (the file may extend further,
    /// zero-filled, up to `allocated`).
    pos: u64,
    /// The file's length, preallocated space included; `u64::MAX` once the filesystem has
    /// refused fallocate (the file then just grows with each write).
    allocated: u64,
    /// Bytes written since the last fsync.
    dirty: bool,
    /// Set by the first I/O error; from then on every operation fails. After a failed fsync
    /// the page cache can no longer be trusted to hold what we wrote (PostgreSQL's
    /// "fsyncgate"), so the only safe answer is to stop acknowledging anything.
    failed: Option<(io::ErrorKind, String)>,
    stats: Arc<WalStats>,
    /// Shared with [`SharedWriter::disk_slow`].
    disk_slow: Arc<AtomicBool>,
    /// Injected durability hooks (simulation); see `crate::env`.
    hooks: Option<Arc<dyn DiskHooks>>,
    /// Updated after every fsync and rewrite.
    durable: Durable,
    /// Operations not carried out yet because the file system was full, in order; the
    /// first is retried before anything newer (see [`Writer::process`]).
    backlog: VecDeque<Op>,
    /// `backlog` is not empty; shared with [`SharedWriter::stalled`] and the disk watch.
    stalled: Arc<AtomicBool>,
    /// When the writer last warned about a full disk (at most every `space::LOG_EVERY`).
    stall_warned: Option<Instant>,
}

/// What a batch accumulates before its single write + fsync.
#[derive(Default)]
pub(crate) struct Pending {
    buf: Vec<u8>,
    appended: Vec<(Option<LogFlushed<TypeConfig>>, u64)>,
}

/// The first operation and whatever is queued behind it, up to the batch bounds.
fn drain(first: Op, rx: &mut mpsc::UnboundedReceiver<Op>) -> Vec<Op> {
    let mut bytes = first.len();
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH_OPS && bytes < MAX_BATCH_BYTES {
        match rx.try_recv() {
            Ok(op) => {
                bytes += op.len();
                batch.push(op);
            }
            Err(_) => break,
        }
    }
    batch
}

/// The writer thread's loop. The writer itself sits behind a lock shared with [`Sink`], which
/// may run small operations on the caller's thread while nothing is queued.
fn run_thread(shared: Arc<SharedWriter>, mut rx: mpsc::UnboundedReceiver<Op>) {
    while let Some(first) = rx.blocking_recv() {
        let batch = drain(first, &mut rx);
        let n = batch.len();
        let mut guard = shared.writer.lock();
        let stopped = guard.as_mut().is_none_or(|w| w.process(batch));
        // Under the lock, so a caller that sees zero knows nothing is queued ahead of it.
        shared.queued.fetch_sub(n, Ordering::AcqRel);
        if stopped {
            *guard = None;
            return;
        }
    }
    // Every sender is gone (node dropped without shutdown): make what we have durable.
    if let Some(w) = shared.writer.lock().as_mut() {
        w.commit(Pending::default(), true);
    }
}

impl Writer {
    /// The same loop as a task on the replica's runtime (injected disk hooks), so that a
    /// simulation schedules it like everything else; a slow disk delays each batch.
    async fn run_task(mut self, mut rx: mpsc::UnboundedReceiver<Op>) {
        while let Some(first) = rx.recv().await {
            let batch = drain(first, &mut rx);
            let delay = self
                .hooks
                .as_ref()
                .map_or(Duration::ZERO, |h| h.fsync_delay());
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if self.process(batch) {
                return;
            }
        }
        self.commit(Pending::default(), true);
    }

    /// Writes one batch of operations (one write and at most one fsync unless the batch
    /// holds a vote or a rewrite); returns whether the writer was told to stop.
    ///
    /// A full file system (`ENOSPC`) is not an error here: the batch that failed goes back
    /// in front of [`Writer::backlog`] with everything after it, nothing of it is
    /// acknowledged, and the next call (new work, or the disk watch's empty poke) tries again
    /// in the same order. The bytes are written again at the same offset, so a partial write
    /// before the failure is simply overwritten. openraft waits for the acknowledgements
    /// meanwhile instead of being handed an error, which would stop its core for good.
    fn process(&mut self, batch: Vec<Op>) -> bool {
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

    /// Tells the hooks (if any) that the current generation is durable through its end.
    fn report_synced(&self) {
        if let Some(h) = &self.hooks {
            h.synced(
                &generation_path(&self.wal_dir, self.generation),
                self.stats.file_bytes.load(Ordering::Relaxed),
            );
        }
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
    fn commit(&mut self, p: Pending, force: bool) -> bool {
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
        // file system shows up at fallocate, above, not here.
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
                    metrics::counter!("baton_wal_appended_entries_total").increment(n);
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
        self.file.write_all_at(buf, self.pos)?;
        self.pos = end;
        self.dirty = true;
        self.stats
            .file_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Allocates the file through `end` and a step beyond (see [`PREALLOCATE_BYTES`]). The new
    /// space reads as zeros, which recovery recognizes as the end of the log. Made durable by
    /// the fsync that follows the write needing it.
    fn preallocate(&mut self, end: u64) -> io::Result<()> {
        let target = (end / PREALLOCATE_BYTES + 1) * PREALLOCATE_BYTES;
        let len = target - self.allocated;
        // SAFETY: plain syscall on a file descriptor we own, no pointers involved.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                0,
                self.allocated as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            self.allocated = target;
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if space::is_enospc(&e) && end > self.allocated {
            // No room for a whole step: allocate just what this write needs, so the last
            // megabyte of a nearly full disk still takes deletes and the alarm.
            // SAFETY: as above.
            let rc = unsafe {
                libc::fallocate(
                    self.file.as_raw_fd(),
                    0,
                    self.allocated as libc::off_t,
                    (end - self.allocated) as libc::off_t,
                )
            };
            if rc == 0 {
                self.allocated = end;
                return Ok(());
            }
        }
        match e.raw_os_error() {
            // Not supported here (some filesystems): fall back to growing with each write.
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => {
                tracing::info!(error = %e, "fallocate unsupported; the raft log grows per write");
                self.allocated = u64::MAX;
                Ok(())
            }
            _ => Err(e),
        }
    }

    #[allow(clippy::disallowed_methods)] // Measures the real disk (the 2 ms inline rule), no deadline.
    fn fsync(&mut self) -> io::Result<()> {
        let t = Instant::now();
        self.file.sync_data()?;
        self.disk_slow
            .store(t.elapsed() > INLINE_MAX_FSYNC, Ordering::Relaxed);
        metrics::histogram!("baton_wal_fsync_seconds").record(t.elapsed().as_secs_f64());
        metrics::counter!("baton_wal_fsyncs_total").increment(1);
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.dirty = false;
        *self.durable.lock() = (self.generation, self.pos);
        self.report_synced();
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
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("baton_wal_fsyncs_total").increment(1);
        self.file = OpenOptions::new().write(true).open(&path)?;
        self.generation = generation;
        self.pos = bytes.len() as u64;
        if self.allocated != u64::MAX {
            self.allocated = self.pos;
        }
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
        self.report_synced();
        Ok(())
    }
}

/// Handle to the writer thread kept by the node, to flush and stop it on shutdown.
pub(crate) struct WalHandle {
    sink: Sink,
    thread: Mutex<Option<WriterJoin>>,
    pub(crate) stats: Arc<WalStats>,
    /// The in-memory log, read-only here: the committed id written at shutdown and the
    /// size-based snapshot trigger.
    mem: Arc<RwLock<MemLog>>,
    /// The writer holds writes back because the file system is full.
    stalled: Arc<AtomicBool>,
}

impl WalHandle {
    /// The id of the last entry in the log (appended, flushed or not): what a pre-vote
    /// compares, as a vote does.
    pub(crate) fn last_log_id(&self) -> Option<LogId> {
        self.mem.read().last_log_id()
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

    /// Flushes everything queued, stops the writer thread and waits for it to exit.
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
        let thread = self.thread.lock().take();
        match thread {
            Some(WriterJoin::Thread(t)) => {
                let _ = tokio::task::spawn_blocking(move || t.join()).await;
            }
            Some(WriterJoin::Task(t)) => {
                let _ = t.await;
            }
            None => {}
        }
    }
}

/// Appends up to this size are written and fsynced on the caller's thread (the Raft core
/// task) when nothing is queued for the writer thread; bigger ones go to the thread.
///
/// Why both: handing an append to the thread and its acknowledgement back costs two
/// cross-thread wake-ups, which on this project's 2-vCPU machine were a fifth of a lone
/// client's put latency (p50 0.40 → 0.33 ms inline; etcd 0.38–0.40 ms). Under load the
/// proposer packs many commands into each entry, appends get big, and blocking a runtime
/// worker for the fsync would idle a core the requests need, so those keep the thread. The
/// bound is a few commands' worth: at 8 KiB, 50 lock contenders' batches (≈5 KiB) went
/// inline and held the runtime's only worker through every fsync.
const INLINE_MAX_BYTES: usize = 2 << 10;
/// ... and only while the disk is quick: after an fsync slower than this, appends go to the
/// writer thread until one is quick again, so a stalling disk stalls Raft, not the runtime
/// worker that also serves reads, keep-alives and heartbeats.
const INLINE_MAX_FSYNC: Duration = Duration::from_millis(2);

/// The writer as shared by its thread and [`Sink`]; `None` once stopped.
struct SharedWriter {
    writer: Mutex<Option<Writer>>,
    /// Operations sent to the thread and not yet processed.
    queued: AtomicUsize,
    /// The last fsync took longer than [`INLINE_MAX_FSYNC`].
    disk_slow: Arc<AtomicBool>,
    /// The writer holds writes back on a full disk: nothing runs inline (a retry must not
    /// happen on the Raft core task, and order needs the backlog first).
    stalled: Arc<AtomicBool>,
}

/// How operations reach the writer: queued for its thread (or task), or carried out at once.
/// Order is preserved: an operation runs inline only when nothing is queued ahead of it.
#[derive(Clone)]
struct Sink {
    tx: mpsc::UnboundedSender<Op>,
    /// `None` for a writer task (simulation): everything is queued.
    inline: Option<Arc<SharedWriter>>,
}

impl Sink {
    fn send(&self, op: Op) -> Result<(), WriterStopped> {
        let Some(shared) = &self.inline else {
            return self.tx.send(op).map_err(|_| WriterStopped);
        };
        let small = matches!(
            op,
            Op::Append { .. } | Op::Write { .. } | Op::SaveVote { .. }
        ) && op.len() <= INLINE_MAX_BYTES;
        if small
            && shared.queued.load(Ordering::Acquire) == 0
            && !shared.disk_slow.load(Ordering::Relaxed)
            && !shared.stalled.load(Ordering::Acquire)
        {
            let mut guard = shared.writer.lock();
            if shared.queued.load(Ordering::Acquire) == 0 {
                let w = guard.as_mut().ok_or(WriterStopped)?;
                if w.process(vec![op]) {
                    *guard = None;
                }
                return Ok(());
            }
        }
        shared.queued.fetch_add(1, Ordering::AcqRel);
        self.tx.send(op).map_err(|_| {
            shared.queued.fetch_sub(1, Ordering::AcqRel);
            WriterStopped
        })
    }
}

/// Where the writer runs: its own OS thread, or a task (injected disk hooks).
enum WriterJoin {
    Thread(std::thread::JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

/// Starts the writer thread on the recovered log; returns the store openraft drives and the
/// node's handle. With disk hooks the writer is a task instead, and the recovered file is
/// reported durable as it is.
pub(crate) fn open(
    raft_dir: &Path,
    rec: Recovered,
    hooks: Option<Arc<dyn DiskHooks>>,
) -> Result<(LogStore, WalHandle), StartError> {
    let wal_dir = raft_dir.join("wal");
    let path = generation_path(&wal_dir, rec.generation);
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    // Preallocated space left from before the restart is reused (it reads as zeros).
    let allocated = file
        .metadata()
        .map_err(io_err(&path))?
        .len()
        .max(rec.file_len);
    let stats = Arc::new(WalStats::default());
    stats.file_bytes.store(rec.file_len, Ordering::Relaxed);
    let writer = Writer {
        wal_dir,
        vote_path: raft_dir.join("vote"),
        file,
        generation: rec.generation,
        pos: rec.file_len,
        allocated,
        dirty: false,
        failed: None,
        stats: stats.clone(),
        disk_slow: Arc::new(AtomicBool::new(false)),
        hooks,
        durable: Arc::new(Mutex::new((rec.generation, rec.file_len))),
        backlog: VecDeque::new(),
        stalled: Arc::new(AtomicBool::new(false)),
        stall_warned: None,
    };
    let stalled = writer.stalled.clone();
    let durable = writer.durable.clone();
    let (tx, rx) = mpsc::unbounded_channel();
    let (sink, thread) = if writer.hooks.is_some() {
        writer.report_synced();
        let task = tokio::spawn(writer.run_task(rx));
        (Sink { tx, inline: None }, WriterJoin::Task(task))
    } else {
        let shared = Arc::new(SharedWriter {
            disk_slow: writer.disk_slow.clone(),
            stalled: writer.stalled.clone(),
            writer: Mutex::new(Some(writer)),
            queued: AtomicUsize::new(0),
        });
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("baton-wal".into())
            .spawn(move || run_thread(for_thread, rx))
            .map_err(io_err(raft_dir))?;
        (
            Sink {
                tx,
                inline: Some(shared),
            },
            WriterJoin::Thread(thread),
        )
    };
    let mem = Arc::new(RwLock::new(rec.mem));
    let store = LogStore {
        mem: mem.clone(),
        sink: sink.clone(),
        generation: rec.generation,
        file_bytes: rec.file_len,
        durable,
        unwritten_committed: None,
    };
    Ok((
        store,
        WalHandle {
            sink,
            mem,
            thread: Mutex::new(Some(thread)),
            stats,
            stalled,
        },
    ))
}

fn write_err(msg: impl ToString) -> StorageError {
    StorageIOError::write_logs(AnyError::error(msg)).into()
}

/// openraft's log storage. Lives in the Raft core task; all mutation goes through `&mut self`,
/// so the in-memory log and the queued records always agree on order.
pub(crate) struct LogStore {
    mem: Arc<RwLock<MemLog>>,
    sink: Sink,
    generation: u64,
    /// Bytes of the current generation once everything queued is written (mirrors the writer).
    file_bytes: u64,
    /// The writer's durable position (see [`Durable`]).
    durable: Durable,
    /// A committed id openraft saved that is not yet queued for the file. openraft saves it
    /// after every commit; writing it at once cost a record, a write(2) and a wake-up of the
    /// writer thread per batch. It is optional state (a restart that finds an older one just
    /// applies less before the first election), so it is written in front of the next record
    /// and at shutdown ([`WalHandle::stop`]) instead.
    unwritten_committed: Option<Option<LogId>>,
}

/// The writer thread is gone (it stopped after shutdown); kept small so helpers stay cheap to
/// return, converted to openraft's error at the trait boundary.
struct WriterStopped;

impl From<WriterStopped> for StorageError {
    fn from(_: WriterStopped) -> Self {
        write_err("raft log writer has stopped")
    }
}

impl LogStore {
    /// Puts the latest committed id, if it changed since it was last written, in front of the
    /// record about to be queued.
    fn encode_unwritten_committed(&mut self, out: &mut Vec<u8>) {
        if let Some(c) = self.unwritten_committed.take() {
            encode_record(out, &RecordRef::Committed(c));
        }
    }

    fn send(&mut self, op: Op) -> Result<(), WriterStopped> {
        self.file_bytes += op.len() as u64;
        self.sink.send(op)
    }

    fn record(&mut self, rec: RecordRef<'_>) -> Result<(), LogError> {
        let mut bytes = Vec::new();
        self.encode_unwritten_committed(&mut bytes);
        encode_record(&mut bytes, &rec);
        self.send(Op::Write { bytes })?;
        self.maybe_rewrite()
    }

    /// `append` without openraft's types in the way (tests pass no callback).
    fn append_entries(
        &mut self,
        entries: Vec<RaftEntry>,
        callback: Option<LogFlushed<TypeConfig>>,
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
        self.send(Op::Append {
            bytes,
            entries: n,
            done: callback,
        })?;
        self.maybe_rewrite()?;
        self.evict();
        Ok(())
    }

    /// Lets the oldest cached entries go once they are durable (see [`MemLog::evict`]).
    fn evict(&mut self) {
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
enum LogError {
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
        Ok(self.append_entries(entries.into_iter().collect(), Some(callback))?)
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

#[cfg(test)]
mod tests {
    use baton_core::Command;
    use openraft::{EntryPayload, LeaderId};

    use super::*;
    use crate::types::Request;

    fn entry(term: u64, index: u64) -> RaftEntry {
        RaftEntry {
            log_id: LogId::new(LeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Request {
                time_ms: index,
                commands: vec![Command::Noop],
            }),
        }
    }

    fn file(records: &[RecordRef<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for r in records {
            encode_record(&mut out, r);
        }
        out
    }

    fn recover_bytes(bytes: &[u8]) -> (tempfile::TempDir, Result<Recovered, StartError>) {
        let tmp = tempfile::tempdir().unwrap();
        let wal = tmp.path().join("wal");
        fs::create_dir_all(&wal).unwrap();
        fs::write(generation_path(&wal, 3), bytes).unwrap();
        let res = recover(tmp.path());
        (tmp, res)
    }

    const START: RecordRef<'static> = RecordRef::GenerationStart {
        purged: None,
        committed: None,
    };

    fn as_ref(r: &Record) -> RecordRef<'_> {
        match r {
            Record::GenerationStart { purged, committed } => RecordRef::GenerationStart {
                purged: *purged,
                committed: *committed,
            },
            Record::Entries(v) => RecordRef::Entries(v),
            Record::TruncateSince(i) => RecordRef::TruncateSince(*i),
            Record::PurgeUpto(id) => RecordRef::PurgeUpto(*id),
            Record::Committed(c) => RecordRef::Committed(*c),
            Record::FormatVersion(v) => RecordRef::FormatVersion(*v),
        }
    }

    /// Golden bytes of every record kind as written to disk, framing included (see
    /// `crate::golden` and `baton_core::format`): a data directory holds these bytes, so
    /// none may change. Each file is parsed back like recovery parses it and encoded again.
    #[test]
    fn golden_records() {
        use crate::golden::{
            assert_no_problems, compare_file, entries, golden_dir, header, log_id,
            missing_variants, orphans,
        };
        use baton_core::format::variant_tag;
        use std::collections::BTreeSet;

        let es = entries();
        let samples = [
            RecordRef::GenerationStart {
                purged: Some(log_id(1, 3)),
                committed: Some(log_id(2, 9)),
            },
            RecordRef::Entries(&es),
            RecordRef::TruncateSince(12),
            RecordRef::PurgeUpto(log_id(1, 4)),
            RecordRef::Committed(Some(log_id(2, 10))),
            RecordRef::FormatVersion(WAL_FORMAT_VERSION),
        ];
        let dir = golden_dir("wal_record");
        let (mut problems, mut tags, mut names) = (Vec::new(), BTreeSet::new(), BTreeSet::new());
        for rec in &samples {
            let name = match rec {
                RecordRef::GenerationStart { .. } => "generation_start",
                RecordRef::Entries(_) => "entries",
                RecordRef::TruncateSince(_) => "truncate_since",
                RecordRef::PurgeUpto(_) => "purge_upto",
                RecordRef::Committed(_) => "committed",
                RecordRef::FormatVersion(_) => "format_version",
            };
            names.insert(name);
            let bytes = file(std::slice::from_ref(rec));
            tags.insert(variant_tag(&bytes[RECORD_HEADER_BYTES..]));
            let what = "[len u32 LE][crc32 u32 LE][bincode(Record)], as wal.rs writes it";
            let h = header("wal_record", name, what, rec);
            problems.extend(compare_file(&dir, name, &h, &bytes));
            match parse_record(&bytes, 0) {
                Ok((back, end)) if end == bytes.len() && file(&[as_ref(&back)]) == bytes => {}
                Ok(_) => problems.push(format!("wal_record/{name}: does not decode to itself")),
                Err(e) => problems.push(format!("wal_record/{name}: {e}")),
            }
        }
        problems.extend(missing_variants::<Record>("wal_record", &tags));
        problems.extend(orphans(&dir, &names));
        assert_no_problems(problems);
    }

    #[test]
    fn encoding_twins_agree() {
        let es = vec![entry(1, 0), entry(1, 1)];
        let bytes = file(&[
            START,
            RecordRef::Entries(&es),
            RecordRef::PurgeUpto(es[0].log_id),
            RecordRef::TruncateSince(1),
        ]);
        let (r0, p) = parse_record(&bytes, 0).unwrap();
        assert!(matches!(
            r0,
            Record::GenerationStart {
                purged: None,
                committed: None
            }
        ));
        let (r1, p) = parse_record(&bytes, p).unwrap();
        assert!(matches!(r1, Record::Entries(v) if v == es));
        let (r2, p) = parse_record(&bytes, p).unwrap();
        assert!(matches!(r2, Record::PurgeUpto(id) if id == es[0].log_id));
        let (r3, p) = parse_record(&bytes, p).unwrap();
        assert!(matches!(r3, Record::TruncateSince(1)));
        assert_eq!(p, bytes.len());
    }

    /// A generation written before format versions (it starts with `GenerationStart`, as
    /// every test above writes it) is format 1 and read as is; a new generation starts with
    /// the version record.
    #[test]
    fn new_generations_carry_the_format_version_and_old_ones_still_open() {
        let old = file(&[START, RecordRef::Entries(&[entry(1, 0)])]);
        let (_tmp, res) = recover_bytes(&old);
        assert_eq!(res.unwrap().mem.read(..).unwrap(), vec![entry(1, 0)]);

        let tmp = tempfile::tempdir().unwrap();
        recover(tmp.path()).unwrap();
        let bytes = fs::read(generation_path(&tmp.path().join("wal"), 1)).unwrap();
        let (first, next) = parse_record(&bytes, 0).unwrap();
        assert!(matches!(first, Record::FormatVersion(WAL_FORMAT_VERSION)));
        let (second, _) = parse_record(&bytes, next).unwrap();
        assert!(matches!(second, Record::GenerationStart { .. }));
        // And it opens again.
        assert!(recover(tmp.path())
            .unwrap()
            .mem
            .read(..)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_newer_log_format_is_refused_naming_both_versions() {
        let newer = file(&[
            RecordRef::FormatVersion(WAL_FORMAT_VERSION + 1),
            START,
            RecordRef::Entries(&[entry(1, 0)]),
        ]);
        let (_tmp, res) = recover_bytes(&newer);
        let err = res.err().expect("a newer format is refused");
        assert!(
            matches!(
                err,
                StartError::UnsupportedLogFormat { found, supported, .. }
                    if found == WAL_FORMAT_VERSION + 1 && supported == WAL_FORMAT_VERSION
            ),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("log format 3") && message.contains("up to 2"),
            "{message}"
        );
    }

    #[test]
    fn a_misplaced_or_impossible_format_version_is_corruption() {
        for bytes in [
            // Not first.
            file(&[START, RecordRef::FormatVersion(WAL_FORMAT_VERSION)]),
            // First, but not followed by the header.
            file(&[
                RecordRef::FormatVersion(WAL_FORMAT_VERSION),
                RecordRef::Entries(&[entry(1, 0)]),
            ]),
            // Nothing after it.
            file(&[RecordRef::FormatVersion(WAL_FORMAT_VERSION)]),
            // Format 1 has no version record.
            file(&[RecordRef::FormatVersion(1), START]),
        ] {
            let (_tmp, res) = recover_bytes(&bytes);
            assert!(
                matches!(res, Err(StartError::CorruptLog { .. })),
                "accepted a misplaced format version"
            );
        }
    }

    #[test]
    fn replay_applies_truncate_and_purge() {
        let a = vec![entry(1, 0), entry(1, 1), entry(1, 2)];
        let b = vec![entry(2, 2), entry(2, 3)];
        let bytes = file(&[
            START,
            RecordRef::Entries(&a),
            RecordRef::TruncateSince(2),
            RecordRef::Entries(&b),
            RecordRef::PurgeUpto(a[1].log_id),
            RecordRef::Committed(Some(b[0].log_id)),
        ]);
        let (_tmp, res) = recover_bytes(&bytes);
        let rec = res.unwrap();
        assert_eq!(rec.mem.purged, Some(a[1].log_id));
        assert_eq!(rec.mem.last_log_id(), Some(b[1].log_id));
        assert_eq!(rec.mem.committed, Some(b[0].log_id));
        assert_eq!(rec.mem.read(..).unwrap(), b);
        assert_eq!(rec.file_len, bytes.len() as u64);
    }

    #[test]
    fn impossible_sequences_are_corruption() {
        let gap = file(&[
            START,
            RecordRef::Entries(&[entry(1, 0)]),
            RecordRef::Entries(&[entry(1, 2)]),
        ]);
        let backwards = file(&[
            START,
            RecordRef::Entries(&[entry(2, 0)]),
            RecordRef::Entries(&[entry(1, 1)]),
        ]);
        let no_header = file(&[RecordRef::Entries(&[entry(1, 0)])]);
        let purge_back = file(&[
            START,
            RecordRef::Entries(&[entry(1, 0), entry(1, 1)]),
            RecordRef::PurgeUpto(entry(1, 1).log_id),
            RecordRef::PurgeUpto(entry(1, 0).log_id),
        ]);
        for bytes in [gap, backwards, no_header, purge_back] {
            let (_tmp, res) = recover_bytes(&bytes);
            assert!(
                matches!(res, Err(StartError::CorruptLog { .. })),
                "accepted an impossible log"
            );
        }
    }

    #[test]
    fn torn_tail_versus_corruption() {
        let es: Vec<RaftEntry> = (0..50).map(|i| entry(1, i)).collect();
        let good = file(&[START, RecordRef::Entries(&es[..25])]);
        let mut full = good.clone();
        encode_record(&mut full, &RecordRef::Entries(&es[25..]));

        // Every strict prefix of the last record is a torn tail: cut off, first records kept.
        for cut in [
            good.len() + 1,
            good.len() + 7,
            good.len() + 9,
            full.len() - 1,
        ] {
            let (tmp, res) = recover_bytes(&full[..cut]);
            let rec = res.unwrap();
            assert_eq!(rec.mem.read(..).unwrap(), es[..25].to_vec(), "cut at {cut}");
            assert_eq!(rec.file_len, good.len() as u64);
            let on_disk = fs::metadata(generation_path(&tmp.path().join("wal"), 3))
                .unwrap()
                .len();
            assert_eq!(
                on_disk,
                good.len() as u64,
                "torn tail not truncated on disk"
            );
        }
        // A flipped bit in the last record with nothing after it is indistinguishable from a
        // torn write, and nothing in it was acknowledged.
        let mut flipped_last = full.clone();
        *flipped_last.last_mut().unwrap() ^= 1;
        let (_tmp, res) = recover_bytes(&flipped_last);
        assert_eq!(res.unwrap().mem.read(..).unwrap().len(), 25);
        // The same flip in the first entries record, with a valid record after it, is not.
        let mut flipped_mid = full.clone();
        flipped_mid[good.len() - 5] ^= 1;
        let (_tmp, res) = recover_bytes(&flipped_mid);
        match res {
            Err(StartError::CorruptLog { offset, .. }) => {
                assert!(offset > 0 && offset < good.len() as u64)
            }
            _ => panic!("mid-log corruption accepted"),
        }
    }

    #[test]
    fn zero_filled_tail_is_torn_not_records() {
        let mut bytes = file(&[START, RecordRef::Entries(&[entry(1, 0)])]);
        let len = bytes.len();
        bytes.extend_from_slice(&[0u8; 4096]);
        let (_tmp, res) = recover_bytes(&bytes);
        let rec = res.unwrap();
        assert_eq!(rec.file_len, len as u64);
        assert_eq!(rec.mem.read(..).unwrap().len(), 1);
    }

    /// Writes `range` as one Entries record each through a writer opened on `raft_dir`.
    async fn write_entries(raft_dir: &Path, range: std::ops::Range<u64>) {
        let rec = recover(raft_dir).unwrap();
        let (_store, wal) = open(raft_dir, rec, None).unwrap();
        for i in range {
            let mut bytes = Vec::new();
            encode_record(&mut bytes, &RecordRef::Entries(&[entry(1, i)]));
            wal.sink.send(Op::Write { bytes }).ok().unwrap();
        }
        wal.stop().await;
    }

    #[tokio::test]
    async fn preallocated_space_is_reused_and_never_read_as_records() {
        let tmp = tempfile::tempdir().unwrap();
        let raft_dir = tmp.path();
        write_entries(raft_dir, 0..50).await;
        let path = generation_path(&raft_dir.join("wal"), 1);
        let allocated = fs::metadata(&path).unwrap().len();
        assert_eq!(
            allocated % PREALLOCATE_BYTES,
            0,
            "file grows in whole steps"
        );
        let rec = recover(raft_dir).unwrap();
        assert_eq!(rec.mem.read(..).unwrap().len(), 50);
        assert!(rec.file_len < allocated, "the zero tail is not log");
        // A restart appends at the end of the log, not at the end of the file, and keeps the
        // allocation.
        write_entries(raft_dir, 50..60).await;
        assert_eq!(fs::metadata(&path).unwrap().len(), allocated);
        let rec = recover(raft_dir).unwrap();
        let indexes: Vec<u64> = rec
            .mem
            .read(..)
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect();
        assert_eq!(indexes, (0..60).collect::<Vec<_>>());
    }

    #[test]
    fn torn_record_inside_preallocated_space_is_cut() {
        let good = file(&[START, RecordRef::Entries(&[entry(1, 0)])]);
        let mut bytes = good.clone();
        let torn = file(&[RecordRef::Entries(&[entry(1, 1)])]);
        bytes.extend_from_slice(&torn[..torn.len() / 2]);
        bytes.extend_from_slice(&[0u8; 4096]);
        let (_tmp, res) = recover_bytes(&bytes);
        let rec = res.unwrap();
        assert_eq!(rec.file_len, good.len() as u64);
        assert_eq!(rec.mem.read(..).unwrap().len(), 1);
    }

    #[test]
    fn newest_generation_wins_and_older_are_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        let wal = tmp.path().join("wal");
        fs::create_dir_all(&wal).unwrap();
        fs::write(
            generation_path(&wal, 1),
            file(&[START, RecordRef::Entries(&[entry(1, 0)])]),
        )
        .unwrap();
        let purged = entry(1, 0).log_id;
        let newer = file(&[
            RecordRef::GenerationStart {
                purged: Some(purged),
                committed: None,
            },
            RecordRef::Entries(&[entry(1, 1)]),
        ]);
        fs::write(generation_path(&wal, 2), &newer).unwrap();
        fs::write(wal.join("0000000000000003.wal.tmp"), b"half a rewrite").unwrap();
        let rec = recover(tmp.path()).unwrap();
        assert_eq!(rec.generation, 2);
        assert_eq!(rec.mem.purged, Some(purged));
        assert_eq!(rec.mem.read(..).unwrap(), vec![entry(1, 1)]);
        let left: Vec<_> = fs::read_dir(&wal)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("0000000000000002.wal")]);
    }

    #[test]
    fn rewrite_keeps_exactly_the_live_log() {
        let mut mem = MemLog::default();
        let es: Vec<RaftEntry> = (0..10).map(|i| entry(1, i)).collect();
        let sizes: Vec<u64> = es.iter().map(entry_size).collect();
        let locs = encode_entries(&mut Vec::new(), &es, &sizes, 1, 0);
        mem.append(
            es.iter()
                .cloned()
                .zip(sizes)
                .zip(locs)
                .map(|((e, b), l)| (e, b, l))
                .collect(),
            true,
        )
        .unwrap();
        mem.purge_upto(es[5].log_id).unwrap();
        mem.committed = Some(es[7].log_id);
        let (bytes, _) = mem.encode_generation(3, &mem.read(..).unwrap());
        let (_tmp, res) = recover_bytes(&bytes);
        let rec = res.unwrap();
        assert_eq!(rec.mem.read(..).unwrap(), es[6..].to_vec());
        assert_eq!(rec.mem.purged, Some(es[5].log_id));
        assert_eq!(rec.mem.committed, Some(es[7].log_id));
        assert_eq!(rec.mem.live_bytes, mem.live_bytes);
    }

    /// An entry with a `value_len`-byte put, so a few thousand of them exceed the cache.
    fn big_entry(term: u64, index: u64, value_len: usize) -> RaftEntry {
        RaftEntry {
            log_id: LogId::new(LeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Request {
                time_ms: index,
                commands: vec![Command::Put(baton_core::PutRequest {
                    key: format!("k{index}").into_bytes(),
                    value: vec![index as u8; value_len],
                    ..Default::default()
                })],
            }),
        }
    }

    /// Appends through the log store as openraft would (one entry per append), then waits
    /// until all of it is durable (a vote is saved after every earlier append) and lets the
    /// cache shrink.
    async fn append_durably(store: &mut LogStore, entries: &[RaftEntry]) {
        for e in entries {
            store.append_entries(vec![e.clone()], None).ok().unwrap();
        }
        store.save_vote(&Vote::new(1, 1)).await.expect("vote saved");
        store.evict();
    }

    async fn all_entries(store: &mut LogStore) -> Vec<RaftEntry> {
        store.try_get_log_entries(..).await.ok().unwrap()
    }

    /// The on-disk positions the log store knows.
    fn locs(store: &LogStore) -> Vec<Loc> {
        store.mem.read().metas.iter().map(|m| m.loc).collect()
    }

    /// A small tmpfs mounted for one test and unmounted when dropped (root only).
    struct SmallFs {
        dir: tempfile::TempDir,
    }

    impl SmallFs {
        /// Fails (never skips) without root: CI runs as root, and a full disk cannot be made
        /// any other way here.
        fn mount(size: &str) -> SmallFs {
            // SAFETY: geteuid has no preconditions.
            assert_eq!(
                unsafe { libc::geteuid() },
                0,
                "this test mounts a small tmpfs and needs root"
            );
            let dir = tempfile::tempdir().unwrap();
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "mount a {size} tmpfs");
            SmallFs { dir }
        }

        /// Fills the file system with `path` until it is full.
        fn fill(&self, path: &Path) {
            use std::io::Write;
            let mut f = File::create(path).unwrap();
            let chunk = vec![0xa5u8; 16 << 10];
            while f.write_all(&chunk).is_ok() {}
            let _ = f.flush();
        }
    }

    impl Drop for SmallFs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }

    /// A full file system stalls the writer instead of failing it: the appends are neither
    /// acknowledged nor refused, and once space is freed (and the writer poked) they are
    /// written in order and everything after them works; nothing is lost across a restart.
    #[tokio::test]
    #[allow(clippy::disallowed_methods)] // A test's bound in real time, outside a replica.
    async fn a_full_disk_stalls_the_writer_until_space_is_freed() {
        let fs_ = SmallFs::mount("4m");
        let raft_dir = fs_.dir.path().join("raft");
        fs::create_dir_all(&raft_dir).unwrap();
        let es: Vec<RaftEntry> = (0..40).map(|i| big_entry(1, i, 48 << 10)).collect();
        let (mut store, wal) = open(&raft_dir, recover(&raft_dir).unwrap(), None).unwrap();
        append_durably(&mut store, &es[..10]).await;
        let filler = fs_.dir.path().join("filler");
        fs_.fill(&filler);
        // Past the preallocated megabyte: the log must grow, and cannot.
        for e in &es[10..] {
            store.append_entries(vec![e.clone()], None).ok().unwrap();
        }
        let durable_before = *store.durable.lock();
        let t = std::time::Instant::now();
        while !wal.stalled() && t.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(wal.stalled(), "the writer did not notice the full disk");
        wal.retry_stalled();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(wal.stalled(), "still full");
        assert_eq!(
            *store.durable.lock(),
            durable_before,
            "nothing more is durable"
        );
        // Readable from memory meanwhile, as openraft requires.
        assert_eq!(all_entries(&mut store).await, es);

        fs::remove_file(&filler).unwrap();
        wal.retry_stalled();
        // The vote is ordered after every held-back append: saved means they are durable.
        tokio::time::timeout(Duration::from_secs(5), store.save_vote(&Vote::new(1, 1)))
            .await
            .expect("the writer resumed")
            .expect("vote saved");
        assert!(!wal.stalled());
        let more: Vec<RaftEntry> = (40..50).map(|i| big_entry(1, i, 48 << 10)).collect();
        append_durably(&mut store, &more).await;
        wal.stop().await;
        drop(store);
        let (mut store, wal) = open(&raft_dir, recover(&raft_dir).unwrap(), None).unwrap();
        let back = all_entries(&mut store).await;
        assert_eq!(back.len(), 50);
        assert_eq!(back[..40], es[..]);
        wal.stop().await;
    }

    #[tokio::test]
    async fn entries_leave_memory_once_durable_and_are_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let raft_dir = tmp.path();
        let es: Vec<RaftEntry> = (0..3000).map(|i| big_entry(1, i, 1000)).collect();
        {
            let (mut store, wal) = open(raft_dir, recover(raft_dir).unwrap(), None).unwrap();
            append_durably(&mut store, &es).await;
            {
                let mem = store.mem.read();
                assert!(mem.cache_bytes <= CACHE_BYTES, "cache not bounded");
                assert!(mem.cache.len() < 3000 / 2, "entries kept in memory");
                assert_eq!(mem.cache.back(), es.last());
            }
            assert_eq!(all_entries(&mut store).await, es);
            let part = store.try_get_log_entries(10..=20).await.ok().unwrap();
            assert_eq!(part, es[10..=20].to_vec());
            wal.stop().await;
        }
        // After a restart nothing is in memory and everything comes from the file.
        let (mut store, wal) = open(raft_dir, recover(raft_dir).unwrap(), None).unwrap();
        assert!(store.mem.read().cache.is_empty());
        assert_eq!(all_entries(&mut store).await, es);
        // Appending continues after the recovered log, in memory and then on disk.
        let more: Vec<RaftEntry> = (3000..4000).map(|i| big_entry(1, i, 1000)).collect();
        append_durably(&mut store, &more).await;
        assert_eq!(all_entries(&mut store).await[3000..], more[..]);
        wal.stop().await;
        let (mut store, wal) = open(raft_dir, recover(raft_dir).unwrap(), None).unwrap();
        assert_eq!(all_entries(&mut store).await.len(), 4000);
        wal.stop().await;
    }

    #[tokio::test]
    async fn entries_are_read_back_after_a_rewrite_moved_them() {
        let tmp = tempfile::tempdir().unwrap();
        let raft_dir = tmp.path();
        let es: Vec<RaftEntry> = (0..6000).map(|i| big_entry(1, i, 1000)).collect();
        let (mut store, wal) = open(raft_dir, recover(raft_dir).unwrap(), None).unwrap();
        append_durably(&mut store, &es).await;
        assert_eq!(store.generation, 1);
        // Purging most of the log makes its bytes dead: the log is rewritten (generation 2)
        // with the live entries moved to new offsets.
        store.purge(es[4999].log_id).await.ok().unwrap();
        assert_eq!(store.generation, 2);
        assert!(locs(&store).iter().all(|l| l.generation == 2));
        // Until the new generation is durable the moved entries stay in memory; readable
        // either way.
        assert_eq!(all_entries(&mut store).await, es[5000..]);
        append_durably(&mut store, &[]).await;
        assert!(
            store.mem.read().cache.len() < 1000,
            "not evicted after the rewrite"
        );
        assert_eq!(all_entries(&mut store).await, es[5000..]);
        let gens = list_generations(&raft_dir.join("wal")).unwrap();
        assert_eq!(gens, vec![2], "the old generation is gone");
        // A truncated suffix is replaced by entries of a later term at the same indexes.
        store.truncate(es[5500].log_id).await.ok().unwrap();
        let newer: Vec<RaftEntry> = (5500..6500).map(|i| big_entry(2, i, 1000)).collect();
        append_durably(&mut store, &newer).await;
        let expected: Vec<RaftEntry> = es[5000..5500].iter().chain(&newer).cloned().collect();
        assert_eq!(all_entries(&mut store).await, expected);
        wal.stop().await;
        let (mut store, wal) = open(raft_dir, recover(raft_dir).unwrap(), None).unwrap();
        assert_eq!(all_entries(&mut store).await, expected);
        wal.stop().await;
    }

    #[tokio::test]
    async fn corrupted_bytes_are_detected_on_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let raft_dir = tmp.path();
        let es: Vec<RaftEntry> = (0..3000).map(|i| big_entry(1, i, 1000)).collect();
        let (mut store, wal) = open(raft_dir, recover(raft_dir).unwrap(), None).unwrap();
        append_durably(&mut store, &es).await;
        let loc = locs(&store)[100];
        assert!(
            store.mem.read().cache_first() > 100,
            "entry 100 is on disk only"
        );
        // A bit flip in the middle of entry 100's record (as a bad disk would).
        let path = generation_path(&raft_dir.join("wal"), loc.generation);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let at = loc.offset + u64::from(loc.len) / 2;
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
        let err = store.try_get_log_entries(90..110).await;
        assert!(err.is_err(), "corrupt record served");
        assert!(format!("{:?}", err.err().unwrap()).contains("checksum"));
        // Its neighbours in other records still read.
        assert_eq!(
            store.try_get_log_entries(101..110).await.ok().unwrap(),
            es[101..110].to_vec()
        );
        // A location that names a valid record holding a different entry is refused too.
        let wrong = Source::Disk {
            file: store.mem.read().files[&loc.generation].clone(),
            loc: locs(&store)[200],
            log_id: es[201].log_id,
        };
        assert!(fetch(vec![wrong]).is_err());
        wal.stop().await;
    }
}
