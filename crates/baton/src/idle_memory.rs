//! Freed memory goes back to the system when a runtime worker goes idle.
//!
//! mimalloc returns a freed page to the system ("purge") only after `purge_delay` (1 s in
//! mimalloc 3) and only when the thread that owns it calls into the allocator again: a
//! member that served a burst and then idles keeps pages the burst freed resident, because
//! its workers sleep without allocating. Here a worker collects (`mi_collect(true)`: frees
//! its all-free pages and purges freed arena memory at once) as it parks, at most once per
//! [`COLLECT_INTERVAL`]: under load it parks many times a second (one collect a second), and
//! an idle member's timers (Raft heartbeats, lease ticks) wake and park it again soon after,
//! so what the last burst freed goes back within about a second of going idle. Go's runtime,
//! which etcd runs on, returns idle memory in the background the same way (its scavenger).
//!
//! Measured (single node, `put --total 100000` at 100 clients, 2 s of rest, `VmRSS`; 3 runs
//! each, alternating): 49.5–49.9 → 48.0–48.7 MiB; put with 100 clients for 10 s on fresh
//! servers 35.8–37.0k ops/s before, 34.6–45.5k after (server CPU per put alike, 27–28 µs).
//! Purging on every free instead (`MIMALLOC_PURGE_DELAY=0`, given to the bench client too)
//! gave 44.4–46.7 MiB but 29.3–35.1k ops/s against 35.9–36.7k, with ~12 % more server CPU
//! per put: not taken.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The shortest time between two collections on one worker. A forced collection walks the
/// thread's pages and purges freed memory with `madvise`, and memory purged while a burst
/// is still running is faulted in again; once a second keeps both out of the requests' way
/// (purging on every free cost ~12 % more CPU per put, see above).
const COLLECT_INTERVAL: Duration = Duration::from_secs(1);

thread_local! {
    /// When this thread last collected.
    static LAST_COLLECT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Makes `builder`'s workers collect freed memory as they park (see the module docs).
pub fn collect_when_parking(builder: &mut tokio::runtime::Builder) {
    builder.on_thread_park(collect_if_due);
}

fn collect_if_due() {
    let now = Instant::now();
    let due = LAST_COLLECT.with(|last| {
        let due = last
            .get()
            .is_none_or(|at| now.duration_since(at) >= COLLECT_INTERVAL);
        if due {
            last.set(Some(now));
        }
        due
    });
    if due {
        // SAFETY: `mi_collect` only frees and purges memory the allocator holds for no live
        // allocation; it may be called from any thread at any time.
        unsafe { libmimalloc_sys::mi_collect(true) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first park collects, the next ones within the interval do not.
    #[test]
    fn collects_at_most_once_per_interval() {
        LAST_COLLECT.with(|l| l.set(None));
        collect_if_due();
        let first = LAST_COLLECT
            .with(Cell::get)
            .expect("the first park collects");
        collect_if_due();
        assert_eq!(LAST_COLLECT.with(Cell::get), Some(first));
        let long_ago = first.checked_sub(COLLECT_INTERVAL).expect("the clock runs");
        LAST_COLLECT.with(|l| l.set(Some(long_ago)));
        collect_if_due();
        assert!(LAST_COLLECT.with(Cell::get).expect("collected") > long_ago);
    }
}
