//! `baton.v1.Lock/List` over real gRPC: a `baton_raft::Node` on a tempdir, the full
//! `baton_server` on a loopback port, and the generated tonic client. The listing is what
//! `baton status` shows operators, so it must agree with `Inspect` on who holds a lock and
//! how many wait, including during a lock-delay.

use std::time::Duration;

use baton_proto::baton::v1 as bv1;
use tonic::Code;

use crate::common::{eventually, Server};

impl Server {
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
