//! The client side of the `baton` binary.
//!
//! - `baton kv`, `baton lease`, `baton status` ([`kv`], [`txn`], [`lease`], [`status`]):
//!   thin commands over `baton-client`, sharing the global flags and the error line of
//!   [`client`] and the three output formats of [`output`] (aligned tables for people,
//!   tab-separated lines for shell scripts, JSON for programs).
//! - `baton member list|add|remove|update|promote` and `baton move-leader` ([`member`]):
//!   etcd's membership calls and leader transfer, in the same formats.
//! - `baton lock` and `baton elect` ([`lock`], [`elect`]): a `baton-client` session
//!   ([`session`]) and its `Mutex` or `Election`, so the lease-loss logic is the client's,
//!   shared with every Rust program using it; the CLI adds running the command in its own
//!   process group ([`child`]) and stopping it when the lock is lost. Everything the user
//!   needs to act on goes to stderr prefixed with `baton lock:` / `baton elect:`; stdout
//!   carries only machine-readable results so scripts can capture it.
//! - `baton saga list|show|retry|skip|cancel` ([`saga`]): the saga log of `baton-txn`'s
//!   orchestrator (kept in Baton), read and acted on directly, in the same three formats.
//! - `baton 2pc list|show` ([`twopc`]): the two-phase-commit decision log of `baton-txn`
//!   (kept in Baton), read only: finishing transactions is the Recoverer's job.
//!
//! - `baton auth|user|role` ([`auth`]): etcd's Auth service with etcdctl's commands.
//! - `baton snapshot save|status|restore` ([`snapshot`]): backups in etcd's format, from and
//!   into Baton or etcd, with a progress line on a terminal ([`progress`]).
//!
//! What the commands share has modules of its own ([`args`], [`exit`], [`signals`]), so a
//! command never reaches back into this file.

pub mod args;
pub mod auth;
pub mod bench;
pub mod child;
pub mod client;
pub mod elect;
pub mod exit;
pub mod fence;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod member;
pub mod ops;
pub mod output;
pub mod progress;
pub mod saga;
pub mod session;
pub mod signals;
pub mod snapshot;
pub mod status;
pub mod twopc;
pub mod txn;
