//! User/password authentication against etcd's auth (Baton's and etcd 3.4's alike): the
//! token from `Authenticate` rides as the `token` metadata of every call, as etcd's own
//! clients send it, and is fetched again when the server answers "invalid auth token"
//! (expired, or dropped by a password change or an auth disable) or "revision of auth
//! store is old".

use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use baton_proto::etcdserverpb as pb;
use tonic::transport::Channel;

/// A user name and password ([`crate::ClientConfig::with_user`]). The password is never
/// printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// A token `Authenticate` issued ([`crate::ClientConfig::with_token`]). Whoever holds it
/// acts as its user, so `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(String);

impl AuthToken {
    /// Wraps `token`.
    pub fn new(token: impl Into<String>) -> AuthToken {
        AuthToken(token.into())
    }

    /// The token's text, as the server issued it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(<hidden>)")
    }
}

/// The token a connection's calls carry, shared by its clones.
pub(crate) type TokenCell = Arc<RwLock<Option<http::HeaderValue>>>;

/// A channel that adds the current token to every request.
#[derive(Clone)]
pub struct AuthChannel {
    inner: Channel,
    token: TokenCell,
}

impl AuthChannel {
    pub(crate) fn new(inner: Channel, token: TokenCell) -> Self {
        AuthChannel { inner, token }
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for AuthChannel {
    type Response = <Channel as tower::Service<http::Request<tonic::body::Body>>>::Response;
    type Error = <Channel as tower::Service<http::Request<tonic::body::Body>>>::Error;
    type Future = <Channel as tower::Service<http::Request<tonic::body::Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        if let Some(token) = self.token.read().expect("token lock").clone() {
            req.headers_mut().insert("token", token);
        }
        tower::Service::call(&mut self.inner, req)
    }
}

/// What an answer says about the token: fetch a new one and try again.
pub(crate) fn token_refused(status: &tonic::Status) -> bool {
    crate::error::refuses_token(status.code(), status.message())
}

/// `Authenticate` over `channel`; `Ok(None)` when the server has auth disabled (etcd's
/// clients carry on without a token then).
pub(crate) async fn authenticate(
    channel: Channel,
    creds: &Credentials,
) -> Result<Option<http::HeaderValue>, tonic::Status> {
    let req = pb::AuthenticateRequest {
        name: creds.user.clone(),
        password: creds.password.clone(),
    };
    match pb::auth_client::AuthClient::new(channel)
        .authenticate(req)
        .await
    {
        Ok(r) => {
            let token = r.into_inner().token;
            Ok(http::HeaderValue::from_str(&token).ok())
        }
        Err(s) if s.message() == "etcdserver: authentication is not enabled" => Ok(None),
        Err(s) => Err(s),
    }
}
