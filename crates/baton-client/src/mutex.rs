//! Mutual exclusion with fencing tokens: [`Mutex`], [`Guard`], and the [`FenceGate`] for
//! resources outside Baton.

use std::future::Future;
use std::time::Duration;

use baton_proto::baton::v1 as bpb;
use baton_proto::baton::v1::fence_client::FenceClient;
use baton_proto::baton::v1::lock_client::LockClient;
use tokio::time::Instant;
use tonic::Code;

use crate::client::{write_request, Client, Deadline, Retry};
use crate::config::ServerKind;
use crate::error::{Error, Result};
use crate::kv::{Compare, CompareOp, Op, PutOptions, PutResponse, Txn};
use crate::lost::LostReason;
use crate::monitor::Holding;
use crate::recipe::{
    create_own_key, delete_if_created, guarded, newest_before, wait_deleted, Cleanup,
};
use crate::session::Session;
use crate::signed::{PublicKeys, SignedToken, VerifyError};
use crate::token::FencingToken;
use crate::util::{backoff, join, lease_hex, show, until};

/// How to acquire: wait at most this long, or not at all; and (Baton only) the lock-delay.
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    timeout: Option<Duration>,
    try_only: bool,
    lock_delay: Option<Duration>,
}

impl LockOptions {
    /// Wait as long as it takes (until the session is lost).
    pub fn new() -> Self {
        Self::default()
    }
    /// Give up after `t` with [`Error::Timeout`]; the waiter's key is deleted so the queue
    /// moves on.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }
    /// Fail at once with [`Error::WouldBlock`] if someone else holds the lock.
    pub fn try_only(mut self) -> Self {
        self.try_only = true;
        self
    }
    /// Baton only (Chubby's lock-delay): after a holder's lease *expires* (not on a clean
    /// release), the lock is not granted again for `d`, so the delayed writes of a crashed
    /// or paused holder can drain. On etcd, asking for it fails with
    /// [`Error::Unsupported`] rather than silently doing nothing.
    pub fn with_lock_delay(mut self, d: Duration) -> Self {
        self.lock_delay = Some(d);
        self
    }
}

/// Locks taken with one [`Session`]: each lock `name` is a FIFO queue of keys
/// `name/<lease hex>` (etcd's layout, so `etcdctl lock` users queue in the same line); the
/// oldest key holds the lock and its create revision is the **fencing token**, larger for
/// every later holder.
///
/// On Baton the queue is served by `baton.v1.Lock` (the server waits for the caller, so
/// giving up — a timeout, dropping the future — deletes the waiter key on the server). On
/// etcd 3.4 the same API runs etcd's client-side recipe over Txn, Range and Watch, with the
/// fix etcd 3.5 made (re-checking the own key after waiting, so an expired session is not
/// handed a lock; etcd#11456).
///
/// A session that acquires a lock it already holds gets a second guard for the same key
/// (re-entrant, as in etcd); releasing either releases the lock.
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, Mutex, PutOptions, Session, SessionOptions};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let session = Session::new(&client, SessionOptions::new()).await?;
/// let locks = Mutex::new(&session);
///
/// let guard = locks.acquire("stock").await?;
/// // Guarded work: stop as soon as the lock is lost, and fence every write.
/// tokio::select! {
///     reason = guard.lost() => panic!("lost the lock: {reason}"),
///     r = guard.fenced_put("stock/qty", "9", PutOptions::new()) => { r?; }
/// }
/// println!("token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) });
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    session: Session,
}

impl Mutex {
    /// Locks held with `session`: they end when it is lost.
    pub fn new(session: &Session) -> Mutex {
        Mutex {
            session: session.clone(),
        }
    }

    /// Waits until `name` is held (or the session is lost). Cancel by dropping the future.
    pub async fn acquire(&self, name: impl Into<Vec<u8>>) -> Result<Guard> {
        self.acquire_with(name, LockOptions::new()).await
    }

