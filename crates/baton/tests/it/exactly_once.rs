//! Exactly-once writes (`baton.v1.ExactlyOnce`): a retried write is applied once, by any
//! member, across restarts and leader changes; plain etcd writes keep etcd's semantics.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::{Baton, Cluster};
use baton_client::{Client, ClientConfig, GetOptions, PutOptions};
use baton_proto::baton::v1 as bv1;
use baton_proto::baton::v1::exactly_once_client::ExactlyOnceClient;
use baton_proto::etcdserverpb as pb;
use tonic::transport::Channel;
use tonic::Code;

async fn raw(endpoint: &str) -> ExactlyOnceClient<Channel> {
    ExactlyOnceClient::new(common::channel(endpoint).await)
}

fn put_req(
    client_id: u64,
    sequence: u64,
    ack: u64,
    key: &str,
    value: &str,
) -> bv1::ExactlyOncePutRequest {
    bv1::ExactlyOncePutRequest {
        id: Some(bv1::RequestId {
            client_id,
            sequence,
        }),
        acknowledged_below: ack,
        request: Some(pb::PutRequest {
            key: key.into(),
            value: value.into(),
            prev_kv: true,
            ..Default::default()
        }),
    }
}

async fn version(endpoint: &str, key: &str) -> i64 {
    let c = Client::connect(ClientConfig::new([endpoint.to_string()]))
        .await
        .unwrap();
    let got = c.get(key, GetOptions::new()).await.unwrap();
    got.kvs.first().map_or(0, |kv| kv.version)
}

/// The protocol at the RPC level: a repeated sequence is answered from the cache with the
/// first answer (same revision, same prev_kv), acknowledged sequences and unknown sessions
/// are refused with clear errors, and the session table survives kill -9 and a restart
/// from a snapshot.
#[tokio::test]
async fn retries_are_applied_once_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // A snapshot every 20 entries: the restart below restores the table from one.
    let mut baton = Baton::start_with(&dir.path().join("data"), &["--snapshot-count", "20"]);
    let ep = baton.endpoint();
    let mut rpc = raw(&ep).await;
    let open = rpc
        .open_session(bv1::OpenSessionRequest { timeout_ms: 0 })
        .await
        .unwrap()
        .into_inner();
    let id = open.client_id;
    assert!(id > 0);
    assert_eq!(open.timeout_ms, 600_000, "the default idle timeout");

    let first = rpc
        .put(put_req(id, 1, 1, "eo/a", "1"))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.replayed);
    let again = rpc
        .put(put_req(id, 1, 1, "eo/a", "1"))
        .await
        .unwrap()
        .into_inner();
    assert!(again.replayed, "the retry is answered from the cache");
    assert_eq!(
        again.response, first.response,
        "byte-for-byte the first answer"
    );
    assert_eq!(version(&ep, "eo/a").await, 1, "applied once");

    // Sequence 2 acknowledges 1; a late retry of 1 is refused, not applied.
    let second = rpc
        .put(put_req(id, 2, 2, "eo/a", "2"))
        .await
        .unwrap()
        .into_inner();
    assert!(!second.replayed);
    let stale = rpc.put(put_req(id, 1, 1, "eo/a", "1")).await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert_eq!(
        stale.message(),
        "baton: request sequence already acknowledged; use a new sequence number"
    );
    let unknown = rpc
        .put(put_req(id + 1000, 1, 1, "eo/a", "x"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::FailedPrecondition);
    assert_eq!(
        unknown.message(),
        "baton: client session not found (expired or never registered)"
    );
    let zero = rpc.put(put_req(id, 0, 0, "eo/a", "x")).await.unwrap_err();
    assert_eq!(zero.code(), Code::InvalidArgument);
    let empty_key = rpc.put(put_req(id, 3, 3, "", "x")).await.unwrap_err();
    assert_eq!(empty_key.message(), "etcdserver: key is not provided");
    assert_eq!(
        version(&ep, "eo/a").await,
        2,
        "refused requests changed nothing"
    );

    // A compare-and-set: the retry gets the first outcome (succeeded), although running
    // it again now would fail its compare.
    let cas = |seq: u64| bv1::ExactlyOnceTxnRequest {
        id: Some(bv1::RequestId {
            client_id: id,
            sequence: seq,
        }),
        acknowledged_below: seq,
        request: Some(pb::TxnRequest {
            compare: vec![pb::Compare {
                result: pb::compare::CompareResult::Equal as i32,
                target: pb::compare::CompareTarget::Version as i32,
                key: b"eo/a".to_vec(),
                target_union: Some(pb::compare::TargetUnion::Version(2)),
                ..Default::default()
            }],
            success: vec![pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: b"eo/a".to_vec(),
                    value: b"3".to_vec(),
                    ..Default::default()
                })),
            }],
            failure: vec![],
        }),
    };
    let t1 = rpc.txn(cas(4)).await.unwrap().into_inner();
    assert!(t1.response.as_ref().unwrap().succeeded && !t1.replayed);
    let t2 = rpc.txn(cas(4)).await.unwrap().into_inner();
    assert!(t2.replayed);
    assert_eq!(t2.response, t1.response);
    assert_eq!(version(&ep, "eo/a").await, 3);

    // Enough other writes to cut a snapshot, then kill -9 and restart: the cached answer of
    // sequence 5 must still be there.
    let fifth = rpc
        .put(put_req(id, 5, 5, "eo/b", "5"))
        .await
        .unwrap()
        .into_inner();
    let c = Client::connect(ClientConfig::new([ep.clone()]))
        .await
        .unwrap();
    for i in 0..50 {
        c.put(format!("eo/filler/{i}"), "x", PutOptions::new())
            .await
            .unwrap();
    }
    baton.kill9();
    baton.spawn();
    let mut rpc = raw(&ep).await;
    let replay = rpc
        .put(put_req(id, 5, 5, "eo/b", "5"))
        .await
        .unwrap()
        .into_inner();
    assert!(replay.replayed, "the session table survived the restart");
    // The header keeps the first application's revision and names the answering term: the
    // restarted member leads a new term (etcd's restarted leader does too).
    let (replayed_header, fifth_header) = (
        replay.response.as_ref().unwrap().header.unwrap(),
        fifth.response.as_ref().unwrap().header.unwrap(),
    );
    assert!(replayed_header.raft_term > fifth_header.raft_term);
    let mut replayed = replay.response.clone();
    replayed
        .as_mut()
        .unwrap()
        .header
        .as_mut()
        .unwrap()
        .raft_term = fifth_header.raft_term;
    assert_eq!(replayed, fifth.response);
    assert_eq!(version(&ep, "eo/b").await, 1);

    let closed = rpc
        .close_session(bv1::CloseSessionRequest { client_id: id })
        .await
        .unwrap()
        .into_inner();
    assert!(closed.existed);
    let gone = rpc.put(put_req(id, 6, 6, "eo/b", "6")).await.unwrap_err();
    assert_eq!(gone.code(), Code::FailedPrecondition);
}

