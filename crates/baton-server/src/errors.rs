//! The one table that turns Baton's internal errors into etcd's status codes and messages.
//!
//! Clients (the Go client's `rpctypes`, jetcd, the `etcd-client` crate) match errors by the
//! exact message text, so every message here is byte-identical to etcd's.

use std::borrow::Cow;

use baton_core::{AuthError, FencingToken, KvError};
use baton_raft::{MemberError, ProposeError, TransferError};
use tonic::{Code, Status};

/// etcd's message when the cluster has no leader.
pub const NO_LEADER: &str = "etcdserver: no leader";
/// etcd's message when a request was cut short by a leader change.
pub const LEADER_CHANGED: &str = "etcdserver: leader changed";
/// etcd's message when a request did not finish in time.
pub const TIMED_OUT: &str = "etcdserver: request timed out";
/// etcd's message when a request's fate is unknown because the leader failed
/// (`ErrTimeoutDueToLeaderFail`).
pub const TIMED_OUT_LEADER_FAIL: &str =
    "etcdserver: request timed out, possibly due to previous leader failure";
/// etcd's message for an RPC a learner does not serve (code `Unavailable`).
pub const NOT_SUPPORTED_FOR_LEARNER: &str = "etcdserver: rpc not supported for learner";
/// etcd's message for an oversized request.
pub const TOO_LARGE: &str = "etcdserver: request is too large";
/// etcd's `ErrGRPCNoSpace` (code `ResourceExhausted`): a `NOSPACE` alarm is raised, or this
/// member's disk is nearly full, and the request would add data.
pub const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";
/// etcd's `ErrGRPCCorrupt` (code `DataLoss`): a `CORRUPT` alarm is raised and the request
/// would change keys or leases.
pub const CORRUPT: &str = "etcdserver: corrupt cluster";
/// etcd's `ErrGRPCStopped` (code `Unavailable`).
pub const STOPPED: &str = "etcdserver: server stopped";

/// etcd's v3election errors. etcd returns them as plain Go errors, which gRPC reports with
/// code `Unknown`; clients match the text, so Baton sends the same code and text.
pub const ELECTION_NO_LEADER: &str = "election: no leader";
/// Proclaim by someone whose leader key is gone or was re-created.
pub const ELECTION_NOT_LEADER: &str = "election: not leader";
/// Proclaim or Resign without a `leader`.
pub const ELECTION_MISSING_LEADER: &str = "\"leader\" field must be provided";

/// Maps a domain error to etcd's status (Baton's own lock and fence errors get the closest
/// gRPC code and a `baton:` message).
pub fn kv_status(err: &KvError) -> Status {
    let code = match err {
        KvError::EmptyKey
        | KvError::TooManyOps
        | KvError::DuplicateKey
        | KvError::RequestTooLarge => Code::InvalidArgument,
        KvError::KeyNotFound => Code::InvalidArgument,
        KvError::LeaseNotFound => Code::NotFound,
        KvError::LeaseExists => Code::FailedPrecondition,
        KvError::LeaseTtlTooLarge => Code::OutOfRange,
        KvError::Compacted | KvError::FutureRevision => Code::OutOfRange,
        KvError::LeaseRequired
        | KvError::EmptyLockName
        | KvError::EmptyFenceResource
        | KvError::InvalidFencingToken
        | KvError::ReasonRequired
        | KvError::ReasonTooLong
        | KvError::LockDelayTooLong => Code::InvalidArgument,
        KvError::NotHolder => Code::FailedPrecondition,
        KvError::LockRegistryFull | KvError::FenceTableFull => Code::ResourceExhausted,
        // The session is gone or the sequence acknowledged: retrying the same request
        // cannot succeed, and whether an earlier attempt was applied is unknown.
        KvError::UnknownClient | KvError::StaleSequence => Code::FailedPrecondition,
        KvError::InvalidSequence | KvError::NotDeduplicable => Code::InvalidArgument,
        KvError::NoSpace => Code::ResourceExhausted,
        KvError::Auth(e) => return auth_status(*e),
        KvError::MisplacedAuthorized => Code::Internal,
        KvError::Corrupt => Code::DataLoss,
    };
    Status::new(code, kv_message(err))
}

/// etcd's `ErrGRPCInvalidAuthToken` (code `Unauthenticated`): clients authenticate again
/// when they see it.
pub const INVALID_AUTH_TOKEN: &str = "etcdserver: invalid auth token";

