//! The applied state and openraft's view of it (`RaftStateMachine`, `RaftSnapshotBuilder`).
//!
//! The state machine lives in memory behind a `RwLock`; durability comes from the log plus
//! snapshots (restart = newest snapshot + log tail re-applied). Lock order, everywhere:
//! state (`RwLock`) → watch hub (`Mutex`) → deletion watches (`Mutex`) → lease clock
//! (`Mutex`).

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

use baton_core::{
    Applied, Command, CommandIndex, Entry, EventKind, Response, Revision, StateMachine, Term,
    WatchHub,
};
use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder, Snapshot, StorageIOError,
    StoredMembership,
};
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;

use crate::deletions::DeletionWatches;
use crate::lease::LeaseClock;
use crate::observe::{ApplyTally, SLOW_APPLY};
use crate::snapshot;
use crate::space::{self, Space};
use crate::types::{LogId, Membership, RaftEntry, Reply, SnapshotMeta, StorageError, TypeConfig};
use crate::value_file::ValueFile;

/// Everything that changes together when an entry is applied; one lock so that a snapshot's
/// bytes, last log id and membership always agree.
pub(crate) struct AppliedState {
    pub(crate) sm: StateMachine,
    /// The last Raft entry applied.
    pub(crate) last_applied: Option<LogId>,
    pub(crate) membership: Membership,
    /// What applying did since start, for monitoring (kept across installed snapshots).
    pub(crate) tally: ApplyTally,
}

impl AppliedState {
    /// The core index the next command gets: commands are numbered consecutively from 0 (one
    /// Raft entry may carry several; blank and membership entries count as one `Noop`).
    /// Derived from replicated state only, so every replica numbers alike.
    fn next_core_index(&self) -> u64 {
        match self.last_applied {
            None => 0,
            Some(_) => self.sm.last_applied().0 .0 + 1,
        }
    }
}

/// The snapshot found on disk at start: meta, path, size in bytes.
pub(crate) type CurrentSnapshot = (SnapshotMeta, PathBuf, u64);

/// State shared by the node, openraft's state-machine worker and the snapshot builder.
pub(crate) struct Shared {
    pub(crate) state: RwLock<AppliedState>,
    pub(crate) hub: Mutex<WatchHub>,
    /// One-shot key-deletion watches (lock waiters).
    pub(crate) deletions: Arc<Mutex<DeletionWatches>>,
    pub(crate) leases: Mutex<LeaseClock>,
    pub(crate) revision_tx: watch::Sender<Revision>,
    /// The index of the last entry applied here, sent as soon as its apply is done (state,
    /// watch hub and deletion watches updated). `Replica::wait_applied` waits on this, not on
    /// openraft's metrics: those report the apply only after the state machine task has
    /// answered the Raft core and the core has published new metrics, two task hops later,
    /// and a write forwarded by this member, or a read waiting for its read index, waits
    /// for this member's apply, not for openraft's bookkeeping of it.
    pub(crate) applied_tx: watch::Sender<u64>,
    /// The highest Raft index of a write this member answered before applying it (a write
    /// forwarded to the leader, answered from the leader's apply: `Node::propose_owing_apply`).
    /// Every client request served here afterwards first waits until `applied_tx` reaches
    /// it (`Node::caught_up`), so whatever a client learns from this member includes every
    /// write this member has already answered: read-your-writes, for that client and every
    /// other, as if the answer had waited for the apply.
    owed_apply: AtomicU64,
    /// Older Batons' `.snap` files (removed once a `db` is written).
    snap_dir: PathBuf,
    /// `member/snap/db`: where snapshots are written.
    db_path: PathBuf,
    /// The `member/snap/db` loaded at start whose `key` bucket failed its checksum, accepted
    /// for the initial corruption check (`NodeConfig::snapshot_kv_checked_by_peers`).
    pub(crate) kv_changed_at_start: Option<PathBuf>,
    /// While set, this member writes no snapshot of its own: it started from a changed
    /// `key` bucket, and a new snapshot would give that key space a fresh, valid checksum
    /// before the initial corruption check has compared it (`Node::release_snapshots`).
    pub(crate) snapshots_held: AtomicBool,
    /// The snapshot on disk (meta, path); serializes snapshot writes.
    current_snapshot: Mutex<Option<(SnapshotMeta, PathBuf)>>,
    pub(crate) snapshot_bytes: AtomicU64,
    snapshot_seq: AtomicU64,
    /// Set on shutdown (`close_snapshots`): no snapshot file is written any more.
    snapshots_closed: AtomicBool,
    /// The disk watch (see `space`): whether snapshots fit, and whether space is low.
    pub(crate) space: Space,
    /// A leader's snapshot is being installed (`etcd_server_snapshot_apply_in_progress_total`).
    pub(crate) installing_snapshot: AtomicBool,
    /// Where the key store keeps its values out of the heap (`None` on a simulated disk):
    /// handed to every state this member adopts.
    pub(crate) values: Option<Arc<ValueFile>>,
}

