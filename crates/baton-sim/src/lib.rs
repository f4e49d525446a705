//! # baton-sim
//!
//! A deterministic simulation of a Baton cluster: N real members (`baton-raft` `Node`s
//! serving the real `baton-server` gRPC services) and their clients run in one process on
//! [turmoil]'s simulated network and clock, all driven from one seed. Faults come from a
//! schedule drawn from the seed ([`faults`]): partitions (symmetric, one-way, isolation),
//! crashes that lose what was not fsynced ([`disk`]), held (paused) members, clock jumps,
//! slow disks and message delays. Afterwards the recorded history is judged by
//! `baton-check`: (a) linearizability of the KV history, (b) at most one lock holder at a
//! time as judged by the fence, with increasing tokens, (c) watch streams in order without
//! gaps or duplicates, (d) liveness once faults stop, (e) convergence of every replica to
//! the same state at the same index.
//!
//! **Determinism**: everything a member does is driven by turmoil's simulated time (tokio's
//! paused clock), the seed (fault schedule, client choices, each member's randomness and
//! election timeout) and single-threaded execution; the log writer runs as a task. What is
//! not controlled is documented in `docs/simulation.md`; a run's trace hash
//! ([`Outcome::trace_hash`]) tells whether two runs of one seed were identical.

pub mod clock;
mod config;
mod ctx;
pub mod disk;
pub mod faults;
mod locking;
pub mod net;
mod workload;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_check::{CheckOptions, Recorder, ReplicaState, WatchEvent};
use baton_raft::{
    ClusterConfig, Environment, InitialClusterState, InitialMember, Node, NodeConfig, WalWritePaths,
};
use baton_server::{ServerConfig, Shared};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::SeedableRng;

pub use crate::config::{SimConfig, CLIENT_PORT, KEY_PREFIX, PEER_PORT};
pub use crate::ctx::mix;
use crate::ctx::{member_name, prefix_end, Ctx};
use crate::disk::SimDisk;
use crate::faults::{Fault, Scheduled};

/// What a passing run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    /// KV operations recorded (including unknown outcomes).
    pub ops: usize,
    /// Watch events received across members.
    pub watch_events: usize,
    /// Lock holdings whose fenced writes were accepted.
    pub lock_holdings: usize,
    /// Time from the end of faults until every member accepted a write.
    pub recovery: Duration,
    /// The faults injected.
    pub faults: Vec<String>,
    /// Hash of everything observable in the run (client results with their simulated
    /// times, watch events, final replica states): equal for equal runs.
    pub trace_hash: u64,
    /// Simulated time of the run.
    pub sim_time: Duration,
    /// Which way the members' log writes went, summed over every incarnation: inline on the
    /// Raft core task, or through the writer's batch loop (a task under simulation).
    pub wal: WalWritePaths,
    /// openraft AppendEntries answered from a follower's early answer instead of sent
    /// (baton-raft `early_acks`), summed the same way: shows that the seeds exercise it.
    pub answered_early: u64,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulation error: {0}")]
    Sim(String),
    #[error("KV history is not linearizable: {0}")]
    Linearizability(String),
    #[error("linearizability undecided within the step budget: {0}")]
    Undecided(String),
    #[error("watch stream on m{member}: {reason}")]
    Watch { member: usize, reason: String },
    #[error("lock safety: {0}")]
    Lock(String),
    #[error("a member or client panicked: {0}")]
    Panic(String),
    #[error("liveness: {0}")]
    Liveness(String),
    #[error("replicas did not converge: {0}")]
    Convergence(String),
}

