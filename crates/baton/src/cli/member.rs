//! `baton member list|add|remove|update|promote` and `baton move-leader`: etcd's
//! `Cluster` and `Maintenance.MoveLeader` calls with the CLI's three output formats.
//!
//! Member changes are sent once (a repeated `MemberAdd` would add a second member). `member
//! add` also prints how to start the new member (`--initial-cluster` from the member list,
//! with the new member's name, as etcdctl prints `ETCD_INITIAL_CLUSTER`). `move-leader`
//! asks each endpoint for its status and sends the request to the one that leads, since
//! only the leader accepts it.

use anyhow::{anyhow, Result};
use baton_client::Member;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::client::{connect, connect_leader, describe, finish, ClientArgs};
use super::output::{emit, hex_u64, Format, Table};

#[derive(Args, Debug)]
#[command(
    about = "List, add, remove, update and promote cluster members",
    after_help = "Examples:\n  \
                  baton member list\n  \
                  baton member add m4 --peer-urls http://10.0.0.4:2380 --learner\n  \
                  baton member promote 5a0d3fc0e5f1c4b3\n  \
                  baton member remove 5a0d3fc0e5f1c4b3"
)]
pub struct MemberArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: MemberCommand,
}

#[derive(Subcommand, Debug)]
pub enum MemberCommand {
    /// List the members (id, started or not, name, peer and client URLs, learner).
    List,
    /// Add a member; then start it with the printed flags and an empty data directory.
    Add {
        /// The new member's name (used only for the printed start flags: the member
        /// publishes its name itself once it runs).
        name: String,
        /// The new member's peer URLs, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        peer_urls: Vec<String>,
        /// Add it as a learner (receives the log, does not vote; promote it later).
        #[arg(long)]
        learner: bool,
    },
    /// Remove a member (a removed member that still runs stops).
    Remove {
        /// Member id (hex, as `baton member list` prints it).
        #[arg(value_parser = parse_member_id)]
        id: u64,
    },
    /// Give a member new peer URLs.
    Update {
        #[arg(value_parser = parse_member_id)]
        id: u64,
        /// The new peer URLs, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        peer_urls: Vec<String>,
    },
    /// Make a learner that has caught up with the leader a voter.
    Promote {
        #[arg(value_parser = parse_member_id)]
        id: u64,
    },
}

#[derive(Args, Debug)]
#[command(
    about = "Hand leadership to another voting member",
    long_about = "Hand leadership to another voting member once it has caught up with the \
                  leader (etcd's MoveLeader). Asks every endpoint for its status and sends \
                  the request to the leader among them, so list the leader's endpoint too.",
    after_help = "Example:\n  baton move-leader 5a0d3fc0e5f1c4b3 --endpoints a:2379,b:2379,c:2379"
)]
pub struct MoveLeaderArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The new leader's member id (hex).
    #[arg(value_parser = parse_member_id)]
    pub target: u64,
}

fn parse_member_id(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u64::from_str_radix(digits, 16)
        .map_err(|_| format!("'{text}' is not a member id (hex, as `baton member list` prints it)"))
}

/// Runs `baton member ...`; returns the process exit status.
pub async fn run(args: MemberArgs) -> i32 {
    finish("member", run_inner(args).await)
}

/// Runs `baton move-leader`; returns the process exit status.
pub async fn run_move_leader(args: MoveLeaderArgs) -> i32 {
    finish("move-leader", move_leader(args).await)
}

fn member_json(m: &Member) -> Value {
    json!({
        "id": hex_u64(m.id),
        "name": m.name,
        "started": !m.name.is_empty(),
        "is_learner": m.is_learner,
        "peer_urls": m.peer_ur_ls,
        "client_urls": m.client_ur_ls,
    })
}

fn render_members(format: Format, members: &[Member]) -> String {
    match format {
        Format::Table => {
            let mut t = Table::new(&[
                "ID",
                "STATUS",
                "NAME",
                "PEER URLS",
                "CLIENT URLS",
                "LEARNER",
            ]);
            for m in members {
                t.row(vec![
                    hex_u64(m.id),
                    if m.name.is_empty() {
                        "unstarted"
                    } else {
                        "started"
                    }
                    .into(),
                    m.name.clone(),
                    m.peer_ur_ls.join(","),
                    m.client_ur_ls.join(","),
                    m.is_learner.to_string(),
                ]);
            }
            t.render()
        }
        Format::Simple => members
            .iter()
            .map(|m| {
                format!(
                    "{}\t{}\t{}\t{}\t{}\t{}\n",
                    hex_u64(m.id),
                    if m.name.is_empty() {
                        "unstarted"
                    } else {
                        "started"
                    },
                    m.name,
                    m.peer_ur_ls.join(","),
                    m.client_ur_ls.join(","),
                    m.is_learner
                )
            })
            .collect(),
        Format::Json => json!({
            "members": members.iter().map(member_json).collect::<Vec<_>>(),
        })
        .to_string(),
    }
}

