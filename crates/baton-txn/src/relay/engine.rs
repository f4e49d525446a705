//! The relay itself ([`Relay`]): its configuration and its rounds (see the module docs of
//! `relay`).

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_postgres::Client;

use super::fence::{Fence, NoFence};
use super::publisher::{PublishError, Publisher};
use crate::pg::{Outbox, OutboxMessage};
use crate::Error;

/// How the relay reads, retries and gives up.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Messages read per round. 500 by default.
    pub batch_size: i64,
    /// How long to sleep when there is nothing to publish. 50 ms by default.
    pub poll_interval: Duration,
    /// Attempts (refusals by the broker) before a message becomes a dead letter. 10 by
    /// default. Outages ([`PublishError::Unavailable`]) do not count.
    pub max_attempts: i32,
    /// The wait after a message's first refusal; it doubles with each further one (with
    /// jitter: a random 50–100 % of it), up to `max_backoff`. 100 ms by default.
    pub initial_backoff: Duration,
    /// The longest wait between attempts, also the longest wait for a broker or database
    /// that is down. 30 s by default.
    pub max_backoff: Duration,
    /// How long one publish may wait for the broker's ack before it counts as unavailable.
    /// 30 s by default.
    pub publish_timeout: Duration,
    /// How often the pending-rows and oldest-age gauges are refreshed. 1 s by default.
    pub metrics_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 500,
            poll_interval: Duration::from_millis(50),
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(30),
            metrics_interval: Duration::from_secs(1),
        }
    }
}

/// What one round did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Messages read.
    pub read: usize,
    /// Published and marked sent.
    pub published: usize,
    /// Refused by the broker and left pending for a retry.
    pub retried: usize,
    /// Refused for the last time: now dead letters.
    pub dead: usize,
    /// Left pending because the broker was unavailable.
    pub unavailable: usize,
}

/// Publishes an outbox through a [`Publisher`], guarded by a [`Fence`].
pub struct Relay<P, F = NoFence> {
    outbox: Outbox,
    publisher: P,
    fence: F,
    config: RelayConfig,
}

impl<P: Publisher> Relay<P, NoFence> {
    /// A relay without a fence: one relay per outbox only (see [`NoFence`]).
    pub fn new(outbox: Outbox, publisher: P, config: RelayConfig) -> Self {
        Relay::with_fence(outbox, publisher, NoFence, config)
    }
}

impl<P: Publisher, F: Fence> Relay<P, F> {
    /// A relay whose progress writes `fence` guards.
    pub fn with_fence(outbox: Outbox, publisher: P, fence: F, config: RelayConfig) -> Self {
        Relay {
            outbox,
            publisher,
            fence,
            config,
        }
    }

    /// The publisher (to read an adapter's own counters).
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// One round: read a batch, publish it, record the outcome. An error leaves every
    /// message of the batch whose outcome was not committed pending, to be published again.
    pub async fn run_once(&self, client: &mut Client) -> Result<RoundReport, Error> {
        let batch = self
            .outbox
            .next_batch(client, self.config.batch_size)
            .await?;
        let mut report = RoundReport {
            read: batch.len(),
            ..RoundReport::default()
        };
        if batch.is_empty() {
            return Ok(report);
        }

        // One chain per aggregate, in batch order; a chain stops at its first failure so a
        // later message never overtakes an earlier one of the same aggregate.
        let mut chains: Vec<Vec<&OutboxMessage>> = Vec::new();
        let mut chain_of: HashMap<&str, usize> = HashMap::new();
        for message in &batch {
            let at = *chain_of.entry(&message.aggregate).or_insert_with(|| {
                chains.push(Vec::new());
                chains.len() - 1
            });
            chains[at].push(message);
        }
        let outcomes = futures_util::future::join_all(chains.iter().map(|chain| async move {
            let mut outcomes = Vec::with_capacity(chain.len());
            for &message in chain {
                let result = match tokio::time::timeout(
                    self.config.publish_timeout,
                    self.publisher.publish(message),
                )
                .await
                {
                    Ok(result) => result,
                    Err(_) => Err(PublishError::Unavailable(format!(
                        "no ack within {:?}",
                        self.config.publish_timeout
                    ))),
                };
                let failed = result.is_err();
                outcomes.push((message, result));
                if failed {
                    break;
                }
            }
            outcomes
        }))
        .await;

        let mut sent = Vec::new();
        let mut refused = Vec::new();
        for (message, result) in outcomes.into_iter().flatten() {
            match result {
                Ok(()) => sent.push(message.seq),
                Err(PublishError::Rejected(why)) => refused.push((message, why)),
                Err(PublishError::Unavailable(why)) => {
                    tracing::debug!(id = %message.id, "broker unavailable: {why}");
                    report.unavailable += 1;
                }
            }
        }

        let tx = client.transaction().await?;
        self.fence.check(&tx).await?;
        if !sent.is_empty() {
            tx.execute(self.outbox.mark_sent_sql(), &[&sent]).await?;
        }
        for (message, why) in &refused {
            let backoff = self.backoff(message.attempts).as_secs_f64();
            let row = tx
                .query_opt(
                    self.outbox.mark_failed_sql(),
                    &[&message.seq, why, &backoff, &self.config.max_attempts],
                )
                .await?;
            match row.map(|r| r.get::<_, String>(0)).as_deref() {
                Some("dead") => {
                    tracing::warn!(id = %message.id, aggregate = %message.aggregate,
                        "outbox message is a dead letter after {} attempts: {why}",
                        message.attempts + 1);
                    report.dead += 1;
                }
                _ => report.retried += 1,
            }
        }
        tx.commit().await?;

        report.published = sent.len();
        let schema = self.outbox.schema().name().to_string();
        metrics::counter!("baton_txn_outbox_published_total", "schema" => schema.clone())
            .increment(report.published as u64);
        metrics::counter!("baton_txn_outbox_publish_failures_total", "schema" => schema.clone(), "kind" => "rejected")
            .increment(refused.len() as u64);
        metrics::counter!("baton_txn_outbox_publish_failures_total", "schema" => schema.clone(), "kind" => "unavailable")
            .increment(report.unavailable as u64);
        metrics::counter!("baton_txn_outbox_dead_lettered_total", "schema" => schema)
            .increment(report.dead as u64);
        Ok(report)
    }

