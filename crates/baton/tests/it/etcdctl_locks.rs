//! etcdctl's own lock and election recipes against Baton.
//!
//! `etcdctl lock` and `etcdctl elect` (Debian's etcdctl 3.4) do not use the v3lock or
//! v3election services: they run etcd's client-side `concurrency` recipes over Lease, Txn,
//! sorted Range and Watch. So these tests show that Baton's KV, lease and watch semantics are
//! close enough to etcd's for those recipes to stay correct: one holder at a time, FIFO
//! hand-over, and hand-over when a holder dies (its lease expires).
//!
//! About "hands over on kill" for `etcdctl elect`: etcdctl 3.4's elect has no `--ttl` (its
//! session lease is a fixed 60 s), so after `kill -9` of the leader the hand-over happens when
//! that lease runs out, about a minute later; the test waits for it, checking first that
//! nobody renews the dead leader's lease and nobody else leads while it lasts.

use std::time::{Duration, Instant};

use crate::common::{descendants, etcdctl, etcdctl_cmd, kill, Baton, Proc};

const T: Duration = Duration::from_secs(10);

/// The value of `NAME=value` in a command's output.
fn var(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} not in {text:?}"))
        .to_string()
}

#[test]
fn etcdctl_lock_excludes_a_second_etcdctl_lock() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let release = dir.path().join("release");

    let mut first = etcdctl_cmd(&b.endpoint());
    first.args(["lock", "jobs", "--", "sh", "-c"]).arg(format!(
        "echo ETCD_LOCK_REV=$ETCD_LOCK_REV; echo first-in; \
         while [ ! -e {} ]; do sleep 0.02; done; echo first-out",
        release.display()
    ));
    let mut first = Proc::spawn("first etcdctl lock", first);
    first.expect_stdout("first-in", T);

    let mut second = etcdctl_cmd(&b.endpoint());
    second
        .args(["lock", "jobs", "--", "sh", "-c"])
        .arg("echo ETCD_LOCK_REV=$ETCD_LOCK_REV; echo second-in");
    let mut second = Proc::spawn("second etcdctl lock", second);

    // While the first holds the lock, the second must wait (and keep waiting).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !second.stdout().contains("second-in") && second.try_status().is_none(),
        "the second etcdctl lock got in while the first held the lock\n{}\n{}",
        first.said(),
        second.said()
    );

    // The first's command exits: etcdctl unlocks and the second gets the lock at once.
    std::fs::write(&release, b"").unwrap();
    let released = Instant::now();
    assert_eq!(first.wait_exit(T), 0, "{}", first.said());
    second.expect_stdout("second-in", T);
    let handover = released.elapsed();
    assert_eq!(second.wait_exit(T), 0, "{}", second.said());
    assert!(
        first.stdout().contains("first-out"),
        "the first ran to completion: {}",
        first.said()
    );
    let (rev1, rev2): (i64, i64) = (
        var(&first.stdout(), "ETCD_LOCK_REV").parse().unwrap(),
        var(&second.stdout(), "ETCD_LOCK_REV").parse().unwrap(),
    );
    assert!(
        rev2 > rev1,
        "the second holder's key is newer: {rev1} then {rev2}"
    );
    eprintln!("hand-over after the first's command exited: {handover:?}");

    // Nothing is left behind under the lock's prefix.
    let left = etcdctl(&b.endpoint(), &["get", "--prefix", "jobs"], None);
    assert_eq!(left.stdout, "", "{left:?}");
}

#[test]
fn etcdctl_lock_holder_killed_hands_over_after_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));

    let mut first = etcdctl_cmd(&b.endpoint());
    first
        .args(["lock", "--ttl", "2", "jobs", "--", "sh", "-c"])
        .arg("echo first-in; exec sleep 60");
    let mut first = Proc::spawn("first etcdctl lock --ttl 2", first);
    first.expect_stdout("first-in", T);

    let mut second = etcdctl_cmd(&b.endpoint());
    second
        .args(["lock", "--ttl", "2", "jobs", "--", "sh", "-c"])
        .arg("echo second-in");
    let mut second = Proc::spawn("second etcdctl lock", second);
    std::thread::sleep(Duration::from_millis(500));
    assert!(!second.stdout().contains("second-in"), "{}", second.said());

    // kill -9 the holder (and its `sleep`, which would otherwise linger): no unlock, no
    // revoke; only the lease running out can free the lock.
    let family = descendants(first.pid());
    first.signal(libc::SIGKILL);
    for p in family {
        kill(p, libc::SIGKILL);
    }
    let killed = Instant::now();
    second.expect_stdout("second-in", T);
    let waited = killed.elapsed();
    assert_eq!(second.wait_exit(T), 0, "{}", second.said());
    // etcd's client renews every TTL/3, so the lease had between 2 s − 0.67 s and 2 s left
    // at the kill. Handing over earlier would mean two holders.
    assert!(
        waited >= Duration::from_millis(1200),
        "handed over {waited:?} after the kill, before the 2 s lease could have expired"
    );
    assert!(
        waited < Duration::from_secs(6),
        "handed over only {waited:?} after the kill"
    );
    eprintln!("hand-over {waited:?} after kill -9 of a holder with a 2 s lease");
}

