//! What a coordinator needs from a database (or any other resource) to take part in 2PC.
//!
//! Two traits, because the two phases need different things: [`Branch`] is one *open local
//! transaction* the application did its work in (it lives only inside one coordinator
//! process), and [`Resource`] is a way to reach the database at any later time, from any
//! process, to finish or inspect prepared branches by GID (phase 2 and recovery).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::ids::{BranchId, Gid};

/// A boxed, sendable future (the traits are object-safe so a coordinator can hold branches of
/// several kinds of database at once).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A participant's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParticipantError {
    /// The resource could not be reached or failed in a way that may pass (connection lost,
    /// server restarting). Phase 2 and recovery retry these.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The resource refused the request (a constraint, a serialization failure, a full
    /// disk). In phase 1 this is a NO vote.
    #[error("refused: {0}")]
    Refused(String),
    /// The resource is not set up for two-phase commit (PostgreSQL's
    /// `max_prepared_transactions` is 0, a MariaDB before 10.5, Galera).
    #[error("not usable for two-phase commit: {0}")]
    Unsupported(String),
}

/// What became of a phase-2 request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// This request committed (or rolled back) the prepared branch.
    Done,
    /// No prepared branch with this GID exists (PostgreSQL's SQLSTATE 42704, MariaDB's
    /// `XAER_NOTA`): it was finished before — by us, by another coordinator, or by hand — or
    /// never prepared. Which one is told by the branch's marker row
    /// ([`Resource::marker_exists`]).
    AlreadyGone,
}

/// A prepared branch found in a resource by [`Resource::list_prepared`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedBranch {
    /// Its GID.
    pub gid: Gid,
    /// How long ago it was prepared, where the resource knows (PostgreSQL does; MariaDB's
    /// `XA RECOVER` does not).
    pub age: Option<Duration>,
}

/// One open local transaction enlisted in a global transaction: the application's work is
/// done in it before the commit starts.
pub trait Branch: Send {
    /// The resource this branch belongs to.
    fn resource(&self) -> &BranchId;

    /// Phase 1: writes the branch's *marker row* (its GID, in a table of the same database)
    /// inside the local transaction and then prepares it under `gid` (PostgreSQL's
    /// `PREPARE TRANSACTION`, MariaDB's `XA END` + `XA PREPARE`). `Ok` is a YES vote: the
    /// branch is durable and can only be finished by [`Resource::commit_prepared`] or
    /// [`Resource::rollback_prepared`]. An error is a NO vote; the local transaction must
    /// then be gone (rolled back), as far as the resource can tell.
    fn prepare<'a>(&'a mut self, gid: &'a Gid) -> BoxFuture<'a, Result<(), ParticipantError>>;

    /// Rolls the local transaction back before it was prepared (the commit was abandoned
    /// before phase 1, or another branch voted NO first).
    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), ParticipantError>>;
}

/// A participant resource reachable at any time: finishes and lists prepared branches.
///
/// Every method is idempotent: phase 2 and recovery may run them several times, from
/// several processes, concurrently.
pub trait Resource: Send + Sync {
    /// The resource's stable name (the branch id of its branches).
    fn id(&self) -> &BranchId;

    /// Commits the prepared branch `gid`.
    fn commit_prepared<'a>(
        &'a self,
        gid: &'a Gid,
    ) -> BoxFuture<'a, Result<Finish, ParticipantError>>;

    /// Rolls back the prepared branch `gid`.
    fn rollback_prepared<'a>(
        &'a self,
        gid: &'a Gid,
    ) -> BoxFuture<'a, Result<Finish, ParticipantError>>;

    /// The prepared branches of this resource in `namespace` (GIDs of other namespaces, other
    /// resources and other software are not listed, and never touched).
    fn list_prepared<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PreparedBranch>, ParticipantError>>;

    /// Whether the marker row of `gid` is committed: after [`Finish::AlreadyGone`], `true`
    /// means the branch committed, `false` that it rolled back (or never prepared).
    fn marker_exists<'a>(&'a self, gid: &'a Gid) -> BoxFuture<'a, Result<bool, ParticipantError>>;

    /// Deletes marker rows older than `older_than` whose branch is no longer prepared;
    /// returns how many. Markers are needed only while phase 2 or recovery may still find
    /// their branch "already gone", so keep `older_than` well above the longest time a
    /// transaction may stay open. The default keeps every marker.
    fn purge_markers(&self, older_than: Duration) -> BoxFuture<'_, Result<u64, ParticipantError>> {
        let _ = older_than;
        Box::pin(async { Ok(0) })
    }

    /// Checks that the resource can take part in 2PC at all, with warnings for settings that
    /// weaken it (MariaDB's binary log). An error says why it cannot.
    fn preflight(&self) -> BoxFuture<'_, Result<Vec<String>, ParticipantError>>;
}
