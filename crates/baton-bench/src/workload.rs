//! The workloads and the load generator.
//!
//! They follow etcd's own `tools/benchmark` (`put` and `range`) so numbers can be compared
//! with published etcd figures in spirit: random 8-byte keys from a fixed key space, fixed-size
//! values, many clients multiplexed over a few connections, closed loop (each client sends its
//! next request when the previous one returns).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, ConnectOptions, GetOptions, KvClient};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;

/// The key the range workloads read. It is written once per server before any range run, so
/// every Range returns exactly one key-value pair on both servers.
pub const RANGE_KEY: &[u8] = b"baton-bench/range-key";

/// Per-request timeout. Generous, since a request never legitimately takes seconds here, but
/// finite, so a wedged server cannot keep the benchmark from ending.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest latency the histograms track (60 s in µs); larger values are clamped.
const MAX_LATENCY_US: u64 = 60_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Sequential puts from a single client: the latency of one durable write.
    Put1,
    /// Puts from many concurrent clients: how well writes are batched into fsyncs.
    PutN,
    /// Linearizable single-key Range (the default): has to confirm leadership (ReadIndex).
    RangeLinearizable,
    /// Serializable single-key Range: served from local state, the cheapest request there is.
    RangeSerializable,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::Put1,
        Workload::PutN,
        Workload::RangeLinearizable,
        Workload::RangeSerializable,
    ];

    /// Clients and connections this workload uses under `cfg`.
    pub fn shape(self, cfg: &LoadConfig) -> (usize, usize) {
        match self {
            Workload::Put1 => (1, 1),
            _ => (cfg.clients, cfg.conns),
        }
    }

    /// The label used in the table, e.g. `put, 100 clients / 10 conns`.
    pub fn label(self, cfg: &LoadConfig) -> String {
        let (clients, conns) = self.shape(cfg);
        let op = match self {
            Workload::Put1 | Workload::PutN => "put",
            Workload::RangeLinearizable => "range linearizable",
            Workload::RangeSerializable => "range serializable",
        };
        if clients == 1 {
            format!("{op}, 1 client")
        } else {
            format!("{op}, {clients} clients / {conns} conns")
        }
    }
}

/// The knobs shared by all workloads.
#[derive(Clone, Debug, Serialize)]
pub struct LoadConfig {
    pub clients: usize,
    pub conns: usize,
    pub key_space: u64,
    pub value_size: usize,
    pub warmup: Duration,
    pub duration: Duration,
}

/// What one run of one workload against one server measured.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// Successful requests completed inside the measurement window.
    pub ops: u64,
    /// Failed requests (any time, warm-up included).
    pub errors: u64,
    pub first_error: Option<String>,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Writes [`RANGE_KEY`] so the range workloads have something to read.
pub async fn prepare(endpoint: &str, value_size: usize) -> Result<()> {
    let mut client = connect(endpoint).await?;
    client
        .put(RANGE_KEY, random_value(value_size, 0), None)
        .await
        .context("writing the range key")?;
    Ok(())
}

