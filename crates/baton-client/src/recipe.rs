//! Building blocks of the client-side recipes (etcd's `concurrency` and `recipes`
//! packages, in Rust): conditional creation of one's own key, waiting for a key's deletion
//! without missing it, and cleaning up a waiter key when waiting is abandoned.

use std::future::Future;
use std::time::Duration;

use baton_proto::mvccpb::KeyValue;
use futures::StreamExt;

use crate::client::{Client, Retry};
use crate::error::{Error, Result};
use crate::kv::{txn_range, Compare, CompareOp, DeleteOptions, GetOptions, Op, PutOptions, Txn};
use crate::kv::{SortOrder, SortTarget};
use crate::session::Session;
use crate::util::backoff;
use crate::watch::{EventKind, WatchOptions};

/// Runs `fut`, failing with [`Error::SessionLost`] as soon as `session` is lost.
pub(crate) async fn guarded<T>(
    session: &Session,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    let lost = session.lost();
    tokio::select! {
        r = fut => r,
        reason = lost => Err(Error::SessionLost(reason)),
    }
}

/// Retries `f` on transient errors with jittered backoff (for steps that are safe to
/// repeat), at most `attempts` times.
pub(crate) async fn retry<T, F, Fut>(attempts: u32, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut n = 0;
    loop {
        match f().await {
            Err(e) if e.is_transient() && n + 1 < attempts => {
                n += 1;
                tokio::time::sleep(backoff(
                    n,
                    Duration::from_millis(50),
                    Duration::from_secs(1),
                ))
                .await;
            }
            r => return r,
        }
    }
}

/// The outcome of [`create_own_key`].
pub(crate) struct OwnKey {
    /// Whether this call created it (else it existed: the same session got there first).
    pub(crate) created: bool,
    /// Its create revision.
    pub(crate) rev: i64,
    /// The oldest key under `queue_prefix` (by create revision), when asked for.
    pub(crate) first: Option<KeyValue>,
}

/// etcd's `If create_revision(key) == 0 Then Put(key, nonce, lease) Else Get(key)`, plus a
/// read of the oldest key under `queue_prefix` in the same revision. Safe to repeat: a
/// retry finds the key the first attempt made, and recognizes it by the nonce.
pub(crate) async fn create_own_key(
    client: &Client,
    key: &[u8],
    lease: i64,
    queue_prefix: Option<&[u8]>,
) -> Result<OwnKey> {
    // A fresh value per call tells "this call created it" from "it was there" even when a
    // retry after a lost answer finds the key the first attempt made.
    let nonce = format!("{:016x}", rand::random::<u64>()).into_bytes();
    let value = nonce.as_slice();
    let first = queue_prefix.map(|p| {
        Op::get(
            p.to_vec(),
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1),
        )
    });
    let txn = Txn::new()
        .when([Compare::create_revision(key.to_vec(), CompareOp::Equal, 0)])
        .and_then(
            [Op::put(
                key.to_vec(),
                value.to_vec(),
                PutOptions::new().with_lease(lease),
            )]
            .into_iter()
            .chain(first.clone()),
        )
        .or_else(
            [Op::get(key.to_vec(), GetOptions::new())]
                .into_iter()
                .chain(first),
        );
    let resp = retry(5, || client.txn_with_retry(txn.clone(), Retry::Idempotent)).await?;
    let header_rev = resp.header.as_ref().map_or(0, |h| h.revision);
    let (created, rev) = if resp.succeeded {
        (true, header_rev)
    } else {
        let kv = txn_range(&resp, 0)
            .and_then(|r| r.kvs.first())
            .ok_or_else(|| Error::Server {
                code: tonic::Code::Internal,
                message: "own key vanished between compare and get".into(),
            })?;
        (kv.value == nonce, kv.create_revision)
    };
    let first = if queue_prefix.is_some() {
        txn_range(&resp, 1).and_then(|r| r.kvs.first().cloned())
    } else {
        None
    };
    Ok(OwnKey {
        created,
        rev,
        first,
    })
}