impl Shared {
    pub(crate) fn new(
        state: AppliedState,
        hub: WatchHub,
        snap_dir: PathBuf,
        db_path: PathBuf,
        current_snapshot: Option<CurrentSnapshot>,
        space: Space,
        values: Option<Arc<ValueFile>>,
    ) -> Self {
        let (revision_tx, _) = watch::channel(state.sm.revision());
        let (applied_tx, _) = watch::channel(state.last_applied.map_or(0, |l| l.index));
        let bytes = current_snapshot.as_ref().map_or(0, |c| c.2);
        Shared {
            state: RwLock::new(state),
            hub: Mutex::new(hub),
            deletions: Arc::new(Mutex::new(DeletionWatches::default())),
            leases: Mutex::new(LeaseClock::default()),
            revision_tx,
            applied_tx,
            owed_apply: AtomicU64::new(0),
            snap_dir,
            db_path,
            kv_changed_at_start: None,
            snapshots_held: AtomicBool::new(false),
            current_snapshot: Mutex::new(current_snapshot.map(|(m, p, _)| (m, p))),
            snapshot_bytes: AtomicU64::new(bytes),
            snapshot_seq: AtomicU64::new(0),
            snapshots_closed: AtomicBool::new(false),
            space,
            installing_snapshot: AtomicBool::new(false),
            values,
        }
    }

    /// Records that a write at Raft index `index`, not yet applied here, is being answered
    /// (`owed_apply`). Called before the answer leaves: a request that follows the answer
    /// finds it.
    pub(crate) fn owe_apply(&self, index: u64) {
        self.owed_apply.fetch_max(index, Ordering::SeqCst);
    }

    /// The index this member must have applied before it serves another client request:
    /// `Some` while it has not yet (`owed_apply` above `applied_tx`).
    pub(crate) fn apply_owed(&self) -> Option<u64> {
        let owed = self.owed_apply.load(Ordering::SeqCst);
        (owed > *self.applied_tx.borrow()).then_some(owed)
    }

    /// Measures the free space of the data directory's file system now.
    pub(crate) fn measure_free(&self) -> Option<u64> {
        self.space.measure(&self.snap_dir)
    }

    /// About how many bytes the next snapshot file takes: the last one's size, or the
    /// state's estimate if that is more.
    pub(crate) fn snapshot_estimate(&self) -> u64 {
        let state = self.state.read().sm.approximate_size_bytes();
        state.max(self.snapshot_bytes.load(Ordering::Relaxed))
    }

    /// Whether the next snapshot would fit now (measuring the free space).
    pub(crate) fn snapshot_fits(&self) -> bool {
        let free = self.measure_free();
        space::snapshot_fits(free, self.space.reserve, self.snapshot_estimate())
    }

