//! `etcdserverpb.Auth`: enabling and disabling auth, authenticating, and managing users and
//! roles, with etcd's checks, codes and messages. Changes go through the log as
//! `Command::Auth` (on behalf of the caller, so `apply` requires the root role once auth is
//! on); reads are served from this member's state after a read barrier, with etcd's
//! exceptions (a user may read itself, and the roles it holds). Passwords are hashed here,
//! off the runtime's workers, and never logged, stored or answered in clear.

use baton_core::{AuthCommand, AuthError, AuthResponse, Command, PermType, Permission, Response};
use baton_proto::authpb;
use baton_proto::etcdserverpb as pb;
use tonic::{Request, Status};

use crate::access::Caller;
use crate::auth::Authenticator;
use crate::errors::{auth_status, kv_status};
use crate::kv::unexpected;
use crate::Shared;

/// etcd 3.5's `ErrGRPCPermissionNotGiven`: a grant without a permission.
const PERMISSION_NOT_GIVEN: &str = "etcdserver: permission not given";

/// The Auth service.
pub struct AuthService {
    pub(crate) shared: Shared,
}

type Reply<T> = Result<tonic::Response<T>, Status>;

impl AuthService {
    /// Proposes an auth change for `caller`; its answer and the response header.
    async fn change(
        &self,
        caller: &Caller,
        cmd: AuthCommand,
    ) -> Result<(AuthResponse, pb::ResponseHeader), Status> {
        let proposed = self.shared.propose_as(caller, Command::Auth(cmd)).await?;
        let header = self
            .shared
            .header_at(proposed.applied.revision.0, proposed.raft_term);
        match proposed.applied.response {
            Response::Auth(a) => Ok((a, header)),
            Response::Error(e) => Err(kv_status(&e)),
            other => Err(unexpected(other)),
        }
    }

    async fn header_of(
        &self,
        caller: &Caller,
        cmd: AuthCommand,
    ) -> Result<pb::ResponseHeader, Status> {
        Ok(self.change(caller, cmd).await?.1)
    }

    /// bcrypt off the runtime's workers (tens of milliseconds per hash).
    async fn hash(&self, password: String) -> Result<String, Status> {
        let auth = self.shared.config.auth.clone();
        tokio::task::spawn_blocking(move || auth.hash_password(&password))
            .await
            .map_err(|_| Status::internal("baton: password hashing failed"))?
            .map_err(|_| Status::internal("baton: password hashing failed"))
    }

    /// etcd's `CheckPassword`: the auth revision the password was checked at.
    async fn check_password(&self, name: &str, password: String) -> Result<u64, Status> {
        let (hash, revision) = self
            .shared
            .node
            .read(|sm| {
                if !sm.auth_enabled() {
                    return Err(AuthError::AuthNotEnabled);
                }
                let user = sm
                    .auth_state()
                    .users
                    .get(name)
                    .ok_or(AuthError::AuthFailed)?;
                let hash = user.password_hash.clone().ok_or(AuthError::AuthFailed)?;
                Ok((hash, sm.auth_revision()))
            })
            .map_err(auth_status)?;
        let matches =
            tokio::task::spawn_blocking(move || Authenticator::password_matches(&password, &hash))
                .await
                .unwrap_or(false);
        if !matches {
            tracing::info!(user = name, "authentication failed: invalid password");
            return Err(auth_status(AuthError::AuthFailed));
        }
        Ok(revision)
    }

    /// Reads need the root role, except what `self_allowed` admits (etcd's `UserGet` of
    /// oneself, `RoleGet` of a held role).
    fn admin_or(
        &self,
        caller: &Caller,
        self_allowed: impl FnOnce(&str) -> bool,
    ) -> Result<(), Status> {
        match self.shared.require_admin(caller) {
            Ok(()) => Ok(()),
            Err(e) => match caller {
                Some(c) if self_allowed(&c.user) => Ok(()),
                _ => Err(e),
            },
        }
    }
}

fn perm_to_pb(p: &Permission) -> authpb::Permission {
    let perm_type = match p.perm_type {
        PermType::Read => authpb::permission::Type::Read,
        PermType::Write => authpb::permission::Type::Write,
        PermType::ReadWrite => authpb::permission::Type::Readwrite,
    };
    authpb::Permission {
        perm_type: perm_type as i32,
        key: p.key.clone(),
        range_end: p.range_end.clone(),
    }
}

fn perm_from_pb(p: authpb::Permission) -> Permission {
    let perm_type = match p.perm_type() {
        authpb::permission::Type::Read => PermType::Read,
        authpb::permission::Type::Write => PermType::Write,
        authpb::permission::Type::Readwrite => PermType::ReadWrite,
    };
    Permission {
        perm_type,
        key: p.key,
        range_end: p.range_end,
    }
}

