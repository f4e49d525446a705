//! `baton lease grant|revoke|keep-alive|timetolive|list`: etcd's Lease API from the command
//! line, on `baton-client`. Lease ids are hex in and out, as etcdctl prints them and as
//! they appear in lock keys (`NAME/<lease hex>`).

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use baton_client::{Client, LeaseTimeToLiveResponse};
use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::{json, Value};

use super::args::parse_duration;
use super::client::{connect, describe, finish, parse_lease, ClientArgs};
use super::output::{emit, emit_json, hex, text, Format, Table};
use super::signals::Signals;

#[derive(Args, Debug)]
#[command(
    about = "Grant, renew, inspect and revoke leases",
    long_about = "Grant, renew, inspect and revoke leases (etcd's Lease API). A lease ends \
                  after its TTL unless renewed; every key attached to it (`baton kv put \
                  --lease`) is deleted with it. Lease ids are hex.\n\n\
                  Output: --output table (default), simple (tab-separated, no header) or \
                  json (one object per line).",
    after_help = "Examples:\n  \
                  LEASE=$(baton lease grant 30 -o simple)\n  \
                  baton kv put --lease \"$LEASE\" service/a 10.0.0.1\n  \
                  baton lease keep-alive \"$LEASE\" &\n  \
                  baton lease timetolive \"$LEASE\" --keys\n  \
                  baton lease revoke \"$LEASE\""
)]
pub struct LeaseArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: LeaseCommand,
}

#[derive(Subcommand, Debug)]
pub enum LeaseCommand {
    Grant(GrantArgs),
    Revoke(IdArgs),
    KeepAlive(KeepAliveArgs),
    #[command(name = "timetolive", visible_alias = "ttl")]
    TimeToLive(TimeToLiveArgs),
    List(ListArgs),
}

#[derive(Args, Debug)]
#[command(about = "Grant a lease; prints its id (the server may raise a small TTL)")]
pub struct GrantArgs {
    /// Time to live: seconds (10), or with a unit (90s, 5m); rounded up to whole seconds.
    #[arg(value_parser = parse_duration)]
    pub ttl: Duration,
}

#[derive(Args, Debug)]
#[command(about = "Revoke a lease, deleting every key attached to it")]
pub struct IdArgs {
    /// The lease id (hex).
    #[arg(value_parser = parse_lease)]
    pub id: i64,
}

#[derive(Args, Debug)]
#[command(
    about = "Keep a lease alive until Ctrl-C (or renew it once with --once)",
    long_about = "Renew a lease every third of its TTL and print each renewal, until Ctrl-C \
                  or SIGTERM (exit status 0). Fails (exit status 1) as soon as the server \
                  says the lease is gone (expired or revoked)."
)]
pub struct KeepAliveArgs {
    /// The lease id (hex).
    #[arg(value_parser = parse_lease)]
    pub id: i64,
    /// Renew once and exit.
    #[arg(long)]
    pub once: bool,
}

#[derive(Args, Debug)]
#[command(about = "Show a lease's remaining and granted TTL (and its keys with --keys)")]
pub struct TimeToLiveArgs {
    /// The lease id (hex).
    #[arg(value_parser = parse_lease)]
    pub id: i64,
    /// Also list the keys attached to the lease.
    #[arg(long)]
    pub keys: bool,
}

#[derive(Args, Debug)]
#[command(about = "List live leases with their TTLs and number of keys")]
pub struct ListArgs {}

/// The most leases `lease list` looks up one by one for their TTLs; past that it lists ids
/// only, because each lookup is a round trip.
const LIST_DETAILS_MAX: usize = 1000;
/// Concurrent TTL lookups of `lease list`.
const LIST_CONCURRENCY: usize = 16;

/// Runs `baton lease …`; returns the process exit status.
pub async fn run(args: LeaseArgs) -> i32 {
    let name = match &args.command {
        LeaseCommand::Grant(_) => "lease grant",
        LeaseCommand::Revoke(_) => "lease revoke",
        LeaseCommand::KeepAlive(_) => "lease keep-alive",
        LeaseCommand::TimeToLive(_) => "lease timetolive",
        LeaseCommand::List(_) => "lease list",
    };
    finish(name, run_inner(args).await)
}

