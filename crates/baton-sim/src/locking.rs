//! The lease and lock workload: clients grant a lease, keep it alive, attach a key to it,
//! take a lock through `baton.v1.Lock` and write through the fence (`FencedPut`), then
//! release (or lose the lease to a fault). What the fence answered is recorded for
//! `baton_check::check_locks`.
//!
//! How a holding is recorded, so that the check is sound (never fails a correct run): one
//! record per fenced write that the fence *accepted*, with `enter` = when the acquisition
//! returned and `exit` = when that write was *sent*. Records of one acquisition merge into
//! `[acquired, last accepted write sent]`. A correct fence can only have accepted a write
//! sent before the next holder's acquisition returned (the next holder's key became the head
//! only after this holder's key was gone, and a write is applied after it is sent), so two
//! merged holdings never overlap and their tokens increase. A write whose outcome is unknown
//! (timeout) is left out: counting it either way could be wrong.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton_check::{Bytes, LockRecord};
use baton_proto::baton::v1 as bpb;
use baton_proto::etcdserverpb as pb;
use bpb::lock_client::LockClient;
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use crate::config::CLIENT_PORT;
use crate::ctx::{member_name, mix, Ctx};
use crate::net;
use crate::workload::now_ns;

/// The lock every lock client contends for.
pub(crate) const LOCK_NAME: &str = "lock/a";
/// Lease TTL of lock clients, in seconds.
const LEASE_TTL_S: i64 = 3;

fn timeout() -> Duration {
    Duration::from_secs(3)
}

/// Grants a lease on `chan`, or `None` if that failed.
async fn grant(chan: &Channel) -> Option<i64> {
    let mut lease = LeaseClient::new(chan.clone());
    let r = tokio::time::timeout(
        timeout(),
        lease.lease_grant(pb::LeaseGrantRequest {
            ttl: LEASE_TTL_S,
            id: 0,
        }),
    )
    .await;
    match r {
        Ok(Ok(r)) => Some(r.into_inner().id),
        _ => None,
    }
}

/// Keeps `id` alive every second over one keep-alive stream (re-opened when it breaks)
/// until `stop` is set; a partition makes the lease expire, which is the point.
async fn keep_alive(chan: Channel, id: i64, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let mut lease = LeaseClient::new(chan.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let opened = tokio::time::timeout(
            timeout(),
            lease.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx)),
        );
        let _ = tx.send(pb::LeaseKeepAliveRequest { id }).await;
        let Ok(Ok(stream)) = opened.await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        loop {
            match tokio::time::timeout(timeout(), stream.message()).await {
                Ok(Ok(Some(r))) if r.ttl > 0 => {}
                // Expired (TTL ≤ 0): nothing to keep alive any more.
                Ok(Ok(Some(_))) => return,
                _ => break,
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            if stop.load(Ordering::Acquire)
                || tx.send(pb::LeaseKeepAliveRequest { id }).await.is_err()
            {
                return;
            }
        }
    }
}

/// One lock client, until `ctx.workload_end`.
pub(crate) async fn lock_client(ctx: Arc<Ctx>, client: usize) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(mix(ctx.config.seed, 2000 + client as u64));
    let chans: Vec<Channel> = (0..ctx.config.members)
        .map(|i| net::client_channel(&member_name(i), CLIENT_PORT))
        .collect();
    let mut acquisition = 0u64;
    while turmoil::sim_elapsed().unwrap_or_default() < ctx.workload_end {
        let chan = &chans[rng.gen_range(0..chans.len())];
        let Some(lease) = grant(chan).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let stop = Arc::new(AtomicBool::new(false));
        let ka = tokio::spawn(keep_alive(chan.clone(), lease, stop.clone()));
        // A key attached to the lease: it goes when the lease does.
        let mut kv = KvClient::new(chan.clone());
        let _ = tokio::time::timeout(
            timeout(),
            kv.put(pb::PutRequest {
                key: format!("lease/c{client}").into_bytes(),
                value: lease.to_string().into_bytes(),
                lease,
                ..Default::default()
            }),
        )
        .await;
        let mut locks = LockClient::new(chans[rng.gen_range(0..chans.len())].clone());
        let acquired = tokio::time::timeout(
            Duration::from_secs(5),
            locks.acquire(bpb::AcquireRequest {
                name: LOCK_NAME.as_bytes().to_vec(),
                lease,
                timeout_ms: 4000,
                ..Default::default()
            }),
        )
        .await;
        if let Ok(Ok(r)) = acquired {
            let r = r.into_inner();
            let enter = now_ns();
            acquisition += 1;
            let holder = client as u64 * 1_000_000 + acquisition;
            ctx.trace(format!(
                "{enter} l{client} acquired token {}",
                r.fencing_token
            ));
            for w in 0..rng.gen_range(1..4) {
                // Writes may go through any member.
                let mut fenced = LockClient::new(chans[rng.gen_range(0..chans.len())].clone());
                let sent = now_ns();
                let res = tokio::time::timeout(
                    timeout(),
                    fenced.fenced_put(bpb::FencedPutRequest {
                        lock_key: r.key.clone(),
                        fencing_token: r.fencing_token,
                        put: Some(pb::PutRequest {
                            key: b"fenced/a".to_vec(),
                            value: format!("{holder}-{w}").into_bytes(),
                            ..Default::default()
                        }),
                    }),
                )
                .await;
                let accepted = match res {
                    Ok(Ok(_)) => Some(true),
                    Ok(Err(s)) if s.code() == tonic::Code::FailedPrecondition => Some(false),
                    _ => None,
                };
                ctx.trace(format!(
                    "{} l{client} fenced write token {} -> {accepted:?}",
                    now_ns(),
                    r.fencing_token
                ));
                if let Some(accepted) = accepted {
                    ctx.locks.lock().push(LockRecord {
                        lock: Bytes::from(LOCK_NAME),
                        holder,
                        token: r.fencing_token as u64,
                        enter,
                        exit: sent.max(enter),
                        accepted,
                    });
                }
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..400))).await;
            }
            let _ = tokio::time::timeout(
                timeout(),
                locks.release(bpb::ReleaseRequest {
                    key: r.key,
                    fencing_token: r.fencing_token,
                }),
            )
            .await;
        }
        stop.store(true, Ordering::Release);
        let _ = ka.await;
        if rng.gen_bool(0.5) {
            let mut l = LeaseClient::new(chan.clone());
            let _ = tokio::time::timeout(
                timeout(),
                l.lease_revoke(pb::LeaseRevokeRequest { id: lease }),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..200))).await;
    }
    Ok(())
}
