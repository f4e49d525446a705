//! The member's value file: where the key store keeps values out of the heap
//! ([`baton_core::value`]), so a member's memory grows with its keys and not with their
//! values, as etcd's does with bbolt's memory-mapped file.
//!
//! Scratch, never a source of truth: each segment is an unnamed file in the data directory
//! (`O_TMPFILE`, through `tempfile`), gone when the process exits or the last handle to it is
//! dropped, and never read after a restart (the store is rebuilt from the snapshot and the
//! log, and its values spilled again). So it needs no fsync, no format version and no
//! recovery; what it needs is to hand back exactly what was stored:
//! - every value is a record `[len: u32][crc32: u32][bytes]` (little endian), and a read
//!   checks both; a read that fails or does not check stops the process (`abort`) with the
//!   reason in the log: handing back other bytes would be a wrong answer, and the member's
//!   data is intact in its log and snapshot for the restart;
//! - records are appended into a buffer of [`FLUSH_AT`] bytes that is written with one
//!   `pwrite` when full (values just written, the ones watchers and readers ask for, are
//!   read from it); the page cache does the rest. If a write fails (a full disk) the buffer
//!   keeps the records and the write is retried once the buffer has doubled (a sealed
//!   segment keeps them in memory until it is gone): memory grows, nothing is lost, and a
//!   warning says so. A write that would leave less free space than the disk reserve
//!   (`--disk-reserve-bytes`) is not attempted and fares the same: the reserve is the raft
//!   log's (votes, alarms, deletes, compaction; see `space`). Without this rule a member
//!   restarted on a nearly full disk spilled its replayed values into the last free bytes
//!   before it could save its vote, and stayed without a leader until space was freed.
//! - a segment is sealed at [`SEGMENT_BYTES`] and a new one started. A sealed segment whose
//!   values the store refers to less than half of is marked for evacuation; the store moves
//!   those values to the current segment a few per applied entry, and the sealed file goes
//!   away with the last handle (snapshot copies being written hold theirs until they finish).
//!   So the files hold at most about twice the live values plus one segment.
//!
//! Values are read with `pread`, not mapped: a read never faults on a file some other
//! process truncated, and pages of the file are the kernel's to keep or drop (they are not
//! counted in the member's RSS, as a mapping's touched pages would be).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use baton_core::value::{Segment, SegmentRead, ValueSpill, Window, MAX_SEGMENT_OFFSET};
use parking_lot::Mutex;

use crate::space::{self, RateLimit};

/// A segment is sealed once it reaches this size (a multiple of the flush size is not
/// needed: a segment ends after the record that crosses it).
pub(crate) const SEGMENT_BYTES: u64 = 64 << 20;

/// Records are buffered up to this many bytes, then written with one `pwrite`.
pub(crate) const FLUSH_AT: usize = 256 << 10;

/// Bytes before a record's value: its length and the CRC-32 of the value.
const HEADER: usize = 8;

/// The most a read in order ([`SegmentRead::read_in_order`]) reads ahead: a few thousand
/// values of a few hundred bytes per `pread`.
const READ_AHEAD_BYTES: usize = 1 << 20;

/// What a read in order reads ahead first; each refill that follows in order reads twice
/// the last, up to [`READ_AHEAD_BYTES`]. Why: a watcher catching up reads a few events'
/// values at a time, under the state lock, where a whole 1 MiB window would copy far more
/// than it uses; a snapshot reads the whole file and reaches full windows after four
/// refills.
const READ_AHEAD_FIRST_BYTES: usize = 64 << 10;

/// A record at most this far past the end of the window still counts as the next in order
/// (values of versions compacted away, or of keys stored between, leave gaps); one further
/// away, or before the window, is read alone, as [`SegmentFile::read`] reads it: a reader
/// jumping around the file (a store spilled in key order at a restart, then read in
/// revision order) costs a `pread` per value, as before, never a window per value.
const READ_AHEAD_GAP: u64 = 64 << 10;

const _: () = assert!(SEGMENT_BYTES + (16 << 20) < MAX_SEGMENT_OFFSET);

