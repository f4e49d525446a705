//! Relay high availability through Baton, against a real `baton serve` (started here), the
//! real PostgreSQL and NATS JetStream (`scripts/services`):
//!
//! - the fence itself: an older token's mark-sent transaction is refused and rolled back;
//! - signed tokens: with the cluster's public keys configured, a forged (huge, altered,
//!   another cluster's, unknown key) token is refused before any statement and the fence
//!   row stays the honest holder's; without them the same forgery locks the holder out;
//! - two in-process instances over two partitions drain an outbox, each partition once;
//! - two relay *processes*, the active one SIGKILLed mid-batch: the other takes over after
//!   the lease, republishes what was not marked (JetStream drops the duplicates), loses
//!   nothing, keeps per-aggregate order;
//! - two relay processes, the active one SIGSTOPped mid-batch past its lease: the other takes
//!   over; the paused one, SIGCONTed, finishes its round and its mark-sent is refused by the
//!   fence (its `FENCED` event and the fence row's `refusals`), nothing lost, order kept.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{connect, connect_nats, fresh_schema, fresh_stream, read_stream, try_connect};
use async_nats::jetstream::{self, stream};
use baton_client::testing::{Flavor, TestServer};
use baton_client::{ClientConfig, SessionOptions};
use baton_txn::pg::{Message, Outbox, OutboxMessage, Schema};
use baton_txn::relay::ha::{HaConfig, HaEvent, HaRelay};
use baton_txn::relay::nats::JetStreamPublisher;
use baton_txn::relay::{Fence, FenceGrant, PgFence, PublishError, Publisher, RelayConfig};
use baton_txn::Error;

const CHILD_ENV: &str = "BATON_TXN_HA_CHILD";
const AGGREGATES: usize = 20;
const PER_AGGREGATE: usize = 100;
/// The session TTL of the relays: how long a dead or paused leader keeps its partition.
const TTL: Duration = Duration::from_secs(2);

