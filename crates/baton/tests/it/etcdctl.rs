//! Compatibility through a client nobody here wrote: Debian's `etcdctl` 3.4.
//!
//! Each scenario runs the same etcdctl commands against a real etcd 3.4 (Debian's
//! `etcd-server`) and against Baton, and requires the same output after normalising what
//! legitimately differs (lease ids, member ids, timings). etcd's output *is* the expected
//! text; a few key lines are also asserted literally so a shared mistake cannot pass.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{etcdctl, Baton, Etcd, Out};
use regex::Regex;

/// One server under test with the variables its script captured (lease ids).
struct Target {
    endpoint: String,
    vars: HashMap<String, String>,
}

impl Target {
    fn expand(&self, s: &str) -> String {
        let mut s = s.to_string();
        for (k, v) in &self.vars {
            s = s.replace(&format!("{{{k}}}"), v);
        }
        s
    }

    /// Runs one step; `capture` names a variable taken from "lease <hex> granted".
    fn run(&mut self, args: &[&str], stdin: Option<&str>, capture: Option<&str>) -> Out {
        let args: Vec<String> = args.iter().map(|a| self.expand(a)).collect();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = etcdctl(&self.endpoint, &argv, stdin);
        if let Some(name) = capture {
            let re = Regex::new(r"lease ([0-9a-f]+) granted").unwrap();
            let id = re
                .captures(&out.stdout)
                .unwrap_or_else(|| panic!("no lease id in {out:?}"))[1]
                .to_string();
            self.vars.insert(name.to_string(), id);
        }
        out
    }

