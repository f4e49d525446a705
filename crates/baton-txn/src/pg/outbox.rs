//! The transactional outbox: messages written in the business transaction, published later by
//! the [`crate::relay::Relay`]. The invariants are in the crate docs; this file is the table
//! and the statements on it.
//!
//! Life of a row in `<schema>.outbox`:
//!
//! ```text
//!  enqueue (in the business tx) ──COMMIT──▶ pending ──published and acked──▶ sent ──purge──▶ gone
//!                                             │  ▲
//!                          publish refused:   │  │ backoff over
//!                          attempts += 1      ▼  │
//!                                           pending (next_attempt_at in the future,
//!                                             │      its aggregate held back)
//!                                             │ attempts reach the limit
//!                                             ▼
//!                                            dead ──requeue (by an operator)──▶ pending
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_postgres::{Client, Row, Transaction};

use super::schema::Schema;
use crate::Error;

/// A message to enqueue: what the business transaction wants published once it commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The message id, which consumers and brokers de-duplicate by. `None`: a random UUID
    /// chosen by PostgreSQL. Give one of your own when the message has a natural identity
    /// (an event id), so that enqueuing it twice fails on the unique index instead of
    /// publishing it twice.
    pub id: Option<String>,
    /// The ordering key: messages of one aggregate are published in the order of their
    /// transactions (see the crate docs), messages of different aggregates independently.
    pub aggregate: String,
    /// The NATS subject or the AMQP routing key.
    pub topic: String,
    /// Headers passed on to the broker with the message.
    pub headers: Vec<(String, String)>,
    /// The body, opaque to the outbox.
    pub payload: Vec<u8>,
}

impl Message {
    /// A message for `topic` about `aggregate`, with a generated id and no headers.
    pub fn new(
        aggregate: impl Into<String>,
        topic: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Message {
            id: None,
            aggregate: aggregate.into(),
            topic: topic.into(),
            headers: Vec::new(),
            payload: payload.into(),
        }
    }

    /// The same message with the id `id`.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The same message with one more header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// A message as the relay reads it from the outbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Position in the table (a sequence, assigned at insert; not the publishing order on its
    /// own, see the crate docs).
    pub seq: i64,
    /// The message id: the broker's and the consumers' de-duplication key.
    pub id: String,
    /// The ordering key.
    pub aggregate: String,
    /// Subject or routing key.
    pub topic: String,
    /// The enqueuer's headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub payload: Vec<u8>,
    /// When the business transaction enqueued it (PostgreSQL's clock).
    pub created_at: SystemTime,
    /// Failed publishing attempts so far.
    pub attempts: i32,
}

impl OutboxMessage {
    fn from_row(row: &Row) -> Self {
        let names: Vec<String> = row.get("header_names");
        let values: Vec<String> = row.get("header_values");
        OutboxMessage {
            seq: row.get("seq"),
            id: row.get("id"),
            aggregate: row.get("aggregate"),
            topic: row.get("topic"),
            headers: names.into_iter().zip(values).collect(),
            payload: row.get("payload"),
            created_at: row.get("created_at"),
            attempts: row.get("attempts"),
        }
    }
}

/// A message the relay gave up on after its last attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The message as it was enqueued.
    pub message: OutboxMessage,
    /// The broker's (or the publisher's) last refusal.
    pub last_error: String,
    /// When it was given up.
    pub dead_at: SystemTime,
}

/// Counts for monitoring (the relay exports them as metrics).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutboxStats {
    /// Messages committed but not yet published: the relay's lag, in rows.
    pub pending: i64,
    /// Messages given up on (dead letters).
    pub dead: i64,
    /// Age of the oldest pending message (zero when none is pending).
    pub oldest_pending_age: Duration,
}

struct Sql {
    enqueue: String,
    batch: String,
    stats: String,
    dead: String,
    requeue: String,
    purge: String,
    mark_sent: String,
    mark_failed: String,
}

