//! lock and election-handoff on the generated clients: v3lock `Lock`/`Unlock` and
//! v3election `Campaign`/`Resign`, served by etcd and Baton alike.
//!
//! Every contender has the shape of etcd's Go recipe (`concurrency.NewSession` + `NewMutex`
//! or `NewElection`): its own connection and session (a lease kept alive every TTL/3), then a
//! closed loop of acquire, empty critical section, release. A cycle counts when its release
//! completes inside the window; its latency is the acquire (sent → granted, queueing
//! included). A contender still queued when the window closes gives up; every session is then
//! revoked, which deletes any key left behind. Each run uses fresh names.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use baton_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, ResignRequest, ResignResponse,
};
use baton_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use serde::Serialize;

use crate::engine::{Counter, CpuWindow, Progress, RunResult, Tally, Window, REQUEST_TIMEOUT};
use crate::grpc::H2Conn;
use crate::session::Session;

const LOCK: &str = "/v3lockpb.Lock/Lock";
const UNLOCK: &str = "/v3lockpb.Lock/Unlock";
const CAMPAIGN: &str = "/v3electionpb.Election/Campaign";
const RESIGN: &str = "/v3electionpb.Election/Resign";

static RUN_ID: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug, Serialize)]
pub struct LockLoad {
    pub contenders: usize,
    /// Contender `i` uses lock `i % locks`: 1 is a contended lock, `contenders` distinct ones.
    pub locks: usize,
    pub ttl_secs: u64,
}

