//! The state itself: the [`StateMachine`] struct with every table it holds, the lease record
//! the key space and the snapshot both name, the per-entry write context, and the check of
//! the invariants that span tables.
//!
//! It lives apart from the module root so that the domain modules (`kv`, `lease`, `lock`,
//! `dedup`, `alarm`, `snapshot`, `read`, `apply`) import it from a sibling instead of reaching
//! back into `state_machine/mod.rs`, which only declares them and re-exports. Each domain
//! module adds its own `impl StateMachine` block; the fields are `pub(super)` for them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::auth::{AuthState, PermCache};
use crate::clients::ClientTable;
use crate::command::{AlarmType, MvccOps};
use crate::fencing_keys::FencingKeys;
use crate::locks::{FenceTable, LockTable};
use crate::mvcc::KeyStore;
use crate::types::{CommandIndex, Event, LeaseId, Term};
use crate::value::ValueSpill;

/// A lease as stored. The key set is the reverse index of `Live::lease`, kept so revoking a
/// lease does not scan the store.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LeaseRecord {
    pub(super) granted_ttl_s: i64,
    pub(super) checkpoint_remaining_ms: Option<i64>,
    pub(super) keys: BTreeSet<Vec<u8>>,
}

/// Revision of the empty store; etcd starts here too, so the first write gets revision 2.
pub(super) const FIRST_REVISION: i64 = 1;

/// The whole replicated state. See the crate docs for the invariants.
#[derive(Debug, Clone)]
pub struct StateMachine {
    pub(super) store: KeyStore,
    pub(super) leases: BTreeMap<LeaseId, LeaseRecord>,
    /// Lock registry (lock-delay, force-release history) and its queue index.
    pub(super) locks: LockTable,
    pub(super) fences: FenceTable,
    /// De-duplication sessions of `Deduplicated` commands.
    pub(super) clients: ClientTable,
    /// Raised alarms, by member (etcd's alarm store; replicated, in snapshots).
    pub(super) alarms: BTreeSet<(u64, AlarmType)>,
    /// Users, roles, the auth flag and revision, simple tokens (replicated, in snapshots).
    pub(super) auth: AuthState,
    /// Derived from `auth` after every change of it: each user's merged permissions.
    pub(super) perms: PermCache,
    /// The fencing-token signing keys (replicated, in snapshots from format 6).
    pub(super) fencing_keys: FencingKeys,
    pub(super) revision: i64,
    /// 1 (the empty store) until the first compaction: nothing before it can be lost.
    pub(super) compact_revision: i64,
    /// `None` until the first entry, so an entry at index 0 is accepted once.
    pub(super) last_applied: Option<(CommandIndex, Term)>,
    pub(super) last_time_ms: u64,
    /// Whether the events of applied writes carry the previous value in `prev_kv` (their
    /// key, revisions and lease always). Local, not replicated: no response and nothing
    /// persisted depends on it, only what watchers could be handed. See
    /// [`StateMachine::set_prev_values_in_events`].
    pub(super) prev_values_in_events: bool,
}

impl Default for StateMachine {
    fn default() -> Self {
        Self::new()
    }
}

/// The per-entry write context: the revision every write of this entry goes to, the
/// events in the order they happened, and the key-space operations counted as etcd counts
/// them (see [`MvccOps`]).
pub(super) struct Writes {
    pub(super) rev: i64,
    pub(super) events: Vec<Event>,
    /// The calls of the etcd mvcc view (read or write transaction) open now.
    pub(super) view: MvccOps,
    /// Everything counted in the views already closed.
    pub(super) ops: MvccOps,
}

impl Writes {
    pub(super) fn new(rev: i64) -> Writes {
        Writes {
            rev,
            events: Vec::new(),
            view: MvccOps::default(),
            ops: MvccOps::default(),
        }
    }