#[tonic::async_trait]
impl pb::auth_server::Auth for AuthService {
    async fn auth_enable(
        &self,
        request: Request<pb::AuthEnableRequest>,
    ) -> Reply<pb::AuthEnableResponse> {
        let caller = self.shared.caller(&request)?;
        let header = self.header_of(&caller, AuthCommand::Enable).await?;
        tracing::info!("enabled authentication");
        Ok(tonic::Response::new(pb::AuthEnableResponse {
            header: Some(header),
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<pb::AuthDisableRequest>,
    ) -> Reply<pb::AuthDisableResponse> {
        let caller = self.shared.caller(&request)?;
        let header = self.header_of(&caller, AuthCommand::Disable).await?;
        tracing::info!("disabled authentication");
        Ok(tonic::Response::new(pb::AuthDisableResponse {
            header: Some(header),
        }))
    }

    async fn auth_status(
        &self,
        request: Request<pb::AuthStatusRequest>,
    ) -> Reply<pb::AuthStatusResponse> {
        self.shared.caller(&request)?;
        self.shared.read_barrier().await?;
        let (enabled, auth_revision) = self
            .shared
            .node
            .read(|sm| (sm.auth_enabled(), sm.auth_revision()));
        Ok(tonic::Response::new(pb::AuthStatusResponse {
            header: Some(self.shared.header()),
            enabled,
            auth_revision,
        }))
    }

    /// etcd's loop: check the password at the auth revision read here, issue the token
    /// through the log, and start over if the auth store changed in between (a password
    /// changed meanwhile must not yield a token).
    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Reply<pb::AuthenticateResponse> {
        let req = request.into_inner();
        self.shared.read_barrier().await?;
        loop {
            let checked = self.check_password(&req.name, req.password.clone()).await?;
            let random = self.shared.node.random_bytes(Authenticator::RANDOM_BYTES);
            let cmd = AuthCommand::Authenticate {
                name: req.name.clone(),
                simple_token_prefix: self.shared.config.auth.simple_token_prefix(&random),
            };
            let (answer, header) = self.change(&None, cmd).await?;
            let AuthResponse::Authenticated { token, revision } = answer else {
                return Err(unexpected(Response::Auth(answer)));
            };
            if revision != checked {
                tracing::info!("auth revision changed while the password was checked; retrying");
                continue;
            }
            let token = self
                .shared
                .config
                .auth
                .issue(&req.name, revision, token, self.shared.node.time_ms())
                .map_err(|e| Status::internal(format!("baton: cannot issue a token: {e}")))?;
            return Ok(tonic::Response::new(pb::AuthenticateResponse {
                header: Some(header),
                token,
            }));
        }
    }

    async fn user_add(
        &self,
        request: Request<pb::AuthUserAddRequest>,
    ) -> Reply<pb::AuthUserAddResponse> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        if req.name.is_empty() {
            return Err(auth_status(AuthError::UserEmpty));
        }
        let no_password = req.options.is_some_and(|o| o.no_password);
        let password_hash = if no_password {
            None
        } else if !req.hashed_password.is_empty() {
            Some(req.hashed_password)
        } else {
            Some(self.hash(req.password).await?)
        };
        let cmd = AuthCommand::UserAdd {
            name: req.name,
            password_hash,
        };
        let header = self.header_of(&caller, cmd).await?;
        Ok(tonic::Response::new(pb::AuthUserAddResponse {
            header: Some(header),
        }))
    }

    async fn user_get(
        &self,
        request: Request<pb::AuthUserGetRequest>,
    ) -> Reply<pb::AuthUserGetResponse> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        self.shared.read_barrier().await?;
        self.admin_or(&caller, |me| me == req.name)?;
        let roles = self
            .shared
            .node
            .read(|sm| {
                sm.auth_state()
                    .users
                    .get(&req.name)
                    .map(|u| u.roles.iter().cloned().collect())
            })
            .ok_or_else(|| auth_status(AuthError::UserNotFound))?;
        Ok(tonic::Response::new(pb::AuthUserGetResponse {
            header: Some(self.shared.header()),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<pb::AuthUserListRequest>,
    ) -> Reply<pb::AuthUserListResponse> {
        let caller = self.shared.caller(&request)?;
        self.shared.read_barrier().await?;
        self.shared.require_admin(&caller)?;
        let users = self
            .shared
            .node
            .read(|sm| sm.auth_state().users.keys().cloned().collect());
        Ok(tonic::Response::new(pb::AuthUserListResponse {
            header: Some(self.shared.header()),
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<pb::AuthUserDeleteRequest>,
    ) -> Reply<pb::AuthUserDeleteResponse> {
        let caller = self.shared.caller(&request)?;
        let name = request.into_inner().name;
        let header = self
            .header_of(&caller, AuthCommand::UserDelete { name })
            .await?;
        Ok(tonic::Response::new(pb::AuthUserDeleteResponse {
            header: Some(header),
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Reply<pb::AuthUserChangePasswordResponse> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let password_hash = if req.hashed_password.is_empty() {
            self.hash(req.password).await?
        } else {
            req.hashed_password
        };
        let cmd = AuthCommand::UserChangePassword {
            name: req.name,
            password_hash,
        };
        let header = self.header_of(&caller, cmd).await?;
        Ok(tonic::Response::new(pb::AuthUserChangePasswordResponse {
            header: Some(header),
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Reply<pb::AuthUserGrantRoleResponse> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let cmd = AuthCommand::UserGrantRole {
            user: req.user,
            role: req.role,
        };
        let header = self.header_of(&caller, cmd).await?;
        Ok(tonic::Response::new(pb::AuthUserGrantRoleResponse {
            header: Some(header),
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Reply<pb::AuthUserRevokeRoleResponse> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let cmd = AuthCommand::UserRevokeRole {
            name: req.name,
            role: req.role,
        };
        let header = self.header_of(&caller, cmd).await?;
        Ok(tonic::Response::new(pb::AuthUserRevokeRoleResponse {
            header: Some(header),
        }))
    }

    async fn role_add(
        &self,
        request: Request<pb::AuthRoleAddRequest>,
    ) -> Reply<pb::AuthRoleAddResponse> {
        let caller = self.shared.caller(&request)?;
        let name = request.into_inner().name;
        let header = self
            .header_of(&caller, AuthCommand::RoleAdd { name })
            .await?;
        Ok(tonic::Response::new(pb::AuthRoleAddResponse {
            header: Some(header),
        }))
    }

    async fn role_get(
        &self,
        request: Request<pb::AuthRoleGetRequest>,
    ) -> Reply<pb::AuthRoleGetResponse> {
        let caller = self.shared.caller(&request)?;
        let role = request.into_inner().role;
        self.shared.read_barrier().await?;
        self.admin_or(&caller, |me| {
            self.shared.node.read(|sm| sm.user_has_role(me, &role))
        })?;
        let perm = self
            .shared
            .node
            .read(|sm| {
                sm.auth_state()
                    .roles
                    .get(&role)
                    .map(|r| r.perms.iter().map(perm_to_pb).collect())
            })
            .ok_or_else(|| auth_status(AuthError::RoleNotFound))?;
        Ok(tonic::Response::new(pb::AuthRoleGetResponse {
            header: Some(self.shared.header()),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<pb::AuthRoleListRequest>,
    ) -> Reply<pb::AuthRoleListResponse> {
        let caller = self.shared.caller(&request)?;
        self.shared.read_barrier().await?;
        self.shared.require_admin(&caller)?;
        let roles = self
            .shared
            .node
            .read(|sm| sm.auth_state().roles.keys().cloned().collect());
        Ok(tonic::Response::new(pb::AuthRoleListResponse {
            header: Some(self.shared.header()),
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<pb::AuthRoleDeleteRequest>,
    ) -> Reply<pb::AuthRoleDeleteResponse> {
        let caller = self.shared.caller(&request)?;
        let name = request.into_inner().role;
        let header = self
            .header_of(&caller, AuthCommand::RoleDelete { name })
            .await?;
        Ok(tonic::Response::new(pb::AuthRoleDeleteResponse {
            header: Some(header),
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Reply<pb::AuthRoleGrantPermissionResponse> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let perm = req
            .perm
            .ok_or_else(|| Status::invalid_argument(PERMISSION_NOT_GIVEN))?;
        let cmd = AuthCommand::RoleGrantPermission {
            name: req.name,
            perm: perm_from_pb(perm),
        };
        let header = self.header_of(&caller, cmd).await?;
        Ok(tonic::Response::new(pb::AuthRoleGrantPermissionResponse {
            header: Some(header),
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Reply<pb::AuthRoleRevokePermissionResponse> {
        let caller = self.shared.caller(&request)?;
        let req = request.into_inner();
        let cmd = AuthCommand::RoleRevokePermission {
            role: req.role,
            key: req.key,
            range_end: req.range_end,
        };
        let header = self.header_of(&caller, cmd).await?;
        Ok(tonic::Response::new(pb::AuthRoleRevokePermissionResponse {
            header: Some(header),
        }))
    }
}
