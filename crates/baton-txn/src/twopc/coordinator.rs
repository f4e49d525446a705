//! The coordinator: runs one global transaction from intent to phase 2.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;

use super::ids::{BranchId, Gid, TxId};
use super::log::{BranchRecord, BranchState, Decision, DecisionLog, Intent, IntentBranch};
use super::participant::{Branch, Finish, ParticipantError, Resource};
use crate::coordination::{now_ms, LeaderFence, LogError};

/// A named point in the protocol, passed to the fault hook ([`Coordinator::with_fault_hook`])
/// so tests can kill a real coordinator process exactly there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultPoint {
    /// The intent is in the log; nothing is prepared.
    AfterIntent,
    /// This branch voted YES (it is prepared); others may not be yet.
    AfterPrepare(BranchId),
    /// Every branch is prepared; no decision yet.
    AfterAllPrepared,
    /// The decision is in the log; phase 2 has not started.
    AfterDecision(Decision),
    /// Phase 2 finished this branch (in the database; its log record may not be written).
    AfterPhase2(BranchId),
}

impl FaultPoint {
    /// The point's name (`after_intent`, `after_prepare:<branch>`, `after_all_prepared`,
    /// `after_decision`, `after_phase2:<branch>`).
    pub fn name(&self) -> String {
        match self {
            FaultPoint::AfterIntent => "after_intent".into(),
            FaultPoint::AfterPrepare(b) => format!("after_prepare:{b}"),
            FaultPoint::AfterAllPrepared => "after_all_prepared".into(),
            FaultPoint::AfterDecision(_) => "after_decision".into(),
            FaultPoint::AfterPhase2(b) => format!("after_phase2:{b}"),
        }
    }
}

type FaultHook = Arc<dyn Fn(&FaultPoint) + Send + Sync>;

/// Coordinator settings.
#[derive(Clone, Debug)]
pub struct TwoPcConfig {
    /// How long after the intent a decision must be made; recovery aborts a transaction
    /// still undecided after this (plus its grace). Phase 1 is cut off at this deadline.
    pub decision_timeout: Duration,
    /// Phase-2 attempts per branch in the coordinator before it leaves the branch to
    /// recovery.
    pub phase2_attempts: u32,
    /// Pause between phase-2 attempts (doubling).
    pub phase2_backoff: Duration,
}

impl Default for TwoPcConfig {
    fn default() -> Self {
        TwoPcConfig {
            decision_timeout: Duration::from_secs(30),
            phase2_attempts: 3,
            phase2_backoff: Duration::from_millis(100),
        }
    }
}

/// Why a commit could not run at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// No resource is registered for a branch's id (phase 2 and recovery need one).
    #[error("no resource is registered for branch {0}")]
    UnknownResource(BranchId),
    /// Two branches of one transaction name the same resource.
    #[error("branch {0} is enlisted twice")]
    DuplicateBranch(BranchId),
    /// The decision log failed. If this came before the decision, nothing was committed and
    /// recovery aborts whatever was prepared after the deadline; if the decision may have
    /// been written, recovery finishes the transaction as decided.
    #[error("decision log: {0}")]
    Log(#[from] LogError),
}

/// How a global transaction ended, as far as the coordinator saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Committed everywhere.
    Committed,
    /// Rolled back everywhere (or the decision to abort is made and phase 2 continues in
    /// recovery for `pending`).
    Aborted {
        /// Why.
        reason: String,
        /// Branches whose rollback is left to recovery.
        pending: Vec<BranchId>,
    },
    /// The decision is commit (durable in the log); these branches could not be committed
    /// yet and recovery will commit them. Their changes become visible then.
    CommitDecided {
        /// Branches not committed yet.
        pending: Vec<BranchId>,
    },
    /// Some branch ended against the decision (finished by hand): atomicity is broken and a
    /// human must look. Never retried.
    Heuristic {
        /// The decision.
        decision: Decision,
        /// Every branch's final state.
        branches: BTreeMap<BranchId, BranchState>,
    },
}