    /// Closes the open view (etcd's `TxnWrite.End`): its calls join the entry's, and a view
    /// of more than one call counts as a txn. A view with no calls counts nothing.
    pub(super) fn end_view(&mut self) {
        let view = std::mem::take(&mut self.view);
        if view.calls() > 1 {
            self.ops.txns += 1;
        }
        self.ops.add(&view);
    }

    /// Counts a put of `key` with `value` (and the read of the previous value when `read_prev`).
    pub(super) fn count_put(&mut self, key: &[u8], value: &[u8], read_prev: bool) {
        self.view.puts += 1;
        self.view.put_bytes += (key.len() + value.len()) as u64;
        self.view.ranges += u64::from(read_prev);
    }
}

impl StateMachine {
    /// An empty store at revision 1 with nothing applied.
    pub fn new() -> Self {
        StateMachine {
            store: KeyStore::default(),
            leases: BTreeMap::new(),
            locks: LockTable::default(),
            fences: FenceTable::default(),
            clients: ClientTable::default(),
            alarms: BTreeSet::new(),
            auth: AuthState::default(),
            perms: PermCache::default(),
            fencing_keys: FencingKeys::default(),
            revision: FIRST_REVISION,
            compact_revision: FIRST_REVISION,
            last_applied: None,
            last_time_ms: 0,
            prev_values_in_events: true,
        }
    }

    /// Whether the events of the next writes carry previous values (default: yes). A member
    /// whose watchers asked for no `prev_kv` turns them off before applying an entry: the
    /// watch hub strips `prev_kv` from every event it hands out then, and reading a
    /// previous value that went to the value file ([`crate::value`]) costs a read from the
    /// file on every overwrite. Responses are unaffected (a request's own `prev_kv` is
    /// always answered with its value).
    pub fn set_prev_values_in_events(&mut self, on: bool) {
        self.prev_values_in_events = on;
    }

    /// Keeps the store's values out of the heap from now on, in `spill` (see
    /// [`crate::value`]): those already stored move there now, in one walk. Changes nothing
    /// any read, hash or snapshot shows. A member calls it once on every state it adopts (at
    /// start, and for an installed snapshot before it replaces the state).
    pub fn keep_values_in(&mut self, spill: Arc<dyn ValueSpill>) {
        self.store.attach_spill(spill);
    }

    /// One short step of moving values out of the spill's segments that are mostly garbage
    /// (see [`crate::value`]); a no-op without a spill or with nothing to move. Meant to run
    /// after each applied entry, under the same lock. Returns how many values moved.
    pub fn evacuate_values(&mut self) -> usize {
        self.store.evacuate()
    }

    /// Verifies the internal invariants (revision order of every key's versions, the change
    /// index, compaction, lease key sets matching the store). `O(size of the store)`: meant
    /// for tests, the simulator and `restore` (the checksum catches damage; this catches a
    /// well-formed snapshot of a broken state), not for the apply path.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.revision < FIRST_REVISION
            || self.compact_revision < FIRST_REVISION
            || self.compact_revision > self.revision
        {
            return Err("impossible revisions".into());
        }
        self.store
            .check_invariants(self.revision, self.compact_revision)?;
        let mut attached = 0;
        for (id, lease) in &self.leases {
            if id.is_none() {
                return Err("lease id 0 in the lease table".into());
            }
            for key in &lease.keys {
                match self.store.latest(key) {
                    Some((_, live)) if live.lease == id.0 => attached += 1,
                    _ => return Err("lease key set out of sync with the store".into()),
                }
            }
        }
        let with_lease = self
            .store
            .keys()
            .values()
            .filter_map(|vs| vs.last()?.live.as_ref())
            .filter(|l| l.lease != 0)
            .count();
        if with_lease != attached {
            return Err("a live key names a lease that does not list it".into());
        }
        self.locks.check_invariants(|name| self.scan_queue(name))?;
        self.fences.check_invariants()?;
        self.clients.check_invariants()?;
        self.fencing_keys.check_invariants()?;
        Ok(())
    }
}
