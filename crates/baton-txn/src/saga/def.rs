//! Saga definitions: ordered steps, each an action with an optional compensation, a retry
//! policy and a timeout.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::error::SagaError;
use super::record::{Phase, SagaRecord, SagaStatus, StepRecord};

/// A boxed, sendable future: actions are stored as trait objects, so one orchestrator can
/// hold many definitions with different step types.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How an action or a compensation failed. Returning an error says the call's effect did
/// **not** happen (its local transaction rolled back); an outcome the step cannot vouch for
/// (a request sent, no answer) must be left to the step's timeout, which the orchestrator
/// treats as "may have happened".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// May pass if tried again (a service down, a serialization failure): retried under the
    /// step's [`RetryPolicy`].
    #[error("{0}")]
    Retryable(String),
    /// Will not pass however often it is tried (a declined card, no stock): a forward step
    /// stops retrying and the saga compensates; a compensation parks the saga as
    /// [`super::SagaStatus::Stuck`] at once.
    #[error("{0}")]
    Fatal(String),
}

impl StepError {
    /// A [`StepError::Retryable`] with `e`'s text.
    pub fn retryable(e: impl fmt::Display) -> StepError {
        StepError::Retryable(e.to_string())
    }
    /// A [`StepError::Fatal`] with `e`'s text.
    pub fn fatal(e: impl fmt::Display) -> StepError {
        StepError::Fatal(e.to_string())
    }
}

/// What an action or compensation is told about its call.
///
/// The idempotency keys are the point: they are derived from the namespace, the saga id and
/// the step name only, so every attempt — including the re-run by a new orchestrator after a
/// crash — carries the same key, and a participant that records the key with its effect (see
/// `StepFence`, feature `postgres`) applies the effect once however often it is asked.
pub struct StepCtx<D> {
    pub(crate) saga_id: Arc<str>,
    pub(crate) definition: Arc<str>,
    pub(crate) step: usize,
    pub(crate) step_name: Arc<str>,
    pub(crate) phase: Phase,
    pub(crate) attempt: u32,
    pub(crate) step_key: Arc<str>,
    pub(crate) data: Arc<D>,
    pub(crate) output: Option<Value>,
}

impl<D> Clone for StepCtx<D> {
    fn clone(&self) -> Self {
        StepCtx {
            saga_id: self.saga_id.clone(),
            definition: self.definition.clone(),
            step: self.step,
            step_name: self.step_name.clone(),
            phase: self.phase,
            attempt: self.attempt,
            step_key: self.step_key.clone(),
            data: self.data.clone(),
            output: self.output.clone(),
        }
    }
}

impl<D> fmt::Debug for StepCtx<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepCtx")
            .field("saga_id", &self.saga_id)
            .field("step", &self.step)
            .field("step_name", &self.step_name)
            .field("phase", &self.phase)
            .field("attempt", &self.attempt)
            .field("key", &self.key())
            .finish_non_exhaustive()
    }
}

impl<D> StepCtx<D> {
    /// The saga's id.
    pub fn saga_id(&self) -> &str {
        &self.saga_id
    }
    /// The definition's name.
    pub fn definition(&self) -> &str {
        &self.definition
    }
    /// The step's index (0-based).
    pub fn step(&self) -> usize {
        self.step
    }
    /// The step's name.
    pub fn step_name(&self) -> &str {
        &self.step_name
    }
    /// Action or compensation.
    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// The attempt number of this phase of the step, from 1. Counts every attempt started,
    /// including one cut short by an orchestrator crash.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// The idempotency key of this call: `<namespace>/<saga id>/<step>` for the action,
    /// `<namespace>/<saga id>/<step>/undo` for the compensation. The same for every attempt.
    pub fn key(&self) -> String {
        match self.phase {
            Phase::Action => self.step_key.to_string(),
            Phase::Compensation => format!("{}/undo", self.step_key),
        }
    }
    /// The step's key, `<namespace>/<saga id>/<step>`, for both halves: a participant's step
    /// fence keeps one row per step under it, so the compensation finds what the action did
    /// (or leaves a tombstone that refuses a late action).
    pub fn step_key(&self) -> &str {
        &self.step_key
    }
    /// The saga's data.
    pub fn data(&self) -> &D {
        &self.data
    }
    /// For a compensation: what the action returned, if it is known to have completed
    /// (`None` when its outcome is unknown, after a timeout: the compensation must then
    /// tolerate finding nothing to undo).
    pub fn output(&self) -> Option<&Value> {
        self.output.as_ref()
    }
}

