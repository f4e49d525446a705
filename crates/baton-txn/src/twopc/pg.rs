//! PostgreSQL as a 2PC participant (features `twopc` + `postgres`).
//!
//! Phase 1 is `PREPARE TRANSACTION 'gid'`: the branch's changes, its locks and its marker
//! row become durable and survive the session and a server restart, until some session of
//! the same user in the same database runs `COMMIT PREPARED` or `ROLLBACK PREPARED`. That is
//! what lets phase 2 and recovery run from any process.
//!
//! Facts this code depends on (PostgreSQL 15):
//! - `max_prepared_transactions` is 0 by default, which disables PREPARE; it changes only
//!   with a restart. [`PgResource::preflight`] says so plainly instead of failing at the first
//!   transaction.
//! - PREPARE/COMMIT PREPARED/ROLLBACK PREPARED are utility statements: the GID cannot be a
//!   bind parameter, so it is spliced in as a literal. Our GIDs contain only
//!   `[A-Za-z0-9:_-]` ([`Gid`]), which needs no quoting; the code escapes anyway.
//! - COMMIT/ROLLBACK PREPARED cannot run inside a transaction block and answer SQLSTATE 42704
//!   when no prepared transaction has the GID — which cannot tell "already committed" from
//!   "rolled back". The marker row can: it was inserted inside the branch, so it exists iff
//!   the branch committed.
//! - A prepared branch keeps its locks and holds back VACUUM (and an xid-horizon outbox
//!   relay) until it is finished; that is why undecided branches are aborted after their
//!   deadline and why `pg_prepared_xacts` ages belong on a dashboard.
//! - A branch may not touch temporary tables or use LISTEN/NOTIFY (PREPARE refuses them).

use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use super::ids::{BranchId, Gid};
use super::participant::{BoxFuture, Branch, Finish, ParticipantError, PreparedBranch, Resource};
use crate::pg::Schema;

/// A PostgreSQL database taking part in 2PC, with its marker table in `schema` (created by
/// [`Schema::migrate`]). Phase-2 and recovery calls use one connection of their own, opened
/// on first use and again after it broke.
pub struct PgResource {
    id: BranchId,
    config: Config,
    schema: Schema,
    conn: Mutex<Option<Client>>,
}

impl std::fmt::Debug for PgResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgResource")
            .field("id", &self.id)
            .field("schema", &self.schema)
            .finish()
    }
}

fn unavailable(e: impl std::error::Error) -> ParticipantError {
    ParticipantError::Unavailable(with_causes(&e))
}

/// An error with its causes ("error connecting to server: Connection refused"): the driver's
/// own message alone often does not say what went wrong.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_s = c.to_string();
        if !s.contains(&c_s) {
            s.push_str(": ");
            s.push_str(&c_s);
        }
        cause = c.source();
    }
    s
}

/// Maps a driver error: an error the server sent is a refusal, anything else (connection,
/// I/O) may pass.
fn classify(e: tokio_postgres::Error) -> ParticipantError {
    match e.as_db_error() {
        Some(db) => ParticipantError::Refused(format!("{} ({})", db.message(), db.code().code())),
        None => ParticipantError::Unavailable(with_causes(&e)),
    }
}

/// The GID as an SQL string literal.
fn literal(gid: &Gid) -> String {
    format!("'{}'", gid.to_string().replace('\'', "''"))
}

async fn connect(config: &Config) -> Result<Client, ParticipantError> {
    let (client, connection) = config.connect(NoTls).await.map_err(unavailable)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl PgResource {
    /// The database `config` connects to, named `id` in the log and in GIDs, with its marker
    /// table in `schema`.
    pub fn new(id: BranchId, config: Config, schema: Schema) -> PgResource {
        PgResource {
            id,
            config,
            schema,
            conn: Mutex::new(None),
        }
    }

    /// Opens a branch: a connection of its own with a transaction begun. Do the work through
    /// [`PgBranch::client`], then [`super::GlobalTx::enlist`] it.
    pub async fn begin(&self) -> Result<PgBranch, ParticipantError> {
        let client = connect(&self.config).await?;
        client.batch_execute("BEGIN").await.map_err(classify)?;
        Ok(PgBranch {
            id: self.id.clone(),
            schema: self.schema.clone(),
            client,
        })
    }

    /// Runs `sql` (one statement with the GID spliced in) on the shared connection,
    /// reconnecting once if it broke.
    async fn run(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            *guard = None;
            match self.config.connect(NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                    *guard = Some(client);
                }
                Err(e) => return Err(e),
            }
        }
        let client = guard.as_ref().expect("connected above");
        let r = client.batch_execute(sql).await;
        if client.is_closed() {
            *guard = None;
        }
        r
    }

    async fn finish(&self, verb: &str, gid: &Gid) -> Result<Finish, ParticipantError> {
        match self.run(&format!("{verb} PREPARED {}", literal(gid))).await {
            Ok(()) => Ok(Finish::Done),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(Finish::AlreadyGone),
            // "prepared transaction with identifier … is busy": another session is finishing
            // it right now; ask again later.
            Err(e) if e.code() == Some(&SqlState::OBJECT_IN_USE) => {
                Err(ParticipantError::Unavailable(with_causes(&e)))
            }
            Err(e) => Err(classify(e)),
        }
    }

    async fn query_one_i64(&self, sql: &str, param: &str) -> Result<i64, ParticipantError> {
        let client = connect(&self.config).await?;
        let row = client.query_one(sql, &[&param]).await.map_err(classify)?;
        Ok(row.get(0))
    }
}

