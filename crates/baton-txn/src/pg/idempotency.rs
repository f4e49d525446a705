//! Idempotency keys on PostgreSQL. The invariants are in the crate docs; this file is the
//! mechanism.
//!
//! Life of a key, one row in `<schema>.idempotency_keys`:
//!
//! ```text
//!  claim ──insert──▶ in_flight(token, lease) ──work tx: lock row, work, complete, COMMIT──▶ done(response)
//!                        │   ▲                                                              │
//!     work failed:       │   │ lease over and row not locked: a retry takes it over          │ retention over:
//!     release (delete) ◀─┘   └── (new token; the old claimant's complete now matches nothing) │ purge, or the next
//!                                                                                           ▼ claim starts afresh
//! ```
//!
//! Claiming is a statement (or three) of its own, committed before the work starts, so that a
//! concurrent duplicate *sees* the claim and can be told "in flight" at once instead of
//! waiting on a unique-index lock for as long as the work takes. The work transaction then
//! locks the row, which is what keeps a slow but live execution from being taken over.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, Row, Transaction};

use super::schema::Schema;
use crate::{Error, Fingerprint, IdempotencyKey, StoredResponse};

/// Timing of the store.
#[derive(Clone, Debug)]
pub struct IdempotencyConfig {
    /// How long a claim stays in flight without a live transaction holding it before a retry
    /// may take it over. It bounds how long a crashed request blocks its retries (they get
    /// "in flight" until then); it does not bound how long work may take, since a running
    /// work transaction holds the row locked and is never taken over. 30 s by default.
    pub lease: Duration,
    /// How long a key is remembered after its first request (Stripe: at least 24 h). After
    /// that the same key is a new request. 24 h by default.
    pub retention: Duration,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            lease: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
        }
    }
}

/// The outcome of claiming a key.
#[derive(Debug)]
pub enum Claim {
    /// First time (or the previous claim crashed and expired, or the key's retention is over):
    /// run the work through this [`Execution`].
    Execute(Execution),
    /// Done before with the same request: answer with this response and run nothing.
    Replay(StoredResponse),
    /// Another request with this key is running (IETF: 409; Stripe: `idempotency_key_in_use`).
    /// `retry_after` is a hint: the claim's remaining lease, or a second when a live
    /// transaction holds a claim whose lease is over.
    InFlight {
        /// When a retry may find the key done or free.
        retry_after: Duration,
    },
    /// The key was used for a different request (IETF: 422). Nothing runs.
    Mismatch,
}

/// What [`IdempotencyStore::run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The work ran now and its response was stored with it.
    Executed(StoredResponse),
    /// The work had run before; this is the stored response.
    Replayed(StoredResponse),
    /// Another request with the key is in flight (after waiting, if asked to).
    InFlight {
        /// See [`Claim::InFlight`].
        retry_after: Duration,
    },
    /// The key belongs to a different request.
    Mismatch,
}

impl Outcome {
    /// The response, executed or replayed.
    pub fn response(&self) -> Option<&StoredResponse> {
        match self {
            Outcome::Executed(r) | Outcome::Replayed(r) => Some(r),
            _ => None,
        }
    }
}

/// Why [`IdempotencyStore::run`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E> {
    /// The store failed (connection, SQL, or the claim was lost).
    #[error(transparent)]
    Store(#[from] Error),
    /// The work returned an error; its transaction was rolled back and the claim released,
    /// so a retry runs it again.
    #[error("the work failed: {0}")]
    Work(E),
}

struct Sql {
    insert: String,
    read: String,
    reclaim: String,
    lock: String,
    complete: String,
    release: String,
    purge: String,
}

/// Idempotency keys in one schema. Cheap to clone.
#[derive(Clone)]
pub struct IdempotencyStore {
    sql: Arc<Sql>,
    config: IdempotencyConfig,
}

/// A claim that may run the work: open the work transaction with [`Execution::begin`], do the
/// work in it, then [`Execution::commit`] it together with the response — or drop it and
/// [`Execution::release`] the key.
#[derive(Clone)]
pub struct Execution {
    sql: Arc<Sql>,
    tenant: String,
    key: String,
    /// This claim's random `claim_token` (not a fencing token: it only tells this claim's
    /// row from a later claimant's, and has no order).
    claim_token: i64,
}