    /// Answers openraft's snapshot request without a new snapshot (there is no room for
    /// one): the snapshot already on disk, which openraft ignores as not newer than its own,
    /// so it purges nothing and asks again later. Handing it an error instead would stop its
    /// core for good. Marks snapshots blocked, which the disk watch counts as low space.
    fn defer_snapshot(&self, why: &str) -> Snapshot<TypeConfig> {
        self.space.set_snapshot_blocked(true);
        if self.space.snapshot_log.allow() {
            tracing::warn!(
                estimate_bytes = self.snapshot_estimate(),
                free_bytes = ?self.space.last_free(),
                why,
                "snapshot deferred: not enough free disk space; the log is kept until one fits"
            );
        }
        metrics::counter!("baton_snapshots_deferred_total").increment(1);
        let meta = self
            .current_snapshot
            .lock()
            .as_ref()
            .map(|(m, _)| m.clone())
            .unwrap_or_default();
        Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(Vec::new())),
        }
    }

    /// Applies one Raft entry: each command to the state machine, then (under the same write
    /// lock, so a watcher registered via `with_watch_hub` sees each event exactly once) to the
    /// hub, then to the lease clock. The lock is held for the whole entry so a snapshot never
    /// sees half of a batch (it would then be re-applied in part after a restart).
    fn apply_entry(
        &self,
        log_id: LogId,
        time_ms: Option<u64>,
        commands: Vec<Command>,
        membership: Option<Membership>,
    ) -> Vec<Applied> {
        let now = Instant::now();
        let mut st = self.state.write();
        let expected = st.last_applied.map_or(0, |l| l.index + 1);
        assert_eq!(
            log_id.index, expected,
            "entries are applied in order without gaps"
        );
        // Blank and membership entries carry no time; the leader's stamps never go backwards,
        // and clamping here (deterministically, from replicated state) keeps that true even
        // across a leader whose clock is behind its predecessor's.
        let time_ms = time_ms.unwrap_or(0).max(st.sm.last_time_ms());
        // Events carry previous values only if a watcher asked for them (no watcher can be
        // added while this entry is applied: registering takes the state lock too).
        let prev_values = self.hub.lock().wants_prev_values();
        st.sm.set_prev_values_in_events(prev_values);
        let first_index = st.next_core_index();
        let mut results = Vec::with_capacity(commands.len());
        for (index, command) in (first_index..).zip(commands) {
            let entry = Entry {
                index: CommandIndex(index),
                term: Term(log_id.leader_id.term),
                time_ms,
                command,
            };
            let applied = st.sm.apply(&entry);
            if !applied.events.is_empty() {
                self.hub.lock().publish(&applied.events);
                let mut deletions = self.deletions.lock();
                if !deletions.is_empty() {
                    for e in applied
                        .events
                        .iter()
                        .filter(|e| e.kind == EventKind::Delete)
                    {
                        deletions.fire(&e.kv.key);
                    }
                }
            }
            self.leases
                .lock()
                .on_applied(&entry.command, &applied.response, now);
            st.tally.add(&applied);
            if let Response::LeaseGrant { ttl_s, .. } = &applied.response {
                metrics::histogram!("etcd_debugging_lease_ttl_total").record(*ttl_s as f64);
            }
            results.push(applied);
        }
        if now.elapsed() > SLOW_APPLY {
            st.tally.slow_applies += 1;
        }
        st.sm.evacuate_values();
        st.last_applied = Some(log_id);
        if let Some(m) = membership {
            st.membership = m;
        }
        results
    }

    /// Stops snapshot writes for good (shutdown): waits for one in progress and refuses
    /// later ones. Snapshots are encoded and written on blocking threads that outlive the
    /// Raft core, so without this one could land in the directory after its lock was
    /// released (a restarted member would then find a snapshot it did not expect).
    pub(crate) fn close_snapshots(&self) {
        let _cur = self.current_snapshot.lock();
        self.snapshots_closed.store(true, Ordering::Release);
    }

    /// Writes a snapshot file (`member/snap/db`) unless a newer one is already on disk.
    /// Returns its size (0: not written, a newer one stands).
    fn persist_snapshot(&self, meta: &SnapshotMeta, state: &StateMachine) -> std::io::Result<u64> {
        let mut cur = self.current_snapshot.lock();
        if self.snapshots_closed.load(Ordering::Acquire) {
            return Err(std::io::Error::other("shutting down: snapshot not written"));
        }
        if let Some((m, _)) = cur.as_ref() {
            if m.last_log_id >= meta.last_log_id {
                return Ok(0);
            }
        }
        // Baton's counterpart of etcd's backend commit (`etcd_disk_backend_commit_duration_seconds`):
        // the applied state reaching disk. etcd commits its bbolt database every 100 ms;
        // Baton's applied state lives in memory (durable through the log) and goes to disk
        // whole, as this file (written, fsynced, renamed).
        #[allow(clippy::disallowed_methods)] // A duration to report, not a deadline.
        let started = std::time::Instant::now();
        let size = snapshot::write_db(&self.db_path, &self.snap_dir, meta, state)?;
        metrics::histogram!("etcd_disk_backend_commit_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        *cur = Some((meta.clone(), self.db_path.clone()));
        self.snapshot_bytes.store(size, Ordering::Relaxed);
        Ok(size)
    }
}

