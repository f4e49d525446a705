//! TLS with etcd 3.4's flags, on the client port and on the peer port.
//!
//! Client port: the server's certificate and key (`--cert-file`, `--key-file`, or a
//! self-signed pair with `--auto-tls`), client certificates required and checked against
//! `--trusted-ca-file` (etcd requires them whenever a trusted CA is given, and with
//! `--client-cert-auth`), revoked ones refused with `--client-crl-file`, and TLS 1.2 suites
//! limited by `--cipher-suites`. Peer port: the same with the `--peer-` flags, plus
//! `--peer-cert-allowed-cn` / `--peer-cert-allowed-hostname` (a peer's certificate must also
//! name that CN, or be valid for that host name), and the client side a member dials its
//! peers with ([`peer_client`]: its own certificate, the peers' checked against
//! `--peer-trusted-ca-file`, or not checked at all with `--peer-auto-tls`, as etcd).
//!
//! rustls with its ring provider does the cryptography and the certificate checks (webpki);
//! certificates are parsed by `rustls-pki-types` (PEM) and, for a Common Name, by
//! `x509-parser`. As in Go's TLS (etcd), `--cipher-suites` names TLS 1.2 suites: given, the
//! server speaks TLS 1.2 with exactly those (Go cannot restrict TLS 1.3's suites, and a
//! client offering none of the listed ones must fail, which it could not if TLS 1.3 were
//! left on).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::client_verifier::{AllowedIdentity, ClientVerifier};
/// rustls's server configuration, re-exported so that users need no rustls of their own.
pub use baton_tls::{common_name, describe_tls_error};
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::{ring, CryptoProvider};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
pub use rustls::ServerConfig;
use rustls::SupportedCipherSuite;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};

/// Which port a configuration is for: it decides the flags' names in errors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TlsPort {
    #[default]
    Client,
    Peer,
}

