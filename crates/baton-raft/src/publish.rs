//! Publishing this member's name and client URLs into the membership (etcd's `publish`), so
//! every member's `MemberList` shows them: [`run`] retries with backoff until the membership
//! shows them, then is done for this process's life. The leader's half is [`publish_local`].

use std::collections::BTreeMap;
use std::sync::Weak;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;
use tokio::time::Instant;

use crate::answer::{leader_error, ProposeError};
use crate::calls::PublishCall;
use crate::limits::{PUBLISH_RETRY_MAX, PUBLISH_RETRY_MIN, REQUEST_TIMEOUT};
use crate::replica::Replica;
use crate::routing::{Routed, Router};
use crate::types::Member;

/// The publishing task. Weak for the same reason as `ticker::run`.
pub(crate) async fn run(router: Weak<Router>) {
    let mut delay = PUBLISH_RETRY_MIN;
    loop {
        let Some(router) = router.upgrade() else {
            return;
        };
        let replica = router.replica();
        if replica.is_shutting_down() {
            return;
        }
        match publish_once(&router).await {
            Ok(true) => {
                let c = &replica.config;
                tracing::debug!(name = %c.name, client_urls = ?c.client_urls, "member attributes are in the membership");
                return;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(error = %e, "publishing member attributes failed; will retry");
                delay = (delay * 2).min(PUBLISH_RETRY_MAX);
            }
        }
        drop(router);
        tokio::time::sleep(delay).await;
    }
}

/// One round: `Ok(true)` once the membership shows this member's attributes, `Ok(false)` if
/// not yet (not in a membership yet, or just sent: the next round checks).
async fn publish_once(router: &Router) -> Result<bool, ProposeError> {
    let replica = router.replica();
    // Not in a membership yet (waiting to be contacted): nothing to publish into.
    let Some(current) = replica.membership_node(replica.member_id) else {
        return Ok(false);
    };
    let member = Member {
        name: replica.config.name.clone(),
        peer_urls: current.peer_urls.clone(),
        client_urls: replica.config.client_urls.clone(),
    };
    if member == current {
        return Ok(true);
    }
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let call = PublishCall {
        id: replica.member_id,
        member,
    };
    match router.route(call, deadline).await? {
        Routed::Local(PublishCall { id, member }) => publish_local(replica, id, member).await?,
        Routed::Remote(()) => {}
    }
    Ok(false)
}

/// The leader's half: records `member`'s name and client URLs for `id`, keeping the peer
/// URLs the membership has (changing those is a member update, not a publish). A membership
/// entry that changes no voter is a single uniform config.
pub(crate) async fn publish_local(
    replica: &Replica,
    id: u64,
    member: Member,
) -> Result<(), ProposeError> {
    replica.check_running()?;
    let Some(current) = replica.membership_node(id) else {
        return Err(ProposeError::MembershipChange(format!(
            "member {id:x} is not in the membership"
        )));
    };
    let node = Member {
        peer_urls: current.peer_urls.clone(),
        ..member
    };
    if node == current {
        return Ok(());
    }
    let change = ChangeMembers::SetNodes(BTreeMap::from([(id, node)]));
    match tokio::time::timeout(
        REQUEST_TIMEOUT,
        replica.raft.change_membership(change, true),
    )
    .await
    {
        Err(_) => Err(ProposeError::Timeout),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
            Err(leader_error(f.leader_id))
        }
        Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
            Err(ProposeError::MembershipChange(match e {
                ChangeMembershipError::InProgress(p) => format!("{p}"),
                other => other.to_string(),
            }))
        }
        Ok(Err(RaftError::Fatal(f))) => Err(replica.fatal_error(&f)),
    }
}
