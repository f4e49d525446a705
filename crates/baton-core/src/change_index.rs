//! The key store's revision → changed keys index (see [`crate::mvcc`]): a persistent vector
//! of `(revision, keys)` in revision order.
//!
//! Why a vector and not an ordered map: revisions only grow, so every change lands at the
//! end (one key more at the newest revision, or a new newest revision) and compaction
//! removes a prefix. A persistent B-tree map paid for order it never needed: at 100k
//! single-key revisions it took about 110 bytes per revision (node slack, the tree's own
//! links), measured as the RSS a compaction gave back; the vector's full 64-entry leaves
//! take the entry itself (32 bytes) and little more. Lookups by revision (watch catch-up,
//! the invariant check) binary-search it, `O(log² n)` on the persistent vector. It is
//! persistent for the same reason as the key map: a snapshot clones the store in `O(1)`.

use imbl::Vector;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize};

/// A key as the store holds it: up to 16 bytes inside the key map's node itself, longer
/// ones in one exact heap allocation. Why inline: every put walks the key map comparing its
/// key against ~4 keys per node on ~5 levels (100k keys); with a `Box<[u8]>` each comparison
/// followed a pointer to another cache line. Measured at 100k keys of 8 bytes (etcd's
/// benchmark keys), single node, put with 100 clients: the apply's share of the worker
/// 22 % → 17 % (the binary search 40 % → 24 % of it), throughput +2.3 % (four alternating
/// pairs). 24 bytes (smallvec's `union` layout): as many as the box and its 8-byte
/// allocation took for such a key, 8 more than the box for a key over 16 bytes.
/// Serializes exactly like the `Box<[u8]>` it replaced (a sequence of bytes), so snapshots
/// written before the change read back unchanged (golden files).
pub(crate) type Key = smallvec::SmallVec<[u8; 16]>;
// The size the doc above counts on (without `union` it would be 32).
const _: () = assert!(std::mem::size_of::<Key>() == 24);

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

    pub(crate) fn push(&mut self, key: Key) {
        match self {
            Changed::One(first) => {
                let first = std::mem::take(first);
                *self = Changed::Many(vec![first, key]);
            }
            Changed::Many(v) => v.push(key),
        }
    }

    pub(crate) fn into_vec(self) -> Vec<Key> {
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

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct ChangeIndex {
    /// Strictly increasing revisions, each with at least one key.
    entries: Vector<(i64, Changed)>,
}

impl ChangeIndex {
    /// From `(revision, keys)` pairs in increasing revision order (a map's order).
    pub(crate) fn from_sorted(pairs: impl IntoIterator<Item = (i64, Changed)>) -> ChangeIndex {
        let entries: Vector<(i64, Changed)> = pairs.into_iter().collect();
        assert!(
            entries
                .iter()
                .zip(entries.iter().skip(1))
                .all(|(a, b)| a.0 < b.0),
            "change index built from revisions out of order"
        );
        ChangeIndex { entries }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Lists `key` as changed at `rev`, after the keys already changed there. `rev` is the
    /// newest revision or a newer one: the store changes keys in revision order.
    pub(crate) fn note(&mut self, rev: i64, key: Key) {
        match self.entries.back_mut() {
            Some((last, changed)) if *last == rev => changed.push(key),
            Some((last, _)) => {
                assert!(
                    *last < rev,
                    "change at revision {rev} after one at revision {last}"
                );
                self.entries.push_back((rev, Changed::One(key)));
            }
            None => self.entries.push_back((rev, Changed::One(key))),
        }
    }

    /// Position of the first entry at or after `rev`.
    fn position(&self, rev: i64) -> usize {
        self.entries
            .binary_search_by(|(r, _)| r.cmp(&rev))
            .unwrap_or_else(|at| at)
    }

    /// The keys changed at `rev`, if any.
    pub(crate) fn get(&self, rev: i64) -> Option<&Changed> {
        let at = self.entries.binary_search_by(|(r, _)| r.cmp(&rev)).ok()?;
        Some(&self.entries[at].1)
    }

    /// Every entry, in revision order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&i64, &Changed)> + '_ {
        self.entries.iter().map(|(r, c)| (r, c))
    }

    /// The entries at revisions `>= from`, in revision order.
    pub(crate) fn iter_from(&self, from: i64) -> impl Iterator<Item = (&i64, &Changed)> + '_ {
        let at = self.position(from);
        self.entries
            .focus()
            .narrow(at..)
            .into_iter()
            .map(|(r, c)| (r, c))
    }

    /// Removes the entries at revisions `<= at` and hands them back, in revision order.
    pub(crate) fn remove_through(&mut self, at: i64) -> Vector<(i64, Changed)> {
        let n = self.position(at.saturating_add(1));
        let rest = self.entries.split_off(n);
        std::mem::replace(&mut self.entries, rest)
    }
}

/// Exactly as the `OrdMap<i64, Changed>` (and before it the `BTreeMap`) it replaced: a map
/// from revision to keys, in revision order. Snapshots read back unchanged.
impl Serialize for ChangeIndex {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.entries.len()))?;
        for (rev, changed) in &self.entries {
            map.serialize_entry(rev, changed)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn key(s: &str) -> Key {
        s.as_bytes().into()
    }

    #[test]
    fn lookups_ranges_and_compaction_agree_with_a_map() {
        let mut index = ChangeIndex::default();
        let mut map: BTreeMap<i64, Changed> = BTreeMap::new();
        // Revisions 2..200, every third one a txn of two keys, every seventh skipped.
        for rev in (2..200i64).filter(|r| r % 7 != 0) {
            index.note(rev, key(&format!("a{rev}")));
            map.insert(rev, Changed::One(key(&format!("a{rev}"))));
            if rev % 3 == 0 {
                index.note(rev, key(&format!("b{rev}")));
                map.get_mut(&rev).unwrap().push(key(&format!("b{rev}")));
            }
        }
        let listed = |i: &ChangeIndex| i.iter().map(|(r, c)| (*r, c.clone())).collect::<Vec<_>>();
        assert_eq!(listed(&index), map.clone().into_iter().collect::<Vec<_>>());
        assert_eq!(
            bincode::serialize(&index).unwrap(),
            bincode::serialize(&map).unwrap()
        );
        for rev in 0..205 {
            assert_eq!(index.get(rev), map.get(&rev), "get {rev}");
            let from: Vec<i64> = index.iter_from(rev).map(|(r, _)| *r).collect();
            let expect: Vec<i64> = map.range(rev..).map(|(r, _)| *r).collect();
            assert_eq!(from, expect, "from {rev}");
        }
        let frozen = index.clone();
        let removed = index.remove_through(100);
        assert!(removed.iter().all(|(r, _)| *r <= 100));
        assert_eq!(removed.len(), map.range(..=100).count());
        assert!(index.iter().all(|(r, _)| *r > 100));
        assert_eq!(index.len() + removed.len(), frozen.len());
        assert_eq!(listed(&frozen), map.into_iter().collect::<Vec<_>>());
        assert!(!index.remove_through(1000).is_empty() && index.is_empty());
    }

    #[test]
    #[should_panic(expected = "after one at revision")]
    fn a_change_at_an_older_revision_is_a_bug() {
        let mut index = ChangeIndex::default();
        index.note(5, key("a"));
        index.note(4, key("b"));
    }
}
