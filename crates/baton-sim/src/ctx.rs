//! The state one run shares among the harness, the members and the clients ([`Ctx`]), and
//! the helpers every client uses to name members and keys and to draw its randomness.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_check::{LockRecord, Recorder, WatchEvent};
use baton_raft::{Node, WalWritePaths};
use parking_lot::Mutex;

use crate::clock::SimClock;
use crate::config::SimConfig;
use crate::disk::SimDisk;

/// State shared by the harness, the members and the clients of one run.
pub(crate) struct Ctx {
    pub(crate) config: SimConfig,
    pub(crate) dir: PathBuf,
    pub(crate) history: Recorder,
    pub(crate) watches: Vec<Mutex<Vec<WatchEvent>>>,
    pub(crate) locks: Mutex<Vec<LockRecord>>,
    pub(crate) nodes: Vec<Mutex<Option<Node>>>,
    pub(crate) clocks: Vec<Arc<SimClock>>,
    pub(crate) disks: Vec<Arc<SimDisk>>,
    pub(crate) incarnations: Vec<AtomicU64>,
    pub(crate) workload_end: Duration,
    pub(crate) faults_end: Duration,
    pub(crate) done: AtomicBool,
    pub(crate) liveness: Mutex<Result<Duration, String>>,
    /// The run's trace hash so far (see [`Ctx::trace`]).
    pub(crate) trace_hash: Mutex<u64>,
    /// Log write paths of the members' incarnations that ended (see `Outcome::wal`).
    pub(crate) wal: Mutex<WalWritePaths>,
    /// openraft requests answered from early answers, summed the same way (see
    /// `Outcome::answered_early`).
    pub(crate) answered_early: AtomicU64,
}

impl Ctx {
    /// Mixes one observation into the run's trace hash (FNV-1a).
    pub(crate) fn trace(&self, line: String) {
        let mut h = self.trace_hash.lock();
        for b in line.bytes().chain([b'\n']) {
            *h ^= b as u64;
            *h = h.wrapping_mul(0x100_0000_01b3);
        }
        tracing::debug!(target: "baton_sim::trace", "{line}");
    }

    /// Adds `node`'s log write paths and its requests answered early to the run's.
    pub(crate) fn tally_node(&self, node: &Node) {
        self.answered_early
            .fetch_add(node.appends_answered_early(), Ordering::Relaxed);
        let p = node.wal_write_paths();
        let mut w = self.wal.lock();
        w.inline_ops += p.inline_ops;
        w.loop_batches += p.loop_batches;
        w.loop_ops += p.loop_ops;
    }
}

/// A deterministic 64-bit mix of a seed and a stream id (SplitMix64's finalizer), so every
/// member and client gets its own independent, reproducible randomness.
pub fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

pub(crate) fn member_name(i: usize) -> String {
    format!("m{}", i + 1)
}

/// etcd's prefix range end: the prefix with its last byte incremented.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}
