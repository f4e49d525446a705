//! Leases as the core knows them: grant, revoke, expiry (decided by the leader's clock and
//! fenced by its term) and checkpoints of the remaining TTL, plus the lease queries.
//!
//! Deadlines are not here: the leader keeps them in memory (keep-alives are not
//! replicated). Revoking or expiring a lease deletes all its keys in one revision, through
//! the key space's own delete; an expiry also starts the lock-delay of the locks whose
//! holders go with it (`lock`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::command::{KvError, Response};
use crate::mvcc::key_value;
use crate::types::{LeaseId, Term};

use super::store::{LeaseRecord, StateMachine, Writes};

/// What the core knows about a lease. Deadlines are not here: the leader keeps them in memory
/// (keep-alives are not replicated); the core keeps the granted TTL and the last checkpointed
/// remaining TTL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub id: LeaseId,
    pub granted_ttl_s: i64,
    /// Remaining TTL (ms) as of the last checkpoint, if any was taken.
    pub checkpoint_remaining_ms: Option<i64>,
    /// Keys attached to the lease, sorted.
    pub keys: Vec<Vec<u8>>,
}

impl StateMachine {
    // ---- commands ----------------------------------------------------------------------

    pub(super) fn apply_lease_grant(
        &mut self,
        id: LeaseId,
        ttl_s: i64,
    ) -> Result<Response, KvError> {
        if id.is_none() || self.leases.contains_key(&id) {
            return Err(KvError::LeaseExists);
        }
        self.leases.insert(
            id,
            LeaseRecord {
                granted_ttl_s: ttl_s,
                checkpoint_remaining_ms: None,
                keys: BTreeSet::new(),
            },
        );
        Ok(Response::LeaseGrant { id, ttl_s })
    }

    pub(super) fn apply_lease_revoke(
        &mut self,
        id: LeaseId,
        w: &mut Writes,
    ) -> Result<Response, KvError> {
        let lease = self.leases.remove(&id).ok_or(KvError::LeaseNotFound)?;
        self.delete_lease_keys(id, lease, w);
        Ok(Response::LeaseRevoke)
    }

    /// `ExpireLeases` proposed in `term`: applied only in an entry of that term, so a
    /// deposed leader's clock cannot expire leases its successor keeps alive.
    pub(super) fn expire_leases_in_term(
        &mut self,
        term: Term,
        ids: &[LeaseId],
        w: &mut Writes,
    ) -> Response {
        let (_, entry_term) = self.last_applied.expect("set before apply_command");
        if entry_term != term {
            return Response::ExpireLeases {
                expired: Vec::new(),
                expired_holders: Vec::new(),
            };
        }
        self.expire_leases(ids, w)
    }

    /// Expires `ids`: deletes every key of every listed lease in one revision and starts the
    /// lock-delay of the locks whose holders go with them.
    pub(super) fn expire_leases(&mut self, ids: &[LeaseId], w: &mut Writes) -> Response {
        // Which of the doomed keys head a registered lock, judged on the state before
        // the entry: a waiter behind an expiring holder never held the lock, even if
        // its own lease expires in the same entry.
        let holders = self.expiring_holders(ids);
        let mut expired = Vec::new();
        for id in ids {
            // Unknown (already revoked, or listed twice) ids are ignored: the leader's
            // clock may have raced a revoke.
            if let Some(lease) = self.leases.remove(id) {
                self.delete_lease_keys(*id, lease, w);
                expired.push(*id);
            }
        }
        let expired_holders = self.start_lock_delays(holders);
        Response::ExpireLeases {
            expired,
            expired_holders,
        }
    }

    pub(super) fn apply_lease_checkpoint(&mut self, checkpoints: &[(LeaseId, i64)]) -> Response {
        for (id, remaining_ms) in checkpoints {
            if let Some(lease) = self.leases.get_mut(id) {
                lease.checkpoint_remaining_ms = Some(*remaining_ms);
            }
        }
        Response::LeaseCheckpoint
    }

    /// Deletes every key of a lease that has just been removed from the table, in key order
    /// (etcd sorts them too), all at `w.rev`.
    ///
    /// Each lease is one etcd write view: one delete call per key.
    fn delete_lease_keys(&mut self, id: LeaseId, lease: LeaseRecord, w: &mut Writes) {
        w.end_view();
        w.view.deletes += lease.keys.len() as u64;
        w.end_view();
        for key in lease.keys {
            let (m, live) = self
                .store
                .latest(&key)
                .expect("a lease lists only live keys");
            assert_eq!(live.lease, id.0, "lease key set out of sync with the store");
            let prev = key_value(&key, m, live);
            self.delete_key(prev, w);
        }
    }

    // ---- queries -----------------------------------------------------------------------

    pub fn lease(&self, id: LeaseId) -> Option<LeaseInfo> {
        self.leases.get(&id).map(|l| LeaseInfo {
            id,
            granted_ttl_s: l.granted_ttl_s,
            checkpoint_remaining_ms: l.checkpoint_remaining_ms,
            keys: l.keys.iter().cloned().collect(),
        })
    }

    /// All live leases, ordered by id.
    pub fn lease_ids(&self) -> Vec<LeaseId> {
        self.leases.keys().copied().collect()
    }

    /// Whether the lease exists (cheaper than `lease`, which copies its key list).
    pub fn lease_exists(&self, id: LeaseId) -> bool {
        self.leases.contains_key(&id)
    }
}
