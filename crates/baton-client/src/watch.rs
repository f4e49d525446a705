//! Watches that survive reconnects: a [`WatchStream`] of events that, when its stream
//! breaks (connection lost, member down), reconnects — to another endpoint if needed — and
//! resumes from the revision after the last event it delivered, so no event is lost or
//! repeated as long as that history has not been compacted.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use baton_proto::etcdserverpb as pb;
use baton_proto::etcdserverpb::watch_client::WatchClient;
use baton_proto::mvccpb::{self, KeyValue};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::Code;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::util::{backoff, prefix_end, AbortOnDrop};

/// Options of [`Client::watch`].
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    prefix: bool,
    range_end: Option<Vec<u8>>,
    start_revision: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
}

impl WatchOptions {
    /// One key, from now on.
    pub fn new() -> Self {
        Self::default()
    }
    /// Every key starting with the given key.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
    /// Keys in `[key, end)`.
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.range_end = Some(end.into());
        self
    }
    /// Deliver events from this revision on (inclusive; `0`: from now). Lets a caller that
    /// read state at revision `r` watch from `r + 1` without a gap.
    pub fn with_start_revision(mut self, rev: i64) -> Self {
        self.start_revision = rev;
        self
    }
    /// Include the previous key-value pair in each event.
    pub fn with_prev_kv(mut self) -> Self {
        self.prev_kv = true;
        self
    }
    /// Leave out put events.
    pub fn without_puts(mut self) -> Self {
        self.no_put = true;
        self
    }
    /// Leave out delete events.
    pub fn without_deletes(mut self) -> Self {
        self.no_delete = true;
        self
    }
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Created or updated.
    Put,
    /// Deleted (explicitly, or with its lease).
    Delete,
}

/// One change of one key.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change (for a delete: the key, with `mod_revision` = the revision
    /// of the deletion).
    pub kv: KeyValue,
    /// The key before the change, if asked for ([`WatchOptions::with_prev_kv`]).
    pub prev_kv: Option<KeyValue>,
}

impl WatchEvent {
    /// The store revision of this change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

/// A stream of [`WatchEvent`]s, resumed across reconnects. It ends with an error only when
/// resuming is impossible ([`Error::Compacted`], or the server refused the watch); while
/// no member is reachable it simply waits. Dropping it cancels the watch.
pub struct WatchStream {
    rx: mpsc::Receiver<Result<WatchEvent>>,
    _task: AbortOnDrop,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream").finish_non_exhaustive()
    }
}

impl Stream for WatchStream {
    type Item = Result<WatchEvent>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Client {
    /// Watches a key (or a range: see [`WatchOptions`]).
    ///
    /// ```
    /// # baton_client::testing::doctest(|endpoint| async move {
    /// use baton_client::{Client, ClientConfig, EventKind, PutOptions, WatchOptions};
    /// use futures::StreamExt;
    ///
    /// let client = Client::connect(ClientConfig::new([endpoint])).await?;
    /// let mut events = client.watch("jobs/", WatchOptions::new().with_prefix());
    /// # tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    /// client.put("jobs/1", "build", PutOptions::new()).await?;
    /// let ev = events.next().await.unwrap()?;
    /// assert_eq!((ev.kind, ev.kv.key.as_slice()), (EventKind::Put, &b"jobs/1"[..]));
    /// # Ok(()) });
    /// ```
    pub fn watch(&self, key: impl Into<Vec<u8>>, opts: WatchOptions) -> WatchStream {
        let key = key.into();
        let range_end = if opts.prefix {
            prefix_end(&key)
        } else {
            opts.range_end.clone().unwrap_or_default()
        };
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(run(self.clone(), key, range_end, opts, tx));
        WatchStream {
            rx,
            _task: AbortOnDrop(task),
        }
    }
}

/// Errors after which a watch cannot usefully be re-created.
fn permanent(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
            | Code::FailedPrecondition
    )
}

async fn run(
    client: Client,
    key: Vec<u8>,
    range_end: Vec<u8>,
    opts: WatchOptions,
    tx: mpsc::Sender<Result<WatchEvent>>,
) {
    let mut filters = Vec::new();
    if opts.no_put {
        filters.push(pb::watch_create_request::FilterType::Noput as i32);
    }
    if opts.no_delete {
        filters.push(pb::watch_create_request::FilterType::Nodelete as i32);
    }
    // The first revision not yet delivered (0: "from now", until the server says when).
    let mut next_rev = opts.start_revision;
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            let pause = backoff(failures, Duration::from_millis(50), Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = tx.closed() => return,
            }
        }
        failures += 1;
        let conn = tokio::select! {
            c = client.conn() => match c {
                Ok(c) => c,
                Err(_) => continue,
            },
            _ = tx.closed() => return,
        };
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: key.clone(),
                    range_end: range_end.clone(),
                    start_revision: next_rev,
                    prev_kv: opts.prev_kv,
                    filters: filters.clone(),
                    ..Default::default()
                },
            )),
        };
        let out = futures::stream::iter([create]).chain(futures::stream::pending());
        let mut rpc = WatchClient::new(conn.channel.clone());
        let opened = tokio::select! {
            r = rpc.watch(out) => r,
            _ = tx.closed() => return,
        };
        let mut stream = match opened {
            Ok(r) => r.into_inner(),
            Err(s) if permanent(s.code()) => {
                let _ = tx.send(Err(Error::from_status(s))).await;
                return;
            }
            Err(s) => {
                if crate::error::connection_failure(&s) {
                    client.invalidate(&conn);
                }
                continue;
            }
        };
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = tx.closed() => return,
            };
            let resp = match msg {
                Ok(Some(resp)) => resp,
                Ok(None) => break,
                Err(s) if permanent(s.code()) => {
                    let _ = tx.send(Err(Error::from_status(s))).await;
                    return;
                }
                Err(s) => {
                    tracing::debug!(status = %s, "watch stream broke; resuming");
                    if crate::error::connection_failure(&s) {
                        client.invalidate(&conn);
                    }
                    break;
                }
            };
            failures = 0;
            if resp.compact_revision > 0 {
                let _ = tx.send(Err(Error::Compacted(resp.compact_revision))).await;
                return;
            }
            if resp.canceled {
                let _ = tx
                    .send(Err(Error::Server {
                        code: Code::Cancelled,
                        message: format!("watch canceled by the server: {}", resp.cancel_reason),
                    }))
                    .await;
                return;
            }
            if resp.created && next_rev == 0 {
                next_rev = resp.header.as_ref().map_or(0, |h| h.revision) + 1;
            }
            for ev in resp.events {
                let Some(kv) = ev.kv else { continue };
                next_rev = next_rev.max(kv.mod_revision + 1);
                let kind = if ev.r#type == mvccpb::event::EventType::Delete as i32 {
                    EventKind::Delete
                } else {
                    EventKind::Put
                };
                let event = WatchEvent {
                    kind,
                    kv,
                    prev_kv: ev.prev_kv,
                };
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        }
    }
}
