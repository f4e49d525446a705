//! The consumer-side dedup record: one row per `(consumer, message_id)`.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, Transaction};

use super::schema::Schema;
use crate::Error;

/// Remembers which messages a consumer has applied, in the consumer's own transaction.
///
/// Broker delivery is at least once (a redelivery after a lost ack, a relay that republishes
/// after a crash); the effect is once when the consumer does
///
/// ```text
/// BEGIN
///   if inbox.first_time(tx, "billing", msg.id) { apply the message's effect in tx }
/// COMMIT, then ack the broker
/// ```
///
/// The "seen" row and the effect commit or roll back together, so a crash anywhere leaves
/// either both (the redelivery is skipped) or neither (it is applied). Acking only after the
/// commit is what keeps the message from being lost. Two deliveries racing in two
/// transactions: the second waits on the unique index until the first commits (then it sees
/// `false`) or rolls back (then `true`).
#[derive(Clone)]
pub struct Inbox {
    insert: Arc<str>,
    purge: Arc<str>,
}

impl Inbox {
    /// The inbox table of `schema` (create it with [`Schema::migrate`]).
    pub fn new(schema: &Schema) -> Self {
        Inbox {
            insert: schema
                .sql(
                    "INSERT INTO {s}.inbox (consumer, message_id) VALUES ($1, $2)
                     ON CONFLICT (consumer, message_id) DO NOTHING",
                )
                .into(),
            purge: schema
                .sql(
                    "DELETE FROM {s}.inbox WHERE (consumer, message_id) IN (
                         SELECT consumer, message_id FROM {s}.inbox
                         WHERE received_at < now() - make_interval(secs => $1)
                         LIMIT $2)",
                )
                .into(),
        }
    }

    /// `true` if `consumer` has not seen `message_id` (and now has, once `tx` commits);
    /// `false` for a duplicate, whose effect must be skipped. Consumers are independent: each
    /// sees every message once.
    pub async fn first_time(
        &self,
        tx: &Transaction<'_>,
        consumer: &str,
        message_id: &str,
    ) -> Result<bool, Error> {
        Ok(tx.execute(&*self.insert, &[&consumer, &message_id]).await? == 1)
    }

    /// Forgets messages seen more than `older_than` ago and returns how many. Keep
    /// `older_than` well above the longest time a duplicate can still arrive (the broker's
    /// redelivery and the relay's retry horizon), or a late duplicate is applied again.
    pub async fn purge(&self, client: &Client, older_than: Duration) -> Result<u64, Error> {
        let secs = older_than.as_secs_f64();
        let batch: i64 = 10_000;
        let mut total = 0;
        loop {
            let n = client.execute(&*self.purge, &[&secs, &batch]).await?;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
        }
    }
}
