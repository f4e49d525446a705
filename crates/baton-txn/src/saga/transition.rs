//! Every change to a [`SagaRecord`], as one pure function: [`transition`] takes the record, an
//! event (an orchestrator's move, or an operator's request) and the time, and returns the
//! record to write — or nothing, when the event no longer fits the record (someone wrote in
//! between), or the operator's refusal. The orchestrator and `SagaLog` only persist what it
//! returns, so the rules of the saga live here, once for actions and compensations alike,
//! and are table-tested without Baton. No clock, no randomness, no I/O: the time and the
//! jitter of a retry pause are inputs.

use serde_json::Value;

use super::def::{StepError, StepSpec};
use super::error::SagaError;
use super::plan::{plan, Plan};
use super::record::{
    AuditEntry, OperatorAction, Phase, PhaseRecord, PhaseState, SagaRecord, SagaStatus,
};

/// How one attempt ended.
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    Ok(Value),
    Failed(StepError),
    /// Timed out or panicked: it may have taken effect.
    Unknown(String),
}

impl Outcome {
    /// The failure kind, for metrics: `ok`, `retryable`, `fatal`, `unknown`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Outcome::Ok(_) => "ok",
            Outcome::Failed(StepError::Retryable(_)) => "retryable",
            Outcome::Failed(StepError::Fatal(_)) => "fatal",
            Outcome::Unknown(_) => "unknown",
        }
    }
}

/// The orchestrator making a move: its tag (instance and fencing token, recorded in the
/// record) and the saga's step settings.
pub(crate) struct Driver<'a> {
    pub tag: &'a str,
    pub specs: &'a [&'a StepSpec],
}

/// An orchestrator's move. Every move but [`Move::End`] carries out a [`Plan`] and is made only
/// if the record's plan still is that one.
#[derive(Clone, Debug)]
pub(crate) enum Move<'a> {
    /// An attempt of `phase` of `step` starts ([`Plan::Run`]); it is called once recorded.
    Start { step: usize, phase: Phase },
    /// Attempt `attempt` of `phase` of `step` ended with `outcome`. `jitter`, uniform in
    /// `[0, 1]`, spreads the retry pause after a failure.
    End {
        step: usize,
        phase: Phase,
        attempt: u32,
        outcome: &'a Outcome,
        jitter: f64,
    },
    /// A new orchestrator found an attempt running whose result was never recorded
    /// ([`Plan::Interrupted`]).
    CutShort { step: usize, phase: Phase },
    /// Act on a requested cancel: compensate ([`Plan::Cancel`]).
    Cancel,
    /// Compensate a failed step of a still running saga ([`Plan::Fail`]).
    Fail,
    /// Every step is done ([`Plan::Complete`]).
    Complete,
    /// Nothing is left to compensate ([`Plan::Compensated`]).
    Compensated,
}

impl Move<'_> {
    /// The move that carries out `plan`, if it is one (not waiting or settled).
    pub(crate) fn carrying_out(plan: Plan) -> Option<Move<'static>> {
        Some(match plan {
            Plan::Settled | Plan::Wait(_) => return None,
            Plan::Run { step, phase } => Move::Start { step, phase },
            Plan::Interrupted { step, phase } => Move::CutShort { step, phase },
            Plan::Cancel => Move::Cancel,
            Plan::Fail => Move::Fail,
            Plan::Complete => Move::Complete,
            Plan::Compensated => Move::Compensated,
        })
    }

    /// The plan the move carries out (`None`: an attempt's result, which is checked against
    /// the attempt instead).
    fn plan(&self) -> Option<Plan> {
        Some(match *self {
            Move::Start { step, phase } => Plan::Run { step, phase },
            Move::CutShort { step, phase } => Plan::Interrupted { step, phase },
            Move::Cancel => Plan::Cancel,
            Move::Fail => Plan::Fail,
            Move::Complete => Plan::Complete,
            Move::Compensated => Plan::Compensated,
            Move::End { .. } => return None,
        })
    }
}

/// What an operator asks for (`SagaLog::cancel`, `retry_stuck`, `skip_step`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Request {
    /// Cancel a running saga.
    Cancel,
    /// Retry the stuck compensation.
    Retry,
    /// Skip the stuck compensation, of this step.
    Skip { step: usize },
}

