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
//! - history below the compact revision is gone, reads there fail with `Compacted`;
//! - a lock's holder is the head of its queue (live keys under `<name>/` by create
//!   revision), so fencing tokens (the holder key's create revision) only grow;
//! - a fence check accepts a token iff it is `>=` the highest recorded for the resource;
//! - a `Deduplicated` write is applied at most once per `(client, sequence)`: a retry gets
//!   the first answer and changes nothing; sessions expire by entry time only;
//! - the fencing key ring only grows a current key (bootstrap once, rotations after), and
//!   a rotation drops the old private key but keeps its public key;
//! - with auth enabled, an `Authorized` command is applied only if its user may touch every
//!   key it names (both branches and the compares of a txn), else it changes nothing; the
//!   auth revision only grows.
//!
//! Codemap: `auth` is the auth store's data (users, roles, permissions, simple tokens)
//! and the pure permission check over merged intervals; `command`/`types` are the contract with the raft and server crates; `fencing_keys` is the replicated signing key ring (bytes only: no crypto here); `locks` is
//! the lock registry (lock-delay, force-release history, queue index) and the fence table;
//! `clients` (private) holds the de-duplication sessions and their cached answers;
//! `state_machine` checks then executes each entry (one module per domain: `kv`, `lease`,
//! `lock`, `dedup`, `alarm`, `snapshot`, `read`, routed by `apply`, over `store`'s struct);
//! `mvcc` (private) holds every version of every key plus a revision-ordered change index;
//! `validate` (private) holds etcd's stateless request checks; `watch` is the node-local
//! watch hub; `crc32` (private) backs snapshot checksums and `hash_kv`; `format` states the
//! rule every persisted type follows (variants append-only, fields never reorder) and what
//! pins it (golden bytes).

pub mod auth;
mod change_index;
mod clients;
pub mod command;
mod crc32;
pub mod fencing_keys;
pub mod format;
pub mod locks;
mod mvcc;
pub mod state_machine;
pub mod types;
mod validate;
pub mod value;
pub mod watch;

pub use auth::{
    AuthCommand, AuthError, AuthInfo, AuthResponse, AuthState, PermCache, PermType, Permission,
    Role, SimpleToken, User, UserPerms, MAX_SIMPLE_TOKENS, ROOT,
};
pub use clients::{MAX_CACHED_RESPONSES, MAX_CLIENT_SESSIONS};
pub use command::*;
pub use fencing_keys::{
    CurrentFencingKey, FencingKeyId, FencingKeyMode, FencingKeys, FencingPublicKey, FencingSecret,
    MAX_FENCING_KEYS,
};
pub use locks::{
    lock_key, lock_name_of, lock_prefix, prefix_end, ForceReleaseRecord, LockContention, LockInfo,
    LockSummary, FORCE_RELEASE_RETENTION_MS, MAX_FENCE_RESOURCES, MAX_FORCE_RELEASE_RECORDS,
    MAX_LOCKS, MAX_LOCK_DELAY_MS, MAX_REASON_BYTES,
};
pub use state_machine::{
    HistoryBatch, ImportError, ImportSummary, Importer, LeaseExport, LeaseInfo, LiveRef,
    SnapshotError, StateMachine, Tables, VersionRef, HISTORY_REVISIONS_PER_EVENT,
};
pub use types::*;
pub use watch::{WatchCensus, WatchHub, WatchOutput, WatchSpec, WatcherId};
