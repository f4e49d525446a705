//! Exactly-once sessions: `RegisterClient` / `UnregisterClient` and the `Deduplicated`
//! wrapper, which applies a KV write or fence check at most once per `(client, sequence)` and
//! answers a retry from the cached first answer.
//!
//! The session table itself (decisions, the answer cache, expiry by entry time) is
//! `crate::clients`; this module is where its decision meets the state machine. A
//! `Deduplicated` command arrives here already validated together with what it wraps, and
//! the wrapped command is run by the caller's closure, so nothing is validated twice and
//! nothing here recurses into `apply`.

use crate::clients::{CachedResponse, Decision};
use crate::command::{KvError, Response};
use crate::types::Revision;

use super::store::{StateMachine, Writes};

/// The session fields of a `Deduplicated` command.
pub(super) struct Sequenced {
    pub(super) client_id: u64,
    pub(super) sequence: u64,
    pub(super) acknowledged_below: u64,
}

impl StateMachine {
    /// Decides `session`'s request and, if it is new, applies it with `execute` and caches
    /// the answer (the session's decision and its record stay in this one function).
    pub(super) fn apply_deduplicated(
        &mut self,
        session: Sequenced,
        w: &mut Writes,
        execute: impl FnOnce(&mut Self, &mut Writes) -> Result<Response, KvError>,
    ) -> Result<Response, KvError> {
        let decision = self.clients.decide(
            session.client_id,
            session.sequence,
            session.acknowledged_below,
            self.last_time_ms,
        );
        match decision {
            Decision::UnknownClient => Err(KvError::UnknownClient),
            Decision::Stale => Err(KvError::StaleSequence),
            Decision::Replay(cached) => Ok(Response::Deduplicated {
                replayed: true,
                revision: Revision(cached.revision),
                response: Box::new(cached.response),
            }),
            Decision::Apply => {
                // The wrapped command's own failure is an answer like any other: it is
                // cached, so a retry gets the same error instead of a second attempt.
                let response = execute(self, w).unwrap_or_else(|e| {
                    assert!(w.events.is_empty(), "a failed command wrote something");
                    Response::Error(e)
                });
                let revision = if w.events.is_empty() {
                    self.revision
                } else {
                    w.rev
                };
                self.clients.record(
                    session.client_id,
                    session.sequence,
                    CachedResponse {
                        revision,
                        response: response.clone(),
                    },
                );
                Ok(Response::Deduplicated {
                    replayed: false,
                    revision: Revision(revision),
                    response: Box::new(response),
                })
            }
        }
    }

    pub(super) fn apply_register_client(&mut self, timeout_ms: u64) -> Response {
        let (index, _) = self.last_applied.expect("set before apply_command");
        // Index 0 never carries a client command in practice (openraft starts at 1);
        // keep ids non-zero regardless, 0 meaning "no session" on the wire.
        let client_id = index.0.max(1);
        let timeout_ms = self
            .clients
            .register(client_id, timeout_ms, self.last_time_ms);
        Response::ClientRegistered {
            client_id,
            timeout_ms,
        }
    }

    pub(super) fn apply_unregister_client(&mut self, client_id: u64) -> Response {
        Response::ClientUnregistered {
            existed: self.clients.unregister(client_id),
        }
    }

    /// Number of open de-duplication sessions (for status and metrics).
    pub fn client_sessions(&self) -> usize {
        self.clients.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::state_machine::tests::{entry, put};

    fn dedup(sequence: u64, command: Command) -> Command {
        Command::Deduplicated {
            client_id: 1,
            sequence,
            acknowledged_below: 0,
            command: Box::new(command),
        }
    }

    /// Validation covers the wrapper and what it wraps before the session decides anything:
    /// a wrapper inside a wrapper is refused as a whole, and its sequence stays unused.
    #[test]
    fn a_nested_wrapper_is_refused_before_the_session_decides() {
        let mut sm = StateMachine::new();
        let registered = sm.apply(&entry(1, Command::RegisterClient { timeout_ms: 60_000 }));
        assert!(matches!(
            registered.response,
            Response::ClientRegistered { client_id: 1, .. }
        ));
        let nested = sm.apply(&entry(2, dedup(1, dedup(1, put("a", "1")))));
        assert_eq!(nested.response, Response::Error(KvError::NotDeduplicable));
        assert!(nested.events.is_empty());
        let first = sm.apply(&entry(3, dedup(1, put("a", "1"))));
        assert_eq!(
            first.response,
            Response::Deduplicated {
                replayed: false,
                revision: Revision(2),
                response: Box::new(Response::Put(Default::default())),
            }
        );
        let retry = sm.apply(&entry(4, dedup(1, put("a", "2"))));
        assert!(retry.events.is_empty(), "a retry writes nothing");
        assert!(matches!(
            retry.response,
            Response::Deduplicated {
                replayed: true,
                revision: Revision(2),
                ..
            }
        ));
        sm.check_invariants().expect("invariants");
    }
}
