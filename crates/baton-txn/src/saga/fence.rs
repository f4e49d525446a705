//! The participant's side of a saga step in PostgreSQL (features `saga` + `postgres`): a
//! fence row per step, written in the participant's own transaction together with the
//! step's effect — the idea of Seata's `tcc_fence_log`.
//!
//! The orchestrator delivers every action and compensation *at least* once (it re-runs an
//! attempt whose result it did not record, with the same idempotency key), and a timed-out
//! action may still arrive after its compensation ran. The fence turns that into exactly one
//! effect per step and keeps the three classic hazards out:
//!
//! - **a repeat** (same key again): the row exists as `done` → [`FenceAction::AlreadyDone`];
//! - **an empty compensation** (the action never took effect): no row → the compensation
//!   writes a `tombstone` and learns [`FenceUndo::NothingToUndo`];
//! - **suspension** (the action arrives after its compensation): the row is `compensated` or
//!   a `tombstone` → [`FenceAction::RejectedCompensated`], the late action must not apply.
//!
//! Each check is one `INSERT … ON CONFLICT DO UPDATE` in the caller's transaction: it locks
//! the step's row (or waits for a concurrent inserter's outcome), so an action and its
//! compensation racing on one step are serialised by PostgreSQL, and the verdict commits or
//! rolls back with the effect — a crash between them leaves neither.

use crate::pg::{Client, Schema, Transaction};
use crate::Error;

/// The verdict for an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceAction {
    /// First time: apply the effect in this transaction.
    Proceed,
    /// The action already took effect (committed earlier): do nothing, answer as before.
    AlreadyDone,
    /// The step was compensated (or its compensation found nothing and left a tombstone)
    /// before this action arrived: it must not apply.
    RejectedCompensated,
}

/// The verdict for a compensation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceUndo {
    /// The action took effect and is not compensated yet: undo it in this transaction.
    Proceed,
    /// A compensation of this step already committed: do nothing.
    AlreadyCompensated,
    /// The action never took effect: nothing to undo. A tombstone is written (it commits with
    /// this transaction), so the action, should it arrive late, is rejected.
    NothingToUndo,
}

/// A step's fence row as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRecord {
    /// `done`, `compensated` or `tombstone`.
    pub state: String,
    /// Repeats of the action that found it done.
    pub repeats: i32,
    /// Late actions refused because the step was compensated.
    pub rejected: i32,
    /// Repeats of the compensation.
    pub undo_repeats: i32,
}

/// The step fence table `<schema>.saga_step_fence`.
#[derive(Debug, Clone)]
pub struct StepFence {
    schema: Schema,
}

impl StepFence {
    /// The fence in `schema`.
    pub fn new(schema: &Schema) -> StepFence {
        StepFence {
            schema: schema.clone(),
        }
    }

    /// Creates the schema and the table if they do not exist; safe to run on every start,
    /// from many processes. Kept apart from [`Schema::migrate`]'s numbered list so a
    /// participant that only takes part in sagas needs nothing else.
    pub async fn create(&self, client: &mut Client) -> Result<(), Error> {
        let tx = client.transaction().await?;
        // The lock `Schema::migrate` takes: concurrent `CREATE … IF NOT EXISTS` can still
        // fail on PostgreSQL's catalog unique indexes.
        tx.execute(
            "SELECT pg_advisory_xact_lock(1114989679, hashtext($1))",
            &[&self.schema.name()],
        )
        .await?;
        tx.batch_execute(&self.schema.sql(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE IF NOT EXISTS {s}.saga_step_fence (
                 step_key     text        PRIMARY KEY,
                 state        text        NOT NULL
                                          CHECK (state IN ('done', 'compensated', 'tombstone')),
                 action_at    timestamptz,
                 undo_at      timestamptz,
                 repeats      integer     NOT NULL DEFAULT 0,
                 rejected     integer     NOT NULL DEFAULT 0,
                 undo_repeats integer     NOT NULL DEFAULT 0
             );",
        ))
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Call first in the action's transaction, with the step key
    /// ([`super::StepCtx::step_key`]); apply the effect only on [`FenceAction::Proceed`].
    pub async fn before_action(
        &self,
        tx: &Transaction<'_>,
        step_key: &str,
    ) -> Result<FenceAction, Error> {
        // Inserted: state 'done' with no repeats. Otherwise the existing row is locked and
        // its counters tell what it was.
        let row = tx
            .query_one(
                &self.schema.sql(
                    "INSERT INTO {s}.saga_step_fence AS f (step_key, state, action_at)
                     VALUES ($1, 'done', now())
                     ON CONFLICT (step_key) DO UPDATE SET
                         repeats  = f.repeats  + (f.state = 'done')::int,
                         rejected = f.rejected + (f.state <> 'done')::int
                     RETURNING state, repeats",
                ),
                &[&step_key],
            )
            .await?;
        let state: &str = row.get(0);
        let repeats: i32 = row.get(1);
        Ok(match state {
            "done" if repeats == 0 => FenceAction::Proceed,
            "done" => FenceAction::AlreadyDone,
            _ => FenceAction::RejectedCompensated,
        })
    }

    /// Call first in the compensation's transaction, with the step key; undo the effect only
    /// on [`FenceUndo::Proceed`], and commit in every case (a tombstone must persist).
    pub async fn before_undo(
        &self,
        tx: &Transaction<'_>,
        step_key: &str,
    ) -> Result<FenceUndo, Error> {
        let row = tx
            .query_one(
                &self.schema.sql(
                    "INSERT INTO {s}.saga_step_fence AS f (step_key, state, undo_at)
                     VALUES ($1, 'tombstone', now())
                     ON CONFLICT (step_key) DO UPDATE SET
                         state        = CASE WHEN f.state = 'done' THEN 'compensated' ELSE f.state END,
                         undo_at      = CASE WHEN f.state = 'done' THEN now() ELSE f.undo_at END,
                         undo_repeats = f.undo_repeats + (f.state <> 'done')::int
                     RETURNING state, undo_repeats",
                ),
                &[&step_key],
            )
            .await?;
        let state: &str = row.get(0);
        let repeats: i32 = row.get(1);
        Ok(match (state, repeats) {
            ("compensated", 0) => FenceUndo::Proceed,
            ("tombstone", 0) => FenceUndo::NothingToUndo,
            _ => FenceUndo::AlreadyCompensated,
        })
    }

    /// The fence row of `step_key`, if any (for operators and tests).
    pub async fn get(&self, client: &Client, step_key: &str) -> Result<Option<FenceRecord>, Error> {
        let row = client
            .query_opt(
                &self.schema.sql(
                    "SELECT state, repeats, rejected, undo_repeats
                     FROM {s}.saga_step_fence WHERE step_key = $1",
                ),
                &[&step_key],
            )
            .await?;
        Ok(row.map(|r| FenceRecord {
            state: r.get(0),
            repeats: r.get(1),
            rejected: r.get(2),
            undo_repeats: r.get(3),
        }))
    }
}
