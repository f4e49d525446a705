//! The log's directory: `data_dir/raft/wal/<generation:016x>.wal`, one file per generation
//! (see `wal/mod.rs`), and the temporaries of a rewrite (`.tmp`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub(crate) fn generation_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{generation:016x}.wal"))
}

fn parse_generation(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    if hex.len() != 16 {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Generation numbers of the `.wal` files in `dir`, ascending; removes leftover temporaries
/// of an interrupted rewrite (they were never renamed into place, so they hold nothing needed).
pub(crate) fn list_generations(dir: &Path) -> io::Result<Vec<u64>> {
    let mut gens = Vec::new();
    for ent in fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            fs::remove_file(ent.path())?;
        } else if let Some(g) = parse_generation(&name) {
            gens.push(g);
        }
    }
    gens.sort_unstable();
    Ok(gens)
}
