//! `baton elect NAME PROPOSAL` and `baton elect --listen NAME`, on `baton-client`'s
//! [`Election`] with a `Session` (so leadership is lost exactly when the client says a lock
//! would be: lease expired or revoked, the local expiry estimate passed, or the leader key
//! deleted).
//!
//! Campaigning uses etcd's `v3election` service, so candidates started with `etcdctl elect`
//! and with `baton elect` take part in the same election (same key layout:
//! `NAME/<lease id in hex>`, oldest key leads).

use anyhow::{anyhow, Result};
use baton_client::{Client, Election, Error};
use clap::Args;
use futures::StreamExt;

use super::args::EndpointArgs;
use super::client::describe;
use super::exit::{EXIT_ERROR, EXIT_LOST};
use super::session::{close, describe_loss};
use super::signals::Signals;

#[derive(Args, Debug)]
#[command(
    about = "Campaign in a leader election (or watch one with --listen)",
    long_about = "Campaign to become the leader of election NAME with value PROPOSAL, wait \
                  until elected, print the leader key and the value (like `etcdctl elect`), \
                  and stay leader until Ctrl-C or SIGTERM, then resign so the next candidate \
                  takes over at once.\n\n\
                  Leadership lives as long as a lease that `baton elect` keeps alive; if this \
                  process is paused or cut off for longer than --ttl the next candidate \
                  becomes leader and `baton elect` exits with status 75.\n\n\
                  With --listen, print the leader's key and value every time the leader \
                  changes, without campaigning.",
    after_help = "Examples:\n  \
                  baton elect scheduler \"$(hostname)\"\n  \
                  baton elect --listen scheduler"
)]
pub struct ElectArgs {
    /// Name of the election.
    pub name: String,
    /// The value this candidate announces when elected (e.g. its address).
    #[arg(required_unless_present = "listen")]
    pub proposal: Option<String>,
    /// Only observe: print each new leader's key and value as it changes.
    #[arg(short, long, conflicts_with = "proposal")]
    pub listen: bool,
    /// Lease time-to-live in seconds: how long leadership survives this process being
    /// paused, crashed or cut off.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub ttl: i64,
    #[command(flatten)]
    pub endpoints: EndpointArgs,
}

/// Runs `baton elect`; returns the process exit status.
pub async fn run(args: ElectArgs) -> i32 {
    let result = match &args.proposal {
        Some(proposal) if !args.listen => campaign(&args, proposal.clone()).await,
        _ => listen(&args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{WHO}: {e:#}");
            EXIT_ERROR
        }
    }
}

const WHO: &str = "baton elect";

async fn campaign(args: &ElectArgs, proposal: String) -> Result<i32> {
    let mut signals = Signals::install()?;
    let (client, session) = super::session::start(&args.endpoints, args.ttl).await?;
    let name = &args.name;
    let election = Election::new(&client, name.clone());
    // Dropping the campaign (Ctrl-C) withdraws it on the server; closing the session
    // (revoking the lease) deletes our key in any case.
    let won = tokio::select! {
        r = election.campaign(&session, proposal.clone()) => r,
        _ = signals.recv() => {
            close(&session, WHO, false).await;
            return Ok(0);
        }
    };
    let leadership = match won {
        Ok(l) => l,
        Err(Error::SessionLost(reason)) => {
            eprintln!(
                "{WHO}: lost the lease while campaigning in '{name}': {}",
                describe_loss(reason, &session)
            );
            close(&session, WHO, false).await;
            return Ok(EXIT_ERROR);
        }
        Err(e) => {
            close(&session, WHO, false).await;
            return Err(describe(e).context(format!("campaigning in '{name}'")));
        }
    };
    println!("{}", String::from_utf8_lossy(leadership.key()));
    println!("{proposal}");
    eprintln!("{WHO}: leader of '{name}'; Ctrl-C resigns");

    let lost = tokio::select! {
        _ = signals.recv() => None,
        reason = leadership.lost() => Some(reason),
    };
    if let Some(reason) = lost {
        eprintln!(
            "{WHO}: LOST leadership of '{name}': {}",
            describe_loss(reason, &session)
        );
        drop(leadership);
        close(&session, WHO, false).await;
        return Ok(EXIT_LOST);
    }
    // Resigning lets the next candidate in now rather than when our lease runs out.
    if let Err(e) = leadership.resign().await {
        eprintln!("{WHO}: warning: resigning: {:#}", describe(e));
    }
    close(&session, WHO, true).await;
    Ok(0)
}

async fn listen(args: &ElectArgs) -> Result<i32> {
    let mut signals = Signals::install()?;
    let endpoints: Vec<String> = args
        .endpoints
        .endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();
    let client = Client::connect(args.endpoints.config(endpoints))
        .await
        .map_err(describe)?;
    // The stream survives reconnects (it observes again and skips what it reported).
    let mut leaders = Election::new(&client, args.name.clone()).observe();
    let mut last: Option<(Vec<u8>, Vec<u8>)> = None;
    loop {
        let next = tokio::select! {
            n = leaders.next() => n,
            _ = signals.recv() => return Ok(0),
        };
        match next {
            Some(Ok(kv)) => {
                // A new leader, or a new proclamation; the same pair twice is not news.
                let current = (kv.key, kv.value);
                if last.as_ref() != Some(&current) {
                    println!("{}", String::from_utf8_lossy(&current.0));
                    println!("{}", String::from_utf8_lossy(&current.1));
                    last = Some(current);
                }
            }
            Some(Err(e)) => return Err(describe(e).context(format!("observing '{}'", args.name))),
            None => return Err(anyhow!("observing '{}': the stream ended", args.name)),
        }
    }
}