impl std::fmt::Debug for Execution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Execution")
            .field("tenant", &self.tenant)
            .field("key", &self.key)
            .finish()
    }
}

/// The claim is taken over only when the previous claimant is gone (lease over and nobody
/// locks the row: a live work transaction holds it `FOR UPDATE`, hence `SKIP LOCKED`) and the
/// request is the same one, or when the key's retention is over (then it is a new request).
const RECLAIMABLE: &str = "(expires_at <= now()
     OR (state = 'in_flight' AND locked_until <= now() AND fingerprint = $3))";

impl IdempotencyStore {
    /// A store over the tables of `schema` (create them with [`Schema::migrate`]).
    pub fn new(schema: &Schema, config: IdempotencyConfig) -> Self {
        let t = schema.sql("{s}.idempotency_keys");
        let sql = Sql {
            insert: format!(
                "INSERT INTO {t} (tenant, key, fingerprint, state, claim_token, locked_until,
                                  created_at, expires_at)
                 VALUES ($1, $2, $3, 'in_flight', $4, now() + make_interval(secs => $5), now(),
                         now() + make_interval(secs => $6))
                 ON CONFLICT (tenant, key) DO NOTHING"
            ),
            read: format!(
                "SELECT fingerprint, state, locked_until <= now(), expires_at <= now(),
                        greatest(extract(epoch FROM locked_until - now()), 0)::float8,
                        response_status, response_header_names, response_header_values,
                        response_body
                 FROM {t} WHERE tenant = $1 AND key = $2"
            ),
            reclaim: format!(
                "UPDATE {t} AS t
                 SET fingerprint = $3, state = 'in_flight', claim_token = $4,
                     locked_until = now() + make_interval(secs => $5),
                     created_at = CASE WHEN t.expires_at <= now() THEN now() ELSE t.created_at END,
                     expires_at = CASE WHEN t.expires_at <= now()
                                       THEN now() + make_interval(secs => $6)
                                       ELSE t.expires_at END,
                     response_status = NULL, response_header_names = NULL,
                     response_header_values = NULL, response_body = NULL
                 WHERE (t.tenant, t.key) IN (
                         SELECT tenant, key FROM {t}
                         WHERE tenant = $1 AND key = $2 AND {RECLAIMABLE}
                         FOR UPDATE SKIP LOCKED)
                   AND {RECLAIMABLE}"
            ),
            lock: format!(
                "SELECT 1 FROM {t}
                 WHERE tenant = $1 AND key = $2 AND claim_token = $3 AND state = 'in_flight'
                 FOR UPDATE"
            ),
            complete: format!(
                "UPDATE {t}
                 SET state = 'done', locked_until = now(), response_status = $4,
                     response_header_names = $5, response_header_values = $6, response_body = $7
                 WHERE tenant = $1 AND key = $2 AND claim_token = $3 AND state = 'in_flight'"
            ),
            release: format!(
                "DELETE FROM {t}
                 WHERE tenant = $1 AND key = $2 AND claim_token = $3 AND state = 'in_flight'"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE (tenant, key) IN (
                     SELECT tenant, key FROM {t} WHERE expires_at <= now()
                     ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
        };
        IdempotencyStore {
            sql: Arc::new(sql),
            config,
        }
    }

