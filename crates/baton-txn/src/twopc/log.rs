//! The decision log: where a global transaction's intent, decision and branch outcomes are
//! recorded. [`BatonDecisionLog`] keeps them in Baton (replicated, so any process can finish a
//! transaction); [`InMemoryDecisionLog`] keeps them in one process's memory and exists to show
//! what that costs (a crash loses the decision and leaves branches in doubt).

use baton_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, Op, PutOptions, SortOrder, SortTarget,
    Txn,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use super::ids::{BranchId, Gid, TxId};
use super::participant::BoxFuture;
use crate::coordination::{
    check_namespace, create_open, decode, encode, now_ms, range, retry, LeaderFence, LogError,
};

/// The outcome every branch of a transaction gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Every branch commits.
    Commit,
    /// Every branch rolls back.
    Abort,
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Decision::Commit => "commit",
            Decision::Abort => "abort",
        })
    }
}

/// What a coordinator records before it sends the first PREPARE: the transaction, the exact
/// GID of every branch, and the deadline after which recovery may abort it undecided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// The transaction.
    pub tx: TxId,
    /// The branches, with their GIDs exactly as they are sent to the databases.
    pub branches: Vec<IntentBranch>,
    /// When the intent was recorded (Unix ms, the coordinator's clock).
    pub created_ms: u64,
    /// After this (Unix ms), a transaction still undecided is aborted by recovery.
    pub deadline_ms: u64,
    /// Who coordinates (host and process id), for operators.
    pub coordinator: String,
}

/// One branch of an [`Intent`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentBranch {
    /// The resource.
    pub branch: BranchId,
    /// The GID sent to it.
    pub gid: String,
}

/// The decision, written once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRecord {
    /// Commit or abort.
    pub decision: Decision,
    /// When it was made (Unix ms).
    pub decided_ms: u64,
    /// Who made it (a coordinator, or the Recoverer with its fencing token), and why.
    pub by: String,
}

/// Where one branch stands in phase 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchState {
    /// Not finished yet (phase 2 failed so far, or has not run).
    Pending,
    /// Committed as decided.
    Committed,
    /// Rolled back as decided (or never prepared, for an abort).
    RolledBack,
    /// The decision was commit, but the branch was found rolled back: someone finished it by
    /// hand (`ROLLBACK PREPARED`, `XA ROLLBACK`). Atomicity is broken; a human must look.
    HeuristicRollback,
    /// The decision was abort, but the branch was found committed by hand.
    HeuristicCommit,
}

impl BranchState {
    /// Whether nothing more will be done to the branch.
    pub fn is_final(self) -> bool {
        self != BranchState::Pending
    }
    /// Whether the branch ended against the decision.
    pub fn is_heuristic(self) -> bool {
        matches!(
            self,
            BranchState::HeuristicRollback | BranchState::HeuristicCommit
        )
    }
}

/// The log's record of one branch in phase 2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchRecord {
    /// Where it stands.
    pub state: BranchState,
    /// Phase-2 attempts so far.
    pub attempts: u32,
    /// The last phase-2 error, if any.
    pub last_error: Option<String>,
    /// When this record was written (Unix ms).
    pub updated_ms: u64,
}

/// Everything the log holds about one transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxRecord {
    /// The transaction.
    pub tx: TxId,
    /// The intent (absent only for a transaction found prepared in a database but never
    /// logged, which recovery aborts).
    pub intent: Option<Intent>,
    /// The decision, once made.
    pub decision: Option<DecisionRecord>,
    /// Phase-2 records per branch.
    pub branches: BTreeMap<BranchId, BranchRecord>,
    /// Whether the transaction still needs work (it is in the log's open set).
    pub open: bool,
}

/// A transaction's state as shown to operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxState {
    /// Intent recorded, no decision yet: branches may be prepared and in doubt.
    Preparing,
    /// Decided commit, some branch not finished.
    Committing,
    /// Decided abort, some branch not finished.
    Aborting,
    /// Every branch committed.
    Committed,
    /// Every branch rolled back.
    Aborted,
    /// Finished, but some branch ended against the decision.
    Heuristic,
}

