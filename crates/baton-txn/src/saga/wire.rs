//! The stored JSON of a step, exactly as the first version of the saga log wrote it: the
//! action's fields at the top level, a compensation object beside them, and a state enum of
//! its own for each. The Rust types ([`StepRecord`], one [`PhaseRecord`] for both halves)
//! were unified later; this module is what keeps records already in Baton readable and
//! re-written byte for byte. The golden records (`tests/golden/saga-*.json`) pin it.
//!
//! Append only: a field added here must be optional (`Option`, missing = `None`), and the
//! order of the fields is the order in the JSON.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::record::{PhaseRecord, PhaseState, StepRecord};

/// An action's state as stored: an action is never `skipped`.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ActionState {
    Pending,
    Running,
    Done,
    Failed,
}

/// A compensation's state as stored: a compensation is never `failed`.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CompensationState {
    Pending,
    Running,
    Done,
    Skipped,
}

/// A step as stored.
#[derive(Serialize, Deserialize)]
struct Step<'a> {
    name: Cow<'a, str>,
    state: ActionState,
    attempts: u32,
    failures: u32,
    outcome_unknown: bool,
    output: Option<Cow<'a, Value>>,
    last_error: Option<Cow<'a, str>>,
    next_attempt_ms: Option<u64>,
    started_ms: Option<u64>,
    finished_ms: Option<u64>,
    compensation: Option<Compensation<'a>>,
}

/// A step's compensation as stored.
#[derive(Serialize, Deserialize)]
struct Compensation<'a> {
    state: CompensationState,
    attempts: u32,
    failures: u32,
    output: Option<Cow<'a, Value>>,
    last_error: Option<Cow<'a, str>>,
    next_attempt_ms: Option<u64>,
    finished_ms: Option<u64>,
}

impl ActionState {
    /// `transition` never makes an action `skipped`: that would be a bug, refused rather
    /// than written as something else.
    fn of(s: PhaseState) -> Result<Self, &'static str> {
        match s {
            PhaseState::Pending => Ok(ActionState::Pending),
            PhaseState::Running => Ok(ActionState::Running),
            PhaseState::Done => Ok(ActionState::Done),
            PhaseState::Failed => Ok(ActionState::Failed),
            PhaseState::Skipped => Err("an action is never skipped"),
        }
    }

    fn state(self) -> PhaseState {
        match self {
            ActionState::Pending => PhaseState::Pending,
            ActionState::Running => PhaseState::Running,
            ActionState::Done => PhaseState::Done,
            ActionState::Failed => PhaseState::Failed,
        }
    }
}

impl CompensationState {
    /// `transition` never makes a compensation `failed` (it parks the saga instead): that
    /// would be a bug, refused rather than written as something else.
    fn of(s: PhaseState) -> Result<Self, &'static str> {
        match s {
            PhaseState::Pending => Ok(CompensationState::Pending),
            PhaseState::Running => Ok(CompensationState::Running),
            PhaseState::Done => Ok(CompensationState::Done),
            PhaseState::Skipped => Ok(CompensationState::Skipped),
            PhaseState::Failed => Err("a compensation never fails for good"),
        }
    }

    fn state(self) -> PhaseState {
        match self {
            CompensationState::Pending => PhaseState::Pending,
            CompensationState::Running => PhaseState::Running,
            CompensationState::Done => PhaseState::Done,
            CompensationState::Skipped => PhaseState::Skipped,
        }
    }
}

impl<'a> Compensation<'a> {
    fn of(c: &'a PhaseRecord) -> Result<Self, &'static str> {
        Ok(Compensation {
            state: CompensationState::of(c.state)?,
            attempts: c.attempts,
            failures: c.failures,
            output: c.output.as_ref().map(Cow::Borrowed),
            last_error: c.last_error.as_deref().map(Cow::Borrowed),
            next_attempt_ms: c.next_attempt_ms,
            finished_ms: c.finished_ms,
        })
    }
}

impl From<Compensation<'_>> for PhaseRecord {
    fn from(c: Compensation<'_>) -> Self {
        PhaseRecord {
            state: c.state.state(),
            attempts: c.attempts,
            failures: c.failures,
            output: c.output.map(Cow::into_owned),
            last_error: c.last_error.map(Cow::into_owned),
            next_attempt_ms: c.next_attempt_ms,
            finished_ms: c.finished_ms,
        }
    }
}

impl Serialize for StepRecord {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let a = &self.action;
        let compensation = match &self.compensation {
            Some(c) => Some(Compensation::of(c).map_err(serde::ser::Error::custom)?),
            None => None,
        };
        Step {
            name: Cow::Borrowed(&self.name),
            state: ActionState::of(a.state).map_err(serde::ser::Error::custom)?,
            attempts: a.attempts,
            failures: a.failures,
            outcome_unknown: self.outcome_unknown,
            output: a.output.as_ref().map(Cow::Borrowed),
            last_error: a.last_error.as_deref().map(Cow::Borrowed),
            next_attempt_ms: a.next_attempt_ms,
            started_ms: self.started_ms,
            finished_ms: a.finished_ms,
            compensation,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StepRecord {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = Step::deserialize(deserializer)?;
        Ok(StepRecord {
            name: s.name.into_owned(),
            action: PhaseRecord {
                state: s.state.state(),
                attempts: s.attempts,
                failures: s.failures,
                output: s.output.map(Cow::into_owned),
                last_error: s.last_error.map(Cow::into_owned),
                next_attempt_ms: s.next_attempt_ms,
                finished_ms: s.finished_ms,
            },
            outcome_unknown: s.outcome_unknown,
            started_ms: s.started_ms,
            compensation: s.compensation.map(PhaseRecord::from),
        })
    }
}
