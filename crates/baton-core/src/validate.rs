//! Stateless request checks, the same ones etcd's gRPC layer runs before proposing
//! (`checkPutRequest`, `checkTxnRequest`, `checkIntervals` in `v3rpc/key.go`).
//!
//! They live in the core rather than the server because `apply` must repeat them: the log may
//! hold entries proposed by an older or buggy server, and a txn that modifies one key twice
//! would break the store's "one change per key per revision" invariant.

use std::collections::BTreeSet;

use crate::command::{
    Command, DeleteRangeRequest, KvError, PutRequest, RequestOp, TxnRequest, MAX_LEASE_TTL_S,
    MAX_TXN_OPS,
};
use crate::locks::{MAX_LOCK_DELAY_MS, MAX_REASON_BYTES};
use crate::types::KeyRange;

pub(crate) fn validate(cmd: &Command) -> Result<(), KvError> {
    match cmd {
        Command::Noop
        | Command::Compact { .. }
        | Command::LeaseRevoke { .. }
        | Command::ExpireLeases { .. }
        | Command::ExpireLeasesInTerm { .. }
        | Command::LeaseCheckpoint { .. } => Ok(()),
        Command::Put(p) => check_put(p),
        Command::DeleteRange(d) => check_delete(d),
        Command::Txn(t) => check_txn_top(t),
        Command::LeaseGrant { ttl_s, .. } => {
            if *ttl_s > MAX_LEASE_TTL_S {
                Err(KvError::LeaseTtlTooLarge)
            } else {
                Ok(())
            }
        }
        Command::LockEnqueue {
            name,
            lease,
            delay_ms,
            ..
        } => {
            if name.is_empty() {
                return Err(KvError::EmptyLockName);
            }
            if lease.is_none() {
                return Err(KvError::LeaseRequired);
            }
            if delay_ms.is_some_and(|d| d > MAX_LOCK_DELAY_MS) {
                return Err(KvError::LockDelayTooLong);
            }
            Ok(())
        }
        Command::LockForceRelease {
            name,
            token,
            reason,
        } => {
            if name.is_empty() {
                return Err(KvError::EmptyLockName);
            }
            if reason.trim().is_empty() {
                return Err(KvError::ReasonRequired);
            }
            if reason.len() > MAX_REASON_BYTES {
                return Err(KvError::ReasonTooLong);
            }
            if token.0 < 0 {
                return Err(KvError::InvalidFencingToken);
            }
            Ok(())
        }
        Command::FenceCheck { resource, token } => {
            if resource.is_empty() {
                return Err(KvError::EmptyFenceResource);
            }
            if token.0 <= 0 {
                return Err(KvError::InvalidFencingToken);
            }
            Ok(())
        }
        Command::RegisterClient { .. }
        | Command::UnregisterClient { .. }
        | Command::Alarm { .. }
        | Command::FencingKey { .. }
        | Command::Auth(_) => Ok(()),
        Command::Authorized { command, .. } => match **command {
            Command::Authorized { .. } => Err(KvError::MisplacedAuthorized),
            _ => validate(command),
        },
        Command::Deduplicated {
            sequence, command, ..
        } => {
            if *sequence == 0 {
                return Err(KvError::InvalidSequence);
            }
            match **command {
                Command::Put(_)
                | Command::DeleteRange(_)
                | Command::Txn(_)
                | Command::FenceCheck { .. } => validate(command),
                _ => Err(KvError::NotDeduplicable),
            }
        }
    }
}

fn check_key(key: &[u8]) -> Result<(), KvError> {
    if key.is_empty() {
        Err(KvError::EmptyKey)
    } else {
        Ok(())
    }
}

pub(crate) fn check_put(p: &PutRequest) -> Result<(), KvError> {
    check_key(&p.key)
}

pub(crate) fn check_delete(d: &DeleteRangeRequest) -> Result<(), KvError> {
    check_key(&d.range.key)
}

