//! The multi-version key store: every retained version of every key, plus a revision-ordered
//! index of which keys changed at which revision.
//!
//! Layout, and why:
//! - `keys: OrdMap<key, Vec<Version>>` (a persistent B-tree, see [`KeyMap`]), each vector
//!   sorted by `mod_revision`. A put into a
//!   store of `n` keys is one `O(log n)` map lookup plus a push; a read at revision `r` is a
//!   binary search in that key's (short) vector; a prefix range walks only the keys in the
//!   prefix, never the whole map.
//! - `changes: revision → keys` (a persistent vector in revision order, see
//!   [`crate::change_index`]), the keys changed at each revision *in the order
//!   the command changed them*. Watch catch-up from revision `r` walks this index from `r`
//!   instead of every key, and compaction uses it to visit only the keys that changed since
//!   the previous compaction. The order matters: events of one revision must come out in
//!   operation order, and a restored replica must produce exactly the same order, so the
//!   index is part of the snapshot rather than rebuilt.
//!
//! Invariants (checked by [`KeyStore::check_invariants`] after a restore and by the tests):
//! - a key changes at most once per revision (the txn validation guarantees it), so a
//!   `(key, revision)` pair names exactly one version;
//! - every retained version newer than the compact revision has an entry in `changes`, and
//!   `changes` holds nothing at or below the compact revision;
//! - at or below the compact revision each key keeps at most one version, and it is live.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use imbl::OrdMap;

use serde::{Deserialize, Serialize};

use crate::change_index::ChangeIndex;
use crate::crc32::Crc32;
use crate::types::{Event, EventKind, EventShape, KeyRange, KeyValue, LeaseId, Revision};
use crate::value::{ReadAhead, Value, ValueSpill};

pub(crate) use crate::change_index::{Changed, Key};

/// Bookkeeping bytes charged per retained version in `approximate_size_bytes`: the
/// `Version` record itself, its share of the map node, and the key copy in `changes`.
pub(crate) const VERSION_OVERHEAD_BYTES: u64 = 64;

/// The data of a live version. `mod_revision` lives in [`Version`] and the key in the map, so
/// neither is stored twice.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Live {
    pub(crate) create_revision: i64,
    pub(crate) version: i64,
    pub(crate) lease: i64,
    /// In the heap or spilled to the member's value file ([`crate::value`]); serialized as
    /// the `Box<[u8]>` it replaced (the same bytes as a `Vec<u8>`).
    pub(crate) value: Value,
}

/// One version of one key: a live value or a tombstone (`live == None`).
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Version {
    pub(crate) mod_revision: i64,
    pub(crate) live: Option<Live>,
}

impl Version {
    fn size_bytes(&self, key: &[u8]) -> u64 {
        let value = self.live.as_ref().map_or(0, |l| l.value.len());
        key.len() as u64 + value as u64 + VERSION_OVERHEAD_BYTES
    }
}

/// How many revisions one read of history (`StateMachine::history`) may walk per event it
/// may return: a range that few revisions touch stops there, with the revision to go on
/// from, instead of walking the whole backlog under the state lock.
pub const HISTORY_REVISIONS_PER_EVENT: usize = 8;

/// Builds the etcd-shaped `KeyValue` of a live version.
pub(crate) fn key_value(key: &[u8], mod_revision: i64, live: &Live) -> KeyValue {
    key_value_holding(key, mod_revision, live, live.value.to_vec())
}

/// [`key_value`] with its value read through `ahead`, for a reader going through many
/// versions in revision order (the order their values were stored in; see [`ReadAhead`]).
fn key_value_in_order(
    key: &[u8],
    mod_revision: i64,
    live: &Live,
    ahead: &mut ReadAhead,
) -> KeyValue {
    let value = live.value.bytes_in_order(ahead).into_owned();
    key_value_holding(key, mod_revision, live, value)
}

/// A previous version as a write's event (and response) carries it: with its value only when
/// `with_value` (reading a value from the value file costs a read; see
/// `StateMachine::set_prev_values_in_events`).
pub(crate) fn prev_key_value(
    key: &[u8],
    mod_revision: i64,
    live: &Live,
    with_value: bool,
) -> KeyValue {
    if with_value {
        return key_value(key, mod_revision, live);
    }
    key_value_holding(key, mod_revision, live, Vec::new())
}

