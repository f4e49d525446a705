//! The election timer, with pre-vote (Raft dissertation §9.6), in place of openraft 0.9's
//! own timer, which has none.
//!
//! **Why.** Without pre-vote, a member that stops hearing from its leader while the leader is
//! fine — a process resumed after SIGSTOP, a follower behind a partition that heals, a
//! restarted member — campaigns at a higher term. Its peers refuse the vote (their leader
//! lease holds), but the leader learns the higher term from that member's next answer and
//! steps down: a term change and a write stall of an election for nothing (issue 14 measured
//! term +2 and ~0.4 s after a 3 s SIGSTOP of a follower).
//!
//! **How.** openraft's timer is off (`Config::enable_elect = false`) and [`election_loop`]
//! is the timer. Every heartbeat interval it checks what openraft's tick checks — this
//! member is a voter, not the leader, and its vote was last refreshed by a leader longer ago
//! than the leader lease plus its randomized election timeout (the same clock openraft
//! keeps: `vote_last_modified`) — and then, instead of campaigning, asks every voter first
//! whether it *would* vote for it in the next term with its log ([`PreVoteRequest`]). A
//! voter says yes only when a real vote could be granted and is needed: it is not the
//! leader, its own leader lease has expired (it has not heard from a leader for `0.4 T`
//! either), its term is below the candidate's next one and the candidate's log is at least
//! as up to date as its own. With a quorum of yeses in every configuration of a joint
//! membership (its own included) the member campaigns (`trigger().elect()`); otherwise it
//! tries again after a new randomized timeout. A pre-vote writes nothing and changes no
//! term, so a member that cannot win cannot disturb the leader.
//!
//! Leader transfer bypasses the pre-vote (`TimeoutNow` → `trigger().elect()`), as etcd's
//! does: the leader has stopped its heartbeats so that the target wins.
//!
//! Safety does not depend on any of this (a pre-vote only gates a campaign that Raft's own
//! vote decides); liveness does, and the simulation's liveness checks cover it.

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use openraft::{LogId, ServerState};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::network::{Method, Peers};
use crate::replica::Replica;
use crate::wire;

/// Sent by a member about to campaign: "would you vote for me in `term`, given my log?"
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PreVoteRequest {
    /// The term the candidate would campaign in (its current term + 1).
    pub(crate) term: u64,
    pub(crate) last_log_id: Option<LogId<u64>>,
}

/// A pre-vote's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum PreVoteAnswer {
    Granted,
    /// Why not (for the candidate's log).
    Refused(String),
}

/// What a member knows that a pre-vote decision needs, read from openraft's state in one go.
#[derive(Debug, Clone)]
struct RaftView {
    state: ServerState,
    term: u64,
    /// A leader is known for the current term (openraft's "committed" vote).
    has_leader: bool,
    /// When a leader last refreshed the vote (openraft's clock for its leader lease); None
    /// after a restart, which openraft treats as long ago.
    vote_refreshed: Option<Instant>,
    /// The voter sets of the membership (two during a joint change).
    configs: Vec<BTreeSet<u64>>,
}

impl RaftView {
    /// Nothing that decides a campaign moved between `before` and `self`: same state and
    /// term, and the vote not refreshed (no vote granted, no leader heard).
    fn unchanged_since(&self, before: &RaftView) -> bool {
        self.state == before.state
            && self.term == before.term
            && self.has_leader == before.has_leader
            && self.vote_refreshed == before.vote_refreshed
    }
}

/// The election timer's side of a member: its own pre-votes and its answers to others'.
pub(crate) struct Elector {
    replica: Arc<Replica>,
    peers: Arc<Peers>,
}

impl Elector {
    pub(crate) fn new(replica: Arc<Replica>, peers: Arc<Peers>) -> Elector {
        Elector { replica, peers }
    }

