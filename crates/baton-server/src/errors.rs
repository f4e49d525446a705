//! The one table that turns Baton's internal errors into etcd's status codes and messages.
//!
//! Clients (the Go client's `rpctypes`, jetcd, the `etcd-client` crate) match errors by the
//! exact message text, so every message here is byte-identical to etcd's.

use baton_core::KvError;
use baton_raft::ProposeError;
use tonic::{Code, Status};

/// etcd's message when the cluster has no leader.
pub const NO_LEADER: &str = "etcdserver: no leader";
/// etcd's message when a request was cut short by a leader change.
pub const LEADER_CHANGED: &str = "etcdserver: leader changed";
/// etcd's message when a request did not finish in time.
pub const TIMED_OUT: &str = "etcdserver: request timed out";
/// etcd's message for an oversized request.
pub const TOO_LARGE: &str = "etcdserver: request is too large";

/// Maps a domain error to etcd's status.
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
    };
    Status::new(code, err.to_string())
}

/// Maps a replication failure to etcd's status.
pub fn propose_status(err: &ProposeError) -> Status {
    match err {
        ProposeError::NoLeader | ProposeError::NotLeader { .. } => Status::unavailable(NO_LEADER),
        ProposeError::LeaderChanged => Status::unavailable(LEADER_CHANGED),
        ProposeError::Timeout => Status::unavailable(TIMED_OUT),
        ProposeError::ShuttingDown => Status::unavailable("etcdserver: server stopped"),
        ProposeError::Storage(msg) => {
            Status::internal(format!("etcdserver: storage failure: {msg}"))
        }
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
    }
}
