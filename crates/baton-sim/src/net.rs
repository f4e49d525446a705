//! Baton's real gRPC (tonic, hyper, h2) over turmoil's simulated TCP: the peer transport
//! injected into every member, the listener of the client API, and client channels.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use baton_raft::{DialFuture, ListenFuture, PeerIncoming, PeerIo, PeerStream, PeerTransport};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// The peer transport of a simulated member: connections are turmoil TCP streams, so every
/// partition, delay and crash the simulation applies hits Raft traffic too.
pub struct TurmoilTransport;

impl PeerTransport for TurmoilTransport {
    fn connect_lazy(&self, endpoint: Endpoint) -> Channel {
        lazy_channel(endpoint)
    }

    fn listen(&self, addr: SocketAddr) -> ListenFuture {
        Box::pin(async move { listen(addr).await })
    }

    /// The peer link over a turmoil stream, so the simulation's faults hit it as they hit
    /// the gRPC channel.
    fn dial(&self, url: &str) -> Option<DialFuture> {
        let (host, port) = baton_raft::peer_host_port(url).ok()?;
        Some(Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
            Ok(Box::new(stream) as Box<dyn PeerStream>)
        }))
    }
}

/// A channel to `endpoint` whose connections are turmoil TCP streams (made lazily, from
/// inside the simulated host or client that uses the channel).
pub fn lazy_channel(endpoint: Endpoint) -> Channel {
    endpoint.connect_with_connector_lazy(tower::service_fn(|uri: Uri| async move {
        let host = uri
            .host()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host in URI"))?
            .to_string();
        let port = uri.port_u16().unwrap_or(80);
        let stream = turmoil::net::TcpStream::connect((host.as_str(), port)).await?;
        Ok::<_, io::Error>(TokioIo::new(stream))
    }))
}

/// A channel to a member's client API, for workload clients.
pub fn client_channel(host: &str, port: u16) -> Channel {
    let endpoint = Endpoint::from_shared(format!("http://{host}:{port}"))
        .expect("valid simulated URL")
        .connect_timeout(std::time::Duration::from_millis(500));
    lazy_channel(endpoint)
}

/// Binds `addr` on the current simulated host and feeds accepted connections into a
/// channel, in order (what tonic's `serve_with_incoming` consumes).
pub async fn listen(addr: SocketAddr) -> io::Result<PeerIncoming> {
    let listener = turmoil::net::TcpListener::bind(addr).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let accepted = listener
                .accept()
                .await
                .map(|(stream, _)| PeerIo(Box::new(stream)));
            if tx.send(accepted).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// The transport as the trait object a member's environment holds.
pub fn transport() -> Arc<dyn PeerTransport> {
    Arc::new(TurmoilTransport)
}
