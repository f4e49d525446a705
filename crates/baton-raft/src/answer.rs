//! What the replica answers its callers: a proposal's outcome ([`Proposed`]), why a proposal
//! or read did not go through ([`ProposeError`]), a keep-alive's result ([`KeepAlive`]),
//! and the mapping of leadership and openraft failures onto them. Apart from lib.rs so that
//! the modules that produce or carry these answers (the proposer, the wire format) do not
//! reach back into the crate root (the tidy test `no_module_cycles`); lib.rs re-exports
//! the public ones.

use baton_core::Applied;
use openraft::error::Fatal;
use serde::{Deserialize, Serialize};

use crate::origin::LeaderDuty;

/// A write's outcome together with the term it was committed in (for response headers).
///
/// For a proposal made on a follower (forwarded to the leader), `applied.events` is empty:
/// the leader does not ship them back, since this member's watchers get the same events
/// from its own apply (which has happened by the time `propose` returns).
#[derive(Debug, Clone, PartialEq)]
pub struct Proposed {
    pub applied: Applied,
    pub raft_term: u64,
    /// The Raft log index of the entry that carried the command.
    pub raft_index: u64,
}

/// Why a proposal or a linearizable read did not go through. The server maps these to etcd's
/// `etcdserver: no leader` / `leader changed` / `request timed out`. Serializable: a leader
/// sends them back to the follower that forwarded a request.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq, Serialize, Deserialize)]
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
    /// A proposal was forwarded to the leader, which failed (or could not be heard from)
    /// before answering: it may or may not have been applied (etcd's "request timed out,
    /// possibly due to previous leader failure").
    #[error("the leader failed before answering: {0}")]
    LeaderFailed(String),
    /// The leader refused a membership change (another one is in progress, or the member is
    /// unknown).
    #[error("membership change refused: {0}")]
    MembershipChange(String),
    /// The queue of proposals in front of Raft is full (etcd's "too many requests"): retry
    /// later. Nothing was done.
    #[error("too many requests")]
    TooManyRequests,
    /// The command is one only the leader's own duties propose (lease expiry, checkpoints,
    /// blank entries; see `origin`), and it came from a caller of
    /// [`Node::propose`](crate::Node::propose) or a peer. Nothing was done.
    #[error("baton: {0} is proposed only by the leader itself, never on request")]
    LeaderOnly(LeaderDuty),
    /// The command adds data and this member's disk is (nearly) full or a `NOSPACE` alarm
    /// is raised (see `space`). Nothing was done. Appended last: this enum travels between
    /// members.
    #[error("no space")]
    NoSpace,
}

/// Result of a lease keep-alive on the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeepAlive {
    /// Renewed; the lease's granted TTL in seconds.
    Renewed { ttl_s: i64 },
    /// No such lease (expired or revoked).
    NotFound,
}

/// `NoLeader` or `NotLeader` with the leader this member knows of.
pub(crate) fn leader_error(leader: Option<u64>) -> ProposeError {
    match leader {
        None => ProposeError::NoLeader,
        Some(id) => ProposeError::NotLeader { leader: Some(id) },
    }
}

/// What a caller is told when openraft stopped (`ShuttingDown` only when that was asked for).
pub(crate) fn fatal_error(f: &Fatal<u64>, shutting_down: bool) -> ProposeError {
    match f {
        Fatal::Stopped if shutting_down => ProposeError::ShuttingDown,
        Fatal::Stopped => ProposeError::Storage("raft stopped".into()),
        Fatal::StorageError(e) => ProposeError::Storage(e.to_string()),
        Fatal::Panicked => ProposeError::Storage("raft core panicked".into()),
    }
}
