//! # baton-fencing
//!
//! Signed fencing tokens (issue 16, part 4). A fencing token alone is a number: a resource
//! that accepts `token >= highest` can be locked out of every honest holder by anyone who
//! presents a huge one. So every grant of Baton's lock API (`baton.v1.Lock`) also carries a
//! **signature by the cluster's key** over what the grant says — the lock name, the token,
//! the holder's lease and the grant revision — and the id of the key that made it. A
//! resource configured with the cluster's public keys ([`PublicKeys`]) checks the signature
//! before anything else and refuses a forged or altered token without asking Baton.
//!
//! This crate is what the signer (baton-server) and every verifier (baton-client's
//! `FenceGate`, baton-txn's `PgFence`, a script resource through `baton fence public-key`)
//! share: the byte encoding ([`Grant::signed_bytes`], pinned by `tests/golden/`), Ed25519
//! through `ring::signature` (the ring rustls already builds; no hand-written crypto), and
//! the public keys' text form. It knows nothing of the log, the server or the wire, and
//! keeps randomness out: a key pair is made from a 32-byte seed the caller draws (the
//! replica's seeded-or-OS randomness seam), so a simulated cluster stays deterministic.
//!
//! ## The signed bytes (encoding version 1)
//!
//! All integers big-endian; the variable-length fields carry a `u32` length in front, so no
//! two different grants encode alike:
//!
//! ```text
//! u32 len(tag) ‖ tag = "baton.fencing.grant"      domain separation: these bytes are never
//!                                                  a valid message of another protocol
//! u8  version = 1                                  a new layout gets a new number
//! u64 key id                                       the signature names its key
//! u32 len(name) ‖ name                             the lock name (bytes as given)
//! i64 token                                        the fencing token
//! i64 lease                                        the holder's lease id
//! i64 revision                                     the store revision of the grant
//! ```
//!
//! ## The public keys' text form
//!
//! One key per line, `ed25519 <key id> <public key as 64 lowercase hex digits>`; blank lines
//! and lines starting with `#` are ignored (`baton fence public-key` prints a `#` header).
//! Every key the cluster ever used is listed: old ones stay valid for verification after a
//! rotation, since tokens they signed may still be held.

use std::collections::BTreeMap;
use std::fmt;

use ring::signature::{Ed25519KeyPair, KeyPair as _, UnparsedPublicKey, ED25519};

/// The domain tag at the front of every signed message.
pub const DOMAIN_TAG: &[u8] = b"baton.fencing.grant";
/// The version of the signed bytes' layout (see the crate docs).
pub const ENCODING_VERSION: u8 = 1;
/// The algorithm's name in the text form of public keys.
pub const ALGORITHM: &str = "ed25519";

/// Id of one of the cluster's signing keys: 1 for the key made at bootstrap, one more for
/// each rotation. Never 0 (0 on the wire means "unsigned").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(u64);

