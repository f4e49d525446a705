//! [`Node`]: one replica, as the server sees it. Its methods are the crate's API; each hands
//! the work to the component whose job it is (`routing`, `read_index`, `lease_duty`,
//! `membership`, `transfer`, …) and [`Node::start`] (in `start`) assembles them.

use std::fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use baton_core::{Command, LeaseId, Revision, StateMachine, WatchHub};
use openraft::ServerState;
use tokio::time::Instant;

use crate::answer::{KeepAlive, ProposeError, Proposed};
use crate::deletions::KeyDeletion;
use crate::disk_watch::DiskWatch;
use crate::fencing_duty::FencingKeyDuty;
use crate::lease_duty::{self, LeaseDuty};
use crate::limits::REQUEST_TIMEOUT;
use crate::membership::change::{MemberChange, MemberChanged, MemberError, MemberInfo};
use crate::membership::Members;
use crate::observe::ReplicaMetrics;
use crate::origin;
use crate::peer_server::Handlers;
use crate::read_index::ReadIndex;
use crate::replica::Replica;
use crate::routing::{LocalApply, Router};
use crate::status::{NodeStatus, WalWritePaths};
use crate::transfer::{self, TransferError};

/// One replica. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct Node {
    pub(crate) parts: Arc<Parts>,
}

/// The replica's components, each owning its own state (see ARCHITECTURE.md, baton-raft).
/// The background tasks hold weak references to them, so a replica dropped without
/// `shutdown` does not live on through its own tasks.
pub(crate) struct Parts {
    pub(crate) replica: Arc<Replica>,
    pub(crate) router: Arc<Router>,
    pub(crate) reads: Arc<ReadIndex>,
    pub(crate) leases: Arc<LeaseDuty>,
    pub(crate) members: Arc<Members>,
    pub(crate) disk: Arc<DiskWatch>,
    pub(crate) fencing: Arc<FencingKeyDuty>,
    /// What the peer service serves (it holds a weak reference).
    pub(crate) handlers: Arc<Handlers>,
    pub(crate) tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Holds the data directory's advisory lock until `shutdown` has stopped every writer
    /// (or the replica is dropped), so a restarted replica in the same process can take it.
    pub(crate) dir_lock: parking_lot::Mutex<Option<fs::File>>,
}

impl Node {
    /// Stamps the command with the leader's time, replicates it, waits until it is durable
    /// (fsynced) and applied, and returns what applying it produced.
    ///
    /// On a follower the command is forwarded to the leader, and the call returns once this
    /// member has applied it too (a client reads its own write on the member it wrote
    /// through, and this member's watchers have seen it).
    ///
    /// Only commands a client may cause are accepted ([`Origin::Client`](crate::Origin::Client)); the leader's own
    /// duties (lease expiry, checkpoints) propose through the crate's internal entry point,
    /// and asking for one here is refused with [`ProposeError::LeaderOnly`].
    pub async fn propose(&self, command: Command) -> Result<Proposed, ProposeError> {
        self.client_propose(command, LocalApply::Wait).await
    }

    /// [`Node::propose`] for a client's write whose answer is everything the client gets
    /// from it (a put, a delete, a transaction): on a follower it returns as soon as the
    /// leader's answer is here (the leader applied the write), without waiting for this
    /// member's own apply of it, which it owes instead — every client request this member
    /// serves from then on first waits for it ([`Node::caught_up`]). The client's next
    /// request here sees its write, as after [`Node::propose`]; the answer does not wait the
    /// commit notice's trip through this member's Raft core and apply (measured, 3 members,
    /// put with 1 client through a follower, two sets of alternating runs: 3.95k → 4.37k
    /// and 3.58k → 4.45k ops/s, p50 0.214 → 0.190 and 0.237 → 0.188 ms).
    /// A caller that reads this member's state itself after proposing (the lock engine)
    /// uses [`Node::propose`].
    pub async fn propose_owing_apply(&self, command: Command) -> Result<Proposed, ProposeError> {
        self.client_propose(command, LocalApply::Owe).await
    }

