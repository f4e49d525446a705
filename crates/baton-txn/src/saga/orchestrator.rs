//! The orchestrator: drives sagas through their steps, recording progress in the saga log
//! before and after every attempt, under a Baton election whose fence guards every write.
//! It is the runtime only — leadership, tasks, calls, timeouts, events and metrics: the next
//! move is `plan`'s and what each write changes is `transition`'s.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{Client, Election, FencingToken, Session, SessionOptions, WatchOptions};
use futures_util::StreamExt;
use rand::Rng;
use serde::Serialize;
use serde_json::Value;
use tokio::task::JoinSet;

use super::def::{CallCtx, DynSaga, SagaDef, StepSpec};
use super::error::SagaError;
use super::log::SagaLog;
use super::plan::{plan, Plan};
use super::record::{Phase, PhaseState, SagaRecord, SagaStatus};
use super::transition::{transition, Driver, Event, Move, Outcome};
use crate::coordination::{now_ms, LeaderFence, LogError};

/// Settings of an [`Orchestrator`].
#[derive(Clone, Debug)]
pub struct OrchestratorConfig {
    /// This instance's name: its proposal in the election, and recorded in the sagas it
    /// writes (with its fencing token).
    pub instance: String,
    /// The session the instance leads with: its TTL is how long a crashed or paused leader
    /// holds the sagas up before another instance takes over.
    pub session: SessionOptions,
    /// How often the leader looks for sagas to drive besides its watch (which sees new sagas
    /// and operator actions at once), and the longest it waits out a retry pause before
    /// reading the saga again (so a cancel during a long pause is acted on within this).
    pub poll: Duration,
    /// The most sagas driven at once; the others wait for a free slot (so a backlog does not
    /// turn into as many concurrent calls to the services).
    pub max_active: usize,
}

impl OrchestratorConfig {
    /// Default settings for `instance`: a 10 s session, a 1 s poll, 64 sagas at once.
    pub fn new(instance: impl Into<String>) -> Self {
        OrchestratorConfig {
            instance: instance.into(),
            session: SessionOptions::default(),
            poll: Duration::from_secs(1),
            max_active: 64,
        }
    }
}

/// What an orchestrator did, for logs, tests and operators ([`Orchestrator::on_event`]). The
/// step events are emitted *at* the step boundaries, in order — `BeforeStep` after the
/// attempt was recorded as running and before the action is called, `AfterStep` after it
/// returned and before its result is recorded, `StepRecorded` after that — so a test can
/// stop the process at each of them.
#[derive(Clone, Debug, PartialEq)]
pub enum SagaEvent {
    /// Elected; from now on driving sagas with this fencing token.
    Leading {
        /// The fencing token.
        token: FencingToken,
    },
    /// Stopped leading: the session was lost, or driving failed.
    Lost {
        /// Why.
        reason: String,
    },
    /// A write was refused by the fence: a newer leader exists. This instance stopped.
    Fenced {
        /// The stale token.
        token: FencingToken,
    },
    /// An action attempt is recorded as running; the action is about to be called.
    BeforeStep {
        /// The saga.
        saga: String,
        /// The step.
        step: usize,
        /// The attempt.
        attempt: u32,
    },
    /// The action returned (`ok`: it succeeded); the result is not yet recorded.
    AfterStep {
        /// The saga.
        saga: String,
        /// The step.
        step: usize,
        /// The attempt.
        attempt: u32,
        /// Whether it succeeded.
        ok: bool,
    },
    /// The action's result is recorded.
    StepRecorded {
        /// The saga.
        saga: String,
        /// The step.
        step: usize,
        /// The attempt.
        attempt: u32,
    },
    /// A compensation attempt is recorded as running; the compensation is about to be called.
    BeforeCompensation {
        /// The saga.
        saga: String,
        /// The step.
        step: usize,
        /// The attempt.
        attempt: u32,
    },
    /// The compensation returned; the result is not yet recorded.
    AfterCompensation {
        /// The saga.
        saga: String,
        /// The step.
        step: usize,
        /// The attempt.
        attempt: u32,
        /// Whether it succeeded.
        ok: bool,
    },
    /// The compensation's result is recorded.
    CompensationRecorded {
        /// The saga.
        saga: String,
        /// The step.
        step: usize,
        /// The attempt.
        attempt: u32,
    },
    /// The saga settled: completed, compensated, or stuck.
    Settled {
        /// The saga.
        saga: String,
        /// How.
        status: SagaStatus,
    },
}

