//! watch-latency: one writer puts one key after another (closed loop); one watcher, on its
//! own connection, watches their prefix. For every write: write-ack → event (how long after
//! the writer learns of its write the watcher does) and write-send → event (end to end).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use baton_proto::etcdserverpb::kv_client::KvClient;
use baton_proto::etcdserverpb::watch_client::WatchClient;
use baton_proto::etcdserverpb::watch_request::RequestUnion;
use baton_proto::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest};
use futures::StreamExt as _;

use crate::engine::{self, Counter, CpuWindow, Progress, RunResult, Tally, Window};
use crate::kv::random_value;

static RUN_ID: AtomicU64 = AtomicU64::new(0);

pub async fn run(
    endpoints: &[String],
    value_size: usize,
    warmup: Duration,
    duration: Duration,
    progress: bool,
) -> Result<RunResult> {
    let prefix = format!(
        "baton-bench/watch/{}-{}/",
        std::process::id(),
        RUN_ID.fetch_add(1, Ordering::Relaxed)
    );
    // Writer and watcher on different connections (to different members in a cluster when
    // there are several endpoints: the watcher on the last one).
    let writer_ch = engine::channel(&endpoints[0], engine::REQUEST_TIMEOUT).await?;
    let watch_ch = engine::channel(
        endpoints.last().expect("endpoints"),
        Duration::from_secs(24 * 3600),
    )
    .await?;
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut range_end = prefix.clone().into_bytes();
    *range_end.last_mut().expect("non-empty") += 1;
    tx.unbounded_send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: prefix.clone().into_bytes(),
            range_end,
            ..Default::default()
        })),
    })
    .map_err(|_| anyhow!("watch channel closed"))?;
    let mut events = WatchClient::new(watch_ch)
        .watch(rx)
        .await
        .context("opening the watch stream")?
        .into_inner();
    match events.next().await {
        Some(Ok(r)) if r.created => {}
        other => bail!("the watch was not created: {other:?}"),
    }
    // revision → when the watcher got it.
    let seen: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let watcher = {
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            let _keep_open = tx;
            while let Some(resp) = events.next().await {
                let now = Instant::now();
                let Ok(resp) = resp else { break };
                let mut seen = seen.lock().expect("not poisoned");
                for ev in resp.events {
                    if let Some(kv) = ev.kv {
                        seen.insert(kv.mod_revision, now);
                    }
                }
            }
        })
    };

    let window = Window::new(warmup, duration);
    let counter = Counter::default();
    let progress = Progress::start(
        "watch latency".into(),
        "writes",
        counter.clone(),
        warmup + duration,
        progress,
    );
    let cpu = CpuWindow::start(window, None);
    let mut kv = KvClient::new(writer_ch);
    let value = random_value(value_size, 2);
    // (revision, sent, acked) of writes acked inside the window.
    let mut writes = Vec::new();
    let mut tally = Tally::new();
    let mut seq = 0u64;
    loop {
        let sent = Instant::now();
        if sent >= window.close {
            break;
        }
        let put = kv
            .put(PutRequest {
                key: format!("{prefix}{seq}").into_bytes(),
                value: value.clone(),
                ..Default::default()
            })
            .await;
        seq += 1;
        let acked = Instant::now();
        match put {
            Ok(resp) => {
                counter.add(1);
                let rev = resp.into_inner().header.map_or(0, |h| h.revision);
                if window.contains(acked) {
                    writes.push((rev, sent, acked));
                }
            }
            Err(status) => {
                tally.error(&anyhow::Error::new(status).context("put"));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    progress.finish().await;
    let cpu = cpu.finish().await;
    // Late events: give the watcher a moment for the last writes.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let last = writes.last().map(|w| w.0);
        if last.is_none_or(|r| seen.lock().expect("not poisoned").contains_key(&r)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    watcher.abort();
    let seen = seen.lock().expect("not poisoned");
    let mut send_to_event = Tally::new();
    let mut missing = 0u64;
    for &(rev, sent, acked) in &writes {
        match seen.get(&rev) {
            Some(&got) => {
                tally.record(got.saturating_duration_since(acked));
                send_to_event.record(got - sent);
            }
            None => missing += 1,
        }
    }
    if missing > 0 {
        tally.errors += missing;
        tally
            .first_error
            .get_or_insert_with(|| format!("{missing} writes never reached the watcher"));
    }
    let mut result = tally.summarize(window.duration())?;
    result.client_cpu_us_per_op = cpu.map(|c| c * 1e6 / result.ops as f64);
    let ms = |q| send_to_event.hist.value_at_quantile(q) as f64 / 1000.0;
    result.extra.push(("send_to_event_p50_ms".into(), ms(0.5)));
    result.extra.push(("send_to_event_p99_ms".into(), ms(0.99)));
    result.extra.push(("writes".into(), writes.len() as f64));
    Ok(result)
}
