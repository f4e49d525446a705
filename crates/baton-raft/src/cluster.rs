//! Cluster bootstrap configuration (etcd's `--initial-cluster` family) and the deterministic
//! member and cluster ids derived from it.
//!
//! Every member of a new cluster must agree on every member's id and on the cluster id before
//! any of them has talked to another: the member with the smallest id initializes Raft with all
//! members, the others only wait to be contacted. As in etcd, the ids are therefore hashes of
//! the initial configuration, derived exactly as etcd 3.4 derives them: a member id of its
//! sorted peer URLs and the cluster token, the cluster id of the sorted member ids (SHA-1).

use std::collections::BTreeSet;
use std::net::SocketAddr;

/// `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialClusterState {
    /// Create the cluster: with an empty data directory, the member with the smallest id
    /// initializes Raft with every member of `--initial-cluster`.
    New,
    /// Join a cluster that already exists: never initialize. A member with data restarts
    /// as itself; one with an empty data directory asks the other listed members for the
    /// membership and adopts the id `MemberAdd` gave its peer URLs (`membership`).
    Existing,
}

/// One entry of `--initial-cluster` (several `name=url` pairs with the same name are one
/// member with several peer URLs, as in etcd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    pub name: String,
    pub peer_urls: Vec<String>,
}

/// How a member of a multi-member cluster starts. Without it ([`crate::NodeConfig::cluster`]
/// `None`) a replica is a single-member cluster with random ids and no peer listener.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `--initial-cluster`, in flag order.
    pub initial_members: Vec<InitialMember>,
    /// `--initial-cluster-state`.
    pub state: InitialClusterState,
    /// `--initial-cluster-token`: two clusters created from the same member list with
    /// different tokens get different ids and refuse each other's messages.
    pub token: String,
    /// Whether `token` was given (`--initial-cluster-token`) rather than defaulted. A member
    /// admitted by `member add` without the token keeps using the cluster credential it was
    /// given when none is; a token given that differs from it is refused.
    pub token_given: bool,
    /// Where to serve the peer service (`--listen-peer-urls`).
    pub listen_peer_addrs: Vec<SocketAddr>,
}

/// Why `--initial-cluster` and the member's own flags do not describe a valid cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterConfigError {
    #[error("--initial-cluster: {0:?} is not of the form name=http://host:port")]
    BadEntry(String),
    #[error("--initial-cluster is empty")]
    Empty,
    #[error("--initial-cluster: peer URL {0} is listed for more than one member")]
    DuplicateUrl(String),
    #[error("--initial-cluster has no member named {0:?} (this member's --name)")]
    NotListed(String),
    #[error(
        "--initial-cluster lists {listed:?} for {name:?} but --initial-advertise-peer-urls \
         is {advertised:?}; they must agree"
    )]
    UrlMismatch {
        name: String,
        listed: Vec<String>,
        advertised: Vec<String>,
    },
    #[error("members {a:?} and {b:?} hash to the same id; change a peer URL")]
    IdCollision { a: String, b: String },
}

/// Parses `name1=url1,name2=url2,...` (etcd's syntax; a name may repeat to give a member
/// several peer URLs). Members keep the order of their first appearance.
pub fn parse_initial_cluster(s: &str) -> Result<Vec<InitialMember>, ClusterConfigError> {
    let mut members: Vec<InitialMember> = Vec::new();
    let mut seen_urls = BTreeSet::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((name, url)) = item.split_once('=') else {
            return Err(ClusterConfigError::BadEntry(item.to_string()));
        };
        let (name, url) = (name.trim(), url.trim().trim_end_matches('/'));
        if name.is_empty() || !url.contains("://") {
            return Err(ClusterConfigError::BadEntry(item.to_string()));
        }
        if !seen_urls.insert(url.to_string()) {
            return Err(ClusterConfigError::DuplicateUrl(url.to_string()));
        }
        match members.iter_mut().find(|m| m.name == name) {
            Some(m) => m.peer_urls.push(url.to_string()),
            None => members.push(InitialMember {
                name: name.to_string(),
                peer_urls: vec![url.to_string()],
            }),
        }
    }
    if members.is_empty() {
        return Err(ClusterConfigError::Empty);
    }
    Ok(members)
}