impl SagaEvent {
    /// The name of a step boundary event (`before_step`, `after_step`, `step_recorded`,
    /// `before_compensation`, `after_compensation`, `compensation_recorded`) and its saga and
    /// step; `None` for the other events.
    pub fn boundary(&self) -> Option<(&'static str, &str, usize)> {
        match self {
            SagaEvent::BeforeStep { saga, step, .. } => Some(("before_step", saga, *step)),
            SagaEvent::AfterStep { saga, step, .. } => Some(("after_step", saga, *step)),
            SagaEvent::StepRecorded { saga, step, .. } => Some(("step_recorded", saga, *step)),
            SagaEvent::BeforeCompensation { saga, step, .. } => {
                Some(("before_compensation", saga, *step))
            }
            SagaEvent::AfterCompensation { saga, step, .. } => {
                Some(("after_compensation", saga, *step))
            }
            SagaEvent::CompensationRecorded { saga, step, .. } => {
                Some(("compensation_recorded", saga, *step))
            }
            _ => None,
        }
    }
}

type Observer = Arc<dyn Fn(&SagaEvent) + Send + Sync>;

/// Drives the sagas of one namespace (module docs). Cheap to clone.
#[derive(Clone)]
pub struct Orchestrator {
    log: SagaLog,
    defs: Arc<HashMap<String, Arc<dyn DynSaga>>>,
    config: OrchestratorConfig,
    observer: Option<Observer>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("namespace", &self.log.namespace())
            .field("definitions", &self.defs.keys().collect::<Vec<_>>())
            .field("config", &self.config)
            .finish()
    }
}

