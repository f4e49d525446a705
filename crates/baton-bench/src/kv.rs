//! The key-value workloads (put, txn-put, range) on the generated tonic KV client.
//!
//! They follow etcd's own `tools/benchmark`: random 8-byte keys from a fixed key space,
//! fixed-size values, many closed-loop clients (each sends its next request when the
//! previous one returns) multiplexed over a few connections.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use baton_proto::etcdserverpb::kv_client::KvClient;
use baton_proto::etcdserverpb::request_op::Request;
use baton_proto::etcdserverpb::{
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;
use tonic::transport::Channel;

use crate::engine::{self, Counter, CpuWindow, Progress, RunResult, Tally, Window};
use crate::grpc;

/// The key the range workloads read. It is written once before any range run, so every
/// Range returns exactly one key-value pair on both servers.
pub const RANGE_KEY: &[u8] = b"baton-bench/range-key";

/// What each request of a key-value workload is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvOp {
    /// `KV.Put` of a random key.
    Put,
    /// `KV.Txn` with no compare and one Put in its success branch (etcd's `benchmark txn-put`).
    TxnPut,
    /// `KV.Range` of [`RANGE_KEY`], linearizable (ReadIndex) or serializable (local).
    Range { serializable: bool },
}

/// A key-value load: what, how many clients over how many connections.
#[derive(Clone, Debug, Serialize)]
pub struct KvLoad {
    pub op: KvOp,
    pub clients: usize,
    pub conns: usize,
    /// Puts choose keys at random from this many.
    pub key_space: u64,
    pub value_size: usize,
    /// Instead of running for a duration, write keys `0..total` exactly once each (the
    /// clients share a counter) and stop: what the RSS measurement needs.
    pub total: Option<u64>,
    /// With `total`: the first key index (so keys `key_offset..key_offset + total` are
    /// written), letting a second fill add new distinct keys to an earlier one.
    #[serde(skip_serializing_if = "is_zero")]
    pub key_offset: u64,
    /// Which gRPC client carries the requests.
    pub client: ClientImpl,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The gRPC client of the key-value workloads. Both speak plain gRPC over HTTP/2 and behave
/// the same for the server; they differ in what they cost the client (see bench/README.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ClientImpl {
    /// The hand-rolled unary client on the `h2` crate ([`crate::grpc`]): the cheapest.
    #[default]
    H2,
    /// The generated tonic client (`KvClient<Channel>`).
    Tonic,
}

/// Attempts per key when filling (`total`).
const FILL_TRIES: u32 = 5;

/// Writes [`RANGE_KEY`] so the range workloads have something to read (also the readiness
/// check of a deployment). Through the lean client, which shows the `--auth` token.
pub async fn prepare(endpoints: &[String], value_size: usize) -> Result<()> {
    let endpoint = endpoints.first().context("no endpoints")?;
    let conn = grpc::H2Conn::connect(endpoint).await?;
    let put = PutRequest {
        key: RANGE_KEY.to_vec(),
        value: random_value(value_size, 0),
        ..Default::default()
    };
    tokio::time::timeout(
        engine::REQUEST_TIMEOUT,
        conn.unary::<_, baton_proto::etcdserverpb::PutResponse>(grpc::KV_PUT, &put),
    )
    .await
    .context("writing the range key: no answer")?
    .context("writing the range key")?;
    Ok(())
}

