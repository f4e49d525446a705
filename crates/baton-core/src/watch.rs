//! The node-local watch hub: who watches what, and what each watcher still has to receive.
//!
//! Not replicated: every node builds it from the events its own `apply` returns. A watcher
//! is either *synced* (it receives events as they are published, into a bounded queue) or
//! *unsynced* (it is behind and is caught up from the store's history). A synced watcher whose
//! queue overflows becomes unsynced instead of growing without bound, so one slow reader
//! costs memory proportional to the bound, never to the write rate.

use std::collections::{BTreeMap, VecDeque};

use crate::command::KvError;
use crate::state_machine::StateMachine;
use crate::types::{Event, EventShape, KeyRange, Revision};

/// Hub-wide watcher id (the gRPC layer maps its per-stream `watch_id`s onto these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WatcherId(pub u64);

/// What a watcher wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    pub range: KeyRange,
    /// First revision to deliver; `Revision(0)` = "from the next revision".
    pub start_revision: Revision,
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
}

/// What a watcher is handed by `take`.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchOutput {
    /// Events in revision order, whole revisions only, filters applied, `prev_kv` stripped
    /// unless asked for.
    Events(Vec<Event>),
    /// The watcher needs history that is compacted; it has been removed from the hub.
    Compacted { compact_revision: Revision },
    /// A batch of history held none of the events the watcher wants (`no_put` /
    /// `no_delete`) and it is still behind: nothing to send, take again. Why not read on
    /// until something is found: `take` runs under the state lock, and a `no_put` watcher
    /// far behind a history of puts would hold it for the whole history.
    Skipped,
}

/// See the module docs.
#[derive(Debug)]
pub struct WatchHub {
    max_pending_events: usize,
    next_id: u64,
    /// A `BTreeMap` so that every walk over the watchers (publish) is in id order on every
    /// node, not in hash order.
    watchers: BTreeMap<WatcherId, Watcher>,
    /// Revision of the last `publish`, to catch a caller feeding entries out of order.
    last_published: Revision,
    /// Watchers that asked for `prev_kv` (see [`WatchHub::wants_prev_values`]).
    prev_kv_watchers: usize,
}

#[derive(Debug)]
struct Watcher {
    spec: WatchSpec,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Receives published events into `queue` (whole revisions, filters applied, `prev_kv`
    /// already stripped if unwanted). Revisions below `min_revision` are skipped: they were
    /// either delivered from history already or precede the requested start.
    Synced {
        queue: VecDeque<Event>,
        min_revision: Revision,
    },
    /// Behind: the next `take` reads the store's history from `next`.
    Unsynced { next: Revision },
}

impl Watcher {
    fn wants(&self, e: &Event) -> bool {
        self.shape().wants(e.kind) && self.spec.range.contains(&e.kv.key)
    }

    /// The event as this watcher receives it.
    fn as_received(&self, e: &Event) -> Event {
        let mut e = e.clone();
        if !self.spec.prev_kv {
            e.prev_kv = None;
        }
        e
    }

    /// The events this watcher receives from history, as they should be built.
    fn shape(&self) -> EventShape {
        EventShape {
            puts: !self.spec.no_put,
            deletes: !self.spec.no_delete,
            prev_kv: self.spec.prev_kv,
        }
    }
}

/// The watch hub's watchers at one moment (`WatchHub::census`), for etcd's
/// `etcd_debugging_mvcc_{watcher,slow_watcher,pending_events}_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchCensus {
    pub watchers: u64,
    /// Watchers behind the store, to be caught up from history (etcd's unsynced, "slow").
    pub unsynced: u64,
    /// Events queued for synced watchers, not yet taken by their streams.
    pub pending_events: u64,
}

impl WatchHub {
    /// `max_pending_events` bounds each synced watcher's queue.
    pub fn new(max_pending_events: usize) -> Self {
        WatchHub {
            max_pending_events,
            next_id: 1,
            watchers: BTreeMap::new(),
            last_published: Revision(0),
            prev_kv_watchers: 0,
        }
    }

    /// Whether some watcher asked for `prev_kv`: only then do published events need the
    /// previous values (see `StateMachine::set_prev_values_in_events`).
    pub fn wants_prev_values(&self) -> bool {
        self.prev_kv_watchers > 0
    }

