//! etcd's checks of a membership change, as a pure function ([`plan`]) of the current
//! membership and what the leader sees of its peers ([`View`]): no clock, no network, no
//! Raft handle, so every rule is table-tested below, as etcd tests `IsReadyToAddVotingMember`
//! and `IsReadyToRemoveVotingMember`.

use std::collections::{BTreeMap, BTreeSet};

use openraft::{ChangeMembers, Membership};

use crate::membership::change::{MemberChange, MemberError};
use crate::types::Member;

/// etcd's limit on learners (`maxLearners` in etcd 3.4): one at a time.
const MAX_LEARNERS: usize = 1;

/// etcd promotes a learner only once its log has reached 90 % of the leader's.
const LEARNER_READY_PERCENT: f64 = 0.9;

/// What the leader knows when it checks a change.
pub(crate) struct View<'a> {
    pub(crate) membership: &'a Membership<u64, Member>,
    /// Members that answered the leader within the election timeout (etcd's "started"
    /// members; the leader itself always is).
    pub(crate) active: &'a BTreeSet<u64>,
    /// Per member, the last log index the leader's replication matched.
    pub(crate) matched: &'a BTreeMap<u64, u64>,
    /// The leader's last log index.
    pub(crate) last_log: u64,
    /// etcd's `--strict-reconfig-check`: off, the started-members checks are skipped (the
    /// URL, learner and promotion-readiness checks stay).
    pub(crate) strict: bool,
}

/// A checked change in openraft's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) change: ChangeMembers<u64, Member>,
    /// Whether voters that the change removes stay on as learners (openraft's `retain`).
    pub(crate) retain: bool,
    /// The id of the member a `MemberAdd` adds.
    pub(crate) added: Option<u64>,
}

/// etcd's checks of `change` against `view`; on success what to ask of openraft. `new_id`
/// draws a candidate id for an added member (the replica's randomness, so a seeded
/// simulation replays); ids in use and 0 are drawn again.
pub(crate) fn plan(
    change: &MemberChange,
    view: &View<'_>,
    mut new_id: impl FnMut() -> u64,
) -> Result<Plan, MemberError> {
    let membership = view.membership;
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let quorum = |n: usize| n / 2 + 1;
    let active_voters = voters.intersection(view.active).count();
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
    let plan = |change, retain, added| Plan {
        change,
        retain,
        added,
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
                if view.strict && !lone_to_two && active_voters < quorum(after) {
                    return Err(MemberError::NotEnoughStarted);
                }
                if view.strict && active_voters < voters.len() {
                    return Err(MemberError::Unhealthy);
                }
            }
            let id = loop {
                let id = new_id();
                if id != 0 && membership.get_node(&id).is_none() {
                    break id;
                }
            };
            let node = Member {
                name: String::new(),
                peer_urls: trimmed(peer_urls),
                client_urls: Vec::new(),
            };
            let nodes = BTreeMap::from([(id, node)]);
            let change = if *is_learner {
                ChangeMembers::AddNodes(nodes)
            } else {
                ChangeMembers::AddVoters(nodes)
            };
            Ok(plan(change, true, Some(id)))
        }
        MemberChange::Remove { id } => {
            if membership.get_node(id).is_none() {
                return Err(MemberError::NotFound);
            }
            if !voters.contains(id) {
                let change = ChangeMembers::RemoveNodes(BTreeSet::from([*id]));
                return Ok(plan(change, false, None));
            }
            // etcd's IsReadyToRemoveVotingMember: the voters that stay must hold a quorum of
            // the new configuration among themselves.
            let staying = voters.len() - 1;
            let active_staying = voters
                .iter()
                .filter(|v| *v != id && view.active.contains(v))
                .count();
            if staying == 0 || (view.strict && active_staying < quorum(staying)) {
                return Err(MemberError::NotEnoughStarted);
            }
            let change = ChangeMembers::RemoveVoters(BTreeSet::from([*id]));
            Ok(plan(change, false, None))
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
                peer_urls: trimmed(peer_urls),
                ..current.clone()
            };
            let change = ChangeMembers::SetNodes(BTreeMap::from([(*id, node)]));
            Ok(plan(change, true, None))
        }
        MemberChange::Promote { id } => {
            if membership.get_node(id).is_none() {
                return Err(MemberError::NotFound);
            }
            if voters.contains(id) {
                return Err(MemberError::NotLearner);
            }
            let learner_match = view.matched.get(id).copied().unwrap_or(0);
            if (learner_match as f64) < (view.last_log as f64) * LEARNER_READY_PERCENT {
                return Err(MemberError::LearnerNotReady);
            }
            // The promoted learner is in sync, so it counts as started.
            let after = voters.len() + 1;
            if view.strict && active_voters + 1 < quorum(after) {
                return Err(MemberError::NotEnoughStarted);
            }
            let change = ChangeMembers::AddVoterIds(BTreeSet::from([*id]));
            Ok(plan(change, true, None))
        }
    }
}

