//! # baton-raft
//!
//! One Baton replica: the Raft log (via `openraft`), the durable storage under it, and the
//! in-memory state that only a leader keeps (the lease clock). Everything the server needs
//! from a replica goes through [`Node`]; openraft's generics stay inside this crate.
//!
//! Codemap:
//! - `wal`: the durable, checksummed Raft log with group commit and torn-tail recovery;
//! - `snapshot`: snapshot files; `files`: small atomic files (vote, member identity);
//! - `sm`: the applied state (core state machine + watch hub) as openraft's state machine;
//! - `lease`: the leader's in-memory lease clock;
//! - `deletions`: one-shot key-deletion watches that wake lock waiters one at a time;
//! - `cluster`: `--initial-cluster` parsing and the deterministic member and cluster ids;
//! - `network` (client) and `peer_server` (server): the peer transport, openraft's messages
//!   and requests forwarded to the leader over the `baton.raft.v1.Raft` gRPC service;
//!   `wire`: the bincode payloads of that service; `forward`: the follower's batching of
//!   what it forwards;
//! - `origin`: which commands a client may cause and which only the leader's own duties
//!   propose (checked on everything that enters from outside).
//!
//! # Followers
//! Only the leader proposes, keeps the lease clock and can confirm a read index. [`Node`]'s
//! methods therefore *route*: on the leader they run locally; on a follower they are sent to
//! the leader (`LeaderRequest`) and the answer is unpacked — batched with whatever else this
//! member is forwarding at the time (`forward`: one `ForwardBatch` call, one answer per item),
//! or alone in a `Forward` call for membership changes and publishing. A request that
//! certainly did not reach a leader (refused connection, the leader had just lost leadership)
//! is retried until `REQUEST_TIMEOUT`; a proposal that may have reached it is never resent
//! (it could be applied twice) and fails with [`ProposeError::LeaderFailed`]. Batching keeps
//! all of that per request: each item has its own answer, deadline and retry decision.
//!
//! On disk, under `data_dir`: `member.meta` (identity), `raft/vote`, `raft/wal/*.wal`,
//! `snap/<term>-<index>.snap`.

mod answer;
mod cluster;
mod deletions;
mod election;
mod env;
mod files;
mod forward;
#[cfg(test)]
mod golden;
mod lease;
mod membership;
mod network;
mod origin;
mod peer_server;
mod proposer;
mod sm;
mod snapshot;
mod space;
pub use space::DEFAULT_SPACE_RESERVE_BYTES;
mod transfer;
mod types;
mod wal;
mod wire;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use baton_core::{
    AlarmAction, AlarmType, Applied, Command, LeaseId, Response, Revision, StateMachine, Term,
    WatchHub,
};
use openraft::error::{
    ChangeMembershipError, CheckIsLeaderError, ClientWriteError, Fatal, RaftError,
};
use openraft::metrics::WaitError;
use openraft::{ChangeMembers, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};

use crate::answer::{fatal_error, leader_error};
pub use crate::answer::{KeepAlive, ProposeError, Proposed};
use crate::cluster::DerivedIds;
pub use crate::cluster::{
    parse_initial_cluster, ClusterConfig, ClusterConfigError, InitialClusterState, InitialMember,
};
pub use crate::deletions::KeyDeletion;
pub use crate::env::{
    Environment, ListenFuture, LogDisk, LogFile, PeerIncoming, PeerIo, PeerStream, PeerTransport,
    WallClock,
};
use crate::files::MemberMeta;
use crate::forward::ForwardError;
pub use crate::membership::{JoinError, MemberChanged, MemberError, REMOVED_MESSAGE};
use crate::network::{Method, PeerError, PeerNetwork, Peers};
pub use crate::origin::{origin, LeaderDuty, Origin};
use crate::proposer::Proposer;
use crate::sm::{AppliedState, CurrentSnapshot, Shared, StateStore};
pub use crate::transfer::TransferError;
use crate::types::{Member, Raft};
use crate::wire::{ForwardedProposal, LeaderRequest, LeaderResponse};

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
        }
    }
}

/// A member as shown by `MemberList`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// Which way the Raft log's writes went since start (see `wal/handoff.rs`): operations
/// carried out inline on the Raft core task, and batches (with their operations) carried out
/// by the writer's batch loop (its OS thread, or its task under simulation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalWritePaths {
    pub inline_ops: u64,
    pub loop_batches: u64,
    pub loop_ops: u64,
}

/// A replica's view of itself, for `Status`, headers and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub cluster_id: u64,
    pub member_id: u64,
    /// The current leader's member id, if one is known.
    pub leader_id: Option<u64>,
    pub term: u64,
    /// Last log index written (not necessarily committed).
    pub last_log_index: u64,
    /// Last log index applied to the state machine.
    pub applied_index: u64,
    /// Bytes on disk used by the log and snapshots.
    pub disk_bytes: u64,
}

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A record failed its checksum with valid records after it: the log is corrupt in the
    /// middle and is refused rather than served.
    #[error("corrupt log in {path} at byte offset {offset}: {reason}")]
    CorruptLog {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("corrupt snapshot {path}: {reason}")]
    CorruptSnapshot { path: PathBuf, reason: String },
    /// The log was written in a newer format than this binary reads (`wal/record.rs`: format
    /// versions): it is refused rather than misread. Run the newer Baton that wrote it.
    #[error(
        "raft log {path} is in log format {found}, but this Baton reads log formats up to \
         {supported}: it was written by a newer Baton; run that version (or a newer one)"
    )]
    UnsupportedLogFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("raft: {0}")]
    Raft(String),
    /// Another process holds the data directory; two members writing one log would corrupt
    /// it.
    #[error("data directory {path} is in use by another process")]
    Locked { path: PathBuf },
    /// The cluster flags are inconsistent.
    #[error(transparent)]
    Config(#[from] ClusterConfigError),
    /// Joining an existing cluster (`--initial-cluster-state existing`, empty data
    /// directory) failed.
    #[error(transparent)]
    Join(#[from] JoinError),
    /// A peer address could not be bound.
    #[error("cannot listen for peers on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// How long a proposal or read barrier may take before the caller gets `Timeout` (etcd's
/// default request timeout is of the same order).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `start` of a sole voter waits for it to become leader, so the first request after
/// a start does not fail with "no leader". (Members of larger clusters do not wait: their
/// peers may not be up yet, and requests wait for a leader anyway.)
const STARTUP_LEADER_WAIT: Duration = Duration::from_secs(5);
/// After a forwarded request failed without reaching a leader, wait at most this long for the
/// leader to change before trying again (the same leader may also come back).
const LEADER_RETRY_INTERVAL: Duration = Duration::from_millis(50);
/// Retry interval bounds of publishing this member's attributes.
const PUBLISH_RETRY_MIN: Duration = Duration::from_millis(100);
const PUBLISH_RETRY_MAX: Duration = Duration::from_secs(2);
/// Lease clock resolution: a lease expires at most this much after its deadline.
const LEASE_TICK: Duration = Duration::from_millis(100);
/// A snapshot is also taken once the log since the last one holds this many bytes (encoded),
/// or as many as the last snapshot if that is more. The entry count alone
/// (`snapshot_every_entries`) does not bound the log: the proposer packs hundreds of commands
/// into one entry under load, so 10 000 entries were a million 256-byte puts. (The log's
/// entries no longer stay in memory — see `wal/index.rs` — so this bounds the log file and a
/// restart's re-apply.) Growing the bound with the snapshot keeps the cost amortized: the
/// snapshots written never add up to more than about twice the log written.
const SNAPSHOT_LOG_MIN_BYTES: u64 = 16 << 20;
/// A gap between two lease ticks longer than this means the leader stalled (paused, starved,
/// stuck): the gap is added to every deadline before anything is expired (etcd#15247).
const LEASE_STALL: Duration = Duration::from_millis(300);
/// Bounds one `ExpireLeases` entry (an entry is fsynced and applied as one unit).
const MAX_EXPIRE_IDS_PER_ENTRY: usize = 1000;
/// Bounds the expiry work of one tick, so a mass expiry cannot monopolize the log.
const MAX_EXPIRE_ENTRIES_PER_TICK: usize = 16;
/// etcd's lease checkpoint interval: remaining TTLs of long leases are written to the log this
/// often so a new leader does not renew them blindly.
pub const DEFAULT_LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);
/// Bounds one `LeaseCheckpoint` entry.
const MAX_CHECKPOINTS_PER_ENTRY: usize = 1000;

/// One replica. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

struct Inner {
    config: NodeConfig,
    member_id: u64,
    cluster_id: u64,
    raft: Raft,
    /// Channels to peers (shared with openraft's network), for forwarding to the leader.
    peers: Arc<Peers>,
    /// Batches what this member forwards to the leader (see `forward`).
    forwarder: Arc<forward::Forwarder>,
    /// Multi-member bootstrap: the ids derived from `--initial-cluster` and its state.
    initial: Option<(DerivedIds, InitialClusterState)>,
    shared: Arc<Shared>,
    wal: wal::WalHandle,
    proposer: Proposer,
    shutting_down: Arc<AtomicBool>,
    tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// `(term, when)`: the start of the last ReadIndex round that confirmed this member's
    /// leadership with a quorum. Keep-alives are acknowledged only while it is recent.
    leadership_confirmed: parking_lot::Mutex<Option<(u64, Instant)>>,
    /// One leadership confirmation in flight at a time; concurrent keep-alives share it.
    confirming: tokio::sync::Mutex<()>,
    /// Concurrent linearizable reads share ReadIndex rounds (see `shared_read_index`).
    read_rounds: parking_lot::Mutex<ReadRounds>,
    /// The same for the ReadIndex rounds this member runs as leader for forwarded read
    /// indexes and grant checks (see `shared_read_index_local`).
    local_read_rounds: parking_lot::Mutex<ReadRounds>,
    /// `(term, index)`: the leader's last log index when it first served a ReadIndex in
    /// `term`; every read of the term waits for at least it (see `read_index_local`).
    read_floor: parking_lot::Mutex<Option<(u64, u64)>>,
    /// Closed while a leader transfer waits for the followers' leases to expire.
    transfer: transfer::TransferGate,
    /// Holds the data directory's advisory lock until `shutdown` has stopped every writer
    /// (or the replica is dropped), so a restarted replica in the same process can take it.
    dir_lock: parking_lot::Mutex<Option<fs::File>>,
    /// Randomness of lease ids and the restart hold (seeded in a simulation).
    rng: parking_lot::Mutex<rand::rngs::StdRng>,
    /// An alarm proposal of the disk watch is in flight (one at a time: on a stalled log
    /// it waits out the request timeout, and the tick comes every 100 ms).
    alarm_in_flight: Arc<AtomicBool>,
    /// Warnings of the disk watch's alarm proposals.
    alarm_log: space::RateLimit,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid_data(path: &Path, msg: String) -> StartError {
    StartError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, msg),
    }
}

