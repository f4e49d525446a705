//! `baton snapshot save|status|restore`: backups in etcd's format, with etcdctl's commands
//! and words, for Baton and etcd alike.
//!
//! - `save FILE` streams `Maintenance.Snapshot` from one member (TLS and `--user` like every
//!   client command) into `FILE.part`, checks the SHA-256 the stream ends with against the
//!   bytes received, syncs and renames it: `FILE` is whole or absent.
//! - `status FILE` prints what `etcdctl snapshot status` prints (the same hash, revision,
//!   keys and size for the same file).
//! - `restore FILE` makes a new data directory for one member of a new cluster from a
//!   snapshot etcd or Baton took (`baton_snapshot::read_state`, then
//!   `baton_raft::restore_data_dir`): run it once per member with the same
//!   `--initial-cluster` and token, then start each member with `baton serve` and the same
//!   flags. The trailer is checked unless `--skip-hash-check` (a file copied out of a data
//!   directory has none).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use baton_bbolt::Db;
use baton_snapshot::{HashingWriter, SHA256_LEN};
use clap::{Args, Subcommand};
use serde_json::json;

use super::client::{connect, describe, finish, ClientArgs};
use super::output::{bytes_human, emit, Format, Table};
use super::progress::Progress;

#[derive(Args, Debug)]
#[command(
    about = "Backups in etcd's snapshot format: save from a member, status of a file, restore \
             into a new data directory",
    after_help = "Examples:\n  \
                  baton snapshot save backup.db --endpoints 127.0.0.1:2379\n  \
                  baton snapshot status backup.db -w json\n  \
                  baton snapshot restore backup.db --name m1 --data-dir m1 \\\n      \
                  --initial-cluster m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380 \\\n      \
                  --initial-advertise-peer-urls http://10.0.0.1:2380\n\n\
                  A snapshot from `etcdctl snapshot save` (etcd 3.4) restores into Baton, and \
                  one from `baton snapshot save` (or etcdctl against Baton) into etcd."
)]
pub struct SnapshotArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Save a snapshot of one member's store to FILE (one --endpoints entry).
    Save { file: PathBuf },
    /// Show a snapshot file's hash, revision, total keys and size (etcdctl's numbers).
    Status { file: PathBuf },
    /// Restore a snapshot into a new data directory of one member of a new cluster.
    Restore(RestoreArgs),
}

/// etcdctl's `snapshot restore` flags and defaults (the token's default is `baton serve`'s).
#[derive(Args, Debug)]
pub struct RestoreArgs {
    pub file: PathBuf,
    /// This member's name.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// The new data directory (must not exist, or be empty) [default: <name>.etcd].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The new cluster's members, name=peer-url,...
    #[arg(long, default_value = "default=http://localhost:2380")]
    pub initial_cluster: String,
    /// The new cluster's token (the members' ids derive from it; the default is `baton
    /// serve`'s, so a restore and a start without the flag agree).
    #[arg(long, default_value = "baton-cluster")]
    pub initial_cluster_token: String,
    /// This member's peer URLs, as listed in --initial-cluster.
    #[arg(long, default_value = "http://localhost:2380", value_delimiter = ',')]
    pub initial_advertise_peer_urls: Vec<String>,
    /// Restore a file without (or despite) its SHA-256 trailer.
    #[arg(long)]
    pub skip_hash_check: bool,
}

/// Runs `baton snapshot ...`; returns the process exit status.
pub async fn run(args: SnapshotArgs) -> i32 {
    let format = args.client.output;
    let result = match args.command {
        SnapshotCommand::Save { file } => save(&args.client, &file).await,
        SnapshotCommand::Status { file } => status(&file, format),
        SnapshotCommand::Restore(r) => tokio::task::spawn_blocking(move || restore(&r, format))
            .await
            .unwrap_or_else(|e| Err(anyhow!("restore stopped: {e}"))),
    };
    finish("snapshot", result)
}

async fn save(client: &ClientArgs, file: &Path) -> Result<i32> {
    if client.endpoints.len() != 1 {
        bail!(
            "snapshot must be requested to one selected node, not multiple {:?}",
            client.endpoints
        );
    }
    let part = PathBuf::from(format!("{}.part", file.display()));
    let result = save_to(client, &part).await;
    if result.is_err() {
        let _ = fs::remove_file(&part);
    }
    let size = result?;
    fs::rename(&part, file)
        .with_context(|| format!("could not rename {} to {}", part.display(), file.display()))?;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    emit(&match client.output {
        Format::Json => json!({"path": file.display().to_string(), "bytes": size}).to_string(),
        _ => format!("Snapshot saved at {}", file.display()),
    });
    Ok(0)
}

