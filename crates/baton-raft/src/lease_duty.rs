//! The leader's lease duties ([`LeaseDuty`]): keep-alives, time-to-live and the grant check
//! on the leader's lease clock (routed there from a follower), rebuilding the clock when this
//! member becomes leader, and each tick's expiry and checkpoints. The clock itself is
//! `lease::LeaseClock`, kept with the applied state (`sm::Shared`) because applying an entry
//! updates it.

use std::sync::Arc;

use baton_core::{Command, LeaseId, Response, Term};
use openraft::ServerState;
use tokio::time::Instant;

use crate::answer::{KeepAlive, ProposeError};
use crate::calls::{GrantCheck, GrantCheckCall, KeepAliveCall, TimeToLiveCall};
use crate::limits::{
    MAX_CHECKPOINTS_PER_ENTRY, MAX_EXPIRE_ENTRIES_PER_TICK, MAX_EXPIRE_IDS_PER_ENTRY,
    REQUEST_TIMEOUT,
};
use crate::read_index::ReadIndex;
use crate::replica::Replica;
use crate::routing::{Routed, Router};
use crate::sm::Shared;

pub(crate) struct LeaseDuty {
    replica: Arc<Replica>,
    router: Arc<Router>,
    reads: Arc<ReadIndex>,
}

impl LeaseDuty {
    pub(crate) fn new(replica: Arc<Replica>, router: Arc<Router>, reads: Arc<ReadIndex>) -> Self {
        LeaseDuty {
            replica,
            router,
            reads,
        }
    }

    /// Renews a lease on the leader's lease clock, wherever the leader is.
    pub(crate) async fn renew(&self, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self.router.route(KeepAliveCall(id), deadline).await? {
            Routed::Local(KeepAliveCall(id)) => self.keep_alive_confirmed(id).await,
            Routed::Remote(answer) => Ok(answer),
        }
    }

