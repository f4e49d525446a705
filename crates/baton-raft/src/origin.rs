//! Who may cause a command to be proposed: a client, or only the leader's own duties.
//!
//! Most commands are a client's request, made on any member and forwarded to the leader if
//! need be. A few are decided by the leader alone, from state only it has: lease expiry (its
//! lease clock says a deadline passed), lease checkpoints (remaining TTLs it measured) and
//! blank entries, and installing a fencing-token signing key (it draws the key itself: bootstrap, rotation).
//! Applied from anywhere else they are an attack, not a request: a forged
//! `ExpireLeases` expires a live lease at once, whatever its TTL (issue 14). So every
//! command that enters a replica from outside — the public [`crate::Node::propose`] and
//! forwarded `Propose` requests on the peer service — is classified by [`origin`] before it
//! is proposed, and the leader's duties propose through `Replica::propose`, which nothing
//! outside the crate reaches.
//!
//! [`origin`] is an exhaustive `match` on `Command` without a wildcard: a new variant does
//! not compile until someone decides who may send it.

use baton_core::Command;
use serde::{Deserialize, Serialize};

/// A command that only the leader's own duties propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaderDuty {
    /// Blank entries (openraft's, and the one of a new term) carry no command of their own.
    Noop,
    /// The unfenced expiry: deletes every key of the listed leases, live or not.
    ExpireLeases,
    /// The leader's lease clock decided these leases are past their deadline.
    ExpireLeasesInTerm,
    /// Remaining TTLs measured on the leader's lease clock; a forged one would shorten a
    /// lease after the next leader change.
    LeaseCheckpoint,
    /// Obsolete, never returned since issue 18: raising an alarm was the leader's duty
    /// until `Maintenance.Alarm` ACTIVATE became a client's request, as in etcd (root only
    /// with auth on). Kept in place: this enum travels in `ProposeError::LeaderOnly`
    /// between members, and its variants are positions.
    RaiseAlarm,
    /// Installing a fencing-token signing key (`Command::FencingKey`, bootstrap or
    /// rotation): the leader draws the seed itself (`fencing_duty`), so nobody outside it
    /// — a client through a server, a peer holding the cluster token — can make the
    /// cluster sign with a key of their choice (whoever chose it could forge every token).
    /// An operator asks for a rotation (`Node::rotate_fencing_key`), never proposes the key.
    /// Appended last: this enum travels between members.
    FencingKey,
}

impl LeaderDuty {
    /// The command's name, as in `baton_core::Command` (also the metric label's subject).
    pub fn name(self) -> &'static str {
        match self {
            LeaderDuty::Noop => "Noop",
            LeaderDuty::ExpireLeases => "ExpireLeases",
            LeaderDuty::ExpireLeasesInTerm => "ExpireLeasesInTerm",
            LeaderDuty::LeaseCheckpoint => "LeaseCheckpoint",
            LeaderDuty::RaiseAlarm => "Alarm(Activate)",
            LeaderDuty::FencingKey => "FencingKey",
        }
    }
}

impl std::fmt::Display for LeaderDuty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who may cause a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A client's request through any member's API (the baton-server services propose it
    /// with `Node::propose`; a follower forwards it to the leader).
    Client,
    /// Only the leader itself, from its own duties, through the crate-internal entry point.
    Leader(LeaderDuty),
}