/// The `KeyValue` of a live version, holding `value` (the version's, or none).
fn key_value_holding(key: &[u8], mod_revision: i64, live: &Live, value: Vec<u8>) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        create_revision: Revision(live.create_revision),
        mod_revision: Revision(mod_revision),
        version: live.version,
        value,
        lease: LeaseId(live.lease),
    }
}

/// The newest version of `versions` with `mod_revision <= at`, if it is live.
pub(crate) fn visible_at(versions: &[Version], at: i64) -> Option<(&Version, &Live)> {
    let n = versions.partition_point(|v| v.mod_revision <= at);
    let v = versions[..n].last()?;
    v.live.as_ref().map(|l| (v, l))
}

/// Start and end bounds of a key interval, as `BTreeMap::range` takes them.
type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// The B-tree bounds of a `KeyRange`, or `None` when the range is empty (an end at or before
/// the start; `BTreeMap::range` panics on those, etcd simply returns nothing).
fn bounds(range: &KeyRange) -> Option<KeyBounds<'_>> {
    let key = range.key.as_slice();
    let end = range.range_end.as_slice();
    if end.is_empty() {
        return Some((Bound::Included(key), Bound::Included(key)));
    }
    if end == [0] {
        return Some((Bound::Included(key), Bound::Unbounded));
    }
    if end <= key {
        return None;
    }
    Some((Bound::Included(key), Bound::Excluded(end)))
}

/// The key → versions map. A persistent B-tree (`imbl::OrdMap`) rather than `std`'s: cloning
/// it is O(1) (its nodes are shared and copied on the next write to each), so a snapshot takes
/// its copy of the state without stalling applies. With `BTreeMap` the copy under the state
/// lock took 77 ms at 60k keys and 420 ms at 300k keys (every write waited, and on one worker
/// thread the whole runtime with it); the nodes a write copies while a snapshot still shares
/// them are at most the whole tree once per snapshot, spread over the writes that follow.
pub(crate) type KeyMap = OrdMap<Key, Vec<Version>>;

/// The revision → changed keys index; persistent for the same reason as [`KeyMap`] (see
/// [`crate::change_index`] for why it is a vector).
pub(crate) type ChangeMap = ChangeIndex;

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyStore {
    keys: KeyMap,
    changes: ChangeMap,
    /// Keys whose newest version is live. Derived; kept so `key_count` is O(1).
    live_keys: usize,
    /// Sum of `Version::size_bytes` over all retained versions. Derived.
    size_bytes: u64,
    /// Where values go out of the heap, once the member hands a spill in (never in the
    /// simulation). Local to this member: not persisted, not replicated.
    spill: Option<Arc<dyn ValueSpill>>,
    /// The last key the evacuation walk ([`KeyStore::evacuate`]) visited; `None`: the walk
    /// starts (again) from the first key.
    evacuation_cursor: Option<Key>,
}

/// The most versions one [`KeyStore::evacuate`] step moves, and the most keys it looks at:
/// it runs under the state's write lock, after an applied entry, so each step is short.
const EVACUATE_MOVES_PER_STEP: usize = 64;
const EVACUATE_KEYS_PER_STEP: usize = 1024;
/// Keys listed at a time by [`KeyStore::attach_spill`]'s walk.
const ATTACH_CHUNK_KEYS: usize = 1024;

impl KeyStore {
    /// Rebuilds a store from its persisted parts, recomputing the derived counters.
    pub(crate) fn from_parts(
        keys: BTreeMap<Key, Vec<Version>>,
        changes: BTreeMap<i64, Changed>,
    ) -> Self {
        let keys: KeyMap = keys.into_iter().collect();
        let changes = ChangeIndex::from_sorted(changes);
        let mut live_keys = 0;
        let mut size_bytes = 0;
        for (k, versions) in &keys {
            if versions.last().is_some_and(|v| v.live.is_some()) {
                live_keys += 1;
            }
            size_bytes += versions.iter().map(|v| v.size_bytes(k)).sum::<u64>();
        }
        KeyStore {
            keys,
            changes,
            live_keys,
            size_bytes,
            spill: None,
            evacuation_cursor: None,
        }
    }

