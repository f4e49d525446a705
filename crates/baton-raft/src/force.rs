//! `--force-new-cluster` (etcd's flag): a member whose cluster lost its quorum for good
//! restarts, with its data, as the only voter of its cluster.
//!
//! openraft 0.9 has no API for this: a membership change needs a quorum of the old
//! configuration. So, as etcd's `restartAsStandaloneNode` does to its WAL, the change is
//! written into the log *before* openraft reads it: one ordinary membership entry, appended
//! after the last entry through the log store (checksummed, fsynced as every append), whose
//! configuration is this member alone, and a vote for a term above every term in the log
//! (an entry's leader must not be older than the entry before it). openraft then starts
//! with that entry as the effective membership (the newest one in the log, as always), sees
//! a sole voter, and `start::bootstrap` elects it; the new leader's first entry commits the
//! forced configuration and everything before it.
//!
//! One deliberate difference from etcd: etcd discards the entries after its persisted
//! commit index first. Baton persists openraft's committed id lazily (`wal/store.rs`,
//! `unwritten_committed`: it rides on the next record), so a leader's last acknowledged
//! entries can lie after the persisted commit index; discarding them would lose
//! acknowledged writes. The whole log is kept instead, exactly as a newly elected Raft
//! leader's log is kept: entries after the last known commit were at worst never
//! acknowledged (a client saw a timeout, which etcd's API allows to have applied).
//!
//! The other members are gone from the configuration: a leader answers a non-member's vote
//! or forwarded request with etcd's "the member has been permanently removed from the
//! cluster", so a member of the old cluster that comes back stops instead of rejoining
//! with stale state. The cluster id and this member's id are unchanged.

use std::collections::{BTreeMap, BTreeSet};

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader};

use crate::error::StartError;
use crate::types::{LogId, Member, Membership, RaftEntry, Vote};
use crate::wal::LogStore;

/// What forcing changed, for the log line.
#[derive(Debug)]
pub(crate) struct Forced {
    /// The members of the previous configuration other than this one.
    pub(crate) removed: Vec<u64>,
    /// The forced membership entry.
    pub(crate) log_id: LogId,
}

fn storage(e: impl std::fmt::Display) -> StartError {
    StartError::Raft(format!("--force-new-cluster: {e}"))
}

/// Rewrites the log so that openraft starts with `me` as the only voter (see the module
/// docs). `applied` is the applied state's last log id and membership (from the snapshot).
pub(crate) async fn make_standalone(
    log: &mut LogStore,
    applied: Option<LogId>,
    applied_membership: &Membership,
    me: u64,
    own: Member,
) -> Result<Forced, StartError> {
    let state = log.get_log_state().await.map_err(storage)?;
    let mut last = state.last_log_id;
    // A snapshot ahead of the log (a restored directory has no log at all): openraft purges
    // up to it at start; do it first so that the entry appended here follows the snapshot.
    if last < applied {
        let applied = applied.expect("greater than some log id");
        log.purge(applied).await.map_err(storage)?;
        last = Some(applied);
    }
    let Some(last) = last else {
        return Err(StartError::ForceNewClusterWithoutData);
    };
    // The configuration being replaced: the newest membership entry after the snapshot, else
    // the snapshot's.
    let from = applied
        .map_or(0, |l| l.index + 1)
        .max(state.last_purged_log_id.map_or(0, |l| l.index + 1));
    let entries = log
        .try_get_log_entries(from..=last.index)
        .await
        .map_err(storage)?;
    let previous = entries
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            EntryPayload::Membership(m) => Some(m.clone()),
            _ => None,
        })
        .unwrap_or_else(|| applied_membership.membership().clone());
    let removed = previous
        .nodes()
        .map(|(id, _)| *id)
        .filter(|id| *id != me)
        .collect();

    let vote = log.read_vote().await.map_err(storage)?;
    let term = vote
        .map_or(0, |v| v.leader_id.term)
        .max(last.leader_id.term)
        + 1;
    let log_id = LogId::new(CommittedLeaderId::new(term, me), last.index + 1);
    let membership =
        openraft::Membership::new(vec![BTreeSet::from([me])], BTreeMap::from([(me, own)]));
    log.append_before_start(RaftEntry {
        log_id,
        payload: EntryPayload::Membership(membership),
    })
    .map_err(storage)?;
    // The writer makes the append durable before it writes the vote (`wal/writer.rs`), so
    // once this returns both are on disk. A crash before it leaves at most the entry: its
    // configuration is then the log's newest, and the next start is standalone all the same.
    log.save_vote(&Vote::new(term, me)).await.map_err(storage)?;
    Ok(Forced { removed, log_id })
}