impl TxRecord {
    /// The state.
    pub fn state(&self) -> TxState {
        let branches: Vec<&BranchId> = match &self.intent {
            Some(i) => i.branches.iter().map(|b| &b.branch).collect(),
            None => self.branches.keys().collect(),
        };
        let finished = branches
            .iter()
            .all(|b| self.branches.get(*b).is_some_and(|r| r.state.is_final()));
        let heuristic = self.branches.values().any(|r| r.state.is_heuristic());
        match self.decision.as_ref().map(|d| d.decision) {
            None => TxState::Preparing,
            Some(_) if finished && heuristic => TxState::Heuristic,
            Some(Decision::Commit) if finished => TxState::Committed,
            Some(Decision::Abort) if finished => TxState::Aborted,
            Some(Decision::Commit) => TxState::Committing,
            Some(Decision::Abort) => TxState::Aborting,
        }
    }

    /// The branches the intent names (or that have records, without an intent).
    pub fn branch_ids(&self) -> Vec<BranchId> {
        match &self.intent {
            Some(i) => i.branches.iter().map(|b| b.branch.clone()).collect(),
            None => self.branches.keys().cloned().collect(),
        }
    }
}

/// Where a coordinator and the Recoverer record a transaction's life.
///
/// The rules every implementation keeps (the coordinator's correctness rests on them):
/// the intent is written once; the decision is written once, by compare-and-set, and every
/// caller of [`DecisionLog::decide`] gets the winner back; a final branch state is never
/// replaced.
pub trait DecisionLog: Send + Sync {
    /// The namespace: it prefixes the GIDs, so recovery touches only this log's branches.
    fn namespace(&self) -> &str;

    /// Records the intent; refused if the transaction already has one.
    fn record_intent<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), LogError>>;

    /// Writes `decision` if none was made and returns the winning decision (ours or an
    /// earlier one). With a fence, the write also needs the fence to hold.
    fn decide<'a>(
        &'a self,
        tx: TxId,
        decision: Decision,
        by: &'a str,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<DecisionRecord, LogError>>;

    /// Everything about `tx`, if the log knows it.
    fn get(&self, tx: TxId) -> BoxFuture<'_, Result<Option<TxRecord>, LogError>>;

    /// Records a branch's phase-2 progress; a final state already recorded stays (the call
    /// then does nothing).
    fn record_branch<'a>(
        &'a self,
        tx: TxId,
        branch: &'a BranchId,
        record: &'a BranchRecord,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<(), LogError>>;

    /// Takes `tx` out of the open set (every branch is final).
    fn close<'a>(
        &'a self,
        tx: TxId,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<(), LogError>>;

    /// The open transactions, oldest first.
    fn open(&self) -> BoxFuture<'_, Result<Vec<TxRecord>, LogError>>;

    /// Up to `limit` transactions, newest first, open or not.
    fn list(&self, limit: usize) -> BoxFuture<'_, Result<Vec<TxRecord>, LogError>>;

    /// Deletes the records of finished transactions created more than `older_than` ago
    /// (open ones are kept however old); returns how many transactions it deleted. The log
    /// would otherwise grow by a few keys per transaction for ever.
    fn purge<'a>(
        &'a self,
        older_than: Duration,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<usize, LogError>>;
}

/// The decision log in Baton. Keys, under `baton-txn/<namespace>/`:
///
/// - `tx/<tx>/intent`, `tx/<tx>/decision`, `tx/<tx>/branch/<branch>`: JSON records;
/// - `open/<tx>`: present while the transaction needs work (created with the intent in one
///   Baton transaction, deleted when every branch is final), so recovery reads only these.
///
/// The decision is `If create_revision(decision) = 0 Then Put Else Get`: one round trip,
/// write-once by the store itself, and the loser reads the winner in the same answer.
#[derive(Clone, Debug)]
pub struct BatonDecisionLog {
    client: Client,
    namespace: String,
    root: String,
}

