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

async fn not_found(body: axum::body::Body) -> axum::response::Response {
    read_unused_body(body).await;
    go_http_error(StatusCode::NOT_FOUND, "404 page not found")
}

/// `/health` and `/version` take GET only (etcd: 405 with `Allow: GET`).
async fn method_not_allowed(body: axum::body::Body) -> axum::response::Response {
    read_unused_body(body).await;
    let mut response = go_http_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    response
        .headers_mut()
        .insert("allow", http::HeaderValue::from_static("GET"));
    response
}

/// The most of a body an answer that does not use it reads first, and for how long.
const UNUSED_BODY_LIMIT: usize = 64 * 1024;
const UNUSED_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads what the client is still sending of a body the answer does not use (at most
/// [`UNUSED_BODY_LIMIT`] bytes, for at most [`UNUSED_BODY_TIMEOUT`]) before answering.
///
/// Why: over HTTP/2, an answer finished while the request's body is still arriving makes h2
/// reset the stream, and a client that has not sent its last frame yet (curl under load)
/// reports "Stream error in the HTTP/2 framing layer" instead of the 404 or 405 it was sent.
/// Go's server reads an unused HTTP/1 body (up to 256 KiB) for the same reason.
async fn read_unused_body(body: axum::body::Body) {
    use http_body_util::BodyExt as _;
    let read = async {
        let mut body = body;
        let mut seen = 0usize;
        while seen <= UNUSED_BODY_LIMIT {
            match body.frame().await {
                Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len()),
                _ => return,
            }
        }
    };
    let _ = tokio::time::timeout(UNUSED_BODY_TIMEOUT, read).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A body whose frames the test sends, and its end when the sender is dropped.
    fn streamed_body() -> (
        tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>,
        axum::body::Body,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        (tx, body)
    }

    #[tokio::test]
    async fn an_error_answer_waits_for_the_body_the_client_is_still_sending() {
        let (tx, body) = streamed_body();
        let answer = tokio::spawn(not_found(body));
        tx.send(Ok(bytes::Bytes::from_static(b"{"))).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!answer.is_finished(), "answered before the body ended");
        tx.send(Ok(bytes::Bytes::from_static(b"}"))).await.unwrap();
        drop(tx);
        let response = answer.await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn an_error_answer_reads_a_bounded_body_for_a_bounded_time() {
        // Past the limit it answers without the rest.
        let (tx, body) = streamed_body();
        let answer = tokio::spawn(method_not_allowed(body));
        let chunk = bytes::Bytes::from(vec![0u8; UNUSED_BODY_LIMIT / 4 + 1]);
        for _ in 0..4 {
            tx.send(Ok(chunk.clone())).await.unwrap();
        }
        let response = tokio::time::timeout(UNUSED_BODY_TIMEOUT / 2, answer)
            .await
            .expect("answered once the limit was read")
            .unwrap();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        // A client that stops sending gets its answer after the timeout.
        let (_silent, body) = streamed_body();
        let started = tokio::time::Instant::now();
        let response = not_found(body).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert!(started.elapsed() >= UNUSED_BODY_TIMEOUT);
    }
}