    /// Takes `name` only if nobody holds it; [`Error::WouldBlock`] otherwise.
    ///
    /// ```
    /// # baton_client::testing::doctest(|endpoint| async move {
    /// use baton_client::{Client, ClientConfig, Error, Mutex, Session, SessionOptions};
    ///
    /// let client = Client::connect(ClientConfig::new([endpoint])).await?;
    /// let a = Mutex::new(&Session::new(&client, SessionOptions::new()).await?);
    /// let b = Mutex::new(&Session::new(&client, SessionOptions::new()).await?);
    /// let held = a.try_lock("cron").await?;
    /// assert!(matches!(b.try_lock("cron").await, Err(Error::WouldBlock { .. })));
    /// held.release().await?;
    /// b.try_lock("cron").await?.release().await?;
    /// # Ok(()) });
    /// ```
    pub async fn try_lock(&self, name: impl Into<Vec<u8>>) -> Result<Guard> {
        self.acquire_with(name, LockOptions::new().try_only()).await
    }

    /// Acquires `name` as `opts` say. Transient failures (no leader, a lost connection) are
    /// retried with jittered backoff while the session lives and the timeout allows;
    /// joining the queue is idempotent per session, so a retry keeps its place if the
    /// server kept the waiter key.
    pub async fn acquire_with(&self, name: impl Into<Vec<u8>>, opts: LockOptions) -> Result<Guard> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::Config("empty lock name".into()));
        }
        match self.session.client().server_kind().await? {
            ServerKind::Etcd => self.acquire_etcd(name, &opts).await,
            _ => self.acquire_baton(name, &opts).await,
        }
    }

    /// Acquires every lock in `names`, in sorted order (so two callers asking for
    /// overlapping sets cannot deadlock); if any fails, the ones already taken are released
    /// and the error returned. The guards come back in sorted name order. A timeout in
    /// `opts` bounds the whole call.
    ///
    /// ```
    /// # baton_client::testing::doctest(|endpoint| async move {
    /// use baton_client::{Client, ClientConfig, LockOptions, Mutex, Session, SessionOptions};
    ///
    /// let client = Client::connect(ClientConfig::new([endpoint])).await?;
    /// let locks = Mutex::new(&Session::new(&client, SessionOptions::new()).await?);
    /// let guards = locks.lock_many(["acct/b", "acct/a"], LockOptions::new()).await?;
    /// assert_eq!(guards[0].name(), b"acct/a");
    /// for g in guards { g.release().await?; }
    /// # Ok(()) });
    /// ```
    pub async fn lock_many<I, N>(&self, names: I, opts: LockOptions) -> Result<Vec<Guard>>
    where
        I: IntoIterator<Item = N>,
        N: Into<Vec<u8>>,
    {
        let mut names: Vec<Vec<u8>> = names.into_iter().map(Into::into).collect();
        names.sort();
        names.dedup();
        if names.is_empty() || names.iter().any(Vec::is_empty) {
            return Err(Error::Config("lock_many needs non-empty names".into()));
        }
        if self.session.client().server_kind().await? != ServerKind::Etcd {
            return self.lock_many_baton(names, &opts).await;
        }
        let end = opts.timeout.map(|t| Instant::now() + t);
        let mut held: Vec<Guard> = Vec::new();
        for name in names {
            let mut o = opts.clone();
            if let Some(e) = end {
                o.timeout = Some(
                    e.saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                );
            }
            match self.acquire_with(name, o).await {
                Ok(g) => held.push(g),
                Err(e) => {
                    for g in held {
                        let _ = g.release().await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(held)
    }

    fn guard(&self, name: Vec<u8>, key: Vec<u8>, token: FencingToken, kind: ServerKind) -> Guard {
        Guard {
            holding: Holding::start(&self.session, key.clone(), token.get()),
            session: self.session.clone(),
            name,
            key,
            token,
            signed: None,
            kind,
            released: false,
        }
    }

    /// A guard of a `baton.v1.Lock` grant, with the grant's signed token.
    fn signed_guard(&self, name: Vec<u8>, resp: bpb::AcquireResponse) -> Guard {
        let signed = SignedToken::from_grant(&name, &resp);
        let mut g = self.guard(
            name,
            resp.key,
            FencingToken::new(resp.fencing_token),
            ServerKind::Baton,
        );
        g.signed = Some(signed);
        g
    }

    async fn acquire_baton(&self, name: Vec<u8>, opts: &LockOptions) -> Result<Guard> {
        let client = self.session.client();
        let end = opts.timeout.map(|t| Instant::now() + t);
        let lock_delay_ms = opts.lock_delay.map_or(0, |d| d.as_millis().max(1) as i64);
        let mut attempt = 0;
        loop {
            let left = end.map(|e| e.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return Err(Error::Timeout(opts.timeout.unwrap_or_default()));
            }
            let req = bpb::AcquireRequest {
                name: name.clone(),
                lease: self.session.lease(),
                timeout_ms: left.map_or(0, |l| l.as_millis().max(1) as i64),
                try_only: opts.try_only,
                lock_delay_ms,
            };
            let deadline = match (opts.try_only, left) {
                (true, _) => Deadline::Default,
                (false, Some(l)) => Deadline::After(l + client.config().request_timeout),
                (false, None) => Deadline::Never,
            };
            let id = client.next_request_id();
            let call = client.call("baton.v1.Lock/Acquire", Retry::Once, deadline, |ch, _| {
                // The server enforces `timeout_ms` itself; no grpc-timeout, so the answer
                // for a timeout is Baton's own (and the waiter key is deleted).
                let r = write_request(req.clone(), None, id);
                async move { LockClient::new(ch).acquire(r).await }
            });
            match guarded(&self.session, call).await {
                Ok(resp) => return Ok(self.signed_guard(name, resp)),
                Err(e) if e.is_transient() => {
                    attempt += 1;
                    tracing::debug!(error = %e, "acquire failed transiently; retrying");
                    let pause = backoff(attempt, Duration::from_millis(50), Duration::from_secs(2));
                    if until(
                        end,
                        guarded(&self.session, async {
                            tokio::time::sleep(pause).await;
                            Ok(())
                        }),
                    )
                    .await
                    .is_err()
                    {
                        return Err(Error::Timeout(opts.timeout.unwrap_or_default()));
                    }
                }
                Err(e) => return Err(lock_error(e, opts.timeout)),
            }
        }
    }

    async fn lock_many_baton(&self, names: Vec<Vec<u8>>, opts: &LockOptions) -> Result<Vec<Guard>> {
        let client = self.session.client();
        let req = bpb::AcquireManyRequest {
            names,
            lease: self.session.lease(),
            timeout_ms: opts.timeout.map_or(0, |t| t.as_millis().max(1) as i64),
            try_only: opts.try_only,
            lock_delay_ms: opts.lock_delay.map_or(0, |d| d.as_millis().max(1) as i64),
        };
        let deadline = match (opts.try_only, opts.timeout) {
            (true, _) => Deadline::Default,
            (false, Some(t)) => Deadline::After(t + client.config().request_timeout),
            (false, None) => Deadline::Never,
        };
        let id = client.next_request_id();
        let call = client.call(
            "baton.v1.Lock/AcquireMany",
            Retry::Once,
            deadline,
            |ch, _| {
                let r = write_request(req.clone(), None, id);
                async move { LockClient::new(ch).acquire_many(r).await }
            },
        );
        let resp = guarded(&self.session, call)
            .await
            .map_err(|e| lock_error(e, opts.timeout))?;
        let mut names: Vec<Vec<u8>> = req.names.clone();
        names.sort();
        names.dedup();
        Ok(resp
            .locks
            .into_iter()
            .zip(names)
            .map(|(l, name)| self.signed_guard(name, l))
            .collect())
    }

    /// etcd's `concurrency.Mutex` (3.5 semantics) over KV, Lease and Watch.
    async fn acquire_etcd(&self, name: Vec<u8>, opts: &LockOptions) -> Result<Guard> {
        if opts.lock_delay.is_some() {
            return Err(Error::Unsupported(
                "lock-delay (needs Baton's baton.v1.Lock)",
            ));
        }
        let client = self.session.client();
        let cleanup = Cleanup::new(client);
        let work = async {
            let key = join(&name, &lease_hex(self.session.lease()));
            let mut prefix = name.clone();
            prefix.push(b'/');
            let own = create_own_key(client, &key, self.session.lease(), Some(&prefix)).await?;
            if own.created {
                cleanup.arm(&key, own.rev);
            }
            let holder = own.first.filter(|kv| kv.create_revision != own.rev);
            if let Some(h) = holder {
                if opts.try_only {
                    cleanup.run().await;
                    return Err(Error::WouldBlock {
                        holder: show(&h.key),
                    });
                }
                // Wait for every older key to go, newest first (each wait is for one key).
                loop {
                    let (older, at) = newest_before(client, &prefix, own.rev - 1).await?;
                    match older {
                        None => break,
                        Some(kv) => wait_deleted(client, &kv.key, at).await?,
                    }
                }
                // etcd 3.5's fix: the own key may have gone with an expired lease while
                // waiting; then this is not a grant.
                let me = client.get(key.clone(), crate::GetOptions::new()).await?;
                if me.kvs.first().map(|kv| kv.create_revision) != Some(own.rev) {
                    return Err(Error::SessionLost(LostReason::KeyDeleted));
                }
            }
            Ok((key, own.rev))
        };
        let end = opts.timeout.map(|t| Instant::now() + t);
        match until(end, guarded(&self.session, work)).await {
            Ok(Ok((key, rev))) => {
                cleanup.disarm();
                Ok(self.guard(name, key, FencingToken::new(rev), ServerKind::Etcd))
            }
            Ok(Err(e)) => {
                cleanup.run().await;
                Err(e)
            }
            Err(()) => {
                cleanup.run().await;
                Err(Error::Timeout(opts.timeout.unwrap_or_default()))
            }
        }
    }
}

/// Maps Baton's lock errors (`baton: ...` messages) to their variants.
fn lock_error(e: Error, timeout: Option<Duration>) -> Error {
    let Error::Server { code, message } = &e else {
        return e;
    };
    match code {
        Code::FailedPrecondition if message.contains("lock is held by") => {
            let holder = message
                .split("held by ")
                .nth(1)
                .and_then(|s| s.split(" (fencing token").next())
                .unwrap_or("")
                .to_string();
            Error::WouldBlock { holder }
        }
        Code::FailedPrecondition if message.contains("lock-delay") => Error::LockDelayed,
        Code::FailedPrecondition if message.contains("key was deleted") => {
            Error::SessionLost(LostReason::KeyDeleted)
        }
        Code::FailedPrecondition if message.contains("lease expired") => {
            Error::SessionLost(LostReason::LeaseExpired)
        }
        Code::DeadlineExceeded if message.starts_with("baton: lock not acquired") => {
            Error::Timeout(timeout.unwrap_or_default())
        }
        _ => e,
    }
}

/// A held lock: its key, its fencing token, and a loss signal.
///
/// **The fencing token** is the key's create revision: every later holder of the lock has
/// a larger one. Pass it along with every write to the protected resource and have the
/// resource refuse anything lower than the highest it has seen — that is what stops the
/// late write of a holder that was paused past its lease (no client-side check can). For
/// data in Baton use [`Guard::fenced_put`]; for services that cannot check tokens put a
/// [`FenceGate`] on their write path; for a SQL database keep the token in the row (see the
/// crate docs, "Fencing a PostgreSQL table").
///
/// **Loss is never silent**: [`Guard::lost`] fires when the session is lost (before the
/// server could give the lock to anyone else) or the key disappears (force-release).
///
/// Dropping a guard without [`Guard::release`] releases it in the background (best
/// effort; the lease's end releases it otherwise).
pub struct Guard {
    name: Vec<u8>,
    key: Vec<u8>,
    token: FencingToken,
    /// The grant's signed token (`baton.v1.Lock` only; etcd signs nothing).
    signed: Option<SignedToken>,
    kind: ServerKind,
    session: Session,
    holding: Holding,
    released: bool,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", &show(&self.key))
            .field("fencing_token", &self.token)
            .finish()
    }
}

impl Guard {
    /// The lock's name.
    pub fn name(&self) -> &[u8] {
        &self.name
    }
    /// This holder's key (`name/<lease hex>`).
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// The grant's signed fencing token, for resources that verify signatures (see
    /// [`FenceGate::with_public_keys`]); `None` on etcd, which signs nothing.
    pub fn signed_token(&self) -> Option<&SignedToken> {
        self.signed.as_ref()
    }
    /// The fencing token (the key's create revision).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }
    /// The session the lock is held with.
    pub fn session(&self) -> &Session {
        &self.session
    }
    /// Completes when the lock is lost (session lost, or key deleted), with the reason.
    /// Does not borrow the guard.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.holding.lost()
    }
    /// Why the lock was lost, if it was (as far as this client knows; see
    /// [`crate::Session::state`] for the uncertain window).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.holding.reason()
    }

    /// Releases the lock, atomically checking that the key still holds it with this token
    /// (Baton's `Release`, or `If create_revision(key) == token Then Delete` on etcd).
    /// [`Error::NotHolder`] if it did not (it was already lost).
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        release(self.session.client(), self.kind, &self.key, self.token).await
    }

    /// Writes `key = value` only while this guard still holds the lock with its token,
    /// checked atomically with the write (Baton's `FencedPut`; on etcd the same condition
    /// as one Txn: `create_revision(lock key) == token` and every key in the lock's queue
    /// created at or after the token). [`Error::FencingTokenRejected`] otherwise.
    pub async fn fenced_put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        opts: PutOptions,
    ) -> Result<PutResponse> {
        fenced_put(
            self.session.client(),
            self.kind,
            &self.key,
            self.token,
            opts.into_request(key.into(), value.into()),
        )
        .await
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let client = self.session.client().clone();
        let (kind, key, token) = (self.kind, self.key.clone(), self.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = release(&client, kind, &key, token).await;
            });
        }
    }
}

