//! Admission by `member add`: how a joiner without the cluster token's credential may still
//! be told the membership, and given the credential (ARCHITECTURE.md, "Admission by member
//! add").
//!
//! etcd uses `--initial-cluster-token` only to bootstrap a new cluster, so a member added
//! with `etcdctl member add` is commonly started with `--initial-cluster-state existing` and
//! no token (etcd's own `TestIssue6361` does). Baton's peers hear nobody without the token's
//! credential (issue 14), so such a joiner would be refused. The operator's `member add`,
//! made through the authenticated client API, is taken as the authorization instead, but only
//! while it is fresh and only for the process that is evidently the added member:
//!
//! - the added member has not started (it has not published its name, and this member has
//!   not heard from it);
//! - it advertises exactly the peer URLs it was added with (compared as normalized sets);
//! - the request's TCP source address is one that those URLs' hosts resolve to;
//! - this member saw the add (took it into its membership) at most [`ADMISSION_WINDOW`] ago,
//!   measured on its own monotonic clock in its current run, while it was a member itself:
//!   an add it found in its log at start, or learned while catching up on the cluster's
//!   history (its initialization, its own join), opens no window;
//! - it admits each added member once.
//!
//! Without peer TLS this is etcd's own level of trust in peers (an etcd member believes any
//! process that can reach its peer port); with peer TLS the certificate check happens in the
//! transport before this service sees anything, and an injected transport tells no source
//! address, so nobody is admitted there.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use openraft::Membership;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::membership::plan::normalize;
use crate::types::Member;

/// How long after this member saw a `member add` the added member may be admitted without
/// the token's credential. Long enough for an operator to start the member by hand after
/// the add (etcdctl prints the flags to use), short enough that a forgotten add does not
/// leave the door open.
pub(crate) const ADMISSION_WINDOW: Duration = Duration::from_secs(10 * 60);

/// Why a joiner without the cluster token's credential was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AdmissionRefusal {
    /// No member in this member's membership has exactly these peer URLs.
    #[error(
        "no pending member with peer URLs {0:?} (add it first: etcdctl member add NAME \
         --peer-urls=...)"
    )]
    NoPendingMember(Vec<String>),
    // The messages below go to whoever asked, who may be a stranger: they name no member id
    // (the ids are what a forger of peer messages would need; the operator finds the member
    // by its peer URLs in `member list`).
    /// This member already admitted the added member once.
    #[error(
        "the member added with these peer URLs was already admitted once; remove it and add \
         it again"
    )]
    AlreadyAdmitted(u64),
    /// The added member has started already (published, or heard from): whoever asks now is
    /// not the process the add was for.
    #[error("the member added with these peer URLs has already started")]
    Started(u64),
    /// The add is older than [`ADMISSION_WINDOW`], or happened before this member's run.
    #[error(
        "the admission window of the member added with these peer URLs has passed (it was \
         added more than 10 minutes ago, or before the asked member last started); remove it \
         and add it again"
    )]
    WindowPassed(u64),
    /// The peer transport does not tell the source address (an injected transport: peer
    /// TLS, where the certificate is what admits a member).
    #[error("the request's source address is unknown to the peer service (peer TLS)")]
    SourceUnknown,
    /// The request did not come from an address the added member's peer URLs name.
    #[error("source address {from} does not match the added member's peer URLs {urls:?}")]
    SourceMismatch { from: IpAddr, urls: Vec<String> },
}

/// How long the system resolver may take for one peer URL's host; a name that does not
/// resolve in time names no address. The joiner's own question times out at 2 s.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// What this member knows about fresh adds.
#[derive(Debug)]
struct State {
    /// The member ids of the last membership observed.
    known: BTreeSet<u64>,
    /// When each member added since this run's first observation was first seen.
    added_at: BTreeMap<u64, Instant>,
    /// The members admitted once already.
    admitted: BTreeSet<u64>,
}

/// The freshness and the once rule of admission, kept per member (in memory: a restart
/// forgets every window, which only closes doors).
#[derive(Debug)]
pub(crate) struct Admissions {
    /// This member's id.
    me: u64,
    state: Mutex<State>,
}

impl Admissions {
    /// Starts from `baseline`, the membership at start: the adds in it are not fresh.
    pub(crate) fn new(me: u64, baseline: &Membership<u64, Member>) -> Admissions {
        Admissions {
            me,
            state: Mutex::new(State {
                known: baseline.nodes().map(|(id, _)| *id).collect(),
                added_at: BTreeMap::new(),
                admitted: BTreeSet::new(),
            }),
        }
    }

