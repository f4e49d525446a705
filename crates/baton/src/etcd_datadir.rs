//! `baton serve` on a data directory that `etcdctl snapshot restore` made: etcd's layout
//! (`member/snap/db`, the restored bbolt database, and `member/wal`, a log holding only the
//! new cluster's membership) and none of Baton's files. The database is imported once, at
//! the first start, into Baton's files beside it, for the member and cluster the serve flags
//! describe — exactly what `baton snapshot restore` would have made — so a runbook that
//! restores with etcdctl and starts "etcd" works with Baton as the binary (etcd's
//! `TestIssue6361` does just that). etcd's files are left as they are, until the member's
//! first snapshot, which Baton writes at `member/snap/db` as etcd's backend would be (with
//! its `baton` bucket, so it is never taken for a restore again).
//!
//! Only a directory fresh from a restore is taken: its database's consistent index is the
//! number of members (etcdctl's restore sets it so). A directory etcd has run on has applied
//! entries that may be only in its WAL, which Baton does not read: it is refused, with the
//! way that works (save a snapshot from the running etcd and restore that).

use std::path::Path;

use anyhow::{bail, Context, Result};
use baton_bbolt::Db;

/// Imports `data_dir/member/snap/db` if `data_dir` is an etcd data directory fresh from
/// `etcdctl snapshot restore` without Baton's files; otherwise does nothing.
pub fn adopt(
    data_dir: &Path,
    name: &str,
    peer_urls: &[String],
    cluster: Option<&baton_raft::ClusterConfig>,
) -> Result<()> {
    let db_path = data_dir.join("member").join("snap").join("db");
    if !db_path.exists() || data_dir.join("member.meta").exists() {
        return Ok(());
    }
    let members = match cluster {
        Some(c) => c.initial_members.clone(),
        None => vec![baton_raft::InitialMember {
            name: name.to_string(),
            peer_urls: peer_urls.to_vec(),
        }],
    };
    // `baton serve`'s default token: a member without `--initial-cluster` has no peers.
    let token = cluster.map_or("baton-cluster", |c| c.token.as_str());
    let file = std::fs::File::open(&db_path)
        .with_context(|| format!("opening etcd's database {}", db_path.display()))?;
    let db = Db::open(file).with_context(|| format!("etcd's database {}", db_path.display()))?;
    // A Baton member's own snapshot (its `baton` bucket) in a directory without
    // `member.meta`: a copy of a member's file restored with etcdctl. Importing it would
    // leave a file that the start takes for this member's own snapshot (of the old
    // cluster's log and membership); refused, with the way that works.
    if baton_snapshot::is_own(&db)? {
        bail!(
            "{} is a Baton member's own snapshot (it has Baton's `baton` bucket), not an etcd \
             backend restored by `etcdctl snapshot restore`, and {} has no member.meta: restore \
             the copied file with `baton snapshot restore <file> --skip-hash-check` into a new \
             data directory instead",
            db_path.display(),
            data_dir.display()
        );
    }
    let problems = db.check()?;
    if !problems.is_empty() {
        bail!(
            "etcd's database {} failed its integrity check: {}",
            db_path.display(),
            problems.join("; ")
        );
    }
    let (state, info) =
        baton_snapshot::read_state(&db, baton_raft::RESTORED_LAST_APPLIED, &mut |_| {})
            .with_context(|| format!("reading etcd's database {}", db_path.display()))?;
    if info.consistent_index > members.len() as u64 {
        bail!(
            "{} is the data directory of an etcd that has run (its database applied entry {}, \
             later ones may be only in its WAL, which Baton does not read): take a snapshot \
             with `etcdctl snapshot save` and restore it with `baton snapshot restore`",
            data_dir.display(),
            info.consistent_index
        );
    }
    let restored = baton_raft::restore_data_dir(
        data_dir,
        baton_raft::RestoreInto::BesideEtcdData,
        name,
        peer_urls,
        members,
        token,
        &state,
    )?;
    tracing::info!(
        keys = info.summary.live_keys,
        revision = state.revision().0,
        member_id = format_args!("{:x}", restored.member_id),
        "imported the database of an etcd data directory made by `etcdctl snapshot restore`"
    );
    Ok(())
}
