//! Idempotency keys for HTTP services (feature `axum`): a tower layer plus a handler-side
//! extractor.
//!
//! ```text
//! request ──▶ IdempotencyLayer: read Idempotency-Key (400 if malformed, or missing when
//!             required), buffer the body, fingerprint method + path?query + body, claim
//!     ├── Replay   ──▶ the stored status, headers and body, plus `Idempotent-Replayed: true`
//!     ├── InFlight ──▶ 409 with Retry-After (or wait first, with `.wait(…)`)
//!     ├── Mismatch ──▶ 422
//!     └── Execute  ──▶ handler: let tx = idem.begin(&mut conn)  — BEGIN + lock the claim
//!                               …the work, in tx…
//!                               idem.commit(tx, StoredResponse::json(201, body))
//!                                 — stores the response in tx, COMMIT, returns it
//!                  ◀── if the handler returned without committing a response, the layer
//!                      releases the claim, so the retry runs the work again
//! ```
//!
//! **Why the handler stores the response, not the layer.** The response must commit in the
//! *same* transaction as the work (crate invariant 1); only the handler has that transaction.
//! A layer that stored whatever the handler returned would write it after the work
//! committed, and a crash in between would leave work done with no response to replay — the
//! retry would run it again. So the layer decides *whether* the handler runs, and the
//! handler's [`Idempotency::commit`] makes work and response durable in one step; the
//! response it returns is built from the same [`StoredResponse`] the replays use, so the
//! first answer and every replay are identical.
//!
//! Requests with safe methods (GET, HEAD, OPTIONS, TRACE) pass through untouched. Without a key,
//! a request passes through with an empty [`Idempotency`] (whose `begin`/`commit` are a plain
//! transaction), or gets a 400 if the layer was built `.required(true)`.
//!
//! Expiry policy (the IETF draft asks servers to publish it): keys are kept for the store's
//! `retention` (24 h by default) after their first request; a crashed request's key is in
//! flight for at most the store's `lease` (30 s by default).
//!
//! A request whose connection drops while the handler runs is dropped with it (hyper cancels
//! the future): the work transaction rolls back and the claim expires after its lease.

use std::convert::Infallible;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use axum::response::IntoResponse;
use tokio_postgres::{Client, Transaction};

use crate::pg::{Claim, Execution, IdempotencyStore};
use crate::{Error, Fingerprint, IdempotencyKey, StoredResponse};

/// The request header carrying the key.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set to `true` on replayed responses, so a client (or a test) can tell a replay from a first
/// execution.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Where the layer gets a database connection for claiming and releasing keys (single
/// statements, never the handler's transaction). A shared [`Client`] pipelines statements
/// from many requests over one connection and is enough for most services; wrap a pool to
/// spread them.
pub trait ClaimConnections: Clone + Send + Sync + 'static {
    /// A connection, returned to its source when dropped.
    type Conn: Deref<Target = Client> + Send;
    /// A connection, or the reason there is none (the request then gets a 503).
    fn get(&self) -> impl Future<Output = Result<Self::Conn, Error>> + Send;
}

impl ClaimConnections for Arc<Client> {
    type Conn = Arc<Client>;
    fn get(&self) -> impl Future<Output = Result<Self::Conn, Error>> + Send {
        std::future::ready(if self.is_closed() {
            Err(Error::Connection("the claim connection is closed".into()))
        } else {
            Ok(self.clone())
        })
    }
}

type TenantFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

#[derive(Clone)]
struct Config<C> {
    store: IdempotencyStore,
    conns: C,
    tenant: Arc<TenantFn>,
    required: bool,
    wait: Option<Duration>,
    max_body: usize,
}

/// The tower layer; see the module docs.
#[derive(Clone)]
pub struct IdempotencyLayer<C> {
    config: Arc<Config<C>>,
}

impl<C: ClaimConnections> IdempotencyLayer<C> {
    /// A layer storing keys in `store`, claiming over `conns`. `tenant` names the client a
    /// request comes from (from its authentication, say); keys are scoped by it, as the IETF
    /// draft asks, so one client can neither collide with nor read another's responses. A
    /// request it returns `None` for (no identity) is refused with 401.
    pub fn new(
        store: IdempotencyStore,
        conns: C,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                store,
                conns,
                tenant: Arc::new(tenant),
                required: false,
                wait: None,
                max_body: 1 << 20,
            }),
        }
    }

    /// Refuse unsafe requests without a key with 400 (the IETF draft's "required" mode).
    pub fn required(mut self, required: bool) -> Self {
        Arc::make_mut(&mut self.config).required = required;
        self
    }

    /// A duplicate of a request in flight waits up to `wait` for it and gets its response,
    /// instead of an immediate 409.
    pub fn wait(mut self, wait: Duration) -> Self {
        Arc::make_mut(&mut self.config).wait = Some(wait);
        self
    }

    /// The largest request body buffered for fingerprinting (1 MiB by default); larger is 413.
    pub fn max_body(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body = bytes;
        self
    }
}

impl<S, C: Clone> tower_layer::Layer<S> for IdempotencyLayer<C> {
    type Service = IdempotencyService<S, C>;
    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            config: self.config.clone(),
            inner,
        }
    }
}

/// The service made by [`IdempotencyLayer`].
#[derive(Clone)]
pub struct IdempotencyService<S, C> {
    config: Arc<Config<C>>,
    inner: S,
}

impl<S, C> tower_service::Service<Request<Body>> for IdempotencyService<S, C>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    C: ClaimConnections,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // The ready service is the one to call; a fresh clone stays behind for the next call.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        Box::pin(handle(self.config.clone(), ready, req))
    }
}

