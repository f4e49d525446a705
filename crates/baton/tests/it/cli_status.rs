//! `baton status` against a real `baton serve` with a lock held by one `baton lock` and
//! waited for by two others: the leader, the revision and the lock with its holder and
//! waiters must show in every format. And against etcd 3.4, which has no lock registry.

use std::time::{Duration, Instant};

use crate::common::{baton, baton_cmd, baton_json, baton_ok, table_row, Baton, Etcd, Proc, Rpc};

const T: Duration = Duration::from_secs(10);

/// `baton lock NAME --ttl 30` holding (or waiting) until Ctrl-C.
fn lock(e: &str, name: &str) -> Proc {
    let mut cmd = baton_cmd();
    cmd.env("BATON_ENDPOINTS", e)
        .args(["lock", name, "--ttl", "30"]);
    Proc::spawn(&format!("baton lock {name}"), cmd)
}

fn var(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} not in {text:?}"))
        .to_string()
}

#[test]
fn status_shows_the_leader_the_revision_and_a_held_lock_with_its_waiters() {
    let dir = tempfile::tempdir().unwrap();
    let b = Baton::start(&dir.path().join("b"));
    let e = &b.endpoint();
    let rpc = Rpc::connect(e);

    let mut holder = lock(e, "jobs");
    holder.expect_stdout("BATON_FENCING_TOKEN=", T);
    let key = var(&holder.stdout(), "BATON_LOCK_KEY");
    let token = var(&holder.stdout(), "BATON_FENCING_TOKEN");
    let lease = key.strip_prefix("jobs/").unwrap().to_string();
    let waiters = [lock(e, "jobs"), lock(e, "jobs")];
    let t0 = Instant::now();
    while rpc.inspect("jobs").waiter_count < 2 {
        assert!(t0.elapsed() < T, "two waiters queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let revision = baton_json(e, &["kv", "get", "jobs", "--prefix", "--count-only"])["revision"]
        .as_i64()
        .unwrap();

    // JSON.
    let j = baton_json(e, &["status"]);
    let member = j["member_id"].as_str().unwrap().to_string();
    assert_eq!(j["leader"], member.as_str(), "a single member leads: {j}");
    assert_eq!(j["revision"], revision);
    assert!(j["raft_term"].as_u64().unwrap() >= 1);
    assert!(j["raft_applied_index"].as_u64().unwrap() >= 1);
    assert!(j["raft_applied_index"].as_u64() <= j["raft_index"].as_u64());
    assert!(j["db_size"].as_i64().unwrap() > 0);
    assert_eq!(j["lease_count"], 3, "one lease per `baton lock`");
    assert_eq!(j["members"].as_array().unwrap().len(), 1);
    assert_eq!(j["members"][0]["id"], member.as_str());
    assert_eq!(j["members"][0]["is_leader"], true);
    assert_eq!(j["members"][0]["role"], "leader");
    assert_eq!(
        j["members"][0]["client_urls"][0],
        format!("http://{e}").as_str()
    );
    assert_eq!(j["lock_count"], 1);
    assert_eq!(j["locks_more"], false);
    let l = &j["locks"][0];
    assert_eq!(l["name"], "jobs");
    assert_eq!(l["holder"]["key"], key.as_str());
    assert_eq!(l["holder"]["token"].to_string(), token);
    assert_eq!(l["holder"]["lease"], lease.as_str());
    assert!(l["holder"]["lease_ttl"].as_i64().unwrap() > 20);
    assert_eq!(l["waiters"], 2);

    // Table.
    let table = baton_ok(e, &["status"]);
    let field = |name: &str| {
        table
            .lines()
            .find_map(|l| l.strip_prefix(name).map(str::trim))
            .unwrap_or_else(|| panic!("{name} in:\n{table}"))
            .to_string()
    };
    assert_eq!(field("LEADER"), format!("{member} (default)"));
    assert_eq!(field("MEMBER"), field("LEADER"));
    assert_eq!(field("REVISION"), revision.to_string());
    assert_eq!(field("LEASES"), "3");
    assert_eq!(table_row(&table, &member)[2], "leader", "{table}");
    assert!(table.contains("\nLOCKS (1)\nNAME  "), "{table}");
    let row = table_row(&table, "jobs");
    assert_eq!(
        &row[..4],
        ["jobs", key.as_str(), token.as_str(), lease.as_str()]
    );
    assert!(row[4].ends_with('s'), "a TTL: {row:?}");
    assert_eq!(row[5], "2", "waiters: {row:?}");

    // Simple.
    let simple = baton_ok(e, &["status", "-o", "simple"]);
    assert!(
        simple.contains(&format!("\nleader_id\t{member}\n")),
        "{simple}"
    );
    assert!(
        simple.contains(&format!("\nrevision\t{revision}\n")),
        "{simple}"
    );
    assert!(
        simple.contains(&format!("\nlock\tjobs\t{key}\t{token}\t{lease}\t2")),
        "{simple}"
    );

    // The holder leaves: the first waiter holds, one waits.
    holder.signal(libc::SIGINT);
    assert_eq!(holder.wait_exit(T), 0, "{}", holder.said());
    let t0 = Instant::now();
    loop {
        let j = baton_json(e, &["status"]);
        let l = &j["locks"][0];
        if l["waiters"] == 1 && l["holder"]["key"] != key.as_str() && !l["holder"].is_null() {
            break;
        }
        assert!(t0.elapsed() < T, "hand-over shows: {j}");
        std::thread::sleep(Duration::from_millis(20));
    }
    for w in &waiters {
        w.signal(libc::SIGINT);
    }
}

#[test]
fn status_and_kv_work_against_etcd_without_a_lock_registry() {
    let etcd = Etcd::start();
    let e = &etcd.endpoint();
    let t0 = Instant::now();
    // etcd listens before it has elected itself; wait for a leader.
    while baton(e, &["kv", "put", "k", "v"], None).code != 0 {
        assert!(t0.elapsed() < T, "etcd did not become ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(baton_json(e, &["kv", "get", "k"])["kvs"][0]["value"], "v");
    let j = baton_json(e, &["status"]);
    assert_eq!(j["leader"], j["member_id"]);
    assert!(j["locks"].is_null(), "{j}");
    let table = baton_ok(e, &["status"]);
    assert!(
        table.contains("LOCKS: not available (the server has no lock registry: etcd?)"),
        "{table}"
    );
}
