//! Three replicas in one process, talking over the real peer transport on loopback: bootstrap
//! from `--initial-cluster`-style config, followers routing proposals, read indexes and lease
//! calls to the leader, published member attributes, and a new leader after the old one stops.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::{Command, KeyRange, LeaseId, PutRequest, RangeRequest, Response};
use baton_raft::{
    ClusterConfig, InitialClusterState, InitialMember, JoinError, KeepAlive, LogDisk, LogFile,
    Node, NodeConfig, StartError,
};

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn configs(dir: &Path, n: usize) -> Vec<NodeConfig> {
    let peers: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
    let members: Vec<InitialMember> = peers
        .iter()
        .enumerate()
        .map(|(i, a)| InitialMember {
            name: format!("r{i}"),
            peer_urls: vec![format!("http://{a}")],
        })
        .collect();
    (0..n)
        .map(|i| {
            let mut c = NodeConfig::new(format!("r{i}"), dir.join(format!("r{i}")));
            c.heartbeat_interval = Duration::from_millis(50);
            c.election_timeout = Duration::from_millis(500);
            c.peer_urls = members[i].peer_urls.clone();
            c.client_urls = vec![format!("http://client-{i}:2379")];
            c.cluster = Some(ClusterConfig {
                initial_members: members.clone(),
                state: InitialClusterState::New,
                token: "t".into(),
                token_given: true,
                listen_peer_addrs: vec![peers[i]],
            });
            c
        })
        .collect()
}

fn put(key: &str, value: &str) -> Command {
    Command::Put(PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    })
}

fn get(node: &Node, key: &str) -> Option<Vec<u8>> {
    let req = RangeRequest {
        range: KeyRange {
            key: key.into(),
            range_end: vec![],
        },
        ..Default::default()
    };
    let resp = node.read(|sm| sm.range(&req)).unwrap();
    resp.kvs.into_iter().next().map(|kv| kv.value)
}