    fn forget(&mut self, id: WatcherId) {
        if let Some(w) = self.watchers.remove(&id) {
            self.prev_kv_watchers -= usize::from(w.spec.prev_kv);
        }
    }

    /// Registers a watcher. `current` is the store revision at registration (taken under the
    /// same lock as `publish`, so no event can fall between the two).
    ///
    /// A start revision of 0 (or negative) or past `current` needs nothing from history: the
    /// watcher starts synced and receives published events from `max(start, current + 1)`.
    /// A start at or below `current` starts unsynced and is caught up from history first.
    pub fn add(&mut self, spec: WatchSpec, current: Revision) -> WatcherId {
        let id = WatcherId(self.next_id);
        self.next_id += 1;
        let start = spec.start_revision;
        let state = if start.0 <= 0 || start > current {
            State::Synced {
                queue: VecDeque::new(),
                min_revision: start.max(Revision(current.0 + 1)),
            }
        } else {
            State::Unsynced { next: start }
        };
        self.prev_kv_watchers += usize::from(spec.prev_kv);
        self.watchers.insert(id, Watcher { spec, state });
        id
    }

    /// Forgets a watcher; unknown ids are ignored.
    pub fn remove(&mut self, id: WatcherId) {
        self.forget(id);
    }

    /// Feeds the events one applied entry produced (all share one revision).
    ///
    /// Each synced watcher gets the matching events of the revision, all or none: if they do
    /// not fit in its queue, the queue is dropped and the watcher becomes unsynced from the
    /// oldest revision it had not been handed yet, to be caught up from history later. The
    /// cost of a slow reader is then bounded by `max_pending_events`, and a revision is never
    /// split.
    pub fn publish(&mut self, events: &[Event]) {
        let Some(first) = events.first() else {
            return;
        };
        let rev = first.kv.mod_revision;
        debug_assert!(events.iter().all(|e| e.kv.mod_revision == rev));
        debug_assert!(rev > self.last_published, "publish out of order");
        self.last_published = rev;
        let max = self.max_pending_events;
        for w in self.watchers.values_mut() {
            let State::Synced {
                queue,
                min_revision,
            } = &w.state
            else {
                continue;
            };
            if rev < *min_revision {
                continue;
            }
            let matched: Vec<Event> = events
                .iter()
                .filter(|e| w.wants(e))
                .map(|e| w.as_received(e))
                .collect();
            if matched.is_empty() {
                continue;
            }
            if queue.len() + matched.len() > max {
                let next = queue.front().map_or(rev, |e| e.kv.mod_revision);
                w.state = State::Unsynced { next };
            } else if let State::Synced { queue, .. } = &mut w.state {
                queue.extend(matched);
            }
        }
    }

    /// Tells the hub the store was replaced wholesale (a snapshot installed from the leader),
    /// so revisions may have been applied that were never published. Every synced watcher
    /// goes back to catching up from history at the first revision it has not been handed;
    /// if the new store compacted that away, its next `take` reports `Compacted`.
    pub fn store_replaced(&mut self) {
        let published_next = Revision(self.last_published.0 + 1);
        for w in self.watchers.values_mut() {
            if let State::Synced {
                queue,
                min_revision,
            } = &w.state
            {
                let next = queue
                    .front()
                    .map_or((*min_revision).max(published_next), |e| e.kv.mod_revision);
                w.state = State::Unsynced { next };
            }
        }
    }

