//! The disk watch: a full disk is a `NOSPACE` alarm, not a wedged member (issue 14).
//!
//! openraft 0.9 stops its core for good on the first storage error it is handed, so a member
//! whose disk filled up used to stay up answering every write and linearizable read with a
//! raw openraft error until restarted (and a restart needed room for a whole snapshot before
//! it served anything). Instead:
//!
//! - **Before the disk is full**, every `LEASE_TICK` a member looks at the free space of its
//!   data directory's file system (`statvfs`). Below the reserve
//!   ([`DEFAULT_SPACE_RESERVE_BYTES`], `--disk-reserve-bytes`) its space is *low*; it also is
//!   while the log writer is stalled on `ENOSPC` or a snapshot did not fit (see below). The
//!   reserve is room for what must still be written while writes are refused: the alarm
//!   entry, deletes, compaction, a vote, the log's preallocation steps.
//! - **Low space refuses writes that add data** on this member at once
//!   (`ProposeError::NoSpace`, etcd's `etcdserver: mvcc: database space exceeded`), and the
//!   leader raises `NOSPACE` for itself through the log (`Command::Alarm`, a leader duty):
//!   every replica then refuses them in `apply`, and `etcdctl alarm list` shows it. Reads,
//!   deletes and compaction go on.
//! - **`ENOSPC` is never an error handed to openraft.** The log writer keeps what it could
//!   not write and retries (the tick pokes it) without acknowledging anything; a snapshot
//!   that does not fit is not attempted (or its partial file is removed) and openraft is
//!   answered with the snapshot already on disk, which it ignores as not newer. Nothing is
//!   acknowledged that is not durable, so nothing acknowledged is lost either way.
//! - **Recovery is automatic**: once free space is back above the reserve plus a quarter
//!   (hysteresis, so the alarm does not flap at the threshold), the writer is unstalled and
//!   a snapshot fits, the member clears the alarm it raised (also from a follower: clearing
//!   is a client's request too, `etcdctl alarm disarm`).
//!
//! With an injected disk (the simulation) free space is not measured: the simulated disk
//! is never full.
//!
//! **The backend quota** (`--quota-backend-bytes`, issue 18) shares this path. etcd raises
//! `NOSPACE` when its bbolt file would outgrow the quota; Baton holds the whole store in
//! memory, so what counts is the replicated state's size estimate
//! (`StateMachine::approximate_size_bytes`: every retained version's key and value plus a
//! fixed overhead, leases, locks, fences), which grows with every revision kept and shrinks
//! when a compaction drops history. The tick compares it with the quota ([`over_quota`];
//! less often on a store whose estimate is slow to compute, see `disk_watch`);
//! over it, this member refuses writes that add data at once and raises its own `NOSPACE`
//! through the log, as every etcd member does after applying the write that crossed it.
//! Unlike the disk's, a quota alarm never clears itself: as on etcd, the operator compacts
//! (and defragments) and then disarms it (`etcdctl alarm disarm`); disarmed while still
//! over the quota, it is raised again at the next tick.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Default free-space reserve of the data directory's file system: 64 MiB. Big enough for
/// what is written while writes are refused (an alarm entry is ~100 bytes, a delete or
/// compaction a few hundred, the log grows in 1 MiB preallocated steps) many times over,
/// and small enough that a test on a 200 MB file system reaches it. etcd's comparable limit
/// is its 2 GiB backend quota, which bounds the database rather than the disk; a disk much
/// smaller than Baton's state needs `--disk-reserve-bytes` lowered, one shared with other
/// data raised.
pub const DEFAULT_SPACE_RESERVE_BYTES: u64 = 64 << 20;

/// etcd's default `--quota-backend-bytes` (2 GiB), used for 0.
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 << 30;

/// The quota etcd suggests at most (8 GiB): above it a warning is logged, as etcd's.
pub const MAX_SUGGESTED_QUOTA_BACKEND_BYTES: u64 = 8 << 30;

/// How often at most the disk watch repeats the same warning.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether `e` says the file system (or the user's quota) is full.
pub(crate) fn is_enospc(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Bytes an unprivileged writer may still allocate on the file system holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a valid NUL-terminated string and `st` points to writable memory
    // of the right type; statvfs initializes it when it returns 0.
    let rc = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: initialized by the successful call above.
    let st = unsafe { st.assume_init() };
    // The field types are narrower on 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let (blocks, size) = (st.f_bavail as u64, st.f_frsize as u64);
    Ok(blocks.saturating_mul(size))
}

/// The low-space decision, pure. `free`: bytes free (`None`: not measured); `blocked`: the
/// log writer is stalled on `ENOSPC` or the last snapshot did not fit. Space turns low below
/// `reserve` and turns back only at `reserve * 5/4`, so a member hovering at the threshold
/// does not raise and clear its alarm every tick. A zero reserve disables the measurement
/// (`ENOSPC` still counts).
pub(crate) fn judge(free: Option<u64>, reserve: u64, was_low: bool, blocked: bool) -> bool {
    if blocked {
        return true;
    }
    let Some(free) = free else {
        return false;
    };
    if reserve == 0 {
        return false;
    }
    let threshold = if was_low {
        reserve.saturating_add(reserve / 4)
    } else {
        reserve
    };
    free < threshold
}

