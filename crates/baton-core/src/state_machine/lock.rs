//! Locks and fences as state: `LockEnqueue` (a waiter key under `<name>/`, with the lock's
//! optional lock-delay), `LockForceRelease` (deleting the holder, remembered in the lock's
//! history), `FenceCheck` (the highest fencing token per resource), the lock-delay an
//! expiring holder starts, the registry's garbage collection, and the lock queries.
//!
//! The registry and the fence table themselves are `crate::locks`; this module is where they
//! meet the key space. A lock's queue is its live keys under `<name>/` by create revision, so
//! the holder is the head and its create revision the fencing token.

use std::collections::BTreeSet;

use crate::command::{Command, KvError, PutRequest, Response};
use crate::locks::{
    lock_key, lock_names_of, lock_prefix, FenceDecision, ForceReleaseRecord, LockContention,
    LockInfo, LockRecord, LockSummary, Queue,
};
use crate::mvcc::key_value;
use crate::types::{Event, EventKind, FencingToken, KeyValue, LeaseId, Revision};

use super::store::{StateMachine, Writes};

impl StateMachine {
    // ---- commands ----------------------------------------------------------------------

    pub(super) fn apply_lock_enqueue(
        &mut self,
        name: &[u8],
        lease: LeaseId,
        value: &[u8],
        delay_ms: Option<u64>,
        w: &mut Writes,
    ) -> Result<Response, KvError> {
        let key = lock_key(name, lease);
        let exists = self.store.latest(&key).is_some();
        // etcd's `If create_revision(key) == 0 Then Put(key, value, lease)`: the lease
        // is checked only when the put runs.
        if !exists && !self.leases.contains_key(&lease) {
            return Err(KvError::LeaseNotFound);
        }
        self.ensure_registered(name)?;
        if let Some(d) = delay_ms {
            self.locks
                .record_mut(name)
                .expect("just registered")
                .delay_ms = d;
        }
        if !exists {
            let put = PutRequest {
                key: key.clone(),
                value: value.to_vec(),
                lease,
                ..PutRequest::default()
            };
            self.exec_put(&put, w);
        }
        let (m, live) = self.store.latest(&key).expect("waiter key exists");
        Ok(Response::LockEnqueue {
            kv: key_value(&key, m, live),
            created: !exists,
        })
    }

    pub(super) fn apply_lock_force_release(
        &mut self,
        name: &[u8],
        token: FencingToken,
        reason: &str,
        w: &mut Writes,
    ) -> Result<Response, KvError> {
        let head = self.lock_head(name);
        if !token.is_none()
            && head
                .as_ref()
                .map(|h| FencingToken::of_create_revision(h.create_revision))
                != Some(token)
        {
            return Err(KvError::NotHolder);
        }
        let Some(head) = head else {
            return Ok(Response::LockForceRelease { released: None });
        };
        self.ensure_registered(name)?;
        let at_ms = self.last_time_ms;
        self.locks
            .record_mut(name)
            .expect("just registered")
            .push_force_release(ForceReleaseRecord {
                key: head.key.clone(),
                token: FencingToken::of_create_revision(head.create_revision),
                reason: reason.to_owned(),
                at_ms,
            });
        w.view.deletes += 1;
        self.delete_key(head.clone(), w);
        Ok(Response::LockForceRelease {
            released: Some(head),
        })
    }

    pub(super) fn apply_fence_check(
        &mut self,
        resource: &[u8],
        token: FencingToken,
    ) -> Result<Response, KvError> {
        match self.fences.decide(resource, token) {
            Err(()) => Err(KvError::FenceTableFull),
            Ok(FenceDecision::Reject { highest }) => Ok(Response::FenceCheck {
                accepted: false,
                highest,
            }),
            Ok(FenceDecision::Accept) => {
                self.fences.record(resource, token);
                Ok(Response::FenceCheck {
                    accepted: true,
                    highest: token,
                })
            }
        }
    }

    /// Registers lock `name` (with its current queue) unless it is; when the registry is
    /// full, first drops every idle lock. Fails (changing nothing: if nothing was idle,
    /// nothing was dropped) when that frees no room.
    fn ensure_registered(&mut self, name: &[u8]) -> Result<(), KvError> {
        if self.locks.is_registered(name) {
            return Ok(());
        }
        if self.locks.is_full() {
            self.locks.collect_all_idle(self.last_time_ms);
            if self.locks.is_full() {
                return Err(KvError::LockRegistryFull);
            }
        }
        let queue = self.scan_queue(name);
        self.locks.register(name, queue);
        Ok(())
    }