/// Something that changes a saga.
#[derive(Clone, Debug)]
pub(crate) enum Event<'a> {
    /// The orchestrator moves.
    Orchestrator(&'a Driver<'a>, Move<'a>),
    /// An operator acts, audited with who and why.
    Operator {
        by: &'a str,
        reason: &'a str,
        request: Request,
    },
}

impl std::fmt::Debug for Driver<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.tag)
    }
}

/// The record `r` becomes on `event` at `now` (Unix ms): `Ok(None)` if the event does not fit
/// the record (nothing to write), an error if an operator's request is refused.
pub(crate) fn transition(
    r: &SagaRecord,
    event: &Event<'_>,
    now: u64,
) -> Result<Option<SagaRecord>, SagaError> {
    let mut next = r.clone();
    let changed = match event {
        Event::Orchestrator(driver, m) => {
            let changed = drive(&mut next, driver.specs, m, now);
            if changed {
                next.orchestrator = Some(driver.tag.to_string());
            }
            changed
        }
        Event::Operator {
            by,
            reason,
            request,
        } => operate(&mut next, *request, by, reason, now)?,
    };
    if !changed {
        return Ok(None);
    }
    next.updated_ms = now;
    Ok(Some(next))
}

fn drive(r: &mut SagaRecord, specs: &[&StepSpec], m: &Move<'_>, now: u64) -> bool {
    if let Some(expected) = m.plan() {
        if plan(r, now) != expected {
            return false;
        }
    }
    match *m {
        Move::Start { step, phase } => {
            let s = &mut r.steps[step];
            if phase == Phase::Action {
                s.started_ms.get_or_insert(now);
            }
            let Some(p) = s.phase_mut(phase) else {
                return false;
            };
            p.state = PhaseState::Running;
            p.attempts += 1;
            p.next_attempt_ms = None;
        }
        Move::End {
            step,
            phase,
            attempt,
            outcome,
            jitter,
        } => return end(r, specs, step, phase, attempt, outcome, jitter, now),
        Move::CutShort { step, phase } => {
            let s = &mut r.steps[step];
            let unknown = match phase {
                Phase::Action => {
                    s.outcome_unknown = true;
                    "; outcome unknown"
                }
                Phase::Compensation => "",
            };
            let Some(p) = s.phase_mut(phase) else {
                return false;
            };
            p.state = PhaseState::Pending;
            p.next_attempt_ms = None;
            p.last_error = Some(format!(
                "attempt {} was cut short (its orchestrator stopped){unknown}",
                p.attempts
            ));
        }
        Move::Cancel => {
            let why = r
                .audit
                .iter()
                .rev()
                .find(|a| a.action == OperatorAction::Cancel)
                .map(|a| format!("cancelled by {}: {}", a.by, a.reason))
                .unwrap_or_else(|| "cancelled".into());
            start_compensation(r, specs, why);
        }
        Move::Fail => start_compensation(r, specs, "a step failed".into()),
        Move::Complete => {
            r.status = SagaStatus::Completed;
            r.finished_ms = Some(now);
        }
        Move::Compensated => {
            r.status = SagaStatus::Compensated;
            r.finished_ms = Some(now);
        }
    }
    true
}