/// Whether a state of `size` bytes (the core's estimate) is over `quota` (`None`: none).
/// etcd refuses a write when `size + cost >= quota`: [`Space::would_exceed`] makes that
/// judgement before a write is proposed; this one, after applies, catches what several
/// writes in flight together added (each judged alone before any was applied).
pub(crate) fn over_quota(size: u64, quota: Option<u64>) -> bool {
    quota.is_some_and(|q| size >= q)
}

/// Whether a snapshot of about `estimate` bytes fits in `free`, keeping a quarter of the
/// reserve (at least 1 MiB, a log preallocation step) for the log meanwhile.
pub(crate) fn snapshot_fits(free: Option<u64>, reserve: u64, estimate: u64) -> bool {
    free.is_none_or(|free| free >= estimate.saturating_add((reserve / 4).max(1 << 20)))
}

/// A log line at most every [`LOG_EVERY`].
#[derive(Default)]
pub(crate) struct RateLimit {
    last: Mutex<Option<Instant>>,
}

impl RateLimit {
    pub(crate) fn allow(&self) -> bool {
        let mut last = self.last.lock();
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// What the disk watch knows, shared by the tick, the snapshot builder and `propose`.
pub(crate) struct Space {
    /// `--disk-reserve-bytes`.
    pub(crate) reserve: u64,
    /// `--quota-backend-bytes` (`None`: no quota).
    pub(crate) quota: Option<u64>,
    /// The last quota judgement: the state is over the quota, writes that add data are
    /// refused on this member.
    over_quota: AtomicBool,
    /// The compact revision the last judgement saw: a compaction since (the one thing that
    /// shrinks the store) makes it stale, and it refuses nothing until judged again.
    judged_at_compaction: AtomicI64,
    /// The estimate's part outside the key space at the last judgement (leases, locks,
    /// fences), added to the key space's `O(1)` size after every apply ([`Space::near_quota`]).
    rest_bytes: AtomicU64,
    /// Wakes the quota check at once when an apply takes the store over the quota, so every
    /// member raises its alarm right after applying the write that crossed it, as etcd's
    /// (and when a write was refused for the quota before it was proposed).
    pub(crate) quota_wake: tokio::sync::Notify,
    /// A write was refused since the last quota judgement because it would have taken the
    /// store to the quota ([`Space::would_exceed`]): the next judgement raises `NOSPACE`
    /// though the store itself is under the quota, as etcd's `quotaAlarmer` raises it on the
    /// first write it refuses.
    write_refused_for_quota: AtomicBool,
    /// Measure free space with statvfs (not with an injected disk).
    measure: bool,
    /// Free bytes at the last measurement (`u64::MAX`: not measured).
    free: AtomicU64,
    /// The last judgement: writes that add data are refused on this member.
    low: AtomicBool,
    /// A snapshot was not written for lack of room since the last one that was.
    snapshot_blocked: AtomicBool,
    /// Warnings of the snapshot builder.
    pub(crate) snapshot_log: RateLimit,
}

impl Space {
    pub(crate) fn new(reserve: u64, quota: Option<u64>, measure: bool) -> Self {
        Space {
            reserve,
            quota,
            over_quota: AtomicBool::new(false),
            write_refused_for_quota: AtomicBool::new(false),
            judged_at_compaction: AtomicI64::new(0),
            rest_bytes: AtomicU64::new(0),
            quota_wake: tokio::sync::Notify::new(),
            measure,
            free: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
            snapshot_blocked: AtomicBool::new(false),
            snapshot_log: RateLimit::default(),
        }
    }

    /// Measures the free space of `dir`'s file system now (`None`: not measured, or the
    /// measurement failed, which is not taken as a full disk).
    pub(crate) fn measure(&self, dir: &Path) -> Option<u64> {
        let free = if self.measure {
            free_bytes(dir).ok()
        } else {
            None
        };
        self.free.store(free.unwrap_or(u64::MAX), Ordering::Relaxed);
        free
    }

    /// The free bytes of the last measurement.
    pub(crate) fn last_free(&self) -> Option<u64> {
        Some(self.free.load(Ordering::Relaxed)).filter(|f| *f != u64::MAX)
    }

    pub(crate) fn is_low(&self) -> bool {
        self.low.load(Ordering::Acquire)
    }

    /// Records the judgement; returns the previous one.
    pub(crate) fn set_low(&self, low: bool) -> bool {
        self.low.swap(low, Ordering::AcqRel)
    }

    /// The last quota judgement.
    pub(crate) fn over_quota(&self) -> bool {
        self.over_quota.load(Ordering::Acquire)
    }

    /// Whether the last quota judgement still refuses writes in a state compacted up to
    /// `compact_revision`: not once a compaction happened after it (the next check
    /// judges again; an operator who compacted and disarmed can write at once).
    pub(crate) fn over_quota_at(&self, compact_revision: i64) -> bool {
        self.over_quota() && self.judged_at_compaction.load(Ordering::Acquire) == compact_revision
    }

    /// Records a quota judgement made on a state compacted up to `compact_revision`, whose
    /// estimate had `rest` bytes outside the key space; returns the previous judgement.
    pub(crate) fn set_over_quota(&self, over: bool, compact_revision: i64, rest: u64) -> bool {
        self.judged_at_compaction
            .store(compact_revision, Ordering::Release);
        self.rest_bytes.store(rest, Ordering::Relaxed);
        self.over_quota.swap(over, Ordering::AcqRel)
    }

    /// Before a write is proposed: whether a key space of `kv_bytes` (plus the rest as last
    /// measured) and the write's `cost` would reach the quota — etcd's
    /// `backendQuota.Available` (`size + cost < quota`) negated. When it would, the write is
    /// refused and the quota check woken to raise `NOSPACE` (see
    /// [`Space::take_write_refused_for_quota`]).
    pub(crate) fn would_exceed(&self, kv_bytes: u64, cost: u64) -> bool {
        let size = kv_bytes
            .saturating_add(self.rest_bytes.load(Ordering::Relaxed))
            .saturating_add(cost);
        if !over_quota(size, self.quota) {
            return false;
        }
        self.write_refused_for_quota.store(true, Ordering::Release);
        self.quota_wake.notify_one();
        true
    }

    /// Whether a write was refused for the quota since the last call.
    pub(crate) fn take_write_refused_for_quota(&self) -> bool {
        self.write_refused_for_quota.swap(false, Ordering::AcqRel)
    }

    /// After an apply: whether a key space of `kv_bytes` (plus the rest as last measured)
    /// reaches the quota while the last judgement said it did not — then the quota check
    /// should run now rather than at the next tick.
    pub(crate) fn near_quota(&self, kv_bytes: u64) -> bool {
        !self.over_quota()
            && over_quota(
                kv_bytes.saturating_add(self.rest_bytes.load(Ordering::Relaxed)),
                self.quota,
            )
    }

    pub(crate) fn snapshot_blocked(&self) -> bool {
        self.snapshot_blocked.load(Ordering::Acquire)
    }

    pub(crate) fn set_snapshot_blocked(&self, blocked: bool) {
        self.snapshot_blocked.store(blocked, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_below_the_reserve_and_back_only_above_it_with_margin() {
        let r = 100;
        assert!(!judge(Some(100), r, false, false));
        assert!(judge(Some(99), r, false, false));
        // Once low, it takes a quarter more to clear.
        assert!(judge(Some(100), r, true, false));
        assert!(judge(Some(124), r, true, false));
        assert!(!judge(Some(125), r, true, false));
        // A stalled writer or a snapshot that did not fit is low whatever statvfs says.
        assert!(judge(Some(u64::MAX), r, false, true));
        assert!(judge(None, r, false, true));
        // Not measured, or no reserve: only ENOSPC counts.
        assert!(!judge(None, r, true, false));
        assert!(!judge(Some(0), 0, true, false));
    }

    #[test]
    fn over_the_quota_from_its_size_on_and_never_without_one() {
        assert!(!over_quota(99, Some(100)));
        assert!(over_quota(100, Some(100)));
        assert!(over_quota(u64::MAX, Some(100)));
        assert!(!over_quota(u64::MAX, None));
    }

    #[test]
    fn a_write_that_would_reach_the_quota_is_refused_once_and_noted_for_the_alarm() {
        let space = Space::new(0, Some(1000), false);
        space.set_over_quota(false, 1, 100); // 100 bytes of leases, locks and fences
        assert!(!space.would_exceed(800, 99)); // 999 < 1000, as etcd's `Available`
        assert!(!space.take_write_refused_for_quota());
        assert!(space.would_exceed(800, 100)); // 1000: refused
        assert!(space.take_write_refused_for_quota());
        assert!(!space.take_write_refused_for_quota(), "taken once");
        // No quota: nothing is refused.
        let unbounded = Space::new(0, None, false);
        assert!(!unbounded.would_exceed(u64::MAX, u64::MAX));
    }

    #[test]
    fn a_snapshot_fits_with_room_left_for_the_log() {
        let mib = 1 << 20;
        assert!(snapshot_fits(None, 64 * mib, u64::MAX / 2));
        assert!(snapshot_fits(Some(26 * mib), 64 * mib, 10 * mib));
        assert!(!snapshot_fits(Some(26 * mib - 1), 64 * mib, 10 * mib));
        // At least one preallocation step stays free.
        assert!(!snapshot_fits(Some(10 * mib), 0, 10 * mib));
    }

    #[test]
    fn free_bytes_reads_this_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn enospc_and_quota_are_full_disks_and_nothing_else_is() {
        assert!(is_enospc(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_enospc(&io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_enospc(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(!is_enospc(&io::Error::other("no space")));
    }
}
