//! Monitoring: the Prometheus recorder, etcd's metric families beside Baton's own, and what
//! `/metrics` renders.
//!
//! Where the numbers come from (`docs/metrics.md` maps every family to what Baton measures):
//! - counted where they happen, through the `metrics` crate's handles: the gRPC layer
//!   (`metrics_layer`, with `grpc`'s table), the Raft log's fsyncs and snapshot writes,
//!   peer traffic, the lock engine, watch streams;
//! - counted as data and read at scrape time (`refresh`): what only applying the log knows
//!   comes out of baton-core as `Applied::ops` and the responses, added up by baton-raft
//!   (`Node::metrics`); the replica's own events (leader changes, failed proposals) are
//!   atomics there; state (leader, indexes, sizes, queues) is read from the replica, the
//!   applied state and the watch hub;
//! - the process (`process_*`) from `metrics-process`, collected at scrape time.
//!
//! Nothing here writes the exposition format: `metrics-exporter-prometheus` renders it.

pub(crate) mod catalog;
mod counts;
pub(crate) mod grpc;
mod refresh;

use std::sync::OnceLock;

use metrics_exporter_prometheus::{BuildError, PrometheusHandle};

use crate::Shared;

pub(crate) use counts::{range_served, WatchStream};
pub use refresh::{ETCD_CLUSTER_VERSION, ETCD_SERVER_VERSION};

/// The process metrics' collector (made on first use: it describes its families then).
fn process() -> &'static metrics_process::Collector {
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    PROCESS.get_or_init(|| {
        let c = metrics_process::Collector::default();
        c.describe();
        c
    })
}

/// Installs the process-wide Prometheus recorder with every family's buckets and HELP, and
/// registers the gRPC series. The caller runs the handle's upkeep (`run_upkeep`).
pub fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let handle = catalog::builder()?.install_recorder()?;
    catalog::describe();
    grpc::meters();
    process();
    metrics::counter!("etcd_server_health_success").increment(0);
    metrics::counter!("etcd_server_health_failures").increment(0);
    Ok(handle)
}

/// How often a scrape yields before it reads anything (see [`render`]).
const SETTLE_YIELDS: usize = 3;

/// Refreshes what is read at scrape time, then renders everything in Prometheus' text
/// format.
///
/// It first yields a few times: tokio runs the tasks already woken (and polls its I/O
/// driver) before a yielded task runs again, so a connection its client closed just before
/// the scrape — `etcdctl watch` killed, then `curl /metrics`, as etcd's e2e test does — is
/// torn down and its stream counted as `Canceled` first (the connection's task reads the
/// EOF, the stream's task drops the response). Without it, on a busy runtime (one worker by
/// default on two cores) the scrape could be served first and miss it, where etcd's handler
/// has returned long before.
pub async fn render(shared: &Shared, handle: &PrometheusHandle) -> String {
    for _ in 0..SETTLE_YIELDS {
        tokio::task::yield_now().await;
    }
    refresh::refresh(shared).await;
    process().collect();
    handle.render()
}

/// Counts `/health` answers (`etcd_server_health_success` / `_failures`).
pub fn health_checked(healthy: bool) {
    if healthy {
        metrics::counter!("etcd_server_health_success").increment(1);
    } else {
        metrics::counter!("etcd_server_health_failures").increment(1);
    }
}
