//! The state as a backup sees it: every retained version of every key in revision order
//! (etcd's backend orders its `key` bucket so, by main then sub revision), and the tables a
//! backup carries beside the keys. Read-only; the server turns it into etcd's layout.

use crate::mvcc::{Key, Version};
use crate::types::LeaseId;

use super::store::StateMachine;

/// One retained version of one key, at `(mod_revision, sub)`: `sub` is its position among
/// the changes of its revision (etcd's sub revision, the operation's place in its txn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRef<'a> {
    pub key: &'a [u8],
    pub mod_revision: i64,
    pub sub: i64,
    /// `None`: a tombstone (the key was deleted at this revision).
    pub live: Option<LiveRef<'a>>,
}

/// A live version's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveRef<'a> {
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
    pub value: &'a [u8],
}

/// A lease as a backup carries it (etcd's `leasepb.Lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseExport {
    pub id: LeaseId,
    pub granted_ttl_s: i64,
    /// The remaining TTL of the last checkpoint, in whole seconds, if one was taken.
    pub remaining_ttl_s: Option<i64>,
}

fn version_ref<'a>(key: &'a Key, v: &'a Version, sub: i64) -> VersionRef<'a> {
    VersionRef {
        key,
        mod_revision: v.mod_revision,
        sub,
        live: v.live.as_ref().map(|l| LiveRef {
            create_revision: l.create_revision,
            version: l.version,
            lease: l.lease,
            value: &l.value,
        }),
    }
}

impl StateMachine {
    /// Every retained version in `(revision, sub)` order, borrowed from the state (take it
    /// from a clone: the key store's clone is O(1)).
    ///
    /// Versions after the compact revision come from the change index, which lists each
    /// revision's keys in operation order: `sub` is that position, as etcd's. At or below it
    /// each key keeps at most its one live version and the order within a revision is gone
    /// with the compacted history; those are numbered in key order. Memory: a reference and
    /// a revision per such version (24 bytes), to sort them; nothing of keys or values.
    pub fn versions_in_revision_order(&self) -> impl Iterator<Item = VersionRef<'_>> + '_ {
        let compact = self.compact_revision;
        let mut compacted: Vec<(i64, &Key, &Version)> = self
            .store
            .keys()
            .iter()
            .filter_map(|(k, vs)| {
                let v = vs.first()?;
                (v.mod_revision <= compact).then_some((v.mod_revision, k, v))
            })
            .collect();
        // Already in key order; a stable sort by revision keeps key order within one.
        compacted.sort_by_key(|(rev, _, _)| *rev);
        let mut subs = 0i64;
        let mut last_rev = 0i64;
        let below = compacted.into_iter().map(move |(rev, key, v)| {
            if rev != last_rev {
                last_rev = rev;
                subs = 0;
            }
            let r = version_ref(key, v, subs);
            subs += 1;
            r
        });
        let keys = self.store.keys();
        let above = self
            .store
            .changes()
            .iter()
            .flat_map(move |(&rev, changed)| {
                changed
                    .as_slice()
                    .iter()
                    .enumerate()
                    .map(move |(sub, key)| {
                        let (key, versions) =
                            keys.get_key_value(key).expect("change index names a key");
                        let at = versions
                            .binary_search_by_key(&rev, |v| v.mod_revision)
                            .expect("change index names a retained version");
                        version_ref(key, &versions[at], sub as i64)
                    })
            });
        below.chain(above)
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
