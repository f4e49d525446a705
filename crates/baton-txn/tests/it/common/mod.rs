//! Shared set-up: a connection to the test PostgreSQL and a fresh schema per test, so tests
//! run in parallel without seeing each other's rows.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use baton_txn::pg::{Client, Message, Outbox, OutboxMessage, Schema, Transaction};
use baton_txn::relay::{Fence, PublishError, Publisher, Relay, RelayConfig};
use tokio_postgres::NoTls;

/// The server `scripts/services` starts (and `scripts/test` starts before the tests).
pub const DEFAULT_PG_URL: &str = "postgres://baton@127.0.0.1:55432/baton";

/// Runs `scripts/services` with `args` (the restart tests stop and start the servers).
pub fn services(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/services");
    let status = Command::new(script).args(args).status().unwrap();
    assert!(status.success(), "scripts/services {args:?}: {status}");
}

pub fn pg_url() -> String {
    std::env::var("BATON_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string())
}

/// A new connection. A missing server is a failure, never a skip: these tests are the proof
/// that the store works on a real PostgreSQL.
pub async fn connect() -> Client {
    let url = pg_url();
    match tokio_postgres::connect(&url, NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(async move {
                let _ = connection.await;
            });
            client
        }
        Err(e) => panic!(
            "PostgreSQL is not reachable at {url}: {e}\n\
             The baton-txn tests need a real server: run `scripts/services` (scripts/test \
             does this first) or point BATON_TEST_PG_URL at one."
        ),
    }
}

/// Drops and recreates `name` with the crate's tables plus `effects`, the table the tests'
/// "work" writes to (one row per execution, so counting rows counts executions).
pub async fn fresh_schema(name: &str) -> Schema {
    let schema = Schema::new(name).unwrap();
    let mut client = connect().await;
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
        .await
        .unwrap();
    schema.migrate(&mut client).await.unwrap();
    // A second run finds everything in place.
    schema.migrate(&mut client).await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE {name}.effects (id bigserial PRIMARY KEY, tenant text NOT NULL,
                                          key text NOT NULL, body text NOT NULL)"
        ))
        .await
        .unwrap();
    schema
}

pub async fn count_effects(client: &Client, schema: &Schema, tenant: &str, key: &str) -> i64 {
    client
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.effects WHERE tenant = $1 AND key = $2",
                schema.name()
            ),
            &[&tenant, &key],
        )
        .await
        .unwrap()
        .get(0)
}

/// A connection for a relay's `connect`: errors are returned (the relay retries), not panics.
pub async fn try_connect() -> Result<Client, baton_txn::Error> {
    let (client, connection) = tokio_postgres::connect(&pg_url(), NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The NATS server `scripts/services` starts (JetStream enabled).
pub fn nats_url() -> String {
    std::env::var("BATON_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:54222".into())
}

/// The RabbitMQ node `scripts/services` starts.
pub fn amqp_url() -> String {
    std::env::var("BATON_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:55672/%2f".into())
}

pub async fn connect_nats() -> async_nats::Client {
    let url = nats_url();
    // A bounded first connect, so a missing server fails the test instead of hanging it.
    let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5));
    match options.connect(&url).await {
        Ok(client) => client,
        Err(e) => panic!(
            "NATS is not reachable at {url}: {e}\n\
             The relay tests need a real nats-server with JetStream: run `scripts/services` \
             (scripts/test does this first) or point BATON_TEST_NATS_URL at one."
        ),
    }
}

pub async fn connect_amqp() -> lapin::Connection {
    let url = amqp_url();
    match lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await {
        Ok(connection) => connection,
        Err(e) => panic!(
            "RabbitMQ is not reachable at {url}: {e}\n\
             The relay tests need a real RabbitMQ: run `scripts/services` (scripts/test does \
             this first) or point BATON_TEST_AMQP_URL at one."
        ),
    }
}

