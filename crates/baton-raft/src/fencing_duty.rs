//! The fencing-token signing key's leader duties ([`FencingKeyDuty`]): make the cluster's
//! first key when the replicated state has none (bootstrap), and make a new one when an
//! operator asks for a rotation.
//!
//! Only the leader does either, and it draws the key's seed from the replica's randomness
//! (`Replica::rng`: the OS's, or the simulation's seed) and derives the public key itself
//! (`baton-fencing`), then proposes `Command::FencingKey` through `Replica::propose`. The
//! command is a leader duty (`origin`): nobody else can install a key, so nobody else knows
//! a private key the cluster signs with (beyond who can read a member's data directory,
//! which holds it, like every replicated state).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use baton_core::{
    Command, FencingKeyId, FencingKeyMode, FencingPublicKey, FencingSecret, Response,
};
use openraft::ServerState;

use crate::answer::{InternalError, ProposeError};
use crate::replica::Replica;
use crate::space;

pub(crate) struct FencingKeyDuty {
    replica: Arc<Replica>,
    /// A bootstrap proposal is in flight (one at a time; the tick comes every 100 ms).
    bootstrapping: AtomicBool,
    /// Warnings of failed bootstrap proposals (a full disk refuses one every tick).
    bootstrap_log: space::RateLimit,
}

impl FencingKeyDuty {
    pub(crate) fn new(replica: Arc<Replica>) -> Arc<FencingKeyDuty> {
        Arc::new(FencingKeyDuty {
            replica,
            bootstrapping: AtomicBool::new(false),
            bootstrap_log: space::RateLimit::default(),
        })
    }

    /// One tick: on the leader, with no key in the applied state, propose the bootstrap key.
    /// A second leader's bootstrap (or a retry after an unknown outcome) is harmless: the
    /// core installs a bootstrap key only while there is none.
    pub(crate) fn tick(self: &Arc<Self>) {
        let replica = &self.replica;
        if replica.role().state != ServerState::Leader
            || replica
                .shared
                .state
                .read()
                .sm
                .fencing_keys()
                .current()
                .is_some()
            || self.bootstrapping.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let duty = self.clone();
        tokio::spawn(async move {
            match duty.install(FencingKeyMode::Bootstrap).await {
                Ok(Some(id)) => tracing::info!(key_id = id.0, "fencing key created (bootstrap)"),
                Ok(None) => {}
                Err(e) => {
                    if duty.bootstrap_log.allow() {
                        tracing::warn!(error = %e, "proposing the bootstrap fencing key failed; will retry");
                    }
                }
            }
            duty.bootstrapping.store(false, Ordering::Release);
        });
    }

    /// A rotation: a new current key, made here. Only the leader rotates (`NotLeader`
    /// elsewhere, as etcd's MoveLeader; the CLI asks the leader), so the key never travels
    /// in a request.
    pub(crate) async fn rotate(&self) -> Result<FencingKeyId, ProposeError> {
        let role = self.replica.role();
        if role.state != ServerState::Leader {
            return Err(match role.leader {
                Some(leader) => ProposeError::NotLeader {
                    leader: Some(leader),
                },
                None => ProposeError::NoLeader,
            });
        }
        let id = self.install(FencingKeyMode::Rotate).await?;
        let id = id.expect("a rotation always installs its key");
        tracing::info!(key_id = id.0, "fencing key rotated");
        Ok(id)
    }

    async fn install(&self, mode: FencingKeyMode) -> Result<Option<FencingKeyId>, ProposeError> {
        let mut seed = [0u8; 32];
        rand::RngCore::fill_bytes(&mut *self.replica.rng.lock(), &mut seed);
        // The id only matters for signing; deriving the public key needs none.
        let public =
            baton_fencing::SigningKey::from_seed(baton_fencing::KeyId::new(0), &seed).public_key();
        let command = Command::FencingKey {
            mode,
            public: FencingPublicKey(*public.as_bytes()),
            secret: FencingSecret(seed),
        };
        let proposed = self.replica.propose(command).await?;
        match proposed.applied.response {
            Response::FencingKey { installed } => Ok(installed),
            Response::Error(baton_core::KvError::NoSpace) => Err(ProposeError::NoSpace),
            other => {
                tracing::error!(?other, "unexpected answer to a FencingKey");
                Err(ProposeError::Internal(InternalError::UnexpectedAnswer))
            }
        }
    }
}
