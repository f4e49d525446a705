//! Two-phase commit that does not block (feature `twopc`).
//!
//! Classic 2PC has one fatal flaw: once every participant voted YES, only the coordinator
//! knows the decision, and if it dies the participants hold their locks until it comes back.
//! Here the decision is a write-once record in Baton's replicated log, so any coordinator
//! process, or the [`Recoverer`], can read it and finish the transaction (the idea of Gray and
//! Lamport's Paxos Commit, with Baton's Raft group as the acceptors).
//!
//! (Module documentation continues in the coordinator's slice.)

mod coordinator;
mod ids;
mod log;
mod participant;
#[cfg(feature = "postgres")]
pub mod pg;
mod recoverer;

pub use coordinator::{Coordinator, FaultPoint, GlobalTx, Outcome, TwoPcConfig, TxError};
pub use ids::{BranchId, Gid, IdError, TxId, GID_PREFIX};
pub use log::{
    gid_of, BatonDecisionLog, BranchRecord, BranchState, Decision, DecisionLog, DecisionRecord,
    InMemoryDecisionLog, Intent, IntentBranch, TxRecord, TxState,
};
pub use participant::{BoxFuture, Branch, Finish, ParticipantError, PreparedBranch, Resource};
pub use recoverer::{Recoverer, RecovererConfig, RecoveryError, RecoveryReport};

#[cfg(feature = "mariadb")]
pub mod mariadb;
