//! Barriers (etcd's `recipes.Barrier` and `recipes.DoubleBarrier`).

use crate::client::{Client, Retry};
use crate::error::{Error, Result};
use crate::kv::{Compare, CompareOp, DeleteOptions, GetOptions, Op, PutOptions, Txn};
use crate::recipe::{create_own_key, delete_if_created, guarded, wait_deleted, wait_event};
use crate::session::Session;
use crate::util::{join, lease_hex, show};
use crate::watch::EventKind;

/// A barrier: while the key `name` exists, [`Barrier::wait`] blocks; deleting it releases
/// every waiter at once. The key has no lease (a holder that dies leaves the barrier
/// up, as in etcd's recipe); delete it by hand if that happens.
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Barrier, Client, ClientConfig};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let gate = Barrier::new(&client, "deploy-gate");
/// gate.hold().await?;
/// let waiter = tokio::spawn({ let g = gate.clone(); async move { g.wait().await } });
/// tokio::time::sleep(std::time::Duration::from_millis(100)).await;
/// assert!(!waiter.is_finished());
/// gate.release().await?;
/// waiter.await.unwrap()?;
/// # Ok(()) });
/// ```
#[derive(Debug, Clone)]
pub struct Barrier {
    client: Client,
    key: Vec<u8>,
}

impl Barrier {
    /// The barrier `name` (its key).
    pub fn new(client: &Client, name: impl Into<Vec<u8>>) -> Barrier {
        Barrier {
            client: client.clone(),
            key: name.into(),
        }
    }

    /// Raises the barrier; [`Error::AlreadyHeld`] if it is already up.
    pub async fn hold(&self) -> Result<()> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([Op::put(self.key.clone(), "", PutOptions::new())]);
        if self
            .client
            .txn_with_retry(txn, Retry::Once)
            .await?
            .succeeded
        {
            Ok(())
        } else {
            Err(Error::AlreadyHeld {
                key: show(&self.key),
            })
        }
    }

    /// Lowers the barrier, releasing every waiter.
    pub async fn release(&self) -> Result<()> {
        self.client
            .delete(self.key.clone(), DeleteOptions::new())
            .await
            .map(|_| ())
    }

    /// Returns once the barrier is down (at once if it is not up).
    pub async fn wait(&self) -> Result<()> {
        let r = self.client.get(self.key.clone(), GetOptions::new()).await?;
        if r.kvs.is_empty() {
            return Ok(());
        }
        let at = r.header.map_or(0, |h| h.revision);
        wait_deleted(&self.client, &self.key, at).await
    }
}

/// A double barrier for `count` participants: [`DoubleBarrier::enter`] returns once all
/// `count` have entered, [`DoubleBarrier::leave`] once all have left. Participants'
/// keys `name/waiters/<lease hex>` are attached to their sessions, so one that dies does
/// not block the others forever in `leave` (its key goes with its lease).
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, DoubleBarrier, Session, SessionOptions};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let mut tasks = Vec::new();
/// for _ in 0..3 {
///     let s = Session::new(&client, SessionOptions::new()).await?;
///     tasks.push(tokio::spawn(async move {
///         let b = DoubleBarrier::new(&s, "batch-7", 3);
///         b.enter().await?;   // everyone starts together
///         b.leave().await     // and finishes together
///     }));
/// }
/// for t in tasks { t.await.unwrap()?; }
/// # Ok(()) });
/// ```
#[derive(Debug)]
pub struct DoubleBarrier {
    session: Session,
    name: Vec<u8>,
    count: usize,
    mine: std::sync::Mutex<Option<(Vec<u8>, i64)>>,
}

impl DoubleBarrier {
    /// The double barrier `name` for `count` participants, joined with `session`.
    pub fn new(session: &Session, name: impl Into<Vec<u8>>, count: usize) -> DoubleBarrier {
        DoubleBarrier {
            session: session.clone(),
            name: name.into(),
            count,
            mine: std::sync::Mutex::new(None),
        }
    }

    fn waiters(&self) -> Vec<u8> {
        join(&self.name, "waiters/")
    }

    fn ready(&self) -> Vec<u8> {
        join(&self.name, "ready")
    }

    /// Enters and waits until `count` participants have. [`Error::TooManyParticipants`]
    /// if more than `count` are in.
    pub async fn enter(&self) -> Result<()> {
        let client = self.session.client();
        let key = join(
            &self.name,
            &format!("waiters/{}", lease_hex(self.session.lease())),
        );
        guarded(&self.session, async {
            let own = create_own_key(client, &key, self.session.lease(), None).await?;
            *self.mine.lock().expect("poisoned") = Some((key.clone(), own.rev));
            let r = client
                .get(
                    self.waiters(),
                    GetOptions::new().with_prefix().with_keys_only(),
                )
                .await?;
            if r.kvs.len() > self.count {
                delete_if_created(client, &key, own.rev).await?;
                *self.mine.lock().expect("poisoned") = None;
                return Err(Error::TooManyParticipants);
            }
            if r.kvs.len() == self.count {
                client.put(self.ready(), "", PutOptions::new()).await?;
                return Ok(());
            }
            wait_event(client, &self.ready(), false, own.rev, EventKind::Put).await?;
            Ok(())
        })
        .await
    }

    /// Leaves and waits until every participant has left.
    pub async fn leave(&self) -> Result<()> {
        let client = self.session.client();
        let mine = self.mine.lock().expect("poisoned").clone();
        guarded(&self.session, async {
            loop {
                let r = client
                    .get(
                        self.waiters(),
                        GetOptions::new().with_prefix().with_keys_only(),
                    )
                    .await?;
                let at = r.header.as_ref().map_or(0, |h| h.revision);
                let kvs = r.kvs;
                let Some(lowest) = kvs.iter().min_by_key(|kv| kv.create_revision) else {
                    return Ok(());
                };
                let highest = kvs
                    .iter()
                    .max_by_key(|kv| kv.create_revision)
                    .expect("non-empty");
                let is_mine = |k: &[u8]| mine.as_ref().is_some_and(|(m, _)| m.as_slice() == k);
                if kvs.len() == 1 {
                    if is_mine(&lowest.key) {
                        // The last one out lowers the "ready" flag for the next round.
                        client.delete(self.ready(), DeleteOptions::new()).await?;
                        if let Some((k, rev)) = &mine {
                            delete_if_created(client, k, *rev).await?;
                        }
                        return Ok(());
                    }
                    wait_deleted(client, &lowest.key, at).await?;
                    continue;
                }
                if is_mine(&lowest.key) {
                    // The lowest leaves last: wait for the others, newest first.
                    wait_deleted(client, &highest.key, at).await?;
                } else {
                    if let Some((k, rev)) = &mine {
                        delete_if_created(client, k, *rev).await?;
                    }
                    wait_deleted(client, &lowest.key, at).await?;
                }
            }
        })
        .await
    }
}
