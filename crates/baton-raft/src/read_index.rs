//! ReadIndex ([`ReadIndex`]): the index a linearizable read must wait for, after the leader
//! has confirmed its leadership with a quorum — shared by every read waiting at the same
//! time — and the leadership confirmation that keep-alives rely on.
//!
//! It owns the state of that: the rounds waiting (one set for reads routed from here, one
//! for the leader's own half), the read floor of the term, and the last confirmation.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::ServerState;
use tokio::time::Instant;

use crate::answer::{leader_error, ProposeError};
use crate::calls::ReadIndexCall;
use crate::lease_verdict::VouchForLeases;
use crate::limits::{LEADER_RETRY_INTERVAL, REQUEST_TIMEOUT};
use crate::replica::Replica;
use crate::routing::{Routed, Router};

/// Reads waiting for the next ReadIndex round, and whether a round task is running.
#[derive(Default)]
struct Rounds {
    running: bool,
    waiting: Vec<tokio::sync::oneshot::Sender<Result<u64, ProposeError>>>,
}

pub(crate) struct ReadIndex {
    replica: Arc<Replica>,
    router: Arc<Router>,
    /// Concurrent linearizable reads share ReadIndex rounds (see [`ReadIndex::shared`]).
    rounds: parking_lot::Mutex<Rounds>,
    /// The same for the rounds this member runs as leader for forwarded read indexes and
    /// grant checks (see [`ReadIndex::shared_local`]).
    local_rounds: parking_lot::Mutex<Rounds>,
    /// `(term, index)`: the leader's last log index when it first served a ReadIndex in
    /// `term`; every read of the term waits for at least it (see [`ReadIndex::local`]).
    floor: parking_lot::Mutex<Option<(u64, u64)>>,
    /// `(term, when)`: the start of the last round that confirmed this member's leadership
    /// with a quorum. Keep-alives are acknowledged only while it is recent.
    confirmed: parking_lot::Mutex<Option<(u64, Instant)>>,
    /// One leadership confirmation in flight at a time; concurrent keep-alives share it.
    confirming: tokio::sync::Mutex<()>,
}

impl ReadIndex {
    pub(crate) fn new(replica: Arc<Replica>, router: Arc<Router>) -> Arc<ReadIndex> {
        Arc::new(ReadIndex {
            replica,
            router,
            rounds: Default::default(),
            local_rounds: Default::default(),
            floor: Default::default(),
            confirmed: Default::default(),
            confirming: Default::default(),
        })
    }

    /// A read index for a linearizable read that arrived now, from a ReadIndex round shared
    /// with every read waiting at the same time (etcd's linearizable-read batching).
    ///
    /// Why: a round costs a heartbeat exchange with a quorum on the leader, and on a follower
    /// a forwarded call to the leader as well. One round per read made 100 concurrent readers
    /// on a follower of a 3-member cluster slower than etcd's. Correctness: a read joins the
    /// round that starts after it arrived (never one already in flight), so the index is
    /// taken after the read arrived, as one round of its own would be.
    pub(crate) async fn shared(self: &Arc<Self>) -> Result<u64, ProposeError> {
        self.join_round(false).await
    }

    /// [`ReadIndex::shared`] for the leader's own half of forwarded ReadIndex and grant
    /// checks: rounds that run [`ReadIndex::local`] only (never routed: a member that lost
    /// leadership must answer `NotLeader`, not ask the new leader), shared by every such
    /// request arriving meanwhile. Followers batch their requests, so one batch may carry
    /// many grant checks; a round each cost a heartbeat exchange each.
    pub(crate) async fn shared_local(self: &Arc<Self>) -> Result<u64, ProposeError> {
        self.join_round(true).await
    }

    fn rounds(&self, local: bool) -> &parking_lot::Mutex<Rounds> {
        if local {
            &self.local_rounds
        } else {
            &self.rounds
        }
    }

