//! The cluster's fencing-token signing keys, replicated (issue 16, part 4).
//!
//! Every lock grant of Baton's lock API carries a signature by the cluster's current key, so
//! a resource can refuse a made-up token (see `baton-fencing`). Every member signs the
//! grants it serves, so every member needs the private key: it is replicated through the
//! log like any state (`Command::FencingKey`) and kept in snapshots. The core holds only
//! bytes — it signs nothing and makes no keys (no randomness, no crypto here): the leader
//! draws the seed and derives the public key before proposing.
//!
//! Rotation installs a new current key; the old private key is dropped (nothing signs with
//! it again) and its public key kept, because grants it signed may still be held.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Public keys kept: the oldest is forgotten beyond this many (a rotation a day keeps almost
/// three years of them; a token older than that has long been superseded).
pub const MAX_FENCING_KEYS: usize = 1024;

/// Id of a signing key: 1 for the bootstrap key, one more per rotation (never 0, which the
/// wire uses for "unsigned").
///
/// Persisted: see [`crate::format`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingKeyId(pub u64);

/// An Ed25519 public key.
///
/// Persisted: see [`crate::format`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FencingPublicKey(pub [u8; 32]);

/// An Ed25519 private key's 32-byte seed. Its `Debug` does not show it (commands and states
/// are logged in tests and panics).
///
/// Persisted: see [`crate::format`].
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencingSecret(pub [u8; 32]);

impl std::fmt::Debug for FencingSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FencingSecret(..)")
    }
}

/// When a [`crate::Command::FencingKey`] installs its key.
///
/// Persisted: see [`crate::format`] (variants append-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FencingKeyMode {
    /// The leader's bootstrap duty: installed only while the state has no key, so two
    /// leaders (or one retrying) proposing one each end with one key.
    Bootstrap,
    /// An operator's rotation: always installed as the new current key.
    Rotate,
}

/// The key the members sign with now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CurrentFencingKey {
    pub id: FencingKeyId,
    pub public: FencingPublicKey,
    pub secret: FencingSecret,
}

/// The key ring: the current key pair and every public key still kept.
///
/// Persisted (snapshot format 6): see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencingKeys {
    current: Option<CurrentFencingKey>,
    public: BTreeMap<FencingKeyId, FencingPublicKey>,
    /// The last id given (ids are never reused, even once a public key is forgotten).
    last_id: u64,
}

impl FencingKeys {
    /// The key to sign with; `None` until the leader's bootstrap key is applied.
    pub fn current(&self) -> Option<&CurrentFencingKey> {
        self.current.as_ref()
    }

    /// Every public key kept, by ascending id (the current one last).
    pub fn public_keys(&self) -> &BTreeMap<FencingKeyId, FencingPublicKey> {
        &self.public
    }

    /// Installs a key per `mode`; the id it got, or `None` when a bootstrap found a key.
    pub(crate) fn install(
        &mut self,
        mode: FencingKeyMode,
        public: FencingPublicKey,
        secret: FencingSecret,
    ) -> Option<FencingKeyId> {
        if mode == FencingKeyMode::Bootstrap && self.current.is_some() {
            return None;
        }
        self.last_id += 1;
        let id = FencingKeyId(self.last_id);
        self.current = Some(CurrentFencingKey { id, public, secret });
        self.public.insert(id, public);
        while self.public.len() > MAX_FENCING_KEYS {
            self.public.pop_first();
        }
        Some(id)
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        if let Some(c) = &self.current {
            if self.public.get(&c.id) != Some(&c.public) || c.id.0 != self.last_id {
                return Err("the current fencing key is not the last one listed".into());
            }
        }
        if self.public.len() > MAX_FENCING_KEYS
            || self
                .public
                .keys()
                .any(|id| id.0 == 0 || id.0 > self.last_id)
        {
            return Err("fencing key ids out of range".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_installs_once_rotation_always_and_old_public_keys_stay() {
        let mut keys = FencingKeys::default();
        let (p1, s1) = (FencingPublicKey([1; 32]), FencingSecret([11; 32]));
        let (p2, s2) = (FencingPublicKey([2; 32]), FencingSecret([12; 32]));
        assert_eq!(
            keys.install(FencingKeyMode::Bootstrap, p1, s1),
            Some(FencingKeyId(1))
        );
        assert_eq!(keys.install(FencingKeyMode::Bootstrap, p2, s2), None);
        assert_eq!(keys.current().unwrap().secret, s1);
        assert_eq!(
            keys.install(FencingKeyMode::Rotate, p2, s2),
            Some(FencingKeyId(2))
        );
        let current = keys.current().unwrap();
        assert_eq!((current.id, current.secret), (FencingKeyId(2), s2));
        assert_eq!(
            keys.public_keys().iter().collect::<Vec<_>>(),
            [(&FencingKeyId(1), &p1), (&FencingKeyId(2), &p2)]
        );
        keys.check_invariants().unwrap();
        assert_eq!(format!("{s1:?}"), "FencingSecret(..)");
    }

    #[test]
    fn the_oldest_public_keys_go_beyond_the_bound_and_ids_are_not_reused() {
        let mut keys = FencingKeys::default();
        for i in 0..MAX_FENCING_KEYS as u64 + 2 {
            keys.install(
                FencingKeyMode::Rotate,
                FencingPublicKey([i as u8; 32]),
                FencingSecret([0; 32]),
            );
        }
        assert_eq!(keys.public_keys().len(), MAX_FENCING_KEYS);
        assert_eq!(keys.public_keys().keys().next(), Some(&FencingKeyId(3)));
        assert_eq!(
            keys.current().unwrap().id,
            FencingKeyId(MAX_FENCING_KEYS as u64 + 2)
        );
        keys.check_invariants().unwrap();
    }
}
