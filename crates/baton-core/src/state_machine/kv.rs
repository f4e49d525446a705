//! The key space: put, delete-range, txn (with etcd's compares), compaction, and range
//! reads at the current or a historical revision.
//!
//! It follows etcd 3.5's applier (`server/etcdserver/apply.go`, `txn.go`): every write is
//! first *checked* against the state before it, and only then *executed*. Execution cannot
//! fail, so a failed command never leaves half its writes behind and no rollback is needed.
//! Every write of one entry goes to `Writes::rev`; `apply` bumps the revision afterwards.
//! Keys carry their lease and lock bookkeeping with them: a put attaches the key to its
//! lease's key set and a lock's queue, a delete detaches it from both.

use std::cmp::Ordering;

use crate::command::{
    Compare, CompareResult, CompareTarget, DeleteRangeRequest, DeleteRangeResponse, KvError,
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, Response, ResponseOp,
    SortOrder, SortTarget, TxnRequest, TxnResponse,
};
use crate::mvcc::{key_value, prev_key_value, visible_at, Live};
use crate::types::{Event, EventKind, KeyValue, LeaseId, Revision};

use super::store::{StateMachine, Writes};

impl StateMachine {
    // ---- commands ----------------------------------------------------------------------

    pub(super) fn apply_put(
        &mut self,
        p: &PutRequest,
        w: &mut Writes,
    ) -> Result<Response, KvError> {
        // etcd's top-level Put looks the lease up before the key (apply.go `Put`).
        self.check_put_lease(p)?;
        if let Err(e) = self.check_put_key(p) {
            // etcd read the previous value (to find it missing) before refusing.
            w.view.ranges += 1;
            return Err(e);
        }
        Ok(Response::Put(self.exec_put(p, w)))
    }

    pub(super) fn apply_delete_range(
        &mut self,
        d: &DeleteRangeRequest,
        w: &mut Writes,
    ) -> Response {
        Response::DeleteRange(self.exec_delete(d, w))
    }

    pub(super) fn apply_txn(
        &mut self,
        t: &TxnRequest,
        w: &mut Writes,
    ) -> Result<Response, KvError> {
        // Compares of the txn and of every nested txn on the chosen path are evaluated
        // against the state *before* the txn, as etcd's `compareToPath` does; so are the
        // per-op checks. Only then does anything get written.
        let mut path = Vec::new();
        w.view.ranges += self.compare_path(t, &mut path);
        // etcd runs a txn that writes in two views: compares and checks in a read view,
        // then the ops in a write view. A read-only txn stays in its read view throughout.
        let writes = !t
            .success
            .iter()
            .chain(&t.failure)
            .all(|op| matches!(op, RequestOp::Range(_)));
        if writes {
            w.view.ranges += self.put_check_reads(t, &path, &mut 0).0;
        }
        self.check_txn(t, &path, &mut 0)?;
        if writes {
            w.end_view();
        }
        Ok(Response::Txn(self.exec_txn(t, &path, &mut 0, w)))
    }

    pub(super) fn apply_compact(&mut self, revision: Revision) -> Result<Response, KvError> {
        if revision.0 > self.revision {
            return Err(KvError::FutureRevision);
        }
        if revision.0 <= self.compact_revision {
            return Err(KvError::Compacted);
        }
        self.compact(revision.0);
        Ok(Response::Compact)
    }

    // ---- reads -------------------------------------------------------------------------