impl KeyId {
    /// The key with this id (as read from the wire or the text form).
    pub const fn new(id: u64) -> KeyId {
        KeyId(id)
    }
    /// The number, for the wire and the text form.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An Ed25519 public key (32 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey([u8; 32]);

impl PublicKey {
    /// The key of these 32 bytes (any bytes: a bad key just verifies nothing).
    pub const fn from_bytes(bytes: [u8; 32]) -> PublicKey {
        PublicKey(bytes)
    }
    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
    /// 64 lowercase hex digits, as in the text form.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
    /// Reads 64 hex digits.
    pub fn from_hex(text: &str) -> Result<PublicKey, ParseError> {
        Ok(PublicKey(unhex(text, "public key")?))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

/// An Ed25519 signature (64 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signature([u8; 64]);

impl Signature {
    /// The signature of these 64 bytes.
    pub const fn from_bytes(bytes: [u8; 64]) -> Signature {
        Signature(bytes)
    }
    /// A signature from wire bytes; anything but 64 bytes is refused.
    pub fn from_slice(bytes: &[u8]) -> Result<Signature, ParseError> {
        <[u8; 64]>::try_from(bytes)
            .map(Signature)
            .map_err(|_| ParseError::Length {
                what: "signature",
                expected: 64,
                got: bytes.len(),
            })
    }
    /// The 64 bytes.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }
    /// 128 lowercase hex digits (as `baton lock` exports it in `BATON_FENCING_SIGNATURE`).
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
    /// Reads 128 hex digits.
    pub fn from_hex(text: &str) -> Result<Signature, ParseError> {
        Ok(Signature(unhex(text, "signature")?))
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({})", self.to_hex())
    }
}

/// What a grant's signature covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant<'a> {
    /// The lock's name.
    pub name: &'a [u8],
    /// The fencing token (the holder key's create revision).
    pub token: i64,
    /// The holder's lease id.
    pub lease: i64,
    /// The store revision of the grant.
    pub revision: i64,
}

impl Grant<'_> {
    /// The bytes signed by key `key` (layout in the crate docs; pinned by `tests/golden/`).
    pub fn signed_bytes(&self, key: KeyId) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + DOMAIN_TAG.len() + 1 + 8 + 4 + self.name.len() + 24);
        put_len_prefixed(&mut out, DOMAIN_TAG);
        out.push(ENCODING_VERSION);
        out.extend_from_slice(&key.0.to_be_bytes());
        put_len_prefixed(&mut out, self.name);
        out.extend_from_slice(&self.token.to_be_bytes());
        out.extend_from_slice(&self.lease.to_be_bytes());
        out.extend_from_slice(&self.revision.to_be_bytes());
        out
    }
}

fn put_len_prefixed(out: &mut Vec<u8>, field: &[u8]) {
    let len = u32::try_from(field.len()).expect("a lock name is far below 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(field);
}

/// A signing key: the Ed25519 key pair made from a 32-byte seed (the private key as the
/// replicated state holds it).
pub struct SigningKey {
    id: KeyId,
    pair: Ed25519KeyPair,
}

impl SigningKey {
    /// The key pair of `seed`, known as `id`. Any 32 bytes are a valid seed; they must be
    /// drawn from a secure source (the caller's job: see the crate docs).
    pub fn from_seed(id: KeyId, seed: &[u8; 32]) -> SigningKey {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)
            .expect("ring accepts every 32-byte Ed25519 seed");
        SigningKey { id, pair }
    }

    /// The id signatures name.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// The public half, derived from the seed.
    pub fn public_key(&self) -> PublicKey {
        let bytes: [u8; 32] = self
            .pair
            .public_key()
            .as_ref()
            .try_into()
            .expect("an Ed25519 public key is 32 bytes");
        PublicKey(bytes)
    }

    /// Signs `grant` (see [`Grant::signed_bytes`]).
    pub fn sign(&self, grant: &Grant<'_>) -> Signature {
        let sig = self.pair.sign(&grant.signed_bytes(self.id));
        Signature(
            sig.as_ref()
                .try_into()
                .expect("an Ed25519 signature is 64 bytes"),
        )
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.id)
            .field("public_key", &self.public_key())
            .finish_non_exhaustive()
    }
}

/// Why a signed grant was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The grant carries no signature (key id 0), and the resource requires one.
    #[error("the fencing token carries no signature")]
    Unsigned,
    /// The key id is not among the configured public keys: a token of another cluster, a
    /// made-up id, or keys configured before a rotation (fetch them again).
    #[error("unknown fencing key id {0}")]
    UnknownKey(KeyId),
    /// The signature does not match the grant under that key: the token, lease, revision,
    /// name or signature was altered, or the grant was never Baton's.
    #[error("the fencing token's signature does not verify under key {0}")]
    BadSignature(KeyId),
}

/// Why a key, a signature or the public keys' text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A key or signature of the wrong length.
    #[error("{what}: expected {expected} bytes, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A key or signature with a non-hex digit.
    #[error("{0}: not hexadecimal")]
    NotHex(&'static str),
    /// A line of the text form that is not `ed25519 <id> <hex>`.
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    /// The text form lists one id twice.
    #[error("key id {0} listed twice")]
    DuplicateKey(KeyId),
}