/// Records an attempt's outcome, if the step is still in that attempt. A failure is retried
/// after a pause until the phase's limit; then an action fails for good (the saga
/// compensates) and a compensation parks the saga ([`SagaStatus::Stuck`]).
#[allow(clippy::too_many_arguments)]
fn end(
    r: &mut SagaRecord,
    specs: &[&StepSpec],
    step: usize,
    phase: Phase,
    attempt: u32,
    outcome: &Outcome,
    jitter: f64,
    now: u64,
) -> bool {
    let spec = specs[step];
    let (status, policy, limit) = match phase {
        Phase::Action => (SagaStatus::Running, &spec.retry, spec.retry.max_attempts),
        Phase::Compensation => (
            SagaStatus::Compensating,
            &spec.compensation.retry,
            spec.compensation.park_after,
        ),
    };
    let s = &mut r.steps[step];
    match s.phase(phase) {
        Some(p)
            if r.status == status && p.state == PhaseState::Running && p.attempts == attempt => {}
        _ => return false,
    }
    let (error, fatal) = match outcome {
        Outcome::Ok(v) => {
            let p = s.phase_mut(phase).expect("checked above");
            p.state = PhaseState::Done;
            p.output = Some(v.clone());
            p.finished_ms = Some(now);
            return true;
        }
        Outcome::Failed(StepError::Retryable(e)) => (e.clone(), false),
        Outcome::Failed(StepError::Fatal(e)) => (e.clone(), true),
        Outcome::Unknown(e) => {
            // A compensation's unknown outcome is retried like any failure: running it again
            // is what it is for.
            if phase == Phase::Action {
                s.outcome_unknown = true;
            }
            (e.clone(), false)
        }
    };
    let p: &mut PhaseRecord = s.phase_mut(phase).expect("checked above");
    p.failures += 1;
    p.last_error = Some(format!("attempt {attempt}: {error}"));
    p.state = PhaseState::Pending;
    if !fatal && p.failures < limit {
        p.next_attempt_ms = Some(now + policy.delay_with(p.failures, jitter).as_millis() as u64);
        return true;
    }
    match phase {
        Phase::Action => {
            p.state = PhaseState::Failed;
            p.finished_ms = Some(now);
            let why = format!(
                "step {step} ({}) failed after {} attempt{}: {error}",
                spec.name,
                p.attempts,
                if p.attempts == 1 { "" } else { "s" }
            );
            start_compensation(r, specs, why);
        }
        Phase::Compensation => {
            p.next_attempt_ms = None;
            r.status = SagaStatus::Stuck {
                step,
                attempts: p.attempts,
                last_error: error,
            };
        }
    }
    true
}

/// Switches to compensating, planning a compensation for every compensable step that took
/// effect or may have (its outcome unknown).
fn start_compensation(r: &mut SagaRecord, specs: &[&StepSpec], reason: String) {
    r.status = SagaStatus::Compensating;
    r.reason = Some(reason);
    for (step, spec) in r.steps.iter_mut().zip(specs) {
        let took_effect = step.action.state == PhaseState::Done || step.outcome_unknown;
        if spec.compensable && took_effect && step.compensation.is_none() {
            step.compensation = Some(PhaseRecord::pending());
        }
    }
}

/// An operator's request, audited: `Ok(false)` if it changes nothing (cancelling a saga that
/// already compensates), an error if it is refused.
fn operate(
    r: &mut SagaRecord,
    request: Request,
    by: &str,
    reason: &str,
    now: u64,
) -> Result<bool, SagaError> {
    let (action, step) = match request {
        Request::Cancel => {
            match r.status {
                SagaStatus::Running if !r.cancel_requested => r.cancel_requested = true,
                SagaStatus::Completed => return Err(wrong_state(r, "cancel")),
                _ => return Ok(false),
            }
            (OperatorAction::Cancel, None)
        }
        Request::Retry | Request::Skip { .. } => {
            let retry = matches!(request, Request::Retry);
            let SagaStatus::Stuck { step: stuck, .. } = r.status else {
                return Err(wrong_state(r, if retry { "retry" } else { "skip" }));
            };
            if let Request::Skip { step } = request {
                if stuck != step {
                    return Err(SagaError::Invalid(format!(
                        "saga {} is stuck on step {stuck} ({}), not step {step}",
                        r.id, r.steps[stuck].name
                    )));
                }
            }
            let id = r.id.clone();
            let c = r
                .steps
                .get_mut(stuck)
                .and_then(|s| s.compensation.as_mut())
                .ok_or_else(|| {
                    SagaError::Corrupt(format!(
                        "saga {id} is stuck on step {stuck}, which has no compensation"
                    ))
                })?;
            c.next_attempt_ms = None;
            let action = if retry {
                c.failures = 0;
                OperatorAction::Retry
            } else {
                c.state = PhaseState::Skipped;
                c.finished_ms = Some(now);
                OperatorAction::Skip
            };
            r.status = SagaStatus::Compensating;
            (action, Some(stuck))
        }
    };
    r.audit.push(AuditEntry {
        at_ms: now,
        action,
        step,
        reason: reason.to_string(),
        by: by.to_string(),
    });
    Ok(true)
}

