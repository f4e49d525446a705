//! The lock workloads: contended handoff and uncontended cycles.
//!
//! Every contender has the shape of etcd's own Go recipe (`concurrency.NewSession` +
//! `NewMutex` + `Lock`/`Unlock`), which is how people actually use etcd locks: its own
//! connection and its own session, i.e. a lease kept alive in the background, then a closed loop
//! of lock, empty critical section, unlock. The locking itself goes through a server-side
//! lock API rather than the client-side recipe (Txn + Range + Watch), so that both servers are
//! measured on one RPC per acquire:
//!
//! - `v3lock`: etcd's `v3lockpb.Lock/Lock` and `Unlock`, through the `etcd-client` crate. In
//!   etcd 3.4 this service runs the Go recipe inside the server, so it is exactly the recipe's
//!   behaviour, including its handoff latency.
//! - `baton.v1`: Baton's own `Lock/Acquire` and `Release`, which etcd does not have. Those rows
//!   are compared with etcd's v3lock rows, the closest thing an etcd user has.
//!
//! What is measured is the *handoff* (how soon the next waiter learns that the lock is free)
//! when contenders share one lock, and the plain cost of an acquire plus a release when they
//! do not. The critical section is empty on purpose: any work inside it would only add a
//! constant to both servers and hide the handoff.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use baton_proto::baton::v1::lock_client::LockClient as BatonLockClient;
use baton_proto::baton::v1::{AcquireRequest, ReleaseRequest};
use etcd_client::{Client, LeaseClient, LockOptions};
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use crate::workload::{self, LoadConfig, RunResult, Tally, REQUEST_TIMEOUT};

/// Request timeout on the contenders' connections. A Lock legitimately blocks while the queue
/// ahead of it drains: with 50 contenders and etcd's ~100 ms handoff that is about 5 s, so the
/// ordinary 10 s request timeout would be too close. Waits never outlive the measurement
/// window anyway (see [`Contender::run`]); this only bounds a wedged server.
const LOCK_WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Numbers the runs so every run locks names of its own: nothing a previous run left behind
/// (a key whose lease has not been revoked yet, say) can queue ahead of this run's contenders.
static RUN_ID: AtomicU64 = AtomicU64::new(0);

/// Which server-side lock API a workload uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockApi {
    /// etcd's `v3lockpb.Lock` service (Lock, Unlock), served by both etcd and Baton.
    V3Lock,
    /// Baton's `baton.v1.Lock` service (Acquire, Release), Baton only.
    BatonV1,
}

impl fmt::Display for LockApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockApi::V3Lock => "v3lock",
            LockApi::BatonV1 => "baton.v1",
        })
    }
}

/// A lock workload: which API, how many contenders, spread over how many locks (contender `i`
/// uses lock `i % locks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockShape {
    pub api: LockApi,
    pub contenders: usize,
    pub locks: usize,
}

impl LockShape {
    /// The table label, e.g. `lock handoff, 10 contenders / 1 lock (v3lock)`.
    pub fn label(&self) -> String {
        let (what, locks) = if self.locks == 1 {
            ("lock handoff", "1 lock".to_string())
        } else {
            ("lock cycles", format!("{} locks", self.locks))
        };
        format!(
            "{what}, {} contenders / {locks} ({})",
            self.contenders, self.api
        )
    }
}

