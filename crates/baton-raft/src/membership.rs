//! Membership changes (etcd's `MemberAdd`, `MemberRemove`, `MemberUpdate`, `MemberPromote`),
//! joining an existing cluster with an empty data directory, and noticing that this member
//! was removed.
//!
//! # Changes
//! A change is checked and made by the leader (a follower forwards it as
//! `LeaderRequest::ChangeMembers`, never retried once it may have arrived: a second MemberAdd
//! would add a second member). The checks are etcd's `--strict-reconfig-check` (on by
//! default in etcd): a change that would leave fewer *active* voters than a quorum is
//! refused with "re-configuration failed due to not enough started members". "Active" is
//! etcd's transport view: the peer answered one of the leader's calls within the election
//! timeout (the leader heartbeats every member, learners included). Voters are added and
//! removed with openraft's joint consensus (`change_membership`); learners with
//! `AddNodes`/`RemoveNodes`, so they receive the log and snapshots but never vote.
//!
//! # Joining
//! A member started with `--initial-cluster-state existing` on an empty data directory asks
//! the other members listed in `--initial-cluster` for the membership (the `Members` peer
//! method), finds itself by its advertised peer URLs (as etcd does), adopts the member id and
//! cluster id from the answer, persists them and waits to be contacted: the leader has been
//! trying to replicate to it since `MemberAdd` and catches it up by log or snapshot. The
//! question carries a [`ClusterCredential`] of the joiner's `--initial-cluster-token`; a member
//! answers only its own token's (the membership names every id and peer URL a forger of
//! peer messages would need).
//!
//! # Removal
//! A member learns it was removed either by applying the configuration without it, or,
//! having missed that (it was down, or the leader stopped replicating to it first), from the
//! leader, which answers votes and forwarded requests of non-members with
//! [`REMOVED_MESSAGE`]. [`crate::Node::removed`] then resolves; the embedder stops serving.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, Membership, ServerState};
use serde::{Deserialize, Serialize};

use crate::files::{self, MemberMeta};
use crate::network::AskError;
use crate::types::Member;
use crate::wire::{self, LeaderRequest, LeaderResponse};
use crate::{
    io_error, leader_error, unexpected_answer, Inner, MemberInfo, Node, NodeConfig, ProposeError,
    Routed, StartError, REQUEST_TIMEOUT,
};

/// etcd's words for a member that was removed (`ErrMemberRemoved` in its peer transport);
/// also the marker a leader sends such a member.
pub const REMOVED_MESSAGE: &str = "the member has been permanently removed from the cluster";

/// etcd's limit on learners (`maxLearners` in etcd 3.4): one at a time.
const MAX_LEARNERS: usize = 1;

/// etcd promotes a learner only once its log has reached 90 % of the leader's.
const LEARNER_READY_PERCENT: f64 = 0.9;

/// How long a change waits for another change (a member publishing itself, a concurrent
/// MemberAdd) to finish before giving up with a timeout.
const IN_PROGRESS_RETRY: Duration = Duration::from_millis(50);

/// How long a joining member keeps asking the listed peers for the membership.
const JOIN_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Every listed member that answered refused to tell the membership: the token differs.
    #[error(
        "--initial-cluster-token: the listed members refused to tell this member the \
         membership ({0}); start it with the cluster's token"
    )]
    TokenRefused(String),
}

/// What a checked change does in openraft's terms: the change, whether removed voters stay
/// as learners (`retain`), and the id of an added member.
type Plan = (ChangeMembers<u64, Member>, bool, Option<u64>);

/// Asked by a joining member: its advertised peer URLs, and proof that it was given the
/// cluster token. (Before issue 14 it carried the URLs only and anyone was answered; every
/// member runs the same build, so the format changed with no version of its own.)
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct JoinRequest {
    pub(crate) peer_urls: Vec<String>,
    pub(crate) credential: ClusterCredential,
}