/// Back-off bounds of writing a leader's snapshot on a full disk.
const INSTALL_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(100);
const INSTALL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

fn sm_err(msg: impl ToString) -> StorageError {
    StorageIOError::write_state_machine(AnyError::error(msg)).into()
}

/// openraft's handle on the applied state.
pub(crate) struct StateStore {
    pub(crate) shared: Arc<Shared>,
}

/// Builds a snapshot of the applied state, concurrently with further applies.
pub(crate) struct SnapBuilder {
    shared: Arc<Shared>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        // Only a copy is taken under the read lock; serializing, checksumming and writing
        // happen on a blocking thread without it. Serializing under the lock (as before)
        // stalled every apply for its duration, then every reader queued behind the waiting
        // apply, until the runtime's worker threads were all blocked and Raft itself stopped:
        // a follower snapshotting at its 10 000th entry went silent for longer than the
        // election timeout and then deposed a healthy leader (`steady_state.rs`, three
        // members under load). The copy is O(1): the key store is a persistent B-tree whose
        // nodes stay shared until the next write to each (`baton_core::mvcc::KeyMap`); the
        // small tables (leases, locks, fences, sessions) are copied.
        // Not even started without room for it: on a full disk openraft asks again after
        // every apply, and copying and encoding the state each time would be for nothing.
        if self.shared.snapshots_held.load(Ordering::Acquire) {
            // openraft asks again later; it purges nothing meanwhile.
            let meta = self
                .shared
                .current_snapshot
                .lock()
                .as_ref()
                .map(|(m, _)| m.clone())
                .unwrap_or_default();
            return Ok(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(Vec::new())),
            });
        }
        if !self.shared.snapshot_fits() {
            return Ok(self
                .shared
                .defer_snapshot("too little free space to start one"));
        }
        #[allow(clippy::disallowed_methods)] // How long the build took, for the log; no deadline.
        let started = std::time::Instant::now();
        let (meta, sm) = {
            let st = self.shared.state.read();
            let seq = self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed);
            let id = st.last_applied.map_or_else(
                || "0-0".to_string(),
                |l| format!("{}-{}", l.leader_id.term, l.index),
            );
            let meta = SnapshotMeta {
                last_log_id: st.last_applied,
                last_membership: st.membership.clone(),
                snapshot_id: format!("{id}-{seq}"),
            };
            (meta, st.sm.clone())
        };
        let locked = started.elapsed();
        let shared = self.shared.clone();
        let m = meta.clone();
        let res = tokio::task::spawn_blocking(move || {
            let res = shared.persist_snapshot(&m, &sm);
            drop(sm);
            release_freed_memory();
            res
        })
        .await
        .map_err(|e| sm_err(format!("snapshot writer panicked: {e}")))?;
        let bytes = match res {
            Ok(bytes) => {
                self.shared.space.set_snapshot_blocked(false);
                bytes
            }
            // The partial file is gone (`files::write_atomic`); the old snapshot still
            // stands and the log behind it is kept.
            Err(e) if space::is_enospc(&e) => {
                return Ok(self
                    .shared
                    .defer_snapshot("the file system filled up while writing"));
            }
            Err(e) => {
                return Err(StorageError::from(StorageIOError::write_snapshot(
                    Some(meta.signature()),
                    AnyError::new(&e),
                )))
            }
        };
        tracing::info!(
            last_log_id = ?meta.last_log_id,
            bytes,
            locked_ms = locked.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "snapshot written"
        );
        // The body is not handed back: openraft 0.9 keeps only the meta of a snapshot it had
        // built (`core/sm/worker.rs`, `storage/helper.rs`) and reads snapshots for followers
        // through `get_current_snapshot`, i.e. from the file just written. Returning it would
        // only keep a second copy of the whole state alive a little longer (354 MB at 1M
        // keys) and, dropped on another thread, out of reach of `release_freed_memory`.
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(Vec::new())),
        })
    }
}

