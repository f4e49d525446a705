//! The connection: endpoints with failover, per-call deadlines, request ids, and which
//! server (Baton or etcd) is on the other end.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_proto::baton::v1::{lock_client::LockClient, InspectRequest};
use tokio::time::Instant;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::auth::{authenticate, AuthChannel, TokenCell};
use tonic::Code;

use crate::config::{ClientConfig, ServerKind, TlsConfig};
use crate::error::{Error, Result};
use crate::util::{backoff, until};

/// A handle on a Baton (or etcd) cluster. Cheap to clone; clones share one connection.
///
/// **Failover.** The client keeps one HTTP/2 connection to one endpoint at a time. When
/// connecting fails, it tries the next endpoint in the list; when a call fails with
/// `Unavailable` (connection lost, no leader, leader changed) or its deadline passes, the
/// connection is dropped and the next call connects to the *next* endpoint. Reads are
/// retried there at once (they change nothing); writes are not, because one that failed
/// with `Unavailable` may still have been applied (see [`RequestId`]).
///
/// **Deadlines.** Every call that should answer promptly has a deadline
/// ([`ClientConfig::request_timeout`] unless given otherwise), enforced on the client and
/// sent as `grpc-timeout`, so a hung member costs a bounded wait instead of a hung caller.
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, GetOptions, PutOptions};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// client.put("greeting", "hello", PutOptions::new()).await?;
/// let got = client.get("greeting", GetOptions::new()).await?;
/// assert_eq!(got.kvs[0].value, b"hello");
/// # Ok(()) });
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoints", &self.inner.urls)
            .field("client_id", &format_args!("{:016x}", self.inner.client_id))
            .finish()
    }
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    /// Used for the `https://` endpoints.
    tls: ClientTlsConfig,
    /// Set: the server's certificate is checked by this instead of against roots
    /// ([`TlsConfig::insecure_skip_verify`]).
    verifier: Option<Arc<dyn rustls::client::danger::ServerCertVerifier>>,
    urls: Vec<String>,
    current: std::sync::Mutex<Option<Conn>>,
    connecting: tokio::sync::Mutex<()>,
    next: AtomicUsize,
    generation: AtomicU64,
    kind: AtomicU8,
    client_id: u64,
    sequence: AtomicU64,
}

/// One established connection.
#[derive(Clone)]
pub(crate) struct Conn {
    /// Carries the credentials' token (if any) on every request.
    pub(crate) channel: AuthChannel,
    /// The bare channel, for authenticating again.
    raw: Channel,
    token: TokenCell,
    index: usize,
    generation: u64,
}

/// How long a call may take.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Deadline {
    /// [`ClientConfig::request_timeout`].
    Default,
    /// This long.
    After(Duration),
    /// Unbounded: the call waits by design (lock acquisition without timeout).
    Never,
}

/// Whether a failed attempt may be repeated on another endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Reads and other calls whose repetition changes nothing.
    Idempotent,
    /// Writes: one attempt.
    Once,
}

/// Identifies one logical request: the client's random id and a per-client sequence number.
///
/// The client gives every plain write one id (the same across its attempts) and sends it as
/// the `baton-request-id` gRPC metadata entry (`<client id hex>-<sequence>`), which shows up
/// in server logs. Plain writes keep etcd's semantics: one that failed with
/// [`Error::Unavailable`] may or may not have been applied, so the client does not retry it.
/// Writes that must be retried safely go through [`crate::ExactlyOnce`], whose sessions and
/// sequence numbers the server de-duplicates in its replicated state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestId {
    /// Random per [`Client`], chosen at connect time.
    pub client_id: u64,
    /// Increases by one per request of that client.
    pub sequence: u64,
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}-{}", self.client_id, self.sequence)
    }
}

const KIND_UNKNOWN: u8 = 0;
const KIND_BATON: u8 = 1;
const KIND_ETCD: u8 = 2;

/// An endpoint as a URL: as given with a scheme, else `https://` with TLS configured and
/// `http://` without.
fn normalize(endpoint: &str, tls: bool) -> String {
    if endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        endpoint.to_string()
    } else if tls {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    }
}

/// The verifier that replaces roots with `--insecure-skip-tls-verify`.
fn skip_verifier(
    tls: Option<&TlsConfig>,
) -> Option<Arc<dyn rustls::client::danger::ServerCertVerifier>> {
    tls.filter(|t| t.insecure_skip_verify).map(|_| {
        Arc::new(baton_tls::AnyServerCertificate::new(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))) as Arc<dyn rustls::client::danger::ServerCertVerifier>
    })
}

/// tonic's TLS configuration for `tls` (the files read now, so a bad path fails `connect`).
fn tls_config(tls: Option<&TlsConfig>) -> Result<ClientTlsConfig> {
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| Error::Tls(format!("{what} {}: {e}", path.display())))
    };
    let mut config = ClientTlsConfig::new();
    let Some(tls) = tls else {
        return Ok(config.with_native_roots());
    };
    config = match &tls.ca_file {
        // tonic refuses roots beside a verifier of one's own.
        _ if tls.insecure_skip_verify => config,
        Some(ca) => config.ca_certificate(Certificate::from_pem(read("CA file", ca)?)),
        None => config.with_native_roots(),
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let identity = Identity::from_pem(read("certificate", cert)?, read("key", key)?);
            config = config.identity(identity);
        }
        (None, None) => {}
        _ => {
            return Err(Error::Config(
                "a client certificate needs both its certificate and its key file".into(),
            ))
        }
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