/// One member's software, started by turmoil at the beginning and after every restart:
/// opens (or recovers) its data directory and serves the real gRPC API until crashed.
async fn member_main(ctx: Arc<Ctx>, i: usize) -> turmoil::Result {
    let name = member_name(i);
    let incarnation = ctx.incarnations[i].fetch_add(1, Ordering::Relaxed);
    let mut config = NodeConfig::new(name.clone(), ctx.dir.join(&name));
    config.client_urls = vec![format!("http://{name}:{CLIENT_PORT}")];
    config.peer_urls = vec![format!("http://{name}:{PEER_PORT}")];
    config.heartbeat_interval = Duration::from_millis(100);
    config.election_timeout = Duration::from_millis(1000);
    // Snapshots are built on tokio's blocking pool, outside the simulation's control.
    config.snapshot_every_entries = 1_000_000;
    config.cluster = Some(ClusterConfig {
        initial_members: (0..ctx.config.members)
            .map(|m| InitialMember {
                name: member_name(m),
                peer_urls: vec![format!("http://{}:{PEER_PORT}", member_name(m))],
            })
            .collect(),
        state: InitialClusterState::New,
        token: "sim".into(),
        token_given: true,
        listen_peer_addrs: vec![SocketAddr::from((Ipv4Addr::UNSPECIFIED, PEER_PORT))],
    });
    config.env = Environment {
        transport: Some(net::transport()),
        wall_clock: Some(ctx.clocks[i].clone()),
        seed: Some(mix(ctx.config.seed, (i as u64 + 1) << 32 | incarnation)),
        disk: Some(ctx.disks[i].clone()),
    };
    let node = Node::start(config).await?;
    *ctx.nodes[i].lock() = Some(node.clone());
    let shared = Shared {
        node,
        config: ServerConfig {
            client_listeners: Vec::new(),
            metrics_listeners: Vec::new(),
            min_lease_ttl_s: 2,
            watch_progress_interval: Duration::from_secs(600),
            max_concurrent_streams: baton_server::transport::DEFAULT_MAX_CONCURRENT_STREAMS,
            keepalive: Default::default(),
            auth: baton_server::auth::Authenticator::default(),
            http_extension: None,
        },
    };
    let locks = baton_server::locks::LockEngine::new(shared.clone());
    let incoming = net::listen(SocketAddr::from((Ipv4Addr::UNSPECIFIED, CLIENT_PORT))).await?;
    baton_server::grpc_router(&shared, &locks)
        .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(incoming))
        .await?;
    Ok(())
}

/// Where members keep their files: tmpfs when there is one (fsync is free there, and the
/// durability model is the simulated disk's, not the host's).
fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("baton-sim-")
            .tempdir_in(shm)
        {
            return Ok(d);
        }
    }
    tempfile::Builder::new().prefix("baton-sim-").tempdir()
}

/// Faults in force, so that healing undoes exactly what was done.
#[derive(Default)]
struct Injected {
    crashed: BTreeSet<usize>,
}

/// Runs one seed to completion and judges it. A panic anywhere in the run (a member, a
/// client, the harness) is a failure of that seed, not of the swarm.
pub fn run(config: &SimConfig) -> Result<Outcome, SimError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_inner(config))) {
        Ok(res) => res,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(SimError::Panic(msg))
        }
    }
}