    /// Records the members of `membership` not seen before as added `now`, if this member
    /// was in the membership seen before: otherwise this is the cluster's initialization, or
    /// this member catching up on history from before it was added (an add made long ago
    /// would look new), and nothing in it is fresh.
    pub(crate) fn observe(&self, membership: &Membership<u64, Member>, now: Instant) {
        let mut st = self.state.lock();
        let ids: BTreeSet<u64> = membership.nodes().map(|(id, _)| *id).collect();
        if st.known.contains(&self.me) {
            for id in ids.difference(&st.known).copied().collect::<Vec<_>>() {
                st.added_at.insert(id, now);
            }
        }
        // Removed members need no window (a member added again gets a new id).
        st.added_at.retain(|id, _| ids.contains(id));
        st.known = ids;
    }

    /// The added member that a joiner advertising `peer_urls` may be, if the rules that do
    /// not need the network allow it: its id and peer URLs. `started` says whether this
    /// member has heard from a member.
    pub(crate) fn candidate(
        &self,
        membership: &Membership<u64, Member>,
        peer_urls: &[String],
        started: impl Fn(u64) -> bool,
        now: Instant,
    ) -> Result<(u64, Vec<String>), AdmissionRefusal> {
        let wanted = normalize(peer_urls);
        let (id, member) = membership
            .nodes()
            .find(|(_, m)| normalize(&m.peer_urls) == wanted)
            .ok_or_else(|| AdmissionRefusal::NoPendingMember(peer_urls.to_vec()))?;
        let st = self.state.lock();
        // Before "started": the admitted member starts right after, and a second asker
        // is told the rule that refused it, not a consequence of the first admission.
        if st.admitted.contains(id) {
            return Err(AdmissionRefusal::AlreadyAdmitted(*id));
        }
        if !member.name.is_empty() || started(*id) {
            return Err(AdmissionRefusal::Started(*id));
        }
        fresh(&st, *id, now)?;
        Ok((*id, member.peer_urls.clone()))
    }

    /// Admits `id` (checked by [`Admissions::candidate`] and the source address): once, and
    /// still within the window.
    pub(crate) fn admit(&self, id: u64, now: Instant) -> Result<(), AdmissionRefusal> {
        let mut st = self.state.lock();
        fresh(&st, id, now)?;
        if !st.admitted.insert(id) {
            return Err(AdmissionRefusal::AlreadyAdmitted(id));
        }
        Ok(())
    }
}

/// Whether `id` was added within [`ADMISSION_WINDOW`] of `now`.
fn fresh(st: &State, id: u64, now: Instant) -> Result<(), AdmissionRefusal> {
    match st.added_at.get(&id) {
        Some(at) if now.saturating_duration_since(*at) <= ADMISSION_WINDOW => Ok(()),
        _ => Err(AdmissionRefusal::WindowPassed(id)),
    }
}

/// Whether `source` is an address that a host of `peer_urls` resolves to (the system
/// resolver; an IP literal is itself), and which (IPv4-mapped IPv6 addresses count as their
/// IPv4).
pub(crate) async fn check_source(
    source: Option<SocketAddr>,
    peer_urls: &[String],
) -> Result<IpAddr, AdmissionRefusal> {
    let source = source
        .ok_or(AdmissionRefusal::SourceUnknown)?
        .ip()
        .to_canonical();
    for url in peer_urls {
        let Some((host, port)) = host_port(url) else {
            continue;
        };
        // A name that does not resolve (in time) names no address: it matches nothing.
        let lookup = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)));
        let Ok(Ok(addrs)) = lookup.await else {
            continue;
        };
        if addrs.into_iter().any(|a| a.ip().to_canonical() == source) {
            return Ok(source);
        }
    }
    Err(AdmissionRefusal::SourceMismatch {
        from: source,
        urls: peer_urls.to_vec(),
    })
}

