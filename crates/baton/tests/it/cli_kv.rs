//! `baton kv get|put|del|watch|txn` as a user runs them: the real binary against a real
//! `baton serve`, each output format checked (tables by their rows, JSON parsed).

use crate::common;

use std::time::Duration;

use crate::common::{baton, baton_cmd, baton_json, baton_ok, table_row, Baton, Proc};
use serde_json::Value;

const T: Duration = Duration::from_secs(10);

fn server() -> (tempfile::TempDir, Baton) {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    (dir, b)
}

/// The revision a `kv put` reports in JSON.
fn put(e: &str, key: &str, value: &str) -> i64 {
    baton_json(e, &["kv", "put", key, value])["revision"]
        .as_i64()
        .unwrap()
}

#[test]
fn put_get_and_del_in_every_format() {
    let (_d, b) = server();
    let e = &b.endpoint();

    // put: a sentence, the bare revision, or JSON.
    let out = baton_ok(e, &["kv", "put", "greeting", "hello"]);
    let r1: i64 = out
        .trim()
        .strip_prefix("OK (revision ")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{out:?}"))
        .parse()
        .unwrap();
    let r2: i64 = baton_ok(e, &["kv", "put", "greet/b", "-1", "-o", "simple"])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(r2, r1 + 1, "a value may start with a dash");
    let r3 = put(e, "greeting", "hi");
    assert_eq!(r3, r2 + 1);

    // get, table: header, one aligned row per key, a summary with the revision.
    let table = baton_ok(e, &["kv", "get", "greet", "--prefix"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(
        lines[0].starts_with("KEY") && lines[0].contains("VALUE") && lines[0].ends_with("LEASE"),
        "{table}"
    );
    assert_eq!(
        table_row(&table, "greeting"),
        [
            "greeting",
            "hi",
            r1.to_string().as_str(),
            r3.to_string().as_str(),
            "2",
            "-"
        ]
    );
    assert_eq!(table_row(&table, "greet/b")[1], "-1");
    // Columns line up: every VALUE cell starts where the header's does.
    let col = lines[0].find("VALUE").unwrap();
    assert_eq!(&lines[1][col..col + 2], "-1");
    assert_eq!(&lines[2][col..col + 2], "hi");
    assert_eq!(lines[3], format!("(2 keys at revision {r3})"));

    // get, simple: key<TAB>value lines; keys-only: keys.
    assert_eq!(
        baton_ok(e, &["kv", "get", "greet", "--prefix", "-o", "simple"]),
        "greet/b\t-1\ngreeting\thi\n"
    );
    assert_eq!(
        baton_ok(
            e,
            &[
                "kv",
                "get",
                "greet",
                "--prefix",
                "--keys-only",
                "-w",
                "simple"
            ]
        ),
        "greet/b\ngreeting\n"
    );

    // get, JSON.
    let j = baton_json(e, &["kv", "get", "greet", "--prefix"]);
    assert_eq!(j["revision"], r3);
    assert_eq!(j["count"], 2);
    assert_eq!(j["more"], false);
    let greeting = &j["kvs"][1];
    assert_eq!(greeting["key"], "greeting");
    assert_eq!(greeting["value"], "hi");
    assert_eq!(greeting["create_revision"], r1);
    assert_eq!(greeting["mod_revision"], r3);
    assert_eq!(greeting["version"], 2);
    assert_eq!(greeting["lease"], Value::Null);
    let keys_only = baton_json(e, &["kv", "get", "greeting", "--keys-only"]);
    assert!(keys_only["kvs"][0].get("value").is_none(), "{keys_only}");

    // Older revisions, limits, sorting, ranges.
    let old = baton_json(e, &["kv", "get", "greeting", "--rev", &r1.to_string()]);
    assert_eq!(old["kvs"][0]["value"], "hello");
    let limited = baton_ok(e, &["kv", "get", "greet", "--prefix", "--limit", "1"]);
    assert!(
        limited.ends_with(&format!(
            "(1 of 2 keys at revision {r3}; raise --limit to see more)\n"
        )),
        "{limited}"
    );
    let limited = baton_json(e, &["kv", "get", "greet", "--prefix", "--limit", "1"]);
    assert_eq!(
        (limited["more"].clone(), limited["count"].clone()),
        (true.into(), 2.into())
    );
    let by_mod = baton_json(
        e,
        &[
            "kv",
            "get",
            "greet",
            "--prefix",
            "--sort-by",
            "mod",
            "--order",
            "desc",
        ],
    );
    assert_eq!(by_mod["kvs"][0]["key"], "greeting");
    assert_eq!(by_mod["kvs"][1]["key"], "greet/b");
    let from = baton_json(e, &["kv", "get", "greeting", "--from-key", "--keys-only"]);
    assert_eq!(from["count"], 1);
    let range = baton_json(e, &["kv", "get", "greet/", "greet0"]);
    assert_eq!(range["kvs"][0]["key"], "greet/b");
    assert_eq!(
        baton_ok(
            e,
            &[
                "kv",
                "get",
                "greet",
                "--prefix",
                "--count-only",
                "-o",
                "simple"
            ]
        ),
        "2\n"
    );
    assert_eq!(
        baton_ok(e, &["kv", "get", "missing"]),
        format!("(0 keys at revision {r3})\n")
    );
    assert_eq!(
        baton_ok(e, &["kv", "get", "missing", "-o", "simple"]),
        "",
        "no keys: no lines"
    );

    // Values from stdin keep every byte; JSON shows what is not UTF-8 as base64.
    let out = baton(e, &["kv", "put", "bin"], Some(b"\xff\x00line\n"));
    assert_eq!(out.code, 0, "{out:?}");
    let bin = baton_json(e, &["kv", "get", "bin"]);
    assert_eq!(bin["kvs"][0]["value_base64"], "/wBsaW5lCg==");
    assert_eq!(
        baton_ok(e, &["kv", "get", "bin", "-o", "simple"]),
        "bin\t\\xff\\x00line\\n\n",
        "simple output escapes control characters"
    );

    // del: table with the deleted pairs, simple count, JSON.
    let del = baton_ok(e, &["kv", "del", "greet", "--prefix", "--prev-kv"]);
    let r4 = r3 + 2; // the binary put, then this delete
    assert!(
        del.starts_with(&format!("deleted 2 keys (revision {r4})\nKEY")),
        "{del}"
    );
    assert_eq!(table_row(&del, "greeting")[1], "hi");
    assert_eq!(
        baton_ok(e, &["kv", "del", "nothing", "-o", "simple"]),
        "0\n"
    );
    put(e, "x/1", "a");
    let j = baton_json(e, &["kv", "delete", "x/", "--prefix", "--prev-kv"]);
    assert_eq!(j["deleted"], 1);
    assert_eq!(j["prev_kvs"][0]["value"], "a");
}

#[test]
fn put_with_a_lease_shows_it_in_hex() {
    let (_d, b) = server();
    let e = &b.endpoint();
    let lease = baton_ok(e, &["lease", "grant", "30", "-o", "simple"]);
    let lease = lease.trim();
    baton_ok(e, &["kv", "put", "eph", "x", "--lease", lease]);
    let j = baton_json(e, &["kv", "get", "eph"]);
    assert_eq!(j["kvs"][0]["lease"], lease);
    let table = baton_ok(e, &["kv", "get", "eph"]);
    assert_eq!(table_row(&table, "eph")[5], lease);
}

#[test]
fn txn_in_etcdctls_format_and_as_json() {
    let (_d, b) = server();
    let e = &b.endpoint();
    // Create-if-absent: the first run takes the success branch, the second the failure.
    let script = "create(\"cfg\") = \"0\"\n\nput cfg v1\nget cfg\n\nget cfg\n";
    let first = baton(e, &["kv", "txn"], Some(script.as_bytes()));
    assert_eq!(first.code, 0, "{first:?}");
    let blocks: Vec<&str> = first.stdout.split("\n\n").collect();
    assert!(
        blocks[0].starts_with("SUCCESS (revision "),
        "{}",
        first.stdout
    );
    assert!(blocks[1].starts_with("OK (revision "), "{}", first.stdout);
    assert_eq!(table_row(blocks[2], "cfg")[1], "v1");

    let second = baton(e, &["kv", "txn", "-o", "json"], Some(script.as_bytes()));
    assert_eq!(second.code, 0, "{second:?}");
    let j: Value = serde_json::from_str(&second.stdout).unwrap();
    assert_eq!(j["succeeded"], false);
    assert_eq!(j["responses"][0]["get"]["kvs"][0]["value"], "v1");

    // Several comparisons, a quoted value with a space, a delete with --prev-kv.
    let script = "value(\"cfg\") = \"v1\"\nversion(\"cfg\") > \"0\"\n\n\
                  put cfg \"v 2\"\ndel gone --prev-kv\n\n";
    let out = baton(e, &["kv", "txn", "-o", "simple"], Some(script.as_bytes()));
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "SUCCESS");
    assert!(lines[1].parse::<i64>().is_ok(), "put's revision: {lines:?}");
    assert_eq!(lines[2], "0", "nothing deleted");
    assert_eq!(
        baton_json(e, &["kv", "get", "cfg"])["kvs"][0]["value"],
        "v 2"
    );

    // The JSON form.
    let json_txn = r#"{
        "compare": [{"target": "mod", "key": "cfg", "op": ">", "value": 0}],
        "success": [{"put": {"key": "cfg", "value": "v3"}}, {"get": {"key": "cf", "prefix": true}}],
        "failure": []
    }"#;
    let out = baton(e, &["kv", "txn", "-o", "json"], Some(json_txn.as_bytes()));
    assert_eq!(out.code, 0, "{out:?}");
    let j: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(j["succeeded"], true);
    let rev = j["revision"].as_i64().unwrap();
    assert_eq!(j["responses"][0]["put"]["revision"], rev);
    assert_eq!(j["responses"][1]["get"]["kvs"][0]["value"], "v3");

    // Mistakes are reported with the line, before anything is sent.
    let bad = baton(
        e,
        &["kv", "txn"],
        Some(b"mod(\"cfg\") > \"0\"\n\nfrob cfg\n"),
    );
    assert_eq!(bad.code, 1);
    assert_eq!(bad.stderr.lines().count(), 1, "{bad:?}");
    assert!(bad.stderr.starts_with("baton kv txn: line 3: "), "{bad:?}");
    let bad = baton(
        e,
        &["kv", "txn"],
        Some(br#"{"success": [{"delete": {"key": "k", "prefx": true}}]}"#),
    );
    assert_eq!(bad.code, 1);
    assert!(bad.stderr.contains("prefx"), "{bad:?}");
}

#[test]
fn watch_prints_events_while_puts_happen() {
    let (_d, b) = server();
    let e = &b.endpoint();
    let start = put(e, "other", "x") + 1;
    let watch = |format: &str| {
        let mut cmd = baton_cmd();
        cmd.env("BATON_ENDPOINTS", e).args([
            "kv",
            "watch",
            "jobs/",
            "--prefix",
            "--prev-kv",
            "--rev",
            &start.to_string(),
            "-o",
            format,
        ]);
        Proc::spawn(&format!("watch -o {format}"), cmd)
    };
    let mut table = watch("table");
    let mut json = watch("json");

    // Each event shows up while the watch runs, before the next write happens.
    let r1 = put(e, "jobs/1", "build");
    table.expect_stdout(&format!("PUT     {r1:<8}  jobs/1  build  -\n"), T);
    let r2 = put(e, "jobs/1", "test");
    table.expect_stdout(&format!("PUT     {r2:<8}  jobs/1  test  build\n"), T);
    put(e, "elsewhere", "ignored");
    let r3 = baton_json(e, &["kv", "del", "jobs/1"])["revision"]
        .as_i64()
        .unwrap();
    table.expect_stdout(&format!("DELETE  {r3:<8}  jobs/1  -  test\n"), T);
    json.expect_stdout(&format!("\"revision\":{r3}"), T);

    // Ctrl-C ends a watch normally.
    for p in [&table, &json] {
        p.signal(libc::SIGINT);
    }
    assert_eq!(table.wait_exit(T), 0, "{}", table.said());
    assert_eq!(json.wait_exit(T), 0, "{}", json.said());
    assert!(table
        .stdout()
        .starts_with("TYPE    REVISION  KEY  VALUE  PREVIOUS\n"));
    assert!(!table.stdout().contains("elsewhere"));

    let events: Vec<Value> = json
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "{}", json.said());
    assert_eq!(events[0]["type"], "PUT");
    assert_eq!(events[0]["revision"], r1);
    assert_eq!(events[0]["kv"]["value"], "build");
    assert_eq!(events[0]["prev_kv"], Value::Null);
    assert_eq!(events[1]["prev_kv"]["value"], "build");
    assert_eq!(events[2]["type"], "DELETE");
    assert_eq!(events[2]["kv"]["key"], "jobs/1");
    assert_eq!(events[2]["prev_kv"]["value"], "test");
}

#[test]
fn errors_are_one_line_with_a_nonzero_status() {
    let (_d, b) = server();
    let e = &b.endpoint();
    // Nobody listening.
    let dead = format!("127.0.0.1:{}", common::free_port());
    let out = baton(&dead, &["kv", "get", "k"], None);
    assert_eq!(out.code, 1);
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    assert!(
        out.stderr
            .starts_with("baton kv get: no endpoint reachable"),
        "{out:?}"
    );
    assert!(out.stdout.is_empty());
    // A dead endpoint first, a live one second: failover.
    let both = format!("{dead},{e}");
    assert_eq!(baton(&both, &["kv", "get", "k"], None).code, 0);
    // The server refuses: its message, one line.
    let out = baton(e, &["kv", "put", "", "v"], None);
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stderr,
        "baton kv put: etcdserver: key is not provided (InvalidArgument)\n"
    );
    let out = baton(e, &["kv", "get", "k", "--rev", "99"], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("required revision is a future revision"),
        "{out:?}"
    );
}