/// etcd's `rpctypes` status of an auth store refusal, code and message byte for byte.
pub fn auth_status(err: AuthError) -> Status {
    let code = match err {
        AuthError::UserEmpty
        | AuthError::AuthFailed
        | AuthError::RoleEmpty
        | AuthError::InvalidAuthMgmt
        | AuthError::AuthOldRevision => Code::InvalidArgument,
        AuthError::PermissionDenied => Code::PermissionDenied,
        AuthError::UserAlreadyExist
        | AuthError::UserNotFound
        | AuthError::RoleAlreadyExist
        | AuthError::RoleNotFound
        | AuthError::RoleNotGranted
        | AuthError::PermissionNotGranted
        | AuthError::RootUserNotExist
        | AuthError::RootRoleNotExist
        | AuthError::AuthNotEnabled => Code::FailedPrecondition,
    };
    Status::new(code, auth_message(err))
}

/// etcd's words for an auth store refusal.
pub fn auth_message(err: AuthError) -> &'static str {
    match err {
        AuthError::UserEmpty => "etcdserver: user name is empty",
        AuthError::AuthFailed => "etcdserver: authentication failed, invalid user ID or password",
        AuthError::UserAlreadyExist => "etcdserver: user name already exists",
        AuthError::UserNotFound => "etcdserver: user name not found",
        AuthError::RoleAlreadyExist => "etcdserver: role name already exists",
        AuthError::RoleNotFound => "etcdserver: role name not found",
        AuthError::RoleEmpty => "etcdserver: role name is empty",
        AuthError::PermissionDenied => "etcdserver: permission denied",
        AuthError::RoleNotGranted => "etcdserver: role is not granted to the user",
        AuthError::PermissionNotGranted => "etcdserver: permission is not granted to the role",
        AuthError::RootUserNotExist => "etcdserver: root user does not exist",
        AuthError::RootRoleNotExist => "etcdserver: root user does not have root role",
        AuthError::AuthNotEnabled => "etcdserver: authentication is not enabled",
        AuthError::AuthOldRevision => "etcdserver: revision of auth store is old",
        AuthError::InvalidAuthMgmt => "etcdserver: invalid auth management",
    }
}

/// What grpc-go's `status.Error(...).Error()` reads for `status`: etcd puts this text in a
/// watch's `cancel_reason` (and clients compare it whole).
pub fn go_status_text(status: &Status) -> String {
    let code = match status.code() {
        Code::PermissionDenied => "PermissionDenied",
        Code::InvalidArgument => "InvalidArgument",
        Code::Unauthenticated => "Unauthenticated",
        Code::FailedPrecondition => "FailedPrecondition",
        other => return format!("rpc error: code = {other:?} desc = {}", status.message()),
    };
    format!("rpc error: code = {code} desc = {}", status.message())
}

/// What a client reads for a domain error: etcd's message byte for byte (its `rpctypes`;
/// clients match the text), and for Baton's own errors a `baton:` message. The core only
/// names what happened (`KvError`'s `Display`); the words are said here.
pub fn kv_message(err: &KvError) -> Cow<'static, str> {
    match err {
        KvError::EmptyKey => "etcdserver: key is not provided".into(),
        KvError::KeyNotFound => "etcdserver: key not found".into(),
        KvError::LeaseNotFound => "etcdserver: requested lease not found".into(),
        KvError::LeaseExists => "etcdserver: lease already exists".into(),
        KvError::LeaseTtlTooLarge => "etcdserver: too large lease TTL".into(),
        KvError::TooManyOps => "etcdserver: too many operations in txn request".into(),
        KvError::DuplicateKey => "etcdserver: duplicate key given in txn request".into(),
        KvError::Compacted => "etcdserver: mvcc: required revision has been compacted".into(),
        KvError::FutureRevision => {
            "etcdserver: mvcc: required revision is a future revision".into()
        }
        KvError::RequestTooLarge => TOO_LARGE.into(),
        KvError::LeaseRequired => "baton: a lease is required (lease = 0); etcd would silently \
                                   attach an orphan 60 s lease here and the lock would vanish \
                                   without notice"
            .into(),
        KvError::EmptyLockName => "baton: lock name is not provided".into(),
        KvError::EmptyFenceResource => "baton: fence resource is not provided".into(),
        KvError::InvalidFencingToken => "baton: fencing token must be positive".into(),
        KvError::ReasonRequired => "baton: a reason is required for a force-release".into(),
        KvError::ReasonTooLong => format!(
            "baton: force-release reason is longer than {} bytes",
            baton_core::MAX_REASON_BYTES
        )
        .into(),
        KvError::NotHolder => "baton: not the holder".into(),
        KvError::LockDelayTooLong => format!(
            "baton: lock delay is longer than {} ms",
            baton_core::MAX_LOCK_DELAY_MS
        )
        .into(),
        KvError::LockRegistryFull => format!(
            "baton: lock registry is full ({} locks)",
            baton_core::MAX_LOCKS
        )
        .into(),
        KvError::FenceTableFull => format!(
            "baton: fence table is full ({} resources)",
            baton_core::MAX_FENCE_RESOURCES
        )
        .into(),
        KvError::UnknownClient => {
            "baton: client session not found (expired or never registered)".into()
        }
        KvError::StaleSequence => {
            "baton: request sequence already acknowledged; use a new sequence number".into()
        }
        KvError::InvalidSequence => "baton: request sequence must be positive".into(),
        KvError::NotDeduplicable => "baton: this request cannot be de-duplicated".into(),
        KvError::NoSpace => NO_SPACE.into(),
        KvError::Auth(e) => auth_message(*e).into(),
        KvError::MisplacedAuthorized => "baton: internal error: misplaced auth wrapper".into(),
        KvError::Corrupt => CORRUPT.into(),
    }
}