/// Returns freed heap memory to the operating system after a snapshot. Building one copies
/// the state and encodes it (together about twice the state's size), and glibc keeps what
/// those copies occupied in its arenas, mapped and counted in RSS, long after they are freed:
/// at 1M keys of 256 B the process stayed at 1.5 GB after the first snapshot, 0.96 GB after
/// a `malloc_trim`. It runs on the blocking thread that wrote the snapshot, once per
/// snapshot; it briefly locks each arena while it walks it.
/// (The `baton` binary allocates with mimalloc, which returns freed pages by itself; this
/// matters for programs that embed a node on glibc's allocator.)
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; it has no
    // preconditions and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl RaftStateMachine<TypeConfig> for StateStore {
    type SnapshotBuilder = SnapBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, Membership), StorageError> {
        let st = self.shared.state.read();
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Reply>, StorageError>
    where
        I: IntoIterator<Item = RaftEntry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        let mut revision = None;
        for e in entries {
            let log_id = e.log_id;
            // Every Raft entry applies at least one command, so the core's last applied term
            // always equals the Raft entry's (checked when loading a snapshot).
            let (time_ms, commands, membership) = match e.payload {
                EntryPayload::Blank => (None, vec![Command::Noop], None),
                EntryPayload::Normal(req) if req.commands.is_empty() => {
                    (Some(req.time_ms), vec![Command::Noop], None)
                }
                EntryPayload::Normal(req) => (Some(req.time_ms), req.commands, None),
                EntryPayload::Membership(m) => (
                    None,
                    vec![Command::Noop],
                    Some(StoredMembership::new(Some(log_id), m)),
                ),
            };
            let applied = self
                .shared
                .apply_entry(log_id, time_ms, commands, membership);
            if let Some(last) = applied.last() {
                revision = Some(last.revision);
            }
            replies.push(Reply { applied });
            self.shared.applied_tx.send_replace(log_id.index);
        }
        let space = &self.shared.space;
        if space.quota.is_some() && space.near_quota(self.shared.state.read().sm.kv_size_bytes()) {
            space.quota_wake.notify_one();
        }
        if let Some(rev) = revision {
            self.shared.revision_tx.send_if_modified(|r| {
                let changed = *r != rev;
                *r = rev;
                changed
            });
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapBuilder {
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    /// Replaces the state with a leader's snapshot (a follower too far behind for the log the
    /// leader kept). Known gap: watchers are not told about the jump.
    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        self.shared
            .installing_snapshot
            .store(true, Ordering::Relaxed);
        let res = self.install(meta, snapshot).await;
        self.shared
            .installing_snapshot
            .store(false, Ordering::Relaxed);
        res
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some((meta, path)) = self.shared.current_snapshot.lock().clone() else {
            return Ok(None);
        };
        let read_err = |msg: String| {
            StorageError::from(StorageIOError::read_snapshot(
                Some(meta.signature()),
                AnyError::error(msg),
            ))
        };
        // Nothing applied since the snapshot was taken or loaded: the state in memory is the
        // snapshot's, and encoding a copy of it (O(1) for the key store) spares reading the
        // file back and importing its key space a second time. (openraft 0.9 asks for it
        // at every start, for its meta, but only after re-applying the committed log tail,
        // so a start with a tail still reads the file.)
        let unchanged = {
            let st = self.shared.state.read();
            (st.last_applied == meta.last_log_id).then(|| st.sm.clone())
        };
        if let Some(sm) = unchanged {
            let body = tokio::task::spawn_blocking(move || sm.snapshot())
                .await
                .map_err(|e| read_err(format!("snapshot encoder panicked: {e}")))?;
            return Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(body)),
            }));
        }
        let accept_changed = self.shared.kv_changed_at_start.as_ref() == Some(&path);
        let loaded =
            tokio::task::spawn_blocking(move || snapshot::read_for_sending(&path, accept_changed))
                .await
                .map_err(|e| read_err(format!("snapshot reader panicked: {e}")))?
                .map_err(|e| read_err(e.to_string()))?
                .map_err(read_err)?;
        Ok(Some(Snapshot {
            meta: loaded.meta,
            snapshot: Box::new(Cursor::new(loaded.body)),
        }))
    }
}

