//! What travels inside `baton.raft.v1.PeerMessage.payload`: bincode, with one set of options
//! for both directions and a size limit so a corrupt or hostile length prefix cannot make the
//! decoder allocate without bound.
//!
//! openraft's own messages (append, vote, snapshot chunks) are encoded as openraft defines
//! them. Requests forwarded to the leader are [`LeaderRequest`] / [`LeaderResponse`]: one
//! each in a `Forward` call, or a `Vec` of each (same length, same order) in a `ForwardBatch`
//! call (see `forward`).

use baton_core::{Command, LeaseId, Response, Revision};
use bincode::Options;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::answer::{KeepAlive, ProposeError};
use crate::membership::change::{MemberChange, MemberChanged, MemberError};
use crate::types::Member;

/// Bound on one peer message (either direction), and the gRPC limit of the peer service.
/// Comfortably above the largest single Raft entry (a proposal batch is cut at 4 MiB, one
/// command is at most 1.5 MiB) and above a snapshot chunk (`SNAPSHOT_CHUNK_BYTES`); an
/// AppendEntries with several entries above it is split (openraft's `PayloadTooLarge`).
pub(crate) const MAX_PEER_MESSAGE_BYTES: usize = 16 << 20;

// The size chain, checked when this crate compiles: one request fits in a proposal batch
// (one Raft entry), and one batch, like one snapshot chunk, fits in a peer message, so an
// AppendEntries can always carry at least one entry (openraft's `PayloadTooLarge` splits
// between entries, never inside one). The chain's last link, peer message <= WAL record,
// is asserted next to `MAX_RECORD_BYTES` in wal/record.rs.
const _: () = assert!(baton_core::MAX_REQUEST_BYTES <= crate::proposer::MAX_BATCH_BYTES);
const _: () = assert!(crate::proposer::MAX_BATCH_BYTES <= MAX_PEER_MESSAGE_BYTES);
const _: () = assert!(SNAPSHOT_CHUNK_BYTES as usize <= MAX_PEER_MESSAGE_BYTES);

/// The format of every peer payload this binary sends and reads (the bincode encodings
/// pinned by `golden`; the rule is `baton_core::format`), carried in
/// `PeerMessage::format_version`. Bump it when a payload changes in a way another build
/// would misread; members of one cluster must then all run the new build.
pub(crate) const PEER_FORMAT_VERSION: u32 = 1;

/// The payload format an envelope announces. proto3 cannot tell an absent field from 0, and
/// binaries from before the field never set it: 0 is therefore their format, which is 1
/// (identical payloads), so a cluster can be upgraded member by member from them.
pub(crate) fn announced_format(field: u32) -> u32 {
    if field == 0 {
        1
    } else {
        field
    }
}

/// Metadata key of a format refusal: the refusing member's [`PEER_FORMAT_VERSION`], so the
/// sender can say which versions met (`network`).
pub(crate) const FORMAT_VERSION_METADATA: &str = "baton-peer-format-version";

/// Size of one InstallSnapshot chunk.
pub(crate) const SNAPSHOT_CHUNK_BYTES: u64 = 4 << 20;

fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_PEER_MESSAGE_BYTES as u64)
}

/// Why a payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// Above [`MAX_PEER_MESSAGE_BYTES`].
    #[error("peer message above {MAX_PEER_MESSAGE_BYTES} bytes")]
    TooLarge,
    #[error("undecodable peer message: {0}")]
    Invalid(String),
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    options().serialize(value).map_err(|e| match *e {
        bincode::ErrorKind::SizeLimit => WireError::TooLarge,
        other => WireError::Invalid(other.to_string()),
    })
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    options()
        .deserialize(bytes)
        .map_err(|e| WireError::Invalid(e.to_string()))
}

/// The encoding of a `Vec<T>` from the encodings of its elements (`ForwardBatch` sends
/// requests that were each encoded once when first forwarded, and may be resent). With
/// fixint encoding bincode writes a sequence as its length (u64, little-endian) followed by
/// the elements, so the receiver decodes the result as a plain `Vec<T>` (pinned by a test).
pub(crate) fn encode_concatenated<'a>(
    items: impl ExactSizeIterator<Item = &'a [u8]> + Clone,
) -> Vec<u8> {
    let len = items.len() as u64;
    let bytes: usize = items.clone().map(<[u8]>::len).sum();
    let mut out = Vec::with_capacity(8 + bytes);
    out.extend_from_slice(&len.to_le_bytes());
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

/// A request only the leader can serve, forwarded by a follower (one per `calls::LeaderCall`
/// type, which says how it is routed and what answers it). The peer service checks each
/// one's content before serving it (`peer_server::check_forwarded`, an exhaustive `match`: a
/// new variant must say what a peer may send in it).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum LeaderRequest {
    /// Replicate and apply a command (through the leader's proposer, batched with its own).
    Propose(Command),
    /// Confirm leadership with a quorum and return the index a linearizable read must wait
    /// for (ReadIndex; openraft's `get_read_log_id`).
    ReadIndex,
    /// Renew a lease on the leader's lease clock.
    KeepAlive(LeaseId),
    /// Remaining TTL of a lease on the leader's lease clock.
    TimeToLive(LeaseId),
    /// Record the sender's name and client URLs in the membership (its peer URLs are kept).
    Publish { id: u64, member: Member },
    /// Before a lock grant: confirm leadership (ReadIndex), then say whether the lease is
    /// alive on the leader's lease clock.
    GrantCheck(LeaseId),
    /// A membership change (etcd's MemberAdd/Remove/Update/Promote), checked and made by the
    /// leader.
    ChangeMembers(MemberChange),
}

