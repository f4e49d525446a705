//! `--experimental-initial-corrupt-check`: before a member serves, its key space is compared
//! with every other member's (etcd's initial corruption check). Each member that has
//! published a client URL is asked for `HashKV` at this member's revision; a different hash
//! at the same compaction revision is corruption on one side, and the member refuses to
//! start. A member that cannot answer (down, not there yet, behind this revision, compacted
//! past it) is logged and skipped, as etcd does: the check only refuses on evidence.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use baton_client::{Client, ClientConfig, TlsConfig};

/// How long one member may take to connect and answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Compares this member's hash with the others'; `Err` on a mismatch.
pub async fn initial(node: &baton_raft::Node, tls: Option<TlsConfig>) -> Result<()> {
    let me = node.status().member_id;
    let (hash, revision, compacted) =
        node.read(|sm| (sm.hash_kv(0), sm.revision().0, sm.compact_revision().0));
    let hash = hash
        .map_err(|e| anyhow!("initial corruption check: hashing this member's key space: {e}"))?;
    let mut mismatches = 0;
    for member in node.members().into_iter().filter(|m| m.id != me) {
        if member.client_urls.is_empty() {
            tracing::warn!(
                peer = format_args!("{:x}", member.id),
                "initial corruption check: the member has not published a client URL yet; skipped"
            );
            continue;
        }
        let mut config = ClientConfig::new(member.client_urls.clone())
            .with_connect_timeout(ASK_TIMEOUT)
            .with_request_timeout(ASK_TIMEOUT);
        if let Some(tls) = &tls {
            config = config.with_tls(tls.clone());
        }
        let answer = match Client::connect(config).await {
            Ok(client) => client.hash_kv(revision).await,
            Err(e) => Err(e),
        };
        match answer {
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
