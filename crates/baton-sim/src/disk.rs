//! The simulated disk: a model of durability on top of real files, *below* the real log
//! writer (it implements baton-raft's [`LogDisk`], so the writer's inline path on the Raft
//! core task, its batch loop and its hand-off rules all run under simulation).
//!
//! Each log file the writer opens remembers how far it has been written and, at every
//! sync, how far it is durable (a file opened at start or after a rewrite is durable as it
//! is: it was recovered, or written atomically). A simulated crash then cuts every log file
//! back to its durable length — optionally keeping a random part of the unsynced tail, a
//! torn write — before the member restarts: exactly what a power loss does to data the
//! process wrote but never fsynced. The other files Baton writes (vote, member identity,
//! snapshots, log rewrites) go through write-to-temp + fsync + rename, so they are durable
//! once they exist. Even a fast disk's sync now and then takes longer than the writer's 2 ms
//! inline bound (one in [`SLOW_SYNC_ONE_IN`], drawn from the seed), as a real disk's does,
//! so the writes after it go through the batch loop until a quick one: every seed runs both
//! paths. A disk can also be made slow (every batch of the writer's loop waits that
//! long, and each sync reports that it took that long, so the writer stops writing inline
//! as it would on a real slow disk) or *lying* (sync is a no-op: nothing written after start
//! becomes durable), the bug switch that shows the checkers catch lost acknowledged writes.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_raft::{LogDisk, LogFile};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One sync in this many takes [`SLOW_SYNC`] instead of [`QUICK_SYNC`] (a real disk's
/// occasional slow fdatasync; see the module docs).
const SLOW_SYNC_ONE_IN: u32 = 8;
const SLOW_SYNC: Duration = Duration::from_millis(3);
const QUICK_SYNC: Duration = Duration::from_micros(100);

/// One member's disk.
pub struct SimDisk {
    model: Arc<Model>,
}

/// What a disk's files share.
struct Model {
    /// Durable length of each log file.
    synced: Mutex<BTreeMap<PathBuf, u64>>,
    /// Extra latency of each log write batch, in milliseconds.
    slow_ms: AtomicU64,
    /// Sync does nothing (fault injection / checker self-test).
    lying: AtomicBool,
    /// Draws how long each sync takes.
    rng: Mutex<StdRng>,
}

impl Model {
    /// `path` is durable through its first `len` bytes.
    fn synced(&self, path: &Path, len: u64, first_sight: bool) {
        let mut synced = self.synced.lock();
        if self.lying.load(Ordering::Relaxed) {
            // Only what the file held when it was first seen (recovered or atomically
            // written) is durable.
            if first_sight {
                synced.entry(path.to_path_buf()).or_insert(len);
            }
        } else {
            synced.insert(path.to_path_buf(), len);
        }
    }

    fn latency(&self) -> Duration {
        Duration::from_millis(self.slow_ms.load(Ordering::Relaxed))
    }

    /// How long one sync takes: the disk's latency, else mostly quick.
    fn sync_time(&self) -> Duration {
        let latency = self.latency();
        if !latency.is_zero() {
            return latency;
        }
        if self.rng.lock().gen_ratio(1, SLOW_SYNC_ONE_IN) {
            SLOW_SYNC
        } else {
            QUICK_SYNC
        }
    }
}

impl SimDisk {
    /// A disk whose sync times are drawn from `seed`.
    pub fn new(lying: bool, seed: u64) -> Self {
        SimDisk {
            model: Arc::new(Model {
                synced: Mutex::default(),
                slow_ms: AtomicU64::new(0),
                lying: AtomicBool::new(lying),
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
            }),
        }
    }

    /// Makes each log write batch take `d` (zero: a fast disk again).
    pub fn set_slow(&self, d: Duration) {
        self.model
            .slow_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// Applies a crash to the files: every log file is cut back to its durable length, plus
    /// (if `torn`) a random part of what was written after it. Returns the bytes dropped.
    pub fn crash(&self, rng: &mut impl Rng, torn: bool) -> io::Result<u64> {
        let synced = std::mem::take(&mut *self.model.synced.lock());
        let mut dropped = 0;
        for (path, durable) in synced {
            let Ok(meta) = std::fs::metadata(&path) else {
                continue; // deleted by a rewrite
            };
            let len = meta.len();
            if len <= durable {
                continue;
            }
            let keep = if torn {
                durable + rng.gen_range(0..=len - durable)
            } else {
                durable
            };
            let f = OpenOptions::new().write(true).open(&path)?;
            f.set_len(keep)?;
            f.sync_all()?;
            dropped += len - keep;
        }
        Ok(dropped)
    }
}

impl LogDisk for SimDisk {
    fn open(&self, path: &Path, durable: u64) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new().write(true).open(path)?;
        self.model.synced(path, durable, true);
        Ok(Box::new(SimFile {
            file,
            path: path.to_path_buf(),
            written: durable,
            model: self.model.clone(),
        }))
    }

    fn latency(&self) -> Duration {
        self.model.latency()
    }
}

/// A log file of a [`SimDisk`]: a real file whose durability the model decides.
struct SimFile {
    file: File,
    path: PathBuf,
    /// The end of what has been written (durable or not).
    written: u64,
    model: Arc<Model>,
}

impl LogFile for SimFile {
    fn file_len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn allocate(&mut self, offset: u64, len: u64) -> io::Result<()> {
        // Space is the host's (a tmpfs): growing the file is what fallocate would do.
        let end = offset + len;
        if self.file.metadata()?.len() < end {
            self.file.set_len(end)?;
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(buf, offset)?;
        self.written = self.written.max(offset + buf.len() as u64);
        Ok(())
    }

    /// Durable through everything written; "took" simulated time (see [`Model::sync_time`]).
    fn sync(&mut self) -> io::Result<Duration> {
        self.model.synced(&self.path, self.written, false);
        Ok(self.model.sync_time())
    }
}
