//! [`FencingToken`]: the number a lock holder shows to the resources it writes.

/// A lock holder's fencing token: its key's create revision, so every later holder of the
/// same lock has a larger one. A resource that remembers the highest token it has accepted
/// and refuses lower ones cannot be written by a holder that has been replaced (a paused
/// process waking up, a delayed packet).
///
/// The client's own type (it shares nothing with the server's crates, so it works against
/// etcd as well): it becomes the wire's `int64` only where a request is built or an answer
/// read. Shown to people and written into other systems (SQL columns, headers) as the plain
/// number: see [`FencingToken::get`] and the `Display` impl.
///
/// ```
/// use baton_client::FencingToken;
///
/// let (older, newer) = (FencingToken::new(7), FencingToken::new(12));
/// assert!(older < newer);
/// assert_eq!(newer.to_string(), "12");
/// assert_eq!(newer.get(), 12);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(i64);

impl FencingToken {
    /// The token with this number (as read from the wire, a database column or a header).
    pub const fn new(value: i64) -> FencingToken {
        FencingToken(value)
    }

    /// The number, for the wire, a database column or a header.
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
