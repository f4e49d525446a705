//! What guards the relay's progress writes ([`Fence`]): nothing ([`NoFence`], one relay per
//! outbox), or [`PgFence`], a fencing token checked by PostgreSQL in the relay's own progress
//! transaction.
//!
//! Why in PostgreSQL, and why in the *same* transaction as the mark-sent: a lease (Baton's
//! session) tells the relay when it *should* stop, but only a process that is running can act
//! on that. A relay paused by the kernel (SIGSTOP, a long GC-like stall, a VM migration)
//! between its check "am I still the leader?" and its write keeps believing it is; meanwhile
//! its lease expires, another relay is elected and starts publishing. When the paused one
//! wakes, its write goes out before it looks at any clock. The only place that can refuse it
//! is the storage the write goes to, at the moment of the write: so the relay's token is
//! compared with the highest token seen, inside the transaction that marks rows sent, under a
//! row lock held until COMMIT. A check in a separate transaction (or a call to Baton before
//! the write) would leave a window between check and write in which the process can pause.
//!
//! The fence row per partition holds the highest token that has written there. The first
//! statement of every progress transaction is
//!
//! ```sql
//! INSERT INTO relay_fence (partition, token) VALUES ($1, $mine)
//! ON CONFLICT (partition) DO UPDATE SET token = $mine WHERE relay_fence.token <= $mine
//! RETURNING token
//! ```
//!
//! which raises the fence to the relay's token and locks the row until COMMIT, or returns
//! nothing when a newer token is there: [`crate::Error::Fenced`], and the transaction rolls
//! back. Baton's fencing tokens (the leader key's create revision) grow with every new
//! leader, so the newest leader always passes and every deposed one fails once the newest has
//! raised the fence — which [`PgFence::raise`] does as soon as it is elected, before it
//! publishes anything. Because the row lock serialises the progress transactions of one
//! partition, a deposed relay's transaction that got the lock first commits entirely before
//! the new leader's first one: that is harmless (it marks as sent what the broker had
//! acknowledged) and the new leader's later reads see it.

use std::future::Future;

use baton_fencing::{Grant, KeyId, PublicKeys, Signature};
use tokio_postgres::{Client, Transaction};

use crate::pg::Schema;
use crate::Error;

/// Guards the relay's progress writes (mark-sent, attempt counts) against a relay that is no
/// longer the active one.
///
/// `check` runs inside the transaction that writes the progress, before the writes; an error
/// rolls that transaction back and stops the relay with [`Error::Fenced`]. An implementation
/// for several relays compares the relay's fencing token with a fence row in the same
/// database and locks it (`SELECT … FOR SHARE` / `FOR UPDATE`) so that the check and the
/// writes commit against the same token.
pub trait Fence: Send + Sync {
    /// `Ok` if this relay may still write; [`Error::Fenced`] otherwise.
    fn check<'a>(
        &'a self,
        tx: &'a Transaction<'_>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;
}

/// No fence: for exactly one relay per outbox (one process, or an external guarantee that
/// only one runs). It is *not* high availability: two relays with `NoFence` both write.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFence;

impl Fence for NoFence {
    async fn check<'a>(&'a self, _tx: &'a Transaction<'_>) -> Result<(), Error> {
        Ok(())
    }
}

/// A relay's fencing token for one partition, checked and raised in PostgreSQL (table
/// `<schema>.relay_fence`, created by [`Schema::migrate`]). See the module docs for why the
/// check is part of the mark-sent transaction.
///
/// **Signed tokens** (issue 16): with the cluster's public keys configured
/// ([`PgFence::with_public_keys`]), the fence accepts only a token whose grant signature
/// verifies ([`PgFence::with_signature`]); a forged or altered token — say a huge one meant
/// to lock every honest holder out — is refused with [`Error::InvalidFencingSignature`]
/// before any statement runs, so it never raises the fence row.
#[derive(Clone, Debug)]
pub struct PgFence {
    partition: String,
    token: i64,
    keys: Option<PublicKeys>,
    grant: Option<FenceGrant>,
    check: String,
    highest: String,
    refused: String,
}