/// The ids every member derives alike from the initial configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DerivedIds {
    pub(crate) cluster_id: u64,
    /// `(member id, member)`, sorted by id.
    pub(crate) members: Vec<(u64, InitialMember)>,
}

impl DerivedIds {
    pub(crate) fn id_of(&self, name: &str) -> Option<u64> {
        self.members
            .iter()
            .find(|(_, m)| m.name == name)
            .map(|(id, _)| *id)
    }

    /// The member that initializes a new cluster.
    pub(crate) fn initializer(&self) -> u64 {
        self.members[0].0
    }

    /// The first membership of a new cluster, `me` as `own` and every other member with its
    /// peer URLs only: name and client URLs are published by each member itself once it runs.
    pub(crate) fn initial_membership(
        &self,
        me: u64,
        own: &crate::types::Member,
    ) -> Vec<(u64, crate::types::Member)> {
        self.members
            .iter()
            .map(|(id, m)| {
                let member = if *id == me {
                    own.clone()
                } else {
                    crate::types::Member {
                        name: String::new(),
                        peer_urls: m.peer_urls.clone(),
                        client_urls: Vec::new(),
                    }
                };
                (*id, member)
            })
            .collect()
    }
}

/// Derives member ids and the cluster id, and checks that `name` is listed with exactly the
/// peer URLs it advertises.
pub(crate) fn derive_ids(
    config: &ClusterConfig,
    name: &str,
    advertised_peer_urls: &[String],
) -> Result<DerivedIds, ClusterConfigError> {
    if config.initial_members.is_empty() {
        return Err(ClusterConfigError::Empty);
    }
    let mut members: Vec<(u64, InitialMember)> = config
        .initial_members
        .iter()
        .map(|m| (member_id(&config.token, m), m.clone()))
        .collect();
    members.sort_by_key(|(id, _)| *id);
    for pair in members.windows(2) {
        if pair[0].0 == pair[1].0 {
            return Err(ClusterConfigError::IdCollision {
                a: pair[0].1.name.clone(),
                b: pair[1].1.name.clone(),
            });
        }
    }
    let me = members
        .iter()
        .find(|(_, m)| m.name == name)
        .ok_or_else(|| ClusterConfigError::NotListed(name.to_string()))?;
    let norm = |urls: &[String]| -> BTreeSet<String> {
        urls.iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect()
    };
    if norm(&me.1.peer_urls) != norm(advertised_peer_urls) {
        return Err(ClusterConfigError::UrlMismatch {
            name: name.to_string(),
            listed: me.1.peer_urls.clone(),
            advertised: advertised_peer_urls.to_vec(),
        });
    }
    let ids: Vec<u64> = members.iter().map(|(id, _)| *id).collect();
    Ok(DerivedIds {
        cluster_id: cluster_id(&ids),
        members,
    })
}

/// etcd 3.4's member id (`membership.NewMember`): the first 8 bytes, big-endian, of SHA-1
/// over the sorted peer URLs, the cluster token and, for a member added at run time, the
/// Unix time in seconds as decimal digits (`added_at_unix_s`). The name is not part of it.
/// Matching etcd's derivation byte for byte gives a cluster created from the same flags the
/// same ids as etcd would, which clients see in every response header (etcd's e2e suite
/// compares `etcdctl -w protobuf` output with them).
pub fn etcd_member_id(peer_urls: &[String], token: &str, added_at_unix_s: Option<u64>) -> u64 {
    use sha1::Digest;
    let mut urls: Vec<&str> = peer_urls
        .iter()
        .map(|u| u.trim().trim_end_matches('/'))
        .collect();
    urls.sort_unstable();
    let mut h = sha1::Sha1::new();
    for u in urls {
        h.update(u.as_bytes());
    }
    h.update(token.as_bytes());
    if let Some(t) = added_at_unix_s {
        h.update(t.to_string().as_bytes());
    }
    first_8_be(&h.finalize())
}

/// etcd 3.4's cluster id (`RaftCluster.genID`): the first 8 bytes, big-endian, of SHA-1 over
/// the sorted member ids, each 8 bytes big-endian.
pub fn cluster_id(member_ids: &[u64]) -> u64 {
    use sha1::Digest;
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let mut h = sha1::Sha1::new();
    for id in ids {
        h.update(id.to_be_bytes());
    }
    first_8_be(&h.finalize())
}

