//! The saga log in Baton: one JSON record per saga, every write a compare-and-set on the
//! record's `mod_revision`.

use std::time::Duration;

use baton_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, Op, PutOptions, SortOrder, SortTarget,
    Txn, WatchOptions,
};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::def::{encode_data, SagaDef, StepSpec};
use super::SagaError;
use crate::coordination::{
    check_namespace, create_open, decode, encode, now_ms, range, retry, LeaderFence, LogError,
};

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

/// Where a step's action stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not started, or waiting for its next attempt (`next_attempt_ms`).
    Pending,
    /// An attempt was started and its result not yet recorded. Found so by a new
    /// orchestrator, it means the attempt was cut short: the step may have taken effect.
    Running,
    /// The action succeeded.
    Done,
    /// The action failed for good (a fatal error, or out of attempts).
    Failed,
}

/// Where a step's compensation stands (present once the step is in the compensation plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationState {
    /// To run, or waiting for its next attempt.
    Pending,
    /// An attempt was started and its result not yet recorded.
    Running,
    /// The compensation succeeded.
    Done,
    /// An operator skipped it (the audit trail has the reason).
    Skipped,
}

/// One step's compensation in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompensationRecord {
    /// Where it stands.
    pub state: CompensationState,
    /// Attempts started.
    pub attempts: u32,
    /// Failed attempts since it was planned or an operator retried it: parking counts these.
    pub failures: u32,
    /// What the compensation returned.
    pub output: Option<Value>,
    /// The last failure.
    pub last_error: Option<String>,
    /// When the next attempt is due (Unix ms), after a failure.
    pub next_attempt_ms: Option<u64>,
    /// When it finished (Unix ms).
    pub finished_ms: Option<u64>,
}

impl CompensationRecord {
    fn pending() -> Self {
        CompensationRecord {
            state: CompensationState::Pending,
            attempts: 0,
            failures: 0,
            output: None,
            last_error: None,
            next_attempt_ms: None,
            finished_ms: None,
        }
    }
}

/// One step in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// The step's name.
    pub name: String,
    /// Where its action stands.
    pub state: StepState,
    /// Action attempts started (an attempt cut short by a crash counts).
    pub attempts: u32,
    /// Failed action attempts (errors and timeouts; a crash is not the step's failure).
    pub failures: u32,
    /// Some attempt's outcome is unknown (it timed out, panicked or was cut short by a
    /// crash), so the step may have taken effect even if it is not `done`: it is compensated
    /// (the compensation then finds nothing to undo, or the effect of a late arrival).
    pub outcome_unknown: bool,
    /// What the action returned.
    pub output: Option<Value>,
    /// The last failure.
    pub last_error: Option<String>,
    /// When the next attempt is due (Unix ms), after a failure.
    pub next_attempt_ms: Option<u64>,
    /// When the first attempt started (Unix ms).
    pub started_ms: Option<u64>,
    /// When the action finished, done or failed (Unix ms).
    pub finished_ms: Option<u64>,
    /// The compensation, once planned.
    pub compensation: Option<CompensationRecord>,
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

