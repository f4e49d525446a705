//! HTTP endpoints beside the gRPC API: `/health` (etcd's JSON shape), `/metrics`
//! (Prometheus text) and `/version`, served on every client port and every
//! `--listen-metrics-urls` listener; the client port adds the JSON gateway's routes.
//! Answers are etcd 3.4's, bodies and statuses alike (a path nothing serves: Go's
//! `404 page not found`).

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{any, get};
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
        .route("/health", get(health).fallback(method_not_allowed))
        .route("/metrics", any(render_metrics))
        .route("/version", get(version).fallback(method_not_allowed))
        .fallback(not_found)
        .with_state(HttpState { shared, metrics });
    match extension {
        Some(extension) => routes.merge(extension),
        None => routes,
    }
}

/// Go's `http.Error`: the text and a newline, as plain text.
fn go_http_error(status: StatusCode, text: &str) -> axum::response::Response {
    (
        status,
        [
            ("content-type", "text/plain; charset=utf-8"),
            ("x-content-type-options", "nosniff"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

async fn not_found() -> axum::response::Response {
    go_http_error(StatusCode::NOT_FOUND, "404 page not found")
}

/// `/health` and `/version` take GET only (etcd: 405 with `Allow: GET`).
async fn method_not_allowed() -> axum::response::Response {
    let mut response = go_http_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    response
        .headers_mut()
        .insert("allow", http::HeaderValue::from_static("GET"));
    response
}

/// `/health?exclude=NOSPACE&exclude=…`: the alarms the caller does not count.
fn excluded_alarms(query: Option<&str>) -> Vec<&str> {
    query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| *key == "exclude")
        .map(|(_, alarm)| alarm)
        .collect()
}

/// How long `/health`'s linearizable read may take (etcd's QGET: 1 s).
const HEALTH_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// etcd 3.4's `/health`: `{"health":"true"}` when no alarm is raised (but those in
/// `?exclude=`), this member has a leader and a linearizable read goes through within a
/// second; else 503 with `{"health":"false"}` (as Go's `http.Error` writes it: plain text, a
/// newline).
async fn health(
    State(st): State<HttpState>,
    RawQuery(query): RawQuery,
) -> axum::response::Response {
    let exclude = excluded_alarms(query.as_deref());
    let alarmed = st.shared.node.read(|sm| {
        sm.alarms()
            .iter()
            .any(|(_, a)| !exclude.contains(&a.name()))
    });
    let healthy = !alarmed
        && st.shared.node.status().leader_id.is_some()
        && tokio::time::timeout(HEALTH_READ_TIMEOUT, st.shared.read_barrier())
            .await
            .is_ok_and(|r| r.is_ok());
    crate::monitor::health_checked(healthy);
    if healthy {
        (
            StatusCode::OK,
            [("content-type", "text/plain; charset=utf-8")],
            r#"{"health":"true"}"#,
        )
            .into_response()
    } else {
        go_http_error(StatusCode::SERVICE_UNAVAILABLE, r#"{"health":"false"}"#)
    }
}

/// Everything in Prometheus' text format (`monitor::render`).
async fn render_metrics(State(st): State<HttpState>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::monitor::render(&st.shared, &st.metrics).await,
    )
}

/// etcd's `/version` shape: the server's version and the cluster's (major.minor.0).
async fn version() -> impl IntoResponse {
    let cluster = crate::monitor::ETCD_CLUSTER_VERSION;
    (
        [("content-type", "application/json")],
        format!(r#"{{"etcdserver":"{ETCD_API_VERSION}","etcdcluster":"{cluster}.0"}}"#),
    )
}
