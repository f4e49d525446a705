//! Why a replica could not start ([`StartError`]) and the helpers that make one from an I/O
//! failure. The errors of a running replica's API are in `answer`.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::answer::InternalError;
use crate::cluster::ClusterConfigError;
use crate::config::TimingError;
use crate::membership::change::JoinError;

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A record failed its checksum with valid records after it: the log is corrupt in the
    /// middle and is refused rather than served.
    #[error("corrupt log in {path} at byte offset {offset}: {reason}")]
    CorruptLog {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("corrupt snapshot {path}: {reason}")]
    CorruptSnapshot { path: PathBuf, reason: String },
    /// The `key` bucket of this member's `member/snap/db` is not what Baton wrote (its
    /// SHA-256 differs): bbolt has no checksums of its own, so this is the only evidence of
    /// an edit or damage, and serving it would answer from a key space no other member has.
    /// Refused unless the initial corruption check is on to compare it with the peers
    /// (`NodeConfig::snapshot_kv_checked_by_peers`).
    #[error(
        "{path}: the `key` bucket does not match the checksum Baton wrote with it (was the \
         file changed outside Baton?), so this member refuses to serve it ({detail}); either \
         start with --experimental-initial-corrupt-check to compare this member's key space \
         with the other members' (it refuses to start on a difference), or remove this \
         member's data directory and add the member back (`member remove`, `member add`) to \
         copy the state from the others"
    )]
    SnapshotKvChanged { path: PathBuf, detail: String },
    /// The log was written in a newer format than this binary reads (`wal/record.rs`: format
    /// versions): it is refused rather than misread. Run the newer Baton that wrote it.
    #[error(
        "raft log {path} is in log format {found}, but this Baton reads log formats up to \
         {supported}: it was written by a newer Baton; run that version (or a newer one)"
    )]
    UnsupportedLogFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// openraft refused to start or initialize (its own description).
    #[error("raft: {0}")]
    Raft(String),
    /// The election timeout and heartbeat interval do not fit etcd's rule.
    #[error(transparent)]
    Timing(#[from] TimingError),
    /// A bug in this build (see [`InternalError`]).
    #[error("internal error: {0}")]
    Internal(InternalError),
    /// Another process holds the data directory; two members writing one log would corrupt
    /// it.
    #[error("data directory {path} is in use by another process")]
    Locked { path: PathBuf },
    /// The cluster flags are inconsistent.
    #[error(transparent)]
    Config(#[from] ClusterConfigError),
    /// Joining an existing cluster (`--initial-cluster-state existing`, empty data
    /// directory) failed.
    #[error(transparent)]
    Join(#[from] JoinError),
    /// `--force-new-cluster` on a member without data: there is nothing to restart as a
    /// one-member cluster (and nothing is created).
    #[error(
        "--force-new-cluster needs this member's data, but the data directory holds none \
         (a new member is started without the flag)"
    )]
    ForceNewClusterWithoutData,
    /// `--initial-cluster-token` was given, but this member was admitted by `member add`
    /// and holds the cluster's credential, which is not that token's.
    #[error(
        "--initial-cluster-token is not the token of the cluster this member was admitted to \
         (its credential is stored in {path}); start it without --initial-cluster-token, or \
         with the cluster's token"
    )]
    TokenMismatch { path: PathBuf },
    /// A peer address could not be bound.
    #[error("cannot listen for peers on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StartError + '_ {
    move |source| StartError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn invalid_data(path: &Path, msg: String) -> StartError {
    StartError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, msg),
    }
}