/// The outbox table of one schema (create it with [`Schema::migrate`]). Cheap to clone.
#[derive(Clone)]
pub struct Outbox {
    sql: Arc<Sql>,
    schema: Schema,
    partition: Option<(u32, u32)>,
}

const COLUMNS: &str =
    "seq, id, aggregate, topic, header_names, header_values, payload, created_at, attempts";

impl Outbox {
    /// The outbox of `schema`.
    pub fn new(schema: &Schema) -> Self {
        Outbox::build(schema, None)
    }

    fn build(schema: &Schema, partition: Option<(u32, u32)>) -> Self {
        let filter = match partition {
            Some((index, count)) => {
                format!("AND mod(abs(hashtext(o.aggregate)::bigint), {count}) = {index}")
            }
            None => String::new(),
        };
        let sql = Sql {
            enqueue: schema.sql(
                "INSERT INTO {s}.outbox (id, aggregate, topic, header_names, header_values, payload)
                 VALUES (coalesce($1, gen_random_uuid()::text), $2, $3, $4, $5, $6)
                 RETURNING id",
            ),
            // Below the horizon (every transaction with a smaller id has ended, so no row can
            // still appear before the ones read), in (xid, seq) order, leaving out whole
            // aggregates whose head is waiting out a backoff.
            batch: schema.sql(&format!(
                "SELECT {COLUMNS} FROM {{s}}.outbox o
                 WHERE o.state = 'pending' {filter}
                   AND o.xid < pg_snapshot_xmin(pg_current_snapshot())
                   AND NOT EXISTS (
                       SELECT 1 FROM {{s}}.outbox b
                       WHERE b.state = 'pending' AND b.attempts > 0
                         AND b.aggregate = o.aggregate AND b.next_attempt_at > now())
                 ORDER BY o.xid, o.seq
                 LIMIT $1"
            )),
            stats: schema.sql(
                "SELECT
                     count(*) FILTER (WHERE state = 'pending'),
                     count(*) FILTER (WHERE state = 'dead'),
                     coalesce(extract(epoch FROM now() - min(created_at)
                                      FILTER (WHERE state = 'pending'))::float8, 0)
                 FROM {s}.outbox WHERE state IN ('pending', 'dead')",
            ),
            dead: schema.sql(&format!(
                "SELECT {COLUMNS}, last_error, dead_at FROM {{s}}.outbox
                 WHERE state = 'dead' ORDER BY seq LIMIT $1"
            )),
            requeue: schema.sql(
                "UPDATE {s}.outbox
                 SET state = 'pending', attempts = 0, next_attempt_at = now(), dead_at = NULL
                 WHERE id = $1 AND state = 'dead'",
            ),
            purge: schema.sql(
                "DELETE FROM {s}.outbox WHERE seq IN (
                     SELECT seq FROM {s}.outbox
                     WHERE state = 'sent' AND sent_at < now() - make_interval(secs => $1)
                     LIMIT $2)",
            ),
            mark_sent: schema.sql(
                "UPDATE {s}.outbox SET state = 'sent', sent_at = now()
                 WHERE seq = ANY($1) AND state = 'pending'",
            ),
            // $3: the backoff before the next attempt, in seconds; $4: the attempt limit.
            mark_failed: schema.sql(
                "UPDATE {s}.outbox
                 SET attempts = attempts + 1,
                     last_error = $2,
                     next_attempt_at = now() + make_interval(secs => $3),
                     state = CASE WHEN attempts + 1 >= $4 THEN 'dead' ELSE 'pending' END,
                     dead_at = CASE WHEN attempts + 1 >= $4 THEN now() END
                 WHERE seq = $1 AND state = 'pending'
                 RETURNING state",
            ),
        };
        Outbox {
            sql: Arc::new(sql),
            schema: schema.clone(),
            partition,
        }
    }

    /// The same outbox, read by a relay for partition `index` of `count` only: the
    /// aggregates whose `hashtext(aggregate)` falls in it. An aggregate lives in exactly one
    /// partition, so per-aggregate order needs nothing across partitions, and each partition
    /// can have its own active relay ([`crate::relay::ha`]). PostgreSQL computes the hash,
    /// so every relay agrees on it whatever language or version it runs. Every relay of an
    /// outbox must use the same `count`; changing it needs all relays stopped first (two
    /// counts would put one aggregate into two partitions with two active relays).
    ///
    /// # Panics
    /// If `count` is 0 or `index >= count`.
    pub fn partition(&self, index: u32, count: u32) -> Outbox {
        assert!(index < count, "partition {index} of {count}");
        Outbox::build(&self.schema, Some((index, count)))
    }

    /// `(index, count)` if this outbox is one partition's view ([`Outbox::partition`]).
    pub fn partition_of(&self) -> Option<(u32, u32)> {
        self.partition
    }

    /// The schema the table lives in.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Writes `message` into the outbox as part of `tx`, the business transaction, and
    /// returns its id. It is published if and only if `tx` commits; nothing is published
    /// before the commit, and a rolled-back transaction leaves nothing to publish.
    pub async fn enqueue(&self, tx: &Transaction<'_>, message: &Message) -> Result<String, Error> {
        let (names, values): (Vec<&str>, Vec<&str>) = message
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .unzip();
        let row = tx
            .query_one(
                &self.sql.enqueue,
                &[
                    &message.id,
                    &message.aggregate,
                    &message.topic,
                    &names,
                    &values,
                    &message.payload,
                ],
            )
            .await?;
        Ok(row.get(0))
    }

    /// The next messages to publish, at most `limit`, in publishing order: committed, below
    /// the transaction-id horizon, not held back by a backoff of their aggregate.
    pub(crate) async fn next_batch(
        &self,
        client: &Client,
        limit: i64,
    ) -> Result<Vec<OutboxMessage>, Error> {
        let rows = client.query(&self.sql.batch, &[&limit]).await?;
        Ok(rows.iter().map(OutboxMessage::from_row).collect())
    }

    pub(crate) fn mark_sent_sql(&self) -> &str {
        &self.sql.mark_sent
    }

    pub(crate) fn mark_failed_sql(&self) -> &str {
        &self.sql.mark_failed
    }

    /// Pending and dead counts and the age of the oldest pending message.
    pub async fn stats(&self, client: &Client) -> Result<OutboxStats, Error> {
        let row = client.query_one(&self.sql.stats, &[]).await?;
        let age: f64 = row.get(2);
        Ok(OutboxStats {
            pending: row.get(0),
            dead: row.get(1),
            oldest_pending_age: Duration::from_secs_f64(age.max(0.0)),
        })
    }

    /// The dead letters, oldest first, at most `limit`.
    pub async fn dead_letters(
        &self,
        client: &Client,
        limit: i64,
    ) -> Result<Vec<DeadLetter>, Error> {
        let rows = client.query(&self.sql.dead, &[&limit]).await?;
        Ok(rows
            .iter()
            .map(|row| DeadLetter {
                message: OutboxMessage::from_row(row),
                last_error: row
                    .get::<_, Option<String>>("last_error")
                    .unwrap_or_default(),
                dead_at: row.get("dead_at"),
            })
            .collect())
    }

    /// Puts a dead letter back in line with a fresh attempt count (after the cause was
    /// fixed: the stream created, the exchange declared). It keeps its place in the order,
    /// before any later message of its aggregate that has not been published yet. Returns
    /// whether a dead letter with that id existed.
    pub async fn requeue(&self, client: &Client, id: &str) -> Result<bool, Error> {
        Ok(client.execute(&self.sql.requeue, &[&id]).await? == 1)
    }

    /// Deletes messages published more than `older_than` ago and returns how many. Sent rows
    /// are kept only for inspection; the relay never reads them.
    pub async fn purge_sent(&self, client: &Client, older_than: Duration) -> Result<u64, Error> {
        let secs = older_than.as_secs_f64();
        let batch: i64 = 10_000;
        let mut total = 0;
        loop {
            let n = client.execute(&self.sql.purge, &[&secs, &batch]).await?;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
        }
    }
}
