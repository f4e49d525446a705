//! # baton-check
//!
//! Checkers that judge a recorded run of a Baton cluster: the deterministic simulator
//! (`baton-sim`) and the real-process tests record what clients saw, and these functions say
//! whether that is something a correct etcd-compatible service could have produced. A
//! checker that passes a buggy history hides bugs, and one that fails a correct history
//! makes every failing seed suspect, so each checker here is itself tested on known-good and
//! known-bad histories.
//!
//! The crate is pure: no I/O, no async, no dependency on other Baton crates (so a bug in the
//! system under test cannot leak into the judge). Time is whatever `u64` the caller records —
//! simulated nanoseconds, real nanoseconds, or a logical event counter; only its order
//! matters.
//!
//! - [`history`] — the KV history model: operations with invoke/return times, results that
//!   may be unknown (timeouts), an event-list form and a thread-safe [`Recorder`].
//! - [`linearizability`] — a Wing–Gong checker with Lowe's/porcupine's optimizations
//!   (per-key partitioning, a cache of visited states, a step/time budget). The search is
//!   generic over a [`Model`]; [`check_history`] applies it to the etcd-style KV register.
//! - [`lock`] — at most one lock holder at a time as judged by the fence, with strictly
//!   increasing fencing tokens.
//! - [`watch`] — a watch stream is the authoritative change history, in order, without gaps
//!   or duplicates, from its start revision.
//! - [`convergence`] — all replicas end at the same applied index with the same state hash.

#![deny(missing_docs)]

mod bytes;
pub mod convergence;
pub mod history;
pub mod linearizability;
pub mod lock;
mod model;
mod register;
pub mod watch;

pub use bytes::Bytes;
pub use convergence::{check_convergence, check_hash_agreement, ConvergenceError, ReplicaState};
pub use history::{
    CallId, Event, History, HistoryError, KvOp, KvResult, Operation, ProcessId, Recorder, Time,
};
pub use linearizability::{
    check_history, check_operations, Blocked, BlockedOp, CheckOptions, HistoryOp, Model, Op,
    Report, Search, SearchResult, Stats, Undecided, Verdict, Violation,
};
pub use lock::{check_locks, LockRecord, LockReport, LockViolation};
pub use watch::{
    check_watch, EventKind, KeyRange, WatchEvent, WatchSpec, WatchSummary, WatchViolation,
};