/// Runs `load` against `endpoints`: a warm-up, then `duration` measured (or, with `total`,
/// until every key is written, all of it measured).
pub async fn run(
    endpoints: &[String],
    load: &KvLoad,
    warmup: Duration,
    duration: Duration,
    progress: bool,
) -> Result<RunResult> {
    if matches!(load.op, KvOp::Range { .. }) {
        prepare(endpoints, load.value_size).await?;
    }
    let n = load.conns.min(load.clients).max(1);
    // The h2 connections' drivers, polled by the task that runs the connection's clients.
    let (conns, drivers): (Vec<Conn>, Vec<grpc::Driver>) = match load.client {
        ClientImpl::Tonic => (
            engine::channels(endpoints, n)
                .await?
                .into_iter()
                .map(|ch| Conn::Tonic(KvClient::new(ch)))
                .collect(),
            Vec::new(),
        ),
        ClientImpl::H2 => futures::future::try_join_all(
            (0..n).map(|i| grpc::H2Conn::connect_driven(&endpoints[i % endpoints.len()])),
        )
        .await?
        .into_iter()
        .map(|(conn, driver)| (Conn::H2(conn), driver))
        .unzip(),
    };
    let value = Arc::new(random_value(load.value_size, 1));
    let (warmup, duration) = match load.total {
        // Filling: everything counts, and the run ends when the keys run out (the window is
        // only an upper bound).
        Some(_) => (Duration::ZERO, Duration::from_secs(24 * 3600)),
        None => (warmup, duration),
    };
    let window = Window::new(warmup, duration);
    let counter = Counter::default();
    let next_key = Arc::new(AtomicU64::new(0));
    let progress_total = match load.total {
        Some(_) => Duration::ZERO,
        None => warmup + duration,
    };
    let progress = Progress::start(
        label(load),
        "ops",
        counter.clone(),
        progress_total,
        progress,
    );
    let cpu = CpuWindow::start(window, None);
    let cpu_start = engine::process_cpu_secs(None);
    let workers = (0..load.clients).map(|id| Worker {
        conn: conns[id % conns.len()].clone(),
        op: load.op,
        key_space: load.key_space,
        total: load.total,
        key_offset: load.key_offset,
        next_key: Arc::clone(&next_key),
        value: Arc::clone(&value),
        rng: StdRng::seed_from_u64(id as u64 + 1),
        window,
        counter: counter.clone(),
    });
    let tasks: Vec<tokio::task::JoinHandle<Result<Tally>>> = if drivers.is_empty() {
        // tonic: a task per client (the channel has its own tasks).
        workers.map(|w| tokio::spawn(w.run())).collect()
    } else {
        // h2: a task per connection, running its clients and its driver (see `on_one_task`).
        let mut groups: Vec<Vec<Worker>> = (0..drivers.len()).map(|_| Vec::new()).collect();
        for (id, worker) in workers.enumerate() {
            groups[id % drivers.len()].push(worker);
        }
        groups
            .into_iter()
            .zip(drivers)
            .map(|(group, driver)| tokio::spawn(on_one_task(group, driver)))
            .collect()
    };
    // No per-request timer on the hot path: a request still unanswered REQUEST_TIMEOUT after
    // the window (a wedged server) ends its client instead, counted as an error.
    let give_up = tokio::time::Instant::from_std(window.close + engine::REQUEST_TIMEOUT);
    let mut total = Tally::new();
    for task in tasks {
        let abort = task.abort_handle();
        match tokio::time::timeout_at(give_up, task).await {
            Ok(joined) => total.merge(joined.context("a load task panicked")??)?,
            Err(_) => {
                abort.abort();
                total.error(&anyhow::anyhow!(
                    "a request was still unanswered {:?} after the window",
                    engine::REQUEST_TIMEOUT
                ));
            }
        }
    }
    progress.finish().await;
    let mut result = match load.total {
        Some(_) => {
            let elapsed = window.start.elapsed();
            let cpu_used = cpu_start
                .zip(engine::process_cpu_secs(None))
                .map(|(a, b)| b - a);
            let mut r = total.summarize(elapsed)?;
            r.client_cpu_us_per_op = cpu_used.map(|c| c * 1e6 / r.ops as f64);
            r
        }
        None => {
            let mut r = total.summarize(window.duration())?;
            r.client_cpu_us_per_op = cpu.finish().await.map(|c| c * 1e6 / r.ops as f64);
            r
        }
    };
    if let Some(n) = load.total {
        result.extra.push(("keys_written".into(), n as f64));
    }
    Ok(result)
}

/// e.g. `put, 100 clients / 10 conns`.
pub fn label(load: &KvLoad) -> String {
    let op = match load.op {
        KvOp::Put => "put",
        KvOp::TxnPut => "txn-put",
        KvOp::Range {
            serializable: false,
        } => "range linearizable",
        KvOp::Range { serializable: true } => "range serializable",
    };
    if load.clients == 1 {
        format!("{op}, 1 client")
    } else {
        format!(
            "{op}, {} clients / {} conns",
            load.clients,
            load.conns.min(load.clients)
        )
    }
}

