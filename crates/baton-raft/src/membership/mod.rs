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
//! question carries a `ClusterCredential` of the joiner's `--initial-cluster-token`; a member
//! answers only its own token's (the membership names every id and peer URL a forger of
//! peer messages would need).
//!
//! # Removal
//! A member learns it was removed either by applying the configuration without it, or,
//! having missed that (it was down, or the leader stopped replicating to it first), from the
//! leader, which answers votes and forwarded requests of non-members with
//! [`REMOVED_MESSAGE`]. `Node::removed` then resolves; the embedder stops serving.
//!
//! Files: `change` (the data: what is asked and answered), `plan` (etcd's checks, a pure
//! function), `join` (joining), this file (making a change on the leader, standing of a
//! sender, noticing removal).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, Membership, ServerState};

use crate::answer::{leader_error, ProposeError};
use crate::calls::ChangeMembersCall;
use crate::limits::REQUEST_TIMEOUT;
use crate::routing::{Routed, Router};
use crate::types::Member;

pub(crate) mod admission;
pub(crate) mod change;
mod join;
pub(crate) mod plan;

use admission::{AdmissionRefusal, Admissions};
use change::{
    member_infos, JoinRequest, JoinResponse, MemberChange, MemberChanged, MemberError,
    SenderStanding, REMOVED_MESSAGE,
};
pub(crate) use join::{join_existing, probe_while_waiting};

/// How long a change waits for another change (a member publishing itself, a concurrent
/// MemberAdd) to finish before giving up with a timeout.
const IN_PROGRESS_RETRY: Duration = Duration::from_millis(50);

/// What asking openraft for a planned change came to.
enum Applied {
    Done(MemberChanged),
    /// Another configuration is not committed yet: ask the same plan again.
    InProgress(plan::Plan),
}

/// Membership changes, made on the leader (routed there from a follower).
pub(crate) struct Members {
    router: Arc<Router>,
    /// Started with `--initial-cluster` (a peer service runs): only then can it have peers.
    clustered: bool,
    /// Fresh adds and the members admitted without the token's credential (`admission`).
    admissions: Admissions,
}

impl Members {
    /// The membership known now (the log's: a voter add that the cluster waits for is in it
    /// before it commits) is the baseline of admission: none of its adds is fresh.
    pub(crate) fn new(router: Arc<Router>, clustered: bool) -> Members {
        let admissions = {
            let replica = router.replica();
            let m = replica.raft.metrics();
            let m = m.borrow();
            Admissions::new(replica.member_id, m.membership_config.membership())
        };
        Members {
            router,
            clustered,
            admissions,
        }
    }

    /// Routes a change to the leader and unpacks its answer.
    pub(crate) async fn change(&self, change: MemberChange) -> Result<MemberChanged, MemberError> {
        if !self.clustered {
            return Err(MemberError::NotClustered);
        }
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        match self
            .router
            .route(ChangeMembersCall(change), deadline)
            .await?
        {
            Routed::Local(ChangeMembersCall(change)) => self.change_local(change, deadline).await,
            Routed::Remote(res) => {
                if let Ok(changed) = &res {
                    // Committed: a slow local apply only delays visibility.
                    let replica = self.router.replica();
                    // In openraft's metrics too: `Node::members` lists from them.
                    let _ = replica
                        .wait_applied_in_metrics(changed.raft_index, deadline)
                        .await;
                }
                res
            }
        }
    }

