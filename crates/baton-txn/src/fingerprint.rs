use sha2::{Digest, Sha256};

/// A stable hash of a request, stored with its idempotency key so that the same key arriving
/// with a *different* request is recognised (Stripe's `idempotency_error`, the IETF draft's
/// 422).
///
/// [`Fingerprint::of_http`] hashes the method, the path with its query, and the body bytes —
/// exactly those, each length-prefixed so no two different requests share an encoding.
/// Headers are left out on purpose: retries legitimately differ in `Date`, tracing ids,
/// authorization tokens that were refreshed, and so on. The body is hashed as bytes, not as
/// parsed JSON: a client retries by resending the same bytes, and normalising JSON would make
/// the fingerprint depend on a parser's choices.
///
/// SHA-256 with a version tag in front, so a later change of the recipe cannot collide with
/// stored fingerprints.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of an HTTP request: method, path with query (the request target as the
    /// client sent it, e.g. `/orders?dry_run=1`) and body.
    pub fn of_http(method: &str, path_and_query: &str, body: &[u8]) -> Self {
        Self::of_parts(&[b"http", method.as_bytes(), path_and_query.as_bytes(), body])
    }

    /// The fingerprint of any request made of parts (for non-HTTP callers: an RPC name and
    /// its encoded arguments, say). The parts are length-prefixed, so `["ab", "c"]` and
    /// `["a", "bc"]` differ.
    pub fn of_parts(parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        h.update(b"baton-txn fingerprint v1\0");
        for part in parts {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        Fingerprint(h.finalize().into())
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_separated_and_order_matters() {
        let a = Fingerprint::of_http("POST", "/orders", b"{}");
        assert_eq!(a, Fingerprint::of_http("POST", "/orders", b"{}"));
        assert_ne!(a, Fingerprint::of_http("PUT", "/orders", b"{}"));
        assert_ne!(a, Fingerprint::of_http("POST", "/orders?x=1", b"{}"));
        assert_ne!(a, Fingerprint::of_http("POST", "/orders", b"{ }"));
        assert_ne!(
            Fingerprint::of_parts(&[b"ab", b"c"]),
            Fingerprint::of_parts(&[b"a", b"bc"])
        );
    }

    #[test]
    fn recipe_is_pinned() {
        // Stored fingerprints outlive builds: a change of the recipe must be a deliberate
        // version bump, never an accident.
        let f = Fingerprint::of_http("POST", "/orders", b"{\"qty\":1}");
        assert_eq!(format!("{f:?}").len(), 16 + "…".len());
        assert_eq!(
            f,
            Fingerprint::of_parts(&[b"http", b"POST", b"/orders", b"{\"qty\":1}"])
        );
    }
}
