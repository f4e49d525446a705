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
//! - `network`: peer transport (none yet: clusters have one member).
//!
//! On disk, under `data_dir`: `member.meta` (identity), `raft/vote`, `raft/wal/*.wal`,
//! `snap/<term>-<index>.snap`.

mod deletions;
mod files;
mod lease;
mod network;
mod proposer;
mod sm;
mod snapshot;
mod types;
mod wal;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use baton_core::{Applied, Command, LeaseId, Response, Revision, StateMachine, Term, WatchHub};
use openraft::error::{CheckIsLeaderError, Fatal, RaftError};
use openraft::{BasicNode, ServerState, SnapshotPolicy};

pub use crate::deletions::KeyDeletion;
use crate::files::MemberMeta;
use crate::proposer::Proposer;
use crate::sm::{AppliedState, CurrentSnapshot, Shared, StateStore};
use crate::types::Raft;

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
        }
    }
}

/// A member as shown by `MemberList`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
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

/// A write's outcome together with the term it was committed in (for response headers).
#[derive(Debug, Clone, PartialEq)]
pub struct Proposed {
    pub applied: Applied,
    pub raft_term: u64,
}

/// Why a proposal or a linearizable read did not go through. The server maps these to etcd's
/// `etcdserver: no leader` / `leader changed` / `request timed out`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ProposeError {
    #[error("no leader")]
    NoLeader,
    #[error("not the leader (leader is {leader:?})")]
    NotLeader { leader: Option<u64> },
    #[error("leader changed")]
    LeaderChanged,
    #[error("request timed out")]
    Timeout,
    #[error("replica is shutting down")]
    ShuttingDown,
    /// Storage failed; the replica stops serving rather than risk acknowledging a lost write.
    #[error("storage failure: {0}")]
    Storage(String),
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
    #[error("raft: {0}")]
    Raft(String),
    /// Another process holds the data directory; two members writing one log would corrupt
    /// it.
    #[error("data directory {path} is in use by another process")]
    Locked { path: PathBuf },
}

/// Result of a lease keep-alive on the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Renewed; the lease's granted TTL in seconds.
    Renewed { ttl_s: i64 },
    /// No such lease (expired or revoked).
    NotFound,
}

/// How long a proposal or read barrier may take before the caller gets `Timeout` (etcd's
/// default request timeout is of the same order).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `start` waits for this replica to become leader, so the first request after a
/// start does not fail with "no leader".
const STARTUP_LEADER_WAIT: Duration = Duration::from_secs(5);
/// Lease clock resolution: a lease expires at most this much after its deadline.
const LEASE_TICK: Duration = Duration::from_millis(100);
/// Bounds one `ExpireLeases` entry (an entry is fsynced and applied as one unit).
const MAX_EXPIRE_IDS_PER_ENTRY: usize = 1000;
/// Bounds the expiry work of one tick, so a mass expiry cannot monopolize the log.
const MAX_EXPIRE_ENTRIES_PER_TICK: usize = 16;
/// etcd's lease checkpoint interval: remaining TTLs of long leases are written to the log this
/// often so a new leader does not renew them blindly.
const LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);
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
    shared: Arc<Shared>,
    wal: wal::WalHandle,
    proposer: Proposer,
    shutting_down: Arc<AtomicBool>,
    tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Holds the data directory's advisory lock until `shutdown` has stopped every writer
    /// (or the replica is dropped), so a restarted replica in the same process can take it.
    dir_lock: parking_lot::Mutex<Option<fs::File>>,
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

fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn leader_error(leader: Option<u64>) -> ProposeError {
    match leader {
        None => ProposeError::NoLeader,
        Some(id) => ProposeError::NotLeader { leader: Some(id) },
    }
}

fn fatal_error(f: &Fatal<u64>, shutting_down: bool) -> ProposeError {
    match f {
        Fatal::Stopped if shutting_down => ProposeError::ShuttingDown,
        Fatal::Stopped => ProposeError::Storage("raft stopped".into()),
        Fatal::StorageError(e) => ProposeError::Storage(e.to_string()),
        Fatal::Panicked => ProposeError::Storage("raft core panicked".into()),
    }
}

