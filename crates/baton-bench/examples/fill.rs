//! A tiny load generator for the resource measurements (RSS per key, CPU per kept-alive lease),
//! speaking the etcd v3 API so it runs against Baton and etcd alike.
//!
//! - `fill keys --endpoint URL --count N`: writes keys `fill/00000000`..`N-1` once each with
//!   `--value-size`-byte values, `--concurrency` requests in flight over `--conns` connections,
//!   then exits. Read the server's VmRSS afterwards.
//! - `fill leases --endpoint URL --count N --ttl S --secs D`: grants N leases, then keeps every
//!   one alive for D seconds over `--streams` LeaseKeepAlive streams (one connection each),
//!   renewing each lease every TTL/3, spread evenly. Exits non-zero if any lease expired.
//!
//! Run with `cargo run --release -p baton-bench --example fill -- keys --endpoint ...`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use baton_proto::etcdserverpb::kv_client::KvClient;
use baton_proto::etcdserverpb::lease_client::LeaseClient;
use baton_proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest};
use clap::{Parser, Subcommand};
use futures::{SinkExt, StreamExt};
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write `count` distinct keys once each.
    Keys {
        #[arg(long)]
        endpoint: String,
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        #[arg(long, default_value_t = 256)]
        value_size: usize,
        #[arg(long, default_value_t = 256)]
        concurrency: u64,
        #[arg(long, default_value_t = 4)]
        conns: usize,
    },
    /// Grant `count` leases and keep them alive for `secs` seconds.
    Leases {
        #[arg(long)]
        endpoint: String,
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        #[arg(long, default_value_t = 10)]
        ttl: i64,
        #[arg(long, default_value_t = 60)]
        secs: u64,
        #[arg(long, default_value_t = 4)]
        streams: usize,
    },
}

async fn channels(endpoint: &str, n: usize) -> Result<Vec<Channel>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let ch = Endpoint::from_shared(endpoint.to_string())?
            .connect()
            .await
            .with_context(|| format!("connecting to {endpoint}"))?;
        out.push(ch);
    }
    Ok(out)
}

async fn keys(
    endpoint: &str,
    count: u64,
    value_size: usize,
    concurrency: u64,
    conns: usize,
) -> Result<()> {
    let chans = channels(endpoint, conns).await?;
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut kv = KvClient::new(chans[w as usize % chans.len()].clone());
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let value = vec![b'v'; value_size];
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, anyhow::Error>(());
                }
                let req = PutRequest {
                    key: format!("fill/{i:08}").into_bytes(),
                    value: value.clone(),
                    ..Default::default()
                };
                kv.put(req).await.context("put")?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "wrote {count} keys in {secs:.1} s ({:.0}/s)",
        count as f64 / secs
    );
    Ok(())
}

async fn leases(endpoint: &str, count: usize, ttl: i64, secs: u64, streams: usize) -> Result<()> {
    let chans = channels(endpoint, streams).await?;
    // Grant concurrently, a few hundred in flight.
    let start = Instant::now();
    let mut ids = Vec::with_capacity(count);
    let mut granting = futures::stream::iter(0..count)
        .map(|i| {
            let mut lc = LeaseClient::new(chans[i % chans.len()].clone());
            async move {
                let r = lc
                    .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                    .await?
                    .into_inner();
                Ok::<_, anyhow::Error>(r.id)
            }
        })
        .buffer_unordered(256);
    while let Some(id) = granting.next().await {
        ids.push(id?);
    }
    drop(granting);
    println!(
        "granted {count} leases in {:.1} s",
        start.elapsed().as_secs_f64()
    );

    let period = Duration::from_millis((ttl as u64 * 1000) / 3);
    let expired = Arc::new(AtomicU64::new(0));
    let acks = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (s, ch) in chans.into_iter().enumerate() {
        let mine: Vec<i64> = ids.iter().copied().skip(s).step_by(streams).collect();
        let (mut tx, rx) = futures::channel::mpsc::channel::<LeaseKeepAliveRequest>(1024);
        // The sender starts before the call: grpc-go (etcd) sends the response headers only
        // with the first response, so awaiting the call before sending anything deadlocks.
        tokio::spawn(async move {
            // Each lease once per period, evenly spread: one send every period / n.
            let gap = period / mine.len().max(1) as u32;
            let mut tick = tokio::time::interval(gap);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let deadline = Instant::now() + Duration::from_secs(secs);
            for &id in mine.iter().cycle() {
                tick.tick().await;
                if Instant::now() >= deadline {
                    break;
                }
                if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                    break;
                }
            }
            drop(tx);
        });
        let mut lc = LeaseClient::new(ch);
        let mut responses = lc.lease_keep_alive(rx).await?.into_inner();
        let expired = expired.clone();
        let acks = acks.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(r) = responses.next().await {
                let r = r?;
                acks.fetch_add(1, Ordering::Relaxed);
                if r.ttl <= 0 {
                    expired.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    let begin = Instant::now();
    let mut last = 0;
    while begin.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let a = acks.load(Ordering::Relaxed);
        println!(
            "{:>4.0} s: {:.0} keep-alives/s, {} expired",
            begin.elapsed().as_secs_f64(),
            (a - last) as f64 / 5.0,
            expired.load(Ordering::Relaxed)
        );
        last = a;
    }
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let e = expired.load(Ordering::Relaxed);
    if e > 0 {
        bail!("{e} keep-alives found their lease expired");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    match Args::parse().cmd {
        Cmd::Keys {
            endpoint,
            count,
            value_size,
            concurrency,
            conns,
        } => keys(&endpoint, count, value_size, concurrency, conns).await,
        Cmd::Leases {
            endpoint,
            count,
            ttl,
            secs,
            streams,
        } => leases(&endpoint, count, ttl, secs, streams).await,
    }
}