    /// Replaces this target's ids and timings with placeholders.
    fn normalize(&self, out: &Out) -> String {
        let mut text = format!("exit={}\n--stdout--\n{}--stderr--\n", out.code, out.stdout);
        for line in out.stderr.lines() {
            // etcdctl 3.4 logs retries as JSON with timestamps; the final "Error:" line is
            // what users see.
            if line.starts_with("{\"level\"") {
                continue;
            }
            text.push_str(line);
            text.push('\n');
        }
        for (k, v) in &self.vars {
            text = text.replace(v.as_str(), &format!("<{k}>"));
            if let Ok(dec) = i64::from_str_radix(v, 16) {
                text = text.replace(&dec.to_string(), &format!("<{k}>"));
            }
        }
        let rules = [
            (r#""cluster_id":\d+"#, r#""cluster_id":C"#),
            (r#""member_id":\d+"#, r#""member_id":M"#),
            (r#""raft_term":\d+"#, r#""raft_term":T"#),
            (r"remaining\(\d+s\)", "remaining(Ns)"),
            (r"took = [^\s]+", "took = X"),
            (r"127\.0\.0\.1:\d+", "ENDPOINT"),
        ];
        for (pat, rep) in rules {
            text = Regex::new(pat)
                .unwrap()
                .replace_all(&text, rep)
                .into_owned();
        }
        // etcd lists a lease's keys in Go map order (random); compare them as a set.
        Regex::new(r"attached keys\(\[([^\]]*)\]\)")
            .unwrap()
            .replace_all(&text, |c: &regex::Captures| {
                let mut keys: Vec<&str> = c[1].split(' ').collect();
                keys.sort_unstable();
                format!("attached keys([{}])", keys.join(" "))
            })
            .into_owned()
    }
}

struct Pair {
    etcd: Target,
    baton: Target,
    _etcd_proc: Etcd,
    _baton_proc: Baton,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn start() -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let baton = Baton::start(&dir.path().join("baton"));
        let etcd = Etcd::start();
        Pair {
            etcd: Target {
                endpoint: etcd.endpoint(),
                vars: HashMap::new(),
            },
            baton: Target {
                endpoint: baton.endpoint(),
                vars: HashMap::new(),
            },
            _etcd_proc: etcd,
            _baton_proc: baton,
            _dir: dir,
        }
    }

    /// Runs a step on both and requires identical normalised output. Returns Baton's.
    fn same(&mut self, args: &[&str], stdin: Option<&str>, capture: Option<&str>) -> Out {
        let e = self.etcd.run(args, stdin, capture);
        let b = self.baton.run(args, stdin, capture);
        let (en, bn) = (self.etcd.normalize(&e), self.baton.normalize(&b));
        assert_eq!(
            en, bn,
            "etcdctl {args:?} differs\n=== etcd 3.4 ===\n{en}\n=== baton ===\n{bn}"
        );
        b
    }
}

#[test]
fn kv_commands_match_etcd() {
    let mut p = Pair::start();
    assert_eq!(p.same(&["put", "foo", "bar"], None, None).stdout, "OK\n");
    p.same(&["put", "foo1", "bar1"], None, None);
    p.same(&["put", "foo2", "bar2"], None, None);
    p.same(&["put", "zoo", "z"], None, None);
    p.same(&["put", "foo", "bar-v2", "--prev-kv"], None, None);
    assert_eq!(p.same(&["get", "foo"], None, None).stdout, "foo\nbar-v2\n");
    assert_eq!(
        p.same(&["get", "foo", "--prefix"], None, None).stdout,
        "foo\nbar-v2\nfoo1\nbar1\nfoo2\nbar2\n"
    );
    p.same(&["get", "foo", "--prefix", "--limit=2"], None, None);
    p.same(&["get", "foo", "--prefix", "--keys-only"], None, None);
    p.same(
        &[
            "get",
            "foo",
            "--prefix",
            "--sort-by=MODIFY",
            "--order=DESCEND",
        ],
        None,
        None,
    );
    p.same(
        &[
            "get",
            "foo",
            "--prefix",
            "--sort-by=CREATE",
            "--order=ASCEND",
        ],
        None,
        None,
    );
    p.same(
        &[
            "get",
            "foo",
            "--prefix",
            "--sort-by=VALUE",
            "--order=DESCEND",
            "--limit=2",
        ],
        None,
        None,
    );
    p.same(&["get", "foo", "--prefix", "--order=DESCEND"], None, None);
    assert_eq!(
        p.same(&["get", "foo", "--rev=2"], None, None).stdout,
        "foo\nbar\n"
    );
    p.same(&["get", "foo", "--prefix", "--rev=3"], None, None);
    p.same(&["get", "foo1", "zoo"], None, None);
    p.same(&["get", "--from-key", "foo1"], None, None);
    p.same(&["get", "", "--prefix", "--keys-only"], None, None);
    p.same(&["get", "foo", "-w", "json"], None, None);
    p.same(
        &["get", "foo", "--prefix", "--count-only", "-w", "json"],
        None,
        None,
    );
    p.same(
        &["get", "foo", "--prefix", "--limit=1", "-w", "json"],
        None,
        None,
    );
    p.same(&["get", "foo", "--consistency=s"], None, None);
    p.same(&["get", "nothing"], None, None);
    p.same(&["put", "", "x"], None, None);
    assert_eq!(p.same(&["del", "foo1"], None, None).stdout, "1\n");
    p.same(&["del", "foo", "--prefix", "--prev-kv"], None, None);
    assert_eq!(p.same(&["del", "nothing"], None, None).stdout, "0\n");
    // Deleting nothing did not bump the revision: the next put's revision shows it.
    p.same(&["put", "rev-probe", "x", "-w", "json"], None, None);

    let txn_ok = "value(\"zoo\") = \"z\"\n\nput foo3 bar3\nget zoo\n\nput foo3 nope\n\n";
    let out = p.same(&["txn"], Some(txn_ok), None);
    assert_eq!(out.stdout, "SUCCESS\n\nOK\n\nzoo\nz\n");
    let txn_fail = "mod(\"zoo\") > \"1000\"\n\nput foo4 never\n\nput foo5 fallback\ndel foo3\n\n";
    let out = p.same(&["txn"], Some(txn_fail), None);
    assert!(out.stdout.starts_with("FAILURE\n"), "{out:?}");
    p.same(
        &["txn", "-w", "json"],
        Some("create(\"foo5\") > \"0\"\n\nget foo5\n\n\n"),
        None,
    );
    p.same(
        &["txn"],
        Some("version(\"zoo\") = \"1\"\n\nput a 1\nput a 2\n\n\n"),
        None,
    );

    p.same(&["compaction", "5"], None, None);
    let out = p.same(&["get", "foo", "--rev=3"], None, None);
    assert!(out
        .stderr
        .contains("etcdserver: mvcc: required revision has been compacted"));
    let out = p.same(&["get", "foo", "--rev=1000"], None, None);
    assert!(out
        .stderr
        .contains("etcdserver: mvcc: required revision is a future revision"));
    p.same(&["compaction", "3"], None, None);
    p.same(&["get", "zoo", "--rev=5"], None, None);
}

#[test]
fn lease_commands_match_etcd() {
    let mut p = Pair::start();
    let out = p.same(&["lease", "grant", "100"], None, Some("L"));
    assert!(out.stdout.ends_with("granted with TTL(100s)\n"), "{out:?}");
    p.same(&["put", "lk", "lv", "--lease={L}"], None, None);
    p.same(&["put", "lk2", "lv2", "--lease={L}"], None, None);
    p.same(&["lease", "timetolive", "{L}", "--keys"], None, None);
    p.same(&["lease", "timetolive", "{L}"], None, None);
    p.same(&["lease", "list"], None, None);
    p.same(&["lease", "keep-alive", "--once", "{L}"], None, None);
    p.same(&["put", "lk", "v2", "--ignore-lease"], None, None);
    p.same(&["put", "lk", "--ignore-value", "--lease={L}"], None, None);
    p.same(&["get", "lk"], None, None);
    p.same(&["lease", "revoke", "{L}"], None, None);
    p.same(&["get", "lk", "--prefix"], None, None);
    p.same(&["lease", "timetolive", "{L}"], None, None);
    p.same(&["lease", "revoke", "{L}"], None, None);
    p.same(&["lease", "keep-alive", "--once", "{L}"], None, None);
    p.same(&["put", "k", "v", "--lease=1234abcd"], None, None);
    p.same(&["put", "missing", "--ignore-value"], None, None);
    p.same(&["lease", "list"], None, None);

    // A key on a short lease is removed when the lease expires without keep-alives.
    p.same(&["lease", "grant", "2"], None, Some("S"));
    p.same(&["put", "short", "lived", "--lease={S}"], None, None);
    assert_eq!(
        p.same(&["get", "short"], None, None).stdout,
        "short\nlived\n"
    );
    std::thread::sleep(Duration::from_millis(3500));
    assert_eq!(p.same(&["get", "short"], None, None).stdout, "");
    p.same(&["lease", "timetolive", "{S}"], None, None);
}

/// Runs `etcdctl watch ARGS` for `duration` while `during` runs, and returns its stdout.
fn watch_output(
    endpoint: &str,
    args: &[&str],
    during: impl FnOnce(),
    duration: Duration,
) -> String {
    let mut child = Command::new("/usr/bin/etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .arg("watch")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcdctl watch");
    std::thread::sleep(Duration::from_millis(700));
    during();
    std::thread::sleep(duration);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn watch_matches_etcd() {
    let p = Pair::start();
    for t in [&p.etcd, &p.baton] {
        for (k, v) in [("w/a", "1"), ("w/b", "2"), ("other", "x")] {
            assert_eq!(etcdctl(&t.endpoint, &["put", k, v], None).code, 0);
        }
    }
    let mut outputs = Vec::new();
    for t in [&p.etcd, &p.baton] {
        let ep = t.endpoint.clone();
        let live = watch_output(
            &t.endpoint,
            &["w/", "--prefix", "--prev-kv"],
            || {
                for args in [
                    vec!["put", "w/a", "1b"],
                    vec!["put", "other", "y"],
                    vec!["del", "w/b"],
                    vec!["put", "w/c", "3"],
                ] {
                    assert_eq!(etcdctl(&ep, &args, None).code, 0);
                }
            },
            Duration::from_millis(700),
        );
        let history = watch_output(
            &t.endpoint,
            &["--rev=2", "w/", "--prefix"],
            || {},
            Duration::from_millis(300),
        );
        let single = watch_output(
            &t.endpoint,
            &["--rev=1", "other"],
            || {},
            Duration::from_millis(300),
        );
        outputs.push((live, history, single));
    }
    let (etcd, baton) = (&outputs[0], &outputs[1]);
    assert_eq!(
        etcd.0, "PUT\nw/a\n1\nw/a\n1b\nDELETE\nw/b\n2\nw/b\n\nPUT\nw/c\n3\n",
        "etcd's own live watch output changed?"
    );
    assert_eq!(etcd, baton, "watch output differs (etcd first)");
}

#[test]
fn endpoint_status_and_member_list() {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::start(&dir.path().join("baton"));
    let ep = baton.endpoint();

    let out = etcdctl(&ep, &["member", "list"], None);
    assert_eq!(out.code, 0, "{out:?}");
    let re = Regex::new(r"^[0-9a-f]+, started, default, http://127\.0\.0\.1:(\d+), http://127\.0\.0\.1:(\d+), false\n$").unwrap();
    let caps = re
        .captures(&out.stdout)
        .unwrap_or_else(|| panic!("member list: {out:?}"));
    assert_eq!(caps[1].parse::<u16>().unwrap(), baton.peer_port);
    assert_eq!(caps[2].parse::<u16>().unwrap(), baton.client_port);
    let member_hex = out.stdout.split(',').next().unwrap().to_string();

    etcdctl(&ep, &["put", "a", "1"], None);
    let out = etcdctl(&ep, &["endpoint", "status", "-w", "json"], None);
    assert_eq!(out.code, 0, "{out:?}");
    let member_id = u64::from_str_radix(&member_hex, 16).unwrap();
    assert!(
        out.stdout.contains(&format!("\"member_id\":{member_id}")),
        "{out:?}"
    );
    assert!(
        out.stdout.contains(&format!("\"leader\":{member_id}")),
        "{out:?}"
    );
    assert!(out.stdout.contains("\"revision\":2"), "{out:?}");

    let out = etcdctl(&ep, &["endpoint", "status", "-w", "table"], None);
    assert_eq!(out.code, 0, "{out:?}");
    let row = out
        .stdout
        .lines()
        .find(|l| l.contains(&ep))
        .expect("a row for the endpoint");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // | ENDPOINT | ID | VERSION | DB SIZE | IS LEADER | IS LEARNER | RAFT TERM | RAFT INDEX | RAFT APPLIED INDEX | ERRORS |
    assert_eq!(cells[2], member_hex, "{row}");
    assert_eq!(cells[5], "true", "IS LEADER: {row}");
    assert_eq!(cells[6], "false", "IS LEARNER: {row}");

    // etcdctl 3.4 prints the health line on stderr.
    let out = etcdctl(&ep, &["endpoint", "health"], None);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr
            .contains("is healthy: successfully committed proposal"),
        "{out:?}"
    );
}

/// A member stops on SIGTERM although clients hold streams that never end by themselves
/// (a watch): they get `baton_server::SHUTDOWN_GRACE` to finish, then the connections close.
/// Without the bound the member waited for the watcher to go away, and an operator (or
/// etcd's e2e suite, restarting a member) had to kill it.
#[test]
fn sigterm_stops_the_member_despite_open_watches() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = crate::common::Baton::start(dir.path());
    let mut watch = crate::common::etcdctl_cmd(&b.endpoint())
        .args(["watch", "forever"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let asked = std::time::Instant::now();
    let status = b.terminate();
    let took = asked.elapsed();
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(status.success(), "{status:?}: {}", b.log());
    assert!(
        took < std::time::Duration::from_secs(6),
        "stopping took {took:?}"
    );
}