fn run_inner(config: &SimConfig) -> Result<Outcome, SimError> {
    let dir = scratch_dir().map_err(|e| SimError::Sim(format!("scratch directory: {e}")))?;
    let mut rng = StdRng::seed_from_u64(mix(config.seed, 0));
    let start = Duration::from_secs(1);
    let faults_end = start + config.fault_window;
    let schedule = faults::schedule(
        &mut rng,
        config.members,
        config.faults,
        start,
        faults_end,
        true,
    );
    let ctx = Arc::new(Ctx {
        config: config.clone(),
        dir: dir.path().to_path_buf(),
        history: Recorder::new(),
        watches: (0..config.members).map(|_| Mutex::default()).collect(),
        locks: Mutex::default(),
        nodes: (0..config.members).map(|_| Mutex::default()).collect(),
        clocks: (0..config.members).map(|_| Arc::default()).collect(),
        disks: (0..config.members as u64)
            .map(|i| {
                Arc::new(SimDisk::new(
                    config.lying_disks,
                    mix(config.seed, 1 << 40 | i),
                ))
            })
            .collect(),
        incarnations: (0..config.members).map(|_| AtomicU64::new(0)).collect(),
        workload_end: faults_end,
        faults_end,
        done: AtomicBool::new(false),
        liveness: Mutex::new(Err("the liveness probe did not finish".into())),
        trace_hash: Mutex::new(0xcbf2_9ce4_8422_2325),
        wal: Mutex::default(),
        answered_early: Default::default(),
    });

    let mut sim = turmoil::Builder::new()
        .rng_seed(mix(config.seed, 1))
        .simulation_duration(
            faults_end
                + config.liveness_bound
                + config.settle
                + config.convergence_bound
                + Duration::from_secs(30),
        )
        .tick_duration(config.tick)
        .min_message_latency(Duration::from_micros(100))
        .max_message_latency(Duration::from_millis(2))
        .tcp_capacity(1 << 16)
        .build();
    for i in 0..config.members {
        let ctx = ctx.clone();
        sim.host(member_name(i), move || member_main(ctx.clone(), i));
    }
    for c in 0..config.clients {
        let ctx = ctx.clone();
        sim.client(format!("c{}", c + 1), workload::kv_client(ctx, c));
    }
    for c in 0..config.lock_clients {
        let ctx = ctx.clone();
        sim.client(format!("l{}", c + 1), locking::lock_client(ctx, c));
    }
    for m in 0..config.members {
        let ctx = ctx.clone();
        sim.client(format!("w{}", m + 1), workload::watcher(ctx, m));
    }
    sim.client("liveness", workload::liveness(ctx.clone()));

    let members: Vec<String> = (0..config.members).map(member_name).collect();
    let clients: Vec<String> = (0..config.clients)
        .map(|c| format!("c{}", c + 1))
        .chain((0..config.lock_clients).map(|c| format!("l{}", c + 1)))
        .chain((0..config.members).map(|m| format!("w{}", m + 1)))
        .chain(["liveness".to_string()])
        .collect();
    // Start and heal events in time order.
    let mut events: Vec<(Duration, bool, usize)> = Vec::new();
    for (k, s) in schedule.iter().enumerate() {
        events.push((s.at, true, k));
        events.push((s.until, false, k));
    }
    events.sort_by_key(|(t, start, k)| (*t, !*start, *k));
    let mut next_event = 0;
    let mut injected = Injected::default();
    let mut healed_all = false;
    loop {
        let now = sim.elapsed();
        while next_event < events.len() && events[next_event].0 <= now {
            let (_, is_start, k) = events[next_event];
            next_event += 1;
            let s = &schedule[k];
            ctx.trace(format!(
                "{} {} {}",
                now.as_millis(),
                if is_start { "fault" } else { "heal" },
                s.fault
            ));
            apply(
                &mut sim,
                &ctx,
                &members,
                &clients,
                s,
                is_start,
                &mut injected,
                &mut rng,
            )?;
        }
        if !healed_all && now >= faults_end {
            healed_all = true;
            heal_all(&mut sim, &ctx, &members, &clients, &mut injected);
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => return Err(SimError::Sim(e.to_string())),
        }
    }
    // Replicas are compared at a quiet moment: an entry committed just before the clients
    // finished (a lease expiry, say) may not have reached every member's apply yet, and a
    // member behind a stalled connection catches up only once keep-alive replaces it. Step
    // on (at most `convergence_bound`) until every member has applied the same index.
    let mut waited = Duration::ZERO;
    while waited < config.convergence_bound && !same_applied_index(&ctx) {
        if let Err(e) = sim.step() {
            return Err(SimError::Sim(e.to_string()));
        }
        waited += config.tick;
    }
    let sim_time = sim.elapsed();
    let outcome = judge(&ctx, &schedule, sim_time);
    drop(sim);
    outcome
}

