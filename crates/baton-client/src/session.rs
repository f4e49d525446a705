//! Sessions: a lease kept alive in the background, with a local, pessimistic estimate of
//! when the server could expire it, so that losing it is noticed *before* anyone else can
//! be granted what it held.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::{Client, Deadline};
use crate::error::{Error, Result};
use crate::lost::LostReason;
use crate::util::{backoff, AbortOnDrop};

/// Settings of a [`Session`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SessionOptions {
    /// The lease TTL asked for (rounded up to whole seconds; the server may raise it to its
    /// minimum, 2 s on Baton and etcd 3.4 with default settings). Short means a crashed
    /// holder is replaced quickly; long means pauses and network hiccups rarely cost the
    /// lease. Default 10 s.
    pub ttl: Duration,
    /// ρ, the bound on how much faster this machine's monotonic clock may run than the
    /// server's over one TTL: the local estimate uses `TTL × (1 − ρ)`. Default 0.01 (1 %,
    /// far above real crystal drift, within reach of a badly slewed VM clock).
    pub clock_drift: f64,
    /// Subtracted from the estimate on top of ρ, so `lost()` fires this long before the
    /// earliest moment the server could expire the lease: room for the notification to be
    /// acted on. Default 100 ms.
    pub margin: Duration,
    /// How often to renew; `None` (default): every TTL/3, so one lost keep-alive is not yet
    /// a loss.
    pub keep_alive_interval: Option<Duration>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: Duration::from_secs(10),
            clock_drift: 0.01,
            margin: Duration::from_millis(100),
            keep_alive_interval: None,
        }
    }
}

impl SessionOptions {
    /// The defaults (10 s TTL, ρ = 0.01, 100 ms margin, keep-alive every TTL/3).
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets [`SessionOptions::ttl`].
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// Sets [`SessionOptions::clock_drift`] (ρ).
    pub fn with_clock_drift(mut self, rho: f64) -> Self {
        self.clock_drift = rho;
        self
    }
    /// Sets [`SessionOptions::margin`].
    pub fn with_margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }
    /// Sets [`SessionOptions::keep_alive_interval`].
    pub fn with_keep_alive_interval(mut self, every: Duration) -> Self {
        self.keep_alive_interval = Some(every);
        self
    }
}

/// How sure the session is that its lease is alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// The last keep-alive was acknowledged recently.
    Alive,
    /// A keep-alive failed or is overdue (not acknowledged within 1.5 keep-alive intervals
    /// of the previous acknowledged one's send time), but the local expiry estimate has not
    /// passed: the lease is still surely alive, and may not be for long. Stop starting new
    /// work; finish or checkpoint what runs.
    Uncertain,
    /// The lease is, or may already be, gone: the estimate passed without an
    /// acknowledgement, the server answered TTL 0, or the session was closed.
    Expired,
}

/// A lease kept alive in the background, with a local expiry estimate and a loss signal.
///
/// Every TTL/3 the session renews its lease. Each acknowledged keep-alive moves the local
/// estimate of the lease's end to `send time + TTL × (1 − ρ) − margin`, measured on the
/// monotonic clock from when the request *left*: the server renewed the lease no earlier
/// than that, so its deadline is at least `send time + TTL` in real time, and ρ covers
/// clocks running at slightly different rates. If the estimate passes without a newer
/// acknowledgement, [`Session::lost`] fires — before the server could expire the lease and
/// grant anything held with it to someone else. A keep-alive answered with TTL 0 fires it
/// at once.
///
/// Nothing on this machine can stop a process that is *paused* (GC, SIGSTOP, a frozen VM)
/// from acting late; that is what fencing tokens are for (see [`crate::Guard`]).
///
/// Clones share the session. When the last clone is dropped, the keep-alives stop and the
/// lease is revoked in the background (best effort; otherwise it expires).
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use std::time::Duration;
/// use baton_client::{Client, ClientConfig, Session, SessionOptions, SessionState};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let session = Session::new(&client, SessionOptions::new().with_ttl(Duration::from_secs(5))).await?;
/// assert_eq!(session.state(), SessionState::Alive);
/// let lost = session.lost(); // a future: await it (or select on it) next to your work
/// session.close().await?;
/// assert_eq!(lost.await, baton_client::LostReason::Closed);
/// # Ok(()) });
/// ```
#[derive(Clone)]
pub struct Session {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &format_args!("{:x}", self.handle.shared.lease))
            .field("state", &self.state())
            .finish()
    }
}

