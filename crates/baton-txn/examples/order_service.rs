//! Exactly-once effects end to end, in one process: `scripts/example-orders` runs it.
//!
//! ```text
//! load generator ──HTTP──▶ order service (axum + IdempotencyLayer)
//!   retries, lost         │ one PostgreSQL transaction: INSERT order, enqueue
//!   responses, doubles    │ `order.created` in the outbox, store the response
//!                         ▼
//!                     outbox ──Relay──▶ NATS JetStream ──pull──▶ shipping consumer
//!                                       (Nats-Msg-Id dedup)      one transaction per message:
//!                                                                Inbox::first_time + INSERT
//!                                                                shipment, COMMIT, then ack
//! ```
//!
//! The load generator sends `--requests` distinct orders (default 1000) with `--concurrency`
//! requests at a time (default 32). Some are sent again with the same key and body: after a
//! response that "got lost" (read and thrown away), after a client timeout (the connection
//! dropped before the answer), and some are sent twice at once. The consumer "crashes"
//! between its commit and its ack for some messages, so JetStream redelivers them. The
//! service therefore sees more HTTP calls than orders, and the consumer more deliveries than
//! messages; the run ends when the shipments table has one row per distinct order and prints
//! `N requests, N effects` — or exits non-zero if the numbers differ or the deadline passes.
//!
//! Environment: `BATON_TEST_PG_URL` (default `postgres://baton@127.0.0.1:55432/baton`) and
//! `BATON_TEST_NATS_URL` (default `nats://127.0.0.1:54222`), the servers `scripts/services`
//! starts. The run drops and recreates the schema `order_example` and the stream
//! `ORDER_EXAMPLE`, so every run starts clean.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use baton_txn::http::{Idempotency, IdempotencyLayer};
use baton_txn::pg::{IdempotencyConfig, IdempotencyStore, Inbox, Message, Outbox, Schema};
use baton_txn::relay::nats::JetStreamPublisher;
use baton_txn::relay::{Relay, RelayConfig};
use baton_txn::StoredResponse;
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

const SCHEMA: &str = "order_example";
const STREAM: &str = "ORDER_EXAMPLE";
const SUBJECT: &str = "order_example.order.created";
const CONSUMER: &str = "shipping";
/// How long the whole run may take before it counts as failed.
const DEADLINE: Duration = Duration::from_secs(180);

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn pg_url() -> String {
    std::env::var("BATON_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://baton@127.0.0.1:55432/baton".into())
}

fn nats_url() -> String {
    std::env::var("BATON_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:54222".into())
}

