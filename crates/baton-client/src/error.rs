//! The one error type of the crate.

use std::time::Duration;

use crate::lost::LostReason;
use crate::token::FencingToken;

/// Everything that can go wrong talking to Baton or etcd.
///
/// Variants are semantic (what happened to the lock, the session, the call) rather than raw
/// gRPC statuses, so callers can react without matching message texts; anything without a
/// dedicated variant is [`Error::Server`] with the server's code and message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot work (no endpoints, a TTL too short for its margin, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// TLS failed: the material of [`crate::ClientConfig::tls`] cannot be used (a file
    /// unreadable or not PEM: the path is named, a key's content never is), or the server
    /// refused this client's TLS (in Go's words, as etcdctl says it: `remote error: tls:
    /// certificate required`).
    #[error("TLS: {0}")]
    Tls(String),
    /// No endpoint accepted a connection.
    #[error("no endpoint reachable (tried {endpoints:?}): {last_error}")]
    Unreachable {
        /// The endpoints tried, in order.
        endpoints: Vec<String>,
        /// The last connection error.
        last_error: String,
    },
    /// The server (or the connection to it) is unavailable right now: no leader, leader
    /// changed, connection reset. Transient: retrying later, possibly elsewhere, is reasonable
    /// for reads; a write may or may not have been applied.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The client-side deadline of a call passed before an answer came.
    #[error("{what}: no answer within {after:?}")]
    DeadlineExceeded {
        /// The RPC.
        what: &'static str,
        /// The deadline that passed.
        after: Duration,
    },
    /// A lock (or permit, or campaign) was not obtained within the requested timeout; the
    /// waiter's key has been (or is being) deleted.
    #[error("not acquired within {0:?}")]
    Timeout(Duration),
    /// A try-lock found the lock held by someone else.
    #[error("lock is held by {holder}")]
    WouldBlock {
        /// The holder's key, as far as the server said.
        holder: String,
    },
    /// A try-lock found the lock in lock-delay after an expired holder (Baton only).
    #[error("lock is in lock-delay after an expired holder")]
    LockDelayed,
    /// The session (lease) ended, or the held key went away, so nothing can be held with it.
    #[error("session lost: {0}")]
    SessionLost(LostReason),
    /// Release or resign of a key that no longer holds (its token does not match).
    #[error("not the holder (the key is gone or was re-created)")]
    NotHolder,
    /// A fenced write or a fence-gate check was refused: a newer holder exists. Stop; do not
    /// retry with the same token.
    #[error("fencing token {token} rejected{}", highest.map(|h| format!(" (highest seen {h})")).unwrap_or_default())]
    FencingTokenRejected {
        /// The token that was refused.
        token: FencingToken,
        /// The highest token the gate has seen, when known (fence gate only).
        highest: Option<FencingToken>,
    },
    /// This session already holds a key in this recipe (a second acquisition by the same
    /// session would share the key and so the permit).
    #[error("this session already holds {key}")]
    AlreadyHeld {
        /// The existing key.
        key: String,
    },
    /// The server does not offer this (etcd 3.4 lacks Baton's `baton.v1` services).
    #[error("{0} is not supported by this server")]
    Unsupported(&'static str),
    /// A watch could not resume: the revisions it needs were compacted.
    #[error("required revision has been compacted (compact revision {0})")]
    Compacted(i64),
    /// Proclaim by a candidate that is no longer the leader.
    #[error("election: not leader")]
    NotLeader,
    /// A double barrier got more participants than its count.
    #[error("too many participants in the barrier")]
    TooManyParticipants,
    /// A fencing token's signature did not verify against the configured public keys (a
    /// forged or altered token, a token of another cluster, an unknown key id, or no
    /// signature at all): refused without asking Baton.
    #[error("fencing token refused: {0}")]
    InvalidFencingSignature(baton_fencing::VerifyError),
    /// Any other server error, with gRPC's code and the server's message.
    #[error("server error {code:?}: {message}")]
    Server {
        /// gRPC status code.
        code: tonic::Code,
        /// The server's message (etcd's text, or Baton's `baton: ...`).
        message: String,
    },
}

impl Error {
    /// Whether retrying the same operation later may succeed (a lost connection, no leader,
    /// a passed deadline). Recipes retry these themselves with jittered backoff.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::DeadlineExceeded { .. } | Error::Unreachable { .. }
        )
    }

    /// Whether the server refused the call's auth token: it expired, or the auth store
    /// changed since it was issued (etcd's "invalid auth token", "revision of auth store is
    /// old"). A client with a password authenticates again by itself; one given only a
    /// token ([`crate::ClientConfig::with_token`]) needs a new one.
    pub fn is_token_refused(&self) -> bool {
        match self {
            Error::Server { code, message } => refuses_token(*code, message),
            _ => false,
        }
    }

    /// Maps a gRPC status to the closest variant.
    pub(crate) fn from_status(s: tonic::Status) -> Error {
        use tonic::Code;
        let msg = s.message();
        // The server's TLS refused this client (no certificate, an untrusted or revoked
        // one): say so, rather than the "operation was canceled" that is left of it after
        // HTTP/2 (a TLS 1.3 server refuses after the client's side of the handshake).
        if let Some(why) = baton_tls::describe_tls_error(&s) {
            return Error::Tls(format!("the server refused the connection: {why}"));
        }
        if connection_failure(&s) {
            return Error::Unavailable(msg.to_string());
        }
        match s.code() {
            Code::Unimplemented => Error::Unsupported("this RPC"),
            Code::NotFound if msg.contains("requested lease not found") => {
                Error::SessionLost(LostReason::LeaseExpired)
            }
            Code::Unknown if msg == "election: not leader" => Error::NotLeader,
            code => Error::Server {
                code,
                message: msg.to_string(),
            },
        }
    }
}

/// Whether an answer with `code` and `message` refuses the token the call carried.
pub(crate) fn refuses_token(code: tonic::Code, message: &str) -> bool {
    (code == tonic::Code::Unauthenticated && message == "etcdserver: invalid auth token")
        || message == "etcdserver: revision of auth store is old"
}

/// Whether `s` says the connection (not the server) failed: `Unavailable`, or what tonic
/// reports when an HTTP/2 connection breaks under a pending call (`Unknown: transport
/// error`, h2 errors). Those are worth a retry elsewhere, unlike the server's own
/// `Unknown` answers (etcd's election errors).
pub(crate) fn connection_failure(s: &tonic::Status) -> bool {
    use tonic::Code;
    match s.code() {
        Code::Unavailable => true,
        Code::Unknown | Code::Internal | Code::Cancelled => {
            let m = s.message();
            [
                "transport error",
                "h2 protocol error",
                "error trying to connect",
                "connection reset",
                "connection closed",
                "broken pipe",
            ]
            .iter()
            .any(|needle| m.contains(needle))
        }
        _ => false,
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
