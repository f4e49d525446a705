//! The multi-version key store: every retained version of every key, plus a revision-ordered
//! index of which keys changed at which revision.
//!
//! Layout, and why:
//! - `keys: OrdMap<key, Vec<Version>>` (a persistent B-tree, see [`KeyMap`]), each vector
//!   sorted by `mod_revision`. A put into a
//!   store of `n` keys is one `O(log n)` map lookup plus a push; a read at revision `r` is a
//!   binary search in that key's (short) vector; a prefix range walks only the keys in the
//!   prefix, never the whole map.
//! - `changes: OrdMap<revision, keys>`, the keys changed at each revision *in the order
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

use imbl::OrdMap;

use serde::{Deserialize, Serialize};

use crate::crc32::Crc32;
use crate::types::{Event, EventKind, KeyRange, KeyValue, LeaseId, Revision};

/// A key as the store holds it: exactly its bytes (a `Vec` would add a capacity word and,
/// from a request buffer, possibly slack). Serializes exactly like `Vec<u8>`, so snapshots
/// written before the change read back unchanged.
pub(crate) type Key = Box<[u8]>;

/// The keys changed at one revision, in operation order. Almost every revision changes one
/// key, so that one is held inline: a vector per revision cost an allocation (32 bytes with
/// glibc) per write. Serialized as a sequence of keys, exactly as the `Vec<Vec<u8>>` it
/// replaced, so snapshots read back unchanged.
///
/// Persisted: see [`crate::format`] (the encoding is that sequence, whatever the variant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changed {
    One(Key),
    Many(Vec<Key>),
}

impl Changed {
    pub(crate) fn as_slice(&self) -> &[Key] {
        match self {
            Changed::One(k) => std::slice::from_ref(k),
            Changed::Many(v) => v,
        }
    }

    fn push(&mut self, key: Key) {
        match self {
            Changed::One(first) => {
                let first = std::mem::take(first);
                *self = Changed::Many(vec![first, key]);
            }
            Changed::Many(v) => v.push(key),
        }
    }

    fn into_vec(self) -> Vec<Key> {
        match self {
            Changed::One(k) => vec![k],
            Changed::Many(v) => v,
        }
    }
}

impl Serialize for Changed {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.as_slice())
    }
}

impl<'de> Deserialize<'de> for Changed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut v = Vec::<Key>::deserialize(d)?;
        Ok(if v.len() == 1 {
            Changed::One(v.pop().expect("one key"))
        } else {
            Changed::Many(v)
        })
    }
}

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
    /// Boxed for the same reasons as [`Key`] (and serialized the same as a `Vec<u8>`).
    pub(crate) value: Box<[u8]>,
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

/// Builds the etcd-shaped `KeyValue` of a live version.
pub(crate) fn key_value(key: &[u8], mod_revision: i64, live: &Live) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        create_revision: Revision(live.create_revision),
        mod_revision: Revision(mod_revision),
        version: live.version,
        value: live.value.to_vec(),
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

/// The revision → changed keys index; persistent for the same reason as [`KeyMap`].
pub(crate) type ChangeMap = OrdMap<i64, Changed>;

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyStore {
    keys: KeyMap,
    changes: ChangeMap,
    /// Keys whose newest version is live. Derived; kept so `key_count` is O(1).
    live_keys: usize,
    /// Sum of `Version::size_bytes` over all retained versions. Derived.
    size_bytes: u64,
}

impl KeyStore {
    /// Rebuilds a store from its persisted parts, recomputing the derived counters.
    pub(crate) fn from_parts(
        keys: BTreeMap<Key, Vec<Version>>,
        changes: BTreeMap<i64, Changed>,
    ) -> Self {
        let keys: KeyMap = keys.into_iter().collect();
        let changes: ChangeMap = changes.into_iter().collect();
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
        }
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

