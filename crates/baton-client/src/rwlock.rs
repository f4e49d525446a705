//! Readers-writer locks over KV (etcd's `recipes.RWMutex` shape).

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::mutex::LockOptions;
use crate::recipe::{create_own_key, guarded, newest_before, wait_deleted, Cleanup};
use crate::semaphore::Permit;
use crate::session::Session;
use crate::token::FencingToken;
use crate::util::{join, lease_hex, show, until};

/// A readers-writer lock named `name`: many readers or one writer.
///
/// Readers put `name/read/<lease hex>`, writers `name/write/<lease hex>`; the queue is
/// every key under `name/` in create-revision order (FIFO, so writers do not starve). A
/// writer holds once every earlier key (reader or writer) is gone; a reader holds once
/// every earlier *writer* is gone. Each waits on the newest earlier key that blocks it,
/// then looks again. The [`Permit`]'s fencing token is its key's create revision.
///
/// One session holds at most one read and one write position per lock; a session that
/// holds a read position and asks to write waits for itself — release first.
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use std::time::Duration;
/// use baton_client::{Client, ClientConfig, Error, LockOptions, RwLock, Session, SessionOptions};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let (a, b, c) = (
///     Session::new(&client, SessionOptions::new()).await?,
///     Session::new(&client, SessionOptions::new()).await?,
///     Session::new(&client, SessionOptions::new()).await?,
/// );
/// let r1 = RwLock::new(&a, "catalog").read().await?;
/// let r2 = RwLock::new(&b, "catalog").read().await?; // readers share
/// let w = RwLock::new(&c, "catalog")
///     .write_with(LockOptions::new().with_timeout(Duration::from_millis(200)))
///     .await;
/// assert!(matches!(w, Err(Error::Timeout(_)))); // a writer waits for both
/// r1.release().await?;
/// r2.release().await?;
/// RwLock::new(&c, "catalog").write().await?.release().await?;
/// # Ok(()) });
/// ```
#[derive(Debug, Clone)]
pub struct RwLock {
    session: Session,
    name: Vec<u8>,
}

impl RwLock {
    /// The lock `name`, taken with `session`.
    pub fn new(session: &Session, name: impl Into<Vec<u8>>) -> RwLock {
        RwLock {
            session: session.clone(),
            name: name.into(),
        }
    }

    /// Waits for a shared (read) hold.
    pub async fn read(&self) -> Result<Permit> {
        self.read_with(LockOptions::new()).await
    }

    /// Waits for the exclusive (write) hold.
    pub async fn write(&self) -> Result<Permit> {
        self.write_with(LockOptions::new()).await
    }

    /// A read hold as `opts` say (timeout, try-only).
    pub async fn read_with(&self, opts: LockOptions) -> Result<Permit> {
        self.take("read", "write/", opts).await
    }

    /// A write hold as `opts` say (timeout, try-only).
    pub async fn write_with(&self, opts: LockOptions) -> Result<Permit> {
        self.take("write", "", opts).await
    }

    /// Puts `name/<kind>/<lease>` and waits until no key under `name/<blockers>` is older.
    async fn take(&self, kind: &str, blockers: &str, opts: LockOptions) -> Result<Permit> {
        if self.name.is_empty() {
            return Err(Error::Config("empty lock name".into()));
        }
        if opts.lock_delay().is_some() {
            return Err(Error::Unsupported("lock-delay on a readers-writer lock"));
        }
        let client = self.session.client();
        let key = join(
            &self.name,
            &format!("{kind}/{}", lease_hex(self.session.lease())),
        );
        let mut blocking = self.name.clone();
        blocking.push(b'/');
        blocking.extend_from_slice(blockers.as_bytes());
        let cleanup = Cleanup::new(client);
        let work = async {
            let own = create_own_key(client, &key, self.session.lease(), None).await?;
            if !own.created {
                return Err(Error::AlreadyHeld { key: show(&key) });
            }
            cleanup.arm(&key, own.rev);
            loop {
                let (older, at) = newest_before(client, &blocking, own.rev - 1).await?;
                let Some(kv) = older else {
                    return Ok(own.rev);
                };
                if opts.is_try_only() {
                    return Err(Error::WouldBlock {
                        holder: show(&kv.key),
                    });
                }
                wait_deleted(client, &kv.key, at).await?;
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
