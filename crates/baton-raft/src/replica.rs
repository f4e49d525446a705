//! This member's replica as every component above it sees it ([`Replica`]): the Raft handle,
//! the applied state, the log, the proposer, the transfer gate and the replica's randomness,
//! with the questions they all ask of it — is it running, does it lead, has it applied
//! index `i` — and the leader's local proposal path.
//!
//! It holds handles, set once at start; the state that changes belongs to the components
//! that change it (`read_index`, `lease_duty`, `disk_watch`, `routing`'s forwarder, …), each
//! of which holds an `Arc<Replica>` and depends on nothing above it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use baton_core::Command;
use openraft::error::Fatal;
use openraft::metrics::WaitError;
use openraft::ServerState;
use tokio::time::Instant;

use crate::answer::{fatal_error, leader_error, ProposeError, Proposed};
use crate::config::{ElectionTiming, NodeConfig};
use crate::limits::REQUEST_TIMEOUT;
use crate::observe::Observed;
use crate::proposer::Proposer;
use crate::sm::Shared;
use crate::transfer_gate::TransferGate;
use crate::types::{Member, Raft};
use crate::wal::WalHandle;

pub(crate) struct Replica {
    pub(crate) config: NodeConfig,
    pub(crate) timing: ElectionTiming,
    pub(crate) member_id: u64,
    pub(crate) cluster_id: u64,
    pub(crate) raft: Raft,
    pub(crate) shared: Arc<Shared>,
    pub(crate) wal: WalHandle,
    pub(crate) proposer: Proposer,
    /// Closed while a leader transfer waits for the followers' leases to expire.
    pub(crate) transfer: TransferGate,
    /// Randomness of lease ids, added member ids and the election timer (seeded in a
    /// simulation). One generator for all, drawn in the order the replica needs them, so
    /// a seed replays.
    pub(crate) rng: parking_lot::Mutex<rand::rngs::StdRng>,
    /// Monitoring counters (see `observe`).
    pub(crate) observed: Observed,
    shutting_down: Arc<AtomicBool>,
}

/// The role this member plays now, per openraft's metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Role {
    pub(crate) state: ServerState,
    pub(crate) leader: Option<u64>,
    pub(crate) term: u64,
}

