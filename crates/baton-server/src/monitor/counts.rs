//! Counts the services keep for the scrape: kept apart from the module root so that the
//! services, which the scrape does not know, and the scrape both import them from here.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Range requests served to clients (etcd counts each in `etcd_mvcc_range_total` on the
/// member that served it; the reads `apply` makes come from the apply tally).
pub(super) static RANGES_SERVED: AtomicU64 = AtomicU64::new(0);

/// Open Watch streams (`etcd_debugging_mvcc_watch_stream_total`).
pub(super) static WATCH_STREAMS: AtomicI64 = AtomicI64::new(0);

/// Counts a Range served to a client (after its permission check, as etcd counts).
pub(crate) fn range_served() {
    RANGES_SERVED.fetch_add(1, Ordering::Relaxed);
}

/// Counts a Watch stream from its start until it ends.
pub(crate) struct WatchStream(());

impl WatchStream {
    pub(crate) fn open() -> WatchStream {
        WATCH_STREAMS.fetch_add(1, Ordering::Relaxed);
        baton_raft::cached_gauge!("baton_watch_streams").increment(1.0);
        WatchStream(())
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        WATCH_STREAMS.fetch_sub(1, Ordering::Relaxed);
        baton_raft::cached_gauge!("baton_watch_streams").decrement(1.0);
    }
}