/// Runs global transactions over registered resources, recording each in a [`DecisionLog`].
///
/// Any number of coordinators (processes) may share one log and one set of resources; each
/// global transaction is run by the coordinator that began it, and finished by recovery if
/// that one dies.
#[derive(Clone)]
pub struct Coordinator {
    log: Arc<dyn DecisionLog>,
    resources: HashMap<BranchId, Arc<dyn Resource>>,
    config: TwoPcConfig,
    name: String,
    hook: Option<FaultHook>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("namespace", &self.log.namespace())
            .field("resources", &self.resources.keys().collect::<Vec<_>>())
            .field("name", &self.name)
            .finish()
    }
}

impl Coordinator {
    /// A coordinator recording in `log`.
    pub fn new(log: Arc<dyn DecisionLog>) -> Coordinator {
        Coordinator {
            log,
            resources: HashMap::new(),
            config: TwoPcConfig::default(),
            name: format!("coordinator {}/{}", hostname(), std::process::id()),
            hook: None,
        }
    }

    /// Registers a resource; branches are enlisted by its id.
    pub fn with_resource(mut self, resource: Arc<dyn Resource>) -> Coordinator {
        self.resources.insert(resource.id().clone(), resource);
        self
    }

    /// Replaces the settings.
    pub fn with_config(mut self, config: TwoPcConfig) -> Coordinator {
        self.config = config;
        self
    }

    /// Calls `hook` at every [`FaultPoint`] (for fault-injection tests).
    pub fn with_fault_hook(
        mut self,
        hook: impl Fn(&FaultPoint) + Send + Sync + 'static,
    ) -> Coordinator {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// The log.
    pub fn log(&self) -> &Arc<dyn DecisionLog> {
        &self.log
    }

    /// Checks every registered resource ([`Resource::preflight`]); returns their warnings.
    pub async fn preflight(&self) -> Result<Vec<String>, ParticipantError> {
        let mut warnings = Vec::new();
        for r in self.resources.values() {
            warnings.extend(r.preflight().await?);
        }
        Ok(warnings)
    }

    /// Starts a global transaction (nothing is written until [`GlobalTx::commit`]).
    pub fn begin(&self) -> GlobalTx<'_> {
        GlobalTx {
            coord: self,
            tx: TxId::generate(),
            branches: Vec::new(),
        }
    }

    fn fault(&self, point: FaultPoint) {
        if let Some(h) = &self.hook {
            h(&point);
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// One global transaction: enlist branches (local transactions with the work done), then
/// [`GlobalTx::commit`] or [`GlobalTx::rollback`].
pub struct GlobalTx<'c> {
    coord: &'c Coordinator,
    tx: TxId,
    branches: Vec<Box<dyn Branch>>,
}

impl std::fmt::Debug for GlobalTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalTx").field("tx", &self.tx).finish()
    }
}

