//! Start-up: recovering the log from disk, and opening it for writing.
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

use std::collections::VecDeque;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::dir::{generation_path, list_generations};
use super::disk::RealDisk;
use super::handoff::{self, SharedWriter};
use super::index::MemLog;
use super::record::{
    find_valid_record_after, parse_record, Record, WAL_FORMAT_UNVERSIONED, WAL_FORMAT_VERSION,
};
use super::store::{LogStore, WalHandle};
use super::writer::{WalStats, Writer};
use crate::env::LogDisk;
use crate::files::{self, VOTE_MAGIC};
use crate::types::Vote;
use crate::StartError;

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The vote a member restarts with: a committed vote comes back uncommitted. A leader thus
/// starts as a follower of its own term and leads again only after a new election (a higher
/// term, a blank entry first) — as etcd's restarted leader does — instead of resuming at once
/// as openraft 0.9 would.
///
/// Why: a leader sends its last entries to followers before they are durable in its own log
/// (`early_append`), so entries it lost in a crash may sit on followers under its term.
/// Leading that term again, it would write different entries under the same log ids, and
/// Raft's log matching would take the two logs for one: the followers would keep and apply
/// the old entries, the leader the new ones (baton-sim seed 127 found it). A follower's
/// vote, uncommitted, changes nothing but that it learns its leader from the leader's next
/// message (a committed vote of the same leader outranks it).
fn as_restarted(vote: Vote) -> Vote {
    if vote.is_committed() {
        Vote {
            committed: false,
            ..vote
        }
    } else {
        vote
    }
}

/// The log recovered from disk, ready to be served.
pub(crate) struct Recovered {
    pub(crate) mem: MemLog,
    pub(super) generation: u64,
    pub(super) file_len: u64,
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
        mem.vote = Some(as_restarted(vote));
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

/// Opens the recovered log for writing on `disk` (`None`: the real one) and starts the
/// writer's batch loop: an OS thread on the real disk, a task with an injected one (see
/// `wal/handoff.rs`). Returns the store openraft drives and the node's handle.
pub(crate) fn open(
    raft_dir: &Path,
    rec: Recovered,
    disk: Option<Arc<dyn LogDisk>>,
) -> Result<(LogStore, WalHandle), StartError> {
    let wal_dir = raft_dir.join("wal");
    let path = generation_path(&wal_dir, rec.generation);
    let injected = disk.clone();
    let disk = disk.unwrap_or_else(|| Arc::new(RealDisk));
    let file = disk.open(&path, rec.file_len).map_err(io_err(&path))?;
    // Preallocated space left from before the restart is reused (it reads as zeros).
    let allocated = file.file_len().map_err(io_err(&path))?.max(rec.file_len);
    let stats = Arc::new(WalStats::default());
    stats.file_bytes.store(rec.file_len, Ordering::Relaxed);
    let writer = Writer {
        wal_dir,
        vote_path: raft_dir.join("vote"),
        disk,
        file,
        generation: rec.generation,
        pos: rec.file_len,
        allocated,
        dirty: false,
        failed: None,
        stats: stats.clone(),
        durable: Arc::new(Mutex::new((rec.generation, rec.file_len))),
        backlog: VecDeque::new(),
        stalled: Arc::new(AtomicBool::new(false)),
        stall_warned: None,
    };
    let stalled = writer.stalled.clone();
    let durable = writer.durable.clone();
    let (sink, batch_loop) =
        handoff::start(SharedWriter::new(writer), injected).map_err(io_err(raft_dir))?;
    let mem = Arc::new(RwLock::new(rec.mem));
    let store = LogStore {
        mem: mem.clone(),
        sink: sink.clone(),
        generation: rec.generation,
        file_bytes: rec.file_len,
        durable,
        unwritten_committed: None,
        early: None,
    };
    Ok((
        store,
        WalHandle {
            sink,
            mem,
            batch_loop: Mutex::new(Some(batch_loop)),
            stats,
            stalled,
        },
    ))
}
