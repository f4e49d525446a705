//! Starting a replica ([`Node::start`]), one step per function: the data directory and its
//! lock, the applied state and the log recovered, the member's identity, openraft's
//! configuration, the components assembled, the peer service, the first leadership, the
//! background tasks.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use baton_core::{StateMachine, Term, WatchHub};
use openraft::{ServerState, SnapshotPolicy};

use crate::cluster::{self, DerivedIds, InitialClusterState};
use crate::config::{ElectionTiming, NodeConfig};
use crate::credential::ClusterCredential;
use crate::disk_watch::DiskWatch;
use crate::early_append::EarlyAppend;
use crate::election::{self, Elector};
use crate::error::{invalid_data, io_error, StartError};
use crate::fencing_duty::FencingKeyDuty;
use crate::files::{self, MemberMeta};
use crate::leader_service::LeaderService;
use crate::lease_duty::LeaseDuty;
use crate::lease_verdict::VouchForLeases;
use crate::limits::{REQUEST_TIMEOUT, STARTUP_LEADER_WAIT};
use crate::membership::{self, Members};
use crate::network::{PeerNetwork, Peers};
use crate::node::{Node, Parts};
use crate::observe::LeaderSeen;
use crate::peer_server::{self, Handlers, PeerService};
use crate::proposer::Proposer;
use crate::read_index::ReadIndex;
use crate::replica::Replica;
use crate::routing::Router;
use crate::sm::{AppliedState, CurrentSnapshot, Shared, StateStore};
use crate::types::{Member, Raft};
use crate::value_file::ValueFile;
use crate::{force, publish, snapshot, space, ticker, wal, wire};

/// The ids `--initial-cluster` derives for a multi-member cluster, and its state.
type Initial = (DerivedIds, InitialClusterState);

