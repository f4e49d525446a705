//! etcd's corruption checks: the key space of every member compared by `HashKV` at one
//! revision.
//!
//! - `--experimental-initial-corrupt-check` ([`initial`]): before a member serves, each other
//!   member that has published a client URL is asked for `HashKV` at this member's revision;
//!   a different hash at the same compaction revision is corruption on one side, and the
//!   member refuses to start with etcd's words. A member that cannot answer (down, not there
//!   yet, behind this revision, compacted past it) is logged and skipped, as etcd does: the
//!   check only refuses on evidence.
//! - `--experimental-corrupt-check-time` ([`periodic`]): the leader asks the others the same
//!   way every period, and on a mismatch raises the `CORRUPT` alarm for the member whose hash
//!   differs from its own (`Node::raise_corrupt_alarm`; etcd's `checkHashKV`). etcd also
//!   raises it when a follower's revision or compaction revision is ahead of the leader's;
//!   Baton only logs those: a follower applies in its own task and may briefly be ahead of
//!   the leader's applied state, and a false `CORRUPT` stops the whole cluster.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use baton_client::{Client, ClientConfig, TlsConfig};

/// How long one member may take to connect and answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Compares this member's hash with the others'; `Err` on a mismatch.
pub async fn initial(node: &baton_raft::Node, tls: Option<TlsConfig>) -> Result<()> {
    let me = node.status().member_id;
    let (hash, revision, compacted) =
        local_hash(node).map_err(|e| anyhow!("initial corruption check: {e}"))?;
    let mut mismatches = 0;
    for member in node.members().into_iter().filter(|m| m.id != me) {
        if member.client_urls.is_empty() {
            tracing::warn!(
                peer = format_args!("{:x}", member.id),
                // Not "published": etcd's e2e suite takes any output line holding that word
                // for a member's ready line (scripts/e2e-etcd-wrapper).
                "initial corruption check: no client URL of the member is known yet; skipped"
            );
            continue;
        }
        match ask(&member.client_urls, revision, tls.as_ref()).await {
            Ok(peer) if peer.hash == hash => {}
            Ok(peer) if peer.compact_revision == compacted => {
                tracing::error!(
                    peer = format_args!("{:x}", member.id),
                    revision,
                    local_hash = hash,
                    peer_hash = peer.hash,
                    "initial corruption check: the key spaces differ at the same revision"
                );
                mismatches += 1;
            }
            Ok(peer) => tracing::warn!(
                peer = format_args!("{:x}", member.id),
                local_compacted = compacted,
                peer_compacted = peer.compact_revision,
                "initial corruption check: the hashes differ but so do the compaction revisions; not comparable"
            ),
            Err(e) => tracing::warn!(
                peer = format_args!("{:x}", member.id),
                error = %e,
                "initial corruption check: cannot ask the member; skipped"
            ),
        }
    }
    if mismatches > 0 {
        // etcd's words (etcdmain), which its e2e test and operators' alerts look for.
        bail!("etcdmain: {me:016x} found data inconsistency with peers");
    }
    tracing::info!(revision, "initial corruption check passed");
    Ok(())
}

/// A member's answer to `HashKV`.
struct PeerHash {
    hash: u32,
    compact_revision: i64,
    /// The member's own revision when it answered (the header's).
    revision: i64,
}

/// `HashKV` at `revision` from the member at `client_urls`, within [`ASK_TIMEOUT`] each for
/// connecting and answering.
async fn ask(
    client_urls: &[String],
    revision: i64,
    tls: Option<&TlsConfig>,
) -> baton_client::Result<PeerHash> {
    let mut config = ClientConfig::new(client_urls.to_vec())
        .with_connect_timeout(ASK_TIMEOUT)
        .with_request_timeout(ASK_TIMEOUT);
    if let Some(tls) = tls {
        config = config.with_tls(tls.clone());
    }
    let r = Client::connect(config).await?.hash_kv(revision).await?;
    Ok(PeerHash {
        hash: r.hash,
        compact_revision: r.compact_revision,
        revision: r.header.map_or(0, |h| h.revision),
    })
}

