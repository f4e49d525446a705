//! The Rust client of Baton — and of etcd 3.4, for everything etcd's API allows — built
//! so that correct locking is the easy path: the fencing token comes with every lock and
//! cannot be forgotten, and losing a lock cannot go unnoticed.
//!
//! # What is here
//!
//! - [`Client`]: several endpoints with failover, a deadline on every call, request ids
//!   ([`RequestId`]), TLS-ready configuration ([`ClientConfig`]); KV ([`Client::get`],
//!   [`Client::put`], [`Client::delete`], [`Client::txn`] with [`Txn`] / [`Compare`] /
//!   [`Op`]), leases, and watches that resume after reconnects ([`Client::watch`]).
//! - [`ExactlyOnce`] (Baton only): writes retried through failovers with one sequence number
//!   each, applied once by the server's replicated de-duplication table.
//! - [`Session`]: a lease kept alive every TTL/3, with a local, pessimistic expiry estimate
//!   (`send time of the last acknowledged keep-alive + TTL × (1 − ρ) − margin`, monotonic
//!   clock) and [`Session::lost`], which fires *before* the server could expire the lease;
//!   plus [`SessionState`] (Alive / Uncertain / Expired).
//! - Recipes. Whatever is *held* is held with a session (so it ends with it) and comes with
//!   a [`FencingToken`]:
//!   [`Mutex`] → [`Guard`] (timeouts, cancellation, try-lock, multi-lock, fenced writes,
//!   atomic release), [`FenceGate`], [`RwLock`] and [`Semaphore`] → [`Permit`],
//!   [`Election`] → [`Leadership`], [`Barrier`], [`DoubleBarrier`], [`Queue`].
//! - For operators and tools: [`Client::status`], [`Client::member_list`],
//!   [`Client::list_locks`] and [`Client::inspect_lock`] (Baton's lock registry: holders
//!   and waiters), [`Client::lease_list`].
//!
//! ```
//! # baton_client::testing::doctest(|endpoint| async move {
//! use baton_client::{Client, ClientConfig, Mutex, PutOptions, Session, SessionOptions};
//!
//! let client = Client::connect(ClientConfig::new([endpoint])).await?;
//! let session = Session::new(&client, SessionOptions::new()).await?;
//! let guard = Mutex::new(&session).acquire("reports/nightly").await?;
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lost the lock ({reason}): stop, redo later"),
//!     done = async {
//!         // ... the guarded work; every write carries the token:
//!         guard.fenced_put("reports/last-run", "2024-05-01", PutOptions::new()).await
//!     } => { done?; }
//! }
//! guard.release().await?;
//! # Ok(()) });
//! ```
//!
//! # Lock loss is never silent
//!
//! A lock is held with a session's lease. If the client cannot renew it (partition,
//! overloaded server, a paused process), the server eventually expires it and grants the
//! lock to the next waiter. The session's estimate of that moment is deliberately early:
//! the server renewed the lease no earlier than the keep-alive *left* the client, so its
//! deadline is at least `send + TTL`; the client fires at `send + TTL × (1 − ρ) − margin`.
//! [`Guard::lost`] (and [`Permit::lost`], [`Leadership::lost`]) fire then, or when the
//! held key disappears (force-release), so the guarded work can stop.
//!
//! Stopping is best effort: a process paused between "I still hold it" and its write
//! writes late. Only the resource can refuse that write, which is what the fencing token is
//! for: [`Guard::fenced_put`] for data in Baton, [`FenceGate`] for services without their
//! own check, and a conditional update for databases (below). A resource that may meet
//! clients it does not trust verifies the grant's signature too ([`SignedToken`]): a
//! made-up higher token would otherwise lock every honest holder out.
//!
//! # Fencing a PostgreSQL table
//!
//! No dependency is needed; keep the highest token next to the data and make every write
//! conditional on it, in the same statement:
//!
//! ```sql
//! ALTER TABLE stock ADD COLUMN fence bigint NOT NULL DEFAULT 0;
//! -- Register the token before the first read (0 rows: a newer holder exists, give up).
//! UPDATE stock SET fence = $token WHERE id = $1 AND fence <= $token;
//! -- Every write carries it; 0 rows updated means it was refused.
//! UPDATE stock SET qty = $2, fence = $token WHERE id = $1 AND fence <= $token;
//! ```
//!
//! `<=`, not `<`: the same holder writes more than once. A refused write means a newer
//! holder exists: stop, do not retry with the same token; acquire again and start over
//! from a fresh read. The column holds the token's number ([`FencingToken::get`]). In Rust
//! (here the table is simulated; with `tokio-postgres` the `update` is
//! `client.execute(SQL, &[&id, &qty, &token.get()]).await?`):
//!
//! ```
//! # baton_client::testing::doctest(|endpoint| async move {
//! use baton_client::{Client, ClientConfig, FencingToken, Mutex, Session, SessionOptions};
//!
//! const SQL: &str = "UPDATE stock SET qty = $2, fence = $3 WHERE id = $1 AND fence <= $3";
//! struct Row { qty: i64, fence: i64 }
//! // What PostgreSQL does with SQL for one row: the check and the write are one statement.
//! fn update(row: &mut Row, qty: i64, token: FencingToken) -> u64 {
//!     let fence = token.get();
//!     if row.fence <= fence { row.qty = qty; row.fence = fence; 1 } else { 0 }
//! }
//!
//! let client = Client::connect(ClientConfig::new([endpoint])).await?;
//! let mut row = Row { qty: 10, fence: 0 };
//! let a = Mutex::new(&Session::new(&client, SessionOptions::new()).await?);
//! let b = Mutex::new(&Session::new(&client, SessionOptions::new()).await?);
//!
//! let old = a.acquire("stock-1").await?;
//! let stale_token = old.fencing_token();
//! old.release().await?; // (in real life: A's lease expired while it was paused)
//! let new = b.acquire("stock-1").await?;
//! assert_eq!(update(&mut row, 8, new.fencing_token()), 1, "{SQL}");
//! assert_eq!(update(&mut row, 9, stale_token), 0, "the late write of the old holder is refused");
//! assert_eq!(row.qty, 8);
//! # Ok(()) });
//! ```
//!
//! # Baton vs etcd 3.4
//!
//! The same code runs against both (the tests run every recipe against each). The client
//! asks the server once whether it speaks `baton.v1` ([`ServerKind::Auto`]) and uses
//! etcd's client-side recipes when it does not. What differs:
//!
//! | | Baton | etcd 3.4 |
//! |---|---|---|
//! | [`Mutex`] queue | server-side (`baton.v1.Lock/Acquire`), a waiter wakes only when its predecessor goes | etcd's client-side recipe (Txn + Range + Watch), with etcd 3.5's re-check of the own key after waiting |
//! | giving up (timeout, dropped future) | the server deletes the waiter key, even if the client vanished | the client deletes it (in the background if the future was dropped); if the client dies, the key stays until its lease expires and the queue waits that long |
//! | grant to an expired session (etcd#11456) | refused: the server checks the lease at grant time | the recipe's re-check of the own key after waiting, plus [`Guard::lost`] |
//! | try-lock | server-side, no revision spent | client-side: creates the key, sees a holder, deletes it (two revisions) |
//! | lock-delay ([`LockOptions::with_lock_delay`]) | yes | [`Error::Unsupported`] |
//! | [`Mutex::lock_many`] | one `AcquireMany` (the server releases all on failure) | sequential acquisitions in sorted order, released by the client on failure |
//! | [`Guard::fenced_put`] | `FencedPut` | the same two conditions as one Txn (identical semantics) |
//! | [`Guard::release`] | `Release` (token checked) | Txn `create_revision(key) == token` → delete (identical semantics) |
//! | [`FenceGate`] | `baton.v1.Fence/Check` | [`Error::Unsupported`] |
//! | [`Guard::signed_token`], [`FenceGate::check_signed`] | grants signed by the cluster's key, verified before the gate is asked | `None`: etcd signs nothing |
//! | [`Client::fence_public_keys`], [`Client::rotate_fence_key`] | `baton.v1.Fence/PublicKeys`, `RotateKey` | [`Error::Unsupported`] |
//! | operator force-release | `baton.v1.Lock/ForceRelease`; the holder's [`Guard::lost`] fires ([`LostReason::KeyDeleted`]) | none; deleting the key by hand has the same effect on the holder |
//! | [`Election`] | `v3election` on the same lock queues as locks (lease 0 refused; the lease is checked at grant) | `v3election` (etcd 3.4's server-side recipe may elect a candidate whose lease just expired, etcd#11456; [`Leadership::lost`] then fires) |
//! | [`Election::observe`] | the leader, then each change of leader or proclamation, each judged at its own revision | etcd's `Observe` (the same events in the tests) |
//! | [`RwLock`], [`Semaphore`], [`Barrier`], [`DoubleBarrier`], [`Queue`] | client-side recipes over KV/Watch | the same recipes |
//! | minimum lease TTL | 2 s with default settings (1.5 × election timeout, rounded up) | 2 s with default settings |
//! | error texts | etcd's, byte for byte; Baton's own start with `baton:` | etcd's |
//! | request ids ([`RequestId`]) on plain KV writes | sent as metadata (logged), not de-duplicated: etcd's semantics | sent, ignored |
//! | exactly-once writes ([`Client::exactly_once`]) | `baton.v1.ExactlyOnce`: retried with the same sequence until answered, applied once | [`Error::Unsupported`] |
//!
//! Lock keys use etcd's layout (`<name>/<lease id in hex>`) on both, so `etcdctl lock`
//! users, etcd's Go recipes and this client queue in the same lines.
//!
//! # Not in this build
//!
//! - Automatic retries of plain KV writes after `Unavailable`: such a write may have been
//!   applied, so [`Client::put`] and friends do not retry it; use [`ExactlyOnce`] (Baton
//!   only) for writes that must survive a failover.
//! - Authentication (etcd's Auth service).

