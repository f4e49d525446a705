//! The test server shared by this directory's test binaries: a `baton_raft::Node` on a
//! tempdir and the full `baton_server` on a loopback port, reached with the generated tonic
//! clients.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use baton_proto::baton::v1 as bv1;
use baton_proto::etcdserverpb as epb;
use baton_raft::{Node, NodeConfig};
use baton_server::locks::LockEngine;
use baton_server::{serve_with_locks, ServerConfig, Shared};
use tonic::transport::Channel;

pub struct Server {
    pub node: Node,
    pub engine: LockEngine,
    pub addr: SocketAddr,
    pub channel: Channel,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub _dir: tempfile::TempDir,
}

/// Methods every test binary here uses; binaries add their own in `impl Server` blocks.
impl Server {
    pub async fn start() -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = NodeConfig::new("t", dir.path());
        config.heartbeat_interval = Duration::from_millis(50);
        config.election_timeout = Duration::from_millis(300);
        let node = Node::start(config).await.expect("node");
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr")
        };
        let shared = Shared {
            node: node.clone(),
            config: ServerConfig {
                client_listeners: vec![baton_server::conn::ClientListener::plain(addr)],
                metrics_listeners: Vec::new(),
                min_lease_ttl_s: 1,
                watch_progress_interval: Duration::from_secs(600),
                max_concurrent_streams: baton_server::transport::DEFAULT_MAX_CONCURRENT_STREAMS,
                keepalive: Default::default(),
                auth: baton_server::auth::Authenticator::default(),
                http_extension: None,
            },
        };
        let engine = LockEngine::new(shared.clone());
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with_locks(shared, engine.clone(), metrics, async {
            let _ = stopped.await;
        }));
        let channel = connect(addr).await;
        Server {
            node,
            engine,
            addr,
            channel,
            stop: Some(stop),
            _dir: dir,
        }
    }

    /// A separate connection (HTTP/2 caps concurrent streams per connection).
    pub async fn connection(&self) -> Channel {
        connect(self.addr).await
    }

    pub fn locks(&self) -> bv1::lock_client::LockClient<Channel> {
        bv1::lock_client::LockClient::new(self.channel.clone())
    }

    pub async fn lease(&self, ttl: i64) -> i64 {
        epb::lease_client::LeaseClient::new(self.channel.clone())
            .lease_grant(epb::LeaseGrantRequest { ttl, id: 0 })
            .await
            .expect("lease grant")
            .into_inner()
            .id
    }

    pub async fn inspect(&self, name: &str) -> bv1::InspectResponse {
        self.locks()
            .inspect(bv1::InspectRequest { name: name.into() })
            .await
            .expect("inspect")
            .into_inner()
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.node.shutdown().await;
    }
}

pub async fn connect(addr: SocketAddr) -> Channel {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .tcp_nodelay(true);
    let t0 = Instant::now();
    loop {
        match endpoint.connect().await {
            Ok(c) => return c,
            Err(e) if t0.elapsed() < Duration::from_secs(5) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("cannot connect to {addr}: {e}"),
        }
    }
}

/// Polls `f` every 10 ms until it is true, failing after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !f().await {
        assert!(t0.elapsed() < limit, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
