//! The workloads, how they are selected on the command line, and the key-value load generator.
//!
//! The key-value workloads follow etcd's own `tools/benchmark` (`put` and `range`) so numbers
//! can be compared with published etcd figures in spirit: random 8-byte keys from a fixed key
//! space, fixed-size values, many clients multiplexed over a few connections, closed loop (each
//! client sends its next request when the previous one returns). The lock workloads live in
//! [`crate::locks`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::builder::PossibleValue;
use etcd_client::{Client, ConnectOptions, GetOptions, KvClient};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;

use crate::locks::{self, LockApi, LockShape};
use crate::server::Kind;

/// The key the range workloads read. It is written once per server before any range run, so
/// every Range returns exactly one key-value pair on both servers.
pub const RANGE_KEY: &[u8] = b"baton-bench/range-key";

/// Per-request timeout. Generous, since a request never legitimately takes seconds here, but
/// finite, so a wedged server cannot keep the benchmark from ending.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest latency the histograms track (60 s in µs); larger values are clamped.
const MAX_LATENCY_US: u64 = 60_000_000;

/// One benchmark workload. The lock workloads' contender counts are fixed rather than flags:
/// they are the shapes issue 3 asks for (10 and 50 contenders on one lock, 50 lone contenders
/// on 50 locks), and fixed shapes keep results from different runs comparable.
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
    /// etcd's v3lock Lock/Unlock, 10 contenders on one lock: the cost of a handoff.
    #[value(name = "lock-handoff-10")]
    #[serde(rename = "lock-handoff-10")]
    LockHandoff10,
    /// Baton's baton.v1 Acquire/Release, 10 contenders on one lock (Baton only).
    #[value(name = "baton-lock-handoff-10")]
    #[serde(rename = "baton-lock-handoff-10")]
    BatonLockHandoff10,
    /// etcd's v3lock Lock/Unlock, 50 contenders on one lock: a handoff with a long queue.
    #[value(name = "lock-handoff-50")]
    #[serde(rename = "lock-handoff-50")]
    LockHandoff50,
    /// Baton's baton.v1 Acquire/Release, 50 contenders on one lock (Baton only).
    #[value(name = "baton-lock-handoff-50")]
    #[serde(rename = "baton-lock-handoff-50")]
    BatonLockHandoff50,
    /// etcd's v3lock Lock/Unlock, 50 distinct locks with one contender each: the cost of an
    /// uncontended acquire and release.
    LockUncontended,
    /// Baton's baton.v1 Acquire/Release, 50 distinct locks with one contender each (Baton only).
    BatonLockUncontended,
}

/// The two families of workloads, selectable as a whole with `--workloads kv,locks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Group {
    /// put1, put-n, range-linearizable, range-serializable.
    Kv,
    /// Every lock workload, v3lock and baton.v1.
    Locks,
}

impl Workload {
    /// Every workload, in the order they run and appear in the tables. Each baton.v1 workload
    /// follows the v3lock one of the same shape, since that is the row its ratio is taken
    /// against.
    pub const ALL: [Workload; 10] = [
        Workload::Put1,
        Workload::PutN,
        Workload::RangeLinearizable,
        Workload::RangeSerializable,
        Workload::LockHandoff10,
        Workload::BatonLockHandoff10,
        Workload::LockHandoff50,
        Workload::BatonLockHandoff50,
        Workload::LockUncontended,
        Workload::BatonLockUncontended,
    ];

    pub fn group(self) -> Group {
        match self.lock_shape() {
            Some(_) => Group::Locks,
            None => Group::Kv,
        }
    }

    /// The lock API, contenders and locks of a lock workload; `None` for key-value workloads.
    pub fn lock_shape(self) -> Option<LockShape> {
        let (api, contenders, locks) = match self {
            Workload::Put1
            | Workload::PutN
            | Workload::RangeLinearizable
            | Workload::RangeSerializable => return None,
            Workload::LockHandoff10 => (LockApi::V3Lock, 10, 1),
            Workload::BatonLockHandoff10 => (LockApi::BatonV1, 10, 1),
            Workload::LockHandoff50 => (LockApi::V3Lock, 50, 1),
            Workload::BatonLockHandoff50 => (LockApi::BatonV1, 50, 1),
            Workload::LockUncontended => (LockApi::V3Lock, 50, 50),
            Workload::BatonLockUncontended => (LockApi::BatonV1, 50, 50),
        };
        Some(LockShape {
            api,
            contenders,
            locks,
        })
    }

    /// Whether `kind` can run this workload at all: etcd has no baton.v1 service.
    pub fn runs_on(self, kind: Kind) -> bool {
        !matches!(self.lock_shape(), Some(s) if s.api == LockApi::BatonV1 && kind == Kind::Etcd)
    }