impl Node {
    /// Opens (or creates) the data directory, recovers snapshot + log tail, and starts Raft.
    /// Without `config.cluster` a fresh directory becomes a one-member cluster. With it, the
    /// peer service is served on the peer addresses before this returns, and a fresh member
    /// of a `new` cluster either initializes it (the member with the smallest id) or waits to
    /// be contacted; this does not wait for a leader.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        let initial: Option<Initial> = match &config.cluster {
            None => None,
            Some(c) => Some((
                cluster::derive_ids(c, &config.name, &config.peer_urls)?,
                c.state,
            )),
        };
        let timing = ElectionTiming::of(&config)?;
        // Checked before the directory is created: a refused start leaves nothing behind.
        if config.force_new_cluster && !config.data_dir.join("member.meta").exists() {
            return Err(StartError::ForceNewClusterWithoutData);
        }
        let dir = DataDir::open(&config.data_dir)?;
        let (state, current_snapshot, kv_changed) =
            load_state(&dir, config.snapshot_kv_checked_by_peers)?;
        let recovered = wal::recover(&dir.raft)?;
        let pristine = recovered.mem.is_pristine() && current_snapshot.is_none();
        if config.force_new_cluster && pristine {
            return Err(StartError::ForceNewClusterWithoutData);
        }
        // This replica's randomness (`Environment::rng`): a new identity, then the election
        // timeout and lease ids. Drawn before the identity, which only a single-member
        // cluster mints (the simulation's members derive theirs, so its draws are unchanged).
        let mut rng = config.env.rng();
        let member = identity(&config, initial.as_ref(), pristine, &mut rng).await?;
        // Before the log is opened: a refusal leaves nothing running.
        let credential = cluster_credential(&config, &member)?;
        // Bound before Raft starts: a port conflict fails the start instead of leaving a
        // member that nobody can reach.
        let peer_listeners = match &config.cluster {
            Some(c) => {
                peer_server::bind(&c.listen_peer_addrs, config.env.transport.as_deref()).await?
            }
            None => Vec::new(),
        };

        // The log before the purge point exists only in the snapshot; if the snapshot does not
        // reach it, entries are missing and serving would silently lose writes.
        let purged = recovered.mem.purged_index();
        let applied = state.last_applied.map(|l| l.index);
        if purged > applied {
            return Err(StartError::CorruptSnapshot {
                path: dir.snap.clone(),
                reason: format!(
                    "log purged through {purged:?} but the newest snapshot covers only {applied:?}"
                ),
            });
        }

        let raft_config = raft_config(&config, timing, member.cluster_id, &mut rng)?;
        let (applied_log_id, applied_membership) = (state.last_applied, state.membership.clone());
        let hub = WatchHub::new(config.max_pending_watch_events);
        let space = space::Space::new(
            config.disk_reserve_bytes,
            config.quota_backend_bytes,
            config.env.disk.is_none(),
        );
        // Values out of the heap, in a scratch file beside the log (a simulated disk keeps
        // them in memory: the simulation does no real I/O).
        let values = config
            .env
            .disk
            .is_none()
            .then(|| Arc::new(ValueFile::new(&config.data_dir, config.disk_reserve_bytes)));
        let mut state = state;
        if let Some(values) = &values {
            state.sm.keep_values_in(values.clone());
        }
        let mut shared = Shared::new(
            state,
            hub,
            dir.snap.clone(),
            dir.db.clone(),
            current_snapshot,
            space,
            values,
        );
        shared.snapshots_held = AtomicBool::new(kv_changed.is_some());
        shared.kv_changed_at_start = kv_changed;
        let shared = Arc::new(shared);
        let (mut log_store, wal) = wal::open(&dir.raft, recovered, config.env.disk.clone())?;
        if config.force_new_cluster {
            let own = Member {
                name: config.name.clone(),
                peer_urls: config.peer_urls.clone(),
                client_urls: config.client_urls.clone(),
            };
            let forced = force::make_standalone(
                &mut log_store,
                applied_log_id,
                &applied_membership,
                member.member_id,
                own,
            )
            .await;
            match forced {
                Ok(f) => tracing::warn!(
                    removed = ?f.removed.iter().map(|id| format!("{id:x}")).collect::<Vec<_>>(),
                    log_id = %f.log_id,
                    "--force-new-cluster: this member is now the only voter of its cluster; \
                     the other members are removed"
                ),
                Err(e) => {
                    wal.stop().await;
                    return Err(e);
                }
            }
        }
        let peers = Arc::new(Peers::new(
            member.cluster_id,
            member.member_id,
            credential,
            config.env.transport.clone(),
        ));
        let early = EarlyAppend::new(member.member_id, peers.clone());
        log_store.send_appends_early(early.clone());
        let raft = match Raft::new(
            member.member_id,
            Arc::new(raft_config),
            PeerNetwork {
                peers: peers.clone(),
            },
            log_store,
            StateStore {
                shared: shared.clone(),
            },
        )
        .await
        {
            Ok(raft) => raft,
            Err(e) => {
                wal.stop().await;
                return Err(StartError::Raft(e.to_string()));
            }
        };

        early.bind(raft.metrics());
        let shutting_down = Arc::new(AtomicBool::new(false));
        let (proposer, proposer_task) = Proposer::spawn(
            raft.clone(),
            shared.clone(),
            shutting_down.clone(),
            REQUEST_TIMEOUT,
            config.env.clock(),
        );
        let clustered = initial.is_some();
        let replica = Arc::new(Replica::new(
            config,
            timing,
            member.member_id,
            member.cluster_id,
            raft,
            shared,
            wal,
            proposer,
            rng,
            shutting_down,
        ));
        let meters = peers.meters.clone();
        let verdicts = peers.verdicts.clone();
        let parts = assemble(replica, peers, clustered, dir.lock, proposer_task);
        let reads: Arc<dyn VouchForLeases> = parts.reads.clone();
        verdicts.bind(Arc::downgrade(&reads));
        let node = Node {
            parts: Arc::new(parts),
        };
        if !peer_listeners.is_empty() {
            let replica = &node.parts.replica;
            let service = PeerService {
                cluster_id: replica.cluster_id,
                me: replica.member_id,
                cluster_credential: credential,
                raft: replica.raft.clone(),
                handlers: Arc::downgrade(&node.parts.handlers),
                meters: meters.clone(),
                verdicts,
            };
            let tasks = peer_server::spawn(peer_listeners, service);
            node.parts.tasks.lock().extend(tasks);
            let round_trips = tokio::spawn(crate::peer_meters::report_round_trips(Arc::downgrade(
                &meters,
            )));
            node.parts.tasks.lock().push(round_trips);
        }
        if let Err(e) = bootstrap(&node.parts, initial.as_ref(), credential).await {
            node.shutdown().await;
            return Err(e);
        }
        spawn_duties(&node.parts);
        Ok(node)
    }
}