impl PgFence {
    /// The fence of `partition` (any name the relays of one outbox partition agree on) for a
    /// relay holding `token` (a Baton fencing token: larger for every
    /// later holder).
    pub fn new(schema: &Schema, partition: impl Into<String>, token: i64) -> PgFence {
        PgFence {
            partition: partition.into(),
            token,
            keys: None,
            grant: None,
            check: schema.sql(
                "INSERT INTO {s}.relay_fence AS f (partition, token) VALUES ($1, $2)
                 ON CONFLICT (partition) DO UPDATE SET token = $2, raised_at = now()
                 WHERE f.token <= $2
                 RETURNING token",
            ),
            highest: schema.sql("SELECT token FROM {s}.relay_fence WHERE partition = $1"),
            refused: schema
                .sql("UPDATE {s}.relay_fence SET refusals = refusals + 1 WHERE partition = $1"),
        }
    }

    /// Only validly signed tokens pass from now on (see the type's docs).
    pub fn with_public_keys(mut self, keys: PublicKeys) -> PgFence {
        self.keys = Some(keys);
        self
    }

    /// The grant this fence's token came with (a `baton.v1.Lock` grant: `baton_client`'s
    /// `Guard::signed_token`, or `baton lock`'s `BATON_FENCING_*` variables).
    pub fn with_signature(mut self, grant: FenceGrant) -> PgFence {
        self.grant = Some(grant);
        self
    }

    /// `Ok` unless public keys are configured and this token's signature does not verify.
    fn verify(&self) -> Result<(), Error> {
        let Some(keys) = &self.keys else {
            return Ok(());
        };
        let Some(g) = &self.grant else {
            return Err(Error::InvalidFencingSignature(
                baton_fencing::VerifyError::Unsigned,
            ));
        };
        let grant = Grant {
            name: &g.name,
            token: self.token,
            lease: g.lease,
            revision: g.revision,
        };
        keys.verify(&grant, g.key_id, &g.signature)
            .map_err(Error::InvalidFencingSignature)
    }

    /// The partition name.
    pub fn partition(&self) -> &str {
        &self.partition
    }

    /// This relay's token.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Raises the fence to this token at once, in a transaction of its own, so that every
    /// older relay's next progress write is refused even before this one has written any.
    /// [`Error::Fenced`] if a newer token is already there.
    pub async fn raise(&self, client: &mut Client) -> Result<(), Error> {
        let tx = client.transaction().await?;
        self.check(&tx).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Counts one refused transaction in the fence row (`refusals`), outside the refused
    /// transaction (which rolled back, taking anything it wrote with it).
    pub async fn record_refusal(&self, client: &Client) -> Result<(), Error> {
        client.execute(&self.refused, &[&self.partition]).await?;
        Ok(())
    }

    /// `(token, refusals)` of `partition`'s fence row, if it has one.
    pub async fn read(
        schema: &Schema,
        client: &Client,
        partition: &str,
    ) -> Result<Option<(i64, i64)>, Error> {
        let row = client
            .query_opt(
                &schema.sql("SELECT token, refusals FROM {s}.relay_fence WHERE partition = $1"),
                &[&partition],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }
}

/// What a lock grant's signature covers besides the token (see `baton_fencing`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceGrant {
    /// The lock's name.
    pub name: Vec<u8>,
    /// The holder's lease id.
    pub lease: i64,
    /// The store revision of the grant.
    pub revision: i64,
    /// The signing key's id.
    pub key_id: KeyId,
    /// The cluster's signature.
    pub signature: Signature,
}

/// How long a progress transaction may sit idle before PostgreSQL ends it. The fence row
/// stays locked until the transaction ends, so a relay paused *inside* its mark-sent
/// transaction would otherwise block the next leader's writes for as long as it stays
/// paused; with this, PostgreSQL rolls the paused transaction back and frees the row.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "10s";

impl Fence for PgFence {
    async fn check<'a>(&'a self, tx: &'a Transaction<'_>) -> Result<(), Error> {
        // Before any statement: a forged token must not even take the row lock.
        self.verify()?;
        tx.batch_execute(&format!(
            "SET LOCAL idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'"
        ))
        .await?;
        let raised = tx
            .query_opt(&self.check, &[&self.partition, &self.token])
            .await?;
        if raised.is_some() {
            return Ok(());
        }
        let highest: Option<i64> = tx
            .query_opt(&self.highest, &[&self.partition])
            .await?
            .map(|r| r.get(0));
        metrics::counter!("baton_txn_relay_fenced_total", "partition" => self.partition.clone())
            .increment(1);
        Err(Error::Fenced(format!(
            "partition {}: token {} is older than {}",
            self.partition,
            self.token,
            highest.map_or_else(|| "?".to_string(), |h| h.to_string())
        )))
    }
}