/// The spill a member hands its state machine. See the module docs.
pub(crate) struct ValueFile {
    dir: PathBuf,
    /// What each segment's writes leave free.
    keep_free: Arc<KeepFree>,
    state: Mutex<FileState>,
    /// Warnings for failed writes and segment creations, at most one per interval.
    warn: RateLimit,
}

struct FileState {
    current: Option<Current>,
    sealed: Vec<Sealed>,
    next_id: u64,
    /// Walks of the store that reached its last key (`evacuation_pass_done`).
    passes: u64,
}

struct Current {
    segment: Arc<Segment>,
    file: Arc<SegmentFile>,
}

struct Sealed {
    segment: Weak<Segment>,
    /// Its file, to write out records a failed seal left in memory ([`ValueFile::write_held`]).
    file: Weak<SegmentFile>,
    bytes: u64,
    /// `passes` when this segment was marked for evacuation.
    marked_at_pass: Option<u64>,
    /// Still counted as referenced after a whole pass since it was marked: the count is
    /// wrong (see `ValueSpill::evacuation_pass_done`), so it no longer keeps walks going.
    /// The file still goes away with the last handle.
    settled: bool,
}

impl ValueFile {
    /// Segments are created in `dir` (the data directory: same file system, same space
    /// accounting), the first one at the first value; their writes leave at least
    /// `reserve_bytes` free (0: no check, writes go on until the file system refuses them).
    pub(crate) fn new(dir: &Path, reserve_bytes: u64) -> ValueFile {
        ValueFile {
            dir: dir.to_path_buf(),
            keep_free: Arc::new(KeepFree {
                dir: dir.to_path_buf(),
                bytes: AtomicU64::new(reserve_bytes),
            }),
            state: Mutex::new(FileState {
                current: None,
                sealed: Vec::new(),
                next_id: 0,
                passes: 0,
            }),
            warn: RateLimit::default(),
        }
    }

    /// Bytes in the segment files still alive (written or buffered), for tests and status.
    pub(crate) fn bytes(&self) -> u64 {
        let st = self.state.lock();
        let sealed: u64 = st
            .sealed
            .iter()
            .filter(|s| s.segment.strong_count() > 0)
            .map(|s| s.bytes)
            .sum();
        sealed + st.current.as_ref().map_or(0, |c| c.file.end())
    }

    /// Bytes of records kept in memory because their write was refused (a full disk, or
    /// the reserve), not yet written out.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.files().iter().map(|f| f.held_bytes()).sum()
    }

    /// Writes out the records earlier writes left in memory, oldest segment first, and
    /// returns the bytes still held. Called by the disk watch once space is no longer low:
    /// otherwise records held back stayed in memory until the current segment's buffer
    /// next filled (a sealed segment's, for its life) — after a restart on a nearly full
    /// disk, every value of the store. Stops at the first refusal (the disk is still full).
    /// Blocking: sealed segments are written without the registry's lock (they take no
    /// appends), the current one under its buffer's, as any flush.
    pub(crate) fn write_held(&self) -> u64 {
        let files = self.files();
        for file in &files {
            if file.held_bytes() == 0 {
                continue;
            }
            if let Err(e) = file.write_held() {
                self.warn_write(&e);
                break;
            }
        }
        files.iter().map(|f| f.held_bytes()).sum()
    }

    /// The live segment files, sealed ones first (in the order they were sealed).
    fn files(&self) -> Vec<Arc<SegmentFile>> {
        let st = self.state.lock();
        st.sealed
            .iter()
            .filter_map(|s| s.file.upgrade())
            .chain(st.current.as_ref().map(|c| c.file.clone()))
            .collect()
    }

    fn open_segment(&self, st: &mut FileState) -> io::Result<Current> {
        let file = tempfile::tempfile_in(&self.dir)?;
        let id = st.next_id;
        st.next_id += 1;
        let file = Arc::new(SegmentFile {
            id,
            file,
            keep_free: self.keep_free.clone(),
            pending: Mutex::new(Pending {
                bytes: Vec::with_capacity(FLUSH_AT + HEADER),
                flushed: 0,
                flush_at: FLUSH_AT,
                held_back: false,
                sealed: false,
            }),
        });
        let segment = Arc::new(Segment::new(Box::new(Reader(file.clone()))));
        Ok(Current { segment, file })
    }
}