    /// A client's proposal, checked and counted (`etcd_server_proposals_*`).
    async fn client_propose(
        &self,
        command: Command,
        local: LocalApply,
    ) -> Result<Proposed, ProposeError> {
        origin::client_may_propose(&command).map_err(ProposeError::LeaderOnly)?;
        let observed = &self.parts.replica.observed;
        let _pending = observed.proposal();
        let res = self.parts.router.propose_then(command, local).await;
        if let Err(e) = &res {
            observed.proposal_failed(e);
        }
        res
    }

    /// Whether this member still owes the apply of a write it has answered
    /// ([`Node::caught_up`] would wait).
    pub fn owes_apply(&self) -> bool {
        self.parts.replica.shared.apply_owed().is_some()
    }

    /// Waits until this member has applied every write it has answered
    /// ([`Node::propose_owing_apply`]); at once when it owes none, the usual case. Every
    /// client request (and every watch created on a running stream) waits here before it is
    /// served. `Timeout` if the apply does not come within the request timeout: nothing is
    /// then served from a state that lacks a write already answered.
    pub async fn caught_up(&self) -> Result<(), ProposeError> {
        let replica = &self.parts.replica;
        let Some(owed) = replica.shared.apply_owed() else {
            return Ok(());
        };
        cached_counter!("baton_owed_apply_waits_total").increment(1);
        replica
            .wait_applied(owed, Instant::now() + REQUEST_TIMEOUT)
            .await
    }

