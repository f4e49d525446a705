//! The RabbitMQ publisher (feature `amqp`), AMQP 0-9-1 over lapin.
//!
//! A publish counts only when RabbitMQ confirms it: the channel is in confirm mode, every
//! message is `mandatory` and persistent, and the relay waits for the confirm. A confirm
//! that comes with the message returned (no queue bound for the routing key) or a nack is
//! a refusal, as is a channel closed by RabbitMQ over this message (a missing exchange,
//! 404). RabbitMQ has no de-duplication of its own (its dedup plugin is not used), so a
//! republished message reaches the consumer twice: the consumer's [`crate::pg::Inbox`],
//! keyed by the AMQP `message_id` property (the outbox id), drops the repeat.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::publisher::{PublishError, Publisher, AGGREGATE_HEADER};
use crate::pg::OutboxMessage;

/// AMQP delivery mode 2: the broker writes the message to disk (in a durable queue) before
/// it confirms.
const PERSISTENT: u8 = 2;

/// Publishes to one exchange with publisher confirms; the message's topic is the routing
/// key. Reconnects (connection, or just the channel) when RabbitMQ closed either.
pub struct AmqpPublisher {
    uri: String,
    exchange: String,
    link: Mutex<Option<(Connection, Channel)>>,
}

impl AmqpPublisher {
    /// A publisher to `exchange` (`""`: the default exchange, routing by queue name) of the
    /// broker at `uri` (`amqp://user:pass@host:port/vhost`). Connects on first use.
    pub fn new(uri: impl Into<String>, exchange: impl Into<String>) -> Self {
        AmqpPublisher {
            uri: uri.into(),
            exchange: exchange.into(),
            link: Mutex::new(None),
        }
    }

    /// A channel in confirm mode, opened (with its connection if need be) when there is none
    /// or RabbitMQ closed the last one.
    async fn channel(&self) -> Result<Channel, PublishError> {
        let mut link = self.link.lock().await;
        if let Some((connection, channel)) = link.as_mut() {
            if channel.status().connected() {
                return Ok(channel.clone());
            }
            if connection.status().connected() {
                *channel = open_channel(connection).await?;
                return Ok(channel.clone());
            }
        }
        let connection = Connection::connect(&self.uri, ConnectionProperties::default())
            .await
            .map_err(|e| PublishError::Unavailable(format!("connecting to RabbitMQ: {e}")))?;
        let channel = open_channel(&connection).await?;
        *link = Some((connection, channel.clone()));
        Ok(channel)
    }
}

async fn open_channel(connection: &Connection) -> Result<Channel, PublishError> {
    let channel = connection.create_channel().await.map_err(unavailable)?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(unavailable)?;
    Ok(channel)
}

fn unavailable(e: lapin::Error) -> PublishError {
    PublishError::Unavailable(e.to_string())
}

/// A soft error (a channel-level one: 404 no such exchange, 403, 406) is about what was
/// published; anything else is the connection's.
fn classify(e: lapin::Error) -> PublishError {
    if e.is_amqp_soft_error() {
        PublishError::Rejected(e.to_string())
    } else {
        PublishError::Unavailable(e.to_string())
    }
}

impl Publisher for AmqpPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        let channel = self.channel().await?;
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            headers.insert(
                ShortString::from(name.as_str()),
                AMQPValue::LongString(LongString::from(value.as_str())),
            );
        }
        headers.insert(
            ShortString::from(AGGREGATE_HEADER),
            AMQPValue::LongString(LongString::from(message.aggregate.as_str())),
        );
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from(message.id.as_str()))
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers);
        let confirm = channel
            .basic_publish(
                ShortString::from(self.exchange.as_str()),
                ShortString::from(message.topic.as_str()),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.payload,
                properties,
            )
            .await
            .map_err(classify)?
            .await
            .map_err(classify)?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(PublishError::Rejected(format!(
                "returned unroutable: {} {}",
                returned.reply_code, returned.reply_text
            ))),
            Confirmation::Nack(_) => Err(PublishError::Rejected("nacked by RabbitMQ".into())),
            Confirmation::NotRequested => Err(PublishError::Unavailable(
                "the channel is not in confirm mode".into(),
            )),
        }
    }
}