impl std::fmt::Debug for ValueFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueFile").field("dir", &self.dir).finish()
    }
}

impl ValueSpill for ValueFile {
    fn store(&self, value: &[u8]) -> Option<(Arc<Segment>, u64)> {
        let mut st = self.state.lock();
        if st
            .current
            .as_ref()
            .is_some_and(|c| c.file.end() >= SEGMENT_BYTES)
        {
            self.seal_current(&mut st);
        }
        if st.current.is_none() {
            match self.open_segment(&mut st) {
                Ok(cur) => st.current = Some(cur),
                Err(e) => {
                    if self.warn.allow() {
                        tracing::warn!(dir = %self.dir.display(), error = %e, "cannot create a value file; values stay in memory meanwhile");
                    }
                    return None;
                }
            }
        }
        let cur = st.current.as_ref().expect("opened above");
        if let Err(e) = cur.file.append(value) {
            self.warn_write(&e);
        }
        let offset = cur.file.end() - (HEADER + value.len()) as u64;
        Some((cur.segment.clone(), offset))
    }

    fn start_segment(&self) {
        let mut st = self.state.lock();
        self.seal_current(&mut st);
    }

    fn evacuation_pending(&self) -> bool {
        let mut st = self.state.lock();
        let passes = st.passes;
        let mut pending = false;
        for sealed in st.sealed.iter_mut().filter(|s| !s.settled) {
            let Some(segment) = sealed.segment.upgrade() else {
                continue;
            };
            let referenced = segment.referenced_bytes();
            if sealed.marked_at_pass.is_none() && referenced.saturating_mul(2) < sealed.bytes {
                segment.mark_for_evacuation();
                sealed.marked_at_pass = Some(passes);
            }
            pending |= sealed.marked_at_pass.is_some() && referenced > 0;
        }
        pending
    }

    fn evacuation_pass_done(&self) {
        let mut st = self.state.lock();
        let passes = st.passes;
        for sealed in &mut st.sealed {
            // Marked before this pass began: the pass has moved all of its values.
            let before = sealed.marked_at_pass.is_some_and(|p| p < passes);
            let referenced = sealed.segment.upgrade().map_or(0, |s| s.referenced_bytes());
            if before && referenced > 0 && !sealed.settled {
                sealed.settled = true;
                tracing::debug!(
                    referenced,
                    "a value file segment still counts referenced bytes after a whole evacuation pass; no longer walked for"
                );
            }
        }
        st.passes += 1;
    }
}

impl ValueFile {
    /// Writes the current segment out and keeps it only as long as handles to it live;
    /// the next value starts a new one.
    fn seal_current(&self, st: &mut FileState) {
        let Some(cur) = st.current.take() else {
            return;
        };
        if let Err(e) = cur.file.seal() {
            self.warn_write(&e);
        }
        st.sealed.retain(|s| s.segment.strong_count() > 0);
        st.sealed.push(Sealed {
            segment: Arc::downgrade(&cur.segment),
            file: Arc::downgrade(&cur.file),
            bytes: cur.file.end(),
            marked_at_pass: None,
            settled: false,
        });
    }

    fn warn_write(&self, e: &io::Error) {
        if self.warn.allow() {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot write the value file; its records stay in memory until a later write succeeds");
        }
    }
}

/// The free space the value file leaves for the raft log: the disk reserve.
struct KeepFree {
    /// Where to measure (the data directory).
    dir: PathBuf,
    /// The reserve (an atomic only so tests can give a file system room again).
    bytes: AtomicU64,
}

impl KeepFree {
    /// Whether `len` more bytes may be written: refused (as the file system would refuse
    /// them, so the caller keeps them in memory) when they would leave less than the
    /// reserve free. A failed measurement does not refuse: the write itself then tells.
    fn allow(&self, len: usize) -> io::Result<()> {
        let reserve = self.bytes.load(Ordering::Relaxed);
        if reserve == 0 {
            return Ok(());
        }
        let Ok(free) = space::free_bytes(&self.dir) else {
            return Ok(());
        };
        if free < reserve.saturating_add(len as u64) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "writing {len} bytes would leave less than the disk reserve free \
                     ({free} bytes free, reserve {} bytes, --disk-reserve-bytes): the reserve \
                     is kept for the raft log",
                    reserve
                ),
            ));
        }
        Ok(())
    }
}

