//! What the replica answers its callers: a proposal's outcome ([`Proposed`]), why a proposal
//! or read did not go through ([`ProposeError`]), a keep-alive's result ([`KeepAlive`]),
//! and the mapping of leadership and openraft failures onto them. These are the errors of the
//! replica's API (they travel between members, so their encoding is pinned by `golden`);
//! why a replica could not start is `error::StartError`.

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
    /// openraft's core stopped without a shutdown being asked for, or panicked: the replica
    /// serves nothing that needs Raft any more (a storage failure stops it with
    /// [`ProposeError::Storage`] instead).
    #[error("the Raft core has halted: {0}")]
    Halted(Halt),
    /// A bug in this build, or two builds in one cluster that disagree: never the caller's
    /// doing, and not a storage failure.
    #[error("internal error: {0}")]
    Internal(InternalError),
}

/// How openraft's core ended when nobody asked it to ([`ProposeError::Halted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Halt {
    #[error("stopped")]
    Stopped,
    #[error("panicked")]
    Panicked,
}

/// What went wrong inside Baton itself ([`ProposeError::Internal`]). Each is a bug (or a
/// cluster of mixed builds); the variants say where, so the log and the client see which.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum InternalError {
    /// A request for the leader could not be encoded (requests are bounded far below the
    /// peer message limit).
    #[error("a request for the leader could not be encoded")]
    EncodeRequest,
    /// The leader answered with the answer of another kind of request.
    #[error("the leader answered with the wrong kind of answer")]
    UnexpectedAnswer,
    /// Applying an entry produced another number of results than it had commands.
    #[error("applying an entry of {commands} commands gave {results} results")]
    ResultCount { commands: u64, results: u64 },
    /// openraft refused a write as if it were a membership change.
    #[error("a write was refused as a membership change")]
    WriteAsMembershipChange,
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
        Fatal::Stopped => ProposeError::Halted(Halt::Stopped),
        Fatal::StorageError(e) => ProposeError::Storage(e.to_string()),
        Fatal::Panicked => ProposeError::Halted(Halt::Panicked),
    }
}