/// Runs one connection's clients and its [`grpc::Driver`] on one task, the clients polled
/// first; their tallies merged.
///
/// Why: with a task per client and the connection on a task of its own, every request
/// crosses tasks twice (the client's stream wakes the connection's task to write it; the
/// response read wakes the client's task), often between the runtime's two threads, and each
/// response arrives in its own wake-up. On one task, whatever the connection's read
/// delivered is consumed by every woken client, and the requests they send next are all
/// queued before the connection writes them out together: the same shape as the server's
/// cheapest HTTP/2 variant in `bench/http2-stack`. The client shares the 2 cores with the
/// server under test, so what it saves per request goes to the server (bench/README.md).
async fn on_one_task(workers: Vec<Worker>, driver: grpc::Driver) -> Result<Tally> {
    use futures::stream::FuturesUnordered;
    use futures::{FutureExt as _, StreamExt as _};
    use std::task::Poll;

    let mut clients: FuturesUnordered<_> = workers.into_iter().map(Worker::run).collect();
    // `None` once the connection has closed: its requests then fail by themselves.
    let mut driver = Some(driver);
    let mut total = Tally::new();
    std::future::poll_fn(|cx| {
        loop {
            match clients.poll_next_unpin(cx) {
                Poll::Ready(Some(tally)) => total.merge(tally?)?,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        if driver.as_mut().is_some_and(|d| d.poll_unpin(cx).is_ready()) {
            driver = None;
            // What the close failed is for the clients to see: poll them again.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    })
    .await
    .map(|()| total)
}

/// A connection as one client uses it.
#[derive(Clone)]
enum Conn {
    H2(grpc::H2Conn),
    Tonic(KvClient<Channel>),
}

/// One closed-loop client.
struct Worker {
    conn: Conn,
    op: KvOp,
    key_space: u64,
    total: Option<u64>,
    key_offset: u64,
    next_key: Arc<AtomicU64>,
    value: Arc<Vec<u8>>,
    rng: StdRng,
    window: Window,
    counter: Counter,
}

impl Worker {
    async fn run(mut self) -> Result<Tally> {
        let mut tally = Tally::new();
        loop {
            let sent = Instant::now();
            if sent >= self.window.close {
                break;
            }
            let key = match self.total {
                Some(total) => {
                    let i = self.next_key.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    self.key_offset + i
                }
                None => self.rng.gen_range(0..self.key_space),
            };
            let mut outcome = self.request(key).await;
            if self.total.is_some() {
                // Filling: every key must be written, so a failed one is retried (a server
                // that times out a request under a stalled disk has usually applied it or
                // will; a retry at worst adds a second revision of the same key).
                let mut tries = 1;
                while let Err(e) = &outcome {
                    if tries == FILL_TRIES {
                        break;
                    }
                    tally.error(e);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    outcome = self.request(key).await;
                    tries += 1;
                }
            }
            let done = Instant::now();
            match outcome {
                Ok(()) => {
                    self.counter.add(1);
                    if self.window.contains(done) {
                        tally.record(done - sent);
                    }
                }
                Err(e) => {
                    tally.error(&e);
                    if self.total.is_some() {
                        return Err(e.context(format!("writing key {key} ({FILL_TRIES} tries)")));
                    }
                    // A server that fails fast would otherwise be hammered in a tight loop.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        Ok(tally)
    }

    async fn request(&mut self, key: u64) -> Result<()> {
        let put = || PutRequest {
            key: bench_key(key).to_vec(),
            value: self.value.to_vec(),
            ..Default::default()
        };
        match (self.op, &mut self.conn) {
            (KvOp::Put, Conn::H2(c)) => {
                c.unary::<_, PutResponse>(grpc::KV_PUT, &put()).await?;
            }
            (KvOp::Put, Conn::Tonic(kv)) => {
                kv.put(put()).await?;
            }
            (KvOp::TxnPut, conn) => {
                let txn = TxnRequest {
                    compare: Vec::new(),
                    success: vec![RequestOp {
                        request: Some(Request::RequestPut(put())),
                    }],
                    failure: Vec::new(),
                };
                match conn {
                    Conn::H2(c) => {
                        c.unary::<_, TxnResponse>(grpc::KV_TXN, &txn).await?;
                    }
                    Conn::Tonic(kv) => {
                        kv.txn(txn).await?;
                    }
                }
            }
            (KvOp::Range { serializable }, conn) => {
                let range = RangeRequest {
                    key: RANGE_KEY.to_vec(),
                    serializable,
                    ..Default::default()
                };
                let resp: RangeResponse = match conn {
                    Conn::H2(c) => c.unary(grpc::KV_RANGE, &range).await?,
                    Conn::Tonic(kv) => kv.range(range).await?.into_inner(),
                };
                // Cheap, and guarantees both servers do the same work (read one real pair).
                if resp.kvs.len() != 1 {
                    bail!("range returned {} pairs, expected 1", resp.kvs.len());
                }
            }
        }
        Ok(())
    }
}

/// An 8-byte key holding a varint of `n`, zero-padded: exactly what etcd's
/// `benchmark put --key-size 8` sends (`binary.PutVarint` into an 8-byte buffer).
pub fn bench_key(n: u64) -> [u8; 8] {
    let mut key = [0u8; 8];
    // Go's PutVarint zig-zag encodes the signed value; `n` is non-negative here.
    let mut v = n << 1;
    let mut i = 0;
    while v >= 0x80 && i < 7 {
        key[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    key[i] = v as u8;
    key
}

/// A random (so incompressible) value of `size` bytes, deterministic per `seed`.
pub fn random_value(size: usize, seed: u64) -> Vec<u8> {
    let mut value = vec![0u8; size];
    StdRng::seed_from_u64(seed).fill_bytes(&mut value);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_match_go_put_varint() {
        // binary.PutVarint(buf, 0) = [0x00], 1 = [0x02], 64 = [0x80 0x01], 99999 = [0xbe 0x9a 0x0c].
        assert_eq!(bench_key(0), [0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bench_key(1), [2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bench_key(64), [0x80, 0x01, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bench_key(99_999), [0xbe, 0x9a, 0x0c, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_million_keys_are_distinct() {
        let keys: std::collections::HashSet<[u8; 8]> = (0..1_000_000).map(bench_key).collect();
        assert_eq!(keys.len(), 1_000_000);
    }

    /// A gRPC server on `h2` that answers the first `answered` puts of each connection and
    /// then closes it; its address.
    async fn server_closing_after(answered: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut conn = h2::server::handshake(tcp).await.unwrap();
                    for _ in 0..answered {
                        let Some(Ok((_request, mut respond))) = conn.accept().await else {
                            return;
                        };
                        let head = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(())
                            .unwrap();
                        let mut body = respond.send_response(head, false).unwrap();
                        body.send_data(grpc::frame(&PutResponse::default()), false)
                            .unwrap();
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        body.send_trailers(trailers).unwrap();
                    }
                    // Flushes the answers, then the connection goes away with `conn`.
                    let _ = tokio::time::timeout(Duration::from_millis(50), async {
                        while conn.accept().await.is_some() {}
                    })
                    .await;
                });
            }
        });
        addr
    }

    /// The clients of one connection share its task (`on_one_task`): when the connection
    /// closes under them they fail, keep failing until the window closes, and the run ends
    /// with what succeeded before and the errors counted, instead of waiting for answers
    /// that cannot come.
    #[tokio::test]
    async fn clients_of_a_closed_connection_end_with_the_window() {
        let endpoint = server_closing_after(3).await;
        let load = KvLoad {
            op: KvOp::Put,
            clients: 4,
            conns: 2,
            key_space: 10,
            value_size: 8,
            total: None,
            key_offset: 0,
            client: ClientImpl::H2,
        };
        let run = tokio::time::timeout(
            Duration::from_secs(30),
            run(
                &[endpoint],
                &load,
                Duration::ZERO,
                Duration::from_millis(500),
                false,
            ),
        )
        .await
        .expect("the run ends")
        .expect("some puts succeeded");
        // Three answered on each of the two connections; the close may beat an answer to
        // the client (a reset discards what it had not read yet), never add one.
        assert!((1..=6).contains(&run.ops), "{run:?}");
        assert!(run.errors > 0, "{run:?}");
    }

    #[test]
    fn labels() {
        let load = |op, clients, conns| KvLoad {
            op,
            clients,
            conns,
            key_space: 1,
            value_size: 1,
            total: None,
            key_offset: 0,
            client: ClientImpl::H2,
        };
        assert_eq!(label(&load(KvOp::Put, 1, 1)), "put, 1 client");
        assert_eq!(
            label(&load(
                KvOp::Range {
                    serializable: false
                },
                100,
                10
            )),
            "range linearizable, 100 clients / 10 conns"
        );
        assert_eq!(
            label(&load(KvOp::TxnPut, 4, 10)),
            "txn-put, 4 clients / 4 conns"
        );
    }
}