    /// Keeps values out of the heap from now on: every value already in the store that is
    /// long enough is moved to `spill` (one walk over the store), and later ones as they
    /// enter. A copy of the store that shares nodes with this one is unaffected (the walk
    /// copies the nodes it changes).
    pub(crate) fn attach_spill(&mut self, spill: Arc<dyn ValueSpill>) {
        spill.start_segment();
        // The keys are listed a chunk at a time (the map cannot be walked while its nodes
        // are changed): listing them all first was a transient copy of every key, ~24 MB
        // at 1M keys, at start and at every snapshot install.
        let mut after: Option<Key> = None;
        loop {
            let from = after.map_or(Bound::Unbounded, Bound::Excluded);
            let chunk: Vec<Key> = self
                .keys
                .range((from, Bound::Unbounded))
                .take(ATTACH_CHUNK_KEYS)
                .map(|(key, _)| key.clone())
                .collect();
            after = chunk.last().cloned();
            if after.is_none() {
                break;
            }
            for key in &chunk {
                let versions = self.keys.get_mut(key).expect("key listed a moment ago");
                for live in versions.iter_mut().filter_map(|v| v.live.as_mut()) {
                    live.value.enter_store(Some(spill.as_ref()));
                }
            }
        }
        self.spill = Some(spill);
        self.evacuation_cursor = None;
    }