    /// A read at the current or a historical revision.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, KvError> {
        if req.range.key.is_empty() {
            return Err(KvError::EmptyKey);
        }
        let at = self.check_read_revision(req.revision)?;
        Ok(self.range_at(req, at))
    }

    /// Resolves a requested read revision (`<= 0` = current) and refuses the future and the
    /// compacted past. `revision == compact_revision` is readable: compaction keeps that state.
    pub(super) fn check_read_revision(&self, revision: i64) -> Result<i64, KvError> {
        let at = if revision <= 0 {
            self.revision
        } else {
            revision
        };
        if at > self.revision {
            return Err(KvError::FutureRevision);
        }
        if at < self.compact_revision {
            return Err(KvError::Compacted);
        }
        Ok(at)
    }

    /// etcd's `Range` (apply.go) over the state at `at`, which the caller has checked.
    ///
    /// Mirrors etcd exactly, including a quirk: only an explicit sort order or a min/max
    /// filter makes it fetch everything before truncating. A non-key `sort_target` with
    /// `sort_order = None` sorts ascending, but only the first `limit + 1` keys in key order
    /// (what etcd does). Ties in the sort target keep key order in both directions (Go's sort
    /// is unstable there; a replicated state machine cannot be).
    fn range_at(&self, req: &RangeRequest, at: i64) -> RangeResponse {
        let fetch_all = req.sort_order != SortOrder::None
            || req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        let fetch_limit = if fetch_all || req.limit <= 0 {
            usize::MAX
        } else {
            usize::try_from(req.limit)
                .unwrap_or(usize::MAX)
                .saturating_add(1)
        };

        let mut count: i64 = 0;
        let mut kvs: Vec<KeyValue> = Vec::new();
        for (key, versions) in self.store.range(&req.range) {
            let Some((v, live)) = visible_at(versions, at) else {
                continue;
            };
            count += 1;
            if req.count_only || kvs.len() >= fetch_limit {
                continue;
            }
            let mut kv = KeyValue {
                key: key.to_vec(),
                create_revision: Revision(live.create_revision),
                mod_revision: Revision(v.mod_revision),
                version: live.version,
                value: Vec::new(),
                lease: LeaseId(live.lease),
            };
            // keys_only clears values only after sorting (etcd), so sorting by value
            // still needs them; otherwise do not copy them at all.
            if !req.keys_only || req.sort_target == SortTarget::Value {
                kv.value = live.value.to_vec();
            }
            kvs.push(kv);
        }

        kvs.retain(|kv| {
            (req.max_mod_revision == 0 || kv.mod_revision.0 <= req.max_mod_revision)
                && (req.min_mod_revision == 0 || kv.mod_revision.0 >= req.min_mod_revision)
                && (req.max_create_revision == 0 || kv.create_revision.0 <= req.max_create_revision)
                && (req.min_create_revision == 0 || kv.create_revision.0 >= req.min_create_revision)
        });

        let order = match (req.sort_target, req.sort_order) {
            (SortTarget::Key, SortOrder::None | SortOrder::Ascend) => SortOrder::None,
            (_, SortOrder::None) => SortOrder::Ascend,
            (_, o) => o,
        };
        if order != SortOrder::None {
            let target = req.sort_target;
            let cmp = |a: &KeyValue, b: &KeyValue| -> Ordering {
                match target {
                    SortTarget::Key => a.key.cmp(&b.key),
                    SortTarget::Version => a.version.cmp(&b.version),
                    SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                    SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                    SortTarget::Value => a.value.cmp(&b.value),
                }
            };
            if order == SortOrder::Descend {
                kvs.sort_by(|a, b| cmp(b, a));
            } else {
                kvs.sort_by(cmp);
            }
        }

        let mut more = false;
        if req.limit > 0 {
            let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
            if kvs.len() > limit {
                kvs.truncate(limit);
                more = true;
            }
        }
        if req.keys_only {
            kvs.iter_mut().for_each(|kv| kv.value.clear());
        }
        RangeResponse { kvs, more, count }
    }

    /// etcd's `applyCompare`: every key of the range must satisfy the compare; a range with
    /// no keys compares as one all-zero key, except for `Value`, which then always fails
    /// (there is no way to tell a missing value from an empty one).
    fn compare(&self, c: &Compare) -> bool {
        let at = self.revision;
        let mut any = false;
        for (key, versions) in self.store.range(&c.range) {
            let Some((v, live)) = visible_at(versions, at) else {
                continue;
            };
            any = true;
            // The value only for a compare on it (it may be in the value file).
            let with_value = matches!(c.target, CompareTarget::Value(_));
            if !compare_kv(c, &prev_key_value(key, v.mod_revision, live, with_value)) {
                return false;
            }
        }
        if any {
            return true;
        }
        if matches!(c.target, CompareTarget::Value(_)) {
            return false;
        }
        compare_kv(c, &KeyValue::default())
    }

    /// etcd's `compareToPath`: the compare outcome of this txn, then of each nested txn on the
    /// chosen branch, depth first. Consumed in the same order by `check_txn` and `exec_txn`.
    /// Returns how many compares were evaluated (each is a range read to etcd; the compares
    /// of one txn stop at the first that fails).
    fn compare_path(&self, t: &TxnRequest, path: &mut Vec<bool>) -> u64 {
        let mut evaluated = 0;
        let mut ok = true;
        for c in &t.compare {
            evaluated += 1;
            if !self.compare(c) {
                ok = false;
                break;
            }
        }
        path.push(ok);
        let ops = if ok { &t.success } else { &t.failure };
        for op in ops {
            if let RequestOp::Txn(nested) = op {
                evaluated += self.compare_path(nested, path);
            }
        }
        evaluated
    }

    /// The range reads etcd's `checkPut` pass makes over a writing txn's chosen path: one per
    /// put with `ignore_value`/`ignore_lease` (it reads the previous value), in op order,
    /// stopping at the first put the pass refuses (a missing key or lease). The pass runs
    /// over every put before etcd checks any range's revision, so a refusal there does not
    /// stop it. Returns the reads and whether the pass refused. Counting only: `check_txn`
    /// decides.
    fn put_check_reads(&self, t: &TxnRequest, path: &[bool], cursor: &mut usize) -> (u64, bool) {
        let ok = path[*cursor];
        *cursor += 1;
        let ops = if ok { &t.success } else { &t.failure };
        let mut reads = 0;
        for op in ops {
            match op {
                RequestOp::Put(p) => {
                    if p.ignore_value || p.ignore_lease {
                        reads += 1;
                    }
                    if self.check_put_key(p).is_err() || self.check_put_lease(p).is_err() {
                        return (reads, true);
                    }
                }
                RequestOp::Txn(nested) => {
                    let (n, refused) = self.put_check_reads(nested, path, cursor);
                    reads += n;
                    if refused {
                        return (reads, true);
                    }
                }
                RequestOp::Range(_) | RequestOp::DeleteRange(_) => {}
            }
        }
        (reads, false)
    }

    // ---- checks (against the state before the entry; nothing is written yet) -----------

    fn check_put_lease(&self, p: &PutRequest) -> Result<(), KvError> {
        // With `ignore_lease` the request's lease is not used, so it need not exist.
        if !p.ignore_lease && !p.lease.is_none() && !self.leases.contains_key(&p.lease) {
            return Err(KvError::LeaseNotFound);
        }
        Ok(())
    }

    fn check_put_key(&self, p: &PutRequest) -> Result<(), KvError> {
        if (p.ignore_value || p.ignore_lease) && self.store.latest(&p.key).is_none() {
            return Err(KvError::KeyNotFound);
        }
        Ok(())
    }

    /// etcd's `checkTxn`: the ops on the chosen path, in order. Checking against the state
    /// before the txn is exact because validation forbids a put on a key the same txn
    /// deletes or puts, so an earlier op can never change the outcome of a later check.
    fn check_txn(&self, t: &TxnRequest, path: &[bool], cursor: &mut usize) -> Result<(), KvError> {
        let ok = path[*cursor];
        *cursor += 1;
        let ops = if ok { &t.success } else { &t.failure };
        for op in ops {
            match op {
                RequestOp::Range(r) => {
                    if r.revision > 0 {
                        self.check_read_revision(r.revision)?;
                    }
                }
                RequestOp::Put(p) => {
                    // In a txn etcd checks the key before the lease (`checkPut`).
                    self.check_put_key(p)?;
                    self.check_put_lease(p)?;
                }
                RequestOp::DeleteRange(_) => {}
                RequestOp::Txn(nested) => self.check_txn(nested, path, cursor)?,
            }
        }
        Ok(())
    }

    // ---- execution (cannot fail: everything was checked) -------------------------------

    /// Drops history below `revision`, which `apply_compact` checked is past the compact
    /// revision and not in the future.
    fn compact(&mut self, revision: i64) {
        // The pair: the compact revision only moves forward, and never past the present.
        assert!(
            self.compact_revision < revision && revision <= self.revision,
            "compaction to {revision} with compact revision {} at revision {}",
            self.compact_revision,
            self.revision
        );
        self.store.compact(revision);
        self.compact_revision = revision;
    }

    fn exec_txn(
        &mut self,
        t: &TxnRequest,
        path: &[bool],
        cursor: &mut usize,
        w: &mut Writes,
    ) -> TxnResponse {
        let succeeded = path[*cursor];
        *cursor += 1;
        let ops = if succeeded { &t.success } else { &t.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let resp = match op {
                RequestOp::Range(r) => {
                    // Latest = including this txn's earlier writes (they are already in the
                    // store at `w.rev`); an explicit revision was checked against the state
                    // before the txn, so it can only see the past.
                    let at = if r.revision <= 0 { w.rev } else { r.revision };
                    w.view.ranges += 1;
                    ResponseOp::Range(self.range_at(r, at))
                }
                RequestOp::Put(p) => ResponseOp::Put(self.exec_put(p, w)),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.exec_delete(d, w)),
                RequestOp::Txn(nested) => ResponseOp::Txn(self.exec_txn(nested, path, cursor, w)),
            };
            responses.push(resp);
        }
        TxnResponse {
            succeeded,
            responses,
        }
    }

    pub(super) fn exec_put(&mut self, p: &PutRequest, w: &mut Writes) -> PutResponse {
        let rev = w.rev;
        let prev_values_in_events = self.prev_values_in_events;
        let (prev, kv) = self.store.put_with(&p.key, rev, |prev| {
            let live = Live {
                create_revision: prev.map_or(rev, |(_, l)| l.create_revision),
                version: prev.map_or(1, |(_, l)| l.version + 1),
                lease: match prev {
                    Some((_, l)) if p.ignore_lease => l.lease,
                    _ => p.lease.0,
                },
                value: match prev {
                    Some((_, l)) if p.ignore_value => l.value.clone(),
                    _ => p.value.as_slice().into(),
                },
            };
            let with_value = p.prev_kv || prev_values_in_events;
            let prev = prev.map(|(m, l)| prev_key_value(&p.key, m, l, with_value));
            let kv = key_value(&p.key, rev, &live);
            (live, (prev, kv))
        });
        w.count_put(
            &p.key,
            &kv.value,
            p.prev_kv || p.ignore_value || p.ignore_lease,
        );
        let lease = kv.lease;
        match &prev {
            Some(prev) => self.detach(prev.lease, &p.key),
            None => self.locks.key_created(&p.key, kv.create_revision.0),
        }
        if !lease.is_none() {
            let record = self
                .leases
                .get_mut(&lease)
                .expect("put's lease was checked to exist");
            record.keys.insert(p.key.clone());
        }
        w.events.push(Event {
            kind: EventKind::Put,
            kv,
            prev_kv: prev.clone(),
        });
        PutResponse {
            prev_kv: if p.prev_kv { prev } else { None },
        }
    }

    fn exec_delete(&mut self, d: &DeleteRangeRequest, w: &mut Writes) -> DeleteRangeResponse {
        // One delete-range call however many keys go (etcd reads them first for `prev_kv`).
        w.view.deletes += 1;
        w.view.ranges += u64::from(d.prev_kv);
        let with_value = d.prev_kv || self.prev_values_in_events;
        let doomed: Vec<KeyValue> = self
            .store
            .range(&d.range)
            .filter_map(|(k, vs)| {
                let v = vs.last()?;
                v.live
                    .as_ref()
                    .map(|l| prev_key_value(k, v.mod_revision, l, with_value))
            })
            .collect();
        for kv in &doomed {
            self.delete_key(kv.clone(), w);
        }
        DeleteRangeResponse {
            deleted: doomed.len() as i64,
            prev_kvs: if d.prev_kv { doomed } else { Vec::new() },
        }
    }

    /// Tombstones one live key at `w.rev` and records its delete event.
    pub(super) fn delete_key(&mut self, prev: KeyValue, w: &mut Writes) {
        self.detach(prev.lease, &prev.key);
        self.locks.key_deleted(&prev.key, prev.create_revision.0);
        self.store.delete(&prev.key, w.rev);
        w.events.push(Event {
            kind: EventKind::Delete,
            kv: KeyValue {
                key: prev.key.clone(),
                mod_revision: Revision(w.rev),
                ..KeyValue::default()
            },
            prev_kv: Some(prev),
        });
    }

    fn detach(&mut self, lease: LeaseId, key: &[u8]) {
        if lease.is_none() {
            return;
        }
        // The lease may already be gone when its own keys are being deleted.
        if let Some(record) = self.leases.get_mut(&lease) {
            record.keys.remove(key);
        }
    }
}

/// etcd's `compareKV`.
fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.0.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.0.cmp(v),
        CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
        CompareTarget::Lease(v) => kv.lease.0.cmp(v),
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::NotEqual => ord != Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
    }
}