/// Reads this member's identity, or mints and persists one on a pristine directory. A missing
/// identity next to existing Raft state is refused: a new member id would not be a voter of
/// the recorded membership and the replica could never make progress.
///
/// In a multi-member cluster (`initial` given) the identity is derived from
/// `--initial-cluster`; on a restart the persisted identity wins (as etcd ignores the initial
/// flags once a member has data) and a disagreement is only logged.
fn load_or_create_member(
    data_dir: &Path,
    name: &str,
    pristine: bool,
    initial: Option<&(DerivedIds, InitialClusterState)>,
    rng: &mut rand::rngs::StdRng,
) -> Result<MemberMeta, StartError> {
    let path = data_dir.join("member.meta");
    if files::has_old_member_magic(&path) {
        return Err(invalid_data(
            &path,
            "this data directory was written by an earlier Baton whose log format this \
             version cannot read (member info changed); start from an empty directory"
                .into(),
        ));
    }
    match files::read_framed(&path, files::MEMBER_MAGIC).map_err(io_error(&path))? {
        Some(Ok(payload)) => {
            let meta =
                files::decode_member(&payload).map_err(|reason| invalid_data(&path, reason))?;
            // A member that joined (`existing`) took its ids from the cluster, not from the
            // flags: nothing to compare.
            if let Some((ids, InitialClusterState::New)) = initial {
                if ids.cluster_id != meta.cluster_id || ids.id_of(name) != Some(meta.member_id) {
                    tracing::warn!(
                        member_id = format_args!("{:x}", meta.member_id),
                        cluster_id = format_args!("{:x}", meta.cluster_id),
                        "--initial-cluster describes another identity than the one in the \
                         data directory; the data directory wins"
                    );
                }
            }
            Ok(meta)
        }
        Some(Err(reason)) => Err(invalid_data(
            &path,
            format!("corrupt member identity: {reason}"),
        )),
        None if !pristine => Err(invalid_data(
            &path,
            "member identity is missing but Raft state exists".into(),
        )),
        None => {
            let meta = match initial {
                None => files::new_identity(name, rng),
                // `Node::start` joins instead (`membership::join_existing`).
                Some((_, InitialClusterState::Existing)) => {
                    return Err(StartError::Raft(
                        "internal: a joining member must take its identity from the cluster".into(),
                    ))
                }
                Some((ids, InitialClusterState::New)) => MemberMeta {
                    member_id: ids
                        .id_of(name)
                        .ok_or_else(|| ClusterConfigError::NotListed(name.to_string()))?,
                    cluster_id: ids.cluster_id,
                    name: name.to_string(),
                },
            };
            files::write_atomic(&path, &files::encode_member(&meta)).map_err(io_error(&path))?;
            Ok(meta)
        }
    }
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
fn openraft_election_timeouts(config: &NodeConfig) -> Result<(u64, u64), StartError> {
    let t = config.election_timeout.as_millis() as u64;
    let heartbeat = config.heartbeat_interval.as_millis() as u64;
    if heartbeat == 0 || t < 5 * heartbeat {
        return Err(StartError::Raft(format!(
            "the election timeout ({t} ms) must be at least 5 times the heartbeat interval \
             ({heartbeat} ms)"
        )));
    }
    Ok((t / 4, t * 2 / 5))
}

/// The applied state to start from: the newest snapshot, or an empty store.
fn load_state(snap_dir: &Path) -> Result<(AppliedState, Option<CurrentSnapshot>), StartError> {
    let Some((path, loaded, size)) = snapshot::load_newest(snap_dir)? else {
        let state = AppliedState {
            sm: StateMachine::new(),
            last_applied: None,
            membership: Default::default(),
        };
        return Ok((state, None));
    };
    let corrupt = |reason: String| StartError::CorruptSnapshot {
        path: path.clone(),
        reason,
    };
    let sm = StateMachine::restore(&loaded.body).map_err(|e| corrupt(e.to_string()))?;
    let Some(last) = loaded.meta.last_log_id else {
        return Err(corrupt("snapshot without a last log id".into()));
    };
    // Every Raft entry applies at least one command, so the terms must agree (the indexes
    // differ: the core counts commands, Raft counts batches).
    if sm.last_applied().1 != Term(last.leader_id.term) {
        return Err(corrupt(format!(
            "header says {last} but the state was applied in {:?}",
            sm.last_applied().1
        )));
    }
    let state = AppliedState {
        sm,
        last_applied: Some(last),
        membership: loaded.meta.last_membership.clone(),
    };
    Ok((state, Some((loaded.meta, path, size))))
}

impl Node {
    /// Opens (or creates) the data directory, recovers snapshot + log tail, and starts Raft.
    /// Without `config.cluster` a fresh directory becomes a one-member cluster. With it, the
    /// peer service is served on the peer addresses before this returns, and a fresh member
    /// of a `new` cluster either initializes it (the member with the smallest id) or waits to
    /// be contacted; this does not wait for a leader.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        let initial = match &config.cluster {
            None => None,
            Some(c) => Some((
                cluster::derive_ids(c, &config.name, &config.peer_urls)?,
                c.state,
            )),
        };
        let data_dir = config.data_dir.clone();
        let raft_dir = data_dir.join("raft");
        let snap_dir = data_dir.join("snap");
        for dir in [&data_dir, &raft_dir, &snap_dir] {
            fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        files::fsync_dir(&data_dir).map_err(io_error(&data_dir))?;
        let lock_path = data_dir.join("LOCK");
        let dir_lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        match dir_lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(StartError::Locked { path: data_dir });
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_error(&lock_path)(e)),
        }

        let (state, current_snapshot) = load_state(&snap_dir)?;
        let recovered = wal::recover(&raft_dir)?;
        let pristine = recovered.mem.is_pristine() && current_snapshot.is_none();
        // This replica's randomness (`Environment::rng`): a new identity, then the election
        // timeout and lease ids. Drawn before the identity, which only a single-member
        // cluster mints (the simulation's members derive theirs, so its draws are unchanged).
        let mut rng = config.env.rng();
        let member = match (&config.cluster, &initial) {
            (Some(c), Some((_, InitialClusterState::Existing))) if pristine => {
                let listed = c
                    .initial_members
                    .iter()
                    .flat_map(|m| m.peer_urls.clone())
                    .collect();
                membership::join_existing(&data_dir, &config, &c.token, listed).await?
            }
            _ => load_or_create_member(
                &data_dir,
                &config.name,
                pristine,
                initial.as_ref(),
                &mut rng,
            )?,
        };
        // Bound before Raft starts: a port conflict fails the start instead of leaving a
        // member that nobody can reach.
        let peer_listeners = match &config.cluster {
            Some(c) => {
                peer_server::bind(&c.listen_peer_addrs, config.env.transport.as_deref()).await?
            }
            None => Vec::new(),
        };

        // The log before the purge point exists only in the snapshot; if the snapshot does not
        // reach it, entries are missing and serving would silently lose writes.
        let purged = recovered.mem.purged_index();
        let applied = state.last_applied.map(|l| l.index);
        if purged > applied {
            return Err(StartError::CorruptSnapshot {
                path: snap_dir,
                reason: format!(
                    "log purged through {purged:?} but the newest snapshot covers only {applied:?}"
                ),
            });
        }

        let (mut election_timeout_min, mut election_timeout_max) =
            openraft_election_timeouts(&config)?;
        if config.env.seed.is_some() {
            // openraft draws the timeout from its own thread_rng; a range of one value makes
            // that draw a constant, picked here from the seed in the same range.
            use rand::Rng;
            election_timeout_min = rng.gen_range(election_timeout_min..election_timeout_max);
            election_timeout_max = election_timeout_min + 1;
        }
        let raft_config = openraft::Config {
            cluster_name: format!("baton-{:016x}", member.cluster_id),
            heartbeat_interval: config.heartbeat_interval.as_millis() as u64,
            election_timeout_min,
            election_timeout_max,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries.max(1)),
            // Keep a little log behind the snapshot for followers that lag slightly (cheaper
            // than shipping a snapshot), but not much: it is memory and disk. Entries are
            // batches of up to hundreds of commands, so 100 entries is already a lot of log.
            max_in_snapshot_log_to_keep: (config.snapshot_every_entries / 2).min(100),
            snapshot_max_chunk_size: wire::SNAPSHOT_CHUNK_BYTES,
            // `election` is the election timer: openraft's has no pre-vote.
            enable_elect: false,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(format!("invalid timing configuration: {e}")))?;

        let hub = WatchHub::new(config.max_pending_watch_events);
        let space = space::Space::new(config.disk_reserve_bytes, config.env.disk.is_none());
        let shared = Arc::new(Shared::new(state, hub, snap_dir, current_snapshot, space));
        let (log_store, wal) = wal::open(&raft_dir, recovered, config.env.disk.clone())?;
        let credential = config
            .cluster
            .as_ref()
            .map(|c| membership::ClusterCredential::of_token(&c.token));
        let peers = Arc::new(Peers::new(
            member.cluster_id,
            member.member_id,
            credential,
            config.env.transport.clone(),
        ));
        let raft = match Raft::new(
            member.member_id,
            Arc::new(raft_config),
            PeerNetwork {
                peers: peers.clone(),
            },
            log_store,
            StateStore {
                shared: shared.clone(),
            },
        )
        .await
        {
            Ok(raft) => raft,
            Err(e) => {
                wal.stop().await;
                return Err(StartError::Raft(e.to_string()));
            }
        };

        let shutting_down = Arc::new(AtomicBool::new(false));
        let (proposer, proposer_task) = Proposer::spawn(
            raft.clone(),
            shared.clone(),
            shutting_down.clone(),
            REQUEST_TIMEOUT,
            config.env.clock(),
        );
        let node = Node {
            inner: Arc::new(Inner {
                config,
                member_id: member.member_id,
                cluster_id: member.cluster_id,
                raft,
                forwarder: forward::Forwarder::new(peers.clone(), forward::Limits::default()),
                peers,
                initial,
                shared,
                wal,
                proposer,
                shutting_down,
                tasks: parking_lot::Mutex::new(vec![proposer_task]),
                leadership_confirmed: parking_lot::Mutex::new(None),
                confirming: tokio::sync::Mutex::new(()),
                read_floor: parking_lot::Mutex::new(None),
                read_rounds: parking_lot::Mutex::new(ReadRounds::default()),
                local_read_rounds: parking_lot::Mutex::new(ReadRounds::default()),
                transfer: transfer::TransferGate::new(),
                dir_lock: parking_lot::Mutex::new(Some(dir_lock)),
                rng: parking_lot::Mutex::new(rng),
                alarm_in_flight: Arc::new(AtomicBool::new(false)),
                alarm_log: space::RateLimit::default(),
            }),
        };
        if !peer_listeners.is_empty() {
            let service = peer_server::PeerService {
                cluster_id: member.cluster_id,
                me: member.member_id,
                cluster_credential: node
                    .inner
                    .config
                    .cluster
                    .as_ref()
                    .map(|c| membership::ClusterCredential::of_token(&c.token)),
                raft: node.inner.raft.clone(),
                node: Arc::downgrade(&node.inner),
            };
            let tasks = peer_server::spawn(peer_listeners, service);
            node.inner.tasks.lock().extend(tasks);
        }
        if let Err(e) = node.inner.bootstrap().await {
            node.shutdown().await;
            return Err(e);
        }
        let lease_task = tokio::spawn(lease_loop(Arc::downgrade(&node.inner)));
        let publish_task = tokio::spawn(publish_loop(Arc::downgrade(&node.inner)));
        let removal_task = tokio::spawn(membership::removal_loop(Arc::downgrade(&node.inner)));
        let election_task = election::spawn(&node.inner);
        node.inner
            .tasks
            .lock()
            .extend([lease_task, publish_task, removal_task, election_task]);
        Ok(node)
    }

    /// Stamps the command with the leader's time, replicates it, waits until it is durable
    /// (fsynced) and applied, and returns what applying it produced.
    ///
    /// On a follower the command is forwarded to the leader, and the call returns once this
    /// member has applied it too (a client reads its own write on the member it wrote
    /// through, and this member's watchers have seen it).
    ///
    /// Only commands a client may cause are accepted ([`Origin::Client`]); the leader's own
    /// duties (lease expiry, checkpoints) propose through the crate's internal entry point,
    /// and asking for one here is refused with [`ProposeError::LeaderOnly`].
    pub async fn propose(&self, command: Command) -> Result<Proposed, ProposeError> {
        origin::client_may_propose(&command).map_err(ProposeError::LeaderOnly)?;
        self.propose_routed(command).await
    }

    /// [`Node::propose`] without the origin check: for this member's own requests of the
    /// leader that no client may make (raising its own `NOSPACE` alarm from a follower).
    async fn propose_routed(&self, command: Command) -> Result<Proposed, ProposeError> {
        let inner = &self.inner;
        inner.refuse_without_space(&command)?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut req = LeaderRequest::Propose(command);
        let req = loop {
            // During a leader transfer on this member, wait for it: the request then goes
            // to whoever leads afterwards (checked again after routing, which may have
            // waited: a proposal made here during a transfer would only fail `NotLeader`).
            inner.wait_transfer(deadline).await;
            match inner.route(req, deadline).await? {
                Routed::Local(r) if inner.transfer_active() && Instant::now() < deadline => {
                    req = r;
                }
                routed => break routed,
            }
        };
        let req = match req {
            Routed::Local(req) => req,
            Routed::Remote(LeaderResponse::Proposed(p)) => {
                // Committed: a slow local apply does not make it fail, only later visible.
                let _ = inner.wait_applied(p.raft_index, deadline).await;
                return Ok(Proposed {
                    applied: Applied {
                        revision: p.revision,
                        response: p.response,
                        events: Vec::new(),
                    },
                    raft_term: p.raft_term,
                    raft_index: p.raft_index,
                });
            }
            Routed::Remote(other) => return Err(unexpected_answer(other)),
        };
        match req {
            LeaderRequest::Propose(command) => inner.propose(command).await,
            _ => unreachable!("route hands back the request it was given"),
        }
    }

    /// Returns once this replica has applied everything committed before the call and the
    /// leader has confirmed its leadership with a quorum (ReadIndex): reads after it are
    /// linearizable. On a follower the leader is asked for the read index over the peer
    /// service; the wait for it to be applied is local.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        let inner = &self.inner;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        inner.wait_transfer(deadline).await;
        let index = inner.shared_read_index().await?;
        inner.wait_applied(index, deadline).await
    }

    /// Runs `f` on the applied state (a read lock; keep `f` short).
    pub fn read<R>(&self, f: impl FnOnce(&StateMachine) -> R) -> R {
        f(&self.inner.shared.state.read().sm)
    }

    /// Runs `f` on the watch hub together with the applied state; no entry is applied while
    /// `f` runs, so a watcher registered here sees every later event exactly once.
    pub fn with_watch_hub<R>(&self, f: impl FnOnce(&mut WatchHub, &StateMachine) -> R) -> R {
        let shared = &self.inner.shared;
        let st = shared.state.read();
        let mut hub = shared.hub.lock();
        f(&mut hub, &st.sm)
    }

    /// Runs `f` on the applied state and registers a one-shot deletion watch for every key it
    /// returns, before any further entry is applied: a key `f` saw live cannot be deleted
    /// unnoticed. Each watch fires once, when its key is deleted (a later re-creation is a
    /// new key as far as the caller is concerned), and unregisters when dropped.
    pub fn read_and_watch_deletions<R>(
        &self,
        f: impl FnOnce(&StateMachine) -> (R, Vec<Vec<u8>>),
    ) -> (R, Vec<KeyDeletion>) {
        let shared = &self.inner.shared;
        let st = shared.state.read();
        let (r, keys) = f(&st.sm);
        if keys.is_empty() {
            return (r, Vec::new());
        }
        let mut watches = shared.deletions.lock();
        let handles = keys
            .into_iter()
            .map(|k| KeyDeletion::register(&shared.deletions, &mut watches, k))
            .collect();
        (r, handles)
    }

    /// Registered key-deletion watches (diagnostics and tests: they must not leak).
    pub fn deletion_watch_count(&self) -> usize {
        self.inner.shared.deletions.lock().len()
    }

    /// Fires whenever an entry that changed the store is applied (the value is the store
    /// revision). Watch streams wait on it.
    pub fn subscribe_revision(&self) -> tokio::sync::watch::Receiver<Revision> {
        self.inner.shared.revision_tx.subscribe()
    }

    /// Renews a lease on the leader's lease clock (not replicated, as etcd), forwarding to the
    /// leader when this member is a follower.
    pub async fn renew_lease(&self, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self
            .inner
            .route(LeaderRequest::KeepAlive(id), deadline)
            .await?
        {
            Routed::Local(_) => self.inner.keep_alive_confirmed(id).await,
            Routed::Remote(LeaderResponse::KeepAlive(k)) => Ok(k),
            Routed::Remote(other) => Err(unexpected_answer(other)),
        }
    }

    /// Remaining TTL of a lease in seconds on the leader's lease clock (see
    /// [`Node::lease_remaining_s`]), forwarding to the leader when this member is a follower
    /// (a follower's own estimate knows nothing of keep-alives).
    pub async fn lease_time_to_live(&self, id: LeaseId) -> Result<Option<i64>, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self
            .inner
            .route(LeaderRequest::TimeToLive(id), deadline)
            .await?
        {
            Routed::Local(_) => self.inner.time_to_live_local(id),
            Routed::Remote(LeaderResponse::TimeToLive(ttl)) => Ok(ttl),
            Routed::Remote(other) => Err(unexpected_answer(other)),
        }
    }

    /// Renews a lease on this replica's lease clock; fails with `NotLeader` on a follower
    /// (use [`Node::renew_lease`] to reach the leader from anywhere). Unlike `renew_lease`, it
    /// does not confirm leadership with a quorum first (tests and tools only).
    pub fn lease_keep_alive(&self, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        self.inner.keep_alive_local(id)
    }

    /// Remaining TTL of a lease in seconds per the leader's lease clock (rounded as etcd does),
    /// `None` if unknown.
    pub fn lease_remaining_s(&self, id: LeaseId) -> Option<i64> {
        lease_remaining_s(&self.inner.shared, id)
    }

    /// Whether a lease is alive: it exists in the state machine, and the lease clock (the
    /// leader's, where deadlines are kept) neither sees its deadline passed nor has its expiry
    /// in flight. Between a deadline and the applied `ExpireLeases` a lease still exists but
    /// is not alive: a lock must not be granted to it then (etcd#11456).
    ///
    /// Only a leader whose clock is rebuilt for its current term knows the deadlines. Every
    /// other replica's clock holds the deadlines set when each grant was applied and never
    /// renewed (keep-alives go to the leader), so trusting it made a follower refuse locks to
    /// every kept-alive lease older than its TTL ("the lease expired before the lock could be
    /// granted", seen in `crates/baton/tests/it/chaos.rs`); there the state machine is the only
    /// authority (the remaining follower gap is described in ARCHITECTURE.md).
    pub fn lease_alive(&self, id: LeaseId) -> bool {
        let shared = &self.inner.shared;
        let term = self.inner.raft.metrics().borrow().current_term;
        let st = shared.state.read();
        if !st.sm.lease_exists(id) {
            return false;
        }
        let clock = shared.leases.lock();
        if clock.ready_term() != Some(term) {
            return true;
        }
        clock.alive(id, Instant::now()).unwrap_or(true)
    }

    /// The last check before a lock grant to `lease`: the leader confirms its leadership with
    /// a quorum (ReadIndex) and then judges the lease on its lease clock — the only clock
    /// that sees keep-alives — and this replica waits until it has applied everything the
    /// leader had committed. `Ok(false)`: the lease is gone or past its deadline.
    ///
    /// Why not [`Node::lease_alive`]: on a follower it knows only that the lease exists
    /// (deadlines live on the leader), and on a deposed leader that has not noticed yet its
    /// clock may still see keep-alives that the real leader never got; either could grant a
    /// lock to a holder the cluster already expired.
    pub async fn confirm_grant(&self, lease: LeaseId) -> Result<bool, ProposeError> {
        let inner = &self.inner;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let (index, alive) = match inner
            .route(LeaderRequest::GrantCheck(lease), deadline)
            .await?
        {
            Routed::Local(_) => inner.grant_check_local(lease).await?,
            Routed::Remote(LeaderResponse::GrantCheck {
                read_index,
                lease_alive,
            }) => (read_index, lease_alive),
            Routed::Remote(other) => return Err(unexpected_answer(other)),
        };
        inner.wait_applied(index, deadline).await?;
        Ok(alive)
    }

    /// Leader time now, on the scale of `Entry::time_ms` (wall-clock milliseconds, never
    /// below the last applied stamp): what the next entry proposed here would at least be
    /// stamped with. Deadlines the core records (lock-delay) are compared against it.
    pub fn time_ms(&self) -> u64 {
        let last = self.inner.shared.state.read().sm.last_time_ms();
        self.inner.config.env.wall_ms().max(last)
    }

    /// A fresh random positive lease id that is not in use (randomness lives here, not in the
    /// core).
    pub fn new_lease_id(&self) -> LeaseId {
        let shared = &self.inner.shared;
        loop {
            let id = LeaseId(rand::Rng::gen::<i64>(&mut *self.inner.rng.lock()) & i64::MAX);
            if id.is_none() {
                continue;
            }
            let st = shared.state.read();
            if st.sm.lease(id).is_none() && !shared.leases.lock().contains(id) {
                return id;
            }
        }
    }

    pub fn status(&self) -> NodeStatus {
        let inner = &self.inner;
        let m = inner.raft.metrics();
        let m = m.borrow();
        NodeStatus {
            cluster_id: inner.cluster_id,
            member_id: inner.member_id,
            leader_id: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            disk_bytes: inner.wal.stats.file_bytes.load(Ordering::Relaxed)
                + inner.shared.snapshot_bytes.load(Ordering::Relaxed),
        }
    }

    /// Every member of the current membership. This member is shown as configured now; the
    /// others as they last published themselves (name and client URLs are empty until a
    /// member has run and published them, as etcd shows "unstarted" members).
    pub fn members(&self) -> Vec<MemberInfo> {
        let inner = &self.inner;
        let membership = inner.raft.metrics().borrow().membership_config.clone();
        let voters: Vec<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| {
                let me = *id == inner.member_id;
                let (name, peer_urls, client_urls) = if me {
                    let c = &inner.config;
                    (c.name.clone(), c.peer_urls.clone(), c.client_urls.clone())
                } else {
                    let n = node.clone();
                    (n.name, n.peer_urls, n.client_urls)
                };
                MemberInfo {
                    id: *id,
                    name,
                    peer_urls,
                    client_urls,
                    is_learner: !voters.contains(id),
                }
            })
            .collect()
    }

    /// Stops Raft and the background tasks; everything acknowledged is already on disk.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        if inner.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        for task in inner.tasks.lock().drain(..) {
            task.abort();
        }
        if let Err(e) = inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft core ended abnormally");
        }
        inner.wal.stop().await;
        inner.shared.close_snapshots();
        // Nothing writes to the directory any more.
        inner.dir_lock.lock().take();
    }

    /// Whether this member's disk watch judges its space low (writes that add data are
    /// refused here; see `space`).
    pub fn disk_space_low(&self) -> bool {
        self.inner.shared.space.is_low()
    }

    /// Number of fsyncs the Raft log has issued since start. For tests (group commit) and
    /// diagnostics; the same count is exported as `baton_wal_fsyncs_total`.
    pub fn wal_fsync_count(&self) -> u64 {
        self.inner.wal.stats.fsyncs.load(Ordering::Relaxed)
    }

    /// Which way the Raft log's writes went since start: inline or through the batch loop.
    /// For tests (the simulation shows it runs both) and diagnostics.
    pub fn wal_write_paths(&self) -> WalWritePaths {
        let s = &self.inner.wal.stats;
        WalWritePaths {
            inline_ops: s.inline_ops.load(Ordering::Relaxed),
            loop_batches: s.loop_batches.load(Ordering::Relaxed),
            loop_ops: s.loop_ops.load(Ordering::Relaxed),
        }
    }
}