/// Reads this member's identity, or mints and persists one on a pristine directory. A missing
/// identity next to existing Raft state is refused: a new member id would not be a voter of
/// the recorded membership and the replica could never make progress.
fn load_or_create_member(
    data_dir: &Path,
    name: &str,
    pristine: bool,
) -> Result<MemberMeta, StartError> {
    let path = data_dir.join("member.meta");
    match files::read_framed(&path, files::MEMBER_MAGIC).map_err(io_error(&path))? {
        Some(Ok(payload)) => {
            files::decode_member(&payload).map_err(|reason| invalid_data(&path, reason))
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
            let meta = files::new_identity(name);
            files::write_atomic(&path, &files::encode_member(&meta)).map_err(io_error(&path))?;
            Ok(meta)
        }
    }
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
    /// A fresh directory becomes a one-member cluster.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
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
        let member = load_or_create_member(&data_dir, &config.name, pristine)?;

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

        let raft_config = openraft::Config {
            cluster_name: format!("baton-{:016x}", member.cluster_id),
            heartbeat_interval: config.heartbeat_interval.as_millis() as u64,
            election_timeout_min: config.election_timeout.as_millis() as u64,
            election_timeout_max: 2 * config.election_timeout.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries.max(1)),
            // Keep a little log behind the snapshot for followers that lag slightly (cheaper
            // than shipping a snapshot), but not much: it is memory and disk.
            max_in_snapshot_log_to_keep: (config.snapshot_every_entries / 2).min(1000),
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(format!("invalid timing configuration: {e}")))?;

        let hub = WatchHub::new(config.max_pending_watch_events);
        let shared = Arc::new(Shared::new(state, hub, snap_dir, current_snapshot));
        let (log_store, wal) = wal::open(&raft_dir, recovered)?;
        let raft = match Raft::new(
            member.member_id,
            Arc::new(raft_config),
            network::NoPeers,
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
        );
        let node = Node {
            inner: Arc::new(Inner {
                config,
                member_id: member.member_id,
                cluster_id: member.cluster_id,
                raft,
                shared,
                wal,
                proposer,
                shutting_down,
                tasks: parking_lot::Mutex::new(vec![proposer_task]),
                dir_lock: parking_lot::Mutex::new(Some(dir_lock)),
            }),
        };
        if let Err(e) = node.inner.bootstrap().await {
            node.shutdown().await;
            return Err(e);
        }
        let task = tokio::spawn(lease_loop(Arc::downgrade(&node.inner)));
        node.inner.tasks.lock().push(task);
        Ok(node)
    }

    /// Stamps the command with the leader's time, replicates it, waits until it is durable
    /// (fsynced) and applied, and returns what applying it produced.
    pub async fn propose(&self, command: Command) -> Result<Proposed, ProposeError> {
        self.inner.propose(command).await
    }

    /// Returns once this replica has applied everything committed before the call and has
    /// confirmed it is still the leader (ReadIndex): reads after it are linearizable.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        let inner = &self.inner;
        inner.check_running()?;
        match tokio::time::timeout(REQUEST_TIMEOUT, inner.raft.ensure_linearizable()).await {
            Err(_) => Err(ProposeError::Timeout),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                Err(leader_error(f.leader_id))
            }
            // Leadership could not be confirmed by a quorum in time.
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                Err(ProposeError::Timeout)
            }
            Ok(Err(RaftError::Fatal(f))) => Err(inner.fatal_error(&f)),
        }
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
            .map(|k| KeyDeletion::register(shared, &mut watches, k))
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

    /// Renews a lease on the leader's lease clock (not replicated, as etcd).
    pub fn lease_keep_alive(&self, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        let inner = &self.inner;
        inner.check_running()?;
        let (state, leader, term) = {
            let m = inner.raft.metrics();
            let m = m.borrow();
            (m.state, m.current_leader, m.current_term)
        };
        if state != ServerState::Leader {
            return Err(leader_error(leader.filter(|l| *l != inner.member_id)));
        }
        let now = Instant::now();
        let shared = &inner.shared;
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
            inner.reset_checkpoint(id, renewal.granted_ttl_s);
        }
        Ok(KeepAlive::Renewed {
            ttl_s: renewal.granted_ttl_s,
        })
    }

    /// Remaining TTL of a lease in seconds per the leader's lease clock (rounded as etcd does),
    /// `None` if unknown.
    pub fn lease_remaining_s(&self, id: LeaseId) -> Option<i64> {
        let shared = &self.inner.shared;
        if let Some(s) = shared.leases.lock().remaining_s(id, Instant::now()) {
            return Some(s);
        }
        // Not on the clock (a replica that is not leader): the best replicated estimate.
        let info = shared.state.read().sm.lease(id)?;
        Some(
            info.checkpoint_remaining_ms
                .map_or(info.granted_ttl_s, |ms| ms.max(0) / 1000),
        )
    }

    /// Whether a lease is alive: it exists in the state machine, and the lease clock (the
    /// leader's, where deadlines are kept) neither sees its deadline passed nor has its expiry
    /// in flight. Between a deadline and the applied `ExpireLeases` a lease still exists but
    /// is not alive: a lock must not be granted to it then (etcd#11456).
    pub fn lease_alive(&self, id: LeaseId) -> bool {
        let shared = &self.inner.shared;
        let st = shared.state.read();
        if !st.sm.lease_exists(id) {
            return false;
        }
        let clock = shared.leases.lock();
        clock.alive(id, Instant::now()).unwrap_or(true)
    }

    /// Leader time now, on the scale of `Entry::time_ms` (wall-clock milliseconds, never
    /// below the last applied stamp): what the next entry proposed here would at least be
    /// stamped with. Deadlines the core records (lock-delay) are compared against it.
    pub fn time_ms(&self) -> u64 {
        let last = self.inner.shared.state.read().sm.last_time_ms();
        wall_clock_ms().max(last)
    }

    /// A fresh random positive lease id that is not in use (randomness lives here, not in the
    /// core).
    pub fn new_lease_id(&self) -> LeaseId {
        let shared = &self.inner.shared;
        loop {
            let id = LeaseId(rand::random::<i64>() & i64::MAX);
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

    pub fn members(&self) -> Vec<MemberInfo> {
        let inner = &self.inner;
        let membership = inner.raft.metrics().borrow().membership_config.clone();
        let voters: Vec<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| {
                let me = *id == inner.member_id;
                MemberInfo {
                    id: *id,
                    // Other members' names and client URLs travel with multi-member support.
                    name: if me {
                        inner.config.name.clone()
                    } else {
                        String::new()
                    },
                    peer_urls: if me {
                        inner.config.peer_urls.clone()
                    } else {
                        vec![node.addr.clone()]
                    },
                    client_urls: if me {
                        inner.config.client_urls.clone()
                    } else {
                        Vec::new()
                    },
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
        // Nothing writes to the directory any more.
        inner.dir_lock.lock().take();
    }

    /// Number of fsyncs the Raft log has issued since start. For tests (group commit) and
    /// diagnostics; the same count is exported as `baton_wal_fsyncs_total`.
    pub fn wal_fsync_count(&self) -> u64 {
        self.inner.wal.stats.fsyncs.load(Ordering::Relaxed)
    }
}

impl Inner {
    fn check_running(&self) -> Result<(), ProposeError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(ProposeError::ShuttingDown);
        }
        Ok(())
    }

    fn fatal_error(&self, f: &Fatal<u64>) -> ProposeError {
        fatal_error(f, self.shutting_down.load(Ordering::Acquire))
    }

    /// First start: make this directory a one-member cluster. Every start: get leadership
    /// (a single voter elects itself) and have the lease clock ready before serving.
    async fn bootstrap(&self) -> Result<(), StartError> {
        let raft_err = |e: &dyn std::fmt::Display| StartError::Raft(e.to_string());
        if !self.raft.is_initialized().await.map_err(|e| raft_err(&e))? {
            let addr = self.config.peer_urls.first().cloned().unwrap_or_default();
            let members = BTreeMap::from([(self.member_id, BasicNode::new(addr))]);
            self.raft
                .initialize(members)
                .await
                .map_err(|e| raft_err(&e))?;
        }
        let (state, voters) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.state, m.membership_config.voter_ids().collect::<Vec<_>>())
        };
        // The sole voter need not wait an election timeout to notice nobody else leads.
        if voters == [self.member_id] && state != ServerState::Leader {
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

    async fn propose(&self, command: Command) -> Result<Proposed, ProposeError> {
        self.check_running()?;
        self.proposer.propose(command).await
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
                .propose(Command::ExpireLeases { ids: ids.clone() })
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
        if last_checkpoint.elapsed() >= LEASE_CHECKPOINT_INTERVAL {
            *last_checkpoint = Instant::now();
            let min_ttl_s = LEASE_CHECKPOINT_INTERVAL.as_secs() as i64;
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

/// The leader's lease duties, every `LEASE_TICK`. Holds only a weak reference so a node that
/// is dropped without `shutdown` does not live on through its own task.
async fn lease_loop(node: Weak<Inner>) {
    let mut tick = tokio::time::interval(LEASE_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_checkpoint = Instant::now();
    loop {
        tick.tick().await;
        let Some(inner) = node.upgrade() else { return };
        if inner.shutting_down.load(Ordering::Acquire) {
            return;
        }
        inner.lease_tick(&mut last_checkpoint).await;
    }
}
