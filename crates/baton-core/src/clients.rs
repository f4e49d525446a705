//! Exactly-once application of retried writes: client sessions, each with a sequence number
//! per request and a cache of the responses it has not acknowledged yet (the Raft
//! dissertation, §6.3).
//!
//! Why in the replicated state: a write whose answer was lost (the leader died after
//! committing it, a connection broke) is retried by the client, possibly through another
//! member and another leader. Only the log knows whether the first attempt was applied, so the
//! table that remembers applied sequences must be replicated with it: every replica makes the
//! same replay-or-apply decision, and a new leader inherits it.
//!
//! Everything here is deterministic: a session expires when the *entry time* (stamped by the
//! leader) says it has been idle longer than its timeout, never by a local clock; ids are log
//! indexes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command::{Response, MAX_CLIENT_TIMEOUT_MS, MIN_CLIENT_TIMEOUT_MS};

/// Most sessions kept at once; registering one more evicts the least recently active. Bounds
/// memory against clients that register and vanish.
pub const MAX_CLIENT_SESSIONS: usize = 100_000;
/// Most unacknowledged responses kept per session. A client that pipelines further than this
/// without acknowledging loses the oldest answers: retrying those fails with
/// `StaleSequence` instead of applying twice.
pub const MAX_CACHED_RESPONSES: usize = 1024;

/// A cached answer: the store revision right after the request was applied, and its response.
///
/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CachedResponse {
    pub revision: i64,
    pub response: Response,
}

/// Persisted: see [`crate::format`] (fields never reorder).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClientSession {
    timeout_ms: u64,
    last_active_ms: u64,
    /// Every sequence below this was acknowledged by the client (or evicted): a request
    /// carrying one is a stale retry and is refused.
    floor: u64,
    /// Answers to applied sequences `>= floor`.
    responses: BTreeMap<u64, CachedResponse>,
}

/// What to do with a de-duplicated request.
#[derive(Debug, PartialEq)]
pub(crate) enum Decision {
    /// First time this sequence is seen: apply it, then `record` the answer.
    Apply,
    /// Applied before: answer with the cached response, change nothing.
    Replay(CachedResponse),
    /// No such session (never registered, expired, or evicted).
    UnknownClient,
    /// The sequence was acknowledged (or its answer evicted): the client must not be
    /// retrying it, and it cannot be known whether applying it again would duplicate it.
    Stale,
}

/// Sessions by id (the log index of the entry that registered them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClientTable {
    sessions: BTreeMap<u64, ClientSession>,
}

impl ClientTable {
    pub(crate) fn from_map(sessions: BTreeMap<u64, ClientSession>) -> Self {
        ClientTable { sessions }
    }

    pub(crate) fn map(&self) -> &BTreeMap<u64, ClientSession> {
        &self.sessions
    }