impl TlsPort {
    /// The flag that sets `what` on this port (`cert-file`: `--cert-file` or
    /// `--peer-cert-file`).
    fn flag(self, what: Flag) -> &'static str {
        match (self, what) {
            (TlsPort::Client, Flag::Cert) => "--cert-file",
            (TlsPort::Client, Flag::Key) => "--key-file",
            (TlsPort::Client, Flag::TrustedCa) => "--trusted-ca-file",
            (TlsPort::Client, Flag::ClientCertAuth) => "--client-cert-auth",
            (TlsPort::Client, Flag::Crl) => "--client-crl-file",
            (TlsPort::Client, Flag::AutoTls) => "--auto-tls",
            (TlsPort::Peer, Flag::Cert) => "--peer-cert-file",
            (TlsPort::Peer, Flag::Key) => "--peer-key-file",
            (TlsPort::Peer, Flag::TrustedCa) => "--peer-trusted-ca-file",
            (TlsPort::Peer, Flag::ClientCertAuth) => "--peer-client-cert-auth",
            (TlsPort::Peer, Flag::Crl) => "--peer-crl-file",
            (TlsPort::Peer, Flag::AutoTls) => "--peer-auto-tls",
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Flag {
    Cert,
    Key,
    TrustedCa,
    ClientCertAuth,
    Crl,
    AutoTls,
}

/// What the TLS flags of one port say (paths as given).
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// Which port's flags these are.
    pub port: TlsPort,
    /// `--cert-file`: the server's certificate chain (PEM).
    pub cert_file: Option<PathBuf>,
    /// `--key-file`: its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// `--trusted-ca-file`: the CAs client certificates must chain to (PEM). Given, client
    /// certificates are required, as etcd requires them.
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth`: a client must present a certificate of a trusted CA.
    pub client_cert_auth: bool,
    /// `--client-crl-file`: revoked client certificates (DER or PEM).
    pub crl_file: Option<PathBuf>,
    /// `--cipher-suites`: Go's names of the TLS 1.2 suites to allow (empty: rustls's
    /// defaults, TLS 1.3 and 1.2).
    pub cipher_suites: Vec<String>,
    /// `--peer-cert-allowed-cn`: a client certificate must also have this Common Name.
    pub allowed_cn: Option<String>,
    /// `--peer-cert-allowed-hostname`: a client certificate must also be valid for this
    /// host name (its subject alternative names, as Go's `VerifyHostname`).
    pub allowed_hostname: Option<String>,
}

impl TlsSettings {
    fn flag(&self, what: Flag) -> &'static str {
        self.port.flag(what)
    }

    /// Whether clients must present a certificate of a trusted CA: with a trusted CA file
    /// or with client certificate auth, as etcd's `TLSInfo.ServerConfig`.
    pub fn requires_client_certs(&self) -> bool {
        self.client_cert_auth || self.trusted_ca_file.is_some()
    }
}

/// Why the TLS configuration could not be built. Each names the flag and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} {path}: {source}")]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} {path}: {reason}")]
    Invalid {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{flag} is required to serve https URLs (or {auto})")]
    Missing {
        flag: &'static str,
        auto: &'static str,
    },
    #[error("{flag} needs {ca}: the CAs that client certificates must chain to")]
    NoTrustedCa {
        flag: &'static str,
        ca: &'static str,
    },
    #[error(
        "--peer-cert-allowed-cn and --peer-cert-allowed-hostname are mutually exclusive \
         (cn={cn:?}, hostname={hostname:?})"
    )]
    AllowedCnAndHostname { cn: String, hostname: String },
    #[error("--peer-cert-allowed-hostname {0:?} is not a host name")]
    BadAllowedHostname(String),
    #[error("--cipher-suites: unknown cipher suite {0:?}")]
    UnknownCipherSuite(String),
    #[error(
        "--cipher-suites: {0} is not offered by this build (only TLS 1.2 ECDHE suites with \
         AES-GCM or ChaCha20-Poly1305 are)"
    )]
    UnsupportedCipherSuite(String),
    #[error("{flag}: {reason}")]
    AutoTls { flag: &'static str, reason: String },
    #[error("TLS configuration: {0}")]
    Rustls(String),
}

/// The server's rustls configuration for `settings`, speaking HTTP/2 (gRPC) by ALPN.
pub fn server_config(settings: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let (chain, key) = read_pair(settings)?;
    let provider = Arc::new(provider(&settings.cipher_suites)?);
    let versions: &[&rustls::SupportedProtocolVersion] = if settings.cipher_suites.is_empty() {
        rustls::DEFAULT_VERSIONS
    } else {
        &[&rustls::version::TLS12]
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = if settings.requires_client_certs() {
        let ca_flag = settings.flag(Flag::TrustedCa);
        let ca_file = settings
            .trusted_ca_file
            .as_deref()
            .ok_or(TlsError::NoTrustedCa {
                flag: settings.flag(Flag::ClientCertAuth),
                ca: ca_flag,
            })?;
        let anchors = read_certs(ca_flag, ca_file)?;
        let roots = root_store(ca_flag, ca_file, &anchors)?;
        let crls = match &settings.crl_file {
            Some(crl_file) => read_crls(settings.flag(Flag::Crl), crl_file)?,
            None => Vec::new(),
        };
        let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        if !crls.is_empty() {
            verifier = verifier.with_crls(crls.clone());
        }
        let verifier = verifier
            .build()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        builder.with_client_cert_verifier(Arc::new(ClientVerifier {
            webpki: verifier,
            anchors,
            crls,
            allowed: allowed_identity(settings)?,
        }))
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| key_mismatch(settings, e))?;
    // The client port serves gRPC and HTTP/1.1 (health checks, the JSON gateway, curl) on
    // one listener, as etcd's does; peers speak gRPC only.
    config.alpn_protocols = match settings.port {
        TlsPort::Client => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        TlsPort::Peer => vec![b"h2".to_vec()],
    };
    Ok(Arc::new(config))
}

fn key_mismatch(settings: &TlsSettings, e: rustls::Error) -> TlsError {
    let cert = settings.cert_file.as_deref().unwrap_or(Path::new(""));
    TlsError::Invalid {
        flag: settings.flag(Flag::Key),
        path: settings.key_file.clone().unwrap_or_default(),
        reason: format!(
            "does not match {} {}: {e}",
            settings.flag(Flag::Cert),
            cert.display()
        ),
    }
}

/// The certificate chain and key `settings` name, both required.
fn read_pair(
    settings: &TlsSettings,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let missing = |what| TlsError::Missing {
        flag: settings.flag(what),
        auto: settings.flag(Flag::AutoTls),
    };
    let cert_file = settings.cert_file.as_deref().ok_or(missing(Flag::Cert))?;
    let key_file = settings.key_file.as_deref().ok_or(missing(Flag::Key))?;
    Ok((
        read_certs(settings.flag(Flag::Cert), cert_file)?,
        read_key(settings.flag(Flag::Key), key_file)?,
    ))
}

fn read_roots(flag: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    root_store(flag, path, &read_certs(flag, path)?)
}

/// The trust anchors of `certs`, read from `path` (named in errors).
fn root_store(
    flag: &'static str,
    path: &Path,
    certs: &[CertificateDer<'static>],
) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for ca in certs {
        roots.add(ca.clone()).map_err(|e| invalid(flag, path, e))?;
    }
    Ok(roots)
}

/// What a client certificate must name beyond chaining to a trusted CA (etcd's
/// `AllowedCN` / `AllowedHostname`, mutually exclusive as there).
fn allowed_identity(settings: &TlsSettings) -> Result<Option<AllowedIdentity>, TlsError> {
    match (&settings.allowed_cn, &settings.allowed_hostname) {
        (Some(cn), Some(hostname)) => Err(TlsError::AllowedCnAndHostname {
            cn: cn.clone(),
            hostname: hostname.clone(),
        }),
        (Some(cn), None) => Ok(Some(AllowedIdentity::CommonName(cn.clone()))),
        (None, Some(hostname)) => ServerName::try_from(hostname.clone())
            .map(|name| Some(AllowedIdentity::Hostname(name)))
            .map_err(|_| TlsError::BadAllowedHostname(hostname.clone())),
        (None, None) => Ok(None),
    }
}

/// How a member dials its peers over TLS: its own certificate (shown to peers that require
/// one) and how their certificates are checked.
#[derive(Debug, Clone)]
pub struct PeerClientTls {
    /// The certificate chain and key, PEM, as tonic takes them.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// How the peer's certificate is checked.
    pub verify: PeerVerify,
}

/// How a member checks the certificates of the peers it dials.
#[derive(Clone)]
pub enum PeerVerify {
    /// Against `--peer-trusted-ca-file` (and for the host name of the peer URL).
    TrustedCa(Arc<dyn ServerCertVerifier>),
    /// Against the system's roots (no `--peer-trusted-ca-file`).
    SystemRoots,
    /// Not at all: `--peer-auto-tls`, whose certificates no CA signed (etcd sets
    /// `InsecureSkipVerify` for self-signed peer certificates). The handshake's signatures
    /// are still checked, so the connection is encrypted to whoever holds the certificate's
    /// key.
    Nothing(Arc<dyn ServerCertVerifier>),
}

impl std::fmt::Debug for PeerVerify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PeerVerify::TrustedCa(_) => "TrustedCa",
            PeerVerify::SystemRoots => "SystemRoots",
            PeerVerify::Nothing(_) => "Nothing",
        })
    }
}

/// The client side of peer TLS for `settings` (the `--peer-` flags; `auto`: the pair was
/// made by `--peer-auto-tls`).
pub fn peer_client(settings: &TlsSettings, auto: bool) -> Result<PeerClientTls, TlsError> {
    let provider = Arc::new(ring::default_provider());
    let cert_file = settings.cert_file.as_deref();
    let key_file = settings.key_file.as_deref();
    let identity = match (cert_file, key_file) {
        (Some(cert), Some(key)) => {
            // Parsed here too, so a bad file fails the start and not every dial.
            read_pair(settings)?;
            Some((
                read(settings.flag(Flag::Cert), cert)?,
                read(settings.flag(Flag::Key), key)?,
            ))
        }
        _ => None,
    };
    let verify = if auto {
        PeerVerify::Nothing(Arc::new(baton_tls::AnyServerCertificate::new(provider)))
    } else if let Some(ca_file) = settings.trusted_ca_file.as_deref() {
        let roots = read_roots(settings.flag(Flag::TrustedCa), ca_file)?;
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
        PeerVerify::TrustedCa(verifier)
    } else {
        PeerVerify::SystemRoots
    };
    Ok(PeerClientTls { identity, verify })
}

/// ring's provider, its TLS 1.2 suites limited to `names` (Go's names) when any are given.
fn provider(names: &[String]) -> Result<CryptoProvider, TlsError> {
    let mut provider = ring::default_provider();
    if names.is_empty() {
        return Ok(provider);
    }
    let mut suites = Vec::with_capacity(names.len());
    for name in names {
        suites.push(cipher_suite(name.trim())?);
    }
    provider.cipher_suites = suites;
    Ok(provider)
}

/// A cipher suite by Go's name (`crypto/tls`, which etcd's flag takes).
fn cipher_suite(name: &str) -> Result<SupportedCipherSuite, TlsError> {
    use ring::cipher_suite as rs;
    Ok(match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => rs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => rs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => rs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => rs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            rs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            rs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        // Go knows these; rustls offers none of them (CBC, RC4, 3DES, static RSA).
        "TLS_RSA_WITH_RC4_128_SHA"
        | "TLS_RSA_WITH_3DES_EDE_CBC_SHA"
        | "TLS_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_RSA_WITH_AES_128_CBC_SHA256"
        | "TLS_RSA_WITH_AES_128_GCM_SHA256"
        | "TLS_RSA_WITH_AES_256_GCM_SHA384"
        | "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_RC4_128_SHA"
        | "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"
        | "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"
        | "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256"
        | "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256" => {
            return Err(TlsError::UnsupportedCipherSuite(name.to_string()))
        }
        other => return Err(TlsError::UnknownCipherSuite(other.to_string())),
    })
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        flag,
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(flag: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::Invalid {
        flag,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read_certs(flag: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(flag, path, e))?;
    if certs.is_empty() {
        return Err(invalid(flag, path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

fn read_key(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(flag, path)?;
    // Never echo the file: its content is the secret.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| {
        invalid(
            flag,
            path,
            "no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file",
        )
    })
}

/// A CRL file as etcd takes it: DER, or PEM (one or more lists).
fn read_crls(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let bytes = read(flag, path)?;
    if bytes.starts_with(b"-----") {
        let crls = CertificateRevocationListDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(flag, path, e))?;
        if crls.is_empty() {
            return Err(invalid(flag, path, "no PEM X509 CRL in the file"));
        }
        return Ok(crls);
    }
    Ok(vec![CertificateRevocationListDer::from(bytes)])
}

/// `--auto-tls` / `--peer-auto-tls` (`port`): a self-signed certificate for `hosts` (the
/// URLs' hosts), written to `dir` (etcd keeps them under `<data-dir>/fixtures/client` and
/// `…/peer`) as `cert.pem` and `key.pem` and made anew at every start, as etcd does.
/// Returns the two paths.
pub fn self_signed(
    port: TlsPort,
    dir: &Path,
    hosts: &[String],
) -> Result<(PathBuf, PathBuf), TlsError> {
    let fail = |reason: String| TlsError::AutoTls {
        flag: port.flag(Flag::AutoTls),
        reason,
    };
    let mut names: Vec<String> = hosts.to_vec();
    if names.is_empty() {
        names.push("localhost".into());
    }
    let certified = rcgen::generate_simple_self_signed(names).map_err(|e| fail(e.to_string()))?;
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    write_private(&key, certified.signing_key.serialize_pem().as_bytes())
        .map_err(|e| fail(format!("{}: {e}", key.display())))?;
    std::fs::write(&cert, certified.cert.pem())
        .map_err(|e| fail(format!("{}: {e}", cert.display())))?;
    Ok((cert, key))
}

/// Writes a key readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_cipher_suite_names_map_or_are_refused_clearly() {
        assert!(cipher_suite("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256").is_ok());
        assert!(cipher_suite("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305").is_ok());
        assert!(matches!(
            cipher_suite("TLS_RSA_WITH_AES_128_CBC_SHA"),
            Err(TlsError::UnsupportedCipherSuite(_))
        ));
        assert!(matches!(
            cipher_suite("TLS_NONSENSE"),
            Err(TlsError::UnknownCipherSuite(_))
        ));
    }

    #[test]
    fn auto_tls_makes_a_usable_pair_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(TlsPort::Client, dir.path(), &["localhost".into()]).unwrap();
        let settings = TlsSettings {
            cert_file: Some(cert.clone()),
            key_file: Some(key.clone()),
            ..Default::default()
        };
        let config = server_config(&settings).unwrap();
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let peer = server_config(&TlsSettings {
            port: TlsPort::Peer,
            ..settings.clone()
        })
        .unwrap();
        assert_eq!(peer.alpn_protocols, vec![b"h2".to_vec()]);
        // A certificate where the key should be: refused, naming the flag.
        let swapped = TlsSettings {
            cert_file: Some(cert.clone()),
            key_file: Some(cert.clone()),
            ..Default::default()
        };
        let e = server_config(&swapped).unwrap_err().to_string();
        assert!(e.starts_with("--key-file"), "{e}");
        let no_ca = TlsSettings {
            client_cert_auth: true,
            ..settings
        };
        assert!(matches!(
            server_config(&no_ca),
            Err(TlsError::NoTrustedCa { .. })
        ));
    }
}
