//! `baton status`: one screen that answers "is the cluster healthy, who leads, and who holds
//! which lock": the answering member's Raft and store status, the member list with the
//! leader marked, the number of leases, and every lock in the server's registry with its
//! holder and number of waiters (`baton.v1.Lock/List`).
//!
//! Against etcd, which has no lock registry, the lock section says so instead of failing:
//! the rest of the status is still worth having.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use baton_client::{Client, Error, ListLocksOptions, ListLocksResponse, LockSummary, Member};
use clap::Args;
use serde_json::{json, Value};

use super::client::{connect, describe, finish, ClientArgs};
use super::output::{
    bytes_human, emit, hex, hex_u64, lease_cell, lease_json, plural, put_bytes, text, Format, Table,
};

#[derive(Args, Debug)]
#[command(
    about = "Show members, leader, Raft and store status, leases, and locks with holders",
    long_about = "Show the status of the cluster as the first reachable endpoint sees it: \
                  its members (the leader marked), the Raft term and indexes, the store \
                  revision and database size, the number of leases, and the locks in the \
                  lock registry with their holders (key, fencing token, lease) and number \
                  of waiters.\n\n\
                  The registry holds every lock taken through the server's lock services \
                  (baton lock, baton elect, etcd's v3lock and v3election APIs, baton-client); \
                  locks taken only with etcd's client-side recipes (etcdctl lock) appear \
                  once a server-side acquisition names them.",
    after_help = "Examples:\n  \
                  baton status\n  \
                  baton status -o json | jq '.locks[] | {name, waiters}'"
)]
pub struct StatusArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// List at most this many locks (the server caps it at 10000).
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub max_locks: usize,
}

/// What the status is made of, gathered before printing so each format shows the same.
struct Status {
    endpoint: String,
    status: baton_client::StatusResponse,
    members: Vec<Member>,
    lease_count: usize,
    /// `None`: the server has no lock registry (etcd).
    locks: Option<ListLocksResponse>,
}

/// Runs `baton status`; returns the process exit status.
pub async fn run(args: StatusArgs) -> i32 {
    finish("status", run_inner(args).await)
}

async fn run_inner(args: StatusArgs) -> Result<i32> {
    let format = args.client.output;
    let client = connect(&args.client).await?;
    let s = gather(&client, args.max_locks).await?;
    emit(&match format {
        Format::Table => render_table(&s),
        Format::Simple => render_simple(&s),
        Format::Json => render_json(&s).to_string(),
    });
    Ok(0)
}

async fn gather(client: &Client, max_locks: usize) -> Result<Status> {
    let (status, members, leases, locks) = tokio::join!(
        client.status(),
        client.member_list(),
        client.lease_list(),
        client.list_locks(ListLocksOptions::new().with_limit(max_locks.max(1))),
    );
    let locks = match locks {
        Ok(l) => Some(l),
        Err(Error::Unsupported(_)) => None,
        Err(e) => return Err(describe(e)),
    };
    Ok(Status {
        endpoint: client.current_endpoint().unwrap_or_default(),
        status: status.map_err(describe)?,
        members: members.map_err(describe)?.members,
        lease_count: leases.map_err(describe)?.len(),
        locks,
    })
}

impl Status {
    fn header(&self) -> (u64, u64, i64) {
        let h = self.status.header.unwrap_or_default();
        (h.cluster_id, h.member_id, h.revision)
    }

    /// "8e9e05c52164694d (default)": an id with the member's name, if it is known.
    fn member_label(&self, id: u64) -> String {
        if id == 0 {
            return "none (no leader)".to_string();
        }
        match self.members.iter().find(|m| m.id == id) {
            Some(m) if !m.name.is_empty() => format!("{} ({})", hex_u64(id), m.name),
            _ => hex_u64(id),
        }
    }