    /// The workload whose etcd throughput this one's Baton throughput is divided by, when it
    /// is not the workload itself: baton.v1 has no etcd counterpart, so its rows are compared
    /// with etcd's v3lock rows of the same shape (what an etcd user would use instead).
    pub fn ratio_base(self) -> Option<Workload> {
        match self {
            Workload::BatonLockHandoff10 => Some(Workload::LockHandoff10),
            Workload::BatonLockHandoff50 => Some(Workload::LockHandoff50),
            Workload::BatonLockUncontended => Some(Workload::LockUncontended),
            _ => None,
        }
    }

    /// Clients and connections this workload uses under `cfg`.
    pub fn shape(self, cfg: &LoadConfig) -> (usize, usize) {
        match self {
            Workload::Put1 => (1, 1),
            _ => (cfg.clients, cfg.conns),
        }
    }

    /// What one operation is, for the progress lines: a request, or a lock + unlock cycle.
    pub fn unit(self) -> &'static str {
        match self.group() {
            Group::Kv => "ops/s",
            Group::Locks => "cycles/s",
        }
    }

    /// The label used in the table, e.g. `put, 100 clients / 10 conns`.
    pub fn label(self, cfg: &LoadConfig) -> String {
        if let Some(shape) = self.lock_shape() {
            return shape.label();
        }
        let (clients, conns) = self.shape(cfg);
        let op = match self {
            Workload::Put1 | Workload::PutN => "put",
            Workload::RangeLinearizable => "range linearizable",
            _ => "range serializable",
        };
        if clients == 1 {
            format!("{op}, 1 client")
        } else {
            format!("{op}, {clients} clients / {conns} conns")
        }
    }
}

/// One value of `--workloads`: a whole group or a single workload. A hand-written
/// [`clap::ValueEnum`] so that clap lists and validates both kinds of name.
#[derive(Clone, Copy, Debug)]
pub enum Selection {
    Group(Group),
    One(Workload),
}

const SELECTIONS: [Selection; 12] = [
    Selection::Group(Group::Kv),
    Selection::Group(Group::Locks),
    Selection::One(Workload::Put1),
    Selection::One(Workload::PutN),
    Selection::One(Workload::RangeLinearizable),
    Selection::One(Workload::RangeSerializable),
    Selection::One(Workload::LockHandoff10),
    Selection::One(Workload::BatonLockHandoff10),
    Selection::One(Workload::LockHandoff50),
    Selection::One(Workload::BatonLockHandoff50),
    Selection::One(Workload::LockUncontended),
    Selection::One(Workload::BatonLockUncontended),
];

impl clap::ValueEnum for Selection {
    fn value_variants<'a>() -> &'a [Self] {
        &SELECTIONS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            Selection::Group(g) => g.to_possible_value(),
            Selection::One(w) => w.to_possible_value(),
        }
    }
}

/// The workloads `selections` name, each once, in [`Workload::ALL`] order (so baton.v1 rows
/// stay next to the v3lock rows they are compared with). Empty means all.
pub fn resolve(selections: &[Selection]) -> Vec<Workload> {
    if selections.is_empty() {
        return Workload::ALL.to_vec();
    }
    Workload::ALL
        .into_iter()
        .filter(|w| {
            selections.iter().any(|s| match *s {
                Selection::Group(g) => w.group() == g,
                Selection::One(one) => one == *w,
            })
        })
        .collect()
}