/// etcd's `Txn` handler: size and key checks first (cheap, linear), then the overlap check on
/// each top-level branch.
pub(crate) fn check_txn_top(t: &TxnRequest) -> Result<(), KvError> {
    check_txn(t, MAX_TXN_OPS)?;
    check_intervals(&t.success)?;
    check_intervals(&t.failure)?;
    Ok(())
}

/// etcd's `checkTxnRequest`: the largest of the compare, success and failure lists must fit
/// in `max_ops`, and a nested txn gets only what this level left over (`max_ops - opc`), so a
/// deeply nested txn cannot multiply the budget.
fn check_txn(t: &TxnRequest, max_ops: usize) -> Result<(), KvError> {
    let opc = t.compare.len().max(t.success.len()).max(t.failure.len());
    if opc > max_ops {
        return Err(KvError::TooManyOps);
    }
    for c in &t.compare {
        check_key(&c.range.key)?;
    }
    for op in t.success.iter().chain(&t.failure) {
        match op {
            RequestOp::Range(r) => check_key(&r.range.key)?,
            RequestOp::Put(p) => check_put(p)?,
            RequestOp::DeleteRange(d) => check_delete(d)?,
            RequestOp::Txn(nested) => check_txn(nested, max_ops - opc)?,
        }
    }
    Ok(())
}

/// The puts and delete ranges a branch may perform (over all paths through its nested txns).
struct Intervals<'a> {
    puts: BTreeSet<&'a [u8]>,
    dels: Vec<&'a KeyRange>,
}

fn deleted_by(dels: &[&KeyRange], key: &[u8]) -> bool {
    dels.iter().any(|r| r.contains(key))
}

/// etcd's `checkIntervals`: within one branch (including the branches of nested txns it can
/// run), no key may be put twice and no put may fall inside a delete range. Deletes may
/// overlap each other (the second finds nothing). The then/else branches of one nested txn
/// are mutually exclusive, so a key put in both is fine, and each branch was checked on its
/// own by the recursive call.
///
/// Deliberate differences from etcd 3.5, both making the check stricter, because one revision
/// must change a key at most once for history and watch events to be unambiguous (etcd can
/// store two changes of a key at sub-revisions of one revision; our store cannot):
/// - etcd checks a nested txn's puts only against the deletes of the nested txns *before* it,
///   so `txn{put a}; txn{delete a}` passes there and changes `a` twice. We check every nested
///   txn against all its siblings.
/// - etcd builds its interval tree from the raw `range_end`, so a from-key delete
///   (`range_end = "\0"`) overlaps nothing there. We use the real range semantics.
fn check_intervals(ops: &[RequestOp]) -> Result<Intervals<'_>, KvError> {
    let level_dels: Vec<&KeyRange> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(d) => Some(&d.range),
            _ => None,
        })
        .collect();
    // Each nested txn's possible puts and deletes, over both of its branches.
    let mut children: Vec<Intervals<'_>> = Vec::new();
    for op in ops {
        let RequestOp::Txn(nested) = op else {
            continue;
        };
        let then = check_intervals(&nested.success)?;
        let els = check_intervals(&nested.failure)?;
        let mut puts = then.puts;
        puts.extend(els.puts);
        let mut dels = then.dels;
        dels.extend(els.dels);
        children.push(Intervals { puts, dels });
    }
    let mut iv = Intervals {
        puts: BTreeSet::new(),
        dels: level_dels,
    };
    for (i, child) in children.iter().enumerate() {
        for &k in &child.puts {
            let hit_sibling_delete = children
                .iter()
                .enumerate()
                .any(|(j, other)| j != i && deleted_by(&other.dels, k));
            if !iv.puts.insert(k) || deleted_by(&iv.dels, k) || hit_sibling_delete {
                return Err(KvError::DuplicateKey);
            }
        }
    }
    for child in &children {
        iv.dels.extend(child.dels.iter().copied());
    }
    for op in ops {
        let RequestOp::Put(p) = op else {
            continue;
        };
        let k = p.key.as_slice();
        if !iv.puts.insert(k) || deleted_by(&iv.dels, k) {
            return Err(KvError::DuplicateKey);
        }
    }
    Ok(iv)
}