/// The public keys a resource verifies with, by id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicKeys {
    keys: BTreeMap<KeyId, PublicKey>,
}

impl PublicKeys {
    /// No keys (verifies nothing).
    pub fn new() -> PublicKeys {
        PublicKeys::default()
    }

    /// Adds (or replaces) key `id`.
    pub fn insert(&mut self, id: KeyId, key: PublicKey) {
        self.keys.insert(id, key);
    }

    /// Key `id`, if configured.
    pub fn get(&self, id: KeyId) -> Option<&PublicKey> {
        self.keys.get(&id)
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Every key, by ascending id.
    pub fn iter(&self) -> impl Iterator<Item = (KeyId, &PublicKey)> {
        self.keys.iter().map(|(id, k)| (*id, k))
    }

    /// `Ok` iff `signature` is key `key`'s signature of `grant`. Key id 0 is "unsigned".
    pub fn verify(
        &self,
        grant: &Grant<'_>,
        key: KeyId,
        signature: &Signature,
    ) -> Result<(), VerifyError> {
        if key.0 == 0 {
            return Err(VerifyError::Unsigned);
        }
        let public = self.keys.get(&key).ok_or(VerifyError::UnknownKey(key))?;
        UnparsedPublicKey::new(&ED25519, public.0)
            .verify(&grant.signed_bytes(key), &signature.0)
            .map_err(|_| VerifyError::BadSignature(key))
    }

    /// The text form (see the crate docs), with a `#` header line.
    pub fn to_text(&self) -> String {
        let mut out =
            String::from("# baton fencing public keys: <algorithm> <key id> <public key hex>\n");
        for (id, key) in &self.keys {
            out.push_str(&format!("{ALGORITHM} {id} {}\n", key.to_hex()));
        }
        out
    }

    /// Reads the text form (see the crate docs).
    pub fn parse(text: &str) -> Result<PublicKeys, ParseError> {
        let mut keys = PublicKeys::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: String| ParseError::Line {
                line: i + 1,
                reason,
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            let [algorithm, id, key] = words[..] else {
                return Err(bad(format!(
                    "expected `{ALGORITHM} <key id> <public key hex>`, got {line:?}"
                )));
            };
            if algorithm != ALGORITHM {
                return Err(bad(format!("unknown algorithm {algorithm:?}")));
            }
            let id = id
                .parse::<u64>()
                .ok()
                .filter(|&id| id != 0)
                .map(KeyId)
                .ok_or_else(|| bad(format!("key id {id:?} is not a positive integer")))?;
            let key = PublicKey::from_hex(key).map_err(|e| bad(e.to_string()))?;
            if keys.keys.insert(id, key).is_some() {
                return Err(ParseError::DuplicateKey(id));
            }
        }
        Ok(keys)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N], ParseError> {
    let text = text.trim();
    if text.len() != 2 * N {
        return Err(ParseError::Length {
            what,
            expected: N,
            got: text.len() / 2,
        });
    }
    let mut out = [0u8; N];
    for (i, chunk) in text.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(chunk).map_err(|_| ParseError::NotHex(what))?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| ParseError::NotHex(what))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u64, seed: u8) -> SigningKey {
        SigningKey::from_seed(KeyId(id), &[seed; 32])
    }

