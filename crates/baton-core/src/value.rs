//! A stored value: in the heap, or in a file of values outside it ("spilled").
//!
//! Why: values are most of a store's memory (100k keys of 256 B: 25.6 MB of a 60 MB heap),
//! and etcd serves its values from bbolt's memory-mapped file, which the kernel pages in and
//! out as memory allows. A member may hand the store a [`ValueSpill`]: from then on every
//! value of at least [`MIN_SPILLED_LEN`] bytes is written there as it enters the store and
//! read back when a response, an event, a hash or a snapshot needs it; the store keeps a
//! 16-byte handle (the file's segment and the value's place in it).
//!
//! The core still does no I/O of its own and stays deterministic: the spill is the
//! server's, handed in as a capability (the simulation never hands one in), and reading a
//! spilled value gives exactly the bytes that were stored (the server's file checks every
//! record's checksum and stops the member rather than hand back anything else). Nothing
//! persisted or replicated changes: a value serializes as its bytes wherever it is kept,
//! exactly as the `Box<[u8]>` it replaced. The file is scratch: nothing reads it after a
//! restart, which rebuilds it from the snapshot and the log.
//!
//! Garbage: a value leaves the store when compaction drops its version. Each [`Segment`]
//! counts the bytes the store (not its snapshot copies) still refers to; the spill marks a
//! full segment that is mostly garbage for evacuation, and the store moves the values still
//! in it to the current segment a few at a time ([`crate::StateMachine::evacuate_values`]).
//! A segment's file goes away with the last handle to it, including those of snapshot
//! copies still being written.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Values shorter than this stay in the heap: the handle is 16 bytes anyway, and reading a
/// short value back from a file would cost more than it saves.
pub const MIN_SPILLED_LEN: usize = 64;

/// Bits of a handle's packed word that hold the value's length; the rest hold its offset.
const LEN_BITS: u32 = 24;
/// The longest value that can be spilled (16 MiB - 1); longer ones stay in the heap.
pub const MAX_SPILLED_LEN: usize = (1 << LEN_BITS) - 1;
/// The largest offset a handle can name (1 TiB); a spill never grows a segment that far.
pub const MAX_SEGMENT_OFFSET: u64 = (1 << (64 - LEN_BITS)) - 1;

/// Reads values back from one segment of a spill. Implemented by the server.
pub trait SegmentRead: Send + Sync + fmt::Debug {
    /// The `len` bytes of the value stored at `offset`. Must be exactly the bytes stored
    /// there: an implementation that cannot read them intact stops the process (the member's
    /// data is safe in its log and snapshot; a restart rebuilds the file).
    fn read(&self, offset: u64, len: usize) -> Vec<u8>;

    /// The same bytes as [`SegmentRead::read`], for a reader going through many values in
    /// about the order they were stored (see [`ReadAhead`]). `window` is what the previous
    /// such call on this segment left in it (empty at first); an implementation may read
    /// ahead into it, so that the values that follow come from memory instead of a read
    /// each. The default reads each value alone.
    fn read_in_order(&self, offset: u64, len: usize, window: &mut Window) -> Vec<u8> {
        let _ = window;
        self.read(offset, len)
    }
}

/// Bytes of one segment from `start` on, kept between [`SegmentRead::read_in_order`] calls;
/// what they hold is the implementation's business.
#[derive(Debug, Default)]
pub struct Window {
    pub start: u64,
    pub bytes: Vec<u8>,
}

/// A reader's place in the spill, for reading many values in the order they were stored.
///
/// Why: a snapshot or a backup reads every retained value in revision order, which is the
/// order values enter the store and so the order they were spilled in. Read one `pread`
/// each, a member with 500k values spent 43 % of a snapshot's CPU in the system call
/// (`perf`, single node, put with 100 clients); read ahead a window at a time, a syscall
/// serves thousands of them.
///
/// A window per segment, for the few segments read last: while a sealed segment is being
/// evacuated, revision order alternates between its values still in place and those
/// already moved to the current segment. One window shared by all segments would be
/// dropped at every switch and refilled by the next run of two values (a 1 MiB read for
/// two values); one per segment keeps its place across the other's reads.
#[derive(Debug, Default)]
pub struct ReadAhead {
    /// Segments with their windows, the one read last at the end (kept alive, so a pointer
    /// comparison means the same segment).
    windows: Vec<(Arc<Segment>, Window)>,
}

