//! The relay to a real NATS JetStream (`scripts/services` starts it): 10,000 messages through
//! two SIGKILLed relays, each message stored by the stream exactly once (its `Nats-Msg-Id`
//! window drops what a killed relay had published but not marked), in order per aggregate;
//! and a message no stream takes ending as a dead letter.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use crate::common::{connect, connect_nats, fresh_schema, fresh_stream, read_stream, try_connect};
use async_nats::jetstream;
use baton_txn::pg::{Message, Outbox, Schema};
use baton_txn::relay::nats::JetStreamPublisher;
use baton_txn::relay::{Relay, RelayConfig};

const SCHEMA: &str = "t_relay_nats";
const STREAM: &str = "T_RELAY_NATS";
const SUBJECT: &str = "t_relay_nats.orders";
const AGGREGATES: usize = 100;
const PER_AGGREGATE: usize = 100;

/// The child's side (see common: `run_faulty_relay`). Does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_child_process() {
    let Ok(fault) = std::env::var(common::FAULT_ENV) else {
        return;
    };
    let publisher = JetStreamPublisher::new(connect_nats().await);
    common::run_faulty_relay(&Schema::new(SCHEMA).unwrap(), publisher, &fault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_exactly_once_through_killed_relays() {
    let schema = fresh_schema(SCHEMA).await;
    let nats = connect_nats().await;
    let js = jetstream::new(nats.clone());
    let mut stream = fresh_stream(&js, STREAM, &[SUBJECT]).await;
    common::enqueue_all(&schema, SUBJECT, AGGREGATES, PER_AGGREGATE).await;
    let total = AGGREGATES * PER_AGGREGATE;

    // Killed after publishing its third batch, before marking it sent; then a second relay
    // killed in the middle of a batch.
    for fault in ["after_publish", "mid_batch"] {
        tokio::task::spawn_blocking(move || {
            common::run_child_until_killed("relay_nats::fault_child_process", fault)
        })
        .await
        .unwrap();
        let client = connect().await;
        let stats = Outbox::new(&schema).stats(&client).await.unwrap();
        let stored = stream.info().await.unwrap().state.messages as usize;
        println!(
            "killed at {fault}: {} pending, {stored} in the stream",
            stats.pending
        );
        assert!(
            stored > total - stats.pending as usize,
            "the killed relay published messages it did not mark sent"
        );
    }

    // A third relay finishes the work and republishes what the killed ones had not marked.
    let relay = Relay::new(
        Outbox::new(&schema),
        JetStreamPublisher::new(nats.clone()),
        RelayConfig::default(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let schema = schema.clone();
        tokio::spawn(async move {
            let _keep = schema;
            relay
                .run(try_connect, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            relay
        })
    };
    common::wait_drained(&schema, Duration::from_secs(120)).await;
    stop.send(()).unwrap();
    let relay = running.await.unwrap();
    let duplicates = relay.publisher().duplicates();

    // The consumer: every message id exactly once, every aggregate in order.
    let messages = read_stream(&mut stream).await;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (id, _) in &messages {
        *seen.entry(id).or_default() += 1;
    }
    println!(
        "nats: {} messages in the stream, {} distinct ids, {duplicates} republished duplicates \
         dropped by the stream",
        messages.len(),
        seen.len()
    );
    assert_eq!(messages.len(), total);
    assert_eq!(seen.len(), total);
    assert!(
        duplicates > 0,
        "the last relay republished what the killed ones had not marked"
    );
    let payloads: Vec<String> = messages.into_iter().map(|(_, p)| p).collect();
    common::assert_per_aggregate_order(&payloads, AGGREGATES, PER_AGGREGATE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_without_a_stream_ends_as_a_dead_letter() {
    let schema = fresh_schema("t_relay_nats_dead").await;
    let outbox = Outbox::new(&schema);
    let nats = connect_nats().await;
    let js = jetstream::new(nats.clone());
    let mut stream = fresh_stream(&js, "T_RELAY_NATS_DEAD", &["t_relay_nats_dead.ok"]).await;
    let mut client = connect().await;
    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue(
            &tx,
            &Message::new("a", "t_relay_nats_dead.nowhere", "lost?"),
        )
        .await
        .unwrap();
    outbox
        .enqueue(&tx, &Message::new("a", "t_relay_nats_dead.ok", "after it"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let relay = Relay::new(
        outbox.clone(),
        JetStreamPublisher::new(nats),
        RelayConfig {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(20),
            publish_timeout: Duration::from_secs(5),
            ..RelayConfig::default()
        },
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while outbox.stats(&client).await.unwrap().pending > 0 {
        assert!(tokio::time::Instant::now() < deadline, "not settled");
        relay.run_once(&mut client).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dead = outbox.dead_letters(&client, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message.payload, b"lost?");
    assert_eq!(dead[0].message.attempts, 3);
    println!("dead letter: {}", dead[0].last_error);
    let messages = read_stream(&mut stream).await;
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].1, "after it");
}
