//! The saga log in Baton: one JSON record per saga, every write a compare-and-set on the
//! record's `mod_revision`. It stores records and decides nothing about them: what a write
//! changes — an orchestrator's or an operator's — is `transition`'s.

use std::time::Duration;

use baton_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, Op, PutOptions, SortOrder, SortTarget,
    Txn, WatchOptions,
};
use futures_util::StreamExt;
use serde::Serialize;

use super::def::SagaDef;
use super::error::SagaError;
use super::record::SagaRecord;
use super::transition::{transition, Event, Request};
use crate::coordination::{
    check_namespace, create_open, decode, encode, now_ms, range, retry, LeaderFence, LogError,
};

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

/// What [`SagaLog::overview`] reads: a bounded part of a namespace's sagas.
#[derive(Clone, Debug, PartialEq)]
pub struct SagaOverview {
    /// Unfinished sagas (running, compensating, stuck), oldest first: at most the limit
    /// asked for, taken from the open set in id order.
    pub open: Vec<SagaRecord>,
    /// Sagas in the open set in all (it may hold more than `open`).
    pub open_total: u64,
    /// The sagas written last, newest first, in any state.
    pub recent: Vec<SagaRecord>,
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
        let record = def.new_record(id, data, now_ms())?;
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

    /// A bounded look at the namespace for operators' screens (Baton's dashboard): the first
    /// `open_limit` unfinished sagas of the open set (by id) with how many it holds in all,
    /// and the `recent_limit` sagas written last, newest first, whatever their state. At
    /// most `open_limit + recent_limit` records are read, however many the namespace has.
    pub async fn overview(
        &self,
        open_limit: usize,
        recent_limit: usize,
    ) -> Result<SagaOverview, SagaError> {
        let prefix = self.open_prefix();
        let marks = retry(|| async {
            Ok(self
                .client
                .get(
                    prefix.clone(),
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(open_limit.max(1) as i64),
                )
                .await?)
        })
        .await?;
        let keys: Vec<String> = marks
            .kvs
            .iter()
            .take(open_limit)
            .map(|kv| self.key(&String::from_utf8_lossy(&kv.key[prefix.len()..])))
            .collect();
        let mut open = Vec::with_capacity(keys.len());
        // One transaction per chunk (etcd allows 128 operations in one).
        for chunk in keys.chunks(64) {
            let ops: Vec<Op> = chunk
                .iter()
                .map(|k| Op::get(k.clone(), GetOptions::new()))
                .collect();
            let r =
                retry(|| async { Ok(self.client.txn(Txn::new().and_then(ops.clone())).await?) })
                    .await?;
            for i in 0..chunk.len() {
                // A saga finished between the two reads has no record to show as open.
                if let Some(kv) = range(&r, i).and_then(|r| r.kvs.first()) {
                    open.push(decode::<SagaRecord>(&kv.key, &kv.value)?);
                }
            }
        }
        open.sort_by_key(|r| r.created_ms);
        let all = format!("{}saga/", self.root);
        let recent = retry(|| async {
            Ok(self
                .client
                .get(
                    all.clone(),
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Mod, SortOrder::Descend)
                        .with_limit(recent_limit.max(1) as i64),
                )
                .await?)
        })
        .await?;
        let recent = recent
            .kvs
            .iter()
            .take(recent_limit)
            .map(|kv| decode::<SagaRecord>(&kv.key, &kv.value))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SagaOverview {
            open,
            open_total: marks.count.max(0) as u64,
            recent,
        })
    }

    /// Reads saga `id`, asks `f` for the record to write in its place (in practice
    /// `transition`'s answer) and writes that by compare-and-set (with `fence`, if given),
    /// again from a fresh read whenever someone else wrote in between. `f` returns `None` to
    /// write nothing (the record is not in the state it expects). Returns whether it wrote,
    /// and the record as written (or as read, if nothing was written).
    ///
    /// `f` may run several times and must decide from the record it is given: after a lost
    /// answer, the record it sees may already hold its own previous write.
    pub(crate) async fn update(
        &self,
        id: &str,
        fence: Option<&LeaderFence>,
        mut f: impl FnMut(&SagaRecord) -> Result<Option<SagaRecord>, SagaError>,
    ) -> Result<(bool, SagaRecord), SagaError> {
        let key = self.key(id);
        for _ in 0..CAS_ROUNDS {
            let (read, rev) = self
                .read(id)
                .await?
                .ok_or_else(|| SagaError::NotFound(id.to_string()))?;
            let Some(rec) = f(&read)? else {
                return Ok((false, read));
            };
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
                return Ok((true, rec));
            }
            let now_rev = range(&r, 0)
                .and_then(|r| r.kvs.first())
                .map(|kv| kv.mod_revision);
            if now_rev == Some(rev) {
                // The record did not change, so the fence is what failed.
                return Err(LogError::fenced_off(fence).into());
            }
        }
        Err(LogError::Contended(key).into())
    }

    /// Asks for saga `id` to be cancelled: a running saga stops going forward after the step
    /// in flight (if any) and compensates what took effect. Cancelling a saga that already
    /// compensates (or did) changes nothing; a completed one cannot be cancelled.
    pub async fn cancel(&self, id: &str, reason: &str) -> Result<SagaRecord, SagaError> {
        self.operate(id, reason, Request::Cancel).await
    }

    /// Retries the stuck compensation of saga `id` (after the cause was fixed): its failure
    /// count starts again from zero and the saga compensates on. Audited with `reason`.
    pub async fn retry_stuck(&self, id: &str, reason: &str) -> Result<SagaRecord, SagaError> {
        self.operate(id, reason, Request::Retry).await
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
        self.operate(id, reason, Request::Skip { step }).await
    }

    /// An operator's request, unfenced and audited.
    async fn operate(
        &self,
        id: &str,
        reason: &str,
        request: Request,
    ) -> Result<SagaRecord, SagaError> {
        let by = who();
        let event = Event::Operator {
            by: &by,
            reason,
            request,
        };
        let (_, rec) = self
            .update(id, None, |r| transition(r, &event, now_ms()))
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
