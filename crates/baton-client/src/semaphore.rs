//! Counting semaphores over KV: at most N holders at once, each with its own fencing
//! token.

use std::future::Future;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::kv::{GetOptions, SortOrder, SortTarget};
use crate::lost::LostReason;
use crate::monitor::Holding;
use crate::mutex::LockOptions;
use crate::recipe::{create_own_key, delete_if_created, guarded, wait_event, Cleanup};
use crate::session::Session;
use crate::token::FencingToken;
use crate::util::{join, lease_hex, show, until};
use crate::watch::EventKind;

/// A semaphore of N permits named `name`.
///
/// Each contender puts its own key `name/<lease hex>` (attached to its session's lease);
/// the keys in create-revision order form the queue, and a contender holds a permit while
/// its key is among the first N. Its **fencing token** is its key's create revision (each
/// holder has its own). A waiter re-checks its rank whenever a key ahead of it is deleted
/// (a rank is a count, so no single key decides it). Giving up deletes the key.
///
/// Every contender must use the same N: the count lives in the clients, not the server
/// (neither Baton nor etcd has a server-side semaphore). One session holds at most one
/// permit of a semaphore ([`Error::AlreadyHeld`] otherwise). Do not give a semaphore the
/// name of a [`crate::Mutex`] lock: both use `name/<lease hex>` keys.
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, Error, Semaphore, Session, SessionOptions};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let mut permits = Vec::new();
/// for _ in 0..2 {
///     let s = Session::new(&client, SessionOptions::new()).await?;
///     permits.push(Semaphore::new(&s, "gpu", 2).acquire().await?);
/// }
/// let third = Session::new(&client, SessionOptions::new()).await?;
/// assert!(matches!(Semaphore::new(&third, "gpu", 2).try_acquire().await, Err(Error::WouldBlock { .. })));
/// assert_ne!(permits[0].fencing_token(), permits[1].fencing_token());
/// permits.pop().unwrap().release().await?;
/// Semaphore::new(&third, "gpu", 2).try_acquire().await?.release().await?;
/// # Ok(()) });
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    session: Session,
    name: Vec<u8>,
    permits: usize,
}

impl Semaphore {
    /// The semaphore `name` with `permits` permits, acquired with `session`.
    pub fn new(session: &Session, name: impl Into<Vec<u8>>, permits: usize) -> Semaphore {
        Semaphore {
            session: session.clone(),
            name: name.into(),
            permits,
        }
    }

    /// Waits for a permit (or the session's loss). Cancel by dropping the future.
    pub async fn acquire(&self) -> Result<Permit> {
        self.acquire_with(LockOptions::new()).await
    }

    /// A permit if one is free now; [`Error::WouldBlock`] otherwise.
    pub async fn try_acquire(&self) -> Result<Permit> {
        self.acquire_with(LockOptions::new().try_only()).await
    }

    /// A permit as `opts` say (timeout, try-only; lock-delay is not supported here).
    pub async fn acquire_with(&self, opts: LockOptions) -> Result<Permit> {
        if self.permits == 0 || self.name.is_empty() {
            return Err(Error::Config(
                "a semaphore needs a name and at least one permit".into(),
            ));
        }
        if opts.lock_delay().is_some() {
            return Err(Error::Unsupported("lock-delay on a semaphore"));
        }
        let client = self.session.client();
        let cleanup = Cleanup::new(client);
        let key = join(&self.name, &lease_hex(self.session.lease()));
        let mut prefix = self.name.clone();
        prefix.push(b'/');
        let work = async {
            let own = create_own_key(client, &key, self.session.lease(), None).await?;
            if !own.created {
                return Err(Error::AlreadyHeld { key: show(&key) });
            }
            cleanup.arm(&key, own.rev);
            loop {
                let r = client
                    .get(
                        prefix.clone(),
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_sort(SortTarget::Create, SortOrder::Ascend)
                            .with_limit(self.permits as i64),
                    )
                    .await?;
                if r.kvs.iter().any(|kv| kv.create_revision == own.rev) {
                    return Ok(own.rev);
                }
                if !r.kvs.iter().any(|kv| kv.key == key) && r.kvs.len() < self.permits {
                    // Fewer than N keys and none is ours: our key is gone.
                    return Err(Error::SessionLost(LostReason::KeyDeleted));
                }
                if opts.is_try_only() {
                    return Err(Error::WouldBlock {
                        holder: format!("all {} permits of {}", self.permits, show(&self.name)),
                    });
                }
                let at = r.header.map_or(0, |h| h.revision);
                wait_event(client, &prefix, true, at + 1, EventKind::Delete).await?;
            }
        };
        let end = opts.timeout().map(|t| Instant::now() + t);
        match until(end, guarded(&self.session, work)).await {
            Ok(Ok(rev)) => {
                cleanup.disarm();
                Ok(Permit::new(&self.session, key, FencingToken::new(rev)))
            }
            Ok(Err(e)) => {
                if !matches!(e, Error::AlreadyHeld { .. }) {
                    cleanup.run().await;
                }
                Err(e)
            }
            Err(()) => {
                cleanup.run().await;
                Err(Error::Timeout(opts.timeout().unwrap_or_default()))
            }
        }
    }
}

/// A held position: a semaphore permit, or a read or write hold of an
/// [`crate::RwLock`]. Its key, its fencing token (the key's create revision), and a loss
/// signal that fires when the session is lost or the key deleted.
///
/// Dropping it without [`Permit::release`] releases it in the background (best effort).
pub struct Permit {
    key: Vec<u8>,
    token: FencingToken,
    session: Session,
    holding: Holding,
    released: bool,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("key", &show(&self.key))
            .field("fencing_token", &self.token)
            .finish()
    }
}

impl Permit {
    pub(crate) fn new(session: &Session, key: Vec<u8>, token: FencingToken) -> Permit {
        Permit {
            holding: Holding::start(session, key.clone(), token.get()),
            session: session.clone(),
            key,
            token,
            released: false,
        }
    }
    /// This holder's key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// This holder's fencing token (its key's create revision).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }
    /// Completes when the permit is lost, with the reason. Does not borrow the permit.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.holding.lost()
    }
    /// Why the permit was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.holding.reason()
    }
    /// Gives the permit back: deletes the key if it is still this holder's;
    /// [`Error::NotHolder`] if it was already gone.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        if delete_if_created(self.session.client(), &self.key, self.token.get()).await? {
            Ok(())
        } else {
            Err(Error::NotHolder)
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let client = self.session.client().clone();
        let (key, token) = (self.key.clone(), self.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = delete_if_created(&client, &key, token.get()).await;
            });
        }
    }
}