/// `If create_revision(key) == rev Then Delete(key)`; whether it deleted.
pub(crate) async fn delete_if_created(client: &Client, key: &[u8], rev: i64) -> Result<bool> {
    let txn = Txn::new()
        .when([Compare::create_revision(
            key.to_vec(),
            CompareOp::Equal,
            rev,
        )])
        .and_then([Op::delete(key.to_vec(), DeleteOptions::new())]);
    Ok(client
        .txn_with_retry(txn, Retry::Idempotent)
        .await?
        .succeeded)
}

/// The newest key under `prefix` created at or before `max_create_rev`, and the store
/// revision of the read.
pub(crate) async fn newest_before(
    client: &Client,
    prefix: &[u8],
    max_create_rev: i64,
) -> Result<(Option<KeyValue>, i64)> {
    let r = client
        .get(
            prefix.to_vec(),
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_max_create_revision(max_create_rev)
                .with_limit(1),
        )
        .await?;
    let rev = r.header.as_ref().map_or(0, |h| h.revision);
    Ok((r.kvs.into_iter().next(), rev))
}

/// Waits until `key` is deleted at a revision after `seen_at` (a revision at which it
/// existed). Never misses the deletion: the watch starts at `seen_at + 1`; if that history
/// is compacted, the key is read directly.
pub(crate) async fn wait_deleted(client: &Client, key: &[u8], seen_at: i64) -> Result<()> {
    let mut from = seen_at + 1;
    loop {
        let mut events = client.watch(key.to_vec(), WatchOptions::new().with_start_revision(from));
        loop {
            match events.next().await {
                Some(Ok(ev)) if ev.kind == EventKind::Delete => return Ok(()),
                Some(Ok(_)) => {}
                Some(Err(Error::Compacted(_))) | None => break,
                Some(Err(e)) => return Err(e),
            }
        }
        let r = client.get(key.to_vec(), GetOptions::new()).await?;
        if r.kvs.is_empty() {
            return Ok(());
        }
        from = r.header.map_or(from, |h| h.revision + 1);
    }
}

/// Waits for the first event of `kind` on `key` (or, with `prefix`, under it) from
/// revision `from` on.
pub(crate) async fn wait_event(
    client: &Client,
    key: &[u8],
    prefix: bool,
    from: i64,
    kind: EventKind,
) -> Result<crate::WatchEvent> {
    let mut opts = WatchOptions::new().with_start_revision(from);
    if prefix {
        opts = opts.with_prefix();
    }
    let mut events = client.watch(key.to_vec(), opts);
    loop {
        match events.next().await {
            Some(Ok(ev)) if ev.kind == kind => return Ok(ev),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e),
            None => {
                return Err(Error::Unavailable("watch ended".into()));
            }
        }
    }
}

/// A waiter key to delete if the acquisition that created it does not finish: on an
/// explicit [`Cleanup::run`], or in the background when dropped while armed (the caller's
/// future was cancelled).
pub(crate) struct Cleanup {
    client: Client,
    slot: std::sync::Mutex<Armed>,
}

/// The waiter key to delete and its create revision, while armed.
type Armed = Option<(Vec<u8>, i64)>;

impl Cleanup {
    pub(crate) fn new(client: &Client) -> Self {
        Cleanup {
            client: client.clone(),
            slot: std::sync::Mutex::new(None),
        }
    }
    /// Arms it for `key` created at `rev`.
    pub(crate) fn arm(&self, key: &[u8], rev: i64) {
        *self.slot.lock().expect("poisoned") = Some((key.to_vec(), rev));
    }
    /// Disarms it (the key now belongs to a guard).
    pub(crate) fn disarm(&self) {
        *self.slot.lock().expect("poisoned") = None;
    }
    /// Deletes the key now, if armed.
    pub(crate) async fn run(&self) {
        let armed = self.slot.lock().expect("poisoned").take();
        if let Some((key, rev)) = armed {
            if let Err(e) = delete_if_created(&self.client, &key, rev).await {
                tracing::warn!(error = %e, "could not delete an abandoned waiter key; it goes with its lease");
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let armed = self.slot.lock().expect("poisoned").take();
        if let Some((key, rev)) = armed {
            let client = self.client.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = delete_if_created(&client, &key, rev).await;
                });
            }
        }
    }
}
