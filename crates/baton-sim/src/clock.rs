//! Simulated wall clocks: simulated time since a fixed epoch, plus a per-member offset that
//! a fault can jump (forwards or backwards), as an NTP step or a bad RTC would.

use std::sync::atomic::{AtomicI64, Ordering};

use baton_raft::WallClock;

/// The wall clock every member starts from: 2026-01-01T00:00:00Z in milliseconds.
pub const EPOCH_MS: u64 = 1_767_225_600_000;

/// One member's wall clock.
#[derive(Default)]
pub struct SimClock {
    offset_ms: AtomicI64,
}

impl SimClock {
    /// Moves this clock by `delta_ms` (negative: backwards).
    pub fn jump(&self, delta_ms: i64) {
        self.offset_ms.fetch_add(delta_ms, Ordering::Relaxed);
    }
}

impl WallClock for SimClock {
    fn now_ms(&self) -> u64 {
        let elapsed = turmoil::sim_elapsed().unwrap_or_default().as_millis() as i64;
        (EPOCH_MS as i64 + elapsed + self.offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }
}