/// One segment's file and the records not yet written to it.
struct SegmentFile {
    id: u64,
    file: File,
    keep_free: Arc<KeepFree>,
    pending: Mutex<Pending>,
}

struct Pending {
    /// Records after `flushed`, in order.
    bytes: Vec<u8>,
    /// Bytes of the file written so far: every record below this offset is in the file.
    flushed: u64,
    /// The buffer is written out once it holds this many bytes: [`FLUSH_AT`], or twice
    /// what it held when a write failed (retrying the whole buffer at every append would
    /// cost a write of a growing buffer per value while the disk stays full).
    flush_at: usize,
    /// The last write of the buffer was refused: its records are held in memory.
    held_back: bool,
    /// No record is appended any more (see [`SegmentFile::seal`]).
    sealed: bool,
}

impl SegmentFile {
    /// The offset the next record will get.
    fn end(&self) -> u64 {
        let p = self.pending.lock();
        p.flushed + p.bytes.len() as u64
    }

    /// Appends one record to the buffer, writing the buffer out when it is full. The record
    /// is stored either way (the error only says the write is deferred).
    fn append(&self, value: &[u8]) -> io::Result<()> {
        let mut p = self.pending.lock();
        let len = u32::try_from(value.len()).expect("spilled values are shorter than 16 MiB");
        p.bytes.extend_from_slice(&len.to_le_bytes());
        p.bytes
            .extend_from_slice(&crc32fast::hash(value).to_le_bytes());
        p.bytes.extend_from_slice(value);
        if p.bytes.len() >= p.flush_at {
            self.write_out(&mut p)?;
        }
        Ok(())
    }

    /// Writes the buffer out and gives its memory back: no record is appended any more.
    fn seal(&self) -> io::Result<()> {
        let mut p = self.pending.lock();
        p.sealed = true;
        self.write_out(&mut p)?;
        p.bytes = Vec::new();
        Ok(())
    }

    /// Bytes of records held in memory by a refused write.
    fn held_bytes(&self) -> u64 {
        let p = self.pending.lock();
        if p.held_back {
            p.bytes.len() as u64
        } else {
            0
        }
    }

    /// Writes out records a refused write left in memory (a sealed segment's memory is
    /// given back, as [`SegmentFile::seal`] does).
    fn write_held(&self) -> io::Result<()> {
        let mut p = self.pending.lock();
        if !p.held_back {
            return Ok(());
        }
        self.write_out(&mut p)?;
        if p.sealed {
            p.bytes = Vec::new();
        }
        Ok(())
    }

    fn write_out(&self, p: &mut Pending) -> io::Result<()> {
        if p.bytes.is_empty() {
            return Ok(());
        }
        let written = self
            .keep_free
            .allow(p.bytes.len())
            .and_then(|()| self.file.write_all_at(&p.bytes, p.flushed));
        if let Err(e) = written {
            p.flush_at = p.bytes.len().saturating_mul(2);
            p.held_back = true;
            return Err(e);
        }
        p.flush_at = FLUSH_AT;
        p.held_back = false;
        p.flushed += p.bytes.len() as u64;
        p.bytes.clear();
        // A buffer that grew while writes failed goes back to its usual size.
        if p.bytes.capacity() > 4 * FLUSH_AT {
            p.bytes.shrink_to(FLUSH_AT + HEADER);
        }
        Ok(())
    }

    /// The record at `offset`, checked against `len` and its CRC.
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, String> {
        let mut record = vec![0u8; HEADER + len];
        let in_buffer = {
            let p = self.pending.lock();
            if offset >= p.flushed {
                let start = usize::try_from(offset - p.flushed).map_err(|e| e.to_string())?;
                let src = p
                    .bytes
                    .get(start..start + record.len())
                    .ok_or_else(|| format!("offset {offset} is past the segment's end"))?;
                record.copy_from_slice(src);
                true
            } else {
                false
            }
        };
        if !in_buffer {
            // Records below `flushed` are in the file and never change.
            self.file
                .read_exact_at(&mut record, offset)
                .map_err(|e| format!("reading {} bytes at {offset}: {e}", record.len()))?;
        }
        check_record(&record, offset, len)?;
        Ok(record.split_off(HEADER))
    }