async fn run_inner(args: LeaseArgs) -> Result<i32> {
    let format = args.client.output;
    let client = connect(&args.client).await?;
    match args.command {
        LeaseCommand::Grant(a) => {
            let resp = client.lease_grant(a.ttl).await.map_err(describe)?;
            if !resp.error.is_empty() {
                return Err(anyhow!("{}", resp.error));
            }
            emit(&match format {
                Format::Table => format!("lease {} granted with TTL {}s", hex(resp.id), resp.ttl),
                Format::Simple => hex(resp.id),
                Format::Json => json!({ "id": hex(resp.id), "ttl": resp.ttl }).to_string(),
            });
        }
        LeaseCommand::Revoke(a) => {
            // The client treats revoking a lease that is already gone as success (the
            // caller's goal is reached); a person typing an id wants to hear about a typo
            // or an expired lease, so look first.
            existing(&client, a.id, false).await?;
            client.lease_revoke(a.id).await.map_err(describe)?;
            emit(&match format {
                Format::Table => format!("lease {} revoked", hex(a.id)),
                Format::Simple => hex(a.id),
                Format::Json => json!({ "id": hex(a.id), "revoked": true }).to_string(),
            });
        }
        LeaseCommand::KeepAlive(a) => return keep_alive(&client, a, format).await,
        LeaseCommand::TimeToLive(a) => {
            let resp = existing(&client, a.id, a.keys).await?;
            emit(&render_ttl(&resp, a.keys, format));
        }
        LeaseCommand::List(_) => return list(&client, format).await,
    }
    Ok(0)
}

/// The lease's TTL, or an error if it does not exist.
async fn existing(client: &Client, id: i64, keys: bool) -> Result<LeaseTimeToLiveResponse> {
    let resp = if keys {
        client.lease_time_to_live_with_keys(id).await
    } else {
        client.lease_time_to_live(id).await
    }
    .map_err(describe)?;
    if resp.ttl < 0 {
        return Err(anyhow!(
            "lease {} not found (it expired or was revoked)",
            hex(id)
        ));
    }
    Ok(resp)
}

/// Pause between attempts after a failed renewal (server or connection down).
const KEEP_ALIVE_RETRY: Duration = Duration::from_millis(500);

/// Renews until interrupted. A renewal that fails for a transient reason (no leader, a
/// broken connection) is retried for as long as the last acknowledged renewal still covers
/// the lease: giving up at the first hiccup would let the lease expire for nothing.
async fn keep_alive(client: &Client, a: KeepAliveArgs, format: Format) -> Result<i32> {
    let mut signals = Signals::install()?;
    // Send time and TTL of the last acknowledged renewal.
    let mut covered: Option<(Instant, i64)> = None;
    loop {
        let sent = Instant::now();
        let answer = tokio::select! {
            r = client.lease_keep_alive_once(a.id) => r,
            _ = signals.recv() => return Ok(0),
        };
        let ttl = match answer {
            Ok(ttl) => ttl,
            // etcd answers TTL 0 for a lease it does not know; a server that says "not
            // found" instead means the same.
            Err(baton_client::Error::SessionLost(_)) => 0,
            Err(e)
                if e.is_transient()
                    && !a.once
                    && covered.is_some_and(|(at, ttl)| {
                        at.elapsed() + KEEP_ALIVE_RETRY < Duration::from_secs(ttl as u64)
                    }) =>
            {
                eprintln!(
                    "baton lease keep-alive: warning: {:#}; retrying",
                    describe(e)
                );
                tokio::select! {
                    _ = tokio::time::sleep(KEEP_ALIVE_RETRY) => {}
                    _ = signals.recv() => return Ok(0),
                }
                continue;
            }
            Err(e) => return Err(describe(e)),
        };
        if ttl <= 0 {
            return Err(anyhow!("lease {} expired or was revoked", hex(a.id)));
        }
        covered = Some((sent, ttl));
        emit(&match format {
            Format::Table => format!("lease {} kept alive, TTL {ttl}s", hex(a.id)),
            Format::Simple => format!("{}\t{ttl}", hex(a.id)),
            Format::Json => json!({ "id": hex(a.id), "ttl": ttl }).to_string(),
        });
        if a.once {
            return Ok(0);
        }
        // A third of the TTL, as sessions do: one lost renewal is not yet the end.
        let pause = Duration::from_secs(ttl as u64) / 3;
        tokio::select! {
            _ = tokio::time::sleep(pause.max(Duration::from_millis(200))) => {}
            _ = signals.recv() => return Ok(0),
        }
    }
}