/// Why a lock acquisition did not end with the caller holding the lock (Baton's own; etcd's
/// Lock RPC has no such outcomes besides its context errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockError {
    /// `try_only` and another key heads the queue.
    Held {
        holder_key: Vec<u8>,
        token: FencingToken,
    },
    /// `try_only` and the lock is in lock-delay after an expired holder.
    Delayed { until_ms: u64 },
    /// The waiter's own key disappeared while it waited (lease expired, revoked, deleted or
    /// force-released).
    WaiterKeyDeleted,
    /// The waiter reached the head but its lease is no longer alive (etcd#11456).
    LeaseExpired,
    /// `timeout_ms` passed; the waiter's key was deleted.
    TimedOut { after_ms: u64 },
    /// Too many acquisitions waiting on this server at once.
    TooManyWaiters { limit: usize },
    /// The fenced write's token is not the current holder's.
    FencingTokenRejected,
}

/// Maps a lock outcome to its status.
pub fn lock_status(err: &LockError) -> Status {
    match err {
        LockError::Held { holder_key, token } => Status::failed_precondition(format!(
            "baton: lock is held by {} (fencing token {token})",
            String::from_utf8_lossy(holder_key)
        )),
        LockError::Delayed { until_ms } => Status::failed_precondition(format!(
            "baton: lock is in lock-delay after an expired holder until {until_ms} \
             (ms since the Unix epoch, leader time)"
        )),
        LockError::WaiterKeyDeleted => Status::failed_precondition(
            "baton: lock waiter's key was deleted while waiting (lease expired or revoked, or \
             force-released)",
        ),
        LockError::LeaseExpired => {
            Status::failed_precondition("baton: the lease expired before the lock could be granted")
        }
        LockError::TimedOut { after_ms } => Status::deadline_exceeded(format!(
            "baton: lock not acquired within {after_ms} ms (the waiter's key was deleted)"
        )),
        LockError::TooManyWaiters { limit } => Status::resource_exhausted(format!(
            "baton: too many lock acquisitions waiting on this member (limit {limit})"
        )),
        LockError::FencingTokenRejected => {
            Status::failed_precondition("baton: fencing token rejected")
        }
    }
}

/// Maps a replication failure to etcd's status.
pub fn propose_status(err: &ProposeError) -> Status {
    match err {
        ProposeError::NoLeader | ProposeError::NotLeader { .. } => Status::unavailable(NO_LEADER),
        ProposeError::LeaderChanged => Status::unavailable(LEADER_CHANGED),
        ProposeError::Timeout => Status::unavailable(TIMED_OUT),
        ProposeError::ShuttingDown => Status::unavailable(STOPPED),
        // The replica's Raft core has stopped on a storage error (logged where it
        // happened): it serves nothing that needs Raft any more, which is what etcd says
        // of a stopped server. openraft's own description never reaches a client.
        ProposeError::Storage(_) => Status::unavailable(STOPPED),
        // The same for a Raft core that stopped or panicked without being asked to.
        ProposeError::Halted(_) => Status::unavailable(STOPPED),
        ProposeError::NoSpace => Status::resource_exhausted(NO_SPACE),
        ProposeError::LeaderFailed(_) => Status::unavailable(TIMED_OUT_LEADER_FAIL),
        ProposeError::MembershipChange(msg) => {
            Status::failed_precondition(format!("baton: membership change refused: {msg}"))
        }
        ProposeError::TooManyRequests => {
            Status::resource_exhausted("etcdserver: too many requests")
        }
        // No client request converts to a leader-only command: reaching this is a bug in
        // this server, not the client's doing.
        ProposeError::LeaderOnly(_) => Status::internal(err.to_string()),
        // A bug of this build (or members of different builds): said as what it is.
        ProposeError::Internal(e) => Status::internal(format!("baton: internal error: {e}")),
    }
}

