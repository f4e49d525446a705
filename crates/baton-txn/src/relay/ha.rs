//! Relay high availability through Baton (feature `baton`): several relay processes, one
//! active per outbox partition.
//!
//! Each partition has an election of its own (`<prefix>/<index>`) and every instance
//! campaigns in all of them, each with its own session (a Baton lease kept alive in the
//! background). The winner of partition `p`:
//!
//! 1. takes the election's fencing token (the leader key's create revision — larger for every
//!    later leader) and raises the partition's [`PgFence`] to it in PostgreSQL, before it
//!    publishes anything, so every earlier leader's next progress write is refused;
//! 2. runs a [`Relay`] over [`Outbox::partition`]`(p, n)` with that fence, until its
//!    leadership is lost (the session could not be renewed in time, the key deleted) or the
//!    fence refuses it;
//! 3. then starts over: a new session, a new campaign, behind the current leader.
//!
//! The session tells a live relay to stop before its lease can expire on the server; the
//! fence is for the relay that cannot act on that (paused, stalled): its round goes on when
//! it wakes, and its mark-sent transaction is refused because the new leader raised the fence
//! (see [`PgFence`] for why that check must be inside the same PostgreSQL transaction). So a
//! deposed relay can at worst publish a duplicate (dropped by JetStream's `Nats-Msg-Id`
//! window or the consumer's inbox), never mark a message it did not publish, never lose one.
//! Per-aggregate order survives the handover: each relay publishes an aggregate in outbox
//! order and only after the previous message was acknowledged, so the first copy of every
//! message reaches the broker after the first copy of its predecessor.
//!
//! Leadership stops the relay between rounds ([`Relay::run_until`]), never in the middle of
//! one, so a round in flight when leadership goes meets the fence.

use std::sync::Arc;
use std::time::Duration;

use baton_client::{Election, FencingToken, LostReason, Session, SessionOptions};
use tokio_postgres::Client;

use super::engine::{Relay, RelayConfig};
use super::fence::PgFence;
use super::publisher::Publisher;
use crate::pg::Outbox;
use crate::Error;

/// What a [`HaRelay`] instance did, for logs, tests and operators ([`HaRelay::on_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HaEvent {
    /// Elected for `partition` with `token`, the fence raised: now relaying.
    Leading {
        /// The partition index.
        partition: u32,
        /// The fencing token.
        token: FencingToken,
    },
    /// Stopped relaying `partition`: leadership lost (the session's reason).
    Lost {
        /// The partition index.
        partition: u32,
        /// Why.
        reason: String,
    },
    /// A progress write for `partition` was refused by the fence: a newer leader exists.
    Fenced {
        /// The partition index.
        partition: u32,
        /// This instance's (stale) token.
        token: FencingToken,
        /// The refusal.
        message: String,
    },
}

/// Settings of a [`HaRelay`].
#[derive(Clone, Debug)]
pub struct HaConfig {
    /// Election names are `<prefix>/<partition index>`; the fence rows `<prefix>/<index>`
    /// too. All instances relaying one outbox use the same prefix.
    pub prefix: String,
    /// Number of partitions (same for every instance). 1 by default.
    pub partitions: u32,
    /// This instance's name, the value it proposes in the elections (shown as the leader).
    pub instance: String,
    /// The sessions' settings: their TTL is how long a crashed or paused leader keeps its
    /// partitions before another instance takes over.
    pub session: SessionOptions,
    /// The relay's settings.
    pub relay: RelayConfig,
}

impl HaConfig {
    /// One partition, default session and relay settings.
    pub fn new(prefix: impl Into<String>, instance: impl Into<String>) -> Self {
        HaConfig {
            prefix: prefix.into(),
            partitions: 1,
            instance: instance.into(),
            session: SessionOptions::default(),
            relay: RelayConfig::default(),
        }
    }
}

type Observer = Arc<dyn Fn(&HaEvent) + Send + Sync>;

/// One relay instance of a group that keeps one active relay per partition (module docs).
pub struct HaRelay<P> {
    baton: baton_client::Client,
    outbox: Outbox,
    publisher: Arc<P>,
    config: HaConfig,
    observer: Option<Observer>,
}