    /// Remaining TTL of a lease on the leader's lease clock, wherever the leader is.
    pub(crate) async fn time_to_live(&self, id: LeaseId) -> Result<Option<i64>, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self.router.route(TimeToLiveCall(id), deadline).await? {
            Routed::Local(TimeToLiveCall(id)) => self.time_to_live_local(id),
            Routed::Remote(ttl) => Ok(ttl),
        }
    }

    /// The last check before a lock grant (see `Node::confirm_grant`): the leader's verdict,
    /// once this replica has applied everything the leader had committed — on a follower the
    /// verdict the leader sent ahead on its last AppendEntries if it stands
    /// (`lease_verdict`), else asked for.
    pub(crate) async fn confirm_grant(&self, lease: LeaseId) -> Result<bool, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        if let Some(index) = self.standing_verdict() {
            self.replica.wait_applied(index, deadline).await?;
            self.router.peers().verdicts.used();
            return Ok(self.replica.shared.state.read().sm.lease_exists(lease));
        }
        let check = match self.router.route(GrantCheckCall(lease), deadline).await? {
            Routed::Local(GrantCheckCall(lease)) => self.grant_check_local(lease).await?,
            Routed::Remote(check) => check,
        };
        self.replica
            .wait_applied(check.read_index, deadline)
            .await?;
        Ok(check.lease_alive)
    }

    /// On a follower: the committed index to wait for, if the leader's last lease verdict
    /// stands for a grant now (`lease_verdict`), instead of asking the leader.
    fn standing_verdict(&self) -> Option<u64> {
        let role = self.replica.role();
        if role.state == ServerState::Leader {
            // The leader's own check costs no round trip.
            return None;
        }
        let applied = self
            .replica
            .shared
            .state
            .read()
            .last_applied
            .map_or(0, |l| l.index);
        self.router.peers().verdicts.standing(
            role.leader,
            role.term,
            applied,
            self.replica.config.heartbeat_interval,
        )
    }

    /// The leader's half of a keep-alive: renews on this replica's lease clock.
    pub(crate) fn keep_alive_local(&self, id: LeaseId) -> Result<KeepAlive, ProposeError> {
        let term = self.replica.require_leader()?;
        let now = Instant::now();
        let shared = &self.replica.shared;
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
        self.replica.observed.lease_renewed();
        Ok(KeepAlive::Renewed {
            ttl_s: renewal.granted_ttl_s,
        })
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
    pub(crate) async fn keep_alive_confirmed(
        &self,
        id: LeaseId,
    ) -> Result<KeepAlive, ProposeError> {
        self.reads.ensure_leadership().await?;
        let term = self.replica.role().term;
        let answer = self.keep_alive_local(id)?;
        let now = self.replica.role();
        if now.state != ServerState::Leader || now.term != term {
            return Err(self.replica.not_leader(now.leader));
        }
        Ok(answer)
    }

    /// The leader's half of TimeToLive.
    pub(crate) fn time_to_live_local(&self, id: LeaseId) -> Result<Option<i64>, ProposeError> {
        self.replica.require_leader()?;
        Ok(remaining_s(&self.replica.shared, id))
    }

    /// The leader's half of the grant check: leadership first, then the lease clock (a lease
    /// judged alive by a leader that has just confirmed it still leads).
    pub(crate) async fn grant_check_local(
        &self,
        lease: LeaseId,
    ) -> Result<GrantCheck, ProposeError> {
        // Leadership confirmed within the last heartbeat interval (the lease keep-alives rely
        // on), else by a round that started after this check arrived, shared by concurrent
        // checks (a follower's batch, many locks): see `ReadIndex::leased_local`.
        let read_index = self.reads.leased_local().await?;
        let shared = &self.replica.shared;
        let exists = shared.state.read().sm.lease_exists(lease);
        let lease_alive = exists
            && shared
                .leases
                .lock()
                .alive(lease, Instant::now())
                .unwrap_or(true);
        Ok(GrantCheck {
            read_index,
            lease_alive,
        })
    }

    /// Whether a lease is alive by what this replica knows (see `Node::lease_alive`).
    pub(crate) fn alive(&self, id: LeaseId) -> bool {
        let shared = &self.replica.shared;
        let term = self.replica.role().term;
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

    /// A fresh random positive lease id that is not in use (randomness lives here, not in the
    /// core).
    pub(crate) fn new_lease_id(&self) -> LeaseId {
        let shared = &self.replica.shared;
        loop {
            let id = LeaseId(rand::Rng::gen::<i64>(&mut *self.replica.rng.lock()) & i64::MAX);
            if id.is_none() {
                continue;
            }
            let st = shared.state.read();
            if st.sm.lease(id).is_none() && !shared.leases.lock().contains(id) {
                return id;
            }
        }
    }

    /// Writes a full-TTL checkpoint for a renewed lease whose replicated checkpoint is stale
    /// (see `lease::Tracked::checkpointed`). Fire and forget: a keep-alive must not wait on
    /// the log; on failure the next renewal retries.
    fn reset_checkpoint(&self, id: LeaseId, granted_ttl_s: i64) {
        let replica = self.replica.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            replica.shared.leases.lock().checkpoint_reset_failed(id);
            return;
        };
        rt.spawn(async move {
            let checkpoints = vec![(id, granted_ttl_s.saturating_mul(1000))];
            if replica
                .propose(Command::LeaseCheckpoint { checkpoints })
                .await
                .is_err()
            {
                replica.shared.leases.lock().checkpoint_reset_failed(id);
            }
        });
    }

    /// Called when this replica leads `term`: waits until everything committed before is
    /// applied (so the state machine lists every live lease), then rebuilds the lease clock.
    pub(crate) async fn become_ready(&self, term: u64) {
        let replica = &self.replica;
        match tokio::time::timeout(REQUEST_TIMEOUT, replica.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, term, "leadership not confirmed; lease clock not rebuilt");
                return;
            }
            Err(_) => return,
        }
        let role = replica.role();
        if role.state != ServerState::Leader || role.term != term {
            return;
        }
        let st = replica.shared.state.read();
        let mut clock = replica.shared.leases.lock();
        clock.rebuild(
            &st.sm,
            Instant::now(),
            replica.config.election_timeout,
            term,
        );
        tracing::info!(
            term,
            leases = st.sm.lease_ids().len(),
            "leader lease clock ready"
        );
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.replica.is_shutting_down()
    }

    /// Extends every deadline by `by`: the duties stalled for that long, and neither expiry
    /// nor the keep-alives that would have renewed ran meanwhile.
    pub(crate) fn extend_all(&self, by: std::time::Duration) {
        self.replica.shared.leases.lock().extend_all(by);
    }

    /// One tick of the leader's lease duties: expire what is due, checkpoint long leases
    /// every `lease_checkpoint_interval` (since `last_checkpoint`, which it moves).
    pub(crate) async fn tick(&self, last_checkpoint: &mut Instant) {
        let replica = &self.replica;
        let shared = &replica.shared;
        let role = replica.role();
        if role.state != ServerState::Leader {
            shared.leases.lock().step_down();
            return;
        }
        let term = role.term;
        if shared.leases.lock().ready_term() != Some(term) {
            self.become_ready(term).await;
            *last_checkpoint = Instant::now();
            return;
        }
        for _ in 0..MAX_EXPIRE_ENTRIES_PER_TICK {
            let ids = shared
                .leases
                .lock()
                .take_expired(Instant::now(), MAX_EXPIRE_IDS_PER_ENTRY);
            if ids.is_empty() {
                break;
            }
            let n = ids.len() as u64;
            let res = replica
                .propose(Command::ExpireLeasesInTerm {
                    term: Term(term),
                    ids: ids.clone(),
                })
                .await;
            shared.leases.lock().finish_expiring(&ids);
            match res {
                Ok(p) => {
                    metrics::counter!("baton_leases_expired_total").increment(n);
                    replica.observed.leases_expired(n);
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
        let interval = replica.config.lease_checkpoint_interval;
        if last_checkpoint.elapsed() >= interval {
            *last_checkpoint = Instant::now();
            let min_ttl_s = interval.as_secs() as i64;
            let checkpoints = shared.leases.lock().checkpoints(Instant::now(), min_ttl_s);
            for chunk in checkpoints.chunks(MAX_CHECKPOINTS_PER_ENTRY) {
                if let Err(e) = replica
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
pub(crate) fn remaining_s(shared: &Shared, id: LeaseId) -> Option<i64> {
    if let Some(s) = shared.leases.lock().remaining_s(id, Instant::now()) {
        return Some(s);
    }
    let info = shared.state.read().sm.lease(id)?;
    Some(
        info.checkpoint_remaining_ms
            .map_or(info.granted_ttl_s, |ms| ms.max(0) / 1000),
    )
}