/// The data directory's layout, created if missing, and its advisory lock taken.
struct DataDir {
    raft: PathBuf,
    /// Older Batons' snapshots (`<term>-<index>.snap`), still read.
    snap: PathBuf,
    /// The snapshot in etcd's layout, `member/snap/db` (its directory made on first write).
    db: PathBuf,
    lock: fs::File,
}

impl DataDir {
    fn open(data_dir: &Path) -> Result<DataDir, StartError> {
        let raft = data_dir.join("raft");
        let snap = data_dir.join("snap");
        for dir in [data_dir, &raft, &snap] {
            fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        files::fsync_dir(data_dir).map_err(io_error(data_dir))?;
        let lock_path = data_dir.join("LOCK");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(StartError::Locked {
                    path: data_dir.to_path_buf(),
                });
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_error(&lock_path)(e)),
        }
        let db = snapshot::db_path(data_dir);
        Ok(DataDir {
            raft,
            snap,
            db,
            lock,
        })
    }
}

/// The applied state to start from: the newest snapshot (`member/snap/db` or an older
/// Baton's `snap/*.snap`), or an empty store. A `db` whose `key` bucket fails its checksum is
/// refused unless `kv_checked_by_peers` (then it is loaded, loudly, and its path returned
/// for the initial corruption check to settle).
fn load_state(
    dir: &DataDir,
    kv_checked_by_peers: bool,
) -> Result<(AppliedState, Option<CurrentSnapshot>, Option<PathBuf>), StartError> {
    let Some(newest) = snapshot::load_newest_state(&dir.snap, &dir.db)? else {
        let state = AppliedState {
            sm: StateMachine::new(),
            last_applied: None,
            membership: Default::default(),
            tally: Default::default(),
        };
        return Ok((state, None, None));
    };
    let path = newest.path;
    let corrupt = |reason: String| StartError::CorruptSnapshot {
        path: path.clone(),
        reason,
    };
    let kv_changed = match newest.kv_changed {
        None => None,
        Some(detail) if !kv_checked_by_peers => {
            return Err(StartError::SnapshotKvChanged {
                path: path.clone(),
                detail,
            })
        }
        Some(detail) => {
            tracing::error!(
                path = %path.display(),
                %detail,
                "the snapshot's `key` bucket does not match the checksum Baton wrote with it \
                 (changed outside Baton?); loaded only for the initial corruption check to \
                 compare with the other members"
            );
            Some(path.clone())
        }
    };
    let sm = newest.state;
    let Some(last) = newest.meta.last_log_id else {
        return Err(corrupt("snapshot without a last log id".into()));
    };
    // Every Raft entry applies at least one command, so the terms must agree (the indexes
    // differ: the core counts commands, Raft counts batches).
    if sm.last_applied().1 != Term(last.leader_id.term) {
        return Err(corrupt(format!(
            "header says {last} but the state was applied in {:?}",
            sm.last_applied().1
        )));
    }
    let state = AppliedState {
        sm,
        last_applied: Some(last),
        membership: newest.meta.last_membership.clone(),
        tally: Default::default(),
    };
    Ok((state, Some((newest.meta, path, newest.size)), kv_changed))
}