/// An action or a compensation. Implemented for every `Fn(StepCtx<D>) -> impl Future<Output
/// = Result<Value, StepError>>` closure; the value is recorded in the saga log and given to
/// the compensation (an action's output) or shown to operators.
pub trait Action<D>: Send + Sync + 'static {
    /// Runs one attempt.
    fn call(&self, cx: StepCtx<D>) -> BoxFuture<'static, Result<Value, StepError>>;
}

impl<D, F, Fut> Action<D> for F
where
    F: Fn(StepCtx<D>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, StepError>> + Send + 'static,
{
    fn call(&self, cx: StepCtx<D>) -> BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(self(cx))
    }
}

/// How jitter spreads the retry pauses (so many sagas failing on one outage do not retry in
/// lock-step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Exactly the exponential pause.
    None,
    /// Uniform in `[0, pause]` ("full jitter": spreads best, may retry at once).
    Full,
    /// Uniform in `[pause / 2, pause]`: spread, but never much sooner than planned.
    Equal,
}

/// Retries with exponential backoff: the pause after the `n`-th failure is
/// `min(initial × multiplier^(n-1), max_interval)`, spread by `jitter`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// The pause after the first failure.
    pub initial: Duration,
    /// Growth per failure.
    pub multiplier: f64,
    /// The longest pause.
    pub max_interval: Duration,
    /// A forward step fails for good after this many failed attempts (at least 1). Not used
    /// for compensations, which are parked after [`CompensationPolicy::park_after`] instead.
    pub max_attempts: u32,
    /// The spread.
    pub jitter: Jitter,
}

impl Default for RetryPolicy {
    /// 200 ms, ×2, at most 30 s, 5 attempts, full jitter.
    fn default() -> Self {
        RetryPolicy {
            initial: Duration::from_millis(200),
            multiplier: 2.0,
            max_interval: Duration::from_secs(30),
            max_attempts: 5,
            jitter: Jitter::Full,
        }
    }
}

impl RetryPolicy {
    /// The pause after the `failures`-th failure before jitter.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let exp = self
            .multiplier
            .max(1.0)
            .powi(failures.saturating_sub(1).min(64) as i32);
        let secs = (self.initial.as_secs_f64() * exp).min(self.max_interval.as_secs_f64());
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// The pause after the `failures`-th failure, jitter applied.
    pub fn delay(&self, failures: u32) -> Duration {
        self.delay_with(failures, rand::thread_rng().gen_range(0.0..=1.0))
    }

    /// The pause after the `failures`-th failure, the jitter drawn from `sample` (uniform in
    /// `[0, 1]`): randomness as an input, for the saga's pure `transition`.
    pub fn delay_with(&self, failures: u32, sample: f64) -> Duration {
        let ceiling = self.ceiling(failures);
        let sample = sample.clamp(0.0, 1.0);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => ceiling.mul_f64(sample),
            Jitter::Equal => ceiling.mul_f64(0.5 + 0.5 * sample),
        }
    }
}

/// How a compensation is retried. A compensation has no "give up and go on" — the effect it
/// undoes would stay — so instead of a last attempt it has a point at which the saga is
/// *parked* as [`super::SagaStatus::Stuck`]: visible, and retried or skipped by an operator.
#[derive(Debug, Clone, PartialEq)]
pub struct CompensationPolicy {
    /// The pauses between attempts (its `max_attempts` is not used).
    pub retry: RetryPolicy,
    /// Park after this many failed attempts in a row (at least 1).
    pub park_after: u32,
}

impl Default for CompensationPolicy {
    /// The default [`RetryPolicy`] pauses, parked after 10 failures.
    fn default() -> Self {
        CompensationPolicy {
            retry: RetryPolicy::default(),
            park_after: 10,
        }
    }
}

/// The settings of one step (everything but its code).
#[derive(Debug, Clone)]
pub struct StepSpec {
    /// The name (unique within the definition; part of the idempotency keys).
    pub name: String,
    /// Whether the step has a compensation.
    pub compensable: bool,
    /// The action's retries.
    pub retry: RetryPolicy,
    /// The compensation's retries and parking.
    pub compensation: CompensationPolicy,
    /// How long one attempt (of the action or the compensation) may take; past it the attempt
    /// is abandoned and counts as a retryable failure whose outcome is unknown. `None` (the
    /// default): no limit — a call that never answers holds its saga until an operator
    /// cancels it, so set one for any call that crosses a network.
    pub timeout: Option<Duration>,
}

struct Step<D> {
    spec: StepSpec,
    action: Arc<dyn Action<D>>,
    compensation: Option<Arc<dyn Action<D>>>,
}