/// Whether every member is running and all have applied the same Raft index.
fn same_applied_index(ctx: &Ctx) -> bool {
    let mut indexes = ctx
        .nodes
        .iter()
        .map(|n| n.lock().as_ref().map(|n| n.status().applied_index));
    let Some(Some(first)) = indexes.next() else {
        return false;
    };
    indexes.all(|i| i == Some(first))
}

#[allow(clippy::too_many_arguments)]
fn apply(
    sim: &mut turmoil::Sim<'_>,
    ctx: &Ctx,
    members: &[String],
    clients: &[String],
    s: &Scheduled,
    start: bool,
    injected: &mut Injected,
    rng: &mut StdRng,
) -> Result<(), SimError> {
    let m = |i: usize| members[i].as_str();
    match (&s.fault, start) {
        (Fault::Partition { a, b }, true) => sim.partition(m(*a), m(*b)),
        (Fault::Partition { a, b }, false) => sim.repair(m(*a), m(*b)),
        (Fault::OneWay { from, to }, true) => sim.partition_oneway(m(*from), m(*to)),
        (Fault::OneWay { from, to }, false) => sim.repair_oneway(m(*from), m(*to)),
        (Fault::Isolate { member }, start) => {
            for other in members.iter().chain(clients) {
                if other != m(*member) {
                    if start {
                        sim.partition(m(*member), other.as_str());
                    } else {
                        sim.repair(m(*member), other.as_str());
                    }
                }
            }
        }
        (Fault::Crash { member, torn }, true) => {
            crash(sim, ctx, members, *member, *torn, injected, rng)?
        }
        (Fault::CrashAll { torn }, true) => {
            for i in 0..members.len() {
                crash(sim, ctx, members, i, *torn, injected, rng)?;
            }
        }
        (Fault::Crash { member, .. }, false) => restart(sim, members, *member, injected),
        (Fault::CrashAll { .. }, false) => {
            for i in 0..members.len() {
                restart(sim, members, i, injected);
            }
        }
        (Fault::Pause { member }, start) => {
            for other in members.iter().chain(clients) {
                if other != m(*member) {
                    if start {
                        sim.hold(m(*member), other.as_str());
                    } else {
                        sim.release(m(*member), other.as_str());
                    }
                }
            }
        }
        (Fault::ClockJump { member, delta_ms }, true) => ctx.clocks[*member].jump(*delta_ms),
        (Fault::ClockJump { .. }, false) => {}
        (Fault::SlowDisk { member, ms }, true) => {
            ctx.disks[*member].set_slow(Duration::from_millis(*ms))
        }
        (Fault::SlowDisk { member, .. }, false) => ctx.disks[*member].set_slow(Duration::ZERO),
        (Fault::Latency { max_ms }, true) => {
            for (i, a) in members.iter().enumerate() {
                for b in &members[i + 1..] {
                    sim.set_link_max_message_latency(
                        a.as_str(),
                        b.as_str(),
                        Duration::from_millis(*max_ms),
                    );
                }
            }
        }
        (Fault::Latency { .. }, false) => {
            for (i, a) in members.iter().enumerate() {
                for b in &members[i + 1..] {
                    sim.set_link_max_message_latency(
                        a.as_str(),
                        b.as_str(),
                        Duration::from_millis(2),
                    );
                }
            }
        }
    }
    Ok(())
}

fn crash(
    sim: &mut turmoil::Sim<'_>,
    ctx: &Ctx,
    members: &[String],
    i: usize,
    torn: bool,
    injected: &mut Injected,
    rng: &mut StdRng,
) -> Result<(), SimError> {
    if !injected.crashed.insert(i) {
        return Ok(());
    }
    sim.crash(members[i].as_str());
    if let Some(node) = ctx.nodes[i].lock().take() {
        ctx.tally_node(&node);
    }
    let dropped = ctx.disks[i]
        .crash(rng, torn)
        .map_err(|e| SimError::Sim(format!("simulated crash of m{}: {e}", i + 1)))?;
    ctx.trace(format!("m{} lost {dropped} unsynced bytes", i + 1));
    Ok(())
}