/// Maps a refused membership change to etcd's status (`rpctypes`: `ErrGRPCMemberNotFound`,
/// `ErrGRPCPeerURLExist`, …).
pub fn member_status(err: &MemberError) -> Status {
    match err {
        MemberError::NotFound => Status::not_found("etcdserver: member not found"),
        MemberError::PeerUrlsExist => {
            Status::failed_precondition("etcdserver: Peer URLs already exists")
        }
        MemberError::BadUrls => {
            Status::invalid_argument("etcdserver: given member URLs are invalid")
        }
        MemberError::NotLearner => {
            Status::failed_precondition("etcdserver: can only promote a learner member")
        }
        MemberError::LearnerNotReady => Status::failed_precondition(
            "etcdserver: can only promote a learner member which is in sync with leader",
        ),
        MemberError::TooManyLearners => {
            Status::failed_precondition("etcdserver: too many learner members in cluster")
        }
        MemberError::NotEnoughStarted => Status::failed_precondition(
            "etcdserver: re-configuration failed due to not enough started members",
        ),
        MemberError::Unhealthy => Status::unavailable("etcdserver: unhealthy cluster"),
        MemberError::NotClustered => Status::failed_precondition(
            "baton: this member was started without --initial-cluster and cannot have peers",
        ),
        MemberError::Propose(e) => propose_status(e),
    }
}

/// Maps a failed fencing-key rotation: served only by the leader, so a follower answers as
/// etcd's MoveLeader does (`ErrGRPCNotLeader`), which tells a client to ask the leader
/// rather than to wait for one; everything else is a replication failure.
pub fn rotate_key_status(err: &ProposeError) -> Status {
    match err {
        ProposeError::NotLeader { .. } => Status::failed_precondition("etcdserver: not leader"),
        other => propose_status(other),
    }
}

/// Maps a failed leader transfer to etcd's status (`ErrGRPCNotLeader`,
/// `ErrGRPCBadLeaderTransferee`, `ErrGRPCTimeoutLeaderTransfer`).
pub fn transfer_status(err: &TransferError) -> Status {
    match err {
        TransferError::NotLeader => Status::failed_precondition("etcdserver: not leader"),
        TransferError::BadTransferee => {
            Status::failed_precondition("etcdserver: bad leader transferee")
        }
        TransferError::InProgress => {
            Status::failed_precondition("baton: a leader transfer is already in progress")
        }
        TransferError::Timeout => {
            Status::unavailable("etcdserver: request timed out, leader transfer took too long")
        }
        TransferError::Propose(e) => propose_status(e),
    }
}

