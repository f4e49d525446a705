//! The PostgreSQL stores (feature `postgres`), over `tokio-postgres`.
//!
//! Every table lives in one schema of the caller's choice ([`Schema`], `baton_txn` by
//! default), created by [`Schema::migrate`]. Calls that must be part of the caller's work take
//! a `&Transaction` — that is what makes the dedup record and the effect commit together;
//! calls that must *not* be (claiming a key, releasing it, purging) take a `&Client` and run as
//! statements of their own.
//!
//! Each store (`idempotency`, `inbox`, `outbox`) adds its tables as an entry of
//! [`Schema::migrate`]'s list.

mod idempotency;
mod inbox;
mod outbox;
mod schema;

pub use idempotency::{Claim, Execution, IdempotencyConfig, IdempotencyStore, Outcome, RunError};
pub use inbox::Inbox;
pub use outbox::{DeadLetter, Message, Outbox, OutboxMessage, OutboxStats};
pub use schema::Schema;
pub use tokio_postgres::{Client, Transaction};