impl<P: Publisher + 'static> HaRelay<P> {
    /// An instance relaying `outbox` through `publisher`, campaigning on the Baton cluster
    /// `baton` is connected to.
    pub fn new(
        baton: baton_client::Client,
        outbox: Outbox,
        publisher: P,
        config: HaConfig,
    ) -> Self {
        assert!(config.partitions > 0, "at least one partition");
        HaRelay {
            baton,
            outbox,
            publisher: Arc::new(publisher),
            config,
            observer: None,
        }
    }

    /// Calls `f` with every [`HaEvent`] (from the partitions' tasks; keep it short).
    pub fn on_event(mut self, f: impl Fn(&HaEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(f));
        self
    }

    /// The shared publisher (to read an adapter's counters).
    pub fn publisher(&self) -> &Arc<P> {
        &self.publisher
    }

    /// The fence row name of partition `index`.
    pub fn fence_name(prefix: &str, index: u32) -> String {
        format!("{prefix}/{index}")
    }

    /// Campaigns for every partition and relays the ones won, until `shutdown` completes.
    /// Errors (Baton or PostgreSQL unreachable, leadership lost, fenced) are logged and
    /// waited out; the instance never gives up on its own. `connect` opens a PostgreSQL
    /// connection (called again after a failure).
    pub async fn run<C, Fut>(&self, connect: C, shutdown: impl std::future::Future<Output = ()>)
    where
        C: Fn() -> Fut + Clone + Send + Sync,
        Fut: std::future::Future<Output = Result<Client, Error>> + Send,
    {
        let partitions =
            (0..self.config.partitions).map(|index| self.run_partition(index, connect.clone()));
        tokio::select! {
            () = shutdown => {}
            _ = futures_util::future::join_all(partitions) => {}
        }
    }

    fn emit(&self, event: HaEvent) {
        match &event {
            HaEvent::Leading { partition, token } => {
                tracing::info!(partition, token = token.get(), instance = %self.config.instance, "relay: leading")
            }
            HaEvent::Lost { partition, reason } => {
                tracing::warn!(partition, %reason, instance = %self.config.instance, "relay: leadership lost")
            }
            HaEvent::Fenced {
                partition,
                token,
                message,
            } => {
                tracing::warn!(partition, token = token.get(), %message, instance = %self.config.instance, "relay: fenced off")
            }
        }
        if let Some(f) = &self.observer {
            f(&event);
        }
    }

    async fn run_partition<C, Fut>(&self, index: u32, connect: C)
    where
        C: Fn() -> Fut + Clone + Send + Sync,
        Fut: std::future::Future<Output = Result<Client, Error>> + Send,
    {
        let name = Self::fence_name(&self.config.prefix, index);
        let election = Election::new(&self.baton, name.clone());
        let outbox = self.outbox.partition(index, self.config.partitions);
        let mut failures: u32 = 0;
        loop {
            if failures > 0 {
                let pause = Duration::from_millis(100)
                    .saturating_mul(1 << failures.min(5))
                    .min(Duration::from_secs(5));
                tokio::time::sleep(pause).await;
            }
            // A session per partition: losing one partition's lease (or resigning it) leaves
            // the others alone.
            let session = match Session::new(&self.baton, self.config.session.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(partition = index, "relay: no Baton session: {e}");
                    failures += 1;
                    continue;
                }
            };
            let leadership = match election
                .campaign(&session, self.config.instance.clone())
                .await
            {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(partition = index, "relay: campaign failed: {e}");
                    let _ = session.close().await;
                    failures += 1;
                    continue;
                }
            };
            let token = leadership.fencing_token();
            // The fence row is a `bigint`: PgFence takes the token's number.
            let fence = PgFence::new(self.outbox.schema(), name.clone(), token.get());
            // Raise the fence before publishing anything: from here on every older leader's
            // progress write is refused, even if this one has none to make yet.
            let raised = match connect().await {
                Ok(mut client) => fence.raise(&mut client).await,
                Err(e) => Err(e),
            };
            match raised {
                Ok(()) => {}
                Err(Error::Fenced(message)) => {
                    // A newer leader already wrote: this leadership is stale on arrival.
                    self.emit(HaEvent::Fenced {
                        partition: index,
                        token,
                        message,
                    });
                    let _ = leadership.resign().await;
                    let _ = session.close().await;
                    failures += 1;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(partition = index, "relay: cannot raise the fence: {e}");
                    let _ = leadership.resign().await;
                    let _ = session.close().await;
                    failures += 1;
                    continue;
                }
            }
            failures = 0;
            self.emit(HaEvent::Leading {
                partition: index,
                token,
            });
            let relay = Relay::with_fence(
                outbox.clone(),
                self.publisher.clone(),
                fence.clone(),
                self.config.relay.clone(),
            );
            let lost = leadership.lost();
            let lost_reason = Arc::new(std::sync::Mutex::new(None::<LostReason>));
            let stop = {
                let lost_reason = lost_reason.clone();
                async move {
                    let reason = lost.await;
                    *lost_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
                }
            };
            match relay.run_until(connect.clone(), stop).await {
                Ok(()) => {
                    let reason = lost_reason
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .map_or_else(|| "stopped".to_string(), |r| r.to_string());
                    self.emit(HaEvent::Lost {
                        partition: index,
                        reason,
                    });
                }
                Err(Error::Fenced(message)) => {
                    // Recorded before the event is emitted, so whoever sees the event finds
                    // the refusal counted in the fence row.
                    if let Ok(client) = connect().await {
                        if let Err(e) = fence.record_refusal(&client).await {
                            tracing::debug!("relay: refusal not recorded: {e}");
                        }
                    }
                    self.emit(HaEvent::Fenced {
                        partition: index,
                        token,
                        message,
                    });
                    let _ = leadership.resign().await;
                }
                Err(e) => {
                    tracing::warn!(partition = index, "relay stopped: {e}");
                    let _ = leadership.resign().await;
                    failures += 1;
                }
            }
            let _ = session.close().await;
        }
    }
}
