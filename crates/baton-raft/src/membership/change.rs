//! The data of membership: what a change asks ([`MemberChange`]) and answers
//! ([`MemberChanged`], [`MemberError`]), what a joiner asks and is told, and how members are
//! shown ([`MemberInfo`]). Below everything that sends or serves them (`wire`, `network`,
//! the peer service), which is why it is apart from the code that makes changes.

use std::collections::BTreeSet;

use openraft::Membership;
use serde::{Deserialize, Serialize};

use crate::answer::ProposeError;
use crate::config::NodeConfig;
use crate::credential::ClusterCredential;
use crate::types::Member;

/// etcd's words for a member that was removed (`ErrMemberRemoved` in its peer transport);
/// also the marker a leader sends such a member.
pub const REMOVED_MESSAGE: &str = "the member has been permanently removed from the cluster";

/// A member as shown by `MemberList`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
}

/// Why a membership change was refused. Each variant is one of etcd's errors (the server
/// maps them to etcd's codes and messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MemberError {
    /// No member with that id (etcd: "member not found").
    #[error("member not found")]
    NotFound,
    /// Another member already has one of the peer URLs.
    #[error("peer URLs already exist")]
    PeerUrlsExist,
    /// A peer URL is not `http(s)://host:port`.
    #[error("given member URLs are invalid")]
    BadUrls,
    /// Promote of a member that is a voter already.
    #[error("can only promote a learner member")]
    NotLearner,
    /// Promote of a learner whose log is not (nearly) the leader's.
    #[error("learner is not in sync with the leader")]
    LearnerNotReady,
    /// etcd allows one learner at a time.
    #[error("too many learner members in cluster")]
    TooManyLearners,
    /// The change would leave fewer active voters than a quorum.
    #[error("not enough started members")]
    NotEnoughStarted,
    /// A voter of the current configuration is not active: etcd refuses to add voters then.
    #[error("unhealthy cluster")]
    Unhealthy,
    /// This member runs without `--initial-cluster` (no peer listener): nobody could reach
    /// it, so it cannot have peers.
    #[error("this member was started without --initial-cluster and has no peer service")]
    NotClustered,
    /// Leadership, timeouts, storage: as for proposals.
    #[error(transparent)]
    Propose(#[from] ProposeError),
}

/// A membership change, as forwarded to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum MemberChange {
    Add {
        peer_urls: Vec<String>,
        is_learner: bool,
    },
    Remove {
        id: u64,
    },
    Update {
        id: u64,
        peer_urls: Vec<String>,
    },
    Promote {
        id: u64,
    },
}

/// The membership after a change (what etcd's responses list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberChanged {
    /// The member added by `MemberAdd` (its id is new; the joiner finds it by peer URLs).
    pub added: Option<MemberInfo>,
    /// Every member after the change, by id.
    pub members: Vec<MemberInfo>,
    /// The Raft index of the (last) configuration entry: a follower that forwarded the
    /// change waits until it has applied it, so its own `MemberList` shows the change.
    pub raft_index: u64,
}

/// Why a member could not join an existing cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    #[error(
        "--initial-cluster-state existing: no other member listed in --initial-cluster \
         answered ({0})"
    )]
    NoPeerAnswered(String),
    #[error(
        "--initial-cluster-state existing: the cluster has no member with peer URLs {0:?}; \
         add it first (etcdctl member add NAME --peer-urls=...)"
    )]
    NotAMember(Vec<String>),
    #[error(
        "member {id:x} has already been bootstrapped (it ran before and has lost its data \
         directory); remove it and add it again"
    )]
    AlreadyBootstrapped { id: u64 },
    /// Every listed member that answered refused to tell the membership: the token differs
    /// and `member add` did not admit this member (each refusal says why, `admission`).
    #[error(
        "--initial-cluster-token: the listed members refused to tell this member the \
         membership ({0}); start it with the cluster's token"
    )]
    TokenRefused(String),
    /// A member admitted this member by `member add` but the credential it handed over is
    /// not one (not 32 bytes): a member of another build, or a corrupted answer.
    #[error("the cluster credential a member answered with is malformed (not 32 bytes)")]
    MalformedCredential,
}

/// Asked by a joining member: its advertised peer URLs, and proof that it was given the
/// cluster token. (Before issue 14 it carried the URLs only and anyone was answered; every
/// member runs the same build, so the format changed with no version of its own.)
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct JoinRequest {
    pub(crate) peer_urls: Vec<String>,
    pub(crate) credential: ClusterCredential,
}

/// Where the sender of a peer message stands (`Members::sender_standing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SenderStanding {
    /// In this member's membership (voter or learner).
    Member,
    /// Not in the leader's membership: removed (or never added).
    Removed,
    /// Not in this follower's membership; it may just not know yet.
    Unknown,
}

/// The answer: the membership the asked member knows (the cluster id is in the envelope).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct JoinResponse {
    pub(crate) members: Vec<(u64, Member)>,
    pub(crate) voters: Vec<u64>,
}

/// `MemberInfo`s of a membership; `me` is shown as configured now (as `Node::members`).
pub(crate) fn member_infos(
    membership: &Membership<u64, Member>,
    me: u64,
    config: &NodeConfig,
) -> Vec<MemberInfo> {
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| {
            let node = if *id == me {
                Member {
                    name: config.name.clone(),
                    peer_urls: node.peer_urls.clone(),
                    client_urls: config.client_urls.clone(),
                }
            } else {
                node.clone()
            };
            MemberInfo {
                id: *id,
                name: node.name,
                peer_urls: node.peer_urls,
                client_urls: node.client_urls,
                is_learner: !voters.contains(id),
            }
        })
        .collect()
}