    async fn raft_view(&self) -> Option<RaftView> {
        self.replica
            .raft
            .with_raft_state(|st| {
                let vote = st.vote_ref();
                RaftView {
                    state: st.server_state,
                    term: vote.leader_id().get_term(),
                    has_leader: vote.is_committed(),
                    vote_refreshed: st.vote_last_modified(),
                    configs: st
                        .membership_state
                        .effective()
                        .membership()
                        .get_joint_config()
                        .clone(),
                }
            })
            .await
            .ok()
    }

    /// The voter's half of a pre-vote (see the module docs for the rules).
    pub(crate) async fn serve_pre_vote(&self, from: u64, req: PreVoteRequest) -> PreVoteAnswer {
        let Some(view) = self.raft_view().await else {
            return PreVoteAnswer::Refused("shutting down".into());
        };
        let my_last = self.replica.wal.last_log_id();
        let lease = self.replica.timing.lease();
        let answer = decide_pre_vote(&view, Instant::now(), lease, my_last, &req);
        if let PreVoteAnswer::Refused(reason) = &answer {
            tracing::debug!(from = format_args!("{from:x}"), term = req.term, %reason, "pre-vote refused");
        }
        answer
    }

    /// Asks every other voter for a pre-vote for `term`: `Ok` when a quorum of every
    /// configuration (this member included) says yes, else the refusals.
    async fn pre_vote_round(
        &self,
        term: u64,
        configs: &[BTreeSet<u64>],
    ) -> Result<(), Vec<String>> {
        let replica = &self.replica;
        let me = replica.member_id;
        let req = PreVoteRequest {
            term,
            last_log_id: replica.wal.last_log_id(),
        };
        let payload = wire::encode(&req).map_err(|e| vec![e.to_string()])?;
        let nodes = replica
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, node)| (*id, node.clone()))
            .collect::<Vec<_>>();
        let voters: BTreeSet<u64> = configs.iter().flatten().copied().collect();
        // Answers must come within the election timeout's lower bound, so a round never
        // outlasts the wait before the next one.
        let timeout = replica.config.election_timeout / 4;
        let asks = nodes
            .into_iter()
            .filter(|(id, _)| *id != me && voters.contains(id))
            .map(|(id, node)| {
                let payload = payload.clone();
                async move {
                    let answer = self
                        .peers
                        .call(id, &node, Method::PreVote, payload, timeout)
                        .await
                        .ok()
                        .and_then(|bytes| wire::decode::<PreVoteAnswer>(&bytes).ok());
                    (id, answer)
                }
            });
        let answers = futures::future::join_all(asks).await;
        let mut granted: BTreeSet<u64> = answers
            .iter()
            .filter(|(_, a)| *a == Some(PreVoteAnswer::Granted))
            .map(|(id, _)| *id)
            .collect();
        granted.insert(me);
        let won = has_quorum_in_every(configs, &granted);
        assert!(granted.contains(&me), "a candidate counts its own vote");
        let refused: Vec<String> = answers
            .iter()
            .filter_map(|(id, a)| match a {
                Some(PreVoteAnswer::Refused(r)) => Some(format!("{id:x}: {r}")),
                None => Some(format!("{id:x}: no answer")),
                Some(PreVoteAnswer::Granted) => None,
            })
            .collect();
        metrics::counter!("baton_raft_pre_votes_total", "outcome" => if won { "won" } else { "lost" })
            .increment(1);
        if won {
            Ok(())
        } else {
            Err(refused)
        }
    }
}

/// The voter's rules, apart from I/O (table-tested below).
fn decide_pre_vote(
    view: &RaftView,
    now: Instant,
    lease: Duration,
    my_last_log_id: Option<LogId<u64>>,
    req: &PreVoteRequest,
) -> PreVoteAnswer {
    if view.state == ServerState::Leader {
        return PreVoteAnswer::Refused("this member is the leader".into());
    }
    if view.has_leader {
        if let Some(at) = view.vote_refreshed {
            if now <= at + lease {
                return PreVoteAnswer::Refused(format!(
                    "heard from the leader {} ms ago",
                    now.saturating_duration_since(at).as_millis()
                ));
            }
        }
    }
    if req.term <= view.term {
        return PreVoteAnswer::Refused(format!(
            "term {} is not above this member's {}",
            req.term, view.term
        ));
    }
    if req.last_log_id < my_last_log_id {
        return PreVoteAnswer::Refused("the candidate's log is behind this member's".into());
    }
    PreVoteAnswer::Granted
}

