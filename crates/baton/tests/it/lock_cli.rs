//! `baton lock` and `baton elect` as a user runs them: real processes against a real
//! `baton serve`, observed from outside through baton.v1.Lock/Inspect and the lease API.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{baton_cmd, etcdctl_cmd, kill, Baton, Proc, Rpc};

const T: Duration = Duration::from_secs(10);
/// `baton lock`'s exit status for "the lock was lost while held".
const EXIT_LOST: i32 = 75;
/// `baton lock`'s exit status for "not obtained" (--try, --timeout).
const EXIT_NOT_ACQUIRED: i32 = 73;

/// `baton lock NAME [flags] -- sh -c SCRIPT` against `b`.
fn lock_sh(b: &Baton, name: &str, flags: &[&str], script: &str) -> Command {
    let mut cmd = baton_cmd();
    cmd.arg("lock")
        .arg(name)
        .args(["--endpoints", &b.endpoint()])
        .args(flags)
        .args(["--", "sh", "-c", script]);
    cmd
}

/// The value of `NAME=value` in a process's output.
fn var(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} not in {text:?}"))
        .to_string()
}

fn holder_key(rpc: &Rpc, name: &str) -> Option<String> {
    rpc.inspect(name)
        .holder
        .map(|h| String::from_utf8_lossy(&h.key).into_owned())
}

#[test]
fn lock_runs_the_command_with_key_and_token_propagates_its_status_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let script = "echo KEY=$BATON_LOCK_KEY; echo TOKEN=$BATON_FENCING_TOKEN; \
                  echo LEASE=$BATON_LEASE_ID; echo NAME=$BATON_LOCK_NAME; exit 7";

    let mut first = Proc::spawn("baton lock", lock_sh(&b, "jobs", &[], script));
    assert_eq!(first.wait_exit(T), 7, "CMD's exit code\n{}", first.said());
    let out = first.stdout();
    let (key, lease) = (var(&out, "KEY"), var(&out, "LEASE"));
    let token: i64 = var(&out, "TOKEN").parse().unwrap();
    assert_eq!(
        key,
        format!("jobs/{lease}"),
        "etcd's key layout NAME/<lease hex>"
    );
    assert_eq!(var(&out, "NAME"), "jobs");
    assert!(token > 0);

    // Released and cleaned up: no holder, no key, and the lease is gone.
    let after = rpc.inspect("jobs");
    assert!(
        after.holder.is_none() && after.waiters.is_empty(),
        "{after:?}"
    );
    assert_eq!(rpc.keys("jobs/"), Vec::<String>::new());
    assert_eq!(
        rpc.lease_ttl(i64::from_str_radix(&lease, 16).unwrap()),
        -1,
        "the lease was revoked"
    );

    // The next holder gets a larger token. (Endpoints from the environment this time, the
    // first of them dead: the next one is tried.)
    let mut cmd = baton_cmd();
    cmd.args(["lock", "jobs", "--", "sh", "-c", script]).env(
        "BATON_ENDPOINTS",
        format!("127.0.0.1:{},{}", common::free_port(), b.endpoint()),
    );
    let mut second = Proc::spawn("baton lock again", cmd);
    assert_eq!(second.wait_exit(T), 7, "{}", second.said());
    let token2: i64 = var(&second.stdout(), "TOKEN").parse().unwrap();
    assert!(token2 > token, "tokens grow: {token} then {token2}");

    // A command killed by a signal: 128 + N, like a shell.
    let mut killed = Proc::spawn("baton lock", lock_sh(&b, "jobs", &[], "kill -9 $$"));
    assert_eq!(killed.wait_exit(T), 128 + 9, "{}", killed.said());
    assert!(rpc.inspect("jobs").holder.is_none());
}