/// Reads waiting for the next ReadIndex round, and whether a round task is running.
#[derive(Default)]
struct ReadRounds {
    running: bool,
    waiting: Vec<tokio::sync::oneshot::Sender<Result<u64, ProposeError>>>,
}

impl Inner {
    /// A read index for a linearizable read that arrived now, from a ReadIndex round shared
    /// with every read waiting at the same time (etcd's linearizable-read batching).
    ///
    /// Why: a round costs a heartbeat exchange with a quorum on the leader, and on a follower
    /// a forwarded call to the leader as well. One round per read made 100 concurrent readers
    /// on a follower of a 3-member cluster slower than etcd's. Correctness: a read joins the
    /// round that starts after it arrived (never one already in flight), so the index is
    /// taken after the read arrived, as one round of its own would be.
    async fn shared_read_index(self: &Arc<Self>) -> Result<u64, ProposeError> {
        self.join_read_round(false).await
    }

    /// [`Inner::shared_read_index`] for the leader's own half of forwarded ReadIndex and
    /// grant checks: rounds that run `read_index_local` only (never routed: a member that
    /// lost leadership must answer `NotLeader`, not ask the new leader), shared by every such
    /// request arriving meanwhile. Followers batch their requests, so one batch may carry
    /// many grant checks; a round each cost a heartbeat exchange each.
    async fn shared_read_index_local(self: &Arc<Self>) -> Result<u64, ProposeError> {
        self.join_read_round(true).await
    }

