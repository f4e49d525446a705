//! # baton-core
//!
//! Baton's replicated state machine as a pure function of the log: given the same entries in
//! the same order, every replica reaches the same state and returns the same results. That is
//! what makes deterministic simulation possible, so this crate has no I/O, no clock, no
//! randomness, no threads and no async. Time enters only as `Entry::time_ms`, stamped by the
//! leader; lease ids are chosen by the proposer.
//!
//! Invariants (asserted in code and checked by the model test):
//! - the global revision only grows, by exactly one per entry that changes something;
//! - a txn is one revision, and a key may not be modified twice in it;
//! - a failed command changes nothing;
//! - revoking or expiring a lease deletes all its keys in one revision;
//! - history below the compact revision is gone, reads there fail with `Compacted`.
//!
//! Codemap: `command`/`types` are the contract with the raft and server crates;
//! `state_machine` checks then executes each entry; `mvcc` (private) holds every version of
//! every key plus a revision-ordered change index; `validate` (private) holds etcd's
//! stateless request checks; `watch` is the node-local watch hub; `crc32` (private) backs
//! snapshot checksums and `hash_kv`.

pub mod command;
mod crc32;
mod mvcc;
pub mod state_machine;
pub mod types;
mod validate;
pub mod watch;

pub use command::*;
pub use state_machine::{HistoryBatch, LeaseInfo, SnapshotError, StateMachine};
pub use types::*;
pub use watch::{WatchHub, WatchOutput, WatchSpec, WatcherId};