/// This member's identity: joined from the cluster (`existing`, empty directory), else read
/// from the directory, or minted on a pristine one.
async fn identity(
    config: &NodeConfig,
    initial: Option<&Initial>,
    pristine: bool,
    rng: &mut rand::rngs::StdRng,
) -> Result<MemberMeta, StartError> {
    let mint = match (&config.cluster, initial) {
        (Some(c), Some((_, InitialClusterState::Existing))) if pristine => {
            let listed = c
                .initial_members
                .iter()
                .flat_map(|m| m.peer_urls.clone())
                .collect();
            return membership::join_existing(&config.data_dir, config, &c.token, listed).await;
        }
        _ if !pristine => None,
        (_, Some((ids, _))) => Some(Mint::Derived(ids)),
        (_, None) => Some(Mint::Random),
    };
    let expected = match initial {
        Some((ids, InitialClusterState::New)) => Some(ids),
        _ => None,
    };
    load_or_create_member(&config.data_dir, &config.name, mint, expected, rng)
}

/// What this member shows its peers, and requires of them: the credential it was given when
/// `member add` admitted it (stored in `member.meta`), else its `--initial-cluster-token`'s.
/// A token given explicitly that is not the stored credential's is refused: the member was
/// admitted to another cluster than the token names, and one of the two is a mistake.
fn cluster_credential(
    config: &NodeConfig,
    member: &MemberMeta,
) -> Result<Option<ClusterCredential>, StartError> {
    let Some(cluster) = &config.cluster else {
        return Ok(None);
    };
    let of_token = ClusterCredential::of_token(&cluster.token);
    match member.credential {
        None => Ok(Some(of_token)),
        Some(stored) if cluster.token_given && !stored.matches(&of_token) => {
            Err(StartError::TokenMismatch {
                path: config.data_dir.join("member.meta"),
            })
        }
        Some(stored) => Ok(Some(stored)),
    }
}

/// How a pristine member gets its identity.
enum Mint<'a> {
    /// A single-member cluster: random ids.
    Random,
    /// A member of a new multi-member cluster: the ids `--initial-cluster` derives.
    Derived(&'a DerivedIds),
}

/// Reads this member's identity, or mints and persists one (`mint`: only on a pristine
/// directory). A missing identity next to existing Raft state is refused: a new member id
/// would not be a voter of the recorded membership and the replica could never make
/// progress.
///
/// In a new multi-member cluster (`expected` given) the persisted identity wins on a
/// restart (as etcd ignores the initial flags once a member has data) and a disagreement is
/// only logged.
fn load_or_create_member(
    data_dir: &Path,
    name: &str,
    mint: Option<Mint<'_>>,
    expected: Option<&DerivedIds>,
    rng: &mut rand::rngs::StdRng,
) -> Result<MemberMeta, StartError> {
    let path = data_dir.join("member.meta");
    if files::has_old_member_magic(&path) {
        return Err(invalid_data(
            &path,
            "this data directory was written by an earlier Baton whose log format this \
             version cannot read (member info changed); start from an empty directory"
                .into(),
        ));
    }
    match files::read_member(&path).map_err(io_error(&path))? {
        Some(Ok(meta)) => {
            if let Some(ids) = expected {
                if ids.cluster_id != meta.cluster_id || ids.id_of(name) != Some(meta.member_id) {
                    tracing::warn!(
                        member_id = format_args!("{:x}", meta.member_id),
                        cluster_id = format_args!("{:x}", meta.cluster_id),
                        "--initial-cluster describes another identity than the one in the \
                         data directory; the data directory wins"
                    );
                }
            }
            Ok(meta)
        }
        Some(Err(reason)) => Err(invalid_data(
            &path,
            format!("corrupt member identity: {reason}"),
        )),
        None => {
            let meta = match mint {
                None => {
                    return Err(invalid_data(
                        &path,
                        "member identity is missing but Raft state exists".into(),
                    ))
                }
                Some(Mint::Random) => files::new_identity(name, rng),
                Some(Mint::Derived(ids)) => MemberMeta {
                    member_id: ids
                        .id_of(name)
                        .ok_or_else(|| cluster::ClusterConfigError::NotListed(name.to_string()))?,
                    cluster_id: ids.cluster_id,
                    name: name.to_string(),
                    credential: None,
                },
            };
            files::write_atomic(&path, &files::encode_member(&meta)).map_err(io_error(&path))?;
            Ok(meta)
        }
    }
}