struct Handle {
    shared: Arc<Shared>,
    _task: AbortOnDrop,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.lose(LostReason::Closed);
        // Revoke even after a local expiry: if the server still has the lease (this process
        // was paused, say), revoking lets the next holder in now rather than at its expiry.
        if !self
            .shared
            .revoked
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let client = self.shared.client.clone();
            let lease = self.shared.lease;
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = client.lease_revoke(lease).await;
                });
            }
        }
    }
}

struct Shared {
    client: Client,
    lease: i64,
    rho: f64,
    margin: Duration,
    fixed_interval: Option<Duration>,
    timing: std::sync::Mutex<Timing>,
    lost: watch::Sender<Option<LostReason>>,
    /// Set once a revoke was sent (by `close` or the drop).
    revoked: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Clone, Copy)]
struct Timing {
    ttl: Duration,
    interval: Duration,
    last_ack_send: Instant,
    expires_at: Instant,
    failing: bool,
}

impl Shared {
    /// Records the loss (the first reason wins); whether this call recorded it.
    fn lose(&self, reason: LostReason) -> bool {
        self.lost.send_if_modified(|v| {
            if v.is_none() {
                *v = Some(reason);
                true
            } else {
                false
            }
        })
    }

    fn timing(&self) -> Timing {
        *self.timing.lock().expect("poisoned")
    }

    /// A keep-alive sent at `sent` was acknowledged with `ttl_s`.
    fn acknowledged(&self, sent: Instant, ttl_s: i64) {
        let ttl = Duration::from_secs(ttl_s.max(0) as u64);
        let mut t = self.timing.lock().expect("poisoned");
        if sent < t.last_ack_send {
            return;
        }
        t.ttl = ttl;
        t.interval = self.fixed_interval.unwrap_or(ttl / 3);
        t.last_ack_send = sent;
        t.expires_at = sent + estimate(ttl, self.rho, self.margin);
        t.failing = false;
    }
}

/// `TTL × (1 − ρ) − margin`.
fn estimate(ttl: Duration, rho: f64, margin: Duration) -> Duration {
    ttl.mul_f64(1.0 - rho).saturating_sub(margin)
}

impl Session {
    /// Grants a lease with `opts.ttl` and starts keeping it alive.
    pub async fn new(client: &Client, opts: SessionOptions) -> Result<Session> {
        check(&opts)?;
        let sent = Instant::now();
        let resp = client.lease_grant(opts.ttl).await?;
        if !resp.error.is_empty() {
            return Err(Error::Server {
                code: tonic::Code::Unknown,
                message: resp.error,
            });
        }
        Self::start(client, resp.id, sent, resp.ttl, opts)
    }

    /// Adopts an existing lease (e.g. one granted by another tool): renews it once, then
    /// keeps it alive like [`Session::new`]. Fails with [`Error::SessionLost`] if it is gone.
    pub async fn attach(client: &Client, lease: i64, opts: SessionOptions) -> Result<Session> {
        check(&opts)?;
        let sent = Instant::now();
        let ttl = client.lease_keep_alive_once(lease).await?;
        if ttl <= 0 {
            return Err(Error::SessionLost(LostReason::LeaseExpired));
        }
        Self::start(client, lease, sent, ttl, opts)
    }

