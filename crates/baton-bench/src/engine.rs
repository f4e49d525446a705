//! The client engine shared by every workload: connections, the measurement window, the
//! latency tally, the progress line and the client's own CPU use.
//!
//! The hot path is the generated tonic clients of `baton-proto` on plain
//! `tonic::transport::Channel`s (one HTTP/2 connection each, many requests in flight on each),
//! the same for every server: nothing here knows whether it talks to Baton or etcd.

use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};

/// Per-request timeout. Generous, since a request never legitimately takes seconds here, but
/// finite, so a wedged server cannot keep the benchmark from ending.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest latency the histograms track (60 s in µs); larger values are clamped.
const MAX_LATENCY_US: u64 = 60_000_000;

/// `http://host:port` for an endpoint given as `host:port` or as a URL.
pub fn url(endpoint: &str) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    }
}

/// tonic's endpoint for `endpoint`, with this process's client TLS for an `https://` one
/// (`security`).
pub fn endpoint(endpoint: &str) -> Result<Endpoint> {
    let url = url(endpoint);
    let e = Endpoint::from_shared(url.clone()).with_context(|| format!("endpoint {endpoint}"))?;
    if url.starts_with("https://") {
        return e
            .tls_config(crate::security::tonic_config()?)
            .with_context(|| format!("TLS for {endpoint}"));
    }
    Ok(e)
}

/// One HTTP/2 connection to `endpoint`, whose requests time out after `timeout`.
pub async fn channel(endpoint: &str, timeout: Duration) -> Result<Channel> {
    self::endpoint(endpoint)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .tcp_nodelay(true)
        // Many requests in flight per connection: do not let HTTP/2 flow control or the
        // stream limit become the bottleneck of 10+ clients sharing one connection.
        .initial_connection_window_size(Some(8 << 20))
        .initial_stream_window_size(Some(1 << 20))
        .connect()
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

/// `n` connections spread round-robin over `endpoints` (connection `i` goes to endpoint
/// `i % endpoints.len()`), as etcd's benchmark spreads `--conns` over `--endpoints`.
pub async fn channels(endpoints: &[String], n: usize) -> Result<Vec<Channel>> {
    if endpoints.is_empty() {
        bail!("no endpoints");
    }
    futures::future::try_join_all(
        (0..n.max(1)).map(|i| channel(&endpoints[i % endpoints.len()], REQUEST_TIMEOUT)),
    )
    .await
}

/// The measurement window of one run: requests that *complete* inside
/// `[start + warmup, start + warmup + duration]` count.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: Instant,
    pub open: Instant,
    pub close: Instant,
}

impl Window {
    pub fn new(warmup: Duration, duration: Duration) -> Window {
        let start = Instant::now();
        Window {
            start,
            open: start + warmup,
            close: start + warmup + duration,
        }
    }

    pub fn contains(&self, t: Instant) -> bool {
        t >= self.open && t <= self.close
    }

    pub fn duration(&self) -> Duration {
        self.close - self.open
    }
}

/// What one task saw: one histogram per task, merged at the end, so the hot path takes no
/// locks.
pub struct Tally {
    pub hist: Histogram<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally::new()
    }
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
    pub fn record(&mut self, latency: Duration) {
        let us = latency.as_micros().clamp(1, MAX_LATENCY_US as u128) as u64;
        self.hist.saturating_record(us);
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
            seconds: duration.as_secs_f64(),
            ops_per_sec: ops as f64 / duration.as_secs_f64(),
            p50_ms: ms(hist.value_at_quantile(0.50)),
            p90_ms: ms(hist.value_at_quantile(0.90)),
            p99_ms: ms(hist.value_at_quantile(0.99)),
            max_ms: ms(hist.max()),
            mean_ms: hist.mean() / 1000.0,
            client_cpu_us_per_op: None,
            extra: Vec::new(),
        })
    }
}

/// What one run of one workload against one server measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Successful operations completed inside the measurement window.
    pub ops: u64,
    /// Failed operations (any time, warm-up included).
    pub errors: u64,
    pub first_error: Option<String>,
    /// Length of the measurement window.
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
    /// CPU time (user + system) this benchmark process used during the window, per
    /// operation, in µs: the client's own cost, which competes with the server on a small
    /// machine.
    pub client_cpu_us_per_op: Option<f64>,
    /// Workload-specific numbers (name, value), e.g. the watch workload's second latency.
    pub extra: Vec<(String, f64)>,
}

