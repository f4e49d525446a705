//! Exactly-once *effects* over at-least-once delivery.
//!
//! A network cannot deliver a message exactly once: a sender that lost the acknowledgement
//! cannot tell a lost request from a lost answer, so it either gives up (at most once) or
//! retries (at least once). What can be made exactly once is the effect: deliver at least once
//! and let the receiver recognise a repeat by a *dedup record written in the same local
//! transaction as the effect*. This crate supplies those dedup records for PostgreSQL:
//!
//! - [`pg::IdempotencyStore`] — idempotency keys for requests (Stripe's semantics and the
//!   IETF `Idempotency-Key` draft's status codes): the first request with a key runs, every
//!   retry gets the stored response, a concurrent duplicate is told it is in flight (409) or
//!   waits, the same key with a different request is refused (422).
//! - [`pg::Inbox`] — the consumer side of messaging: `first_time(tx, consumer, message_id)`
//!   inside the consumer's transaction; a redelivered message finds its row and is skipped.
//! - [`http`] (feature `axum`) — a tower layer that applies idempotency keys to an HTTP
//!   service, with a handler-side helper that stores the response in the handler's own
//!   transaction.
//!
//! Later parts of the same toolkit (issue 7) fit beside these: a transactional outbox
//! (`pg::outbox`, `enqueue(tx, message)` in the business transaction) and a relay publishing
//! it to NATS JetStream and RabbitMQ under a Baton election with fenced writes (`relay`).
//! The PostgreSQL code sits behind the `postgres` feature and the HTTP layer behind `axum`, so
//! the plain crate (keys, fingerprints, stored responses) builds without a database driver.
//!
//! # Invariants
//!
//! The idempotency store keeps one row per `(tenant, key)`; its `state` is `in_flight` or
//! `done`. These hold for every interleaving of requests, crashes and retries, and each has a
//! test in `tests/` against a real PostgreSQL:
//!
//! 1. **The work, the `done` state and the stored response commit together.** The work runs in
//!    a transaction that also moves the row to `done` with the response
//!    ([`pg::Execution::commit`]). A crash before that commit rolls the work back with it; a
//!    crash after it leaves a response that every retry replays. There is no moment at which
//!    the work is durable but the key says "not done".
//! 2. **A claim is fenced by a token.** Claiming writes (and commits, on its own) an
//!    `in_flight` row with a fresh random `claim_token` and a lease (`locked_until`). Storing
//!    the response is `UPDATE … WHERE claim_token = ours AND state = 'in_flight'`; if another
//!    request took the key over, that update matches nothing and the work transaction is
//!    rolled back ([`Error::ClaimLost`]). So at most one claimant's work ever commits, however
//!    late a slow one wakes up.
//! 3. **A live execution is never taken over.** The work transaction locks the claim row
//!    first ([`pg::Execution::begin`]); a takeover skips locked rows (`FOR UPDATE SKIP
//!    LOCKED`). A request that is slow but alive keeps its claim past its lease; only a
//!    request whose transaction has ended (crashed, cancelled, connection gone: PostgreSQL
//!    rolls it back and drops the lock) can lose it.
//! 4. **A crashed claim expires.** An `in_flight` row whose lease has run out and which no
//!    transaction locks is taken over by the next retry with the same request, which then runs
//!    the work — once, because of 2. Until then retries are told "in flight" with the time
//!    left (the lesson of Powertools' stuck INPROGRESS records).
//! 5. **A failure that changed nothing is forgotten.** When the work fails without storing a
//!    response, its transaction rolls back and the claim is released (the row deleted, fenced
//!    by the token), so the retry runs at once; only responses the work chose to store are
//!    replayed (a 4xx after execution started may be stored, a rolled-back 5xx never is).
//! 6. **A key means one request.** The row keeps the request's fingerprint; the same key with
//!    another fingerprint is a [`pg::Claim::Mismatch`], in flight or done, and runs nothing.
//! 7. **Keys are scoped per tenant and retained for a fixed time.** `(tenant, key)` is the
//!    primary key, so tenants never see each other's responses. A key older than its
//!    retention (24 h by default) is a new request whether or not [`pg::IdempotencyStore::purge`]
//!    has deleted it yet, so behaviour never depends on when the purge ran.
//!
//! All times (leases, retention) are PostgreSQL's `now()`, never the client's clock, so clients
//! with skewed clocks agree.
//!
//! The inbox keeps one row per `(consumer, message_id)`, inserted with `ON CONFLICT DO NOTHING`
//! in the consumer's transaction: the effect and the "seen" mark commit or roll back together,
//! and a concurrent duplicate waits on the unique index for the first one's outcome.

#![warn(missing_docs)]

mod error;
mod fingerprint;
mod key;
mod response;

#[cfg(feature = "axum")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod pg;
#[cfg(feature = "postgres")]
pub mod relay;

pub use error::Error;
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyError};
pub use response::StoredResponse;
