//! [`SagaError`]: what the saga API fails with.

use super::record::SagaRecord;
use crate::coordination::LogError;

/// Errors of sagas.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SagaError {
    /// The saga log: Baton unreachable, a record unreadable, or — for an orchestrator — its
    /// leadership gone ([`LogError::Fenced`]).
    #[error(transparent)]
    Log(#[from] LogError),
    /// No saga with this id.
    #[error("no saga {0}")]
    NotFound(String),
    /// A saga with this id exists with another definition or other data.
    #[error("{0}")]
    Conflict(String),
    /// The saga is not in a state that allows the action.
    #[error("saga {id} is {state}: cannot {action} it")]
    WrongState {
        /// The saga.
        id: String,
        /// Its state.
        state: &'static str,
        /// The refused action.
        action: &'static str,
    },
    /// An invalid request (a malformed id, a missing reason, the wrong step).
    #[error("{0}")]
    Invalid(String),
    /// A definition is invalid, not registered, or does not match a saga's recorded steps.
    #[error("definition: {0}")]
    Definition(String),
    /// A record contradicts itself.
    #[error("saga record: {0}")]
    Corrupt(String),
    /// A wait ended before the saga got there; the record as last seen.
    #[error("timed out waiting for saga {}; it is {}", .0.id, .0.status)]
    Timeout(Box<SagaRecord>),
}

impl SagaError {
    /// Whether this is an orchestrator's refused write: its leadership is gone.
    pub fn is_fenced(&self) -> bool {
        matches!(self, SagaError::Log(LogError::Fenced { .. }))
    }
}