/// openraft's configuration for this member.
fn raft_config(
    config: &NodeConfig,
    timing: ElectionTiming,
    cluster_id: u64,
    rng: &mut rand::rngs::StdRng,
) -> Result<openraft::Config, StartError> {
    let (mut election_timeout_min, mut election_timeout_max) =
        (timing.timeout_min_ms, timing.lease_ms);
    if config.env.seed.is_some() {
        // openraft draws the timeout from its own thread_rng; a range of one value makes
        // that draw a constant, picked here from the seed in the same range.
        use rand::Rng;
        election_timeout_min = rng.gen_range(election_timeout_min..election_timeout_max);
        election_timeout_max = election_timeout_min + 1;
    }
    openraft::Config {
        cluster_name: format!("baton-{cluster_id:016x}"),
        heartbeat_interval: config.heartbeat_interval.as_millis() as u64,
        election_timeout_min,
        election_timeout_max,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries.max(1)),
        // Keep a little log behind the snapshot for followers that lag slightly (cheaper
        // than shipping a snapshot), but not much: it is memory and disk. Entries are
        // batches of up to hundreds of commands, so 100 entries is already a lot of log.
        max_in_snapshot_log_to_keep: (config.snapshot_every_entries / 2).min(100),
        snapshot_max_chunk_size: wire::SNAPSHOT_CHUNK_BYTES,
        // `election` is the election timer: openraft's has no pre-vote.
        enable_elect: false,
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Raft(format!("invalid timing configuration: {e}")))
}

/// The components over the replica, each given what it depends on (and nothing above it).
fn assemble(
    replica: Arc<Replica>,
    peers: Arc<Peers>,
    clustered: bool,
    dir_lock: fs::File,
    proposer_task: tokio::task::JoinHandle<()>,
) -> Parts {
    let router = Arc::new(Router::new(replica.clone(), peers.clone()));
    let reads = ReadIndex::new(replica.clone(), router.clone());
    let leases = Arc::new(LeaseDuty::new(
        replica.clone(),
        router.clone(),
        reads.clone(),
    ));
    let members = Arc::new(Members::new(router.clone(), clustered));
    let disk = DiskWatch::new(replica.clone(), router.clone());
    let fencing = FencingKeyDuty::new(replica.clone());
    let elector = Arc::new(Elector::new(replica.clone(), peers));
    let handlers = Arc::new(Handlers {
        leader: LeaderService {
            replica: replica.clone(),
            reads: reads.clone(),
            leases: leases.clone(),
            members: members.clone(),
            peers: router.peers().clone(),
        },
        members: members.clone(),
        elector,
    });
    Parts {
        replica,
        router,
        reads,
        leases,
        members,
        disk,
        fencing,
        handlers,
        tasks: parking_lot::Mutex::new(vec![proposer_task]),
        dir_lock: parking_lot::Mutex::new(Some(dir_lock)),
    }
}

