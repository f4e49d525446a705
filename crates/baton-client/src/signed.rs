//! Signed fencing tokens on the client's side: [`SignedToken`], what a grant of Baton's lock
//! API proves (its name, token, lease and revision under the cluster's signature), and the
//! calls that fetch the cluster's public keys and rotate its key.
//!
//! A resource that verifies [`SignedToken`]s against the cluster's [`PublicKeys`] cannot be
//! locked out by someone who presents a made-up huge token: such a token has no valid
//! signature, and is refused before anything is recorded (see [`crate::FenceGate`]). The
//! encoding and the crypto are `baton-fencing`'s, shared with the server that signs.

use baton_fencing::Grant;
use baton_proto::baton::v1 as bpb;
use baton_proto::baton::v1::fence_client::FenceClient;

use crate::client::{request, Client, Deadline, Retry};
use crate::error::{Error, Result};
use crate::token::FencingToken;

/// The algorithm's name in the public keys' text and JSON forms (`"ed25519"`).
pub use baton_fencing::ALGORITHM as FENCING_KEY_ALGORITHM;
pub use baton_fencing::{
    KeyId, ParseError as PublicKeysParseError, PublicKey, PublicKeys, Signature, VerifyError,
};

/// A lock grant as signed by the cluster: what a resource needs to check that `token` is
/// one Baton gave (to the holder of `lease`, for lock `name`, at `revision`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedToken {
    /// The lock's name.
    pub name: Vec<u8>,
    /// The fencing token.
    pub token: FencingToken,
    /// The holder's lease id.
    pub lease: i64,
    /// The store revision of the grant.
    pub revision: i64,
    /// Key id 0 with no signature: the cluster had no key yet (just after bootstrap).
    pub key_id: KeyId,
    /// The cluster's Ed25519 signature of the above under `key_id`.
    pub signature: Option<Signature>,
}

impl SignedToken {
    /// `Ok` iff the signature is the cluster's over this grant (see `baton_fencing`).
    pub fn verify(&self, keys: &PublicKeys) -> std::result::Result<(), VerifyError> {
        let signature = self.signature.as_ref().ok_or(VerifyError::Unsigned)?;
        let grant = Grant {
            name: &self.name,
            token: self.token.get(),
            lease: self.lease,
            revision: self.revision,
        };
        keys.verify(&grant, self.key_id, signature)
    }

    /// The signed token of a `baton.v1.Lock` grant for `name`.
    pub(crate) fn from_grant(name: &[u8], resp: &bpb::AcquireResponse) -> SignedToken {
        SignedToken {
            name: name.to_vec(),
            token: FencingToken::new(resp.fencing_token),
            lease: resp.lease,
            revision: resp.revision,
            key_id: KeyId::new(resp.key_id),
            // An empty (or malformed) signature is no signature: it verifies as `Unsigned`.
            signature: Signature::from_slice(&resp.signature).ok(),
        }
    }
}

/// The cluster's public keys as [`Client::fence_public_keys`] reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceKeys {
    /// Every key, old ones included (tokens they signed may still be held).
    pub keys: PublicKeys,
    /// The key grants are signed with now; `None` before the bootstrap key exists.
    pub current: Option<KeyId>,
}

impl Client {
    /// Every public key the cluster signs (or signed) fencing tokens with
    /// (`baton.v1.Fence/PublicKeys`): what a resource configures to verify them. Baton
    /// only ([`Error::Unsupported`] on etcd).
    pub async fn fence_public_keys(&self) -> Result<FenceKeys> {
        let resp = self
            .call(
                "baton.v1.Fence/PublicKeys",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = request(bpb::FencePublicKeysRequest {}, t);
                    async move { FenceClient::new(ch).public_keys(r).await }
                },
            )
            .await?;
        let mut keys = PublicKeys::new();
        let mut current = None;
        for k in resp.keys {
            let bytes: [u8; 32] =
                k.public_key
                    .as_slice()
                    .try_into()
                    .map_err(|_| Error::Server {
                        code: tonic::Code::Internal,
                        message: format!("baton: public key {} is not 32 bytes", k.id),
                    })?;
            let id = KeyId::new(k.id);
            keys.insert(id, PublicKey::from_bytes(bytes));
            if k.current {
                current = Some(id);
            }
        }
        Ok(FenceKeys { keys, current })
    }

    /// Rotates the cluster's fencing key (`baton.v1.Fence/RotateKey`): the leader makes a
    /// new one; old public keys stay valid. Only the leader accepts it ("etcdserver: not
    /// leader" elsewhere: connect to the leader's endpoint); root only with auth on. Sent
    /// once.
    pub async fn rotate_fence_key(&self) -> Result<KeyId> {
        let resp = self
            .call(
                "baton.v1.Fence/RotateKey",
                Retry::Once,
                Deadline::Default,
                |ch, t| {
                    let r = request(bpb::FenceRotateKeyRequest {}, t);
                    async move { FenceClient::new(ch).rotate_key(r).await }
                },
            )
            .await?;
        Ok(KeyId::new(resp.key_id))
    }
}
