//! Sagas (feature `saga`): a long business transaction across services as a sequence of
//! local transactions, each with a compensation that semantically undoes it, driven by an
//! orchestrator whose log lives in Baton.
//!
//! A saga holds no locks across services, so it is neither atomic nor isolated: between
//! steps the world sees an order that exists but is not paid yet. What it guarantees instead
//! is that it *ends*: every step takes effect, or every step that took effect is compensated
//! — and when a compensation cannot run, a human is told rather than the saga being dropped.
//!
//! - [`SagaDef`] — a definition: ordered steps, each an [`Action`] with an optional
//!   compensation, a [`RetryPolicy`] (exponential backoff with jitter, a maximum of attempts),
//!   a [`CompensationPolicy`] (backoff, and after how many failures to park) and a timeout.
//!   Actions get a [`StepCtx`] with a stable idempotency key.
//! - [`SagaLog`] — the saga log in Baton: one JSON [`SagaRecord`] per saga (status, every
//!   step's state, attempts, last error and output, the audit trail), and the operator
//!   actions `cancel`, `retry_stuck` and `skip_step`; usable without the definitions (the
//!   `baton saga` command is built on it).
//! - [`Orchestrator`] — drives the sagas of a namespace under a Baton election.
//! - [`StepFence`] (with feature `postgres`) — the participant's side in PostgreSQL: one row per
//!   step in the participant's own transaction, for exactly-once effects, empty compensations
//!   and refusing actions that arrive after their compensation.
//!
//! The order saga of the usual example — create order → charge card → reserve stock →
//! schedule shipment — with reserve failing compensates refund, then cancel: in reverse order,
//! each once.
//!
//! # Guarantees
//!
//! These hold for every interleaving of orchestrator crashes, leadership changes, timeouts
//! and operator actions; each has a test in `tests/it/saga_*.rs` against a real Baton and a real
//! PostgreSQL, crashes being real SIGKILLs of an orchestrator process at each step boundary.
//!
//! 1. **Progress is recorded before and after every attempt.** An attempt is written as
//!    `running` (attempt *n*) before the action is called and its result after it returns;
//!    a new orchestrator that finds a step `running` knows the attempt was cut short, marks
//!    its outcome unknown and runs it again.
//! 2. **Every step has a stable idempotency key**, `<namespace>/<saga id>/<step>` (and
//!    `…/undo` for its compensation), the same for every attempt and every orchestrator. So
//!    delivery is at least once and, with a participant that records the key with its effect
//!    ([`StepFence`]), the effect is exactly once.
//! 3. **Compensation runs in reverse step order, one step at a time.** A compensation starts
//!    only after the later step's compensation succeeded (or was skipped). Compensated are the
//!    steps that took effect — and a failed step whose outcome is unknown (it timed out, or an
//!    attempt was cut short), whose compensation must then tolerate nothing to undo.
//! 4. **A compensation is never dropped.** It is retried with backoff; after
//!    `park_after` failures in a row (or one fatal error) the saga is
//!    [`SagaStatus::Stuck`] — with the step, its attempts and the last error, counted in the
//!    `baton_txn_saga_stuck` gauge and shown by `baton saga list` — until an operator retries
//!    it or skips it with a reason. Every operator action is kept in the record's audit trail.
//! 5. **Cancelling compensates.** A cancel is a flag in the record; the orchestrator lets an
//!    attempt in flight finish, records it, and compensates everything that took effect,
//!    including that step.
//! 6. **One orchestrator drives a namespace, and a deposed one cannot advance a saga.** The
//!    orchestrators campaign in a Baton election; every write of the leader is a Baton
//!    transaction comparing the record's `mod_revision` *and* the leader key's create
//!    revision (its fencing token, [`LeaderFence`](crate::coordination::LeaderFence)). A
//!    leader paused past its session and replaced finds its next write refused — and since an
//!    attempt is written as `running` before its action is called, it calls nothing more.
//!    At worst an attempt it had already started completes late, which the participant's
//!    step fence makes harmless.
//! 7. **Starting is idempotent.** `start(def, id, data)` twice with the same data is one
//!    saga; with different data it is refused.
//!
//! Operator writes (cancel, retry, skip; from the API or `baton saga`) are compare-and-set
//! on the same record without a fence, so they and the orchestrator's writes never overwrite
//! each other: the loser reads again and re-decides.
//!
//! Metrics (the `metrics` crate, label `namespace`): `baton_txn_saga_stuck` and
//! `baton_txn_saga_open` (gauges, set by the leader on every scan),
//! `baton_txn_saga_step_attempts_total{saga, step, phase}`,
//! `baton_txn_saga_step_failures_total{saga, step, phase, kind}` (kind `retryable`, `fatal`
//! or `unknown`) and `baton_txn_saga_outcomes_total{saga, outcome}` (`completed`,
//! `compensated`, `stuck`).

mod def;
mod error;
#[cfg(feature = "postgres")]
mod fence;
#[cfg(test)]
mod golden;
mod log;
mod orchestrator;
mod plan;
mod record;
mod transition;
mod wire;

pub use def::{
    Action, BoxFuture, CompensationPolicy, Jitter, RetryPolicy, SagaBuilder, SagaDef, StepBuilder,
    StepCtx, StepError, StepSpec,
};
pub use error::SagaError;
#[cfg(feature = "postgres")]
pub use fence::{FenceAction, FenceRecord, FenceUndo, StepFence};
pub use log::{SagaLog, SagaOverview};
pub use orchestrator::{Orchestrator, OrchestratorConfig, SagaEvent};
pub use record::{
    AuditEntry, OperatorAction, Phase, PhaseRecord, PhaseState, SagaRecord, SagaStatus, StepRecord,
};