    /// The leader's half of a membership change: etcd's checks (`plan`), then openraft's
    /// `change_membership`; waits (until `deadline`) while another change is in progress.
    pub(crate) async fn change_local(
        &self,
        change: MemberChange,
        deadline: Instant,
    ) -> Result<MemberChanged, MemberError> {
        let replica = self.router.replica();
        replica.check_running()?;
        replica.transfer.wait(deadline).await;
        // The plan openraft answered `InProgress` to. Its first step may have appended the
        // joint configuration before the second step found it uncommitted, and then a
        // fresh plan would judge a half-made change of its own (a promotion would see the
        // learner among the joint voters and answer "can only promote a learner member"
        // for a promotion that is happening). openraft's contract for `InProgress` is to
        // ask again, and asking the same change again completes it.
        let mut interrupted: Option<plan::Plan> = None;
        loop {
            if let Some(planned) = interrupted.take() {
                match self.apply_plan(planned, deadline).await? {
                    Applied::Done(changed) => return Ok(changed),
                    Applied::InProgress(planned) => {
                        interrupted = Some(planned);
                        continue;
                    }
                }
            }
            let (membership, matched, last_log) = {
                let m = replica.raft.metrics();
                let m = m.borrow();
                if m.state != ServerState::Leader {
                    return Err(replica.not_leader(m.current_leader).into());
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
            let active: BTreeSet<u64> = membership
                .nodes()
                .map(|(id, _)| *id)
                .filter(|id| self.router.active(*id))
                .collect();
            let view = plan::View {
                membership: &membership,
                active: &active,
                matched: &matched,
                last_log,
                strict: replica.config.strict_reconfig_check,
            };
            // etcd's id for an added member (SHA-1 of its peer URLs, the cluster token and
            // the Unix time in seconds, `cluster::etcd_member_id`), from the environment's
            // wall clock; should it be taken or zero, the replica's randomness
            // (`Environment::rng`). Both are injected, so a simulation replays. The id is
            // chosen here, before the change is proposed: the applied entry carries it.
            let mut etcd_id = match &change {
                MemberChange::Add { peer_urls, .. } => Some(crate::cluster::etcd_member_id(
                    peer_urls,
                    replica
                        .config
                        .cluster
                        .as_ref()
                        .map_or("", |c| c.token.as_str()),
                    Some(replica.config.env.wall_ms() / 1000),
                )),
                _ => None,
            };
            let new_id = || {
                etcd_id
                    .take()
                    .unwrap_or_else(|| rand::Rng::gen::<u64>(&mut *replica.rng.lock()))
            };
            let planned = plan::plan(&change, &view, new_id)?;
            if let Some(added) = planned
                .added
                .filter(|_| needs_the_added_voter(&planned.change, &membership, &active))
            {
                if membership.get_joint_config().len() > 1 {
                    // Another change is half done; wait for it as openraft's InProgress.
                    if Instant::now() + IN_PROGRESS_RETRY >= deadline {
                        return Err(ProposeError::Timeout.into());
                    }
                    tokio::time::sleep(IN_PROGRESS_RETRY).await;
                    continue;
                }
                return self.add_awaited_voter(planned, added, deadline).await;
            }
            match self.apply_plan(planned, deadline).await? {
                Applied::Done(changed) => return Ok(changed),
                Applied::InProgress(planned) => interrupted = Some(planned),
            }
        }
    }

    /// Asks openraft for `planned`; after `InProgress`, waits a moment and hands the plan
    /// back to be asked again.
    async fn apply_plan(
        &self,
        planned: plan::Plan,
        deadline: Instant,
    ) -> Result<Applied, MemberError> {
        let replica = self.router.replica();
        let remaining = deadline.saturating_duration_since(Instant::now());
        let res = tokio::time::timeout(
            remaining,
            replica
                .raft
                .change_membership(planned.change.clone(), planned.retain),
        )
        .await;
        match res {
            Err(_) => Err(ProposeError::Timeout.into()),
            Ok(Ok(resp)) => {
                let after = resp.membership.unwrap_or_else(|| {
                    replica
                        .raft
                        .metrics()
                        .borrow()
                        .membership_config
                        .membership()
                        .clone()
                });
                let members = member_infos(&after, replica.member_id, &replica.config);
                let added = planned
                    .added
                    .and_then(|id| members.iter().find(|m| m.id == id).cloned());
                Ok(Applied::Done(MemberChanged {
                    added,
                    members,
                    raft_index: resp.log_id.index,
                }))
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(leader_error(f.leader_id).into())
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => match e {
                ChangeMembershipError::InProgress(_) => {
                    if Instant::now() + IN_PROGRESS_RETRY >= deadline {
                        return Err(ProposeError::Timeout.into());
                    }
                    tokio::time::sleep(IN_PROGRESS_RETRY).await;
                    Ok(Applied::InProgress(planned))
                }
                ChangeMembershipError::LearnerNotFound(_) => Err(MemberError::NotFound),
                ChangeMembershipError::EmptyMembership(_) => Err(MemberError::NotEnoughStarted),
            },
            Ok(Err(RaftError::Fatal(f))) => Err(replica.fatal_error(&f).into()),
        }
    }

    /// A voter add whose joint configuration cannot commit before the added member answers
    /// (a lone voter growing to two, or a non-strict add beyond the started voters): etcd
    /// answers such a `MemberAdd` at once (its single-step change commits in the old
    /// configuration) and the cluster waits for the new member; openraft's
    /// `change_membership` would not return before the member runs, and its operator waits
    /// for the answer to start it. So the change runs on in a task, and the answer comes once
    /// the joint configuration naming the member is in this leader's log — from then on,
    /// as with etcd, nothing commits until the new member runs and catches up (the task then
    /// finishes the change to the uniform configuration).
    async fn add_awaited_voter(
        &self,
        planned: plan::Plan,
        added: u64,
        deadline: Instant,
    ) -> Result<MemberChanged, MemberError> {
        let replica = self.router.replica();
        let raft = replica.raft.clone();
        let (change, retain) = (planned.change, planned.retain);
        tokio::spawn(async move {
            if let Err(e) = raft.change_membership(change, retain).await {
                tracing::warn!(
                    member = format_args!("{added:x}"),
                    error = %e,
                    "adding a voter that the cluster waits for did not complete"
                );
            }
        });
        let remaining = deadline.saturating_duration_since(Instant::now());
        let m = replica
            .raft
            .wait(Some(remaining))
            .metrics(
                |m| m.membership_config.membership().get_node(&added).is_some(),
                "the added voter is in the membership",
            )
            .await
            .map_err(|_| MemberError::from(ProposeError::Timeout))?;
        let after = m.membership_config.membership().clone();
        let members = member_infos(&after, replica.member_id, &replica.config);
        Ok(MemberChanged {
            added: members.iter().find(|m| m.id == added).cloned(),
            members,
            raft_index: m.membership_config.log_id().map_or(0, |l| l.index),
        })
    }

    /// Whether this member is a learner (receives the log, does not vote). Asked on every
    /// client call (`member_guard`), hence one look at the membership and no copies.
    pub(crate) fn is_learner(&self) -> bool {
        let replica = self.router.replica();
        let me = replica.member_id;
        let m = replica.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        membership.get_node(&me).is_some() && !crate::replica::is_voter_of(membership, me)
    }

    /// Where the sender of a peer message stands in this member's membership. Only the
    /// leader can say "removed": it holds every configuration ever proposed, while a lagging
    /// follower may not know yet a member that was just added.
    pub(crate) fn sender_standing(&self, from: u64) -> SenderStanding {
        let m = self.router.replica().raft.metrics();
        let m = m.borrow();
        if m.membership_config.membership().get_node(&from).is_some() {
            SenderStanding::Member
        } else if m.state == ServerState::Leader {
            SenderStanding::Removed
        } else {
            SenderStanding::Unknown
        }
    }

    /// Answers a joiner that did not show the cluster token's credential, if `member add`
    /// admits it (`admission`): the membership, as [`Members::serve_join`]. The caller then
    /// hands it the cluster's credential. `source` is the request's TCP source address
    /// (`None`: the transport does not tell it).
    pub(crate) async fn admit(
        &self,
        req: JoinRequest,
        source: Option<SocketAddr>,
    ) -> Result<JoinResponse, AdmissionRefusal> {
        let membership = self
            .router
            .replica()
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .clone();
        // Observed here too, not only by `observe_adds_loop`: an add made a moment ago may
        // not have reached that task yet.
        self.admissions.observe(&membership, Instant::now());
        let (id, urls) = self.admissions.candidate(
            &membership,
            &req.peer_urls,
            |id| self.router.active(id),
            Instant::now(),
        )?;
        let from = admission::check_source(source, &urls).await?;
        self.admissions.admit(id, Instant::now())?;
        tracing::info!(
            member_id = format_args!("{id:x}"),
            peer_urls = ?urls,
            source = %from,
            "admitted a member added by member add without the cluster token: it is given the \
             cluster credential"
        );
        Ok(self.serve_join(req))
    }

    /// Answers a joining member (whose credential the peer service checked, or that was
    /// admitted): the membership as this member knows it.
    pub(crate) fn serve_join(&self, req: JoinRequest) -> JoinResponse {
        let m = self.router.replica().raft.metrics();
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

/// Notes each member added to this member's membership when it appears (`admission`: the
/// window of an add is measured from then). Weak for the same reason as `ticker::run`.
pub(crate) async fn observe_adds_loop(members: Weak<Members>) {
    // openraft's server metrics change with the membership, never per request.
    let mut metrics = match members.upgrade() {
        Some(m) => m.router.replica().raft.server_metrics(),
        None => return,
    };
    let mut seen = None;
    loop {
        let membership = {
            let m = metrics.borrow_and_update();
            let log_id = *m.membership_config.log_id();
            (seen != Some(log_id)).then(|| {
                seen = Some(log_id);
                m.membership_config.membership().clone()
            })
        };
        let Some(members) = members.upgrade() else {
            return;
        };
        if let Some(membership) = membership {
            members.admissions.observe(&membership, Instant::now());
        }
        drop(members);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Watches this member's applied membership: once a configuration that no longer contains it
/// is applied (having contained it before: a joiner catching up applies older
/// configurations first), it was removed. Weak for the same reason as `ticker::run`.
pub(crate) async fn removal_loop(router: Weak<Router>) {
    let (mut metrics, mut membership_changes, peers, me) = {
        let Some(router) = router.upgrade() else {
            return;
        };
        let replica = router.replica();
        (
            replica.raft.metrics(),
            replica.raft.server_metrics(),
            router.peers().clone(),
            replica.member_id,
        )
    };
    let mut was_member = false;
    loop {
        let removal_pending = {
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
            was_member && !contains
        };
        // openraft's full metrics change with every write; its server metrics only with the
        // membership (and vote, role, leader). Only a removal waiting for its apply needs the
        // former — otherwise this task would be woken on every request.
        let changed = if removal_pending {
            metrics.changed().await
        } else {
            membership_changes.changed().await
        };
        if changed.is_err() {
            return;
        }
    }
}

/// Whether `change` adds voters whose configuration needs one of them for a quorum: the
/// voters of `membership` that are `active` fall short of a majority of the new voters.
fn needs_the_added_voter(
    change: &ChangeMembers<u64, Member>,
    membership: &Membership<u64, Member>,
    active: &BTreeSet<u64>,
) -> bool {
    let ChangeMembers::AddVoters(added) = change else {
        return false;
    };
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let after = voters.len() + added.keys().filter(|id| !voters.contains(id)).count();
    voters.intersection(active).count() < after / 2 + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credential::ClusterCredential;
    use crate::wire;

    #[test]
    fn the_join_request_shows_a_digest_never_the_token() {
        let bytes = wire::encode(&JoinRequest {
            peer_urls: vec!["http://127.0.0.1:2380".into()],
            credential: ClusterCredential::of_token("cluster-a"),
        })
        .unwrap();
        assert!(!bytes.windows(9).any(|w| w == b"cluster-a"));
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