impl GlobalTx<'_> {
    /// The transaction's id.
    pub fn id(&self) -> TxId {
        self.tx
    }

    /// The GID `branch` will be prepared under (for resources that need it up front, like
    /// MariaDB's `XA START`).
    pub fn gid(&self, branch: &BranchId) -> Gid {
        Gid::new(self.coord.log.namespace(), self.tx, branch.clone())
    }

    /// Adds a branch. Its resource must be registered with the coordinator.
    pub fn enlist(&mut self, branch: impl Branch + 'static) -> Result<(), TxError> {
        let id = branch.resource().clone();
        if !self.coord.resources.contains_key(&id) {
            return Err(TxError::UnknownResource(id));
        }
        if self.branches.iter().any(|b| b.resource() == &id) {
            return Err(TxError::DuplicateBranch(id));
        }
        self.branches.push(Box::new(branch));
        Ok(())
    }

    /// Rolls every branch back (nothing was prepared, so nothing needs the log).
    pub async fn rollback(self) -> Vec<ParticipantError> {
        join_all(self.branches.into_iter().map(|b| b.rollback()))
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect()
    }

    /// Commits atomically: every branch commits or none does.
    ///
    /// 1. The intent (transaction, every branch's exact GID, the deadline) is written to the
    ///    log — before any PREPARE, so every prepared branch anywhere can be traced to it.
    /// 2. Every branch writes its marker row and prepares, concurrently, until the deadline.
    /// 3. The decision (commit if every branch voted YES, abort otherwise) is written once,
    ///    by compare-and-set; if recovery decided first (abort, after the deadline), its
    ///    decision is followed.
    /// 4. Phase 2 applies the decision to every branch and records each branch's outcome;
    ///    what it cannot finish (a database down) is left to recovery, which finishes it
    ///    the same way.
    ///
    /// Nothing is ever rolled back after a PREPARE unless an abort decision is in the log,
    /// so a coordinator paused anywhere cannot disagree with recovery.
    pub async fn commit(self) -> Result<Outcome, TxError> {
        let coord = self.coord;
        let log = &coord.log;
        let tx = self.tx;
        let mut branches = self.branches;
        if branches.is_empty() {
            return Ok(Outcome::Committed);
        }
        let started = Instant::now();
        let created_ms = now_ms();
        let deadline = started + coord.config.decision_timeout;
        let intent = Intent {
            tx,
            branches: branches
                .iter()
                .map(|b| IntentBranch {
                    branch: b.resource().clone(),
                    gid: Gid::new(log.namespace(), tx, b.resource().clone()).to_string(),
                })
                .collect(),
            created_ms,
            deadline_ms: created_ms + coord.config.decision_timeout.as_millis() as u64,
            coordinator: coord.name.clone(),
        };
        if let Err(e) = log.record_intent(&intent).await {
            // Nothing is prepared: the local transactions roll back. (If the intent did
            // reach the log, recovery aborts it after the deadline and finds nothing.)
            join_all(branches.into_iter().map(|b| b.rollback())).await;
            return Err(e.into());
        }
        coord.fault(FaultPoint::AfterIntent);

        // Phase 1.
        let votes = {
            let prepares = branches.iter_mut().map(|b| {
                let gid = Gid::new(log.namespace(), tx, b.resource().clone());
                async move {
                    let id = b.resource().clone();
                    let r = match tokio::time::timeout_at(deadline.into(), b.prepare(&gid)).await {
                        Ok(r) => r,
                        Err(_) => Err(ParticipantError::Unavailable(
                            "no vote before the decision deadline".into(),
                        )),
                    };
                    if r.is_ok() {
                        coord.fault(FaultPoint::AfterPrepare(id.clone()));
                    }
                    (id, r)
                }
            });
            join_all(prepares).await
        };
        let no: Vec<String> = votes
            .iter()
            .filter_map(|(id, r)| r.as_ref().err().map(|e| format!("{id} voted no: {e}")))
            .collect();
        let wanted = if no.is_empty() {
            coord.fault(FaultPoint::AfterAllPrepared);
            Decision::Commit
        } else {
            Decision::Abort
        };
        drop(branches);

        // The decision: ours, or recovery's if it was first.
        let by = match wanted {
            Decision::Commit => format!("{}: every branch voted yes", coord.name),
            Decision::Abort => format!("{}: {}", coord.name, no.join("; ")),
        };
        let winner = log.decide(tx, wanted, &by, None).await?;
        metrics::histogram!("baton_txn_2pc_decision_seconds", "namespace" => log.namespace().to_string())
            .record(started.elapsed().as_secs_f64());
        coord.fault(FaultPoint::AfterDecision(winner.decision));

        // Phase 2, branch by branch in intent order (so a crash after one branch leaves the
        // later ones prepared: a fixed state for recovery, and for the fault tests).
        let mut states = BTreeMap::new();
        for b in &intent.branches {
            let id = &b.branch;
            let gid = Gid::new(log.namespace(), tx, id.clone());
            let state = finish_branch(
                log.as_ref(),
                coord.resources[id].as_ref(),
                &gid,
                winner.decision,
                coord.config.phase2_attempts,
                coord.config.phase2_backoff,
                None,
            )
            .await?;
            if state.is_final() {
                coord.fault(FaultPoint::AfterPhase2(id.clone()));
            }
            states.insert(id.clone(), state);
        }
        let pending: Vec<BranchId> = states
            .iter()
            .filter(|(_, s)| !s.is_final())
            .map(|(b, _)| b.clone())
            .collect();
        if pending.is_empty() {
            log.close(tx, None).await?;
        }
        let outcome = if states.values().any(|s| s.is_heuristic()) {
            Outcome::Heuristic {
                decision: winner.decision,
                branches: states,
            }
        } else {
            match winner.decision {
                Decision::Commit if pending.is_empty() => Outcome::Committed,
                Decision::Commit => Outcome::CommitDecided { pending },
                Decision::Abort => Outcome::Aborted {
                    reason: winner.by.clone(),
                    pending,
                },
            }
        };
        metrics::counter!("baton_txn_2pc_outcomes_total",
            "namespace" => log.namespace().to_string(), "outcome" => outcome_label(&outcome))
        .increment(1);
        Ok(outcome)
    }
}