/// The host (without IPv6 brackets) and port of a peer URL `http(s)://host:port`.
fn host_port(url: &str) -> Option<(&str, u16)> {
    let rest = url
        .trim()
        .strip_prefix("http://")
        .or_else(|| url.trim().strip_prefix("https://"))?
        .trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some((host, port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, url: &str) -> Member {
        Member {
            name: name.into(),
            peer_urls: vec![url.into()],
            client_urls: Vec::new(),
        }
    }

    fn membership(nodes: &[(u64, Member)]) -> Membership<u64, Member> {
        let voters: BTreeSet<u64> = nodes.iter().map(|(id, _)| *id).collect();
        Membership::new(
            vec![voters],
            nodes.iter().cloned().collect::<BTreeMap<_, _>>(),
        )
    }

    const URL: &str = "http://localhost:20031";

    #[test]
    fn only_a_fresh_unstarted_add_with_the_same_urls_is_a_candidate_and_only_once() {
        let t0 = Instant::now();
        let one = membership(&[(1, member("infra1", "http://localhost:20011"))]);
        let adm = Admissions::new(1, &one);
        let urls = vec![format!("{URL}/")];
        let never = |_| false;
        assert_eq!(
            adm.candidate(&one, &urls, never, t0),
            Err(AdmissionRefusal::NoPendingMember(urls.clone()))
        );
        let two = membership(&[
            (1, member("infra1", "http://localhost:20011")),
            (2, member("", URL)),
        ]);
        adm.observe(&two, t0);
        // Another set of URLs (one more) is not the added member.
        let more = vec![URL.to_string(), "http://localhost:20032".into()];
        assert!(matches!(
            adm.candidate(&two, &more, never, t0),
            Err(AdmissionRefusal::NoPendingMember(_))
        ));
        assert_eq!(
            adm.candidate(&two, &urls, never, t0),
            Ok((2, vec![URL.to_string()]))
        );
        assert_eq!(
            adm.candidate(&two, &urls, |id| id == 2, t0),
            Err(AdmissionRefusal::Started(2))
        );
        let late = t0 + ADMISSION_WINDOW + Duration::from_secs(1);
        assert_eq!(
            adm.candidate(&two, &urls, never, late),
            Err(AdmissionRefusal::WindowPassed(2))
        );
        assert_eq!(adm.admit(2, late), Err(AdmissionRefusal::WindowPassed(2)));
        assert_eq!(adm.admit(2, t0 + ADMISSION_WINDOW), Ok(()));
        assert_eq!(adm.admit(2, t0), Err(AdmissionRefusal::AlreadyAdmitted(2)));
        assert_eq!(
            adm.candidate(&two, &urls, never, t0),
            Err(AdmissionRefusal::AlreadyAdmitted(2))
        );
        let published = membership(&[
            (1, member("infra1", "http://localhost:20011")),
            (3, member("infra3", "http://localhost:20033")),
        ]);
        adm.observe(&published, t0);
        let urls3 = vec!["http://localhost:20033".to_string()];
        assert_eq!(
            adm.candidate(&published, &urls3, never, t0),
            Err(AdmissionRefusal::Started(3))
        );
    }

    #[test]
    fn adds_known_at_start_at_initialization_or_from_history_open_no_window() {
        let t0 = Instant::now();
        let two = membership(&[(1, member("a", "http://h:1")), (2, member("", URL))]);
        let urls = vec![URL.to_string()];
        let refused = Err(AdmissionRefusal::WindowPassed(2));
        // In the membership at start: added before this run.
        let adm = Admissions::new(1, &two);
        adm.observe(&two, t0);
        assert_eq!(adm.candidate(&two, &urls, |_| false, t0), refused);
        // A pristine member's first membership: its cluster's initialization.
        let adm = Admissions::new(1, &Membership::default());
        adm.observe(&two, t0);
        assert_eq!(adm.candidate(&two, &urls, |_| false, t0), refused);
        // Member 3 joined later and replays the log: member 2's add, made before 3 was a
        // member, is history to it, not a fresh add.
        let adm = Admissions::new(3, &Membership::default());
        let one = membership(&[(1, member("a", "http://h:1"))]);
        adm.observe(&one, t0);
        adm.observe(&two, t0);
        let three = membership(&[
            (1, member("a", "http://h:1")),
            (2, member("", URL)),
            (3, member("", "http://h:3")),
        ]);
        adm.observe(&three, t0);
        assert_eq!(adm.candidate(&three, &urls, |_| false, t0), refused);
        // A member added after 3 became one is fresh to it.
        let mut nodes: Vec<(u64, Member)> = three.nodes().map(|(i, m)| (*i, m.clone())).collect();
        nodes.push((4, member("", "http://h:4")));
        let four = membership(&nodes);
        adm.observe(&four, t0);
        let urls4 = vec!["http://h:4".to_string()];
        assert_eq!(
            adm.candidate(&four, &urls4, |_| false, t0),
            Ok((4, urls4.clone()))
        );
    }

    #[tokio::test]
    async fn the_source_must_be_an_address_of_the_peer_urls() {
        let from = |ip: &str| Some(SocketAddr::new(ip.parse().unwrap(), 40000));
        let urls = vec![URL.to_string()];
        let localhost: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(check_source(from("127.0.0.1"), &urls).await, Ok(localhost));
        assert_eq!(
            check_source(from("::ffff:127.0.0.1"), &urls).await,
            Ok(localhost)
        );
        let lit = vec!["http://[::1]:2380".to_string()];
        assert_eq!(
            check_source(from("::1"), &lit).await,
            Ok("::1".parse().unwrap())
        );
        assert_eq!(
            check_source(from("10.1.2.3"), &urls).await,
            Err(AdmissionRefusal::SourceMismatch {
                from: "10.1.2.3".parse().unwrap(),
                urls: urls.clone()
            })
        );
        assert_eq!(
            check_source(None, &urls).await,
            Err(AdmissionRefusal::SourceUnknown)
        );
        assert_eq!(
            host_port("https://10.0.0.1:2380/"),
            Some(("10.0.0.1", 2380))
        );
        assert_eq!(host_port("http://[::1]:2380"), Some(("::1", 2380)));
        assert_eq!(host_port("unix://x"), None);
    }
}