    /// [`SegmentFile::read`] for a reader going through the file in order: a record inside
    /// `window` is taken from it; one that straddles its end or starts at most
    /// [`READ_AHEAD_GAP`] past it refills it with the file from that record on (twice the
    /// window's size, from [`READ_AHEAD_FIRST_BYTES`] up to [`READ_AHEAD_BYTES`]); any
    /// other is read alone and leaves the window empty just after it. Only bytes below
    /// `flushed` go into a window (they never change); a record still in the buffer is read
    /// from there.
    fn read_in_order(
        &self,
        offset: u64,
        len: usize,
        window: &mut Window,
    ) -> Result<Vec<u8>, String> {
        let need = HEADER + len;
        let start = window.start;
        let end = start + window.bytes.len() as u64;
        if offset >= start && offset + need as u64 <= end {
            let at = (offset - start) as usize;
            let record = &window.bytes[at..at + need];
            check_record(record, offset, len)?;
            return Ok(record[HEADER..].to_vec());
        }
        // Past the window, or straddling its end: the window moves on (and grows).
        let next_in_order = offset >= start && offset.saturating_sub(end) <= READ_AHEAD_GAP;
        let flushed = self.pending.lock().flushed;
        if !next_in_order || offset + need as u64 > flushed {
            window.start = offset + need as u64;
            window.bytes.clear();
            return self.read(offset, len);
        }
        let ahead = (window.bytes.len() * 2).clamp(READ_AHEAD_FIRST_BYTES, READ_AHEAD_BYTES);
        let fill = (flushed - offset).min(ahead as u64) as usize;
        window.bytes.resize(fill.max(need), 0);
        window.start = offset;
        self.file
            .read_exact_at(&mut window.bytes, offset)
            .map_err(|e| format!("reading {fill} bytes at {offset}: {e}"))?;
        check_record(&window.bytes[..need], offset, len)?;
        Ok(window.bytes[HEADER..need].to_vec())
    }
}

/// Checks that `record` (header and value) is the record of a value of `len` bytes.
fn check_record(record: &[u8], offset: u64, len: usize) -> Result<(), String> {
    debug_assert_eq!(record.len(), HEADER + len);
    let stored_len = u32::from_le_bytes(record[0..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes"));
    if stored_len as usize != len {
        return Err(format!(
            "record at {offset} holds {stored_len} bytes, the store expects {len}"
        ));
    }
    if crc32fast::hash(&record[HEADER..]) != crc {
        return Err(format!("record at {offset} fails its checksum"));
    }
    Ok(())
}

/// What the core's [`Segment`] reads through.
struct Reader(Arc<SegmentFile>);

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "value file segment {}", self.0.id)
    }
}

impl Reader {
    /// The value read, or the member stopped: see the module docs.
    fn value_or_stop(&self, read: Result<Vec<u8>, String>) -> Vec<u8> {
        match read {
            Ok(value) => value,
            Err(reason) => {
                // Not a panic: one caught by the runtime would fail one request and leave a
                // member that cannot read part of its store serving.
                tracing::error!(segment = self.0.id, %reason, "a value read back from the value file is not the value stored; stopping (the data is intact in the log and snapshot: a restart rebuilds the file)");
                eprintln!(
                    "baton: value file segment {}: {reason}; stopping",
                    self.0.id
                );
                std::process::abort();
            }
        }
    }
}