    /// Returns once this replica has applied everything committed before the call and the
    /// leader has confirmed its leadership with a quorum (ReadIndex): reads after it are
    /// linearizable. On a follower the leader is asked for the read index over the peer
    /// service; the wait for it to be applied is local.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        let parts = &self.parts;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        parts.replica.transfer.wait(deadline).await;
        let res = match parts.reads.shared().await {
            Ok(index) => parts.replica.wait_applied(index, deadline).await,
            Err(e) => Err(e),
        };
        if let Err(e) = &res {
            parts.replica.observed.read_index_failed(e);
        }
        res
    }

    /// The `member/snap/db` this member started from although its `key` bucket failed its
    /// checksum (accepted only with `NodeConfig::snapshot_kv_checked_by_peers`): the caller's
    /// initial corruption check is what decides whether serving it is sound.
    pub fn snapshot_kv_changed(&self) -> Option<&std::path::Path> {
        self.parts.replica.shared.kv_changed_at_start.as_deref()
    }

    /// Lets a member that started from a changed `key` bucket
    /// ([`Node::snapshot_kv_changed`]) write snapshots again, once the initial corruption
    /// check found no member with a different key space. Until then it writes none, so
    /// the changed key space does not get a fresh, valid checksum unchecked.
    pub fn release_snapshots(&self) {
        self.parts
            .replica
            .shared
            .snapshots_held
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Runs `f` on the applied state (a read lock; keep `f` short).
    pub fn read<R>(&self, f: impl FnOnce(&StateMachine) -> R) -> R {
        f(&self.parts.replica.shared.state.read().sm)
    }

    /// A frozen copy of the applied state and the Raft log index it reflects (etcd's
    /// consistent index), taken under one read lock: O(1) for the key store (a persistent
    /// B-tree whose nodes stay shared until the next write to each), a copy of the small
    /// tables. A backup is written from it without holding any lock.
    pub fn frozen_state(&self) -> (StateMachine, u64) {
        let st = self.parts.replica.shared.state.read();
        (st.sm.clone(), st.last_applied.map_or(0, |l| l.index))
    }

    /// Runs `f` on the watch hub together with the applied state; no entry is applied while
    /// `f` runs, so a watcher registered here sees every later event exactly once.
    pub fn with_watch_hub<R>(&self, f: impl FnOnce(&mut WatchHub, &StateMachine) -> R) -> R {
        let shared = &self.parts.replica.shared;
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
        let shared = &self.parts.replica.shared;
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
        self.parts.replica.shared.deletions.lock().len()
    }

    /// Fires whenever an entry that changed the store is applied (the value is the store
    /// revision). Watch streams wait on it.
    pub fn subscribe_revision(&self) -> tokio::sync::watch::Receiver<Revision> {
        self.parts.replica.shared.revision_tx.subscribe()
    }

    /// Renews a lease on the leader's lease clock (not replicated, as etcd), forwarding to the
    /// leader when this member is a follower.
    pub async fn renew_lease(&self, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        self.parts.leases.renew(id).await
    }

    /// Remaining TTL of a lease in seconds on the leader's lease clock (see
    /// [`Node::lease_remaining_s`]), forwarding to the leader when this member is a follower
    /// (a follower's own estimate knows nothing of keep-alives).
    pub async fn lease_time_to_live(&self, id: LeaseId) -> Result<Option<i64>, ProposeError> {
        self.parts.leases.time_to_live(id).await
    }

    /// Renews a lease on this replica's lease clock; fails with `NotLeader` on a follower
    /// (use [`Node::renew_lease`] to reach the leader from anywhere). Unlike `renew_lease`, it
    /// does not confirm leadership with a quorum first (tests and tools only).
    pub fn lease_keep_alive(&self, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        self.parts.leases.keep_alive_local(id)
    }

    /// Remaining TTL of a lease in seconds per the leader's lease clock (rounded as etcd does),
    /// `None` if unknown.
    pub fn lease_remaining_s(&self, id: LeaseId) -> Option<i64> {
        lease_duty::remaining_s(&self.parts.replica.shared, id)
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
        self.parts.leases.alive(id)
    }

    /// The last check before a lock grant to `lease`: the leader confirms its leadership with
    /// a quorum (ReadIndex) and then judges the lease on its lease clock — the only clock
    /// that sees keep-alives — and this replica waits until it has applied everything the
    /// leader had committed. `Ok(false)`: the lease is gone or past its deadline. On a
    /// follower the leader's lease verdict, when it stands, is that answer without a call
    /// (`lease_verdict`).
    ///
    /// Why not [`Node::lease_alive`]: on a follower it knows only that the lease exists
    /// (deadlines live on the leader), and on a deposed leader that has not noticed yet its
    /// clock may still see keep-alives that the real leader never got; either could grant a
    /// lock to a holder the cluster already expired.
    pub async fn confirm_grant(&self, lease: LeaseId) -> Result<bool, ProposeError> {
        self.parts.leases.confirm_grant(lease).await
    }

    /// Leader time now, on the scale of `Entry::time_ms` (wall-clock milliseconds, never
    /// below the last applied stamp): what the next entry proposed here would at least be
    /// stamped with. Deadlines the core records (lock-delay) are compared against it.
    pub fn time_ms(&self) -> u64 {
        let replica = &self.parts.replica;
        let last = replica.shared.state.read().sm.last_time_ms();
        replica.config.env.wall_ms().max(last)
    }

    /// A fresh random positive lease id that is not in use (randomness lives here, not in the
    /// core).
    pub fn new_lease_id(&self) -> LeaseId {
        self.parts.leases.new_lease_id()
    }

    /// `n` bytes from the replica's randomness (seeded under simulation, else the OS's):
    /// the random part of simple auth tokens, which must not be guessable.
    pub fn random_bytes(&self, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        rand::RngCore::fill_bytes(&mut *self.parts.replica.rng.lock(), &mut out);
        out
    }

    /// Rotates the fencing-token signing key: the leader makes a new key pair and
    /// replicates it; grants are signed with it from then on, and the old public key stays
    /// listed (tokens it signed may still be held). Served only by the leader
    /// ([`ProposeError::NotLeader`] elsewhere, naming it). Who may ask is the server's rule.
    pub async fn rotate_fencing_key(&self) -> Result<baton_core::FencingKeyId, ProposeError> {
        self.parts.fencing.rotate().await
    }

    /// Raises etcd's `CORRUPT` alarm for `member_id`: the leader's periodic corruption
    /// check found that member's key space different from its own at the same revision.
    /// Proposed only here, on the leader (a leader duty, see `origin`: no client or peer
    /// raises it); on another member the proposer answers [`ProposeError::NotLeader`].
    pub async fn raise_corrupt_alarm(&self, member_id: u64) -> Result<Proposed, ProposeError> {
        self.parts
            .replica
            .propose(Command::Alarm {
                action: baton_core::AlarmAction::Activate,
                member_id,
                alarm: baton_core::AlarmType::Corrupt,
            })
            .await
    }

    /// The index of the last entry applied here: the state machine's own count
    /// (`Shared::applied_tx`), which a read or a forwarded write has waited for, or
    /// openraft's metrics' if those are ahead. The metrics alone lag the state machine by
    /// two task hops, so a status taken right after a forwarded write could report an index
    /// below that write's, although its effect was already readable.
    fn applied_index(&self, in_metrics: u64) -> u64 {
        in_metrics.max(*self.parts.replica.shared.applied_tx.borrow())
    }

    pub fn status(&self) -> NodeStatus {
        let replica = &self.parts.replica;
        let m = replica.raft.metrics();
        let m = m.borrow();
        NodeStatus {
            cluster_id: replica.cluster_id,
            member_id: replica.member_id,
            leader_id: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index: self.applied_index(m.last_applied.map_or(0, |l| l.index)),
            disk_bytes: replica.wal.stats.file_bytes.load(Ordering::Relaxed)
                + replica.shared.snapshot_bytes.load(Ordering::Relaxed),
        }
    }

    /// This replica's monitoring figures now (see [`ReplicaMetrics`] for what each means).
    /// Asks openraft's core about the follower's leader (one message; for scrapes, not for
    /// the request path).
    pub async fn metrics(&self) -> ReplicaMetrics {
        let replica = &self.parts.replica;
        let shared = &replica.shared;
        let (state, leader, quorum_ack_ms, applied_index) = {
            let m = replica.raft.metrics();
            let m = m.borrow();
            (
                m.state,
                m.current_leader,
                m.millis_since_quorum_ack,
                self.applied_index(m.last_applied.map_or(0, |l| l.index)),
            )
        };
        let timeout = replica.config.election_timeout;
        let is_leader = state == ServerState::Leader;
        let has_leader = if is_leader {
            quorum_ack_ms.is_some_and(|ms| u128::from(ms) < timeout.as_millis())
        } else {
            // A follower that heard from its leader within the election timeout; openraft
            // refreshes the vote with every message from the leader. A core too busy to
            // answer within that time has not heard from it either, as far as anyone knows.
            let heard = replica.raft.with_raft_state(move |st| {
                st.vote_ref().is_committed()
                    && st
                        .vote_last_modified()
                        .is_some_and(|at| at.elapsed() < timeout)
            });
            leader.is_some() && matches!(tokio::time::timeout(timeout, heard).await, Ok(Ok(true)))
        };
        let status = self.status();
        let space = &shared.space;
        let headroom = space
            .last_free()
            .map_or(0, |free| free.saturating_sub(space.reserve));
        let mut m = ReplicaMetrics {
            has_leader,
            is_leader,
            is_learner: self.is_learner(),
            member_id: replica.member_id,
            leader_changes: 0,
            committed_index: replica.wal.committed_index().max(applied_index),
            applied_index,
            proposals_pending: 0,
            proposals_failed: 0,
            read_indexes_failed: 0,
            slow_read_indexes: 0,
            leases_renewed: 0,
            leases_expired: 0,
            snapshot_installing: shared.installing_snapshot.load(Ordering::Relaxed),
            wal_write_bytes: replica.wal.stats.written_bytes.load(Ordering::Relaxed),
            disk_bytes: status.disk_bytes,
            quota_bytes: space.quota.unwrap_or(status.disk_bytes + headroom),
            apply: shared.state.read().tally,
        };
        replica.observed.fill(&mut m);
        m
    }

    /// Every member of the current membership. This member is shown as configured now; the
    /// others as they last published themselves (name and client URLs are empty until a
    /// member has run and published them, as etcd shows "unstarted" members).
    ///
    /// A member of a new cluster that the initializer has not reached yet has no membership
    /// entry: it lists the members `--initial-cluster` names, as the initializer writes them
    /// into that entry. etcd lists its bootstrap members from the start too, and a client
    /// asking right after the start would otherwise see a cluster of no members.
    pub fn members(&self) -> Vec<MemberInfo> {
        let replica = &self.parts.replica;
        let membership = replica.raft.metrics().borrow().membership_config.clone();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let mut listed: Vec<(u64, crate::types::Member)> = membership
            .nodes()
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        // Every bootstrap member is a voter (etcd's `--initial-cluster` has no learners).
        let bootstrapping = listed.is_empty();
        if bootstrapping {
            listed = bootstrap_members(&replica.config);
        }
        listed
            .into_iter()
            .map(|(id, node)| {
                let (name, peer_urls, client_urls) = if id == replica.member_id {
                    let c = &replica.config;
                    (c.name.clone(), c.peer_urls.clone(), c.client_urls.clone())
                } else {
                    (node.name, node.peer_urls, node.client_urls)
                };
                MemberInfo {
                    id,
                    name,
                    peer_urls,
                    client_urls,
                    is_learner: !bootstrapping && !voters.contains(&id),
                }
            })
            .collect()
    }

    /// etcd's `MemberAdd`: adds a member with `peer_urls` (a learner if `is_learner`) under a
    /// fresh id. The member then starts with `--initial-cluster-state existing` and an empty
    /// data directory. Made by the leader (forwarded from a follower).
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<MemberChanged, MemberError> {
        let change = MemberChange::Add {
            peer_urls,
            is_learner,
        };
        self.parts.members.change(change).await
    }

    /// etcd's `MemberRemove`. Removing the leader works: it steps down once the configuration
    /// without it is committed, and the others elect a new leader.
    pub async fn member_remove(&self, id: u64) -> Result<MemberChanged, MemberError> {
        self.parts.members.change(MemberChange::Remove { id }).await
    }

    /// etcd's `MemberUpdate`: new peer URLs for a member (name and client URLs are kept).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<MemberChanged, MemberError> {
        let change = MemberChange::Update { id, peer_urls };
        self.parts.members.change(change).await
    }

    /// etcd's `MemberPromote`: makes a learner that has caught up a voter.
    pub async fn member_promote(&self, id: u64) -> Result<MemberChanged, MemberError> {
        self.parts
            .members
            .change(MemberChange::Promote { id })
            .await
    }

    /// Whether this member is a learner (receives the log, does not vote).
    pub fn is_learner(&self) -> bool {
        self.parts.members.is_learner()
    }

    /// Resolves once this member knows it was removed from the cluster (it applied a
    /// configuration without it, or the leader refused it as a non-member). The replica
    /// takes no further part in elections; the embedder should stop serving, as etcd does.
    pub async fn removed(&self) {
        let mut rx = self.parts.router.peers().removed();
        // An error means the sender is gone (the replica was dropped): never removed then.
        if rx.wait_for(|removed| *removed).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// How many of openraft's AppendEntries this member, leading, answered from a follower's
    /// answer to the early AppendEntries of the same entries instead of sending them again
    /// (`early_acks`; also `baton_raft_appends_answered_early_total`).
    pub fn appends_answered_early(&self) -> u64 {
        self.parts.router.peers().early_acks.stood_in_total()
    }

    /// How many lock grants on this member, a follower, stood on the leader's lease verdict
    /// instead of a grant check (`lease_verdict`; also `baton_lock_grant_checks_total`
    /// `{confirmed_by="verdict"}`).
    pub fn grants_on_lease_verdicts(&self) -> u64 {
        self.parts.router.peers().verdicts.used_total()
    }

    /// etcd's `MoveLeader`: hands leadership to `target`, a voter, once it has caught up.
    /// Only the leader can do this ([`TransferError::NotLeader`] elsewhere); moving to the
    /// leader itself succeeds at once.
    pub async fn move_leader(&self, target: u64) -> Result<(), TransferError> {
        transfer::move_leader(&self.parts.router, target).await
    }

    /// etcd's `Defragment`, Baton's way: etcd rewrites its database file so the pages a
    /// compaction freed leave the file; Baton's store is in memory (a compaction frees it at
    /// once), and what takes room on disk is the log and the snapshot. So this member writes
    /// a snapshot of its state as applied now — compacted history gone from it — and
    /// openraft purges the log it covers, and the data directory shrinks as etcd's file
    /// does. Local to this member, as etcd's. `NoSpace` when the snapshot does not fit;
    /// `Timeout` when none covering this moment was written within the deadline.
    pub async fn defragment(&self) -> Result<(), ProposeError> {
        const DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);
        let replica = &self.parts.replica;
        replica.check_running()?;
        let covered = |m: &openraft::RaftMetrics<u64, crate::types::Member>, target: u64| {
            m.snapshot.is_some_and(|s| s.index >= target)
        };
        let Some(target) = replica
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map(|l| l.index)
        else {
            return Ok(());
        };
        let deadline = Instant::now() + DEADLINE;
        loop {
            if covered(&replica.raft.metrics().borrow(), target) {
                return Ok(());
            }
            if !replica.shared.snapshot_fits() {
                return Err(ProposeError::NoSpace);
            }
            // Ignored while a snapshot is being built: then wait for it and ask again.
            if let Err(e) = replica.raft.trigger().snapshot().await {
                tracing::debug!(error = %e, "defragment: snapshot not started");
            }
            let _ = replica
                .raft
                .wait(Some(std::time::Duration::from_secs(1)))
                .metrics(|m| covered(m, target), "snapshot covers the applied index")
                .await;
            if Instant::now() >= deadline {
                return Err(ProposeError::Timeout);
            }
        }
    }

    /// Stops Raft and the background tasks; everything acknowledged is already on disk.
    pub async fn shutdown(&self) {
        let parts = &self.parts;
        let replica = &parts.replica;
        if !replica.begin_shutdown() {
            return;
        }
        for task in parts.tasks.lock().drain(..) {
            task.abort();
        }
        if let Err(e) = replica.raft.shutdown().await {
            tracing::warn!(error = %e, "raft core ended abnormally");
        }
        replica.wal.stop().await;
        replica.shared.close_snapshots();
        // Nothing writes to the directory any more.
        parts.dir_lock.lock().take();
    }

    /// Whether this member's disk watch judges its space low (writes that add data are
    /// refused here; see `space`).
    pub fn disk_space_low(&self) -> bool {
        self.parts.replica.shared.space.is_low()
    }

    /// Number of fsyncs the Raft log has issued since start. For tests (group commit) and
    /// diagnostics; the same count is exported as `baton_wal_fsyncs_total`.
    pub fn wal_fsync_count(&self) -> u64 {
        self.parts.replica.wal.stats.fsyncs.load(Ordering::Relaxed)
    }

    /// Which way the Raft log's writes went since start: inline or through the batch loop.
    /// For tests (the simulation shows it runs both) and diagnostics.
    pub fn wal_write_paths(&self) -> WalWritePaths {
        let s = &self.parts.replica.wal.stats;
        WalWritePaths {
            inline_ops: s.inline_ops.load(Ordering::Relaxed),
            loop_batches: s.loop_batches.load(Ordering::Relaxed),
            loop_ops: s.loop_ops.load(Ordering::Relaxed),
        }
    }
}

/// The members a new cluster starts with (`--initial-cluster`, state `new`), as the
/// initializer writes them into the first membership entry. Empty for a single-member
/// replica and for a member joining an existing cluster: those learn the membership from
/// the cluster.
fn bootstrap_members(config: &crate::NodeConfig) -> Vec<(u64, crate::types::Member)> {
    let Some(cluster) = config.cluster.as_ref() else {
        return Vec::new();
    };
    if cluster.state != crate::InitialClusterState::New {
        return Vec::new();
    }
    // Derived (and checked) alike at start; a configuration that failed there never ran.
    let Ok(ids) = crate::cluster::derive_ids(cluster, &config.name, &config.peer_urls) else {
        return Vec::new();
    };
    let me = ids.id_of(&config.name).unwrap_or_default();
    let own = crate::types::Member {
        name: config.name.clone(),
        peer_urls: config.peer_urls.clone(),
        client_urls: config.client_urls.clone(),
    };
    ids.initial_membership(me, &own)
}
