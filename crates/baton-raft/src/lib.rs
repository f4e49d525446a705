//! # baton-raft
//!
//! One Baton replica: the Raft log (via `openraft`), the durable storage under it, and the
//! in-memory state that only a leader keeps (the lease clock). Everything the server needs
//! from a replica goes through [`Node`]; openraft's generics stay inside this crate.
//!
//! This file only declares the modules and re-exports the API. Codemap, from the bottom up
//! (a module uses only modules above it in this list; the tidy test `no_module_cycles`
//! keeps it so):
//! - storage: `wal` (the durable, checksummed Raft log with group commit and torn-tail
//!   recovery), `snapshot` (snapshot files), `files` (small atomic files: vote, member
//!   identity), `space` (the disk's free space and the backend quota), `sm` (the applied
//!   state — core state machine, watch hub, lease clock — as openraft's state machine),
//!   `lease` (the lease clock),
//!   `deletions` (one-shot key-deletion watches that wake lock waiters one at a time);
//! - data: `types` (openraft's type configuration, `Member`), `answer` (the API's answers
//!   and errors), `error` (why a start failed), `config` and `limits` (how a replica is
//!   started; its timeouts and bounds), `status`, `observe` (its monitoring counters, as
//!   data: `Node::metrics`), `cached_meters` (metric handles looked up once per call site,
//!   for the paths every request takes), `cluster` (`--initial-cluster` and the
//!   deterministic ids), `origin` (which commands a client may cause), `credential` (the
//!   cluster token's proof), `membership::change` (membership requests and answers);
//! - the peer protocol: `wire` (the bincode payloads of the `baton.raft.v1.Raft` service),
//!   `peer_meters` (traffic per peer, for etcd's `etcd_network_*`), `network` (its client),
//!   `pipe` (most peer calls over one long-lived stream per pair of members, both ends),
//!   `early_append` (a leader's appends sent to followers before its own fsync), `forward`
//!   (a follower's batching of what it forwards), `calls` (the operations only the leader
//!   serves, each typed with its answer);
//! - the replica's components: `replica` (the handles every component shares: Raft, applied
//!   state, log, proposer, transfer gate), `proposer` (batches proposals into entries),
//!   `transfer_gate`, `routing` (a leader-only call to wherever the leader is), `read_index`
//!   (shared ReadIndex rounds, leadership confirmation), `lease_duty` (keep-alives and expiry
//!   on the leader's clock), `disk_watch`, `ticker` (the periodic duties), `publish`,
//!   `membership` (changes; `plan`: etcd's checks as a pure function; `join`), `election`
//!   (the pre-vote timer), `transfer` (leader transfer);
//! - `restore`: a new data directory from a backup (`baton snapshot restore`); `force`:
//!   `--force-new-cluster`'s membership entry, written into the log before openraft starts;
//! - the top: `leader_service` (the leader's side of forwarded requests), `peer_server` (the
//!   peer service), `node` ([`Node`], the API), `start` ([`Node::start`]).
//!
//! # Followers
//! Only the leader proposes, keeps the lease clock and can confirm a read index. [`Node`]'s
//! methods therefore *route* (`routing`): on the leader they run locally; on a follower they
//! are sent to the leader and the answer is unpacked — batched with whatever else this
//! member is forwarding at the time (`forward`: one `ForwardBatch` call, one answer per
//! item), or alone in a `Forward` call for membership changes and publishing. A request
//! that certainly did not reach a leader (refused connection, the leader had just lost
//! leadership) is retried until `REQUEST_TIMEOUT`; a proposal that may have reached it is
//! never resent (it could be applied twice) and fails with [`ProposeError::LeaderFailed`].
//!
//! On disk, under `data_dir`: `member.meta` (identity), `raft/vote`, `raft/wal/*.wal`,
//! `member/snap/db` (the snapshot, in etcd's backend layout plus Baton's bucket; `snapshot`),
//! and in directories of older Batons (or fresh from a restore) `snap/<term>-<index>.snap`.

// First, so its macros are in scope in every module below (textual macro scope).
#[macro_use]
mod cached_meters;
mod answer;
mod calls;
mod cluster;
mod config;
mod credential;
mod deletions;
mod disk_watch;
mod early_acks;
mod early_append;
mod election;
mod env;
mod error;
mod fencing_duty;
mod files;
mod force;
mod forward;
#[cfg(test)]
mod golden;
mod leader_service;
mod lease;
mod lease_duty;
mod lease_verdict;
mod limits;
mod link;
mod membership;
mod network;
mod node;
mod observe;
mod origin;
mod peer_meters;
mod peer_server;
mod pipe;
mod proposer;
mod publish;
mod read_index;
mod replica;
mod restore;
mod routing;
mod sm;
mod snapshot;
mod space;
mod start;
mod status;
mod ticker;
mod transfer;
mod transfer_gate;
mod types;
mod value_file;
mod wal;
mod wire;

pub use crate::answer::{Halt, InternalError, KeepAlive, ProposeError, Proposed};
pub use crate::cluster::{
    cluster_id, etcd_member_id, parse_initial_cluster, ClusterConfig, ClusterConfigError,
    InitialClusterState, InitialMember,
};
pub use crate::config::{NodeConfig, TimingError, DEFAULT_LEASE_CHECKPOINT_INTERVAL};
pub use crate::deletions::KeyDeletion;
pub use crate::env::{
    DialFuture, Environment, ListenFuture, LogDisk, LogFile, PeerIncoming, PeerIo, PeerStream,
    PeerTransport, WallClock,
};
pub use crate::error::StartError;
pub use crate::link::{dial_plain, peer_host_port};
pub use crate::membership::change::{
    JoinError, MemberChanged, MemberError, MemberInfo, REMOVED_MESSAGE,
};
pub use crate::node::Node;
pub use crate::observe::{ApplyTally, ReplicaMetrics};
pub use crate::origin::{origin, LeaderDuty, Origin};
pub use crate::restore::{
    restore_data_dir, RestoreError, RestoreInto, Restored, RESTORED_LAST_APPLIED,
};
pub use crate::space::{
    DEFAULT_QUOTA_BACKEND_BYTES, DEFAULT_SPACE_RESERVE_BYTES, MAX_SUGGESTED_QUOTA_BACKEND_BYTES,
};
pub use crate::status::{NodeStatus, WalWritePaths};
pub use crate::transfer::TransferError;