/// Streams the snapshot into `part`; returns its size (trailer included).
async fn save_to(client: &ClientArgs, part: &Path) -> Result<u64> {
    let c = connect(client).await?;
    let mut stream = c.snapshot().await.map_err(describe)?;
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(part)
        .with_context(|| format!("could not open {}", part.display()))?;
    let mut out = HashingWriter::new(file);
    let mut progress = Progress::new("received", "keys");
    let mut db_bytes = 0u64;
    let mut trailer: Option<Vec<u8>> = None;
    while let Some(chunk) = stream.next().await.map_err(describe)? {
        if trailer.is_some() {
            bail!("the snapshot stream went on after its checksum");
        }
        // The last message carries the SHA-256 of everything before it; the database
        // itself is whole pages, so a 32-byte chunk with nothing remaining is the trailer.
        if chunk.remaining_bytes == 0 && chunk.blob.len() == SHA256_LEN && db_bytes > 0 {
            trailer = Some(chunk.blob);
            continue;
        }
        out.write_all(&chunk.blob)?;
        db_bytes += chunk.blob.len() as u64;
        progress.update(db_bytes, Some(db_bytes + chunk.remaining_bytes), None);
    }
    progress.done(db_bytes, Some(db_bytes), None);
    let (digest, mut file) = out.finish();
    match trailer {
        None => bail!("sha256 checksum not found [bytes: {db_bytes}]"),
        Some(t) if t != digest => {
            bail!("the snapshot's sha256 does not match the bytes received")
        }
        Some(t) => file.write_all(&t)?,
    }
    file.sync_all()?;
    Ok(db_bytes + SHA256_LEN as u64)
}

fn status(file: &Path, format: Format) -> Result<i32> {
    let st = baton_snapshot::status(file).map_err(|e| anyhow!("{e}"))?;
    emit(&match format {
        Format::Json => serde_json::to_string(&st)?,
        Format::Simple => format!(
            "{:x}\t{}\t{}\t{}",
            st.hash, st.revision, st.total_key, st.total_size
        ),
        Format::Table => {
            let mut t = Table::new(&["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"]);
            t.row(vec![
                format!("{:x}", st.hash),
                st.revision.to_string(),
                st.total_key.to_string(),
                bytes_human(st.total_size as i64),
            ]);
            t.render()
        }
    });
    Ok(0)
}

fn restore(args: &RestoreArgs, format: Format) -> Result<i32> {
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{}.etcd", args.name)));
    // Checked before reading a large file; `restore_data_dir` checks again.
    if data_dir.exists() && fs::read_dir(&data_dir)?.next().is_some() {
        bail!("data-dir {:?} exists", data_dir.display().to_string());
    }
    let members = baton_raft::parse_initial_cluster(&args.initial_cluster)?;
    let mut file = File::open(&args.file)
        .with_context(|| format!("could not open {}", args.file.display()))?;
    baton_snapshot::verify_trailer(&mut file, args.skip_hash_check)?;
    let db = Db::open(file).map_err(|e| anyhow!("{}: {e}", args.file.display()))?;
    let problems = db.check()?;
    if !problems.is_empty() {
        bail!(
            "snapshot file integrity check failed. {} errors found.\n{}",
            problems.len(),
            problems.join("\n")
        );
    }
    let total = db.size();
    let mut progress = Progress::new("restored", "key versions");
    let mut shown = 0;
    let (state, info) =
        baton_snapshot::read_state(&db, baton_raft::RESTORED_LAST_APPLIED, &mut |versions| {
            shown = versions;
            progress.update(0, None, Some(versions));
        })
        .map_err(|e| anyhow!("{}: {e}", args.file.display()))?;
    let restored = baton_raft::restore_data_dir(
        &data_dir,
        baton_raft::RestoreInto::NewDirectory,
        &args.name,
        &args.initial_advertise_peer_urls,
        members,
        &args.initial_cluster_token,
        &state,
    )?;
    progress.done(total, Some(total), Some(info.summary.versions.max(shown)));
    let s = &info.summary;
    emit(&match format {
        Format::Json => json!({
            "data_dir": data_dir.display().to_string(),
            "member_id": format!("{:x}", restored.member_id),
            "cluster_id": format!("{:x}", restored.cluster_id),
            "revision": state.revision().0,
            "compact_revision": state.compact_revision().0,
            "keys": s.live_keys,
            "versions": s.versions,
            "leases": s.leases,
            "users": state.auth_state().users.len(),
            "roles": state.auth_state().roles.len(),
        })
        .to_string(),
        _ => {
            let mut line = format!(
                "Restored {} into {}: {} keys ({} versions) at revision {} (compacted at {}), {} \
                 leases, {} users, {} roles; member {} ({:x}) of cluster {:x}",
                args.file.display(),
                data_dir.display(),
                s.live_keys,
                s.versions,
                state.revision().0,
                state.compact_revision().0,
                s.leases,
                state.auth_state().users.len(),
                state.auth_state().roles.len(),
                args.name,
                restored.member_id,
                restored.cluster_id,
            );
            if s.keys_without_their_lease > 0 {
                line += &format!(
                    "\nnote: {} keys named a lease the snapshot does not hold; restored without it",
                    s.keys_without_their_lease
                );
            }
            if info.alarms_dropped > 0 {
                line += &format!(
                    "\nnote: {} CORRUPT alarms not carried over",
                    info.alarms_dropped
                );
            }
            line
        }
    });
    Ok(0)
}
