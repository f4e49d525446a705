//! failover: a writer that keeps writing and records when each write was sent and when it
//! succeeded, so the gap around a leader kill can be measured.
//!
//! It is open-loop: a new Put every [`INTERVAL`], round-robin over all endpoints, each with
//! a short timeout, so a request stuck on a dead or leaderless member does not hold up the
//! next ones. "Kill → next successful write" is then: the earliest completion among writes
//! *sent* after the kill that succeeded (a write sent before the kill may have committed
//! before it and says nothing about the new leader).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use baton_proto::etcdserverpb::kv_client::KvClient;
use baton_proto::etcdserverpb::PutRequest;
use tokio::sync::Semaphore;
use tonic::transport::Channel;

use crate::engine::{self, Counter, Progress, RunResult, Tally, Window};

/// Time between two writes.
pub const INTERVAL: Duration = Duration::from_millis(5);
/// Per-write timeout.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Writes in flight at most (a stalled cluster must not pile up thousands).
const MAX_IN_FLIGHT: usize = 500;

/// One write: when it was sent, when it completed, whether it succeeded.
#[derive(Clone, Copy, Debug)]
pub struct Write {
    pub sent: Instant,
    pub done: Instant,
    pub ok: bool,
}

pub struct Writer {
    log: Arc<Mutex<Vec<Write>>>,
    task: tokio::task::JoinHandle<()>,
    pub counter: Counter,
}

impl Writer {
    /// Starts writing to `endpoints` (lazily connected: a member may be down).
    pub fn start(endpoints: &[String]) -> Result<Writer> {
        let channels: Vec<Channel> = endpoints
            .iter()
            .map(|e| {
                Ok(engine::endpoint(e)?
                    .connect_timeout(Duration::from_millis(500))
                    .timeout(TIMEOUT)
                    .tcp_nodelay(true)
                    .connect_lazy())
            })
            .collect::<Result<_>>()?;
        let log: Arc<Mutex<Vec<Write>>> = Arc::default();
        let counter = Counter::default();
        let task = {
            let log = Arc::clone(&log);
            let counter = counter.clone();
            tokio::spawn(async move {
                let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
                let mut tick = tokio::time::interval(INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                for seq in 0u64.. {
                    tick.tick().await;
                    let Ok(permit) = Arc::clone(&limit).acquire_owned().await else {
                        return;
                    };
                    let mut kv = KvClient::new(channels[seq as usize % channels.len()].clone());
                    let log = Arc::clone(&log);
                    let counter = counter.clone();
                    tokio::spawn(async move {
                        let sent = Instant::now();
                        let put = tokio::time::timeout(
                            TIMEOUT,
                            kv.put(PutRequest {
                                key: format!("baton-bench/failover/{}", seq % 1000).into_bytes(),
                                value: seq.to_le_bytes().to_vec(),
                                ..Default::default()
                            }),
                        )
                        .await;
                        let ok = matches!(put, Ok(Ok(_)));
                        if ok {
                            counter.add(1);
                        }
                        log.lock().expect("not poisoned").push(Write {
                            sent,
                            done: Instant::now(),
                            ok,
                        });
                        drop(permit);
                    });
                }
            })
        };
        Ok(Writer { log, task, counter })
    }

    /// The completion time of the first successful write sent at or after `t`, if any yet.
    pub fn first_success_sent_after(&self, t: Instant) -> Option<Instant> {
        first_success_sent_after(&self.log.lock().expect("not poisoned"), t)
    }

    /// Successful writes sent at or after `t` so far.
    pub fn successes_sent_after(&self, t: Instant) -> usize {
        let log = self.log.lock().expect("not poisoned");
        log.iter().filter(|w| w.ok && w.sent >= t).count()
    }

    pub fn stop(self) -> Vec<Write> {
        self.task.abort();
        let log = self.log.lock().expect("not poisoned");
        log.clone()
    }
}

pub fn first_success_sent_after(log: &[Write], t: Instant) -> Option<Instant> {
    log.iter()
        .filter(|w| w.ok && w.sent >= t)
        .map(|w| w.done)
        .min()
}

/// The longest time between two consecutive successful completions inside `[from, to]`.
pub fn max_gap(log: &[Write], from: Instant, to: Instant) -> Duration {
    let mut done: Vec<Instant> = log
        .iter()
        .filter(|w| w.ok && w.done >= from && w.done <= to)
        .map(|w| w.done)
        .collect();
    done.sort();
    let mut points = vec![from];
    points.extend(done);
    points.push(to);
    points
        .windows(2)
        .map(|p| p[1] - p[0])
        .max()
        .unwrap_or_default()
}

/// `baton bench failover`: writes for the duration and reports the longest gap between
/// successful writes (kill the leader meanwhile to see a failover).
pub async fn run(
    endpoints: &[String],
    warmup: Duration,
    duration: Duration,
    progress: bool,
) -> Result<RunResult> {
    let window = Window::new(warmup, duration);
    let writer = Writer::start(endpoints)?;
    let progress = Progress::start(
        "failover writer".into(),
        "writes",
        writer.counter.clone(),
        warmup + duration,
        progress,
    );
    tokio::time::sleep_until(window.close.into()).await;
    progress.finish().await;
    let log = writer.stop();
    let mut tally = Tally::new();
    for w in &log {
        if w.ok && window.contains(w.done) {
            tally.record(w.done - w.sent);
        } else if !w.ok {
            tally.error(&anyhow::anyhow!("a write failed or timed out"));
        }
    }
    let gap = max_gap(&log, window.open, window.close);
    let mut result = tally.summarize(window.duration())?;
    result
        .extra
        .push(("max_gap_ms".into(), gap.as_secs_f64() * 1000.0));
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_and_first_success() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let w = |sent, done, ok| Write {
            sent: ms(sent),
            done: ms(done),
            ok,
        };
        let log = vec![
            w(0, 10, true),
            w(20, 30, true),
            w(40, 2040, false),
            // sent before the kill at 50, done after: does not count
            w(45, 900, true),
            w(60, 700, true),
            w(70, 650, true),
        ];
        assert_eq!(first_success_sent_after(&log, ms(50)), Some(ms(650)));
        assert_eq!(first_success_sent_after(&log, ms(71)), None);
        assert_eq!(max_gap(&log, ms(0), ms(1000)), Duration::from_millis(620));
        assert_eq!(max_gap(&[], ms(0), ms(5)), Duration::from_millis(5));
    }
}