/// Enqueues `aggregates × per_aggregate` messages to `topic`, payload `"<aggregate>:<i>"`,
/// 100 to a transaction, the aggregates interleaved (so every batch of the relay holds many
/// aggregates, each in order).
pub async fn enqueue_all(schema: &Schema, topic: &str, aggregates: usize, per_aggregate: usize) {
    let outbox = Outbox::new(schema);
    let mut client = connect().await;
    let all: Vec<(usize, usize)> = (0..per_aggregate)
        .flat_map(|i| (0..aggregates).map(move |a| (a, i)))
        .collect();
    for chunk in all.chunks(100) {
        let tx = client.transaction().await.unwrap();
        for &(a, i) in chunk {
            let message = Message::new(format!("agg-{a}"), topic, format!("agg-{a}:{i}"));
            outbox.enqueue(&tx, &message).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
}

/// Checks that the payloads `"<aggregate>:<i>"`, in the order the consumer applied them,
/// hold every aggregate's messages exactly once and in order: 0, 1, 2, … per aggregate.
pub fn assert_per_aggregate_order(applied: &[String], aggregates: usize, per_aggregate: usize) {
    let mut next: HashMap<String, usize> = HashMap::new();
    for payload in applied {
        let (aggregate, i) = payload.rsplit_once(':').expect("payload aggregate:i");
        let i: usize = i.parse().unwrap();
        let expected = next.entry(aggregate.to_string()).or_insert(0);
        assert_eq!(
            i, *expected,
            "{aggregate}: message {i} applied where {expected} was due"
        );
        *expected += 1;
    }
    assert_eq!(next.len(), aggregates, "aggregates seen");
    assert!(
        next.values().all(|&n| n == per_aggregate),
        "every aggregate complete"
    );
}

/// Waits until the outbox has nothing pending, or panics after `deadline`.
pub async fn wait_drained(schema: &Schema, deadline: Duration) {
    let outbox = Outbox::new(schema);
    let until = Instant::now() + deadline;
    loop {
        if let Ok(client) = try_connect().await {
            if let Ok(stats) = outbox.stats(&client).await {
                if stats.pending == 0 {
                    return;
                }
            }
        }
        assert!(
            Instant::now() < until,
            "the outbox was not drained in {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- real process kills at named fault points ----------------------------------------------
//
// A relay child is this same test binary re-run with `BATON_TXN_RELAY_FAULT` set: it relays
// normally until the fault point, prints `REACHED <fault>` and hangs there; the parent then
// kills it with SIGKILL.
//
// - `after_publish`: in the third round, after the whole batch was published and acked and
//   before its mark-sent (the fence check is the first statement of that transaction).
// - `mid_batch`: after 1,234 messages of this process, inside a batch: some of the batch's
//   messages are out, the rest not, none of them marked.

pub mod bank;
pub mod bank2;
pub mod recorder;

pub const FAULT_ENV: &str = "BATON_TXN_RELAY_FAULT";

fn reached(fault: &str) -> ! {
    println!("REACHED {fault}");
    std::thread::sleep(Duration::from_secs(300));
    panic!("the parent should have killed this process");
}

pub struct FaultFence {
    rounds: AtomicUsize,
    hang_in_round: Option<usize>,
}

impl Fence for FaultFence {
    async fn check<'a>(&'a self, _tx: &'a Transaction<'_>) -> Result<(), baton_txn::Error> {
        let round = self.rounds.fetch_add(1, Ordering::SeqCst) + 1;
        if self.hang_in_round == Some(round) {
            reached("after_publish");
        }
        Ok(())
    }
}

pub struct FaultPublisher<P> {
    pub inner: P,
    published: AtomicUsize,
    hang_after: Option<usize>,
}

impl<P: Publisher> Publisher for FaultPublisher<P> {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        if let Some(n) = self.hang_after {
            if self.published.load(Ordering::SeqCst) >= n {
                reached("mid_batch");
            }
        }
        self.inner.publish(message).await?;
        self.published.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The child's side: relays `schema` through `publisher` until the fault point named by
/// `fault`. Never returns.
pub async fn run_faulty_relay<P: Publisher>(schema: &Schema, publisher: P, fault: &str) {
    let (hang_in_round, hang_after) = match fault {
        "after_publish" => (Some(3), None),
        "mid_batch" => (None, Some(1234)),
        other => panic!("unknown fault point {other}"),
    };
    let relay = Relay::with_fence(
        Outbox::new(schema),
        FaultPublisher {
            inner: publisher,
            published: AtomicUsize::new(0),
            hang_after,
        },
        FaultFence {
            rounds: AtomicUsize::new(0),
            hang_in_round,
        },
        RelayConfig::default(),
    );
    relay
        .run(try_connect, std::future::pending())
        .await
        .unwrap();
    unreachable!("the relay runs until killed");
}

/// Runs this test binary's test `child_test` (its full name, `module::fn`: the tests share
/// one binary) with `fault`, waits until it reports the fault point, kills it with SIGKILL
/// and reaps it.
pub fn run_child_until_killed(child_test: &str, fault: &str) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture", "--test-threads", "1"])
        .env(FAULT_ENV, fault)
        .env("BATON_TEST_PG_URL", pg_url())
        .env("BATON_TEST_NATS_URL", nats_url())
        .env("BATON_TEST_AMQP_URL", amqp_url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mark = format!("REACHED {fault}");
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| {
                panic!(
                    "the child exited before reaching {fault}: {:?}",
                    child.wait()
                )
            })
            .unwrap();
        if line.contains(&mark) {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

/// A JetStream stream `name` on `subjects`, created afresh (a leftover from an earlier run is
/// deleted first).
pub async fn fresh_stream(
    js: &async_nats::jetstream::Context,
    name: &str,
    subjects: &[&str],
) -> async_nats::jetstream::stream::Stream {
    let _ = js.delete_stream(name).await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: name.to_string(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        // The default; said here because the tests depend on it: duplicates published
        // within two minutes of the original are dropped.
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Every message of the stream, in stream order: (message id, payload).
pub async fn read_stream(
    stream: &mut async_nats::jetstream::stream::Stream,
) -> Vec<(String, String)> {
    use async_nats::jetstream::consumer;
    use futures_util::StreamExt;
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
