//! The simulated clients: KV operations and CAS txns recorded for the linearizability
//! checker, a watcher per member, and the liveness probe that runs after faults stop. All
//! talk etcd's gRPC API to the members over simulated TCP, exactly as real clients would.

use std::sync::Arc;
use std::time::Duration;

use baton_check::{Bytes, EventKind, KvOp, KvResult, WatchEvent};
use baton_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;
use pb::watch_client::WatchClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use crate::config::{CLIENT_PORT, KEY_PREFIX};
use crate::ctx::{member_name, mix, prefix_end, Ctx};
use crate::net;

/// How long a client waits for one answer before recording the outcome as unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(3);

fn channels(members: usize) -> Vec<Channel> {
    (0..members)
        .map(|i| net::client_channel(&member_name(i), CLIENT_PORT))
        .collect()
}

/// Simulated time now, in nanoseconds (for the trace).
pub(crate) fn now_ns() -> u64 {
    turmoil::sim_elapsed().unwrap_or_default().as_nanos() as u64
}

/// One KV client: a stream of puts, linearizable gets, deletes and CAS txns on a few keys,
/// each sent to a random member, until `ctx.workload_end`.
pub(crate) async fn kv_client(ctx: Arc<Ctx>, client: usize) -> turmoil::Result {
    let mut rng = StdRng::seed_from_u64(mix(ctx.config.seed, 1000 + client as u64));
    let chans = channels(ctx.config.members);
    let mut incarnation = 0u64;
    let mut n = 0u64;
    while turmoil::sim_elapsed().unwrap_or_default() < ctx.workload_end {
        let member = rng.gen_range(0..chans.len());
        let key = format!("{KEY_PREFIX}{}", rng.gen_range(0..ctx.config.keys));
        n += 1;
        let value = format!("c{client}-{n}");
        let op = match rng.gen_range(0..10) {
            0..=3 => KvOp::Get {
                key: Bytes::from(key.as_str()),
            },
            4..=6 => KvOp::Put {
                key: Bytes::from(key.as_str()),
                value: Bytes::from(value.as_str()),
            },
            7 => KvOp::Delete {
                key: Bytes::from(key.as_str()),
            },
            _ => KvOp::Cas {
                key: Bytes::from(key.as_str()),
                expected: if rng.gen_bool(0.3) {
                    None
                } else {
                    Some(Bytes::from(
                        format!("c{}-{}", rng.gen_range(0..ctx.config.clients), n / 2).as_str(),
                    ))
                },
                new: Bytes::from(value.as_str()),
            },
        };
        let process = client as u64 * 1_000_000 + incarnation;
        let call = ctx.history.invoke(process, op.clone());
        let invoked = now_ns();
        let mut kv = KvClient::new(chans[member].clone());
        let result = match tokio::time::timeout(OP_TIMEOUT, execute(&mut kv, &op)).await {
            Ok(Ok(r)) => r,
            // A write that failed or timed out may still take effect; a read has no effect.
            Ok(Err(_)) | Err(_) => match op {
                KvOp::Get { .. } => KvResult::Failed,
                _ => KvResult::Unknown,
            },
        };
        if result == KvResult::Unknown {
            // The op may still be in flight: later ops of this client must not be ordered
            // after it, so they continue as a new process (as Jepsen does).
            incarnation += 1;
        }
        ctx.trace(format!(
            "{invoked}..{} p{process} m{} {op} -> {result}",
            now_ns(),
            member + 1
        ));
        ctx.history
            .complete(call, result)
            .map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..50))).await;
    }
    Ok(())
}

fn bytes(b: &Bytes) -> Vec<u8> {
    b.as_slice().to_vec()
}

