//! Model test: random command sequences applied to the real `StateMachine` and to a naive
//! reference written independently here (a full copy of the key space per revision, leases
//! in a map, linear scans everywhere). Every response, event list and revision must agree,
//! and so must reads at random historical revisions, `history`, leases and key counts.
//! Midway, the machine is snapshotted and restored, and the restored copy must continue
//! exactly like the original.
//!
//! Locks and fences are modelled too: a lock's queue is recomputed from the whole key space
//! every time (no index), the registry is a plain map with the documented collection rule,
//! and the fence table is a map of highest tokens.

use std::collections::BTreeMap;

use baton_core::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type State = BTreeMap<Vec<u8>, KeyValue>;

/// Independent of `KeyRange::contains` on purpose.
fn in_range(r: &KeyRange, k: &[u8]) -> bool {
    match r.range_end.as_slice() {
        [] => k == r.key.as_slice(),
        [0] => k >= r.key.as_slice(),
        end => k >= r.key.as_slice() && k < end,
    }
}

#[derive(Clone)]
struct ModelLease {
    ttl_s: i64,
    checkpoint_ms: Option<i64>,
}

/// A de-duplication session: every answer ever given (the model never forgets one), and the
/// sequences below `acked` count as acknowledged.
#[derive(Clone)]
struct ModelSession {
    timeout_ms: u64,
    last_ms: u64,
    acked: u64,
    answers: BTreeMap<u64, (Revision, Response)>,
}

#[derive(Clone, Default)]
struct ModelLock {
    delay_ms: u64,
    delayed_until_ms: u64,
    releases: Vec<ForceReleaseRecord>,
}

/// Written independently of `lock_key` (positive ids only; the generator makes no others).
fn model_lock_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut k = name.to_vec();
    k.extend_from_slice(format!("/{lease:x}").as_bytes());
    k
}

/// Lock `name`'s queue in `state`: every key under `name/`, by (create revision, key).
fn model_queue(state: &State, name: &[u8]) -> Vec<KeyValue> {
    let mut pfx = name.to_vec();
    pfx.push(b'/');
    let mut q: Vec<KeyValue> = state
        .values()
        .filter(|kv| kv.key.starts_with(&pfx))
        .cloned()
        .collect();
    q.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    q
}

/// The names (prefixes before a `/`) whose queues `key` is in.
fn model_ancestors(key: &[u8]) -> Vec<Vec<u8>> {
    (0..key.len())
        .filter(|&i| key[i] == b'/')
        .map(|i| key[..i].to_vec())
        .collect()
}

/// The reference: `states[r - 1]` is the whole key space at revision `r`.
#[derive(Clone)]
struct Model {
    states: Vec<State>,
    /// `events[r]`: the events of revision `r`.
    events: BTreeMap<i64, Vec<Event>>,
    leases: BTreeMap<i64, ModelLease>,
    compact: i64,
    locks: BTreeMap<Vec<u8>, ModelLock>,
    fences: BTreeMap<Vec<u8>, FencingToken>,
    /// De-duplication sessions by id.
    sessions: BTreeMap<u64, ModelSession>,
    /// Coverage counters: registry entries collected, lock-delays started.
    collected: usize,
    delays_started: usize,
}

/// The mutable view of one command in progress: the pre-state, the working state, events.
struct Work<'a> {
    model: &'a Model,
    rev: i64,
    cur: State,
    events: Vec<Event>,
}

impl Work<'_> {
    fn put(&mut self, p: &PutRequest) -> PutResponse {
        let prev = self.cur.get(&p.key).cloned();
        let (create, version) = match &prev {
            Some(kv) => (kv.create_revision, kv.version + 1),
            None => (Revision(self.rev), 1),
        };
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: create,
            mod_revision: Revision(self.rev),
            version,
            value: match (&prev, p.ignore_value) {
                (Some(prev), true) => prev.value.clone(),
                _ => p.value.clone(),
            },
            lease: match (&prev, p.ignore_lease) {
                (Some(prev), true) => prev.lease,
                _ => p.lease,
            },
        };
        self.cur.insert(p.key.clone(), kv.clone());
        self.events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: prev.clone(),
        });
        PutResponse {
            prev_kv: if p.prev_kv { prev } else { None },
        }
    }

    fn delete(&mut self, d: &DeleteRangeRequest) -> DeleteRangeResponse {
        let keys: Vec<Vec<u8>> = self
            .cur
            .keys()
            .filter(|k| in_range(&d.range, k))
            .cloned()
            .collect();
        let mut prevs = Vec::new();
        for k in keys {
            let prev = self.cur.remove(&k).expect("listed");
            self.events.push(Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: k,
                    mod_revision: Revision(self.rev),
                    ..KeyValue::default()
                },
                prev_kv: Some(prev.clone()),
            });
            prevs.push(prev);
        }
        DeleteRangeResponse {
            deleted: prevs.len() as i64,
            prev_kvs: if d.prev_kv { prevs } else { Vec::new() },
        }
    }
}

impl Model {
    fn new() -> Self {
        Model {
            states: vec![State::new()],
            events: BTreeMap::new(),
            leases: BTreeMap::new(),
            compact: 1,
            locks: BTreeMap::new(),
            fences: BTreeMap::new(),
            sessions: BTreeMap::new(),
            collected: 0,
            delays_started: 0,
        }
    }

    fn rev(&self) -> i64 {
        self.states.len() as i64
    }

    fn state(&self, rev: i64) -> &State {
        &self.states[(rev - 1) as usize]
    }

    fn read_rev(&self, revision: i64) -> Result<i64, KvError> {
        let at = if revision <= 0 { self.rev() } else { revision };
        if at > self.rev() {
            Err(KvError::FutureRevision)
        } else if at < self.compact {
            Err(KvError::Compacted)
        } else {
            Ok(at)
        }
    }

    fn range(&self, r: &RangeRequest) -> Result<RangeResponse, KvError> {
        if r.range.key.is_empty() {
            return Err(KvError::EmptyKey);
        }
        let at = self.read_rev(r.revision)?;
        Ok(range_over(self.state(at), r))
    }

    fn compare(&self, c: &Compare) -> bool {
        let kvs: Vec<&KeyValue> = self
            .state(self.rev())
            .values()
            .filter(|kv| in_range(&c.range, &kv.key))
            .collect();
        let zero = KeyValue::default();
        let kvs = if kvs.is_empty() {
            if matches!(c.target, CompareTarget::Value(_)) {
                return false;
            }
            vec![&zero]
        } else {
            kvs
        };
        kvs.iter().all(|kv| {
            let ord = match &c.target {
                CompareTarget::Version(v) => kv.version.cmp(v),
                CompareTarget::Create(v) => kv.create_revision.0.cmp(v),
                CompareTarget::Mod(v) => kv.mod_revision.0.cmp(v),
                CompareTarget::Value(v) => kv.value.cmp(v),
                CompareTarget::Lease(v) => kv.lease.0.cmp(v),
            };
            match c.result {
                CompareResult::Equal => ord.is_eq(),
                CompareResult::NotEqual => ord.is_ne(),
                CompareResult::Greater => ord.is_gt(),
                CompareResult::Less => ord.is_lt(),
            }
        })
    }