    /// The store's timing.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.config
    }

    /// Claims `key` of `tenant` for the request with fingerprint `fp`. Runs as statements of
    /// its own on `client` (never inside the caller's transaction: a claim must be visible to
    /// concurrent duplicates before the work starts), and never waits for another request.
    pub async fn claim(
        &self,
        client: &Client,
        tenant: &str,
        key: &IdempotencyKey,
        fp: &Fingerprint,
    ) -> Result<Claim, Error> {
        let lease = self.config.lease.as_secs_f64();
        let retention = self.config.retention.as_secs_f64();
        let key = key.as_str();
        let fp: &[u8] = &fp.0;
        let mut takeover_failed = false;
        // Each round is insert-or-read; a round repeats only when the row vanished between
        // the two (purged or released), which cannot go on for long.
        for _ in 0..4 {
            let claim_token: i64 = rand::random();
            let inserted = client
                .execute(
                    &self.sql.insert,
                    &[&tenant, &key, &fp, &claim_token, &lease, &retention],
                )
                .await?;
            if inserted == 1 {
                return Ok(Claim::Execute(self.execution(tenant, key, claim_token)));
            }
            let Some(row) = client.query_opt(&self.sql.read, &[&tenant, &key]).await? else {
                continue;
            };
            let retired: bool = row.get(3);
            if !retired {
                let stored: &[u8] = row.get(0);
                if stored != fp {
                    return Ok(Claim::Mismatch);
                }
                if row.get::<_, &str>(1) == "done" {
                    return Ok(Claim::Replay(response_of(&row)));
                }
                let lease_over: bool = row.get(2);
                if !lease_over {
                    let left: f64 = row.get(4);
                    return Ok(Claim::InFlight {
                        retry_after: Duration::from_secs_f64(left),
                    });
                }
                if takeover_failed {
                    // Lease over, yet a live transaction holds the row: it is still working.
                    return Ok(Claim::InFlight {
                        retry_after: Duration::from_secs(1),
                    });
                }
            }
            let taken = client
                .execute(
                    &self.sql.reclaim,
                    &[&tenant, &key, &fp, &claim_token, &lease, &retention],
                )
                .await?;
            if taken == 1 {
                return Ok(Claim::Execute(self.execution(tenant, key, claim_token)));
            }
            // Locked by a live execution, or changed under us: look again once.
            takeover_failed = true;
        }
        Ok(Claim::InFlight {
            retry_after: Duration::from_secs(1),
        })
    }

    /// [`claim`](Self::claim), but while the key is in flight, polls (5 ms doubling to
    /// 100 ms) for up to `wait` until it is done — then the stored response is replayed — or
    /// free again. Returns [`Claim::InFlight`] if it still is when `wait` runs out.
    pub async fn claim_wait(
        &self,
        client: &Client,
        tenant: &str,
        key: &IdempotencyKey,
        fp: &Fingerprint,
        wait: Duration,
    ) -> Result<Claim, Error> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut pause = Duration::from_millis(5);
        loop {
            match self.claim(client, tenant, key, fp).await? {
                Claim::InFlight { retry_after } => {
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        return Ok(Claim::InFlight { retry_after });
                    }
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                other => return Ok(other),
            }
        }
    }

    /// Claims the key and, if this request is the one to run, runs `work` in a transaction
    /// on `client` and commits it together with the response `work` returns. `wait`: `None`
    /// answers [`Outcome::InFlight`] at once, `Some(d)` waits up to `d` for the other request
    /// (see [`claim_wait`](Self::claim_wait)).
    ///
    /// If `work` fails, its transaction is rolled back and the claim released: nothing is
    /// stored, and the next retry runs the work. To have a failure replayed (a 4xx decided
    /// after execution started, Stripe-style), return it as an `Ok` response instead.
    pub async fn run<F, E>(
        &self,
        client: &mut Client,
        tenant: &str,
        key: &IdempotencyKey,
        fp: &Fingerprint,
        wait: Option<Duration>,
        work: F,
    ) -> Result<Outcome, RunError<E>>
    where
        F: AsyncFnOnce(&Transaction<'_>) -> Result<StoredResponse, E>,
    {
        let claim = match wait {
            None => self.claim(client, tenant, key, fp).await?,
            Some(wait) => self.claim_wait(client, tenant, key, fp, wait).await?,
        };
        let exec = match claim {
            Claim::Execute(exec) => exec,
            Claim::Replay(r) => return Ok(Outcome::Replayed(r)),
            Claim::InFlight { retry_after } => return Ok(Outcome::InFlight { retry_after }),
            Claim::Mismatch => return Ok(Outcome::Mismatch),
        };
        let tx = exec.begin(client).await?;
        match work(&tx).await {
            Ok(response) => {
                exec.commit(tx, &response).await?;
                Ok(Outcome::Executed(response))
            }
            Err(e) => {
                // Best effort: if either step fails (the connection is gone, say), the
                // server rolls the transaction back on its own and the claim's lease runs
                // out; the work's error is the one worth returning.
                let _ = tx.rollback().await;
                let _ = exec.release(client).await;
                Err(RunError::Work(e))
            }
        }
    }

    /// Deletes keys whose retention is over, in batches of `batch`, and returns how many. Keys
    /// held by a live transaction are skipped. Run it periodically; correctness does not
    /// depend on it (a retired key is a new request whether or not it was purged).
    pub async fn purge(&self, client: &Client, batch: u32) -> Result<u64, Error> {
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            let n = client.execute(&self.sql.purge, &[&batch]).await?;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
        }
    }

    fn execution(&self, tenant: &str, key: &str, claim_token: i64) -> Execution {
        Execution {
            sql: self.sql.clone(),
            tenant: tenant.into(),
            key: key.into(),
            claim_token,
        }
    }
}

