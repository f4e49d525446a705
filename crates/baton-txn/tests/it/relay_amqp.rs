//! The relay to a real RabbitMQ (`scripts/services` starts it): 10,000 messages through two
//! SIGKILLed relays, applied exactly once by a consumer whose `Inbox` drops the republished
//! duplicates (RabbitMQ itself delivers them), in order per aggregate; and messages RabbitMQ
//! refuses (unroutable `mandatory`, a missing exchange) ending as dead letters.

use crate::common;

use std::time::Duration;

use crate::common::{amqp_url, connect, connect_amqp, fresh_schema, try_connect};
use baton_txn::pg::{Inbox, Message, Outbox, Schema};
use baton_txn::relay::amqp::AmqpPublisher;
use baton_txn::relay::{Relay, RelayConfig, AGGREGATE_HEADER};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};

const SCHEMA: &str = "t_relay_amqp";
const QUEUE: &str = "t_relay_amqp";
const AGGREGATES: usize = 100;
const PER_AGGREGATE: usize = 100;

/// The child's side (see common: `run_faulty_relay`). Does nothing in a normal test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_child_process() {
    let Ok(fault) = std::env::var(common::FAULT_ENV) else {
        return;
    };
    // The default exchange routes by queue name: the topic is the queue.
    let publisher = AmqpPublisher::new(amqp_url(), "");
    common::run_faulty_relay(&Schema::new(SCHEMA).unwrap(), publisher, &fault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_applied_exactly_once_through_killed_relays() {
    let schema = fresh_schema(SCHEMA).await;
    let amqp = connect_amqp().await;
    let channel = amqp.create_channel().await.unwrap();
    let _ = channel
        .queue_delete(QUEUE.into(), QueueDeleteOptions::default())
        .await;
    channel
        .queue_declare(
            QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    common::enqueue_all(&schema, QUEUE, AGGREGATES, PER_AGGREGATE).await;
    let total = AGGREGATES * PER_AGGREGATE;

    for fault in ["after_publish", "mid_batch"] {
        tokio::task::spawn_blocking(move || {
            common::run_child_until_killed("relay_amqp::fault_child_process", fault)
        })
        .await
        .unwrap();
        let client = connect().await;
        let stats = Outbox::new(&schema).stats(&client).await.unwrap();
        println!("killed at {fault}: {} pending", stats.pending);
        assert!(stats.pending > 0 && (stats.pending as usize) < total);
    }
    let started = std::time::Instant::now();
    let relay = Relay::new(
        Outbox::new(&schema),
        AmqpPublisher::new(amqp_url(), ""),
        RelayConfig::default(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        relay
            .run(try_connect, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    common::wait_drained(&schema, Duration::from_secs(180)).await;
    stop.send(()).unwrap();
    running.await.unwrap();
    println!(
        "amqp: the last relay drained the outbox in {:?}",
        started.elapsed()
    );
    let started = std::time::Instant::now();

    // The consumer: the inbox row and the effect in one transaction, then the ack.
    let inbox = Inbox::new(&schema);
    let mut client = connect().await;
    channel
        .basic_qos(500, BasicQosOptions::default())
        .await
        .unwrap();
    let mut deliveries = channel
        .basic_consume(
            QUEUE.into(),
            "t_relay_amqp_consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let effect = format!(
        "INSERT INTO {}.effects (tenant, key, body) VALUES ('amqp', $1, $2)",
        schema.name()
    );
    let (mut delivered, mut applied) = (0usize, 0usize);
    // Every message was published and confirmed before the relay drained, so once the
    // queue is quiet for a while everything has been delivered.
    while let Ok(Some(delivery)) =
        tokio::time::timeout(Duration::from_secs(3), deliveries.next()).await
    {
        let delivery = delivery.unwrap();
        delivered += 1;
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .expect("message_id")
            .to_string();
        let aggregate = match delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(AGGREGATE_HEADER))
        {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("aggregate header: {other:?}"),
        };
        let payload = String::from_utf8(delivery.data.clone()).unwrap();
        assert!(payload.starts_with(&format!("{aggregate}:")));
        let tx = client.transaction().await.unwrap();
        if inbox.first_time(&tx, "orders", &id).await.unwrap() {
            tx.execute(&effect, &[&id, &payload]).await.unwrap();
            applied += 1;
        }
        tx.commit().await.unwrap();
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }

    let rows = client
        .query(
            &format!(
                "SELECT body FROM {}.effects WHERE tenant = 'amqp' ORDER BY id",
                schema.name()
            ),
            &[],
        )
        .await
        .unwrap();
    let effects: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    println!("amqp: consumed in {:?}", started.elapsed());
    println!(
        "amqp: {delivered} deliveries, {applied} applied, {} effects, {} duplicates dropped by \
         the inbox",
        effects.len(),
        delivered - applied
    );
    assert_eq!(applied, total);
    assert_eq!(effects.len(), total);
    assert!(
        delivered > total,
        "the killed relays' unmarked messages were delivered again"
    );
    common::assert_per_aggregate_order(&effects, AGGREGATES, PER_AGGREGATE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_messages_end_as_dead_letters() {
    let schema = fresh_schema("t_relay_amqp_dead").await;
    // A missing RabbitMQ fails here with a clear message, not as "not settled" below (the
    // relay takes an outage for something to wait out).
    drop(connect_amqp().await);
    let outbox = Outbox::new(&schema);
    let mut client = connect().await;
    let tx = client.transaction().await.unwrap();
    // No queue is bound to this routing key: `mandatory` makes RabbitMQ return it.
    outbox
        .enqueue(&tx, &Message::new("a", "t_relay_amqp_no_such_queue", "x"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let config = RelayConfig {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(20),
        publish_timeout: Duration::from_secs(5),
        ..RelayConfig::default()
    };
    let unroutable = Relay::new(
        outbox.clone(),
        AmqpPublisher::new(amqp_url(), ""),
        config.clone(),
    );
    let settle = async |relay: &Relay<AmqpPublisher>, client: &mut tokio_postgres::Client| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while outbox.stats(client).await.unwrap().pending > 0 {
            assert!(tokio::time::Instant::now() < deadline, "not settled");
            relay.run_once(client).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    settle(&unroutable, &mut client).await;

    // An exchange that does not exist: RabbitMQ closes the channel (404), the publisher
    // opens a new one for each attempt.
    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue(&tx, &Message::new("b", "anything", "y"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let missing = Relay::new(
        outbox.clone(),
        AmqpPublisher::new(amqp_url(), "t_relay_amqp_no_such_exchange"),
        config,
    );
    settle(&missing, &mut client).await;

    let dead = outbox.dead_letters(&client, 10).await.unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    for letter in &dead {
        println!("dead letter: {}", letter.last_error);
        assert_eq!(letter.message.attempts, 3);
    }
    assert!(dead[0].last_error.contains("returned"), "{:?}", dead[0]);
    assert!(dead[1].last_error.contains("NOT_FOUND"), "{:?}", dead[1]);
}
