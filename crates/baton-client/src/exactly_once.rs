//! Exactly-once writes over `baton.v1.ExactlyOnce`: a write whose outcome is unknown (the
//! connection broke, the leader died, the deadline passed) is retried with the same sequence
//! number, through any member, until an answer comes; the server applies each sequence at
//! most once and answers a retry with the first answer.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use baton_proto::baton::v1 as pb;
use baton_proto::baton::v1::exactly_once_client::ExactlyOnceClient;
use tokio::time::Instant;

use crate::client::{request, Client, Deadline, Retry};
use crate::config::ServerKind;
use crate::error::{Error, Result};
use crate::kv::{DeleteOptions, DeleteRangeResponse, PutOptions, PutResponse, Txn, TxnResponse};
use crate::util::backoff;

/// How long a write keeps being retried after transient errors by default: long enough to
/// ride out a leader election and a member restart.
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(30);

/// The answer to an exactly-once write.
#[derive(Debug, Clone, PartialEq)]
pub struct Once<T> {
    /// The server's answer to the first (and only) application of the write.
    pub response: T,
    /// True when an earlier attempt had already been applied and this answer came from the
    /// server's cache (the retry changed nothing).
    pub replayed: bool,
}

/// A de-duplication session: writes through it take effect at most once even when retried,
/// so with its retries they take effect exactly once (Baton only; etcd has no equivalent).
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, PutOptions};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let writer = client.exactly_once().await?;
/// let put = writer.put("orders/42", "paid", PutOptions::new()).await?;
/// assert!(!put.replayed);
/// # Ok(()) });
/// ```
#[derive(Debug)]
pub struct ExactlyOnce {
    client: Client,
    client_id: u64,
    next_sequence: AtomicU64,
    /// Sequences sent and not answered yet: the smallest bounds what may be acknowledged.
    outstanding: Mutex<BTreeSet<u64>>,
    retry_for: Duration,
}

impl Client {
    /// Opens a de-duplication session (idle timeout: the server's default, 10 minutes).
    /// [`Error::Unsupported`] on etcd, which has nothing like it.
    pub async fn exactly_once(&self) -> Result<ExactlyOnce> {
        self.exactly_once_with(Duration::ZERO, DEFAULT_RETRY_FOR)
            .await
    }

    /// Opens a de-duplication session that the server forgets after `idle_timeout` without
    /// requests (zero: the server's default), retrying each write for up to `retry_for`.
    pub async fn exactly_once_with(
        &self,
        idle_timeout: Duration,
        retry_for: Duration,
    ) -> Result<ExactlyOnce> {
        if self.server_kind().await? == ServerKind::Etcd {
            return Err(Error::Unsupported(
                "exactly-once writes (baton.v1.ExactlyOnce)",
            ));
        }
        let timeout_ms = idle_timeout.as_millis() as u64;
        // Opening twice only leaves an unused session behind, which expires.
        let resp = self
            .call(
                "ExactlyOnce/OpenSession",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = request(pb::OpenSessionRequest { timeout_ms }, t);
                    async move { ExactlyOnceClient::new(ch).open_session(r).await }
                },
            )
            .await?;
        Ok(ExactlyOnce {
            client: self.clone(),
            client_id: resp.client_id,
            next_sequence: AtomicU64::new(1),
            outstanding: Mutex::new(BTreeSet::new()),
            retry_for,
        })
    }
}

/// Removes a sequence from the outstanding set when its write ends, however it ends.
struct Outstanding<'a> {
    set: &'a Mutex<BTreeSet<u64>>,
    sequence: u64,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.set.lock().expect("poisoned").remove(&self.sequence);
    }
}

