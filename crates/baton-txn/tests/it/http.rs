//! The axum layer against a real PostgreSQL: an order endpoint whose handler commits its work
//! and its response together through the `Idempotency` extractor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{connect, count_effects, fresh_schema};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use baton_txn::http::{Idempotency, IdempotencyLayer, IDEMPOTENT_REPLAYED};
use baton_txn::pg::{IdempotencyConfig, IdempotencyStore, Schema};
use baton_txn::StoredResponse;
use tower::ServiceExt;

#[derive(Clone)]
struct App {
    schema: Schema,
    hold: Duration,
    fail_once: Arc<AtomicBool>,
}

async fn create_order(State(app): State<App>, idem: Idempotency, body: Bytes) -> Response<Body> {
    // The handler's own connection; the layer claims over another one.
    let mut conn = connect().await;
    let tx = match idem.begin(&mut conn).await {
        Ok(tx) => tx,
        Err(e) => return e.into_response(),
    };
    if app.fail_once.swap(false, Ordering::SeqCst) {
        drop(tx); // rolled back: nothing happened, and nothing is stored
        return (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response();
    }
    let sql = format!(
        "INSERT INTO {}.effects (tenant, key, body) VALUES ('t', $1, $2) RETURNING id",
        app.schema.name()
    );
    let body = String::from_utf8_lossy(&body).into_owned();
    let id: i64 = tx
        .query_one(&sql, &[&idem.key().unwrap_or(""), &body])
        .await
        .unwrap()
        .get(0);
    tokio::time::sleep(app.hold).await;
    let response = StoredResponse::json(201, format!("{{\"order\":{id}}}"))
        .header("location", format!("/orders/{id}"));
    idem.commit(tx, response)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn router(schema_name: &str, hold: Duration, wait: Option<Duration>) -> (Router, App) {
    let schema = fresh_schema(schema_name).await;
    let store = IdempotencyStore::new(&schema, IdempotencyConfig::default());
    let app = App {
        schema,
        hold,
        fail_once: Arc::new(AtomicBool::new(false)),
    };
    let mut layer = IdempotencyLayer::new(store, Arc::new(connect().await), |parts| {
        let tenant = parts.headers.get("x-tenant")?;
        Some(tenant.to_str().ok()?.to_string())
    })
    .required(true);
    if let Some(wait) = wait {
        layer = layer.wait(wait);
    }
    let router = Router::new()
        .route("/orders", post(create_order).get(async || "the list"))
        .layer(layer)
        .with_state(app.clone());
    (router, app)
}

fn post_order(key: Option<&str>, body: &str) -> Request<Body> {
    let mut req = Request::post("/orders").header("x-tenant", "t");
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.body(Body::from(body.to_string())).unwrap()
}

async fn send(router: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let response = router.clone().oneshot(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_the_stored_response_and_runs_the_handler_once() {
    let (router, app) = router("t_http_replay", Duration::ZERO, None).await;
    let (status, headers, body) = send(&router, post_order(Some("\"k-1\""), "qty=1")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(headers.get(&IDEMPOTENT_REPLAYED).is_none());
    let location = headers.get("location").unwrap().clone();
    // The bare form of the same key is the same key.
    let (status2, headers2, body2) = send(&router, post_order(Some("k-1"), "qty=1")).await;
    assert_eq!((status2, &body2), (StatusCode::CREATED, &body));
    assert_eq!(headers2.get("location"), Some(&location));
    assert_eq!(headers2.get("content-type").unwrap(), "application/json");
    assert_eq!(headers2.get(&IDEMPOTENT_REPLAYED).unwrap(), "true");
    assert_eq!(
        count_effects(&connect().await, &app.schema, "t", "k-1").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_missing_or_mismatched_keys_are_refused() {
    let (router, app) = router("t_http_refusals", Duration::ZERO, None).await;
    for bad in ["", "\"unterminated", &"x".repeat(256)] {
        let (status, headers, _) = send(&router, post_order(Some(bad), "qty=1")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(
            headers.get("content-type").unwrap(),
            "application/problem+json"
        );
    }
    assert_eq!(
        send(&router, post_order(None, "qty=1")).await.0,
        StatusCode::BAD_REQUEST,
        "required"
    );
    let no_tenant = Request::post("/orders")
        .header("idempotency-key", "k")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, no_tenant).await.0, StatusCode::UNAUTHORIZED);
    // Safe methods pass through, key or not.
    let get = Request::get("/orders")
        .header("idempotency-key", "k")
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = send(&router, get).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "the list"));

    assert_eq!(
        send(&router, post_order(Some("k"), "qty=1")).await.0,
        StatusCode::CREATED
    );
    let (status, _, body) = send(&router, post_order(Some("k"), "qty=2")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        count_effects(&connect().await, &app.schema, "t", "k").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_duplicate_gets_409_with_retry_after_then_the_replay() {
    let (router, app) = router("t_http_409", Duration::from_millis(1000), None).await;
    let first = {
        let router = router.clone();
        tokio::spawn(async move { send(&router, post_order(Some("k"), "qty=1")).await })
    };
    // Wait until the first request's claim is committed (its handler then holds for 1 s).
    let observer = connect().await;
    let claimed = format!(
        "SELECT 1 FROM {}.idempotency_keys WHERE key = 'k'",
        app.schema.name()
    );
    while observer.query_opt(&claimed, &[]).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, headers, _) = send(&router, post_order(Some("k"), "qty=1")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let retry_after: u64 = headers
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let (status1, _, body1) = first.await.unwrap();
    assert_eq!(status1, StatusCode::CREATED);
    let (status3, headers3, body3) = send(&router, post_order(Some("k"), "qty=1")).await;
    assert_eq!((status3, body3), (StatusCode::CREATED, body1));
    assert_eq!(headers3.get(&IDEMPOTENT_REPLAYED).unwrap(), "true");
    assert_eq!(
        count_effects(&connect().await, &app.schema, "t", "k").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_requests_with_waiting_get_one_response() {
    let (router, app) = router(
        "t_http_fifty",
        Duration::from_millis(300),
        Some(Duration::from_secs(30)),
    )
    .await;
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            send(&router, post_order(Some("k"), "qty=1")).await
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let firsts = results
        .iter()
        .filter(|(_, h, _)| h.get(&IDEMPOTENT_REPLAYED).is_none())
        .count();
    assert_eq!(firsts, 1);
    let body = &results[0].2;
    assert!(
        results
            .iter()
            .all(|(s, _, b)| *s == StatusCode::CREATED && b == body),
        "{results:?}"
    );
    assert_eq!(
        count_effects(&connect().await, &app.schema, "t", "k").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_rolls_back_stores_nothing_and_the_retry_runs() {
    let (router, app) = router("t_http_rollback", Duration::ZERO, None).await;
    app.fail_once.store(true, Ordering::SeqCst);
    let (status, _, _) = send(&router, post_order(Some("k"), "qty=1")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        count_effects(&connect().await, &app.schema, "t", "k").await,
        0
    );
    let (status, headers, _) = send(&router, post_order(Some("k"), "qty=1")).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "released at once, no lease to wait out"
    );
    assert!(headers.get(&IDEMPOTENT_REPLAYED).is_none());
    assert_eq!(
        count_effects(&connect().await, &app.schema, "t", "k").await,
        1
    );
}
