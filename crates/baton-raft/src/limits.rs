//! The replica's timeouts and bounds, in one place: each says what it bounds and why it is
//! what it is. (The log's own bounds are in `wal`, the peer message's in `wire`, the
//! forwarder's in `forward::Limits`.)

use std::time::Duration;

/// How long a proposal or read barrier may take before the caller gets `Timeout` (etcd's
/// default request timeout is of the same order).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `start` of a sole voter waits for it to become leader, so the first request after
/// a start does not fail with "no leader". (Members of larger clusters do not wait: their
/// peers may not be up yet, and requests wait for a leader anyway.)
pub(crate) const STARTUP_LEADER_WAIT: Duration = Duration::from_secs(5);

/// After a forwarded request failed without reaching a leader, wait at most this long for the
/// leader to change before trying again (the same leader may also come back). Also the pause
/// between ReadIndex attempts that found no quorum in time.
pub(crate) const LEADER_RETRY_INTERVAL: Duration = Duration::from_millis(50);

/// Retry interval bounds of publishing this member's attributes.
pub(crate) const PUBLISH_RETRY_MIN: Duration = Duration::from_millis(100);
pub(crate) const PUBLISH_RETRY_MAX: Duration = Duration::from_secs(2);

/// Lease clock resolution: a lease expires at most this much after its deadline.
pub(crate) const LEASE_TICK: Duration = Duration::from_millis(100);

/// A gap between two lease ticks longer than this means the leader stalled (paused, starved,
/// stuck): the gap is added to every deadline before anything is expired (etcd#15247).
pub(crate) const LEASE_STALL: Duration = Duration::from_millis(300);

/// Bounds one `ExpireLeases` entry (an entry is fsynced and applied as one unit).
pub(crate) const MAX_EXPIRE_IDS_PER_ENTRY: usize = 1000;

/// Bounds the expiry work of one tick, so a mass expiry cannot monopolize the log.
pub(crate) const MAX_EXPIRE_ENTRIES_PER_TICK: usize = 16;

/// Bounds one `LeaseCheckpoint` entry.
pub(crate) const MAX_CHECKPOINTS_PER_ENTRY: usize = 1000;

/// A snapshot is also taken once the log since the last one holds this many bytes (encoded),
/// or as many as the last snapshot if that is more. The entry count alone
/// (`snapshot_every_entries`) does not bound the log: the proposer packs hundreds of commands
/// into one entry under load, so 10 000 entries were a million 256-byte puts. (The log's
/// entries no longer stay in memory — see `wal/index.rs` — so this bounds the log file and a
/// restart's re-apply.) Growing the bound with the snapshot keeps the cost amortized: the
/// snapshots written never add up to more than about twice the log written.
///
/// Why 64 MiB (16 before): a snapshot rewrites the whole state, and under load its bytes
/// share the disk with the log's fsyncs. For a state smaller than the bound — the usual
/// coordination store — the bound alone sets how often that happens. 64 MiB is about 200k
/// puts of 256 B, the order of etcd 3.4's own snapshot interval (`--snapshot-count`
/// 100 000 entries, one request each); a restart re-applies at most that much (measured:
/// 191k puts, 56 MB of log, no snapshot: kill -9 → first write after restart in 1.07 s).
/// Measured (3 members, put with 100 clients, 9 s from an empty store, three alternating
/// pairs): one snapshot per member instead of three, throughput +5.6 % (34.2k vs 32.4k
/// ops/s), p99 6.4–7.7 ms against 8.6–9.1.
pub(crate) const SNAPSHOT_LOG_MIN_BYTES: u64 = 64 << 20;