    async fn join_round(self: &Arc<Self>, local: bool) -> Result<u64, ProposeError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let start = {
            let mut r = self.rounds(local).lock();
            r.waiting.push(tx);
            !std::mem::replace(&mut r.running, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move {
                loop {
                    let waiting = {
                        let mut r = me.rounds(local).lock();
                        if r.waiting.is_empty() {
                            r.running = false;
                            return;
                        }
                        std::mem::take(&mut r.waiting)
                    };
                    let res = if local {
                        me.local().await
                    } else {
                        me.round().await
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
    async fn round(&self) -> Result<u64, ProposeError> {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self.router.route(ReadIndexCall, deadline).await? {
            Routed::Local(ReadIndexCall) => self.local().await,
            Routed::Remote(index) => Ok(index),
        }
    }

    /// The leader's half of ReadIndex: confirms leadership with a quorum and returns the
    /// index a linearizable read must wait for (not waiting for it here: the caller may be
    /// on another member).
    pub(crate) async fn local(&self) -> Result<u64, ProposeError> {
        let replica = &self.replica;
        replica.check_running()?;
        replica
            .transfer
            .wait(Instant::now() + REQUEST_TIMEOUT)
            .await;
        // The round's heartbeats leave after this: a quorum that answers them confirmed this
        // member's leadership at least as late as now.
        let started = Instant::now();
        // openraft 0.9 restores a restarted leader as leader at once (same term, no new
        // blank entry; Baton no longer lets it, see `wal::recovery::as_restarted`, but the
        // floor stays cheap insurance) and then answers `max(its first entry of the term, committed)`, where
        // `committed` is what it recovered from disk: it can lag entries that were committed
        // (and acknowledged) before the crash, and a read at that index is stale (found by
        // baton-sim, seeds 42 and 78). Every committed entry is in the leader's log, so
        // waiting for everything it held when it began serving reads in this term is always
        // enough; entries it appended since are its own, and its committed index tracks them.
        // (Waiting for the log's end at every read instead made each read or lock grant under
        // write load wait for the batch in flight: one more fsync + apply per lock acquire.)
        let (term, last_log_index) = {
            let m = replica.raft.metrics();
            let m = m.borrow();
            (m.current_term, m.last_log_index.unwrap_or(0))
        };
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(remaining, replica.raft.get_read_log_id()).await {
                Err(_) => return Err(ProposeError::Timeout),
                Ok(Ok((read_log_id, _))) => {
                    self.confirm(term, started);
                    let floor = self.floor(term, last_log_index);
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
                Ok(Err(RaftError::Fatal(f))) => return Err(replica.fatal_error(&f)),
            }
        }
    }

    /// The read floor of `term` (see [`ReadIndex::local`]), set to `last_log_index` by the
    /// first read of the term.
    fn floor(&self, term: u64, last_log_index: u64) -> u64 {
        let mut f = self.floor.lock();
        match *f {
            Some((t, index)) if t == term => index,
            _ => {
                *f = Some((term, last_log_index));
                last_log_index
            }
        }
    }

    /// Records a quorum's confirmation of this member's leadership in `term`, as of `at`
    /// (kept only if newer than the one held).
    fn confirm(&self, term: u64, at: Instant) {
        let mut c = self.confirmed.lock();
        if !c.is_some_and(|(t, held)| t == term && held >= at) {
            *c = Some((term, at));
        }
    }

    /// Whether a quorum confirmed this member's leadership in the current term within the
    /// last heartbeat interval.
    fn confirmed_recently(&self) -> bool {
        let replica = &self.replica;
        let term = replica.raft.metrics().borrow().current_term;
        self.confirmed
            .lock()
            .is_some_and(|(t, at)| t == term && at.elapsed() < replica.config.heartbeat_interval)
    }

    /// The leader's half of a lock grant check: the index [`ReadIndex::shared_local`] would
    /// answer, without its round of heartbeats while a quorum confirmed this member's
    /// leadership within the last heartbeat interval (the lease keep-alives rely on, see
    /// [`ReadIndex::ensure_leadership`]); otherwise a shared round, which renews it.
    ///
    /// Why: a contended lock is handed over once per release, and the next waiter's grant
    /// waited for a heartbeat exchange with a quorum each time — the slowest step of a
    /// handoff in a cluster (issue 19). Correctness: followers that answered a heartbeat
    /// refuse to vote for anyone else for their election timeout (openraft's leader lease),
    /// several heartbeat intervals, so no other leader can have committed anything since; and
    /// every entry whose effect anyone has seen was saved as committed before it was applied
    /// (openraft saves the committed id, then applies), so the committed id saved in the log
    /// covers it. The term's read floor applies as in [`ReadIndex::local`].
    pub(crate) async fn leased_local(self: &Arc<Self>) -> Result<u64, ProposeError> {
        let replica = &self.replica;
        replica.check_running()?;
        if !self.confirmed_recently() || replica.transfer.is_closed() {
            cached_counter!("baton_lock_grant_checks_total", "confirmed_by" => "round")
                .increment(1);
            return self.shared_local().await;
        }
        let (term, last_log_index, leading) = {
            let m = replica.raft.metrics();
            let m = m.borrow();
            (
                m.current_term,
                m.last_log_index.unwrap_or(0),
                m.current_leader == Some(replica.member_id),
            )
        };
        if !leading {
            return self.shared_local().await;
        }
        cached_counter!("baton_lock_grant_checks_total", "confirmed_by" => "lease").increment(1);
        let committed = replica.wal.committed_index();
        Ok(committed.max(self.floor(term, last_log_index)))
    }

    /// What this member, as leader in `term`, vouches for in a lease verdict
    /// (`lease_verdict`): how long every lease it tracks stays alive, when a quorum confirmed
    /// its leadership in `term` within the last heartbeat interval, its lease clock is rebuilt
    /// for `term` and no lease is being expired or due within two heartbeat intervals. `None`
    /// otherwise: followers then ask with a grant check, as before.
    ///
    /// The conditions are [`ReadIndex::leased_local`]'s (and the clock's, as
    /// `LeaseDuty::grant_check_local` reads it), for every lease at once.
    pub(crate) fn vouch_for_leases(&self, term: u64) -> Option<Duration> {
        let replica = &self.replica;
        let heartbeat = replica.config.heartbeat_interval;
        if replica.transfer.is_closed() {
            return None;
        }
        let confirmed = self
            .confirmed
            .lock()
            .is_some_and(|(t, at)| t == term && at.elapsed() < heartbeat);
        let role = replica.role();
        let leading = role.state == ServerState::Leader
            && role.term == term
            && role.leader == Some(replica.member_id);
        if !confirmed || !leading {
            return None;
        }
        let alive_for = heartbeat * 2;
        let clock = replica.shared.leases.lock();
        (clock.ready_term() == Some(term) && clock.all_alive_for(Instant::now(), alive_for))
            .then_some(alive_for)
    }

    /// Returns once a quorum has confirmed this member's leadership within the last
    /// heartbeat interval (etcd's `ensureLeadership`): at most one round per interval,
    /// however many callers (see `lease_duty::LeaseDuty::keep_alive_confirmed`).
    pub(crate) async fn ensure_leadership(&self) -> Result<(), ProposeError> {
        let replica = &self.replica;
        let fresh = || {
            let term = replica.raft.metrics().borrow().current_term;
            self.confirmed.lock().is_some_and(|(t, at)| {
                t == term && at.elapsed() < replica.config.heartbeat_interval
            })
        };
        if fresh() {
            return Ok(());
        }
        let _one = self.confirming.lock().await;
        if fresh() {
            return Ok(());
        }
        self.local().await?;
        Ok(())
    }
}

impl VouchForLeases for ReadIndex {
    fn vouch_for_leases(&self, term: u64) -> Option<Duration> {
        ReadIndex::vouch_for_leases(self, term)
    }
}