async fn release(client: &Client, kind: ServerKind, key: &[u8], token: FencingToken) -> Result<()> {
    let once = || async {
        match kind {
            ServerKind::Etcd => {
                if delete_if_created(client, key, token.get()).await? {
                    Ok(())
                } else {
                    Err(Error::NotHolder)
                }
            }
            _ => {
                let req = bpb::ReleaseRequest {
                    key: key.to_vec(),
                    fencing_token: token.get(),
                };
                let id = client.next_request_id();
                let r = client
                    .call(
                        "baton.v1.Lock/Release",
                        Retry::Once,
                        Deadline::Default,
                        |ch, t| {
                            let r = write_request(req.clone(), t, id);
                            async move { LockClient::new(ch).release(r).await }
                        },
                    )
                    .await;
                match r {
                    Ok(_) => Ok(()),
                    Err(Error::Server {
                        code: Code::FailedPrecondition,
                        message,
                    }) if message.contains("not the holder") => Err(Error::NotHolder),
                    Err(e) => Err(e),
                }
            }
        }
    };
    match once().await {
        // The first attempt may have been applied before the connection broke: if the
        // retry finds the key gone, that was this release.
        Err(e) if e.is_transient() => match once().await {
            Err(Error::NotHolder) => Ok(()),
            r => r,
        },
        r => r,
    }
}