#![warn(missing_docs)]

mod admin;
mod auth;
mod auth_admin;
mod barrier;
mod client;
mod config;
mod election;
mod error;
mod exactly_once;
mod kv;
mod lease;
mod lost;
mod monitor;
mod mutex;
mod queue;
mod recipe;
mod rwlock;
mod semaphore;
mod session;
mod signed;
mod token;
mod util;
mod watch;

#[doc(hidden)]
pub mod testing;

/// The protobuf messages and gRPC clients underneath (etcd's API and `baton.v1`), for
/// callers who need an RPC this crate does not wrap.
pub use baton_proto as proto;
/// A key with its revisions, version, lease and value (etcd's `mvccpb.KeyValue`).
pub use baton_proto::mvccpb::KeyValue;

pub use admin::{
    InspectResponse, ListLocksOptions, ListLocksResponse, LockEntry, LockSummary, Member,
    MemberListResponse, StatusResponse,
};
pub use auth::{AuthChannel, AuthToken, Credentials};
pub use barrier::{Barrier, DoubleBarrier};
pub use client::{Client, RequestId};
pub use config::{ClientConfig, ServerKind, TlsConfig};
pub use election::{Election, Leadership, ObserveStream};
pub use error::{Error, Result};
pub use exactly_once::{ExactlyOnce, Once, DEFAULT_RETRY_FOR};
pub use kv::{
    Compare, CompareOp, DeleteOptions, DeleteRangeResponse, GetOptions, Op, PutOptions,
    PutResponse, RangeResponse, SortOrder, SortTarget, Txn, TxnResponse,
};
pub use lease::{LeaseGrantResponse, LeaseTimeToLiveResponse};
pub use lost::LostReason;
pub use mutex::{FenceCheck, FenceGate, Guard, LockOptions, Mutex};
pub use queue::Queue;
pub use rwlock::RwLock;
pub use semaphore::{Permit, Semaphore};
pub use session::{Session, SessionOptions, SessionState};
pub use signed::{
    FenceKeys, KeyId, PublicKey, PublicKeys, PublicKeysParseError, Signature, SignedToken,
    VerifyError, FENCING_KEY_ALGORITHM,
};
pub use token::FencingToken;
pub use util::prefix_end;
pub use watch::{EventKind, WatchEvent, WatchOptions, WatchStream};
