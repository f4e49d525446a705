//! Membership changes and leader transfer on replicas in one process over the real peer
//! transport: a learner joins with an empty data directory, is refused promotion while it
//! lags, is promoted, leadership moves to it, and a removed member learns it was removed.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use baton_core::{Command, KeyRange, PutRequest, RangeRequest};
use baton_raft::{
    ClusterConfig, InitialClusterState, InitialMember, MemberError, Node, NodeConfig, TransferError,
};

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn config(dir: &Path, name: &str, members: &[InitialMember], addr: SocketAddr) -> NodeConfig {
    let mut c = NodeConfig::new(name, dir.join(name));
    c.heartbeat_interval = Duration::from_millis(50);
    c.election_timeout = Duration::from_millis(500);
    c.peer_urls = vec![format!("http://{addr}")];
    c.client_urls = vec![format!("http://client-{name}:2379")];
    c.cluster = Some(ClusterConfig {
        initial_members: members.to_vec(),
        state: InitialClusterState::New,
        token: "t".into(),
        token_given: true,
        listen_peer_addrs: vec![addr],
    });
    c
}

fn put(key: &str) -> Command {
    Command::Put(PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    })
}

fn has(node: &Node, key: &str) -> bool {
    let req = RangeRequest {
        range: KeyRange {
            key: key.into(),
            range_end: vec![],
        },
        ..Default::default()
    };
    !node.read(|sm| sm.range(&req)).unwrap().kvs.is_empty()
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learner_joins_is_promoted_takes_over_and_a_removed_member_notices() {
    let tmp = tempfile::tempdir().unwrap();
    let addrs: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    let members: Vec<InitialMember> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| InitialMember {
            name: format!("r{i}"),
            peer_urls: vec![format!("http://{a}")],
        })
        .collect();
    let mut nodes = Vec::new();
    for (i, a) in addrs.iter().enumerate() {
        nodes.push(
            Node::start(config(tmp.path(), &format!("r{i}"), &members, *a))
                .await
                .unwrap(),
        );
    }
    wait_for("a leader", || {
        nodes.iter().all(|n| {
            n.status().leader_id.is_some() && n.status().leader_id == nodes[0].status().leader_id
        })
    })
    .await;
    wait_for("every member published", || {
        nodes
            .iter()
            .all(|n| n.members().iter().all(|m| !m.name.is_empty()))
    })
    .await;
    for i in 0..50 {
        nodes[1].propose(put(&format!("k{i}"))).await.unwrap();
    }

    // Add a learner through a follower; the change is made by the leader.
    let leader_id = nodes[0].status().leader_id.unwrap();
    let follower = nodes
        .iter()
        .position(|n| n.status().member_id != leader_id)
        .unwrap();
    let addr = free_addr();
    let url = format!("http://{addr}");
    let added = nodes[follower]
        .member_add(vec![url.clone()], true)
        .await
        .unwrap();
    let new = added.added.clone().expect("the added member");
    assert!(new.is_learner && new.name.is_empty());
    assert_eq!(new.peer_urls, vec![url.clone()]);
    assert_eq!(added.members.len(), 4);
    // The follower answered after applying the change: its own list shows it.
    assert!(nodes[follower].members().iter().any(|m| m.id == new.id));
    assert_eq!(
        nodes[follower].member_promote(new.id).await,
        Err(MemberError::LearnerNotReady)
    );
    assert_eq!(
        nodes[follower].member_add(vec![url.clone()], true).await,
        Err(MemberError::PeerUrlsExist)
    );

    // It joins with an empty data directory and the other members listed.
    let mut listed = members.clone();
    listed.push(InitialMember {
        name: "r3".into(),
        peer_urls: vec![url.clone()],
    });
    let mut c = config(tmp.path(), "r3", &listed, addr);
    c.cluster.as_mut().unwrap().state = InitialClusterState::Existing;
    let joiner = Node::start(c).await.unwrap();
    assert_eq!(joiner.status().member_id, new.id);
    assert_eq!(joiner.status().cluster_id, nodes[0].status().cluster_id);
    wait_for("the learner catches up", || has(&joiner, "k49")).await;
    assert!(joiner.is_learner());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match nodes[0].member_promote(new.id).await {
            Ok(_) => break,
            Err(MemberError::LearnerNotReady) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("promote: {e}"),
        }
    }
    wait_for("the promotion reaches the joiner", || !joiner.is_learner()).await;
    assert_eq!(
        nodes[0].member_promote(new.id).await,
        Err(MemberError::NotLearner)
    );

    // Leadership moves to the new member, asked of the leader only.
    let leader = nodes
        .iter()
        .find(|n| n.status().member_id == leader_id)
        .unwrap();
    assert_eq!(
        nodes[follower].move_leader(new.id).await,
        Err(TransferError::NotLeader)
    );
    assert_eq!(
        leader.move_leader(12345).await,
        Err(TransferError::BadTransferee)
    );
    leader.move_leader(new.id).await.unwrap();
    wait_for("everyone follows the new leader", || {
        nodes
            .iter()
            .chain([&joiner])
            .all(|n| n.status().leader_id == Some(new.id))
    })
    .await;
    nodes[follower].propose(put("after-move")).await.unwrap();

    // Remove a follower while it runs: it notices.
    let victim = nodes
        .iter()
        .find(|n| n.status().member_id != new.id)
        .unwrap()
        .clone();
    let victim_id = victim.status().member_id;
    let changed = joiner.member_remove(victim_id).await.unwrap();
    assert_eq!(changed.members.len(), 3);
    assert!(changed.members.iter().all(|m| m.id != victim_id));
    tokio::time::timeout(Duration::from_secs(10), victim.removed())
        .await
        .expect("the removed member learns it was removed");
    assert_eq!(
        joiner.member_remove(victim_id).await,
        Err(MemberError::NotFound)
    );
    joiner.propose(put("after-remove")).await.unwrap();

    joiner.shutdown().await;
    for n in &nodes {
        n.shutdown().await;
    }
}