fn has_quorum_in_every(configs: &[BTreeSet<u64>], granted: &BTreeSet<u64>) -> bool {
    !configs.is_empty()
        && configs
            .iter()
            .all(|c| c.iter().filter(|id| granted.contains(id)).count() * 2 > c.len())
}

/// The election timer (module docs): runs until the replica is dropped or shuts down.
pub(crate) async fn election_loop(elector: Weak<Elector>) {
    let Some(inner) = elector.upgrade() else {
        return;
    };
    let timing = inner.replica.timing;
    let tick = inner.replica.config.heartbeat_interval;
    let lease = timing.lease();
    let draw = |inner: &Elector| {
        let ms = inner
            .replica
            .rng
            .lock()
            .gen_range(timing.timeout_min_ms..timing.lease_ms);
        Duration::from_millis(ms)
    };
    // A member (re)started with a cluster gives a leader one randomized timeout to be heard
    // before asking anyone; members started together thus do not all ask at once.
    let mut timeout = draw(&inner);
    let mut not_before = Instant::now() + timeout;
    // Pre-votes lost in a row: the first is logged at INFO, the rest (a member cut off for
    // a long time asks every few hundred ms) at DEBUG; the counter has them all.
    let mut lost_in_a_row = 0u64;
    drop(inner);
    loop {
        tokio::time::sleep(tick).await;
        let Some(inner) = elector.upgrade() else {
            return;
        };
        if inner.replica.is_shutting_down() {
            return;
        }
        let Some(view) = inner.raft_view().await else {
            return;
        };
        let me = inner.replica.member_id;
        let voter = view.configs.iter().any(|c| c.contains(&me));
        if view.state == ServerState::Leader || !voter || inner.replica.transfer.is_closed() {
            continue;
        }
        let now = Instant::now();
        let sole_voter = view.configs.iter().all(|c| c.len() == 1 && c.contains(&me));
        if !sole_voter {
            let wait = if view.has_leader {
                lease + timeout
            } else {
                timeout
            };
            let quiet_since_long_enough = view.vote_refreshed.is_none_or(|at| now >= at + wait);
            if !quiet_since_long_enough {
                // A leader is heard again: the next lost pre-vote is news.
                lost_in_a_row = 0;
                continue;
            }
            if now < not_before {
                continue;
            }
        }
        let term = view.term + 1;
        let campaign = sole_voter
            || match inner.pre_vote_round(term, &view.configs).await {
                // The answers are only as fresh as the view they were asked from: if this
                // member voted for someone or heard a leader meanwhile (its vote changed or
                // was refreshed), a campaign now would start a term above that election's
                // and depose its winner — two members doing this to each other livelocked
                // a cluster whose leader was paused. Stand down; the timer starts over.
                Ok(())
                    if !inner
                        .raft_view()
                        .await
                        .is_some_and(|now| now.unchanged_since(&view)) =>
                {
                    tracing::debug!(
                        term,
                        "pre-vote won, but the vote changed meanwhile; not campaigning"
                    );
                    false
                }
                Ok(()) => {
                    tracing::info!(term, "pre-vote won; campaigning");
                    true
                }
                Err(refused) => {
                    lost_in_a_row += 1;
                    if lost_in_a_row == 1 {
                        tracing::info!(
                            term,
                            ?refused,
                            "pre-vote lost; not campaigning (no term change)"
                        );
                    } else {
                        tracing::debug!(term, ?refused, lost_in_a_row, "pre-vote lost again");
                    }
                    false
                }
            };
        if campaign {
            lost_in_a_row = 0;
            if let Err(e) = inner.replica.raft.trigger().elect().await {
                tracing::warn!(error = %e, "could not start an election");
                return;
            }
        }
        timeout = draw(&inner);
        not_before = Instant::now() + timeout;
    }
}

