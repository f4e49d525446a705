//! etcd's Auth calls on [`Client`](crate::Client): enabling auth, users, roles and their
//! permissions (what `baton auth|user|role` and `etcdctl` do). Changes are sent once; reads
//! are retried on another endpoint like other reads.

use baton_proto::authpb;
use baton_proto::etcdserverpb as pb;
use pb::auth_client::AuthClient;

impl crate::Client {
    /// Adds user `name` with `password`, or with no password (`None`: etcd's
    /// `--no-password`, for client-certificate users).
    pub async fn user_add(
        &self,
        name: &str,
        password: Option<&str>,
    ) -> crate::Result<pb::AuthUserAddResponse> {
        let req = pb::AuthUserAddRequest {
            name: name.to_string(),
            password: password.unwrap_or_default().to_string(),
            options: Some(authpb::UserAddOptions {
                no_password: password.is_none(),
            }),
            hashed_password: String::new(),
        };
        self.call(
            "Auth/UserAdd",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).user_add(r).await }
            },
        )
        .await
    }

    /// Enables auth (needs a `root` user holding the `root` role).
    pub async fn auth_enable(&self) -> crate::Result<pb::AuthEnableResponse> {
        let req = pb::AuthEnableRequest {};
        self.call(
            "Auth/AuthEnable",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req, t);
                async move { AuthClient::new(ch).auth_enable(r).await }
            },
        )
        .await
    }

    /// Disables auth (root only while it is on).
    pub async fn auth_disable(&self) -> crate::Result<pb::AuthDisableResponse> {
        let req = pb::AuthDisableRequest {};
        self.call(
            "Auth/AuthDisable",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req, t);
                async move { AuthClient::new(ch).auth_disable(r).await }
            },
        )
        .await
    }

    /// A token for `name` with `password` (etcd's `Auth.Authenticate`), for a later
    /// [`crate::ClientConfig::with_token`]. A wrong name or password is etcd's
    /// "authentication failed, invalid user ID or password"; with auth off, etcd's
    /// "authentication is not enabled". Sent once: each call issues a new token.
    pub async fn authenticate(&self, name: &str, password: &str) -> crate::Result<String> {
        let req = pb::AuthenticateRequest {
            name: name.to_string(),
            password: password.to_string(),
        };
        let r = self
            .call(
                "Auth/Authenticate",
                crate::client::Retry::Once,
                crate::client::Deadline::Default,
                |ch, t| {
                    let r = crate::client::request(req.clone(), t);
                    async move { AuthClient::new(ch).authenticate(r).await }
                },
            )
            .await?;
        Ok(r.token)
    }

    /// Whether auth is on, and the auth store's revision.
    pub async fn auth_status(&self) -> crate::Result<pb::AuthStatusResponse> {
        let req = pb::AuthStatusRequest {};
        self.call(
            "Auth/AuthStatus",
            crate::client::Retry::Idempotent,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req, t);
                async move { AuthClient::new(ch).auth_status(r).await }
            },
        )
        .await
    }

    /// The roles of user `name`.
    pub async fn user_get(&self, name: &str) -> crate::Result<pb::AuthUserGetResponse> {
        let req = pb::AuthUserGetRequest {
            name: name.to_string(),
        };
        self.call(
            "Auth/UserGet",
            crate::client::Retry::Idempotent,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).user_get(r).await }
            },
        )
        .await
    }

    /// Every user's name.
    pub async fn user_list(&self) -> crate::Result<pb::AuthUserListResponse> {
        let req = pb::AuthUserListRequest {};
        self.call(
            "Auth/UserList",
            crate::client::Retry::Idempotent,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req, t);
                async move { AuthClient::new(ch).user_list(r).await }
            },
        )
        .await
    }

    /// Deletes user `name`.
    pub async fn user_delete(&self, name: &str) -> crate::Result<pb::AuthUserDeleteResponse> {
        let req = pb::AuthUserDeleteRequest {
            name: name.to_string(),
        };
        self.call(
            "Auth/UserDelete",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).user_delete(r).await }
            },
        )
        .await
    }

    /// Sets user `name`'s password (its tokens stop working).
    pub async fn user_change_password(
        &self,
        name: &str,
        password: &str,
    ) -> crate::Result<pb::AuthUserChangePasswordResponse> {
        let req = pb::AuthUserChangePasswordRequest {
            name: name.to_string(),
            password: password.to_string(),
            ..Default::default()
        };
        self.call(
            "Auth/UserChangePassword",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).user_change_password(r).await }
            },
        )
        .await
    }

    /// Grants `role` to `user`.
    pub async fn user_grant_role(
        &self,
        user: &str,
        role: &str,
    ) -> crate::Result<pb::AuthUserGrantRoleResponse> {
        let req = pb::AuthUserGrantRoleRequest {
            user: user.to_string(),
            role: role.to_string(),
        };
        self.call(
            "Auth/UserGrantRole",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).user_grant_role(r).await }
            },
        )
        .await
    }

    /// Revokes `role` from `user`.
    pub async fn user_revoke_role(
        &self,
        user: &str,
        role: &str,
    ) -> crate::Result<pb::AuthUserRevokeRoleResponse> {
        let req = pb::AuthUserRevokeRoleRequest {
            name: user.to_string(),
            role: role.to_string(),
        };
        self.call(
            "Auth/UserRevokeRole",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).user_revoke_role(r).await }
            },
        )
        .await
    }

    /// Adds role `name` (no permissions).
    pub async fn role_add(&self, name: &str) -> crate::Result<pb::AuthRoleAddResponse> {
        let req = pb::AuthRoleAddRequest {
            name: name.to_string(),
        };
        self.call(
            "Auth/RoleAdd",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).role_add(r).await }
            },
        )
        .await
    }

    /// Role `name`'s permissions.
    pub async fn role_get(&self, name: &str) -> crate::Result<pb::AuthRoleGetResponse> {
        let req = pb::AuthRoleGetRequest {
            role: name.to_string(),
        };
        self.call(
            "Auth/RoleGet",
            crate::client::Retry::Idempotent,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).role_get(r).await }
            },
        )
        .await
    }

    /// Every role's name.
    pub async fn role_list(&self) -> crate::Result<pb::AuthRoleListResponse> {
        let req = pb::AuthRoleListRequest {};
        self.call(
            "Auth/RoleList",
            crate::client::Retry::Idempotent,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req, t);
                async move { AuthClient::new(ch).role_list(r).await }
            },
        )
        .await
    }

    /// Deletes role `name` (and revokes it from every user).
    pub async fn role_delete(&self, name: &str) -> crate::Result<pb::AuthRoleDeleteResponse> {
        let req = pb::AuthRoleDeleteRequest {
            role: name.to_string(),
        };
        self.call(
            "Auth/RoleDelete",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).role_delete(r).await }
            },
        )
        .await
    }

    /// Grants `perm` (a key, a range `[key, range_end)`, a prefix, or from-key with `range_end = "\\0"`) to `role`.
    pub async fn role_grant_permission(
        &self,
        role: &str,
        perm: &authpb::Permission,
    ) -> crate::Result<pb::AuthRoleGrantPermissionResponse> {
        let req = pb::AuthRoleGrantPermissionRequest {
            name: role.to_string(),
            perm: Some(perm.clone()),
        };
        self.call(
            "Auth/RoleGrantPermission",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).role_grant_permission(r).await }
            },
        )
        .await
    }

    /// Revokes `role`'s permission on exactly `(key, range_end)`.
    pub async fn role_revoke_permission(
        &self,
        role: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> crate::Result<pb::AuthRoleRevokePermissionResponse> {
        let req = pb::AuthRoleRevokePermissionRequest {
            role: role.to_string(),
            key: key.to_vec(),
            range_end: range_end.to_vec(),
        };
        self.call(
            "Auth/RoleRevokePermission",
            crate::client::Retry::Once,
            crate::client::Deadline::Default,
            |ch, t| {
                let r = crate::client::request(req.clone(), t);
                async move { AuthClient::new(ch).role_revoke_permission(r).await }
            },
        )
        .await
    }
}