impl LockLoad {
    pub fn label(&self) -> String {
        if self.locks == 1 {
            format!("lock handoff, {} contenders / 1 lock", self.contenders)
        } else {
            format!(
                "lock cycles, {} contenders / {} locks",
                self.contenders, self.locks
            )
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct ElectionLoad {
    pub contenders: usize,
    pub ttl_secs: u64,
}

#[derive(Clone, Copy)]
enum Api {
    Lock,
    Election,
}

/// One lock (or election) as its contenders see it, with a check that it does its job: set
/// between a grant and the release being sent; finding it set means two holders at once.
struct Mutex {
    name: Vec<u8>,
    held: AtomicBool,
}

pub async fn run_lock(
    endpoints: &[String],
    load: &LockLoad,
    warmup: Duration,
    duration: Duration,
    progress: bool,
) -> Result<RunResult> {
    run(
        endpoints,
        Api::Lock,
        load.contenders,
        load.locks,
        load.ttl_secs,
        load.label(),
        warmup,
        duration,
        progress,
    )
    .await
}

pub async fn run_election(
    endpoints: &[String],
    load: &ElectionLoad,
    warmup: Duration,
    duration: Duration,
    progress: bool,
) -> Result<RunResult> {
    let label = format!("election handoff, {} contenders", load.contenders);
    run(
        endpoints,
        Api::Election,
        load.contenders,
        1,
        load.ttl_secs,
        label,
        warmup,
        duration,
        progress,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn run(
    endpoints: &[String],
    api: Api,
    contenders: usize,
    locks: usize,
    ttl_secs: u64,
    label: String,
    warmup: Duration,
    duration: Duration,
    progress: bool,
) -> Result<RunResult> {
    let run_id = RUN_ID.fetch_add(1, Ordering::Relaxed);
    let kind = match api {
        Api::Lock => "lock",
        Api::Election => "election",
    };
    let mutexes: Vec<Arc<Mutex>> = (0..locks.max(1))
        .map(|i| {
            Arc::new(Mutex {
                name: format!("baton-bench/{kind}/{}-{run_id}/{i}", std::process::id())
                    .into_bytes(),
                held: AtomicBool::new(false),
            })
        })
        .collect();
    // Sessions are opened up front and concurrently: setup, not measured.
    let opened = futures::future::try_join_all((0..contenders).map(|i| {
        let endpoint = endpoints[i % endpoints.len()].clone();
        async move {
            let ch = H2Conn::connect(&endpoint).await?;
            let session = Session::open(ch.clone(), ttl_secs).await?;
            Ok::<_, anyhow::Error>((ch, session))
        }
    }))
    .await
    .context("opening the contenders' sessions")?;
    let window = Window::new(warmup, duration);
    let counter = Counter::default();
    let progress = Progress::start(
        label,
        "cycles",
        counter.clone(),
        warmup + duration,
        progress,
    );
    let cpu = CpuWindow::start(window, None);
    let tasks: Vec<_> = opened
        .into_iter()
        .enumerate()
        .map(|(i, (ch, session))| {
            let mutex = Arc::clone(&mutexes[i % mutexes.len()]);
            tokio::spawn(contender(api, ch, session, mutex, window, counter.clone()))
        })
        .collect();
    let mut total = Tally::new();
    for task in futures::future::join_all(tasks).await {
        total.merge(task.context("a contender task panicked")??)?;
    }
    progress.finish().await;
    let cpu = cpu.finish().await;
    let mut result = total.summarize(window.duration())?;
    result.client_cpu_us_per_op = cpu.map(|c| c * 1e6 / result.ops as f64);
    Ok(result)
}

enum Granted {
    Lock(Vec<u8>),
    Leader(LeaderKey),
}

async fn contender(
    api: Api,
    ch: H2Conn,
    session: Session,
    mutex: Arc<Mutex>,
    window: Window,
    counter: Counter,
) -> Result<Tally> {
    let mut tally = Tally::new();
    let deadline = tokio::time::Instant::from_std(window.close);
    loop {
        let sent = Instant::now();
        if sent >= window.close {
            break;
        }
        let acquire = async {
            Ok::<_, anyhow::Error>(match api {
                Api::Lock => Granted::Lock(
                    ch.unary::<_, LockResponse>(
                        LOCK,
                        &LockRequest {
                            name: mutex.name.clone(),
                            lease: session.lease,
                        },
                    )
                    .await
                    .context("v3lock Lock")?
                    .key,
                ),
                Api::Election => Granted::Leader(
                    ch.unary::<_, CampaignResponse>(
                        CAMPAIGN,
                        &CampaignRequest {
                            name: mutex.name.clone(),
                            lease: session.lease,
                            value: b"bench".to_vec(),
                        },
                    )
                    .await
                    .context("v3election Campaign")?
                    .leader
                    .ok_or_else(|| anyhow!("Campaign answered without a leader key"))?,
                ),
            })
        };
        let granted = tokio::select! {
            granted = acquire => granted,
            // Still queued when the window closes: give up; `close` deletes the key.
            () = tokio::time::sleep_until(deadline) => break,
        };
        let granted = match granted {
            Ok(g) => g,
            Err(e) => {
                tally.error(&e);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let got = Instant::now();
        if mutex.held.swap(true, Ordering::SeqCst) {
            tally.error(&anyhow!(
                "mutual exclusion violated: {} granted while held",
                String::from_utf8_lossy(&mutex.name)
            ));
        }
        mutex.held.store(false, Ordering::SeqCst);
        let release = async {
            match granted {
                Granted::Lock(key) => {
                    ch.unary::<_, UnlockResponse>(UNLOCK, &UnlockRequest { key })
                        .await
                        .context("v3lock Unlock")?;
                }
                Granted::Leader(leader) => {
                    ch.unary::<_, ResignResponse>(
                        RESIGN,
                        &ResignRequest {
                            leader: Some(leader),
                        },
                    )
                    .await
                    .context("v3election Resign")?;
                }
            }
            Ok::<_, anyhow::Error>(())
        };
        let released = match tokio::time::timeout(REQUEST_TIMEOUT, release).await {
            Ok(r) => r,
            Err(_) => Err(anyhow!("release took over {REQUEST_TIMEOUT:?}")),
        };
        let done = Instant::now();
        match released {
            Ok(()) => {
                counter.add(1);
                if window.contains(done) {
                    tally.record(got - sent);
                }
            }
            Err(e) => {
                tally.error(&e);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    if let Err(e) = session.close().await {
        tally.error(&e);
    }
    if tally.errors > 0 && tally.hist.is_empty() && tally.first_error.is_none() {
        bail!("contender failed");
    }
    Ok(tally)
}