impl SegmentRead for Reader {
    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        self.value_or_stop(self.0.read(offset, len))
    }

    fn read_in_order(&self, offset: u64, len: usize, window: &mut Window) -> Vec<u8> {
        self.value_or_stop(self.0.read_in_order(offset, len, window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(i: u32, len: usize) -> Vec<u8> {
        (0..len).map(|j| (i as usize * 31 + j) as u8).collect()
    }

    #[test]
    fn values_read_back_from_the_buffer_and_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = ValueFile::new(dir.path(), 0);
        let mut handles = Vec::new();
        // Enough to flush the buffer several times.
        for i in 0..4000u32 {
            let v = value(i, 64 + (i as usize % 300));
            let (seg, off) = file.store(&v).unwrap();
            handles.push((seg, off, v));
        }
        for (seg, off, v) in &handles {
            assert_eq!(&seg.read(*off, v.len()), v);
        }
        assert!(
            handles
                .iter()
                .all(|(seg, _, _)| Arc::ptr_eq(seg, &handles[0].0)),
            "one segment"
        );
        let flushed = file
            .state
            .lock()
            .current
            .as_ref()
            .unwrap()
            .file
            .pending
            .lock()
            .flushed;
        assert!(flushed > 0, "the buffer was written out");
        assert_eq!(
            file.bytes(),
            handles
                .iter()
                .map(|(_, _, v)| (HEADER + v.len()) as u64)
                .sum::<u64>()
        );
    }

    #[test]
    fn values_read_in_order_come_from_a_window_and_match_every_other_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = ValueFile::new(dir.path(), 0);
        // Several windows' worth written out, the last records still in the buffer.
        let handles: Vec<_> = (0..12_000u32)
            .map(|i| {
                let v = value(i, 64 + (i as usize % 300));
                let (_, off) = file.store(&v).unwrap();
                (off, v)
            })
            .collect();
        let segment = file.state.lock().current.as_ref().unwrap().file.clone();
        let flushed = segment.pending.lock().flushed;
        assert!(
            flushed > 2 * READ_AHEAD_BYTES as u64,
            "several windows in the file"
        );
        assert!(
            handles.last().unwrap().0 >= flushed,
            "the last records are still in the buffer"
        );
        let read_all = |order: &mut dyn Iterator<Item = usize>| -> usize {
            let mut window = Window::default();
            let mut refills = 0;
            for i in order {
                let (off, v) = &handles[i];
                let before = (window.start, window.bytes.len());
                let got = segment.read_in_order(*off, v.len(), &mut window).unwrap();
                assert_eq!(&got, v, "value {i}");
                if window.bytes.len() > HEADER + v.len()
                    && (window.start, window.bytes.len()) != before
                {
                    refills += 1;
                }
            }
            refills
        };
        // In order: windows growing from READ_AHEAD_FIRST_BYTES to READ_AHEAD_BYTES, not a
        // read per value.
        let refills = read_all(&mut (0..handles.len()));
        let (mut windows, mut covered, mut size) = (0, 0, READ_AHEAD_FIRST_BYTES as u64);
        while covered < flushed {
            (windows, covered) = (windows + 1, covered + size);
            size = (size * 2).min(READ_AHEAD_BYTES as u64);
        }
        assert!(
            (windows - 1..=windows + 1).contains(&refills),
            "{refills} refills for {windows} windows"
        );
        // Every other order reads the same bytes (alone where it jumps).
        assert_eq!(
            read_all(&mut (0..handles.len()).rev()),
            0,
            "backwards: no window"
        );
        read_all(&mut (0..handles.len()).step_by(7));
        let mut scattered: Vec<usize> = (0..handles.len()).collect();
        scattered.sort_by_key(|i| (i * 7919) % handles.len());
        read_all(&mut scattered.into_iter());
    }

    #[test]
    fn a_damaged_record_read_through_a_window_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = ValueFile::new(dir.path(), 0);
        let handles: Vec<_> = (0..4000u32)
            .map(|i| {
                let v = value(i, 200);
                (file.store(&v).unwrap().1, v)
            })
            .collect();
        let segment = file.state.lock().current.as_ref().unwrap().file.clone();
        // One byte of the 11th value changed in the file, under the store's feet.
        let (off, _) = handles[10];
        segment
            .file
            .write_all_at(&[0xff], off + HEADER as u64 + 3)
            .unwrap();
        let mut window = Window::default();
        for (i, (off, v)) in handles.iter().enumerate().take(20) {
            let got = segment.read_in_order(*off, v.len(), &mut window);
            if i == 10 {
                let e = got.unwrap_err();
                assert!(e.contains("checksum"), "{e}");
            } else {
                assert_eq!(&got.unwrap(), v);
            }
        }
    }

    #[test]
    fn writes_that_would_eat_into_the_reserve_stay_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let free = space::free_bytes(dir.path()).unwrap();
        // A reserve above what the file system has free: nothing may be written.
        let file = ValueFile::new(dir.path(), free + (1 << 30));
        let store = |ids: std::ops::Range<u32>| -> Vec<_> {
            ids.map(|i| {
                let v = value(i, 1000);
                let (seg, off) = file.store(&v).unwrap();
                (seg, off, v)
            })
            .collect()
        };
        let handles = store(0..2000);
        let flushed = |file: &ValueFile| {
            let st = file.state.lock();
            let cur = st.current.as_ref().unwrap();
            let flushed = cur.file.pending.lock().flushed;
            flushed
        };
        assert_eq!(flushed(&file), 0, "nothing written into the reserve");
        let held = file.held_bytes();
        assert!(held > FLUSH_AT as u64, "held in memory: {held}");
        // Sealed while the disk is "full": that segment's records stay in memory too.
        file.start_segment();
        let more = store(2000..2300);
        assert_eq!(file.write_held(), file.held_bytes(), "still refused");
        assert!(file.held_bytes() >= held);
        for (seg, off, v) in handles.iter().chain(&more) {
            assert_eq!(&seg.read(*off, v.len()), v, "read back from memory");
        }
        // Room again: everything held is written out (the sealed segment's memory given
        // back) and reads back from the files.
        file.keep_free.bytes.store(1, Ordering::Relaxed);
        assert_eq!(file.write_held(), 0);
        assert_eq!(file.held_bytes(), 0);
        let files = file.files();
        assert_eq!(files.len(), 2, "the sealed segment and the current one");
        {
            let p = files[0].pending.lock();
            assert_eq!(
                (p.bytes.capacity(), p.held_back),
                (0, false),
                "memory given back"
            );
            assert!(p.flushed > 0);
        }
        assert!(flushed(&file) > 0, "the current segment's records written");
        for (seg, off, v) in handles.iter().chain(&more) {
            assert_eq!(&seg.read(*off, v.len()), v, "read back from the files");
        }
    }

    #[test]
    fn a_damaged_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = ValueFile::new(dir.path(), 0);
        let v = value(1, 100);
        let (_, off) = file.store(&v).unwrap();
        let seg = file.state.lock().current.as_ref().unwrap().file.clone();
        seg.seal().unwrap();
        seg.file
            .write_all_at(&[0xff], off + HEADER as u64 + 10)
            .unwrap();
        let err = seg.read(off, v.len()).unwrap_err();
        assert!(err.contains("checksum"), "{err}");
        let err = seg.read(off, v.len() - 1).unwrap_err();
        assert!(err.contains("holds 100 bytes"), "{err}");
    }

    #[test]
    fn full_segments_are_sealed_and_mostly_garbage_ones_marked() {
        let dir = tempfile::tempdir().unwrap();
        let file = ValueFile::new(dir.path(), 0);
        let v = vec![7u8; 1 << 20];
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for i in 0..70 {
            let (seg, off) = file.store(&v).unwrap();
            if i % 4 == 0 {
                kept.push((seg, off));
            } else {
                dropped.push((seg, off));
            }
        }
        assert_eq!(
            file.state.lock().sealed.len(),
            1,
            "one segment sealed at 64 MiB"
        );
        // The store refers to none of them (nothing entered a store): the sealed one is
        // marked, and with nothing referenced, nothing is pending.
        assert!(!file.evacuation_pending());
        let sealed = file.state.lock().sealed[0].segment.upgrade().unwrap();
        assert!(sealed.marked_for_evacuation());
        drop(sealed);
        drop(dropped);
        drop(kept);
        assert_eq!(
            file.bytes(),
            file.state.lock().current.as_ref().unwrap().file.end(),
            "the sealed segment is gone with its handles"
        );
    }
}
