//! PostgreSQL restarted under a running relay (its own test binary, the one exception to
//! tests/it/: the restart cuts every connection, which would break tests running beside it,
//! and cargo runs test binaries one at a time). The relay loses its connection in
//! the middle of its rounds, reconnects with backoff and finishes; JetStream drops what it
//! republishes; nothing is lost and every aggregate stays in order.
//!
//! It restarts the cluster of `scripts/services` (`stop pg`, `start pg`), so it needs that
//! cluster, not a server elsewhere.

// The shared helpers of tests/it/, compiled into this binary too (only some are used here).
#[path = "it/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, stream};
use baton_txn::pg::{Outbox, OutboxMessage};
use baton_txn::relay::nats::JetStreamPublisher;
use baton_txn::relay::{PublishError, Publisher, Relay, RelayConfig};
use common::{connect, connect_nats, fresh_schema, try_connect};

const SUBJECT: &str = "t_relay_restart.orders";
const AGGREGATES: usize = 30;
const PER_AGGREGATE: usize = 100;

/// Starts PostgreSQL again if the test fails while it is stopped, so the test binaries after
/// this one find it running.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            common::services(&["start", "pg"]);
        }
    }
}

/// Counts publishes and slows them down, so the restart lands in the middle of the run.
struct Slow {
    inner: JetStreamPublisher,
    published: Arc<AtomicUsize>,
}

impl Publisher for Slow {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.inner.publish(message).await?;
        self.published.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn postmaster_start() -> SystemTime {
    connect()
        .await
        .query_one("SELECT pg_postmaster_start_time()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_a_running_relay_loses_nothing() {
    assert_eq!(
        common::pg_url(),
        common::DEFAULT_PG_URL,
        "this test restarts the cluster of scripts/services and needs BATON_TEST_PG_URL unset \
         or pointing at it"
    );
    let schema = fresh_schema("t_relay_restart").await;
    let nats = connect_nats().await;
    let js = jetstream::new(nats.clone());
    let _ = js.delete_stream("T_RELAY_RESTART").await;
    let mut stream = js
        .create_stream(stream::Config {
            name: "T_RELAY_RESTART".into(),
            subjects: vec![SUBJECT.into()],
            ..Default::default()
        })
        .await
        .unwrap();
    common::enqueue_all(&schema, SUBJECT, AGGREGATES, PER_AGGREGATE).await;
    let total = AGGREGATES * PER_AGGREGATE;
    let before = postmaster_start().await;

    let published = Arc::new(AtomicUsize::new(0));
    let relay = Relay::new(
        Outbox::new(&schema),
        Slow {
            inner: JetStreamPublisher::new(nats),
            published: published.clone(),
        },
        RelayConfig {
            batch_size: 100,
            max_backoff: Duration::from_secs(1),
            ..RelayConfig::default()
        },
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(try_connect, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        relay
    });

    while published.load(Ordering::SeqCst) < total / 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let guard = RestartOnDrop;
    tokio::task::spawn_blocking(|| {
        common::services(&["stop", "pg"]);
        // Down long enough for the relay to fail a few times and back off.
        std::thread::sleep(Duration::from_secs(1));
        common::services(&["start", "pg"]);
    })
    .await
    .unwrap();
    let at_restart = published.load(Ordering::SeqCst);
    println!("restarted PostgreSQL after {at_restart} publishes");
    assert!(at_restart < total, "the relay was still running");
    assert_ne!(postmaster_start().await, before, "PostgreSQL was restarted");

    common::wait_drained(&schema, Duration::from_secs(120)).await;
    stop.send(()).unwrap();
    let relay = running.await.unwrap();
    drop(guard);

    let messages = common::read_stream(&mut stream).await;
    let ids: HashSet<&str> = messages.iter().map(|(id, _)| id.as_str()).collect();
    let payloads: Vec<String> = messages.iter().map(|(_, p)| p.clone()).collect();
    println!(
        "after the restart: {} in the stream, {} distinct, {} duplicates dropped",
        payloads.len(),
        ids.len(),
        relay.publisher().inner.duplicates()
    );
    assert_eq!(payloads.len(), total);
    assert_eq!(ids.len(), total);
    common::assert_per_aggregate_order(&payloads, AGGREGATES, PER_AGGREGATE);
}