async fn fenced_put(
    client: &Client,
    kind: ServerKind,
    lock_key: &[u8],
    token: FencingToken,
    put: baton_proto::etcdserverpb::PutRequest,
) -> Result<PutResponse> {
    let rejected = Error::FencingTokenRejected {
        token,
        highest: None,
    };
    match kind {
        ServerKind::Etcd => {
            let Some(slash) = lock_key.iter().rposition(|&b| b == b'/') else {
                return Err(Error::Config("not a lock key".into()));
            };
            let prefix = lock_key[..=slash].to_vec();
            let txn = Txn::new()
                .when([
                    Compare::create_revision(lock_key.to_vec(), CompareOp::Equal, token.get()),
                    Compare::create_revision(prefix, CompareOp::Greater, token.get() - 1)
                        .with_prefix(),
                ])
                .and_then([Op(baton_proto::etcdserverpb::RequestOp {
                    request: Some(baton_proto::etcdserverpb::request_op::Request::RequestPut(
                        put,
                    )),
                })]);
            let resp = client.txn(txn).await?;
            if !resp.succeeded {
                return Err(rejected);
            }
            let header = resp.header;
            Ok(
                match resp.responses.into_iter().next().and_then(|r| r.response) {
                    Some(baton_proto::etcdserverpb::response_op::Response::ResponsePut(p)) => p,
                    _ => PutResponse {
                        header,
                        prev_kv: None,
                    },
                },
            )
        }
        _ => {
            let req = bpb::FencedPutRequest {
                lock_key: lock_key.to_vec(),
                fencing_token: token.get(),
                put: Some(put),
            };
            let id = client.next_request_id();
            let r = client
                .call(
                    "baton.v1.Lock/FencedPut",
                    Retry::Once,
                    Deadline::Default,
                    |ch, t| {
                        let r = write_request(req.clone(), t, id);
                        async move { LockClient::new(ch).fenced_put(r).await }
                    },
                )
                .await;
            match r {
                Ok(resp) => Ok(resp.put.unwrap_or(PutResponse {
                    header: resp.header,
                    prev_kv: None,
                })),
                Err(Error::Server {
                    code: Code::FailedPrecondition,
                    message,
                }) if message.contains("fencing token rejected") => Err(rejected),
                Err(e) => Err(e),
            }
        }
    }
}