impl ExactlyOnce {
    /// The session id the server assigned.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// Writes a key exactly once.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        opts: PutOptions,
    ) -> Result<Once<PutResponse>> {
        let req = opts.into_request(key.into(), value.into());
        self.send("ExactlyOnce/Put", |id, acknowledged_below, ch, t| {
            let r = request(
                pb::ExactlyOncePutRequest {
                    id: Some(id),
                    acknowledged_below,
                    request: Some(req.clone()),
                },
                t,
            );
            async move {
                let resp = ExactlyOnceClient::new(ch).put(r).await?;
                Ok(resp.map(|r| (r.response.unwrap_or_default(), r.replayed)))
            }
        })
        .await
    }

    /// Deletes a key (or range) exactly once.
    pub async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
        opts: DeleteOptions,
    ) -> Result<Once<DeleteRangeResponse>> {
        let req = opts.into_request(key.into());
        self.send(
            "ExactlyOnce/DeleteRange",
            |id, acknowledged_below, ch, t| {
                let r = request(
                    pb::ExactlyOnceDeleteRangeRequest {
                        id: Some(id),
                        acknowledged_below,
                        request: Some(req.clone()),
                    },
                    t,
                );
                async move {
                    let resp = ExactlyOnceClient::new(ch).delete_range(r).await?;
                    Ok(resp.map(|r| (r.response.unwrap_or_default(), r.replayed)))
                }
            },
        )
        .await
    }

    /// Runs a transaction exactly once (its compares are evaluated once, at the first
    /// application; a retry gets that outcome back).
    pub async fn txn(&self, txn: Txn) -> Result<Once<TxnResponse>> {
        let req = txn.into_request();
        self.send("ExactlyOnce/Txn", |id, acknowledged_below, ch, t| {
            let r = request(
                pb::ExactlyOnceTxnRequest {
                    id: Some(id),
                    acknowledged_below,
                    request: Some(req.clone()),
                },
                t,
            );
            async move {
                let resp = ExactlyOnceClient::new(ch).txn(r).await?;
                Ok(resp.map(|r| (r.response.unwrap_or_default(), r.replayed)))
            }
        })
        .await
    }

    /// Ends the session on the server (its cached answers are dropped).
    pub async fn close(self) -> Result<()> {
        let client_id = self.client_id;
        self.client
            .call(
                "ExactlyOnce/CloseSession",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = request(pb::CloseSessionRequest { client_id }, t);
                    async move { ExactlyOnceClient::new(ch).close_session(r).await }
                },
            )
            .await
            .map(|_| ())
    }

    /// One write: a new sequence number, then attempts with that same number until an
    /// answer, a definite error, or `retry_for` has passed (each attempt is a single call
    /// with the client's deadline; a failed connection moves the next attempt to the next
    /// endpoint).
    async fn send<T, F, Fut>(&self, what: &'static str, mut f: F) -> Result<Once<T>>
    where
        F: FnMut(pb::RequestId, u64, crate::auth::AuthChannel, Option<Duration>) -> Fut,
        Fut: std::future::Future<
            Output = std::result::Result<tonic::Response<(T, bool)>, tonic::Status>,
        >,
    {
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        self.outstanding.lock().expect("poisoned").insert(sequence);
        let _guard = Outstanding {
            set: &self.outstanding,
            sequence,
        };
        let id = pb::RequestId {
            client_id: self.client_id,
            sequence,
        };
        let give_up = Instant::now() + self.retry_for;
        let mut attempt = 0;
        loop {
            // Every answer below the oldest write still in flight has been received.
            let acknowledged_below = self
                .outstanding
                .lock()
                .expect("poisoned")
                .first()
                .copied()
                .unwrap_or(sequence);
            let result = self
                .client
                .call(what, Retry::Once, Deadline::Default, |ch, t| {
                    f(id, acknowledged_below, ch, t)
                })
                .await;
            match result {
                Ok((response, replayed)) => return Ok(Once { response, replayed }),
                Err(e) if e.is_transient() && Instant::now() < give_up => {
                    attempt += 1;
                    tracing::debug!(error = %e, sequence, attempt, "write outcome unknown, retrying");
                    let pause = backoff(attempt, Duration::from_millis(50), Duration::from_secs(1));
                    tokio::time::sleep(
                        pause.min(give_up.saturating_duration_since(Instant::now())),
                    )
                    .await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
