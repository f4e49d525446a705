//! `--tls`: both servers with TLS on every port, mutually authenticated — `https://` client
//! URLs with `--client-cert-auth` and `https://` peer URLs with `--peer-client-cert-auth`,
//! the same certificate files and flags for etcd and Baton — and this process's clients
//! speaking TLS with a client certificate to every `https://` endpoint. What a secure
//! deployment pays for TLS is then one run of the side-by-side report against another.
//!
//! The certificates are etcd's own test fixtures (Debian's golang-etcd-server-dev, which
//! `scripts/install-deps` installs): a CA and a server certificate for 127.0.0.1 that is
//! also valid as a client certificate, as the e2e suite uses them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// Where etcd's test certificates are installed.
pub const ETCD_FIXTURES: &str = "/usr/share/gocode/src/go.etcd.io/etcd/integration/fixtures";

/// The certificate files both servers and the clients use.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// etcd's fixtures (`ca.crt`, `server.crt`, `server.key.insecure`).
    pub fn etcd_fixtures() -> Result<TlsFiles> {
        let dir = Path::new(ETCD_FIXTURES);
        let files = TlsFiles {
            ca: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key.insecure"),
        };
        for f in [&files.ca, &files.cert, &files.key] {
            if !f.exists() {
                bail!(
                    "--tls needs etcd's test certificates: {} is missing (install Debian's \
                     golang-etcd-server-dev; scripts/install-deps does)",
                    f.display()
                );
            }
        }
        Ok(files)
    }

    /// The flags that give a member TLS on both ports, client certificates required
    /// (identical for etcd and Baton).
    pub fn server_flags(&self) -> Vec<(&'static str, String)> {
        let (ca, cert, key) = (
            self.ca.display().to_string(),
            self.cert.display().to_string(),
            self.key.display().to_string(),
        );
        vec![
            ("cert-file", cert.clone()),
            ("key-file", key.clone()),
            ("trusted-ca-file", ca.clone()),
            ("client-cert-auth", "true".into()),
            ("peer-cert-file", cert),
            ("peer-key-file", key),
            ("peer-trusted-ca-file", ca),
            ("peer-client-cert-auth", "true".into()),
        ]
    }
}

/// This process's client side of TLS, for every `https://` endpoint.
struct ClientTls {
    tonic: ClientTlsConfig,
    rustls: Arc<rustls::ClientConfig>,
}

static CLIENT_TLS: OnceLock<ClientTls> = OnceLock::new();

/// Makes every `https://` endpoint of this process use `files` (the CA to trust, the
/// client certificate to show). Once per process: later calls keep the first files.
pub fn install(files: &TlsFiles) -> Result<()> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let (ca, cert, key) = (read(&files.ca)?, read(&files.cert)?, read(&files.key)?);
    let tonic = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca))
        .identity(Identity::from_pem(&cert, &key));
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.context("CA file")?).context("CA file")?;
    }
    let chain = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .context("certificate file")?;
    let key = PrivateKeyDer::from_pem_slice(&key).context("key file: no PEM private key")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .context("client certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    CLIENT_TLS.get_or_init(|| ClientTls {
        tonic,
        rustls: Arc::new(config),
    });
    Ok(())
}

/// tonic's TLS settings for `https://` endpoints.
pub fn tonic_config() -> Result<ClientTlsConfig> {
    CLIENT_TLS
        .get()
        .map(|t| t.tonic.clone())
        .context("an https:// endpoint, but no client TLS installed (--tls)")
}

/// rustls's client configuration for `https://` endpoints (the lean h2 client).
pub fn rustls_config() -> Result<Arc<rustls::ClientConfig>> {
    CLIENT_TLS
        .get()
        .map(|t| t.rustls.clone())
        .context("an https:// endpoint, but no client TLS installed (--tls)")
}

/// `--auth`: the user the bench's key-value clients are, and its password. Not root: a
/// user whose role grants read-write on every key, so each request takes the permission
/// check a real application's does.
pub const AUTH_USER: &str = "bench";
const AUTH_PASSWORD: &str = "bench-password";
const ROOT_PASSWORD: &str = "bench-root-password";

/// The token of [`AUTH_USER`] on the deployment under test, shown on every key-value
/// request (`token` metadata, as etcd's clients send it); `None` without `--auth`.
static TOKEN: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// The token the key-value clients connected from now on show.
pub fn token() -> Option<String> {
    TOKEN.read().expect("poisoned").clone()
}

/// Turns authentication on at `endpoint` with etcd's API alone, identically for etcd and
/// Baton: a root user with the root role, a role `bench` with read-write on every key
/// (from-key ""), the user [`AUTH_USER`] with it; then authenticates as that user and keeps
/// the token for the clients ([`token`]).
pub async fn enable_auth(endpoint: &str) -> Result<()> {
    use baton_proto::authpb::{permission::Type as PermType, Permission};
    use baton_proto::etcdserverpb::auth_client::AuthClient;
    use baton_proto::etcdserverpb::{
        AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthUserAddRequest,
        AuthUserGrantRoleRequest, AuthenticateRequest,
    };

    let ch = crate::engine::channel(endpoint, crate::engine::REQUEST_TIMEOUT).await?;
    let mut auth = AuthClient::new(ch);
    let user = |name: &str, password: &str| AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        ..Default::default()
    };
    auth.user_add(user("root", ROOT_PASSWORD))
        .await
        .context("adding user root")?;
    auth.user_grant_role(AuthUserGrantRoleRequest {
        user: "root".into(),
        role: "root".into(),
    })
    .await
    .context("granting root the root role")?;
    auth.role_add(AuthRoleAddRequest {
        name: AUTH_USER.into(),
    })
    .await
    .context("adding the bench role")?;
    auth.role_grant_permission(AuthRoleGrantPermissionRequest {
        name: AUTH_USER.into(),
        perm: Some(Permission {
            perm_type: PermType::Readwrite as i32,
            key: vec![0],
            range_end: vec![0],
        }),
    })
    .await
    .context("granting the bench role every key")?;
    auth.user_add(user(AUTH_USER, AUTH_PASSWORD))
        .await
        .context("adding the bench user")?;
    auth.user_grant_role(AuthUserGrantRoleRequest {
        user: AUTH_USER.into(),
        role: AUTH_USER.into(),
    })
    .await
    .context("granting the bench user its role")?;
    auth.auth_enable(AuthEnableRequest {})
        .await
        .context("enabling authentication")?;
    let token = auth
        .authenticate(AuthenticateRequest {
            name: AUTH_USER.into(),
            password: AUTH_PASSWORD.into(),
        })
        .await
        .context("authenticating as the bench user")?
        .into_inner()
        .token;
    *TOKEN.write().expect("poisoned") = Some(token);
    Ok(())
}