/// The answer of [`FenceGate::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceCheck {
    /// Whether the token was accepted (it is at least the highest seen, and now is it).
    pub accepted: bool,
    /// The highest token the gate has recorded for the resource after this check.
    pub highest_token: FencingToken,
}

/// Baton's fence gate (`baton.v1.Fence`), for resources that cannot check tokens
/// themselves: Baton keeps the highest token seen per resource name, replicated, and
/// accepts a token only if it is at least that high.
///
/// The gate must sit on the **resource's side**, inside whatever serializes its writes
/// (the one process owning a device, a proxy in front of a file server): take the
/// resource's own write lock, [`FenceGate::check`], write only if accepted, release. A
/// client that checks and *then* writes reopens the gap a pause can slip through. A new
/// holder should also check on its first read, so older tokens are refused from then on.
///
/// Not available on etcd ([`Error::Unsupported`]).
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, Error, FenceGate, FencingToken};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let gate = FenceGate::new(&client);
/// let token = FencingToken::new;
/// assert!(gate.check("printer-1", token(7)).await?.accepted);
/// assert!(gate.check("printer-1", token(7)).await?.accepted); // the same holder again
/// let stale = gate.check("printer-1", token(5)).await?;
/// assert_eq!((stale.accepted, stale.highest_token), (false, token(7)));
/// assert!(matches!(
///     gate.admit("printer-1", token(6)).await,
///     Err(Error::FencingTokenRejected { .. })
/// ));
/// # Ok(()) });
/// ```
///
/// **Signed tokens.** Configured with the cluster's public keys
/// ([`FenceGate::with_public_keys`], from [`Client::fence_public_keys`] or
/// `baton fence public-key`), the gate accepts only tokens whose signature verifies
/// ([`FenceGate::check_signed`] with a [`Guard::signed_token`]): a forged or altered token
/// is refused with [`Error::InvalidFencingSignature`] *before* Baton is asked, so it raises
/// no one's highest token. A plain [`FenceGate::check`] is then refused too (unsigned).
#[derive(Debug, Clone)]
pub struct FenceGate {
    client: Client,
    keys: Option<PublicKeys>,
}

