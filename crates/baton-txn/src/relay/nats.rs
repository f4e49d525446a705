//! The NATS JetStream publisher (feature `nats`).
//!
//! Each message is published with `Nats-Msg-Id` set to the outbox message id, so a stream
//! stores it once however often the relay sends it within the stream's duplicate window
//! (`duplicate_window`, 2 minutes by default): a relay that crashed between the publish ack
//! and its mark-sent, or lost the ack, republishes and the stream answers "duplicate". The
//! window therefore must outlast the longest time a message can stay unmarked (a relay's
//! restart plus its backoff); beyond it, the consumers' [`crate::pg::Inbox`] is what drops
//! the repeat.
//!
//! NATS 2.9–2.10 have a known flaw in clustered streams (nats-server #6415): after a leader
//! change, a message id that was never stored can be taken for a duplicate until the window
//! passes, and then the message is acknowledged but missing. A single server, as in the
//! tests, has no leader changes.

use std::sync::atomic::{AtomicU64, Ordering};

use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::HeaderMap;

use super::publisher::{PublishError, Publisher, AGGREGATE_HEADER};
use crate::pg::OutboxMessage;

/// Publishes to JetStream and waits for each message's publish ack.
pub struct JetStreamPublisher {
    js: jetstream::Context,
    duplicates: AtomicU64,
}

impl JetStreamPublisher {
    /// Over an existing connection.
    pub fn new(client: async_nats::Client) -> Self {
        JetStreamPublisher {
            js: jetstream::new(client),
            duplicates: AtomicU64::new(0),
        }
    }

    /// Connects to `url` (`nats://host:port`). The client reconnects by itself after an
    /// outage; publishes meanwhile fail as unavailable and are retried.
    pub async fn connect(url: &str) -> Result<Self, PublishError> {
        let client = async_nats::connect(url)
            .await
            .map_err(|e| PublishError::Unavailable(format!("connecting to {url}: {e}")))?;
        Ok(JetStreamPublisher::new(client))
    }

    /// The JetStream context, to create streams or read them.
    pub fn context(&self) -> &jetstream::Context {
        &self.js
    }

    /// How many publishes the stream acknowledged as duplicates (a message sent again after
    /// a crash or a lost ack, and dropped by the stream).
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
}

fn classify(kind: PublishErrorKind, error: String) -> PublishError {
    match kind {
        // The broker is there but has nowhere (or no room) to put this message.
        PublishErrorKind::StreamNotFound
        | PublishErrorKind::WrongLastMessageId
        | PublishErrorKind::WrongLastSequence
        | PublishErrorKind::MaxPayloadExceeded => PublishError::Rejected(error),
        // `Other` covers the stream's own refusals (`-ERR`/JetStream API errors) but also
        // odd transport states; count them as refusals, which back off and end in the dead
        // letters only after many attempts.
        PublishErrorKind::Other => PublishError::Rejected(error),
        _ => PublishError::Unavailable(error),
    }
}

impl Publisher for JetStreamPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &message.headers {
            headers.append(name.as_str(), value.as_str());
        }
        headers.insert("Nats-Msg-Id", message.id.as_str());
        headers.insert(AGGREGATE_HEADER, message.aggregate.as_str());
        let ack = self
            .js
            .publish_with_headers(
                message.topic.clone(),
                headers,
                message.payload.clone().into(),
            )
            .await
            .map_err(|e| classify(e.kind(), e.to_string()))?
            .await
            .map_err(|e| classify(e.kind(), e.to_string()))?;
        if ack.duplicate {
            self.duplicates.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("baton_txn_outbox_broker_duplicates_total").increment(1);
        }
        Ok(())
    }
}