fn first_8_be(digest: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(b)
}

/// A bootstrap member's id, as etcd derives it (no time: `--initial-cluster` members).
fn member_id(token: &str, m: &InitialMember) -> u64 {
    etcd_member_id(&m.peer_urls, token, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(spec: &str, token: &str) -> ClusterConfig {
        ClusterConfig {
            initial_members: parse_initial_cluster(spec).unwrap(),
            state: InitialClusterState::New,
            token: token.into(),
            token_given: true,
            listen_peer_addrs: Vec::new(),
        }
    }

    #[test]
    fn parse_groups_urls_by_name() {
        let m = parse_initial_cluster("a=http://h:1, b=http://h:2,a=http://h:3/").unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].name, "a");
        assert_eq!(m[0].peer_urls, vec!["http://h:1", "http://h:3"]);
        assert_eq!(m[1].peer_urls, vec!["http://h:2"]);
        assert!(matches!(
            parse_initial_cluster("a"),
            Err(ClusterConfigError::BadEntry(_))
        ));
        assert!(matches!(
            parse_initial_cluster("a=http://h:1,b=http://h:1"),
            Err(ClusterConfigError::DuplicateUrl(_))
        ));
        assert_eq!(parse_initial_cluster(""), Err(ClusterConfigError::Empty));
    }

    #[test]
    fn ids_are_deterministic_and_order_independent() {
        let spec = "n1=http://127.0.0.1:1,n2=http://127.0.0.1:2,n3=http://127.0.0.1:3";
        let a = derive_ids(&config(spec, "t"), "n1", &["http://127.0.0.1:1".into()]).unwrap();
        let reordered = "n3=http://127.0.0.1:3,n1=http://127.0.0.1:1,n2=http://127.0.0.1:2";
        let b = derive_ids(
            &config(reordered, "t"),
            "n2",
            &["http://127.0.0.1:2/".into()],
        )
        .unwrap();
        assert_eq!(a, b, "every member derives the same ids");
        let ids: BTreeSet<u64> = a.members.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids.len(), 3);
        assert!(!ids.contains(&0));
        let other_token =
            derive_ids(&config(spec, "u"), "n1", &["http://127.0.0.1:1".into()]).unwrap();
        assert_ne!(other_token.cluster_id, a.cluster_id);
        assert_ne!(other_token.id_of("n1"), a.id_of("n1"));
        // Pinned: ids are derived independently by every member, so the derivation must
        // never change. Until issue 18 Baton hashed token, name and URLs with FNV-1a
        // (cluster 0xc9d878c7483f36c7, n1 0xa0da0cc63655700f here); since then it is etcd's
        // SHA-1 derivation. Clusters created before keep their ids: a member with data
        // reads them from `member.meta` and never derives them again.
        assert_eq!(a.cluster_id, 0x241e_8354_a38f_3f00);
        assert_eq!(a.id_of("n1"), Some(0x3ec7_a265_f1d8_44c1));
        // A real etcd 3.4.23 member `r1` at http://127.0.0.1:36380 with the default token
        // answered these (shared/reference parity facts, the JSON gateway's headers).
        let etcd = derive_ids(
            &config("r1=http://127.0.0.1:36380", "etcd-cluster"),
            "r1",
            &["http://127.0.0.1:36380".into()],
        )
        .unwrap();
        assert_eq!(etcd.id_of("r1"), Some(9070289934633186038));
        assert_eq!(etcd.cluster_id, 10590307618791464684);
    }

    #[test]
    fn own_entry_must_match_advertised_urls() {
        let spec = "n1=http://127.0.0.1:1,n2=http://127.0.0.1:2";
        assert!(matches!(
            derive_ids(&config(spec, "t"), "n3", &[]),
            Err(ClusterConfigError::NotListed(_))
        ));
        assert!(matches!(
            derive_ids(&config(spec, "t"), "n1", &["http://127.0.0.1:9".into()]),
            Err(ClusterConfigError::UrlMismatch { .. })
        ));
    }
}