/// [`LeaderRequest`] borrowed, for sending: the same variants in the same order, so it
/// encodes to the same bytes (bincode writes a reference as the value; pinned by
/// `calls::tests`). A proposal is encoded straight from the caller's command, never copied.
#[derive(Debug, Serialize)]
pub(crate) enum LeaderRequestRef<'a> {
    Propose(&'a Command),
    ReadIndex,
    KeepAlive(LeaseId),
    TimeToLive(LeaseId),
    Publish { id: u64, member: &'a Member },
    GrantCheck(LeaseId),
    ChangeMembers(&'a MemberChange),
}

/// The leader's answer. Each request kind has its own variant; `Failed` carries the leader's
/// own error (e.g. `NotLeader` if it lost leadership, which means nothing was done).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum LeaderResponse {
    Proposed(ForwardedProposal),
    ReadIndex(u64),
    KeepAlive(KeepAlive),
    TimeToLive(Option<i64>),
    Published,
    GrantCheck {
        read_index: u64,
        lease_alive: bool,
    },
    /// The outcome of `ChangeMembers`: refusals that are not about leadership (unknown
    /// member, not enough started members, …) travel here; `NotLeader` and the like come as
    /// `Failed` so the follower retries.
    MembersChanged(Result<MemberChanged, MemberError>),
    Failed(ProposeError),
}

/// A proposal's outcome as the leader saw it. `Applied::events` are not sent: the follower
/// publishes the same events to its own watchers when it applies the entry.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ForwardedProposal {
    pub(crate) revision: Revision,
    pub(crate) response: Response,
    pub(crate) raft_term: u64,
    /// The Raft index of the entry; the follower waits until it has applied it, so a client
    /// reads its own write on the member it wrote through (as with etcd).
    pub(crate) raft_index: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::KeyValue;

    #[test]
    fn forwarded_proposal_roundtrips() {
        let p = ForwardedProposal {
            revision: Revision(7),
            response: Response::LockEnqueue {
                kv: KeyValue {
                    key: b"k".to_vec(),
                    ..Default::default()
                },
                created: true,
            },
            raft_term: 3,
            raft_index: 42,
        };
        let bytes = encode(&LeaderResponse::Proposed(p)).unwrap();
        match decode::<LeaderResponse>(&bytes).unwrap() {
            LeaderResponse::Proposed(q) => {
                assert_eq!(q.revision, Revision(7));
                assert_eq!(q.raft_index, 42);
                assert!(matches!(
                    q.response,
                    Response::LockEnqueue { created: true, .. }
                ));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn concatenated_encodings_decode_as_a_vec() {
        let reqs = [
            LeaderRequest::ReadIndex,
            LeaderRequest::KeepAlive(LeaseId(5)),
            LeaderRequest::Propose(Command::LeaseRevoke { id: LeaseId(9) }),
        ];
        let each: Vec<Vec<u8>> = reqs.iter().map(|r| encode(r).unwrap()).collect();
        let joined = encode_concatenated(each.iter().map(Vec::as_slice));
        assert_eq!(joined, encode(&reqs.as_slice()).unwrap());
        let back: Vec<LeaderRequest> = decode(&joined).unwrap();
        assert!(matches!(
            back.as_slice(),
            [
                LeaderRequest::ReadIndex,
                LeaderRequest::KeepAlive(LeaseId(5)),
                LeaderRequest::Propose(Command::LeaseRevoke { id: LeaseId(9) })
            ]
        ));
        let empty: Vec<LeaderRequest> = decode(&encode_concatenated([].iter().copied())).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn size_limit_is_enforced_both_ways() {
        let big = vec![0u8; MAX_PEER_MESSAGE_BYTES + 1];
        assert!(matches!(encode(&big), Err(WireError::TooLarge)));
        // A length prefix claiming more than the limit is refused without allocating it.
        let lie = (u64::MAX / 2).to_le_bytes();
        assert!(decode::<Vec<u8>>(&lie).is_err());
    }
}
