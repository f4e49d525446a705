//! One client connection's transport ([`ClientIo`]): plain TCP or TLS over it, decided per
//! listener (`--listen-client-urls` with `http://`, `https://`, or both on one port, as
//! etcd allows), and what the handlers may learn about it ([`ClientConnectInfo`]: the
//! addresses and the client's certificate chain, for etcd's CN-based authentication).
//!
//! The TLS handshake runs per connection, bounded by [`HANDSHAKE_TIMEOUT`], off the accept
//! path (`transport::Incoming` polls pending handshakes beside `accept`), so a slow or
//! silent client cannot hold up the others.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long a client has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of every TLS connection (a handshake record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a listener's connections speak.
#[derive(Clone)]
pub enum Security {
    /// `http://` only.
    Plain,
    /// `https://` only: a client that does not complete a TLS handshake is dropped.
    Tls(Arc<rustls::ServerConfig>),
    /// `http://` and `https://` on one port: a connection whose first byte opens a TLS
    /// handshake gets TLS, any other plain text (etcd's cmux does the same).
    Both(Arc<rustls::ServerConfig>),
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Security::Plain => "Plain",
            Security::Tls(_) => "Tls",
            Security::Both(_) => "Both",
        })
    }
}

/// One client address and how it speaks.
#[derive(Clone, Debug)]
pub struct ClientListener {
    pub addr: SocketAddr,
    pub security: Security,
}

impl ClientListener {
    /// A plain-text listener.
    pub fn plain(addr: SocketAddr) -> Self {
        ClientListener {
            addr,
            security: Security::Plain,
        }
    }
}

/// What a handler can learn about its connection (tonic puts it in every request's
/// extensions).
#[derive(Clone, Debug)]
pub struct ClientConnectInfo {
    pub local_addr: Option<SocketAddr>,
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate chain a TLS client presented (verified against
    /// `--trusted-ca-file` when `--client-cert-auth` is on); `None` over plain TCP.
    pub peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// A client connection: plain, or TLS.
pub enum ClientIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl ClientIo {
    pub fn connect_info(&self) -> ClientConnectInfo {
        let tcp = match self {
            ClientIo::Plain(s) => s,
            ClientIo::Tls(s) => s.get_ref().0,
        };
        let peer_certs = match self {
            ClientIo::Plain(_) => None,
            ClientIo::Tls(s) => s
                .get_ref()
                .1
                .peer_certificates()
                .map(|certs| Arc::new(certs.iter().map(|c| c.clone().into_owned()).collect())),
        };
        ClientConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
            peer_certs,
        }
    }

    pub fn is_write_vectored(&self) -> bool {
        match self {
            ClientIo::Plain(s) => s.is_write_vectored(),
            ClientIo::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Who connects to a listener: how loudly a refused handshake is logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialer {
    /// Clients: at DEBUG, since a client decides how often it fails (the counter is the
    /// operator's signal).
    Client,
    /// Members: at INFO, in etcd's words (`rejected connection from …`): a member refused
    /// is a cluster whose certificates disagree, which the operator must see (and etcd's
    /// e2e suite waits for the line).
    Peer,
}

/// Makes `stream` a connection as `security` says: `None` if it must be dropped (a failed
/// or timed-out handshake, counted in `baton_tls_handshake_failures_total`).
pub async fn establish(
    stream: TcpStream,
    peer: SocketAddr,
    security: Security,
    dialer: Dialer,
) -> Option<ClientIo> {
    let config = match security {
        Security::Plain => return Some(ClientIo::Plain(stream)),
        Security::Tls(config) => config,
        Security::Both(config) => {
            let mut first = [0u8; 1];
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
                Ok(Ok(1)) if first[0] == TLS_HANDSHAKE_RECORD => config,
                Ok(Ok(1)) => return Some(ClientIo::Plain(stream)),
                // Closed, failed or silent before sending anything.
                _ => return None,
            }
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(ClientIo::Tls(Box::new(tls))),
        Ok(Err(e)) => {
            handshake_failed(peer, "refused", &e, dialer);
            None
        }
        Err(_) => {
            handshake_failed(
                peer,
                "timeout",
                &io::Error::new(io::ErrorKind::TimedOut, "no handshake in time"),
                dialer,
            );
            None
        }
    }
}

fn handshake_failed(peer: SocketAddr, kind: &'static str, error: &io::Error, dialer: Dialer) {
    metrics::counter!("baton_tls_handshake_failures_total", "kind" => kind).increment(1);
    match dialer {
        // A client's mistake (plain text on a TLS port, an untrusted certificate), not the
        // server's.
        Dialer::Client => {
            tracing::debug!(%peer, kind, %error, "TLS handshake with a client failed")
        }
        Dialer::Peer => {
            let why = crate::tls::describe_tls_error(error).unwrap_or_else(|| error.to_string());
            tracing::info!("rejected connection from \"{peer}\" (error \"{why}\")");
        }
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        ClientIo::is_write_vectored(self)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
