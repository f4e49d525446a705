//! The saga record: everything the log holds about one saga, as Rust values. Kept apart from
//! the log (which stores it) and from `transition` (the only code that changes one), so the
//! types say what a saga *is* and nothing about how it moves; the stored JSON of a step is
//! `wire`'s.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where a saga stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SagaStatus {
    /// Running its steps forward.
    Running,
    /// A step failed for good or the saga was cancelled: compensating the steps that took
    /// effect, in reverse order.
    Compensating,
    /// Every step took effect.
    Completed,
    /// Every step that took effect was compensated (or its compensation skipped by an
    /// operator, which the audit trail records).
    Compensated,
    /// A compensation kept failing: the saga waits for an operator (`retry` or `skip`).
    Stuck {
        /// The step whose compensation failed.
        step: usize,
        /// Its compensation attempts so far.
        attempts: u32,
        /// The last failure.
        last_error: String,
    },
}

impl SagaStatus {
    /// The state's name: `running`, `compensating`, `completed`, `compensated`, `stuck`.
    pub fn name(&self) -> &'static str {
        match self {
            SagaStatus::Running => "running",
            SagaStatus::Compensating => "compensating",
            SagaStatus::Completed => "completed",
            SagaStatus::Compensated => "compensated",
            SagaStatus::Stuck { .. } => "stuck",
        }
    }

    /// Whether the saga is finished (nothing will ever be done to it again).
    pub fn is_final(&self) -> bool {
        matches!(self, SagaStatus::Completed | SagaStatus::Compensated)
    }

    /// Whether the orchestrator has nothing to do until something changes: finished, or
    /// stuck.
    pub fn is_settled(&self) -> bool {
        self.is_final() || matches!(self, SagaStatus::Stuck { .. })
    }
}

impl std::fmt::Display for SagaStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where one half of a step — its action or its compensation — stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseState {
    /// Not started, or waiting for its next attempt (`next_attempt_ms`).
    Pending,
    /// An attempt was started and its result not yet recorded. Found so by a new
    /// orchestrator, it means the attempt was cut short: it may have taken effect.
    Running,
    /// It succeeded.
    Done,
    /// Actions only: the action failed for good (a fatal error, or out of attempts). A
    /// compensation never fails for good: it parks the saga ([`SagaStatus::Stuck`]) instead.
    Failed,
    /// Compensations only: an operator skipped it (the audit trail has the reason).
    Skipped,
}

/// One half of a step in the log — its action or its compensation: its attempts and what
/// they gave. The action's and the compensation's are the same struct, moved by the same
/// rules (`transition`); where they differ the field says so.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseRecord {
    /// Where it stands.
    pub state: PhaseState,
    /// Attempts started (an attempt cut short by a crash counts).
    pub attempts: u32,
    /// Failed attempts (errors and timeouts; a crash is not the step's failure). For a
    /// compensation: since it was planned or an operator retried it, which parking counts.
    pub failures: u32,
    /// What it returned.
    pub output: Option<Value>,
    /// The last failure.
    pub last_error: Option<String>,
    /// When the next attempt is due (Unix ms), after a failure.
    pub next_attempt_ms: Option<u64>,
    /// When it finished (Unix ms): done, failed or skipped.
    pub finished_ms: Option<u64>,
}

impl PhaseRecord {
    /// Not started.
    pub(crate) fn pending() -> Self {
        PhaseRecord {
            state: PhaseState::Pending,
            attempts: 0,
            failures: 0,
            output: None,
            last_error: None,
            next_attempt_ms: None,
            finished_ms: None,
        }
    }
}

/// One step in the log. Stored as the JSON of the first version (see `wire`): the action's
/// fields at the top level, the compensation's under `compensation`.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    /// The step's name.
    pub name: String,
    /// Its action.
    pub action: PhaseRecord,
    /// Some action attempt's outcome is unknown (it timed out, panicked or was cut short by
    /// a crash), so the step may have taken effect even if it is not `done`: it is compensated
    /// (the compensation then finds nothing to undo, or the effect of a late arrival).
    pub outcome_unknown: bool,
    /// When the action's first attempt started (Unix ms).
    pub started_ms: Option<u64>,
    /// The compensation, once planned.
    pub compensation: Option<PhaseRecord>,
}

impl StepRecord {
    /// Not started.
    pub(crate) fn pending(name: &str) -> Self {
        StepRecord {
            name: name.to_string(),
            action: PhaseRecord::pending(),
            outcome_unknown: false,
            started_ms: None,
            compensation: None,
        }
    }

    /// The action, or the compensation if it is planned.
    pub fn phase(&self, phase: Phase) -> Option<&PhaseRecord> {
        match phase {
            Phase::Action => Some(&self.action),
            Phase::Compensation => self.compensation.as_ref(),
        }
    }

    pub(crate) fn phase_mut(&mut self, phase: Phase) -> Option<&mut PhaseRecord> {
        match phase {
            Phase::Action => Some(&mut self.action),
            Phase::Compensation => self.compensation.as_mut(),
        }
    }
}

/// What an operator did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorAction {
    /// Asked for the saga to be cancelled (it compensates).
    Cancel,
    /// Retried a stuck compensation.
    Retry,
    /// Skipped a stuck compensation.
    Skip,
}

impl std::fmt::Display for OperatorAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OperatorAction::Cancel => "cancel",
            OperatorAction::Retry => "retry",
            OperatorAction::Skip => "skip",
        })
    }
}

/// One operator action, kept in the record for ever.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When (Unix ms).
    pub at_ms: u64,
    /// What.
    pub action: OperatorAction,
    /// The step it concerned.
    pub step: Option<usize>,
    /// Why (the operator's words).
    pub reason: String,
    /// Who: user, host and process.
    pub by: String,
}

/// Everything the log holds about one saga.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SagaRecord {
    /// The saga's id.
    pub id: String,
    /// Its definition's name.
    pub definition: String,
    /// Its data, as JSON.
    pub data: Value,
    /// Where it stands.
    pub status: SagaStatus,
    /// Its steps, in definition order.
    pub steps: Vec<StepRecord>,
    /// Why it compensates: the failed step and its error, or the cancellation.
    pub reason: Option<String>,
    /// Someone asked for it to be cancelled.
    pub cancel_requested: bool,
    /// Operator actions, oldest first.
    pub audit: Vec<AuditEntry>,
    /// When it was started (Unix ms).
    pub created_ms: u64,
    /// When it was last written (Unix ms).
    pub updated_ms: u64,
    /// When it finished (Unix ms).
    pub finished_ms: Option<u64>,
    /// The orchestrator that wrote it last: instance and fencing token.
    pub orchestrator: Option<String>,
}

/// Which half of a step a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The step's action (forward).
    Action,
    /// The step's compensation (backward).
    Compensation,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Action => "action",
            Phase::Compensation => "compensation",
        })
    }
}