async fn handle<S, C>(
    config: Arc<Config<C>>,
    mut inner: S,
    mut req: Request<Body>,
) -> Result<Response<Body>, Infallible>
where
    S: tower_service::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    C: ClaimConnections,
{
    let safe = matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    let raw_key = req.headers().get(&IDEMPOTENCY_KEY).cloned();
    let raw_key = match raw_key {
        Some(raw) if !safe => raw,
        _ => {
            if !safe && config.required {
                return Ok(problem(
                    StatusCode::BAD_REQUEST,
                    "this request needs an Idempotency-Key header",
                ));
            }
            req.extensions_mut().insert(Idempotency(None));
            return inner.call(req).await;
        }
    };
    let key = match IdempotencyKey::parse_header(raw_key.as_bytes()) {
        Ok(key) => key,
        Err(e) => return Ok(problem(StatusCode::BAD_REQUEST, &e.to_string())),
    };
    let (mut parts, body) = req.into_parts();
    let Some(tenant) = (config.tenant)(&parts) else {
        return Ok(problem(
            StatusCode::UNAUTHORIZED,
            "idempotency keys are scoped per client, and this request names none",
        ));
    };
    let Ok(body) = axum::body::to_bytes(body, config.max_body).await else {
        let msg = format!(
            "the request body could not be read or is over {} bytes",
            config.max_body
        );
        return Ok(problem(StatusCode::PAYLOAD_TOO_LARGE, &msg));
    };
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let fp = Fingerprint::of_http(parts.method.as_str(), target, &body);

    let claim = match config.conns.get().await {
        Ok(conn) => match config.wait {
            None => config.store.claim(&conn, &tenant, &key, &fp).await,
            Some(wait) => {
                config
                    .store
                    .claim_wait(&conn, &tenant, &key, &fp, wait)
                    .await
            }
        },
        Err(e) => Err(e),
    };
    let exec = match claim {
        Ok(Claim::Execute(exec)) => exec,
        Ok(Claim::Replay(stored)) => {
            let mut response = to_response(&stored);
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            return Ok(response);
        }
        Ok(Claim::InFlight { retry_after }) => {
            let mut response = problem(
                StatusCode::CONFLICT,
                "a request with this Idempotency-Key is still being processed; retry later",
            );
            let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
            return Ok(response);
        }
        Ok(Claim::Mismatch) => {
            return Ok(problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "this Idempotency-Key was already used for a different request",
            ))
        }
        Err(e) => return Ok(problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
    };

    let slot = Arc::new(Slot {
        exec,
        committed: AtomicBool::new(false),
    });
    parts.extensions.insert(Idempotency(Some(slot.clone())));
    let response = inner
        .call(Request::from_parts(parts, Body::from(body)))
        .await?;
    if !slot.committed.load(Ordering::Acquire) {
        // The handler answered without committing a response (a validation error, a failure
        // that rolled back): nothing is stored, and the retry should run the work. If the
        // release itself fails, the claim's lease runs out instead.
        if let Ok(conn) = config.conns.get().await {
            let _ = slot.exec.release(&conn).await;
        }
    }
    Ok(response)
}

struct Slot {
    exec: Execution,
    committed: AtomicBool,
}

/// The handler's side of the layer (an axum extractor): opens the work transaction and
/// commits it together with the response. Present on every request that went through
/// [`IdempotencyLayer`]; for requests without a key it does plain transactions, so a handler
/// is written once for both.
#[derive(Clone)]
pub struct Idempotency(Option<Arc<Slot>>);

impl Idempotency {
    /// The request's key, if it had one.
    pub fn key(&self) -> Option<&str> {
        self.0.as_ref().map(|slot| slot.exec.key())
    }

    /// Opens the work transaction on `client` (the handler's own connection, not the
    /// layer's) and locks the key's claim in it; see [`Execution::begin`].
    pub async fn begin<'c>(&self, client: &'c mut Client) -> Result<Transaction<'c>, Error> {
        match &self.0 {
            Some(slot) => slot.exec.begin(client).await,
            None => Ok(client.transaction().await?),
        }
    }

    /// Stores `response` under the key in `tx`, commits `tx`, and returns the response to
    /// send — built from `response` exactly as replays will be.
    pub async fn commit(
        &self,
        tx: Transaction<'_>,
        response: StoredResponse,
    ) -> Result<Response<Body>, Error> {
        match &self.0 {
            Some(slot) => {
                slot.exec.commit(tx, &response).await?;
                slot.committed.store(true, Ordering::Release);
            }
            None => tx.commit().await?,
        }
        Ok(to_response(&response))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Idempotency {
    type Rejection = Response<Body>;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Idempotency>()
            .cloned()
            .ok_or_else(|| {
                problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the route has no IdempotencyLayer",
                )
            })
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> axum::response::Response {
        let status = match self {
            Error::ClaimLost => StatusCode::CONFLICT,
            Error::InvalidKey(_) => StatusCode::BAD_REQUEST,
            Error::Postgres(_) | Error::Connection(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        problem(status, &self.to_string())
    }
}

/// The HTTP response for a stored one; headers that are not valid HTTP are left out.
pub fn to_response(stored: &StoredResponse) -> Response<Body> {
    let mut response = Response::new(Body::from(stored.body.clone()));
    *response.status_mut() =
        StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in &stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// An RFC 9457 problem document.
fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    let mut escaped = String::with_capacity(detail.len());
    for c in detail.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            c if (c as u32) < 0x20 => escaped.push_str(&format!("\\u{:04x}", c as u32)),
            c => escaped.push(c),
        }
    }
    let body = format!(
        "{{\"status\":{},\"title\":\"{}\",\"detail\":\"{}\"}}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        escaped
    );
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}
