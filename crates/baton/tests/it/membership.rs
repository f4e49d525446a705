//! Membership changes and leader transfer on real `baton serve` processes: growing a cluster
//! from three to five members (learner → join with an empty data directory → promote) while
//! writes go on, then losing two of five; etcdctl's `member add/list/update/remove/promote`
//! with etcd's outputs and errors; `move-leader`; removing the leader; and a removed member
//! that comes back and cannot disturb the cluster.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::{etcdctl, free_port_below_ephemeral, Baton, Cluster, Out};
use etcd_client::{Client, ConnectOptions, GetOptions};
use regex::Regex;

async fn client(endpoint: &str) -> Client {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Client::connect([format!("http://{endpoint}")], Some(opts))
        .await
        .unwrap_or_else(|e| panic!("connect to {endpoint}: {e}"))
}

/// `(member_id, leader, raft_term)` of one member, if it answers `Status`.
pub(crate) async fn status(endpoint: &str) -> Option<(u64, u64, u64)> {
    let st = async {
        let mut c = client(endpoint).await;
        let s = c.status().await.ok()?;
        Some((s.header()?.member_id(), s.leader(), s.raft_term()))
    };
    tokio::time::timeout(Duration::from_secs(2), st)
        .await
        .ok()
        .flatten()
}

/// Waits until every listed member reports the same leader, which is one of them; returns
/// `(index in endpoints, leader id)`.
pub(crate) async fn agreed_leader(endpoints: &[String], within: Duration) -> (usize, u64) {
    let deadline = Instant::now() + within;
    loop {
        let mut st = Vec::new();
        for ep in endpoints {
            st.push(status(ep).await);
        }
        if let Some(Some((_, leader, _))) = st.first() {
            let agreed = st.iter().all(|s| s.is_some_and(|(_, l, _)| l == *leader));
            let index = st
                .iter()
                .position(|s| s.is_some_and(|(m, _, _)| m == *leader));
            if *leader != 0 && agreed {
                if let Some(i) = index {
                    return (i, *leader);
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader within {within:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs etcdctl in a blocking thread (it is a process; the test runtime has few threads).
pub(crate) async fn ctl(endpoints: &str, args: &[&str]) -> Out {
    let endpoints = endpoints.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        etcdctl(&endpoints, &args, None)
    })
    .await
    .unwrap()
}

/// etcdctl must succeed; returns its stdout.
pub(crate) async fn ctl_ok(endpoints: &str, args: &[&str]) -> String {
    let out = ctl(endpoints, args).await;
    assert_eq!(out.code, 0, "etcdctl {args:?} failed: {out:?}");
    out.stdout
}

/// etcdctl must fail with exactly etcd's `message`.
async fn ctl_err(endpoints: &str, args: &[&str], message: &str) {
    let out = ctl(endpoints, args).await;
    assert_ne!(out.code, 0, "etcdctl {args:?} should fail: {out:?}");
    // etcdctl 3.4 logs the client's retry as JSON first; its verdict is the last line.
    assert_eq!(
        out.stderr.trim().lines().last().unwrap_or_default(),
        format!("Error: {message}"),
        "etcdctl {args:?}: {out:?}"
    );
}

/// One line of `etcdctl member list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) id: u64,
    pub(crate) started: bool,
    pub(crate) name: String,
    pub(crate) peer_urls: String,
    pub(crate) client_urls: String,
    pub(crate) learner: bool,
}

pub(crate) async fn member_list(endpoints: &str) -> Vec<Listed> {
    let out = ctl_ok(endpoints, &["member", "list"]).await;
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(", ").collect();
            assert_eq!(f.len(), 6, "member list line {l:?}");
            Listed {
                id: u64::from_str_radix(f[0], 16).unwrap(),
                started: match f[1] {
                    "started" => true,
                    "unstarted" => false,
                    other => panic!("{other:?} in {l:?}"),
                },
                name: f[2].to_string(),
                peer_urls: f[3].to_string(),
                client_urls: f[4].to_string(),
                learner: match f[5] {
                    "true" => true,
                    "false" => false,
                    other => panic!("{other:?} in {l:?}"),
                },
            }
        })
        .collect()
}

/// The flags `Cluster::start` gave its members, for a member that joins later.
fn token(cluster: &Cluster) -> String {
    let args = &cluster.members[0].extra_args;
    let i = args
        .iter()
        .position(|a| a == "--initial-cluster-token")
        .unwrap();
    args[i + 1].clone()
}

/// `etcdctl member add NAME --peer-urls=URL [--learner]`: checks etcd's output and returns
/// the new member's id and the `ETCD_INITIAL_CLUSTER` etcdctl prints for it.
pub(crate) async fn member_add(
    endpoints: &str,
    name: &str,
    peer_url: &str,
    learner: bool,
) -> (u64, String) {
    let peer_flag = format!("--peer-urls={peer_url}");
    let mut args = vec!["member", "add", name, &peer_flag];
    if learner {
        args.push("--learner");
    }
    let out = ctl_ok(endpoints, &args).await;
    let head = Regex::new(r"^Member\s+([0-9a-f]+) added to cluster\s+([0-9a-f]+)$").unwrap();
    let first = out.lines().next().unwrap_or_default();
    let caps = head
        .captures(first)
        .unwrap_or_else(|| panic!("member add said {out:?}"));
    let id = u64::from_str_radix(&caps[1], 16).unwrap();
    let env = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=\"")))
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or_else(|| panic!("no {key} in {out:?}"))
            .to_string()
    };
    assert_eq!(env("ETCD_NAME"), name);
    assert_eq!(env("ETCD_INITIAL_ADVERTISE_PEER_URLS"), peer_url);
    assert_eq!(env("ETCD_INITIAL_CLUSTER_STATE"), "existing");
    let initial = env("ETCD_INITIAL_CLUSTER");
    assert!(
        !initial.split(',').any(|e| e.starts_with('=')),
        "a member without a name (not published yet) in {out}"
    );
    assert!(initial.contains(&format!("{name}={peer_url}")), "{initial}");
    (id, initial)
}

