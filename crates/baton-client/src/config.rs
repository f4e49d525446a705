//! Client configuration.

use std::path::PathBuf;
use std::time::Duration;

/// How to reach the cluster and how patient to be.
///
/// ```
/// use std::time::Duration;
/// use baton_client::ClientConfig;
///
/// let config = ClientConfig::new(["10.0.0.1:2379", "10.0.0.2:2379"])
///     .with_request_timeout(Duration::from_secs(2));
/// assert_eq!(config.endpoints.len(), 2);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Members to talk to, `host:port` or `http://host:port`. They are tried in order when
    /// connecting; after a connection failure or an `Unavailable` answer the client moves
    /// to the next one (failover), so list every member of the cluster.
    pub endpoints: Vec<String>,
    /// How long to wait for a TCP + HTTP/2 connection to one endpoint before trying the
    /// next.
    pub connect_timeout: Duration,
    /// The deadline of every call that should answer promptly (KV, lease, release, fenced
    /// put, ...). Calls that wait by design (acquiring a lock, campaigning, watching) have
    /// no deadline unless the caller gives one, because waiting *is* their answer.
    pub request_timeout: Duration,
    /// TLS settings: set, every endpoint is dialled with TLS (one without a scheme as
    /// `https://`), the server verified against [`TlsConfig::ca_file`] (else the system's
    /// roots), with a client certificate if one is given. An `https://` endpoint uses TLS
    /// with the system's roots even without it.
    pub tls: Option<TlsConfig>,
    /// Which server API the recipes use; [`ServerKind::Auto`] asks the server once.
    pub server_kind: ServerKind,
    /// A user and password for servers with auth enabled: the client authenticates on
    /// every connection and again when its token is refused.
    pub credentials: Option<crate::auth::Credentials>,
    /// A token an earlier `Authenticate` issued ([`crate::Client::authenticate`]), sent on
    /// every call when there are no [`Self::credentials`]: for a program that holds a
    /// user's token but not their password (Baton's dashboard keeps the token of the user
    /// who logged in, and reads as that user). It is never renewed: once the server refuses
    /// it (expired, or the auth store changed), calls fail with etcd's "invalid auth token".
    pub token: Option<crate::auth::AuthToken>,
}

impl ClientConfig {
    /// A configuration for `endpoints` with the defaults: 2 s connect timeout, 5 s request
    /// timeout, no TLS, automatic server detection.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            tls: None,
            server_kind: ServerKind::Auto,
            credentials: None,
            token: None,
        }
    }

    /// Authenticates as `user` with `password` (etcd's `--user name:password`).
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(crate::auth::Credentials {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Sends `token` (from [`crate::Client::authenticate`]) on every call
    /// ([`ClientConfig::token`]).
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(crate::auth::AuthToken::new(token));
        self
    }

    /// Sets [`ClientConfig::connect_timeout`].
    pub fn with_connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Sets [`ClientConfig::request_timeout`].
    pub fn with_request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// Sets [`ClientConfig::tls`].
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets [`ClientConfig::server_kind`].
    pub fn with_server_kind(mut self, kind: ServerKind) -> Self {
        self.server_kind = kind;
        self
    }
}

/// TLS material, by file path (PEM), as etcd's `--cacert/--cert/--key` flags take it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsConfig {
    /// CA bundle to verify the server with.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// Client private key (mutual TLS).
    pub key_file: Option<PathBuf>,
    /// Name to verify the server certificate against, if not the endpoint's host.
    pub server_name: Option<String>,
    /// Accept any server certificate (etcdctl's `--insecure-skip-tls-verify`): the
    /// connection is still encrypted, but to whoever answers. For self-signed servers
    /// (`--auto-tls`) in tests; never against a server whose identity matters.
    pub insecure_skip_verify: bool,
}

impl TlsConfig {
    /// Empty settings (fill in the fields you need).
    pub fn new() -> Self {
        Self::default()
    }
}

/// Which server the recipes talk to. Baton serves everything etcd 3.4 does plus
/// `baton.v1`; the recipes use `baton.v1` where it exists (server-side lock queues,
/// cancellation that cleans up, lock-delay, the fence gate) and etcd's client-side recipes
/// otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerKind {
    /// Ask the server once (a `baton.v1` call that etcd answers with `Unimplemented`).
    #[default]
    Auto,
    /// Baton: use `baton.v1`.
    Baton,
    /// etcd 3.4 (or a Baton you want to drive exactly as etcd's own clients do): only the
    /// etcd API, client-side recipes.
    Etcd,
}
