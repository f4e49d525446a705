//! `baton elect NAME PROPOSAL` and `baton elect --listen NAME`.
//!
//! Campaigning uses etcd's `v3election` service, so candidates started with `etcdctl elect`
//! and with `baton elect` take part in the same election (same key layout:
//! `NAME/<lease id in hex>`, oldest key leads).

use anyhow::{bail, Result};
use baton_proto::v3electionpb::{
    election_client::ElectionClient, CampaignRequest, LeaderKey, LeaderRequest, ResignRequest,
};
use clap::Args;
use tonic::transport::Channel;

use super::connect::connect;
use super::session::Session;
use super::{describe_status, EndpointArgs, Signals, EXIT_ERROR, EXIT_LOST};

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
            eprintln!("baton elect: {e:#}");
            EXIT_ERROR
        }
    }
}

async fn campaign(args: &ElectArgs, proposal: String) -> Result<i32> {
    let mut signals = Signals::install()?;
    let (channel, _) = connect(&args.endpoints.endpoints).await?;
    let mut session = Session::grant(channel.clone(), args.ttl).await?;
    let mut election = ElectionClient::new(channel.clone());
    let name = &args.name;
    let request = CampaignRequest {
        name: name.clone().into_bytes(),
        lease: session.lease_id,
        value: proposal.clone().into_bytes(),
    };
    let won = tokio::select! {
        r = election.campaign(request) => r,
        reason = session.lost() => {
            eprintln!("baton elect: lost the lease while campaigning in '{name}': {reason}");
            let _ = session.revoke().await;
            return Ok(EXIT_ERROR);
        }
        _ = signals.recv() => {
            // Revoking the lease withdraws the candidacy (deletes our key).
            let _ = session.revoke().await;
            return Ok(0);
        }
    };
    let leader = match won {
        Ok(r) => match r.into_inner().leader {
            Some(l) => l,
            None => {
                let _ = session.revoke().await;
                bail!("campaign in '{name}': the server answered without a leader key");
            }
        },
        Err(s) => {
            let _ = session.revoke().await;
            bail!(describe_status(&format!("campaigning in '{name}'"), &s));
        }
    };
    println!("{}", String::from_utf8_lossy(&leader.key));
    println!("{proposal}");
    eprintln!("baton elect: leader of '{name}'; Ctrl-C resigns");

    let key_gone = super::watch::key_deleted(channel, leader.key.clone(), leader.rev);
    let lost = tokio::select! {
        _ = signals.recv() => None,
        reason = session.lost() => Some(reason),
        reason = key_gone => Some(reason),
    };
    if let Some(reason) = lost {
        eprintln!("baton elect: LOST leadership of '{name}': {reason}");
        let _ = session.revoke().await;
        return Ok(EXIT_LOST);
    }
    resign(&mut election, leader).await;
    if let Err(e) = session.revoke().await {
        eprintln!("baton elect: warning: {e:#}");
    }
    Ok(0)
}

/// Resigns so the next candidate is elected now rather than when our lease runs out.
async fn resign(election: &mut ElectionClient<Channel>, leader: LeaderKey) {
    let call = election.resign(ResignRequest {
        leader: Some(leader),
    });
    match tokio::time::timeout(std::time::Duration::from_secs(3), call).await {
        Ok(Ok(_)) => {}
        Ok(Err(s)) => eprintln!("baton elect: warning: {}", describe_status("resigning", &s)),
        Err(_) => eprintln!("baton elect: warning: resigning: no answer within 3 s"),
    }
}

async fn listen(args: &ElectArgs) -> Result<i32> {
    let mut signals = Signals::install()?;
    let (channel, _) = connect(&args.endpoints.endpoints).await?;
    let mut election = ElectionClient::new(channel);
    let observe = election.observe(LeaderRequest {
        name: args.name.clone().into_bytes(),
    });
    let mut stream = tokio::select! {
        r = observe => match r {
            Ok(r) => r.into_inner(),
            Err(s) => bail!(describe_status(&format!("observing '{}'", args.name), &s)),
        },
        _ = signals.recv() => return Ok(0),
    };
    let mut last: Option<(Vec<u8>, Vec<u8>)> = None;
    loop {
        let msg = tokio::select! {
            m = stream.message() => m,
            _ = signals.recv() => return Ok(0),
        };
        match msg {
            Ok(Some(resp)) => {
                let Some(kv) = resp.kv else { continue };
                let current = (kv.key, kv.value);
                if last.as_ref() != Some(&current) {
                    println!("{}", String::from_utf8_lossy(&current.0));
                    println!("{}", String::from_utf8_lossy(&current.1));
                    last = Some(current);
                }
            }
            Ok(None) => bail!("observing '{}': the server ended the stream", args.name),
            Err(s) => bail!(describe_status(&format!("observing '{}'", args.name), &s)),
        }
    }
}