    fn grant() -> Grant<'static> {
        Grant {
            name: b"stock",
            token: 42,
            lease: 0x1234,
            revision: 57,
        }
    }

    fn keys_of(ks: &[&SigningKey]) -> PublicKeys {
        let mut p = PublicKeys::new();
        for k in ks {
            p.insert(k.id(), k.public_key());
        }
        p
    }

    #[test]
    fn a_signed_grant_verifies_and_every_altered_field_is_refused() {
        let k = key(1, 7);
        let keys = keys_of(&[&k]);
        let g = grant();
        let sig = k.sign(&g);
        assert_eq!(keys.verify(&g, KeyId(1), &sig), Ok(()));
        let bad = Err(VerifyError::BadSignature(KeyId(1)));
        let altered = [
            Grant { token: 43, ..g },
            Grant {
                token: i64::MAX,
                ..g
            },
            Grant { lease: 0x1235, ..g },
            Grant { revision: 58, ..g },
            Grant {
                name: b"stocks",
                ..g
            },
            Grant { name: b"", ..g },
        ];
        for a in &altered {
            assert_eq!(keys.verify(a, KeyId(1), &sig), bad, "{a:?}");
        }
        for i in 0..64 {
            let mut b = *sig.as_bytes();
            b[i] ^= 1;
            assert_eq!(keys.verify(&g, KeyId(1), &Signature(b)), bad, "byte {i}");
        }
        assert_eq!(
            keys.verify(&g, KeyId(2), &sig),
            Err(VerifyError::UnknownKey(KeyId(2)))
        );
        assert_eq!(keys.verify(&g, KeyId(0), &sig), Err(VerifyError::Unsigned));
    }

    #[test]
    fn a_token_of_another_cluster_is_refused() {
        let ours = key(1, 7);
        let theirs = key(1, 8);
        let g = grant();
        assert_eq!(
            keys_of(&[&ours]).verify(&g, KeyId(1), &theirs.sign(&g)),
            Err(VerifyError::BadSignature(KeyId(1)))
        );
    }

    #[test]
    fn the_key_id_is_covered_by_the_signature() {
        // Two keys with the same pair under different ids: a signature made as key 1 must
        // not verify as key 2's.
        let one = key(1, 7);
        let two = key(2, 7);
        let keys = keys_of(&[&one, &two]);
        let g = grant();
        assert_eq!(
            keys.verify(&g, KeyId(2), &one.sign(&g)),
            Err(VerifyError::BadSignature(KeyId(2)))
        );
    }

    #[test]
    fn old_keys_keep_verifying_after_a_rotation() {
        let old = key(1, 7);
        let new = key(2, 9);
        let keys = keys_of(&[&old, &new]);
        let g = grant();
        assert_eq!(keys.verify(&g, KeyId(1), &old.sign(&g)), Ok(()));
        assert_eq!(keys.verify(&g, KeyId(2), &new.sign(&g)), Ok(()));
    }

    #[test]
    fn length_prefixes_keep_names_apart() {
        // Without the name's length a name ending in the token's bytes could collide.
        let a = Grant {
            name: b"a",
            ..grant()
        }
        .signed_bytes(KeyId(1));
        let b = Grant {
            name: b"a\0",
            ..grant()
        }
        .signed_bytes(KeyId(1));
        assert_ne!(a[..a.len() - 24], b[..b.len() - 24]);
        assert_ne!(a.len(), b.len());
    }

    #[test]
    fn the_text_form_round_trips_and_refuses_bad_lines() {
        let keys = keys_of(&[&key(1, 7), &key(3, 9)]);
        let text = keys.to_text();
        assert_eq!(PublicKeys::parse(&text), Ok(keys.clone()));
        assert!(text.starts_with('#'));
        assert_eq!(
            text.lines().filter(|l| l.starts_with("ed25519 ")).count(),
            2
        );
        for bad in [
            "rsa 1 00",
            "ed25519 0 ".to_string().as_str(),
            "ed25519 x 00",
            "ed25519 1 zz",
            "ed25519 1",
        ] {
            assert!(PublicKeys::parse(bad).is_err(), "{bad:?}");
        }
        let line = text.lines().nth(1).unwrap();
        assert_eq!(
            PublicKeys::parse(&format!("{line}\n{line}\n")),
            Err(ParseError::DuplicateKey(KeyId(1)))
        );
    }

    #[test]
    fn signatures_round_trip_through_hex_and_refuse_other_lengths() {
        let sig = key(1, 7).sign(&grant());
        assert_eq!(Signature::from_hex(&sig.to_hex()), Ok(sig));
        assert!(Signature::from_hex("00").is_err());
        assert!(Signature::from_slice(&[0; 63]).is_err());
        assert_eq!(Signature::from_slice(sig.as_bytes()), Ok(sig));
    }
}