fn wrong_state(r: &SagaRecord, action: &'static str) -> SagaError {
    SagaError::WrongState {
        id: r.id.clone(),
        state: r.status.name(),
        action,
    }
}

#[cfg(test)]
mod tests {
    //! A table of (record, event) → record: each row starts from a new three-step saga (`a`
    //! and `c` compensable, `b` not; two attempts each; compensations parked after two
    //! failures; pauses of 200 ms without jitter, but `c`'s action with full jitter) changed
    //! by `given`, and expects `given` changed by `then` — plus, for every write,
    //! `updated_ms = NOW` and, for the orchestrator's, its tag in `orchestrator`.

    use serde_json::json;

    use super::*;
    use crate::saga::def::{CompensationPolicy, Jitter, RetryPolicy, SagaDef, StepCtx};

    const NOW: u64 = 1_000;
    const TAG: &str = "o1 (token 3)";
    const A: Phase = Phase::Action;
    const C: Phase = Phase::Compensation;

    fn noop(_: StepCtx<()>) -> crate::saga::BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(async { Ok(Value::Null) })
    }

    fn def() -> SagaDef<()> {
        let retry = RetryPolicy {
            max_attempts: 2,
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        let comp = CompensationPolicy {
            retry: retry.clone(),
            park_after: 2,
        };
        SagaDef::builder("t")
            .step("a", noop)
            .compensate(noop)
            .retry(retry.clone())
            .compensation_policy(comp.clone())
            .step("b", noop)
            .retry(retry.clone())
            .step("c", noop)
            .compensate(noop)
            .retry(RetryPolicy {
                jitter: Jitter::Full,
                ..retry
            })
            .compensation_policy(comp)
            .build()
            .unwrap()
    }

    /// How a row changes the new saga before the event.
    type Given = fn(&mut SagaRecord);

    /// What a row expects.
    enum Then {
        /// The record `given` made, changed so.
        Becomes(fn(&mut SagaRecord)),
        /// Nothing to write.
        Unchanged,
        /// This error.
        Refused(&'static str),
    }
    use Then::*;

    fn done(r: &mut SagaRecord, steps: &[usize]) {
        for &i in steps {
            let a = &mut r.steps[i].action;
            a.state = PhaseState::Done;
            a.attempts = 1;
        }
    }

    fn running(p: &mut PhaseRecord, attempt: u32) {
        p.state = PhaseState::Running;
        p.attempts = attempt;
        p.failures = attempt - 1;
    }

    /// `a` (and `c` if `both`) done and compensating, their compensations planned.
    fn compensating(r: &mut SagaRecord, both: bool) {
        done(r, &[0, 1]);
        r.status = SagaStatus::Compensating;
        r.reason = Some("x".into());
        r.steps[0].compensation = Some(PhaseRecord::pending());
        if both {
            done(r, &[2]);
            r.steps[2].compensation = Some(PhaseRecord::pending());
        }
    }

    fn comp(r: &mut SagaRecord, step: usize) -> &mut PhaseRecord {
        r.steps[step].compensation.as_mut().unwrap()
    }

    fn stuck(r: &mut SagaRecord) {
        compensating(r, false);
        let c = comp(r, 0);
        c.attempts = 2;
        c.failures = 2;
        c.last_error = Some("attempt 2: down".into());
        r.status = SagaStatus::Stuck {
            step: 0,
            attempts: 2,
            last_error: "down".into(),
        };
    }

    fn audit(r: &mut SagaRecord, action: OperatorAction, step: Option<usize>) {
        r.audit.push(AuditEntry {
            at_ms: NOW,
            action,
            step,
            reason: "asked".into(),
            by: "ops".into(),
        });
    }

    #[test]
    fn transitions() {
        let def = def();
        let specs = def.steps();
        let driver = Driver {
            tag: TAG,
            specs: &specs,
        };
        let ok = Outcome::Ok(json!({"id": 7}));
        let down = Outcome::Failed(StepError::Retryable("down".into()));
        let fatal = Outcome::Failed(StepError::Fatal("declined".into()));
        let timeout = Outcome::Unknown("timed out".into());
        let o = |m: Move<'static>| Event::Orchestrator(&driver, m);
        let end = |step, phase, attempt, outcome, jitter| {
            Event::Orchestrator(
                &driver,
                Move::End {
                    step,
                    phase,
                    attempt,
                    outcome,
                    jitter,
                },
            )
        };
        let op = |request| Event::Operator {
            by: "ops",
            reason: "asked",
            request,
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, Given, Event<'_>, Then)> = vec![
            // An action's attempts.
            ("the first action starts", |_| {}, o(Move::Start { step: 0, phase: A }), Becomes(|r| {
                running(&mut r.steps[0].action, 1);
                r.steps[0].started_ms = Some(NOW);
            })),
            ("a retry starts: the first start is kept, the pause ends", |r| {
                let a = &mut r.steps[0].action;
                (a.attempts, a.failures, a.next_attempt_ms) = (1, 1, Some(NOW));
                r.steps[0].started_ms = Some(5);
            }, o(Move::Start { step: 0, phase: A }), Becomes(|r| {
                running(&mut r.steps[0].action, 2);
                r.steps[0].action.next_attempt_ms = None;
            })),
            ("no start during the pause", |r| r.steps[0].action.next_attempt_ms = Some(NOW + 1),
                o(Move::Start { step: 0, phase: A }), Unchanged),
            ("no start of a later step", |_| {}, o(Move::Start { step: 1, phase: A }), Unchanged),
            ("the action succeeds", |r| running(&mut r.steps[0].action, 1),
                end(0, A, 1, &ok, 0.5), Becomes(|r| {
                let a = &mut r.steps[0].action;
                (a.state, a.output, a.finished_ms) = (PhaseState::Done, Some(json!({"id": 7})), Some(NOW));
            })),
            ("a retryable failure pauses", |r| running(&mut r.steps[0].action, 1),
                end(0, A, 1, &down, 0.5), Becomes(|r| {
                let a = &mut r.steps[0].action;
                (a.state, a.failures, a.next_attempt_ms) = (PhaseState::Pending, 1, Some(NOW + 200));
                a.last_error = Some("attempt 1: down".into());
            })),
            ("jitter spreads the pause", |r| { done(r, &[0, 1]); running(&mut r.steps[2].action, 1) },
                end(2, A, 1, &down, 0.25), Becomes(|r| {
                let a = &mut r.steps[2].action;
                (a.state, a.failures, a.next_attempt_ms) = (PhaseState::Pending, 1, Some(NOW + 50));
                a.last_error = Some("attempt 1: down".into());
            })),
            ("an unknown outcome pauses and is remembered", |r| running(&mut r.steps[0].action, 1),
                end(0, A, 1, &timeout, 0.5), Becomes(|r| {
                r.steps[0].outcome_unknown = true;
                let a = &mut r.steps[0].action;
                (a.state, a.failures, a.next_attempt_ms) = (PhaseState::Pending, 1, Some(NOW + 200));
                a.last_error = Some("attempt 1: timed out".into());
            })),
            ("out of attempts: failed, what took effect compensates", |r| {
                done(r, &[0, 1]);
                running(&mut r.steps[2].action, 2);
            }, end(2, A, 2, &down, 0.5), Becomes(|r| {
                let a = &mut r.steps[2].action;
                (a.state, a.failures, a.finished_ms) = (PhaseState::Failed, 2, Some(NOW));
                a.last_error = Some("attempt 2: down".into());
                r.status = SagaStatus::Compensating;
                r.reason = Some("step 2 (c) failed after 2 attempts: down".into());
                r.steps[0].compensation = Some(PhaseRecord::pending());
            })),
            ("a fatal error fails at once; an unknown outcome is compensated", |r| {
                running(&mut r.steps[0].action, 1);
                r.steps[0].outcome_unknown = true;
            }, end(0, A, 1, &fatal, 0.5), Becomes(|r| {
                let a = &mut r.steps[0].action;
                (a.state, a.failures, a.finished_ms) = (PhaseState::Failed, 1, Some(NOW));
                a.last_error = Some("attempt 1: declined".into());
                r.status = SagaStatus::Compensating;
                r.reason = Some("step 0 (a) failed after 1 attempt: declined".into());
                r.steps[0].compensation = Some(PhaseRecord::pending());
            })),
            ("the result of an older attempt", |r| running(&mut r.steps[0].action, 2),
                end(0, A, 1, &ok, 0.5), Unchanged),
            ("an action's result while compensating", |r| {
                running(&mut r.steps[0].action, 1);
                r.status = SagaStatus::Compensating;
            }, end(0, A, 1, &ok, 0.5), Unchanged),
            ("an action cut short", |r| running(&mut r.steps[0].action, 1),
                o(Move::CutShort { step: 0, phase: A }), Becomes(|r| {
                r.steps[0].outcome_unknown = true;
                let a = &mut r.steps[0].action;
                a.state = PhaseState::Pending;
                a.last_error = Some("attempt 1 was cut short (its orchestrator stopped); outcome unknown".into());
            })),
            ("a cancel waits for the attempt cut short", |r| {
                running(&mut r.steps[0].action, 1);
                r.cancel_requested = true;
            }, o(Move::Cancel), Unchanged),
            ("a cancel compensates, saying who asked", |r| {
                done(r, &[0]);
                r.cancel_requested = true;
                audit(r, OperatorAction::Cancel, None);
            }, o(Move::Cancel), Becomes(|r| {
                r.status = SagaStatus::Compensating;
                r.reason = Some("cancelled by ops: asked".into());
                r.steps[0].compensation = Some(PhaseRecord::pending());
            })),
            ("a failed step of a running saga compensates", |r| {
                done(r, &[0]);
                r.steps[1].action.state = PhaseState::Failed;
            }, o(Move::Fail), Becomes(|r| {
                r.status = SagaStatus::Compensating;
                r.reason = Some("a step failed".into());
                r.steps[0].compensation = Some(PhaseRecord::pending());
            })),
            ("every step done: completed", |r| done(r, &[0, 1, 2]), o(Move::Complete), Becomes(|r| {
                (r.status, r.finished_ms) = (SagaStatus::Completed, Some(NOW));
            })),
            ("not completed before the last step", |r| done(r, &[0, 1]), o(Move::Complete), Unchanged),
            // A compensation's attempts.
            ("a compensation starts", |r| compensating(r, false),
                o(Move::Start { step: 0, phase: C }), Becomes(|r| running(comp(r, 0), 1))),
            ("compensations run in reverse step order", |r| compensating(r, true),
                o(Move::Start { step: 0, phase: C }), Unchanged),
            ("a compensation succeeds", |r| { compensating(r, false); running(comp(r, 0), 1) },
                end(0, C, 1, &ok, 0.5), Becomes(|r| {
                let c = comp(r, 0);
                (c.state, c.output, c.finished_ms) = (PhaseState::Done, Some(json!({"id": 7})), Some(NOW));
            })),
            ("a failed compensation pauses", |r| { compensating(r, false); running(comp(r, 0), 1) },
                end(0, C, 1, &down, 0.5), Becomes(|r| {
                let c = comp(r, 0);
                (c.state, c.failures, c.next_attempt_ms) = (PhaseState::Pending, 1, Some(NOW + 200));
                c.last_error = Some("attempt 1: down".into());
            })),
            ("a compensation's unknown outcome is a plain failure", |r| {
                compensating(r, false);
                running(comp(r, 0), 1);
            }, end(0, C, 1, &timeout, 0.5), Becomes(|r| {
                let c = comp(r, 0);
                (c.state, c.failures, c.next_attempt_ms) = (PhaseState::Pending, 1, Some(NOW + 200));
                c.last_error = Some("attempt 1: timed out".into());
            })),
            ("a compensation parks after its budget", |r| { compensating(r, false); running(comp(r, 0), 2) },
                end(0, C, 2, &down, 0.5), Becomes(|r| {
                let c = comp(r, 0);
                (c.state, c.failures) = (PhaseState::Pending, 2);
                c.last_error = Some("attempt 2: down".into());
                r.status = SagaStatus::Stuck { step: 0, attempts: 2, last_error: "down".into() };
            })),
            ("a fatal compensation parks at once", |r| { compensating(r, false); running(comp(r, 0), 1) },
                end(0, C, 1, &fatal, 0.5), Becomes(|r| {
                let c = comp(r, 0);
                (c.state, c.failures) = (PhaseState::Pending, 1);
                c.last_error = Some("attempt 1: declined".into());
                r.status = SagaStatus::Stuck { step: 0, attempts: 1, last_error: "declined".into() };
            })),
            ("a compensation's result when stuck", |r| { stuck(r); running(comp(r, 0), 2) },
                end(0, C, 2, &ok, 0.5), Unchanged),
            ("a compensation cut short", |r| { compensating(r, false); running(comp(r, 0), 1) },
                o(Move::CutShort { step: 0, phase: C }), Becomes(|r| {
                let c = comp(r, 0);
                c.state = PhaseState::Pending;
                c.last_error = Some("attempt 1 was cut short (its orchestrator stopped)".into());
            })),
            ("every compensation done or skipped: compensated", |r| {
                compensating(r, true);
                comp(r, 0).state = PhaseState::Skipped;
                comp(r, 2).state = PhaseState::Done;
            }, o(Move::Compensated), Becomes(|r| {
                (r.status, r.finished_ms) = (SagaStatus::Compensated, Some(NOW));
            })),
            ("not compensated while one is open", |r| compensating(r, false), o(Move::Compensated), Unchanged),
            // Operators.
            ("cancel a running saga", |_| {}, op(Request::Cancel), Becomes(|r| {
                r.cancel_requested = true;
                audit(r, OperatorAction::Cancel, None);
            })),
            ("cancel twice", |r| r.cancel_requested = true, op(Request::Cancel), Unchanged),
            ("cancel a compensating saga", |r| compensating(r, false), op(Request::Cancel), Unchanged),
            ("cancel a completed saga", |r| r.status = SagaStatus::Completed, op(Request::Cancel),
                Refused("saga s1 is completed: cannot cancel it")),
            ("retry a stuck compensation", stuck, op(Request::Retry), Becomes(|r| {
                comp(r, 0).failures = 0;
                r.status = SagaStatus::Compensating;
                audit(r, OperatorAction::Retry, Some(0));
            })),
            ("retry a running saga", |_| {}, op(Request::Retry),
                Refused("saga s1 is running: cannot retry it")),
            ("skip a stuck compensation", stuck, op(Request::Skip { step: 0 }), Becomes(|r| {
                let c = comp(r, 0);
                (c.state, c.finished_ms) = (PhaseState::Skipped, Some(NOW));
                r.status = SagaStatus::Compensating;
                audit(r, OperatorAction::Skip, Some(0));
            })),
            ("skip another step", stuck, op(Request::Skip { step: 2 }),
                Refused("saga s1 is stuck on step 0 (a), not step 2")),
            ("skip in a compensating saga", |r| compensating(r, false), op(Request::Skip { step: 0 }),
                Refused("saga s1 is compensating: cannot skip it")),
            ("stuck on a step without a compensation", |r| {
                stuck(r);
                r.status = SagaStatus::Stuck { step: 1, attempts: 1, last_error: "?".into() };
            }, op(Request::Retry),
                Refused("saga record: saga s1 is stuck on step 1, which has no compensation")),
        ];
        for (name, given, event, then) in cases {
            let mut before = def.new_record("s1", &(), 0).unwrap();
            given(&mut before);
            let got = transition(&before, &event, NOW);
            match (then, got) {
                (Becomes(change), Ok(Some(after))) => {
                    let mut want = before.clone();
                    change(&mut want);
                    want.updated_ms = NOW;
                    if let Event::Orchestrator(..) = event {
                        want.orchestrator = Some(TAG.into());
                    }
                    assert_eq!(after, want, "{name}");
                }
                (Unchanged, Ok(None)) => {}
                (Refused(message), Err(e)) => assert_eq!(e.to_string(), message, "{name}"),
                (_, got) => panic!("{name}: unexpected {got:?}"),
            }
        }
    }

    #[test]
    fn move_carries_out_its_plan() {
        for plan in [
            Plan::Run { step: 1, phase: C },
            Plan::Interrupted { step: 2, phase: A },
            Plan::Cancel,
            Plan::Fail,
            Plan::Complete,
            Plan::Compensated,
        ] {
            assert_eq!(Move::carrying_out(plan).unwrap().plan(), Some(plan));
        }
        assert!(Move::carrying_out(Plan::Settled).is_none());
        assert!(Move::carrying_out(Plan::Wait(5)).is_none());
    }
}