/// The id (hex) of the lease behind the current leader's key of `election`.
fn leader_lease(endpoint: &str, election: &str) -> String {
    let out = etcdctl(
        endpoint,
        &[
            "get",
            "--prefix",
            election,
            "--sort-by=CREATE",
            "-w",
            "fields",
        ],
        None,
    );
    let lease: i64 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("\"Lease\" : "))
        .unwrap_or_else(|| panic!("no candidates in {out:?}"))
        .trim()
        .parse()
        .unwrap();
    format!("{lease:x}")
}

/// Remaining seconds of a lease, from `etcdctl lease timetolive`.
fn remaining(endpoint: &str, lease_hex: &str) -> i64 {
    let out = etcdctl(endpoint, &["lease", "timetolive", lease_hex], None);
    let re = regex::Regex::new(r"remaining\((-?\d+)s\)").unwrap();
    re.captures(&out.stdout)
        .unwrap_or_else(|| panic!("{out:?}"))[1]
        .parse()
        .unwrap()
}

#[test]
fn etcdctl_elect_elects_one_and_hands_over_on_resign_and_on_kill() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let ep = b.endpoint();

    let mut listen = etcdctl_cmd(&ep);
    listen.args(["elect", "--listen", "leader"]);
    let mut listen = Proc::spawn("etcdctl elect --listen", listen);

    let mut one = etcdctl_cmd(&ep);
    one.args(["elect", "leader", "one"]);
    let mut one = Proc::spawn("candidate one", one);
    one.expect_stdout("one", T);
    listen.expect_stdout("one", T);

    let mut two = etcdctl_cmd(&ep);
    two.args(["elect", "leader", "two"]);
    let mut two = Proc::spawn("candidate two", two);
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        !two.stdout().contains("two"),
        "two leaders at once\n{}\n{}",
        one.said(),
        two.said()
    );

    // Resign: Ctrl-C makes etcdctl resign (delete its key); two takes over at once.
    one.signal(libc::SIGINT);
    let resigned = Instant::now();
    two.expect_stdout("two", T);
    let after_resign = resigned.elapsed();
    listen.expect_stdout("two", T);
    one.wait_exit(T);

    // Kill: kill -9 leaves the leader key behind with its lease.
    let mut three = etcdctl_cmd(&ep);
    three.args(["elect", "leader", "three"]);
    let mut three = Proc::spawn("candidate three", three);
    std::thread::sleep(Duration::from_millis(500));
    let lease = leader_lease(&ep, "leader");
    two.signal(libc::SIGKILL);
    two.wait_exit(T);
    let before = remaining(&ep, &lease);
    std::thread::sleep(Duration::from_millis(3000));
    let after = remaining(&ep, &lease);
    assert!(
        !three.stdout().contains("three"),
        "three became leader while the killed leader's lease was still valid\n{}",
        three.said()
    );
    assert!(
        after <= before - 2,
        "nobody renews the dead leader's lease: remaining {before} s, then {after} s 3 s later"
    );
    assert!(
        after > 40,
        "etcdctl elect's session lease is 60 s; {after} s left"
    );
    // Now the real expiry: nobody renews the lease, Baton's lease clock expires it, the
    // key goes, and etcdctl's waiter (watching its predecessor) takes over.
    let waiting = Instant::now();
    three.expect_stdout("three", Duration::from_secs(after as u64 + 10));
    let after_expiry = waiting.elapsed();
    assert!(
        after_expiry + Duration::from_secs(1) >= Duration::from_secs(after as u64),
        "three became leader {after_expiry:?} after the check, before the {after} s left on the killed leader's lease ran out"
    );
    listen.expect_stdout("three", T);

    let values: Vec<String> = listen
        .stdout()
        .lines()
        .filter(|l| !l.starts_with("leader/"))
        .map(String::from)
        .collect();
    assert_eq!(values, ["one", "two", "three"], "{}", listen.said());
    eprintln!(
        "hand-over after resign: {after_resign:?}; after the killed leader's lease ended: \
         {after_expiry:?}"
    );
}
