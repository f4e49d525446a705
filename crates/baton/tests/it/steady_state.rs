//! Steady state: a healthy three-member cluster under sustained load must keep its leader.
//!
//! Why a test of its own: an election that nobody caused (a heartbeat starved by a busy
//! proposer, an fsync stall on the leader, a follower whose election timer fires while the
//! leader is merely slow) costs every client a failover — about a second without writes, and
//! "request timed out" for whatever was in flight — and with leases, an extension of every
//! deadline. Such elections come from load, not faults, so only a long loaded run finds
//! them.
//!
//! Sixteen closed-loop clients, spread over the three members, alternate puts and
//! linearizable gets (so both the forwarding path and ReadIndex are exercised on followers)
//! for `BATON_STEADY_SECS` seconds (default 300; shorten it for local iteration). Every
//! second, `Maintenance.Status` is asked of every member: the Raft term and the leader id
//! must never change. Throughput and latency are printed for the CI log.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{agreed_leader_of, lazy_channel, member_status, within, Cluster};
use baton_proto::etcdserverpb::{kv_client::KvClient, PutRequest, RangeRequest};
use tonic::transport::Channel;

const CLIENTS: usize = 16;
const KEYS: usize = 64;

/// What one client did.
#[derive(Default)]
struct ClientStats {
    puts: u64,
    gets: u64,
    errors: Vec<String>,
    /// Latency of every successful call, in microseconds.
    latencies_us: Vec<u32>,
}

async fn client(id: usize, ch: Channel, stop: Arc<AtomicBool>) -> ClientStats {
    let mut st = ClientStats::default();
    let mut kv = KvClient::new(ch);
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let key = format!("steady/{}", (id * 7 + i) % KEYS).into_bytes();
        let started = Instant::now();
        let res = if i.is_multiple_of(2) {
            within(
                Duration::from_secs(5),
                kv.put(PutRequest {
                    key,
                    value: format!("{id}-{i}").into_bytes(),
                    ..Default::default()
                }),
            )
            .await
            .map(|_| st.puts += 1)
        } else {
            within(
                Duration::from_secs(5),
                kv.range(RangeRequest {
                    key,
                    ..Default::default()
                }),
            )
            .await
            .map(|_| st.gets += 1)
        };
        match res {
            Ok(()) => st
                .latencies_us
                .push(started.elapsed().as_micros().min(u32::MAX as u128) as u32),
            Err(e) => {
                if st.errors.len() < 10 {
                    st.errors.push(format!(
                        "client {id} {} after {:?} (at {:?} since the epoch): {e:?}",
                        if i.is_multiple_of(2) { "put" } else { "get" },
                        started.elapsed(),
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default()
                    ));
                }
            }
        }
    }
    st
}

fn percentile(sorted: &[u32], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_micros(sorted[i] as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_load_keeps_the_leader() {
    let secs: u64 = match std::env::var("BATON_STEADY_SECS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("BATON_STEADY_SECS={v:?} is not a number of seconds")),
        // The full run is one of the long tests (README: `BATON_LONG_TESTS`, which
        // scripts/test sets); by hand, a short run of the same checks.
        Err(_) if std::env::var_os("BATON_LONG_TESTS").is_some() => 300,
        Err(_) => {
            eprintln!("steady state: 20 s (BATON_LONG_TESTS=1 for the full 300 s)");
            20
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let chans: Vec<Channel> = cluster
        .members
        .iter()
        .map(|m| lazy_channel(&m.endpoint()))
        .collect();
    let leader = agreed_leader_of(&chans, &[0, 1, 2], Duration::from_secs(15)).await;
    // Wait for the members to publish themselves (a membership entry) so that the run
    // starts from a settled cluster.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let first = member_status(&chans[leader]).await.expect("leader status");
    let (term, leader_id) = (first.raft_term, first.leader);
    eprintln!(
        "steady state: leader m{} (id {leader_id:x}), term {term}; {CLIENTS} clients for {secs} s",
        leader + 1
    );

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..CLIENTS)
        .map(|id| tokio::spawn(client(id, chans[id % 3].clone(), stop.clone())))
        .collect();

    // Sample every member every second. A member that does not answer within a second is
    // counted (a slow Status is not a leader change, but too many would blind the test).
    let started = Instant::now();
    let mut samples = 0u64;
    let mut missed = 0u64;
    let mut changes = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while started.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        for (i, ch) in chans.iter().enumerate() {
            samples += 1;
            match member_status(ch).await {
                None => missed += 1,
                Some(s) if s.raft_term != term || s.leader != leader_id => {
                    if changes.len() < 20 {
                        changes.push(format!(
                            "{:?}: m{} reports term {} leader {:x}",
                            started.elapsed(),
                            i + 1,
                            s.raft_term,
                            s.leader
                        ));
                    }
                }
                Some(_) => {}
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let mut all = ClientStats::default();
    for w in workers {
        let s = w.await.unwrap();
        all.puts += s.puts;
        all.gets += s.gets;
        all.errors.extend(s.errors);
        all.latencies_us.extend(s.latencies_us);
    }
    all.latencies_us.sort_unstable();
    let ops = all.puts + all.gets;
    let secs_f = elapsed.as_secs_f64();
    eprintln!(
        "steady state over {elapsed:?}: {ops} ops ({:.0} ops/s: {:.0} puts/s, {:.0} linearizable gets/s), latency p50 {:?} p99 {:?} max {:?}; {samples} status samples ({missed} unanswered), term {term} throughout: {}",
        ops as f64 / secs_f,
        all.puts as f64 / secs_f,
        all.gets as f64 / secs_f,
        percentile(&all.latencies_us, 0.5),
        percentile(&all.latencies_us, 0.99),
        percentile(&all.latencies_us, 1.0),
        changes.is_empty(),
    );
    assert!(
        changes.is_empty(),
        "the leader or term changed under steady load:\n{}\n{}",
        changes.join("\n"),
        cluster.logs()
    );
    assert!(
        missed * 10 <= samples,
        "{missed} of {samples} status samples unanswered"
    );
    assert!(
        all.errors.is_empty(),
        "calls failed under steady load: {:#?}\n{}",
        all.errors,
        cluster.logs()
    );
    assert!(ops > 0, "no operation completed");
    // Once more after the load: still the same leader and term everywhere.
    for (i, ch) in chans.iter().enumerate() {
        let s = member_status(ch).await.expect("status after the run");
        assert_eq!(
            (s.raft_term, s.leader),
            (term, leader_id),
            "m{} after the run",
            i + 1
        );
    }
}
