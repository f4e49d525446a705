//! The broker side of the relay: [`Publisher`], what a publish may fail with, and the header
//! every adapter sets.

use std::future::Future;
use std::sync::Arc;

use crate::pg::OutboxMessage;

/// The header that carries a message's aggregate to the consumer (both adapters set it), so
/// a consumer can check or restore per-aggregate order without parsing the payload.
pub const AGGREGATE_HEADER: &str = "Baton-Aggregate";

/// Why a publish did not happen.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// The broker refused this message (no stream for the subject, an unroutable `mandatory`
    /// message returned, a nack, a missing exchange). Counts as an attempt: after
    /// [`RelayConfig::max_attempts`](super::RelayConfig::max_attempts) the message becomes a dead letter.
    #[error("refused by the broker: {0}")]
    Rejected(String),
    /// The broker could not be reached or did not answer in time. Not the message's fault, so
    /// not an attempt: the relay waits and tries again, however long the outage.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
}

/// A broker adapter. `publish` returns only once the broker has taken responsibility for the
/// message (JetStream's publish ack, RabbitMQ's publisher confirm); `Ok` before that would let
/// the relay mark a message sent that the broker may still drop.
///
/// The relay calls it concurrently for different aggregates and never for two messages of
/// one aggregate at once. The future is `Send` so that a relay can run on a spawned task.
pub trait Publisher: Send + Sync {
    /// Publishes `message` to `message.topic`, its id as the broker's de-duplication id where
    /// the broker has one.
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send;
}

/// One publisher shared by several relays (one per partition, `ha::HaRelay`): a broker
/// connection is multiplexed, so partitions need not each open their own.
impl<P: Publisher> Publisher for Arc<P> {
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        (**self).publish(message)
    }
}
