//! [`Schema`]: the PostgreSQL schema that holds the tables, and its migrations.

use tokio_postgres::Client;

use crate::Error;

/// The schema that holds the tables. A plain lower-case identifier, so statements can name
/// it without quoting; several applications (or tests) can share one database with a schema
/// each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema(String);

impl Default for Schema {
    fn default() -> Self {
        Schema("baton_txn".into())
    }
}

/// Each entry runs once per schema, in order, recorded in `<schema>.migrations`; `{s}` is the
/// schema. Entries are never edited once released, only appended.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE {s}.idempotency_keys (
         tenant          text        NOT NULL,
         key             text        NOT NULL,
         fingerprint     bytea       NOT NULL,
         state           text        NOT NULL CHECK (state IN ('in_flight', 'done')),
         claim_token     bigint      NOT NULL,
         locked_until    timestamptz NOT NULL,
         created_at      timestamptz NOT NULL,
         expires_at      timestamptz NOT NULL,
         response_status integer,
         response_header_names  text[],
         response_header_values text[],
         response_body   bytea,
         PRIMARY KEY (tenant, key)
     );
     CREATE INDEX idempotency_keys_expires_at ON {s}.idempotency_keys (expires_at);
     CREATE TABLE {s}.inbox (
         consumer    text        NOT NULL,
         message_id  text        NOT NULL,
         received_at timestamptz NOT NULL DEFAULT now(),
         PRIMARY KEY (consumer, message_id)
     );
     CREATE INDEX inbox_received_at ON {s}.inbox (received_at);",
    ),
    (
        2,
        // `xid` is the enqueuing transaction's id (64-bit, never wraps): the relay reads only
        // below the oldest transaction still running, and in (xid, seq) order; see
        // `outbox.rs`. The partial indexes keep the relay's scans proportional to the
        // unsent rows, however many sent ones are kept.
        "CREATE TABLE {s}.outbox (
             seq             bigserial   PRIMARY KEY,
             id              text        NOT NULL UNIQUE,
             aggregate       text        NOT NULL,
             topic           text        NOT NULL,
             header_names    text[]      NOT NULL,
             header_values   text[]      NOT NULL,
             payload         bytea       NOT NULL,
             created_at      timestamptz NOT NULL DEFAULT now(),
             xid             xid8        NOT NULL DEFAULT pg_current_xact_id(),
             state           text        NOT NULL DEFAULT 'pending'
                                         CHECK (state IN ('pending', 'sent', 'dead')),
             attempts        integer     NOT NULL DEFAULT 0,
             next_attempt_at timestamptz NOT NULL DEFAULT now(),
             last_error      text,
             sent_at         timestamptz,
             dead_at         timestamptz
         );
         CREATE INDEX outbox_pending ON {s}.outbox (xid, seq) WHERE state = 'pending';
         CREATE INDEX outbox_retrying ON {s}.outbox (aggregate)
             WHERE state = 'pending' AND attempts > 0;
         CREATE INDEX outbox_sent ON {s}.outbox (sent_at) WHERE state = 'sent';
         CREATE INDEX outbox_dead ON {s}.outbox (seq) WHERE state = 'dead';",
    ),
    (
        3,
        // One row per relay partition: the highest fencing token that has written progress
        // there (see `relay::PgFence`). `refusals` counts the deposed relays' refused
        // transactions, recorded after their rollback, for operators and the tests.
        "CREATE TABLE {s}.relay_fence (
             partition  text        PRIMARY KEY,
             token      bigint      NOT NULL,
             raised_at  timestamptz NOT NULL DEFAULT now(),
             refusals   bigint      NOT NULL DEFAULT 0
         );",
    ),
    (
        4,
        // The 2PC marker rows (`crate::twopc::pg`): one per branch, inserted inside the
        // branch before PREPARE, so it commits exactly when the branch does.
        "CREATE TABLE {s}.twopc_marker (
             gid        text        PRIMARY KEY,
             created_at timestamptz NOT NULL DEFAULT now()
         );",
    ),
];

impl Schema {
    /// A schema name: 1–63 characters of `[a-z0-9_]`, not starting with a digit.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= 63
            && !name.as_bytes()[0].is_ascii_digit()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(Schema(name))
        } else {
            Err(Error::InvalidSchema(name))
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// `sql` with `{s}` replaced by the schema name.
    pub(crate) fn sql(&self, sql: &str) -> String {
        sql.replace("{s}", &self.0)
    }

    /// Creates the schema and its tables, or brings them up to date. Safe to run from many
    /// processes at once (an advisory lock serialises them: concurrent `CREATE … IF NOT
    /// EXISTS` can still fail on PostgreSQL's catalog unique indexes) and on every start.
    pub async fn migrate(&self, client: &mut Client) -> Result<(), Error> {
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(1114989679, hashtext($1))",
            &[&self.0],
        )
        .await?;
        tx.batch_execute(&self.sql(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE IF NOT EXISTS {s}.migrations (
                 version    integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now()
             );",
        ))
        .await?;
        let done: Vec<i32> = tx
            .query(&self.sql("SELECT version FROM {s}.migrations"), &[])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for (version, sql) in MIGRATIONS {
            if !done.contains(version) {
                tx.batch_execute(&self.sql(sql)).await?;
                tx.execute(
                    &self.sql("INSERT INTO {s}.migrations (version) VALUES ($1)"),
                    &[version],
                )
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}