impl SagaRecord {
    pub(crate) fn new<D: Serialize>(
        def: &SagaDef<D>,
        id: &str,
        data: &D,
    ) -> Result<Self, SagaError> {
        let now = now_ms();
        Ok(SagaRecord {
            id: id.to_string(),
            definition: def.name().to_string(),
            data: encode_data(data)?,
            status: SagaStatus::Running,
            steps: def
                .steps()
                .iter()
                .map(|s| StepRecord {
                    name: s.name.clone(),
                    state: StepState::Pending,
                    attempts: 0,
                    failures: 0,
                    outcome_unknown: false,
                    output: None,
                    last_error: None,
                    next_attempt_ms: None,
                    started_ms: None,
                    finished_ms: None,
                    compensation: None,
                })
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

    /// Switches to compensating, planning a compensation for every compensable step that
    /// took effect or may have (its outcome unknown).
    pub(crate) fn start_compensation(&mut self, specs: &[&StepSpec], reason: String) {
        self.status = SagaStatus::Compensating;
        self.reason = Some(reason);
        for (step, spec) in self.steps.iter_mut().zip(specs) {
            let took_effect = step.state == StepState::Done || step.outcome_unknown;
            if spec.compensable && took_effect && step.compensation.is_none() {
                step.compensation = Some(CompensationRecord::pending());
            }
        }
    }
}

/// Who is acting, for the audit trail: `user@host (pid n)`.
fn who() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host} (pid {})", std::process::id())
}

/// The saga log of one namespace in Baton. Keys, under `baton-txn/<namespace>/`:
///
/// - `saga/<id>`: the [`SagaRecord`], JSON;
/// - `saga-open/<id>`: present while the saga is not finished (running, compensating or
///   stuck), so the orchestrator reads only those; created with the record, deleted in the
///   same transaction as the final write, put again by every operator action (which wakes the
///   orchestrator's watch).
///
/// Every write is `If mod_revision(record) = <read> [And <leader fence>] Then Put`: a writer
/// that read an older version loses and reads again, so an operator's cancel and an
/// orchestrator's step result never overwrite each other; the fence (orchestrator writes
/// only) makes a deposed orchestrator's write fail in the store itself.
#[derive(Clone, Debug)]
pub struct SagaLog {
    client: Client,
    namespace: String,
    root: String,
}

/// Rounds of a compare-and-set loop before giving up ([`LogError::Contended`]).
const CAS_ROUNDS: u32 = 32;

impl SagaLog {
    /// The log of `namespace` (1-16 of `[A-Za-z0-9_-]`) in the Baton cluster `client` talks to.
    pub fn new(client: &Client, namespace: &str) -> Result<SagaLog, SagaError> {
        check_namespace(namespace)?;
        Ok(SagaLog {
            client: client.clone(),
            namespace: namespace.to_string(),
            root: format!("baton-txn/{namespace}/"),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Baton client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The name of the election the namespace's orchestrators campaign in.
    pub fn election_name(&self) -> String {
        format!("{}saga-orchestrator", self.root)
    }

    fn key(&self, id: &str) -> String {
        format!("{}saga/{id}", self.root)
    }

    fn open_key(&self, id: &str) -> String {
        format!("{}saga-open/{id}", self.root)
    }

    pub(crate) fn open_prefix(&self) -> String {
        format!("{}saga-open/", self.root)
    }

    /// The idempotency key of step `step` of saga `id`: `<namespace>/<id>/<step>`.
    pub fn step_key(&self, id: &str, step: &str) -> String {
        format!("{}/{id}/{step}", self.namespace)
    }

    /// Records a new saga of `def` with `data`, running. Idempotent on `id`: starting it again
    /// with the same definition and data returns the existing record (whatever its state);
    /// with other ones it is refused ([`SagaError::Conflict`]).
    pub async fn start<D: Serialize>(
        &self,
        def: &SagaDef<D>,
        id: &str,
        data: &D,
    ) -> Result<SagaRecord, SagaError> {
        check_id(id)?;
        let record = SagaRecord::new(def, id, data)?;
        let key = self.key(id);
        let value = encode(&record);
        let Some(kv) = create_open(&self.client, &key, &value, &self.open_key(id)).await? else {
            return Ok(record);
        };
        let existing: SagaRecord = decode(&kv.key, &kv.value)?;
        if existing.definition == record.definition && existing.data == record.data {
            Ok(existing)
        } else {
            Err(SagaError::Conflict(format!(
                "saga {id} exists with {} {}; not starting it as {} {}",
                existing.definition, existing.data, record.definition, record.data
            )))
        }
    }

    /// The record of saga `id`, with its `mod_revision`.
    pub(crate) async fn read(&self, id: &str) -> Result<Option<(SagaRecord, i64)>, SagaError> {
        let key = self.key(id);
        let r =
            retry(|| async { Ok(self.client.get(key.clone(), GetOptions::new()).await?) }).await?;
        match r.kvs.first() {
            Some(kv) => Ok(Some((decode(&kv.key, &kv.value)?, kv.mod_revision))),
            None => Ok(None),
        }
    }

    /// The record of saga `id`.
    pub async fn get(&self, id: &str) -> Result<Option<SagaRecord>, SagaError> {
        Ok(self.read(id).await?.map(|(r, _)| r))
    }

    /// Every saga of the namespace, oldest first.
    pub async fn list(&self) -> Result<Vec<SagaRecord>, SagaError> {
        let prefix = format!("{}saga/", self.root);
        let r = retry(|| async {
            Ok(self
                .client
                .get(
                    prefix.clone(),
                    GetOptions::new()
                        .with_range_end(baton_client::prefix_end(prefix.as_bytes()))
                        .with_sort(SortTarget::Create, SortOrder::Ascend),
                )
                .await?)
        })
        .await?;
        let mut out = Vec::with_capacity(r.kvs.len());
        for kv in &r.kvs {
            out.push(decode::<SagaRecord>(&kv.key, &kv.value)?);
        }
        out.sort_by_key(|r| r.created_ms);
        Ok(out)
    }

    /// The sagas that are not finished (running, compensating or stuck), oldest first.
    pub async fn open(&self) -> Result<Vec<SagaRecord>, SagaError> {
        let prefix = self.open_prefix();
        let r = retry(|| async {
            Ok(self
                .client
                .get(
                    prefix.clone(),
                    GetOptions::new().with_prefix().with_keys_only(),
                )
                .await?)
        })
        .await?;
        let mut out = Vec::with_capacity(r.kvs.len());
        for kv in &r.kvs {
            let id = String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
            if let Some(rec) = self.get(&id).await? {
                out.push(rec);
            }
        }
        out.sort_by_key(|r| r.created_ms);
        Ok(out)
    }

    /// Reads saga `id`, lets `f` change it and writes it back by compare-and-set (with
    /// `fence`, if given), again from a fresh read whenever someone else wrote in between.
    /// `f` returns `None` to write nothing (the record is not in the state it expects).
    /// Returns `f`'s value and the record as written (or as read, if nothing was written).
    ///
    /// `f` may run several times and must decide from the record it is given: after a lost
    /// answer, the record it sees may already hold its own previous write.
    pub(crate) async fn update<T>(
        &self,
        id: &str,
        fence: Option<&LeaderFence>,
        mut f: impl FnMut(&mut SagaRecord) -> Result<Option<T>, SagaError>,
    ) -> Result<(Option<T>, SagaRecord), SagaError> {
        let key = self.key(id);
        for _ in 0..CAS_ROUNDS {
            let (mut rec, rev) = self
                .read(id)
                .await?
                .ok_or_else(|| SagaError::NotFound(id.to_string()))?;
            let Some(out) = f(&mut rec)? else {
                return Ok((None, rec));
            };
            rec.updated_ms = now_ms();
            let value = encode(&rec);
            let mut ops = vec![Op::put(key.clone(), value, PutOptions::new())];
            if rec.status.is_final() {
                ops.push(Op::delete(self.open_key(id), DeleteOptions::new()));
            } else if fence.is_none() {
                // An operator's write: wake the orchestrator's watch.
                ops.push(Op::put(self.open_key(id), "", PutOptions::new()));
            }
            let mut compares = vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)];
            compares.extend(fence.map(LeaderFence::compare));
            let r = retry(|| async {
                Ok(self
                    .client
                    .txn(
                        Txn::new()
                            .when(compares.clone())
                            .and_then(ops.clone())
                            .or_else([Op::get(key.clone(), GetOptions::new())]),
                    )
                    .await?)
            })
            .await?;
            if r.succeeded {
                return Ok((Some(out), rec));
            }
            let now_rev = range(&r, 0)
                .and_then(|r| r.kvs.first())
                .map(|kv| kv.mod_revision);
            if now_rev == Some(rev) {
                // The record did not change, so the fence is what failed.
                let token = fence.map(LeaderFence::token).unwrap_or_default();
                return Err(LogError::Fenced { token }.into());
            }
        }
        Err(LogError::Contended(key).into())
    }

    /// Asks for saga `id` to be cancelled: a running saga stops going forward after the step
    /// in flight (if any) and compensates what took effect. Cancelling a saga that already
    /// compensates (or did) changes nothing; a completed one cannot be cancelled.
    pub async fn cancel(&self, id: &str, reason: &str) -> Result<SagaRecord, SagaError> {
        let by = who();
        let (_, rec) = self
            .update(id, None, |r| match &r.status {
                SagaStatus::Running if !r.cancel_requested => {
                    r.cancel_requested = true;
                    r.audit.push(AuditEntry {
                        at_ms: now_ms(),
                        action: OperatorAction::Cancel,
                        step: None,
                        reason: reason.to_string(),
                        by: by.clone(),
                    });
                    Ok(Some(()))
                }
                SagaStatus::Completed => Err(SagaError::WrongState {
                    id: r.id.clone(),
                    state: r.status.name(),
                    action: "cancel",
                }),
                _ => Ok(None),
            })
            .await?;
        Ok(rec)
    }

    /// Retries the stuck compensation of saga `id` (after the cause was fixed): its failure
    /// count starts again from zero and the saga compensates on. Audited with `reason`.
    pub async fn retry_stuck(&self, id: &str, reason: &str) -> Result<SagaRecord, SagaError> {
        let by = who();
        let (_, rec) = self
            .update(id, None, |r| {
                let SagaStatus::Stuck { step, .. } = r.status else {
                    return Err(SagaError::WrongState {
                        id: r.id.clone(),
                        state: r.status.name(),
                        action: "retry",
                    });
                };
                let c = stuck_compensation(r, step)?;
                c.failures = 0;
                c.next_attempt_ms = None;
                r.status = SagaStatus::Compensating;
                r.audit.push(AuditEntry {
                    at_ms: now_ms(),
                    action: OperatorAction::Retry,
                    step: Some(step),
                    reason: reason.to_string(),
                    by: by.clone(),
                });
                Ok(Some(()))
            })
            .await?;
        Ok(rec)
    }

    /// Skips the stuck compensation of step `step` of saga `id`: it is recorded as skipped
    /// with `reason` (an operator undid the effect by hand, or decided it may stay) and the
    /// saga compensates the earlier steps. Only the step the saga is stuck on can be skipped.
    pub async fn skip_step(
        &self,
        id: &str,
        step: usize,
        reason: &str,
    ) -> Result<SagaRecord, SagaError> {
        if reason.trim().is_empty() {
            return Err(SagaError::Invalid(
                "skipping a compensation needs a reason".into(),
            ));
        }
        let by = who();
        let (_, rec) = self
            .update(id, None, |r| {
                let SagaStatus::Stuck { step: stuck, .. } = r.status else {
                    return Err(SagaError::WrongState {
                        id: r.id.clone(),
                        state: r.status.name(),
                        action: "skip",
                    });
                };
                if stuck != step {
                    return Err(SagaError::Invalid(format!(
                        "saga {} is stuck on step {stuck} ({}), not step {step}",
                        r.id, r.steps[stuck].name
                    )));
                }
                let c = stuck_compensation(r, step)?;
                c.state = CompensationState::Skipped;
                c.next_attempt_ms = None;
                c.finished_ms = Some(now_ms());
                r.status = SagaStatus::Compensating;
                r.audit.push(AuditEntry {
                    at_ms: now_ms(),
                    action: OperatorAction::Skip,
                    step: Some(step),
                    reason: reason.to_string(),
                    by: by.clone(),
                });
                Ok(Some(()))
            })
            .await?;
        Ok(rec)
    }

    /// Waits until saga `id`'s record satisfies `done` (watching it, no polling), at most
    /// `timeout`; returns the record, or [`SagaError::Timeout`] with the last one seen.
    pub async fn wait_for(
        &self,
        id: &str,
        timeout: Duration,
        mut done: impl FnMut(&SagaRecord) -> bool,
    ) -> Result<SagaRecord, SagaError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (rec, rev) = self
                .read(id)
                .await?
                .ok_or_else(|| SagaError::NotFound(id.to_string()))?;
            if done(&rec) {
                return Ok(rec);
            }
            let mut changes = self.client.watch(
                self.key(id),
                WatchOptions::new().with_start_revision(rev + 1),
            );
            match tokio::time::timeout_at(deadline, changes.next()).await {
                Ok(_) => continue,
                Err(_) => return Err(SagaError::Timeout(Box::new(rec))),
            }
        }
    }

    /// Waits until saga `id` is settled (completed, compensated or stuck).
    pub async fn wait_settled(&self, id: &str, timeout: Duration) -> Result<SagaRecord, SagaError> {
        self.wait_for(id, timeout, |r| r.status.is_settled()).await
    }
}

fn stuck_compensation(
    r: &mut SagaRecord,
    step: usize,
) -> Result<&mut CompensationRecord, SagaError> {
    let id = r.id.clone();
    r.steps
        .get_mut(step)
        .and_then(|s| s.compensation.as_mut())
        .ok_or_else(|| {
            SagaError::Corrupt(format!(
                "saga {id} is stuck on step {step}, which has no compensation"
            ))
        })
}

/// Saga ids: 1-128 of `[A-Za-z0-9_.:-]` (no `/`, so `<namespace>/<id>/<step>` is an
/// unambiguous idempotency key).
pub(crate) fn check_id(id: &str) -> Result<(), SagaError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if ok {
        Ok(())
    } else {
        Err(SagaError::Invalid(format!(
            "invalid saga id {id:?}: use 1-128 of [A-Za-z0-9_.:-]"
        )))
    }
}