/// The segments a [`ReadAhead`] keeps a window for (a window is up to a read-ahead's size).
const READ_AHEAD_SEGMENTS: usize = 4;

impl ReadAhead {
    /// `segment`'s window, made the one read last; a new one (the least recently read
    /// dropped when there are [`READ_AHEAD_SEGMENTS`]) if it has none.
    fn window_for(&mut self, segment: &Arc<Segment>) -> &mut Window {
        match self
            .windows
            .iter()
            .position(|(s, _)| Arc::ptr_eq(s, segment))
        {
            Some(i) => {
                let entry = self.windows.remove(i);
                self.windows.push(entry);
            }
            None => {
                if self.windows.len() == READ_AHEAD_SEGMENTS {
                    self.windows.remove(0);
                }
                self.windows.push((segment.clone(), Window::default()));
            }
        }
        &mut self.windows.last_mut().expect("pushed above").1
    }
}

/// One file (or part of one) of spilled values, with what the store still refers to in it.
pub struct Segment {
    reader: Box<dyn SegmentRead>,
    /// Sum of the lengths of the values in this segment that versions of the live store
    /// refer to (a value two versions share counts twice). Snapshot copies of the store do
    /// not count: they only keep the segment alive until they are dropped.
    referenced: AtomicU64,
    /// Set by the spill: the store moves its values out of this segment.
    evacuate: AtomicBool,
}

impl Segment {
    pub fn new(reader: Box<dyn SegmentRead>) -> Segment {
        Segment {
            reader,
            referenced: AtomicU64::new(0),
            evacuate: AtomicBool::new(false),
        }
    }

    /// The `len` bytes of the value stored at `offset` (see [`SegmentRead::read`]).
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        self.reader.read(offset, len)
    }

    /// Bytes of this segment's values the store still refers to.
    pub fn referenced_bytes(&self) -> u64 {
        self.referenced.load(Ordering::Relaxed)
    }

    /// Asks the store to move its values out of this segment (see the module docs).
    pub fn mark_for_evacuation(&self) {
        self.evacuate.store(true, Ordering::Relaxed);
    }

    pub fn marked_for_evacuation(&self) -> bool {
        self.evacuate.load(Ordering::Relaxed)
    }

    fn refer(&self, len: usize) {
        self.referenced.fetch_add(len as u64, Ordering::Relaxed);
    }

    fn release(&self, len: usize) {
        let before = self.referenced.fetch_sub(len as u64, Ordering::Relaxed);
        debug_assert!(before >= len as u64, "segment released more than it held");
    }
}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("reader", &self.reader)
            .field("referenced", &self.referenced_bytes())
            .field("evacuate", &self.marked_for_evacuation())
            .finish()
    }
}

/// Where a store keeps its values out of the heap. Implemented by the server.
pub trait ValueSpill: Send + Sync + fmt::Debug {
    /// Stores `bytes` (at least [`MIN_SPILLED_LEN`], at most [`MAX_SPILLED_LEN`] long) and
    /// says where: the segment and the offset to hand to its [`SegmentRead::read`] (at most
    /// [`MAX_SEGMENT_OFFSET`]). `None` keeps the value in the heap (the file is unusable).
    fn store(&self, bytes: &[u8]) -> Option<(Arc<Segment>, u64)>;

    /// A store is about to be attached (a member adopts a new state: at start, or an
    /// installed snapshot): later values go to a new segment, so no segment is shared
    /// between the store being replaced and the new one (the replaced store's values are
    /// never released, and a shared segment's count would stay too high to evacuate it).
    fn start_segment(&self);

    /// Whether some segment marked for evacuation still holds values of the store: while it
    /// does, the store walks its keys and moves them.
    fn evacuation_pending(&self) -> bool;

    /// The store's walk reached its last key: every value that was in a segment marked
    /// before the walk began has moved. A segment that still counts referenced bytes after
    /// that counts wrong (a store that was replaced while an install failed left its counts
    /// behind) and must stop the walks, which would otherwise go on forever.
    fn evacuation_pass_done(&self);
}

/// The bytes of a version's value. See the module docs.
#[derive(Clone)]
pub(crate) enum Value {
    Heap(Box<[u8]>),
    /// In `segment`, at `packed >> LEN_BITS`, `packed & len mask` bytes long.
    Spilled {
        segment: Arc<Segment>,
        packed: u64,
    },
}

