//! Peer TLS: `https://` in `--listen-peer-urls`, with etcd's `--peer-*` flags, as a
//! [`PeerTransport`] that `baton serve` hands the replica (baton-raft stays free of TLS: its
//! peer service and channels are the same tonic code over whatever streams the transport
//! makes).
//!
//! - **Accepting**: each peer address is a TCP listener whose connections complete a TLS
//!   handshake before tonic sees them ([`transport::Incoming`], the client port's accept
//!   loop: handshakes off the accept path, bounded in number and time). With
//!   `--peer-trusted-ca-file` or `--peer-client-cert-auth` a peer must present a certificate
//!   of that CA (and name `--peer-cert-allowed-cn` / `-hostname`), so a process without one
//!   gets no gRPC method at all — openraft's included — which is what the cluster-token
//!   credential alone cannot give (`baton-raft`'s `peer_server`). A refused handshake is
//!   logged as etcd logs it (`rejected connection from …`).
//! - **Dialing**: an `https://` peer URL is dialed with this member's certificate and the
//!   peer's checked as [`PeerVerify`] says; an `http://` one in plain text (a member of a
//!   mixed cluster).
//! - **Explaining**: a call refused by the peer's TLS is reported in Go's words (`remote
//!   error: tls: bad certificate`), logged once per peer ([`PeerTransport::explain`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use baton_raft::{ListenFuture, PeerIo, PeerTransport};
use futures::StreamExt;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Identity};

use crate::conn::Security;
use crate::tls::{self, PeerClientTls, PeerVerify};
use crate::transport::Incoming;

/// Accepted peer connections waiting for the peer service (it takes them at once; the
/// bound only keeps a stalled service from buffering without limit).
const ACCEPTED_QUEUE: usize = 64;

/// Peer connections over TLS.
pub struct TlsPeerTransport {
    server: Arc<rustls::ServerConfig>,
    client: PeerClientTls,
}

impl TlsPeerTransport {
    /// `server`: what peers dialing this member meet (`tls::server_config` of the `--peer-`
    /// flags); `client`: how this member dials them (`tls::peer_client`).
    pub fn new(server: Arc<rustls::ServerConfig>, client: PeerClientTls) -> Self {
        TlsPeerTransport { server, client }
    }

    /// tonic's TLS settings for dialing a peer at `endpoint`.
    fn tls_endpoint(&self, endpoint: Endpoint) -> Result<Endpoint, tonic::transport::Error> {
        let mut config = ClientTlsConfig::new().assume_http2(true);
        if let Some((cert, key)) = &self.client.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        match &self.client.verify {
            PeerVerify::TrustedCa(verifier) | PeerVerify::Nothing(verifier) => {
                endpoint.tls_config_with_verifier(config, verifier.clone())
            }
            PeerVerify::SystemRoots => endpoint.tls_config(config.with_native_roots()),
        }
    }
}

impl PeerTransport for TlsPeerTransport {
    fn connect_lazy(&self, endpoint: Endpoint) -> Channel {
        if endpoint.uri().scheme_str() != Some("https") {
            return endpoint.connect_lazy();
        }
        let uri = endpoint.uri().clone();
        match self.tls_endpoint(endpoint.clone()) {
            Ok(tls) => tls.connect_lazy(),
            Err(e) => {
                // Only a host that is not a valid TLS server name gets here (the
                // certificates were read at start); tonic's plain connector then refuses
                // the https URL at every call, and each call says why.
                tracing::warn!(peer_url = %uri, error = %e, "cannot dial this peer over TLS");
                endpoint.connect_lazy()
            }
        }
    }

