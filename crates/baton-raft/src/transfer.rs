//! Leader transfer (etcd's `Maintenance.MoveLeader`) on openraft 0.9, which has no transfer
//! API of its own (openraft 0.10 adds one).
//!
//! The obstacle is openraft's leader lease: a follower refuses to vote for anybody for
//! `election_timeout_max` (`0.4 T`, see `config::ElectionTiming`) after it last heard
//! from its leader, so a target that simply campaigns (`trigger().elect()`) is refused while
//! the leader keeps sending heartbeats. The leader therefore:
//!
//! 1. closes its gate: new proposals, read indexes and membership changes on this member wait
//!    (etcd drops proposals during a transfer), so the log stops growing and nothing but
//!    replication renews the followers' leases;
//! 2. stops heartbeats;
//! 3. waits until the target's log matches its own (etcd: the transferee must be caught up);
//! 4. waits one lease plus a heartbeat interval: every follower's lease has then expired,
//!    while their election timers (`[0.65 T, 0.8 T)` after the last heartbeat) have not;
//! 5. tells the target to campaign (`TimeoutNow` peer method → `trigger().elect()`); the
//!    target has the longest log and the highest term and wins, and its first AppendEntries
//!    makes the old leader step down;
//! 6. waits until the target is the leader it knows, then re-enables heartbeats and opens
//!    the gate (also on failure: a transfer that times out leaves the
//!    old leader leading).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use openraft::metrics::WaitError;
use openraft::ServerState;
use serde::{Deserialize, Serialize};

use crate::answer::{InternalError, ProposeError};
use crate::network::Method;
use crate::replica::Replica;
use crate::routing::Router;
use crate::wire;

/// How long a transfer may take (etcdctl's command timeout is 5 s; answer before it).
const TRANSFER_TIMEOUT: Duration = Duration::from_millis(4500);

/// Why a leader transfer failed. The server maps them to etcd's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum TransferError {
    /// Asked of a member that is not the leader (etcd answers "etcdserver: not leader"; the
    /// caller must ask the leader, as etcdctl does).
    #[error("not leader")]
    NotLeader,
    /// The target is not a voting member.
    #[error("bad leader transferee")]
    BadTransferee,
    /// Another transfer is under way on this leader.
    #[error("a leader transfer is already in progress")]
    InProgress,
    /// The target did not catch up or win in time; the old leader keeps leading.
    #[error("leader transfer took too long")]
    Timeout,
    #[error(transparent)]
    Propose(#[from] ProposeError),
}

/// Re-opens the gate and restores heartbeats however the transfer ends.
struct Reopen<'a>(&'a Replica);

impl Drop for Reopen<'_> {
    fn drop(&mut self) {
        let rc = self.0.raft.runtime_config();
        rc.heartbeat(true);
        self.0.transfer.open();
    }
}