    /// `(key, lock names it heads)` for every key the listed leases would delete that heads
    /// at least one registered lock, in deletion order.
    pub(super) fn expiring_holders(&self, ids: &[LeaseId]) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
        let mut holders = Vec::new();
        if self.locks.is_empty() {
            return holders;
        }
        let mut seen = BTreeSet::new();
        for id in ids {
            if !seen.insert(*id) {
                continue;
            }
            let Some(lease) = self.leases.get(id) else {
                continue;
            };
            for key in &lease.keys {
                let (_, live) = self
                    .store
                    .latest(key)
                    .expect("a lease lists only live keys");
                let names: Vec<Vec<u8>> = lock_names_of(key)
                    .filter(|name| {
                        self.locks
                            .queue(name)
                            .and_then(|q| q.first())
                            .is_some_and(|(rev, k)| {
                                *rev == live.create_revision && k.as_slice() == key.as_slice()
                            })
                    })
                    .map(<[u8]>::to_vec)
                    .collect();
                if !names.is_empty() {
                    holders.push((key.clone(), names));
                }
            }
        }
        holders
    }

    /// Starts the lock-delay of every lock whose holder (from [`Self::expiring_holders`])
    /// went with its lease in this entry; returns those holders' keys, in deletion order.
    pub(super) fn start_lock_delays(
        &mut self,
        holders: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    ) -> Vec<Vec<u8>> {
        let now = self.last_time_ms;
        let mut expired_holders = Vec::with_capacity(holders.len());
        for (key, names) in holders {
            for name in names {
                let record = self
                    .locks
                    .record_mut(&name)
                    .expect("a lock with a key is registered until idle");
                if record.delay_ms > 0 {
                    let until = now.saturating_add(record.delay_ms);
                    record.delayed_until_ms = record.delayed_until_ms.max(until);
                }
            }
            expired_holders.push(key);
        }
        expired_holders
    }

    /// Registry garbage collection after a successful command: every registered lock that
    /// lost a key in this entry, or that the command named, is dropped if now idle.
    pub(super) fn collect_idle_locks(&mut self, cmd: &Command, events: &[Event]) {
        if self.locks.is_empty() {
            return;
        }
        let mut touched: BTreeSet<Vec<u8>> = BTreeSet::new();
        for e in events.iter().filter(|e| e.kind == EventKind::Delete) {
            for name in lock_names_of(&e.kv.key) {
                if self.locks.is_registered(name) {
                    touched.insert(name.to_vec());
                }
            }
        }
        if let Command::LockForceRelease { name, .. } = cmd {
            touched.insert(name.clone());
        }
        let now = self.last_time_ms;
        for name in touched {
            self.locks.collect_if_idle(&name, now);
        }
    }

    /// Lock `name`'s queue read from the key space (for unregistered locks and to build the
    /// index): `O(keys under the prefix, tombstones included)`.
    pub(super) fn scan_queue(&self, name: &[u8]) -> Queue {
        let range = lock_prefix(name);
        self.store
            .range(&range)
            .filter_map(|(k, vs)| {
                let live = vs.last()?.live.as_ref()?;
                Some((live.create_revision, k.to_vec()))
            })
            .collect()
    }

    fn with_queue<R>(&self, name: &[u8], f: impl FnOnce(&Queue) -> R) -> R {
        match self.locks.queue(name) {
            Some(q) => f(q),
            None => f(&self.scan_queue(name)),
        }
    }

    fn live_kv(&self, key: &[u8]) -> KeyValue {
        let (m, live) = self.store.latest(key).expect("queued keys are live");
        key_value(key, m, live)
    }

    // ---- queries -----------------------------------------------------------------------

    /// The head of lock `name`'s queue: the first live key under `<name>/` by create
    /// revision (ties in key order). Its create revision is the fencing token.
    /// `O(log n)` for registered locks, a prefix scan otherwise.
    pub fn lock_head(&self, name: &[u8]) -> Option<KeyValue> {
        self.with_queue(name, |q| q.first().map(|(_, k)| self.live_kv(k)))
    }

    /// The key just ahead of `(create_revision, key)` in lock `name`'s queue: what that
    /// waiter must see deleted before it can hold the lock. `None` means it is the head.
    pub fn lock_predecessor(
        &self,
        name: &[u8],
        create_revision: Revision,
        key: &[u8],
    ) -> Option<KeyValue> {
        self.with_queue(name, |q| {
            q.range(..(create_revision.0, key.to_vec()))
                .next_back()
                .map(|(_, k)| self.live_kv(k))
        })
    }

    /// The first `max` keys of lock `name`'s queue in order, and the queue's length.
    pub fn lock_queue(&self, name: &[u8], max: usize) -> (Vec<KeyValue>, usize) {
        self.with_queue(name, |q| {
            let kvs = q.iter().take(max).map(|(_, k)| self.live_kv(k)).collect();
            (kvs, q.len())
        })
    }

    /// The registry's record of lock `name` (`None` if it is not registered: never enqueued
    /// through `LockEnqueue`, or idle and collected).
    pub fn lock_info(&self, name: &[u8]) -> Option<LockInfo> {
        self.locks.record(name).map(LockRecord::info)
    }

    /// Number of locks in the registry.
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// How contended the registered locks are now, for monitoring: one pass over the queue
    /// index (at most `MAX_LOCKS` queues).
    pub fn lock_contention(&self) -> LockContention {
        self.locks.contention()
    }

    /// Up to `max` registered locks in name order, after `after` (empty: from the first)
    /// and starting with `prefix`, plus whether more follow (page on with the last name).
    ///
    /// Only the registry is listed: every lock taken through the server's lock services is
    /// registered, while keys written by etcd's client-side recipes (`etcdctl lock`) under
    /// some prefix are not locks the core knows of until a server-side acquisition names
    /// them. Idle locks kept for a pending lock-delay or a recent force-release are listed
    /// with an empty queue.
    pub fn lock_list(&self, after: &[u8], prefix: &[u8], max: usize) -> (Vec<LockSummary>, bool) {
        let mut out = Vec::new();
        let mut more = false;
        for (name, record, queue) in self.locks.list(after, prefix) {
            if out.len() == max {
                more = true;
                break;
            }
            let (head, queue_len) = match queue {
                Some(q) => (q.first().map(|(_, k)| self.live_kv(k)), q.len()),
                None => (None, 0),
            };
            out.push(LockSummary {
                name: name.clone(),
                head,
                queue_len,
                delay_ms: record.delay_ms,
                delayed_until_ms: record.delayed_until_ms,
            });
        }
        (out, more)
    }

    /// The highest fencing token recorded for `resource` by `FenceCheck`.
    pub fn fence_highest(&self, resource: &[u8]) -> Option<FencingToken> {
        self.fences.get(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{DeleteRangeRequest, Entry};
    use crate::state_machine::tests::{enqueue, entry};
    use crate::types::{CommandIndex, KeyRange, Term};

    #[test]
    fn full_lock_registry_collects_idle_locks_or_refuses() {
        let mut sm = StateMachine::new();
        sm.locks.set_capacity(2);
        let mut i = 0;
        let mut at = |sm: &mut StateMachine, time_ms: u64, command: Command| {
            i += 1;
            sm.apply(&Entry {
                index: CommandIndex(i),
                term: Term(1),
                time_ms,
                command,
            })
        };
        at(
            &mut sm,
            0,
            Command::LeaseGrant {
                id: LeaseId(1),
                ttl_s: 60,
            },
        );
        assert!(matches!(
            at(&mut sm, 0, enqueue("a", 1)).response,
            Response::LockEnqueue { .. }
        ));
        assert!(matches!(
            at(&mut sm, 0, enqueue("b", 1)).response,
            Response::LockEnqueue { .. }
        ));
        let before = sm.snapshot();
        let full = at(&mut sm, 0, enqueue("c", 1));
        assert_eq!(full.response, Response::Error(KvError::LockRegistryFull));
        assert!(full.events.is_empty());
        // Nothing changed but the applied index and time.
        let mut cmp = StateMachine::restore(&before).expect("restore");
        cmp.last_applied = sm.last_applied;
        assert_eq!(cmp.snapshot(), sm.snapshot());
        // A force-release keeps "a" registered (its record) after its only key is gone...
        let fr = at(
            &mut sm,
            10,
            Command::LockForceRelease {
                name: "a".into(),
                token: FencingToken::NONE,
                reason: "test".into(),
            },
        );
        assert!(matches!(
            fr.response,
            Response::LockForceRelease { released: Some(_) }
        ));
        assert_eq!(sm.lock_count(), 2);
        assert_eq!(
            at(&mut sm, 20, enqueue("c", 1)).response,
            Response::Error(KvError::LockRegistryFull)
        );
        // ...until the record ages out; then a registration at capacity sweeps it away.
        let later = 10 + crate::locks::FORCE_RELEASE_RETENTION_MS;
        assert!(matches!(
            at(&mut sm, later, enqueue("c", 1)).response,
            Response::LockEnqueue { .. }
        ));
        assert_eq!(sm.lock_info(b"a"), None);
        assert!(sm.lock_info(b"c").is_some());
        // Deleting a lock's last key collects it at once when nothing else is pending.
        at(
            &mut sm,
            later,
            Command::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: b"b/1".to_vec(),
                    range_end: Vec::new(),
                },
                prev_kv: false,
            }),
        );
        assert_eq!(sm.lock_info(b"b"), None);
        assert_eq!(sm.lock_count(), 1);
        sm.check_invariants().expect("invariants");
    }

    #[test]
    fn lock_list_pages_through_the_registry_in_name_order() {
        let mut sm = StateMachine::new();
        let mut i = 0;
        let mut apply = |sm: &mut StateMachine, command: Command| {
            i += 1;
            sm.apply(&entry(i, command))
        };
        for lease in [1, 2] {
            apply(
                &mut sm,
                Command::LeaseGrant {
                    id: LeaseId(lease),
                    ttl_s: 60,
                },
            );
        }
        for (name, lease) in [("jobs/b", 1), ("jobs/a", 1), ("jobs/a", 2), ("other", 2)] {
            assert!(matches!(
                apply(&mut sm, enqueue(name, lease)).response,
                Response::LockEnqueue { .. }
            ));
        }
        let names = |list: &[LockSummary]| {
            list.iter()
                .map(|l| String::from_utf8(l.name.clone()).unwrap())
                .collect::<Vec<_>>()
        };
        let (all, more) = sm.lock_list(b"", b"", 10);
        assert_eq!(names(&all), ["jobs/a", "jobs/b", "other"]);
        assert!(!more);
        let a = &all[0];
        assert_eq!(a.queue_len, 2);
        let head = a.head.as_ref().expect("held");
        assert_eq!(head.key, lock_key(b"jobs/a", LeaseId(1)));
        assert_eq!(Some(head.clone()), sm.lock_head(b"jobs/a"));

        // Bounded, with `more`; the next page starts after the last name seen.
        let (page, more) = sm.lock_list(b"", b"", 2);
        assert_eq!(
            (names(&page), more),
            (vec!["jobs/a".into(), "jobs/b".into()], true)
        );
        let (rest, more) = sm.lock_list(b"jobs/b", b"", 2);
        assert_eq!((names(&rest), more), (vec!["other".to_string()], false));

        // A prefix narrows the walk; `after` before the prefix starts at the prefix.
        let (jobs, _) = sm.lock_list(b"a", b"jobs/", 10);
        assert_eq!(names(&jobs), ["jobs/a", "jobs/b"]);
        let (none, more) = sm.lock_list(b"jobs/b", b"jobs/", 10);
        assert!(none.is_empty() && !more);

        // An empty but still registered lock is listed without a head.
        apply(&mut sm, Command::LeaseRevoke { id: LeaseId(2) });
        let (after_revoke, _) = sm.lock_list(b"", b"", 10);
        assert_eq!(after_revoke[0].queue_len, 1);
        assert!(
            after_revoke.iter().all(|l| l.name != b"other"),
            "idle lock collected"
        );
    }

    #[test]
    fn full_fence_table_refuses_new_resources_only() {
        let mut sm = StateMachine::new();
        sm.fences.set_capacity(1);
        let fence = |r: &str, token: i64| Command::FenceCheck {
            resource: r.into(),
            token: FencingToken(token),
        };
        sm.apply(&entry(1, fence("r", 5)));
        assert_eq!(
            sm.apply(&entry(2, fence("s", 5))).response,
            Response::Error(KvError::FenceTableFull)
        );
        assert_eq!(
            sm.apply(&entry(3, fence("r", 7))).response,
            Response::FenceCheck {
                accepted: true,
                highest: FencingToken(7)
            }
        );
        assert_eq!(sm.fence_highest(b"s"), None);
    }
}