    fn listen(&self, addr: SocketAddr) -> ListenFuture {
        let server = self.server.clone();
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            let mut incoming = Incoming::with_security(listener, Security::Tls(server)).for_peers();
            let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<PeerIo>>(ACCEPTED_QUEUE);
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        // The peer service is gone (the replica shut down): stop accepting.
                        _ = tx.closed() => return,
                        next = incoming.next() => {
                            let Some(accepted) = next else { return };
                            let io = accepted.map(|stream| PeerIo(Box::new(stream)));
                            if tx.send(io).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            Ok(rx)
        })
    }

    fn explain(&self, status: &tonic::Status) -> Option<String> {
        tls::describe_tls_error(status)
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use baton_proto::baton::raft::v1::raft_client::RaftClient;
    use baton_proto::baton::raft::v1::PeerMessage;
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    use super::*;
    use crate::tls::{TlsPort, TlsSettings};

    /// A CA and leaf certificates it signs, written as PEM files.
    struct Pki {
        dir: tempfile::TempDir,
        ca_params: CertificateParams,
        ca_key: KeyPair,
    }

    impl Pki {
        fn new(ca_name: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
            ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            ca_params
                .distinguished_name
                .push(DnType::CommonName, ca_name);
            let ca_key = KeyPair::generate().unwrap();
            let ca = ca_params.self_signed(&ca_key).unwrap();
            std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
            Pki {
                dir,
                ca_params,
                ca_key,
            }
        }

        fn ca(&self) -> PathBuf {
            self.dir.path().join("ca.pem")
        }

        /// A leaf for localhost and 127.0.0.1 with Common Name `cn`: (cert, key) paths.
        fn leaf(&self, name: &str, cn: &str) -> (PathBuf, PathBuf) {
            let mut params =
                CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                    .unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            let key = KeyPair::generate().unwrap();
            let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
            let cert = params.signed_by(&key, &issuer).unwrap();
            let cert_path = self.dir.path().join(format!("{name}.crt"));
            let key_path = self.dir.path().join(format!("{name}.key"));
            std::fs::write(&cert_path, cert.pem()).unwrap();
            std::fs::write(&key_path, key.serialize_pem()).unwrap();
            (cert_path, key_path)
        }
    }

    fn settings(
        ca: &Path,
        (cert, key): (PathBuf, PathBuf),
        allowed_cn: Option<&str>,
    ) -> TlsSettings {
        TlsSettings {
            port: TlsPort::Peer,
            cert_file: Some(cert),
            key_file: Some(key),
            trusted_ca_file: Some(ca.to_path_buf()),
            client_cert_auth: true,
            allowed_cn: allowed_cn.map(str::to_string),
            ..Default::default()
        }
    }

    fn transport(settings: &TlsSettings) -> TlsPeerTransport {
        TlsPeerTransport::new(
            tls::server_config(settings).unwrap(),
            tls::peer_client(settings, false).unwrap(),
        )
    }

    fn free_port() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    /// Dials `addr` through `dialer` and makes one call; the status it fails with (every
    /// call fails: nothing serves the accepted connections, so a connection that got
    /// through ends when the test drops it).
    async fn call(dialer: &TlsPeerTransport, addr: SocketAddr) -> tonic::Status {
        let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{}", addr.port()))
            .unwrap()
            .timeout(std::time::Duration::from_secs(5));
        let mut client = RaftClient::new(dialer.connect_lazy(endpoint));
        client
            .vote(PeerMessage::default())
            .await
            .expect_err("nothing serves the peer service")
    }

    /// A peer whose certificate chains to the CA but names another CN is refused in the
    /// handshake, and the dialer hears why in Go's words; one with the allowed CN gets a
    /// connection through to the peer service.
    #[tokio::test]
    async fn allowed_cn_is_enforced_in_the_handshake() {
        let pki = Pki::new("our CA");
        let server = transport(&settings(
            &pki.ca(),
            pki.leaf("a", "example.com"),
            Some("example.com"),
        ));
        let addr = free_port();
        let mut accepted = server.listen(addr).await.unwrap();

        let stranger = transport(&settings(&pki.ca(), pki.leaf("b", "example2.com"), None));
        let status = call(&stranger, addr).await;
        assert_eq!(
            stranger.explain(&status).as_deref(),
            Some("remote error: tls: bad certificate"),
            "{status:?}"
        );
        assert!(
            accepted.try_recv().is_err(),
            "a refused peer reaches nothing"
        );

        let member = transport(&settings(&pki.ca(), pki.leaf("c", "example.com"), None));
        let dial = tokio::spawn(async move { call(&member, addr).await });
        let io = tokio::time::timeout(std::time::Duration::from_secs(5), accepted.recv())
            .await
            .expect("the member's connection is accepted")
            .expect("listener open");
        assert!(io.is_ok());
        drop(io);
        dial.abort();
    }

    /// A peer with another CA's certificate, or none, gets no connection.
    #[tokio::test]
    async fn another_ca_or_no_certificate_is_refused() {
        let pki = Pki::new("our CA");
        let other = Pki::new("their CA");
        let server = transport(&settings(&pki.ca(), pki.leaf("a", "m"), None));
        let addr = free_port();
        let mut accepted = server.listen(addr).await.unwrap();

        // Trusts our CA (so it would accept the server) but shows another CA's certificate.
        let mut foreign = settings(&pki.ca(), other.leaf("x", "m"), None);
        foreign.trusted_ca_file = Some(pki.ca());
        let foreign = transport(&foreign);
        let status = call(&foreign, addr).await;
        assert_eq!(
            foreign.explain(&status).as_deref(),
            Some("remote error: tls: unknown certificate authority"),
            "{status:?}"
        );

        let anonymous = TlsPeerTransport::new(
            tls::server_config(&settings(&pki.ca(), pki.leaf("y", "m"), None)).unwrap(),
            PeerClientTls {
                identity: None,
                verify: tls::peer_client(&settings(&pki.ca(), pki.leaf("z", "m"), None), false)
                    .unwrap()
                    .verify,
            },
        );
        let status = call(&anonymous, addr).await;
        assert!(anonymous.explain(&status).is_some(), "{status:?}");
        assert!(accepted.try_recv().is_err());
    }
}