fn render_ttl(resp: &LeaseTimeToLiveResponse, with_keys: bool, format: Format) -> String {
    let keys: Vec<String> = resp.keys.iter().map(|k| text(k)).collect();
    match format {
        Format::Table => {
            let mut header = vec!["ID", "TTL", "GRANTED"];
            if with_keys {
                header.push("KEYS");
            }
            let mut t = Table::new(&header);
            let mut row = vec![
                hex(resp.id),
                format!("{}s", resp.ttl),
                format!("{}s", resp.granted_ttl),
            ];
            if with_keys {
                row.push(if keys.is_empty() {
                    "-".into()
                } else {
                    keys.join(", ")
                });
            }
            t.row(row);
            t.render()
        }
        Format::Simple => {
            let mut out = format!("{}\t{}\t{}\n", hex(resp.id), resp.ttl, resp.granted_ttl);
            for k in &keys {
                out.push_str(k);
                out.push('\n');
            }
            out
        }
        Format::Json => {
            let mut v = json!({
                "id": hex(resp.id),
                "ttl": resp.ttl,
                "granted_ttl": resp.granted_ttl,
            });
            if with_keys {
                let mut list = Vec::new();
                for k in &resp.keys {
                    let mut m = serde_json::Map::new();
                    super::output::put_bytes(&mut m, "key", k);
                    // A plain string when possible, else the {"key_base64": …} object.
                    list.push(match m.remove("key") {
                        Some(s) => s,
                        None => Value::Object(m),
                    });
                }
                v["keys"] = Value::Array(list);
            }
            v.to_string()
        }
    }
}

async fn list(client: &Client, format: Format) -> Result<i32> {
    let ids = client.lease_list().await.map_err(describe)?;
    let detailed = ids.len() <= LIST_DETAILS_MAX;
    // (id, details); details are `None` past LIST_DETAILS_MAX or for a lease that ended
    // between the listing and the lookup (it is left out then).
    let mut rows: Vec<(i64, Option<LeaseTimeToLiveResponse>)> = if detailed {
        let looked_up: Vec<(i64, Option<LeaseTimeToLiveResponse>)> =
            futures::stream::iter(ids.iter().copied())
                .map(|id| async move { (id, client.lease_time_to_live_with_keys(id).await.ok()) })
                .buffered(LIST_CONCURRENCY)
                .collect()
                .await;
        looked_up
            .into_iter()
            .filter(|(_, d)| d.as_ref().is_none_or(|d| d.ttl >= 0))
            .collect()
    } else {
        ids.iter().map(|&id| (id, None)).collect()
    };
    rows.sort_by_key(|(id, _)| *id);
    match format {
        Format::Json => {
            let leases: Vec<Value> = rows
                .iter()
                .map(|(id, d)| match d {
                    Some(d) => json!({
                        "id": hex(*id),
                        "ttl": d.ttl,
                        "granted_ttl": d.granted_ttl,
                        "key_count": d.keys.len(),
                    }),
                    None => json!({ "id": hex(*id) }),
                })
                .collect();
            emit_json(&json!({ "count": rows.len(), "leases": leases }));
        }
        Format::Simple => {
            let mut out = String::new();
            for (id, d) in &rows {
                match d {
                    Some(d) => out.push_str(&format!(
                        "{}\t{}\t{}\t{}\n",
                        hex(*id),
                        d.ttl,
                        d.granted_ttl,
                        d.keys.len()
                    )),
                    None => out.push_str(&format!("{}\n", hex(*id))),
                }
            }
            emit(&out);
        }
        Format::Table => {
            if rows.is_empty() {
                emit("(no leases)");
                return Ok(0);
            }
            let mut t = Table::new(&["ID", "TTL", "GRANTED", "KEYS"]);
            for (id, d) in &rows {
                t.row(match d {
                    Some(d) => vec![
                        hex(*id),
                        format!("{}s", d.ttl),
                        format!("{}s", d.granted_ttl),
                        d.keys.len().to_string(),
                    ],
                    None => vec![hex(*id), "?".into(), "?".into(), "?".into()],
                });
            }
            let mut out = t.render();
            if !detailed {
                out.push_str(&format!(
                    "({} leases: TTLs are looked up for at most {LIST_DETAILS_MAX}; use \
                     `baton lease timetolive ID`)\n",
                    rows.len()
                ));
            }
            emit(&out);
        }
    }
    Ok(0)
}