/// The error for an RPC that Baton does not offer yet; names what is missing instead of
/// gRPC's bare "unimplemented".
pub fn not_supported(what: &str) -> Status {
    Status::unimplemented(format!("baton: {what} is not supported yet"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_raft::LeaderDuty;

    #[test]
    fn membership_and_transfer_errors_are_etcds() {
        let cases = [
            (
                member_status(&MemberError::NotFound),
                Code::NotFound,
                "etcdserver: member not found",
            ),
            (
                member_status(&MemberError::PeerUrlsExist),
                Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
            (
                member_status(&MemberError::NotLearner),
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member",
            ),
            (
                member_status(&MemberError::LearnerNotReady),
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member which is in sync with leader",
            ),
            (
                member_status(&MemberError::NotEnoughStarted),
                Code::FailedPrecondition,
                "etcdserver: re-configuration failed due to not enough started members",
            ),
            (
                member_status(&MemberError::BadUrls),
                Code::InvalidArgument,
                "etcdserver: given member URLs are invalid",
            ),
            (
                transfer_status(&TransferError::NotLeader),
                Code::FailedPrecondition,
                "etcdserver: not leader",
            ),
            (
                transfer_status(&TransferError::BadTransferee),
                Code::FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
            (
                transfer_status(&TransferError::Timeout),
                Code::Unavailable,
                "etcdserver: request timed out, leader transfer took too long",
            ),
        ];
        for (status, code, message) in cases {
            assert_eq!((status.code(), status.message()), (code, message));
        }
    }

    /// Every domain error's code and text, byte for byte: etcd's (`rpctypes`) or Baton's
    /// own. These texts were the core's `Display` until the core stopped speaking etcd's
    /// words; this table pins that nothing a client reads changed with the move.
    #[test]
    fn every_kv_error_has_its_code_and_exact_message() {
        let cases = [
            (KvError::EmptyKey, Code::InvalidArgument, "etcdserver: key is not provided"),
            (KvError::KeyNotFound, Code::InvalidArgument, "etcdserver: key not found"),
            (KvError::LeaseNotFound, Code::NotFound, "etcdserver: requested lease not found"),
            (KvError::LeaseExists, Code::FailedPrecondition, "etcdserver: lease already exists"),
            (KvError::LeaseTtlTooLarge, Code::OutOfRange, "etcdserver: too large lease TTL"),
            (KvError::TooManyOps, Code::InvalidArgument, "etcdserver: too many operations in txn request"),
            (KvError::DuplicateKey, Code::InvalidArgument, "etcdserver: duplicate key given in txn request"),
            (KvError::Compacted, Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted"),
            (KvError::FutureRevision, Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision"),
            (KvError::RequestTooLarge, Code::InvalidArgument, "etcdserver: request is too large"),
            (KvError::LeaseRequired, Code::InvalidArgument, "baton: a lease is required (lease = 0); etcd would silently attach an orphan 60 s lease here and the lock would vanish without notice"),
            (KvError::EmptyLockName, Code::InvalidArgument, "baton: lock name is not provided"),
            (KvError::EmptyFenceResource, Code::InvalidArgument, "baton: fence resource is not provided"),
            (KvError::InvalidFencingToken, Code::InvalidArgument, "baton: fencing token must be positive"),
            (KvError::ReasonRequired, Code::InvalidArgument, "baton: a reason is required for a force-release"),
            (KvError::ReasonTooLong, Code::InvalidArgument, "baton: force-release reason is longer than 1024 bytes"),
            (KvError::NotHolder, Code::FailedPrecondition, "baton: not the holder"),
            (KvError::LockDelayTooLong, Code::InvalidArgument, "baton: lock delay is longer than 3600000 ms"),
            (KvError::LockRegistryFull, Code::ResourceExhausted, "baton: lock registry is full (100000 locks)"),
            (KvError::FenceTableFull, Code::ResourceExhausted, "baton: fence table is full (100000 resources)"),
            (KvError::UnknownClient, Code::FailedPrecondition, "baton: client session not found (expired or never registered)"),
            (KvError::StaleSequence, Code::FailedPrecondition, "baton: request sequence already acknowledged; use a new sequence number"),
            (KvError::InvalidSequence, Code::InvalidArgument, "baton: request sequence must be positive"),
            (KvError::NotDeduplicable, Code::InvalidArgument, "baton: this request cannot be de-duplicated"),
            (KvError::NoSpace, Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded"),
            (KvError::Auth(AuthError::PermissionDenied), Code::PermissionDenied, "etcdserver: permission denied"),
            (KvError::MisplacedAuthorized, Code::Internal, "baton: internal error: misplaced auth wrapper"),
            (KvError::Corrupt, Code::DataLoss, "etcdserver: corrupt cluster"),
        ];
        for (err, code, message) in &cases {
            let s = kv_status(err);
            assert_eq!((s.code(), s.message()), (*code, *message), "{err:?}");
        }
        // One case per variant (the match in `kv_status` is exhaustive; this keeps the table
        // complete with it).
        assert_eq!(
            cases.len(),
            baton_core::format::variant_count::<KvError>() as usize
        );
    }

    /// etcd's `rpctypes` codes and messages of every auth store refusal, byte for byte.
    #[test]
    fn every_auth_error_has_etcd_s_code_and_message() {
        let cases = [
            (
                AuthError::UserEmpty,
                Code::InvalidArgument,
                "etcdserver: user name is empty",
            ),
            (
                AuthError::AuthFailed,
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (
                AuthError::UserAlreadyExist,
                Code::FailedPrecondition,
                "etcdserver: user name already exists",
            ),
            (
                AuthError::UserNotFound,
                Code::FailedPrecondition,
                "etcdserver: user name not found",
            ),
            (
                AuthError::RoleAlreadyExist,
                Code::FailedPrecondition,
                "etcdserver: role name already exists",
            ),
            (
                AuthError::RoleNotFound,
                Code::FailedPrecondition,
                "etcdserver: role name not found",
            ),
            (
                AuthError::RoleEmpty,
                Code::InvalidArgument,
                "etcdserver: role name is empty",
            ),
            (
                AuthError::PermissionDenied,
                Code::PermissionDenied,
                "etcdserver: permission denied",
            ),
            (
                AuthError::RoleNotGranted,
                Code::FailedPrecondition,
                "etcdserver: role is not granted to the user",
            ),
            (
                AuthError::PermissionNotGranted,
                Code::FailedPrecondition,
                "etcdserver: permission is not granted to the role",
            ),
            (
                AuthError::RootUserNotExist,
                Code::FailedPrecondition,
                "etcdserver: root user does not exist",
            ),
            (
                AuthError::RootRoleNotExist,
                Code::FailedPrecondition,
                "etcdserver: root user does not have root role",
            ),
            (
                AuthError::AuthNotEnabled,
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            (
                AuthError::AuthOldRevision,
                Code::InvalidArgument,
                "etcdserver: revision of auth store is old",
            ),
            (
                AuthError::InvalidAuthMgmt,
                Code::InvalidArgument,
                "etcdserver: invalid auth management",
            ),
        ];
        for (err, code, message) in &cases {
            let s = auth_status(*err);
            assert_eq!((s.code(), s.message()), (*code, *message), "{err:?}");
        }
        assert_eq!(
            cases.len(),
            baton_core::format::variant_count::<AuthError>() as usize
        );
        assert_eq!(
            go_status_text(&auth_status(AuthError::PermissionDenied)),
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
        );
    }

    #[test]
    fn messages_are_etcds() {
        let s = kv_status(&KvError::Compacted);
        assert_eq!(s.code(), Code::OutOfRange);
        assert_eq!(
            s.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
        let s = kv_status(&KvError::LeaseNotFound);
        assert_eq!(s.code(), Code::NotFound);
        assert_eq!(s.message(), "etcdserver: requested lease not found");
        let s = kv_status(&KvError::EmptyKey);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "etcdserver: key is not provided");
        let s = kv_status(&KvError::TooManyOps);
        assert_eq!(
            s.message(),
            "etcdserver: too many operations in txn request"
        );
        // The decoder's refusal of a txn nested too deep says what validation would.
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), baton_proto::codec::TOO_MANY_OPS);
        let s = kv_status(&KvError::DuplicateKey);
        assert_eq!(
            s.message(),
            "etcdserver: duplicate key given in txn request"
        );
        let s = kv_status(&KvError::FutureRevision);
        assert_eq!(
            s.message(),
            "etcdserver: mvcc: required revision is a future revision"
        );
        assert_eq!(propose_status(&ProposeError::NoLeader).message(), NO_LEADER);
        let s = propose_status(&ProposeError::LeaderOnly(LeaderDuty::ExpireLeases));
        assert_eq!(s.code(), Code::Internal);
        assert_eq!(
            s.message(),
            "baton: ExpireLeases is proposed only by the leader itself, never on request"
        );
        let s = kv_status(&KvError::NotHolder);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "baton: not the holder");
        let s = kv_status(&KvError::LeaseRequired);
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().starts_with("baton: a lease is required"));
        let s = lock_status(&LockError::FencingTokenRejected);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "baton: fencing token rejected");
    }

    /// etcd's `ErrGRPCNoSpace`, whether the refusal came from this member's disk watch
    /// (before proposing) or from the replicated alarm (at apply); and a stopped Raft core
    /// never shows openraft's debug text.
    #[test]
    fn a_full_disk_is_etcds_no_space_and_storage_failures_say_stopped() {
        for s in [
            kv_status(&KvError::NoSpace),
            propose_status(&ProposeError::NoSpace),
        ] {
            assert_eq!(s.code(), Code::ResourceExhausted);
            assert_eq!(s.message(), "etcdserver: mvcc: database space exceeded");
        }
        let s = propose_status(&ProposeError::Storage(
            "when Write Snapshot(Some(..)): No space left on device".into(),
        ));
        assert_eq!(
            (s.code(), s.message()),
            (Code::Unavailable, "etcdserver: server stopped")
        );
    }
}
