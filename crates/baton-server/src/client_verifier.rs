//! How a TLS client's certificate is judged, on the client port and the peer port alike:
//! webpki's chain check against the trusted CAs and CRLs, Go's rule for a certificate that
//! *is* a trusted CA certificate, then etcd's allowed identity.
//!
//! **A trusted CA certificate as its own client certificate.** etcd's own e2e suite
//! (`TestCtlV3AuthCertCNWithWithConcurrentOperation`) and some small deployments use one
//! self-signed `CA:TRUE` certificate for everything: the server's certificate, the client's,
//! and `--trusted-ca-file`. Go's `x509.Verify` accepts a leaf that is itself in the root pool
//! (the chain is that one certificate), so etcd admits such a client; webpki refuses any
//! `CA:TRUE` certificate as an end entity (`CaUsedAsEndEntity`). The fallback here runs only
//! after webpki refused, and only for a certificate byte-identical to a trust anchor the
//! operator listed; the TLS handshake still proves the client holds that certificate's private
//! key (the handshake signature is checked by webpki's verifier with the certificate's own
//! key). It grants nothing new: whoever holds a trusted CA's key can already mint any client
//! certificate that CA vouches for. What Go checks of such a leaf is checked here too: the
//! validity period, the client-auth purpose when the certificate names its purposes, and —
//! as etcd's `--client-crl-file` check does, by serial — revocation.
//!
//! **Allowed identity** (`--peer-cert-allowed-cn` / `--peer-cert-allowed-hostname`): a
//! certificate that chains but names the wrong identity is refused with a `bad_certificate`
//! alert, as Go's `VerifyPeerCertificate` failure is ([`CertificateError::NotValidForName`];
//! the refusal is logged as etcd words it: `baton_tls::describe_tls_error`).

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, ServerName, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

/// What a client certificate must name beyond chaining to a trusted CA (etcd's
/// `AllowedCN` / `AllowedHostname`).
#[derive(Debug, Clone)]
pub(crate) enum AllowedIdentity {
    CommonName(String),
    Hostname(ServerName<'static>),
}

impl AllowedIdentity {
    fn admits(&self, end_entity: &CertificateDer<'_>) -> bool {
        match self {
            AllowedIdentity::CommonName(cn) => {
                baton_tls::common_name(end_entity).as_deref() == Some(cn)
            }
            AllowedIdentity::Hostname(name) => ParsedCertificate::try_from(end_entity)
                .and_then(|cert| rustls::client::verify_server_name(&cert, name))
                .is_ok(),
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ClientVerifier {
    /// webpki's verifier over `--trusted-ca-file` and the CRLs.
    pub(crate) webpki: Arc<dyn ClientCertVerifier>,
    /// The DER of every certificate in `--trusted-ca-file`.
    pub(crate) anchors: Vec<CertificateDer<'static>>,
    /// The DER of every CRL in `--client-crl-file` / `--peer-crl-file`.
    pub(crate) crls: Vec<CertificateRevocationListDer<'static>>,
    pub(crate) allowed: Option<AllowedIdentity>,
}

impl ClientVerifier {
    /// Whether `end_entity`, a trust anchor itself, passes what Go checks of such a leaf.
    fn admits_anchor(&self, end_entity: &CertificateDer<'_>, now: UnixTime) -> bool {
        if !self
            .anchors
            .iter()
            .any(|a| a.as_ref() == end_entity.as_ref())
        {
            return false;
        }
        let Ok((_, cert)) = X509Certificate::from_der(end_entity.as_ref()) else {
            return false;
        };
        let Ok(now) = x509_parser::time::ASN1Time::from_timestamp(now.as_secs() as i64) else {
            return false;
        };
        cert.validity().is_valid_at(now) && allows_client_auth(&cert) && !revoked(&cert, &self.crls)
    }
}

/// Go requires the client-auth purpose only of a certificate that lists purposes.
fn allows_client_auth(cert: &X509Certificate<'_>) -> bool {
    match cert.extended_key_usage() {
        Ok(None) => true,
        Ok(Some(eku)) => eku.value.client_auth || eku.value.any,
        Err(_) => false,
    }
}

/// Listed by serial in a CRL from the certificate's issuer (an unreadable CRL revokes:
/// refusing is the safe side, and the server already refused to start on a malformed one).
fn revoked(cert: &X509Certificate<'_>, crls: &[CertificateRevocationListDer<'_>]) -> bool {
    crls.iter().any(
        |der| match CertificateRevocationList::from_der(der.as_ref()) {
            Ok((_, crl)) => {
                crl.issuer() == cert.issuer()
                    && crl
                        .iter_revoked_certificates()
                        .any(|r| r.raw_serial() == cert.raw_serial())
            }
            Err(_) => true,
        },
    )
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        self.webpki.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.webpki.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = match self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(verified) => verified,
            Err(refused) if self.admits_anchor(end_entity, now) => {
                tracing::debug!(%refused, "client certificate is a trusted CA certificate itself: accepted as Go accepts it");
                ClientCertVerified::assertion()
            }
            Err(refused) => return Err(refused),
        };
        match &self.allowed {
            Some(allowed) if !allowed.admits(end_entity) => Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            )),
            _ => Ok(verified),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
