//! The permission checks every service runs once auth is enabled, over one request's
//! caller (etcd's `AuthInfoFromCtx` + `IsRangePermitted` / `IsAdminPermitted`, and the
//! `Authorized` wrapper the core checks again at apply). With auth off each is a no-op, so
//! the services behave exactly as before auth existed.

use baton_core::{AuthInfo, Command, PermType};
use baton_raft::Proposed;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::auth::IdentityError;
use crate::conn::ClientConnectInfo;
use crate::errors::{auth_status, INVALID_AUTH_TOKEN};
use crate::Shared;

/// Who sent a request: `None` when it carried no token and no client certificate.
pub type Caller = Option<AuthInfo>;

impl Shared {
    /// The caller of `request` (token metadata, else a client certificate's CN). A token
    /// that does not check out is etcd's "invalid auth token", auth on or off.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let conn = request.extensions().get::<ClientConnectInfo>();
        self.caller_from(request.metadata(), conn)
    }

    /// [`Self::caller`] from a request's parts (a watch stream resolves its caller again at
    /// every create, as etcd does, so a token's revision is the current one).
    pub fn caller_from(
        &self,
        metadata: &MetadataMap,
        conn: Option<&ClientConnectInfo>,
    ) -> Result<Caller, Status> {
        let now_ms = self.node.time_ms();
        self.node
            .read(|sm| self.config.auth.identify(sm, now_ms, metadata, conn))
            .map_err(|IdentityError::InvalidToken| Status::unauthenticated(INVALID_AUTH_TOKEN))
    }

    /// Proposes `command` on behalf of `caller`: with auth on, refused before proposing if
    /// the caller may not (no log entry), else wrapped in `Command::Authorized` so `apply`
    /// checks again against the auth store as it is then.
    pub async fn propose_as(&self, caller: &Caller, command: Command) -> Result<Proposed, Status> {
        let command = self.authorized(caller, command)?;
        self.propose(command).await
    }

    /// [`Self::propose_as`] for a write whose answer is all the caller gets from it: on a
    /// follower, answered from the leader's apply (`baton_raft::Node::propose_owing_apply`).
    pub async fn propose_owing_apply_as(
        &self,
        caller: &Caller,
        command: Command,
    ) -> Result<Proposed, Status> {
        let command = self.authorized(caller, command)?;
        self.node
            .propose_owing_apply(command)
            .await
            .map_err(|e| crate::errors::propose_status(&e))
    }

    /// `command` as `caller` may propose it (see [`Self::propose_as`]).
    fn authorized(&self, caller: &Caller, command: Command) -> Result<Command, Status> {
        let enabled = self.node.read(|sm| {
            sm.auth_precheck(caller.as_ref(), &command)
                .map(|()| sm.auth_enabled())
        });
        Ok(match (enabled.map_err(auth_status)?, caller) {
            (true, Some(auth)) => Command::Authorized {
                auth: auth.clone(),
                command: Box::new(command),
            },
            _ => command,
        })
    }

    /// `perm` on `[key, range_end)` for `caller` (etcd's range conventions).
    pub fn check_perm(
        &self,
        caller: &Caller,
        perm: PermType,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), Status> {
        self.node
            .read(|sm| sm.auth_permitted(caller.as_ref(), perm, key, range_end))
            .map_err(auth_status)
    }

    /// The root role, as etcd requires for maintenance and membership (`IsAdminPermitted`).
    pub fn require_admin(&self, caller: &Caller) -> Result<(), Status> {
        let user = caller.as_ref().map_or("", |c| c.user.as_str());
        self.node
            .read(|sm| sm.admin_permitted(user))
            .map_err(auth_status)
    }

    /// `perm` on lock (or election) `name`'s queue, the keys `name/…` its waiters hold:
    /// what etcd's client-side recipes would need to run the same lock.
    pub fn check_lock(&self, caller: &Caller, perm: PermType, name: &[u8]) -> Result<(), Status> {
        let range = baton_core::lock_prefix(name);
        self.check_perm(caller, perm, &range.key, &range.range_end)
    }
}
