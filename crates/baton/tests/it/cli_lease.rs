//! `baton lease grant|revoke|keep-alive|timetolive|list` against a real `baton serve`,
//! each output format checked (tables by their rows, JSON parsed).

use std::time::Duration;

use crate::common::{baton, baton_cmd, baton_json, baton_ok, table_row, Baton, Proc};
use serde_json::Value;

const T: Duration = Duration::from_secs(10);

fn server() -> (tempfile::TempDir, Baton) {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    (dir, b)
}

#[test]
fn grant_inspect_list_and_revoke_in_every_format() {
    let (_d, b) = server();
    let e = &b.endpoint();

    // grant: a sentence, the bare id (for `$(…)`), or JSON.
    let sentence = baton_ok(e, &["lease", "grant", "60"]);
    let a = sentence
        .trim()
        .strip_prefix("lease ")
        .and_then(|s| s.strip_suffix(" granted with TTL 60s"))
        .unwrap_or_else(|| panic!("{sentence:?}"))
        .to_string();
    let b_id = baton_ok(e, &["lease", "grant", "1m", "-o", "simple"])
        .trim()
        .to_string();
    assert!(i64::from_str_radix(&b_id, 16).is_ok(), "{b_id:?}");
    let j = baton_json(e, &["lease", "grant", "30"]);
    let c = j["id"].as_str().unwrap().to_string();
    assert_eq!(j["ttl"], 30);

    baton_ok(e, &["kv", "put", "svc/a", "1", "--lease", &a]);
    baton_ok(e, &["kv", "put", "svc/b", "2", "--lease", &a]);

    // timetolive: table, simple, JSON; --keys adds the attached keys.
    let table = baton_ok(e, &["lease", "timetolive", &a, "--keys"]);
    assert!(table.starts_with("ID"), "{table}");
    let row = table_row(&table, &a);
    assert!(["60s", "59s"].contains(&row[1].as_str()), "{row:?}");
    assert_eq!(row[2], "60s");
    assert_eq!(row[3], "svc/a, svc/b");
    let simple = baton_ok(e, &["lease", "ttl", &a, "--keys", "-o", "simple"]);
    let lines: Vec<&str> = simple.lines().collect();
    assert!(lines[0].starts_with(&format!("{a}\t")) && lines[0].ends_with("\t60"));
    assert_eq!(&lines[1..], ["svc/a", "svc/b"]);
    let j = baton_json(e, &["lease", "timetolive", &a, "--keys"]);
    assert_eq!(j["id"], a.as_str());
    assert_eq!(j["granted_ttl"], 60);
    assert_eq!(j["keys"], serde_json::json!(["svc/a", "svc/b"]));
    assert!(j["ttl"].as_i64().unwrap() > 50);
    let j = baton_json(e, &["lease", "timetolive", &c]);
    assert!(j.get("keys").is_none(), "{j}");

    // list: every lease with TTLs and key counts.
    let table = baton_ok(e, &["lease", "list"]);
    assert_eq!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["ID", "TTL", "GRANTED", "KEYS"]
    );
    assert_eq!(table_row(&table, &a)[3], "2");
    assert_eq!(table_row(&table, &c)[2], "30s");
    let j = baton_json(e, &["lease", "list"]);
    assert_eq!(j["count"], 3);
    let ids: Vec<&str> = j["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    for id in [&a, &b_id, &c] {
        assert!(ids.contains(&id.as_str()), "{id} in {ids:?}");
    }
    let simple = baton_ok(e, &["lease", "list", "-o", "simple"]);
    assert!(
        simple
            .lines()
            .any(|l| l.starts_with(&format!("{a}\t")) && l.ends_with("\t60\t2")),
        "{simple}"
    );

    // revoke: the keys go with the lease; a second revoke is an error.
    assert_eq!(
        baton_ok(e, &["lease", "revoke", &a]),
        format!("lease {a} revoked\n")
    );
    assert_eq!(
        baton_json(e, &["kv", "get", "svc/", "--prefix"])["count"],
        0
    );
    let again = baton(e, &["lease", "revoke", &a], None);
    assert_eq!(again.code, 1);
    assert_eq!(
        again.stderr,
        format!("baton lease revoke: lease {a} not found (it expired or was revoked)\n")
    );
    let j = baton_json(e, &["lease", "revoke", &c]);
    assert_eq!(j, serde_json::json!({"id": c, "revoked": true}));
    let gone = baton(e, &["lease", "timetolive", &c], None);
    assert_eq!(gone.code, 1);
    assert!(gone.stderr.contains("not found"), "{gone:?}");
    let bad = baton(e, &["lease", "revoke", "not-hex"], None);
    assert_eq!(bad.code, 2, "a usage error: {bad:?}");
}

#[test]
fn keep_alive_renews_until_interrupted_and_fails_once_the_lease_is_gone() {
    let (_d, b) = server();
    let e = &b.endpoint();
    let id = baton_ok(e, &["lease", "grant", "3", "-o", "simple"])
        .trim()
        .to_string();

    let once = baton_json(e, &["lease", "keep-alive", &id, "--once"]);
    assert_eq!(once, serde_json::json!({"id": id, "ttl": 3}));

    // Renewals every TTL/3 (1 s): two lines within a few seconds, then Ctrl-C exits 0.
    let mut cmd = baton_cmd();
    cmd.env("BATON_ENDPOINTS", e)
        .args(["lease", "keep-alive", &id, "-o", "simple"]);
    let mut keeper = Proc::spawn("keep-alive", cmd);
    let line = format!("{id}\t3\n");
    keeper.expect_stdout(&line.repeat(2), T);
    keeper.signal(libc::SIGINT);
    assert_eq!(keeper.wait_exit(T), 0, "{}", keeper.said());

    // A keep-alive that outlives its lease fails with one line.
    let mut cmd = baton_cmd();
    cmd.env("BATON_ENDPOINTS", e)
        .args(["lease", "keep-alive", &id]);
    let mut keeper = Proc::spawn("keep-alive", cmd);
    keeper.expect_stdout(&format!("lease {id} kept alive, TTL 3s\n"), T);
    baton_ok(e, &["lease", "revoke", &id]);
    assert_eq!(keeper.wait_exit(T), 1, "{}", keeper.said());
    assert_eq!(
        keeper.stderr(),
        format!("baton lease keep-alive: lease {id} expired or was revoked\n")
    );
    let j: Value =
        serde_json::from_str(&baton(e, &["lease", "list", "-o", "json"], None).stdout).unwrap();
    assert_eq!(j["count"], 0);
}
