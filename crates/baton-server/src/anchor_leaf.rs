//! A client certificate that *is* one of the trusted CA certificates, accepted as Go accepts
//! it.
//!
//! **Why.** etcd's own e2e suite (`TestCtlV3AuthCertCNWithWithConcurrentOperation`) and some
//! small deployments use one self-signed `CA:TRUE` certificate for everything: the server's
//! certificate, the client's, and `--trusted-ca-file`. Go's `x509.Verify` accepts a leaf that
//! is itself in the root pool (the chain is that one certificate), so etcd admits such a
//! client; webpki refuses any `CA:TRUE` certificate as an end entity (`CaUsedAsEndEntity`),
//! so Baton refused the handshake (`certificate unknown`).
//!
//! **Why it grants nothing new.** The fallback runs only after webpki refused, and only for a
//! certificate byte-identical to a trust anchor the operator listed; the TLS handshake still
//! proves the client holds that certificate's private key (the handshake signature is checked
//! by the inner verifier with the certificate's own key). Whoever holds a trusted CA's key can
//! already mint any client certificate that CA vouches for. What Go checks for such a leaf is
//! checked here too: the validity period, the client-auth purpose when the certificate names
//! its purposes, and — as etcd's `--client-crl-file` check does, by serial — revocation.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::revocation_list::CertificateRevocationList;

/// webpki's chain check, then, for a refused certificate equal to a trust anchor, Go's rule
/// for a leaf found in the root pool.
#[derive(Debug)]
pub(crate) struct AnchorAsLeafVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    /// The DER of every certificate in `--trusted-ca-file`.
    anchors: Vec<CertificateDer<'static>>,
    /// The DER of every CRL in `--client-crl-file`.
    crls: Vec<CertificateRevocationListDer<'static>>,
}

impl AnchorAsLeafVerifier {
    pub(crate) fn new(
        inner: Arc<dyn ClientCertVerifier>,
        anchors: Vec<CertificateDer<'static>>,
        crls: Vec<CertificateRevocationListDer<'static>>,
    ) -> Self {
        AnchorAsLeafVerifier {
            inner,
            anchors,
            crls,
        }
    }

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

impl ClientCertVerifier for AnchorAsLeafVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self
            .inner
            .verify_client_cert(end_entity, intermediates, now)
        {
            Ok(verified) => Ok(verified),
            Err(refused) if self.admits_anchor(end_entity, now) => {
                tracing::debug!(%refused, "client certificate is a trusted CA certificate itself: accepted as Go accepts it");
                Ok(ClientCertVerified::assertion())
            }
            Err(refused) => Err(refused),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
