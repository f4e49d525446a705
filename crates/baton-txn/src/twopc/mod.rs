//! Two-phase commit that does not block (feature `twopc`).
//!
//! Classic 2PC has one fatal flaw: once every participant voted YES, only the coordinator
//! knows the decision, and if it dies the participants hold their locks until it comes back.
//! Here the decision is a write-once record in Baton's replicated log, so any coordinator
//! process, or the [`Recoverer`], can read it and finish the transaction (the idea of Gray and
//! Lamport's Paxos Commit, with Baton's Raft group as the acceptors).
//!
//! - [`Coordinator`] runs global transactions: enlist one local transaction ([`Branch`]) per
//!   database, then [`GlobalTx::commit`].
//! - [`BatonDecisionLog`] keeps each transaction's intent, decision and branch outcomes in
//!   Baton ([`DecisionLog`] is the trait; [`InMemoryDecisionLog`] exists to show what a
//!   log that dies with its process costs).
//! - [`Recoverer`] runs under a Baton election and finishes what dead or stalled
//!   coordinators left: it resolves prepared branches (`pg_prepared_xacts`, `XA RECOVER`) by
//!   the recorded decision and aborts undecided transactions past their deadline.
//! - Participants: [`pg::PgResource`] (PostgreSQL, `PREPARE TRANSACTION`; feature
//!   `postgres`), [`mariadb::MariaDbResource`] (MariaDB 10.5+, XA; feature `mariadb`), and the
//!   [`Resource`] / [`Branch`] traits for anything else that can prepare.
//!
//! ```no_run
//! # async fn example(client: baton_client::Client, pg_url: &str, maria_url: &str) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use baton_txn::twopc::{BatonDecisionLog, BranchId, Coordinator, Outcome, Resource};
//! use baton_txn::twopc::pg::PgResource;
//! use baton_txn::twopc::mariadb::{mysql_async::prelude::Queryable, MariaDbResource};
//!
//! let log = Arc::new(BatonDecisionLog::new(&client, "bank")?);
//! let pg = Arc::new(PgResource::new(BranchId::new("pg-ledger")?, pg_url.parse()?,
//!                                   baton_txn::pg::Schema::default()));
//! let maria = Arc::new(MariaDbResource::from_url(BranchId::new("maria-ledger")?, maria_url)?);
//! let coordinator = Coordinator::new(log).with_resource(pg.clone()).with_resource(maria.clone());
//! coordinator.preflight().await?; // max_prepared_transactions > 0, MariaDB >= 10.5, ...
//!
//! let mut tx = coordinator.begin();
//! let debit = pg.begin().await?;
//! debit.client().execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]).await?;
//! tx.enlist(debit)?;
//! let mut credit = maria.begin(&tx.gid(maria.id())).await?;
//! credit.conn().query_drop("UPDATE accounts SET balance = balance + 10 WHERE id = 7").await?;
//! tx.enlist(credit)?;
//! match tx.commit().await? {
//!     Outcome::Committed => {}
//!     Outcome::CommitDecided { pending } => { /* durable; recovery commits `pending` */ }
//!     Outcome::Aborted { reason, .. } => eprintln!("aborted: {reason}"),
//!     Outcome::Heuristic { .. } => { /* someone finished a branch by hand: page a human */ }
//! }
//! # Ok(()) }
//! ```
//!
//! # Invariants
//!
//! Each has a test against real servers (`tests/it/twopc_pg.rs`, `tests/it/twopc_bank.rs`,
//! `tests/it/mariadb_xa.rs`), crashes being real SIGKILLs of a coordinator process at named
//! [`FaultPoint`]s.
//!
//! 1. **Intent before PREPARE.** The log holds the transaction id, the exact GID of every
//!    branch and the decision deadline before the first PREPARE is sent. GIDs
//!    (`bt1:<namespace>:<tx>:<branch>`, [`Gid`]) are derived from logged data only, so every
//!    prepared branch found in a database leads back to its record.
//! 2. **One decision, written once.** The decision is `If create_revision(decision) = 0 Then
//!    Put Else Get` in Baton: the first writer wins, and every other caller — a coordinator
//!    that was paused, the Recoverer — gets the winner back and follows it.
//! 3. **Nothing prepared is rolled back before an abort decision has won.** The coordinator
//!    and the Recoverer roll back prepared branches only after the abort is in the log (for a
//!    prepared branch the log does not know: decide abort first, then roll back). Before the
//!    intent, and for a branch that was never prepared, the local transaction simply rolls
//!    back. So a coordinator paused at any point cannot disagree with recovery.
//! 4. **Phase 2 is idempotent and verified.** `COMMIT PREPARED` / `XA COMMIT` may run any
//!    number of times from any process; "no such prepared transaction" is checked against
//!    the branch's **marker row** (written inside the branch before PREPARE, so it exists
//!    iff the branch committed). A branch found finished against the decision (rolled back
//!    by hand after a commit decision, or the reverse) is a *heuristic* outcome: recorded,
//!    counted (`baton_txn_2pc_heuristic_total`), reported ([`Outcome::Heuristic`],
//!    `baton 2pc show`) — never retried.
//! 5. **Recovery finishes everything.** The Recoverer resolves every prepared branch of its
//!    namespace by the recorded decision (including a PREPARE that landed after its
//!    transaction was aborted) and aborts undecided transactions past their deadline.
//!    Prepared transactions of other namespaces and other software are never touched.
//! 6. **A deposed Recoverer cannot write the log.** It runs under a Baton election and every
//!    log write carries its [`LeaderFence`](crate::coordination::LeaderFence) compare, so a
//!    Recoverer paused past its session finds its decision and branch writes refused. Its
//!    database actions need no fence: they only apply a decision already in the log.
//!
//! Why the deadline does not need synchronized clocks: the Recoverer decides *abort* only by
//! compare-and-set, so an early abort (a fast Recoverer clock) costs a transaction that could
//! have committed, never atomicity.
//!
//! Costs: one intent, one decision and one close write in Baton per transaction, plus a
//! branch record per branch; phase 2 runs branch by branch in intent order (a crash between
//! branches leaves a fixed state for recovery).
//!
//! Metrics (the `metrics` crate, label `namespace`): `baton_txn_2pc_decision_seconds`
//! (histogram, from the intent to the decision), `baton_txn_2pc_in_doubt_branches` (gauge:
//! prepared branches the Recoverer found at its last pass), `baton_txn_2pc_undecided_transactions`
//! (gauge), `baton_txn_2pc_outcomes_total{outcome}` and `baton_txn_2pc_heuristic_total`.

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
