//! A FIFO queue over KV (etcd's `recipes.Queue`).

use crate::client::{Client, Retry};
use crate::error::Result;
use crate::kv::{Compare, CompareOp, DeleteOptions, GetOptions, Op, PutOptions, Txn};
use crate::kv::{SortOrder, SortTarget};
use crate::recipe::{retry, wait_event};
use crate::util::join;
use crate::watch::EventKind;

/// A FIFO queue named `name`: each item is a key `name/<unique>`, ordered by create
/// revision; a consumer claims the oldest with a compare-and-delete on its mod revision,
/// so each item goes to exactly one consumer.
///
/// Items have no lease: they outlive their producers. A claim whose answer is lost in a
/// failover may have consumed the item (at-most-once then): a claim is a plain etcd txn,
/// which the server does not de-duplicate (see [`crate::ExactlyOnce`] for writes that it
/// does).
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, Queue};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let q = Queue::new(&client, "emails");
/// q.enqueue("first").await?;
/// q.enqueue("second").await?;
/// assert_eq!(q.dequeue().await?, b"first");
/// assert_eq!(q.dequeue().await?, b"second");
/// assert_eq!(q.try_dequeue().await?, None);
/// # Ok(()) });
/// ```
#[derive(Debug, Clone)]
pub struct Queue {
    client: Client,
    name: Vec<u8>,
}

impl Queue {
    /// The queue `name`.
    pub fn new(client: &Client, name: impl Into<Vec<u8>>) -> Queue {
        Queue {
            client: client.clone(),
            name: name.into(),
        }
    }

    fn prefix(&self) -> Vec<u8> {
        join(&self.name, "")
    }

    /// Appends `value`.
    pub async fn enqueue(&self, value: impl Into<Vec<u8>>) -> Result<()> {
        let value = value.into();
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let key = join(
                &self.name,
                &format!("{nanos:020}-{:08x}", rand::random::<u32>()),
            );
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([Op::put(key.clone(), value.clone(), PutOptions::new())]);
            // A conditional create of a fresh key: repeating it cannot add a second item.
            let r = retry(5, || {
                self.client.txn_with_retry(txn.clone(), Retry::Idempotent)
            })
            .await?;
            if r.succeeded {
                return Ok(());
            }
        }
    }

    /// Removes and returns the oldest item, `None` if the queue is empty.
    pub async fn try_dequeue(&self) -> Result<Option<Vec<u8>>> {
        Ok(self.claim_first().await?.0)
    }

    /// Removes and returns the oldest item, waiting for one if the queue is empty.
    pub async fn dequeue(&self) -> Result<Vec<u8>> {
        loop {
            let (item, at) = self.claim_first().await?;
            if let Some(v) = item {
                return Ok(v);
            }
            let ev = wait_event(&self.client, &self.prefix(), true, at + 1, EventKind::Put).await?;
            if self.claim(&ev.kv.key, ev.kv.mod_revision).await? {
                return Ok(ev.kv.value);
            }
        }
    }

    /// Claims the oldest claimable item; the read's revision if there is none.
    async fn claim_first(&self) -> Result<(Option<Vec<u8>>, i64)> {
        loop {
            let r = self
                .client
                .get(
                    self.prefix(),
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(8),
                )
                .await?;
            let at = r.header.as_ref().map_or(0, |h| h.revision);
            if r.kvs.is_empty() {
                return Ok((None, at));
            }
            for kv in r.kvs {
                if self.claim(&kv.key, kv.mod_revision).await? {
                    return Ok((Some(kv.value), at));
                }
            }
            // Everything we saw was taken by other consumers: look again.
        }
    }

    async fn claim(&self, key: &[u8], mod_rev: i64) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.to_vec(),
                CompareOp::Equal,
                mod_rev,
            )])
            .and_then([Op::delete(key.to_vec(), DeleteOptions::new())]);
        Ok(self
            .client
            .txn_with_retry(txn, Retry::Once)
            .await?
            .succeeded)
    }
}