impl Client {
    /// Validates `config` and connects to the first endpoint that answers (so a wrong
    /// address fails here, not at the first call).
    pub async fn connect(config: ClientConfig) -> Result<Client> {
        if config.endpoints.is_empty() {
            return Err(Error::Config("no endpoints given".into()));
        }
        let tls = tls_config(config.tls.as_ref())?;
        let verifier = skip_verifier(config.tls.as_ref());
        if config.request_timeout.is_zero() || config.connect_timeout.is_zero() {
            return Err(Error::Config("timeouts must be positive".into()));
        }
        let urls = config
            .endpoints
            .iter()
            .map(|e| normalize(e, config.tls.is_some()))
            .collect();
        let client = Client {
            inner: Arc::new(Inner {
                config,
                tls,
                verifier,
                urls,
                current: std::sync::Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                next: AtomicUsize::new(0),
                generation: AtomicU64::new(0),
                kind: AtomicU8::new(KIND_UNKNOWN),
                client_id: rand::random(),
                sequence: AtomicU64::new(0),
            }),
        };
        client.conn().await?;
        Ok(client)
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The endpoint of the current connection, if connected.
    pub fn current_endpoint(&self) -> Option<String> {
        let cur = self.inner.current.lock().expect("poisoned");
        cur.as_ref().map(|c| self.inner.urls[c.index].clone())
    }

    /// A fresh [`RequestId`] (for callers composing their own requests).
    pub fn next_request_id(&self) -> RequestId {
        RequestId {
            client_id: self.inner.client_id,
            sequence: self.inner.sequence.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }

    /// Which server the recipes use: the configured [`ServerKind`], or (for
    /// [`ServerKind::Auto`]) the answer to one probe, remembered: an empty-name
    /// `baton.v1.Lock/Inspect`, which Baton refuses as invalid and etcd as unimplemented.
    pub async fn server_kind(&self) -> Result<ServerKind> {
        match self.inner.config.server_kind {
            ServerKind::Auto => {}
            k => return Ok(k),
        }
        match self.inner.kind.load(Ordering::Acquire) {
            KIND_BATON => return Ok(ServerKind::Baton),
            KIND_ETCD => return Ok(ServerKind::Etcd),
            _ => {}
        }
        let probe = self
            .call(
                "baton.v1.Lock/Inspect",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let req = request(InspectRequest { name: Vec::new() }, t);
                    async move { LockClient::new(ch).inspect(req).await }
                },
            )
            .await;
        let kind = match probe {
            Ok(_) => ServerKind::Baton,
            Err(Error::Unsupported(_)) => ServerKind::Etcd,
            Err(e) if e.is_transient() => return Err(e),
            Err(_) => ServerKind::Baton,
        };
        let code = if kind == ServerKind::Baton {
            KIND_BATON
        } else {
            KIND_ETCD
        };
        self.inner.kind.store(code, Ordering::Release);
        Ok(kind)
    }

    /// The current connection, connecting (with failover across endpoints) if there is
    /// none.
    pub(crate) async fn conn(&self) -> Result<Conn> {
        if let Some(c) = self.inner.current.lock().expect("poisoned").clone() {
            return Ok(c);
        }
        let _connecting = self.inner.connecting.lock().await;
        if let Some(c) = self.inner.current.lock().expect("poisoned").clone() {
            return Ok(c);
        }
        let n = self.inner.urls.len();
        let start = self.inner.next.load(Ordering::Acquire) % n;
        let timeout = self.inner.config.connect_timeout;
        let mut last_error = String::new();
        for i in 0..n {
            let index = (start + i) % n;
            let url = &self.inner.urls[index];
            let endpoint = match Endpoint::from_shared(url.clone()) {
                Ok(e) => e.connect_timeout(timeout).tcp_nodelay(true),
                Err(e) => {
                    last_error = format!("{url}: {e}");
                    continue;
                }
            };
            let endpoint = if url.starts_with("https://") {
                let configured = match &self.inner.verifier {
                    Some(v) => endpoint.tls_config_with_verifier(self.inner.tls.clone(), v.clone()),
                    None => endpoint.tls_config(self.inner.tls.clone()),
                };
                match configured {
                    Ok(e) => e,
                    Err(e) => {
                        last_error = format!("{url}: TLS: {e}");
                        continue;
                    }
                }
            } else {
                endpoint
            };
            match tokio::time::timeout(timeout, endpoint.connect()).await {
                Ok(Ok(raw)) => {
                    let token = TokenCell::default();
                    if let Some(creds) = &self.inner.config.credentials {
                        match authenticate(raw.clone(), creds).await {
                            Ok(t) => *token.write().expect("token lock") = t,
                            Err(status) => return Err(Error::from_status(status)),
                        }
                    } else if let Some(given) = &self.inner.config.token {
                        let value = http::HeaderValue::from_str(given.expose()).map_err(|_| {
                            Error::Config("the auth token is not a valid header value".into())
                        })?;
                        *token.write().expect("token lock") = Some(value);
                    }
                    let generation = self.inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
                    let conn = Conn {
                        channel: AuthChannel::new(raw.clone(), token.clone()),
                        raw,
                        token,
                        index,
                        generation,
                    };
                    self.inner.next.store(index, Ordering::Release);
                    *self.inner.current.lock().expect("poisoned") = Some(conn.clone());
                    tracing::debug!(endpoint = %url, "connected");
                    return Ok(conn);
                }
                Ok(Err(e)) => {
                    last_error = format!("{url}: {e}");
                    if let Some(why) = baton_tls::describe_tls_error(&e) {
                        last_error.push_str(&format!(" (TLS: {why})"));
                    } else if let Some(src) = std::error::Error::source(&e) {
                        last_error.push_str(&format!(" ({src})"));
                    }
                }
                Err(_) => last_error = format!("{url}: no connection within {timeout:?}"),
            }
            tracing::debug!(error = %last_error, "endpoint unreachable, trying the next");
        }
        Err(Error::Unreachable {
            endpoints: self.inner.urls.clone(),
            last_error,
        })
    }

    /// Forgets `conn` (if it is still the current one) so that the next call connects
    /// afresh, starting with the endpoint after it.
    pub(crate) fn invalidate(&self, conn: &Conn) {
        let mut cur = self.inner.current.lock().expect("poisoned");
        if cur.as_ref().map(|c| c.generation) == Some(conn.generation) {
            *cur = None;
            let n = self.inner.urls.len();
            self.inner
                .next
                .store((conn.index + 1) % n, Ordering::Release);
            tracing::debug!(endpoint = %self.inner.urls[conn.index], "dropping connection");
        }
    }

    /// One unary call with a deadline, failover and (for `Retry::Idempotent`) retries on
    /// other endpoints. `f` gets the channel and what is left of the deadline, and makes
    /// the request.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: &'static str,
        retry: Retry,
        deadline: Deadline,
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut(AuthChannel, Option<Duration>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let total = match deadline {
            Deadline::Default => Some(self.inner.config.request_timeout),
            Deadline::After(d) => Some(d),
            Deadline::Never => None,
        };
        let end = total.map(|d| Instant::now() + d);
        let exceeded = || Error::DeadlineExceeded {
            what,
            after: total.unwrap_or_default(),
        };
        // One more than the endpoints, so every member gets a chance after a failure.
        let attempts = self.inner.urls.len() as u32 + 1;
        let mut attempt = 0;
        let mut reauthenticated = false;
        loop {
            let conn = until(end, self.conn()).await.map_err(|_| exceeded())??;
            let left = end.map(|e| e.saturating_duration_since(Instant::now()));
            match until(end, f(conn.channel.clone(), left)).await {
                Err(()) => {
                    // No answer in time: the member or the path to it may be hung.
                    self.invalidate(&conn);
                    return Err(exceeded());
                }
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                // tonic's own enforcement of the grpc-timeout we set: same as ours.
                Ok(Err(status))
                    if status.code() == Code::Cancelled
                        && status.message() == "Timeout expired" =>
                {
                    self.invalidate(&conn);
                    return Err(exceeded());
                }
                Ok(Err(status))
                    if !reauthenticated
                        && crate::auth::token_refused(&status)
                        && self.inner.config.credentials.is_some() =>
                {
                    // etcd's clients do the same: a new token, then the call once more.
                    reauthenticated = true;
                    let creds = self.inner.config.credentials.as_ref().expect("checked");
                    let fresh = authenticate(conn.raw.clone(), creds)
                        .await
                        .map_err(Error::from_status)?;
                    *conn.token.write().expect("token lock") = fresh;
                    continue;
                }
                Ok(Err(status)) => {
                    let unavailable = crate::error::connection_failure(&status);
                    if unavailable {
                        self.invalidate(&conn);
                    }
                    attempt += 1;
                    if unavailable && retry == Retry::Idempotent && attempt < attempts {
                        let pause = backoff(
                            attempt,
                            Duration::from_millis(25),
                            Duration::from_millis(500),
                        );
                        if until(end, tokio::time::sleep(pause)).await.is_err() {
                            return Err(exceeded());
                        }
                        continue;
                    }
                    return Err(Error::from_status(status));
                }
            }
        }
    }
}

/// A request carrying `timeout` as `grpc-timeout`.
pub(crate) fn request<T>(msg: T, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    r
}

/// A write request: like [`request`], plus the `baton-request-id` metadata.
pub(crate) fn write_request<T>(
    msg: T,
    timeout: Option<Duration>,
    id: RequestId,
) -> tonic::Request<T> {
    let mut r = request(msg, timeout);
    if let Ok(v) = id.to_string().parse() {
        r.metadata_mut().insert("baton-request-id", v);
    }
    r
}
