//! # baton-tls
//!
//! The TLS pieces Baton's server (`baton-server`: the client and peer ports) and its client
//! (`baton-client`) share, over rustls:
//! - [`AnyServerCertificate`]: a server-certificate verifier that accepts any certificate
//!   but still checks the handshake's signatures — for etcd's `--peer-auto-tls` peers and
//!   etcdctl's `--insecure-skip-tls-verify`;
//! - [`describe_tls_error`]: a TLS failure in Go's words (`remote error: tls: bad
//!   certificate`), as etcd and etcdctl print them;
//! - [`common_name`]: a certificate's subject Common Name (x509-parser; rustls and webpki
//!   expose none), for `--peer-cert-allowed-cn` and CN-based authentication.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// The subject Common Name of a certificate (the first, as Go's `Subject.CommonName`);
/// `None` if it has none or does not parse. Also what etcd authenticates a client as from
/// its certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Accepts any server certificate but checks the handshake's signatures with it
/// (etcd's self-signed peers, `--insecure-skip-tls-verify`): the connection is
/// encrypted to whoever holds the certificate's key, and nobody vouches for who that is.
#[derive(Debug)]
pub struct AnyServerCertificate {
    provider: Arc<CryptoProvider>,
}

impl AnyServerCertificate {
    /// The verifier, checking signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Self {
        AnyServerCertificate { provider }
    }
}

impl ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS failure in Go's words, which etcd's logs (and tools reading them) use: an alert
/// from the other side is `remote error: tls: <alert>`; our own refusal of a certificate
/// that chains but names the wrong identity is `client certificate authentication failed`.
/// `None` if `error` holds no TLS failure.
///
/// An alert can arrive after the client's side of the handshake is done (TLS 1.3: the
/// server checks the client's certificate after the client sent its Finished), and then h2
/// carries the error on as text only: such an error is recognised by rustls's own wording
/// of each alert.
pub fn describe_tls_error(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(error);
    while let Some(e) = source {
        let rustls_error = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(r) = rustls_error {
            return Some(go_words(r));
        }
        let text = e.to_string();
        if let Some(alert) = ALERTS
            .iter()
            .find(|a| rustls::Error::AlertReceived(**a).to_string() == text)
        {
            return Some(go_words(&rustls::Error::AlertReceived(*alert)));
        }
        source = e.source();
    }
    None
}

/// The alerts a peer refusing a handshake sends (what [`describe_tls_error`] recognises in
/// text).
const ALERTS: &[rustls::AlertDescription] = {
    use rustls::AlertDescription as A;
    &[
        A::BadCertificate,
        A::UnsupportedCertificate,
        A::CertificateRevoked,
        A::CertificateExpired,
        A::CertificateUnknown,
        A::UnknownCA,
        A::AccessDenied,
        A::HandshakeFailure,
        A::CertificateRequired,
        A::ProtocolVersion,
        A::DecryptError,
        A::IllegalParameter,
        A::DecodeError,
        A::InternalError,
        A::NoApplicationProtocol,
    ]
};

fn go_words(error: &rustls::Error) -> String {
    use rustls::AlertDescription as A;
    match error {
        rustls::Error::AlertReceived(alert) => {
            let text = match alert {
                A::BadCertificate => "bad certificate".to_string(),
                A::UnsupportedCertificate => "unsupported certificate".to_string(),
                A::CertificateRevoked => "revoked certificate".to_string(),
                A::CertificateExpired => "expired certificate".to_string(),
                A::CertificateUnknown => "unknown certificate".to_string(),
                A::UnknownCA => "unknown certificate authority".to_string(),
                A::AccessDenied => "access denied".to_string(),
                A::HandshakeFailure => "handshake failure".to_string(),
                A::CertificateRequired => "certificate required".to_string(),
                A::ProtocolVersion => "protocol version not supported".to_string(),
                A::DecryptError => "error decrypting message".to_string(),
                other => format!("{other:?}"),
            };
            format!("remote error: tls: {text}")
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName) => {
            "client certificate authentication failed".to_string()
        }
        rustls::Error::NoCertificatesPresented => {
            "tls: client didn't provide a certificate".to_string()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rustls error reads in Go's words whether it arrives typed (inside an `io::Error`,
    /// as tokio-rustls gives it) or only as rustls's text (as h2 passes it on).
    #[test]
    fn tls_failures_read_in_gos_words() {
        let typed = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert_eq!(
            describe_tls_error(&typed).as_deref(),
            Some("remote error: tls: certificate required")
        );
        let text = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate).to_string(),
        );
        assert_eq!(
            describe_tls_error(&text).as_deref(),
            Some("remote error: tls: bad certificate")
        );
        let ours = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert_eq!(
            describe_tls_error(&ours).as_deref(),
            Some("client certificate authentication failed")
        );
        let unrelated = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(describe_tls_error(&unrelated), None);
    }
}
