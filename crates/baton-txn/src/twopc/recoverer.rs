//! The Recoverer: finishes what coordinators left behind.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use baton_client::{Client, Election, Session, SessionOptions};

use super::coordinator::finish_branch;
use super::ids::{BranchId, Gid, TxId};
use super::log::{BranchState, Decision, DecisionLog, TxRecord};
use super::participant::Resource;
use crate::coordination::{now_ms, LeaderFence, LogError};

/// Recoverer settings.
#[derive(Clone, Debug)]
pub struct RecovererConfig {
    /// Pause between passes.
    pub interval: Duration,
    /// Extra time after a transaction's deadline before an undecided one is aborted (room
    /// for clock differences between the coordinator and the Recoverer; safety does not
    /// depend on it, since the decision is a compare-and-set either way).
    pub grace: Duration,
    /// Phase-2 attempts per branch per pass.
    pub attempts: u32,
    /// The session TTL of the Recoverer's election.
    pub session_ttl: Duration,
    /// How long the records of finished transactions stay in the log (for `baton 2pc`)
    /// before [`Recoverer::run`] deletes them (hourly).
    pub retention: Duration,
}

impl Default for RecovererConfig {
    fn default() -> Self {
        RecovererConfig {
            interval: Duration::from_secs(5),
            grace: Duration::from_secs(1),
            attempts: 2,
            session_ttl: Duration::from_secs(10),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// How often a leading Recoverer deletes finished transactions past their retention.
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Transactions this pass decided (abort: undecided past the deadline, or unknown).
    pub aborted: Vec<TxId>,
    /// Branches this pass committed.
    pub committed: Vec<Gid>,
    /// Branches this pass rolled back.
    pub rolled_back: Vec<Gid>,
    /// Branches found finished against the decision.
    pub heuristic: Vec<(Gid, BranchState)>,
    /// Transactions still undecided and within their deadline (their coordinator may still
    /// be working).
    pub waiting: Vec<TxId>,
    /// Prepared branches found in the resources at the start of the pass: branches in doubt.
    pub in_doubt: usize,
    /// Failures (a resource down, a branch with no registered resource); retried next pass.
    pub errors: Vec<String>,
}

/// Why the Recoverer stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// The decision log failed (Baton unreachable), or this Recoverer was fenced off.
    #[error(transparent)]
    Log(#[from] LogError),
}

/// Resolves in-doubt branches by the recorded decision and aborts undecided transactions
/// past their deadline.
///
/// Each pass:
/// 1. reads the log's open transactions: an undecided one past its deadline is decided
///    *abort* by compare-and-set (a coordinator that decided first wins, and is followed);
///    then every branch not finished gets the decision;
/// 2. lists the prepared branches of this namespace in every resource (`pg_prepared_xacts`,
///    `XA RECOVER`) and resolves each by its transaction's decision — including branches the
///    log calls finished (a PREPARE that landed after recovery aborted its transaction) and
///    branches whose transaction the log does not know (decided abort first: rule I3);
/// 3. takes finished transactions out of the open set.
///
/// Run it under [`Recoverer::run`], which holds a Baton election so one Recoverer works at a
/// time and fences its log writes with the election's token: a deposed Recoverer (paused
/// past its session) cannot write a decision or a branch outcome. Its database actions need
/// no fence: it only ever applies a decision that is in the log.
#[derive(Clone)]
pub struct Recoverer {
    log: Arc<dyn DecisionLog>,
    resources: HashMap<BranchId, Arc<dyn Resource>>,
    config: RecovererConfig,
}

impl std::fmt::Debug for Recoverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recoverer")
            .field("namespace", &self.log.namespace())
            .field("resources", &self.resources.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Recoverer {
    /// A Recoverer for `log`.
    pub fn new(log: Arc<dyn DecisionLog>) -> Recoverer {
        Recoverer {
            log,
            resources: HashMap::new(),
            config: RecovererConfig::default(),
        }
    }

    /// Registers a resource whose branches it resolves.
    pub fn with_resource(mut self, resource: Arc<dyn Resource>) -> Recoverer {
        self.resources.insert(resource.id().clone(), resource);
        self
    }

    /// Replaces the settings.
    pub fn with_config(mut self, config: RecovererConfig) -> Recoverer {
        self.config = config;
        self
    }

    /// Campaigns in the Baton election `name` and, while leading, runs a pass every
    /// interval with the election's fence. Returns only on an error other than losing the
    /// leadership (after which it campaigns again).
    pub async fn run(&self, client: &Client, name: &str) -> Result<(), RecoveryError> {
        loop {
            let session = match Session::new(
                client,
                SessionOptions::new().with_ttl(self.config.session_ttl),
            )
            .await
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "recoverer: no session; trying again");
                    tokio::time::sleep(self.config.interval).await;
                    continue;
                }
            };
            let who = format!("recoverer pid {}", std::process::id());
            let leadership = match Election::new(client, name).campaign(&session, who).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "recoverer: campaign failed; trying again");
                    tokio::time::sleep(self.config.interval).await;
                    continue;
                }
            };
            let fence = LeaderFence::of(&leadership);
            tracing::info!(token = fence.token().get(), "recoverer: leading");
            let lost = leadership.lost();
            tokio::pin!(lost);
            let mut last_purge: Option<std::time::Instant> = None;
            loop {
                if last_purge.is_none_or(|t| t.elapsed() >= PURGE_EVERY) {
                    last_purge = Some(std::time::Instant::now());
                    self.purge(&fence).await;
                }
                tokio::select! {
                    reason = &mut lost => {
                        tracing::warn!(%reason, "recoverer: leadership lost");
                        break;
                    }
                    r = self.resolve_once(Some(&fence)) => match r {
                        Ok(report) => {
                            if !report.errors.is_empty() {
                                tracing::warn!(errors = ?report.errors, "recoverer: pass left work");
                            }
                        }
                        Err(RecoveryError::Log(LogError::Fenced { token })) => {
                            tracing::warn!(token = token.get(), "recoverer: fenced off");
                            break;
                        }
                        Err(e) => tracing::warn!(error = %e, "recoverer: pass failed"),
                    }
                }
                tokio::select! {
                    _ = &mut lost => break,
                    _ = tokio::time::sleep(self.config.interval) => {}
                }
            }
            drop(leadership);
        }
    }

    /// Deletes finished transactions and marker rows past the retention.
    async fn purge(&self, fence: &LeaderFence) {
        match self.log.purge(self.config.retention, Some(fence)).await {
            Ok(n) if n > 0 => tracing::info!(n, "recoverer: purged finished transactions"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "recoverer: purging the log failed"),
        }
        for r in self.resources.values() {
            if let Err(e) = r.purge_markers(self.config.retention).await {
                tracing::warn!(resource = %r.id(), error = %e, "recoverer: purging markers failed");
            }
        }
    }

    /// One pass (see the type's documentation). `fence` guards its log writes; without one
    /// (tests, a one-off operator run) make sure no other Recoverer runs.
    pub async fn resolve_once(
        &self,
        fence: Option<&LeaderFence>,
    ) -> Result<RecoveryReport, RecoveryError> {
        let log = self.log.as_ref();
        let ns = log.namespace().to_string();
        let mut report = RecoveryReport::default();
        let by = match fence {
            Some(f) => format!(
                "recoverer (token {}, pid {})",
                f.token(),
                std::process::id()
            ),
            None => format!("recoverer (pid {})", std::process::id()),
        };

        // What the databases hold prepared, listed first: a branch prepared after this
        // listing is in an open transaction (step 1) or is found by the next pass.
        let mut prepared: Vec<Gid> = Vec::new();
        for r in self.resources.values() {
            match r.list_prepared(&ns).await {
                Ok(list) => prepared.extend(list.into_iter().map(|p| p.gid)),
                Err(e) => report
                    .errors
                    .push(format!("{}: listing prepared: {e}", r.id())),
            }
        }
        report.in_doubt = prepared.len();
        metrics::gauge!("baton_txn_2pc_in_doubt_branches", "namespace" => ns.clone())
            .set(prepared.len() as f64);

        // 1. Open transactions.
        let mut handled: HashSet<Gid> = HashSet::new();
        let open = log.open().await?;
        let mut undecided = 0usize;
        for rec in open {
            if let Some(d) = self.decision_for(&rec, &by, fence, &mut report).await? {
                self.finish_tx(&rec, d, fence, &mut handled, &mut report)
                    .await?;
            } else {
                undecided += 1;
            }
        }
        metrics::gauge!("baton_txn_2pc_undecided_transactions", "namespace" => ns.clone())
            .set(undecided as f64);

        // 2. Prepared branches step 1 did not finish: of closed transactions (a PREPARE that
        // landed after its transaction was aborted and closed), of branches the log already
        // calls final, of transactions the log does not know.
        for gid in prepared {
            if handled.contains(&gid) || report.waiting.contains(&gid.tx()) {
                continue;
            }
            let Some(resource) = self.resources.get(gid.branch()) else {
                continue;
            };
            let rec = log.get(gid.tx()).await?.unwrap_or(TxRecord {
                tx: gid.tx(),
                intent: None,
                decision: None,
                branches: Default::default(),
                open: false,
            });
            let Some(d) = self.decision_for(&rec, &by, fence, &mut report).await? else {
                continue;
            };
            self.finish_one(resource.as_ref(), &gid, d, fence, &mut report)
                .await?;
        }
        Ok(report)
    }

    /// The transaction's decision; decides abort if it is undecided past its deadline (or
    /// has no intent at all). `None`: still within its deadline.
    async fn decision_for(
        &self,
        rec: &TxRecord,
        by: &str,
        fence: Option<&LeaderFence>,
        report: &mut RecoveryReport,
    ) -> Result<Option<Decision>, LogError> {
        if let Some(d) = &rec.decision {
            return Ok(Some(d.decision));
        }
        let why = match &rec.intent {
            Some(i) if now_ms() < i.deadline_ms + self.config.grace.as_millis() as u64 => {
                report.waiting.push(rec.tx);
                return Ok(None);
            }
            Some(_) => "undecided past its deadline",
            None => "prepared branch with no intent in the log",
        };
        let winner = self
            .log
            .decide(rec.tx, Decision::Abort, &format!("{by}: {why}"), fence)
            .await?;
        if winner.decision == Decision::Abort && winner.by.starts_with(by) {
            report.aborted.push(rec.tx);
        }
        Ok(Some(winner.decision))
    }

    async fn finish_tx(
        &self,
        rec: &TxRecord,
        decision: Decision,
        fence: Option<&LeaderFence>,
        handled: &mut HashSet<Gid>,
        report: &mut RecoveryReport,
    ) -> Result<(), LogError> {
        let mut all_final = true;
        for b in rec.branch_ids() {
            if rec.branches.get(&b).is_some_and(|r| r.state.is_final()) {
                continue;
            }
            let Some(resource) = self.resources.get(&b) else {
                report
                    .errors
                    .push(format!("{}: no resource registered for branch {b}", rec.tx));
                all_final = false;
                continue;
            };
            let gid = Gid::new(self.log.namespace(), rec.tx, b);
            handled.insert(gid.clone());
            if !self
                .finish_one(resource.as_ref(), &gid, decision, fence, report)
                .await?
            {
                all_final = false;
            }
        }
        if all_final {
            self.log.close(rec.tx, fence).await?;
        }
        Ok(())
    }

    /// Applies the decision to one branch; `true` when it is final.
    async fn finish_one(
        &self,
        resource: &dyn Resource,
        gid: &Gid,
        decision: Decision,
        fence: Option<&LeaderFence>,
        report: &mut RecoveryReport,
    ) -> Result<bool, LogError> {
        let state = finish_branch(
            self.log.as_ref(),
            resource,
            gid,
            decision,
            self.config.attempts,
            Duration::from_millis(100),
            fence,
        )
        .await?;
        match state {
            BranchState::Committed => report.committed.push(gid.clone()),
            BranchState::RolledBack => report.rolled_back.push(gid.clone()),
            BranchState::Pending => report
                .errors
                .push(format!("{gid}: phase 2 failed; next pass retries")),
            s => report.heuristic.push((gid.clone(), s)),
        }
        Ok(state.is_final())
    }
}