/// Starts a member that joins an existing cluster: `--initial-cluster-state existing`, an
/// empty data directory under `dir`.
pub(crate) fn start_joiner(
    dir: &std::path::Path,
    name: &str,
    peer_port: u16,
    initial: &str,
    token: &str,
) -> Baton {
    let mut b = Baton {
        child: None,
        data_dir: dir.join(name),
        client_port: free_port_below_ephemeral(),
        metrics_port: free_port_below_ephemeral(),
        peer_port,
        extra_args: [
            "--name",
            name,
            "--initial-cluster",
            initial,
            "--initial-cluster-state",
            "existing",
            "--initial-cluster-token",
            token,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        nofile_limit: None,
        client_urls: None,
        peer_scheme: "http",
    };
    b.spawn();
    b
}

/// Retries `etcdctl member promote ID` while etcd's "not in sync" error says the learner
/// is still catching up.
async fn promote_when_ready(endpoints: &str, id: u64, within: Duration) {
    let hex = format!("{id:x}");
    let deadline = Instant::now() + within;
    let re = Regex::new(r"^Member\s+([0-9a-f]+) promoted in cluster\s+[0-9a-f]+$").unwrap();
    loop {
        let out = ctl(endpoints, &["member", "promote", &hex]).await;
        if out.code == 0 {
            let caps = re
                .captures(out.stdout.trim())
                .unwrap_or_else(|| panic!("promote said {out:?}"));
            assert_eq!(&caps[1], hex);
            return;
        }
        assert!(
            out.stderr.contains(
                "etcdserver: can only promote a learner member which is in sync with leader"
            ),
            "{out:?}"
        );
        assert!(
            Instant::now() < deadline,
            "learner {hex} never caught up: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `member list` shows `id` started (published its name and client URLs).
async fn wait_started(endpoints: &str, id: u64, within: Duration) -> Listed {
    let deadline = Instant::now() + within;
    loop {
        let list = member_list(endpoints).await;
        if let Some(m) = list.iter().find(|m| m.id == id && m.started) {
            return m.clone();
        }
        assert!(
            Instant::now() < deadline,
            "member {id:x} never started: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `member list` shows `n` members, all started (each publishes its name and
/// client URLs after it runs; etcdctl's `member add` output names members from the list).
///
/// Asks every endpoint: a member always shows itself with its configured name, so one
/// member's list does not prove that the others know its name.
pub(crate) async fn all_started(endpoints: &str, n: usize) -> Vec<Listed> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut list = Vec::new();
        let mut complete = true;
        for ep in endpoints.split(',') {
            list = member_list(ep).await;
            complete &= list.len() == n && list.iter().all(|m| m.started);
        }
        if complete {
            return list;
        }
        assert!(Instant::now() < deadline, "{list:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes keys `prefix/NNNN` through `endpoint` until told to stop; every write must
/// succeed. Returns how many were written.
fn writer(
    endpoint: String,
    prefix: &'static str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut c = client(&endpoint).await;
        let mut n = 0usize;
        while !*stop.borrow() {
            c.put(format!("{prefix}/{n:06}"), format!("{n}"), None)
                .await
                .unwrap_or_else(|e| panic!("write {n} through {endpoint} failed: {e}"));
            n += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        n
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grow_three_to_five_then_lose_two() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    // Snapshots every 20 entries: the log the joiners need is purged by then, so they
    // catch up by snapshot and then by log.
    let mut cluster = Cluster::start(dir.path(), 3, &["--snapshot-count", "20"]);
    let token = token(&cluster);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let (leader, _) = agreed_leader(&eps, Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let all = cluster.endpoints();
    all_started(&all, 3).await;
    let mut c = client(&eps[leader]).await;
    for i in 0..100 {
        c.put(format!("before/{i:03}"), "x", None).await.unwrap();
    }

    // Writes through a follower go on while the cluster grows; every one must succeed.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writes = writer(eps[follower].clone(), "grow", stop_rx);

    for name in ["m4", "m5"] {
        let peer_port = free_port_below_ephemeral();
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let (id, initial) = member_add(&all, name, &peer_url, true).await;
        // Listed at once as an unstarted learner.
        let list = member_list(&all).await;
        let added = list.iter().find(|m| m.id == id).expect("listed");
        assert!(added.learner && !added.started, "{list:?}");
        assert_eq!(added.peer_urls, peer_url);
        // Not running, so not in sync: etcd's refusal.
        ctl_err(
            &all,
            &["member", "promote", &format!("{id:x}")],
            "etcdserver: can only promote a learner member which is in sync with leader",
        )
        .await;

        let joiner = start_joiner(dir.path(), name, peer_port, &initial, &token);
        let listed = wait_started(&all, id, Duration::from_secs(15)).await;
        assert_eq!(listed.name, name);
        assert_eq!(listed.client_urls, joiner.url());
        assert!(listed.learner);
        // A learner serves only Status and serializable reads, as etcd.
        ctl_err(
            &joiner.endpoint(),
            &["put", "via-learner", "x"],
            "etcdserver: rpc not supported for learner",
        )
        .await;
        ctl_err(
            &joiner.endpoint(),
            &["get", "before/000"],
            "etcdserver: rpc not supported for learner",
        )
        .await;
        ctl_ok(
            &joiner.endpoint(),
            &["get", "--consistency=s", "before/000"],
        )
        .await;
        let mut jc = client(&joiner.endpoint()).await;
        assert!(jc.status().await.unwrap().is_learner());
        promote_when_ready(&all, id, Duration::from_secs(15)).await;
        // It was sent a snapshot (it takes none of its own this early).
        // (written as its `member/snap/db`, from the leader's payload)
        assert!(
            dir.path().join(name).join("member/snap/db").exists(),
            "{name} has no snapshot: {}",
            joiner.log()
        );
        // The joiner adopted the id MemberAdd gave it.
        let (me, _, _) = status(&joiner.endpoint()).await.expect("joiner status");
        assert_eq!(me, id);
        cluster.members.push(joiner);
        cluster.names.push(name.to_string());
    }
    stop_tx.send(true).unwrap();
    let written = writes.await.unwrap();
    assert!(written > 10, "only {written} writes during the growth");

    let list = member_list(&cluster.endpoints()).await;
    assert_eq!(list.len(), 5, "{list:?}");
    assert!(list.iter().all(|m| m.started && !m.learner), "{list:?}");

    // Every member, the new ones included, has every write (serializable: its own state).
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    for ep in &eps[3..] {
        let mut c = client(ep).await;
        let before = c
            .get(
                "before/",
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_count_only()
                        .with_serializable(),
                ),
            )
            .await
            .unwrap();
        assert_eq!(before.count(), 100, "{ep}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut c = client(ep).await;
            let got = c
                .get(
                    "grow/",
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_count_only()
                            .with_serializable(),
                    ),
                )
                .await
                .unwrap();
            if got.count() as usize == written {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ep} has {} of {written} writes",
                got.count()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Five voters survive losing two: the leader first, then another member.
    let (leader, _) = agreed_leader(&eps, Duration::from_secs(10)).await;
    cluster.members[leader].kill9();
    let rest: Vec<usize> = (0..5).filter(|i| *i != leader).collect();
    let rest_eps: Vec<String> = rest.iter().map(|i| eps[*i].clone()).collect();
    let (new_leader, _) = agreed_leader(&rest_eps, Duration::from_secs(10)).await;
    let second = rest[(new_leader + 1) % rest.len()];
    cluster.members[second].kill9();
    let alive: Vec<String> = rest
        .iter()
        .filter(|i| **i != second)
        .map(|i| eps[*i].clone())
        .collect();
    assert_eq!(alive.len(), 3);
    for (i, ep) in alive.iter().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut c = client(ep).await;
            match c.put(format!("three-of-five/{i}"), "x", None).await {
                Ok(_) => break,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "no write through {ep} with 3 of 5 members: {e}\n{}",
                        cluster.logs()
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    let mut c = client(&alive[0]).await;
    let got = c
        .get("three-of-five/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(got.kvs().len(), 3);
    println!(
        "grow_three_to_five_then_lose_two: {written} writes during growth, {:?} in all",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_member_commands_match_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    agreed_leader(&eps, Duration::from_secs(10)).await;
    let all = cluster.endpoints();
    let list = all_started(&all, 3).await;
    let existing_url = list[0].peer_urls.clone();
    let voter = list[1].id;

    ctl_err(
        &all,
        &[
            "member",
            "add",
            "dup",
            &format!("--peer-urls={existing_url}"),
        ],
        "etcdserver: Peer URLs already exists",
    )
    .await;
    ctl_err(
        &all,
        &["member", "remove", "1234abcd"],
        "etcdserver: member not found",
    )
    .await;
    ctl_err(
        &all,
        &["member", "promote", "1234abcd"],
        "etcdserver: member not found",
    )
    .await;
    ctl_err(
        &all,
        &["member", "promote", &format!("{voter:x}")],
        "etcdserver: can only promote a learner member",
    )
    .await;

    // A learner that never starts: listed, updatable, not promotable, one at a time.
    let url_a = format!("http://127.0.0.1:{}", free_port_below_ephemeral());
    let (learner, _) = member_add(&eps[1], "never", &url_a, true).await;
    ctl_err(
        &all,
        &[
            "member",
            "add",
            "second",
            &format!(
                "--peer-urls=http://127.0.0.1:{}",
                free_port_below_ephemeral()
            ),
            "--learner",
        ],
        "etcdserver: too many learner members in cluster",
    )
    .await;
    let url_b = format!("http://127.0.0.1:{}", free_port_below_ephemeral());
    let out = ctl_ok(
        &eps[2],
        &[
            "member",
            "update",
            &format!("{learner:x}"),
            &format!("--peer-urls={url_b}"),
        ],
    )
    .await;
    assert!(
        Regex::new(r"^Member\s+[0-9a-f]+ updated in cluster\s+[0-9a-f]+$")
            .unwrap()
            .is_match(out.trim()),
        "{out:?}"
    );
    let list = member_list(&all).await;
    let row = list.iter().find(|m| m.id == learner).expect("listed");
    assert_eq!(
        (
            row.started,
            row.name.as_str(),
            row.peer_urls.as_str(),
            row.learner
        ),
        (false, "", url_b.as_str(), true),
        "{list:?}"
    );
    ctl_err(
        &all,
        &[
            "member",
            "update",
            &format!("{learner:x}"),
            &format!("--peer-urls={existing_url}"),
        ],
        "etcdserver: Peer URLs already exists",
    )
    .await;
    let out = ctl_ok(&eps[0], &["member", "remove", &format!("{learner:x}")]).await;
    assert!(
        Regex::new(r"^Member\s+[0-9a-f]+ removed from cluster\s+[0-9a-f]+$")
            .unwrap()
            .is_match(out.trim()),
        "{out:?}"
    );
    assert_eq!(member_list(&all).await.len(), 3);

    // A voter that never starts: 3 of 4 voters are up, a quorum, so etcd allows it; a
    // fifth voter is then refused while one voter is down.
    let url_c = format!("http://127.0.0.1:{}", free_port_below_ephemeral());
    let (ghost, _) = member_add(&all, "ghost", &url_c, false).await;
    let list = member_list(&all).await;
    assert_eq!(list.len(), 4);
    assert!(list
        .iter()
        .any(|m| m.id == ghost && !m.learner && !m.started));
    ctl_err(
        &all,
        &[
            "member",
            "add",
            "ghost2",
            &format!(
                "--peer-urls=http://127.0.0.1:{}",
                free_port_below_ephemeral()
            ),
        ],
        "etcdserver: unhealthy cluster",
    )
    .await;
    // Writes still commit with 3 of 4 voters.
    ctl_ok(&all, &["put", "k", "v"]).await;
    ctl_ok(&all, &["member", "remove", &format!("{ghost:x}")]).await;
    assert_eq!(member_list(&all).await.len(), 3);
    ctl_ok(&all, &["put", "k", "v2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_then_remove_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let all = cluster.endpoints();
    let (leader, leader_id) = agreed_leader(&eps, Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let (target_id, _, _) = status(&eps[follower]).await.unwrap();

    // etcd's errors: only the leader moves leadership, and only to a voter.
    let mut c = client(&eps[follower]).await;
    let err = c.move_leader(target_id).await.unwrap_err().to_string();
    assert!(err.contains("etcdserver: not leader"), "{err}");
    let mut c = client(&eps[leader]).await;
    let err = c.move_leader(0x1234_abcd).await.unwrap_err().to_string();
    assert!(err.contains("etcdserver: bad leader transferee"), "{err}");

    // etcdctl finds the leader among the endpoints and asks it; writes through the old
    // leader and through the third member go on meanwhile (they wait during the handover
    // and then go to the new leader) and must all succeed.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let third = (leader + 2) % 3;
    let writers = [
        writer(eps[leader].clone(), "via-leader", stop_rx.clone()),
        writer(eps[third].clone(), "via-follower", stop_rx),
    ];
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    let out = ctl_ok(&all, &["move-leader", &format!("{target_id:x}")]).await;
    let took = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_tx.send(true).unwrap();
    for w in writers {
        assert!(w.await.unwrap() > 0);
    }
    assert_eq!(
        out.trim(),
        format!("Leadership transferred from {leader_id:x} to {target_id:x}"),
        "{out:?}"
    );
    let (now_leader, now_id) = agreed_leader(&eps, Duration::from_secs(5)).await;
    assert_eq!((now_leader, now_id), (follower, target_id));
    // As etcdctl shows it: every endpoint names the target as leader.
    let status: serde_json::Value =
        serde_json::from_str(&ctl_ok(&all, &["endpoint", "status", "-w", "json"]).await).unwrap();
    let rows = status.as_array().unwrap();
    assert_eq!(rows.len(), 3, "{status}");
    for row in rows {
        assert_eq!(
            row["Status"]["leader"].as_u64(),
            Some(target_id),
            "{status}"
        );
    }
    println!("move-leader took {took:?}");
    ctl_ok(&all, &["put", "after-move", "x"]).await;

    // Remove the (new) leader: the others elect a leader, the removed member stops.
    let out = ctl_ok(&all, &["member", "remove", &format!("{target_id:x}")]).await;
    assert!(out.contains("removed from cluster"), "{out:?}");
    let rest: Vec<String> = (0..3)
        .filter(|i| *i != follower)
        .map(|i| eps[i].clone())
        .collect();
    let (_, next_id) = agreed_leader(&rest, Duration::from_secs(10)).await;
    assert_ne!(next_id, target_id);
    let deadline = Instant::now() + Duration::from_secs(10);
    let removed = &mut cluster.members[follower];
    loop {
        if let Some(st) = removed.child.as_mut().unwrap().try_wait().unwrap() {
            assert!(!st.success(), "a removed member exits with an error");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed leader still runs: {}",
            removed.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        removed
            .log()
            .contains("the member has been permanently removed from the cluster"),
        "{}",
        removed.log()
    );
    removed.child = None;
    let rest_all = rest.join(",");
    ctl_ok(&rest_all, &["put", "after-remove", "x"]).await;
    assert_eq!(member_list(&rest_all).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_member_cannot_disrupt_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let (leader, _) = agreed_leader(&eps, Duration::from_secs(10)).await;
    let victim = (leader + 1) % 3;
    let (victim_id, _, _) = status(&eps[victim]).await.unwrap();
    // Published everywhere, so the restarted member has nothing to forward (publishing)
    // and the way it learns of its removal is its campaign.
    all_started(&cluster.endpoints(), 3).await;
    ctl_ok(&cluster.endpoints(), &["put", "before", "x"]).await;

    // Down while it is removed: it never applies its removal.
    cluster.members[victim].kill9();
    let rest: Vec<String> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| eps[i].clone())
        .collect();
    let rest_all = rest.join(",");
    ctl_ok(&rest_all, &["member", "remove", &format!("{victim_id:x}")]).await;
    let (_, leader_id) = agreed_leader(&rest, Duration::from_secs(10)).await;
    let (_, _, term) = status(&rest[0]).await.unwrap();

    // Back with its old data: it still believes it is a voter and campaigns, but the
    // leader's lease makes the others refuse its votes and the leader tells it it was
    // removed; it stops.
    let member = &mut cluster.members[victim];
    member.spawn();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if member.child.as_mut().unwrap().try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed member still runs: {}",
            member.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    member.child = None;
    assert!(
        member
            .log()
            .contains("the member has been permanently removed from the cluster"),
        "{}",
        member.log()
    );
    // Neither leader nor term changed, and writes go on.
    let (_, still) = agreed_leader(&rest, Duration::from_secs(5)).await;
    assert_eq!(still, leader_id);
    let (_, _, term_after) = status(&rest[0]).await.unwrap();
    assert_eq!(term_after, term, "the removed member disturbed the cluster");
    ctl_ok(&rest_all, &["put", "after", "x"]).await;
}

/// Runs `baton ARGS` (a client command) in a blocking thread.
async fn baton_async(endpoints: &str, args: &[&str]) -> Out {
    let endpoints = endpoints.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::baton(&endpoints, &args, None)
    })
    .await
    .unwrap()
}

async fn baton_json(endpoints: &str, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = baton_async(endpoints, &all).await;
    assert_eq!(out.code, 0, "baton {args:?}: {out:?}");
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_member_commands_and_move_leader() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    let all = cluster.endpoints();
    let (leader, leader_id) = agreed_leader(&eps, Duration::from_secs(10)).await;
    all_started(&all, 3).await;

    let list = baton_json(&all, &["member", "list"]).await;
    let members = list["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{list}");
    assert!(members
        .iter()
        .all(|m| m["started"] == true && m["is_learner"] == false));

    let url = format!("http://127.0.0.1:{}", free_port_below_ephemeral());
    let added = baton_json(
        &all,
        &["member", "add", "m4", "--peer-urls", &url, "--learner"],
    )
    .await;
    let id = added["id"].as_str().unwrap().to_string();
    assert_eq!(added["is_learner"], true);
    assert!(
        added["initial_cluster"]
            .as_str()
            .unwrap()
            .contains(&format!("m4={url}")),
        "{added}"
    );
    assert_eq!(added["members"].as_array().unwrap().len(), 4);
    let table = baton_async(&all, &["member", "list"]).await.stdout;
    let row = table
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("unstarted") && row.contains(&url) && row.ends_with("true"),
        "{table}"
    );
    let out = baton_async(&all, &["member", "promote", &id]).await;
    assert_ne!(out.code, 0);
    assert!(
        out.stderr
            .contains("etcdserver: can only promote a learner member which is in sync with leader"),
        "{out:?}"
    );
    let removed = baton_json(&all, &["member", "remove", &id]).await;
    assert_eq!(removed["members"].as_array().unwrap().len(), 3);

    let target = (leader + 2) % 3;
    let (target_id, _, _) = status(&eps[target]).await.unwrap();
    let moved = baton_json(&all, &["move-leader", &format!("{target_id:x}")]).await;
    assert_eq!(moved["from"], format!("{leader_id:x}"));
    assert_eq!(moved["to"], format!("{target_id:x}"));
    let (_, now) = agreed_leader(&eps, Duration::from_secs(5)).await;
    assert_eq!(now, target_id);
}

/// A joiner is refused when it was never added, when it was bootstrapped before, and when
/// it does not know the cluster token (issue 14: `Members` told anyone the member ids and
/// peer URLs a forger needs); the refusals without the token are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_without_member_add_or_the_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    agreed_leader(&eps, Duration::from_secs(10)).await;
    all_started(&cluster.endpoints(), 3).await;
    let token = token(&cluster);
    let initial = cluster.members[0].extra_args[3].clone();

    let run = |name: &str, peer_port: u16, initial: String, token: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
            .args([
                "serve",
                "--name",
                name,
                "--data-dir",
                dir.path().join(format!("{name}-empty")).to_str().unwrap(),
                "--listen-client-urls",
                &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", free_port_below_ephemeral()),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &initial,
                "--initial-cluster-state",
                "existing",
                "--initial-cluster-token",
                token,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Never added: no member has its peer URLs.
    let port = free_port_below_ephemeral();
    let err = run(
        "m9",
        port,
        format!("{initial},m9=http://127.0.0.1:{port}"),
        &token,
    );
    assert!(
        err.contains("the cluster has no member with peer URLs"),
        "{err}"
    );
    // An existing member that lost its data directory: it has been bootstrapped.
    // (It asks the others before binding its peer port, which m1 still holds.)
    let err = run("m1", cluster.members[0].peer_port, initial.clone(), &token);
    assert!(err.contains("has already been bootstrapped"), "{err}");
    // The wrong token: every member refuses to say anything, and the joiner stops at once.
    let err = run("m1", cluster.members[0].peer_port, initial.clone(), "guess");
    assert!(
        err.contains("--initial-cluster-token: the listed members refused"),
        "{err}"
    );

    // Raw `Members` calls to m1: without the token's credential (a guess, or the request
    // format from before credentials) refused; with it, answered with the cluster id.
    use common::peer::{self, JoinRequest, Method};
    let m1 = &cluster.members[0];
    let ask =
        |payload: Vec<u8>| peer::call(m1.peer_port, Method::Members, (0, 0, 0), None, payload);
    let urls = vec![format!("http://127.0.0.1:{}", free_port_below_ephemeral())];
    for payload in [
        peer::encode(&JoinRequest {
            peer_urls: urls.clone(),
            credential: peer::cluster_credential("guess"),
        }),
        peer::encode(&urls),
    ] {
        let e = ask(payload).await.expect_err("Members without the token");
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("--initial-cluster-token"), "{e:?}");
    }
    let answer = ask(peer::encode(&JoinRequest {
        peer_urls: urls,
        credential: peer::cluster_credential(&token),
    }))
    .await
    .expect("Members with the token");
    let list = client(&eps[0]).await.member_list().await.unwrap();
    assert_eq!(answer.cluster_id, list.header().unwrap().cluster_id());
    // The wrong-token joiner (with m1's URLs) asked m2 and m3 once each; m1 got the two raw
    // calls. A decodable request without the token is looked at for admission by member add
    // (none applies: m1 started long ago, the raw URLs were never added) and counted as
    // `not_admitted`; the undecodable one as `no_cluster_token`.
    for (m, no_token, not_admitted) in [(0, Some(1.0), 1.0), (1, None, 1.0), (2, None, 1.0)] {
        let port = cluster.members[m].metrics_port;
        let name = &cluster.names[m];
        let sample = r#"baton_peer_refused_total{reason="no_cluster_token"}"#;
        assert_eq!(common::metric(port, sample).await, no_token, "{name}");
        let sample = r#"baton_peer_refused_total{reason="not_admitted"}"#;
        assert_eq!(
            common::metric(port, sample).await,
            Some(not_admitted),
            "{name}"
        );
    }
}

/// etcd answers `member add` of a second voter to a lone member at once (its single-step
/// change commits in the old configuration; the cluster then waits for the new member), and
/// tooling relies on it: the new member is started with what `member add` printed. Baton's
/// joint consensus could not commit without the new member, so the answer comes once the
/// change is in the leader's log, and the change completes when the member joins: both
/// are voters then, and writes go through both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_member_adds_a_second_voter_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, &[]);
    let ep = cluster.members[0].endpoint();
    ctl_ok(&ep, &["put", "before", "1"]).await;

    let peer_port = free_port_below_ephemeral();
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let asked = Instant::now();
    let (id, initial) = tokio::time::timeout(
        Duration::from_secs(10),
        member_add(&ep, "m2", &peer_url, false),
    )
    .await
    .expect("member add answers without waiting for the new member");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let listed = member_list(&ep).await;
    let new = listed.iter().find(|m| m.id == id).expect("listed");
    assert!(!new.learner && !new.started, "{listed:?}");

    let joiner = start_joiner(dir.path(), "m2", peer_port, &initial, &token(&cluster));
    let both = format!("{ep},{}", joiner.endpoint());
    let members = all_started(&both, 2).await;
    assert!(members.iter().all(|m| !m.learner), "{members:?}");
    ctl_ok(&ep, &["put", "after", "2"]).await;
    let got = ctl_ok(
        &joiner.endpoint(),
        &["get", "--consistency=s", "--prefix", ""],
    )
    .await;
    assert!(got.contains("before") && got.contains("after"), "{got}");
    // Both vote now: the configuration is no longer joint, and a second change works.
    let peer3 = format!("http://127.0.0.1:{}", free_port_below_ephemeral());
    let (learner, _) = member_add(&both, "m3", &peer3, true).await;
    ctl_ok(&both, &["member", "remove", &format!("{learner:x}")]).await;
}