    /// What is ready for `id`: queued events if synced, else a bounded batch from the store's
    /// history (`Skipped` if it held nothing the watcher wants). `None` if nothing is ready
    /// (or the id is unknown).
    ///
    /// Either way the batch holds whole revisions and about `max_events` events (at least one
    /// revision, however large). An unsynced watcher whose next revision has been compacted
    /// is removed and gets `Compacted`; one whose history batch reaches the store's current
    /// revision becomes synced again.
    pub fn take(
        &mut self,
        id: WatcherId,
        store: &StateMachine,
        max_events: usize,
    ) -> Option<WatchOutput> {
        let w = self.watchers.get_mut(&id)?;
        loop {
            match &mut w.state {
                State::Synced { queue, .. } => {
                    let first_rev = queue.front()?.kv.mod_revision;
                    let mut out = Vec::new();
                    let mut rev = first_rev;
                    while let Some(e) = queue.front() {
                        if e.kv.mod_revision != rev {
                            // A new revision starts: take it only if it fits.
                            let len = queue
                                .iter()
                                .take_while(|x| x.kv.mod_revision == e.kv.mod_revision)
                                .count();
                            if out.len() + len > max_events {
                                break;
                            }
                            rev = e.kv.mod_revision;
                        }
                        out.extend(queue.pop_front());
                    }
                    return Some(WatchOutput::Events(out));
                }
                State::Unsynced { next } => {
                    let from = *next;
                    let batch = match store.history(&w.spec.range, from, max_events, w.shape()) {
                        Ok(b) => b,
                        Err(KvError::Compacted) => {
                            self.forget(id);
                            return Some(WatchOutput::Compacted {
                                compact_revision: store.compact_revision(),
                            });
                        }
                        Err(e) => unreachable!("history only fails with Compacted, got {e}"),
                    };
                    assert!(batch.next > from, "history made no progress");
                    // Built to this watcher's shape: nothing to filter or strip.
                    let events = batch.events;
                    w.state = if batch.next > store.revision() {
                        State::Synced {
                            queue: VecDeque::new(),
                            min_revision: batch.next,
                        }
                    } else {
                        State::Unsynced { next: batch.next }
                    };
                    if !events.is_empty() {
                        return Some(WatchOutput::Events(events));
                    }
                    if matches!(w.state, State::Unsynced { .. }) {
                        return Some(WatchOutput::Skipped);
                    }
                    // Caught up with nothing wanted in the last batch: the synced branch
                    // answers (with events published meanwhile, or "nothing ready").
                }
            }
        }
    }

    /// True when the watcher has been handed everything up to the store's current revision
    /// (used to order progress notifications after the events they cover). False for an
    /// unknown id: a progress notification must never vouch for a watcher the hub does not
    /// know.
    pub fn is_synced(&self, id: WatcherId, store: &StateMachine) -> bool {
        match self.watchers.get(&id).map(|w| &w.state) {
            Some(State::Synced { queue, .. }) => queue.is_empty(),
            Some(State::Unsynced { next }) => *next > store.revision(),
            None => false,
        }
    }

    /// Number of registered watchers.
    pub fn len(&self) -> usize {
        self.watchers.len()
    }