    async fn join_read_round(self: &Arc<Self>, local: bool) -> Result<u64, ProposeError> {
        fn rounds(me: &Inner, local: bool) -> &parking_lot::Mutex<ReadRounds> {
            if local {
                &me.local_read_rounds
            } else {
                &me.read_rounds
            }
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = {
            let mut r = rounds(self, local).lock();
            r.waiting.push(tx);
            !std::mem::replace(&mut r.running, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move {
                loop {
                    let waiting = {
                        let mut r = rounds(&me, local).lock();
                        if r.waiting.is_empty() {
                            r.running = false;
                            return;
                        }
                        std::mem::take(&mut r.waiting)
                    };
                    let res = if local {
                        me.read_index_local().await
                    } else {
                        me.read_index_round().await
                    };
                    for w in waiting {
                        let _ = w.send(res.clone());
                    }
                }
            });
        }
        rx.await.unwrap_or(Err(ProposeError::ShuttingDown))
    }

    /// One ReadIndex round: on the leader, or asked of it.
    async fn read_index_round(self: &Arc<Self>) -> Result<u64, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self.route(LeaderRequest::ReadIndex, deadline).await? {
            Routed::Local(_) => self.read_index_local().await,
            Routed::Remote(LeaderResponse::ReadIndex(index)) => Ok(index),
            Routed::Remote(other) => Err(unexpected_answer(other)),
        }
    }