/// A heap value (`Box<[u8]>`) and a spilled one's handle are 16 bytes each; with the tag the
/// value is 24, as every version pays it. Growing it would cost every version in the store.
const _: () = assert!(std::mem::size_of::<Value>() == 24);

impl Value {
    pub(crate) fn len(&self) -> usize {
        match self {
            Value::Heap(b) => b.len(),
            Value::Spilled { packed, .. } => (packed & MAX_SPILLED_LEN as u64) as usize,
        }
    }

    /// The bytes, borrowed from the heap or read from the spill.
    pub(crate) fn bytes(&self) -> Cow<'_, [u8]> {
        match self {
            Value::Heap(b) => Cow::Borrowed(b),
            Value::Spilled { segment, packed } => {
                Cow::Owned(segment.read(packed >> LEN_BITS, self.len()))
            }
        }
    }

    /// [`Value::bytes`], through `ahead` (see [`ReadAhead`]).
    pub(crate) fn bytes_in_order(&self, ahead: &mut ReadAhead) -> Cow<'_, [u8]> {
        match self {
            Value::Heap(b) => Cow::Borrowed(b),
            Value::Spilled { segment, packed } => Cow::Owned(segment.reader.read_in_order(
                packed >> LEN_BITS,
                self.len(),
                ahead.window_for(segment),
            )),
        }
    }

    pub(crate) fn to_vec(&self) -> Vec<u8> {
        self.bytes().into_owned()
    }

    /// Whether this value is spilled in a segment marked for evacuation.
    pub(crate) fn in_evacuated_segment(&self) -> bool {
        matches!(self, Value::Spilled { segment, .. } if segment.marked_for_evacuation())
    }

    /// Makes this value one the live store refers to: a heap value long enough goes to
    /// `spill`, and a spilled one (a value a new version shares with an older one) is
    /// counted in its segment once more.
    pub(crate) fn enter_store(&mut self, spill: Option<&dyn ValueSpill>) {
        let len = self.len();
        match self {
            Value::Spilled { segment, .. } => segment.refer(len),
            Value::Heap(bytes) => {
                let Some(spill) = spill else { return };
                if bytes.len() < MIN_SPILLED_LEN || bytes.len() > MAX_SPILLED_LEN {
                    return;
                }
                let Some((segment, offset)) = spill.store(bytes) else {
                    return;
                };
                assert!(
                    offset <= MAX_SEGMENT_OFFSET,
                    "spill offset {offset} does not fit a handle"
                );
                segment.refer(bytes.len());
                *self = Value::Spilled {
                    segment,
                    packed: (offset << LEN_BITS) | bytes.len() as u64,
                };
            }
        }
    }

    /// The live store no longer refers to this value (its version was dropped).
    pub(crate) fn leave_store(&self) {
        if let Value::Spilled { segment, .. } = self {
            segment.release(self.len());
        }
    }

    /// Moves a value out of a segment marked for evacuation into `spill`'s current one.
    /// Returns whether it moved.
    pub(crate) fn evacuate(&mut self, spill: &dyn ValueSpill) -> bool {
        if !self.in_evacuated_segment() {
            return false;
        }
        let mut moved = Value::Heap(self.to_vec().into_boxed_slice());
        moved.enter_store(Some(spill));
        self.leave_store();
        *self = moved;
        true
    }
}

impl From<&[u8]> for Value {
    fn from(bytes: &[u8]) -> Value {
        Value::Heap(bytes.into())
    }
}

impl From<Vec<u8>> for Value {
    fn from(bytes: Vec<u8>) -> Value {
        Value::Heap(bytes.into_boxed_slice())
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        self.len() == other.len() && self.bytes() == other.bytes()
    }
}

impl Eq for Value {}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Heap(b) => f.debug_tuple("Heap").field(b).finish(),
            Value::Spilled { packed, .. } => f
                .debug_struct("Spilled")
                .field("offset", &(packed >> LEN_BITS))
                .field("len", &self.len())
                .finish(),
        }
    }
}