/// Classifies `command`. A `Deduplicated` wrapper has the origin of the command it wraps
/// (unwrapped in a loop, so no nesting depth a sender chooses can recurse); the core refuses
/// wrapping anything but plain writes and fence checks, but that is its rule, not this one.
pub fn origin(command: &Command) -> Origin {
    let mut command = command;
    loop {
        let duty = match command {
            Command::Deduplicated { command: inner, .. }
            | Command::Authorized { command: inner, .. } => {
                command = inner;
                continue;
            }
            // What the baton-server services propose for their clients: KV (kv.rs,
            // v3lock.rs unlock, locks.rs fenced puts), compaction, leases (lease.rs), locks
            // (locks.rs, baton_v1.rs force-release is an operator's request), the fence
            // gate (baton_v1.rs), and exactly-once sessions (exactly_once.rs: a session is
            // opened and closed by its client; idle ones expire by entry time in the core,
            // not by a command).
            Command::Put(_)
            | Command::DeleteRange(_)
            | Command::Txn(_)
            | Command::Compact { .. }
            | Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
            | Command::LockEnqueue { .. }
            | Command::LockForceRelease { .. }
            | Command::FenceCheck { .. }
            | Command::RegisterClient { .. }
            | Command::UnregisterClient { .. }
            // The auth store's changes and token issues (maintenance.rs's Auth service).
            | Command::Auth(_)
            // etcd's `Maintenance.Alarm` ACTIVATE and DEACTIVATE (root only once auth is
            // on, checked by the server), and every member's own disk and quota watch
            // (`disk_watch`), which raises its alarm through the leader like a client.
            | Command::Alarm { .. } => return Origin::Client,
            Command::Noop => LeaderDuty::Noop,
            Command::ExpireLeases { .. } => LeaderDuty::ExpireLeases,
            Command::ExpireLeasesInTerm { .. } => LeaderDuty::ExpireLeasesInTerm,
            Command::LeaseCheckpoint { .. } => LeaderDuty::LeaseCheckpoint,
            Command::FencingKey { .. } => LeaderDuty::FencingKey,
        };
        return Origin::Leader(duty);
    }
}