/// Spawns [`election_loop`] for `elector`.
pub(crate) fn spawn(elector: &Arc<Elector>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(election_loop(Arc::downgrade(elector)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn log_id(term: u64, index: u64) -> Option<LogId<u64>> {
        Some(LogId::new(CommittedLeaderId::new(term, 0), index))
    }

    fn follower(term: u64, refreshed_ago: Option<Duration>, now: Instant) -> RaftView {
        RaftView {
            state: ServerState::Follower,
            term,
            has_leader: refreshed_ago.is_some(),
            vote_refreshed: refreshed_ago.map(|d| now - d),
            configs: vec![BTreeSet::from([1, 2, 3])],
        }
    }

    #[test]
    fn a_voter_that_hears_its_leader_refuses() {
        let now = Instant::now() + Duration::from_secs(60);
        let lease = Duration::from_millis(400);
        let req = PreVoteRequest {
            term: 6,
            last_log_id: log_id(5, 100),
        };
        let cases = [
            // (what the voter knows, its last log id, granted?)
            (
                follower_at(5, Some(Duration::from_millis(100))),
                log_id(5, 100),
                false,
            ),
            (
                follower_at(5, Some(Duration::from_millis(401))),
                log_id(5, 100),
                true,
            ),
            (follower_at(5, None), log_id(5, 100), true),
            (follower_at(6, None), log_id(5, 100), false),
            (follower_at(5, None), log_id(5, 101), false),
            (follower_at(5, None), log_id(4, 500), true),
        ];
        for (i, (make, last, want)) in cases.into_iter().enumerate() {
            let view = make(now);
            let got = decide_pre_vote(&view, now, lease, last, &req) == PreVoteAnswer::Granted;
            assert_eq!(got, want, "case {i}: {view:?}");
        }
        let mut leader = follower(5, None, now);
        leader.state = ServerState::Leader;
        assert_ne!(
            decide_pre_vote(&leader, now, lease, None, &req),
            PreVoteAnswer::Granted
        );
    }

    /// `follower` with the time supplied later (the table builds views lazily).
    fn follower_at(term: u64, ago: Option<Duration>) -> impl Fn(Instant) -> RaftView {
        move |now| follower(term, ago, now)
    }

    #[test]
    fn a_vote_granted_meanwhile_cancels_a_won_pre_vote() {
        let now = Instant::now() + Duration::from_secs(60);
        let before = follower(4, None, now);
        assert!(before.clone().unchanged_since(&before));
        // It voted for another candidate of term 5 while its own pre-vote was out.
        let voted = RaftView {
            term: 5,
            vote_refreshed: Some(now),
            ..before.clone()
        };
        assert!(!voted.unchanged_since(&before));
        // It heard a leader of its own term.
        let heard = RaftView {
            has_leader: true,
            vote_refreshed: Some(now),
            ..before.clone()
        };
        assert!(!heard.unchanged_since(&before));
    }

    #[test]
    fn quorum_counts_every_configuration_of_a_joint_membership() {
        let granted = BTreeSet::from([1, 2]);
        assert!(has_quorum_in_every(&[BTreeSet::from([1, 2, 3])], &granted));
        assert!(!has_quorum_in_every(
            &[BTreeSet::from([1, 2, 3]), BTreeSet::from([3, 4, 5])],
            &granted
        ));
        assert!(!has_quorum_in_every(
            &[BTreeSet::from([1, 2, 3, 4])],
            &granted
        ));
        assert!(!has_quorum_in_every(&[], &granted));
    }
}