/// A saga definition: a name and ordered steps. Build one with [`SagaDef::builder`].
///
/// ```
/// use baton_txn::saga::{SagaDef, StepCtx, StepError, RetryPolicy};
/// use serde_json::{json, Value};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Order { id: String, cents: i64 }
///
/// async fn charge(cx: StepCtx<Order>) -> Result<Value, StepError> {
///     // Call the payment service with cx.key() as its idempotency key.
///     Ok(json!({ "charged": cx.data().cents }))
/// }
/// async fn refund(cx: StepCtx<Order>) -> Result<Value, StepError> {
///     Ok(json!({ "refunded": cx.output().is_some() }))
/// }
///
/// let def = SagaDef::<Order>::builder("order")
///     .step("charge_card", charge)
///     .compensate(refund)
///     .retry(RetryPolicy { max_attempts: 3, ..RetryPolicy::default() })
///     .step("notify", |_cx: StepCtx<Order>| async { Ok(Value::Null) })
///     .build()
///     .unwrap();
/// assert_eq!(def.steps().len(), 2);
/// ```
pub struct SagaDef<D> {
    name: String,
    steps: Vec<Step<D>>,
}

impl<D> fmt::Debug for SagaDef<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SagaDef")
            .field("name", &self.name)
            .field(
                "steps",
                &self.steps().iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl<D> SagaDef<D> {
    /// Starts a definition named `name`.
    pub fn builder(name: impl Into<String>) -> SagaBuilder<D> {
        SagaBuilder {
            name: name.into(),
            steps: Vec::new(),
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The steps' settings, in order.
    pub fn steps(&self) -> Vec<&StepSpec> {
        self.steps.iter().map(|s| &s.spec).collect()
    }
}

/// Builds a [`SagaDef`]: add steps with [`SagaBuilder::step`].
pub struct SagaBuilder<D> {
    name: String,
    steps: Vec<Step<D>>,
}

impl<D> SagaBuilder<D> {
    /// Adds a step running `action`; the returned builder sets the step's compensation,
    /// retries and timeout.
    pub fn step(mut self, name: impl Into<String>, action: impl Action<D>) -> StepBuilder<D> {
        self.steps.push(Step {
            spec: StepSpec {
                name: name.into(),
                compensable: false,
                retry: RetryPolicy::default(),
                compensation: CompensationPolicy::default(),
                timeout: None,
            },
            action: Arc::new(action),
            compensation: None,
        });
        StepBuilder { saga: self }
    }
}

/// Sets up the step just added (and adds further steps, or builds).
pub struct StepBuilder<D> {
    saga: SagaBuilder<D>,
}

impl<D> StepBuilder<D> {
    fn last(&mut self) -> &mut Step<D> {
        self.saga
            .steps
            .last_mut()
            .expect("a StepBuilder exists only after a step was added")
    }

    /// The step's compensation: undoes the action's effect (semantically: a refund for a
    /// charge), run in reverse step order when a later step fails or the saga is cancelled.
    pub fn compensate(mut self, undo: impl Action<D>) -> Self {
        let step = self.last();
        step.compensation = Some(Arc::new(undo));
        step.spec.compensable = true;
        self
    }

    /// The action's retries.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.last().spec.retry = policy;
        self
    }

    /// The compensation's retries and when it parks the saga.
    pub fn compensation_policy(mut self, policy: CompensationPolicy) -> Self {
        self.last().spec.compensation = policy;
        self
    }

    /// The time one attempt may take (action and compensation alike).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.last().spec.timeout = Some(timeout);
        self
    }

    /// Adds the next step.
    pub fn step(self, name: impl Into<String>, action: impl Action<D>) -> StepBuilder<D> {
        self.saga.step(name, action)
    }

    /// The definition; refused if a name is invalid or two steps share one (the step name is
    /// part of the idempotency keys, so it must be unique and stable), or a policy allows no
    /// attempt.
    pub fn build(self) -> Result<SagaDef<D>, SagaError> {
        let SagaBuilder { name, steps } = self.saga;
        check_name("definition", &name)?;
        for (i, s) in steps.iter().enumerate() {
            check_name("step", &s.spec.name)?;
            if steps[..i].iter().any(|o| o.spec.name == s.spec.name) {
                return Err(SagaError::Definition(format!(
                    "{name}: two steps are named {:?}",
                    s.spec.name
                )));
            }
            if s.spec.retry.max_attempts == 0 || s.spec.compensation.park_after == 0 {
                return Err(SagaError::Definition(format!(
                    "{name}: step {:?} allows no attempt (max_attempts and park_after must be at least 1)",
                    s.spec.name
                )));
            }
        }
        Ok(SagaDef { name, steps })
    }
}

/// Names of definitions and steps: 1-64 of `[A-Za-z0-9_.-]` (they appear in keys and metric
/// labels).
fn check_name(what: &str, name: &str) -> Result<(), SagaError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(SagaError::Definition(format!(
            "invalid {what} name {name:?}: use 1-64 of [A-Za-z0-9_.-]"
        )))
    }
}