/// This member's `(hash, revision, compact revision)`.
fn local_hash(node: &baton_raft::Node) -> Result<(u32, i64, i64)> {
    let (hash, revision, compacted) =
        node.read(|sm| (sm.hash_kv(0), sm.revision().0, sm.compact_revision().0));
    let hash = hash.map_err(|e| anyhow!("hashing this member's key space: {e}"))?;
    Ok((hash, revision, compacted))
}

/// `--experimental-corrupt-check-time`: every `every`, if this member leads, compares the
/// members' key spaces ([`check_as_leader`]). Runs until the process ends.
pub async fn periodic(node: baton_raft::Node, tls: Option<TlsConfig>, every: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let st = node.status();
        if st.leader_id != Some(st.member_id) {
            continue;
        }
        match check_as_leader(&node, tls.as_ref()).await {
            Ok(None) => {}
            Ok(Some(id)) => tracing::error!(
                member = format_args!("{id:016x}"),
                "corruption check: raised the CORRUPT alarm"
            ),
            Err(e) => tracing::warn!(error = %e, "corruption check: not completed"),
        }
    }
}

/// One round of etcd's `checkHashKV` on the leader: its own hash, every other member's at
/// the same revision, its own again. Returns the member the `CORRUPT` alarm was raised for
/// (one per round, as etcd), if any.
async fn check_as_leader(node: &baton_raft::Node, tls: Option<&TlsConfig>) -> Result<Option<u64>> {
    let me = node.status().member_id;
    let (hash, revision, compacted) = local_hash(node)?;
    let mut answers = Vec::new();
    for member in node.members().into_iter().filter(|m| m.id != me) {
        if member.client_urls.is_empty() {
            continue;
        }
        let answer = ask(&member.client_urls, revision, tls).await;
        answers.push((member.id, answer));
    }
    let (hash2, revision2, compacted2) = local_hash(node)?;
    let mut corrupt = None;
    if hash2 != hash && revision2 == revision && compacted2 == compacted {
        tracing::warn!(
            hash,
            hash2,
            revision,
            "corruption check: this member hashed its own key space twice differently at the same revision"
        );
        corrupt = Some(me);
    }
    for (id, answer) in answers {
        let peer = match answer {
            Ok(peer) => peer,
            Err(e) => {
                tracing::debug!(peer = format_args!("{id:x}"), error = %e, "corruption check: cannot ask the member; skipped");
                continue;
            }
        };
        let peer_revision = peer.revision;
        if peer_revision > revision2 || peer.compact_revision > compacted2 {
            tracing::warn!(
                peer = format_args!("{id:x}"),
                peer_revision,
                peer_compacted = peer.compact_revision,
                revision = revision2,
                compacted = compacted2,
                "corruption check: the member is ahead of the leader (logged only, see the module docs)"
            );
        }
        if peer.compact_revision == compacted && peer.hash != hash {
            tracing::warn!(
                "corruption check: {id:016x}'s hash {} != leader's hash {hash} for revision {revision} (compact revision {compacted})",
                peer.hash
            );
            corrupt.get_or_insert(id);
        }
    }
    if let Some(id) = corrupt {
        // Raised already (an earlier round): nothing to propose; the alarm stays until an
        // operator disarms it.
        let raised = node.read(|sm| {
            sm.alarms()
                .iter()
                .any(|(member, alarm)| *member == id && alarm.name() == "CORRUPT")
        });
        if raised {
            return Ok(None);
        }
        node.raise_corrupt_alarm(id)
            .await
            .map_err(|e| anyhow!("raising the CORRUPT alarm for {id:016x}: {e}"))?;
    }
    Ok(corrupt)
}