/// Runs `workload` against `endpoint`: a warm-up, then `cfg.duration` of measurement.
///
/// A request counts (in throughput and latency) when it *completes* inside the window
/// `[start + warmup, start + warmup + duration]`; requests that straddle the start of the
/// window are counted, ones still in flight at its end are not, so ops / duration is exactly
/// the completion rate during the window.
pub async fn run(endpoint: &str, workload: Workload, cfg: &LoadConfig) -> Result<RunResult> {
    let (clients, conns) = workload.shape(cfg);
    // Separate `Client`s are separate HTTP/2 connections; clones of one `Client` share its
    // connection, just as etcd's benchmark spreads --clients over --conns gRPC connections.
    let mut connections = Vec::with_capacity(conns);
    for _ in 0..conns {
        connections.push(connect(endpoint).await?);
    }
    let value = Arc::new(random_value(cfg.value_size, 1));
    let start = Instant::now();
    let window_start = start + cfg.warmup;
    let window_end = window_start + cfg.duration;

    let mut tasks = Vec::with_capacity(clients);
    for id in 0..clients {
        let kv = connections[id % conns].kv_client();
        let worker = Worker {
            kv,
            workload,
            key_space: cfg.key_space,
            value: Arc::clone(&value),
            rng: StdRng::seed_from_u64(id as u64),
            window_start,
            window_end,
        };
        tasks.push(tokio::spawn(worker.run()));
    }

    let mut hist = new_histogram();
    let mut errors = 0;
    let mut first_error = None;
    for task in futures::future::join_all(tasks).await {
        let tally = task.context("a load task panicked")??;
        hist.add(&tally.hist).context("merging histograms")?;
        errors += tally.errors;
        first_error = first_error.or(tally.first_error);
    }
    let ops = hist.len();
    if ops == 0 {
        bail!(
            "no request succeeded in the measurement window ({errors} errors; first: {})",
            first_error.as_deref().unwrap_or("none")
        );
    }
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(RunResult {
        ops,
        errors,
        first_error,
        ops_per_sec: ops as f64 / cfg.duration.as_secs_f64(),
        p50_ms: ms(hist.value_at_quantile(0.50)),
        p90_ms: ms(hist.value_at_quantile(0.90)),
        p99_ms: ms(hist.value_at_quantile(0.99)),
        max_ms: ms(hist.max()),
        mean_ms: hist.mean() / 1000.0,
    })
}

/// One closed-loop client.
struct Worker {
    kv: KvClient,
    workload: Workload,
    key_space: u64,
    value: Arc<Vec<u8>>,
    rng: StdRng,
    window_start: Instant,
    window_end: Instant,
}

/// What one worker saw; merged by [`run`].
struct Tally {
    hist: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
}

impl Worker {
    async fn run(mut self) -> Result<Tally> {
        let mut tally = Tally {
            hist: new_histogram(),
            errors: 0,
            first_error: None,
        };
        // Each worker records into its own histogram: no locking on the hot path.
        loop {
            let sent = Instant::now();
            if sent >= self.window_end {
                break;
            }
            let outcome = self.request().await;
            let done = Instant::now();
            match outcome {
                Ok(()) if done >= self.window_start && done <= self.window_end => {
                    let us = (done - sent).as_micros().clamp(1, MAX_LATENCY_US as u128) as u64;
                    tally.hist.record(us).context("recording a latency")?;
                }
                Ok(()) => {}
                Err(e) => {
                    tally.errors += 1;
                    tally.first_error.get_or_insert_with(|| format!("{e:#}"));
                    // A server that fails fast would otherwise be hammered in a tight loop.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        Ok(tally)
    }

    async fn request(&mut self) -> Result<()> {
        match self.workload {
            Workload::Put1 | Workload::PutN => {
                let key = bench_key(self.rng.gen_range(0..self.key_space));
                self.kv
                    .put(key.to_vec(), self.value.as_slice(), None)
                    .await?;
            }
            Workload::RangeLinearizable | Workload::RangeSerializable => {
                let options = (self.workload == Workload::RangeSerializable)
                    .then(|| GetOptions::new().with_serializable());
                let resp = self.kv.get(RANGE_KEY, options).await?;
                // Cheap, and guarantees both servers do the same work (read one real pair).
                if resp.kvs().len() != 1 {
                    bail!("range returned {} pairs, expected 1", resp.kvs().len());
                }
            }
        }
        Ok(())
    }
}

async fn connect(endpoint: &str) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(REQUEST_TIMEOUT);
    Client::connect([endpoint], Some(options))
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

/// An 8-byte key holding a varint of `n`, zero-padded: exactly what etcd's
/// `benchmark put --key-size 8` sends (`binary.PutVarint` into an 8-byte buffer).
fn bench_key(n: u64) -> [u8; 8] {
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
fn random_value(size: usize, seed: u64) -> Vec<u8> {
    let mut value = vec![0u8; size];
    StdRng::seed_from_u64(seed).fill_bytes(&mut value);
    value
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
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
}
