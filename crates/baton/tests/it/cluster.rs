//! Multi-member clusters: three real `baton serve` processes on loopback, created with
//! `--initial-cluster`. Any member serves reads and writes (followers forward writes,
//! keep-alives and TimeToLive to the leader and get read indexes from it), watches see
//! writes made through other members, kill -9 of the leader elects a new one quickly, and a
//! killed member restarted with its data directory catches up (by snapshot if the log it
//! missed was purged). Forged peer messages (issue 14) are refused and change nothing.

use crate::common;

use std::time::{Duration, Instant};

use crate::common::{etcdctl, etcdctl_cmd, Cluster, Proc};
use etcd_client::{Client, ConnectOptions, GetOptions};
use regex::Regex;

/// A client of one member alone (`host:port`), with short timeouts.
pub(crate) async fn client(endpoint: &str) -> Client {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Client::connect([format!("http://{endpoint}")], Some(opts))
        .await
        .unwrap_or_else(|e| panic!("connect to {endpoint}: {e}"))
}

fn endpoints(c: &Cluster) -> Vec<String> {
    c.members.iter().map(|m| m.endpoint()).collect()
}

/// Runs etcdctl in a blocking thread (it is a process; the test runtime has few threads).
async fn etcdctl_async(endpoint: &str, args: &[&str]) -> common::Out {
    let endpoint = endpoint.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        etcdctl(&endpoint, &args, None)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_serve_from_any_member() {
    let dir = tempfile::tempdir().unwrap();
    // With the initial corruption check, which logs about the other members at start (etcd's
    // e2e suite runs members with it; see the end of this test).
    let cluster = Cluster::start(dir.path(), 3, &["--experimental-initial-corrupt-check"]);
    let eps = endpoints(&cluster);
    let leader = common::agreed_leader(&eps, Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;

    // Member list on any member: three members with names, peer and client URLs (client
    // URLs are published by each member after it joined, so allow a moment).
    let line = Regex::new(
        r"^([0-9a-f]+), started, (m[123]), http://127\.0\.0\.1:(\d+), http://127\.0\.0\.1:(\d+), false$",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let list = loop {
        let out = etcdctl_async(&eps[1], &["member", "list"]).await;
        let lines: Vec<_> = out
            .stdout
            .lines()
            .filter_map(|l| line.captures(l))
            .collect();
        if out.code == 0 && lines.len() == 3 {
            break out.stdout;
        }
        assert!(
            Instant::now() < deadline,
            "member list never showed 3 started members: {out:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Member ids by member index.
    let mut ids = [0u64; 3];
    for caps in list.lines().filter_map(|l| line.captures(l)) {
        let i: usize = caps[2][1..].parse::<usize>().unwrap() - 1;
        let m = &cluster.members[i];
        assert_eq!(caps[3].parse::<u16>().unwrap(), m.peer_port, "{list}");
        assert_eq!(caps[4].parse::<u16>().unwrap(), m.client_port, "{list}");
        ids[i] = u64::from_str_radix(&caps[1], 16).unwrap();
    }
    assert!(ids.iter().all(|id| *id != 0), "{list}");

    // Endpoint status of all three: one leader, the same on all, and it is a member.
    let out = etcdctl_async(&cluster.endpoints(), &["endpoint", "status", "-w", "json"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let leaders: Vec<u64> = Regex::new(r#""leader":(\d+)"#)
        .unwrap()
        .captures_iter(&out.stdout)
        .map(|c| c[1].parse().unwrap())
        .collect();
    assert_eq!(leaders.len(), 3, "{out:?}");
    assert!(leaders.iter().all(|l| *l == leaders[0]), "{out:?}");
    assert_eq!(leaders[0], ids[leader], "{out:?}");
    let cluster_ids: Vec<&str> = Regex::new(r#""cluster_id":(\d+)"#)
        .unwrap()
        .captures_iter(&out.stdout)
        .map(|c| c.get(1).unwrap().as_str())
        .collect();
    assert_eq!(cluster_ids.len(), 3, "{out:?}");
    assert!(cluster_ids.iter().all(|c| *c == cluster_ids[0]), "{out:?}");

    // A put through member 2 is readable, linearizably, through member 3 at once.
    let out = etcdctl_async(&eps[1], &["put", "k2", "through-2"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = etcdctl_async(&eps[2], &["get", "k2", "--print-value-only"]).await;
    assert_eq!(out.stdout, "through-2\n", "{out:?}");

    // A follower reads its own write even serializably (the write is answered from the
    // leader's apply, and the next request on the follower waits for its own apply), and
    // answers with a header that has its own member id.
    let mut f = client(&eps[follower]).await;
    for i in 0..300 {
        let key = format!("ryw-{i}");
        let put = f.put(key.as_str(), "v", None).await.unwrap();
        let get = f
            .get(key.as_str(), Some(GetOptions::new().with_serializable()))
            .await
            .unwrap();
        // (Without the wait a debug build missed a put within the first 50 reads.)
        assert_eq!(
            get.kvs().len(),
            1,
            "put {i} not read back through the follower"
        );
        assert!(
            get.header().unwrap().revision() >= put.header().unwrap().revision(),
            "{i}"
        );
    }
    // A watch created from "now" on a stream already open starts after every write the
    // follower has answered: the first event it sees is the put made after it was created.
    let mut ws = f.watch("ryw-watch-0", None).await.unwrap();
    assert!(ws.message().await.unwrap().unwrap().created());
    for i in 1..=100 {
        let key = format!("ryw-watch-{i}");
        f.put(key.as_str(), "before", None).await.unwrap();
        ws.watch(key.as_str(), None).await.unwrap();
        let id = loop {
            let resp = ws.message().await.unwrap().unwrap();
            if resp.created() {
                break resp.watch_id();
            }
        };
        f.put(key.as_str(), "after", None).await.unwrap();
        let event = loop {
            let resp = ws.message().await.unwrap().unwrap();
            if resp.watch_id() == id && !resp.events().is_empty() {
                break resp.events()[0].kv().unwrap().value().to_vec();
            }
        };
        assert_eq!(
            event, b"after",
            "watch {i} saw the put answered before it was created"
        );
    }
    let put = f.put("own", "write", None).await.unwrap();
    let get = f
        .get("own", Some(GetOptions::new().with_serializable()))
        .await
        .unwrap();
    assert_eq!(get.kvs()[0].value(), b"write");
    assert_eq!(
        get.header().unwrap().revision(),
        put.header().unwrap().revision()
    );
    assert_eq!(get.header().unwrap().member_id(), ids[follower]);
    assert_eq!(put.header().unwrap().member_id(), ids[follower]);

    // A watch on member 3 sees a put made through member 1.
    let mut watch = Proc::spawn("watch", {
        let mut cmd = etcdctl_cmd(&eps[2]);
        cmd.args(["watch", "w"]);
        cmd
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = etcdctl_async(&eps[0], &["put", "w", "from-member-1"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    tokio::task::block_in_place(|| {
        watch.expect_stdout("PUT\nw\nfrom-member-1\n", Duration::from_secs(5))
    });

    // Leases through a follower: grant (a proposal), keep-alive and TimeToLive (served by
    // the leader's lease clock), a put attached to the lease, revoke.
    let ep = &eps[follower];
    let out = etcdctl_async(ep, &["lease", "grant", "30"]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let lease = Regex::new(r"lease ([0-9a-f]+) granted with TTL\(30s\)")
        .unwrap()
        .captures(&out.stdout)
        .unwrap_or_else(|| panic!("{out:?}"))[1]
        .to_string();
    let out = etcdctl_async(ep, &["lease", "keep-alive", "--once", &lease]).await;
    assert!(
        out.stdout
            .contains(&format!("lease {lease} keepalived with TTL(30)")),
        "{out:?}"
    );
    let out = etcdctl_async(ep, &["put", "leased", "v", "--lease", &lease]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = etcdctl_async(ep, &["lease", "timetolive", &lease, "--keys"]).await;
    assert!(
        Regex::new(r"granted with TTL\(30s\), remaining\((29|30)s\), attached keys\(\[leased\]\)")
            .unwrap()
            .is_match(&out.stdout),
        "{out:?}"
    );
    let out = etcdctl_async(ep, &["lease", "revoke", &lease]).await;
    assert_eq!(out.code, 0, "{out:?}");
    let out = etcdctl_async(&eps[leader], &["get", "leased", "--print-value-only"]).await;
    assert_eq!(
        out.stdout, "",
        "revoking deleted the key everywhere: {out:?}"
    );

    // etcd's e2e suite takes any output line of a member holding one of etcd's ready phrases
    // for a ready line, and starts a test once it has two: Baton must print neither itself
    // (scripts/e2e-etcd-wrapper prints them once the member answers). A corruption-check
    // warning that said "published" once started tests before the members had a leader.
    let logs = cluster.logs();
    for phrase in ["published", "enabled capabilities for version"] {
        assert!(
            !logs.lines().any(|l| l.contains(phrase)),
            "a member logged {phrase:?}:\n{logs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill9_fails_over_and_the_member_catches_up() {
    const ROUNDS: usize = 5;
    /// Keys written while a member is down: more than the leader keeps behind a snapshot
    /// (`--snapshot-count 100` keeps 50), so the restarted member needs a snapshot.
    const WRITES_WHILE_DOWN: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    // Default timing (100 ms heartbeat, 1 s election timeout): the failover time printed
    // below is what a default deployment gets.
    let mut cluster = Cluster::start(dir.path(), 3, &["--snapshot-count", "100"]);
    let eps = endpoints(&cluster);
    let mut leader = common::agreed_leader(&eps, Duration::from_secs(10)).await;
    let mut failovers = Vec::new();

    for round in 0..ROUNDS {
        let survivors: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
        let mut c = client(&eps[survivors[0]]).await;
        c.put(format!("before/{round}"), "x", None).await.unwrap();

        cluster.members[leader].kill9();
        let killed_at = Instant::now();
        // The next write through a survivor that succeeds, as a client waiting on it sees
        // it: the survivor holds the request (retrying the dead leader, then waiting for a
        // new one) and forwards it as soon as a leader is elected. Attempts are bounded in
        // case one is lost with the dead leader.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let put = c.put(format!("failover/{round}/{attempt}"), "x", None);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(3), put).await {
                break;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(10),
                "no successful write within 10 s of killing the leader\n{}",
                cluster.logs()
            );
        }
        let took = killed_at.elapsed();
        eprintln!(
            "round {round}: killed leader m{}; next write succeeded after {took:?} ({attempt} attempts)",
            leader + 1
        );
        failovers.push(took);
        let survivor_eps: Vec<String> = survivors.iter().map(|i| eps[*i].clone()).collect();
        let new_leader =
            survivors[common::agreed_leader(&survivor_eps, Duration::from_secs(5)).await];
        assert_ne!(new_leader, leader);

        // Writes through both survivors while the member is down; enough that the leader
        // snapshots and purges past what the dead member has.
        let mut other = client(&eps[survivors[1]]).await;
        for i in 0..WRITES_WHILE_DOWN {
            let c = if i % 2 == 0 { &mut c } else { &mut other };
            c.put(format!("down/{round}/{i:04}"), format!("{i}"), None)
                .await
                .unwrap();
        }
        let expected_revision = c
            .get("any", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();

        // Restart with its data directory; it must catch up to the others' revision.
        let m = &mut cluster.members[leader];
        let snapshots_before = m
            .log()
            .matches("installed a snapshot from the leader")
            .count();
        if round == 0 {
            m.extra_args
                .extend(["--initial-cluster-state".into(), "existing".into()]);
        }
        m.spawn();
        let mut r = client(&eps[leader]).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got = r
                .get(
                    format!("down/{round}/{:04}", WRITES_WHILE_DOWN - 1),
                    Some(GetOptions::new().with_serializable()),
                )
                .await;
            if let Ok(got) = got {
                let rev = got.header().unwrap().revision();
                if rev >= expected_revision {
                    assert_eq!(got.kvs().len(), 1, "the last write is there");
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "restarted m{} did not reach revision {expected_revision}\n{}",
                leader + 1,
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Everything written while it was down is there, read locally.
        let all = r
            .get(
                format!("down/{round}/"),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_serializable()
                        .with_count_only(),
                ),
            )
            .await
            .unwrap();
        assert_eq!(all.count(), WRITES_WHILE_DOWN as i64);
        let m = &cluster.members[leader];
        assert!(
            m.log()
                .matches("installed a snapshot from the leader")
                .count()
                > snapshots_before,
            "the restarted member caught up by snapshot (the leader purged what it missed)\n{}",
            m.log()
        );
        // Its restart did not depose the leader (it holds its elections until it has heard
        // from the leader).
        assert_eq!(
            survivors[common::agreed_leader(&survivor_eps, Duration::from_secs(5)).await],
            new_leader
        );
        leader = common::agreed_leader(&eps, Duration::from_secs(5)).await;
        assert_eq!(
            leader, new_leader,
            "a restarted member does not disrupt the leader"
        );
    }

    let mut sorted = failovers.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    eprintln!("failover (kill -9 of the leader → next successful write): {failovers:?}, median {median:?}");
    // The target is ≤ 1 s (measured 0.85-1.0 s on loopback); the bound leaves room for a
    // loaded machine without letting the old 3-4 s behaviour through.
    assert!(
        median <= Duration::from_millis(1500),
        "median failover {median:?} (target ≤ 1 s)"
    );
}

/// Issue 14: anyone who can reach a peer port learns the cluster and member ids from the
/// client API (response headers, `MemberList`) and could forge `Forward` calls. Without the
/// cluster token's credential nothing is heard at all (a Put with a real follower's id
/// included). With it, the leader still refuses a forwarded lease expiry whoever it claims to
/// come from, and any forwarded request claiming to come from the leader itself or from a
/// non-member; nothing changes, and each refusal is counted in `baton_peer_refused_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_peer_messages_are_refused() {
    use baton_core::{Command, LeaseId, PutRequest, Term};
    use common::peer::{self, LeaderRequest, Method};

    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 3, &[]);
    let eps = endpoints(&cluster);
    let leader = common::agreed_leader(&eps, Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let status = common::member_status(&common::lazy_channel(&eps[leader]))
        .await
        .expect("the leader answers Status");
    let leader_id = status.member_id;

    // What a stranger learns from any member's client port (once the follower has applied
    // the initial membership).
    let mut c = client(&eps[follower]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let list = loop {
        let list = c.member_list().await.unwrap();
        if list.members().len() == 3 || Instant::now() > deadline {
            break list;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let cluster_id = list.header().unwrap().cluster_id();
    let follower_ids: Vec<u64> = list
        .members()
        .iter()
        .map(|m| m.id())
        .filter(|id| *id != leader_id)
        .collect();
    assert_eq!(follower_ids.len(), 2, "{:?}", list.members());
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put(
        "guard/owned",
        "v",
        Some(etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();

    let port = cluster.members[leader].peer_port;
    let token = cluster.token.clone();
    let call_as = |token: Option<String>, from: u64, req: &LeaderRequest| {
        let payload = peer::encode(req);
        async move {
            peer::call(
                port,
                Method::Forward,
                (cluster_id, from, leader_id),
                token.as_deref(),
                payload,
            )
            .await
        }
    };
    let put = LeaderRequest::Propose(Command::Put(PutRequest {
        key: b"guard/forged".to_vec(),
        value: b"x".to_vec(),
        ..Default::default()
    }));
    let refused = |r: Result<_, tonic::Status>, what: &str, message: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{what}: {e:?}");
        assert!(e.message().contains(message), "{what}: {e:?}");
    };
    // A stranger (no cluster token) is heard by no method: a Put with a real follower's
    // id, a harmless ReadIndex, a batch, or a guessed token.
    refused(
        call_as(None, follower_ids[0], &put).await,
        "a Put with a follower's id, without the token",
        "--initial-cluster-token",
    );
    refused(
        call_as(None, follower_ids[1], &LeaderRequest::ReadIndex).await,
        "a ReadIndex without the token",
        "--initial-cluster-token",
    );
    refused(
        call_as(Some("guess".into()), follower_ids[0], &put).await,
        "a Put with a wrong token",
        "--initial-cluster-token",
    );
    refused(
        peer::call(
            port,
            Method::ForwardBatch,
            (cluster_id, follower_ids[0], leader_id),
            None,
            peer::encode(&[&put]),
        )
        .await,
        "a batch without the token",
        "--initial-cluster-token",
    );

    // Someone who has the token (an insider, until peer TLS): what a member may forward.
    let forward = |from: u64, req: &LeaderRequest| call_as(Some(token.clone()), from, req);
    // The forgery is well-formed: a harmless request with a member's id is served.
    forward(follower_ids[0], &LeaderRequest::ReadIndex)
        .await
        .expect("a forwarded ReadIndex is served");

    let expire = Command::ExpireLeases {
        ids: vec![LeaseId(lease)],
    };
    let expire_in_term = Command::ExpireLeasesInTerm {
        term: Term(status.raft_term),
        ids: vec![LeaseId(lease)],
    };
    // The receiver's own id: a Put and an expiry.
    refused(
        forward(leader_id, &put).await,
        "Put from the leader's own id",
        "claims to come from its receiver",
    );
    refused(
        forward(leader_id, &LeaderRequest::Propose(expire.clone())).await,
        "expiry from the leader's own id",
        "claims to come from its receiver",
    );
    // A real member's id: the leader's duties are refused, alone, wrapped or batched.
    for (from, command) in [
        (follower_ids[0], expire.clone()),
        (follower_ids[1], expire_in_term),
        (
            follower_ids[1],
            Command::Deduplicated {
                client_id: 1,
                sequence: 1,
                acknowledged_below: 0,
                command: Box::new(expire.clone()),
            },
        ),
        (
            follower_ids[0],
            Command::LeaseCheckpoint {
                checkpoints: vec![(LeaseId(lease), 1)],
            },
        ),
    ] {
        refused(
            forward(from, &LeaderRequest::Propose(command)).await,
            "a forwarded leader duty",
            "only the leader itself proposes it",
        );
    }
    let batch = peer::encode(&vec![
        LeaderRequest::ReadIndex,
        LeaderRequest::Propose(expire.clone()),
    ]);
    refused(
        peer::call(
            port,
            Method::ForwardBatch,
            (cluster_id, follower_ids[0], leader_id),
            Some(&token),
            batch,
        )
        .await,
        "a batch with an expiry",
        "only the leader itself proposes it",
    );
    // An id that is no member's.
    refused(
        forward(0x5eed, &put).await,
        "Put from a non-member",
        "permanently removed",
    );

    // Nothing changed: give a wrongly applied expiry time to show on every member.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for ep in &eps {
        let mut c = client(ep).await;
        let serializable = Some(GetOptions::new().with_serializable());
        let forged = c.get("guard/forged", serializable.clone()).await.unwrap();
        assert!(forged.kvs().is_empty(), "{ep}: {:?}", forged.kvs());
        let owned = c.get("guard/owned", serializable).await.unwrap();
        assert_eq!(owned.kvs().len(), 1, "{ep}: the leased key is gone");
    }
    let ttl = c.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!((590..=600).contains(&ttl), "lease TTL {ttl}");

    let metrics = cluster.members[leader].metrics_port;
    for (reason, n) in [
        ("no_cluster_token", 4.0),
        ("from_receiver", 2.0),
        ("leader_only_command", 5.0),
        ("not_a_member", 1.0),
    ] {
        let sample = format!("baton_peer_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(common::metric(metrics, &sample).await, Some(n), "{sample}");
    }
}

/// Pre-vote (issue 14): a follower stopped for 3 s (SIGSTOP) and resumed has missed its
/// leader for longer than any election timeout, but its peers still hear the leader, so its
/// pre-vote fails and it never campaigns: no member's term changes, and the leader keeps
/// leading. (Without pre-vote it campaigned at a higher term and the leader stepped down:
/// term +2 and an election's write stall.) The same holds for a follower restarted with its
/// data: it asks before campaigning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_or_restarted_follower_changes_no_term() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::start(dir.path(), 3, &[]);
    let eps = endpoints(&cluster);
    let leader = common::agreed_leader(&eps, Duration::from_secs(10)).await;
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let chans: Vec<_> = eps.iter().map(|e| common::lazy_channel(e)).collect();
    let mut c = client(&eps[leader]).await;
    c.put("before", "x", None).await.unwrap();
    let terms = |statuses: &[Option<common::MemberStatus>]| -> Vec<u64> {
        statuses
            .iter()
            .map(|s| s.map_or(0, |s| s.raft_term))
            .collect()
    };
    let mut before = Vec::new();
    for ch in &chans {
        before.push(common::member_status(ch).await);
    }
    let term = before[leader].expect("the leader answers").raft_term;
    assert!(terms(&before).iter().all(|t| *t == term), "{before:?}");

    // "No term changes" is a property of a stretch of time, so it is watched for a fixed
    // one: two election timeouts (the default 1 s) after the member is back, in which its
    // timer has fired ([0.25, 0.4) T) and a campaign would long have shown.
    const QUIET: Duration = Duration::from_secs(2);
    let pid = cluster.members[follower].child.as_ref().unwrap().id() as i32;
    common::kill(pid, libc::SIGSTOP);
    // The fault itself: three election timeouts without a word from the leader.
    tokio::time::sleep(Duration::from_secs(3)).await;
    common::kill(pid, libc::SIGCONT);
    tokio::time::sleep(QUIET).await;
    c.put("after-pause", "x", None).await.unwrap();
    let mut after = Vec::new();
    for ch in &chans {
        after.push(common::member_status(ch).await);
    }
    assert_eq!(
        terms(&after),
        vec![term; 3],
        "a resumed follower changed a term: before {before:?}, after {after:?}"
    );
    assert!(after
        .iter()
        .all(|s| s.unwrap().leader == before[leader].unwrap().member_id));

    // A restart with its data: same outcome.
    cluster.members[follower].kill9();
    cluster.members[follower].spawn();
    tokio::time::sleep(QUIET).await;
    c.put("after-restart", "x", None).await.unwrap();
    let mut restarted = Vec::new();
    for ch in &chans {
        restarted.push(common::member_status(ch).await);
    }
    assert_eq!(
        terms(&restarted),
        vec![term; 3],
        "a restarted follower changed a term: {restarted:?}\n{}",
        cluster.logs()
    );
}