#[test]
fn lock_excludes_queues_and_try_and_timeout_give_up() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let release = dir.path().join("release");
    let hold = format!(
        "echo first-in; while [ ! -e {} ]; do sleep 0.02; done",
        release.display()
    );

    let mut first = Proc::spawn("first", lock_sh(&b, "jobs", &[], &hold));
    first.expect_stdout("first-in", T);

    // --try: refused at once while held, with a message naming the holder.
    let started = Instant::now();
    let mut tried = Proc::spawn("--try", lock_sh(&b, "jobs", &["--try"], "echo tried-in"));
    assert_eq!(tried.wait_exit(T), EXIT_NOT_ACQUIRED, "{}", tried.said());
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(!tried.stdout().contains("tried-in"));
    assert!(
        tried.stderr().contains("is held by jobs/"),
        "{}",
        tried.said()
    );

    // --timeout: waits that long, then gives up and leaves the queue.
    let started = Instant::now();
    let mut timed = Proc::spawn(
        "--timeout 1",
        lock_sh(&b, "jobs", &["--timeout", "1"], "echo timed-in"),
    );
    assert_eq!(timed.wait_exit(T), EXIT_NOT_ACQUIRED, "{}", timed.said());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(5),
        "gave up after {waited:?}"
    );
    assert!(!timed.stdout().contains("timed-in"));
    assert!(
        rpc.inspect("jobs").waiters.is_empty(),
        "a timed-out waiter leaves the queue"
    );

    // Ctrl-C while waiting: gives up (130) and leaves the queue.
    let mut impatient = Proc::spawn("impatient", lock_sh(&b, "jobs", &[], "echo impatient-in"));
    let deadline = Instant::now() + T;
    while rpc.inspect("jobs").waiters.is_empty() {
        assert!(
            Instant::now() < deadline,
            "never queued\n{}",
            impatient.said()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    impatient.signal(libc::SIGINT);
    assert_eq!(impatient.wait_exit(T), 130, "{}", impatient.said());
    assert!(!impatient.stdout().contains("impatient-in"));
    assert!(
        rpc.inspect("jobs").waiters.is_empty(),
        "an interrupted waiter leaves the queue"
    );

    // A plain second waiter gets the lock when the first's command ends.
    let mut second = Proc::spawn("second", lock_sh(&b, "jobs", &[], "echo second-in"));
    std::thread::sleep(Duration::from_millis(800));
    assert!(!second.stdout().contains("second-in"), "{}", second.said());
    assert_eq!(rpc.inspect("jobs").waiters.len(), 1);
    std::fs::write(&release, b"").unwrap();
    assert_eq!(first.wait_exit(T), 0, "{}", first.said());
    second.expect_stdout("second-in", T);
    assert_eq!(second.wait_exit(T), 0, "{}", second.said());
}

/// Revoking the holder's lease from outside is the lease loss a paused or partitioned
/// holder suffers; `baton lock` must notice, stop its command and exit 75.
#[test]
fn lease_loss_stops_the_command_with_sigterm_and_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let script = "trap 'echo got-TERM; exit 9' TERM; echo started; \
                  while :; do sleep 0.05; done";
    let mut p = Proc::spawn(
        "baton lock",
        lock_sh(&b, "jobs", &["--ttl", "6", "--kill-after", "5"], script),
    );
    p.expect_stdout("started", T);
    let holder = rpc.inspect("jobs").holder.expect("held");
    rpc.revoke(holder.lease);
    let revoked = Instant::now();
    assert_eq!(p.wait_exit(T), EXIT_LOST, "{}", p.said());
    let noticed = revoked.elapsed();
    assert!(
        p.stdout().contains("got-TERM"),
        "CMD got SIGTERM\n{}",
        p.said()
    );
    assert!(p.stderr().contains("LOST the lock"), "{}", p.said());
    // Keep-alives go every TTL/3 = 2 s; the next one learns the lease is gone.
    assert!(
        noticed < Duration::from_secs(4),
        "noticed after {noticed:?}"
    );
    eprintln!("lease revoked → command stopped and baton lock exited after {noticed:?}");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    // `sh -c` with a pipeline-like child: both ignore TERM; the group SIGKILL ends both.
    let script = "trap '' TERM; echo pgid=$$; sleep 600 & echo started; wait";
    let mut p = Proc::spawn(
        "baton lock",
        lock_sh(&b, "jobs", &["--ttl", "3", "--kill-after", "1.5"], script),
    );
    p.expect_stdout("started", T);
    let pgid: i32 = var(&p.stdout(), "pgid").parse().unwrap();
    let holder = rpc.inspect("jobs").holder.expect("held");
    rpc.revoke(holder.lease);
    let revoked = Instant::now();
    assert_eq!(p.wait_exit(T), EXIT_LOST, "{}", p.said());
    let took = revoked.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "exited {took:?} after the revoke, before the 1.5 s grace period"
    );
    assert!(p.stderr().contains("SIGKILL"), "{}", p.said());
    // Nothing of the command's process group survives (the backgrounded sleep included).
    std::thread::sleep(Duration::from_millis(100));
    let alive = live_members(pgid);
    assert!(
        alive.is_empty(),
        "processes of the command's group survived: {alive:?}"
    );
}