/// What a member (on every peer request, in the envelope) and a joiner (to `Members`) show
/// for `--initial-cluster-token`: SHA-256 of the token under a domain tag, compared by the
/// receiver with the digest of its own token. A digest rather than
/// the token, so a captured request does not hand out the token itself (it also seeds the
/// member and cluster ids, and an operator may reuse it); a captured digest can still be
/// replayed to `Members` until peer TLS (a later issue) protects the connection — which is
/// also what a challenge-response would have needed, for one more round trip.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ClusterCredential([u8; 32]);

impl ClusterCredential {
    pub(crate) fn of_token(token: &str) -> ClusterCredential {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"baton-join-credential-v1\0");
        h.update(token.as_bytes());
        ClusterCredential(h.finalize().into())
    }

    /// Constant-time, so how long a refusal takes says nothing about how close a guess was.
    pub(crate) fn matches(&self, other: &ClusterCredential) -> bool {
        self.matches_bytes(&other.0)
    }

    /// [`ClusterCredential::matches`] against an envelope's bytes (any length: a wrong
    /// length never matches).
    pub(crate) fn matches_bytes(&self, other: &[u8]) -> bool {
        other.len() == self.0.len()
            && self
                .0
                .iter()
                .zip(other.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// The bytes sent in a `PeerMessage`'s `credential`.
    pub(crate) fn to_vec(self) -> Vec<u8> {
        self.0.to_vec()
    }
}

impl std::fmt::Debug for ClusterCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterCredential(..)")
    }
}

/// [`Inner::sender_standing`].
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

fn normalize(urls: &[String]) -> BTreeSet<String> {
    urls.iter()
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .collect()
}

/// etcd's peer URL rules: `http` or `https`, `host:port`, no path.
fn valid_peer_url(url: &str) -> bool {
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return false;
    };
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return false;
    }
    match rest.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
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

impl Node {
    /// etcd's `MemberAdd`: adds a member with `peer_urls` (a learner if `is_learner`) under a
    /// fresh id. The member then starts with `--initial-cluster-state existing` and an empty
    /// data directory. Made by the leader (forwarded from a follower).
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<MemberChanged, MemberError> {
        self.inner
            .change_members(MemberChange::Add {
                peer_urls,
                is_learner,
            })
            .await
    }

    /// etcd's `MemberRemove`. Removing the leader works: it steps down once the configuration
    /// without it is committed, and the others elect a new leader.
    pub async fn member_remove(&self, id: u64) -> Result<MemberChanged, MemberError> {
        self.inner.change_members(MemberChange::Remove { id }).await
    }

