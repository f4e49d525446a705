//! The entry point of the log: [`StateMachine::apply`] orders entries, validates each command
//! once, and routes it to the domain module that owns it. Nothing here decides anything about
//! keys, leases, locks or sessions; it holds the rules every entry shares: applied in log
//! order, a failed command writes nothing, and the revision moves only forward, by one, and
//! only when something was written.

use crate::command::{Applied, Command, Entry, KvError, Response};
use crate::types::Revision;
use crate::validate;

use super::dedup::Sequenced;
use super::store::{StateMachine, Writes};

impl StateMachine {
    /// Applies one log entry. Never fails: domain errors come back as `Response::Error`, and
    /// such an entry changes nothing (but its index still counts as applied).
    pub fn apply(&mut self, entry: &Entry) -> Applied {
        if let Some((index, _)) = self.last_applied {
            // Applying out of order or twice would silently fork this replica from the others.
            assert!(
                entry.index > index,
                "log entry {} applied after {}",
                entry.index.0,
                index.0
            );
        }
        self.last_applied = Some((entry.index, entry.term));
        self.last_time_ms = self.last_time_ms.max(entry.time_ms);

        let mut w = Writes::new(self.revision + 1);
        let result = self.apply_command(&entry.command, &mut w);
        // A refused command may still have read the store first (etcd counts those reads).
        w.end_view();
        let response = match result {
            Ok(r) => {
                let mut cmd = &entry.command;
                while let Command::Deduplicated { command, .. }
                | Command::Authorized { command, .. } = cmd
                {
                    cmd = command;
                }
                self.collect_idle_locks(cmd, &w.events);
                r
            }
            Err(e) => {
                assert!(w.events.is_empty(), "a failed command wrote something");
                Response::Error(e)
            }
        };
        if !w.events.is_empty() {
            debug_assert!(w.events.iter().all(|e| e.kv.mod_revision.0 == w.rev));
            // The pair: the entry's writes went to exactly the revision after the one it
            // started from. Anything else means a command moved `revision` itself, and a
            // revision that goes back (or skips) breaks every watcher and reader after it.
            assert_eq!(
                w.rev,
                self.revision + 1,
                "revision {} recorded after {}",
                w.rev,
                self.revision
            );
            self.revision = w.rev;
        }
        Applied {
            revision: Revision(self.revision),
            response,
            events: w.events,
            ops: w.ops,
        }
    }

    /// Stateless checks the server runs before proposing, so bad input is refused without a
    /// log entry: empty keys, too many txn ops, a key modified twice in one txn, a TTL too
    /// large. `apply` repeats every check (the log may hold entries from older versions).
    ///
    /// Request size (`RequestTooLarge`) is not checked here: only the server knows the
    /// encoded protobuf size etcd's limit is defined on.
    pub fn validate(cmd: &Command) -> Result<(), KvError> {
        validate::validate(cmd)
    }

    /// Validates `cmd` (a wrapper together with what it wraps), then applies it: unwrapped
    /// from its exactly-once session if it is `Deduplicated`, routed by [`Self::execute`].
    fn apply_command(&mut self, cmd: &Command, w: &mut Writes) -> Result<Response, KvError> {
        validate::validate(cmd)?;
        let cmd = match cmd {
            Command::Authorized { auth, command } => {
                self.authorize(auth, command)?;
                &**command
            }
            other => other,
        };
        // Before any de-duplication decision: a refused exactly-once write leaves its
        // sequence unused, so the client's retry once space is back is applied, not answered
        // from a cache with this refusal.
        if self.corrupt() && cmd.refused_while_corrupt() {
            return Err(KvError::Corrupt);
        }
        if self.no_space() && cmd.adds_data() {
            return Err(KvError::NoSpace);
        }
        match cmd {
            Command::Deduplicated {
                client_id,
                sequence,
                acknowledged_below,
                command,
            } => {
                let session = Sequenced {
                    client_id: *client_id,
                    sequence: *sequence,
                    acknowledged_below: *acknowledged_below,
                };
                self.apply_deduplicated(session, w, |sm, w| sm.execute(command, w))
            }
            other => self.execute(other, w),
        }
    }

    /// Routes one validated command to the domain that owns it.
    fn execute(&mut self, cmd: &Command, w: &mut Writes) -> Result<Response, KvError> {
        match cmd {
            Command::Noop => Ok(Response::Noop),
            Command::Put(p) => self.apply_put(p, w),
            Command::DeleteRange(d) => Ok(self.apply_delete_range(d, w)),
            Command::Txn(t) => self.apply_txn(t, w),
            Command::Compact { revision } => self.apply_compact(*revision),
            Command::LeaseGrant { id, ttl_s } => self.apply_lease_grant(*id, *ttl_s),
            Command::LeaseRevoke { id } => self.apply_lease_revoke(*id, w),
            Command::ExpireLeases { ids } => Ok(self.expire_leases(ids, w)),
            Command::ExpireLeasesInTerm { term, ids } => {
                Ok(self.expire_leases_in_term(*term, ids, w))
            }
            Command::LeaseCheckpoint { checkpoints } => {
                Ok(self.apply_lease_checkpoint(checkpoints))
            }
            Command::LockEnqueue {
                name,
                lease,
                value,
                delay_ms,
            } => self.apply_lock_enqueue(name, *lease, value, *delay_ms, w),
            Command::LockForceRelease {
                name,
                token,
                reason,
            } => self.apply_lock_force_release(name, *token, reason, w),
            Command::FenceCheck { resource, token } => self.apply_fence_check(resource, *token),
            Command::RegisterClient { timeout_ms } => Ok(self.apply_register_client(*timeout_ms)),
            Command::UnregisterClient { client_id } => Ok(self.apply_unregister_client(*client_id)),
            Command::Alarm {
                action,
                member_id,
                alarm,
            } => Ok(self.apply_alarm(*action, *member_id, *alarm)),
            Command::Auth(a) => {
                let (index, _) = self.last_applied.expect("set before apply_command");
                self.apply_auth(a, index.0)
            }
            Command::FencingKey {
                mode,
                public,
                secret,
            } => Ok(Response::FencingKey {
                installed: self.fencing_keys.install(*mode, *public, *secret),
            }),
            // `apply_command` unwraps the wrappers an entry may have: validation admits
            // only KV writes and fence checks inside `Deduplicated`, so this is what it
            // would answer; a second `Authorized` is refused by validation.
            Command::Deduplicated { .. } => Err(KvError::NotDeduplicable),
            Command::Authorized { .. } => Err(KvError::MisplacedAuthorized),
        }
    }
}