    pub(crate) fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Opens session `id` at `now_ms`, first dropping expired sessions and, at capacity, the
    /// least recently active one. Returns the timeout actually granted (clamped).
    pub(crate) fn register(&mut self, id: u64, timeout_ms: u64, now_ms: u64) -> u64 {
        let timeout_ms = timeout_ms.clamp(MIN_CLIENT_TIMEOUT_MS, MAX_CLIENT_TIMEOUT_MS);
        self.sessions.retain(|_, s| !s.expired(now_ms));
        if self.sessions.len() >= MAX_CLIENT_SESSIONS {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(id, s)| (s.last_active_ms, **id))
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                self.sessions.remove(&oldest);
            }
        }
        self.sessions.insert(
            id,
            ClientSession {
                timeout_ms,
                last_active_ms: now_ms,
                floor: 1,
                responses: BTreeMap::new(),
            },
        );
        timeout_ms
    }

    /// Ends session `id`; `false` if there was none.
    pub(crate) fn unregister(&mut self, id: u64) -> bool {
        self.sessions.remove(&id).is_some()
    }

    /// Decides a request `(id, sequence)` that acknowledges every answer below
    /// `acknowledged_below`. Touches the session (it is active) and forgets acknowledged
    /// answers, whatever the decision, unless the session is unknown or expired (an expired
    /// session is removed here, so the answer does not depend on when it was collected).
    pub(crate) fn decide(
        &mut self,
        id: u64,
        sequence: u64,
        acknowledged_below: u64,
        now_ms: u64,
    ) -> Decision {
        let Some(s) = self.sessions.get_mut(&id) else {
            return Decision::UnknownClient;
        };
        if s.expired(now_ms) {
            self.sessions.remove(&id);
            return Decision::UnknownClient;
        }
        s.last_active_ms = now_ms;
        // The request itself is not acknowledged by its own retry.
        let ack = acknowledged_below.min(sequence);
        if ack > s.floor {
            s.floor = ack;
            s.responses = s.responses.split_off(&ack);
        }
        if sequence < s.floor {
            return Decision::Stale;
        }
        match s.responses.get(&sequence) {
            Some(cached) => Decision::Replay(cached.clone()),
            None => Decision::Apply,
        }
    }

    /// Remembers the answer to a request `decide` said to apply.
    pub(crate) fn record(&mut self, id: u64, sequence: u64, answer: CachedResponse) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        s.responses.insert(sequence, answer);
        while s.responses.len() > MAX_CACHED_RESPONSES {
            let Some((&oldest, _)) = s.responses.first_key_value() else {
                break;
            };
            s.responses.remove(&oldest);
            s.floor = s.floor.max(oldest + 1);
        }
    }

    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        if self.sessions.len() > MAX_CLIENT_SESSIONS {
            return Err("client session table over capacity".into());
        }
        for (id, s) in &self.sessions {
            if *id == 0 || s.floor == 0 {
                return Err(format!("client session {id}: zero id or sequence floor"));
            }
            if s.responses.len() > MAX_CACHED_RESPONSES {
                return Err(format!("client session {id}: response cache over capacity"));
            }
            if s.responses.keys().next().is_some_and(|&q| q < s.floor) {
                return Err(format!(
                    "client session {id}: cached answer below its floor"
                ));
            }
        }
        Ok(())
    }
}

impl ClientSession {
    fn expired(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_active_ms) > self.timeout_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(revision: i64) -> CachedResponse {
        CachedResponse {
            revision,
            response: Response::Noop,
        }
    }

    #[test]
    fn replays_until_acknowledged_then_refuses() {
        let mut t = ClientTable::default();
        t.register(7, 60_000, 0);
        assert_eq!(t.decide(7, 1, 1, 10), Decision::Apply);
        t.record(7, 1, answer(2));
        assert_eq!(t.decide(7, 1, 1, 20), Decision::Replay(answer(2)));
        assert_eq!(t.decide(7, 2, 2, 30), Decision::Apply);
        t.record(7, 2, answer(3));
        // Sequence 3 acknowledges 1 and 2: a late retry of 1 is stale, 2 too.
        assert_eq!(t.decide(7, 3, 3, 40), Decision::Apply);
        assert_eq!(t.decide(7, 1, 1, 50), Decision::Stale);
        assert_eq!(t.decide(7, 2, 1, 50), Decision::Stale);
    }

    #[test]
    fn sessions_expire_by_entry_time() {
        let mut t = ClientTable::default();
        assert_eq!(t.register(9, 1, 0), MIN_CLIENT_TIMEOUT_MS);
        assert_eq!(t.decide(9, 1, 1, 1_000), Decision::Apply);
        assert_eq!(t.decide(9, 2, 1, 2_001), Decision::UnknownClient);
        assert_eq!(t.len(), 0);
        assert_eq!(t.decide(1, 1, 1, 0), Decision::UnknownClient);
    }

    #[test]
    fn cache_is_bounded_and_evicted_answers_are_stale() {
        let mut t = ClientTable::default();
        t.register(3, 60_000, 0);
        for q in 1..=(MAX_CACHED_RESPONSES as u64 + 5) {
            assert_eq!(t.decide(3, q, 1, 0), Decision::Apply);
            t.record(3, q, answer(q as i64));
        }
        assert_eq!(t.decide(3, 5, 1, 0), Decision::Stale);
        assert_eq!(t.decide(3, 6, 1, 0), Decision::Replay(answer(6)));
        t.check_invariants().unwrap();
    }
}