    fn check_put(&self, p: &PutRequest, lease_first: bool) -> Result<(), KvError> {
        let lease = if !p.ignore_lease && p.lease.0 != 0 && !self.leases.contains_key(&p.lease.0) {
            Err(KvError::LeaseNotFound)
        } else {
            Ok(())
        };
        let key =
            if (p.ignore_value || p.ignore_lease) && !self.state(self.rev()).contains_key(&p.key) {
                Err(KvError::KeyNotFound)
            } else {
                Ok(())
            };
        if lease_first {
            lease.and(key)
        } else {
            key.and(lease)
        }
    }

    /// Structural validation of a txn: op counts and empty keys (etcd's rules, written
    /// directly) and duplicates by brute force over every combination of nested branches.
    fn validate_txn(t: &TxnRequest, budget: usize) -> Result<(), KvError> {
        let opc = t.compare.len().max(t.success.len()).max(t.failure.len());
        if opc > budget {
            return Err(KvError::TooManyOps);
        }
        if t.compare.iter().any(|c| c.range.key.is_empty()) {
            return Err(KvError::EmptyKey);
        }
        for op in t.success.iter().chain(&t.failure) {
            match op {
                RequestOp::Range(r) if r.range.key.is_empty() => return Err(KvError::EmptyKey),
                RequestOp::Put(p) if p.key.is_empty() => return Err(KvError::EmptyKey),
                RequestOp::DeleteRange(d) if d.range.key.is_empty() => {
                    return Err(KvError::EmptyKey)
                }
                RequestOp::Txn(n) => Self::validate_txn(n, budget - opc)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Every (puts, deletes) list a branch can execute, one per combination of nested
    /// then/else choices.
    fn paths(ops: &[RequestOp]) -> Vec<(Vec<Vec<u8>>, Vec<KeyRange>)> {
        let mut acc: Vec<(Vec<Vec<u8>>, Vec<KeyRange>)> = vec![(Vec::new(), Vec::new())];
        for op in ops {
            match op {
                RequestOp::Put(p) => acc.iter_mut().for_each(|a| a.0.push(p.key.clone())),
                RequestOp::DeleteRange(d) => acc.iter_mut().for_each(|a| a.1.push(d.range.clone())),
                RequestOp::Range(_) => {}
                RequestOp::Txn(n) => {
                    let mut choices = Self::paths(&n.success);
                    choices.extend(Self::paths(&n.failure));
                    let mut next = Vec::new();
                    for a in &acc {
                        for c in &choices {
                            let mut puts = a.0.clone();
                            puts.extend(c.0.iter().cloned());
                            let mut dels = a.1.clone();
                            dels.extend(c.1.iter().cloned());
                            next.push((puts, dels));
                        }
                    }
                    acc = next;
                }
            }
        }
        acc
    }

    fn has_duplicates(ops: &[RequestOp]) -> bool {
        Self::paths(ops).iter().any(|(puts, dels)| {
            puts.iter()
                .enumerate()
                .any(|(i, k)| puts[..i].contains(k) || dels.iter().any(|r| in_range(r, k)))
        })
    }

    fn txn_path(&self, t: &TxnRequest, path: &mut Vec<bool>) {
        let ok = t.compare.iter().all(|c| self.compare(c));
        path.push(ok);
        for op in if ok { &t.success } else { &t.failure } {
            if let RequestOp::Txn(n) = op {
                self.txn_path(n, path);
            }
        }
    }

    fn check_txn(&self, t: &TxnRequest, path: &[bool], i: &mut usize) -> Result<(), KvError> {
        let ok = path[*i];
        *i += 1;
        for op in if ok { &t.success } else { &t.failure } {
            match op {
                RequestOp::Range(r) if r.revision > 0 => {
                    self.read_rev(r.revision)?;
                }
                RequestOp::Put(p) => self.check_put(p, false)?,
                RequestOp::Txn(n) => self.check_txn(n, path, i)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn exec_txn(w: &mut Work<'_>, t: &TxnRequest, path: &[bool], i: &mut usize) -> TxnResponse {
        let succeeded = path[*i];
        *i += 1;
        let mut responses = Vec::new();
        for op in if succeeded { &t.success } else { &t.failure } {
            responses.push(match op {
                RequestOp::Range(r) => {
                    let state = if r.revision <= 0 {
                        &w.cur
                    } else {
                        w.model.state(r.revision)
                    };
                    ResponseOp::Range(range_over(state, r))
                }
                RequestOp::Put(p) => ResponseOp::Put(w.put(p)),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(w.delete(d)),
                RequestOp::Txn(n) => ResponseOp::Txn(Self::exec_txn(w, n, path, i)),
            });
        }
        TxnResponse {
            succeeded,
            responses,
        }
    }

    fn revoke_keys(w: &mut Work<'_>, id: i64) {
        let keys: Vec<Vec<u8>> = w
            .cur
            .values()
            .filter(|kv| kv.lease.0 == id)
            .map(|kv| kv.key.clone())
            .collect();
        for k in keys {
            w.delete(&DeleteRangeRequest {
                range: KeyRange {
                    key: k,
                    range_end: Vec::new(),
                },
                prev_kv: false,
            });
        }
    }

    /// Applies the command of entry `index`: the de-duplication commands here, everything else
    /// through `apply`.
    fn apply_entry(
        &mut self,
        cmd: &Command,
        index: u64,
        term: Term,
        now_ms: u64,
    ) -> (Revision, Response, Vec<Event>) {
        let current = Revision(self.rev());
        let unchanged = |r: Response| (current, r, Vec::new());
        match cmd {
            Command::ExpireLeasesInTerm { term: decided, ids } => {
                if *decided == term {
                    self.apply(&Command::ExpireLeases { ids: ids.clone() }, now_ms)
                } else {
                    unchanged(Response::ExpireLeases {
                        expired: Vec::new(),
                        expired_holders: Vec::new(),
                    })
                }
            }
            Command::RegisterClient { timeout_ms } => {
                let timeout_ms = (*timeout_ms).clamp(MIN_CLIENT_TIMEOUT_MS, MAX_CLIENT_TIMEOUT_MS);
                self.sessions
                    .retain(|_, s| now_ms.saturating_sub(s.last_ms) <= s.timeout_ms);
                self.sessions.insert(
                    index,
                    ModelSession {
                        timeout_ms,
                        last_ms: now_ms,
                        acked: 1,
                        answers: BTreeMap::new(),
                    },
                );
                unchanged(Response::ClientRegistered {
                    client_id: index,
                    timeout_ms,
                })
            }
            Command::UnregisterClient { client_id } => unchanged(Response::ClientUnregistered {
                existed: self.sessions.remove(client_id).is_some(),
            }),
            Command::Deduplicated {
                client_id,
                sequence,
                acknowledged_below,
                command,
            } => {
                if *sequence == 0 {
                    return unchanged(Response::Error(KvError::InvalidSequence));
                }
                if !matches!(
                    **command,
                    Command::Put(_)
                        | Command::DeleteRange(_)
                        | Command::Txn(_)
                        | Command::FenceCheck { .. }
                ) {
                    return unchanged(Response::Error(KvError::NotDeduplicable));
                }
                // Stateless checks of the wrapped request fail the whole request (nothing is
                // cached: a retry fails the same way anyway).
                if let Err(e) = StateMachine::validate(command) {
                    return unchanged(Response::Error(e));
                }
                let Some(s) = self.sessions.get_mut(client_id) else {
                    return unchanged(Response::Error(KvError::UnknownClient));
                };
                if now_ms.saturating_sub(s.last_ms) > s.timeout_ms {
                    self.sessions.remove(client_id);
                    return unchanged(Response::Error(KvError::UnknownClient));
                }
                s.last_ms = now_ms;
                s.acked = s.acked.max((*acknowledged_below).min(*sequence));
                if *sequence < s.acked {
                    return unchanged(Response::Error(KvError::StaleSequence));
                }
                if let Some((revision, response)) = s.answers.get(sequence).cloned() {
                    return unchanged(Response::Deduplicated {
                        replayed: true,
                        revision,
                        response: Box::new(response),
                    });
                }
                let (revision, response, events) = self.apply(command, now_ms);
                self.sessions
                    .get_mut(client_id)
                    .expect("still there")
                    .answers
                    .insert(*sequence, (revision, response.clone()));
                (
                    revision,
                    Response::Deduplicated {
                        replayed: false,
                        revision,
                        response: Box::new(response),
                    },
                    events,
                )
            }
            other => self.apply(other, now_ms),
        }
    }

    /// Applies a command; returns (revision after, response, events). Everything is computed
    /// from `&self` into fresh values and committed only on success, so a failed command
    /// leaves the model untouched by construction.
    fn apply(&mut self, cmd: &Command, now_ms: u64) -> (Revision, Response, Vec<Event>) {
        let mut leases = self.leases.clone();
        let mut compact = self.compact;
        let mut locks = self.locks.clone();
        let mut fences = self.fences.clone();
        let mut delays_started = 0;
        let this: &Model = self;
        let mut w = Work {
            model: this,
            rev: this.rev() + 1,
            cur: this.state(this.rev()).clone(),
            events: Vec::new(),
        };
        let result: Result<Response, KvError> = (|| match cmd {
            Command::Noop => Ok(Response::Noop),
            Command::Put(p) => {
                if p.key.is_empty() {
                    return Err(KvError::EmptyKey);
                }
                this.check_put(p, true)?;
                Ok(Response::Put(w.put(p)))
            }
            Command::DeleteRange(d) => {
                if d.range.key.is_empty() {
                    return Err(KvError::EmptyKey);
                }
                Ok(Response::DeleteRange(w.delete(d)))
            }
            Command::Txn(t) => {
                Self::validate_txn(t, MAX_TXN_OPS)?;
                if Self::has_duplicates(&t.success) || Self::has_duplicates(&t.failure) {
                    return Err(KvError::DuplicateKey);
                }
                let mut path = Vec::new();
                this.txn_path(t, &mut path);
                this.check_txn(t, &path, &mut 0)?;
                Ok(Response::Txn(Self::exec_txn(&mut w, t, &path, &mut 0)))
            }
            Command::Compact { revision } => {
                if revision.0 > this.rev() {
                    Err(KvError::FutureRevision)
                } else if revision.0 <= compact {
                    Err(KvError::Compacted)
                } else {
                    compact = revision.0;
                    Ok(Response::Compact)
                }
            }
            Command::LeaseGrant { id, ttl_s } => {
                if *ttl_s > MAX_LEASE_TTL_S {
                    Err(KvError::LeaseTtlTooLarge)
                } else if id.0 == 0 || leases.contains_key(&id.0) {
                    Err(KvError::LeaseExists)
                } else {
                    leases.insert(
                        id.0,
                        ModelLease {
                            ttl_s: *ttl_s,
                            checkpoint_ms: None,
                        },
                    );
                    Ok(Response::LeaseGrant {
                        id: *id,
                        ttl_s: *ttl_s,
                    })
                }
            }
            Command::LeaseRevoke { id } => {
                if leases.remove(&id.0).is_none() {
                    return Err(KvError::LeaseNotFound);
                }
                Self::revoke_keys(&mut w, id.0);
                Ok(Response::LeaseRevoke)
            }
            Command::ExpireLeases { ids } => {
                // Holders are judged on the state before the entry.
                let before = this.state(this.rev());
                let mut holders: Vec<(Vec<u8>, Vec<Vec<u8>>)> = Vec::new();
                let mut seen = Vec::new();
                for id in ids {
                    if seen.contains(&id.0) || !this.leases.contains_key(&id.0) {
                        continue;
                    }
                    seen.push(id.0);
                    for kv in before.values().filter(|kv| kv.lease.0 == id.0) {
                        let names: Vec<Vec<u8>> = model_ancestors(&kv.key)
                            .into_iter()
                            .filter(|n| {
                                this.locks.contains_key(n)
                                    && model_queue(before, n).first().map(|h| &h.key)
                                        == Some(&kv.key)
                            })
                            .collect();
                        if !names.is_empty() {
                            holders.push((kv.key.clone(), names));
                        }
                    }
                }
                let mut expired = Vec::new();
                for id in ids {
                    if leases.remove(&id.0).is_some() {
                        Self::revoke_keys(&mut w, id.0);
                        expired.push(*id);
                    }
                }
                for (_, names) in &holders {
                    for n in names {
                        let l = locks.get_mut(n).expect("registered");
                        if l.delay_ms > 0 {
                            l.delayed_until_ms = l.delayed_until_ms.max(now_ms + l.delay_ms);
                            delays_started += 1;
                        }
                    }
                }
                Ok(Response::ExpireLeases {
                    expired,
                    expired_holders: holders.into_iter().map(|(k, _)| k).collect(),
                })
            }
            Command::LockEnqueue {
                name,
                lease,
                value,
                delay_ms,
            } => {
                if name.is_empty() {
                    return Err(KvError::EmptyLockName);
                }
                if lease.0 == 0 {
                    return Err(KvError::LeaseRequired);
                }
                if delay_ms.is_some_and(|d| d > MAX_LOCK_DELAY_MS) {
                    return Err(KvError::LockDelayTooLong);
                }
                let key = model_lock_key(name, lease.0);
                let exists = w.cur.contains_key(&key);
                if !exists && !leases.contains_key(&lease.0) {
                    return Err(KvError::LeaseNotFound);
                }
                let l = locks.entry(name.clone()).or_default();
                if let Some(d) = delay_ms {
                    l.delay_ms = *d;
                }
                if !exists {
                    w.put(&PutRequest {
                        key: key.clone(),
                        value: value.clone(),
                        lease: *lease,
                        ..PutRequest::default()
                    });
                }
                Ok(Response::LockEnqueue {
                    kv: w.cur[&key].clone(),
                    created: !exists,
                })
            }
            Command::LockForceRelease {
                name,
                token,
                reason,
            } => {
                if name.is_empty() {
                    return Err(KvError::EmptyLockName);
                }
                if reason.trim().is_empty() {
                    return Err(KvError::ReasonRequired);
                }
                if reason.len() > MAX_REASON_BYTES {
                    return Err(KvError::ReasonTooLong);
                }
                if token.0 < 0 {
                    return Err(KvError::InvalidFencingToken);
                }
                let head = model_queue(&w.cur, name).into_iter().next();
                if !token.is_none()
                    && head.as_ref().map(|h| FencingToken(h.create_revision.0)) != Some(*token)
                {
                    return Err(KvError::NotHolder);
                }
                let Some(head) = head else {
                    return Ok(Response::LockForceRelease { released: None });
                };
                let l = locks.entry(name.clone()).or_default();
                if l.releases.len() == MAX_FORCE_RELEASE_RECORDS {
                    l.releases.remove(0);
                }
                l.releases.push(ForceReleaseRecord {
                    key: head.key.clone(),
                    token: FencingToken(head.create_revision.0),
                    reason: reason.clone(),
                    at_ms: now_ms,
                });
                w.delete(&DeleteRangeRequest {
                    range: KeyRange {
                        key: head.key.clone(),
                        range_end: Vec::new(),
                    },
                    prev_kv: false,
                });
                Ok(Response::LockForceRelease {
                    released: Some(head),
                })
            }
            Command::FenceCheck { resource, token } => {
                if resource.is_empty() {
                    return Err(KvError::EmptyFenceResource);
                }
                if token.0 <= 0 {
                    return Err(KvError::InvalidFencingToken);
                }
                match fences.get(resource) {
                    Some(&h) if *token < h => Ok(Response::FenceCheck {
                        accepted: false,
                        highest: h,
                    }),
                    _ => {
                        fences.insert(resource.clone(), *token);
                        Ok(Response::FenceCheck {
                            accepted: true,
                            highest: *token,
                        })
                    }
                }
            }
            Command::LeaseCheckpoint { checkpoints } => {
                for (id, ms) in checkpoints {
                    if let Some(l) = leases.get_mut(&id.0) {
                        l.checkpoint_ms = Some(*ms);
                    }
                }
                Ok(Response::LeaseCheckpoint)
            }
            Command::RegisterClient { .. }
            | Command::ExpireLeasesInTerm { .. }
            | Command::UnregisterClient { .. }
            | Command::Deduplicated { .. } => unreachable!("apply_entry handles sessions"),
            // Alarms are covered by the state machine's own unit tests.
            Command::Alarm { .. } => unreachable!("the generator proposes no alarms"),
            Command::FencingKey { .. } => {
                unreachable!("the generator proposes no fencing keys (unit-tested in the core)")
            }
            Command::Auth(_) | Command::Authorized { .. } => {
                unreachable!("the generator proposes no auth commands (unit-tested in the core)")
            }
        })();
        let Work {
            rev, cur, events, ..
        } = w;
        let response = match result {
            Ok(r) => r,
            Err(e) => return (Revision(self.rev()), Response::Error(e), Vec::new()),
        };
        // Registry collection: locks that lost a key here or that the command named, if
        // idle (no keys, no delay pending, no recent force-release).
        let mut touched: Vec<Vec<u8>> = events
            .iter()
            .filter(|e| e.kind == EventKind::Delete)
            .flat_map(|e| model_ancestors(&e.kv.key))
            .collect();
        if let Command::LockForceRelease { name, .. } = cmd {
            touched.push(name.clone());
        }
        for n in touched {
            let idle = locks.get(&n).is_some_and(|l| {
                model_queue(&cur, &n).is_empty()
                    && l.delayed_until_ms <= now_ms
                    && l.releases
                        .last()
                        .is_none_or(|r| r.at_ms + FORCE_RELEASE_RETENTION_MS <= now_ms)
            });
            if idle {
                locks.remove(&n);
                self.collected += 1;
            }
        }
        self.leases = leases;
        self.compact = compact;
        self.locks = locks;
        self.fences = fences;
        self.delays_started += delays_started;
        if !events.is_empty() {
            self.states.push(cur);
            self.events.insert(rev, events.clone());
        }
        (Revision(self.rev()), response, events)
    }

    /// Every event in `range` counts towards `max`; those `shape` does not want are left
    /// out after the count, and `prev_kv` stripped when it is not asked for. At most
    /// `HISTORY_REVISIONS_PER_EVENT` revisions per event of `max` are walked for a range of
    /// more than one key.
    fn history(
        &self,
        range: &KeyRange,
        from: i64,
        max: usize,
        shape: EventShape,
    ) -> Result<HistoryBatch, KvError> {
        let from = if from <= 0 { self.compact + 1 } else { from };
        if self.compact > 1 && from <= self.compact {
            return Err(KvError::Compacted);
        }
        let mut events = Vec::new();
        let mut counted = 0;
        let max_walked = max.max(1) * HISTORY_REVISIONS_PER_EVENT;
        for (walked, (&rev, evs)) in self.events.range(from..).enumerate() {
            // (One key is read from its own versions, every one an event of the range.)
            if !range.range_end.is_empty() && walked >= max_walked {
                return Ok(HistoryBatch {
                    events,
                    next: Revision(rev),
                });
            }
            let batch: Vec<Event> = evs
                .iter()
                .filter(|e| in_range(range, &e.kv.key))
                .cloned()
                .collect();
            if batch.is_empty() {
                continue;
            }
            if counted > 0 && counted + batch.len() > max {
                return Ok(HistoryBatch {
                    events,
                    next: Revision(rev),
                });
            }
            counted += batch.len();
            events.extend(
                batch
                    .into_iter()
                    .filter(|e| shape.wants(e.kind))
                    .map(|mut e| {
                        if !shape.prev_kv {
                            e.prev_kv = None;
                        }
                        e
                    }),
            );
        }
        Ok(HistoryBatch {
            events,
            next: Revision(from.max(self.rev() + 1)),
        })
    }

    fn lease_info(&self, id: i64) -> Option<LeaseInfo> {
        let l = self.leases.get(&id)?;
        Some(LeaseInfo {
            id: LeaseId(id),
            granted_ttl_s: l.ttl_s,
            checkpoint_remaining_ms: l.checkpoint_ms,
            keys: self
                .state(self.rev())
                .values()
                .filter(|kv| kv.lease.0 == id)
                .map(|kv| kv.key.clone())
                .collect(),
        })
    }
}

/// etcd's range algorithm over one full state, written naively.
fn range_over(state: &State, r: &RangeRequest) -> RangeResponse {
    let all: Vec<KeyValue> = state
        .values()
        .filter(|kv| in_range(&r.range, &kv.key))
        .cloned()
        .collect();
    let count = all.len() as i64;
    if r.count_only {
        return RangeResponse {
            kvs: Vec::new(),
            more: false,
            count,
        };
    }
    let filtered = r.sort_order != SortOrder::None
        || r.min_mod_revision != 0
        || r.max_mod_revision != 0
        || r.min_create_revision != 0
        || r.max_create_revision != 0;
    let mut kvs: Vec<KeyValue> = if !filtered && r.limit > 0 {
        all.into_iter().take(r.limit as usize + 1).collect()
    } else {
        all
    };
    // Each filter names what it drops, as etcd's pruneKVs calls do.
    let dropped = |kv: &KeyValue| {
        (r.max_mod_revision != 0 && kv.mod_revision.0 > r.max_mod_revision)
            || (r.min_mod_revision != 0 && kv.mod_revision.0 < r.min_mod_revision)
            || (r.max_create_revision != 0 && kv.create_revision.0 > r.max_create_revision)
            || (r.min_create_revision != 0 && kv.create_revision.0 < r.min_create_revision)
    };
    kvs.retain(|kv| !dropped(kv));
    let key_of = |kv: &KeyValue| -> (i64, Vec<u8>) {
        match r.sort_target {
            SortTarget::Key => (0, kv.key.clone()),
            SortTarget::Version => (kv.version, Vec::new()),
            SortTarget::Create => (kv.create_revision.0, Vec::new()),
            SortTarget::Mod => (kv.mod_revision.0, Vec::new()),
            SortTarget::Value => (0, kv.value.clone()),
        }
    };
    match (r.sort_target, r.sort_order) {
        (SortTarget::Key, SortOrder::None | SortOrder::Ascend) => {}
        (_, SortOrder::Descend) => kvs.sort_by_key(|kv| std::cmp::Reverse(key_of(kv))),
        _ => kvs.sort_by_key(key_of),
    }
    let mut more = false;
    if r.limit > 0 && kvs.len() > r.limit as usize {
        kvs.truncate(r.limit as usize);
        more = true;
    }
    if r.keys_only {
        kvs.iter_mut().for_each(|kv| kv.value.clear());
    }
    RangeResponse { kvs, more, count }
}

// ---- random generation --------------------------------------------------------------------

const KEYS: &[&str] = &["a", "a/1", "a/2", "a/3", "b", "b/1", "c", "d"];
const VALUES: &[&str] = &["", "x", "y", "zz", "0"];
/// Lock names: waiter keys of "a" with leases 1..=3 are the plain keys "a/1".."a/3", and
/// "a/1" is a lock nested in "a", so locks, plain writes and nesting all interact.
const LOCK_NAMES: &[&str] = &["a", "b", "a/1"];
const RESOURCES: &[&str] = &["r1", "r2"];

struct Gen {
    rng: StdRng,
    /// Highest sequence used per de-duplication session, so most requests are new and
    /// some are retries (replays), acknowledged ones (stale) or out of order.
    sequences: BTreeMap<u64, u64>,
}

impl Gen {
    fn key(&mut self) -> Vec<u8> {
        if self.rng.gen_ratio(1, 100) {
            return Vec::new();
        }
        KEYS[self.rng.gen_range(0..KEYS.len())].into()
    }

    fn value(&mut self) -> Vec<u8> {
        VALUES[self.rng.gen_range(0..VALUES.len())].into()
    }

    fn range(&mut self) -> KeyRange {
        match self.rng.gen_range(0..6) {
            0 | 1 => KeyRange {
                key: self.key(),
                range_end: Vec::new(),
            },
            2 => KeyRange {
                key: b"a/".to_vec(),
                range_end: b"a0".to_vec(),
            },
            3 => KeyRange {
                key: self.key(),
                range_end: vec![0],
            },
            4 => KeyRange {
                key: vec![0],
                range_end: vec![0],
            },
            _ => KeyRange {
                key: self.key(),
                range_end: self.key(),
            },
        }
    }

    fn lease(&mut self) -> LeaseId {
        LeaseId(if self.rng.gen_bool(0.6) {
            0
        } else {
            self.rng.gen_range(1..8)
        })
    }

    fn revision(&mut self, current: i64) -> i64 {
        match self.rng.gen_range(0..4) {
            0 | 1 => 0,
            _ => self.rng.gen_range(-1..=current + 1),
        }
    }

    fn put(&mut self) -> PutRequest {
        PutRequest {
            key: self.key(),
            value: self.value(),
            lease: self.lease(),
            prev_kv: self.rng.gen_bool(0.5),
            ignore_value: self.rng.gen_ratio(1, 8),
            ignore_lease: self.rng.gen_ratio(1, 8),
        }
    }

    fn get(&mut self, current: i64) -> RangeRequest {
        let filter = |g: &mut Gen| {
            if g.rng.gen_ratio(1, 6) {
                g.rng.gen_range(1..=current.max(1))
            } else {
                0
            }
        };
        RangeRequest {
            range: self.range(),
            limit: [0, 0, 1, 2, 3][self.rng.gen_range(0..5)],
            revision: self.revision(current),
            sort_order: [SortOrder::None, SortOrder::Ascend, SortOrder::Descend]
                [self.rng.gen_range(0..3)],
            sort_target: [
                SortTarget::Key,
                SortTarget::Version,
                SortTarget::Create,
                SortTarget::Mod,
                SortTarget::Value,
            ][self.rng.gen_range(0..5)],
            keys_only: self.rng.gen_ratio(1, 5),
            count_only: self.rng.gen_ratio(1, 8),
            min_mod_revision: filter(self),
            max_mod_revision: filter(self),
            min_create_revision: filter(self),
            max_create_revision: filter(self),
        }
    }

    fn compare(&mut self, current: i64) -> Compare {
        let range = if self.rng.gen_bool(0.8) {
            KeyRange {
                key: self.key(),
                range_end: Vec::new(),
            }
        } else {
            self.range()
        };
        let target = match self.rng.gen_range(0..5) {
            0 => CompareTarget::Version(self.rng.gen_range(0..4)),
            1 => CompareTarget::Create(self.rng.gen_range(0..=current)),
            2 => CompareTarget::Mod(self.rng.gen_range(0..=current)),
            3 => CompareTarget::Value(self.value()),
            _ => CompareTarget::Lease(self.lease().0),
        };
        let result = [
            CompareResult::Equal,
            CompareResult::NotEqual,
            CompareResult::Greater,
            CompareResult::Less,
        ][self.rng.gen_range(0..4)];
        Compare {
            range,
            result,
            target,
        }
    }

    fn ops(&mut self, current: i64, depth: u32) -> Vec<RequestOp> {
        let n = self.rng.gen_range(0..4);
        let mut nested = 0;
        (0..n)
            .map(|_| match self.rng.gen_range(0..10) {
                0..=2 => RequestOp::Range(self.get(current)),
                3..=5 => RequestOp::Put(self.put()),
                6 | 7 => RequestOp::DeleteRange(DeleteRangeRequest {
                    // Mostly single keys: wide deletes make most txns duplicates.
                    range: if self.rng.gen_bool(0.7) {
                        KeyRange {
                            key: self.key(),
                            range_end: Vec::new(),
                        }
                    } else {
                        self.range()
                    },
                    prev_kv: self.rng.gen_bool(0.5),
                }),
                _ if depth < 2 && nested < 2 => {
                    nested += 1;
                    RequestOp::Txn(self.txn(current, depth + 1))
                }
                _ => RequestOp::Range(self.get(current)),
            })
            .collect()
    }

    fn txn(&mut self, current: i64, depth: u32) -> TxnRequest {
        let nc = self.rng.gen_range(0..3);
        TxnRequest {
            compare: (0..nc).map(|_| self.compare(current)).collect(),
            success: self.ops(current, depth),
            failure: self.ops(current, depth),
        }
    }

    fn lock_name(&mut self) -> Vec<u8> {
        if self.rng.gen_ratio(1, 40) {
            return Vec::new();
        }
        LOCK_NAMES[self.rng.gen_range(0..LOCK_NAMES.len())].into()
    }

    fn command(&mut self, m: &Model) -> Command {
        let current = m.rev();
        match self.rng.gen_range(0..125) {
            0..=29 => Command::Put(self.put()),
            30..=39 => Command::DeleteRange(DeleteRangeRequest {
                range: self.range(),
                prev_kv: self.rng.gen_bool(0.5),
            }),
            40..=69 => Command::Txn(self.txn(current, 0)),
            70..=74 => Command::Compact {
                revision: Revision(self.rng.gen_range(m.compact - 1..=current + 1)),
            },
            75..=82 => Command::LeaseGrant {
                id: LeaseId(self.rng.gen_range(0..8)),
                ttl_s: if self.rng.gen_ratio(1, 10) {
                    MAX_LEASE_TTL_S + 1
                } else {
                    self.rng.gen_range(1..100)
                },
            },
            83..=87 => Command::LeaseRevoke {
                id: LeaseId(self.rng.gen_range(1..9)),
            },
            88..=90 => Command::ExpireLeases {
                ids: (0..self.rng.gen_range(0..4))
                    .map(|_| LeaseId(self.rng.gen_range(1..9)))
                    .collect(),
            },
            91..=92 => Command::ExpireLeasesInTerm {
                term: Term(self.rng.gen_range(1..8)),
                ids: (0..self.rng.gen_range(0..4))
                    .map(|_| LeaseId(self.rng.gen_range(1..9)))
                    .collect(),
            },
            93..=96 => Command::LeaseCheckpoint {
                checkpoints: (0..self.rng.gen_range(0..3))
                    .map(|_| {
                        (
                            LeaseId(self.rng.gen_range(1..9)),
                            self.rng.gen_range(0..10_000),
                        )
                    })
                    .collect(),
            },
            100..=109 => Command::LockEnqueue {
                name: self.lock_name(),
                lease: LeaseId(if self.rng.gen_ratio(1, 20) {
                    0
                } else {
                    self.rng.gen_range(1..9)
                }),
                value: self.value(),
                delay_ms: match self.rng.gen_range(0..20) {
                    0..=9 => None,
                    10 => Some(MAX_LOCK_DELAY_MS + 1),
                    11..=13 => Some(0),
                    _ => Some(self.rng.gen_range(1..20_000)),
                },
            },
            110..=113 => Command::LockForceRelease {
                name: self.lock_name(),
                token: FencingToken(match self.rng.gen_range(0..10) {
                    0..=4 => 0,
                    5 => -1,
                    _ => self.rng.gen_range(1..=current),
                }),
                reason: match self.rng.gen_range(0..20) {
                    0 => String::new(),
                    1 => " ".into(),
                    2 => "x".repeat(MAX_REASON_BYTES + 1),
                    _ => "stuck holder".into(),
                },
            },
            114..=119 => Command::FenceCheck {
                resource: if self.rng.gen_ratio(1, 20) {
                    Vec::new()
                } else {
                    RESOURCES[self.rng.gen_range(0..RESOURCES.len())].into()
                },
                token: FencingToken(self.rng.gen_range(-1..=current.min(40))),
            },
            120 => Command::RegisterClient {
                timeout_ms: self.rng.gen_range(0..600_000),
            },
            121 if self.rng.gen_ratio(1, 4) => Command::UnregisterClient {
                client_id: self.client(m),
            },
            121..=124 => self.deduplicated(m, current),
            _ => Command::Noop,
        }
    }

    /// A known session mostly, sometimes one that never existed.
    fn client(&mut self, m: &Model) -> u64 {
        let ids: Vec<u64> = m.sessions.keys().copied().collect();
        if ids.is_empty() || self.rng.gen_ratio(1, 10) {
            self.rng.gen_range(1..5000)
        } else {
            ids[self.rng.gen_range(0..ids.len())]
        }
    }

    fn deduplicated(&mut self, m: &Model, current: i64) -> Command {
        let client_id = self.client(m);
        let last = self.sequences.get(&client_id).copied().unwrap_or(0);
        let sequence = match self.rng.gen_range(0..10) {
            0..=5 => last + 1,
            6 if self.rng.gen_ratio(1, 5) => 0,
            _ => self.rng.gen_range(last.saturating_sub(3)..=last),
        };
        self.sequences.insert(client_id, last.max(sequence));
        let command = match self.rng.gen_range(0..10) {
            0..=3 => Command::Put(self.put()),
            4 => Command::DeleteRange(DeleteRangeRequest {
                range: self.range(),
                prev_kv: self.rng.gen_bool(0.5),
            }),
            5..=7 => Command::Txn(self.txn(current, 0)),
            8 => Command::FenceCheck {
                resource: RESOURCES[self.rng.gen_range(0..RESOURCES.len())].into(),
                token: FencingToken(self.rng.gen_range(1..=current.clamp(1, 40))),
            },
            _ => Command::LeaseRevoke {
                id: LeaseId(self.rng.gen_range(1..9)),
            },
        };
        Command::Deduplicated {
            client_id,
            sequence,
            acknowledged_below: self.rng.gen_range(0..=sequence),
            command: Box::new(command),
        }
    }
}

// ---- the comparison -----------------------------------------------------------------------

/// Compares every read-side view of `sm` with the model, at random revisions.
fn compare_reads(g: &mut Gen, sm: &StateMachine, m: &Model, ctx: &str) {
    assert_eq!(sm.revision().0, m.rev(), "{ctx}: revision");
    assert_eq!(
        sm.compact_revision().0,
        m.compact,
        "{ctx}: compact revision"
    );
    assert_eq!(sm.key_count(), m.state(m.rev()).len(), "{ctx}: key count");
    let ids: Vec<LeaseId> = m.leases.keys().map(|&id| LeaseId(id)).collect();
    assert_eq!(sm.lease_ids(), ids, "{ctx}: lease ids");
    for id in 0..9 {
        assert_eq!(sm.lease(LeaseId(id)), m.lease_info(id), "{ctx}: lease {id}");
    }
    let now = m.state(m.rev());
    for name in LOCK_NAMES.iter().chain(&["c", "a/"]) {
        let name = name.as_bytes();
        let q = model_queue(now, name);
        assert_eq!(
            sm.lock_queue(name, 100),
            (q.clone(), q.len()),
            "{ctx}: queue"
        );
        assert_eq!(sm.lock_head(name), q.first().cloned(), "{ctx}: head");
        for (i, kv) in q.iter().enumerate() {
            let pred = i.checked_sub(1).map(|p| q[p].clone());
            assert_eq!(
                sm.lock_predecessor(name, kv.create_revision, &kv.key),
                pred,
                "{ctx}: predecessor"
            );
        }
        let expected = m.locks.get(name).map(|l| LockInfo {
            delay_ms: l.delay_ms,
            delayed_until_ms: l.delayed_until_ms,
            force_releases: l.releases.clone(),
        });
        assert_eq!(sm.lock_info(name), expected, "{ctx}: lock info");
    }
    assert_eq!(sm.lock_count(), m.locks.len(), "{ctx}: registry size");
    for r in RESOURCES {
        assert_eq!(
            sm.fence_highest(r.as_bytes()),
            m.fences.get(r.as_bytes()).copied(),
            "{ctx}: fence"
        );
    }
    for _ in 0..3 {
        let req = g.get(m.rev());
        assert_eq!(sm.range(&req), m.range(&req), "{ctx}: range {req:?}");
    }
    // The whole key space at every retained revision, now and then.
    if g.rng.gen_ratio(1, 20) {
        for rev in m.compact..=m.rev() {
            let req = RangeRequest {
                range: KeyRange {
                    key: vec![0],
                    range_end: vec![0],
                },
                revision: rev,
                ..RangeRequest::default()
            };
            assert_eq!(sm.range(&req), m.range(&req), "{ctx}: full range at {rev}");
        }
    }
    let range = g.range();
    let from = g.rng.gen_range(-1..=m.rev() + 2);
    let max = g.rng.gen_range(0..6);
    let shape = EventShape {
        puts: g.rng.gen_ratio(4, 5),
        deletes: g.rng.gen_ratio(4, 5),
        prev_kv: g.rng.gen_bool(0.5),
    };
    assert_eq!(
        sm.history(&range, Revision(from), max, shape),
        m.history(&range, from, max, shape),
        "{ctx}: history {range:?} from {from} max {max} {shape:?}"
    );
}

/// A name for what an applied command did, to check the generator reaches every outcome.
fn outcome(a: &Applied) -> String {
    fn nested(r: &TxnResponse) -> bool {
        r.responses
            .iter()
            .any(|op| matches!(op, ResponseOp::Txn(_)))
    }
    match &a.response {
        Response::Error(e) => format!("error {e:?}"),
        Response::Auth(_) => "auth".into(),
        Response::FencingKey { .. } => "fencing key".into(),
        Response::Txn(t) if nested(t) && !a.events.is_empty() => "txn nested write".into(),
        Response::Txn(t) if !a.events.is_empty() => format!("txn write succeeded={}", t.succeeded),
        Response::Txn(_) => "txn no write".into(),
        Response::ExpireLeases {
            expired_holders, ..
        } if !expired_holders.is_empty() => "lease expired a lock holder".into(),
        Response::LeaseRevoke | Response::ExpireLeases { .. } if !a.events.is_empty() => {
            "lease deleted keys".into()
        }
        Response::Noop => "noop".into(),
        Response::Put(_) => "put".into(),
        Response::DeleteRange(d) => format!("delete deleted_any={}", d.deleted > 0),
        Response::Compact => "compact".into(),
        Response::LeaseGrant { .. } => "lease grant".into(),
        Response::LeaseRevoke | Response::ExpireLeases { .. } => "lease gone, no keys".into(),
        Response::LeaseCheckpoint => "lease checkpoint".into(),
        Response::LockEnqueue { created, .. } => format!("lock enqueue created={created}"),
        Response::LockForceRelease { released } => {
            format!("lock force-release released={}", released.is_some())
        }
        Response::FenceCheck { accepted, .. } => format!("fence accepted={accepted}"),
        Response::ClientRegistered { .. } => "client registered".into(),
        Response::Alarm { .. } => "alarm".into(),
        Response::ClientUnregistered { existed } => {
            format!("client unregistered existed={existed}")
        }
        Response::Deduplicated { replayed, .. } => format!("deduplicated replayed={replayed}"),
    }
}

fn run_seed(seed: u64, steps: usize, outcomes: &mut BTreeMap<String, usize>) -> (usize, usize) {
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        sequences: BTreeMap::new(),
    };
    let mut sm = StateMachine::new();
    let mut m = Model::new();
    // A restored copy taken midway, and driven in lockstep from then on.
    let mut twin: Option<StateMachine> = None;
    let restore_at = steps / 2;
    let mut succeeded_txns = 0;
    for step in 0..steps {
        let ctx = format!("seed {seed} step {step}");
        if step == restore_at {
            let snap = sm.snapshot();
            let restored = StateMachine::restore(&snap).expect("restore");
            assert_eq!(restored.snapshot(), snap, "{ctx}: snapshot round trip");
            assert_eq!(restored.last_applied(), sm.last_applied());
            assert_eq!(restored.last_time_ms(), sm.last_time_ms());
            assert_eq!(
                restored.approximate_size_bytes(),
                sm.approximate_size_bytes()
            );
            twin = Some(restored);
        }
        let mut cmd = g.command(&m);
        let term = Term(1 + step as u64 / 500);
        // Term-fenced expiries: mostly of the entry's own term (they apply), some stale.
        if let Command::ExpireLeasesInTerm { term: decided, .. } = &mut cmd {
            if g.rng.gen_bool(0.7) {
                *decided = term;
            }
        }
        let entry = Entry {
            index: CommandIndex(step as u64 + 1),
            term,
            // Seconds apart, so lock-delays (up to 20 s) run out and force-release records
            // age past their one-hour retention within a run.
            time_ms: step as u64 * 3000,
            command: cmd.clone(),
        };
        let applied = sm.apply(&entry);
        *outcomes.entry(outcome(&applied)).or_default() += 1;
        let (rev, response, events) = m.apply_entry(&cmd, entry.index.0, entry.term, entry.time_ms);
        assert_eq!(applied.response, response, "{ctx}: response to {cmd:?}");
        assert_eq!(applied.events, events, "{ctx}: events of {cmd:?}");
        assert_eq!(applied.revision, rev, "{ctx}: revision after {cmd:?}");
        if let Err(e) = StateMachine::validate(&cmd) {
            assert_eq!(
                applied.response,
                Response::Error(e),
                "{ctx}: validate vs apply"
            );
        }
        let inner = match &applied.response {
            Response::Deduplicated { response, .. } => response,
            r => r,
        };
        if matches!(inner, Response::Txn(_)) && !events.is_empty() {
            succeeded_txns += 1;
        }
        sm.check_invariants()
            .unwrap_or_else(|e| panic!("{ctx}: invariant: {e}"));
        assert_eq!(sm.last_applied(), (entry.index, entry.term));
        assert_eq!(sm.last_time_ms(), entry.time_ms);
        compare_reads(&mut g, &sm, &m, &ctx);
        if let Some(t) = twin.as_mut() {
            let a = t.apply(&entry);
            assert_eq!(a, applied, "{ctx}: restored twin diverged");
            assert_eq!(t.hash_kv(0), sm.hash_kv(0), "{ctx}: twin hash");
        }
    }
    if let Some(t) = twin {
        assert_eq!(
            t.snapshot(),
            sm.snapshot(),
            "seed {seed}: twin state at the end"
        );
    }
    // The generator must actually exercise writing txns, not just refused ones.
    assert!(
        succeeded_txns > steps / 40,
        "seed {seed}: only {succeeded_txns} writing txns"
    );
    (m.collected, m.delays_started)
}

#[test]
fn model_seeds() {
    let mut outcomes = BTreeMap::new();
    let (mut collected, mut delays) = (0, 0);
    for seed in 0..8 {
        let (c, d) = run_seed(seed, 3000, &mut outcomes);
        collected += c;
        delays += d;
    }
    assert!(
        collected >= 20 && delays >= 20,
        "lock registry paths too rare: {collected} collected, {delays} delays started"
    );
    // Every error the commands can produce, and the interesting successes, must have been
    // reached; otherwise the generator has drifted and the comparison proves little.
    let must = [
        "error EmptyKey",
        "error KeyNotFound",
        "error LeaseNotFound",
        "error LeaseExists",
        "error LeaseTtlTooLarge",
        "error DuplicateKey",
        "error Compacted",
        "error FutureRevision",
        "txn nested write",
        "txn write succeeded=true",
        "txn write succeeded=false",
        "txn no write",
        "lease deleted keys",
        "lease gone, no keys",
        "lease checkpoint",
        "error EmptyLockName",
        "error LeaseRequired",
        "error LockDelayTooLong",
        "error NotHolder",
        "error ReasonRequired",
        "error ReasonTooLong",
        "error InvalidFencingToken",
        "error EmptyFenceResource",
        "lock enqueue created=true",
        "lock enqueue created=false",
        "lock force-release released=true",
        "lock force-release released=false",
        "lease expired a lock holder",
        "fence accepted=true",
        "fence accepted=false",
        "client registered",
        "client unregistered existed=true",
        "deduplicated replayed=false",
        "deduplicated replayed=true",
        "error UnknownClient",
        "error StaleSequence",
        "error InvalidSequence",
        "error NotDeduplicable",
    ];
    for m in must {
        assert!(
            outcomes.get(m).copied().unwrap_or(0) >= 5,
            "outcome {m:?} too rare: {outcomes:#?}"
        );
    }
    for m in [
        "compact",
        "delete deleted_any=true",
        "delete deleted_any=false",
    ] {
        assert!(
            outcomes.get(m).copied().unwrap_or(0) >= 20,
            "{m}: {outcomes:#?}"
        );
    }
}

/// Scale sanity: 100k keys, then point and prefix reads that must only touch a few keys.
/// (No timing assertion; the layout is what makes these O(log n). Running this in a debug
/// build in about a second is the practical check.)
#[test]
fn hundred_thousand_keys() {
    let mut sm = StateMachine::new();
    let n = 100_000u64;
    for i in 0..n {
        let a = sm.apply(&Entry {
            index: CommandIndex(i + 1),
            term: Term(1),
            time_ms: 0,
            command: Command::Put(PutRequest {
                key: format!("key/{i:06}").into_bytes(),
                value: b"v".to_vec(),
                ..PutRequest::default()
            }),
        });
        assert_eq!(a.revision, Revision(i as i64 + 2));
    }
    assert_eq!(sm.key_count(), n as usize);
    let prefix = RangeRequest {
        range: KeyRange {
            key: b"key/01234".to_vec(),
            range_end: b"key/01235".to_vec(),
        },
        ..RangeRequest::default()
    };
    let r = sm.range(&prefix).expect("range");
    assert_eq!(r.count, 10);
    assert_eq!(r.kvs[0].key, b"key/012340".to_vec());
    let h = sm
        .history(&prefix.range, Revision(n as i64 - 10), 100, EventShape::ALL)
        .expect("history");
    assert_eq!(h.next, Revision(n as i64 + 2));
    sm.apply(&Entry {
        index: CommandIndex(n + 1),
        term: Term(1),
        time_ms: 0,
        command: Command::Compact {
            revision: Revision(n as i64),
        },
    });
    assert_eq!(sm.key_count(), n as usize);
    let restored = StateMachine::restore(&sm.snapshot()).expect("restore");
    assert_eq!(restored.range(&prefix), sm.range(&prefix));
}