impl RunResult {
    pub fn extra(&self, name: &str) -> Option<f64> {
        self.extra.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// Operations completed so far (in or out of the window), for the progress line.
#[derive(Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A `\r`-updated progress line on stderr while a run goes, cleared when dropped. Silent
/// when disabled or when stderr is not a terminal.
pub struct Progress {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    pub fn start(
        label: String,
        unit: &'static str,
        counter: Counter,
        total: Duration,
        on: bool,
    ) -> Progress {
        let stop = Arc::new(AtomicBool::new(false));
        let task = (on && std::io::stderr().is_terminal()).then(|| {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let start = Instant::now();
                let (mut last_ops, mut last_t) = (0u64, start);
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    let now = Instant::now();
                    let ops = counter.get();
                    let rate = (ops - last_ops) as f64 / (now - last_t).as_secs_f64().max(1e-3);
                    (last_ops, last_t) = (ops, now);
                    let elapsed = (now - start).as_secs_f64();
                    let total = total.as_secs_f64().max(1e-3);
                    let width = 20usize;
                    let filled = ((elapsed / total).min(1.0) * width as f64) as usize;
                    let bar: String = "#".repeat(filled) + &".".repeat(width - filled);
                    let mut err = std::io::stderr().lock();
                    let _ = write!(
                        err,
                        "\r\x1b[2K{label} [{bar}] {elapsed:.1}/{total:.0} s  {ops} {unit}  {rate:.0} {unit}/s"
                    );
                    let _ = err.flush();
                }
                let _ = write!(std::io::stderr(), "\r\x1b[2K");
            })
        });
        Progress { stop, task }
    }

    pub async fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// CPU time (user + system) used so far by process `pid` (`None`: this process), from
/// `/proc/PID/stat`, in seconds.
pub fn process_cpu_secs(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    parse_stat_cpu_ticks(&stat).map(|ticks| ticks as f64 / clock_ticks_per_sec())
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` line, in clock ticks. The command
/// name (field 2) is in parentheses and may contain spaces, so fields are counted after
/// the last `)`.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': field 3 (state) is fields[0], so field N is fields[N - 3].
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// USER_HZ: 100 on every Linux this runs on (it is fixed by the kernel ABI).
fn clock_ticks_per_sec() -> f64 {
    100.0
}

/// `VmRSS` of process `pid` from `/proc/PID/status`, in bytes.
pub fn process_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

pub fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Samples this process's CPU time at the window's opening and closing, so the client's cost
/// per operation can be reported. Runs on its own task; `finish` returns the CPU seconds used
/// inside the window (or `None` if /proc is unreadable or the window never closed).
pub struct CpuWindow {
    task: tokio::task::JoinHandle<Option<f64>>,
}

impl CpuWindow {
    pub fn start(window: Window, pid: Option<u32>) -> CpuWindow {
        CpuWindow {
            task: tokio::spawn(async move {
                tokio::time::sleep_until(window.open.into()).await;
                let a = process_cpu_secs(pid)?;
                tokio::time::sleep_until(window.close.into()).await;
                let b = process_cpu_secs(pid)?;
                Some(b - a)
            }),
        }
    }

    pub async fn finish(self) -> Option<f64> {
        self.task.await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces() {
        let line = "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 4 0 \
                    1000 123456 789 18446744073709551615";
        assert_eq!(parse_stat_cpu_ticks(line), Some(325));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn vm_rss() {
        let status = "Name:\tetcd\nVmPeak:\t  100 kB\nVmRSS:\t   20480 kB\nThreads: 9\n";
        assert_eq!(parse_vm_rss(status), Some(20480 * 1024));
        assert_eq!(parse_vm_rss("Name: x\n"), None);
    }

    #[test]
    fn urls() {
        assert_eq!(url("127.0.0.1:2379"), "http://127.0.0.1:2379");
        assert_eq!(url("http://h:1"), "http://h:1");
    }

    #[test]
    fn tally_summarizes() {
        let mut t = Tally::new();
        for ms in 1..=100 {
            t.record(Duration::from_millis(ms));
        }
        t.error(&anyhow::anyhow!("boom"));
        let r = t.summarize(Duration::from_secs(2)).unwrap();
        assert_eq!(r.ops, 100);
        assert_eq!(r.errors, 1);
        assert_eq!(r.ops_per_sec, 50.0);
        assert!((r.p50_ms - 50.0).abs() < 0.1, "{}", r.p50_ms);
        assert!(Tally::new().summarize(Duration::from_secs(1)).is_err());
    }
}
