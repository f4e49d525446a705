//! Relay high availability through Baton, against a real `baton serve` (started here), the
//! real PostgreSQL and NATS JetStream (`scripts/services`):
//!
//! - the fence itself: an older token's mark-sent transaction is refused and rolled back;
//! - two in-process instances over two partitions drain an outbox, each partition once;
//! - two relay *processes*, the active one SIGKILLed mid-batch: the other takes over after
//!   the lease, republishes what was not marked (JetStream drops the duplicates), loses
//!   nothing, keeps per-aggregate order;
//! - two relay processes, the active one SIGSTOPped mid-batch past its lease: the other takes
//!   over; the paused one, SIGCONTed, finishes its round and its mark-sent is refused by the
//!   fence (its `FENCED` event and the fence row's `refusals`), nothing lost, order kept.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use baton_client::testing::{Flavor, TestServer};
use baton_client::{ClientConfig, SessionOptions};
use baton_txn::pg::{Message, Outbox};
use baton_txn::relay::ha::{HaConfig, HaEvent, HaRelay};
use baton_txn::relay::nats::JetStreamPublisher;
use baton_txn::relay::{Fence, PgFence};
use baton_txn::Error;
use common::{connect, connect_nats, fresh_schema, try_connect};
use futures_util::StreamExt;

const AGGREGATES: usize = 20;
const PER_AGGREGATE: usize = 100;
/// The session TTL of the relays: how long a dead or paused leader keeps its partition.
const TTL: Duration = Duration::from_secs(2);

async fn baton(endpoint: &str) -> baton_client::Client {
    baton_client::Client::connect(ClientConfig::new([endpoint.to_string()]))
        .await
        .unwrap()
}

async fn fresh_stream(js: &jetstream::Context, name: &str, subject: &str) -> stream::Stream {
    let _ = js.delete_stream(name).await;
    js.create_stream(stream::Config {
        name: name.to_string(),
        subjects: vec![subject.to_string()],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Every payload of the stream, in stream order, with its message id.
async fn read_stream(stream: &mut stream::Stream) -> Vec<(String, String)> {
    let total = stream.info().await.unwrap().state.messages as usize;
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .messages()
            .await
            .unwrap();
        while let Some(message) = batch.next().await {
            let message = message.unwrap();
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .expect("Nats-Msg-Id")
                .to_string();
            out.push((id, String::from_utf8(message.payload.to_vec()).unwrap()));
        }
    }
    out
}

/// The consumer's checks: every message exactly once, each aggregate in order.
async fn assert_stream_exact(stream: &mut stream::Stream, total: usize) {
    let messages = read_stream(stream).await;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (id, _) in &messages {
        *seen.entry(id).or_default() += 1;
    }
    println!(
        "consumer: {} messages in the stream, {} distinct ids",
        messages.len(),
        seen.len()
    );
    assert_eq!(seen.len(), total, "no message lost");
    assert_eq!(messages.len(), total, "no duplicate stored");
    let payloads: Vec<String> = messages.into_iter().map(|(_, p)| p).collect();
    common::assert_per_aggregate_order(&payloads, AGGREGATES, PER_AGGREGATE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_token_is_refused_in_the_mark_sent_transaction() {
    let schema = fresh_schema("t_relay_ha_fence").await;
    let outbox = Outbox::new(&schema);
    let mut client = connect().await;
    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue(&tx, &Message::new("a", "nowhere", "x"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let old = PgFence::new(&schema, "p/0", 5);
    let new = PgFence::new(&schema, "p/0", 7);
    old.raise(&mut client).await.unwrap();
    // The same token again passes (every round of one leader checks it).
    old.raise(&mut client).await.unwrap();
    new.raise(&mut client).await.unwrap();

    // The old leader's transaction: its write, after the check, is rolled back with it.
    let tx = client.transaction().await.unwrap();
    let refused = old.check(&tx).await;
    assert!(
        matches!(&refused, Err(Error::Fenced(m)) if m.contains("token 5 is older than 7")),
        "{refused:?}"
    );
    drop(tx);
    old.record_refusal(&client).await.unwrap();
    assert_eq!(
        PgFence::read(&schema, &client, "p/0").await.unwrap(),
        Some((7, 1))
    );
    assert!(matches!(
        old.raise(&mut client).await,
        Err(Error::Fenced(_))
    ));
    // Other partitions are fenced independently.
    PgFence::new(&schema, "p/1", 1)
        .raise(&mut client)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_two_partitions_one_leader_each() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_schema("t_relay_ha_parts").await;
    let nats = connect_nats().await;
    let js = jetstream::new(nats.clone());
    let subject = "t_relay_ha_parts.orders";
    let mut stream = fresh_stream(&js, "T_RELAY_HA_PARTS", subject).await;
    common::enqueue_all(&schema, subject, AGGREGATES, PER_AGGREGATE).await;

    let leading: Arc<Mutex<Vec<(String, u32, i64)>>> = Arc::default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for instance in ["x", "y"] {
        let mut config = HaConfig::new("t_relay_ha_parts", instance);
        config.partitions = 2;
        config.session = SessionOptions::new().with_ttl(TTL);
        let leading = leading.clone();
        let ha = HaRelay::new(
            baton(&server.endpoint()).await,
            Outbox::new(&schema),
            JetStreamPublisher::new(nats.clone()),
            config,
        )
        .on_event(move |e| {
            if let HaEvent::Leading { partition, token } = e {
                leading
                    .lock()
                    .unwrap()
                    .push((instance.to_string(), *partition, *token));
            }
        });
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            ha.run(try_connect, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
        }));
    }
    common::wait_drained(&schema, Duration::from_secs(120)).await;
    stop.send(true).unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let leading = leading.lock().unwrap().clone();
    println!("leaders: {leading:?}");
    let mut partitions: Vec<u32> = leading.iter().map(|l| l.1).collect();
    partitions.sort();
    assert_eq!(partitions, vec![0, 1], "one leadership per partition");
    assert_stream_exact(&mut stream, AGGREGATES * PER_AGGREGATE).await;
    let client = connect().await;
    for p in 0..2 {
        let name = HaRelay::<JetStreamPublisher>::fence_name("t_relay_ha_parts", p);
        let (token, refusals) = PgFence::read(&schema, &client, &name)
            .await
            .unwrap()
            .unwrap();
        assert!(token > 0);
        assert_eq!(refusals, 0);
    }
}
