//! The replicated state machine: a pure function of the log.
//!
//! `apply` follows etcd 3.5's applier (`server/etcdserver/apply.go`, `txn.go`): every command
//! is first *checked* against the state before it, and only then *executed*. Execution cannot
//! fail, so a failed command never leaves half its writes behind and no rollback is needed.
//! All writes of one entry go to revision `current + 1`; the revision is bumped at the end if
//! (and only if) something was written.
//!
//! This file only declares the modules and re-exports; each owns one part of the state:
//! - `store`: the [`StateMachine`] struct and the types its tables share, and the invariant
//!   check across tables (the other modules import it from there, never from here);
//! - `apply`: entry order, validation (once), and the routing of each command to its domain;
//! - `kv`: put, delete-range, txn and compares, compaction, range reads;
//! - `lease`: grant, revoke, expiry, checkpoints, lease queries;
//! - `lock`: lock queues, lock-delay, force-release, the fence table, lock queries;
//! - `dedup`: exactly-once sessions (`RegisterClient`, `Deduplicated`);
//! - `alarm`: raised alarms and the `NoSpace` refusal;
//! - `auth`: the auth store's commands, the permission check of `Authorized`, auth queries;
//! - `snapshot`: the current snapshot format and the read paths of formats 1 to 3;
//! - `export`: every retained version in revision order and the leases, for backups;
//! - `import`: a state built from a backup (etcd's snapshot layout), checked;
//! - `read`: queries over the whole state (revisions, history, size, `hash_kv`).

mod alarm;
mod apply;
mod auth;
mod dedup;
mod export;
mod import;
mod kv;
mod lease;
mod lock;
mod read;
mod snapshot;
mod store;
#[cfg(test)]
mod tests;

pub use crate::mvcc::HISTORY_REVISIONS_PER_EVENT;
pub use export::{LeaseExport, LiveRef, VersionRef};
pub use import::{ImportError, ImportSummary, Importer};
pub use lease::LeaseInfo;
pub use read::HistoryBatch;
pub use snapshot::{SnapshotError, Tables};
pub use store::StateMachine;