    /// The leader's half of a keep-alive: renews on this replica's lease clock.
    fn keep_alive_local(self: &Arc<Self>, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        self.check_running()?;
        let (state, leader, term) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.state, m.current_leader, m.current_term)
        };
        if state != ServerState::Leader {
            return Err(leader_error(leader.filter(|l| *l != self.member_id)));
        }
        let now = Instant::now();
        let shared = &self.shared;
        let renewal = shared.leases.lock().keep_alive(id, now);
        let renewal = match renewal {
            Some(r) => r,
            None => {
                // Before the post-election rebuild the clock may not know leases that predate
                // this term; the state machine is the authority on which leases exist.
                let st = shared.state.read();
                let mut clock = shared.leases.lock();
                if clock.ready_term() == Some(term) {
                    return Ok(KeepAlive::NotFound);
                }
                match st.sm.lease(id) {
                    Some(info) => clock.track(id, &info, now),
                    None => return Ok(KeepAlive::NotFound),
                }
            }
        };
        if renewal.reset_checkpoint {
            self.reset_checkpoint(id, renewal.granted_ttl_s);
        }
        Ok(KeepAlive::Renewed {
            ttl_s: renewal.granted_ttl_s,
        })
    }

    fn check_running(&self) -> Result<(), ProposeError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(ProposeError::ShuttingDown);
        }
        Ok(())
    }

    fn fatal_error(&self, f: &Fatal<u64>) -> ProposeError {
        fatal_error(f, self.shutting_down.load(Ordering::Acquire))
    }

    /// First start of a single member: make this directory a one-member cluster. First start
    /// of a new multi-member cluster: the member with the smallest id initializes Raft with
    /// every member of `--initial-cluster` (the others wait to be contacted; a member that
    /// has data never initializes again). Every start of a sole voter: get leadership (it
    /// elects itself) and have the lease clock ready before serving.
    async fn bootstrap(&self) -> Result<(), StartError> {
        let raft_err = |e: &dyn std::fmt::Display| StartError::Raft(e.to_string());
        if !self.raft.is_initialized().await.map_err(|e| raft_err(&e))? {
            let own = Member {
                name: self.config.name.clone(),
                peer_urls: self.config.peer_urls.clone(),
                client_urls: self.config.client_urls.clone(),
            };
            let members = match &self.initial {
                None => Some(BTreeMap::from([(self.member_id, own)])),
                Some((ids, InitialClusterState::New)) if ids.initializer() == self.member_id => {
                    let all = ids.members.iter().map(|(id, m)| {
                        let node = if *id == self.member_id {
                            own.clone()
                        } else {
                            // Name and client URLs are published by the member itself.
                            Member {
                                name: String::new(),
                                peer_urls: m.peer_urls.clone(),
                                client_urls: Vec::new(),
                            }
                        };
                        (*id, node)
                    });
                    Some(all.collect())
                }
                Some(_) => None,
            };
            if let Some(members) = members {
                tracing::info!(members = members.len(), "initializing a new cluster");
                self.raft
                    .initialize(members)
                    .await
                    .map_err(|e| raft_err(&e))?;
            } else {
                tracing::info!("waiting to be contacted by the cluster's leader");
            }
        }
        // Asked of the Raft core, not read from the metrics: those are published
        // asynchronously and may not show the membership `initialize` just wrote.
        let (state, voters) = self
            .raft
            .with_raft_state(|st| {
                let voters = st
                    .membership_state
                    .effective()
                    .voter_ids()
                    .collect::<Vec<_>>();
                (st.server_state, voters)
            })
            .await
            .map_err(|e| raft_err(&e))?;
        if voters != [self.member_id] {
            // openraft campaigns at once after `initialize`; members waiting to be contacted
            // (no voters yet) and restarted members do not wait for a leader here: their
            // peers may not be up yet, and requests wait for a leader anyway. A restarted
            // member does not disturb a live leader: it campaigns only after a pre-vote
            // (`election`).
            return Ok(());
        }
        // The sole voter need not wait an election timeout to notice nobody else leads.
        if state != ServerState::Leader {
            self.raft
                .trigger()
                .elect()
                .await
                .map_err(|e| raft_err(&e))?;
        }
        let leader = self
            .raft
            .wait(Some(STARTUP_LEADER_WAIT))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await;
        match leader {
            Ok(m) if m.current_leader == Some(self.member_id) => {
                self.become_ready(m.current_term).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "no leader yet; serving anyway (requests will report no leader)")
            }
        }
        Ok(())
    }

    /// Proposes through this replica's own proposer (it must be the leader). The internal
    /// entry point: the leader's duties call it with their own commands, and the peer
    /// service only after checking a forwarded command's origin (`peer_server`).
    async fn propose(&self, command: Command) -> Result<Proposed, ProposeError> {
        self.check_running()?;
        self.refuse_without_space(&command)?;
        self.wait_transfer(Instant::now() + REQUEST_TIMEOUT).await;
        self.proposer.propose(command).await
    }

    /// Refuses a command that adds data while this member's space is low or a `NOSPACE`
    /// alarm is applied, before it costs a log entry: the apply-time refusal
    /// (`StateMachine::apply`) only covers what was proposed before the alarm, and a log
    /// that cannot grow could not take the entry anyway.
    fn refuse_without_space(&self, command: &Command) -> Result<(), ProposeError> {
        if command.adds_data()
            && (self.shared.space.is_low() || self.shared.state.read().sm.no_space())
        {
            return Err(ProposeError::NoSpace);
        }
        Ok(())
    }

    /// Where a request that only the leader can serve goes: to `Routed::Local` (handed back)
    /// when this member leads, else to the leader over the peer service. Waits for a leader
    /// to be known, and retries while an attempt certainly did not reach a leader (refused
    /// connection, wrong peer, the callee had lost leadership) or the request is idempotent;
    /// all until `deadline`.
    async fn route(
        self: &Arc<Self>,
        req: LeaderRequest,
        deadline: Instant,
    ) -> Result<Routed, ProposeError> {
        self.check_running()?;
        let leader = self.wait_for_leader(deadline).await?;
        if leader == self.member_id {
            return Ok(Routed::Local(req));
        }
        let idempotent = req.is_idempotent();
        let batched = req.is_batched();
        let may_linger = matches!(req, LeaderRequest::KeepAlive(_));
        // Cannot fail in practice: requests are bounded (1.5 MiB) far below the peer limit.
        let payload = wire::encode(&req).map_err(|e| {
            ProposeError::Storage(format!("internal: cannot encode a forwarded request: {e}"))
        })?;
        let mut leader = leader;
        loop {
            let node = self
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&leader)
                .cloned();
            let remaining = deadline.saturating_duration_since(Instant::now());
            // One attempt: in the next batch to this leader (each item answered as a call of
            // its own would be), or alone.
            let outcome = match node {
                None => Err(ForwardError::Peer(PeerError::Unreachable {
                    target: leader,
                    reason: "not in the membership".into(),
                })),
                Some(node) if batched => {
                    self.forwarder
                        .forward(leader, node, payload.clone(), deadline, may_linger)
                        .await
                }
                Some(node) => self
                    .peers
                    .call(leader, &node, Method::Forward, payload.clone(), remaining)
                    .await
                    .and_then(|bytes| {
                        wire::decode::<LeaderResponse>(&bytes).map_err(|e| PeerError::Failed {
                            target: leader,
                            reason: e.to_string(),
                        })
                    })
                    .map_err(ForwardError::Peer),
            };
            let retry_reason = match outcome {
                // The callee was not (or no longer) the leader: it did nothing.
                Ok(LeaderResponse::Failed(
                    e @ (ProposeError::NotLeader { .. } | ProposeError::NoLeader),
                )) => e.to_string(),
                Ok(LeaderResponse::Failed(e)) => return Err(e),
                Ok(resp) => return Ok(Routed::Remote(resp)),
                // Refused before sending: too much is queued for the leader already.
                Err(ForwardError::QueueFull) => return Err(ProposeError::TooManyRequests),
                Err(ForwardError::Peer(e)) if e.not_delivered() || idempotent => e.to_string(),
                Err(ForwardError::Peer(PeerError::Timeout { .. })) => {
                    return Err(ProposeError::Timeout)
                }
                Err(ForwardError::Peer(e)) => {
                    return Err(ProposeError::LeaderFailed(e.to_string()))
                }
            };
            tracing::debug!(leader = format_args!("{leader:x}"), reason = %retry_reason, "forwarding to the leader failed; retrying");
            self.check_running()?;
            if Instant::now() >= deadline {
                return Err(ProposeError::Timeout);
            }
            // Give the cluster a moment to elect someone else (or the same one to recover).
            let _ = self
                .raft
                .wait(Some(
                    LEADER_RETRY_INTERVAL.min(deadline.saturating_duration_since(Instant::now())),
                ))
                .metrics(
                    |m| m.current_leader.is_some_and(|l| l != leader),
                    "another leader",
                )
                .await;
            leader = self.wait_for_leader(deadline).await?;
            if leader == self.member_id {
                return Ok(Routed::Local(req));
            }
        }
    }

    /// The current leader, waiting for one to be known until `deadline` (`NoLeader` then).
    async fn wait_for_leader(&self, deadline: Instant) -> Result<u64, ProposeError> {
        if let Some(leader) = self.raft.metrics().borrow().current_leader {
            return Ok(leader);
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        match self
            .raft
            .wait(Some(remaining))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
        {
            Ok(m) => m.current_leader.ok_or(ProposeError::NoLeader),
            Err(WaitError::Timeout(..)) => Err(ProposeError::NoLeader),
            Err(WaitError::ShuttingDown) => Err(ProposeError::ShuttingDown),
        }
    }

    /// Waits until this replica has applied Raft index `index` (`Timeout` after `deadline`).
    async fn wait_applied(&self, index: u64, deadline: Instant) -> Result<(), ProposeError> {
        let applied =
            |m: &openraft::RaftMetrics<u64, Member>| m.last_applied.map_or(0, |l| l.index) >= index;
        if applied(&self.raft.metrics().borrow()) {
            return Ok(());
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        match self
            .raft
            .wait(Some(remaining))
            .metrics(applied, "read index applied")
            .await
        {
            Ok(_) => Ok(()),
            Err(WaitError::Timeout(..)) => Err(ProposeError::Timeout),
            Err(WaitError::ShuttingDown) => Err(ProposeError::ShuttingDown),
        }
    }

    /// The leader's half of ReadIndex: confirms leadership with a quorum and returns the
    /// index a linearizable read must wait for (not waiting for it here: the caller may be
    /// on another member).
    async fn read_index_local(&self) -> Result<u64, ProposeError> {
        self.check_running()?;
        self.wait_transfer(Instant::now() + REQUEST_TIMEOUT).await;
        // openraft 0.9 restores a restarted leader as leader at once (same term, no new
        // blank entry) and then answers `max(its first entry of the term, committed)`, where
        // `committed` is what it recovered from disk: it can lag entries that were committed
        // (and acknowledged) before the crash, and a read at that index is stale (found by
        // baton-sim, seeds 42 and 78). Every committed entry is in the leader's log, so
        // waiting for everything it held when it began serving reads in this term is always
        // enough; entries it appended since are its own, and its committed index tracks them.
        // (Waiting for the log's end at every read instead made each read or lock grant under
        // write load wait for the batch in flight: one more fsync + apply per lock acquire.)
        let (term, last_log_index) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_term, m.last_log_index.unwrap_or(0))
        };
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(remaining, self.raft.get_read_log_id()).await {
                Err(_) => return Err(ProposeError::Timeout),
                Ok(Ok((read_log_id, _))) => {
                    let floor = {
                        let mut f = self.read_floor.lock();
                        match *f {
                            Some((t, index)) if t == term => index,
                            _ => {
                                *f = Some((term, last_log_index));
                                last_log_index
                            }
                        }
                    };
                    return Ok(read_log_id.map_or(0, |l| l.index).max(floor));
                }
                Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                    return Err(leader_error(f.leader_id))
                }
                // No quorum answered this round of heartbeats within openraft's limit of one
                // heartbeat interval (100 ms by default): a follower slow for a moment (a
                // loaded machine, an fsync), not lost leadership — that shows up as
                // `ForwardToLeader`. Ask again until the deadline, as etcd retries its
                // ReadIndex; failing at once turned every slow heartbeat into a client-visible
                // "request timed out" on a healthy cluster (`steady_state.rs`).
                Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                    if Instant::now() + LEADER_RETRY_INTERVAL >= deadline {
                        return Err(ProposeError::Timeout);
                    }
                    tokio::time::sleep(LEADER_RETRY_INTERVAL).await;
                }
                Ok(Err(RaftError::Fatal(f))) => return Err(self.fatal_error(&f)),
            }
        }
    }

    /// A keep-alive acknowledged only by a leader that a quorum confirmed within the last
    /// heartbeat interval (etcd's `ensureLeadership`, the fix of etcd#15247).
    ///
    /// Why: a leader that was paused (SIGSTOP, a long GC, a frozen VM) or cut off still
    /// believes it leads until a peer tells it otherwise. Its clock may still track a lease
    /// the new leader has since expired — renewing it would tell the client it holds a lease
    /// (and the locks under it) that is gone; or its clock may have marked as expiring a lease
    /// the client kept alive through the new leader — "not found" would make the client give
    /// up a live lease. Both were observed with three processes
    /// (`crates/baton/tests/it/leases_failover.rs`). A confirmation less than one heartbeat
    /// interval old is enough: followers that acknowledged it will not elect anyone else
    /// for at least their election timeout, several heartbeat intervals. It is shared — at
    /// most one ReadIndex round per heartbeat interval however many keep-alives arrive — so
    /// 10k leases cost the leader no extra Raft traffic. After the renewal the term and role
    /// are checked once more (cheap), so a change of leadership while renewing is not
    /// acknowledged either.
    async fn keep_alive_confirmed(
        self: &Arc<Self>,
        id: LeaseId,
    ) -> Result<KeepAlive, ProposeError> {
        self.ensure_leadership().await?;
        let term = self.raft.metrics().borrow().current_term;
        let answer = self.keep_alive_local(id)?;
        let (state, leader, now_term) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.state, m.current_leader, m.current_term)
        };
        if state != ServerState::Leader || now_term != term {
            return Err(leader_error(leader.filter(|l| *l != self.member_id)));
        }
        Ok(answer)
    }

    async fn ensure_leadership(&self) -> Result<(), ProposeError> {
        let fresh = || {
            let term = self.raft.metrics().borrow().current_term;
            self.leadership_confirmed
                .lock()
                .is_some_and(|(t, at)| t == term && at.elapsed() < self.config.heartbeat_interval)
        };
        if fresh() {
            return Ok(());
        }
        let _one = self.confirming.lock().await;
        if fresh() {
            return Ok(());
        }
        let started = Instant::now();
        let term = self.raft.metrics().borrow().current_term;
        self.read_index_local().await?;
        *self.leadership_confirmed.lock() = Some((term, started));
        Ok(())
    }

    /// The leader's half of [`Node::confirm_grant`]: leadership first, then the lease clock
    /// (a lease judged alive by a leader that has just confirmed it still leads).
    async fn grant_check_local(
        self: &Arc<Self>,
        lease: LeaseId,
    ) -> Result<(u64, bool), ProposeError> {
        // A round that started after this check arrived confirms leadership as one of its
        // own would; concurrent checks (a follower's batch, many locks) share it.
        let index = self.shared_read_index_local().await?;
        let exists = self.shared.state.read().sm.lease_exists(lease);
        let alive = exists
            && self
                .shared
                .leases
                .lock()
                .alive(lease, Instant::now())
                .unwrap_or(true);
        Ok((index, alive))
    }

    /// The leader's half of TimeToLive.
    fn time_to_live_local(&self, id: LeaseId) -> Result<Option<i64>, ProposeError> {
        self.check_running()?;
        let (state, leader) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.state, m.current_leader)
        };
        if state != ServerState::Leader {
            return Err(leader_error(leader.filter(|l| *l != self.member_id)));
        }
        Ok(lease_remaining_s(&self.shared, id))
    }

    /// The leader's half of publishing: records `member`'s name and client URLs for `id`,
    /// keeping the peer URLs the membership has (changing those is a member update, not a
    /// publish). A membership entry that changes no voter is a single uniform config.
    async fn publish_local(&self, id: u64, member: Member) -> Result<(), ProposeError> {
        self.check_running()?;
        let current = {
            let m = self.raft.metrics();
            let m = m.borrow();
            m.membership_config.membership().get_node(&id).cloned()
        };
        let Some(current) = current else {
            return Err(ProposeError::MembershipChange(format!(
                "member {id:x} is not in the membership"
            )));
        };
        let node = Member {
            peer_urls: current.peer_urls.clone(),
            ..member
        };
        if node == current {
            return Ok(());
        }
        let change = ChangeMembers::SetNodes(BTreeMap::from([(id, node)]));
        match tokio::time::timeout(REQUEST_TIMEOUT, self.raft.change_membership(change, true)).await
        {
            Err(_) => Err(ProposeError::Timeout),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(leader_error(f.leader_id))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(ProposeError::MembershipChange(match e {
                    ChangeMembershipError::InProgress(p) => format!("{p}"),
                    other => other.to_string(),
                }))
            }
            Ok(Err(RaftError::Fatal(f))) => Err(self.fatal_error(&f)),
        }
    }

    /// Serves a request forwarded by a follower. Everything runs locally: a member that is
    /// not the leader answers `NotLeader` and the follower tries again, so requests never
    /// hop twice.
    async fn serve_leader_request(self: &Arc<Self>, req: LeaderRequest) -> LeaderResponse {
        let res = match req {
            LeaderRequest::Propose(command) => self.propose(command).await.map(forwarded),
            LeaderRequest::ReadIndex => self
                .shared_read_index_local()
                .await
                .map(LeaderResponse::ReadIndex),
            LeaderRequest::KeepAlive(id) => self
                .keep_alive_confirmed(id)
                .await
                .map(LeaderResponse::KeepAlive),
            LeaderRequest::TimeToLive(id) => {
                self.time_to_live_local(id).map(LeaderResponse::TimeToLive)
            }
            LeaderRequest::Publish { id, member } => self
                .publish_local(id, member)
                .await
                .map(|()| LeaderResponse::Published),
            LeaderRequest::GrantCheck(lease) => {
                self.grant_check_local(lease)
                    .await
                    .map(|(read_index, lease_alive)| LeaderResponse::GrantCheck {
                        read_index,
                        lease_alive,
                    })
            }
            LeaderRequest::ChangeMembers(change) => {
                let deadline = Instant::now() + REQUEST_TIMEOUT;
                match self.change_members_local(change, deadline).await {
                    Err(MemberError::Propose(e)) => Err(e),
                    res => Ok(LeaderResponse::MembersChanged(res)),
                }
            }
        };
        res.unwrap_or_else(LeaderResponse::Failed)
    }

    /// Serves a follower's batch of forwarded requests: every item as
    /// [`Inner::serve_leader_request`] would serve it alone, all at once, the proposals handed
    /// to the proposer together (one Raft entry for the batch, not one per proposer wake-up).
    /// One answer per item, in order.
    async fn serve_leader_batch(self: &Arc<Self>, reqs: Vec<LeaderRequest>) -> Vec<LeaderResponse> {
        let n = reqs.len();
        let mut proposal_at = Vec::new();
        let mut commands = Vec::new();
        let mut others = Vec::new();
        for (i, req) in reqs.into_iter().enumerate() {
            match req {
                LeaderRequest::Propose(command) => {
                    proposal_at.push(i);
                    commands.push(command);
                }
                other => others.push((i, other)),
            }
        }
        let proposals = async {
            if commands.is_empty() {
                Vec::new()
            } else {
                self.propose_many(commands).await
            }
        };
        let served = futures::future::join_all(
            others
                .into_iter()
                .map(|(i, req)| async move { (i, self.serve_leader_request(req).await) }),
        );
        let (proposed, served) = futures::join!(proposals, served);
        let mut out: Vec<Option<LeaderResponse>> = (0..n).map(|_| None).collect();
        for (i, res) in proposal_at.into_iter().zip(proposed) {
            out[i] = Some(res.map(forwarded).unwrap_or_else(LeaderResponse::Failed));
        }
        for (i, resp) in served {
            out[i] = Some(resp);
        }
        out.into_iter()
            .map(|r| r.expect("every item is answered"))
            .collect()
    }

    /// [`Inner::propose`] for several commands at once (in one Raft entry unless the
    /// proposer's batch limits cut between them); one result each, in order.
    async fn propose_many(&self, commands: Vec<Command>) -> Vec<Result<Proposed, ProposeError>> {
        if let Err(e) = self.check_running() {
            return commands.iter().map(|_| Err(e.clone())).collect();
        }
        self.wait_transfer(Instant::now() + REQUEST_TIMEOUT).await;
        self.proposer.propose_many(commands).await
    }

    /// One round of publishing this member's name and client URLs into the membership:
    /// `Ok(true)` once the membership shows them, `Ok(false)` if not yet (not in a membership
    /// yet, or just sent: the next round checks).
    async fn publish_once(self: &Arc<Self>) -> Result<bool, ProposeError> {
        let current = {
            let m = self.raft.metrics();
            let m = m.borrow();
            m.membership_config
                .membership()
                .get_node(&self.member_id)
                .cloned()
        };
        // Not in a membership yet (waiting to be contacted): nothing to publish into.
        let Some(current) = current else {
            return Ok(false);
        };
        let member = Member {
            name: self.config.name.clone(),
            peer_urls: current.peer_urls.clone(),
            client_urls: self.config.client_urls.clone(),
        };
        if member == current {
            return Ok(true);
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let req = LeaderRequest::Publish {
            id: self.member_id,
            member,
        };
        match self.route(req, deadline).await? {
            Routed::Local(LeaderRequest::Publish { id, member }) => {
                self.publish_local(id, member).await?
            }
            Routed::Local(_) => unreachable!("route hands back the request it was given"),
            Routed::Remote(LeaderResponse::Published) => {}
            Routed::Remote(other) => return Err(unexpected_answer(other)),
        }
        Ok(false)
    }

    /// Writes a full-TTL checkpoint for a renewed lease whose replicated checkpoint is stale
    /// (see `lease::Tracked::checkpointed`). Fire and forget: a keep-alive must not wait on
    /// the log; on failure the next renewal retries.
    fn reset_checkpoint(self: &Arc<Self>, id: LeaseId, granted_ttl_s: i64) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.shared.leases.lock().checkpoint_reset_failed(id);
            return;
        };
        let inner = self.clone();
        rt.spawn(async move {
            let checkpoints = vec![(id, granted_ttl_s.saturating_mul(1000))];
            if inner
                .propose(Command::LeaseCheckpoint { checkpoints })
                .await
                .is_err()
            {
                inner.shared.leases.lock().checkpoint_reset_failed(id);
            }
        });
    }

    /// Called when this replica leads `term`: waits until everything committed before is
    /// applied (so the state machine lists every live lease), then rebuilds the lease clock.
    async fn become_ready(&self, term: u64) {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, term, "leadership not confirmed; lease clock not rebuilt");
                return;
            }
            Err(_) => return,
        }
        let still_leader = {
            let m = self.raft.metrics();
            let m = m.borrow();
            m.state == ServerState::Leader && m.current_term == term
        };
        if !still_leader {
            return;
        }
        let st = self.shared.state.read();
        let mut clock = self.shared.leases.lock();
        clock.rebuild(&st.sm, Instant::now(), self.config.election_timeout, term);
        tracing::info!(
            term,
            leases = st.sm.lease_ids().len(),
            "leader lease clock ready"
        );
    }

    /// One tick of the leader's lease duties: expire what is due, checkpoint long leases.
    /// The size-based snapshot trigger (see [`SNAPSHOT_LOG_MIN_BYTES`]); checked on every
    /// member from the lease loop's tick. openraft ignores the trigger while a snapshot is
    /// being built.
    async fn snapshot_if_log_large(&self) {
        let since = self.raft.metrics().borrow().snapshot.map(|l| l.index);
        let log = self.wal.log_bytes_after(since);
        let last = self.shared.snapshot_bytes.load(Ordering::Relaxed);
        if log >= SNAPSHOT_LOG_MIN_BYTES.max(last) {
            if let Err(e) = self.raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "size-triggered snapshot not started");
            }
        }
    }

    /// One tick of the disk watch (see `space`): measures the free space, pokes a stalled log
    /// writer, re-triggers a snapshot that did not fit once it does, judges whether space is
    /// low, and raises or clears this member's `NOSPACE` alarm to match. Both go through
    /// the leader from any member: a follower's full disk stops the cluster's writes as
    /// etcd's does (a follower that cannot log would otherwise fall behind silently), and
    /// the leader accepts an alarm raised over `Forward` only for its sender's own id
    /// (`peer_server::check_forwarded`).
    async fn space_tick(self: &Arc<Self>) {
        let shared = &self.shared;
        let free = shared.measure_free();
        self.wal.retry_stalled();
        let mut snapshot_blocked = shared.space.snapshot_blocked();
        if snapshot_blocked && shared.snapshot_fits() {
            // Room again: try now rather than after the next apply (none may come).
            shared.space.set_snapshot_blocked(false);
            snapshot_blocked = false;
            if let Err(e) = self.raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "snapshot after space came back not started");
            }
        }
        let stalled = self.wal.stalled();
        let was_low = shared.space.is_low();
        let low = space::judge(
            free,
            shared.space.reserve,
            was_low,
            stalled || snapshot_blocked,
        );
        if shared.space.set_low(low) != low {
            metrics::gauge!("baton_disk_space_low").set(if low { 1.0 } else { 0.0 });
            if low {
                tracing::warn!(
                    free_bytes = ?free,
                    reserve_bytes = shared.space.reserve,
                    log_stalled = stalled,
                    snapshot_blocked,
                    "disk space low: refusing writes that add data (NOSPACE); reads, deletes \
                     and compaction are served"
                );
            } else {
                tracing::info!(free_bytes = ?free, "disk space available again: writes accepted");
            }
        }
        let raised = shared
            .state
            .read()
            .sm
            .alarms()
            .contains(&(self.member_id, AlarmType::NoSpace));
        let action = match (low, raised) {
            (true, false) => AlarmAction::Activate,
            (false, true) => AlarmAction::Deactivate,
            _ => return,
        };
        if self.alarm_in_flight.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.clone();
        tokio::spawn(async move {
            let command = Command::Alarm {
                action,
                member_id: inner.member_id,
                alarm: AlarmType::NoSpace,
            };
            // Routed: a follower's own alarm is raised and cleared through the leader.
            let node = Node {
                inner: inner.clone(),
            };
            let res = node.propose_routed(command).await;
            match res {
                Ok(_) if action == AlarmAction::Activate => tracing::warn!(
                    member = format_args!("{:x}", inner.member_id),
                    "NOSPACE alarm raised"
                ),
                Ok(_) => tracing::info!(
                    member = format_args!("{:x}", inner.member_id),
                    "NOSPACE alarm cleared: space is available again"
                ),
                Err(e) => {
                    if inner.alarm_log.allow() {
                        tracing::warn!(error = %e, ?action, "proposing the NOSPACE alarm failed; will retry");
                    }
                }
            }
            inner.alarm_in_flight.store(false, Ordering::Release);
        });
    }

    async fn lease_tick(&self, last_checkpoint: &mut Instant) {
        let (state, term) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.state, m.current_term)
        };
        if state != ServerState::Leader {
            self.shared.leases.lock().step_down();
            return;
        }
        if self.shared.leases.lock().ready_term() != Some(term) {
            self.become_ready(term).await;
            *last_checkpoint = Instant::now();
            return;
        }
        for _ in 0..MAX_EXPIRE_ENTRIES_PER_TICK {
            let ids = self
                .shared
                .leases
                .lock()
                .take_expired(Instant::now(), MAX_EXPIRE_IDS_PER_ENTRY);
            if ids.is_empty() {
                break;
            }
            let n = ids.len() as u64;
            let res = self
                .propose(Command::ExpireLeasesInTerm {
                    term: Term(term),
                    ids: ids.clone(),
                })
                .await;
            self.shared.leases.lock().finish_expiring(&ids);
            match res {
                Ok(p) => {
                    metrics::counter!("baton_leases_expired_total").increment(n);
                    if let Response::ExpireLeases {
                        expired_holders, ..
                    } = &p.applied.response
                    {
                        if !expired_holders.is_empty() {
                            metrics::counter!("baton_lock_expired_holders_total")
                                .increment(expired_holders.len() as u64);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, leases = n, "proposing lease expiry failed; will retry");
                    break;
                }
            }
        }
        let interval = self.config.lease_checkpoint_interval;
        if last_checkpoint.elapsed() >= interval {
            *last_checkpoint = Instant::now();
            let min_ttl_s = interval.as_secs() as i64;
            let checkpoints = self
                .shared
                .leases
                .lock()
                .checkpoints(Instant::now(), min_ttl_s);
            for chunk in checkpoints.chunks(MAX_CHECKPOINTS_PER_ENTRY) {
                if let Err(e) = self
                    .propose(Command::LeaseCheckpoint {
                        checkpoints: chunk.to_vec(),
                    })
                    .await
                {
                    tracing::warn!(error = %e, "proposing lease checkpoints failed");
                    break;
                }
            }
        }
    }
}