/// etcd's `MoveLeader`: hands leadership to `target`, a voter, once it has caught up. Only
/// the leader can do this ([`TransferError::NotLeader`] elsewhere); moving to the leader
/// itself succeeds at once.
pub(crate) async fn move_leader(router: &Router, target: u64) -> Result<(), TransferError> {
    let replica = router.replica();
    replica.check_running()?;
    let deadline = Instant::now() + TRANSFER_TIMEOUT;
    let term = {
        let m = replica.raft.metrics();
        let m = m.borrow();
        if m.state != ServerState::Leader {
            return Err(TransferError::NotLeader);
        }
        if target == replica.member_id {
            return Ok(());
        }
        if !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == target)
        {
            return Err(TransferError::BadTransferee);
        }
        m.current_term
    };
    tracing::info!(
        target = format_args!("{target:x}"),
        term,
        "leadership transfer starting"
    );
    // A target that does not answer cannot campaign: fail now rather than hold the gate
    // (and every write on this member) until the deadline.
    if !router.active(target) {
        return Err(TransferError::Timeout);
    }
    if !replica.transfer.close() {
        return Err(TransferError::InProgress);
    }
    let _reopen = Reopen(replica);
    let rc = replica.raft.runtime_config();
    // (The leader never campaigns: `election` skips a leader, and a transfer in
    // progress, so stopping heartbeats is all.)
    rc.heartbeat(false);
    // With the gate closed the leader's log stops growing, so the target catches up
    // even under a steady write load (the writes wait, as etcd drops them meanwhile).
    // etcd's raft gives a transfer one election timeout.
    let catch_up_deadline = deadline.min(Instant::now() + replica.config.election_timeout);
    wait_caught_up(replica, target, catch_up_deadline).await?;
    tokio::time::sleep(replica.timing.lease() + replica.config.heartbeat_interval).await;
    let node = replica
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .get_node(&target)
        .cloned()
        .ok_or(TransferError::BadTransferee)?;
    let payload =
        wire::encode(&term).map_err(|_| ProposeError::Internal(InternalError::EncodeRequest))?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    let answer = router
        .peers()
        .call(target, &node, Method::TimeoutNow, payload, remaining)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "leadership transfer: the target did not answer");
            TransferError::Timeout
        })?;
    match wire::decode::<Result<(), String>>(&answer) {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => {
            tracing::warn!(%reason, "leadership transfer: the target refused to campaign");
            return Err(TransferError::BadTransferee);
        }
        Err(e) => return Err(ProposeError::LeaderFailed(e.to_string()).into()),
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    match replica
        .raft
        .wait(Some(remaining))
        .metrics(|m| m.current_leader == Some(target), "the transferee leads")
        .await
    {
        Ok(m) => {
            tracing::info!(
                target = format_args!("{target:x}"),
                term = m.current_term,
                "leadership transferred"
            );
            Ok(())
        }
        Err(WaitError::Timeout(..)) => Err(TransferError::Timeout),
        Err(WaitError::ShuttingDown) => Err(ProposeError::ShuttingDown.into()),
    }
}

/// Waits until the leader's replication to `target` has matched its whole log.
async fn wait_caught_up(
    replica: &Replica,
    target: u64,
    deadline: Instant,
) -> Result<(), TransferError> {
    let remaining = deadline.saturating_duration_since(Instant::now());
    let caught_up = |m: &openraft::RaftMetrics<u64, crate::types::Member>| {
        let matched: BTreeMap<u64, Option<u64>> = m
            .replication
            .iter()
            .flatten()
            .map(|(id, l)| (*id, l.map(|l| l.index)))
            .collect();
        m.state == ServerState::Leader
            && matched.get(&target).copied().flatten() >= m.last_log_index
    };
    match replica
        .raft
        .wait(Some(remaining))
        .metrics(caught_up, "the transferee has caught up")
        .await
    {
        Ok(_) => Ok(()),
        Err(WaitError::Timeout(..)) => {
            if replica.role().state != ServerState::Leader {
                return Err(TransferError::NotLeader);
            }
            Err(TransferError::Timeout)
        }
        Err(WaitError::ShuttingDown) => Err(ProposeError::ShuttingDown.into()),
    }
}

/// The transferee's half: campaign now. Refused by a member that is not a voter or that has
/// seen a newer term than the leader's that asks.
pub(crate) async fn serve_timeout_now(
    replica: &Replica,
    from: u64,
    leader_term: u64,
) -> Result<(), String> {
    let voter = replica.is_voter(replica.member_id);
    let term = replica.role().term;
    if !voter {
        return Err("not a voter".into());
    }
    if term > leader_term {
        return Err(format!(
            "term {term} is newer than the leader's {leader_term}"
        ));
    }
    tracing::info!(
        from = format_args!("{from:x}"),
        leader_term,
        "campaigning at the leader's request (leadership transfer)"
    );
    replica
        .raft
        .trigger()
        .elect()
        .await
        .map_err(|e| e.to_string())
}