/// Several writers, each bumping its own key through `baton_client::ExactlyOnce` with
/// connections to different members, while the leader is killed with -9 twice. Every write
/// is answered (retries ride out the failovers) and each key's version equals the number of
/// writes to it: none lost, none applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_leader_kills() {
    const WRITERS: usize = 4;
    const KILLS: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    common::agreed_leader(&eps, Duration::from_secs(15)).await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        // Each writer starts at a different member and fails over through all of them.
        let mut order = eps.clone();
        order.rotate_left(w % eps.len());
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let client = Client::connect(
                ClientConfig::new(order).with_request_timeout(Duration::from_secs(2)),
            )
            .await
            .unwrap();
            let once = client
                .exactly_once_with(Duration::ZERO, Duration::from_secs(30))
                .await
                .unwrap();
            let key = format!("eo/writer/{w}");
            let (mut writes, mut replays) = (0i64, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = once
                    .put(key.as_str(), writes.to_string(), PutOptions::new())
                    .await
                    .unwrap_or_else(|e| panic!("writer {w} write {writes}: {e}"));
                writes += 1;
                replays += usize::from(r.replayed);
            }
            (key, writes, replays)
        }));
    }

    let mut leader = common::agreed_leader(&eps, Duration::from_secs(15)).await;
    for _ in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        cluster.members[leader].kill9();
        let killed = Instant::now();
        let survivors: Vec<String> = eps
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .map(|(_, e)| e.clone())
            .collect();
        let new_leader = common::agreed_leader(&survivors, Duration::from_secs(15)).await;
        eprintln!(
            "killed m{}; new leader after {:?}",
            leader + 1,
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
        cluster.members[leader].spawn();
        leader = eps
            .iter()
            .position(|e| *e == survivors[new_leader])
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);

    let mut total_replays = 0;
    for h in writers {
        let (key, writes, replays) = h.await.unwrap();
        total_replays += replays;
        let v = version(&eps[leader], &key).await;
        eprintln!("{key}: {writes} writes answered, version {v}, {replays} answered by replay");
        assert!(writes > 0);
        assert_eq!(
            v, writes,
            "{key}: every answered write applied exactly once"
        );
    }
    eprintln!("{total_replays} writes were answered from the de-duplication cache");
}