    /// The watchers by state, for monitoring (one pass over them).
    pub fn census(&self) -> WatchCensus {
        let mut c = WatchCensus {
            watchers: self.watchers.len() as u64,
            ..WatchCensus::default()
        };
        for w in self.watchers.values() {
            match &w.state {
                State::Synced { queue, .. } => c.pending_events += queue.len() as u64,
                State::Unsynced { .. } => c.unsynced += 1,
            }
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, DeleteRangeRequest, Entry, PutRequest, TxnRequest};
    use crate::command::{RequestOp, Response};
    use crate::state_machine::HISTORY_REVISIONS_PER_EVENT;
    use crate::types::{CommandIndex, EventKind, Term};

    /// A store plus a hub wired the way the server wires them: every applied entry's events
    /// are published right away.
    struct Node {
        sm: StateMachine,
        hub: WatchHub,
        index: u64,
    }

    impl Node {
        fn new(max_pending: usize) -> Self {
            Node {
                sm: StateMachine::new(),
                hub: WatchHub::new(max_pending),
                index: 0,
            }
        }

        fn apply(&mut self, command: Command) -> Response {
            self.index += 1;
            let applied = self.sm.apply(&Entry {
                index: CommandIndex(self.index),
                term: Term(1),
                time_ms: 0,
                command,
            });
            self.hub.publish(&applied.events);
            applied.response
        }

        fn put(&mut self, k: &str, v: &str) {
            self.apply(put_cmd(k, v));
        }

        fn del(&mut self, k: &str, end: &str) {
            self.apply(Command::DeleteRange(DeleteRangeRequest {
                range: range(k, end),
                prev_kv: false,
            }));
        }

        fn watch(&mut self, spec: WatchSpec) -> WatcherId {
            let current = self.sm.revision();
            self.hub.add(spec, current)
        }

        fn take(&mut self, id: WatcherId, max: usize) -> Option<WatchOutput> {
            self.hub.take(id, &self.sm, max)
        }
    }

    fn put_cmd(k: &str, v: &str) -> Command {
        Command::Put(PutRequest {
            key: k.into(),
            value: v.into(),
            ..PutRequest::default()
        })
    }

    fn range(k: &str, end: &str) -> KeyRange {
        KeyRange {
            key: k.into(),
            range_end: end.into(),
        }
    }

    fn spec(k: &str, end: &str, start: i64) -> WatchSpec {
        WatchSpec {
            range: range(k, end),
            start_revision: Revision(start),
            no_put: false,
            no_delete: false,
            prev_kv: false,
        }
    }

    /// `(revision, kind, key)` of each event, for compact assertions.
    fn summary(out: Option<WatchOutput>) -> Vec<(i64, EventKind, String)> {
        match out {
            Some(WatchOutput::Events(evs)) => evs
                .iter()
                .map(|e| {
                    (
                        e.kv.mod_revision.0,
                        e.kind,
                        String::from_utf8_lossy(&e.kv.key).into_owned(),
                    )
                })
                .collect(),
            other => panic!("expected events, got {other:?}"),
        }
    }

    use EventKind::{Delete as D, Put as P};

    #[test]
    fn synced_watcher_gets_matching_events_only() {
        let mut n = Node::new(100);
        let w = n.watch(spec("a", "b", 0));
        assert!(n.hub.is_synced(w, &n.sm));
        assert_eq!(n.take(w, 10), None);
        n.put("a1", "x"); // rev 2
        n.put("b1", "x"); // rev 3, outside
        n.put("a2", "x"); // rev 4
        assert!(!n.hub.is_synced(w, &n.sm), "events pending");
        assert_eq!(
            summary(n.take(w, 10)),
            vec![(2, P, "a1".into()), (4, P, "a2".into())]
        );
        assert!(n.hub.is_synced(w, &n.sm));
        assert_eq!(n.take(w, 10), None);
    }

    /// The hub counts the watchers that want `prev_kv` as they come and go (the state
    /// machine leaves previous values out of events while there are none).
    #[test]
    fn wants_prev_values_follows_the_watchers() {
        let mut n = Node::new(100);
        assert!(!n.hub.wants_prev_values());
        let plain = n.watch(spec("a", "", 0));
        assert!(!n.hub.wants_prev_values());
        let with = n.watch(WatchSpec {
            prev_kv: true,
            ..spec("a", "", 0)
        });
        let with2 = n.watch(WatchSpec {
            prev_kv: true,
            ..spec("b", "", 0)
        });
        assert!(n.hub.wants_prev_values());
        n.hub.remove(with);
        assert!(n.hub.wants_prev_values(), "one left");
        n.hub.remove(with2);
        n.hub.remove(with2);
        assert!(!n.hub.wants_prev_values(), "a second remove counts nothing");
        n.hub.remove(plain);
        assert!(!n.hub.wants_prev_values());
    }

    #[test]
    fn filters_and_prev_kv() {
        let mut n = Node::new(100);
        let no_put = n.watch(WatchSpec {
            no_put: true,
            prev_kv: true,
            ..spec("k", "", 0)
        });
        let no_del = n.watch(WatchSpec {
            no_delete: true,
            ..spec("k", "", 0)
        });
        n.put("k", "1");
        n.put("k", "2");
        n.del("k", "");
        match n.take(no_put, 10) {
            Some(WatchOutput::Events(evs)) => {
                assert_eq!(evs.len(), 1);
                assert_eq!(evs[0].kind, D);
                assert_eq!(
                    evs[0].prev_kv.as_ref().map(|p| p.value.clone()),
                    Some(b"2".to_vec())
                );
            }
            other => panic!("{other:?}"),
        }
        match n.take(no_del, 10) {
            Some(WatchOutput::Events(evs)) => {
                assert_eq!(evs.len(), 2);
                assert!(evs.iter().all(|e| e.kind == P && e.prev_kv.is_none()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn future_start_revision_skips_earlier_events() {
        let mut n = Node::new(100);
        n.put("k", "1"); // rev 2
        let w = n.watch(spec("k", "", 5));
        n.put("k", "2"); // 3
        n.put("k", "3"); // 4
        assert_eq!(n.take(w, 10), None);
        assert!(n.hub.is_synced(w, &n.sm));
        n.put("k", "4"); // 5
        assert_eq!(summary(n.take(w, 10)), vec![(5, P, "k".into())]);
    }

    #[test]
    fn past_start_revision_catches_up_from_history_then_goes_live() {
        let mut n = Node::new(100);
        for i in 0..5 {
            n.put("k", &i.to_string()); // revs 2..=6
        }
        let w = n.watch(spec("k", "", 3));
        assert!(!n.hub.is_synced(w, &n.sm));
        // Two per batch.
        assert_eq!(
            summary(n.take(w, 2)),
            vec![(3, P, "k".into()), (4, P, "k".into())]
        );
        n.put("k", "late"); // rev 7, published while unsynced: must come from history
        assert_eq!(
            summary(n.take(w, 2)),
            vec![(5, P, "k".into()), (6, P, "k".into())]
        );
        assert_eq!(summary(n.take(w, 2)), vec![(7, P, "k".into())]);
        assert!(n.hub.is_synced(w, &n.sm));
        n.put("k", "live"); // rev 8
        assert_eq!(summary(n.take(w, 2)), vec![(8, P, "k".into())]);
        assert_eq!(n.take(w, 2), None);
    }

    #[test]
    fn a_revision_is_never_split() {
        let mut n = Node::new(100);
        let w = n.watch(spec("a", "z", 0));
        let txn = |keys: &[&str]| {
            Command::Txn(TxnRequest {
                compare: vec![],
                success: keys
                    .iter()
                    .map(|k| {
                        RequestOp::Put(PutRequest {
                            key: (*k).into(),
                            value: b"v".to_vec(),
                            ..PutRequest::default()
                        })
                    })
                    .collect(),
                failure: vec![],
            })
        };
        n.apply(txn(&["a", "b", "c"])); // rev 2
        n.apply(txn(&["d", "e"])); // rev 3
                                   // max 1: the first revision whole, nothing more.
        assert_eq!(summary(n.take(w, 1)).len(), 3);
        assert_eq!(summary(n.take(w, 4)).len(), 2);
        // Same from history.
        let h = n.watch(spec("a", "z", 2));
        assert_eq!(summary(n.take(h, 4)).len(), 3);
        assert_eq!(summary(n.take(h, 4)).len(), 2);
    }

    #[test]
    fn overflow_makes_watcher_unsynced_and_history_fills_the_gap() {
        let mut n = Node::new(3);
        let w = n.watch(spec("k", "", 0));
        for i in 0..10 {
            n.put("k", &i.to_string()); // revs 2..=11
        }
        // The queue overflowed at the 4th event; everything comes back, in order, once.
        let mut seen = Vec::new();
        while let Some(out) = n.take(w, 4) {
            seen.extend(summary(Some(out)).into_iter().map(|(r, _, _)| r));
        }
        assert_eq!(seen, (2..=11).collect::<Vec<_>>());
        assert!(n.hub.is_synced(w, &n.sm));
        n.put("k", "after");
        assert_eq!(summary(n.take(w, 4)), vec![(12, P, "k".into())]);
    }

    #[test]
    fn compacted_watcher_is_told_and_removed() {
        let mut n = Node::new(100);
        for i in 0..5 {
            n.put("k", &i.to_string()); // revs 2..=6
        }
        n.apply(Command::Compact {
            revision: Revision(4),
        });
        let w = n.watch(spec("k", "", 3));
        assert_eq!(n.hub.len(), 1);
        assert_eq!(
            n.take(w, 10),
            Some(WatchOutput::Compacted {
                compact_revision: Revision(4)
            })
        );
        assert!(n.hub.is_empty());
        assert_eq!(n.take(w, 10), None);
        assert!(!n.hub.is_synced(w, &n.sm));
        // Starting right after the compact revision is fine.
        let ok = n.watch(spec("k", "", 5));
        assert_eq!(
            summary(n.take(ok, 10)),
            vec![(5, P, "k".into()), (6, P, "k".into())]
        );
    }

    #[test]
    fn overflowed_watcher_that_falls_behind_compaction_is_compacted() {
        let mut n = Node::new(1);
        let w = n.watch(spec("k", "", 0));
        n.put("k", "1"); // 2, queued
        n.put("k", "2"); // 3, overflow → unsynced from 2
        n.apply(Command::Compact {
            revision: Revision(3),
        });
        assert_eq!(
            n.take(w, 10),
            Some(WatchOutput::Compacted {
                compact_revision: Revision(3)
            })
        );
    }

    /// A batch at a time, so that one `take` (under the state lock) never reads more than
    /// one batch of history however little of it the watcher wants.
    #[test]
    fn history_with_everything_filtered_out_is_skipped_a_batch_at_a_time_then_syncs() {
        let mut n = Node::new(100);
        n.put("k", "1");
        n.put("k", "2");
        let w = n.watch(WatchSpec {
            no_put: true,
            ..spec("k", "", 2)
        });
        assert!(!n.hub.is_synced(w, &n.sm));
        assert_eq!(n.take(w, 1), Some(WatchOutput::Skipped));
        assert!(!n.hub.is_synced(w, &n.sm));
        assert_eq!(n.take(w, 1), None);
        assert!(n.hub.is_synced(w, &n.sm));
        n.del("k", "");
        assert_eq!(summary(n.take(w, 1)), vec![(4, D, "k".into())]);
    }

    /// A watcher on a range that few revisions touch, far behind: each `take` walks a bounded
    /// number of revisions (under the state lock), skipping ahead until its event.
    #[test]
    fn a_narrow_range_far_behind_is_walked_a_bounded_stretch_at_a_time() {
        let mut n = Node::new(100);
        for i in 0..200 {
            n.put(&format!("b{i}"), "x"); // revs 2..=201
        }
        n.put("a1", "mine"); // rev 202
        let w = n.watch(spec("a", "b", 2));
        let mut takes = 0;
        let events = loop {
            takes += 1;
            match n.take(w, 1) {
                Some(WatchOutput::Skipped) => assert!(takes < 1000, "no progress"),
                other => break summary(other),
            }
        };
        assert_eq!(events, vec![(202, P, "a1".into())]);
        let per_take = HISTORY_REVISIONS_PER_EVENT;
        assert!(per_take < 20, "a stretch is a few revisions per event");
        assert_eq!(takes, 200 / per_take + 1, "{per_take} revisions a take");
        assert!(n.hub.is_synced(w, &n.sm));
    }

    /// If a `take` ever runs between an entry's `apply` and its `publish`, the catch-up read
    /// already covered that revision; the late publish must not deliver it a second time.
    #[test]
    fn late_publish_after_catch_up_is_not_delivered_twice() {
        let mut n = Node::new(100);
        n.put("k", "1"); // rev 2
        let w = n.watch(spec("k", "", 2));
        n.index += 1;
        let applied = n.sm.apply(&Entry {
            index: CommandIndex(n.index),
            term: Term(1),
            time_ms: 0,
            command: put_cmd("k", "2"),
        }); // rev 3, not yet published
        assert_eq!(
            summary(n.take(w, 10)),
            vec![(2, P, "k".into()), (3, P, "k".into())]
        );
        n.hub.publish(&applied.events);
        assert_eq!(n.take(w, 10), None);
        n.put("k", "3");
        assert_eq!(summary(n.take(w, 10)), vec![(4, P, "k".into())]);
    }

    /// A follower that installs a snapshot skips the entries in it; its watchers must get
    /// those revisions from the new store's history.
    #[test]
    fn store_replaced_catches_watchers_up_from_the_new_store() {
        let mut n = Node::new(100);
        n.put("k", "1"); // rev 2
        let synced = n.watch(spec("k", "", 0));
        let queued = n.watch(spec("k", "", 0));
        n.put("k", "2"); // rev 3: queued for both
        assert_eq!(summary(n.take(synced, 10)), vec![(3, P, "k".into())]);
        // The leader moves on without us, then we install its snapshot.
        let mut leader = StateMachine::restore(&n.sm.snapshot()).expect("restore");
        for (i, v) in ["3", "4"].iter().enumerate() {
            leader.apply(&Entry {
                index: CommandIndex(n.index + 1 + i as u64),
                term: Term(2),
                time_ms: 0,
                command: put_cmd("k", v),
            });
        }
        n.sm = StateMachine::restore(&leader.snapshot()).expect("restore");
        n.index += 2;
        n.hub.store_replaced();
        assert!(!n.hub.is_synced(synced, &n.sm));
        assert_eq!(
            summary(n.take(synced, 10)),
            vec![(4, P, "k".into()), (5, P, "k".into())]
        );
        assert_eq!(
            summary(n.take(queued, 10)),
            vec![(3, P, "k".into()), (4, P, "k".into()), (5, P, "k".into())]
        );
        assert!(n.hub.is_synced(synced, &n.sm) && n.hub.is_synced(queued, &n.sm));
        n.put("k", "5");
        assert_eq!(summary(n.take(synced, 10)), vec![(6, P, "k".into())]);
    }

    #[test]
    fn remove_and_unknown_ids() {
        let mut n = Node::new(10);
        let a = n.watch(spec("a", "", 0));
        let b = n.watch(spec("b", "", 0));
        assert_ne!(a, b);
        assert_eq!(n.hub.len(), 2);
        n.hub.remove(a);
        n.hub.remove(a);
        n.hub.remove(WatcherId(999));
        assert_eq!(n.hub.len(), 1);
        n.put("a", "1");
        assert_eq!(n.take(a, 10), None);
        assert_eq!(n.take(WatcherId(999), 10), None);
    }

    /// Random writes, random watcher starts/filters, random `take` sizes, tiny queues: every
    /// watcher must see exactly the store's events for its range and filters from its start,
    /// in revision order, no gaps, no duplicates, each revision whole (etcd's watch
    /// guarantees).
    #[test]
    fn random_watchers_see_exactly_the_history() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let keys = ["a", "a/1", "a/2", "b", "b/1", "c"];
        let ranges = [("a", "b"), ("b", ""), ("a/", "a0"), ("\0", "\0")];
        for seed in 0..30u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut n = Node::new(rng.gen_range(0..4));
            // Every applied event, to compute what each watcher should get.
            let mut log: Vec<Event> = Vec::new();
            // (id, spec, first revision it must receive, events received so far)
            let mut watchers: Vec<(WatcherId, WatchSpec, Revision, Vec<Event>)> = Vec::new();
            for step in 0..400 {
                let command = match rng.gen_range(0..10) {
                    0..=4 => Some(put_cmd(
                        keys[rng.gen_range(0..keys.len())],
                        &step.to_string(),
                    )),
                    5 => {
                        let (k, end) = ranges[rng.gen_range(0..ranges.len())];
                        Some(Command::DeleteRange(DeleteRangeRequest {
                            range: range(k, end),
                            prev_kv: false,
                        }))
                    }
                    6 if watchers.len() < 8 => {
                        let (k, end) = ranges[rng.gen_range(0..ranges.len())];
                        let cur = n.sm.revision().0;
                        let start = match rng.gen_range(0..3) {
                            0 => 0,
                            1 => rng.gen_range(1..=cur + 1),
                            _ => cur + rng.gen_range(1..4),
                        };
                        let s = WatchSpec {
                            no_put: rng.gen_bool(0.2),
                            no_delete: rng.gen_bool(0.2),
                            prev_kv: rng.gen_bool(0.5),
                            ..spec(k, end, start)
                        };
                        let first = Revision(if start <= 0 { cur + 1 } else { start });
                        let id = n.watch(s.clone());
                        watchers.push((id, s, first, Vec::new()));
                        None
                    }
                    _ => {
                        if !watchers.is_empty() {
                            let i = rng.gen_range(0..watchers.len());
                            let max = rng.gen_range(0..5);
                            match n.hub.take(watchers[i].0, &n.sm, max) {
                                Some(WatchOutput::Events(evs)) => {
                                    assert!(!evs.is_empty());
                                    watchers[i].3.extend(evs);
                                }
                                None | Some(WatchOutput::Skipped) => {}
                                Some(other) => panic!("no compaction here: {other:?}"),
                            }
                        }
                        None
                    }
                };
                if let Some(command) = command {
                    n.index += 1;
                    let a = n.sm.apply(&Entry {
                        index: CommandIndex(n.index),
                        term: Term(1),
                        time_ms: 0,
                        command,
                    });
                    n.hub.publish(&a.events);
                    log.extend(a.events);
                }
            }
            for (id, s, first, got) in &mut watchers {
                loop {
                    match n.hub.take(*id, &n.sm, 3) {
                        Some(WatchOutput::Events(evs)) => got.extend(evs),
                        Some(WatchOutput::Skipped) => {}
                        _ => break,
                    }
                }
                assert!(n.hub.is_synced(*id, &n.sm));
                let model = Watcher {
                    spec: s.clone(),
                    state: State::Unsynced { next: *first },
                };
                let expected: Vec<Event> = log
                    .iter()
                    .filter(|e| e.kv.mod_revision >= *first && model.wants(e))
                    .map(|e| model.as_received(e))
                    .collect();
                assert_eq!(got, &expected, "seed {seed}, watcher {s:?}");
            }
        }
    }
}