fn restart(sim: &mut turmoil::Sim<'_>, members: &[String], i: usize, injected: &mut Injected) {
    if injected.crashed.remove(&i) {
        sim.bounce(members[i].as_str());
    }
}

/// Faults stop: every link repaired and released, crashed members restarted, disks fast,
/// latency back to normal. (Clock jumps stay: a wrong clock is not healed by itself.)
fn heal_all(
    sim: &mut turmoil::Sim<'_>,
    ctx: &Ctx,
    members: &[String],
    clients: &[String],
    injected: &mut Injected,
) {
    for (i, a) in members.iter().enumerate() {
        ctx.disks[i].set_slow(Duration::ZERO);
        for b in &members[i + 1..] {
            sim.set_link_max_message_latency(a.as_str(), b.as_str(), Duration::from_millis(2));
        }
    }
    // Every link involving a member (clients included), both directions.
    for (i, a) in members.iter().enumerate() {
        for b in members[i + 1..].iter().chain(clients) {
            sim.repair(a.as_str(), b.as_str());
            sim.release(a.as_str(), b.as_str());
        }
    }
    let crashed: Vec<usize> = injected.crashed.iter().copied().collect();
    for i in crashed {
        restart(sim, members, i, injected);
    }
    ctx.trace(format!("{} heal all", sim.elapsed().as_millis()));
}

