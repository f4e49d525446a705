//! What the log keeps in memory, and where each entry is on disk.
//!
//! Per entry only its id, size and position (generation, record offset and length, slot in
//! the record); the entries themselves only while they are among the newest
//! ([`CACHE_BYTES`]) or not yet durable. Older entries (a lagging follower's replication, the
//! re-apply after a restart) are read back from the file (`wal/reader.rs`), and every record
//! read back is checked like recovery checks it (length, CRC, decoding, the expected entry
//! id). Durable bytes of a generation are never overwritten (records are only appended, and
//! a rewrite writes a new file), and a reader holds an open handle, so a location stays valid
//! for as long as its entry is live. A rewrite moves every live entry into the new
//! generation: they are kept in memory until that generation is durable, then read from it.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::PathBuf;
use std::sync::Arc;

use super::dir::generation_path;
use super::record::{encode_record, entry_size, Record, RecordRef, WAL_FORMAT_VERSION};
use crate::types::{LogId, RaftEntry, Vote};

/// Entries records are split at about this size so one huge append does not make one huge
/// record: recovery reads records whole, and so does reading one entry back (which decodes
/// its whole record), so a rewrite packing thousands of entries per record would make every
/// single-entry read decode them all.
pub(super) const RECORD_TARGET_BYTES: u64 = 256 << 10;

/// Encodes entries as one or more `Entries` records of about `RECORD_TARGET_BYTES` each and
/// returns where each entry lands, given that `out[0]` will be at offset `base` of
/// `generation`.
pub(super) fn encode_entries(
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

/// Where an entry's bytes are on disk: slot `slot` of the `Entries` record that starts at
/// `offset` in generation `generation` and is `len` bytes long (header included). Reading an
/// entry back reads and CRC-checks that whole record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) generation: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) slot: u32,
}

/// What the log keeps in memory of every entry: its id, its encoded size (for the dead/live
/// byte accounting and the snapshot trigger) and where it is on disk.
#[derive(Clone, Copy, Debug)]
pub(super) struct Meta {
    pub(super) log_id: LogId,
    pub(super) bytes: u64,
    pub(super) loc: Loc,
}

/// The most recent entries kept decoded, beyond those not yet durable: openraft reads every
/// entry back right after appending it (to apply it, and on a leader to replicate it), so the
/// newest entries are served from memory and only older ones (a lagging follower, a restart's
/// re-apply) come from the file. Counted in encoded bytes.
pub(super) const CACHE_BYTES: u64 = 1 << 20;

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
    pub(super) metas: VecDeque<Meta>,
    /// The entries of the last `cache.len()` metas (always a suffix of the log), decoded.
    pub(super) cache: VecDeque<RaftEntry>,
    /// Sum of `Meta::bytes` over the cached entries.
    pub(super) cache_bytes: u64,
    pub(super) purged: Option<LogId>,
    pub(super) committed: Option<LogId>,
    pub(super) vote: Option<Vote>,
    /// Sum of `Meta::bytes`.
    pub(super) live_bytes: u64,
    /// Where the generation files are; read handles are opened on demand.
    pub(super) wal_dir: PathBuf,
    /// Read handles of the generations that metas point into. A reader clones the handle it
    /// needs, so a generation deleted by a rewrite meanwhile stays readable through it.
    pub(super) files: BTreeMap<u64, Arc<File>>,
}

/// How `read` gets one entry: from memory or from a record on disk.
pub(super) enum Source {
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

    pub(super) fn first_index(&self) -> u64 {
        self.purged.map_or(0, |p| p.index + 1)
    }

    pub(super) fn next_index(&self) -> u64 {
        self.first_index() + self.metas.len() as u64
    }

    pub(super) fn meta(&self, index: u64) -> Option<&Meta> {
        let pos = index.checked_sub(self.first_index())?;
        self.metas.get(usize::try_from(pos).ok()?)
    }

    /// Index of the first cached entry.
    pub(super) fn cache_first(&self) -> u64 {
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
    pub(super) fn append(
        &mut self,
        entries: Vec<(RaftEntry, u64, Loc)>,
        cached: bool,
    ) -> Result<(), String> {
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

    pub(super) fn truncate_since(&mut self, index: u64) -> Result<(), String> {
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

    pub(super) fn purge_upto(&mut self, id: LogId) -> Result<(), String> {
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
    pub(super) fn apply(
        &mut self,
        rec: Record,
        generation: u64,
        offset: u64,
        len: u32,
    ) -> Result<(), String> {
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
    pub(super) fn sanitize_committed(&mut self) {
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
    pub(super) fn file(&mut self, generation: u64) -> io::Result<Arc<File>> {
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
    pub(super) fn evict(&mut self, durable: (u64, u64)) {
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
    /// Cheap; the disk reads happen in `reader::fetch`, outside any lock.
    pub(super) fn plan(&self, range: impl RangeBounds<u64>) -> Result<Vec<Source>, String> {
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

    /// Encodes a fresh generation: format version, header, then `entries` (every live entry,
    /// in order), with where each entry lands in it.
    pub(super) fn encode_generation(
        &self,
        generation: u64,
        entries: &[RaftEntry],
    ) -> (Vec<u8>, Vec<Loc>) {
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
    pub(super) fn relocate(&mut self, entries: Vec<RaftEntry>, locs: Vec<Loc>) {
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
