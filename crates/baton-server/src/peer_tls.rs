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

use baton_raft::{DialFuture, ListenFuture, PeerIo, PeerStream, PeerTransport};
use futures::StreamExt;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
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
    /// How the peer link (`baton-raft`'s `link`) dials `https://` peers: the same identity
    /// and the same check of the peer's certificate as the gRPC channel's; `None` with
    /// [`PeerVerify::SystemRoots`] (those calls keep the gRPC pipe).
    link: Option<tokio_rustls::TlsConnector>,
}

impl TlsPeerTransport {
    /// `server`: what peers dialing this member meet (`tls::server_config` of the `--peer-`
    /// flags); `client`: how this member dials them (`tls::peer_client`).
    pub fn new(server: Arc<rustls::ServerConfig>, client: PeerClientTls) -> Self {
        let link = match link_connector(&client) {
            Ok(link) => link,
            Err(e) => {
                // tonic refuses the same identity at every call, and says so there.
                tracing::warn!(error = %e, "peer link: cannot use this member's peer certificate");
                None
            }
        };
        TlsPeerTransport {
            server,
            client,
            link,
        }
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

    fn dial(&self, url: &str) -> Option<DialFuture> {
        if url.starts_with("http://") {
            return Some(baton_raft::dial_plain(url));
        }
        if !url.starts_with("https://") {
            return None;
        }
        let connector = self.link.clone()?;
        let (host, port) = baton_raft::peer_host_port(url).ok()?;
        let name = ServerName::try_from(host.clone()).ok()?;
        Some(Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok(Box::new(tls) as Box<dyn PeerStream>)
        }))
    }

    fn explain(&self, status: &tonic::Status) -> Option<String> {
        tls::describe_tls_error(status)
    }
}

/// The rustls client settings of the peer link, equal to what `tls_endpoint` gives tonic
/// (no ALPN: the link is not HTTP/2).
fn link_connector(
    client: &PeerClientTls,
) -> Result<Option<tokio_rustls::TlsConnector>, rustls::Error> {
    let verifier = match &client.verify {
        PeerVerify::TrustedCa(v) | PeerVerify::Nothing(v) => v.clone(),
        PeerVerify::SystemRoots => return Ok(None),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &client.identity {
        Some((cert, key)) => {
            let bad = |what: &str| rustls::Error::General(format!("peer {what}: no PEM"));
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| bad("certificate"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| bad("key"))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Some(tokio_rustls::TlsConnector::from(Arc::new(config))))
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

    /// A peer listener whose certificate names (and whose peers must name) example.com.
    async fn listen_as_example_com(pki: &Pki) -> (SocketAddr, baton_raft::PeerIncoming) {
        let server = transport(&settings(
            &pki.ca(),
            pki.leaf("a", "example.com"),
            Some("example.com"),
        ));
        let addr = free_port();
        (addr, server.listen(addr).await.unwrap())
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

    /// The peer link dials with the same identity and checks as the gRPC channel: a peer
    /// with the allowed CN gets a byte stream through to the accepting side, a stranger's
    /// link fails with the TLS refusal, which the transport explains in Go's words as it
    /// does for a gRPC call (the link passes the I/O error on as the status's source).
    #[tokio::test]
    async fn the_peer_link_dials_under_the_same_tls() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let pki = Pki::new("our CA");
        let (addr, mut accepted) = listen_as_example_com(&pki).await;
        // The accepting side echoes 5 bytes on each connection that reaches it.
        tokio::spawn(async move {
            while let Some(Ok(PeerIo(mut io))) = accepted.recv().await {
                tokio::spawn(async move {
                    let mut got = [0u8; 5];
                    if io.read_exact(&mut got).await.is_ok() {
                        let _ = io.write_all(&got).await;
                        let _ = io.flush().await;
                    }
                });
            }
        });
        let url = format!("https://127.0.0.1:{}", addr.port());
        let echo = |dialer: TlsPeerTransport| {
            let dial = dialer.dial(&url).expect("an https URL is dialed");
            async move {
                let mut io = dial.await?;
                io.write_all(b"hello").await?;
                io.flush().await?;
                let mut back = [0u8; 5];
                io.read_exact(&mut back).await?;
                Ok::<_, io::Error>(back)
            }
        };
        let friend = transport(&settings(&pki.ca(), pki.leaf("c", "example.com"), None));
        assert_eq!(&echo(friend).await.unwrap(), b"hello");

        let stranger = transport(&settings(&pki.ca(), pki.leaf("b", "example2.com"), None));
        let e = echo(stranger).await.unwrap_err();
        let mut status = tonic::Status::unavailable("baton: peer link");
        status.set_source(Arc::new(e));
        let stranger = transport(&settings(&pki.ca(), pki.leaf("d", "example2.com"), None));
        assert_eq!(
            stranger.explain(&status).as_deref(),
            Some("remote error: tls: bad certificate"),
            "{status:?}"
        );
        // Plain peer URLs are dialed in plain text; other schemes not at all.
        assert!(stranger.dial("http://127.0.0.1:1").is_some());
        assert!(stranger.dial("unix:///tmp/x").is_none());
    }

    /// A peer whose certificate chains to the CA but names another CN is refused in the
    /// handshake, and the dialer hears why in Go's words; one with the allowed CN gets a
    /// connection through to the peer service.
    #[tokio::test]
    async fn allowed_cn_is_enforced_in_the_handshake() {
        let pki = Pki::new("our CA");
        let (addr, mut accepted) = listen_as_example_com(&pki).await;

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
