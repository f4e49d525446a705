//! Why a session was lost: the reason `Session::lost` reports and `Error::SessionLost`
//! carries. In its own module so the error type does not depend on the session (which
//! depends on the client, which returns the error): a cycle `session → client → error →
//! session` otherwise (the tidy test `no_module_cycles`).

/// Why a session, or something held with it, was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// The server answered a keep-alive with TTL 0, or said the lease does not exist: it
    /// expired or was revoked.
    LeaseExpired,
    /// No keep-alive was acknowledged before the local expiry estimate passed (partition,
    /// overloaded server, or this process was paused).
    KeepAliveDeadline,
    /// The session was closed, or dropped by its owner.
    Closed,
    /// The held key disappeared while the lease lived (an operator's force-release, a
    /// manual delete).
    KeyDeleted,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::LeaseExpired => {
                "the lease expired or was revoked (keep-alive answered TTL 0)"
            }
            LostReason::KeepAliveDeadline => {
                "no keep-alive acknowledged before the local expiry estimate"
            }
            LostReason::Closed => "the session was closed",
            LostReason::KeyDeleted => "the held key was deleted (force-release or manual delete)",
        })
    }
}