async fn baton(endpoint: &str) -> baton_client::Client {
    baton_client::Client::connect(ClientConfig::new([endpoint.to_string()]))
        .await
        .unwrap()
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

/// Waits for the cluster's bootstrap fencing key and returns the public keys.
async fn public_keys(client: &baton_client::Client) -> baton_client::PublicKeys {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let keys = client.fence_public_keys().await.unwrap();
        if keys.current.is_some() {
            return keys.keys;
        }
        assert!(Instant::now() < deadline, "no fencing key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn fence_grant(t: &baton_client::SignedToken) -> FenceGrant {
    FenceGrant {
        name: t.name.clone(),
        lease: t.lease,
        revision: t.revision,
        key_id: t.key_id,
        signature: t.signature.expect("a signed grant"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_token_is_refused_when_the_fence_verifies_signatures() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_schema("t_relay_signed_fence").await;
    let mut client = connect().await;
    let baton = baton(&server.endpoint()).await;
    let keys = public_keys(&baton).await;
    let session = baton_client::Session::new(&baton, SessionOptions::new())
        .await
        .unwrap();
    let guard = baton_client::Mutex::new(&session)
        .acquire("relay/p0")
        .await
        .unwrap();
    let signed = guard.signed_token().unwrap().clone();
    assert_eq!(signed.verify(&keys), Ok(()));
    let token = signed.token.get();
    let honest = PgFence::new(&schema, "p/0", token)
        .with_public_keys(keys.clone())
        .with_signature(fence_grant(&signed));
    honest.raise(&mut client).await.unwrap();

    // A third party presents a much higher token with the honest holder's signature, an
    // altered signature, a key id the cluster never had, another cluster's signature, or
    // none: every one is refused before any statement, and the row stays the holder's.
    let huge = token + 1_000_000;
    let mut flipped = fence_grant(&signed);
    let mut sig = *flipped.signature.as_bytes();
    sig[7] ^= 0x20;
    flipped.signature = baton_client::Signature::from_bytes(sig);
    let other_cluster = baton_fencing::SigningKey::from_seed(signed.key_id, &[9; 32]);
    let foreign = FenceGrant {
        signature: other_cluster.sign(&baton_fencing::Grant {
            name: &signed.name,
            token: huge,
            lease: signed.lease,
            revision: signed.revision,
        }),
        ..fence_grant(&signed)
    };
    let unknown_key = FenceGrant {
        key_id: baton_client::KeyId::new(99),
        ..fence_grant(&signed)
    };
    let forged = [
        (huge, Some(fence_grant(&signed)), "bad"),
        (token, Some(flipped), "bad"),
        (huge, Some(foreign), "bad"),
        (token, Some(unknown_key), "unknown"),
        (huge, None, "unsigned"),
    ];
    for (t, grant, why) in forged {
        let mut fence = PgFence::new(&schema, "p/0", t).with_public_keys(keys.clone());
        if let Some(g) = grant {
            fence = fence.with_signature(g);
        }
        let refused = fence.raise(&mut client).await;
        let expected = match why {
            "bad" => matches!(
                refused,
                Err(Error::InvalidFencingSignature(
                    baton_client::VerifyError::BadSignature(_)
                ))
            ),
            "unknown" => matches!(
                refused,
                Err(Error::InvalidFencingSignature(
                    baton_client::VerifyError::UnknownKey(_)
                ))
            ),
            _ => matches!(
                refused,
                Err(Error::InvalidFencingSignature(
                    baton_client::VerifyError::Unsigned
                ))
            ),
        };
        assert!(expected, "token {t} ({why}): {refused:?}");
        assert_eq!(
            PgFence::read(&schema, &client, "p/0").await.unwrap(),
            Some((token, 0)),
            "the forged token changed nothing"
        );
    }
    // The honest holder writes on.
    honest.raise(&mut client).await.unwrap();

    // Without public keys the same forgery is taken at its word: the row jumps to the huge
    // token and the honest holder is fenced off its own partition.
    PgFence::new(&schema, "p/0", huge)
        .raise(&mut client)
        .await
        .unwrap();
    assert!(matches!(
        PgFence::new(&schema, "p/0", token).raise(&mut client).await,
        Err(Error::Fenced(_))
    ));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_two_partitions_one_leader_each() {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_schema("t_relay_ha_parts").await;
    let nats = connect_nats().await;
    let js = jetstream::new(nats.clone());
    let subject = "t_relay_ha_parts.orders";
    let mut stream = fresh_stream(&js, "T_RELAY_HA_PARTS", &[subject]).await;
    common::enqueue_all(&schema, subject, AGGREGATES, PER_AGGREGATE).await;

    let leading: Arc<Mutex<Vec<(String, u32, baton_client::FencingToken)>>> = Arc::default();
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

// ---- relay processes ------------------------------------------------------------------------
//
// A relay child is this test binary re-run with `BATON_TXN_HA_CHILD=<instance>`; it runs a
// `HaRelay` (one partition) and prints its events (`EVENT LEADING <token>`, `EVENT FENCED …`,
// `EVENT LOST …`) and, every 50 ms, `DUPS <n>` (JetStream's duplicate acks so far). With
// `BATON_TXN_HA_HOLD=<n>:<ms>` its n-th publish prints `REACHED` and then waits `ms` before it
// goes on (the broker's ack delayed): the point where the parent kills or stops it, with part
// of a batch published and none of it marked.

struct HoldingPublisher {
    inner: JetStreamPublisher,
    published: AtomicUsize,
    hold: Option<(usize, Duration)>,
}

impl Publisher for HoldingPublisher {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        // Slow enough that a batch takes a while, so the kill lands inside one.
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.inner.publish(message).await?;
        let n = self.published.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((at, hold)) = self.hold {
            if n == at {
                println!("REACHED {n}");
                tokio::time::sleep(hold).await;
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ha_child_process() {
    let Ok(instance) = std::env::var(CHILD_ENV) else {
        return;
    };
    let endpoint = std::env::var("BATON_TXN_HA_ENDPOINT").unwrap();
    let schema = Schema::new(std::env::var("BATON_TXN_HA_SCHEMA").unwrap()).unwrap();
    let hold = std::env::var("BATON_TXN_HA_HOLD").ok().map(|h| {
        let (n, ms) = h.split_once(':').unwrap();
        (
            n.parse().unwrap(),
            Duration::from_millis(ms.parse().unwrap()),
        )
    });
    let mut config = HaConfig::new(schema.name(), instance);
    config.session = SessionOptions::new().with_ttl(TTL);
    config.relay = RelayConfig {
        batch_size: 100,
        ..RelayConfig::default()
    };
    let ha = HaRelay::new(
        baton(&endpoint).await,
        Outbox::new(&schema),
        HoldingPublisher {
            inner: JetStreamPublisher::new(connect_nats().await),
            published: AtomicUsize::new(0),
            hold,
        },
        config,
    )
    .on_event(|e| match e {
        HaEvent::Leading { token, .. } => println!("EVENT LEADING {token}"),
        HaEvent::Fenced { message, .. } => println!("EVENT FENCED {message}"),
        HaEvent::Lost { reason, .. } => println!("EVENT LOST {reason}"),
    });
    let publisher = ha.publisher().clone();
    tokio::spawn(async move {
        loop {
            println!("DUPS {}", publisher.inner.duplicates());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    println!("STARTED");
    ha.run(try_connect, std::future::pending()).await;
}

/// A relay child and everything it printed so far.
struct RelayProcess {
    name: &'static str,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl RelayProcess {
    fn start(name: &'static str, endpoint: &str, schema: &Schema, hold: Option<&str>) -> Self {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "relay_ha::ha_child_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, name)
            .env("BATON_TXN_HA_ENDPOINT", endpoint)
            .env("BATON_TXN_HA_SCHEMA", schema.name())
            .env("BATON_TEST_PG_URL", common::pg_url())
            .env("BATON_TEST_NATS_URL", common::nats_url())
            .stdout(Stdio::piped());
        if let Some(hold) = hold {
            command.env("BATON_TXN_HA_HOLD", hold);
        }
        let mut child = command.spawn().unwrap();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let out = child.stdout.take().unwrap();
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if !line.starts_with("DUPS") {
                        println!("[{name}] {line}");
                    }
                    lines.lock().unwrap().push(line);
                }
            });
        }
        RelayProcess { name, child, lines }
    }

    /// The first line holding `prefix`, from `prefix` on (libtest's "test … ... " may come
    /// first on the child's first line).
    fn has(&self, prefix: &str) -> Option<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find_map(|l| l.find(prefix).map(|at| l[at..].to_string()))
    }

    /// Waits (polling, with a deadline) for a line starting with `prefix`.
    async fn wait_for(&mut self, prefix: &str, deadline: Duration) -> String {
        let until = Instant::now() + deadline;
        loop {
            if let Some(line) = self.has(prefix) {
                return line;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited ({status}) before printing {prefix}", self.name);
            }
            assert!(
                Instant::now() < until,
                "{} did not print {prefix} within {deadline:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn duplicates(&self) -> u64 {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("DUPS ").map(|n| n.parse().unwrap()))
            .unwrap_or(0)
    }

    fn signal(&self, signal: libc::c_int) {
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({}, {signal})", self.child.id());
    }

    /// Waits until the kernel reports the process stopped (state `T` in /proc).
    async fn wait_stopped(&self) {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
                .unwrap_or_default();
            // The state follows the parenthesised command name.
            if stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
            {
                return;
            }
            assert!(Instant::now() < until, "{} not stopped", self.name);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Setup {
    server: TestServer,
    schema: Schema,
    stream: stream::Stream,
}

async fn setup(name: &str) -> Setup {
    let server = TestServer::start(Flavor::Baton);
    let schema = fresh_schema(name).await;
    let js = jetstream::new(connect_nats().await);
    let stream = fresh_stream(&js, &name.to_uppercase(), &[&format!("{name}.orders")]).await;
    common::enqueue_all(
        &schema,
        &format!("{name}.orders"),
        AGGREGATES,
        PER_AGGREGATE,
    )
    .await;
    Setup {
        server,
        schema,
        stream,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_relay_killed_the_other_takes_over() {
    let mut s = setup("t_relay_ha_kill").await;
    let total = AGGREGATES * PER_AGGREGATE;
    let endpoint = s.server.endpoint();
    // a holds its 550th publish (in its sixth batch of 100) long enough to be killed there.
    let mut a = RelayProcess::start("a", &endpoint, &s.schema, Some("550:60000"));
    let token_a = a.wait_for("EVENT LEADING", Duration::from_secs(30)).await;
    let mut b = RelayProcess::start("b", &endpoint, &s.schema, None);
    b.wait_for("STARTED", Duration::from_secs(30)).await;
    a.wait_for("REACHED", Duration::from_secs(60)).await;
    assert!(b.has("EVENT LEADING").is_none(), "b leads while a lives");

    a.signal(libc::SIGKILL);
    let killed = Instant::now();
    let _ = a.child.wait();
    let token_b = b.wait_for("EVENT LEADING", Duration::from_secs(30)).await;
    let takeover = killed.elapsed();
    common::wait_drained(&s.schema, Duration::from_secs(120)).await;
    // The DUPS line is printed every 50 ms: wait for one printed after the drain.
    let drained = b.lines.lock().unwrap().len();
    let until = Instant::now() + Duration::from_secs(10);
    while b.lines.lock().unwrap()[drained..]
        .iter()
        .all(|l| !l.starts_with("DUPS"))
    {
        assert!(Instant::now() < until, "b prints no DUPS");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let duplicates = b.duplicates();
    println!(
        "kill: a ({token_a}) SIGKILLed after 550 publishes; b ({token_b}) leading {takeover:?} \
         later; {duplicates} republished duplicates dropped by JetStream"
    );
    assert!(
        duplicates > 0,
        "b republished what a had published but not marked"
    );
    drop(b);
    assert_stream_exact(&mut s.stream, total).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_relay_paused_past_its_lease_is_fenced_when_it_resumes() {
    let mut s = setup("t_relay_ha_stop").await;
    let total = AGGREGATES * PER_AGGREGATE;
    let endpoint = s.server.endpoint();
    // a's 550th publish holds 3 s: the parent stops it there, mid-batch, nothing marked.
    let mut a = RelayProcess::start("a", &endpoint, &s.schema, Some("550:3000"));
    let token_a = a.wait_for("EVENT LEADING", Duration::from_secs(30)).await;
    let mut b = RelayProcess::start("b", &endpoint, &s.schema, None);
    b.wait_for("STARTED", Duration::from_secs(30)).await;
    a.wait_for("REACHED", Duration::from_secs(60)).await;

    a.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    a.wait_stopped().await;
    // Past a's lease: the only wait that is a matter of time, and b's election is its end.
    let token_b = b.wait_for("EVENT LEADING", Duration::from_secs(30)).await;
    let takeover = stopped.elapsed();
    assert!(takeover >= TTL / 2, "b took over after {takeover:?}");

    a.signal(libc::SIGCONT);
    let fenced = a.wait_for("EVENT FENCED", Duration::from_secs(30)).await;
    common::wait_drained(&s.schema, Duration::from_secs(120)).await;
    let client = connect().await;
    let (token, refusals) = PgFence::read(&s.schema, &client, &format!("{}/0", s.schema.name()))
        .await
        .unwrap()
        .unwrap();
    println!(
        "sigstop: a ({token_a}) stopped mid-batch, b ({token_b}) leading {takeover:?} later; \
         a resumed: {fenced}; fence row: token {token}, {refusals} refusals; b saw {} \
         duplicates",
        b.duplicates()
    );
    assert!(refusals >= 1, "the refusal is recorded in the fence row");
    assert_eq!(
        token.to_string(),
        token_b.trim_start_matches("EVENT LEADING ")
    );
    drop(a);
    drop(b);
    assert_stream_exact(&mut s.stream, total).await;
}