/// Peer URLs as the membership keeps them: trimmed, without a trailing `/`.
fn trimmed(urls: &[String]) -> Vec<String> {
    urls.iter()
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .collect()
}

/// Peer URLs compared as sets of [`trimmed`] URLs.
pub(crate) fn normalize(urls: &[String]) -> BTreeSet<String> {
    trimmed(urls).into_iter().collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn member(port: u16) -> Member {
        Member {
            name: format!("m{port}"),
            peer_urls: vec![format!("http://127.0.0.1:{port}")],
            client_urls: Vec::new(),
        }
    }

    /// Voters `1..=voters`, learners after them (`voters+1..=voters+learners`).
    fn membership(voters: u64, learners: u64) -> Membership<u64, Member> {
        let ids: BTreeSet<u64> = (1..=voters).collect();
        let nodes: BTreeMap<u64, Member> = (1..=voters + learners)
            .map(|id| (id, member(2380 + id as u16)))
            .collect();
        Membership::new(vec![ids], nodes)
    }

    fn check(
        change: MemberChange,
        m: &Membership<u64, Member>,
        active: &[u64],
        matched: &[(u64, u64)],
        last_log: u64,
    ) -> Result<Plan, MemberError> {
        let active: BTreeSet<u64> = active.iter().copied().collect();
        let matched: BTreeMap<u64, u64> = matched.iter().copied().collect();
        let view = View {
            membership: m,
            active: &active,
            matched: &matched,
            last_log,
            strict: active_is_checked(),
        };
        let mut ids = [0, 1, 77].into_iter();
        plan(&change, &view, || {
            ids.next().expect("three draws are enough")
        })
    }

    thread_local! {
        static LAX: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// `strict` of the views `check` makes (tests of `--strict-reconfig-check=false` turn
    /// it off).
    fn active_is_checked() -> bool {
        !LAX.with(|l| l.get())
    }

    #[test]
    fn without_strict_reconfig_check_started_members_are_not_counted() {
        LAX.with(|l| l.set(true));
        // Adding a voter to 3 of which 2 are down, removing one of 3 with one up.
        assert!(check(add_voter(), &membership(3, 0), &[1], &[], 0).is_ok());
        assert!(check(
            MemberChange::Remove { id: 2 },
            &membership(3, 0),
            &[1],
            &[],
            0
        )
        .is_ok());
        // The last voter still cannot go, and a learner must still be in sync.
        assert_eq!(
            check(
                MemberChange::Remove { id: 1 },
                &membership(1, 0),
                &[1],
                &[],
                0
            ),
            Err(MemberError::NotEnoughStarted)
        );
        assert_eq!(
            check(
                MemberChange::Promote { id: 4 },
                &membership(3, 1),
                &[],
                &[(4, 1)],
                100
            ),
            Err(MemberError::LearnerNotReady)
        );
        LAX.with(|l| l.set(false));
    }

    fn add_voter() -> MemberChange {
        MemberChange::Add {
            peer_urls: vec!["http://127.0.0.1:9999".into()],
            is_learner: false,
        }
    }

    /// etcd's `TestIsReadyToAddVotingMember`, in Baton's terms: (voters, active voters,
    /// expected).
    #[test]
    fn adding_a_voter_needs_every_voter_started_and_a_quorum_after() {
        let ok = Ok(());
        let cases: &[(u64, &[u64], Result<(), MemberError>)] = &[
            // A lone member may grow to two.
            (1, &[1], ok.clone()),
            (2, &[1, 2], ok.clone()),
            (2, &[1], Err(MemberError::NotEnoughStarted)),
            (3, &[1, 2, 3], ok.clone()),
            // After the add 4 voters need 3 started: 2 are not enough.
            (3, &[1, 2], Err(MemberError::NotEnoughStarted)),
            // 4 → 5 needs 3 started; 3 of 4 are, but one voter is down: unhealthy.
            (4, &[1, 2, 3], Err(MemberError::Unhealthy)),
            (5, &[1, 2, 3, 4, 5], ok.clone()),
        ];
        for (voters, active, want) in cases {
            let m = membership(*voters, 0);
            let got = check(add_voter(), &m, active, &[], 0).map(|_| ());
            assert_eq!(&got, want, "{voters} voters, active {active:?}");
        }
    }

    #[test]
    fn an_added_member_gets_a_fresh_id_and_trimmed_urls() {
        let m = membership(1, 0);
        let change = MemberChange::Add {
            peer_urls: vec![" http://127.0.0.1:9999/ ".into()],
            is_learner: true,
        };
        let p = check(change, &m, &[1], &[], 0).unwrap();
        // 0 and 1 (in use) are drawn again.
        assert_eq!(p.added, Some(77));
        assert!(p.retain);
        let ChangeMembers::AddNodes(nodes) = p.change else {
            panic!("a learner is added as a node: {:?}", p.change)
        };
        assert_eq!(
            nodes[&77].peer_urls,
            vec!["http://127.0.0.1:9999".to_string()]
        );
    }

    #[test]
    fn urls_are_checked_before_anything_else() {
        let m = membership(3, 0);
        let taken = MemberChange::Add {
            peer_urls: vec!["http://127.0.0.1:2382/".into()],
            is_learner: false,
        };
        assert_eq!(
            check(taken, &m, &[1, 2, 3], &[], 0),
            Err(MemberError::PeerUrlsExist)
        );
        for bad in [vec![], vec!["127.0.0.1:1".to_string()]] {
            let change = MemberChange::Add {
                peer_urls: bad,
                is_learner: false,
            };
            assert_eq!(check(change, &m, &[], &[], 0), Err(MemberError::BadUrls));
        }
        // An update may keep the member's own URLs, not take another's.
        let own = MemberChange::Update {
            id: 2,
            peer_urls: vec!["http://127.0.0.1:2382".into()],
        };
        assert!(check(own, &m, &[], &[], 0).is_ok());
        let other = MemberChange::Update {
            id: 2,
            peer_urls: vec!["http://127.0.0.1:2383".into()],
        };
        assert_eq!(
            check(other, &m, &[], &[], 0),
            Err(MemberError::PeerUrlsExist)
        );
        let unknown = MemberChange::Update {
            id: 9,
            peer_urls: vec!["http://127.0.0.1:1".into()],
        };
        assert_eq!(check(unknown, &m, &[], &[], 0), Err(MemberError::NotFound));
    }

    #[test]
    fn one_learner_at_a_time() {
        let change = || MemberChange::Add {
            peer_urls: vec!["http://127.0.0.1:9999".into()],
            is_learner: true,
        };
        // A learner needs no started voters.
        assert!(check(change(), &membership(3, 0), &[], &[], 0).is_ok());
        assert_eq!(
            check(change(), &membership(3, 1), &[1, 2, 3, 4], &[], 0),
            Err(MemberError::TooManyLearners)
        );
    }

    /// etcd's `TestIsReadyToRemoveVotingMember`: (voters, active, removed, expected).
    #[test]
    fn removing_a_voter_leaves_a_started_quorum() {
        let ok = Ok(());
        type Case<'a> = (u64, &'a [u64], u64, Result<(), MemberError>);
        let cases: &[Case] = &[
            (1, &[1], 1, Err(MemberError::NotEnoughStarted)),
            (2, &[1, 2], 2, ok.clone()),
            (3, &[1, 2, 3], 3, ok.clone()),
            // Removing a started voter of three with one down leaves one of two.
            (3, &[1, 2], 2, Err(MemberError::NotEnoughStarted)),
            // Removing the voter that is down is fine.
            (3, &[1, 2], 3, ok.clone()),
            (4, &[1, 2, 3], 4, ok.clone()),
            (5, &[1, 2, 3], 3, Err(MemberError::NotEnoughStarted)),
            (5, &[1, 2, 3], 4, ok.clone()),
            (3, &[1, 2, 3], 9, Err(MemberError::NotFound)),
        ];
        for (voters, active, id, want) in cases {
            let m = membership(*voters, 0);
            let got = check(MemberChange::Remove { id: *id }, &m, active, &[], 0);
            let got = got.map(|p| {
                assert_eq!(p.change, ChangeMembers::RemoveVoters(BTreeSet::from([*id])));
                assert!(!p.retain, "a removed voter does not stay as a learner");
            });
            assert_eq!(
                &got, want,
                "{voters} voters, active {active:?}, remove {id}"
            );
        }
        // A learner goes without a quorum check.
        let p = check(
            MemberChange::Remove { id: 4 },
            &membership(3, 1),
            &[],
            &[],
            0,
        )
        .unwrap();
        assert_eq!(p.change, ChangeMembers::RemoveNodes(BTreeSet::from([4])));
    }

    #[test]
    fn a_learner_is_promoted_once_in_sync_and_counted_as_started() {
        let m = membership(3, 1);
        let promote = || MemberChange::Promote { id: 4 };
        // 90 % of the leader's log.
        assert_eq!(
            check(promote(), &m, &[1, 2, 3], &[(4, 89)], 100),
            Err(MemberError::LearnerNotReady)
        );
        assert!(check(promote(), &m, &[1, 2, 3], &[(4, 90)], 100).is_ok());
        // 4 voters after need 3 started: two voters plus the learner are.
        assert!(check(promote(), &m, &[1, 2], &[(4, 100)], 100).is_ok());
        assert_eq!(
            check(promote(), &m, &[1], &[(4, 100)], 100),
            Err(MemberError::NotEnoughStarted)
        );
        assert_eq!(
            check(MemberChange::Promote { id: 2 }, &m, &[1, 2, 3], &[], 0),
            Err(MemberError::NotLearner)
        );
        assert_eq!(
            check(MemberChange::Promote { id: 9 }, &m, &[1, 2, 3], &[], 0),
            Err(MemberError::NotFound)
        );
    }

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
}