/// The index of the member all `nodes` agree leads.
async fn leader_of(nodes: &[&Node]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let leaders: Vec<Option<u64>> = nodes.iter().map(|n| n.status().leader_id).collect();
        if let Some(Some(l)) = leaders.first() {
            if leaders.iter().all(|x| *x == Some(*l)) {
                if let Some(i) = nodes.iter().position(|n| n.status().member_id == *l) {
                    return i;
                }
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_route_to_the_leader() {
    let tmp = tempfile::tempdir().unwrap();
    let cfgs = configs(tmp.path(), 3);
    let mut nodes = Vec::new();
    for c in cfgs.clone() {
        nodes.push(Node::start(c).await.expect("start"));
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    let leader = leader_of(&refs).await;
    let f = (leader + 1) % 3;
    let ids: Vec<u64> = nodes.iter().map(|n| n.status().member_id).collect();
    let cluster_ids: Vec<u64> = nodes.iter().map(|n| n.status().cluster_id).collect();
    assert!(cluster_ids.iter().all(|c| *c == cluster_ids[0]));
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 3, "distinct member ids");

    // A proposal on a follower is forwarded, and the follower has applied it on return.
    let p = nodes[f]
        .propose(put("k", "v"))
        .await
        .expect("forwarded put");
    assert!(matches!(p.applied.response, Response::Put(_)));
    assert!(p.applied.events.is_empty(), "events are not shipped back");
    assert_eq!(get(&nodes[f], "k").as_deref(), Some(&b"v"[..]));
    assert!(nodes[f].status().applied_index >= p.raft_index);

    // ReadIndex from a follower: after the barrier, the follower has what the leader has.
    nodes[leader].propose(put("k", "w")).await.unwrap();
    let other = (leader + 2) % 3;
    nodes[other]
        .read_barrier()
        .await
        .expect("follower read barrier");
    assert_eq!(get(&nodes[other], "k").as_deref(), Some(&b"w"[..]));

    // Leases: granted through a follower, renewed and inspected through the other one (on the
    // leader's clock); the follower's own clock refuses.
    let id = LeaseId(77);
    nodes[f]
        .propose(Command::LeaseGrant { id, ttl_s: 30 })
        .await
        .unwrap();
    assert_eq!(
        nodes[other].renew_lease(id).await,
        Ok(KeepAlive::Renewed { ttl_s: 30 })
    );
    assert_eq!(
        nodes[other].renew_lease(LeaseId(78)).await,
        Ok(KeepAlive::NotFound)
    );
    assert!(matches!(
        nodes[other].lease_time_to_live(id).await,
        Ok(Some(29 | 30))
    ));
    assert!(nodes[other].lease_keep_alive(id).is_err());

    // Every member shows every member's name, peer and client URLs (published by each).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let complete = nodes.iter().all(|n| {
            let m = n.members();
            m.len() == 3
                && m.iter().all(|m| {
                    let i: usize = m
                        .name
                        .strip_prefix('r')
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(9);
                    i < 3
                        && m.id == ids[i]
                        && m.peer_urls == cfgs[i].peer_urls
                        && m.client_urls == cfgs[i].client_urls
                        && !m.is_learner
                })
        });
        if complete {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "members never complete: {:?}",
            nodes[f].members()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The leader stops: the others elect one of themselves and accept writes again.
    nodes[leader].shutdown().await;
    let survivors: Vec<&Node> = (0..3).filter(|i| *i != leader).map(|i| &nodes[i]).collect();
    let new_leader = leader_of(&survivors).await;
    let follower = survivors[1 - new_leader];
    follower
        .propose(put("after", "x"))
        .await
        .expect("write after failover");
    assert_eq!(get(follower, "after").as_deref(), Some(&b"x"[..]));
    for n in &nodes {
        n.shutdown().await;
    }
}

/// A real file under the log writer whose batches wait `slow_ms` first, and whose syncs
/// report that long (so small appends stop running inline, as on a slow real disk).
struct SlowableDisk {
    slow_ms: Arc<AtomicU64>,
}

struct SlowableFile {
    file: File,
    slow_ms: Arc<AtomicU64>,
}

impl LogDisk for SlowableDisk {
    fn open(&self, path: &Path, _durable: u64) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(Box::new(SlowableFile {
            file,
            slow_ms: self.slow_ms.clone(),
        }))
    }

    fn latency(&self) -> Duration {
        Duration::from_millis(self.slow_ms.load(Ordering::Relaxed))
    }
}

impl LogFile for SlowableFile {
    fn file_len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn allocate(&mut self, offset: u64, len: u64) -> io::Result<()> {
        if offset + len > self.file_len()? {
            self.file.set_len(offset + len)?;
        }
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync(&mut self) -> io::Result<Duration> {
        self.file.sync_data()?;
        Ok(Duration::from_millis(self.slow_ms.load(Ordering::Relaxed)))
    }
}

/// The leader writes its log in parallel with replicating it (baton-raft `early_append`):
/// with the leader's disk 400 ms slow and the followers' quick, both followers hold a new
/// entry long before the leader's write of it is durable and the write is acknowledged.
/// openraft 0.9 alone sends AppendEntries only after the leader's own flush, so the
/// followers would see the entry no sooner than 400 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_get_entries_while_the_leader_still_writes_them() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfgs = configs(tmp.path(), 3);
    let slow: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::new(AtomicU64::new(0))).collect();
    for (c, s) in cfgs.iter_mut().zip(&slow) {
        c.env.disk = Some(Arc::new(SlowableDisk { slow_ms: s.clone() }));
    }
    let mut nodes = Vec::new();
    for c in cfgs {
        nodes.push(Node::start(c).await.expect("start"));
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    let leader = leader_of(&refs).await;
    let followers: Vec<&Node> = (0..3).filter(|i| *i != leader).map(|i| &nodes[i]).collect();
    // Replication to both followers is under way (the leader knows where each stands).
    nodes[leader].propose(put("warm", "1")).await.unwrap();
    let caught_up = Instant::now() + Duration::from_secs(10);
    while followers
        .iter()
        .any(|f| f.status().last_log_index < nodes[leader].status().last_log_index)
    {
        assert!(Instant::now() < caught_up, "followers never caught up");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    slow[leader].store(400, Ordering::Relaxed);
    let before = nodes[leader].status().last_log_index;
    let started = Instant::now();
    let followers_have_it = async {
        loop {
            if followers.iter().all(|f| f.status().last_log_index > before) {
                return started.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let (written, seen) = tokio::join!(nodes[leader].propose(put("k", "v")), followers_have_it);
    let acknowledged = started.elapsed();
    written.expect("the write commits");
    assert!(
        acknowledged >= Duration::from_millis(400),
        "the leader's slow disk did not hold its write back ({acknowledged:?})"
    );
    assert!(
        seen < Duration::from_millis(200),
        "followers held the entry after {seen:?}; the write was acknowledged after \
         {acknowledged:?}"
    );
    assert_eq!(get(&nodes[leader], "k").as_deref(), Some(&b"v"[..]));
    for n in &nodes {
        n.shutdown().await;
    }
}

/// A follower grants a lock on the leader's lease verdict (baton-raft `lease_verdict`): while
/// a quorum confirmed the leader's leadership within the last heartbeat interval, the commit
/// that reaches a follower carries the verdict, and the follower's grant check is answered
/// without a call to the leader — refusing, as the leader would, a lease that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_grant_on_the_leaders_lease_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for c in configs(tmp.path(), 3) {
        nodes.push(Node::start(c).await.expect("start"));
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    let leader = leader_of(&refs).await;
    let follower = (leader + 1) % 3;
    let lease = LeaseId(77);
    nodes[leader]
        .propose(Command::LeaseGrant {
            id: lease,
            ttl_s: 60,
        })
        .await
        .unwrap();
    // One write and one grant check on the follower: whether the check stood on a verdict.
    let mut round = 0;
    let mut grant_after_a_write = |asked: LeaseId| {
        round += 1;
        let key = format!("k{round}");
        let (leader, follower) = (&nodes[leader], &nodes[follower]);
        async move {
            // A keep-alive confirms the leadership, as clients' keep-alives do all the time;
            // the write's commit then reaches the follower with a verdict.
            leader.renew_lease(lease).await.unwrap();
            leader.propose(put(&key, "v")).await.unwrap();
            while get(follower, &key).is_none() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let before = follower.grants_on_lease_verdicts();
            // Refused, as the leader would, for a lease that does not exist.
            let exists = asked == lease;
            assert_eq!(follower.confirm_grant(asked).await.unwrap(), exists);
            follower.grants_on_lease_verdicts() > before
        }
    };
    // Until the leader's lease clock is rebuilt (its first ticks as leader) it vouches for
    // nothing, and the follower asks.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !grant_after_a_write(lease).await {
        assert!(
            Instant::now() < deadline,
            "no grant ever stood on a verdict"
        );
    }
    const ROUNDS: u64 = 20;
    let mut on_verdicts = 0;
    for i in 0..ROUNDS {
        let asked = if i % 4 == 3 { LeaseId(78) } else { lease };
        on_verdicts += u64::from(grant_after_a_write(asked).await);
    }
    // Some commits may reach the follower on a heartbeat without a verdict (leadership not
    // confirmed within the interval on a loaded machine): those checks ask the leader.
    assert!(
        on_verdicts >= ROUNDS / 2,
        "only {on_verdicts} of {ROUNDS} grant checks stood on a verdict"
    );
    // The leader never stands on a verdict: its own check is local.
    assert_eq!(nodes[leader].grants_on_lease_verdicts(), 0);
    for n in &nodes {
        n.shutdown().await;
    }
}

/// A follower's answer to the early AppendEntries stands in for openraft's own request of
/// the same entries (baton-raft `early_acks`): with the leader's disk 40 ms slow, followers
/// acknowledge each entry long before openraft's request for it would leave, so that request
/// is answered without travelling — and the writes still commit only after the leader's own
/// write of them (it counts itself only once durable).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn early_answers_stand_in_for_openrafts_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cfgs = configs(tmp.path(), 3);
    let slow: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::new(AtomicU64::new(0))).collect();
    for (c, s) in cfgs.iter_mut().zip(&slow) {
        c.env.disk = Some(Arc::new(SlowableDisk { slow_ms: s.clone() }));
    }
    let mut nodes = Vec::new();
    for c in cfgs {
        nodes.push(Node::start(c).await.expect("start"));
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    let leader = leader_of(&refs).await;
    nodes[leader].propose(put("warm", "1")).await.unwrap();

    slow[leader].store(40, Ordering::Relaxed);
    let before = nodes[leader].appends_answered_early();
    const WRITES: u64 = 10;
    for i in 0..WRITES {
        let started = Instant::now();
        nodes[leader]
            .propose(put(&format!("k{i}"), "v"))
            .await
            .expect("the write commits");
        assert!(
            started.elapsed() >= Duration::from_millis(40),
            "acknowledged before the leader's own write was durable"
        );
    }
    let answered = nodes[leader].appends_answered_early() - before;
    // Two followers per write; a request that met no fresh answer travels as before, so
    // some slack for a loaded machine.
    assert!(
        answered >= WRITES,
        "only {answered} of openraft's requests for {WRITES} writes were answered early"
    );
    // Every member learns the commit (from openraft's commit heartbeat) and applies it.
    let last = format!("k{}", WRITES - 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while nodes.iter().any(|n| get(n, &last).is_none()) {
        assert!(
            Instant::now() < deadline,
            "a member never applied the last write"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

/// A member of a new cluster that the initializer has not reached (here: the only one
/// started) lists the members `--initial-cluster` names, under the ids every member derives,
/// as etcd does; it does not answer a cluster of no members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_not_yet_reached_lists_its_initial_cluster() {
    let tmp = tempfile::tempdir().unwrap();
    let cfgs = configs(tmp.path(), 3);
    let ids: Vec<u64> = cfgs
        .iter()
        .map(|c| baton_raft::etcd_member_id(&c.peer_urls, "t", None))
        .collect();
    let initializer = (0..3).min_by_key(|i| ids[*i]).unwrap();
    let waiting = (initializer + 1) % 3;
    let node = Node::start(cfgs[waiting].clone()).await.expect("start");
    let mut members = node.members();
    members.sort_by_key(|m| m.id);
    let mut expected: Vec<(u64, usize)> = (0..3).map(|i| (ids[i], i)).collect();
    expected.sort_unstable();
    assert_eq!(members.len(), 3, "{members:?}");
    for (m, (id, i)) in members.iter().zip(expected) {
        assert_eq!(m.id, id);
        assert_eq!(m.peer_urls, cfgs[i].peer_urls);
        assert!(!m.is_learner);
        if i == waiting {
            assert_eq!(m.name, cfgs[i].name);
            assert_eq!(m.client_urls, cfgs[i].client_urls);
        } else {
            // Not yet published by the member itself: etcd's "unstarted".
            assert!(m.name.is_empty() && m.client_urls.is_empty(), "{m:?}");
        }
    }
    node.shutdown().await;
}

#[tokio::test]
async fn inconsistent_cluster_flags_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = configs(tmp.path(), 2).remove(0);
    c.peer_urls = vec!["http://127.0.0.1:1".into()];
    assert!(matches!(
        Node::start(c.clone()).await,
        Err(StartError::Config(_))
    ));
    let mut c = configs(tmp.path(), 2).remove(0);
    // Joining an existing cluster with an empty data directory asks the other listed
    // members for the membership; none runs here.
    c.cluster.as_mut().unwrap().state = InitialClusterState::Existing;
    assert!(matches!(
        Node::start(c).await,
        Err(StartError::Join(JoinError::NoPeerAnswered(_)))
    ));
    let mut c = configs(tmp.path(), 2).remove(1);
    c.election_timeout = Duration::from_millis(200);
    assert!(matches!(Node::start(c).await, Err(StartError::Timing(_))));
}

/// `restore_data_dir` (what `baton snapshot restore` runs once per member): three
/// directories made from one restored state start as a new cluster that serves the state,
/// elects a leader, goes on from the state's revision, and restarts from its own files; a
/// directory that holds anything, or a name `--initial-cluster` does not list, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restored_data_directories_start_as_a_new_cluster() {
    use baton_raft::{restore_data_dir, RestoreError, RestoreInto, RESTORED_LAST_APPLIED};
    let tmp = tempfile::tempdir().unwrap();
    let cfgs = configs(tmp.path(), 3);
    let mut im = baton_core::Importer::new();
    im.version(b"a", 2, Some((2, 1, 0, b"1"))).unwrap();
    im.version(b"b", 3, Some((3, 1, 0, b"2"))).unwrap();
    im.version(b"a", 4, Some((2, 2, 0, b"3"))).unwrap();
    let (state, _) = im.finish(4, 1, RESTORED_LAST_APPLIED).unwrap();
    let cluster = cfgs[0].cluster.clone().unwrap();
    for c in &cfgs {
        restore_data_dir(
            &c.data_dir,
            RestoreInto::NewDirectory,
            &c.name,
            &c.peer_urls,
            cluster.initial_members.clone(),
            &cluster.token,
            &state,
        )
        .unwrap();
    }
    let again = restore_data_dir(
        &cfgs[0].data_dir,
        RestoreInto::NewDirectory,
        &cfgs[0].name,
        &cfgs[0].peer_urls,
        cluster.initial_members.clone(),
        &cluster.token,
        &state,
    );
    assert!(matches!(again, Err(RestoreError::Exists(_))), "{again:?}");
    let stranger = restore_data_dir(
        &tmp.path().join("stranger"),
        RestoreInto::NewDirectory,
        "nobody",
        &cfgs[0].peer_urls,
        cluster.initial_members.clone(),
        &cluster.token,
        &state,
    );
    assert!(
        matches!(stranger, Err(RestoreError::Cluster(_))),
        "{stranger:?}"
    );

    let mut nodes = Vec::new();
    for c in cfgs.clone() {
        nodes.push(Node::start(c).await.expect("start a restored member"));
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    let leader = leader_of(&refs).await;
    for n in &nodes {
        assert_eq!(get(n, "a").as_deref(), Some(&b"3"[..]));
        assert_eq!(n.read(|sm| sm.revision().0), 4);
    }
    let p = nodes[(leader + 1) % 3]
        .propose(put("c", "4"))
        .await
        .unwrap();
    assert_eq!(
        p.applied.revision.0, 5,
        "the restored cluster goes on from the state's revision"
    );
    for n in nodes.drain(..) {
        n.shutdown().await;
    }
    let mut nodes = Vec::new();
    for c in cfgs {
        nodes.push(Node::start(c).await.expect("restart"));
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    leader_of(&refs).await;
    assert_eq!(get(&nodes[2], "c").as_deref(), Some(&b"4"[..]));
    for n in nodes {
        n.shutdown().await;
    }
}