/// The knobs shared by all workloads.
#[derive(Clone, Debug, Serialize)]
pub struct LoadConfig {
    pub clients: usize,
    pub conns: usize,
    pub key_space: u64,
    pub value_size: usize,
    pub warmup: Duration,
    /// Measured time per key-value run.
    pub duration: Duration,
    /// Measured time per lock run. Shorter than `duration` by default: there are more lock
    /// runs (three shapes, two APIs), each reaches its steady state within the warm-up, and
    /// longer runs would add minutes without adding information.
    pub lock_duration: Duration,
    /// TTL of each lock contender's lease (its session).
    pub lock_ttl: Duration,
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

/// Runs `workload` against `endpoint`: a warm-up, then the workload's measured duration.
///
/// A request counts (in throughput and latency) when it *completes* inside the window
/// `[start + warmup, start + warmup + duration]`; requests that straddle the start of the
/// window are counted, ones still in flight at its end are not, so ops / duration is exactly
/// the completion rate during the window.
pub async fn run(endpoint: &str, workload: Workload, cfg: &LoadConfig) -> Result<RunResult> {
    if let Some(shape) = workload.lock_shape() {
        return locks::run(endpoint, shape, cfg).await;
    }
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

    let mut total = Tally::new();
    for task in futures::future::join_all(tasks).await {
        total.merge(task.context("a load task panicked")??)?;
    }
    total.summarize(cfg.duration)
}

/// What one load task saw: one histogram per task, merged at the end, so the hot path takes
/// no locks.
pub struct Tally {
    pub hist: Histogram<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            hist: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds"),
            errors: 0,
            first_error: None,
        }
    }

    /// Records one successful operation that took `latency`.
    pub fn record(&mut self, latency: Duration) -> Result<()> {
        let us = latency.as_micros().clamp(1, MAX_LATENCY_US as u128) as u64;
        self.hist.record(us).context("recording a latency")
    }

    pub fn error(&mut self, e: &anyhow::Error) {
        self.errors += 1;
        self.first_error.get_or_insert_with(|| format!("{e:#}"));
    }

    pub fn merge(&mut self, other: Tally) -> Result<()> {
        self.hist.add(&other.hist).context("merging histograms")?;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        Ok(())
    }

    /// Throughput over `duration` and latency percentiles. Fails if nothing succeeded: a run
    /// of nothing but errors has no numbers worth a row.
    pub fn summarize(self, duration: Duration) -> Result<RunResult> {
        let Tally {
            hist,
            errors,
            first_error,
        } = self;
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
            ops_per_sec: ops as f64 / duration.as_secs_f64(),
            p50_ms: ms(hist.value_at_quantile(0.50)),
            p90_ms: ms(hist.value_at_quantile(0.90)),
            p99_ms: ms(hist.value_at_quantile(0.99)),
            max_ms: ms(hist.max()),
            mean_ms: hist.mean() / 1000.0,
        })
    }
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

impl Worker {
    async fn run(mut self) -> Result<Tally> {
        let mut tally = Tally::new();
        loop {
            let sent = Instant::now();
            if sent >= self.window_end {
                break;
            }
            let outcome = self.request().await;
            let done = Instant::now();
            match outcome {
                Ok(()) if done >= self.window_start && done <= self.window_end => {
                    tally.record(done - sent)?;
                }
                Ok(()) => {}
                Err(e) => {
                    tally.error(&e);
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
            lock => unreachable!("{lock:?} runs in locks::run, not as a key-value worker"),
        }
        Ok(())
    }
}

async fn connect(endpoint: &str) -> Result<Client> {
    connect_with_timeout(endpoint, REQUEST_TIMEOUT).await
}

/// A new connection (`Client`) whose requests time out after `timeout`.
pub async fn connect_with_timeout(endpoint: &str, timeout: Duration) -> Result<Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(timeout);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_is_selectable_by_name() {
        for w in Workload::ALL {
            assert!(
                SELECTIONS
                    .iter()
                    .any(|s| matches!(s, Selection::One(one) if *one == w)),
                "{w:?} missing from SELECTIONS"
            );
        }
    }

    #[test]
    fn selections_resolve_to_groups_and_names_in_canonical_order() {
        use clap::ValueEnum as _;
        let parse = |names: &[&str]| {
            let selections: Vec<Selection> = names
                .iter()
                .map(|n| Selection::from_str(n, false).unwrap())
                .collect();
            resolve(&selections)
        };
        assert_eq!(parse(&[]), Workload::ALL.to_vec());
        assert_eq!(parse(&["kv", "locks"]), Workload::ALL.to_vec());
        assert_eq!(
            parse(&["locks"]),
            Workload::ALL
                .into_iter()
                .filter(|w| w.lock_shape().is_some())
                .collect::<Vec<_>>()
        );
        assert_eq!(
            parse(&["lock-uncontended", "put1", "put1"]),
            vec![Workload::Put1, Workload::LockUncontended]
        );
        assert!(Selection::from_str("lock-handoff-10", false).is_ok());
        assert!(Selection::from_str("nope", false).is_err());
    }

    #[test]
    fn baton_v1_rows_compare_with_v3lock_rows_of_the_same_shape() {
        for w in Workload::ALL {
            let Some(shape) = w.lock_shape() else {
                continue;
            };
            assert_eq!(w.runs_on(Kind::Etcd), shape.api == LockApi::V3Lock);
            if let Some(base) = w.ratio_base() {
                let base_shape = base.lock_shape().unwrap();
                assert_eq!(base_shape.api, LockApi::V3Lock);
                assert_eq!(
                    (base_shape.contenders, base_shape.locks),
                    (shape.contenders, shape.locks)
                );
            } else {
                assert_eq!(shape.api, LockApi::V3Lock);
            }
        }
    }

    #[test]
    fn keys_match_go_put_varint() {
        // binary.PutVarint(buf, 0) = [0x00], 1 = [0x02], 64 = [0x80 0x01], 99999 = [0xbe 0x9a 0x0c].
        assert_eq!(bench_key(0), [0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bench_key(1), [2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bench_key(64), [0x80, 0x01, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bench_key(99_999), [0xbe, 0x9a, 0x0c, 0, 0, 0, 0, 0]);
    }
}