    fn role(&self, m: &Member) -> &'static str {
        if m.is_learner {
            "learner"
        } else if m.id == self.status.leader {
            "leader"
        } else {
            "follower"
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The holder cell of a lock row: the key, or why there is none.
fn holder_cell(l: &LockSummary) -> String {
    match &l.holder {
        Some(h) => text(&h.key),
        // Compared with this machine's clock: close enough to tell "delay running" from
        // "delay over" for a person reading the table.
        None if l.delayed_until_ms > now_ms() => "none (lock-delay)".to_string(),
        None => "none".to_string(),
    }
}

fn render_table(s: &Status) -> String {
    let (_, member_id, revision) = s.header();
    let st = &s.status;
    let mut summary = Table::headless();
    let mut field = |name: &str, value: String| summary.row(vec![name.to_string(), value]);
    field("ENDPOINT", s.endpoint.clone());
    field("MEMBER", s.member_label(member_id));
    field("LEADER", s.member_label(st.leader));
    field("RAFT TERM", st.raft_term.to_string());
    field("RAFT INDEX", st.raft_index.to_string());
    field("RAFT APPLIED", st.raft_applied_index.to_string());
    field("REVISION", revision.to_string());
    field(
        "DB SIZE",
        format!(
            "{} ({} in use)",
            bytes_human(st.db_size),
            bytes_human(st.db_size_in_use)
        ),
    );
    field("LEASES", s.lease_count.to_string());
    field("VERSION", st.version.clone());
    if !st.errors.is_empty() {
        field("ERRORS", st.errors.join("; "));
    }
    let mut out = summary.render();

    out.push_str(&format!("\nMEMBERS ({})\n", s.members.len()));
    let mut members = Table::new(&["ID", "NAME", "ROLE", "PEER URLS", "CLIENT URLS"]);
    for m in &s.members {
        members.row(vec![
            hex_u64(m.id),
            m.name.clone(),
            s.role(m).to_string(),
            m.peer_ur_ls.join(","),
            m.client_ur_ls.join(","),
        ]);
    }
    out.push_str(&members.render());

    match &s.locks {
        None => out.push_str("\nLOCKS: not available (the server has no lock registry: etcd?)\n"),
        Some(list) => {
            out.push_str(&format!("\nLOCKS ({})\n", list.total));
            if list.locks.is_empty() {
                out.push_str("(none)\n");
            } else {
                let mut t = Table::new(&["NAME", "HOLDER", "TOKEN", "LEASE", "TTL", "WAITERS"]);
                for l in &list.locks {
                    let h = l.holder.as_ref();
                    t.row(vec![
                        text(&l.name),
                        holder_cell(l),
                        h.map_or("-".into(), |h| h.create_revision.to_string()),
                        h.map_or("-".into(), |h| lease_cell(h.lease)),
                        h.filter(|h| h.lease_remaining_s >= 0)
                            .map_or("-".into(), |h| format!("{}s", h.lease_remaining_s)),
                        l.waiter_count.to_string(),
                    ]);
                }
                out.push_str(&t.render());
                if list.more {
                    out.push_str(&format!(
                        "({} of {} shown; raise --max-locks to see more)\n",
                        list.locks.len(),
                        plural(list.total, "lock", "locks")
                    ));
                }
            }
        }
    }
    out
}

/// `field<TAB>value` lines, then one `member<TAB>id<TAB>name<TAB>role<TAB>peer urls<TAB>client
/// urls` line per member and one `lock<TAB>name<TAB>holder key<TAB>token<TAB>lease<TAB>waiters`
/// line per lock (empty holder fields when nobody holds it), so `grep`/`cut` can pick any
/// part.
fn render_simple(s: &Status) -> String {
    let (cluster_id, member_id, revision) = s.header();
    let st = &s.status;
    let mut lines = vec![
        format!("endpoint\t{}", s.endpoint),
        format!("cluster_id\t{}", hex_u64(cluster_id)),
        format!("member_id\t{}", hex_u64(member_id)),
        format!("leader_id\t{}", hex_u64(st.leader)),
        format!("raft_term\t{}", st.raft_term),
        format!("raft_index\t{}", st.raft_index),
        format!("raft_applied_index\t{}", st.raft_applied_index),
        format!("revision\t{revision}"),
        format!("db_size\t{}", st.db_size),
        format!("db_size_in_use\t{}", st.db_size_in_use),
        format!("leases\t{}", s.lease_count),
        format!("version\t{}", st.version),
    ];
    for m in &s.members {
        lines.push(format!(
            "member\t{}\t{}\t{}\t{}\t{}",
            hex_u64(m.id),
            m.name,
            s.role(m),
            m.peer_ur_ls.join(","),
            m.client_ur_ls.join(",")
        ));
    }
    for l in s.locks.iter().flat_map(|list| &list.locks) {
        let (key, token, lease) = match &l.holder {
            Some(h) => (text(&h.key), h.create_revision.to_string(), hex(h.lease)),
            None => (String::new(), String::new(), String::new()),
        };
        lines.push(format!(
            "lock\t{}\t{key}\t{token}\t{lease}\t{}",
            text(&l.name),
            l.waiter_count
        ));
    }
    lines.join("\n")
}

fn render_json(s: &Status) -> Value {
    let (cluster_id, member_id, revision) = s.header();
    let st = &s.status;
    let members: Vec<Value> = s
        .members
        .iter()
        .map(|m| {
            json!({
                "id": hex_u64(m.id),
                "name": m.name,
                "role": s.role(m),
                "is_leader": m.id == st.leader,
                "is_learner": m.is_learner,
                "peer_urls": m.peer_ur_ls,
                "client_urls": m.client_ur_ls,
            })
        })
        .collect();
    let locks = s.locks.as_ref().map(|list| {
        list.locks
            .iter()
            .map(|l| {
                let mut m = serde_json::Map::new();
                put_bytes(&mut m, "name", &l.name);
                let holder = l.holder.as_ref().map_or(Value::Null, |h| {
                    let mut hm = serde_json::Map::new();
                    put_bytes(&mut hm, "key", &h.key);
                    hm.insert("token".into(), json!(h.create_revision));
                    hm.insert("lease".into(), lease_json(h.lease));
                    hm.insert("lease_ttl".into(), json!(h.lease_remaining_s));
                    Value::Object(hm)
                });
                m.insert("holder".into(), holder);
                m.insert("waiters".into(), json!(l.waiter_count));
                m.insert("lock_delay_ms".into(), json!(l.lock_delay_ms));
                m.insert("delayed_until_ms".into(), json!(l.delayed_until_ms));
                Value::Object(m)
            })
            .collect::<Vec<_>>()
    });
    json!({
        "endpoint": s.endpoint,
        "cluster_id": hex_u64(cluster_id),
        "member_id": hex_u64(member_id),
        "leader": hex_u64(st.leader),
        "raft_term": st.raft_term,
        "raft_index": st.raft_index,
        "raft_applied_index": st.raft_applied_index,
        "revision": revision,
        "db_size": st.db_size,
        "db_size_in_use": st.db_size_in_use,
        "version": st.version,
        "errors": st.errors,
        "lease_count": s.lease_count,
        "members": members,
        // null when the server has no lock registry (etcd).
        "locks": locks,
        "lock_count": s.locks.as_ref().map(|l| l.total),
        "locks_more": s.locks.as_ref().is_some_and(|l| l.more),
    })
}
