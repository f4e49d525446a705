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
//! - [`pg::Outbox`] — the producer side: `enqueue(tx, message)` writes a message in the
//!   business transaction, so it exists if and only if the business change committed.
//! - [`relay::Relay`] — publishes the outbox to a broker through a [`relay::Publisher`]:
//!   [`relay::nats::JetStreamPublisher`] (feature `nats`) and [`relay::amqp::AmqpPublisher`]
//!   (feature `amqp`), its progress writes guarded by a [`relay::Fence`].
//! - [`relay::PgFence`] — the fence for several relays: a fencing token checked and raised
//!   in PostgreSQL inside the mark-sent transaction; and [`relay::ha::HaRelay`] (feature
//!   `baton`) — one active relay per outbox partition, chosen by a Baton election whose
//!   fencing token is the fence's token.
//! - [`twopc`] (feature `twopc`) — two-phase commit that does not block: the decision is a
//!   write-once record in Baton, so any coordinator or the Recoverer (under a Baton election)
//!   finishes a transaction whose coordinator died; PostgreSQL (`PREPARE TRANSACTION`) and
//!   MariaDB (XA, feature `mariadb`) participants with marker rows that tell a committed
//!   branch from one rolled back by hand. See [Two-phase commit](#two-phase-commit).
//! - [`saga`] (feature `saga`) — a saga orchestrator: ordered steps with compensations,
//!   retries and timeouts, the saga log in Baton, reverse-order compensation, stuck sagas
//!   parked for an operator (`baton saga`), orchestrators under a Baton election whose fence
//!   guards every write; with `postgres` also [`saga::StepFence`], the participant's
//!   exactly-once guard. See [Sagas](#sagas).
//!
//! The PostgreSQL code sits behind the `postgres` feature, the HTTP layer behind `axum` and
//! each broker client behind its own feature, so the plain crate (keys, fingerprints, stored
//! responses) builds without a database driver and a PostgreSQL-only user builds no broker
//! client; Baton's client (for [`relay::ha`]) comes with the feature `baton`.
//!
//! # Invariants
//!
//! The idempotency store keeps one row per `(tenant, key)`; its `state` is `in_flight` or
//! `done`. These hold for every interleaving of requests, crashes and retries, and each has a
//! test in `tests/it/` against a real PostgreSQL:
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
//!
//! # The outbox and its relay
//!
//! Each outbox row records `seq` (a sequence, taken at insert) and `xid`, the enqueuing
//! transaction's 64-bit id (`pg_current_xact_id()`, type `xid8`, which never wraps). The
//! *outbox order* is `(xid, seq)`. These hold, each tested against real servers:
//!
//! 8. **A message exists if and only if its business transaction committed**: `enqueue`
//!    takes the business transaction, and the relay sees only committed rows.
//! 9. **No committed row is ever skipped or overtaken.** A sequence alone cannot say what is
//!    safe to publish: sequence numbers are taken at insert but become visible at commit, so
//!    transaction A can take `seq` 1, B take 2 and commit first, and a relay that publishes
//!    "everything after the last `seq` I sent" moves past 1 before A commits — A's message
//!    is skipped for ever (or, with per-row states, published after 2: out of order). The
//!    relay therefore reads only rows whose `xid` is below the snapshot's `xmin`
//!    (`pg_snapshot_xmin(pg_current_snapshot())`, the oldest transaction still running):
//!    every transaction below that horizon has ended, so the set of rows below it is final —
//!    no commit can add a row in front of one the relay has read. In the example, B's row
//!    waits until A ends, then both go out, A's first. The cost: one long-running
//!    transaction anywhere on the server (or a forgotten prepared one) holds every outbox
//!    back until it ends; the lag gauges show it.
//! 10. **Publishing is at least once; the effect is once.** A row is marked `sent` only after
//!     the broker acknowledged it (JetStream's publish ack, RabbitMQ's publisher confirm for a
//!     `mandatory`, persistent message), in a transaction of its own after the publishes. A
//!     relay that dies between the ack and that commit leaves the rows pending and the next
//!     round publishes them again under the same message id: JetStream drops the repeat within
//!     its duplicate window (`Nats-Msg-Id`), and a consumer's [`pg::Inbox`] drops it anyway.
//! 11. **Order per aggregate.** Messages of one aggregate are published in outbox order, each
//!     only after the previous one of its aggregate was acknowledged (one chain per aggregate;
//!     chains of different aggregates run concurrently). A message the broker refuses holds
//!     its aggregate back — later ones wait through its backoff — until it is published or
//!     becomes a dead letter; other aggregates go on. The outbox order is the order in which the
//!     enqueuing transactions got their ids, then insert order within one transaction; for one
//!     aggregate that is the business order when its transactions serialise on the aggregate
//!     (the usual `SELECT … FOR UPDATE` of its row) with that lock as their first write. A
//!     transaction that wrote something else first holds an older id and is ordered by it.
//! 12. **A refused message ends visibly.** A refusal (no stream for the subject, returned as
//!     unroutable, nacked, a missing exchange) counts an attempt and backs off exponentially
//!     with jitter; after `max_attempts` the row's state is `dead` with the last error
//!     ([`pg::Outbox::dead_letters`], [`pg::Outbox::requeue`]). An outage of the broker or the
//!     database is not the message's fault and never counts: the relay waits and reconnects.
//! 13. **Progress writes pass the fence.** Marking sent and counting attempts happen in one
//!     transaction that first calls [`relay::Fence::check`]; a deposed relay's check fails and
//!     its writes roll back. The default [`relay::NoFence`] accepts everything and is right only
//!     for a single relay; with it, two relays never lose a message but may duplicate and
//!     reorder.
//! 14. **One active relay per partition; a deposed one cannot write.** [`pg::Outbox::partition`]
//!     splits the aggregates by `hashtext(aggregate) mod n` (computed by PostgreSQL, so all
//!     relays agree); [`relay::ha::HaRelay`] campaigns for each partition in a Baton election
//!     with a session (a lease kept alive in the background), and the winner raises the
//!     partition's [`relay::PgFence`] row to its fencing token (the leader key's create
//!     revision, larger for every later leader) before publishing anything. Every progress
//!     transaction's first write is `INSERT … ON CONFLICT DO UPDATE … WHERE token <= mine
//!     RETURNING`, which locks the row to COMMIT or finds a newer token and rolls back
//!     ([`Error::Fenced`]). The check must be a statement of *that* transaction, in the
//!     database being written: the session's lease can only tell a *running* process to stop;
//!     a relay paused (SIGSTOP, a stall) between any earlier check and its write wakes up
//!     still believing it leads, and nothing but the storage can refuse the write at that
//!     moment. The deposed relay may have published in the meantime: duplicates (dropped by
//!     JetStream or the inbox) and, because every relay publishes an aggregate in order and
//!     only after the previous message was acked, no reordering of first copies.
//!
//! # Baton's own idempotency: exactly-once writes to Baton
//!
//! Baton itself de-duplicates client requests, the same idea applied to its replicated
//! state: a write sent through `baton.v1.ExactlyOnce` (`baton_client::Client::exactly_once`)
//! carries `(client session, sequence number)`, and the *state machine* — replicated, so
//! every member and every later leader decides alike, across restarts and snapshots — applies
//! each sequence once and answers a retry with the cached first answer (`Once::replayed`).
//! A client whose connection broke or whose leader died retries the same sequence through any
//! member until it gets an answer: the write takes effect exactly once. Answers are cached
//! until the client acknowledges them; sessions expire after an idle timeout (10 minutes by
//! default); both tables are bounded, and a retry whose answer was evicted fails with
//! `StaleSequence` rather than applying twice (see `baton-core/src/clients.rs` and
//! ARCHITECTURE.md). Plain etcd-API writes keep etcd's at-least-once ambiguity. Use it for
//! state kept *in Baton* (configuration, counters, the fence gate); use this crate's
//! idempotency keys and inbox for effects in PostgreSQL, where the dedup record must commit
//! with the effect.
//!
//! # Two-phase commit
//!
//! Seed 003 names 2PC's fatal flaw: after every participant voted YES, only the coordinator
//! knows the decision, and a dead coordinator leaves them holding locks, unable to decide.
//! [`twopc`] writes the decision once, by compare-and-set, into Baton's replicated log, so
//! any process can read it and finish (Gray and Lamport's Paxos Commit, with Baton's Raft
//! group as the acceptors). Its invariants (listed in full in [`twopc`]): the intent with
//! every exact GID is logged before any PREPARE; one decision, and a loser follows the
//! winner; nothing prepared is rolled back before an abort decision has won; phase 2 is
//! idempotent and checked against a marker row per branch, and a branch finished against
//! the decision is reported as a heuristic outcome, never retried; the Recoverer resolves
//! every prepared branch of its namespace and aborts undecided transactions past their
//! deadline, its log writes fenced by its election. `baton 2pc list|show` shows the log.
//!
//! # Sagas
//!
//! A saga ([`saga`], feature `saga`) splits a business transaction across services into
//! local transactions with compensations — the seed's order: create order → charge card →
//! reserve stock → schedule shipment; when reserve fails, refund, then cancel. Its log is one
//! JSON record per saga in Baton (`baton-txn/<namespace>/saga/<id>`), so any orchestrator
//! can finish what another started. These hold, each tested against a real Baton and
//! PostgreSQL with the orchestrator SIGKILLed at every step boundary (the full list is in
//! [`saga`]'s documentation):
//!
//! 15. **Recorded before and after every attempt, one key per step.** An attempt is written
//!     as running before its action is called; a new orchestrator re-runs an unrecorded one
//!     with the same idempotency key (`<namespace>/<saga>/<step>`), and the participant's
//!     [`saga::StepFence`] (a row committed with the effect) applies it once. The fence also
//!     tolerates an empty compensation and rejects an action that arrives after its
//!     compensation (a timeout's late arrival).
//! 16. **Compensation runs in reverse order, one step at a time, and is never dropped.** A
//!     compensation that keeps failing parks the saga as `Stuck` (gauge
//!     `baton_txn_saga_stuck`, `baton saga list`) until an operator retries it or skips it
//!     with a reason, kept in the record's audit trail. Cancelling a saga compensates too.
//! 17. **A deposed orchestrator cannot advance a saga.** Orchestrators campaign in a Baton
//!     election; each write is a compare-and-set on the record that also compares the leader
//!     key's create revision ([`coordination::LeaderFence`]), so a paused or partitioned
//!     ex-leader's next write — and with it its next attempt — is refused by the store.
//!
//! Metrics (the `metrics` crate, label `schema`): `baton_txn_outbox_pending_rows` (the lag),
//! `baton_txn_outbox_oldest_pending_seconds`, `baton_txn_outbox_dead_rows`,
//! `baton_txn_outbox_published_total`, `baton_txn_outbox_publish_failures_total{kind}`,
//! `baton_txn_outbox_dead_lettered_total`, and `baton_txn_outbox_broker_duplicates_total`
//! (JetStream's "duplicate" acks). The sagas' metrics are listed in [`saga`].

#![warn(missing_docs)]

mod error;
mod fingerprint;
mod key;
mod response;

#[cfg(feature = "coordination")]
pub mod coordination;
#[cfg(feature = "axum")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod pg;
#[cfg(feature = "postgres")]
pub mod relay;
#[cfg(feature = "saga")]
pub mod saga;
#[cfg(feature = "twopc")]
pub mod twopc;

pub use error::Error;
pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, KeyError};
pub use response::StoredResponse;
