//! The orchestrator: drives sagas through their steps, recording progress in the saga log
//! before and after every attempt, under a Baton election whose fence guards every write.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_client::{Client, Election, Session, SessionOptions, WatchOptions};
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::Value;
use tokio::task::JoinSet;

use super::def::{CallCtx, DynSaga, Phase, SagaDef, StepError, StepSpec};
use super::log::{CompensationState, SagaLog, SagaRecord, SagaStatus, StepState};
use super::SagaError;
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
        token: i64,
    },
    /// Stopped leading: the session was lost, or driving failed.
    Lost {
        /// Why.
        reason: String,
    },
    /// A write was refused by the fence: a newer leader exists. This instance stopped.
    Fenced {
        /// The stale token.
        token: i64,
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

/// The next thing to do for a saga, decided from its record alone (so any orchestrator,
/// reading the same record, decides the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Finished or stuck: nothing to do.
    Settled,
    /// A retry pause runs until then (Unix ms).
    Wait(u64),
    /// An attempt was recorded running but its result never was: it was cut short.
    Interrupted { step: usize, phase: Phase },
    /// Cancellation was asked for: start compensating.
    Cancel,
    /// A step failed for good but the saga is still running (not written by this version;
    /// repaired by compensating).
    Fail,
    /// Every step is done.
    Complete,
    /// Nothing is left to compensate.
    Compensated,
    /// Start an attempt.
    Run { step: usize, phase: Phase },
}

fn plan(r: &SagaRecord, now: u64) -> Plan {
    match r.status {
        SagaStatus::Completed | SagaStatus::Compensated | SagaStatus::Stuck { .. } => Plan::Settled,
        SagaStatus::Running => {
            if let Some(step) = r.steps.iter().position(|s| s.state == StepState::Running) {
                return Plan::Interrupted {
                    step,
                    phase: Phase::Action,
                };
            }
            if r.cancel_requested {
                return Plan::Cancel;
            }
            let Some(step) = r.steps.iter().position(|s| s.state != StepState::Done) else {
                return Plan::Complete;
            };
            let s = &r.steps[step];
            match s.state {
                StepState::Pending => match s.next_attempt_ms {
                    Some(due) if due > now => Plan::Wait(due),
                    _ => Plan::Run {
                        step,
                        phase: Phase::Action,
                    },
                },
                _ => Plan::Fail,
            }
        }
        SagaStatus::Compensating => {
            // The highest step whose compensation is still open: compensations run one at a
            // time, in reverse step order.
            let next = r.steps.iter().enumerate().rev().find_map(|(i, s)| {
                s.compensation.as_ref().and_then(|c| match c.state {
                    CompensationState::Pending | CompensationState::Running => Some((i, c)),
                    _ => None,
                })
            });
            match next {
                None => Plan::Compensated,
                Some((step, c)) if c.state == CompensationState::Running => Plan::Interrupted {
                    step,
                    phase: Phase::Compensation,
                },
                Some((step, c)) => match c.next_attempt_ms {
                    Some(due) if due > now => Plan::Wait(due),
                    _ => Plan::Run {
                        step,
                        phase: Phase::Compensation,
                    },
                },
            }
        }
    }
}

/// How one attempt ended.
enum Outcome {
    Ok(Value),
    Failed(StepError),
    /// Timed out or panicked: it may have taken effect.
    Unknown(String),
}

