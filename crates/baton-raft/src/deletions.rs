//! One-shot notifications of key deletions, for lock waiters.
//!
//! A lock waiter sleeps until its predecessor's key is deleted (and wants to hear at once if
//! its own key is). Waking every waiter on every applied revision (the watch streams'
//! revision channel) would make a queue of `n` waiters cost `O(n)` wake-ups per release;
//! with a watch per key, a release wakes exactly the one waiter behind it.
//!
//! Watches are registered under the state lock (see `Node::read_and_watch_deletions`), and
//! fired in `apply_entry` under the same lock as the delete is applied, so a watch
//! registered after reading "the key is live" cannot miss its deletion. A fired watch is
//! removed; a dropped one unregisters itself. The registry is bounded by its users (the lock
//! engine caps concurrent waiters), not here.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct DeletionWatches {
    next_id: u64,
    by_key: HashMap<Vec<u8>, Vec<(u64, Arc<Notify>)>>,
}

impl DeletionWatches {
    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn add(&mut self, key: Vec<u8>) -> (u64, Arc<Notify>) {
        let id = self.next_id;
        self.next_id += 1;
        let notify = Arc::new(Notify::new());
        self.by_key
            .entry(key)
            .or_default()
            .push((id, notify.clone()));
        (id, notify)
    }

    fn remove(&mut self, key: &[u8], id: u64) {
        if let Some(list) = self.by_key.get_mut(key) {
            list.retain(|(i, _)| *i != id);
            if list.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// `key` was deleted: wakes (and forgets) everyone watching it. `notify_one` stores a
    /// permit when the waiter is not polling yet, so a wake-up is never lost.
    pub(crate) fn fire(&mut self, key: &[u8]) {
        if let Some(list) = self.by_key.remove(key) {
            for (_, n) in list {
                n.notify_one();
            }
        }
    }

    /// The store was replaced wholesale (a snapshot installed): any watched key may be gone,
    /// so everyone re-checks.
    pub(crate) fn fire_all(&mut self) {
        for (_, list) in self.by_key.drain() {
            for (_, n) in list {
                n.notify_one();
            }
        }
    }

    /// Number of registered watches.
    pub(crate) fn len(&self) -> usize {
        self.by_key.values().map(Vec::len).sum()
    }
}

/// A one-shot watch for the deletion of one key. Dropping it unregisters it.
pub struct KeyDeletion {
    key: Vec<u8>,
    id: u64,
    notify: Arc<Notify>,
    /// The registry to leave on drop: `Shared::deletions` (weak, so a watch outliving its
    /// replica does nothing), held directly rather than through `Shared` so this module
    /// does not depend on `sm`, which holds the registry (the tidy test `no_module_cycles`).
    registry: Weak<Mutex<DeletionWatches>>,
}

impl KeyDeletion {
    pub(crate) fn register(
        registry: &Arc<Mutex<DeletionWatches>>,
        watches: &mut DeletionWatches,
        key: Vec<u8>,
    ) -> Self {
        let (id, notify) = watches.add(key.clone());
        KeyDeletion {
            key,
            id,
            notify,
            registry: Arc::downgrade(registry),
        }
    }

    /// The watched key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// Resolves once the key has been deleted (or the store was replaced, after which the
    /// caller must re-check). Cancel safe: a wake-up that arrives while nobody awaits is
    /// kept for the next call.
    pub async fn deleted(&self) {
        self.notify.notified().await;
    }
}

impl Drop for KeyDeletion {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            registry.lock().remove(&self.key, self.id);
        }
    }
}

impl std::fmt::Debug for KeyDeletion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyDeletion")
            .field("key", &String::from_utf8_lossy(&self.key))
            .finish()
    }
}
