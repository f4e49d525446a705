//! Joining an existing cluster from an empty data directory (`--initial-cluster-state
//! existing`): see the module docs of `membership`.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use crate::answer::InternalError;
use crate::config::NodeConfig;
use crate::credential::ClusterCredential;
use crate::error::{io_error, StartError};
use crate::files::{self, MemberMeta};
use crate::membership::change::{JoinError, JoinRequest, JoinResponse};
use crate::membership::plan::normalize;
use crate::network::{self, AskError};
use crate::wire;

/// How long a joining member keeps asking the listed peers for the membership.
const JOIN_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Joins an existing cluster from an empty data directory: asks the other members listed in
/// `--initial-cluster` for the membership, finds this member by its advertised peer URLs and
/// persists the identity found (member id, cluster id).
pub(crate) async fn join_existing(
    data_dir: &Path,
    config: &NodeConfig,
    token: &str,
    listed_peer_urls: Vec<String>,
) -> Result<MemberMeta, StartError> {
    let own = normalize(&config.peer_urls);
    let others: Vec<String> = listed_peer_urls
        .into_iter()
        .filter(|u| !own.contains(u.trim_end_matches('/')))
        .collect();
    let request = wire::encode(&JoinRequest {
        peer_urls: config.peer_urls.clone(),
        credential: ClusterCredential::of_token(token),
    })
    .map_err(|e| {
        tracing::error!(error = %e, "cannot encode the question to join");
        StartError::Internal(InternalError::EncodeRequest)
    })?;
    // Every listed member is asked in each round, and an answer that lists this member wins:
    // a lagging member may not have applied the MemberAdd yet. Only when every listed member
    // answered without it is the member refused at once; otherwise rounds repeat until the
    // deadline.
    let deadline = Instant::now() + JOIN_DISCOVERY_TIMEOUT;
    let mine = |answer: &JoinResponse| {
        answer
            .members
            .iter()
            .find(|(_, m)| normalize(&m.peer_urls) == own)
            .cloned()
    };
    let (cluster_id, (id, member), admitted) = 'found: loop {
        let mut errors = Vec::new();
        let mut answered_without_me = 0;
        let mut refused = 0;
        for url in &others {
            match network::ask_members(
                config.env.transport.as_deref(),
                url,
                request.clone(),
                Duration::from_secs(2),
            )
            .await
            {
                Ok(asked) => match wire::decode::<JoinResponse>(&asked.payload) {
                    Ok(answer) if answer.voters.is_empty() => {
                        errors.push(format!("{url}: not initialized yet"))
                    }
                    Ok(answer) => match mine(&answer) {
                        Some(found) => break 'found (asked.cluster_id, found, asked.credential),
                        None => answered_without_me += 1,
                    },
                    Err(e) => errors.push(format!("{url}: {e}")),
                },
                Err(AskError::Refused(e)) => {
                    refused += 1;
                    errors.push(format!("{url}: {e}"));
                }
                Err(AskError::Failed(e) | AskError::Transport(e)) => {
                    errors.push(format!("{url}: {e}"))
                }
            }
        }
        let out_of_time = Instant::now() >= deadline || others.is_empty();
        if answered_without_me > 0 && (answered_without_me == others.len() || out_of_time) {
            return Err(JoinError::NotAMember(config.peer_urls.clone()).into());
        }
        // Every member refused: no later round will go differently.
        if refused > 0 && refused == others.len() {
            return Err(JoinError::TokenRefused(errors.join("; ")).into());
        }
        if out_of_time {
            return Err(JoinError::NoPeerAnswered(errors.join("; ")).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    if !member.name.is_empty() {
        return Err(JoinError::AlreadyBootstrapped { id }.into());
    }
    // Admitted by `member add` (`admission`): the answer carries the cluster's credential,
    // which this member keeps and shows from now on in place of its token's.
    let credential = if admitted.is_empty() {
        None
    } else {
        let credential =
            ClusterCredential::from_bytes(&admitted).ok_or(JoinError::MalformedCredential)?;
        // A token given on purpose that is not the cluster's is a mistake (a wrong secret,
        // or the wrong cluster): refused, as on a restart (`start::cluster_credential`).
        if config.cluster.as_ref().is_some_and(|c| c.token_given) {
            return Err(StartError::TokenMismatch {
                path: data_dir.join("member.meta"),
            });
        }
        tracing::info!(
            member_id = format_args!("{id:x}"),
            "admitted by member add without --initial-cluster-token: this member keeps the \
             cluster credential it was given in member.meta"
        );
        Some(credential)
    };
    let meta = MemberMeta {
        member_id: id,
        cluster_id,
        name: config.name.clone(),
        credential,
    };
    let path = data_dir.join("member.meta");
    files::write_atomic(&path, &files::encode_member(&meta)).map_err(io_error(&path))?;
    tracing::info!(
        member_id = format_args!("{:x}", meta.member_id),
        cluster_id = format_args!("{:x}", meta.cluster_id),
        "joined an existing cluster; waiting for the leader to catch this member up"
    );
    Ok(meta)
}

/// How often a member waiting to be contacted by a new cluster's leader checks that it can
/// reach the other listed members.
const WAITING_PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// While a member of a new cluster waits to be contacted by the leader (it is not the
/// initializer), asks the other listed members for the membership every
/// [`WAITING_PROBE_INTERVAL`], only to see that their transport lets it in: a connection
/// refused by TLS (a certificate of another CA, a Common Name the peers do not allow) means
/// the leader cannot reach this member either, and nothing else would say so on this side.
/// Each such refusal is logged at WARN once per peer until it changes. Stops once Raft is
/// initialized (the leader got through) or shut down.
///
/// `credential` is what this member shows its peers: its token's, or the one it was given
/// when `member add` admitted it (`admission`; shown with any other, the probe would be
/// refused, and counted as a refusal, at every interval).
pub(crate) async fn probe_while_waiting(
    raft: crate::types::Raft,
    config: NodeConfig,
    credential: ClusterCredential,
    listed_peer_urls: Vec<String>,
) {
    let own = normalize(&config.peer_urls);
    let others: Vec<String> = listed_peer_urls
        .into_iter()
        .filter(|u| !own.contains(u.trim_end_matches('/')))
        .collect();
    let Ok(request) = wire::encode(&JoinRequest {
        peer_urls: config.peer_urls.clone(),
        credential,
    }) else {
        return;
    };
    let mut reported: std::collections::HashMap<String, String> = Default::default();
    loop {
        match raft.is_initialized().await {
            Ok(false) => {}
            Ok(true) | Err(_) => return,
        }
        for url in &others {
            let answer = network::ask_members(
                config.env.transport.as_deref(),
                url,
                request.clone(),
                WAITING_PROBE_INTERVAL,
            )
            .await;
            match answer {
                Err(AskError::Transport(why)) => {
                    if reported.get(url) != Some(&why) {
                        tracing::warn!(peer_url = %url, "peer connection failed: {why}");
                        reported.insert(url.clone(), why);
                    }
                }
                _ => {
                    reported.remove(url);
                }
            }
        }
        tokio::time::sleep(WAITING_PROBE_INTERVAL).await;
    }
}
