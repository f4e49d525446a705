//! The next move for a saga, decided from its record alone — so any orchestrator reading the
//! same record decides the same, and a new leader picks up exactly where the old one stopped.
//! Read-only: `transition` makes the move (and checks, against the record it is given, that
//! the move is still the plan).

use super::record::{Phase, PhaseState, SagaRecord, SagaStatus};

/// The next thing to do for a saga.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
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

/// The plan for `r` at `now` (Unix ms).
pub(crate) fn plan(r: &SagaRecord, now: u64) -> Plan {
    match r.status {
        SagaStatus::Completed | SagaStatus::Compensated | SagaStatus::Stuck { .. } => Plan::Settled,
        SagaStatus::Running => {
            let phase = Phase::Action;
            if let Some(step) = r
                .steps
                .iter()
                .position(|s| s.action.state == PhaseState::Running)
            {
                return Plan::Interrupted { step, phase };
            }
            if r.cancel_requested {
                return Plan::Cancel;
            }
            let Some(step) = r
                .steps
                .iter()
                .position(|s| s.action.state != PhaseState::Done)
            else {
                return Plan::Complete;
            };
            let a = &r.steps[step].action;
            match a.state {
                PhaseState::Pending => match a.next_attempt_ms {
                    Some(due) if due > now => Plan::Wait(due),
                    _ => Plan::Run { step, phase },
                },
                _ => Plan::Fail,
            }
        }
        SagaStatus::Compensating => {
            let phase = Phase::Compensation;
            // The highest step whose compensation is still open: compensations run one at a
            // time, in reverse step order.
            let next = r.steps.iter().enumerate().rev().find_map(|(i, s)| {
                s.compensation.as_ref().and_then(|c| match c.state {
                    PhaseState::Pending | PhaseState::Running => Some((i, c)),
                    _ => None,
                })
            });
            match next {
                None => Plan::Compensated,
                Some((step, c)) if c.state == PhaseState::Running => {
                    Plan::Interrupted { step, phase }
                }
                Some((step, c)) => match c.next_attempt_ms {
                    Some(due) if due > now => Plan::Wait(due),
                    _ => Plan::Run { step, phase },
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! A table of (record, time) → plan, each record a new three-step saga (`a` and `c`
    //! compensable) changed by `given`.

    use serde_json::Value;

    use super::*;
    use crate::saga::def::{SagaDef, StepCtx, StepError};
    use crate::saga::record::PhaseRecord;

    const A: Phase = Phase::Action;
    const C: Phase = Phase::Compensation;

    fn noop(_: StepCtx<()>) -> crate::saga::BoxFuture<'static, Result<Value, StepError>> {
        Box::pin(async { Ok(Value::Null) })
    }

    fn done(r: &mut SagaRecord, steps: &[usize]) {
        for &i in steps {
            r.steps[i].action.state = PhaseState::Done;
        }
    }

    /// Compensating `a` and `c` (both done).
    fn compensating(r: &mut SagaRecord) {
        done(r, &[0, 1, 2]);
        r.status = SagaStatus::Compensating;
        for i in [0, 2] {
            r.steps[i].compensation = Some(PhaseRecord::pending());
        }
    }

    fn comp(r: &mut SagaRecord, step: usize) -> &mut PhaseRecord {
        r.steps[step].compensation.as_mut().unwrap()
    }

    /// How a row changes the new saga.
    type Given = fn(&mut SagaRecord);

    #[test]
    fn plans() {
        let def = SagaDef::builder("t")
            .step("a", noop)
            .compensate(noop)
            .step("b", noop)
            .step("c", noop)
            .compensate(noop)
            .build()
            .unwrap();
        #[rustfmt::skip]
        let cases: Vec<(&str, Given, u64, Plan)> = vec![
            ("a new saga runs its first step", |_| {}, 0, Plan::Run { step: 0, phase: A }),
            ("then the next", |r| done(r, &[0]), 0, Plan::Run { step: 1, phase: A }),
            ("a retry pause", |r| r.steps[0].action.next_attempt_ms = Some(200), 100, Plan::Wait(200)),
            ("a retry pause ends", |r| r.steps[0].action.next_attempt_ms = Some(200), 200,
                Plan::Run { step: 0, phase: A }),
            ("a running action was cut short", |r| r.steps[1].action.state = PhaseState::Running, 0,
                Plan::Interrupted { step: 1, phase: A }),
            ("a cut-short attempt before a cancel", |r| {
                r.steps[0].action.state = PhaseState::Running;
                r.cancel_requested = true;
            }, 0, Plan::Interrupted { step: 0, phase: A }),
            ("a cancel before the next step", |r| { done(r, &[0]); r.cancel_requested = true }, 0,
                Plan::Cancel),
            ("a cancel before the retry pause ends", |r| {
                r.steps[0].action.next_attempt_ms = Some(200);
                r.cancel_requested = true;
            }, 100, Plan::Cancel),
            ("a failed step in a running saga", |r| r.steps[0].action.state = PhaseState::Failed, 0,
                Plan::Fail),
            ("every step done", |r| done(r, &[0, 1, 2]), 0, Plan::Complete),
            ("compensations in reverse order", compensating, 0, Plan::Run { step: 2, phase: C }),
            ("then the earlier one", |r| { compensating(r); comp(r, 2).state = PhaseState::Done }, 0,
                Plan::Run { step: 0, phase: C }),
            ("a skipped one counts as finished", |r| {
                compensating(r);
                comp(r, 2).state = PhaseState::Skipped;
            }, 0, Plan::Run { step: 0, phase: C }),
            ("a running compensation was cut short", |r| {
                compensating(r);
                comp(r, 2).state = PhaseState::Running;
            }, 0, Plan::Interrupted { step: 2, phase: C }),
            ("a compensation's retry pause", |r| {
                compensating(r);
                comp(r, 2).next_attempt_ms = Some(200);
            }, 100, Plan::Wait(200)),
            ("nothing left to compensate", |r| {
                compensating(r);
                comp(r, 0).state = PhaseState::Done;
                comp(r, 2).state = PhaseState::Skipped;
            }, 0, Plan::Compensated),
            ("stuck", |r| {
                compensating(r);
                r.status = SagaStatus::Stuck { step: 2, attempts: 1, last_error: "x".into() };
            }, 0, Plan::Settled),
            ("completed", |r| r.status = SagaStatus::Completed, 0, Plan::Settled),
            ("compensated", |r| r.status = SagaStatus::Compensated, 0, Plan::Settled),
        ];
        for (name, given, now, want) in cases {
            let mut r = def.new_record("s1", &(), 0).unwrap();
            given(&mut r);
            assert_eq!(plan(&r, now), want, "{name}");
        }
    }
}
