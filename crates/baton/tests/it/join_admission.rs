//! Admission by `member add` on real `baton serve` processes (ARCHITECTURE.md, "Admission by
//! member add"): a member added with `member add` and started without
//! `--initial-cluster-token` (as etcd's `TestIssue6361` starts it) is admitted, serves, keeps
//! the cluster credential across a restart without the flag, and is refused with a token
//! that is not the cluster's; a joiner without the token is refused, saying why, when no add
//! matches it, when it asks from another address than its peer URLs name, and when the add
//! admitted a member once already.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, free_port_below_ephemeral, Baton, Cluster};
use crate::membership::{all_started, ctl_ok, member_add};

/// A member that joins with `--initial-cluster-state existing` and no token.
fn joiner_without_token(dir: &Path, name: &str, peer_port: u16, initial: &str) -> Baton {
    Baton {
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
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        nofile_limit: None,
        client_urls: None,
        peer_scheme: "http",
    }
}

/// Runs `baton serve` with `args`, which must fail to start; returns what it printed.
fn refused_start(args: &[String]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_baton"))
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn baton serve");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "baton serve {args:?} still runs after 20 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The flags [`common::Baton`] starts `b` with (its data directory and ports), and `extra`.
fn serve_args(b: &Baton, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--data-dir".into(),
        b.data_dir.display().to_string(),
        "--listen-client-urls".into(),
        b.url(),
        "--listen-metrics-urls".into(),
        format!("http://127.0.0.1:{}", b.metrics_port),
        "--listen-peer-urls".into(),
        format!("http://127.0.0.1:{}", b.peer_port),
    ];
    args.extend(b.extra_args.iter().cloned());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_joins_without_the_token_and_keeps_the_credential() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, &[]);
    let ep = cluster.members[0].endpoint();
    ctl_ok(&ep, &["put", "before", "1"]).await;

    // A second voter, as TestIssue6361 adds it: the cluster waits for it to commit anything.
    let peer_port = free_port_below_ephemeral();
    let (id, initial) =
        member_add(&ep, "m2", &format!("http://127.0.0.1:{peer_port}"), false).await;
    let mut joiner = joiner_without_token(dir.path(), "m2", peer_port, &initial);
    joiner.spawn();
    let both = format!("{ep},{}", joiner.endpoint());
    all_started(&both, 2).await;
    ctl_ok(&ep, &["put", "after", "2"]).await;
    let got = ctl_ok(&joiner.endpoint(), &["get", "--prefix", ""]).await;
    assert_eq!(got, "after\n2\nbefore\n1\n");

    // The admission is logged with who was admitted, and the token never is.
    let leader_log = cluster.members[0].log();
    let admitted = leader_log
        .lines()
        .find(|l| l.contains("admitted a member added by member add"))
        .unwrap_or_else(|| panic!("no admission logged: {leader_log}"));
    assert!(admitted.contains(&format!("{id:x}")), "{admitted}");
    assert!(admitted.contains("127.0.0.1"), "{admitted}");
    for log in [&leader_log, &joiner.log()] {
        assert!(!log.contains(&cluster.token), "the token in a log: {log}");
    }
    // The credential is kept in member.meta, version 3.
    let meta = std::fs::read(joiner.data_dir.join("member.meta")).unwrap();
    assert_eq!(&meta[..8], b"BTNMEMB3");

    // A restart without the flag shows the kept credential: the cluster goes on.
    assert!(joiner.terminate().success());
    joiner.spawn();
    ctl_ok(&joiner.endpoint(), &["put", "restarted", "3"]).await;
    let got = ctl_ok(&ep, &["get", "restarted"]).await;
    assert_eq!(got, "restarted\n3\n");

    // A restart with a token that is not the cluster's is refused, saying why; with the
    // cluster's own, it starts.
    assert!(joiner.terminate().success());
    let err = refused_start(&serve_args(
        &joiner,
        &["--initial-cluster-token", "another"],
    ));
    assert!(
        err.contains(
            "--initial-cluster-token is not the token of the cluster this member was admitted to"
        ),
        "{err}"
    );
    joiner
        .extra_args
        .extend(["--initial-cluster-token".to_string(), cluster.token.clone()]);
    joiner.spawn();
    ctl_ok(&joiner.endpoint(), &["put", "with-token", "4"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_without_the_token_is_refused_unless_an_add_admits_it() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(dir.path(), 1, &[]);
    let m1 = &cluster.members[0];
    let ep = m1.endpoint();
    ctl_ok(&ep, &["put", "k", "v"]).await;
    let listed = format!("m1=http://127.0.0.1:{}", m1.peer_port);

    // Never added: the token is the first hint, the reason follows.
    let port = free_port_below_ephemeral();
    let stranger = joiner_without_token(
        dir.path(),
        "m9",
        port,
        &format!("{listed},m9=http://127.0.0.1:{port}"),
    );
    let err = refused_start(&serve_args(&stranger, &[]));
    let hint = err
        .find("--initial-cluster-token: the listed members refused")
        .unwrap_or_else(|| panic!("{err}"));
    let reason = err
        .find("no pending member with peer URLs")
        .unwrap_or_else(|| panic!("{err}"));
    assert!(hint < reason, "{err}");

    // Added with a peer URL on 127.0.0.2, but asking from 127.0.0.1: not the added member.
    let port = free_port_below_ephemeral();
    let url = format!("http://127.0.0.2:{port}");
    let (m8, initial) = member_add(&ep, "m8", &url, true).await;
    let mut elsewhere = joiner_without_token(dir.path(), "m8", port, &initial);
    elsewhere
        .extra_args
        .extend(["--initial-advertise-peer-urls".to_string(), url]);
    let err = refused_start(&serve_args(&elsewhere, &[]));
    assert!(
        err.contains("source address 127.0.0.1 does not match the added member's peer URLs"),
        "{err}"
    );
    // etcd allows one learner at a time.
    ctl_ok(&ep, &["member", "remove", &format!("{m8:x}")]).await;

    // Admitted once: the same add does not admit a second process (here the same member
    // started again on an empty data directory).
    let port = free_port_below_ephemeral();
    let (_, initial) = member_add(&ep, "m2", &format!("http://127.0.0.1:{port}"), true).await;
    let mut joiner = joiner_without_token(dir.path(), "m2", port, &initial);
    joiner.spawn();
    assert!(joiner.terminate().success());
    std::fs::remove_dir_all(&joiner.data_dir).unwrap();
    let err = refused_start(&serve_args(&joiner, &[]));
    assert!(err.contains("was already admitted once"), "{err}");

    // Each refusal is counted under its own reason.
    let refused = common::metric(
        m1.metrics_port,
        r#"baton_peer_refused_total{reason="not_admitted"}"#,
    )
    .await;
    assert_eq!(refused, Some(3.0));
}