/// Runs one lock workload against `endpoint`: opens every contender's session, then lets them
/// loop through lock/unlock cycles for the warm-up and the measured window.
///
/// A cycle counts when its unlock completes inside the window, and the latency recorded for it
/// is its acquire latency (Lock sent → Lock answered, i.e. time spent queued plus the handoff),
/// so `ops` is the number of cycles completed and `ops_per_sec` the cycle rate.
pub async fn run(endpoint: &str, shape: LockShape, cfg: &LoadConfig) -> Result<RunResult> {
    let run_id = RUN_ID.fetch_add(1, Ordering::Relaxed);
    let locks: Vec<Arc<LockState>> = (0..shape.locks)
        .map(|i| Arc::new(LockState::new(format!("baton-bench/lock/{run_id}/{i}"))))
        .collect();
    // Sessions are opened up front and concurrently: connecting and granting 50 leases is
    // setup, not part of what is measured.
    let contenders = futures::future::try_join_all(
        (0..shape.contenders).map(|_| Contender::open(endpoint, shape.api, cfg.lock_ttl)),
    )
    .await
    .context("opening the contenders' sessions")?;

    let window_start = Instant::now() + cfg.warmup;
    let window_end = window_start + cfg.lock_duration;
    let tasks: Vec<_> = contenders
        .into_iter()
        .enumerate()
        .map(|(i, contender)| {
            let lock = Arc::clone(&locks[i % shape.locks]);
            tokio::spawn(contender.run(lock, window_start, window_end))
        })
        .collect();
    let mut total = Tally::new();
    for task in futures::future::join_all(tasks).await {
        total.merge(task.context("a contender task panicked")??)?;
    }
    total.summarize(cfg.lock_duration)
}

/// Checks whether `endpoint` serves `api` with one lock/unlock cycle. `Ok(None)`: it does.
/// `Ok(Some(why))`: the server answered UNIMPLEMENTED (Baton while its lock service is not
/// there yet), so the caller can skip those runs with a note rather than fail the whole
/// benchmark. Any other failure is an error.
pub async fn probe(endpoint: &str, api: LockApi, ttl: Duration) -> Result<Option<String>> {
    let mut contender = Contender::open(endpoint, api, ttl).await?;
    let name = format!("baton-bench/lock/probe-{api}");
    let cycle = async {
        let held = tokio::time::timeout(REQUEST_TIMEOUT, contender.acquire(name.as_bytes()))
            .await
            .map_err(|_| anyhow!("{api} lock on a free lock took over {REQUEST_TIMEOUT:?}"))??;
        contender.release(held).await
    }
    .await;
    let closed = contender.close().await;
    match cycle {
        Ok(()) => closed.map(|()| None),
        Err(e) if is_unimplemented(&e) => Ok(Some(format!("{e:#}"))),
        Err(e) => Err(e.context(format!("a trial {api} lock/unlock"))),
    }
}

/// Whether a failure is a gRPC UNIMPLEMENTED status, however it is wrapped.
fn is_unimplemented(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let status = cause.downcast_ref::<tonic::Status>().or_else(|| {
            match cause.downcast_ref::<etcd_client::Error>() {
                Some(etcd_client::Error::GRpcStatus(status)) => Some(status),
                _ => None,
            }
        });
        status.is_some_and(|s| s.code() == tonic::Code::Unimplemented)
    })
}

/// One lock as the contenders see it, with a cheap client-side check that the lock does its
/// job: a benchmark of a lock that lets two holders in at once would be measuring nothing.
struct LockState {
    name: String,
    /// Set between a contender's acquire response and the moment it sends its release. A
    /// holder clears it *before* sending the release, and the next holder can only be granted
    /// after that release, so finding it already set means two holders at once.
    held: AtomicBool,
    /// The highest fencing token seen (baton.v1 only).
    highest_token: AtomicI64,
}

impl LockState {
    fn new(name: String) -> LockState {
        LockState {
            name,
            held: AtomicBool::new(false),
            highest_token: AtomicI64::new(0),
        }
    }

    fn enter(&self, held: &Held) -> Result<()> {
        if self.held.swap(true, Ordering::SeqCst) {
            bail!(
                "mutual exclusion violated: {} was granted while another contender held it",
                self.name
            );
        }
        if let Some(token) = held.token {
            // Lower is a violation. Equal is only possible when a contender's own key is
            // granted again (after a failed release), since every key has its own revision.
            let previous = self.highest_token.fetch_max(token, Ordering::SeqCst);
            if token < previous {
                bail!(
                    "fencing token {token} for {} is below an earlier holder's {previous}",
                    self.name
                );
            }
        }
        Ok(())
    }

    fn leave(&self) {
        self.held.store(false, Ordering::SeqCst);
    }
}

