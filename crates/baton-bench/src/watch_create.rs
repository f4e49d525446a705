//! watch-create: many watchers on one key, created over a few streams — the shape of etcd's
//! own `benchmark watch` (10 streams × 1000 watchers), which measures how fast a server
//! admits watchers rather than how fast it delivers events.
//!
//! A round opens `streams` watch streams (spread over `conns` connections), creates the
//! watchers on each one after another (the next create once the last is acknowledged, as
//! etcd's Go client does), and ends when every watcher is acknowledged (`created`); the
//! streams are then closed and the next round starts. One operation is one acknowledged
//! watcher; its latency runs from its create being sent to its `created` answer. The extra `round_ms_p50` is the time one round took: "creating
//! 10,000 watchers takes X s".

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use baton_proto::etcdserverpb::watch_client::WatchClient;
use baton_proto::etcdserverpb::watch_request::RequestUnion;
use baton_proto::etcdserverpb::{WatchCreateRequest, WatchRequest};
use futures::StreamExt as _;
use serde::Serialize;
use tonic::transport::Channel;

use crate::engine::{self, Counter, CpuWindow, Progress, RunResult, Tally, Window};

static RUN_ID: AtomicU64 = AtomicU64::new(0);

/// How long one stream may take to have all its watchers acknowledged before the run fails.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, Serialize)]
pub struct WatchCreateLoad {
    pub streams: usize,
    pub watchers_per_stream: usize,
    pub conns: usize,
}

impl WatchCreateLoad {
    pub fn label(&self) -> String {
        format!(
            "watch create, {} watchers on one key over {} streams",
            self.streams * self.watchers_per_stream,
            self.streams
        )
    }
}

pub async fn run(
    endpoints: &[String],
    load: &WatchCreateLoad,
    warmup: Duration,
    duration: Duration,
    progress: bool,
) -> Result<RunResult> {
    if load.streams == 0 || load.watchers_per_stream == 0 {
        bail!("watch-create needs at least one stream and one watcher per stream");
    }
    let key = format!(
        "baton-bench/watch-create/{}-{}",
        std::process::id(),
        RUN_ID.fetch_add(1, Ordering::Relaxed)
    )
    .into_bytes();
    let channels = engine::channels(endpoints, load.conns).await?;
    let window = Window::new(warmup, duration);
    let counter = Counter::default();
    let progress = Progress::start(
        "watch create".into(),
        "watchers",
        counter.clone(),
        warmup + duration,
        progress,
    );
    let cpu = CpuWindow::start(window, None);
    let mut tally = Tally::new();
    let mut rounds = Vec::new();
    while Instant::now() < window.close {
        let started = Instant::now();
        let streams = (0..load.streams).map(|i| {
            one_stream(
                channels[i % channels.len()].clone(),
                key.clone(),
                load.watchers_per_stream,
            )
        });
        let per_stream = futures::future::try_join_all(streams).await?;
        let finished = Instant::now();
        for acks in per_stream {
            for (sent, acked) in acks {
                counter.add(1);
                if window.contains(acked) {
                    tally.record(acked - sent);
                }
            }
        }
        // A round counts when it ran wholly inside the window.
        if started >= window.open && finished <= window.close {
            rounds.push(finished - started);
        }
    }
    progress.finish().await;
    let cpu = cpu.finish().await;
    let mut result = tally.summarize(window.duration())?;
    result.client_cpu_us_per_op = cpu.map(|c| c * 1e6 / result.ops as f64);
    rounds.sort();
    if let Some(median) = rounds.get(rounds.len() / 2) {
        result
            .extra
            .push(("round_ms_p50".into(), median.as_secs_f64() * 1e3));
    }
    result.extra.push(("rounds".into(), rounds.len() as f64));
    Ok(result)
}

/// Opens one stream and creates `n` watchers on it one after another, each create sent once
/// the previous one is acknowledged — as etcd's Go client does (its watch stream keeps one
/// create outstanding), so this is what `clientv3.Watch` callers see. Returns (sent,
/// acknowledged) per watcher. Closing the stream (dropping it) cancels them.
async fn one_stream(channel: Channel, key: Vec<u8>, n: usize) -> Result<Vec<(Instant, Instant)>> {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let create = || WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.clone(),
            ..Default::default()
        })),
    };
    let mut sent = Instant::now();
    tx.unbounded_send(create())
        .map_err(|_| anyhow!("watch channel closed"))?;
    let mut responses = WatchClient::new(channel)
        .watch(rx)
        .await
        .context("opening a watch stream")?
        .into_inner();
    let mut acks = Vec::with_capacity(n);
    let deadline = tokio::time::Instant::now() + ROUND_TIMEOUT;
    while acks.len() < n {
        let resp = tokio::time::timeout_at(deadline, responses.next())
            .await
            .map_err(|_| {
                anyhow!(
                    "{} of {n} watchers acknowledged in {ROUND_TIMEOUT:?}",
                    acks.len()
                )
            })?
            .ok_or_else(|| anyhow!("the watch stream ended after {} creates", acks.len()))?
            .context("watch stream")?;
        if resp.canceled {
            bail!("a watcher was refused: {}", resp.cancel_reason);
        }
        if resp.created {
            acks.push((sent, Instant::now()));
            if acks.len() < n {
                sent = Instant::now();
                tx.unbounded_send(create())
                    .map_err(|_| anyhow!("watch channel closed"))?;
            }
        }
    }
    drop(tx);
    Ok(acks)
}