/// Processes of process group `pgid` that are still running (zombies waiting to be reaped
/// by whoever adopted them do not count).
fn live_members(pgid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp …"
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
            found.push(pid);
        }
    }
    found
}

#[test]
fn sigterm_to_baton_lock_stops_the_command_and_releases() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let script = "trap 'echo got-TERM; exit 0' TERM; echo started; \
                  while :; do sleep 0.05; done";
    let mut p = Proc::spawn("baton lock", lock_sh(&b, "jobs", &[], script));
    p.expect_stdout("started", T);
    assert!(holder_key(&rpc, "jobs").is_some());
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(T), 128 + libc::SIGTERM, "{}", p.said());
    assert!(p.stdout().contains("got-TERM"), "{}", p.said());
    assert_eq!(holder_key(&rpc, "jobs"), None, "released");
}

#[test]
fn without_a_command_it_prints_key_and_token_and_holds_until_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let mut cmd = baton_cmd();
    cmd.args(["lock", "jobs", "--endpoints", &b.endpoint()]);
    let mut p = Proc::spawn("baton lock (no command)", cmd);
    p.expect_stdout("BATON_FENCING_TOKEN=", T);
    let out = p.stdout();
    let key = var(&out, "BATON_LOCK_KEY");
    let token: i64 = var(&out, "BATON_FENCING_TOKEN").parse().unwrap();
    let holder = rpc.inspect("jobs").holder.expect("held");
    assert_eq!(String::from_utf8_lossy(&holder.key), key);
    assert_eq!(
        holder.create_revision, token,
        "the token is the key's create_revision"
    );

    p.signal(libc::SIGINT);
    assert_eq!(p.wait_exit(T), 0, "{}", p.said());
    assert_eq!(holder_key(&rpc, "jobs"), None, "released");
    assert_eq!(rpc.lease_ttl(holder.lease), -1, "lease revoked");
}

#[test]
fn a_force_released_holder_stops_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let script = "trap 'echo got-TERM; exit 0' TERM; echo started; \
                  while :; do sleep 0.05; done";
    let mut p = Proc::spawn("baton lock", lock_sh(&b, "jobs", &[], script));
    p.expect_stdout("started", T);
    rpc.force_release("jobs", "test: operator takes the lock away");
    let released = Instant::now();
    assert_eq!(p.wait_exit(T), EXIT_LOST, "{}", p.said());
    assert!(p.stdout().contains("got-TERM"), "{}", p.said());
    assert!(p.stderr().contains("key was deleted"), "{}", p.said());
    assert!(released.elapsed() < Duration::from_secs(3));
}

#[test]
fn lease_keepalive_holds_the_lock_past_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let mut p = Proc::spawn(
        "baton lock --ttl 2",
        lock_sh(
            &b,
            "jobs",
            &["--ttl", "2"],
            "echo started; sleep 5; echo done",
        ),
    );
    p.expect_stdout("started", T);
    let holder = rpc.inspect("jobs").holder.expect("held");
    assert_eq!(p.wait_exit(T), 0, "{}", p.said());
    assert!(p.stdout().contains("done"));
    assert!(
        !p.stderr().contains("LOST"),
        "no false alarm over 5 s with a 2 s lease\n{}",
        p.said()
    );
    assert_eq!(rpc.lease_ttl(holder.lease), -1);
}