impl FenceGate {
    /// A gate client.
    pub fn new(client: &Client) -> FenceGate {
        FenceGate {
            client: client.clone(),
            keys: None,
        }
    }

    /// Only validly signed tokens pass from now on (see the type's docs).
    pub fn with_public_keys(mut self, keys: PublicKeys) -> FenceGate {
        self.keys = Some(keys);
        self
    }

    /// [`FenceGate::check`] of a signed token: with public keys configured its signature
    /// is verified first, and a token that does not verify is refused without calling
    /// Baton ([`Error::InvalidFencingSignature`]).
    pub async fn check_signed(
        &self,
        resource: impl Into<Vec<u8>>,
        token: &SignedToken,
    ) -> Result<FenceCheck> {
        if let Some(keys) = &self.keys {
            token.verify(keys).map_err(Error::InvalidFencingSignature)?;
        }
        self.ask(resource.into(), token.token).await
    }

    /// [`FenceGate::check_signed`] as a `Result`, like [`FenceGate::admit`].
    pub async fn admit_signed(
        &self,
        resource: impl Into<Vec<u8>>,
        token: &SignedToken,
    ) -> Result<()> {
        let c = self.check_signed(resource, token).await?;
        if c.accepted {
            Ok(())
        } else {
            Err(Error::FencingTokenRejected {
                token: token.token,
                highest: Some(c.highest_token),
            })
        }
    }