impl Replica {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        config: NodeConfig,
        timing: ElectionTiming,
        member_id: u64,
        cluster_id: u64,
        raft: Raft,
        shared: Arc<Shared>,
        wal: WalHandle,
        proposer: Proposer,
        rng: rand::rngs::StdRng,
        shutting_down: Arc<AtomicBool>,
    ) -> Replica {
        Replica {
            config,
            timing,
            member_id,
            cluster_id,
            raft,
            shared,
            wal,
            proposer,
            transfer: TransferGate::new(),
            rng: parking_lot::Mutex::new(rng),
            observed: Observed::default(),
            shutting_down,
        }
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Marks the replica as shutting down; `false` if it already was.
    pub(crate) fn begin_shutdown(&self) -> bool {
        !self.shutting_down.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn check_running(&self) -> Result<(), ProposeError> {
        if self.is_shutting_down() {
            return Err(ProposeError::ShuttingDown);
        }
        Ok(())
    }

    pub(crate) fn fatal_error(&self, f: &Fatal<u64>) -> ProposeError {
        fatal_error(f, self.is_shutting_down())
    }

    pub(crate) fn role(&self) -> Role {
        let m = self.raft.metrics();
        let m = m.borrow();
        Role {
            state: m.state,
            leader: m.current_leader,
            term: m.current_term,
        }
    }

    /// `NoLeader` or `NotLeader` naming the leader this member knows of (never itself).
    pub(crate) fn not_leader(&self, leader: Option<u64>) -> ProposeError {
        leader_error(leader.filter(|l| *l != self.member_id))
    }

    /// The current term if this member leads, else `NotLeader`/`NoLeader`.
    pub(crate) fn require_leader(&self) -> Result<u64, ProposeError> {
        self.check_running()?;
        let role = self.role();
        if role.state != ServerState::Leader {
            return Err(self.not_leader(role.leader));
        }
        Ok(role.term)
    }

    /// What the applied membership records for member `id`.
    pub(crate) fn membership_node(&self, id: u64) -> Option<Member> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config.membership().get_node(&id).cloned()
    }

    /// Whether `id` is a voter of the applied membership.
    pub(crate) fn is_voter(&self, id: u64) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        let voter = is_voter_of(m.membership_config.membership(), id);
        voter
    }

    /// The current leader, waiting for one to be known until `deadline` (`NoLeader` then).
    pub(crate) async fn wait_for_leader(&self, deadline: Instant) -> Result<u64, ProposeError> {
        if let Some(leader) = self.raft.metrics().borrow().current_leader {
            return Ok(leader);
        }
        // Boxed: the wait is rare and its state large; every proposal's future holds this
        // one's (see `Router::route`).
        Box::pin(self.wait_for_a_leader(deadline)).await
    }

    /// [`Replica::wait_for_leader`] when none is known yet.
    async fn wait_for_a_leader(&self, deadline: Instant) -> Result<u64, ProposeError> {
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

    /// Waits until openraft reports Raft index `index` applied here (`Timeout` after
    /// `deadline`): later than [`Replica::wait_applied`], but then openraft's metrics (the
    /// membership `Node::members` lists) show everything up to `index` too.
    pub(crate) async fn wait_applied_in_metrics(
        &self,
        index: u64,
        deadline: Instant,
    ) -> Result<(), ProposeError> {
        let applied =
            |m: &openraft::RaftMetrics<u64, Member>| m.last_applied.map_or(0, |l| l.index) >= index;
        if applied(&self.raft.metrics().borrow()) {
            return Ok(());
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        match self
            .raft
            .wait(Some(remaining))
            .metrics(applied, "applied index reported")
            .await
        {
            Ok(_) => Ok(()),
            Err(WaitError::Timeout(..)) => Err(ProposeError::Timeout),
            Err(WaitError::ShuttingDown) => Err(ProposeError::ShuttingDown),
        }
    }

    /// Waits until this replica has applied Raft index `index` (`Timeout` after `deadline`):
    /// its state, watch hub and deletion watches have it (`Shared::applied_tx`).
    pub(crate) async fn wait_applied(
        &self,
        index: u64,
        deadline: Instant,
    ) -> Result<(), ProposeError> {
        let mut applied = self.shared.applied_tx.subscribe();
        if *applied.borrow_and_update() >= index {
            return Ok(());
        }
        // Boxed: the wait's state is large and rare; reads and proposals await this.
        Box::pin(self.wait_applied_from(applied, index, deadline)).await
    }

    /// [`Replica::wait_applied`] once `applied` (a fresh receiver) is below `index`.
    async fn wait_applied_from(
        &self,
        mut applied: tokio::sync::watch::Receiver<u64>,
        index: u64,
        deadline: Instant,
    ) -> Result<(), ProposeError> {
        // openraft's wait, only for its end: the deadline, or this member shutting down
        // (the state machine, and so the sender, outlive the Raft core).
        let remaining = deadline.saturating_duration_since(Instant::now());
        let wait = self.raft.wait(Some(remaining));
        let ended = wait.metrics(|_| false, "the deadline or shutdown");
        let reached = async { applied.wait_for(|&i| i >= index).await.is_ok() };
        tokio::select! {
            reached = reached => {
                if reached {
                    Ok(())
                } else {
                    Err(ProposeError::ShuttingDown)
                }
            }
            ended = ended => match ended {
                Err(WaitError::ShuttingDown) => Err(ProposeError::ShuttingDown),
                _ => Err(ProposeError::Timeout),
            },
        }
    }

    /// Refuses a command that adds data while this member's space is low, its state is over
    /// the quota (or would be with this command, as etcd judges `size + cost`) or a `NOSPACE`
    /// alarm is applied, before it costs a log entry: the
    /// apply-time refusal (`StateMachine::apply`) only covers what was proposed before the
    /// alarm, and a log that cannot grow could not take the entry anyway.
    pub(crate) fn refuse_without_space(&self, command: &Command) -> Result<(), ProposeError> {
        if command.adds_data() {
            let space = &self.shared.space;
            let refused = space.is_low() || {
                let st = self.shared.state.read();
                st.sm.no_space()
                    || space.over_quota_at(st.sm.compact_revision().0)
                    || space.would_exceed(st.sm.kv_size_bytes(), command.quota_cost_bytes())
            };
            if refused {
                return Err(ProposeError::NoSpace);
            }
        }
        Ok(())
    }

    /// Proposes through this replica's own proposer (it must be the leader). The internal
    /// entry point: the leader's duties call it with their own commands, and the peer
    /// service only after checking a forwarded command's origin (`peer_server`).
    pub(crate) async fn propose(&self, command: Command) -> Result<Proposed, ProposeError> {
        self.check_running()?;
        self.refuse_without_space(&command)?;
        self.transfer.wait(Instant::now() + REQUEST_TIMEOUT).await;
        self.proposer.propose(command).await
    }

    /// [`Replica::propose`] for several commands at once (in one Raft entry unless the
    /// proposer's batch limits cut between them); one result each, in order. A follower's
    /// forwarded batch comes here: the follower checked its own space before forwarding, and
    /// the leader's `NOSPACE` alarm refuses them when they are applied.
    pub(crate) async fn propose_many(
        &self,
        commands: Vec<Command>,
    ) -> Vec<Result<Proposed, ProposeError>> {
        if let Err(e) = self.check_running() {
            return commands.iter().map(|_| Err(e.clone())).collect();
        }
        self.transfer.wait(Instant::now() + REQUEST_TIMEOUT).await;
        self.proposer.propose_many(commands).await
    }
}

/// Whether `id` votes in `membership` (in either half of a joint configuration). Reads the
/// configuration's sets in place: openraft's `voter_ids` collects them into a new set first,
/// which on the learner check of every client call was an allocation per call.
pub(crate) fn is_voter_of(membership: &openraft::Membership<u64, Member>, id: u64) -> bool {
    membership
        .get_joint_config()
        .iter()
        .any(|config| config.contains(&id))
}