/// A granted lock: the holder's key and, on baton.v1, its fencing token.
struct Held {
    key: Vec<u8>,
    token: Option<i64>,
}

/// How a contender talks to the lock service.
enum LockConn {
    /// Through its etcd-client `Client` (the same connection as its session).
    V3Lock,
    /// Through a generated baton.v1 client on a second connection of its own: etcd-client
    /// cannot share its connection with other gRPC clients, and the session connection carries
    /// only a keep-alive every few seconds.
    BatonV1(BatonLockClient<Channel>),
}

/// One contender: its own connection(s) and its own session (lease + background keep-alive).
struct Contender {
    client: Client,
    lock: LockConn,
    lease: i64,
    keep_alive: JoinHandle<Result<()>>,
}

impl Contender {
    async fn open(endpoint: &str, api: LockApi, ttl: Duration) -> Result<Contender> {
        let mut client = workload::connect_with_timeout(endpoint, LOCK_WAIT_TIMEOUT).await?;
        let lock = match api {
            LockApi::V3Lock => LockConn::V3Lock,
            LockApi::BatonV1 => {
                let channel = Endpoint::from_shared(format!("http://{endpoint}"))
                    .context("the baton.v1 endpoint URL")?
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(LOCK_WAIT_TIMEOUT)
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .with_context(|| format!("connecting to {endpoint} for baton.v1"))?;
                LockConn::BatonV1(BatonLockClient::new(channel))
            }
        };
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).context("--lock-ttl-secs")?;
        let lease = client
            .lease_grant(ttl_secs, None)
            .await
            .context("granting the session lease")?
            .id();
        let keep_alive = tokio::spawn(keep_alive(client.lease_client(), lease, ttl));
        Ok(Contender {
            client,
            lock,
            lease,
            keep_alive,
        })
    }

    /// The closed loop: lock, empty critical section, unlock, until the window closes; then
    /// closes the session.
    async fn run(
        mut self,
        lock: Arc<LockState>,
        window_start: Instant,
        window_end: Instant,
    ) -> Result<Tally> {
        let mut tally = Tally::new();
        let deadline = tokio::time::Instant::from_std(window_end);
        loop {
            let sent = Instant::now();
            if sent >= window_end {
                break;
            }
            let acquired = tokio::select! {
                acquired = self.acquire(lock.name.as_bytes()) => acquired,
                // A contender still queued when the window closes gives up: its cycle could
                // no longer count, and waiting out a 50-deep queue on etcd takes seconds. Its
                // key goes when `close` revokes the session's lease.
                () = tokio::time::sleep_until(deadline) => break,
            };
            let held = match acquired {
                Ok(held) => held,
                Err(e) => {
                    tally.error(&e);
                    // A server that fails fast would otherwise be hammered in a tight loop.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let got = Instant::now();
            if let Err(e) = lock.enter(&held) {
                tally.error(&e);
            }
            // The critical section: empty.
            lock.leave();
            let released = self.release(held).await;
            let done = Instant::now();
            match released {
                Ok(()) if done >= window_start && done <= window_end => tally.record(got - sent),
                Ok(()) => {}
                Err(e) => {
                    tally.error(&e);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        if let Err(e) = self.close().await {
            tally.error(&e);
        }
        Ok(tally)
    }

    async fn acquire(&mut self, name: &[u8]) -> Result<Held> {
        match &mut self.lock {
            LockConn::V3Lock => {
                let options = LockOptions::new().with_lease(self.lease);
                let resp = self
                    .client
                    .lock(name, Some(options))
                    .await
                    .context("v3lock Lock")?;
                Ok(Held {
                    key: resp.key().to_vec(),
                    token: None,
                })
            }
            LockConn::BatonV1(client) => {
                let resp = client
                    .acquire(AcquireRequest {
                        name: name.to_vec(),
                        lease: self.lease,
                        timeout_ms: 0,
                        try_only: false,
                        lock_delay_ms: 0,
                    })
                    .await
                    .context("baton.v1 Acquire")?
                    .into_inner();
                Ok(Held {
                    key: resp.key,
                    token: Some(resp.fencing_token),
                })
            }
        }
    }

    async fn release(&mut self, held: Held) -> Result<()> {
        // Unlike Lock, a release never waits for anyone, so it gets the ordinary timeout.
        let release = async {
            match &mut self.lock {
                LockConn::V3Lock => {
                    self.client
                        .unlock(held.key)
                        .await
                        .context("v3lock Unlock")?;
                }
                LockConn::BatonV1(client) => {
                    client
                        .release(ReleaseRequest {
                            key: held.key,
                            fencing_token: held.token.unwrap_or_default(),
                        })
                        .await
                        .context("baton.v1 Release")?;
                }
            }
            Ok(())
        };
        tokio::time::timeout(REQUEST_TIMEOUT, release)
            .await
            .map_err(|_| anyhow!("release took over {REQUEST_TIMEOUT:?}"))?
    }

    /// Ends the session the way Go's `Session.Close` does: stop the keep-alive and revoke the
    /// lease, which also deletes the contender's lock key if it is still queued or holding.
    /// Reports a keep-alive that failed during the run, since a session that lapsed would
    /// make the run's numbers suspect.
    async fn close(mut self) -> Result<()> {
        let keep_alive = if self.keep_alive.is_finished() {
            Some(self.keep_alive.await)
        } else {
            self.keep_alive.abort();
            None
        };
        let revoked = tokio::time::timeout(REQUEST_TIMEOUT, self.client.lease_revoke(self.lease))
            .await
            .map_err(|_| anyhow!("revoking the session lease took over {REQUEST_TIMEOUT:?}"))
            .and_then(|r| r.context("revoking the session lease"));
        if let Some(keep_alive) = keep_alive {
            keep_alive
                .context("the keep-alive task panicked")?
                .context("keeping the session lease alive")?;
        }
        revoked.map(drop)
    }
}

/// Keeps lease `id` alive until aborted, renewing every third of its TTL like Go's clientv3
/// does. Returns only on failure.
async fn keep_alive(mut lease: LeaseClient, id: i64, ttl: Duration) -> Result<()> {
    let (mut keeper, mut responses) = lease
        .keep_alive(id)
        .await
        .context("opening the keep-alive stream")?;
    loop {
        match responses.message().await.context("lease keep-alive")? {
            Some(resp) if resp.ttl() > 0 => {}
            Some(_) => bail!("lease {id:x} expired"),
            None => bail!("the server closed the keep-alive stream"),
        }
        tokio::time::sleep(ttl / 3).await;
        keeper.keep_alive().await.context("lease keep-alive")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        let shape = |api, contenders, locks| LockShape {
            api,
            contenders,
            locks,
        };
        assert_eq!(
            shape(LockApi::V3Lock, 10, 1).label(),
            "lock handoff, 10 contenders / 1 lock (v3lock)"
        );
        assert_eq!(
            shape(LockApi::BatonV1, 50, 50).label(),
            "lock cycles, 50 contenders / 50 locks (baton.v1)"
        );
    }

    #[test]
    fn unimplemented_is_found_through_wrapping() {
        let status = tonic::Status::unimplemented("no");
        let e = anyhow::Error::new(etcd_client::Error::GRpcStatus(status.clone()))
            .context("v3lock Lock");
        assert!(is_unimplemented(&e));
        assert!(is_unimplemented(
            &anyhow::Error::new(status).context("baton.v1 Acquire")
        ));
        let other = anyhow::Error::new(tonic::Status::unavailable("down"));
        assert!(!is_unimplemented(&other));
    }

    #[test]
    fn lock_state_catches_two_holders_and_lower_tokens() {
        let lock = LockState::new("l".into());
        let held = |token| Held { key: vec![], token };
        lock.enter(&held(Some(5))).unwrap();
        assert!(lock.enter(&held(Some(6))).is_err(), "second holder");
        lock.leave();
        lock.enter(&held(Some(7))).unwrap();
        lock.leave();
        assert!(lock.enter(&held(Some(6))).is_err(), "token went down");
        lock.leave();
        lock.enter(&held(None)).unwrap();
    }
}