async fn connect() -> Result<Client, baton_txn::Error> {
    let (client, connection) = tokio_postgres::connect(&pg_url(), NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

// ---------------------------------------------------------------------------------------
// (1) The order service.

#[derive(Clone)]
struct App {
    /// The handlers' connections (the layer claims keys over a connection of its own).
    pool: Arc<Vec<Mutex<Client>>>,
    next: Arc<AtomicUsize>,
    outbox: Outbox,
    insert_order: Arc<str>,
}

/// `POST /orders`: the order, its `order.created` message and the response commit in one
/// transaction; a retry with the same key gets the stored response instead.
async fn create_order(State(app): State<App>, idem: Idempotency, body: Bytes) -> Response<Body> {
    let slot = app.next.fetch_add(1, Ordering::Relaxed) % app.pool.len();
    let mut conn = app.pool[slot].lock().await;
    let tx = match idem.begin(&mut conn).await {
        Ok(tx) => tx,
        Err(e) => return e.into_response(),
    };
    let Ok(body) = std::str::from_utf8(&body) else {
        return (StatusCode::BAD_REQUEST, "the body is not UTF-8").into_response();
    };
    // PostgreSQL checks the JSON; a bad body rolls back, stores nothing and gets a 400.
    let row = match tx
        .query_one(&*app.insert_order, &[&idem.key().unwrap_or(""), &body])
        .await
    {
        Ok(row) => row,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let (id, customer): (i64, String) = (row.get(0), row.get(1));
    let event = format!("{{\"order\":{id},\"customer\":\"{customer}\",\"order_body\":{body}}}");
    let message = Message::new(customer, SUBJECT, event).with_header("Order-Id", id.to_string());
    if let Err(e) = app.outbox.enqueue(&tx, &message).await {
        return e.into_response();
    }
    let response = StoredResponse::json(201, format!("{{\"order\":{id}}}"))
        .header("location", format!("/orders/{id}"));
    idem.commit(tx, response)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn start_service(schema: &Schema) -> Result<SocketAddr, Failure> {
    let mut pool = Vec::new();
    for _ in 0..8 {
        pool.push(Mutex::new(connect().await?));
    }
    let app = App {
        pool: Arc::new(pool),
        next: Arc::new(AtomicUsize::new(0)),
        outbox: Outbox::new(schema),
        insert_order: format!(
            "INSERT INTO {SCHEMA}.orders (idempotency_key, body) VALUES ($1, $2::text::jsonb)
             RETURNING id, body->>'customer'"
        )
        .into(),
    };
    // A short lease: a request cut off by a client timeout blocks its retries for 3 s at most.
    let store = IdempotencyStore::new(
        schema,
        IdempotencyConfig {
            lease: Duration::from_secs(3),
            ..IdempotencyConfig::default()
        },
    );
    let layer = IdempotencyLayer::new(store, Arc::new(connect().await?), |_| {
        Some("demo".to_string())
    })
    .required(true)
    .wait(Duration::from_secs(5));
    let router = Router::new()
        .route("/orders", post(create_order))
        .layer(layer)
        .with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("the order service stopped: {e}");
        }
    });
    Ok(addr)
}

// ---------------------------------------------------------------------------------------
// (3) The shipping consumer.

#[derive(Default)]
struct ConsumerStats {
    deliveries: AtomicU64,
    /// Deliveries the inbox recognised as seen and skipped.
    inbox_dropped: AtomicU64,
    /// Messages whose effect committed but whose ack was "lost" (not sent), so that
    /// JetStream redelivered them.
    acks_withheld: AtomicU64,
}

async fn run_consumer(
    schema: Schema,
    consumer: consumer::Consumer<consumer::pull::Config>,
    stats: Arc<ConsumerStats>,
) -> Result<(), Failure> {
    let inbox = Inbox::new(&schema);
    let insert = format!("INSERT INTO {SCHEMA}.shipments (order_id, message_id) VALUES ($1, $2)");
    let mut client = connect().await?;
    let mut messages = consumer.messages().await?;
    while let Some(message) = messages.next().await {
        let message = message?;
        stats.deliveries.fetch_add(1, Ordering::Relaxed);
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.to_string())
                .ok_or_else(|| format!("a message without {name}"))
        };
        let id = header("Nats-Msg-Id")?;
        let order: i64 = header("Order-Id")?.parse()?;
        let tx = client.transaction().await?;
        if inbox.first_time(&tx, CONSUMER, &id).await? {
            tx.execute(&insert, &[&order, &id]).await?;
        } else {
            stats.inbox_dropped.fetch_add(1, Ordering::Relaxed);
        }
        tx.commit().await?;
        // Every 20th order "crashes" after its commit and before its first ack: JetStream
        // redelivers it after the ack wait, and the inbox drops the repeat.
        let delivered = message.info().map(|info| info.delivered).unwrap_or(1);
        if order % 20 == 0 && delivered == 1 {
            stats.acks_withheld.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        message.ack().await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// (4) The load generator: a bare HTTP/1.1 client, one connection per call.

#[derive(Default)]
struct LoadStats {
    calls: AtomicU64,
    created: AtomicU64,
    replays: AtomicU64,
    conflicts: AtomicU64,
    errors: AtomicU64,
    lost_responses: AtomicU64,
    timeouts: AtomicU64,
    doubles: AtomicU64,
}

struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Option<u64>,
    body: String,
}

fn request_bytes(addr: SocketAddr, key: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /orders HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Idempotency-Key: \"{key}\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn call(addr: SocketAddr, key: &str, body: &str) -> std::io::Result<Answer> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(&request_bytes(addr, key, body)).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let raw = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "a malformed response");
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(bad)?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let mut answer = Answer {
        status,
        replayed: false,
        retry_after: None,
        body: body.to_string(),
    };
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "idempotent-replayed" => answer.replayed = value.trim() == "true",
                "retry-after" => answer.retry_after = value.trim().parse().ok(),
                _ => {}
            }
        }
    }
    Ok(answer)
}