#[test]
fn lock_delay_holds_the_lock_free_after_a_killed_holder_but_not_after_a_release() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());
    let delayed = ["--ttl", "2", "--lock-delay", "3s"];

    // A clean release is not an expiry: the next holder gets the lock at once.
    let mut first = Proc::spawn("first", lock_sh(&b, "jobs", &delayed, "true"));
    assert_eq!(first.wait_exit(T), 0, "{}", first.said());
    let started = Instant::now();
    let mut next = Proc::spawn("next", lock_sh(&b, "jobs", &[], "echo next-in"));
    assert_eq!(next.wait_exit(T), 0, "{}", next.said());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // A holder killed with kill -9 (baton lock and its command): its lease expires, and
    // then the lock stays free for the 3 s lock-delay.
    let mut holder = Proc::spawn(
        "holder",
        lock_sh(&b, "jobs", &delayed, "echo started; exec sleep 600"),
    );
    holder.expect_stdout("started", T);
    let family = common::descendants(holder.pid());
    holder.signal(libc::SIGKILL);
    for p in family {
        kill(p, libc::SIGKILL);
    }
    let killed = Instant::now();
    let mut next = Proc::spawn("after kill", lock_sh(&b, "jobs", &[], "echo next-in"));
    // Somewhere inside the delay: not granted, and Inspect shows the delay.
    std::thread::sleep(Duration::from_millis(3000));
    let during = rpc.inspect("jobs");
    assert!(
        during.delayed_until_ms > 0 && !next.stdout().contains("next-in"),
        "in lock-delay 3 s after the kill: {during:?}\n{}",
        next.said()
    );
    next.expect_stdout("next-in", Duration::from_secs(15));
    let waited = killed.elapsed();
    // Lease expiry (1.33–2 s after the kill: renewals every 0.67 s) plus the 3 s delay.
    assert!(
        waited >= Duration::from_millis(4300) && waited < Duration::from_secs(9),
        "granted {waited:?} after the kill"
    );
    assert_eq!(next.wait_exit(T), 0, "{}", next.said());
    eprintln!("granted {waited:?} after kill -9 of a holder with a 2 s lease and 3 s lock-delay");
}

fn elect(b: &Baton, name: &str, proposal: &str, ttl: &str) -> Proc {
    let mut cmd = baton_cmd();
    cmd.args([
        "elect",
        name,
        proposal,
        "--ttl",
        ttl,
        "--endpoints",
        &b.endpoint(),
    ]);
    Proc::spawn(&format!("baton elect {proposal}"), cmd)
}

#[test]
fn elect_campaigns_resigns_hands_over_on_kill_and_listen_follows() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let rpc = Rpc::connect(&b.endpoint());

    let mut listen = baton_cmd();
    listen.args(["elect", "--listen", "leader", "--endpoints", &b.endpoint()]);
    let mut listen = Proc::spawn("baton elect --listen", listen);
    // etcdctl follows the same election: same key layout and ordering.
    let mut etcd_listen = etcdctl_cmd(&b.endpoint());
    etcd_listen.args(["elect", "--listen", "leader"]);
    let mut etcd_listen = Proc::spawn("etcdctl elect --listen", etcd_listen);

    let mut one = elect(&b, "leader", "one", "2");
    one.expect_stdout("one", T);
    let key_line = one.stdout().lines().next().unwrap().to_string();
    assert!(key_line.starts_with("leader/"), "{}", one.said());
    listen.expect_stdout("one", T);
    etcd_listen.expect_stdout("one", T);

    let mut two = elect(&b, "leader", "two", "2");
    std::thread::sleep(Duration::from_millis(800));
    assert!(!two.stdout().contains("two"), "two leaders\n{}", two.said());

    // Ctrl-C resigns: two is elected at once.
    one.signal(libc::SIGINT);
    let resigned = Instant::now();
    two.expect_stdout("two", T);
    let after_resign = resigned.elapsed();
    assert_eq!(one.wait_exit(T), 0, "{}", one.said());
    listen.expect_stdout("two", T);

    // kill -9: no resign; three is elected when two's 2 s lease expires, not before.
    let mut three = elect(&b, "leader", "three", "2");
    std::thread::sleep(Duration::from_millis(300));
    two.signal(libc::SIGKILL);
    let killed = Instant::now();
    three.expect_stdout("three", T);
    let after_kill = killed.elapsed();
    assert!(
        after_kill >= Duration::from_millis(1000) && after_kill < Duration::from_secs(6),
        "elected {after_kill:?} after the kill of a leader with a 2 s lease"
    );
    listen.expect_stdout("three", T);
    etcd_listen.expect_stdout("three", T);

    // Leadership lost under the leader (its lease revoked): exit 75.
    let lease_hex = three
        .stdout()
        .lines()
        .next()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    rpc.revoke(i64::from_str_radix(&lease_hex, 16).unwrap());
    assert_eq!(three.wait_exit(T), EXIT_LOST, "{}", three.said());
    assert!(
        three.stderr().contains("LOST leadership"),
        "{}",
        three.said()
    );

    let values: Vec<String> = listen
        .stdout()
        .lines()
        .filter(|l| !l.starts_with("leader/"))
        .map(String::from)
        .collect();
    assert_eq!(values, ["one", "two", "three"], "{}", listen.said());
    eprintln!("hand-over after resign {after_resign:?}, after kill -9 {after_kill:?}");
    kill(listen.pid(), libc::SIGINT);
    assert_eq!(listen.wait_exit(T), 0, "{}", listen.said());
}
