//! lease-keepalive: many leases kept alive at once, the way a fleet of clients with sessions
//! loads a server. Each lease is renewed every TTL/3 (as Go's clientv3 does), spread evenly
//! over time and over `streams` LeaseKeepAlive streams (one per connection). The server's
//! CPU while doing this is what matters; the orchestrator measures it from /proc.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use baton_proto::etcdserverpb::lease_client::LeaseClient;
use baton_proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest};
use futures::{StreamExt as _, TryStreamExt as _};
use serde::Serialize;
use tonic::transport::Channel;

use crate::engine::{self, Counter, CpuWindow, Progress, RunResult, Tally, Window};

#[derive(Clone, Debug, Serialize)]
pub struct LeaseLoad {
    pub leases: usize,
    pub ttl_secs: u64,
    /// LeaseKeepAlive streams (each on its own connection).
    pub streams: usize,
}

/// How often the keep-alive loop wakes to send what has come due.
const TICK: Duration = Duration::from_millis(10);

pub async fn run(
    endpoints: &[String],
    load: &LeaseLoad,
    warmup: Duration,
    duration: Duration,
    progress: bool,
    server_pids: &[u32],
) -> Result<RunResult> {
    let streams = load.streams.clamp(1, load.leases.max(1));
    let channels = engine::channels(endpoints, streams).await?;
    // Grant every lease first (setup, not measured), 100 at a time.
    let setup = Instant::now();
    let ids: Vec<i64> = futures::stream::iter(0..load.leases)
        .map(|i| {
            let mut c = LeaseClient::new(channels[i % channels.len()].clone());
            let ttl = load.ttl_secs as i64;
            async move {
                c.lease_grant(LeaseGrantRequest { ttl, id: 0 })
                    .await
                    .map(|r| r.into_inner().id)
                    .context("granting a lease")
            }
        })
        .buffer_unordered(100)
        .try_collect()
        .await?;
    let grant_secs = setup.elapsed().as_secs_f64();
    let window = Window::new(warmup, duration);
    let counter = Counter::default();
    let progress = Progress::start(
        format!("lease keep-alive, {} leases", load.leases),
        "keep-alives",
        counter.clone(),
        warmup + duration,
        progress,
    );
    let cpu = CpuWindow::start(window, None);
    let server_cpu: Vec<CpuWindow> = server_pids
        .iter()
        .map(|&pid| CpuWindow::start(window, Some(pid)))
        .collect();
    let period = Duration::from_secs(load.ttl_secs) / 3;
    let tasks: Vec<_> = (0..streams)
        .map(|s| {
            let mine: Vec<i64> = ids.iter().copied().skip(s).step_by(streams).collect();
            let client = LeaseClient::new(channels[s].clone());
            tokio::spawn(stream_task(client, mine, period, window, counter.clone()))
        })
        .collect();
    let mut total = Tally::new();
    for task in futures::future::join_all(tasks).await {
        total.merge(task.context("a keep-alive task panicked")??)?;
    }
    progress.finish().await;
    let cpu = cpu.finish().await;
    let mut server_secs = Vec::new();
    for c in server_cpu {
        server_secs.push(c.finish().await);
    }
    // Clean up: revoke every lease (not measured).
    let teardown = Instant::now();
    let revoke_errors = futures::stream::iter(ids.iter().copied().enumerate())
        .map(|(i, id)| {
            let mut c = LeaseClient::new(channels[i % channels.len()].clone());
            async move { c.lease_revoke(LeaseRevokeRequest { id }).await.is_err() }
        })
        .buffer_unordered(100)
        .filter(|failed| futures::future::ready(*failed))
        .count()
        .await;
    let revoke_secs = teardown.elapsed().as_secs_f64();
    let mut result = total.summarize(window.duration())?;
    result.client_cpu_us_per_op = cpu.map(|c| c * 1e6 / result.ops as f64);
    result.extra.push(("leases".into(), load.leases as f64));
    result.extra.push((
        "expected_keep_alives_per_sec".into(),
        load.leases as f64 / period.as_secs_f64(),
    ));
    result
        .extra
        .push(("revoke_errors".into(), revoke_errors as f64));
    // Setup and cleanup are not measured, but a slow one is worth seeing.
    result.extra.push(("grant_secs".into(), grant_secs));
    result.extra.push(("revoke_secs".into(), revoke_secs));
    // Server CPU over the window as a percentage of one core: the leader's, and all members'.
    let pct = |secs: f64| secs / window.duration().as_secs_f64() * 100.0;
    if let Some(Some(leader)) = server_secs.first() {
        result.extra.push(("server_cpu_pct".into(), pct(*leader)));
    }
    if server_secs.len() > 1 && server_secs.iter().all(Option::is_some) {
        let all: f64 = server_secs.iter().flatten().sum();
        result.extra.push(("all_members_cpu_pct".into(), pct(all)));
    }
    Ok(result)
}

/// One stream's leases: each renewed every `period`, the sends spread evenly over the
/// period; latency is send → response for the same lease id.
async fn stream_task(
    mut client: LeaseClient<Channel>,
    ids: Vec<i64>,
    period: Duration,
    window: Window,
    counter: Counter,
) -> Result<Tally> {
    let mut tally = Tally::new();
    if ids.is_empty() {
        return Ok(tally);
    }
    let (tx, rx) = futures::channel::mpsc::unbounded();
    // The first keep-alive goes out before the stream is awaited: etcd sends the response
    // headers only with the first response, so awaiting an idle stream would time out.
    let start = Instant::now();
    let mut sent_at: HashMap<i64, Instant> = HashMap::with_capacity(ids.len());
    sent_at.insert(ids[0], start);
    tx.unbounded_send(LeaseKeepAliveRequest { id: ids[0] })
        .map_err(|_| anyhow!("keep-alive stream closed"))?;
    let mut next = 1usize; // sends so far
    let mut responses = client
        .lease_keep_alive(rx)
        .await
        .context("opening a LeaseKeepAlive stream")?
        .into_inner();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_sec = ids.len() as f64 / period.as_secs_f64();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                if now >= window.close {
                    break;
                }
                // Everything due by now: sends are paced at `per_sec`, round-robin.
                let due = ((now - start).as_secs_f64() * per_sec) as usize + 1;
                while next < due {
                    let id = ids[next % ids.len()];
                    sent_at.insert(id, Instant::now());
                    tx.unbounded_send(LeaseKeepAliveRequest { id })
                        .map_err(|_| anyhow!("keep-alive stream closed"))?;
                    next += 1;
                }
            }
            resp = responses.next() => {
                let done = Instant::now();
                match resp {
                    Some(Ok(r)) if r.ttl > 0 => {
                        counter.add(1);
                        if window.contains(done) {
                            if let Some(sent) = sent_at.get(&r.id) {
                                tally.record(done - *sent);
                            }
                        }
                    }
                    Some(Ok(r)) => tally.error(&anyhow!("lease {:x} expired (TTL {})", r.id, r.ttl)),
                    Some(Err(status)) => {
                        tally.error(&anyhow::Error::new(status).context("LeaseKeepAlive"));
                        break;
                    }
                    None => {
                        tally.error(&anyhow!("the server closed a LeaseKeepAlive stream"));
                        break;
                    }
                }
            }
        }
    }
    Ok(tally)
}