impl Outcome {
    fn kind(&self) -> &'static str {
        match self {
            Outcome::Ok(_) => "ok",
            Outcome::Failed(StepError::Retryable(_)) => "retryable",
            Outcome::Failed(StepError::Fatal(_)) => "fatal",
            Outcome::Unknown(_) => "unknown",
        }
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
                tracing::info!(token, instance = %self.config.instance, "saga orchestrator: leading")
            }
            SagaEvent::Lost { reason } => {
                tracing::warn!(%reason, instance = %self.config.instance, "saga orchestrator: stopped leading")
            }
            SagaEvent::Fenced { token } => {
                tracing::warn!(token, instance = %self.config.instance, "saga orchestrator: fenced off")
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
                p => self.transition(&def, id, fence, p).await?,
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

    /// Writes a transition that needs no call (cut-short attempts, cancel, the end).
    async fn transition(
        &self,
        def: &Arc<dyn DynSaga>,
        id: &str,
        fence: &LeaderFence,
        planned: Plan,
    ) -> Result<(), SagaError> {
        let specs = def.specs();
        let tag = self.tag(fence);
        let (written, rec) = self
            .log
            .update(id, Some(fence), |r| {
                let now = now_ms();
                if plan(r, now) != planned {
                    return Ok(None);
                }
                r.orchestrator = Some(tag.clone());
                match planned {
                    Plan::Interrupted {
                        step,
                        phase: Phase::Action,
                    } => {
                        let s = &mut r.steps[step];
                        s.state = StepState::Pending;
                        s.outcome_unknown = true;
                        s.next_attempt_ms = None;
                        s.last_error = Some(format!(
                            "attempt {} was cut short (its orchestrator stopped); outcome unknown",
                            s.attempts
                        ));
                    }
                    Plan::Interrupted {
                        step,
                        phase: Phase::Compensation,
                    } => {
                        if let Some(c) = r.steps[step].compensation.as_mut() {
                            c.state = CompensationState::Pending;
                            c.next_attempt_ms = None;
                            c.last_error = Some(format!(
                                "attempt {} was cut short (its orchestrator stopped)",
                                c.attempts
                            ));
                        }
                    }
                    Plan::Cancel => {
                        let why = r
                            .audit
                            .iter()
                            .rev()
                            .find(|a| a.action == super::OperatorAction::Cancel)
                            .map(|a| format!("cancelled by {}: {}", a.by, a.reason))
                            .unwrap_or_else(|| "cancelled".into());
                        r.start_compensation(&specs, why);
                    }
                    Plan::Fail => {
                        r.start_compensation(&specs, "a step failed".into());
                    }
                    Plan::Complete => {
                        r.status = SagaStatus::Completed;
                        r.finished_ms = Some(now);
                    }
                    Plan::Compensated => {
                        r.status = SagaStatus::Compensated;
                        r.finished_ms = Some(now);
                    }
                    Plan::Settled | Plan::Wait(_) | Plan::Run { .. } => return Ok(None),
                }
                Ok(Some(()))
            })
            .await?;
        if written.is_some() && rec.status.is_final() {
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
        let planned = Plan::Run { step, phase };
        let tag = self.tag(fence);
        let (started, rec) = self
            .log
            .update(id, Some(fence), |r| {
                let now = now_ms();
                if plan(r, now) != planned {
                    return Ok(None);
                }
                r.orchestrator = Some(tag.clone());
                let s = &mut r.steps[step];
                let attempt = match phase {
                    Phase::Action => {
                        s.state = StepState::Running;
                        s.attempts += 1;
                        s.next_attempt_ms = None;
                        s.started_ms.get_or_insert(now);
                        s.attempts
                    }
                    Phase::Compensation => {
                        let Some(c) = s.compensation.as_mut() else {
                            return Ok(None);
                        };
                        c.state = CompensationState::Running;
                        c.attempts += 1;
                        c.next_attempt_ms = None;
                        c.attempts
                    }
                };
                Ok(Some(attempt))
            })
            .await?;
        let Some(attempt) = started else {
            // Someone changed the saga since it was read: decide again.
            return Ok(());
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
        let s = &rec.steps[step];
        let output = match phase {
            Phase::Compensation if s.state == StepState::Done => s.output.clone(),
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
        let (written, rec) = self
            .log
            .update(id, Some(fence), |r| {
                let now = now_ms();
                r.orchestrator = Some(tag.clone());
                match phase {
                    Phase::Action => record_action(r, &specs, step, attempt, &outcome, now),
                    Phase::Compensation => {
                        record_compensation(r, spec, step, attempt, &outcome, now)
                    }
                }
            })
            .await?;
        if written.is_some() {
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

/// Records an action attempt's outcome (if the step is still in that attempt).
fn record_action(
    r: &mut SagaRecord,
    specs: &[&StepSpec],
    step: usize,
    attempt: u32,
    outcome: &Outcome,
    now: u64,
) -> Result<Option<()>, SagaError> {
    let spec = specs[step];
    let s = &mut r.steps[step];
    if r.status != SagaStatus::Running || s.state != StepState::Running || s.attempts != attempt {
        return Ok(None);
    }
    let (error, fatal) = match outcome {
        Outcome::Ok(v) => {
            s.state = StepState::Done;
            s.output = Some(v.clone());
            s.finished_ms = Some(now);
            return Ok(Some(()));
        }
        Outcome::Failed(StepError::Retryable(e)) => (e.clone(), false),
        Outcome::Failed(StepError::Fatal(e)) => (e.clone(), true),
        Outcome::Unknown(e) => {
            s.outcome_unknown = true;
            (e.clone(), false)
        }
    };
    s.failures += 1;
    s.last_error = Some(format!("attempt {attempt}: {error}"));
    if fatal || s.failures >= spec.retry.max_attempts {
        s.state = StepState::Failed;
        s.finished_ms = Some(now);
        let why = format!(
            "step {step} ({}) failed after {} attempt{}: {error}",
            spec.name,
            s.attempts,
            if s.attempts == 1 { "" } else { "s" }
        );
        r.start_compensation(specs, why);
    } else {
        s.state = StepState::Pending;
        s.next_attempt_ms = Some(now + spec.retry.delay(s.failures).as_millis() as u64);
    }
    Ok(Some(()))
}

/// Records a compensation attempt's outcome (if it is still in that attempt); parks the
/// saga when the compensation failed fatally or `park_after` times in a row.
fn record_compensation(
    r: &mut SagaRecord,
    spec: &StepSpec,
    step: usize,
    attempt: u32,
    outcome: &Outcome,
    now: u64,
) -> Result<Option<()>, SagaError> {
    if r.status != SagaStatus::Compensating {
        return Ok(None);
    }
    let Some(c) = r.steps[step].compensation.as_mut() else {
        return Ok(None);
    };
    if c.state != CompensationState::Running || c.attempts != attempt {
        return Ok(None);
    }
    let (error, fatal) = match outcome {
        Outcome::Ok(v) => {
            c.state = CompensationState::Done;
            c.output = Some(v.clone());
            c.finished_ms = Some(now);
            return Ok(Some(()));
        }
        Outcome::Failed(StepError::Retryable(e)) | Outcome::Unknown(e) => (e.clone(), false),
        Outcome::Failed(StepError::Fatal(e)) => (e.clone(), true),
    };
    c.failures += 1;
    c.state = CompensationState::Pending;
    c.last_error = Some(format!("attempt {attempt}: {error}"));
    if fatal || c.failures >= spec.compensation.park_after {
        c.next_attempt_ms = None;
        r.status = SagaStatus::Stuck {
            step,
            attempts: c.attempts,
            last_error: error,
        };
    } else {
        c.next_attempt_ms =
            Some(now + spec.compensation.retry.delay(c.failures).as_millis() as u64);
    }
    Ok(Some(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saga::def::{RetryPolicy, StepCtx};

    fn noop(_: StepCtx<()>) -> crate::saga::BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(async { Ok(Value::Null) })
    }

    fn def() -> SagaDef<()> {
        let once = RetryPolicy {
            max_attempts: 2,
            jitter: crate::saga::Jitter::None,
            ..RetryPolicy::default()
        };
        SagaDef::builder("t")
            .step("a", noop)
            .compensate(noop)
            .step("b", noop)
            .step("c", noop)
            .compensate(noop)
            .retry(once)
            .build()
            .unwrap()
    }

    fn record(def: &SagaDef<()>) -> SagaRecord {
        SagaRecord::new(def, "s1", &()).unwrap()
    }

    fn run(step: usize, phase: Phase) -> Plan {
        Plan::Run { step, phase }
    }

    #[test]
    fn a_failure_after_retries_compensates_what_took_effect_in_reverse() {
        let def = def();
        let specs = def.steps();
        let mut r = record(&def);
        for step in 0..2 {
            assert_eq!(plan(&r, 0), run(step, Phase::Action));
            r.steps[step].state = StepState::Running;
            r.steps[step].attempts = 1;
            record_action(&mut r, &specs, step, 1, &Outcome::Ok(Value::Null), 0).unwrap();
        }
        // Step c: a timeout (outcome unknown), then a retryable failure: out of attempts.
        r.steps[2].state = StepState::Running;
        r.steps[2].attempts = 1;
        let unknown = Outcome::Unknown("timed out".into());
        record_action(&mut r, &specs, 2, 1, &unknown, 1000).unwrap();
        assert_eq!(r.steps[2].state, StepState::Pending);
        assert_eq!(plan(&r, 1000), Plan::Wait(1200), "the backoff pause");
        assert_eq!(plan(&r, 1200), run(2, Phase::Action));
        r.steps[2].state = StepState::Running;
        r.steps[2].attempts = 2;
        let failed = Outcome::Failed(StepError::Retryable("no".into()));
        record_action(&mut r, &specs, 2, 2, &failed, 1300).unwrap();
        assert_eq!(r.status, SagaStatus::Compensating);
        // c (unknown outcome) first, then a; b has no compensation.
        assert_eq!(plan(&r, 1300), run(2, Phase::Compensation));
        assert!(r.steps[1].compensation.is_none());
        r.steps[2].compensation.as_mut().unwrap().state = CompensationState::Done;
        assert_eq!(plan(&r, 1300), run(0, Phase::Compensation));
        r.steps[0].compensation.as_mut().unwrap().state = CompensationState::Done;
        assert_eq!(plan(&r, 1300), Plan::Compensated);
    }

    #[test]
    fn a_cut_short_attempt_is_rerun_and_marks_the_outcome_unknown() {
        let def = def();
        let mut r = record(&def);
        r.steps[0].state = StepState::Running;
        r.steps[0].attempts = 1;
        r.cancel_requested = true;
        // The interrupted attempt is settled first, then the cancel.
        assert_eq!(
            plan(&r, 0),
            Plan::Interrupted {
                step: 0,
                phase: Phase::Action
            }
        );
        r.steps[0].state = StepState::Pending;
        r.steps[0].outcome_unknown = true;
        assert_eq!(plan(&r, 0), Plan::Cancel);
        r.start_compensation(&def.steps(), "cancelled".into());
        assert_eq!(plan(&r, 0), run(0, Phase::Compensation));
    }

    #[test]
    fn a_compensation_parks_after_its_budget() {
        let def = def();
        let specs = def.steps();
        let mut r = record(&def);
        r.steps[0].state = StepState::Done;
        r.start_compensation(&specs, "x".into());
        let fail = Outcome::Failed(StepError::Retryable("down".into()));
        for attempt in 1..=10 {
            assert!(matches!(plan(&r, u64::MAX), Plan::Run { step: 0, .. }));
            let c = r.steps[0].compensation.as_mut().unwrap();
            c.state = CompensationState::Running;
            c.attempts = attempt;
            record_compensation(&mut r, specs[0], 0, attempt, &fail, 0).unwrap();
        }
        assert_eq!(
            r.status,
            SagaStatus::Stuck {
                step: 0,
                attempts: 10,
                last_error: "down".into()
            }
        );
        assert_eq!(plan(&r, u64::MAX), Plan::Settled);
    }
}

#[cfg(test)]
mod golden {
    //! Records written by this version, pinned byte for byte (tests/golden/).
    use super::*;
    use crate::saga::def::{CompensationPolicy, Jitter, RetryPolicy, StepCtx};
    use crate::saga::log::{AuditEntry, OperatorAction};
    use serde_json::json;

    const T0: u64 = 1_700_000_000_000;
    const TAG: &str = "orch-1 (token 7)";
    const BY: &str = "ops@host-1 (pid 4242)";

    fn noop(_: StepCtx<Value>) -> crate::saga::BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(async { Ok(Value::Null) })
    }

    fn def() -> SagaDef<Value> {
        let retry = RetryPolicy {
            max_attempts: 3,
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        let comp = CompensationPolicy {
            retry: retry.clone(),
            park_after: 2,
        };
        SagaDef::builder("order")
            .step("create", noop)
            .compensate(noop)
            .retry(retry.clone())
            .compensation_policy(comp.clone())
            .step("charge", noop)
            .compensate(noop)
            .retry(retry.clone())
            .compensation_policy(comp)
            .step("ship", noop)
            .retry(retry)
            .build()
            .unwrap()
    }

    fn fresh(def: &SagaDef<Value>, id: &str) -> SagaRecord {
        let mut r = SagaRecord::new(
            def,
            id,
            &json!({"order": id, "cents": 1250, "items": ["a", "b"]}),
        )
        .unwrap();
        r.created_ms = T0;
        r.updated_ms = T0;
        r
    }

    fn begin(r: &mut SagaRecord, step: usize, phase: Phase, now: u64) -> u32 {
        assert_eq!(plan(r, now), Plan::Run { step, phase });
        r.orchestrator = Some(TAG.into());
        r.updated_ms = now;
        let s = &mut r.steps[step];
        match phase {
            Phase::Action => {
                s.state = StepState::Running;
                s.attempts += 1;
                s.next_attempt_ms = None;
                s.started_ms.get_or_insert(now);
                s.attempts
            }
            Phase::Compensation => {
                let c = s.compensation.as_mut().unwrap();
                c.state = CompensationState::Running;
                c.attempts += 1;
                c.next_attempt_ms = None;
                c.attempts
            }
        }
    }

    fn end(
        r: &mut SagaRecord,
        def: &SagaDef<Value>,
        step: usize,
        phase: Phase,
        outcome: Outcome,
        now: u64,
    ) {
        let specs = def.steps();
        let attempt = match phase {
            Phase::Action => r.steps[step].attempts,
            Phase::Compensation => r.steps[step].compensation.as_ref().unwrap().attempts,
        };
        r.orchestrator = Some(TAG.into());
        let written = match phase {
            Phase::Action => record_action(r, &specs, step, attempt, &outcome, now),
            Phase::Compensation => {
                record_compensation(r, specs[step], step, attempt, &outcome, now)
            }
        };
        assert!(written.unwrap().is_some());
        r.updated_ms = now;
    }

    /// What `Orchestrator::transition` writes.
    fn follow(r: &mut SagaRecord, def: &SagaDef<Value>, now: u64) {
        let specs = def.steps();
        let planned = plan(r, now);
        r.orchestrator = Some(TAG.into());
        match planned {
            Plan::Interrupted {
                step,
                phase: Phase::Action,
            } => {
                let s = &mut r.steps[step];
                s.state = StepState::Pending;
                s.outcome_unknown = true;
                s.next_attempt_ms = None;
                s.last_error = Some(format!(
                    "attempt {} was cut short (its orchestrator stopped); outcome unknown",
                    s.attempts
                ));
            }
            Plan::Interrupted {
                step,
                phase: Phase::Compensation,
            } => {
                let c = r.steps[step].compensation.as_mut().unwrap();
                c.state = CompensationState::Pending;
                c.next_attempt_ms = None;
                c.last_error = Some(format!(
                    "attempt {} was cut short (its orchestrator stopped)",
                    c.attempts
                ));
            }
            Plan::Cancel => {
                let why = r
                    .audit
                    .iter()
                    .rev()
                    .find(|a| a.action == OperatorAction::Cancel)
                    .map(|a| format!("cancelled by {}: {}", a.by, a.reason))
                    .unwrap_or_else(|| "cancelled".into());
                r.start_compensation(&specs, why);
            }
            Plan::Complete => {
                r.status = SagaStatus::Completed;
                r.finished_ms = Some(now);
            }
            Plan::Compensated => {
                r.status = SagaStatus::Compensated;
                r.finished_ms = Some(now);
            }
            p => panic!("not a transition: {p:?}"),
        }
        r.updated_ms = now;
    }

    fn audit(r: &mut SagaRecord, action: OperatorAction, step: Option<usize>, why: &str, now: u64) {
        r.audit.push(AuditEntry {
            at_ms: now,
            action,
            step,
            reason: why.into(),
            by: BY.into(),
        });
        r.updated_ms = now;
    }

    fn ok(v: Value) -> Outcome {
        Outcome::Ok(v)
    }

    fn records() -> Vec<(&'static str, SagaRecord)> {
        let d = def();
        let (a, c) = (Phase::Action, Phase::Compensation);
        let mut out = Vec::new();

        // Mid-action: charge timed out once and is in its second attempt.
        let mut r = fresh(&d, "o-running");
        begin(&mut r, 0, a, T0 + 1);
        end(&mut r, &d, 0, a, ok(json!({"order_id": 17})), T0 + 10);
        begin(&mut r, 1, a, T0 + 20);
        end(
            &mut r,
            &d,
            1,
            a,
            Outcome::Unknown("timed out after 5s".into()),
            T0 + 30,
        );
        begin(&mut r, 1, a, T0 + 230);
        out.push(("saga-running.json", r));

        // Compensating: charge cut short, then declined; its refund in a second attempt.
        let mut r = fresh(&d, "o-compensating");
        begin(&mut r, 0, a, T0 + 1);
        end(&mut r, &d, 0, a, ok(json!({"order_id": 18})), T0 + 10);
        begin(&mut r, 1, a, T0 + 20);
        follow(&mut r, &d, T0 + 25);
        begin(&mut r, 1, a, T0 + 30);
        let declined = Outcome::Failed(StepError::Fatal("card declined".into()));
        end(&mut r, &d, 1, a, declined, T0 + 40);
        begin(&mut r, 1, c, T0 + 50);
        let down = Outcome::Failed(StepError::Retryable("refund service down".into()));
        end(&mut r, &d, 1, c, down, T0 + 60);
        begin(&mut r, 1, c, T0 + 260);
        out.push(("saga-compensating.json", r));

        // Completed.
        let mut r = fresh(&d, "o-completed");
        for (step, v) in [json!({"order_id": 19}), json!("ch_19"), Value::Null]
            .into_iter()
            .enumerate()
        {
            let t = T0 + 10 * step as u64;
            begin(&mut r, step, a, t + 1);
            end(&mut r, &d, step, a, ok(v), t + 5);
        }
        follow(&mut r, &d, T0 + 40);
        out.push(("saga-completed.json", r));

        // Cancelled by an operator after charge; the refund refused for good: stuck.
        let mut r = fresh(&d, "o-stuck");
        begin(&mut r, 0, a, T0 + 1);
        end(&mut r, &d, 0, a, ok(json!({"order_id": 20})), T0 + 10);
        begin(&mut r, 1, a, T0 + 20);
        end(
            &mut r,
            &d,
            1,
            a,
            ok(json!({"charge": "ch_20", "cents": 1250})),
            T0 + 30,
        );
        r.cancel_requested = true;
        audit(
            &mut r,
            OperatorAction::Cancel,
            None,
            "customer asked",
            T0 + 40,
        );
        follow(&mut r, &d, T0 + 50);
        begin(&mut r, 1, c, T0 + 60);
        let refused = Outcome::Failed(StepError::Fatal("refund refused: card closed".into()));
        end(&mut r, &d, 1, c, refused, T0 + 70);
        out.push(("saga-stuck.json", r.clone()));

        // The same saga retried, cut short, parked again, skipped, and compensated.
        r.id = "o-compensated".into();
        let cc = r.steps[1].compensation.as_mut().unwrap();
        cc.failures = 0;
        cc.next_attempt_ms = None;
        r.status = SagaStatus::Compensating;
        audit(
            &mut r,
            OperatorAction::Retry,
            Some(1),
            "card reopened",
            T0 + 80,
        );
        begin(&mut r, 1, c, T0 + 90);
        follow(&mut r, &d, T0 + 100);
        begin(&mut r, 1, c, T0 + 110);
        let again = Outcome::Failed(StepError::Retryable("still refused".into()));
        end(&mut r, &d, 1, c, again, T0 + 120);
        begin(&mut r, 1, c, T0 + 320);
        let again = Outcome::Unknown("panicked: boom".into());
        end(&mut r, &d, 1, c, again, T0 + 330);
        let cc = r.steps[1].compensation.as_mut().unwrap();
        cc.state = CompensationState::Skipped;
        cc.next_attempt_ms = None;
        cc.finished_ms = Some(T0 + 340);
        r.status = SagaStatus::Compensating;
        audit(
            &mut r,
            OperatorAction::Skip,
            Some(1),
            "refunded by hand",
            T0 + 340,
        );
        begin(&mut r, 0, c, T0 + 350);
        end(&mut r, &d, 0, c, ok(json!({"cancelled": true})), T0 + 360);
        follow(&mut r, &d, T0 + 370);
        out.push(("saga-compensated.json", r));
        out
    }

    fn path(name: &str) -> String {
        format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn golden_records_decode_and_encode_byte_for_byte() {
        for (name, rec) in records() {
            let bytes = crate::coordination::encode(&rec);
            if std::env::var_os("BATON_WRITE_GOLDEN").is_some() {
                std::fs::write(path(name), &bytes).unwrap();
            }
            let file = std::fs::read(path(name)).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                String::from_utf8_lossy(&file),
                "{name}: this version's encoding"
            );
            // (Not `decoded == rec`: an output of `null` reads back as no output.)
            let decoded: SagaRecord = serde_json::from_slice(&file).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&crate::coordination::encode(&decoded)),
                String::from_utf8_lossy(&file),
                "{name}: decoded and encoded again"
            );
        }
    }
}