    fn start(
        client: &Client,
        lease: i64,
        sent: Instant,
        ttl_s: i64,
        opts: SessionOptions,
    ) -> Result<Session> {
        let ttl = Duration::from_secs(ttl_s.max(1) as u64);
        let interval = opts.keep_alive_interval.unwrap_or(ttl / 3);
        let span = estimate(ttl, opts.clock_drift, opts.margin);
        if span <= interval {
            let c = client.clone();
            tokio::spawn(async move { c.lease_revoke(lease).await });
            return Err(Error::Config(format!(
                "a {ttl:?} lease renewed every {interval:?} leaves no room: TTL × (1 − ρ) − \
                 margin = {span:?} must exceed the keep-alive interval"
            )));
        }
        let (lost, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            client: client.clone(),
            lease,
            rho: opts.clock_drift,
            margin: opts.margin,
            fixed_interval: opts.keep_alive_interval,
            timing: std::sync::Mutex::new(Timing {
                ttl,
                interval,
                last_ack_send: sent,
                expires_at: sent + span,
                failing: false,
            }),
            lost,
            revoked: std::sync::atomic::AtomicBool::new(false),
        });
        let task = tokio::spawn(keep_alive(shared.clone()));
        Ok(Session {
            handle: Arc::new(Handle {
                shared,
                _task: AbortOnDrop(task),
            }),
        })
    }

    /// The lease id.
    pub fn lease(&self) -> i64 {
        self.handle.shared.lease
    }

    /// The client the session uses.
    pub fn client(&self) -> &Client {
        &self.handle.shared.client
    }

    /// The TTL the server granted (at the last acknowledgement).
    pub fn ttl(&self) -> Duration {
        self.handle.shared.timing().ttl
    }

    /// The local expiry estimate: the session counts as lost from this instant on unless a
    /// keep-alive sent before it is acknowledged.
    pub fn expires_at(&self) -> std::time::Instant {
        self.handle.shared.timing().expires_at.into_std()
    }

    /// Time left until [`Session::expires_at`] (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.handle
            .shared
            .timing()
            .expires_at
            .saturating_duration_since(Instant::now())
    }

    /// The current state, computed from the clock (so it is exact even between the
    /// background task's wake-ups).
    pub fn state(&self) -> SessionState {
        let s = &self.handle.shared;
        if s.lost.borrow().is_some() {
            return SessionState::Expired;
        }
        let t = s.timing();
        let now = Instant::now();
        if now >= t.expires_at {
            SessionState::Expired
        } else if t.failing || now >= t.last_ack_send + t.interval + t.interval / 2 {
            SessionState::Uncertain
        } else {
            SessionState::Alive
        }
    }

    /// Why the session was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        *self.handle.shared.lost.borrow()
    }

    /// A future that completes when the session is lost, with the reason. It does not
    /// borrow the session: hand it to the task doing the guarded work and `select!` on it.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        wait_lost(self.handle.shared.lost.subscribe())
    }

    /// Stops the keep-alives and revokes the lease (deleting every key attached to it, so
    /// everything held with this session is released). `lost()` fires with
    /// [`LostReason::Closed`].
    pub async fn close(&self) -> Result<()> {
        self.handle._task.0.abort();
        self.handle.shared.lose(LostReason::Closed);
        self.handle
            .shared
            .revoked
            .store(true, std::sync::atomic::Ordering::Release);
        self.handle.shared.client.lease_revoke(self.lease()).await
    }
}

fn check(opts: &SessionOptions) -> Result<()> {
    if !(0.0..0.5).contains(&opts.clock_drift) {
        return Err(Error::Config(format!(
            "clock_drift (ρ) must be in [0, 0.5), got {}",
            opts.clock_drift
        )));
    }
    if opts.ttl.is_zero() {
        return Err(Error::Config("the session TTL must be positive".into()));
    }
    Ok(())
}

/// Completes with the loss reason once one is recorded.
pub(crate) async fn wait_lost(mut rx: watch::Receiver<Option<LostReason>>) -> LostReason {
    match rx.wait_for(Option::is_some).await {
        Ok(v) => v.unwrap_or(LostReason::Closed),
        // The sender went away without a reason: the owner is gone.
        Err(_) => LostReason::Closed,
    }
}

/// The background task: renew every interval until the estimate passes without an
/// acknowledgement or the server says the lease is gone.
async fn keep_alive(shared: Arc<Shared>) {
    let mut next_send = {
        let t = shared.timing();
        t.last_ack_send + t.interval
    };
    let mut failures = 0u32;
    loop {
        let t = shared.timing();
        let request_timeout = shared.client.config().request_timeout;
        let attempt = async {
            tokio::time::sleep_until(next_send).await;
            let sent = Instant::now();
            // Waiting past the estimate is pointless: the loss fires then anyway.
            let left = t
                .expires_at
                .saturating_duration_since(sent)
                .min(request_timeout)
                .max(Duration::from_millis(1));
            let r = shared
                .client
                .keep_alive_once(shared.lease, Deadline::After(left))
                .await;
            (sent, r)
        };
        tokio::select! {
            _ = tokio::time::sleep_until(t.expires_at) => {
                tracing::warn!(lease = %format_args!("{:x}", shared.lease),
                    "session lost: no keep-alive acknowledged before the local expiry estimate");
                shared.lose(LostReason::KeepAliveDeadline);
                return;
            }
            (sent, r) = attempt => match r {
                Ok(ttl) if ttl > 0 => {
                    shared.acknowledged(sent, ttl);
                    failures = 0;
                    next_send = sent + shared.timing().interval;
                }
                Ok(_) | Err(Error::SessionLost(_)) => {
                    tracing::warn!(lease = %format_args!("{:x}", shared.lease),
                        "session lost: the lease expired or was revoked");
                    shared.lose(LostReason::LeaseExpired);
                    return;
                }
                Err(e) => {
                    failures += 1;
                    tracing::debug!(error = %e, "keep-alive failed; retrying");
                    shared.timing.lock().expect("poisoned").failing = true;
                    let cap = (t.interval / 2).max(Duration::from_millis(20));
                    next_send = Instant::now()
                        + backoff(failures, Duration::from_millis(50), cap);
                }
            }
        }
    }
}