    /// etcd's `MemberUpdate`: new peer URLs for a member (name and client URLs are kept).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<MemberChanged, MemberError> {
        self.inner
            .change_members(MemberChange::Update { id, peer_urls })
            .await
    }

    /// etcd's `MemberPromote`: makes a learner that has caught up a voter.
    pub async fn member_promote(&self, id: u64) -> Result<MemberChanged, MemberError> {
        self.inner
            .change_members(MemberChange::Promote { id })
            .await
    }

    /// Whether this member is a learner (receives the log, does not vote).
    pub fn is_learner(&self) -> bool {
        let inner = &self.inner;
        let m = inner.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        membership.get_node(&inner.member_id).is_some()
            && !membership.voter_ids().any(|v| v == inner.member_id)
    }

    /// Resolves once this member knows it was removed from the cluster (it applied a
    /// configuration without it, or the leader refused it as a non-member). The replica
    /// takes no further part in elections; the embedder should stop serving, as etcd does.
    pub async fn removed(&self) {
        let mut rx = self.inner.peers.removed();
        // An error means the sender is gone (the replica was dropped): never removed then.
        if rx.wait_for(|removed| *removed).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Inner {
    /// Routes a change to the leader and unpacks its answer.
    async fn change_members(
        self: &Arc<Self>,
        change: MemberChange,
    ) -> Result<MemberChanged, MemberError> {
        if self.initial.is_none() {
            return Err(MemberError::NotClustered);
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self
            .route(LeaderRequest::ChangeMembers(change), deadline)
            .await?
        {
            Routed::Local(LeaderRequest::ChangeMembers(change)) => {
                self.change_members_local(change, deadline).await
            }
            Routed::Local(_) => unreachable!("route hands back the request it was given"),
            Routed::Remote(LeaderResponse::MembersChanged(res)) => {
                if let Ok(changed) = &res {
                    // Committed: a slow local apply only delays visibility.
                    let _ = self.wait_applied(changed.raft_index, deadline).await;
                }
                res
            }
            Routed::Remote(other) => Err(unexpected_answer(other).into()),
        }
    }

    /// Whether `peer` is active: it answered this member's calls within the election
    /// timeout (this member itself always is).
    pub(crate) fn active(&self, peer: u64) -> bool {
        peer == self.member_id || self.peers.active_within(peer, self.config.election_timeout)
    }

    /// The leader's half of a membership change: etcd's checks, then openraft's
    /// `change_membership`; waits (until `deadline`) while another change is in progress.
    pub(crate) async fn change_members_local(
        &self,
        change: MemberChange,
        deadline: Instant,
    ) -> Result<MemberChanged, MemberError> {
        self.check_running()?;
        self.wait_transfer(deadline).await;
        loop {
            let (membership, matched, last_log) = {
                let m = self.raft.metrics();
                let m = m.borrow();
                if m.state != ServerState::Leader {
                    let leader = m.current_leader.filter(|l| *l != self.member_id);
                    return Err(leader_error(leader).into());
                }
                let matched: BTreeMap<u64, u64> = m
                    .replication
                    .iter()
                    .flatten()
                    .map(|(id, log)| (*id, log.map_or(0, |l| l.index)))
                    .collect();
                (
                    m.membership_config.membership().clone(),
                    matched,
                    m.last_log_index.unwrap_or(0),
                )
            };
            let (changes, retain, added) = self.plan(&change, &membership, &matched, last_log)?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let res =
                tokio::time::timeout(remaining, self.raft.change_membership(changes, retain)).await;
            match res {
                Err(_) => return Err(ProposeError::Timeout.into()),
                Ok(Ok(resp)) => {
                    let after = resp.membership.unwrap_or(membership);
                    let members = member_infos(&after, self.member_id, &self.config);
                    let added = added.and_then(|id| members.iter().find(|m| m.id == id).cloned());
                    return Ok(MemberChanged {
                        added,
                        members,
                        raft_index: resp.log_id.index,
                    });
                }
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                    return Err(leader_error(f.leader_id).into())
                }
                Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => match e
                {
                    ChangeMembershipError::InProgress(_) => {
                        if Instant::now() + IN_PROGRESS_RETRY >= deadline {
                            return Err(ProposeError::Timeout.into());
                        }
                        tokio::time::sleep(IN_PROGRESS_RETRY).await;
                    }
                    ChangeMembershipError::LearnerNotFound(_) => return Err(MemberError::NotFound),
                    ChangeMembershipError::EmptyMembership(_) => {
                        return Err(MemberError::NotEnoughStarted)
                    }
                },
                Ok(Err(RaftError::Fatal(f))) => return Err(self.fatal_error(&f).into()),
            }
        }
    }

    /// etcd's checks of a change against the current membership; on success openraft's
    /// change, whether to keep removed voters as learners, and the id of an added member.
    fn plan(
        &self,
        change: &MemberChange,
        membership: &Membership<u64, Member>,
        matched: &BTreeMap<u64, u64>,
        last_log: u64,
    ) -> Result<Plan, MemberError> {
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let quorum = |n: usize| n / 2 + 1;
        let active_voters = voters.iter().filter(|v| self.active(**v)).count();
        let url_taken = |urls: &[String], except: Option<u64>| {
            let wanted = normalize(urls);
            membership.nodes().any(|(id, node)| {
                Some(*id) != except && !normalize(&node.peer_urls).is_disjoint(&wanted)
            })
        };
        let check_urls = |urls: &[String]| {
            if urls.is_empty() || !urls.iter().all(|u| valid_peer_url(u.trim())) {
                return Err(MemberError::BadUrls);
            }
            Ok(())
        };
        match change {
            MemberChange::Add {
                peer_urls,
                is_learner,
            } => {
                check_urls(peer_urls)?;
                if url_taken(peer_urls, None) {
                    return Err(MemberError::PeerUrlsExist);
                }
                if *is_learner {
                    let learners = membership.nodes().count() - voters.len();
                    if learners >= MAX_LEARNERS {
                        return Err(MemberError::TooManyLearners);
                    }
                } else {
                    // etcd's IsReadyToAddVotingMember (growing a lone member to two is fine)
                    // and its "connected to every voter" check.
                    let after = voters.len() + 1;
                    let lone_to_two = active_voters == 1 && after == 2;
                    if !lone_to_two && active_voters < quorum(after) {
                        return Err(MemberError::NotEnoughStarted);
                    }
                    if active_voters < voters.len() {
                        return Err(MemberError::Unhealthy);
                    }
                }
                // The replica's randomness (`Environment::rng`), so a seeded one is replayable.
                let id = loop {
                    let id = rand::Rng::gen::<u64>(&mut *self.rng.lock());
                    if id != 0 && membership.get_node(&id).is_none() {
                        break id;
                    }
                };
                let node = Member {
                    name: String::new(),
                    peer_urls: peer_urls
                        .iter()
                        .map(|u| u.trim().trim_end_matches('/').to_string())
                        .collect(),
                    client_urls: Vec::new(),
                };
                let nodes = BTreeMap::from([(id, node)]);
                let changes = if *is_learner {
                    ChangeMembers::AddNodes(nodes)
                } else {
                    ChangeMembers::AddVoters(nodes)
                };
                Ok((changes, true, Some(id)))
            }
            MemberChange::Remove { id } => {
                if membership.get_node(id).is_none() {
                    return Err(MemberError::NotFound);
                }
                if !voters.contains(id) {
                    return Ok((
                        ChangeMembers::RemoveNodes(BTreeSet::from([*id])),
                        false,
                        None,
                    ));
                }
                // etcd's IsReadyToRemoveVotingMember: the voters that stay must hold a
                // quorum of the new configuration among themselves.
                let staying = voters.len() - 1;
                let active_staying = voters
                    .iter()
                    .filter(|v| *v != id && self.active(**v))
                    .count();
                if staying == 0 || active_staying < quorum(staying) {
                    return Err(MemberError::NotEnoughStarted);
                }
                Ok((
                    ChangeMembers::RemoveVoters(BTreeSet::from([*id])),
                    false,
                    None,
                ))
            }
            MemberChange::Update { id, peer_urls } => {
                let Some(current) = membership.get_node(id) else {
                    return Err(MemberError::NotFound);
                };
                check_urls(peer_urls)?;
                if url_taken(peer_urls, Some(*id)) {
                    return Err(MemberError::PeerUrlsExist);
                }
                let node = Member {
                    peer_urls: peer_urls
                        .iter()
                        .map(|u| u.trim().trim_end_matches('/').to_string())
                        .collect(),
                    ..current.clone()
                };
                Ok((
                    ChangeMembers::SetNodes(BTreeMap::from([(*id, node)])),
                    true,
                    None,
                ))
            }
            MemberChange::Promote { id } => {
                if membership.get_node(id).is_none() {
                    return Err(MemberError::NotFound);
                }
                if voters.contains(id) {
                    return Err(MemberError::NotLearner);
                }
                let learner_match = matched.get(id).copied().unwrap_or(0);
                if (learner_match as f64) < (last_log as f64) * LEARNER_READY_PERCENT {
                    return Err(MemberError::LearnerNotReady);
                }
                // The promoted learner is in sync, so it counts as started.
                let after = voters.len() + 1;
                if active_voters + 1 < quorum(after) {
                    return Err(MemberError::NotEnoughStarted);
                }
                Ok((
                    ChangeMembers::AddVoterIds(BTreeSet::from([*id])),
                    true,
                    None,
                ))
            }
        }
    }

    /// Where the sender of a peer message stands in this member's membership. Only the
    /// leader can say "removed": it holds every configuration ever proposed, while a lagging
    /// follower may not know yet a member that was just added.
    pub(crate) fn sender_standing(&self, from: u64) -> SenderStanding {
        let m = self.raft.metrics();
        let m = m.borrow();
        if m.membership_config.membership().get_node(&from).is_some() {
            SenderStanding::Member
        } else if m.state == ServerState::Leader {
            SenderStanding::Removed
        } else {
            SenderStanding::Unknown
        }
    }

    /// Answers a joining member (whose credential the peer service checked): the membership
    /// as this member knows it.
    pub(crate) fn serve_join(&self, req: JoinRequest) -> JoinResponse {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        tracing::info!(peer_urls = ?req.peer_urls, "a member asks for the membership to join");
        JoinResponse {
            members: membership
                .nodes()
                .map(|(id, node)| (*id, node.clone()))
                .collect(),
            voters: membership.voter_ids().collect(),
        }
    }
}

/// Joins an existing cluster from an empty data directory: asks the other members listed in
/// `--initial-cluster` for the membership, finds this member by its advertised peer URLs and
/// persists the identity found (member id, cluster id).
pub(crate) async fn join_existing(
    data_dir: &Path,
    config: &NodeConfig,
    token: &str,
    listed_peer_urls: Vec<String>,
) -> Result<MemberMeta, StartError> {
    let own = normalize(&config.peer_urls);
    let others: Vec<String> = listed_peer_urls
        .into_iter()
        .filter(|u| !own.contains(u.trim_end_matches('/')))
        .collect();
    let request = wire::encode(&JoinRequest {
        peer_urls: config.peer_urls.clone(),
        credential: ClusterCredential::of_token(token),
    })
    .map_err(|e| StartError::Raft(e.to_string()))?;
    // Every listed member is asked in each round, and an answer that lists this member wins:
    // a lagging member may not have applied the MemberAdd yet. Only when every listed member
    // answered without it is the member refused at once; otherwise rounds repeat until the
    // deadline.
    let deadline = Instant::now() + JOIN_DISCOVERY_TIMEOUT;
    let mine = |answer: &JoinResponse| {
        answer
            .members
            .iter()
            .find(|(_, m)| normalize(&m.peer_urls) == own)
            .cloned()
    };
    let (cluster_id, (id, member)) = 'found: loop {
        let mut errors = Vec::new();
        let mut answered_without_me = 0;
        let mut refused = 0;
        for url in &others {
            match crate::network::ask_members(url, request.clone(), Duration::from_secs(2)).await {
                Ok((cluster_id, payload)) => match wire::decode::<JoinResponse>(&payload) {
                    Ok(answer) if answer.voters.is_empty() => {
                        errors.push(format!("{url}: not initialized yet"))
                    }
                    Ok(answer) => match mine(&answer) {
                        Some(found) => break 'found (cluster_id, found),
                        None => answered_without_me += 1,
                    },
                    Err(e) => errors.push(format!("{url}: {e}")),
                },
                Err(AskError::Refused(e)) => {
                    refused += 1;
                    errors.push(format!("{url}: {e}"));
                }
                Err(AskError::Failed(e)) => errors.push(format!("{url}: {e}")),
            }
        }
        let out_of_time = Instant::now() >= deadline || others.is_empty();
        if answered_without_me > 0 && (answered_without_me == others.len() || out_of_time) {
            return Err(JoinError::NotAMember(config.peer_urls.clone()).into());
        }
        // Every member refused: no later round will go differently.
        if refused > 0 && refused == others.len() {
            return Err(JoinError::TokenRefused(errors.join("; ")).into());
        }
        if out_of_time {
            return Err(JoinError::NoPeerAnswered(errors.join("; ")).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if !member.name.is_empty() {
        return Err(JoinError::AlreadyBootstrapped { id }.into());
    }
    let meta = MemberMeta {
        member_id: id,
        cluster_id,
        name: config.name.clone(),
    };
    let path = data_dir.join("member.meta");
    files::write_atomic(&path, &files::encode_member(&meta)).map_err(io_error(&path))?;
    tracing::info!(
        member_id = format_args!("{:x}", meta.member_id),
        cluster_id = format_args!("{:x}", meta.cluster_id),
        "joined an existing cluster; waiting for the leader to catch this member up"
    );
    Ok(meta)
}

/// Watches this member's applied membership: once a configuration that no longer contains it
/// is applied (having contained it before: a joiner catching up applies older
/// configurations first), it was removed. Weak for the same reason as `lease_loop`.
pub(crate) async fn removal_loop(node: Weak<Inner>) {
    let (mut metrics, peers, me) = {
        let Some(inner) = node.upgrade() else { return };
        (inner.raft.metrics(), inner.peers.clone(), inner.member_id)
    };
    let mut was_member = false;
    loop {
        {
            let m = metrics.borrow_and_update();
            let stored = &m.membership_config;
            let contains = stored.membership().get_node(&me).is_some();
            let applied = m.last_applied.map(|l| l.index) >= stored.log_id().map(|l| l.index);
            if contains {
                was_member = true;
            } else if was_member && applied {
                if peers.mark_removed() {
                    tracing::error!("{REMOVED_MESSAGE}");
                }
                return;
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_follow_etcds_rules() {
        assert!(valid_peer_url("http://127.0.0.1:2380"));
        assert!(valid_peer_url("https://node-1.example:2380/"));
        assert!(!valid_peer_url("127.0.0.1:2380"));
        assert!(!valid_peer_url("http://127.0.0.1"));
        assert!(!valid_peer_url("http://127.0.0.1:2380/path"));
        assert!(!valid_peer_url("unix://sock:1"));
        assert!(!valid_peer_url("http://:2380"));
    }

    #[test]
    fn the_cluster_credential_is_a_digest_of_the_token() {
        let a = ClusterCredential::of_token("cluster-a");
        assert!(a.matches(&ClusterCredential::of_token("cluster-a")));
        assert!(!a.matches(&ClusterCredential::of_token("cluster-b")));
        assert!(!a.matches(&ClusterCredential::of_token("")));
        // The token does not appear in what the joiner sends, nor in logs.
        let bytes = wire::encode(&JoinRequest {
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            credential: a,
        })
        .unwrap();
        assert!(!bytes.windows(9).any(|w| w == b"cluster-a"));
        assert_eq!(format!("{a:?}"), "ClusterCredential(..)");
        // A request in the format before credentials (URLs only) does not decode: refused.
        let old = wire::encode(&vec!["http://127.0.0.1:2380".to_string()]).unwrap();
        assert!(wire::decode::<JoinRequest>(&old).is_err());
    }

    #[test]
    fn member_errors_cross_the_wire() {
        for e in [
            MemberError::NotFound,
            MemberError::LearnerNotReady,
            MemberError::Propose(ProposeError::Timeout),
        ] {
            let bytes = wire::encode(&e).unwrap();
            assert_eq!(wire::decode::<MemberError>(&bytes).unwrap(), e);
        }
    }
}