    /// One bounded step of moving values out of segments the spill marked for evacuation
    /// (see [`crate::value`]). Changes nothing any read can see. Returns how many versions'
    /// values moved.
    pub(crate) fn evacuate(&mut self) -> usize {
        let Some(spill) = self.spill.clone() else {
            return 0;
        };
        if !spill.evacuation_pending() {
            self.evacuation_cursor = None;
            return 0;
        }
        let start = match &self.evacuation_cursor {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        let mut visited = 0;
        let mut to_move: Vec<Key> = Vec::new();
        let mut last: Option<Key> = None;
        for (key, versions) in self.keys.range((start, Bound::Unbounded)) {
            visited += 1;
            last = Some(key.clone());
            let moves = versions
                .iter()
                .filter(|v| {
                    v.live
                        .as_ref()
                        .is_some_and(|l| l.value.in_evacuated_segment())
                })
                .count();
            if moves > 0 {
                to_move.push(key.clone());
            }
            if visited >= EVACUATE_KEYS_PER_STEP || to_move.len() >= EVACUATE_MOVES_PER_STEP {
                break;
            }
        }
        let mut moved = 0;
        for key in &to_move {
            let versions = self.keys.get_mut(key).expect("key listed a moment ago");
            for live in versions.iter_mut().filter_map(|v| v.live.as_mut()) {
                moved += usize::from(live.value.evacuate(spill.as_ref()));
            }
        }
        if visited == 0 {
            // Past the last key: the pass is over, the next step starts one from the first.
            spill.evacuation_pass_done();
            self.evacuation_cursor = None;
        } else {
            self.evacuation_cursor = last;
        }
        moved
    }

    pub(crate) fn keys(&self) -> &KeyMap {
        &self.keys
    }

    pub(crate) fn changes(&self) -> &ChangeMap {
        &self.changes
    }

    pub(crate) fn live_keys(&self) -> usize {
        self.live_keys
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Keys (with all their retained versions) that fall in `range`, in key order. Dead keys
    /// are included; callers pick the version they need with [`visible_at`].
    pub(crate) fn range<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> impl Iterator<Item = (&'a Key, &'a Vec<Version>)> + 'a {
        bounds(range)
            .map(|b| self.keys.range::<_, [u8]>(b))
            .into_iter()
            .flatten()
    }

    /// The newest version of `key` if it is live: the "current" value, including writes the
    /// entry being applied has already made.
    pub(crate) fn latest(&self, key: &[u8]) -> Option<(i64, &Live)> {
        let v = self.keys.get(key)?.last()?;
        v.live.as_ref().map(|l| (v.mod_revision, l))
    }

    fn push(&mut self, key: &[u8], mut version: Version) {
        let rev = version.mod_revision;
        self.enter(&mut version);
        self.size_bytes += version.size_bytes(key);
        // A new version vector starts with room for exactly one: most keys are written once,
        // and `push` onto an empty vector reserves four (~18 MB unused at 100k keys).
        let versions = match self.keys.get_mut(key) {
            Some(v) => v,
            None => self
                .keys
                .entry(key.into())
                .or_insert_with(|| Vec::with_capacity(1)),
        };
        let was_live = versions.last().is_some_and(|v| v.live.is_some());
        if let Some(last) = versions.last() {
            // Two changes to one key at one revision would make `(key, revision)` ambiguous
            // and lose an event; txn validation rules it out, so this is a bug if it fires.
            assert!(
                last.mod_revision < rev,
                "key changed twice at revision {rev} (last change at {})",
                last.mod_revision
            );
        }
        let is_live = version.live.is_some();
        versions.push(version);
        match (was_live, is_live) {
            (false, true) => self.live_keys += 1,
            (true, false) => self.live_keys -= 1,
            _ => {}
        }
        self.note_change(key, rev);
    }

    /// A version enters the store: its value goes to the spill (or is counted in its
    /// segment once more).
    fn enter(&self, version: &mut Version) {
        if let Some(live) = version.live.as_mut() {
            live.value.enter_store(self.spill.as_deref());
        }
    }

    /// A version leaves the store (compaction, or an import replacing it).
    fn leave(&mut self, key: &[u8], version: &Version) {
        self.size_bytes -= version.size_bytes(key);
        if let Some(live) = &version.live {
            live.value.leave_store();
        }
    }

    /// Lists `key` in the change index at `rev`, after the keys already changed there.
    fn note_change(&mut self, key: &[u8], rev: i64) {
        self.changes.note(rev, key.into());
    }

    /// Writes a live version of `key` at `rev`, made by `make` from the key's newest live
    /// version (with its `mod_revision`), if any; `make`'s second result is handed back. One
    /// map traversal for a key that exists (a lookup and then [`KeyStore::put`] would be two,
    /// each a string comparison and a likely cache miss per tree level).
    pub(crate) fn put_with<R>(
        &mut self,
        key: &[u8],
        rev: i64,
        make: impl FnOnce(Option<(i64, &Live)>) -> (Live, R),
    ) -> R {
        let Some(versions) = self.keys.get_mut(key) else {
            let (live, out) = make(None);
            self.put(key, rev, live);
            return out;
        };
        let last = versions.last().expect("a stored key has a version");
        assert!(
            last.mod_revision < rev,
            "key changed twice at revision {rev} (last change at {})",
            last.mod_revision
        );
        let was_live = last.live.is_some();
        let (live, out) = make(last.live.as_ref().map(|l| (last.mod_revision, l)));
        let mut version = Version {
            mod_revision: rev,
            live: Some(live),
        };
        if let Some(live) = version.live.as_mut() {
            live.value.enter_store(self.spill.as_deref());
        }
        self.size_bytes += version.size_bytes(key);
        versions.push(version);
        if !was_live {
            self.live_keys += 1;
        }
        self.note_change(key, rev);
        out
    }

    /// Writes a live version of `key` at `rev`.
    pub(crate) fn put(&mut self, key: &[u8], rev: i64, live: Live) {
        self.push(
            key,
            Version {
                mod_revision: rev,
                live: Some(live),
            },
        );
    }

    /// Writes a tombstone for a live `key` at `rev`.
    pub(crate) fn delete(&mut self, key: &[u8], rev: i64) {
        assert!(
            self.latest(key).is_some(),
            "deleting a key that is not live"
        );
        self.push(
            key,
            Version {
                mod_revision: rev,
                live: None,
            },
        );
    }

    /// Makes `live` (or nothing, for `None`) the one version of `key`, at `rev`, without an
    /// entry in the change index: history at or below the compact revision, where each key
    /// keeps at most its one live version. For an import that knows its compact revision
    /// before its versions (a second index of a million keys, only for compaction to drop
    /// it, was most of an import's peak memory). Every version `key` had must be at or
    /// below the same compact revision (the caller imports in revision order).
    pub(crate) fn set_compacted(&mut self, key: &[u8], rev: i64, live: Option<Live>) {
        if let Some(old) = self.keys.remove(key) {
            if old.last().is_some_and(|v| v.live.is_some()) {
                self.live_keys -= 1;
            }
            for v in &old {
                self.leave(key, v);
            }
        }
        if let Some(live) = live {
            let mut version = Version {
                mod_revision: rev,
                live: Some(live),
            };
            self.enter(&mut version);
            self.size_bytes += version.size_bytes(key);
            self.live_keys += 1;
            self.keys.insert(key.into(), vec![version]);
        }
    }

    /// Clears the lease of `key`'s newest version in place (an import whose backup lacks the
    /// lease the key names); nothing else changes.
    pub(crate) fn detach_lease(&mut self, key: &[u8]) {
        if let Some(live) = self
            .keys
            .get_mut(key)
            .and_then(|vs| vs.last_mut())
            .and_then(|v| v.live.as_mut())
        {
            live.lease = 0;
        }
    }

    /// Drops every version that no read at or after `at` can see: for each key, everything
    /// older than its newest version `<= at`, and that one too if it is a tombstone. Only keys
    /// changed since the previous compaction can have anything to drop, and `changes` lists
    /// exactly those, so the cost is proportional to the history being dropped.
    pub(crate) fn compact(&mut self, at: i64) {
        let mut touched: BTreeSet<Key> = BTreeSet::new();
        for (_, changed) in self.changes.remove_through(at) {
            touched.extend(changed.into_vec());
        }
        for key in touched {
            let Some(versions) = self.keys.get_mut(&key) else {
                continue;
            };
            let n = versions.partition_point(|v| v.mod_revision <= at);
            let drop_n = match versions[..n].last() {
                None => 0,
                Some(v) if v.live.is_some() => n - 1,
                Some(_) => n,
            };
            let dropped: Vec<Version> = versions.drain(..drop_n).collect();
            if versions.is_empty() {
                self.keys.remove(&key);
            }
            for v in &dropped {
                self.leave(&key, v);
            }
        }
    }

    /// The event that changed `key` in `versions[idx]`, if `shape` wants its kind: with
    /// `prev_kv` when `shape` asks for it and the previous version is still retained and
    /// live. The event's own value is read through `ahead`; a previous value alone (it lies
    /// back in the file, where a window would not help).
    fn event_at(
        key: &[u8],
        versions: &[Version],
        idx: usize,
        shape: EventShape,
        ahead: &mut ReadAhead,
    ) -> Option<Event> {
        let v = &versions[idx];
        let kind = match v.live {
            Some(_) => EventKind::Put,
            None => EventKind::Delete,
        };
        if !shape.wants(kind) {
            return None;
        }
        let prev_kv = idx
            .checked_sub(1)
            .filter(|_| shape.prev_kv)
            .and_then(|p| {
                let pv = &versions[p];
                pv.live.as_ref().map(|l| (pv.mod_revision, l))
            })
            .map(|(m, l)| key_value(key, m, l));
        let kv = match &v.live {
            Some(l) => key_value_in_order(key, v.mod_revision, l, ahead),
            None => KeyValue {
                key: key.to_vec(),
                mod_revision: Revision(v.mod_revision),
                ..KeyValue::default()
            },
        };
        Some(Event { kind, kv, prev_kv })
    }

    /// Events in `range` at revisions `>= from`, whole revisions only, stopping before the
    /// revision that would take the batch past `max_events` (but always covering at least
    /// one revision with events, if there is one). Returns the events `shape` wants and the
    /// first revision not covered, or `None` for "covered everything retained".
    ///
    /// `max_events` counts every event in `range`, built or not, and the revisions walked
    /// are at most [`HISTORY_REVISIONS_PER_EVENT`] times as many: together they bound the
    /// work of one call (which runs under the state lock), also for a shape that wants few
    /// of the events, or a range that few revisions touch.
    pub(crate) fn events_from(
        &self,
        range: &KeyRange,
        from: i64,
        max_events: usize,
        shape: EventShape,
    ) -> (Vec<Event>, Option<i64>) {
        let mut out: Vec<Event> = Vec::new();
        let mut covered = 0;
        // Revision order is the order values were stored in: read them a window at a time.
        let mut ahead = ReadAhead::default();
        if range.range_end.is_empty() {
            // One key: its own version list is the history, no need to walk `changes`.
            let Some(versions) = self.keys.get(range.key.as_slice()) else {
                return (out, None);
            };
            let start = versions.partition_point(|v| v.mod_revision < from);
            for idx in start..versions.len() {
                if covered > 0 && covered + 1 > max_events {
                    return (out, Some(versions[idx].mod_revision));
                }
                covered += 1;
                out.extend(Self::event_at(&range.key, versions, idx, shape, &mut ahead));
            }
            return (out, None);
        }
        let max_walked = max_events
            .max(1)
            .saturating_mul(HISTORY_REVISIONS_PER_EVENT);
        for (walked, (&rev, keys)) in self.changes.iter_from(from).enumerate() {
            if walked >= max_walked {
                // A narrow range far behind a busy store: stop walking other keys' changes.
                return (out, Some(rev));
            }
            let in_range = || keys.as_slice().iter().filter(|k| range.contains(k));
            let n = in_range().count();
            if n == 0 {
                continue;
            }
            if covered > 0 && covered + n > max_events {
                return (out, Some(rev));
            }
            covered += n;
            for key in in_range() {
                let versions = &self.keys[key];
                let idx = versions
                    .binary_search_by_key(&rev, |v| v.mod_revision)
                    .expect("changes index names a retained version");
                out.extend(Self::event_at(key, versions, idx, shape, &mut ahead));
            }
        }
        (out, None)
    }

    /// Feeds every retained version with `mod_revision <= at` into `crc`, in key then
    /// revision order.
    pub(crate) fn hash_into(&self, crc: &mut Crc32, at: i64) {
        for (key, versions) in &self.keys {
            for v in versions.iter().take_while(|v| v.mod_revision <= at) {
                crc.update_bytes(key);
                crc.update_i64(v.mod_revision);
                match &v.live {
                    Some(l) => {
                        crc.update(&[1]);
                        crc.update_i64(l.create_revision);
                        crc.update_i64(l.version);
                        crc.update_i64(l.lease);
                        crc.update_bytes(&l.value.bytes());
                    }
                    None => crc.update(&[0]),
                }
            }
        }
    }

    /// Structural checks for a store that came from outside (a snapshot): see the module
    /// docs for the invariants.
    pub(crate) fn check_invariants(&self, revision: i64, compact: i64) -> Result<(), String> {
        for (key, versions) in &self.keys {
            if key.is_empty() {
                return Err("empty key in store".into());
            }
            if versions.is_empty() {
                return Err("key with no versions".into());
            }
            let mut prev: Option<&Version> = None;
            let mut at_or_below_compact = 0;
            for v in versions {
                if v.mod_revision <= 1 || v.mod_revision > revision {
                    return Err(format!("version at impossible revision {}", v.mod_revision));
                }
                if let Some(p) = prev {
                    if p.mod_revision >= v.mod_revision {
                        return Err("versions out of order".into());
                    }
                }
                if v.mod_revision <= compact {
                    at_or_below_compact += 1;
                    if v.live.is_none() {
                        return Err("tombstone at or below the compact revision".into());
                    }
                } else {
                    let listed = self
                        .changes
                        .get(v.mod_revision)
                        .is_some_and(|ks| ks.as_slice().iter().any(|k| k == key));
                    if !listed {
                        return Err("version missing from the change index".into());
                    }
                }
                if let Some(l) = &v.live {
                    if l.version < 1 || l.create_revision > v.mod_revision {
                        return Err("inconsistent live version".into());
                    }
                }
                prev = Some(v);
            }
            if at_or_below_compact > 1 {
                return Err("uncompacted history below the compact revision".into());
            }
        }
        for (&rev, keys) in self.changes.iter() {
            let keys = keys.as_slice();
            if rev <= compact || rev > revision {
                return Err(format!("change index entry at revision {rev}"));
            }
            let unique: BTreeSet<&Key> = keys.iter().collect();
            if keys.is_empty() || unique.len() != keys.len() {
                return Err("malformed change index entry".into());
            }
            for key in keys {
                let ok = self
                    .keys
                    .get(key)
                    .is_some_and(|vs| vs.binary_search_by_key(&rev, |v| v.mod_revision).is_ok());
                if !ok {
                    return Err("change index names a missing version".into());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(value: &[u8]) -> Live {
        Live {
            create_revision: 2,
            version: 1,
            lease: 0,
            value: value.into(),
        }
    }

    /// Snapshots written with `BTreeMap`s must read back, and new ones must read in older
    /// binaries: the persistent maps encode to exactly the same bytes.
    #[test]
    fn persistent_maps_encode_like_btreemaps() {
        let mut store = KeyStore::default();
        for i in 0..300u32 {
            let key = format!("k{:05}", i * 7 % 300);
            store.put(key.as_bytes(), 2 + i64::from(i), live(&i.to_le_bytes()));
        }
        store.delete(b"k00007", 400);
        let keys: BTreeMap<Key, Vec<Version>> = store
            .keys()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let changes: BTreeMap<i64, Changed> = store
            .changes()
            .iter()
            .map(|(r, c)| (*r, c.clone()))
            .collect();
        assert_eq!(
            bincode::serialize(store.keys()).unwrap(),
            bincode::serialize(&keys).unwrap()
        );
        assert_eq!(
            bincode::serialize(store.changes()).unwrap(),
            bincode::serialize(&changes).unwrap()
        );
        let back = KeyStore::from_parts(keys, changes);
        assert_eq!(back.keys(), store.keys());
        assert_eq!(back.live_keys(), store.live_keys());
        assert_eq!(back.size_bytes(), store.size_bytes());
    }

    /// A clone taken for a snapshot keeps its contents while the original moves on, and the
    /// original sees its own writes (the copy-on-write of shared nodes).
    #[test]
    fn clone_is_a_stable_copy() {
        let mut store = KeyStore::default();
        for i in 0..1000u32 {
            store.put(format!("k{i:04}").as_bytes(), 2 + i64::from(i), live(b"a"));
        }
        let frozen = store.clone();
        for i in 0..1000u32 {
            store.put(
                format!("k{i:04}").as_bytes(),
                2000 + i64::from(i),
                live(b"b"),
            );
        }
        store.compact(2999);
        assert!(frozen
            .keys()
            .iter()
            .all(|(_, v)| v.len() == 1 && *v[0].live.as_ref().unwrap().value.bytes() == *b"a"));
        assert_eq!(frozen.changes().len(), 1000);
        assert!(store
            .keys()
            .iter()
            .all(|(_, v)| v.len() == 1 && *v[0].live.as_ref().unwrap().value.bytes() == *b"b"));
        assert!(store.changes().is_empty());
        assert_eq!(store.check_invariants(2999, 2999), Ok(()));
        assert_eq!(frozen.check_invariants(1001, 0), Ok(()));
    }

    /// The values a store holds, with their versions, read back.
    fn contents(store: &KeyStore) -> Vec<(Vec<u8>, i64, Option<Vec<u8>>)> {
        store
            .keys()
            .iter()
            .flat_map(|(k, vs)| {
                vs.iter().map(move |v| {
                    let value = v.live.as_ref().map(|l| l.value.to_vec());
                    (k.to_vec(), v.mod_revision, value)
                })
            })
            .collect()
    }

    /// How many versions hold their value in the spill.
    fn spilled_versions(store: &KeyStore) -> usize {
        store
            .keys()
            .values()
            .flatten()
            .filter(|v| matches!(v.live.as_ref().unwrap().value, Value::Spilled { .. }))
            .count()
    }

    /// Attaching walks the whole store, chunk after chunk: every long value already in it
    /// leaves the heap and reads back the same.
    #[test]
    fn attaching_moves_every_long_value_already_stored() {
        use crate::value::tests::MemSpill;
        let keys = 2 * ATTACH_CHUNK_KEYS as u64 + 3;
        let value = |i: u64| format!("{i:0>100}").into_bytes();
        let mut store = KeyStore::default();
        for i in 0..keys {
            store.put(&i.to_be_bytes(), 2 + i as i64, live(&value(i)));
        }
        let before = contents(&store);
        store.attach_spill(Arc::new(MemSpill::new(64 * 1024)));
        let spilled = spilled_versions(&store);
        assert_eq!(spilled as u64, keys);
        assert_eq!(contents(&store), before);
    }

    /// History read from spilled values is what it is from the heap, for every shape; a
    /// shape reads back only the values of what it builds: the puts it wants, and the
    /// previous versions only when it asks for them.
    #[test]
    fn history_reads_from_the_spill_only_the_values_its_shape_builds() {
        use crate::value::tests::MemSpill;
        let spill = Arc::new(MemSpill::new(8 * 1024));
        let mut heap = KeyStore::default();
        let mut spilled = KeyStore::default();
        spilled.attach_spill(spill.clone());
        for rev in 2..400i64 {
            let key = format!("k{:02}", rev % 23);
            for store in [&mut heap, &mut spilled] {
                if rev % 7 == 3 && store.latest(key.as_bytes()).is_some() {
                    store.delete(key.as_bytes(), rev);
                } else {
                    store.put(key.as_bytes(), rev, live(format!("{rev:0>100}").as_bytes()));
                }
            }
        }
        let ranges = [
            KeyRange {
                key: b"k".to_vec(),
                range_end: b"l".to_vec(),
            },
            KeyRange {
                key: b"k05".to_vec(),
                range_end: Vec::new(),
            },
        ];
        for range in &ranges {
            for bits in 0..8 {
                let shape = EventShape {
                    puts: bits & 1 != 0,
                    deletes: bits & 2 != 0,
                    prev_kv: bits & 4 != 0,
                };
                for max in [1, 10, 1000] {
                    let from_heap = heap.events_from(range, 50, max, shape);
                    let before = spill.reads();
                    let from_spill = spilled.events_from(range, 50, max, shape);
                    let reads = spill.reads() - before;
                    assert_eq!(from_spill, from_heap, "{range:?} {shape:?} max {max}");
                    let built_values: u64 = from_heap
                        .0
                        .iter()
                        .map(|e| {
                            assert!(shape.wants(e.kind));
                            assert!(shape.prev_kv || e.prev_kv.is_none());
                            u64::from(e.kind == EventKind::Put) + u64::from(e.prev_kv.is_some())
                        })
                        .sum();
                    assert_eq!(reads, built_values, "{range:?} {shape:?} max {max}");
                }
            }
        }
    }

    /// With a spill attached, long values leave the heap and read back the same; compaction
    /// releases them; evacuation empties mostly-garbage segments until none is pending, and
    /// the segments nobody refers to any more are gone. A copy taken before (a snapshot)
    /// keeps reading its own values throughout.
    #[test]
    fn spilled_values_read_back_and_garbage_segments_are_evacuated() {
        use crate::value::tests::MemSpill;
        let value = |i: u64, round: u64| format!("{round:04}-{i:0>200}").into_bytes();
        let mut store = KeyStore::default();
        // Some written before the spill is attached: they move on attach.
        for i in 0..50u64 {
            store.put(
                format!("k{i:03}").as_bytes(),
                2 + i as i64,
                live(&value(i, 0)),
            );
        }
        let spill = Arc::new(MemSpill::new(8 * 1024));
        store.attach_spill(spill.clone());
        let mut rev = 52;
        for round in 1..6u64 {
            for i in 0..200u64 {
                store.put(format!("k{i:03}").as_bytes(), rev, live(&value(i, round)));
                rev += 1;
            }
        }
        // One short value stays in the heap.
        store.put(b"short", rev, live(b"s"));
        let spilled = spilled_versions(&store);
        assert_eq!(spilled, 50 + 5 * 200, "every long value spilled");
        let before = contents(&store);
        let frozen = store.clone();
        // Drop all but the newest version of every key: most of every older segment is garbage.
        store.compact(rev);
        assert_eq!(store.check_invariants(rev, rev), Ok(()));
        let segments_before = spill.live_segments();
        let mut steps = 0;
        while spill.evacuation_pending() {
            store.evacuate();
            steps += 1;
            assert!(steps < 1000, "evacuation does not finish");
        }
        let after: Vec<_> = contents(&store);
        let expected: Vec<_> = before
            .iter()
            .filter(|(k, r, _)| store.keys()[k.as_slice()][0].mod_revision == *r)
            .cloned()
            .collect();
        assert_eq!(
            after, expected,
            "values read back unchanged after evacuation"
        );
        assert_eq!(contents(&frozen), before, "the copy reads its own values");
        drop(frozen);
        assert!(
            spill.live_segments() < segments_before,
            "evacuated segments are freed ({} before, {} after)",
            segments_before,
            spill.live_segments()
        );
    }
}