impl BatonDecisionLog {
    /// The log of `namespace` (1-16 of `[A-Za-z0-9_-]`) in the Baton cluster `client` talks
    /// to.
    pub fn new(client: &Client, namespace: &str) -> Result<BatonDecisionLog, LogError> {
        check_namespace(namespace)?;
        Ok(BatonDecisionLog {
            client: client.clone(),
            namespace: namespace.to_string(),
            root: format!("baton-txn/{namespace}/"),
        })
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn tx_prefix(&self, tx: TxId) -> String {
        format!("{}tx/{tx}/", self.root)
    }
    fn intent_key(&self, tx: TxId) -> String {
        format!("{}intent", self.tx_prefix(tx))
    }
    fn decision_key(&self, tx: TxId) -> String {
        format!("{}decision", self.tx_prefix(tx))
    }
    fn branch_key(&self, tx: TxId, b: &BranchId) -> String {
        format!("{}branch/{b}", self.tx_prefix(tx))
    }
    fn open_key(&self, tx: TxId) -> String {
        format!("{}open/{tx}", self.root)
    }

    async fn read(&self, tx: TxId) -> Result<Option<TxRecord>, LogError> {
        let prefix = self.tx_prefix(tx);
        let (kvs, open) = retry(|| async {
            let r = self
                .client
                .txn(Txn::new().and_then([
                    Op::get(prefix.clone(), GetOptions::new().with_prefix()),
                    Op::get(self.open_key(tx), GetOptions::new().with_count_only()),
                ]))
                .await?;
            let kvs = range(&r, 0).map(|r| r.kvs.clone()).unwrap_or_default();
            let open = range(&r, 1).map(|r| r.count > 0).unwrap_or(false);
            Ok((kvs, open))
        })
        .await?;
        if kvs.is_empty() {
            return Ok(None);
        }
        let mut rec = TxRecord {
            tx,
            intent: None,
            decision: None,
            branches: BTreeMap::new(),
            open,
        };
        for kv in kvs {
            let rest = &kv.key[prefix.len()..];
            if rest == b"intent" {
                rec.intent = Some(decode(&kv.key, &kv.value)?);
            } else if rest == b"decision" {
                rec.decision = Some(decode(&kv.key, &kv.value)?);
            } else if let Some(b) = rest.strip_prefix(b"branch/") {
                let b = BranchId::new(String::from_utf8_lossy(b).into_owned()).map_err(|e| {
                    LogError::Corrupt {
                        key: String::from_utf8_lossy(&kv.key).into_owned(),
                        reason: e.to_string(),
                    }
                })?;
                rec.branches.insert(b, decode(&kv.key, &kv.value)?);
            }
        }
        Ok(Some(rec))
    }

    /// The first `limit` open transactions (by id, so oldest first), with how many are open
    /// in all: a bounded [`DecisionLog::open`] for operators' screens (Baton's dashboard).
    pub async fn open_page(&self, limit: usize) -> Result<(Vec<TxRecord>, u64), LogError> {
        let prefix = format!("{}open/", self.root);
        let r = retry(|| async {
            Ok(self
                .client
                .get(
                    prefix.clone(),
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(limit.max(1) as i64),
                )
                .await?)
        })
        .await?;
        let ids: Vec<TxId> = r
            .kvs
            .iter()
            .take(limit)
            .filter_map(|kv| tx_of_key(&kv.key[prefix.len()..]))
            .collect();
        Ok((self.read_many(ids).await?, r.count.max(0) as u64))
    }

    async fn read_many(&self, ids: Vec<TxId>) -> Result<Vec<TxRecord>, LogError> {
        let mut out = Vec::with_capacity(ids.len());
        for tx in ids {
            if let Some(r) = self.read(tx).await? {
                out.push(r);
            }
        }
        Ok(out)
    }

    async fn ids_under(&self, prefix: String, opts: GetOptions) -> Result<Vec<TxId>, LogError> {
        let r =
            retry(|| async { Ok(self.client.get(prefix.clone(), opts.clone()).await?) }).await?;
        Ok(r.kvs
            .iter()
            .filter_map(|kv| {
                let rest = std::str::from_utf8(&kv.key[prefix.len()..]).ok()?;
                rest.split('/').next()?.parse().ok()
            })
            .collect())
    }
}

fn with_fence(compares: Vec<Compare>, fence: Option<&LeaderFence>) -> Vec<Compare> {
    let mut c = compares;
    c.extend(fence.map(LeaderFence::compare));
    c
}

impl DecisionLog for BatonDecisionLog {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn record_intent<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            let key = self.intent_key(intent.tx);
            let value = encode(intent);
            match create_open(&self.client, &key, &value, &self.open_key(intent.tx)).await? {
                None => Ok(()),
                // A repeat of our own write (the first attempt's answer was lost) finds our
                // record; anything else is a second intent for one id.
                Some(kv) if kv.value == value => Ok(()),
                Some(_) => Err(LogError::Invalid(format!(
                    "transaction {} already has an intent",
                    intent.tx
                ))),
            }
        })
    }

    fn decide<'a>(
        &'a self,
        tx: TxId,
        decision: Decision,
        by: &'a str,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<DecisionRecord, LogError>> {
        Box::pin(async move {
            let key = self.decision_key(tx);
            let ours = DecisionRecord {
                decision,
                decided_ms: now_ms(),
                by: by.to_string(),
            };
            let value = encode(&ours);
            retry(|| async {
                let r = self
                    .client
                    .txn(
                        Txn::new()
                            .when(with_fence(
                                vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)],
                                fence,
                            ))
                            .and_then([Op::put(key.clone(), value.clone(), PutOptions::new())])
                            .or_else([Op::get(key.clone(), GetOptions::new())]),
                    )
                    .await?;
                if r.succeeded {
                    return Ok(ours.clone());
                }
                match range(&r, 0).and_then(|r| r.kvs.first()) {
                    Some(kv) => decode(&kv.key, &kv.value),
                    None => Err(LogError::fenced_off(fence)),
                }
            })
            .await
        })
    }

    fn get(&self, tx: TxId) -> BoxFuture<'_, Result<Option<TxRecord>, LogError>> {
        Box::pin(self.read(tx))
    }

    fn record_branch<'a>(
        &'a self,
        tx: TxId,
        branch: &'a BranchId,
        record: &'a BranchRecord,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            let key = self.branch_key(tx, branch);
            let value = encode(record);
            for _ in 0..16 {
                let cur =
                    retry(|| async { Ok(self.client.get(key.clone(), GetOptions::new()).await?) })
                        .await?;
                let (rev, prev) = match cur.kvs.first() {
                    Some(kv) => (
                        kv.mod_revision,
                        Some(decode::<BranchRecord>(&kv.key, &kv.value)?),
                    ),
                    None => (0, None),
                };
                if prev.as_ref().is_some_and(|p| p.state.is_final()) {
                    return Ok(());
                }
                let r = retry(|| async {
                    Ok(self
                        .client
                        .txn(
                            Txn::new()
                                .when(with_fence(
                                    vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)],
                                    fence,
                                ))
                                .and_then([Op::put(key.clone(), value.clone(), PutOptions::new())]),
                        )
                        .await?)
                })
                .await?;
                if r.succeeded {
                    return Ok(());
                }
                if let Some(f) = fence {
                    if !f.holds(&self.client).await? {
                        return Err(LogError::Fenced { token: f.token() });
                    }
                }
            }
            Err(LogError::Contended(key))
        })
    }

    fn close<'a>(
        &'a self,
        tx: TxId,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            let r = retry(|| async {
                Ok(self
                    .client
                    .txn(
                        Txn::new()
                            .when(with_fence(Vec::new(), fence))
                            .and_then([Op::delete(self.open_key(tx), DeleteOptions::new())]),
                    )
                    .await?)
            })
            .await?;
            if r.succeeded {
                Ok(())
            } else {
                Err(LogError::fenced_off(fence))
            }
        })
    }

    fn open(&self) -> BoxFuture<'_, Result<Vec<TxRecord>, LogError>> {
        Box::pin(async move {
            let prefix = format!("{}open/", self.root);
            let ids = self
                .ids_under(prefix, GetOptions::new().with_prefix().with_keys_only())
                .await?;
            self.read_many(ids).await
        })
    }

    fn list(&self, limit: usize) -> BoxFuture<'_, Result<Vec<TxRecord>, LogError>> {
        Box::pin(async move {
            let prefix = format!("{}tx/", self.root);
            // Keys only, newest first (ids sort by time), a page at a time.
            const PAGE: i64 = 512;
            let mut end = baton_client::prefix_end(prefix.as_bytes());
            let mut ids: Vec<TxId> = Vec::new();
            while ids.len() < limit {
                let r = retry(|| async {
                    Ok(self
                        .client
                        .get(
                            prefix.clone(),
                            GetOptions::new()
                                .with_range_end(end.clone())
                                .with_keys_only()
                                .with_sort(SortTarget::Key, SortOrder::Descend)
                                .with_limit(PAGE),
                        )
                        .await?)
                })
                .await?;
                for kv in &r.kvs {
                    let Some(id) = tx_of_key(&kv.key[prefix.len()..]) else {
                        continue;
                    };
                    if ids.last() != Some(&id) && ids.len() < limit {
                        ids.push(id);
                    }
                }
                match r.kvs.last() {
                    Some(last) if r.kvs.len() as i64 == PAGE => end = last.key.clone(),
                    _ => break,
                }
            }
            self.read_many(ids).await
        })
    }

    fn purge<'a>(
        &'a self,
        older_than: Duration,
        fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<usize, LogError>> {
        Box::pin(async move {
            let prefix = format!("{}tx/", self.root);
            // Ids start with their creation time (12 hex digits of Unix ms), so every
            // transaction created before the cutoff sorts below this key.
            let cutoff = now_ms().saturating_sub(older_than.as_millis() as u64);
            let end = format!("{prefix}{cutoff:012x}");
            let r = retry(|| async {
                Ok(self
                    .client
                    .get(
                        prefix.clone(),
                        GetOptions::new()
                            .with_range_end(end.clone())
                            .with_keys_only(),
                    )
                    .await?)
            })
            .await?;
            let mut old: Vec<TxId> = Vec::new();
            for kv in &r.kvs {
                if let Some(id) = tx_of_key(&kv.key[prefix.len()..]) {
                    if old.last() != Some(&id) {
                        old.push(id);
                    }
                }
            }
            let open: std::collections::HashSet<TxId> = self
                .ids_under(
                    format!("{}open/", self.root),
                    GetOptions::new().with_prefix().with_keys_only(),
                )
                .await?
                .into_iter()
                .collect();
            let doomed: Vec<TxId> = old.into_iter().filter(|id| !open.contains(id)).collect();
            for chunk in doomed.chunks(64) {
                let deletes: Vec<Op> = chunk
                    .iter()
                    .map(|tx| Op::delete(self.tx_prefix(*tx), DeleteOptions::new().with_prefix()))
                    .collect();
                let r = retry(|| async {
                    Ok(self
                        .client
                        .txn(
                            Txn::new()
                                .when(with_fence(Vec::new(), fence))
                                .and_then(deletes.clone()),
                        )
                        .await?)
                })
                .await?;
                if !r.succeeded {
                    return Err(LogError::fenced_off(fence));
                }
            }
            Ok(doomed.len())
        })
    }
}