    /// Records `token` for `resource` if it is at least the highest seen; says whether it
    /// was accepted and what the highest now is. Repeating a check is harmless, so it is
    /// retried on failover.
    ///
    /// With public keys configured a bare token proves nothing, so it is refused
    /// ([`Error::InvalidFencingSignature`] with [`VerifyError::Unsigned`]) without calling
    /// Baton: use [`FenceGate::check_signed`].
    pub async fn check(
        &self,
        resource: impl Into<Vec<u8>>,
        token: FencingToken,
    ) -> Result<FenceCheck> {
        if self.keys.is_some() {
            return Err(Error::InvalidFencingSignature(VerifyError::Unsigned));
        }
        self.ask(resource.into(), token).await
    }

    async fn ask(&self, resource: Vec<u8>, token: FencingToken) -> Result<FenceCheck> {
        if self.client.server_kind().await? == ServerKind::Etcd {
            return Err(Error::Unsupported("the fence gate (baton.v1.Fence)"));
        }
        let req = bpb::FenceCheckRequest {
            resource,
            fencing_token: token.get(),
        };
        let id = self.client.next_request_id();
        let resp = self
            .client
            .call(
                "baton.v1.Fence/Check",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = write_request(req.clone(), t, id);
                    async move { FenceClient::new(ch).check(r).await }
                },
            )
            .await?;
        Ok(FenceCheck {
            accepted: resp.accepted,
            highest_token: FencingToken::new(resp.highest_token),
        })
    }

    /// [`FenceGate::check`] as a `Result`: `Ok` if accepted, otherwise
    /// [`Error::FencingTokenRejected`] with the highest token seen.
    pub async fn admit(&self, resource: impl Into<Vec<u8>>, token: FencingToken) -> Result<()> {
        let c = self.check(resource, token).await?;
        if c.accepted {
            Ok(())
        } else {
            Err(Error::FencingTokenRejected {
                token,
                highest: Some(c.highest_token),
            })
        }
    }
}

impl LockOptions {
    pub(crate) fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
    pub(crate) fn is_try_only(&self) -> bool {
        self.try_only
    }
    pub(crate) fn lock_delay(&self) -> Option<Duration> {
        self.lock_delay
    }
}