    fn push(&mut self, key: &[u8], version: Version) {
        let rev = version.mod_revision;
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

    /// Lists `key` in the change index at `rev`, after the keys already changed there.
    fn note_change(&mut self, key: &[u8], rev: i64) {
        match self.changes.get_mut(&rev) {
            Some(changed) => changed.push(key.into()),
            None => {
                self.changes.insert(rev, Changed::One(key.into()));
            }
        }
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
        let version = Version {
            mod_revision: rev,
            live: Some(live),
        };
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
                self.size_bytes -= v.size_bytes(key);
            }
        }
        if let Some(live) = live {
            let version = Version {
                mod_revision: rev,
                live: Some(live),
            };
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
        // (`OrdMap::split` walks the whole map; removing the dropped revisions one by one costs
        // in proportion to the history being dropped.)
        let dropped: Vec<i64> = self.changes.range(..=at).map(|(&rev, _)| rev).collect();
        let mut touched: BTreeSet<Key> = BTreeSet::new();
        for rev in dropped {
            if let Some(changed) = self.changes.remove(&rev) {
                touched.extend(changed.into_vec());
            }
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
            for v in versions.drain(..drop_n) {
                self.size_bytes -= v.size_bytes(&key);
            }
            if versions.is_empty() {
                self.keys.remove(&key);
            }
        }
    }

    /// The event that changed `key` at exactly `rev`, with `prev_kv` when the previous version
    /// is still retained and live.
    fn event_at(key: &[u8], versions: &[Version], idx: usize) -> Event {
        let v = &versions[idx];
        let prev_kv = idx
            .checked_sub(1)
            .and_then(|p| {
                let pv = &versions[p];
                pv.live.as_ref().map(|l| (pv.mod_revision, l))
            })
            .map(|(m, l)| key_value(key, m, l));
        match &v.live {
            Some(l) => Event {
                kind: EventKind::Put,
                kv: key_value(key, v.mod_revision, l),
                prev_kv,
            },
            None => Event {
                kind: EventKind::Delete,
                kv: KeyValue {
                    key: key.to_vec(),
                    mod_revision: Revision(v.mod_revision),
                    ..KeyValue::default()
                },
                prev_kv,
            },
        }
    }

    /// Events in `range` at revisions `>= from`, whole revisions only, stopping before the
    /// revision that would take the batch past `max_events` (but always returning at least one
    /// revision with events, if there is one). Returns the events and the first revision not
    /// covered, or `None` for "covered everything retained".
    pub(crate) fn events_from(
        &self,
        range: &KeyRange,
        from: i64,
        max_events: usize,
    ) -> (Vec<Event>, Option<i64>) {
        let mut out: Vec<Event> = Vec::new();
        if range.range_end.is_empty() {
            // One key: its own version list is the history, no need to walk `changes`.
            let Some(versions) = self.keys.get(range.key.as_slice()) else {
                return (out, None);
            };
            let start = versions.partition_point(|v| v.mod_revision < from);
            for idx in start..versions.len() {
                if !out.is_empty() && out.len() + 1 > max_events {
                    return (out, Some(versions[idx].mod_revision));
                }
                out.push(Self::event_at(&range.key, versions, idx));
            }
            return (out, None);
        }
        for (&rev, keys) in self.changes.range(from..) {
            let mut batch = Vec::new();
            for key in keys.as_slice().iter().filter(|k| range.contains(k)) {
                let versions = &self.keys[key];
                let idx = versions
                    .binary_search_by_key(&rev, |v| v.mod_revision)
                    .expect("changes index names a retained version");
                batch.push(Self::event_at(key, versions, idx));
            }
            if batch.is_empty() {
                continue;
            }
            if !out.is_empty() && out.len() + batch.len() > max_events {
                return (out, Some(rev));
            }
            out.extend(batch);
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
                        crc.update_bytes(&l.value);
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
                        .get(&v.mod_revision)
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
        for (&rev, keys) in &self.changes {
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
            .all(|(_, v)| v.len() == 1 && &*v[0].live.as_ref().unwrap().value == b"a"));
        assert_eq!(frozen.changes().len(), 1000);
        assert!(store
            .keys()
            .iter()
            .all(|(_, v)| v.len() == 1 && &*v[0].live.as_ref().unwrap().value == b"b"));
        assert!(store.changes().is_empty());
        assert_eq!(store.check_invariants(2999, 2999), Ok(()));
        assert_eq!(frozen.check_invariants(1001, 0), Ok(()));
    }
}