    /// Runs rounds until `shutdown` completes or the fence refuses a write
    /// ([`Error::Fenced`], returned). Database errors (PostgreSQL restarting, a dropped
    /// connection) and broker outages are waited out with backoff: `connect` is called again
    /// for a new connection. Stopping through `shutdown` may cut a round short; what it had
    /// published goes out again from the next relay.
    pub async fn run<C, Fut>(
        &self,
        connect: C,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error>
    where
        C: FnMut() -> Fut,
        Fut: Future<Output = Result<Client, Error>>,
    {
        tokio::select! {
            () = shutdown => Ok(()),
            result = self.run_rounds(connect, std::future::pending()) => result,
        }
    }

    /// Like [`Relay::run`], but `stop` never cuts a round short: it is looked at between
    /// rounds and during the waits, and a round that has started runs to its COMMIT (or its
    /// fence refusal). [`ha::HaRelay`] stops this way when it loses its leadership, so that
    /// a relay deposed in the middle of a round — the case the fence exists for, since a
    /// paused process cannot notice its deposition in time — meets the fence instead of
    /// vanishing; either ending is safe, this one is observable.
    pub async fn run_until<C, Fut>(
        &self,
        connect: C,
        stop: impl Future<Output = ()>,
    ) -> Result<(), Error>
    where
        C: FnMut() -> Fut,
        Fut: Future<Output = Result<Client, Error>>,
    {
        self.run_rounds(connect, stop).await
    }

    async fn run_rounds<C, Fut>(
        &self,
        mut connect: C,
        stop: impl Future<Output = ()>,
    ) -> Result<(), Error>
    where
        C: FnMut() -> Fut,
        Fut: Future<Output = Result<Client, Error>>,
    {
        let mut stop = pin!(stop);
        let mut stopped = false;
        // Waits `d`, or less if `stop` completes; returns whether it did.
        macro_rules! wait {
            ($d:expr) => {{
                let d = $d;
                if !stopped {
                    tokio::select! {
                        () = &mut stop => stopped = true,
                        () = tokio::time::sleep(d) => {}
                    }
                }
                stopped
            }};
        }
        let mut client: Option<Client> = None;
        let mut failures = 0;
        let mut metrics_due = Instant::now();
        loop {
            if stopped {
                return Ok(());
            }
            tokio::select! {
                biased;
                () = &mut stop => return Ok(()),
                () = std::future::ready(()) => {}
            }
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                let connected = tokio::select! {
                    () = &mut stop => return Ok(()),
                    connected = connect() => connected,
                };
                match connected {
                    Ok(c) => client = Some(c),
                    Err(e) => {
                        tracing::warn!("relay: cannot connect to the database: {e}");
                        wait!(self.backoff(failures));
                        failures += 1;
                        continue;
                    }
                }
            }
            let c = client.as_mut().expect("connected above");
            if Instant::now() >= metrics_due {
                metrics_due = Instant::now() + self.config.metrics_interval;
                if let Err(e) = self.export_gauges(c).await {
                    tracing::debug!("relay: gauges not refreshed: {e}");
                }
            }
            match self.run_once(c).await {
                Ok(report) => {
                    if report.unavailable > 0 {
                        wait!(self.backoff(failures));
                        failures += 1;
                    } else {
                        failures = 0;
                        if report.read == 0 {
                            wait!(self.config.poll_interval);
                        }
                    }
                }
                Err(e @ Error::Fenced(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!("relay: round failed, reconnecting: {e}");
                    client = None;
                    wait!(self.backoff(failures));
                    failures += 1;
                }
            }
        }
    }

    /// Refreshes the gauges: pending rows (the lag), dead letters, age of the oldest
    /// pending message.
    pub async fn export_gauges(&self, client: &Client) -> Result<(), Error> {
        let stats = self.outbox.stats(client).await?;
        let schema = self.outbox.schema().name().to_string();
        metrics::gauge!("baton_txn_outbox_pending_rows", "schema" => schema.clone())
            .set(stats.pending as f64);
        metrics::gauge!("baton_txn_outbox_dead_rows", "schema" => schema.clone())
            .set(stats.dead as f64);
        metrics::gauge!("baton_txn_outbox_oldest_pending_seconds", "schema" => schema)
            .set(stats.oldest_pending_age.as_secs_f64());
        Ok(())
    }

    /// The wait after the `attempts + 1`-th failure in a row: `initial · 2^attempts`, at most
    /// `max_backoff`, scaled by a random 50–100 % so that many relays (or aggregates) do not
    /// retry in lockstep.
    fn backoff(&self, attempts: i32) -> Duration {
        let exp = attempts.clamp(0, 30) as u32;
        let base = self
            .config
            .initial_backoff
            .saturating_mul(1u32 << exp)
            .min(self.config.max_backoff);
        base.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
    }
}
