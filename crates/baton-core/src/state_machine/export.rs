//! The state as a backup sees it: every retained version of every key in revision order
//! (etcd's backend orders its `key` bucket so, by main then sub revision), and the tables a
//! backup carries beside the keys. Read-only; the server turns it into etcd's layout.

use std::borrow::Cow;

use crate::mvcc::{Key, Version};
use crate::types::LeaseId;
use crate::value::ReadAhead;

use super::store::StateMachine;

/// One retained version of one key, at `(mod_revision, sub)`: `sub` is its position among
/// the changes of its revision (etcd's sub revision, the operation's place in its txn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRef<'a> {
    pub key: &'a [u8],
    pub mod_revision: i64,
    pub sub: i64,
    /// `None`: a tombstone (the key was deleted at this revision).
    pub live: Option<LiveRef<'a>>,
}

/// A live version's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveRef<'a> {
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
    /// Borrowed from the heap, or read from the member's value file ([`crate::value`]).
    pub value: Cow<'a, [u8]>,
}

/// A lease as a backup carries it (etcd's `leasepb.Lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseExport {
    pub id: LeaseId,
    pub granted_ttl_s: i64,
    /// The remaining TTL of the last checkpoint, in whole seconds, if one was taken.
    pub remaining_ttl_s: Option<i64>,
}

fn version_ref<'a>(
    key: &'a Key,
    v: &'a Version,
    sub: i64,
    ahead: &mut ReadAhead,
) -> VersionRef<'a> {
    VersionRef {
        key,
        mod_revision: v.mod_revision,
        sub,
        live: v.live.as_ref().map(|l| LiveRef {
            create_revision: l.create_revision,
            version: l.version,
            lease: l.lease,
            value: l.value.bytes_in_order(ahead),
        }),
    }
}

impl StateMachine {
    /// Every retained version in `(revision, sub)` order, borrowed from the state (take it
    /// from a clone: the key store's clone is O(1)).
    ///
    /// Built from one walk of the key map, a sort by revision and a walk of the change index
    /// alongside, not a key map lookup per version through the change index: a backup or
    /// snapshot of n versions then costs sequential walks and a sort of integers instead of
    /// n B-tree descents comparing keys (the lookups were half of a snapshot's CPU under
    /// write load).
    ///
    /// Above the compact revision, `sub` is the version's position in its revision's entry
    /// of the change index (operation order, as etcd's); at or below it each key keeps at
    /// most its one live version and the order within a revision is gone with the compacted
    /// history, so those are numbered in key order. Memory: a reference and a revision per
    /// version (24 bytes), to sort them; nothing of keys or values.
    pub fn versions_in_revision_order(&self) -> impl Iterator<Item = VersionRef<'_>> + '_ {
        let compact = self.compact_revision;
        let mut all: Vec<(i64, &Key, &Version)> = self
            .store
            .keys()
            .iter()
            .flat_map(|(k, vs)| vs.iter().map(move |v| (v.mod_revision, k, v)))
            .collect();
        // Already in key order; a stable sort by revision keeps key order within one.
        all.sort_by_key(|(rev, _, _)| *rev);
        // Revisions above the compact revision come in the change index's order too, so it is
        // walked alongside rather than searched.
        let mut changes = self.store.changes().iter();
        let mut next = 0;
        // A txn's versions in operation order, last first (popped). Their values are read
        // as they are popped, so in the order they were stored (see `ReadAhead`).
        let mut pending: Vec<(&Key, &Version, i64)> = Vec::new();
        let mut ahead = ReadAhead::default();
        std::iter::from_fn(move || {
            if pending.is_empty() {
                let &(rev, _, _) = all.get(next)?;
                let same = all[next..].iter().take_while(|(r, _, _)| *r == rev).count();
                let group = &all[next..next + same];
                next += same;
                if rev <= compact {
                    pending.extend(
                        group
                            .iter()
                            .enumerate()
                            .rev()
                            .map(|(sub, (_, k, v))| (*k, *v, sub as i64)),
                    );
                } else {
                    let (&changed_at, changed) = changes
                        .next()
                        .expect("every version above the compact revision is in the change index");
                    let changed = changed.as_slice();
                    assert!(
                        changed_at == rev && changed.len() == group.len(),
                        "the change index and the key map agree on revision {rev}"
                    );
                    // Several keys at one revision (a txn): operation order, found by key in
                    // the group (which is in key order).
                    for (sub, key) in changed.iter().enumerate().rev() {
                        let at = group
                            .binary_search_by(|(_, k, _)| k.as_ref().cmp(key.as_ref()))
                            .expect("the change index names a version of its revision");
                        let (_, k, v) = group[at];
                        pending.push((k, v, sub as i64));
                    }
                }
            }
            let (k, v, sub) = pending.pop()?;
            Some(version_ref(k, v, sub, &mut ahead))
        })
    }

    /// Every lease, by id.
    pub fn leases_for_export(&self) -> impl Iterator<Item = LeaseExport> + '_ {
        self.leases.iter().map(|(id, l)| LeaseExport {
            id: *id,
            granted_ttl_s: l.granted_ttl_s,
            remaining_ttl_s: l
                .checkpoint_remaining_ms
                .map(|ms| (ms + 999).div_euclid(1000)),
        })
    }
}