/// Remaining TTL per the lease clock, else (a replica that is not leader) the best replicated
/// estimate; `None` if the lease does not exist.
fn lease_remaining_s(shared: &Shared, id: LeaseId) -> Option<i64> {
    if let Some(s) = shared.leases.lock().remaining_s(id, Instant::now()) {
        return Some(s);
    }
    let info = shared.state.read().sm.lease(id)?;
    Some(
        info.checkpoint_remaining_ms
            .map_or(info.granted_ttl_s, |ms| ms.max(0) / 1000),
    )
}

/// A leader's proposal outcome as sent back to the follower that forwarded it.
fn forwarded(p: Proposed) -> LeaderResponse {
    LeaderResponse::Proposed(ForwardedProposal {
        revision: p.applied.revision,
        response: p.applied.response,
        raft_term: p.raft_term,
        raft_index: p.raft_index,
    })
}

/// Where [`Inner::route`] sent a request.
enum Routed {
    /// This member leads: serve it here (the request is handed back).
    Local(LeaderRequest),
    /// The leader's answer.
    Remote(LeaderResponse),
}

/// A leader answered with the wrong kind of response: a bug, or two different Baton builds
/// in one cluster.
fn unexpected_answer(resp: LeaderResponse) -> ProposeError {
    tracing::error!(
        ?resp,
        "the leader answered a forwarded request with the wrong kind of response"
    );
    ProposeError::LeaderFailed("unexpected answer from the leader".into())
}