/// Sends the request until it gets its 201 (first execution or replay) and returns the body.
async fn until_created(
    addr: SocketAddr,
    key: &str,
    body: &str,
    stats: &LoadStats,
) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if Instant::now() > deadline {
            return Err(format!("{key}: no 201 within 60 s"));
        }
        stats.calls.fetch_add(1, Ordering::Relaxed);
        match call(addr, key, body).await {
            Ok(a) if a.status == 201 => {
                let counter = if a.replayed {
                    &stats.replays
                } else {
                    &stats.created
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return Ok(a.body);
            }
            Ok(a) if a.status == 409 => {
                stats.conflicts.fetch_add(1, Ordering::Relaxed);
                let secs = a.retry_after.unwrap_or(1).min(3);
                tokio::time::sleep(Duration::from_secs(secs)).await;
            }
            Ok(a) if (400..500).contains(&a.status) => {
                return Err(format!("{key}: {} {}", a.status, a.body));
            }
            Ok(_) | Err(_) => {
                stats.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One distinct order, sent the way its number says: plainly, after a lost response, after a
/// client timeout, or twice at once. Every 201 it gets must carry the same order.
async fn one_order(addr: SocketAddr, i: usize, stats: Arc<LoadStats>) -> Result<(), String> {
    let key = format!("order-{i}");
    let body = format!(
        "{{\"customer\":\"c{}\",\"item\":\"sku-{}\",\"qty\":{}}}",
        i % 50,
        i % 17,
        1 + i % 5
    );
    let mut answers = Vec::new();
    match i % 20 {
        // The response is lost on the way back: read and thrown away, then the retry.
        0 | 10 => {
            stats.lost_responses.fetch_add(1, Ordering::Relaxed);
            answers.push(until_created(addr, &key, &body, &stats).await?);
            answers.push(until_created(addr, &key, &body, &stats).await?);
        }
        // The client times out: the connection closes before the answer (maybe before the
        // server even ran the request), then the retry.
        5 | 15 => {
            stats.timeouts.fetch_add(1, Ordering::Relaxed);
            stats.calls.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut stream) = TcpStream::connect(addr).await {
                let _ = stream.write_all(&request_bytes(addr, &key, &body)).await;
                tokio::time::sleep(Duration::from_millis((i % 3) as u64)).await;
            }
            answers.push(until_created(addr, &key, &body, &stats).await?);
        }
        // A double click: the same request twice at the same moment.
        7 => {
            stats.doubles.fetch_add(1, Ordering::Relaxed);
            let (a, b) = tokio::join!(
                until_created(addr, &key, &body, &stats),
                until_created(addr, &key, &body, &stats)
            );
            answers.push(a?);
            answers.push(b?);
        }
        _ => answers.push(until_created(addr, &key, &body, &stats).await?),
    }
    if answers.iter().any(|a| *a != answers[0]) {
        return Err(format!("{key}: different answers {answers:?}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------

struct Args {
    requests: usize,
    concurrency: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        requests: 1000,
        concurrency: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (arg, None),
        };
        let mut number = |what: &str| -> Result<usize, String> {
            value
                .clone()
                .or_else(|| it.next())
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{what} needs a positive number"))
        };
        match name.as_str() {
            "--requests" | "-n" => args.requests = number("--requests")?,
            "--concurrency" | "-c" => args.concurrency = number("--concurrency")?,
            "--help" | "-h" => {
                return Err("usage: order_service [--requests N] [--concurrency C]".into())
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

async fn count(client: &Client, table: &str) -> Result<i64, Failure> {
    let sql = format!("SELECT count(*) FROM {SCHEMA}.{table}");
    Ok(client.query_one(&sql, &[]).await?.get(0))
}

async fn run(args: Args) -> Result<bool, Failure> {
    let started = Instant::now();
    println!(
        "PostgreSQL {}, NATS {}: {} orders, {} at a time",
        pg_url(),
        nats_url(),
        args.requests,
        args.concurrency
    );

    // A clean schema with the crate's tables plus the business tables.
    let schema = Schema::new(SCHEMA)?;
    let mut admin = connect().await?;
    admin
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        .await?;
    schema.migrate(&mut admin).await?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {SCHEMA}.orders (
                 id bigserial PRIMARY KEY, idempotency_key text NOT NULL,
                 body jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
             CREATE TABLE {SCHEMA}.shipments (
                 id bigserial PRIMARY KEY, order_id bigint NOT NULL,
                 message_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());"
        ))
        .await?;

    // (2) The stream and the relay.
    let nats = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(nats_url())
        .await?;
    let js = jetstream::new(nats.clone());
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.to_string(),
            subjects: vec![SUBJECT.to_string()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;
    let publisher = Arc::new(JetStreamPublisher::new(nats.clone()));
    let relay = Relay::new(
        Outbox::new(&schema),
        publisher.clone(),
        RelayConfig {
            poll_interval: Duration::from_millis(20),
            ..RelayConfig::default()
        },
    );
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay_task = tokio::spawn(async move {
        relay
            .run(connect, async {
                let _ = relay_stopped.await;
            })
            .await
    });

    // (3) The consumer.
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(CONSUMER.to_string()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(1),
            ..Default::default()
        })
        .await?;
    let consumer_stats = Arc::new(ConsumerStats::default());
    let consumer_task = tokio::spawn(run_consumer(
        schema.clone(),
        consumer,
        consumer_stats.clone(),
    ));

    // (1) The service, then (4) the load.
    let addr = start_service(&schema).await?;
    println!("order service on http://{addr}");
    let load = Arc::new(LoadStats::default());
    let permits = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
    let mut tasks = Vec::with_capacity(args.requests);
    for i in 0..args.requests {
        let permit = permits.clone().acquire_owned().await?;
        let load = load.clone();
        tasks.push(tokio::spawn(async move {
            let result = one_order(addr, i, load).await;
            drop(permit);
            result
        }));
    }
    let mut failed_requests = 0;
    for task in tasks {
        if let Err(e) = task.await? {
            failed_requests += 1;
            eprintln!("request failed: {e}");
        }
    }
    let load_done = started.elapsed();

    // Wait for the effects to catch up with the requests.
    let deadline = started + DEADLINE;
    let outbox = Outbox::new(&schema);
    let (mut orders, mut effects);
    loop {
        orders = count(&admin, "orders").await?;
        effects = count(&admin, "shipments").await?;
        let pending = outbox.stats(&admin).await?.pending;
        let settled = effects >= args.requests as i64
            && pending == 0
            && consumer_stats.acks_withheld.load(Ordering::Relaxed)
                <= consumer_stats.inbox_dropped.load(Ordering::Relaxed);
        if settled || Instant::now() >= deadline || consumer_task.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A moment more, so that a duplicate effect, if there were one, would show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    effects = count(&admin, "shipments").await?;
    let distinct_effects: i64 = admin
        .query_one(
            &format!("SELECT count(DISTINCT order_id) FROM {SCHEMA}.shipments"),
            &[],
        )
        .await?
        .get(0);
    let inbox_rows = count(&admin, "inbox").await?;
    let stream_messages = js.get_stream(STREAM).await?.info().await?.state.messages;

    let _ = stop_relay.send(());
    let _ = relay_task.await;
    if consumer_task.is_finished() {
        if let Ok(Err(e)) = consumer_task.await {
            eprintln!("the consumer stopped: {e}");
        }
    } else {
        consumer_task.abort();
    }

    let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "load: {} orders in {:.1?}: {} HTTP calls ({} lost responses retried, {} client \
         timeouts retried, {} sent twice at once); {} answers from a first execution, {} \
         replayed (Idempotent-Replayed), {} 409 in flight, {} failed calls retried",
        args.requests,
        load_done,
        l(&load.calls),
        l(&load.lost_responses),
        l(&load.timeouts),
        l(&load.doubles),
        l(&load.created),
        l(&load.replays),
        l(&load.conflicts),
        l(&load.errors),
    );
    println!(
        "database: {orders} orders; stream {STREAM}: {stream_messages} messages, {} duplicate \
         publishes dropped by JetStream",
        publisher.duplicates()
    );
    println!(
        "consumer: {} deliveries, {} acks withheld (simulated crash before ack), {} \
         redeliveries dropped by the inbox, {inbox_rows} inbox rows, {distinct_effects} \
         distinct orders shipped",
        l(&consumer_stats.deliveries),
        l(&consumer_stats.acks_withheld),
        l(&consumer_stats.inbox_dropped),
    );
    println!("{} requests, {effects} effects", args.requests);
    let n = args.requests as i64;
    Ok(failed_requests == 0 && orders == n && effects == n && distinct_effects == n)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match tokio::time::timeout(DEADLINE + Duration::from_secs(30), run(args)).await {
        Ok(Ok(true)) => ExitCode::SUCCESS,
        Ok(Ok(false)) => {
            eprintln!("FAILED: the effects do not match the requests");
            ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("FAILED: the run did not finish in time");
            ExitCode::FAILURE
        }
    }
}