/// `Ok` if a client may cause `command`; else the duty it belongs to.
pub(crate) fn client_may_propose(command: &Command) -> Result<(), LeaderDuty> {
    match origin(command) {
        Origin::Client => Ok(()),
        Origin::Leader(duty) => Err(duty),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_core::{
        AlarmAction, DeleteRangeRequest, KeyRange, LeaseId, PutRequest, Term, TxnRequest,
    };

    /// One command of every variant, with its expected origin. The match inside makes this
    /// list fail to compile when a variant is added, like `origin` itself.
    fn every_variant() -> Vec<(Command, Origin)> {
        let put = Command::Put(PutRequest {
            key: b"k".to_vec(),
            ..Default::default()
        });
        let all = vec![
            Command::Noop,
            put.clone(),
            Command::DeleteRange(DeleteRangeRequest {
                range: KeyRange {
                    key: b"k".to_vec(),
                    range_end: Vec::new(),
                },
                prev_kv: false,
            }),
            Command::Txn(TxnRequest::default()),
            Command::Compact {
                revision: baton_core::Revision(1),
            },
            Command::LeaseGrant {
                id: LeaseId(1),
                ttl_s: 600,
            },
            Command::LeaseRevoke { id: LeaseId(1) },
            Command::ExpireLeases {
                ids: vec![LeaseId(1)],
            },
            Command::ExpireLeasesInTerm {
                term: Term(3),
                ids: vec![LeaseId(1)],
            },
            Command::LeaseCheckpoint {
                checkpoints: vec![(LeaseId(1), 1)],
            },
            Command::LockEnqueue {
                name: b"l".to_vec(),
                lease: LeaseId(1),
                value: Vec::new(),
                delay_ms: None,
            },
            Command::LockForceRelease {
                name: b"l".to_vec(),
                token: baton_core::FencingToken::NONE,
                reason: "stuck".into(),
            },
            Command::FenceCheck {
                resource: b"r".to_vec(),
                token: baton_core::FencingToken(1),
            },
            Command::RegisterClient { timeout_ms: 1000 },
            Command::UnregisterClient { client_id: 1 },
            Command::Deduplicated {
                client_id: 1,
                sequence: 1,
                acknowledged_below: 0,
                command: Box::new(put),
            },
            Command::Alarm {
                action: AlarmAction::Activate,
                member_id: 1,
                alarm: baton_core::AlarmType::NoSpace,
            },
            Command::Alarm {
                action: AlarmAction::Deactivate,
                member_id: 1,
                alarm: baton_core::AlarmType::NoSpace,
            },
            Command::Auth(baton_core::AuthCommand::Enable),
            Command::Authorized {
                auth: baton_core::AuthInfo {
                    user: "u".into(),
                    revision: 1,
                },
                command: Box::new(Command::Put(PutRequest::default())),
            },
            Command::FencingKey {
                mode: baton_core::FencingKeyMode::Rotate,
                public: baton_core::FencingPublicKey([1; 32]),
                secret: baton_core::FencingSecret([2; 32]),
            },
        ];
        all.into_iter()
            .map(|c| {
                let expected = match &c {
                    Command::Noop => Origin::Leader(LeaderDuty::Noop),
                    Command::ExpireLeases { .. } => Origin::Leader(LeaderDuty::ExpireLeases),
                    Command::ExpireLeasesInTerm { .. } => {
                        Origin::Leader(LeaderDuty::ExpireLeasesInTerm)
                    }
                    Command::LeaseCheckpoint { .. } => Origin::Leader(LeaderDuty::LeaseCheckpoint),
                    Command::FencingKey { .. } => Origin::Leader(LeaderDuty::FencingKey),
                    Command::Alarm { .. } => Origin::Client,
                    Command::Put(_)
                    | Command::DeleteRange(_)
                    | Command::Txn(_)
                    | Command::Compact { .. }
                    | Command::LeaseGrant { .. }
                    | Command::LeaseRevoke { .. }
                    | Command::LockEnqueue { .. }
                    | Command::LockForceRelease { .. }
                    | Command::FenceCheck { .. }
                    | Command::RegisterClient { .. }
                    | Command::UnregisterClient { .. }
                    | Command::Auth(_)
                    | Command::Deduplicated { .. } => Origin::Client,
                    Command::Authorized { .. } => Origin::Client,
                };
                (c, expected)
            })
            .collect()
    }

    #[test]
    fn every_command_is_classified() {
        let cases = every_variant();
        assert_eq!(
            cases.len(),
            21,
            "one case per Command variant (two for Alarm)"
        );
        for (command, expected) in cases {
            assert_eq!(origin(&command), expected, "{command:?}");
            assert_eq!(
                client_may_propose(&command).is_ok(),
                expected == Origin::Client,
                "{command:?}"
            );
        }
    }

    #[test]
    fn the_leaders_duties_are_exactly_these() {
        let wrapped_duty = Command::Authorized {
            auth: baton_core::AuthInfo {
                user: "u".into(),
                revision: 1,
            },
            command: Box::new(Command::Noop),
        };
        assert_eq!(origin(&wrapped_duty), Origin::Leader(LeaderDuty::Noop));
        let duties: Vec<LeaderDuty> = every_variant()
            .into_iter()
            .filter_map(|(c, _)| client_may_propose(&c).err())
            .collect();
        assert_eq!(
            duties,
            [
                LeaderDuty::Noop,
                LeaderDuty::ExpireLeases,
                LeaderDuty::ExpireLeasesInTerm,
                LeaderDuty::LeaseCheckpoint,
                LeaderDuty::FencingKey
            ]
        );
    }

    #[test]
    fn a_wrapper_has_the_origin_of_what_it_wraps() {
        let wrap = |c: Command| Command::Deduplicated {
            client_id: 7,
            sequence: 1,
            acknowledged_below: 0,
            command: Box::new(c),
        };
        let expiry = Command::ExpireLeases {
            ids: vec![LeaseId(5)],
        };
        assert_eq!(
            origin(&wrap(expiry.clone())),
            Origin::Leader(LeaderDuty::ExpireLeases)
        );
        // Nested as deep as a sender likes, still found, without recursion.
        let mut deep = expiry;
        for _ in 0..100_000 {
            deep = wrap(deep);
        }
        assert_eq!(origin(&deep), Origin::Leader(LeaderDuty::ExpireLeases));
        // Dropping a 100k-deep Box chain recursively could overflow the test's stack.
        std::mem::forget(deep);
        assert_eq!(
            origin(&wrap(wrap(Command::FenceCheck {
                resource: b"r".to_vec(),
                token: baton_core::FencingToken(1)
            }))),
            Origin::Client
        );
    }
}
