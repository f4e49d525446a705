//! The proof of `--initial-cluster-token` that every peer message carries
//! ([`ClusterCredential`]).

use serde::{Deserialize, Serialize};

/// What a member (on every peer request, in the envelope) and a joiner (to `Members`) show
/// for `--initial-cluster-token`: SHA-256 of the token under a domain tag, compared by the
/// receiver with the digest of its own token. A digest rather than
/// the token, so a captured request does not hand out the token itself (it also seeds the
/// member and cluster ids, and an operator may reuse it); a captured digest can still be
/// replayed to `Members` unless peer TLS protects the connection (`https://` peer URLs:
/// encrypted, so nothing is captured) — which is also what a challenge-response would have
/// needed, for one more round trip.
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

    /// The credential in `bytes` (a `PeerMessage`'s `credential`); `None` unless exactly 32
    /// bytes.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Option<ClusterCredential> {
        bytes.try_into().ok().map(ClusterCredential)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_credential_is_a_digest_of_the_token() {
        let a = ClusterCredential::of_token("cluster-a");
        assert!(a.matches(&ClusterCredential::of_token("cluster-a")));
        assert!(!a.matches(&ClusterCredential::of_token("cluster-b")));
        assert!(!a.matches(&ClusterCredential::of_token("")));
        assert!(!a.matches_bytes(&[0; 31]));
        assert!(ClusterCredential::from_bytes(&a.to_vec()).is_some_and(|b| b.matches(&a)));
        assert!(ClusterCredential::from_bytes(&[0; 31]).is_none());
        assert!(ClusterCredential::from_bytes(&[]).is_none());
        assert_eq!(format!("{a:?}"), "ClusterCredential(..)");
    }
}
