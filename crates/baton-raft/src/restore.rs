//! A new data directory from a backup (`baton snapshot restore`, etcdctl's `snapshot
//! restore`): the member's identity derived from `--initial-cluster` and the token exactly as
//! `baton serve` derives it, and a snapshot file holding the restored state with the new
//! cluster's membership, at the log position a freshly initialized cluster has (openraft's
//! first log id, the one `initialize` writes). No log, no vote: the members start as a new
//! cluster whose history begins with the backup's data, elect a leader, and go on from the
//! backup's revision. The files are Baton's current formats (`member.meta`, snapshot file
//! version 2 over state format 6), so nothing here is a new on-disk format.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use baton_core::{CommandIndex, StateMachine, Term};

use crate::cluster::{self, ClusterConfig, ClusterConfigError, InitialClusterState, InitialMember};
use crate::files::{self, MemberMeta};
use crate::snapshot;
use crate::types::{LogId, Member, SnapshotMeta};

/// The core's last applied entry in a restored state: the first one, as after `initialize`
/// (whose membership entry is applied as one `Noop`). An imported state is built with it.
pub const RESTORED_LAST_APPLIED: (CommandIndex, Term) = (CommandIndex(0), Term(0));

/// Why a data directory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// etcdctl's words.
    #[error("data-dir {0:?} exists")]
    Exists(PathBuf),
    #[error(transparent)]
    Cluster(#[from] ClusterConfigError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the restored state is not one this Baton writes: {0}")]
    State(String),
}

/// Who the restored member is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub member_id: u64,
    pub cluster_id: u64,
}

/// What may already be in the directory restored into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreInto {
    /// Nothing: the directory must not exist, or be empty (`baton snapshot restore`).
    NewDirectory,
    /// An etcd data directory (`member/`, as `etcdctl snapshot restore` makes it): Baton's
    /// files go beside it, and none of them may exist yet.
    BesideEtcdData,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RestoreError {
    let path = path.to_path_buf();
    move |source| RestoreError::Io { path, source }
}

/// Makes `data_dir` the data directory of member `name` of the cluster `initial_members`
/// with `token`, holding `state` (built with [`RESTORED_LAST_APPLIED`]).
pub fn restore_data_dir(
    data_dir: &Path,
    into: RestoreInto,
    name: &str,
    advertised_peer_urls: &[String],
    initial_members: Vec<InitialMember>,
    token: &str,
    state: &StateMachine,
) -> Result<Restored, RestoreError> {
    let taken = match into {
        RestoreInto::NewDirectory => {
            data_dir.exists()
                && fs::read_dir(data_dir)
                    .map_err(io(data_dir))?
                    .next()
                    .is_some()
        }
        RestoreInto::BesideEtcdData => ["member.meta", "raft", "snap"]
            .iter()
            .any(|f| data_dir.join(f).exists()),
    };
    if taken {
        return Err(RestoreError::Exists(data_dir.to_path_buf()));
    }
    if state.last_applied() != RESTORED_LAST_APPLIED {
        return Err(RestoreError::State(format!(
            "last applied {:?}, expected {:?}",
            state.last_applied(),
            RESTORED_LAST_APPLIED
        )));
    }
    let config = ClusterConfig {
        initial_members,
        state: InitialClusterState::New,
        token: token.to_string(),
        token_given: true,
        listen_peer_addrs: Vec::new(),
    };
    let ids = cluster::derive_ids(&config, name, advertised_peer_urls)?;
    let member_id = ids
        .id_of(name)
        .expect("derive_ids checked that the name is listed");

    let voters: BTreeSet<u64> = ids.members.iter().map(|(id, _)| *id).collect();
    let nodes: BTreeMap<u64, Member> = ids
        .members
        .iter()
        .map(|(id, m)| {
            // Name and client URLs are published by each member when it runs.
            let node = Member {
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                client_urls: Vec::new(),
            };
            (*id, node)
        })
        .collect();
    let first = LogId::default();
    let meta = SnapshotMeta {
        last_log_id: Some(first),
        last_membership: openraft::StoredMembership::new(
            Some(first),
            openraft::Membership::new(vec![voters], nodes),
        ),
        snapshot_id: "restored-0-0".to_string(),
    };

    let snap_dir = data_dir.join("snap");
    let raft_dir = data_dir.join("raft");
    for dir in [data_dir, &snap_dir, &raft_dir] {
        fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let member_path = data_dir.join("member.meta");
    let identity = MemberMeta {
        member_id,
        cluster_id: ids.cluster_id,
        name: name.to_string(),
        credential: None,
    };
    files::write_atomic(&member_path, &files::encode_member(&identity))
        .map_err(io(&member_path))?;
    snapshot::write_state(&snap_dir, &meta, state).map_err(io(&snap_dir))?;
    files::fsync_dir(data_dir).map_err(io(data_dir))?;
    Ok(Restored {
        member_id,
        cluster_id: ids.cluster_id,
    })
}
