//! Shared by the integration tests: one server of each kind per test binary, and the three
//! ways the tests run the same recipe code.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use baton_client::testing::{Flavor, TestServer};
use baton_client::{Client, ClientConfig, ServerKind, Session, SessionOptions};

static BATON: OnceLock<TestServer> = OnceLock::new();
static ETCD: OnceLock<TestServer> = OnceLock::new();

/// Where a test runs and which API the client uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Baton, with `baton.v1`.
    Baton,
    /// etcd 3.4 (client-side recipes).
    Etcd,
    /// Baton driven exactly as etcd's own clients drive it: the client-side recipes
    /// against Baton's etcd API (checks that the two interoperate).
    BatonAsEtcd,
}

impl Target {
    pub fn server(self) -> &'static TestServer {
        match self {
            Target::Baton | Target::BatonAsEtcd => {
                BATON.get_or_init(|| TestServer::start(Flavor::Baton))
            }
            Target::Etcd => ETCD.get_or_init(|| TestServer::start(Flavor::Etcd)),
        }
    }

    pub fn config(self, endpoints: Vec<String>) -> ClientConfig {
        let kind = match self {
            Target::Baton => ServerKind::Auto,
            Target::Etcd => ServerKind::Auto,
            Target::BatonAsEtcd => ServerKind::Etcd,
        };
        ClientConfig::new(endpoints).with_server_kind(kind)
    }

    pub async fn client(self) -> Client {
        Client::connect(self.config(vec![self.server().endpoint()]))
            .await
            .expect("connect")
    }

    /// Whether `baton.v1` is in use (lock-delay, fence gate, force-release).
    pub fn baton_v1(self) -> bool {
        self == Target::Baton
    }
}

/// A fresh session with a 5 s TTL (long enough to never expire by accident in a test).
pub async fn session(client: &Client) -> Session {
    Session::new(
        client,
        SessionOptions::new().with_ttl(Duration::from_secs(5)),
    )
    .await
    .expect("session")
}

static NAMES: AtomicU64 = AtomicU64::new(0);

/// A name no other test in this process uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NAMES.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs each test body for every target, as separate `#[test]`s.
#[macro_export]
macro_rules! for_each_target {
    ($($name:ident),* $(,)?) => {
        mod baton {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Target::Baton).await
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Target::Etcd).await
                }
            )*
        }
        mod baton_as_etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Target::BatonAsEtcd).await
                }
            )*
        }
    };
}

/// Largest number of intervals `[start, end)` that overlap at one instant.
pub fn max_overlap(intervals: &[(std::time::Instant, std::time::Instant)]) -> usize {
    let mut edges: Vec<(std::time::Instant, i32)> = Vec::new();
    for &(s, e) in intervals {
        assert!(s <= e);
        edges.push((s, 1));
        edges.push((e, -1));
    }
    // Ends before starts at the same instant: touching intervals do not overlap.
    edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in edges {
        cur += d;
        max = max.max(cur);
    }
    max as usize
}