/// Exactly as the `Box<[u8]>` it replaced (a sequence of bytes), wherever the value is kept:
/// written with `serialize_bytes`, for which bincode writes what it writes for a sequence of
/// `u8`s (the length, then the bytes) in one copy instead of a call per byte.
impl Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(&*self.bytes(), s)
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Value::Heap(serde_bytes::deserialize::<Box<[u8]>, D>(d)?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A spill in memory, with segments of `segment_len` bytes: the tests' stand-in for the
    /// server's file (whose own tests are in `baton-raft`).
    #[derive(Debug)]
    pub(crate) struct MemSpill {
        segment_len: usize,
        state: Mutex<MemSpillState>,
        /// Values read back, from every segment.
        reads: Arc<AtomicU64>,
    }

    /// A segment and its bytes.
    type MemSegment = (Arc<Segment>, Arc<Mutex<Vec<u8>>>);

    #[derive(Debug, Default)]
    struct MemSpillState {
        current: Option<MemSegment>,
        sealed: Vec<(std::sync::Weak<Segment>, u64)>,
    }

    #[derive(Debug)]
    struct MemReader {
        data: Arc<Mutex<Vec<u8>>>,
        reads: Arc<AtomicU64>,
    }

    impl SegmentRead for MemReader {
        fn read(&self, offset: u64, len: usize) -> Vec<u8> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let data = self.data.lock().unwrap();
            data[offset as usize..offset as usize + len].to_vec()
        }
    }

    impl MemSpill {
        pub(crate) fn new(segment_len: usize) -> MemSpill {
            MemSpill {
                segment_len,
                state: Mutex::new(MemSpillState::default()),
                reads: Arc::default(),
            }
        }

        /// Values read back so far.
        pub(crate) fn reads(&self) -> u64 {
            self.reads.load(Ordering::Relaxed)
        }

        /// Segments still alive (held by a store or a copy of one).
        pub(crate) fn live_segments(&self) -> usize {
            let st = self.state.lock().unwrap();
            st.sealed
                .iter()
                .filter(|(w, _)| w.strong_count() > 0)
                .count()
                + usize::from(st.current.is_some())
        }
    }

    impl ValueSpill for MemSpill {
        fn store(&self, bytes: &[u8]) -> Option<(Arc<Segment>, u64)> {
            let mut st = self.state.lock().unwrap();
            let full = st
                .current
                .as_ref()
                .is_some_and(|(_, d)| d.lock().unwrap().len() >= self.segment_len);
            if full {
                let (seg, data) = st.current.take().unwrap();
                let len = data.lock().unwrap().len() as u64;
                st.sealed.push((Arc::downgrade(&seg), len));
            }
            let (seg, data) = st.current.get_or_insert_with(|| {
                let data = Arc::new(Mutex::new(Vec::new()));
                let seg = Arc::new(Segment::new(Box::new(MemReader {
                    data: data.clone(),
                    reads: self.reads.clone(),
                })));
                (seg, data)
            });
            let mut d = data.lock().unwrap();
            let offset = d.len() as u64;
            d.extend_from_slice(bytes);
            Some((seg.clone(), offset))
        }

        fn start_segment(&self) {
            let mut st = self.state.lock().unwrap();
            if let Some((seg, data)) = st.current.take() {
                let len = data.lock().unwrap().len() as u64;
                st.sealed.push((Arc::downgrade(&seg), len));
            }
        }

        fn evacuation_pass_done(&self) {}

        fn evacuation_pending(&self) -> bool {
            let st = self.state.lock().unwrap();
            let mut pending = false;
            for (weak, len) in &st.sealed {
                if let Some(seg) = weak.upgrade() {
                    if seg.referenced_bytes() * 2 < *len {
                        seg.mark_for_evacuation();
                    }
                    pending |= seg.marked_for_evacuation() && seg.referenced_bytes() > 0;
                }
            }
            pending
        }
    }

    /// A segment of `data` whose `read_in_order` fills a window with all of it, counting the
    /// windows it had to fill.
    #[derive(Debug)]
    struct WholeWindowReader {
        data: Vec<u8>,
        fills: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl SegmentRead for WholeWindowReader {
        fn read(&self, offset: u64, len: usize) -> Vec<u8> {
            self.data[offset as usize..][..len].to_vec()
        }

        fn read_in_order(&self, offset: u64, len: usize, window: &mut Window) -> Vec<u8> {
            if window.bytes.is_empty() {
                self.fills.fetch_add(1, Ordering::Relaxed);
                window.start = 0;
                window.bytes = self.data.clone();
            }
            window.bytes[offset as usize..][..len].to_vec()
        }
    }

    #[test]
    fn a_read_ahead_keeps_each_segments_window_across_reads_of_others() {
        let fills = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let values: Vec<Vec<Value>> = (0..5u8)
            .map(|s| {
                let data: Vec<u8> = (0..1000u32)
                    .map(|i| (i as u8).wrapping_mul(s + 1))
                    .collect();
                let segment = Arc::new(Segment::new(Box::new(WholeWindowReader {
                    data,
                    fills: fills.clone(),
                })));
                (0..10u64)
                    .map(|i| Value::Spilled {
                        segment: segment.clone(),
                        packed: ((i * 100) << LEN_BITS) | 100,
                    })
                    .collect()
            })
            .collect();
        let expected = |s: usize, i: usize| -> Vec<u8> {
            (i as u32 * 100..i as u32 * 100 + 100)
                .map(|b| (b as u8).wrapping_mul(s as u8 + 1))
                .collect()
        };
        // Reads value 0 of the first `segments` segments round robin, then value 1, ...;
        // the windows the segments had to fill.
        let fills_reading = |segments: usize| -> usize {
            fills.store(0, Ordering::Relaxed);
            let mut ahead = ReadAhead::default();
            for i in 0..10 {
                for (s, of_segment) in values.iter().enumerate().take(segments) {
                    let got = of_segment[i].bytes_in_order(&mut ahead);
                    assert_eq!(&*got, &expected(s, i)[..], "segment {s} value {i}");
                }
            }
            assert!(ahead.windows.len() <= READ_AHEAD_SEGMENTS);
            fills.load(Ordering::Relaxed)
        };
        // Two segments read alternately (a sealed one being evacuated and the current one):
        // one window each, for all their reads.
        assert_eq!(fills_reading(2), 2);
        // As many as it keeps windows for: still one each.
        assert_eq!(fills_reading(READ_AHEAD_SEGMENTS), READ_AHEAD_SEGMENTS);
        // One more than that: the least recently read is the one dropped, so every read
        // starts a window again (the bound on memory holds).
        assert_eq!(
            fills_reading(READ_AHEAD_SEGMENTS + 1),
            10 * (READ_AHEAD_SEGMENTS + 1)
        );
    }

    #[test]
    fn short_values_stay_in_the_heap_and_long_ones_spill() {
        let spill = MemSpill::new(1 << 20);
        let mut short = Value::from(vec![1u8; MIN_SPILLED_LEN - 1]);
        short.enter_store(Some(&spill));
        assert!(matches!(short, Value::Heap(_)));
        let mut long = Value::from(vec![7u8; 300]);
        long.enter_store(Some(&spill));
        assert!(matches!(long, Value::Spilled { .. }));
        assert_eq!(long.len(), 300);
        assert_eq!(long.to_vec(), vec![7u8; 300]);
        assert_eq!(long, Value::from(vec![7u8; 300]));
        let Value::Spilled { segment, .. } = &long else {
            unreachable!()
        };
        assert_eq!(segment.referenced_bytes(), 300);
        long.leave_store();
        assert_eq!(segment.referenced_bytes(), 0);
    }

    #[test]
    fn a_spilled_value_serializes_as_its_bytes() {
        let spill = MemSpill::new(1 << 20);
        let bytes = (0..200u8).collect::<Vec<_>>();
        let mut v = Value::from(bytes.clone());
        v.enter_store(Some(&spill));
        assert!(matches!(v, Value::Spilled { .. }));
        let boxed: Box<[u8]> = bytes.into_boxed_slice();
        let encoded = bincode::serialize(&v).unwrap();
        assert_eq!(encoded, bincode::serialize(&boxed).unwrap());
        let back: Value = bincode::deserialize(&encoded).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn evacuation_moves_a_value_to_the_current_segment() {
        let spill = MemSpill::new(256);
        let mut v = Value::from(vec![3u8; 256]);
        v.enter_store(Some(&spill));
        let Value::Spilled { segment: old, .. } = v.clone() else {
            unreachable!()
        };
        assert!(!v.evacuate(&spill), "not marked: stays");
        old.mark_for_evacuation();
        // The next store seals the full segment and opens another.
        assert!(v.evacuate(&spill));
        assert_eq!(old.referenced_bytes(), 0);
        assert_eq!(v.to_vec(), vec![3u8; 256]);
        let Value::Spilled { segment: new, .. } = &v else {
            unreachable!()
        };
        assert!(!Arc::ptr_eq(&old, new));
        assert_eq!(new.referenced_bytes(), 256);
    }
}
