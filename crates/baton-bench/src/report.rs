//! Facts about the machine and the binaries that a number is meaningless without, and the
//! small statistics the report needs. The report itself is in [`crate::results`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A server binary and what its `--version` says.
#[derive(Debug, Serialize, Deserialize)]
pub struct Binary {
    pub path: PathBuf,
    pub version: Option<String>,
}

impl Binary {
    pub fn describe(path: &Path) -> Binary {
        let version = Command::new(path)
            .arg("--version")
            .output()
            .ok()
            .and_then(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .next()
                    .map(|l| l.trim().to_string())
            })
            .filter(|l| !l.is_empty());
        Binary {
            path: path.to_path_buf(),
            version,
        }
    }
}

/// `git rev-parse HEAD` of the workspace and whether tracked files differ from it. Neither is
/// worth failing the run over, so both are optional.
pub fn git_state(workspace_root: &Path) -> (Option<String>, Option<bool>) {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(workspace_root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "HEAD"]);
    let dirty = head
        .as_ref()
        .and_then(|_| git(&["status", "--porcelain", "--untracked-files=no"]))
        .map(|s| !s.is_empty());
    (head, dirty)
}

/// Where the data directories live and what fsync costs there.
#[derive(Debug, Serialize, Deserialize)]
pub struct Disk {
    pub data_root: PathBuf,
    /// The device and filesystem type (`df`), e.g. `/dev/vda ext4`.
    pub device: Option<String>,
    pub fstype: Option<String>,
    /// `/sys/block/<dev>/queue/rotational`: true for a spinning disk.
    pub rotational: Option<bool>,
    /// 4 KiB write + fdatasync, 200 times in a file under the data root: median and p99, µs.
    pub fdatasync_p50_us: Option<f64>,
    pub fdatasync_p99_us: Option<f64>,
}

impl Disk {
    pub fn probe(data_root: &Path) -> Disk {
        let df = Command::new("df")
            .args(["--output=source,fstype"])
            .arg(data_root)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let (device, fstype) = df
            .as_deref()
            .and_then(|t| t.lines().nth(1))
            .map(|l| {
                let mut f = l.split_whitespace();
                (f.next().map(String::from), f.next().map(String::from))
            })
            .unwrap_or((None, None));
        let rotational = device.as_deref().and_then(|d| {
            let name = d.strip_prefix("/dev/")?;
            // /dev/vda1 → vda, /dev/nvme0n1p2 → nvme0n1: try the name, then shorter prefixes.
            (1..=name.len()).rev().find_map(|n| {
                std::fs::read_to_string(format!("/sys/block/{}/queue/rotational", &name[..n]))
                    .ok()
                    .map(|v| v.trim() == "1")
            })
        });
        let (p50, p99) = fdatasync_probe(data_root).unzip();
        Disk {
            data_root: data_root.to_path_buf(),
            device,
            fstype,
            rotational,
            fdatasync_p50_us: p50,
            fdatasync_p99_us: p99,
        }
    }

    pub fn is_tmpfs(&self) -> bool {
        self.fstype.as_deref() == Some("tmpfs")
    }
}

/// Median and p99 (µs) of 200 × (4 KiB write + fdatasync) at the start of a scratch file
/// in `dir` (an overwrite: no allocation, only the data and the device cache flush).
fn fdatasync_probe(dir: &Path) -> Option<(f64, f64)> {
    use std::os::unix::fs::FileExt;
    let path = dir.join(format!(".fdatasync-probe-{}", std::process::id()));
    let file = std::fs::File::options()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .ok();
    let result = file.and_then(|file| {
        let block = [0x5au8; 4096];
        let mut times = Vec::with_capacity(200);
        for i in 0..220 {
            let t = Instant::now();
            file.write_all_at(&block, 0).ok()?;
            file.sync_data().ok()?;
            if i >= 20 {
                // the first ones allocate the block
                times.push(t.elapsed());
            }
        }
        times.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        Some((
            us(times[times.len() / 2]),
            us(times[times.len() * 99 / 100]),
        ))
    });
    let _ = std::fs::remove_file(&path);
    result
}

/// The median; with an even count, the mean of the middle two. Rounds are few (often two),
/// and the median keeps one disturbed round from dragging the result the way a mean would
/// once there are three or more.
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// `MemTotal` from /proc/meminfo, in bytes.
pub fn mem_total_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The first `model name` in /proc/cpuinfo.
pub fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// The current time as `YYYY-MM-DD HH:MM:SS UTC`, without pulling in a date crate for one line.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0].into_iter()), 2.5);
        assert_eq!(median([7.0].into_iter()), 7.0);
    }

    #[test]
    fn fdatasync_probe_runs() {
        let dir = tempfile::tempdir().unwrap();
        let (p50, p99) = fdatasync_probe(dir.path()).unwrap();
        assert!(p50 > 0.0 && p99 >= p50);
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
    }
}