impl StateStore {
    /// `install_snapshot`'s work (the caller marks the install in progress around it).
    async fn install(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let body = snapshot.into_inner();
        let mut sm = StateMachine::restore(&body)
            .map_err(|e| sm_err(format!("received snapshot does not restore: {e}")))?;
        if let Some(values) = &self.shared.values {
            sm.keep_values_in(values.clone());
        }
        let bytes = body.len();
        drop(body);
        // On a full disk the leader's snapshot is retried until it is written (the state
        // machine worker waits; the core and replication stay alive): installing it only in
        // memory would let openraft purge a log that no file on disk replaces. Written as
        // this member's `member/snap/db` (the payload stays Baton's own encoding).
        let mut backoff = INSTALL_RETRY_MIN;
        loop {
            let shared = self.shared.clone();
            let m = meta.clone();
            // O(1) for the key store (a persistent B-tree); the small tables are copied.
            let copy = sm.clone();
            let res = tokio::task::spawn_blocking(move || shared.persist_snapshot(&m, &copy))
                .await
                .map_err(|e| sm_err(format!("snapshot writer panicked: {e}")))?;
            match res {
                Ok(_) => break,
                Err(e) if space::is_enospc(&e) => {
                    self.shared.space.set_snapshot_blocked(true);
                    if self.shared.space.snapshot_log.allow() {
                        tracing::warn!(error = %e, bytes, "no room for the leader's snapshot; retrying until space is freed");
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(INSTALL_RETRY_MAX);
                }
                Err(e) => {
                    return Err(StorageError::from(StorageIOError::write_snapshot(
                        Some(meta.signature()),
                        AnyError::new(&e),
                    )))
                }
            }
        }
        self.shared.space.set_snapshot_blocked(false);
        let rev = {
            let mut st = self.shared.state.write();
            st.sm = sm;
            st.last_applied = meta.last_log_id;
            st.membership = meta.last_membership.clone();
            st.sm.revision()
        };
        self.shared.deletions.lock().fire_all();
        self.shared.revision_tx.send_replace(rev);
        self.shared
            .applied_tx
            .send_replace(meta.last_log_id.map_or(0, |l| l.index));
        tracing::info!(last_log_id = ?meta.last_log_id, revision = rev.0, "installed a snapshot from the leader");
        Ok(())
    }
}