/// "Member X <verb> cluster Y" with the members after the change (json: one object).
fn render_change(
    format: Format,
    verb: &str,
    id: u64,
    cluster_id: u64,
    members: &[Member],
) -> String {
    match format {
        Format::Table => format!(
            "Member {} {verb} cluster {}\n{}",
            hex_u64(id),
            hex_u64(cluster_id),
            render_members(Format::Table, members)
        ),
        Format::Simple => format!("{}\n", hex_u64(id)),
        Format::Json => json!({
            "id": hex_u64(id),
            "cluster_id": hex_u64(cluster_id),
            "members": members.iter().map(member_json).collect::<Vec<_>>(),
        })
        .to_string(),
    }
}

async fn run_inner(args: MemberArgs) -> Result<i32> {
    let format = args.client.output;
    let client = connect(&args.client).await?;
    let cluster_id = |h: Option<baton_client::proto::etcdserverpb::ResponseHeader>| {
        h.map_or(0, |h| h.cluster_id)
    };
    let out = match args.command {
        MemberCommand::List => {
            let r = client.member_list().await.map_err(describe)?;
            render_members(format, &r.members)
        }
        MemberCommand::Add {
            name,
            peer_urls,
            learner,
        } => {
            let r = client
                .member_add(peer_urls.clone(), learner)
                .await
                .map_err(describe)?;
            let added = r
                .member
                .ok_or_else(|| anyhow!("the server did not name the added member"))?;
            // etcdctl's ETCD_INITIAL_CLUSTER: every member's peer URLs under its name.
            let initial = r
                .members
                .iter()
                .flat_map(|m| {
                    let n = if m.id == added.id { &name } else { &m.name };
                    m.peer_ur_ls.iter().map(move |u| format!("{n}={u}"))
                })
                .collect::<Vec<_>>()
                .join(",");
            let start = format!(
                "baton serve --name {name} --initial-cluster {initial} \
                 --initial-cluster-state existing --initial-advertise-peer-urls {} \
                 --listen-peer-urls {} (with an empty --data-dir)",
                peer_urls.join(","),
                peer_urls.join(",")
            );
            match format {
                Format::Table => format!(
                    "Member {} added to cluster {}{}\nStart it with:\n  {start}",
                    hex_u64(added.id),
                    hex_u64(cluster_id(r.header)),
                    if learner { " as a learner" } else { "" },
                ),
                Format::Simple => format!("{}\t{initial}\n", hex_u64(added.id)),
                Format::Json => json!({
                    "id": hex_u64(added.id),
                    "cluster_id": hex_u64(cluster_id(r.header)),
                    "is_learner": learner,
                    "initial_cluster": initial,
                    "members": r.members.iter().map(member_json).collect::<Vec<_>>(),
                })
                .to_string(),
            }
        }
        MemberCommand::Remove { id } => {
            let r = client.member_remove(id).await.map_err(describe)?;
            render_change(format, "removed from", id, cluster_id(r.header), &r.members)
        }
        MemberCommand::Update { id, peer_urls } => {
            let r = client
                .member_update(id, peer_urls)
                .await
                .map_err(describe)?;
            render_change(format, "updated in", id, cluster_id(r.header), &r.members)
        }
        MemberCommand::Promote { id } => {
            let r = client.member_promote(id).await.map_err(describe)?;
            render_change(format, "promoted in", id, cluster_id(r.header), &r.members)
        }
    };
    emit(&out);
    Ok(0)
}

async fn move_leader(args: MoveLeaderArgs) -> Result<i32> {
    let format = args.client.output;
    // Only the leader accepts MoveLeader: find it among the endpoints.
    let (client, from) = connect_leader(&args.client).await?;
    client.move_leader(args.target).await.map_err(describe)?;
    emit(&match format {
        Format::Table => format!(
            "Leadership transferred from {} to {}",
            hex_u64(from),
            hex_u64(args.target)
        ),
        Format::Simple => format!("{}\t{}\n", hex_u64(from), hex_u64(args.target)),
        Format::Json => json!({"from": hex_u64(from), "to": hex_u64(args.target)}).to_string(),
    });
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_ids_are_hex() {
        assert_eq!(parse_member_id("8e9e05c52164694d"), Ok(0x8e9e05c52164694d));
        assert_eq!(parse_member_id("0x10"), Ok(16));
        assert!(parse_member_id("m1").is_err());
    }

    #[test]
    fn member_tables() {
        let members = vec![
            Member {
                id: 0xab,
                name: "m1".into(),
                peer_ur_ls: vec!["http://a:2380".into()],
                client_ur_ls: vec!["http://a:2379".into()],
                is_learner: false,
            },
            Member {
                id: 0xcd,
                name: String::new(),
                peer_ur_ls: vec!["http://b:2380".into()],
                client_ur_ls: vec![],
                is_learner: true,
            },
        ];
        let t = render_members(Format::Table, &members);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("ID"));
        assert!(
            lines[2].contains("unstarted") && lines[2].ends_with("true"),
            "{t}"
        );
        assert_eq!(
            render_members(Format::Simple, &members).lines().next(),
            Some("ab\tstarted\tm1\thttp://a:2380\thttp://a:2379\tfalse")
        );
        let j: Value = serde_json::from_str(&render_members(Format::Json, &members)).unwrap();
        assert_eq!(j["members"][1]["id"], "cd");
        assert_eq!(j["members"][1]["started"], false);
    }
}
