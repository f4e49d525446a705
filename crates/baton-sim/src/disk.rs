//! The simulated disk's durability model on top of real files.
//!
//! A member's log writer reports, after every fsync (and for files written atomically or
//! recovered at start), how many bytes of each log file are durable. A simulated crash then
//! cuts every log file back to its durable length — optionally keeping a random part of
//! the unsynced tail, a torn write — before the member restarts: exactly what a power loss
//! does to data the process wrote but never fsynced. The other files Baton writes (vote,
//! member identity, snapshots, log rewrites) go through write-to-temp + fsync + rename, so
//! they are durable once they exist. A disk can also be made slow (every batch of the log
//! writer takes that long) or *lying* (fsync is a no-op: nothing written after start becomes
//! durable), the bug switch that shows the checkers catch lost acknowledged writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use baton_raft::DiskHooks;
use parking_lot::Mutex;
use rand::Rng;

/// One member's disk.
#[derive(Default)]
pub struct SimDisk {
    /// Durable length of each log file.
    synced: Mutex<BTreeMap<PathBuf, u64>>,
    /// Extra latency of each log write batch, in milliseconds.
    slow_ms: AtomicU64,
    /// Fsync does nothing (fault injection / checker self-test).
    lying: AtomicBool,
}

impl SimDisk {
    pub fn new(lying: bool) -> Self {
        SimDisk {
            lying: AtomicBool::new(lying),
            ..Default::default()
        }
    }

    /// Makes each log write batch take `d` (zero: a fast disk again).
    pub fn set_slow(&self, d: Duration) {
        self.slow_ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// Applies a crash to the files: every log file is cut back to its durable length, plus
    /// (if `torn`) a random part of what was written after it. Returns the bytes dropped.
    pub fn crash(&self, rng: &mut impl Rng, torn: bool) -> std::io::Result<u64> {
        let synced = std::mem::take(&mut *self.synced.lock());
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
            let f = std::fs::OpenOptions::new().write(true).open(&path)?;
            f.set_len(keep)?;
            f.sync_all()?;
            dropped += len - keep;
        }
        Ok(dropped)
    }
}

impl DiskHooks for SimDisk {
    fn synced(&self, path: &Path, len: u64) {
        let mut synced = self.synced.lock();
        if self.lying.load(Ordering::Relaxed) {
            // Only what the file held when it was first seen (recovered or atomically
            // written) is durable.
            synced.entry(path.to_path_buf()).or_insert(len);
        } else {
            synced.insert(path.to_path_buf(), len);
        }
    }

    fn fsync_delay(&self) -> Duration {
        Duration::from_millis(self.slow_ms.load(Ordering::Relaxed))
    }
}
