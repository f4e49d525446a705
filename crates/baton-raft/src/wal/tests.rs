//! The WAL's tests across its parts: golden records, recovery (torn tails, corruption,
//! format versions), preallocation, rewrites, read-back and a full disk.

use std::fs::{self, File, OpenOptions};
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use baton_core::Command;
use openraft::storage::RaftLogStorage;
use openraft::{EntryPayload, LeaderId, RaftLogReader};

use super::dir::{generation_path, list_generations};
use super::index::{encode_entries, Loc, MemLog, Source, CACHE_BYTES};
use super::reader::fetch;
use super::record::{
    encode_record, entry_size, parse_record, Record, RecordRef, RECORD_HEADER_BYTES,
    WAL_FORMAT_VERSION,
};
use super::recovery::{open, recover, Recovered};
use super::store::LogStore;
use super::writer::{Op, PREALLOCATE_BYTES};
use crate::types::{LogId, RaftEntry, Request, Vote};
use crate::StartError;

/// Reading a whole range of the in-memory log, as the log store does.
trait ReadRange {
    fn read(&self, range: impl RangeBounds<u64>) -> Result<Vec<RaftEntry>, String>;
}

impl ReadRange for MemLog {
    fn read(&self, range: impl RangeBounds<u64>) -> Result<Vec<RaftEntry>, String> {
        fetch(self.plan(range)?)
    }
}

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

/// Golden bytes of every record kind as written to disk, framing included (see
/// `crate::golden` and `baton_core::format`): a data directory holds these bytes, so
/// none may change. Each file is parsed back like recovery parses it and encoded again.
#[test]
fn golden_records() {
    use crate::golden::{
        assert_no_problems, compare_file, entries, golden_dir, header, log_id, missing_variants,
        orphans,
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
            Ok((back, end)) if end == bytes.len() && file(&[back.as_ref()]) == bytes => {}
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

/// The writer thread keeps the default scheduling policy for writes run inline or queued,
/// and the first append sent ahead to followers (`send_with(_, false)`) puts it under
/// `SCHED_BATCH` (`SharedWriter::writer_wakeups_do_not_preempt`).
#[tokio::test]
async fn an_append_sent_ahead_stops_the_writer_thread_preempting() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = recover(tmp.path()).unwrap();
    let (_store, wal) = open(tmp.path(), rec, None).unwrap();
    let write = |i| {
        let mut bytes = Vec::new();
        encode_record(&mut bytes, &RecordRef::Entries(&[entry(1, i)]));
        Op::Write { bytes }
    };
    // The thread publishes its id as it starts: wait up to 10 s for it.
    let mut tid = 0;
    for _ in 0..2000 {
        tid = wal.sink.writer_thread();
        if tid != 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_ne!(tid, 0, "the writer thread runs");
    // SAFETY: sched_getscheduler only reads the policy of thread `tid` (alive: the log is open).
    let policy = || unsafe { libc::sched_getscheduler(tid) };
    for i in 0..3 {
        wal.sink.send(write(i)).ok().unwrap();
    }
    assert_eq!(policy(), libc::SCHED_OTHER, "writes of a single member");
    wal.sink.send_with(write(3), false).ok().unwrap();
    assert_eq!(policy(), libc::SCHED_BATCH, "after an append sent ahead");
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
    // The writer clears the flag once its whole backlog is written, just after it has
    // answered the vote (the answer can reach this task first).
    let t = std::time::Instant::now();
    while wal.stalled() && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!wal.stalled(), "the writer is no longer stalled");
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
