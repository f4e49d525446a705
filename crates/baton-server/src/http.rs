//! HTTP endpoints beside the gRPC API: `/health` (etcd's JSON shape), `/metrics`
//! (Prometheus text) and `/version`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::maintenance::ETCD_API_VERSION;
use crate::Shared;

#[derive(Clone)]
struct HttpState {
    shared: Shared,
    metrics: PrometheusHandle,
}

/// The HTTP routes, with [`ServerConfig::http_extension`](crate::ServerConfig)'s merged in.
pub fn router(shared: Shared, metrics: PrometheusHandle) -> Router {
    let extension = shared.config.http_extension.clone();
    let routes = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(render_metrics))
        .route("/version", get(version))
        .with_state(HttpState { shared, metrics });
    match extension {
        Some(extension) => routes.merge(extension),
        None => routes,
    }
}

/// Healthy when no alarm is raised, this member has a leader and a linearizable read goes
/// through, as etcd's `/health` (which does a quorum read) reports; a raised alarm answers
/// as etcd 3.5 does (`"reason":"ALARM NOSPACE"`, 503).
async fn health(State(st): State<HttpState>) -> impl IntoResponse {
    let alarm = st
        .shared
        .node
        .read(|sm| sm.alarms().first().map(|(_, a)| a.name()));
    if let Some(name) = alarm {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(r#"{{"health":"false","reason":"ALARM {name}"}}"#),
        );
    }
    let ok = st.shared.node.status().leader_id.is_some()
        && tokio::time::timeout(std::time::Duration::from_secs(2), st.shared.read_barrier())
            .await
            .map(|r| r.is_ok())
            .unwrap_or(false);
    crate::monitor::health_checked(ok);
    if ok {
        (
            StatusCode::OK,
            r#"{"health":"true","reason":""}"#.to_string(),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"health":"false","reason":"no leader or quorum read failed"}"#.to_string(),
        )
    }
}

/// Everything in Prometheus' text format (`monitor::render`).
async fn render_metrics(State(st): State<HttpState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::monitor::render(&st.shared, &st.metrics).await,
    )
}

async fn version() -> impl IntoResponse {
    (
        [("content-type", "application/json")],
        format!(
            r#"{{"etcdserver":"{ETCD_API_VERSION}","etcdcluster":"3.5.0","baton":"{}"}}"#,
            env!("CARGO_PKG_VERSION")
        ),
    )
}
