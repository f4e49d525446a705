//! The openraft type configuration. Everything generic over `TypeConfig` stays inside this
//! crate; the server only ever sees [`crate::Node`].

use std::io::Cursor;

use baton_core::{Applied, Command};
use serde::{Deserialize, Serialize};

/// What one Raft entry replicates: a batch of commands plus the leader's time stamp. Time is
/// data (DESIGN §3): replicas never read their own clock while applying.
///
/// Why a batch: openraft 0.9 waits for each append to be flushed before it appends the next
/// entry, so one entry per command would cost one fsync per command no matter how the log
/// store queues writes. Concurrent proposals are therefore gathered into one entry (see
/// `proposer`), and group commit happens there. Each command is applied to the core as its own
/// `baton_core::Entry`; the core's `CommandIndex` counts applied commands, not Raft entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) time_ms: u64,
    pub(crate) commands: Vec<Command>,
}

/// What applying an entry hands back to openraft, which passes it to the `client_write` caller.
///
/// openraft requires `R: Serialize + Deserialize` (feature `serde`) although it never
/// serializes responses itself; `Applied` is deliberately not serde (it is a local result).
/// Skipping the field keeps `Applied` out of any wire format: a response that crossed a wire
/// would arrive empty, and `propose` reports that as a storage error rather than guessing.
/// Carrying the result here (instead of a side table keyed by log index) means results of
/// entries nobody waits for (replays after restart, leader-proposed `ExpireLeases`) are
/// simply dropped with the reply: nothing to leak, no race between registering and applying.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Reply {
    /// One result per command of the entry, in order.
    #[serde(skip)]
    pub(crate) applied: Vec<Applied>,
}

/// What the membership records about each member (openraft's `Node`): enough for peers to
/// reach it and for `MemberList` to show it on every member.
///
/// `peer_urls` come from `--initial-cluster` when the cluster is created. `name` and
/// `client_urls` are *published* by the member itself once it runs (a membership entry that
/// updates only its own node, as etcd's `publish`): the member that initializes a cluster
/// knows its peers' peer URLs but not their client URLs. Until a member has published, its
/// `client_urls` are empty (etcdctl shows it as "unstarted").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// etcd's `--name`.
    pub name: String,
    /// Where peers reach this member's `baton.raft.v1.Raft` service.
    pub peer_urls: Vec<String>,
    /// Where clients reach this member's etcd API.
    pub client_urls: Vec<String>,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}(peers {:?}, clients {:?})",
            self.name, self.peer_urls, self.client_urls
        )
    }
}

openraft::declare_raft_types!(
    /// Baton's openraft types: node ids are member ids, nodes are [`Member`]s.
    pub(crate) TypeConfig:
        D = Request,
        R = Reply,
        NodeId = u64,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub(crate) type LogId = openraft::LogId<u64>;
pub(crate) type Vote = openraft::Vote<u64>;
pub(crate) type RaftEntry = openraft::Entry<TypeConfig>;
pub(crate) type Membership = openraft::StoredMembership<u64, Member>;
pub(crate) type SnapshotMeta = openraft::SnapshotMeta<u64, Member>;
pub(crate) type StorageError = openraft::StorageError<u64>;
pub(crate) type Raft = openraft::Raft<TypeConfig>;

/// A map keyed by member id. The ids are SHA-1-derived or random and every such map is
/// bounded by the membership, so rustc's FxHash (not keyed, a multiply per `u64`) is safe
/// here; std's SipHash bought resistance to chosen keys nobody can choose, at ~44 hashes
/// (~6k instructions, ~3 % of a leader's) per replicated put (callgrind, issue 19).
pub(crate) type MemberMap<V> = std::collections::HashMap<u64, V, rustc_hash::FxBuildHasher>;