fn response_of(row: &Row) -> StoredResponse {
    let status: Option<i32> = row.get(5);
    let names: Option<Vec<String>> = row.get(6);
    let values: Option<Vec<String>> = row.get(7);
    let body: Option<Vec<u8>> = row.get(8);
    StoredResponse {
        status: status.unwrap_or(0) as u16,
        headers: names
            .unwrap_or_default()
            .into_iter()
            .zip(values.unwrap_or_default())
            .collect(),
        body: body.unwrap_or_default(),
    }
}

impl Execution {
    /// The tenant the key belongs to.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Opens the work transaction on `client` and [`lock`](Self::lock)s the claim in it.
    pub async fn begin<'c>(&self, client: &'c mut Client) -> Result<Transaction<'c>, Error> {
        let tx = client.transaction().await?;
        self.lock(&tx).await?;
        Ok(tx)
    }

    /// Locks the claim row in the caller's work transaction, and checks the claim is still
    /// this request's. Call it first thing: from then on no retry can take the claim over,
    /// however long the work takes (it ends with the transaction). Fails with
    /// [`Error::ClaimLost`] if the lease ran out before this and another request took over.
    pub async fn lock(&self, tx: &Transaction<'_>) -> Result<(), Error> {
        let row = tx
            .query_opt(
                &self.sql.lock,
                &[&self.tenant, &self.key, &self.claim_token],
            )
            .await?;
        row.map(|_| ()).ok_or(Error::ClaimLost)
    }

    /// Stores `response` as the key's result, in the work transaction: it becomes visible —
    /// and the key done — exactly when the work commits. [`Error::ClaimLost`] if another
    /// request took the claim over (possible only without [`lock`](Self::lock)); the caller
    /// must then roll back.
    pub async fn complete(
        &self,
        tx: &Transaction<'_>,
        response: &StoredResponse,
    ) -> Result<(), Error> {
        let status = i32::from(response.status);
        let names: Vec<&str> = response.headers.iter().map(|(n, _)| n.as_str()).collect();
        let values: Vec<&str> = response.headers.iter().map(|(_, v)| v.as_str()).collect();
        let body: &[u8] = &response.body;
        let n = tx
            .execute(
                &self.sql.complete,
                &[
                    &self.tenant,
                    &self.key,
                    &self.claim_token,
                    &status,
                    &names,
                    &values,
                    &body,
                ],
            )
            .await?;
        if n == 1 {
            Ok(())
        } else {
            Err(Error::ClaimLost)
        }
    }

    /// [`complete`](Self::complete), then commits the work transaction. If the commit's
    /// answer is lost (connection cut), the outcome is unknown to this caller but not to the
    /// key: a retry either replays the response (committed) or, after the lease, runs again
    /// (rolled back).
    pub async fn commit(
        &self,
        tx: Transaction<'_>,
        response: &StoredResponse,
    ) -> Result<(), Error> {
        self.complete(&tx, response).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Gives the claim up after the work transaction rolled back, so a retry runs at once
    /// rather than after the lease. Does nothing (returns `false`) if the key is done or
    /// claimed by another request — it is fenced by this claim's `claim_token`, so it is safe
    /// to call whatever happened.
    pub async fn release(&self, client: &Client) -> Result<bool, Error> {
        let n = client
            .execute(
                &self.sql.release,
                &[&self.tenant, &self.key, &self.claim_token],
            )
            .await?;
        Ok(n == 1)
    }
}
