//! The relay: publishes the outbox to a broker, at least once, in order per aggregate.
//!
//! One round ([`Relay::run_once`]):
//!
//! ```text
//!  read a batch (pending, below the xid horizon, (xid, seq) order)
//!    ──▶ publish: one chain per aggregate, in order, each waiting for the broker's ack
//!        before its next message; the chains run concurrently
//!    ──▶ one transaction: Fence::check, mark the acked rows sent, count the refused ones
//!        (backoff, or dead after the last attempt) ──▶ COMMIT
//! ```
//!
//! A crash (or a cancelled future) anywhere before that COMMIT leaves the batch pending, so
//! the next round publishes it again: the broker (NATS's `Nats-Msg-Id` window) or the
//! consumer's [`crate::pg::Inbox`] drops the duplicate. Nothing between the broker's ack and
//! the mark-sent can lose a message; the price is a duplicate.
//!
//! [`Publisher`] is the broker side (adapters: [`nats`] behind the feature `nats`, [`amqp`]
//! behind `amqp`); [`Fence`] guards the progress write. The default [`NoFence`] is correct
//! only while one relay at a time works on an outbox: two unfenced relays never lose a
//! message either, but they publish duplicates and may interleave one aggregate's messages
//! out of order. Several relays need [`PgFence`], a fencing token checked in PostgreSQL,
//! and [`ha::HaRelay`] (feature `baton`) runs one active relay per partition by a Baton
//! election whose fencing token it is.

#[cfg(feature = "amqp")]
pub mod amqp;
mod engine;
mod fence;
#[cfg(feature = "baton")]
pub mod ha;
#[cfg(feature = "nats")]
pub mod nats;
mod publisher;

pub use engine::{Relay, RelayConfig, RoundReport};
pub use fence::{Fence, FenceGrant, NoFence, PgFence};
pub use publisher::{PublishError, Publisher, AGGREGATE_HEADER};