fn judge(ctx: &Ctx, schedule: &[Scheduled], sim_time: Duration) -> Result<Outcome, SimError> {
    // (d) liveness
    let recovery = ctx.liveness.lock().clone().map_err(SimError::Liveness)?;

    // (a) linearizability
    let history = ctx
        .history
        .history()
        .map_err(|e| SimError::Sim(format!("recorded history: {e}")))?;
    let report = baton_check::check_history(
        &history,
        &CheckOptions {
            max_steps_per_key: 2_000_000,
            timeout: None,
        },
    );
    match &report.verdict {
        baton_check::Verdict::Linearizable => {}
        baton_check::Verdict::NotLinearizable(v) => {
            let shown: Vec<String> = v.iter().map(|v| v.to_string()).collect();
            return Err(SimError::Linearizability(shown.join("\n")));
        }
        baton_check::Verdict::Unknown(u) => {
            return Err(SimError::Undecided(format!("{u:?}")));
        }
    }

    // (b) locks, as judged by the fence.
    let lock_report = baton_check::check_locks(&ctx.locks.lock());
    if !lock_report.is_ok() {
        return Err(SimError::Lock(lock_report.to_string()));
    }
    ctx.trace(format!(
        "locks: {} accepted holdings, {} rejected",
        lock_report.accepted_holdings, lock_report.rejected
    ));

    // (e) convergence: same applied index, same state.
    let nodes: Vec<Node> = ctx
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            n.lock()
                .clone()
                .ok_or_else(|| SimError::Convergence(format!("m{} is not running", i + 1)))
        })
        .collect::<Result<_, _>>()?;
    let states: Vec<ReplicaState> = nodes
        .iter()
        .map(|n| {
            let status = n.status();
            ReplicaState {
                replica: status.member_id,
                applied_index: status.applied_index,
                state_hash: n.read(|sm| {
                    let kv = sm.hash_kv(0).unwrap_or(0) as u64;
                    kv << 32 ^ sm.revision().0 as u64
                }),
            }
        })
        .collect();
    baton_check::check_convergence(&states).map_err(|e| {
        let detail: Vec<String> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let s = n.status();
                format!(
                    "m{} = {:x}: leader {:?}, term {}, last log {}, applied {}",
                    i + 1,
                    s.member_id,
                    s.leader_id.map(|l| format!("{l:x}")),
                    s.term,
                    s.last_log_index,
                    s.applied_index
                )
            })
            .collect();
        SimError::Convergence(format!("{e} ({})", detail.join("; ")))
    })?;
    for s in &states {
        ctx.trace(format!(
            "replica {:x} at {} hash {:x}",
            s.replica, s.applied_index, s.state_hash
        ));
    }

    // (c) watch streams against the authoritative history of a converged replica.
    let authoritative: Vec<WatchEvent> = nodes[0].read(|sm| {
        let range = baton_core::KeyRange {
            key: KEY_PREFIX.as_bytes().to_vec(),
            range_end: prefix_end(KEY_PREFIX.as_bytes()),
        };
        sm.history(
            &range,
            baton_core::Revision(1),
            usize::MAX,
            baton_core::EventShape::ALL,
        )
        .map(|b| b.events)
        .unwrap_or_default()
        .into_iter()
        .map(|e| WatchEvent {
            revision: e.kv.mod_revision.0 as u64,
            key: baton_check::Bytes(e.kv.key.clone()),
            kind: match e.kind {
                baton_core::EventKind::Put => {
                    baton_check::EventKind::Put(baton_check::Bytes(e.kv.value.clone()))
                }
                baton_core::EventKind::Delete => baton_check::EventKind::Delete,
            },
        })
        .collect()
    });
    let spec = baton_check::WatchSpec {
        range: baton_check::KeyRange::Prefix(baton_check::Bytes::from(KEY_PREFIX)),
        start_revision: 1,
        through_revision: None,
    };
    let mut watch_events = 0;
    for (i, w) in ctx.watches.iter().enumerate() {
        let got = w.lock();
        watch_events += got.len();
        baton_check::check_watch(&spec, &got, &authoritative).map_err(|e| SimError::Watch {
            member: i + 1,
            reason: e.to_string(),
        })?;
        for e in got.iter() {
            ctx.trace(format!("w{} {e}", i + 1));
        }
    }

    let faults = schedule
        .iter()
        .map(|s| {
            format!(
                "{}..{} ms {}",
                s.at.as_millis(),
                s.until.as_millis(),
                s.fault
            )
        })
        .collect();
    Ok(Outcome {
        seed: ctx.config.seed,
        ops: history.len(),
        watch_events,
        recovery,
        lock_holdings: lock_report.accepted_holdings,
        faults,
        trace_hash: *ctx.trace_hash.lock(),
        sim_time,
        wal: {
            for n in &nodes {
                ctx.tally_node(n);
            }
            *ctx.wal.lock()
        },
        answered_early: ctx
            .answered_early
            .load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// Result of a swarm.
#[derive(Debug)]
pub struct SwarmReport {
    pub passed: usize,
    pub failed: Vec<(u64, String)>,
    pub elapsed: Duration,
    /// Log write paths summed over the passing seeds.
    pub wal: WalWritePaths,
}

/// Runs seeds `start..start + count` with `base` as the template, stopping at the first
/// failure when `stop_at_first` is set. `progress` is called after each seed.
pub fn swarm(
    base: &SimConfig,
    start: u64,
    count: u64,
    stop_at_first: bool,
    mut progress: impl FnMut(u64, &Result<Outcome, SimError>),
) -> SwarmReport {
    let t0 = Instant::now();
    let mut passed = 0;
    let mut failed = Vec::new();
    let mut wal = WalWritePaths::default();
    for seed in start..start + count {
        let mut config = base.clone();
        config.seed = seed;
        let res = run(&config);
        progress(seed, &res);
        match res {
            Ok(o) => {
                passed += 1;
                wal.inline_ops += o.wal.inline_ops;
                wal.loop_batches += o.wal.loop_batches;
                wal.loop_ops += o.wal.loop_ops;
            }
            Err(e) => {
                failed.push((seed, e.to_string()));
                if stop_at_first {
                    break;
                }
            }
        }
    }
    SwarmReport {
        passed,
        failed,
        elapsed: t0.elapsed(),
        wal,
    }
}
