//! How a replica is started ([`NodeConfig`]) and the election timing derived from it once,
//! at start ([`ElectionTiming`]): the pre-vote timer, leader transfer and openraft's own
//! configuration all read the same numbers.

use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::ClusterConfig;
use crate::env::Environment;
use crate::space;

/// etcd's lease checkpoint interval: remaining TTLs of long leases are written to the log this
/// often so a new leader does not renew them blindly.
pub const DEFAULT_LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);

/// How to start a replica.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Human name of the member (etcd's `--name`).
    pub name: String,
    /// Where the log, vote, snapshots and member metadata live.
    pub data_dir: PathBuf,
    /// Client URLs advertised in the member list.
    pub client_urls: Vec<String>,
    /// Peer URLs advertised in the member list.
    pub peer_urls: Vec<String>,
    /// Raft heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Raft election timeout (also the extension granted to live leases on leader change).
    pub election_timeout: Duration,
    /// Bound of each synced watcher's queue in the watch hub.
    pub max_pending_watch_events: usize,
    /// Take a snapshot (and purge the log before it) after this many applied entries.
    pub snapshot_every_entries: u64,
    /// How often the leader records the remaining TTL of leases longer than this interval
    /// in the log, so a new leader continues their countdown instead of restarting it.
    pub lease_checkpoint_interval: Duration,
    /// Member of a multi-member cluster (`--initial-cluster` given); `None`: a single-member
    /// cluster with random ids and no peer listener, as before clusters existed.
    pub cluster: Option<ClusterConfig>,
    /// Network, clock, randomness and the log's disk; the default is the real world (only a
    /// simulation injects anything, see `env`).
    pub env: Environment,
    /// Free bytes the data directory's file system keeps in reserve: below it this member
    /// refuses writes that add data and raises `NOSPACE` (see `space`); 0 disables the
    /// measurement (a full disk still raises it).
    pub disk_reserve_bytes: u64,
    /// etcd's `--quota-backend-bytes` as resolved by the server: the size estimate of the
    /// replicated state (`StateMachine::approximate_size_bytes`) above which this member
    /// raises `NOSPACE` through the log (see `space`); `None`: no quota (etcd's negative
    /// value).
    pub quota_backend_bytes: Option<u64>,
    /// etcd's `--strict-reconfig-check` (default on): membership changes that would leave
    /// fewer started voters than a quorum are refused (`membership::plan`).
    pub strict_reconfig_check: bool,
    /// etcd's `--force-new-cluster`: restart this member, with its data, as the only voter
    /// of its cluster (`force`). Refused on a member without data.
    pub force_new_cluster: bool,
    /// The initial corruption check will run before this member serves (etcd's
    /// `--experimental-initial-corrupt-check`): a `member/snap/db` whose `key` bucket fails
    /// its checksum is then loaded, with a warning, for that check to compare with the
    /// other members, instead of being refused (`StartError::SnapshotKvChanged`). Such a
    /// member writes no snapshot of its own until the caller, its check passed, calls
    /// `Node::release_snapshots` (`Node::snapshot_kv_changed` says whether it applies).
    pub snapshot_kv_checked_by_peers: bool,
}

impl NodeConfig {
    /// Defaults suited to a single local member.
    pub fn new(name: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        NodeConfig {
            name: name.into(),
            data_dir: data_dir.into(),
            client_urls: vec!["http://127.0.0.1:2379".into()],
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            heartbeat_interval: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
            max_pending_watch_events: 1024,
            snapshot_every_entries: 10_000,
            lease_checkpoint_interval: DEFAULT_LEASE_CHECKPOINT_INTERVAL,
            cluster: None,
            env: Environment::default(),
            disk_reserve_bytes: space::DEFAULT_SPACE_RESERVE_BYTES,
            quota_backend_bytes: Some(space::DEFAULT_QUOTA_BACKEND_BYTES),
            strict_reconfig_check: true,
            force_new_cluster: false,
            snapshot_kv_checked_by_peers: false,
        }
    }
}

/// The election timeout is below etcd's rule of five heartbeat intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the election timeout ({election_ms} ms) must be at least 5 times the heartbeat interval \
     ({heartbeat_ms} ms)"
)]
pub struct TimingError {
    pub election_ms: u64,
    pub heartbeat_ms: u64,
}

/// openraft's election timeouts for Baton's (etcd's) election timeout `T`: about the longest
/// a follower waits without hearing from its leader before it campaigns.
///
/// openraft 0.9 makes a follower that has a leader wait its *leader lease*
/// (`election_timeout_max`) plus its own election timeout (drawn once, in
/// `[election_timeout_min, election_timeout_max)`) after the last heartbeat, checked on a
/// tick of 1.5 heartbeat intervals, and refuse votes for the lease after each heartbeat.
/// `max = 0.4 T` and `min = 0.25 T` therefore replace a dead leader `[0.65 T, 0.8 T)` after
/// its last heartbeat, plus up to one tick, plus one vote round: within `T` with the default
/// timing (a new leader extends leases by `T`, which must cover the time without one).
/// (openraft's usual `min = T, max = 2T` would mean `[3T, 4T)`: 3–4 s with the default 1 s.)
/// Split votes are rare and short: at equal terms openraft prefers the higher member id.
/// Requires `T ≥ 5 × heartbeat` (etcd's rule), so the lease spans at least two heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ElectionTiming {
    /// openraft's `election_timeout_min`, `0.25 T`.
    pub(crate) timeout_min_ms: u64,
    /// openraft's `election_timeout_max`, `0.4 T`: also the leader lease.
    pub(crate) lease_ms: u64,
}

impl ElectionTiming {
    pub(crate) fn of(config: &NodeConfig) -> Result<ElectionTiming, TimingError> {
        let t = config.election_timeout.as_millis() as u64;
        let heartbeat = config.heartbeat_interval.as_millis() as u64;
        if heartbeat == 0 || t < 5 * heartbeat {
            return Err(TimingError {
                election_ms: t,
                heartbeat_ms: heartbeat,
            });
        }
        let timing = ElectionTiming {
            timeout_min_ms: t / 4,
            lease_ms: t * 2 / 5,
        };
        assert!(
            timing.timeout_min_ms < timing.lease_ms,
            "openraft needs min < max"
        );
        Ok(timing)
    }

    /// The leader lease: how long a follower refuses votes after hearing from its leader.
    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timing_follows_the_election_timeout() {
        let mut c = NodeConfig::new("a", "/nonexistent");
        assert_eq!(
            ElectionTiming::of(&c),
            Ok(ElectionTiming {
                timeout_min_ms: 250,
                lease_ms: 400
            })
        );
        c.election_timeout = Duration::from_millis(400);
        assert_eq!(
            ElectionTiming::of(&c),
            Err(TimingError {
                election_ms: 400,
                heartbeat_ms: 100
            })
        );
        c.heartbeat_interval = Duration::ZERO;
        assert!(ElectionTiming::of(&c).is_err());
    }
}