async fn execute(kv: &mut KvClient<Channel>, op: &KvOp) -> Result<KvResult, tonic::Status> {
    Ok(match op {
        KvOp::Put { key, value } => {
            let r = kv
                .put(pb::PutRequest {
                    key: bytes(key),
                    value: bytes(value),
                    ..Default::default()
                })
                .await?
                .into_inner();
            KvResult::Put {
                revision: r.header.map(|h| h.revision as u64),
            }
        }
        KvOp::Get { key } => {
            let r = kv
                .range(pb::RangeRequest {
                    key: bytes(key),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let kv = r.kvs.first();
            KvResult::Get {
                value: kv.map(|kv| Bytes(kv.value.clone())),
                revision: kv.map(|kv| kv.mod_revision as u64),
            }
        }
        KvOp::Delete { key } => {
            let r = kv
                .delete_range(pb::DeleteRangeRequest {
                    key: bytes(key),
                    ..Default::default()
                })
                .await?
                .into_inner();
            KvResult::Delete {
                deleted: Some(r.deleted > 0),
                revision: r.header.map(|h| h.revision as u64),
            }
        }
        KvOp::Cas { key, expected, new } => {
            use pb::compare::{CompareResult, CompareTarget, TargetUnion};
            let compare = match expected {
                Some(v) => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Value as i32,
                    key: bytes(key),
                    target_union: Some(TargetUnion::Value(bytes(v))),
                    ..Default::default()
                },
                None => pb::Compare {
                    result: CompareResult::Equal as i32,
                    target: CompareTarget::Create as i32,
                    key: bytes(key),
                    target_union: Some(TargetUnion::CreateRevision(0)),
                    ..Default::default()
                },
            };
            let r = kv
                .txn(pb::TxnRequest {
                    compare: vec![compare],
                    success: vec![pb::RequestOp {
                        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                            key: bytes(key),
                            value: bytes(new),
                            ..Default::default()
                        })),
                    }],
                    failure: vec![],
                })
                .await?
                .into_inner();
            KvResult::Cas {
                succeeded: r.succeeded,
                revision: r.header.map(|h| h.revision as u64),
            }
        }
    })
}

/// Watches every workload key on one member from revision 1, resuming after the last event
/// it saw whenever the stream breaks (a crash, a partition), as an etcd client does; runs
/// until the liveness probe is done. Everything received goes to `ctx.watches[member]`.
pub(crate) async fn watcher(ctx: Arc<Ctx>, member: usize) -> turmoil::Result {
    let chan = net::client_channel(&member_name(member), CLIENT_PORT);
    let mut next = 1i64;
    while !ctx.done.load(std::sync::atomic::Ordering::Acquire) {
        let mut client = WatchClient::new(chan.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key: KEY_PREFIX.as_bytes().to_vec(),
                    range_end: prefix_end(KEY_PREFIX.as_bytes()),
                    start_revision: next,
                    ..Default::default()
                },
            )),
        };
        let _ = tx.send(create).await;
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let stream = tokio::time::timeout(OP_TIMEOUT, client.watch(outbound)).await;
        let Ok(Ok(stream)) = stream else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = stream.into_inner();
        loop {
            if ctx.done.load(std::sync::atomic::Ordering::Acquire) {
                break;
            }
            let msg = match tokio::time::timeout(Duration::from_millis(200), stream.message()).await
            {
                Err(_) => continue,
                Ok(Ok(Some(m))) => m,
                Ok(_) => break,
            };
            if msg.canceled {
                break;
            }
            let mut got = ctx.watches[member].lock();
            for e in msg.events {
                let Some(kv) = e.kv else { continue };
                let kind = if e.r#type == baton_proto::mvccpb::event::EventType::Delete as i32 {
                    EventKind::Delete
                } else {
                    EventKind::Put(Bytes(kv.value.clone()))
                };
                next = kv.mod_revision + 1;
                got.push(WatchEvent {
                    revision: kv.mod_revision as u64,
                    key: Bytes(kv.key),
                    kind,
                });
            }
        }
        drop(tx);
    }
    Ok(())
}

/// After faults stop: every member must answer a write within `ctx.config.liveness_bound`
/// (a leader is elected and requests succeed). Records the time it took, then lets the
/// cluster settle so the replicas can be compared.
pub(crate) async fn liveness(ctx: Arc<Ctx>) -> turmoil::Result {
    let start = ctx.faults_end;
    let now = turmoil::sim_elapsed().unwrap_or_default();
    if now < start {
        tokio::time::sleep(start - now).await;
    }
    let chans = channels(ctx.config.members);
    let deadline = start + ctx.config.liveness_bound;
    for (i, chan) in chans.iter().enumerate() {
        loop {
            let now = turmoil::sim_elapsed().unwrap_or_default();
            if now >= deadline {
                *ctx.liveness.lock() = Err(format!(
                    "m{} did not accept a write within {:?} after faults stopped",
                    i + 1,
                    ctx.config.liveness_bound
                ));
                ctx.done.store(true, std::sync::atomic::Ordering::Release);
                return Ok(());
            }
            let mut kv = KvClient::new(chan.clone());
            let put = kv.put(pb::PutRequest {
                key: b"liveness".to_vec(),
                value: format!("m{}", i + 1).into_bytes(),
                ..Default::default()
            });
            match tokio::time::timeout(Duration::from_secs(1), put).await {
                Ok(Ok(_)) => break,
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    let took = turmoil::sim_elapsed().unwrap_or_default() - start;
    *ctx.liveness.lock() = Ok(took);
    // Let every member apply everything (heartbeats carry the commit index).
    tokio::time::sleep(ctx.config.settle).await;
    ctx.done.store(true, std::sync::atomic::Ordering::Release);
    Ok(())
}