/// What the orchestrator needs from a definition, without its data type: the steps' settings
/// and a way to call a step with the saga's data as stored (JSON).
pub(crate) trait DynSaga: Send + Sync {
    fn specs(&self) -> Vec<&StepSpec>;
    /// The call of `phase` of step `cx.step`, or a fatal error if the stored data does not
    /// decode as this definition's data type.
    fn call(
        &self,
        cx: CallCtx,
        data: &Value,
    ) -> Result<BoxFuture<'static, Result<Value, StepError>>, StepError>;
}

/// A [`StepCtx`] without the data.
pub(crate) struct CallCtx {
    pub saga_id: Arc<str>,
    pub step: usize,
    pub phase: Phase,
    pub attempt: u32,
    pub step_key: Arc<str>,
    pub output: Option<Value>,
}

impl<D> DynSaga for SagaDef<D>
where
    D: DeserializeOwned + Send + Sync + 'static,
{
    fn specs(&self) -> Vec<&StepSpec> {
        self.steps()
    }

    fn call(
        &self,
        cx: CallCtx,
        data: &Value,
    ) -> Result<BoxFuture<'static, Result<Value, StepError>>, StepError> {
        let step = &self.steps[cx.step];
        let f = match cx.phase {
            Phase::Action => &step.action,
            Phase::Compensation => step.compensation.as_ref().ok_or_else(|| {
                StepError::Fatal(format!("step {} has no compensation", step.spec.name))
            })?,
        };
        let data: D = serde_json::from_value(data.clone()).map_err(|e| {
            StepError::Fatal(format!(
                "the saga's data does not decode as {}'s data: {e}",
                self.name
            ))
        })?;
        Ok(f.call(StepCtx {
            saga_id: cx.saga_id,
            definition: self.name.as_str().into(),
            step: cx.step,
            step_name: step.spec.name.as_str().into(),
            phase: cx.phase,
            attempt: cx.attempt,
            step_key: cx.step_key,
            data: Arc::new(data),
            output: cx.output,
        }))
    }
}

/// Encodes a saga's data for the log.
pub(crate) fn encode_data<D: Serialize>(data: &D) -> Result<Value, SagaError> {
    serde_json::to_value(data).map_err(|e| SagaError::Definition(format!("data: {e}")))
}

impl<D: Serialize> SagaDef<D> {
    /// The record of a new saga of this definition with `data`, running, started at `now`
    /// (Unix ms).
    pub(crate) fn new_record(&self, id: &str, data: &D, now: u64) -> Result<SagaRecord, SagaError> {
        Ok(SagaRecord {
            id: id.to_string(),
            definition: self.name().to_string(),
            data: encode_data(data)?,
            status: SagaStatus::Running,
            steps: self
                .steps()
                .iter()
                .map(|s| StepRecord::pending(&s.name))
                .collect(),
            reason: None,
            cancel_requested: false,
            audit: Vec::new(),
            created_ms: now,
            updated_ms: now,
            finished_ms: None,
            orchestrator: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop(_: StepCtx<()>) -> BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(async { Ok(Value::Null) })
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            initial: Duration::from_millis(100),
            multiplier: 2.0,
            max_interval: Duration::from_millis(500),
            max_attempts: 5,
            jitter: Jitter::None,
        };
        let pauses: Vec<u128> = (1..=5).map(|n| p.delay(n).as_millis()).collect();
        assert_eq!(pauses, vec![100, 200, 400, 500, 500]);
        let full = RetryPolicy {
            jitter: Jitter::Full,
            ..p.clone()
        };
        let equal = RetryPolicy {
            jitter: Jitter::Equal,
            ..p
        };
        for _ in 0..200 {
            assert!(full.delay(3) <= Duration::from_millis(400));
            let d = equal.delay(3);
            assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(400));
        }
    }

    #[test]
    fn step_names_are_unique_and_plain() {
        let dup = SagaDef::<()>::builder("s")
            .step("a", noop)
            .step("a", noop)
            .build();
        assert!(matches!(dup, Err(SagaError::Definition(m)) if m.contains("two steps")));
        let slash = SagaDef::<()>::builder("s").step("a/b", noop).build();
        assert!(slash.is_err());
        let ok = SagaDef::<()>::builder("s")
            .step("a", noop)
            .compensate(noop)
            .step("b", noop)
            .build()
            .unwrap();
        let specs = ok.steps();
        assert!(specs[0].compensable && !specs[1].compensable);
    }
}
