//! Replica convergence.
//!
//! Raft's promise is that every replica applies the same log in the same order, so once
//! faults stop and the cluster quiesces all replicas must sit at the same applied index with
//! byte-identical state. A replica that applied an entry twice, skipped one, or restored a
//! bad snapshot shows up here even when no client ever read the damaged key.
//!
//! Two checks: [`check_convergence`] (the end state: one index, one hash) and
//! [`check_hash_agreement`] (any samples taken at the same index agree — divergence is
//! caught even while replicas are still at different indexes, as etcd's corruption check
//! does with `HashKV` at a common revision).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One replica's position and a hash of its state there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReplicaState {
    /// The replica (member id).
    pub replica: u64,
    /// Its last applied log index.
    pub applied_index: u64,
    /// A hash of its state machine at that index (e.g. `hash_kv`).
    pub state_hash: u64,
}

/// Why replicas have not converged. Groups list replica ids, so the odd one out is obvious.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConvergenceError {
    /// Nothing to compare: vacuous success would hide a broken harness.
    NoReplicas,
    /// The same replica appears twice in a convergence check.
    DuplicateReplica(u64),
    /// Replicas stopped at different applied indexes: `(index, replicas)` groups.
    IndexMismatch(Vec<(u64, Vec<u64>)>),
    /// Replicas at the same index have different state: `(hash, replicas)` groups.
    HashMismatch {
        /// The index where the hashes differ.
        index: u64,
        /// Replicas grouped by hash.
        groups: Vec<(u64, Vec<u64>)>,
    },
}

fn fmt_groups(f: &mut fmt::Formatter<'_>, what: &str, groups: &[(u64, Vec<u64>)]) -> fmt::Result {
    for (i, (k, rs)) in groups.iter().enumerate() {
        f.write_str(if i == 0 { "" } else { "; " })?;
        write!(f, "{what} {k:#x} on replicas {rs:?}")?;
    }
    Ok(())
}

impl fmt::Display for ConvergenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConvergenceError::NoReplicas => f.write_str("no replica states to compare"),
            ConvergenceError::DuplicateReplica(r) => write!(f, "replica {r} listed twice"),
            ConvergenceError::IndexMismatch(groups) => {
                f.write_str("replicas did not converge to one applied index: ")?;
                for (i, (k, rs)) in groups.iter().enumerate() {
                    f.write_str(if i == 0 { "" } else { "; " })?;
                    write!(f, "index {k} on replicas {rs:?}")?;
                }
                Ok(())
            }
            ConvergenceError::HashMismatch { index, groups } => {
                write!(f, "replicas diverged at applied index {index}: ")?;
                fmt_groups(f, "state hash", groups)
            }
        }
    }
}

impl std::error::Error for ConvergenceError {}

fn group(items: impl Iterator<Item = (u64, u64)>) -> Vec<(u64, Vec<u64>)> {
    let mut m: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (k, r) in items {
        m.entry(k).or_default().push(r);
    }
    m.into_iter()
        .map(|(k, mut rs)| {
            rs.sort_unstable();
            (k, rs)
        })
        .collect()
}

/// Checks the final state: every replica at the same applied index with the same hash.
/// Returns the common `(applied_index, state_hash)`.
///
/// A hash mismatch is reported only when the indexes agree; with different indexes the
/// hashes are expected to differ and the index mismatch is the finding.
pub fn check_convergence(replicas: &[ReplicaState]) -> Result<(u64, u64), ConvergenceError> {
    let first = replicas.first().ok_or(ConvergenceError::NoReplicas)?;
    let mut seen = std::collections::BTreeSet::new();
    for r in replicas {
        if !seen.insert(r.replica) {
            return Err(ConvergenceError::DuplicateReplica(r.replica));
        }
    }
    let by_index = group(replicas.iter().map(|r| (r.applied_index, r.replica)));
    if by_index.len() > 1 {
        return Err(ConvergenceError::IndexMismatch(by_index));
    }
    let by_hash = group(replicas.iter().map(|r| (r.state_hash, r.replica)));
    if by_hash.len() > 1 {
        return Err(ConvergenceError::HashMismatch {
            index: first.applied_index,
            groups: by_hash,
        });
    }
    Ok((first.applied_index, first.state_hash))
}

/// Checks that samples taken at the same applied index agree, whichever replicas and
/// whenever they were taken. Replicas may appear many times (one sample per index). Returns
/// the number of distinct indexes at which two or more samples were compared.
pub fn check_hash_agreement(samples: &[ReplicaState]) -> Result<usize, ConvergenceError> {
    if samples.is_empty() {
        return Err(ConvergenceError::NoReplicas);
    }
    let mut by_index: BTreeMap<u64, Vec<&ReplicaState>> = BTreeMap::new();
    for s in samples {
        by_index.entry(s.applied_index).or_default().push(s);
    }
    let mut compared = 0;
    for (index, ss) in by_index {
        if ss.len() < 2 {
            continue;
        }
        compared += 1;
        let groups = group(ss.iter().map(|s| (s.state_hash, s.replica)));
        if groups.len() > 1 {
            return Err(ConvergenceError::HashMismatch { index, groups });
        }
    }
    Ok(compared)
}