/// Publishes this member's name and client URLs into the membership (etcd's `publish`), so
/// every member's `MemberList` shows them: retried with backoff until the membership shows
/// them, then done for this process's life. Weak for the same reason as `lease_loop`.
async fn publish_loop(node: Weak<Inner>) {
    let mut delay = PUBLISH_RETRY_MIN;
    loop {
        let Some(inner) = node.upgrade() else { return };
        if inner.shutting_down.load(Ordering::Acquire) {
            return;
        }
        match inner.publish_once().await {
            Ok(true) => {
                tracing::debug!(name = %inner.config.name, client_urls = ?inner.config.client_urls, "member attributes are in the membership");
                return;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(error = %e, "publishing member attributes failed; will retry");
                delay = (delay * 2).min(PUBLISH_RETRY_MAX);
            }
        }
        drop(inner);
        tokio::time::sleep(delay).await;
    }
}

/// The leader's lease duties, every `LEASE_TICK`. Holds only a weak reference so a node that
/// is dropped without `shutdown` does not live on through its own task.
async fn lease_loop(node: Weak<Inner>) {
    let mut tick = tokio::time::interval(LEASE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_checkpoint = Instant::now();
    let mut last_tick = Instant::now();
    loop {
        tick.tick().await;
        let Some(inner) = node.upgrade() else { return };
        if inner.shutting_down.load(Ordering::Acquire) {
            return;
        }
        let gap = last_tick.elapsed();
        if gap > LEASE_STALL {
            // Nothing ran for `gap`: neither expiry nor the keep-alives that would have
            // renewed. Give the clients that time back before judging any deadline.
            let by = gap - LEASE_TICK;
            inner.shared.leases.lock().extend_all(by);
            tracing::warn!(stalled = ?gap, "lease duties stalled; extended every lease deadline by the stall");
            metrics::counter!("baton_lease_stalls_total").increment(1);
        }
        inner.lease_tick(&mut last_checkpoint).await;
        inner.space_tick().await;
        inner.snapshot_if_log_large().await;
        last_tick = Instant::now();
    }
}
