//! The outbox and the relay's bookkeeping against a real PostgreSQL, with an in-memory
//! publisher (the brokers have their own tests: relay_nats.rs, relay_amqp.rs).

use std::sync::Mutex;
use std::time::Duration;

use crate::common::{connect, fresh_schema};
use baton_txn::pg::{Message, Outbox, OutboxMessage};
use baton_txn::relay::{PublishError, Publisher, Relay, RelayConfig};

/// Records what it published; refuses topics starting with `bad` and reports `down` topics
/// as an outage.
#[derive(Default)]
struct Recorder {
    published: Mutex<Vec<String>>,
}

impl Recorder {
    fn payloads(&self) -> Vec<String> {
        self.published.lock().unwrap().clone()
    }
}

impl Publisher for Recorder {
    async fn publish(&self, message: &OutboxMessage) -> Result<(), PublishError> {
        if message.topic.starts_with("bad") {
            return Err(PublishError::Rejected(format!(
                "no route for {}",
                message.topic
            )));
        }
        if message.topic.starts_with("down") {
            return Err(PublishError::Unavailable("broker down".into()));
        }
        let payload = String::from_utf8(message.payload.clone()).unwrap();
        self.published.lock().unwrap().push(payload);
        Ok(())
    }
}

/// The relay reads below the oldest running transaction of the whole server, so one test's
/// open transaction would hold back another test's relay: these tests take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn quick() -> RelayConfig {
    RelayConfig {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(40),
        ..RelayConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_committed_messages_are_published_with_their_headers_and_ids() {
    let _serial = SERIAL.lock().await;
    let schema = fresh_schema("t_outbox_commit").await;
    let outbox = Outbox::new(&schema);
    let mut client = connect().await;

    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue(&tx, &Message::new("a", "t", "rolled back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let tx = client.transaction().await.unwrap();
    let id = outbox
        .enqueue(
            &tx,
            &Message::new("a", "t", "committed")
                .with_header("k", "v")
                .with_id("my-id"),
        )
        .await
        .unwrap();
    assert_eq!(id, "my-id");
    let generated = outbox
        .enqueue(&tx, &Message::new("a", "t", "second"))
        .await
        .unwrap();
    assert_eq!(generated.len(), 36, "a UUID: {generated}");
    // The same id twice is refused by the unique index instead of being published twice.
    assert!(outbox
        .enqueue(&tx, &Message::new("a", "t", "again").with_id("my-id"))
        .await
        .is_err());
    drop(tx);

    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue(
            &tx,
            &Message::new("a", "t", "committed").with_header("k", "v"),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let stats = outbox.stats(&client).await.unwrap();
    assert_eq!(stats.pending, 1);

    struct Check;
    impl Publisher for Check {
        async fn publish(&self, m: &OutboxMessage) -> Result<(), PublishError> {
            assert_eq!(m.payload, b"committed");
            assert_eq!(m.headers, vec![("k".to_string(), "v".to_string())]);
            assert_eq!(m.aggregate, "a");
            Ok(())
        }
    }
    let relay = Relay::new(outbox.clone(), Check, quick());
    let report = relay.run_once(&mut client).await.unwrap();
    assert_eq!((report.read, report.published), (1, 1));
    assert_eq!(relay.run_once(&mut client).await.unwrap().read, 0);
    assert_eq!(outbox.stats(&client).await.unwrap().pending, 0);
    assert_eq!(
        outbox
            .purge_sent(&client, Duration::from_secs(3600))
            .await
            .unwrap(),
        0
    );
    assert_eq!(outbox.purge_sent(&client, Duration::ZERO).await.unwrap(), 1);
}

/// The classic way to lose a message: transaction A takes sequence 1, B takes 2, B commits
/// first and a relay reading "seq > last published" publishes 2 and moves past 1 before A
/// commits. Reading below the xid horizon holds 2 back while A runs; both go out, 1 first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_with_a_lower_sequence_is_not_skipped_or_overtaken() {
    let _serial = SERIAL.lock().await;
    let schema = fresh_schema("t_outbox_late").await;
    let outbox = Outbox::new(&schema);
    let mut a = connect().await;
    let mut b = connect().await;
    let mut relay_client = connect().await;
    let recorder = Recorder::default();
    let relay = Relay::new(outbox.clone(), recorder, quick());

    let tx_a = a.transaction().await.unwrap();
    outbox
        .enqueue(&tx_a, &Message::new("agg", "t", "first"))
        .await
        .unwrap();
    let tx_b = b.transaction().await.unwrap();
    outbox
        .enqueue(&tx_b, &Message::new("agg", "t", "second"))
        .await
        .unwrap();
    outbox
        .enqueue(&tx_b, &Message::new("other", "t", "other aggregate"))
        .await
        .unwrap();
    tx_b.commit().await.unwrap();

    let seqs: Vec<i64> = relay_client
        .query(
            &format!("SELECT seq FROM {}.outbox ORDER BY seq", schema.name()),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seqs.len(), 2, "A's row is not visible yet");

    // B is committed and visible, but A (older xid) still runs: nothing may go out yet.
    for _ in 0..3 {
        let report = relay.run_once(&mut relay_client).await.unwrap();
        assert_eq!(report.read, 0, "{report:?}");
    }
    assert_eq!(outbox.stats(&relay_client).await.unwrap().pending, 2);

    tx_a.commit().await.unwrap();
    let report = relay.run_once(&mut relay_client).await.unwrap();
    assert_eq!(report.published, 3, "{report:?}");
    let published = relay.publisher().payloads();
    let pos = |p: &str| published.iter().position(|x| x == p).unwrap();
    assert!(pos("first") < pos("second"), "{published:?}");
    assert_eq!(outbox.stats(&relay_client).await.unwrap().pending, 0);
}

/// A transaction that got its id early (it wrote something else first) but enqueues late
/// still comes first in the outbox order (xid, seq), and a relay that ran meanwhile waited
/// for it instead of publishing past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_order_is_xid_then_seq() {
    let _serial = SERIAL.lock().await;
    let schema = fresh_schema("t_outbox_xid").await;
    let outbox = Outbox::new(&schema);
    let mut early = connect().await;
    let mut late = connect().await;
    let mut relay_client = connect().await;
    let relay = Relay::new(outbox.clone(), Recorder::default(), quick());

    let tx_early = early.transaction().await.unwrap();
    tx_early
        .execute("SELECT pg_current_xact_id()", &[])
        .await
        .unwrap();
    let tx_late = late.transaction().await.unwrap();
    outbox
        .enqueue(&tx_late, &Message::new("agg", "t", "later xid, lower seq"))
        .await
        .unwrap();
    tx_late.commit().await.unwrap();
    assert_eq!(relay.run_once(&mut relay_client).await.unwrap().read, 0);
    outbox
        .enqueue(
            &tx_early,
            &Message::new("agg", "t", "earlier xid, higher seq"),
        )
        .await
        .unwrap();
    tx_early.commit().await.unwrap();
    assert_eq!(
        relay.run_once(&mut relay_client).await.unwrap().published,
        2
    );
    assert_eq!(
        relay.publisher().payloads(),
        ["earlier xid, higher seq", "later xid, lower seq"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_backs_off_holds_its_aggregate_and_becomes_a_dead_letter() {
    let _serial = SERIAL.lock().await;
    let schema = fresh_schema("t_outbox_dead").await;
    let outbox = Outbox::new(&schema);
    let mut client = connect().await;
    let tx = client.transaction().await.unwrap();
    outbox
        .enqueue(&tx, &Message::new("held", "bad.route", "refused"))
        .await
        .unwrap();
    outbox
        .enqueue(&tx, &Message::new("held", "t", "behind the refused one"))
        .await
        .unwrap();
    outbox
        .enqueue(&tx, &Message::new("free", "t", "another aggregate"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let relay = Relay::new(outbox.clone(), Recorder::default(), quick());
    let report = relay.run_once(&mut client).await.unwrap();
    assert_eq!((report.published, report.retried), (1, 1), "{report:?}");
    assert_eq!(relay.publisher().payloads(), ["another aggregate"]);

    // During the backoff the whole aggregate is held back.
    let report = relay.run_once(&mut client).await.unwrap();
    assert_eq!(report.read, 0, "{report:?}");

    let mut rounds = 0;
    while outbox.stats(&client).await.unwrap().dead == 0 {
        rounds += 1;
        assert!(rounds < 100, "never dead-lettered");
        relay.run_once(&mut client).await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dead = outbox.dead_letters(&client, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message.payload, b"refused");
    assert_eq!(dead[0].message.attempts, 3);
    assert!(dead[0].last_error.contains("no route"), "{:?}", dead[0]);

    // The dead letter no longer holds its aggregate back.
    relay.run_once(&mut client).await.unwrap();
    assert_eq!(
        relay.publisher().payloads(),
        ["another aggregate", "behind the refused one"]
    );
    let stats = outbox.stats(&client).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 1));

    // Requeued, it is tried again with fresh attempts (and refused again here).
    assert!(outbox.requeue(&client, &dead[0].message.id).await.unwrap());
    assert!(!outbox.requeue(&client, "no-such-id").await.unwrap());
    let report = relay.run_once(&mut client).await.unwrap();
    assert_eq!(report.retried, 1, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_not_an_attempt_and_the_lag_is_visible() {
    let _serial = SERIAL.lock().await;
    let schema = fresh_schema("t_outbox_outage").await;
    let outbox = Outbox::new(&schema);
    let mut client = connect().await;
    let tx = client.transaction().await.unwrap();
    for i in 0..3 {
        outbox
            .enqueue(&tx, &Message::new("a", "down", format!("m{i}")))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let relay = Relay::new(outbox.clone(), Recorder::default(), quick());
    for _ in 0..5 {
        let report = relay.run_once(&mut client).await.unwrap();
        // The chain stops at its first failure: one message tried per round.
        assert_eq!((report.unavailable, report.retried), (1, 0), "{report:?}");
    }
    let stats = outbox.stats(&client).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (3, 0));
    assert!(
        stats.oldest_pending_age >= Duration::from_millis(300),
        "{stats:?}"
    );
    relay.export_gauges(&client).await.unwrap();
}