/// The transaction id a key below `tx/` belongs to.
fn tx_of_key(rest: &[u8]) -> Option<TxId> {
    std::str::from_utf8(rest)
        .ok()?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// A decision log in this process's memory. **Not for production**: it is what a
/// coordinator without a replicated log has, and it exists so the tests can show the failure
/// Baton's log prevents. When the process dies, its decisions die with it: branches it
/// prepared stay in doubt (holding their locks) and no other process can tell whether they
/// must commit or roll back — aborting them is wrong if the decision was commit and some
/// branch already committed.
#[derive(Debug)]
pub struct InMemoryDecisionLog {
    namespace: String,
    records: Mutex<HashMap<TxId, TxRecord>>,
}

impl InMemoryDecisionLog {
    /// An empty log.
    pub fn new(namespace: &str) -> Result<InMemoryDecisionLog, LogError> {
        check_namespace(namespace)?;
        Ok(InMemoryDecisionLog {
            namespace: namespace.to_string(),
            records: Mutex::new(HashMap::new()),
        })
    }
}

impl DecisionLog for InMemoryDecisionLog {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn record_intent<'a>(&'a self, intent: &'a Intent) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            let mut m = self.records.lock().unwrap();
            if m.contains_key(&intent.tx) {
                return Err(LogError::Invalid(format!(
                    "transaction {} already has an intent",
                    intent.tx
                )));
            }
            m.insert(
                intent.tx,
                TxRecord {
                    tx: intent.tx,
                    intent: Some(intent.clone()),
                    decision: None,
                    branches: BTreeMap::new(),
                    open: true,
                },
            );
            Ok(())
        })
    }

    fn decide<'a>(
        &'a self,
        tx: TxId,
        decision: Decision,
        by: &'a str,
        _fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<DecisionRecord, LogError>> {
        Box::pin(async move {
            let mut m = self.records.lock().unwrap();
            let rec = m.entry(tx).or_insert_with(|| TxRecord {
                tx,
                intent: None,
                decision: None,
                branches: BTreeMap::new(),
                open: true,
            });
            Ok(rec
                .decision
                .get_or_insert_with(|| DecisionRecord {
                    decision,
                    decided_ms: now_ms(),
                    by: by.to_string(),
                })
                .clone())
        })
    }

    fn get(&self, tx: TxId) -> BoxFuture<'_, Result<Option<TxRecord>, LogError>> {
        Box::pin(async move { Ok(self.records.lock().unwrap().get(&tx).cloned()) })
    }

    fn record_branch<'a>(
        &'a self,
        tx: TxId,
        branch: &'a BranchId,
        record: &'a BranchRecord,
        _fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            let mut m = self.records.lock().unwrap();
            if let Some(rec) = m.get_mut(&tx) {
                let cur = rec.branches.get(branch);
                if !cur.is_some_and(|c| c.state.is_final()) {
                    rec.branches.insert(branch.clone(), record.clone());
                }
            }
            Ok(())
        })
    }

    fn close<'a>(
        &'a self,
        tx: TxId,
        _fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            if let Some(rec) = self.records.lock().unwrap().get_mut(&tx) {
                rec.open = false;
            }
            Ok(())
        })
    }

    fn open(&self) -> BoxFuture<'_, Result<Vec<TxRecord>, LogError>> {
        Box::pin(async move {
            let mut v: Vec<TxRecord> = self
                .records
                .lock()
                .unwrap()
                .values()
                .filter(|r| r.open)
                .cloned()
                .collect();
            v.sort_by_key(|r| r.tx);
            Ok(v)
        })
    }

    fn list(&self, limit: usize) -> BoxFuture<'_, Result<Vec<TxRecord>, LogError>> {
        Box::pin(async move {
            let mut v: Vec<TxRecord> = self.records.lock().unwrap().values().cloned().collect();
            v.sort_by_key(|r| std::cmp::Reverse(r.tx));
            v.truncate(limit);
            Ok(v)
        })
    }

    fn purge<'a>(
        &'a self,
        older_than: Duration,
        _fence: Option<&'a LeaderFence>,
    ) -> BoxFuture<'a, Result<usize, LogError>> {
        Box::pin(async move {
            let cutoff = now_ms().saturating_sub(older_than.as_millis() as u64);
            let mut m = self.records.lock().unwrap();
            let before = m.len();
            m.retain(|tx, r| r.open || tx.created_ms() >= cutoff);
            Ok(before - m.len())
        })
    }
}

/// The GID of `branch` in `tx` for a log.
pub fn gid_of(log: &dyn DecisionLog, tx: TxId, branch: &BranchId) -> Gid {
    Gid::new(log.namespace(), tx, branch.clone())
}