/// Aborts a spawned attempt when the orchestrator stops waiting for it (a timeout, or the
/// drive dropped because leadership was lost).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Orchestrator {
    /// An orchestrator for the sagas of `namespace` in the Baton cluster `client` talks to.
    /// Register the definitions it drives with [`Orchestrator::register`]; every instance of a
    /// namespace must register the same ones (the leader drives every saga of the namespace).
    pub fn new(
        client: &Client,
        namespace: &str,
        config: OrchestratorConfig,
    ) -> Result<Orchestrator, SagaError> {
        Ok(Orchestrator {
            log: SagaLog::new(client, namespace)?,
            defs: Arc::new(HashMap::new()),
            config,
            observer: None,
        })
    }

    /// Adds a definition (replacing one of the same name).
    pub fn register<D>(mut self, def: SagaDef<D>) -> Self
    where
        D: serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.defs).insert(def.name().to_string(), Arc::new(def));
        self
    }

    /// Calls `f` with every [`SagaEvent`], synchronously at the point it describes (keep it
    /// short).
    pub fn on_event(mut self, f: impl Fn(&SagaEvent) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(f));
        self
    }

    /// The saga log.
    pub fn log(&self) -> &SagaLog {
        &self.log
    }

    /// Starts saga `id` of `def` with `data` (see [`SagaLog::start`]: idempotent on `id`).
    /// The leader picks it up at once (it watches for new sagas).
    pub async fn start<D: Serialize>(
        &self,
        def: &SagaDef<D>,
        id: &str,
        data: &D,
    ) -> Result<SagaRecord, SagaError> {
        self.log.start(def, id, data).await
    }

    /// Asks for saga `id` to be cancelled; it still compensates ([`SagaLog::cancel`]).
    pub async fn cancel(&self, id: &str, reason: &str) -> Result<SagaRecord, SagaError> {
        self.log.cancel(id, reason).await
    }

    /// The record of saga `id`.
    pub async fn status(&self, id: &str) -> Result<Option<SagaRecord>, SagaError> {
        self.log.get(id).await
    }

    /// Every saga of the namespace.
    pub async fn list(&self) -> Result<Vec<SagaRecord>, SagaError> {
        self.log.list().await
    }

    /// Retries a stuck compensation ([`SagaLog::retry_stuck`]).
    pub async fn retry_stuck(&self, id: &str, reason: &str) -> Result<SagaRecord, SagaError> {
        self.log.retry_stuck(id, reason).await
    }

    /// Skips a stuck compensation, audited ([`SagaLog::skip_step`]).
    pub async fn skip_step(
        &self,
        id: &str,
        step: usize,
        reason: &str,
    ) -> Result<SagaRecord, SagaError> {
        self.log.skip_step(id, step, reason).await
    }

    fn emit(&self, event: SagaEvent) {
        match &event {
            SagaEvent::Leading { token } => {
                tracing::info!(token = token.get(), instance = %self.config.instance, "saga orchestrator: leading")
            }
            SagaEvent::Lost { reason } => {
                tracing::warn!(%reason, instance = %self.config.instance, "saga orchestrator: stopped leading")
            }
            SagaEvent::Fenced { token } => {
                tracing::warn!(token = token.get(), instance = %self.config.instance, "saga orchestrator: fenced off")
            }
            SagaEvent::Settled { saga, status } => {
                tracing::info!(%saga, %status, "saga settled")
            }
            other => tracing::debug!(?other, "saga"),
        }
        if let Some(f) = &self.observer {
            f(&event);
        }
    }

    /// Campaigns in the namespace's election and, while leading, drives every unfinished saga
    /// of a registered definition; after losing leadership (or being fenced) it campaigns
    /// again. Returns when `shutdown` completes. Errors are logged and waited out.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) {
        tokio::select! {
            () = shutdown => {}
            () = self.campaign_forever() => {}
        }
    }

    async fn campaign_forever(&self) {
        let client = self.log.client().clone();
        let election = Election::new(&client, self.log.election_name());
        let mut failures: u32 = 0;
        loop {
            if failures > 0 {
                let pause = Duration::from_millis(100)
                    .saturating_mul(1 << failures.min(5))
                    .min(Duration::from_secs(5));
                tokio::time::sleep(pause).await;
            }
            let session = match Session::new(&client, self.config.session.clone()).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("saga orchestrator: no Baton session: {e}");
                    failures += 1;
                    continue;
                }
            };
            let leadership = match election
                .campaign(&session, self.config.instance.clone())
                .await
            {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("saga orchestrator: campaign failed: {e}");
                    let _ = session.close().await;
                    failures += 1;
                    continue;
                }
            };
            let fence = LeaderFence::of(&leadership);
            self.emit(SagaEvent::Leading {
                token: fence.token(),
            });
            let lost = leadership.lost();
            // Dropping `lead` aborts the sagas' drives (and their attempts) before the event.
            let (ended, failed) = tokio::select! {
                reason = lost => (SagaEvent::Lost { reason: reason.to_string() }, false),
                r = self.lead(&fence) => match r {
                    Err(SagaError::Log(LogError::Fenced { token })) => (SagaEvent::Fenced { token }, true),
                    Err(e) => (SagaEvent::Lost { reason: e.to_string() }, true),
                    Ok(never) => match never {},
                },
            };
            failures = if failed { failures + 1 } else { 0 };
            self.emit(ended);
            let _ = leadership.resign().await;
            let _ = session.close().await;
        }
    }

    /// The leader's loop: every unfinished saga gets one drive task at a time.
    async fn lead(&self, fence: &LeaderFence) -> Result<std::convert::Infallible, SagaError> {
        let ns = self.log.namespace().to_string();
        let mut tasks: JoinSet<Result<SagaStatus, SagaError>> = JoinSet::new();
        let mut driving: HashMap<tokio::task::Id, String> = HashMap::new();
        let mut active: HashSet<String> = HashSet::new();
        // Sagas whose drive failed (Baton unreachable, an unknown definition) rest a poll
        // interval before the next try, so a lasting fault is not retried in a tight loop.
        let mut resting: HashMap<String, Instant> = HashMap::new();
        let mut warned: HashSet<String> = HashSet::new();
        let watch = || {
            self.log.client().watch(
                self.log.open_prefix(),
                WatchOptions::new().with_prefix().without_deletes(),
            )
        };
        let mut wake = watch();
        loop {
            match self.log.open().await {
                Ok(open) => {
                    let stuck = open
                        .iter()
                        .filter(|r| matches!(r.status, SagaStatus::Stuck { .. }))
                        .count();
                    metrics::gauge!("baton_txn_saga_stuck", "namespace" => ns.clone())
                        .set(stuck as f64);
                    metrics::gauge!("baton_txn_saga_open", "namespace" => ns.clone())
                        .set(open.len() as f64);
                    resting.retain(|_, until| until.elapsed() < self.config.poll);
                    for rec in open {
                        if active.len() >= self.config.max_active.max(1) {
                            break;
                        }
                        if rec.status.is_settled()
                            || active.contains(&rec.id)
                            || resting.contains_key(&rec.id)
                        {
                            continue;
                        }
                        if !self.defs.contains_key(&rec.definition) {
                            if warned.insert(rec.id.clone()) {
                                tracing::warn!(saga = %rec.id, definition = %rec.definition,
                                    "saga orchestrator: no such definition registered; not driving it");
                            }
                            continue;
                        }
                        let me = self.clone();
                        let fence = fence.clone();
                        let id = rec.id.clone();
                        let handle = tasks.spawn(async move { me.drive(&id, &fence).await });
                        driving.insert(handle.id(), rec.id.clone());
                        active.insert(rec.id);
                    }
                }
                Err(e) if is_fenced(&e) => return Err(e),
                Err(e) => tracing::warn!("saga orchestrator: cannot list sagas: {e}"),
            }
            // Until something may have changed: a drive ended, the watch saw a new saga or an
            // operator action, or the poll interval passed.
            tokio::select! {
                Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    let (task, result) = match joined {
                        Ok((task, r)) => (task, r),
                        Err(e) => (e.id(), Err(SagaError::Invalid(format!("drive task failed: {e}")))),
                    };
                    let id = driving.remove(&task).unwrap_or_default();
                    active.remove(&id);
                    match result {
                        Ok(_) => {}
                        Err(e) if is_fenced(&e) => return Err(e),
                        Err(e) => {
                            tracing::warn!(saga = %id, "saga orchestrator: drive failed: {e}");
                            resting.insert(id, Instant::now());
                        }
                    }
                }
                event = wake.next() => {
                    if !matches!(event, Some(Ok(_))) {
                        // The watch ended (compacted, refused): start a new one; the scan
                        // that follows covers what it may have missed.
                        tokio::time::sleep(self.config.poll).await;
                        wake = watch();
                    }
                }
                () = tokio::time::sleep(self.config.poll) => {}
            }
        }
    }

    /// Drives saga `id` under `fence` until it is settled (completed, compensated or stuck);
    /// returns its status. Fails with a fenced error ([`LogError::Fenced`]) as soon as a write
    /// is refused because `fence`'s leadership is gone — before the next action or
    /// compensation is called, since every attempt is recorded (fenced) before it starts.
    ///
    /// [`Orchestrator::run`] calls this for every saga while leading; it is public for
    /// programs that hold a leadership of their own.
    pub async fn drive(&self, id: &str, fence: &LeaderFence) -> Result<SagaStatus, SagaError> {
        loop {
            let (rec, _) = self
                .log
                .read(id)
                .await?
                .ok_or_else(|| SagaError::NotFound(id.to_string()))?;
            let def = self.definition_of(&rec)?;
            let now = now_ms();
            match plan(&rec, now) {
                Plan::Settled => return Ok(rec.status),
                Plan::Wait(due) => {
                    let pause =
                        Duration::from_millis(due.saturating_sub(now)).min(self.config.poll);
                    tokio::time::sleep(pause).await;
                }
                Plan::Run { step, phase } => self.attempt(&def, id, step, phase, fence).await?,
                p => {
                    let m = Move::carrying_out(p).expect("settled and waiting are handled above");
                    self.advance(&def, id, fence, m).await?
                }
            }
        }
    }

    fn definition_of(&self, rec: &SagaRecord) -> Result<Arc<dyn DynSaga>, SagaError> {
        let def = self.defs.get(&rec.definition).ok_or_else(|| {
            SagaError::Definition(format!(
                "saga {} is of definition {}, which is not registered",
                rec.id, rec.definition
            ))
        })?;
        let names: Vec<&str> = def.specs().iter().map(|s| s.name.as_str()).collect();
        let recorded: Vec<&str> = rec.steps.iter().map(|s| s.name.as_str()).collect();
        if names != recorded {
            return Err(SagaError::Definition(format!(
                "saga {} was started with steps {recorded:?}; definition {} now has {names:?}",
                rec.id, rec.definition
            )));
        }
        Ok(def.clone())
    }

    fn tag(&self, fence: &LeaderFence) -> String {
        format!("{} (token {})", self.config.instance, fence.token())
    }

    /// Writes a move that needs no call (cut-short attempts, cancel, the end).
    async fn advance(
        &self,
        def: &Arc<dyn DynSaga>,
        id: &str,
        fence: &LeaderFence,
        m: Move<'_>,
    ) -> Result<(), SagaError> {
        let specs = def.specs();
        let tag = self.tag(fence);
        let driver = Driver {
            tag: &tag,
            specs: &specs,
        };
        let event = Event::Orchestrator(&driver, m);
        let (written, rec) = self
            .log
            .update(id, Some(fence), |r| transition(r, &event, now_ms()))
            .await?;
        if written && rec.status.is_final() {
            self.settled(&rec);
        }
        Ok(())
    }

    fn settled(&self, rec: &SagaRecord) {
        metrics::counter!("baton_txn_saga_outcomes_total",
            "namespace" => self.log.namespace().to_string(),
            "saga" => rec.definition.clone(),
            "outcome" => rec.status.name())
        .increment(1);
        self.emit(SagaEvent::Settled {
            saga: rec.id.clone(),
            status: rec.status.clone(),
        });
    }

    /// One attempt of `phase` of `step`: recorded as running (fenced), called, its result
    /// recorded (fenced).
    async fn attempt(
        &self,
        def: &Arc<dyn DynSaga>,
        id: &str,
        step: usize,
        phase: Phase,
        fence: &LeaderFence,
    ) -> Result<(), SagaError> {
        let specs = def.specs();
        let spec: &StepSpec = specs[step];
        let tag = self.tag(fence);
        let driver = Driver {
            tag: &tag,
            specs: &specs,
        };
        let start = Event::Orchestrator(&driver, Move::Start { step, phase });
        let (started, rec) = self
            .log
            .update(id, Some(fence), |r| transition(r, &start, now_ms()))
            .await?;
        let attempt = match rec.steps[step].phase(phase) {
            Some(p) if started => p.attempts,
            // Someone changed the saga since it was read: decide again.
            _ => return Ok(()),
        };
        let labels = [
            ("namespace", self.log.namespace().to_string()),
            ("saga", rec.definition.clone()),
            ("step", spec.name.clone()),
            ("phase", phase.to_string()),
        ];
        metrics::counter!("baton_txn_saga_step_attempts_total", &labels).increment(1);
        let saga = id.to_string();
        self.emit(match phase {
            Phase::Action => SagaEvent::BeforeStep {
                saga: saga.clone(),
                step,
                attempt,
            },
            Phase::Compensation => SagaEvent::BeforeCompensation {
                saga: saga.clone(),
                step,
                attempt,
            },
        });
        let action = &rec.steps[step].action;
        let output = match phase {
            Phase::Compensation if action.state == PhaseState::Done => action.output.clone(),
            _ => None,
        };
        let cx = CallCtx {
            saga_id: id.into(),
            step,
            phase,
            attempt,
            step_key: self.log.step_key(id, &spec.name).into(),
            output,
        };
        let outcome = self.call(def, cx, &rec.data, spec.timeout).await;
        let ok = matches!(outcome, Outcome::Ok(_));
        if !ok {
            let mut labels = labels.to_vec();
            labels.push(("kind", outcome.kind().to_string()));
            metrics::counter!("baton_txn_saga_step_failures_total", &labels).increment(1);
        }
        self.emit(match phase {
            Phase::Action => SagaEvent::AfterStep {
                saga: saga.clone(),
                step,
                attempt,
                ok,
            },
            Phase::Compensation => SagaEvent::AfterCompensation {
                saga: saga.clone(),
                step,
                attempt,
                ok,
            },
        });
        let end = Event::Orchestrator(
            &driver,
            Move::End {
                step,
                phase,
                attempt,
                outcome: &outcome,
                jitter: rand::thread_rng().gen_range(0.0..=1.0),
            },
        );
        let (written, rec) = self
            .log
            .update(id, Some(fence), |r| transition(r, &end, now_ms()))
            .await?;
        if written {
            self.emit(match phase {
                Phase::Action => SagaEvent::StepRecorded {
                    saga,
                    step,
                    attempt,
                },
                Phase::Compensation => SagaEvent::CompensationRecorded {
                    saga,
                    step,
                    attempt,
                },
            });
            if matches!(rec.status, SagaStatus::Stuck { .. }) {
                self.settled(&rec);
            }
        }
        Ok(())
    }

    /// Runs one call as a task of its own (a panic is an unknown outcome, not the
    /// orchestrator's end), bounded by `timeout`.
    async fn call(
        &self,
        def: &Arc<dyn DynSaga>,
        cx: CallCtx,
        data: &Value,
        timeout: Option<Duration>,
    ) -> Outcome {
        let future = match def.call(cx, data) {
            Ok(f) => f,
            Err(e) => return Outcome::Failed(e),
        };
        let mut handle = tokio::spawn(future);
        let _abort = AbortOnDrop(handle.abort_handle());
        let joined = match timeout {
            Some(t) => match tokio::time::timeout(t, &mut handle).await {
                Ok(j) => j,
                Err(_) => return Outcome::Unknown(format!("timed out after {t:?}")),
            },
            None => (&mut handle).await,
        };
        match joined {
            Ok(Ok(v)) => Outcome::Ok(v),
            Ok(Err(e)) => Outcome::Failed(e),
            Err(e) if e.is_panic() => Outcome::Unknown(format!("panicked: {}", panic_text(e))),
            Err(e) => Outcome::Unknown(format!("cancelled: {e}")),
        }
    }
}

fn panic_text(e: tokio::task::JoinError) -> String {
    let p = e.into_panic();
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

fn is_fenced(e: &SagaError) -> bool {
    matches!(e, SagaError::Log(LogError::Fenced { .. }))
}