fn outcome_label(o: &Outcome) -> &'static str {
    match o {
        Outcome::Committed => "committed",
        Outcome::CommitDecided { .. } => "commit_decided",
        Outcome::Aborted { .. } => "aborted",
        Outcome::Heuristic { .. } => "heuristic",
    }
}

/// Applies `decision` to one branch and records the result: up to `attempts` tries, then the
/// branch is left `Pending` (with the last error recorded) for a later pass. Shared by the
/// coordinator and the Recoverer, so both finish branches identically.
pub(crate) async fn finish_branch(
    log: &dyn DecisionLog,
    resource: &dyn Resource,
    gid: &Gid,
    decision: Decision,
    attempts: u32,
    backoff: Duration,
    fence: Option<&LeaderFence>,
) -> Result<BranchState, LogError> {
    let mut last_error = None;
    let mut pause = backoff;
    for attempt in 1..=attempts.max(1) {
        let r = match decision {
            Decision::Commit => resource.commit_prepared(gid).await,
            Decision::Abort => resource.rollback_prepared(gid).await,
        };
        let state = match r {
            Ok(Finish::Done) => Ok(match decision {
                Decision::Commit => BranchState::Committed,
                Decision::Abort => BranchState::RolledBack,
            }),
            // Gone: finished before (by us, another coordinator, recovery, or by hand), or
            // never prepared. The marker row was part of the branch: it exists iff the
            // branch committed.
            Ok(Finish::AlreadyGone) => {
                resource
                    .marker_exists(gid)
                    .await
                    .map(|committed| match (decision, committed) {
                        (Decision::Commit, true) => BranchState::Committed,
                        (Decision::Commit, false) => BranchState::HeuristicRollback,
                        (Decision::Abort, false) => BranchState::RolledBack,
                        (Decision::Abort, true) => BranchState::HeuristicCommit,
                    })
            }
            Err(e) => Err(e),
        };
        match state {
            Ok(state) => {
                if state.is_heuristic() {
                    tracing::error!(%gid, ?state, %decision,
                        "heuristic outcome: the branch was finished against the decision (by hand?); atomicity is broken, a human must look");
                    metrics::counter!("baton_txn_2pc_heuristic_total",
                        "namespace" => gid.namespace().to_string())
                    .increment(1);
                }
                let record = BranchRecord {
                    state,
                    attempts: attempt,
                    last_error: last_error.clone(),
                    updated_ms: now_ms(),
                };
                log.record_branch(gid.tx(), gid.branch(), &record, fence)
                    .await?;
                return Ok(state);
            }
            Err(e) => {
                tracing::warn!(%gid, %decision, attempt, error = %e, "phase 2 failed");
                last_error = Some(e.to_string());
                if attempt < attempts {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
    }
    let prev = log
        .get(gid.tx())
        .await?
        .and_then(|r| r.branches.get(gid.branch()).map(|b| b.attempts))
        .unwrap_or(0);
    let record = BranchRecord {
        state: BranchState::Pending,
        attempts: prev + attempts.max(1),
        last_error,
        updated_ms: now_ms(),
    };
    log.record_branch(gid.tx(), gid.branch(), &record, fence)
        .await?;
    Ok(BranchState::Pending)
}
