//! `baton.v1.Lock/List` over real gRPC: a `baton_raft::Node` on a tempdir, the full
//! `baton_server` on a loopback port, and the generated tonic client. The listing is what
//! `baton status` shows operators, so it must agree with `Inspect` on who holds a lock and
//! how many wait, including during a lock-delay.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use baton_proto::baton::v1 as bv1;
use baton_proto::etcdserverpb as epb;
use baton_raft::{Node, NodeConfig};
use baton_server::locks::LockEngine;
use baton_server::{serve_with_locks, ServerConfig, Shared};
use tonic::transport::Channel;
use tonic::Code;

struct Server {
    node: Node,
    channel: Channel,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start() -> Server {
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
                client_addrs: vec![addr],
                metrics_addrs: Vec::new(),
                min_lease_ttl_s: 1,
                watch_progress_interval: Duration::from_secs(600),
            },
        };
        let engine = LockEngine::new(shared.clone());
        let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with_locks(shared, engine, metrics, async {
            let _ = stopped.await;
        }));
        let channel = connect(addr).await;
        Server {
            node,
            channel,
            stop: Some(stop),
            _dir: dir,
        }
    }

    fn locks(&self) -> bv1::lock_client::LockClient<Channel> {
        bv1::lock_client::LockClient::new(self.channel.clone())
    }

    async fn lease(&self, ttl: i64) -> i64 {
        epb::lease_client::LeaseClient::new(self.channel.clone())
            .lease_grant(epb::LeaseGrantRequest { ttl, id: 0 })
            .await
            .expect("lease grant")
            .into_inner()
            .id
    }

    async fn acquire(&self, name: &str, lease: i64, lock_delay_ms: i64) -> bv1::AcquireResponse {
        self.locks()
            .acquire(bv1::AcquireRequest {
                name: name.into(),
                lease,
                lock_delay_ms,
                ..Default::default()
            })
            .await
            .expect("acquire")
            .into_inner()
    }

    /// Starts an acquisition that will wait; returns once the server has queued it.
    async fn enqueue_waiter(&self, name: &str, lease: i64) {
        let before = self.inspect(name).await.waiter_count;
        let mut c = self.locks();
        let req = bv1::AcquireRequest {
            name: name.into(),
            lease,
            ..Default::default()
        };
        tokio::spawn(async move {
            let _ = c.acquire(req).await;
        });
        eventually(Duration::from_secs(5), "the waiter is queued", || async {
            self.inspect(name).await.waiter_count > before
        })
        .await;
    }

    async fn inspect(&self, name: &str) -> bv1::InspectResponse {
        self.locks()
            .inspect(bv1::InspectRequest { name: name.into() })
            .await
            .expect("inspect")
            .into_inner()
    }

    async fn list(&self, prefix: &str, after: &str, limit: i64) -> bv1::ListLocksResponse {
        self.locks()
            .list(bv1::ListLocksRequest {
                prefix: prefix.into(),
                after: after.into(),
                limit,
            })
            .await
            .expect("list")
            .into_inner()
    }

    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.node.shutdown().await;
    }
}

async fn connect(addr: SocketAddr) -> Channel {
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
async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
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

fn names(r: &bv1::ListLocksResponse) -> Vec<String> {
    r.locks
        .iter()
        .map(|l| String::from_utf8_lossy(&l.name).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_holders_and_waiter_counts_in_name_order_and_pages() {
    let s = Server::start().await;
    let (a, b, c) = (s.lease(60).await, s.lease(60).await, s.lease(60).await);
    let held = s.acquire("jobs", a, 0).await;
    s.enqueue_waiter("jobs", b).await;
    s.enqueue_waiter("jobs", c).await;
    let alpha = s.acquire("alpha", b, 0).await;

    let all = s.list("", "", 0).await;
    assert_eq!(names(&all), ["alpha", "jobs"]);
    assert!(!all.more);
    assert_eq!(all.total, 2);
    assert!(all.header.expect("header").revision >= held.fencing_token);
    let jobs = &all.locks[1];
    let holder = jobs.holder.as_ref().expect("jobs is held");
    assert_eq!(holder.key, held.key);
    assert_eq!(holder.create_revision, held.fencing_token);
    assert_eq!(holder.lease, a);
    assert!(holder.lease_remaining_s > 0, "{holder:?}");
    assert_eq!(jobs.waiter_count, 2);
    let alpha_holder = all.locks[0].holder.as_ref().expect("alpha is held");
    assert_eq!(alpha_holder.key, alpha.key);
    assert_eq!(all.locks[0].waiter_count, 0);

    // Agrees with Inspect.
    let inspected = s.inspect("jobs").await;
    assert_eq!(inspected.holder.as_ref(), Some(holder));
    assert_eq!(inspected.waiter_count, jobs.waiter_count);

    // Bounded with `more`, paged with `after`, narrowed with `prefix`.
    let first = s.list("", "", 1).await;
    assert_eq!((names(&first), first.more), (vec!["alpha".into()], true));
    let next = s.list("", "alpha", 1).await;
    assert_eq!((names(&next), next.more), (vec!["jobs".into()], false));
    let jo = s.list("jo", "", 0).await;
    assert_eq!(names(&jo), ["jobs"]);
    assert_eq!(jo.total, 2, "total counts the whole registry");
    let err = s
        .locks()
        .list(bv1::ListLocksRequest {
            limit: -1,
            ..Default::default()
        })
        .await
        .expect_err("negative limit");
    assert_eq!(err.code(), Code::InvalidArgument);

    // A release hands the lock on; the listing follows.
    s.locks()
        .release(bv1::ReleaseRequest {
            key: held.key.clone(),
            fencing_token: held.fencing_token,
        })
        .await
        .expect("release");
    eventually(Duration::from_secs(5), "b holds jobs", || async {
        let l = s.list("jobs", "", 0).await;
        l.locks[0].holder.as_ref().map(|h| h.lease) == Some(b) && l.locks[0].waiter_count == 1
    })
    .await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_lock_delay_nobody_is_listed_as_holder() {
    let s = Server::start().await;
    // A 1 s lease that nobody keeps alive: its expiry (not a release) starts the delay.
    let doomed = s.lease(1).await;
    let next = s.lease(60).await;
    s.acquire("delayed", doomed, 60_000).await;
    s.enqueue_waiter("delayed", next).await;
    eventually(Duration::from_secs(10), "the lock-delay runs", || async {
        let l = s.list("", "", 0).await;
        l.locks[0].delayed_until_ms > 0
    })
    .await;
    let l = s.list("", "", 0).await;
    let d = &l.locks[0];
    assert!(d.holder.is_none(), "{d:?}");
    assert_eq!(d.waiter_count, 1, "the head waits out the delay");
    assert_eq!(d.lock_delay_ms, 60_000);
    s.stop().await;
}