impl Resource for PgResource {
    fn id(&self) -> &BranchId {
        &self.id
    }

    fn commit_prepared<'a>(
        &'a self,
        gid: &'a Gid,
    ) -> BoxFuture<'a, Result<Finish, ParticipantError>> {
        Box::pin(self.finish("COMMIT", gid))
    }

    fn rollback_prepared<'a>(
        &'a self,
        gid: &'a Gid,
    ) -> BoxFuture<'a, Result<Finish, ParticipantError>> {
        Box::pin(self.finish("ROLLBACK", gid))
    }

    fn list_prepared<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PreparedBranch>, ParticipantError>> {
        Box::pin(async move {
            let client = connect(&self.config).await?;
            let rows = client
                .query(
                    "SELECT gid, extract(epoch FROM now() - prepared)::float8
                       FROM pg_prepared_xacts
                      WHERE database = current_database() AND starts_with(gid, $1)",
                    &[&Gid::namespace_prefix(namespace)],
                )
                .await
                .map_err(classify)?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let gid: Gid = r.get::<_, String>(0).parse().ok()?;
                    let age: f64 = r.get(1);
                    (gid.branch() == &self.id).then(|| PreparedBranch {
                        gid,
                        age: Some(Duration::from_secs_f64(age.max(0.0))),
                    })
                })
                .collect())
        })
    }

    fn marker_exists<'a>(&'a self, gid: &'a Gid) -> BoxFuture<'a, Result<bool, ParticipantError>> {
        Box::pin(async move {
            let n = self
                .query_one_i64(
                    &format!(
                        "SELECT count(*) FROM {}.twopc_marker WHERE gid = $1",
                        self.schema.name()
                    ),
                    &gid.to_string(),
                )
                .await?;
            Ok(n > 0)
        })
    }

    fn purge_markers(&self, older_than: Duration) -> BoxFuture<'_, Result<u64, ParticipantError>> {
        Box::pin(async move {
            let client = connect(&self.config).await?;
            client
                .execute(
                    &format!(
                        "DELETE FROM {}.twopc_marker m
                          WHERE m.created_at < now() - make_interval(secs => $1)
                            AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE p.gid = m.gid)",
                        self.schema.name()
                    ),
                    &[&older_than.as_secs_f64()],
                )
                .await
                .map_err(classify)
        })
    }

    fn preflight(&self) -> BoxFuture<'_, Result<Vec<String>, ParticipantError>> {
        Box::pin(async move {
            let client = connect(&self.config).await?;
            let row = client
                .query_one(
                    "SELECT current_setting('max_prepared_transactions')::int",
                    &[],
                )
                .await
                .map_err(classify)?;
            let max: i32 = row.get(0);
            if max == 0 {
                return Err(ParticipantError::Unsupported(format!(
                    "{}: max_prepared_transactions is 0, which disables PREPARE TRANSACTION; \
                     set it to at least max_connections and restart PostgreSQL",
                    self.id
                )));
            }
            let table = format!("{}.twopc_marker", self.schema.name());
            let row = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
                .await
                .map_err(classify)?;
            if !row.get::<_, bool>(0) {
                return Err(ParticipantError::Unsupported(format!(
                    "{}: the marker table {table} is missing; run Schema::migrate",
                    self.id
                )));
            }
            Ok(Vec::new())
        })
    }
}

/// One open PostgreSQL transaction enlisted in a global transaction.
pub struct PgBranch {
    id: BranchId,
    schema: Schema,
    client: Client,
}

impl std::fmt::Debug for PgBranch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBranch").field("id", &self.id).finish()
    }
}

impl PgBranch {
    /// The connection, inside the branch's transaction: run the branch's work through it.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Branch for PgBranch {
    fn resource(&self) -> &BranchId {
        &self.id
    }

    fn prepare<'a>(&'a mut self, gid: &'a Gid) -> BoxFuture<'a, Result<(), ParticipantError>> {
        Box::pin(async move {
            if gid.branch() != &self.id {
                return Err(ParticipantError::Refused(format!(
                    "GID {gid} is not for branch {}",
                    self.id
                )));
            }
            let marker = format!(
                "INSERT INTO {}.twopc_marker (gid) VALUES ($1)",
                self.schema.name()
            );
            let r = async {
                self.client.execute(&marker, &[&gid.to_string()]).await?;
                self.client
                    .batch_execute(&format!("PREPARE TRANSACTION {}", literal(gid)))
                    .await
            }
            .await;
            match r {
                Ok(()) => Ok(()),
                Err(e) => {
                    // A failed statement aborted the transaction and a failed PREPARE rolls
                    // it back; end the block either way so the NO vote leaves nothing behind.
                    let _ = self.client.batch_execute("ROLLBACK").await;
                    Err(classify(e))
                }
            }
        })
    }

    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), ParticipantError>> {
        Box::pin(async move {
            self.client
                .batch_execute("ROLLBACK")
                .await
                .map_err(classify)
        })
    }
}