/// First start of a single member: make this directory a one-member cluster. First start
/// of a new multi-member cluster: the member with the smallest id initializes Raft with
/// every member of `--initial-cluster` (the others wait to be contacted; a member that
/// has data never initializes again). Every start of a sole voter: get leadership (it
/// elects itself) and have the lease clock ready before serving.
///
/// `credential` is what this member shows its peers (`cluster_credential`).
async fn bootstrap(
    parts: &Parts,
    initial: Option<&Initial>,
    credential: Option<ClusterCredential>,
) -> Result<(), StartError> {
    let replica = &parts.replica;
    let raft = &replica.raft;
    let me = replica.member_id;
    let raft_err = |e: &dyn std::fmt::Display| StartError::Raft(e.to_string());
    if !raft.is_initialized().await.map_err(|e| raft_err(&e))? {
        let config = &replica.config;
        let own = Member {
            name: config.name.clone(),
            peer_urls: config.peer_urls.clone(),
            client_urls: config.client_urls.clone(),
        };
        let members = match initial {
            None => Some(BTreeMap::from([(me, own)])),
            Some((ids, InitialClusterState::New)) if ids.initializer() == me => {
                Some(ids.initial_membership(me, &own).into_iter().collect())
            }
            Some(_) => None,
        };
        if let Some(members) = members {
            tracing::info!(members = members.len(), "initializing a new cluster");
            raft.initialize(members).await.map_err(|e| raft_err(&e))?;
        } else {
            tracing::info!("waiting to be contacted by the cluster's leader");
            if let (Some((ids, _)), Some(credential)) = (initial, credential) {
                let listed = ids
                    .members
                    .iter()
                    .flat_map(|(_, m)| m.peer_urls.iter().cloned())
                    .collect();
                let probe = tokio::spawn(membership::probe_while_waiting(
                    raft.clone(),
                    config.clone(),
                    credential,
                    listed,
                ));
                parts.tasks.lock().push(probe);
            }
        }
    }
    // Asked of the Raft core, not read from the metrics: those are published
    // asynchronously and may not show the membership `initialize` just wrote.
    let (state, voters) = raft
        .with_raft_state(|st| {
            let voters = st
                .membership_state
                .effective()
                .voter_ids()
                .collect::<Vec<_>>();
            (st.server_state, voters)
        })
        .await
        .map_err(|e| raft_err(&e))?;
    if voters != [me] {
        // openraft campaigns at once after `initialize`; members waiting to be contacted
        // (no voters yet) and restarted members do not wait for a leader here: their
        // peers may not be up yet, and requests wait for a leader anyway. A restarted
        // member does not disturb a live leader: it campaigns only after a pre-vote
        // (`election`).
        return Ok(());
    }
    // The sole voter need not wait an election timeout to notice nobody else leads.
    if state != ServerState::Leader {
        raft.trigger().elect().await.map_err(|e| raft_err(&e))?;
    }
    let leader = raft
        .wait(Some(STARTUP_LEADER_WAIT))
        .metrics(|m| m.current_leader.is_some(), "a leader is known")
        .await;
    match leader {
        Ok(m) if m.current_leader == Some(me) => {
            parts.leases.become_ready(m.current_term).await;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(error = %e, "no leader yet; serving anyway (requests will report no leader)")
        }
    }
    Ok(())
}

/// The background tasks: lease duties and the disk watch, publishing, noticing removal, the
/// election timer. Each holds weak references (see [`Parts`]).
fn spawn_duties(parts: &Parts) {
    let ticker = tokio::spawn(ticker::run(
        Arc::downgrade(&parts.leases),
        Arc::downgrade(&parts.disk),
        Arc::downgrade(&parts.fencing),
    ));
    let quota = tokio::spawn(crate::disk_watch::quota_wakeups(Arc::downgrade(
        &parts.disk,
    )));
    let publish = tokio::spawn(publish::run(Arc::downgrade(&parts.router)));
    let removal = tokio::spawn(membership::removal_loop(Arc::downgrade(&parts.router)));
    let adds = tokio::spawn(membership::observe_adds_loop(Arc::downgrade(
        &parts.members,
    )));
    let election = election::spawn(&parts.handlers.elector);
    let leaders = tokio::spawn(watch_leader_changes(Arc::downgrade(&parts.replica)));
    parts
        .tasks
        .lock()
        .extend([ticker, quota, publish, removal, adds, election, leaders]);
}

/// Counts the leader changes this member sees (`observe::LeaderSeen`), from openraft's
/// server metrics: they change with the leader, vote, role or membership, never per request.
async fn watch_leader_changes(replica: std::sync::Weak<Replica>) {
    let Some(r) = replica.upgrade() else {
        return;
    };
    let mut rx = r.raft.server_metrics();
    drop(r);
    let mut seen = LeaderSeen::default();
    loop {
        let leader = rx.borrow_and_update().current_leader;
        if seen.saw(leader) {
            let Some(r) = replica.upgrade() else {
                return;
            };
            r.observed.leader_changed();
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
