//! etcd 3.4's backend layout: bucket and key names, and the encodings of revision keys,
//! lease ids and the meta values (see the table in the crate docs).

/// Bucket names, as etcd creates them.
pub(crate) const ALARM: &[u8] = b"alarm";
pub(crate) const AUTH: &[u8] = b"auth";
pub(crate) const AUTH_ROLES: &[u8] = b"authRoles";
pub(crate) const AUTH_USERS: &[u8] = b"authUsers";
/// Baton's own bucket, only in Baton's `member/snap/db` (`own.rs`); etcd ignores it.
pub(crate) const BATON: &[u8] = b"baton";
pub(crate) const CLUSTER: &[u8] = b"cluster";
pub(crate) const KEY: &[u8] = b"key";
pub(crate) const LEASE: &[u8] = b"lease";
pub(crate) const MEMBERS: &[u8] = b"members";
pub(crate) const MEMBERS_REMOVED: &[u8] = b"members_removed";
pub(crate) const META: &[u8] = b"meta";

/// Keys of the `auth` bucket.
pub(crate) const AUTH_ENABLED: &[u8] = b"authEnabled";
pub(crate) const AUTH_REVISION: &[u8] = b"authRevision";
/// Keys of the `meta` bucket.
pub(crate) const CONSISTENT_INDEX: &[u8] = b"consistent_index";
pub(crate) const FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
pub(crate) const SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
/// The key of the `cluster` bucket.
pub(crate) const CLUSTER_VERSION_KEY: &[u8] = b"clusterVersion";

/// The cluster version Baton's snapshots record: etcd 3.4's API, which is what Baton
/// speaks (etcd 3.4 refuses to join a cluster whose version it does not know).
pub const CLUSTER_VERSION: &str = "3.4.0";

/// A revision key's length: 8 + 1 + 8 bytes.
pub(crate) const REV_KEY_LEN: usize = 17;
/// etcd's mark after a tombstone's revision key.
pub(crate) const TOMBSTONE_MARK: u8 = b't';

/// etcd's `revToBytes` (plus the tombstone mark): main BE, `_`, sub BE.
pub(crate) fn rev_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut k = Vec::with_capacity(REV_KEY_LEN + 1);
    k.extend_from_slice(&main.to_be_bytes());
    k.push(b'_');
    k.extend_from_slice(&sub.to_be_bytes());
    if tombstone {
        k.push(TOMBSTONE_MARK);
    }
    k
}

/// A parsed revision key: `(main, sub, tombstone)`, or `None` for anything else.
pub(crate) fn parse_rev_key(k: &[u8]) -> Option<(i64, i64, bool)> {
    let tombstone = match k.len() {
        REV_KEY_LEN => false,
        18 if k[REV_KEY_LEN] == TOMBSTONE_MARK => true,
        _ => return None,
    };
    if k[8] != b'_' {
        return None;
    }
    let main = i64::from_be_bytes(k[..8].try_into().ok()?);
    let sub = i64::from_be_bytes(k[9..17].try_into().ok()?);
    Some((main, sub, tombstone))
}

/// etcd's `leasepb.Lease` (lease/leasepb/lease.proto): what the `lease` bucket holds.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LeasePb {
    #[prost(int64, tag = "1")]
    pub(crate) id: i64,
    #[prost(int64, tag = "2")]
    pub(crate) ttl: i64,
    #[prost(int64, tag = "3")]
    pub(crate) remaining_ttl: i64,
}

/// A member as etcd's `members` bucket stores it (`membership.Member`'s JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct MemberJson {
    pub(crate) id: u64,
    #[serde(rename = "peerURLs")]
    pub(crate) peer_urls: Vec<String>,
    #[serde(
        rename = "isLearner",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub(crate) is_learner: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) name: String,
    #[serde(rename = "clientURLs", default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) client_urls: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_keys_are_etcds() {
        let k = rev_key(0x0102, 3, false);
        assert_eq!(k, [0, 0, 0, 0, 0, 0, 1, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 3]);
        assert_eq!(parse_rev_key(&k), Some((0x0102, 3, false)));
        let t = rev_key(9, 0, true);
        assert_eq!(t.len(), 18);
        assert_eq!(t[17], b't');
        assert_eq!(parse_rev_key(&t), Some((9, 0, true)));
        assert_eq!(parse_rev_key(b"consistent_index"), None);
        // byte order is revision order, and a tombstone's key sorts after nothing it could
        // collide with: (main, sub) names one version
        assert!(rev_key(2, 5, false) < rev_key(3, 0, false));
        assert!(rev_key(3, 0, false) < rev_key(3, 1, true));
    }

    /// The JSON etcd 3.4 writes into `members` (read from a snapshot it made).
    #[test]
    fn member_json_is_etcds() {
        let etcd = r#"{"id":17010963214147749224,"peerURLs":["http://127.0.0.1:41380"],"name":"fx","clientURLs":["http://127.0.0.1:41379"]}"#;
        let m: MemberJson = serde_json::from_str(etcd).unwrap();
        assert_eq!(serde_json::to_string(&m).unwrap(), etcd);
    }
}
