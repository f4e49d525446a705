//! TLS on the client port, with etcd 3.4's flags: the server's certificate and key
//! (`--cert-file`, `--key-file`, or a self-signed pair with `--auto-tls`), client
//! certificates required and checked against `--trusted-ca-file` with `--client-cert-auth`,
//! revoked ones refused with `--client-crl-file`, and TLS 1.2 suites limited by
//! `--cipher-suites`.
//!
//! rustls with its ring provider does the cryptography and the certificate checks (webpki);
//! nothing here parses a certificate beyond handing PEM to `rustls-pki-types`. As in Go's
//! TLS (etcd), `--cipher-suites` names TLS 1.2 suites: given, the server speaks TLS 1.2 with
//! exactly those (Go cannot restrict TLS 1.3's suites, and a client offering none of the
//! listed ones must fail, which it could not if TLS 1.3 were left on).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::{ring, CryptoProvider};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
/// rustls's server configuration, re-exported so that users need no rustls of their own.
pub use rustls::ServerConfig;
use rustls::SupportedCipherSuite;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

/// What the TLS flags say (paths as given).
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// `--cert-file`: the server's certificate chain (PEM).
    pub cert_file: Option<PathBuf>,
    /// `--key-file`: its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// `--trusted-ca-file`: the CAs client certificates must chain to (PEM).
    pub trusted_ca_file: Option<PathBuf>,
    /// `--client-cert-auth`: a client must present a certificate of a trusted CA.
    pub client_cert_auth: bool,
    /// `--client-crl-file`: revoked client certificates (DER or PEM).
    pub crl_file: Option<PathBuf>,
    /// `--cipher-suites`: Go's names of the TLS 1.2 suites to allow (empty: rustls's
    /// defaults, TLS 1.3 and 1.2).
    pub cipher_suites: Vec<String>,
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
    #[error("{0} is required to serve https URLs (or --auto-tls)")]
    Missing(&'static str),
    #[error("--client-cert-auth needs --trusted-ca-file: the CAs that client certificates must chain to")]
    NoTrustedCa,
    #[error("--cipher-suites: unknown cipher suite {0:?}")]
    UnknownCipherSuite(String),
    #[error(
        "--cipher-suites: {0} is not offered by this build (only TLS 1.2 ECDHE suites with \
         AES-GCM or ChaCha20-Poly1305 are)"
    )]
    UnsupportedCipherSuite(String),
    #[error("--auto-tls: {0}")]
    AutoTls(String),
    #[error("TLS configuration: {0}")]
    Rustls(String),
}

/// The server's rustls configuration for `settings`, speaking HTTP/2 (gRPC) by ALPN.
pub fn server_config(settings: &TlsSettings) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cert_file = settings
        .cert_file
        .as_deref()
        .ok_or(TlsError::Missing("--cert-file"))?;
    let key_file = settings
        .key_file
        .as_deref()
        .ok_or(TlsError::Missing("--key-file"))?;
    let chain = read_certs("--cert-file", cert_file)?;
    let key = read_key("--key-file", key_file)?;
    let provider = Arc::new(provider(&settings.cipher_suites)?);
    let versions: &[&rustls::SupportedProtocolVersion] = if settings.cipher_suites.is_empty() {
        rustls::DEFAULT_VERSIONS
    } else {
        &[&rustls::version::TLS12]
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = if settings.client_cert_auth {
        let ca_file = settings
            .trusted_ca_file
            .as_deref()
            .ok_or(TlsError::NoTrustedCa)?;
        let mut roots = RootCertStore::empty();
        for ca in read_certs("--trusted-ca-file", ca_file)? {
            roots.add(ca).map_err(|e| TlsError::Invalid {
                flag: "--trusted-ca-file",
                path: ca_file.to_path_buf(),
                reason: e.to_string(),
            })?;
        }
        let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        if let Some(crl_file) = &settings.crl_file {
            verifier = verifier.with_crls(read_crls(crl_file)?);
        }
        let verifier = verifier
            .build()
            .map_err(|e| TlsError::Rustls(e.to_string()))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Invalid {
            flag: "--key-file",
            path: key_file.to_path_buf(),
            reason: format!("does not match --cert-file {}: {e}", cert_file.display()),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
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
fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    const FLAG: &str = "--client-crl-file";
    let bytes = read(FLAG, path)?;
    if bytes.starts_with(b"-----") {
        let crls = CertificateRevocationListDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(FLAG, path, e))?;
        if crls.is_empty() {
            return Err(invalid(FLAG, path, "no PEM X509 CRL in the file"));
        }
        return Ok(crls);
    }
    Ok(vec![CertificateRevocationListDer::from(bytes)])
}

/// `--auto-tls`: a self-signed certificate for `hosts` (the client URLs' hosts), written
/// to `dir` (etcd keeps it under `<data-dir>/fixtures/client`) as `cert.pem` and `key.pem`
/// and made anew at every start, as etcd does. Returns the two paths.
pub fn self_signed(dir: &Path, hosts: &[String]) -> Result<(PathBuf, PathBuf), TlsError> {
    let mut names: Vec<String> = hosts.to_vec();
    if names.is_empty() {
        names.push("localhost".into());
    }
    let certified =
        rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::AutoTls(e.to_string()))?;
    std::fs::create_dir_all(dir)
        .map_err(|e| TlsError::AutoTls(format!("{}: {e}", dir.display())))?;
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    write_private(&key, certified.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&cert, certified.cert.pem())
        .map_err(|e| TlsError::AutoTls(format!("{}: {e}", cert.display())))?;
    Ok((cert, key))
}

/// Writes a key readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| TlsError::AutoTls(format!("{}: {e}", path.display())))?;
    f.write_all(bytes)
        .map_err(|e| TlsError::AutoTls(format!("{}: {e}", path.display())))
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
        let (cert, key) = self_signed(dir.path(), &["localhost".into()]).unwrap();
        let settings = TlsSettings {
            cert_file: Some(cert.clone()),
            key_file: Some(key.clone()),
            ..Default::default()
        };
        let config = server_config(&settings).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
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
        assert!(matches!(server_config(&no_ca), Err(TlsError::NoTrustedCa)));
    }
}
