//! Turning runs into the printed table and the JSON file, plus the facts about the machine
//! and the binaries that a number is meaningless without.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::server::Kind;
use crate::workload::{Group, LoadConfig, RunResult, Workload};

/// Where and with what the benchmark ran.
#[derive(Debug, Serialize)]
pub struct Meta {
    pub date_utc: String,
    /// `git rev-parse HEAD` of the workspace, if it is a repository with commits.
    pub git_head: Option<String>,
    /// Whether tracked files differ from `HEAD`: a number measured on uncommitted code cannot be
    /// reproduced from the commit alone.
    pub git_dirty: Option<bool>,
    pub nproc: usize,
    pub cpu_model: Option<String>,
    pub mem_total_bytes: Option<u64>,
    pub etcd: Option<Binary>,
    pub baton: Option<Binary>,
    pub rounds: usize,
    pub load: LoadConfig,
    /// Where the data directories were created (their filesystem decides what fsync costs).
    pub data_root: PathBuf,
}

/// A server binary and what its `--version` says.
#[derive(Debug, Serialize)]
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

/// One run: one workload, one server, one round.
#[derive(Debug, Serialize)]
pub struct Sample {
    pub workload: Workload,
    pub server: Kind,
    pub round: usize,
    pub result: RunResult,
}

/// Medians over rounds for one workload on one server.
#[derive(Debug, Serialize)]
pub struct Stats {
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
}

/// One line of the table.
#[derive(Debug, Serialize)]
pub struct Row {
    pub workload: Workload,
    pub label: String,
    pub etcd: Option<Stats>,
    pub baton: Option<Stats>,
    /// Baton throughput / etcd throughput (of `ratio_against` if set).
    pub ratio: Option<f64>,
    /// The workload whose etcd throughput `ratio` divides by, when not this row's own: the
    /// baton.v1 rows, which etcd cannot run, are compared with its v3lock rows.
    pub ratio_against: Option<Workload>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub meta: Meta,
    pub rows: Vec<Row>,
    /// Why some rows are missing (a server without a lock API, `--only`).
    pub notes: Vec<String>,
    pub samples: Vec<Sample>,
}

impl Report {
    pub fn new(
        meta: Meta,
        workloads: &[Workload],
        samples: Vec<Sample>,
        notes: Vec<String>,
    ) -> Report {
        let stats = |workload, server| {
            let runs: Vec<&RunResult> = samples
                .iter()
                .filter(|s| s.workload == workload && s.server == server)
                .map(|s| &s.result)
                .collect();
            (!runs.is_empty()).then(|| Stats {
                ops_per_sec: median(runs.iter().map(|r| r.ops_per_sec)),
                p50_ms: median(runs.iter().map(|r| r.p50_ms)),
                p99_ms: median(runs.iter().map(|r| r.p99_ms)),
                errors: runs.iter().map(|r| r.errors).sum(),
            })
        };
        let rows = workloads
            .iter()
            .filter_map(|&workload| {
                let etcd = stats(workload, Kind::Etcd);
                let baton = stats(workload, Kind::Baton);
                if etcd.is_none() && baton.is_none() {
                    // Never ran (see the notes): a row of dashes would say nothing.
                    return None;
                }
                let ratio_against = workload.ratio_base();
                let etcd_ops = match ratio_against {
                    Some(base) => stats(base, Kind::Etcd).map(|s| s.ops_per_sec),
                    None => etcd.as_ref().map(|s| s.ops_per_sec),
                };
                let ratio = match (etcd_ops, &baton) {
                    (Some(e), Some(b)) if e > 0.0 => Some(b.ops_per_sec / e),
                    _ => None,
                };
                Some(Row {
                    workload,
                    label: workload.label(&meta.load),
                    etcd,
                    baton,
                    ratio,
                    ratio_against,
                })
            })
            .collect();
        Report {
            meta,
            rows,
            notes,
            samples,
        }
    }

    /// The human-readable report: a short header and one table.
    pub fn markdown(&self) -> String {
        let m = &self.meta;
        let mut out = String::new();
        let _ = writeln!(out, "## Baton vs etcd, side by side\n");
        let _ = writeln!(out, "- date: {}", m.date_utc);
        let commit = match (&m.git_head, m.git_dirty) {
            (Some(head), Some(true)) => format!("{head} (plus uncommitted changes)"),
            (Some(head), _) => head.clone(),
            (None, _) => "unknown (not a git checkout, or no commits yet)".to_string(),
        };
        let _ = writeln!(out, "- commit: {commit}");
        let mem = m
            .mem_total_bytes
            .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "unknown".into());
        let cpu = m.cpu_model.as_deref().unwrap_or("unknown CPU");
        let _ = writeln!(
            out,
            "- machine: nproc {}, {cpu}, {mem} memory; both servers and the client share these cores",
            m.nproc
        );
        for (name, bin) in [("etcd", &m.etcd), ("baton", &m.baton)] {
            if let Some(bin) = bin {
                let _ = writeln!(
                    out,
                    "- {name}: {} ({})",
                    bin.path.display(),
                    bin.version.as_deref().unwrap_or("version unknown")
                );
            }
        }
        let l = &m.load;
        let has = |group| self.rows.iter().any(|r| r.workload.group() == group);
        let _ = writeln!(
            out,
            "- load: {:.0} s warm-up per run, {} round(s) per server alternating, medians \
             shown; fsync on; data in {}",
            l.warmup.as_secs_f64(),
            m.rounds,
            m.data_root.display()
        );
        if has(Group::Kv) {
            let _ = writeln!(
                out,
                "- kv workloads: {:.0} s measured per run; {} keys, {}-byte values",
                l.duration.as_secs_f64(),
                l.key_space,
                l.value_size
            );
        }
        if has(Group::Locks) {
            let _ = writeln!(
                out,
                "- lock workloads: {:.0} s measured per run; each contender has its own \
                 connection and session (a {:.0} s lease kept alive) and loops lock, empty \
                 critical section, unlock; cycles/s = completed lock+unlock cycles per second, \
                 all contenders together; latency = acquire (Lock sent → answered)",
                l.lock_duration.as_secs_f64(),
                l.lock_ttl.as_secs_f64()
            );
        }
        let _ = writeln!(out);
        for (group, unit, latency) in [
            (Group::Kv, "ops/s", ""),
            (Group::Locks, "cycles/s", "acquire "),
        ] {
            if !has(group) {
                continue;
            }
            let _ = writeln!(
                out,
                "| workload | etcd {unit} | baton {unit} | ratio (baton/etcd) | \
                 etcd {latency}p50 ms | baton {latency}p50 ms | \
                 etcd {latency}p99 ms | baton {latency}p99 ms |"
            );
            let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|");
            for row in self.rows.iter().filter(|r| r.workload.group() == group) {
                let col = |s: &Option<Stats>, f: fn(&Stats) -> String| {
                    s.as_ref().map(f).unwrap_or_else(|| "–".into())
                };
                let ratio = match (row.ratio, row.ratio_against) {
                    (Some(r), None) => format!("{r:.2}"),
                    (Some(r), Some(_)) => format!("{r:.2} (vs etcd v3lock)"),
                    (None, _) => "–".into(),
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {ratio} | {} | {} | {} | {} |",
                    row.label,
                    col(&row.etcd, |s| format!("{:.0}", s.ops_per_sec)),
                    col(&row.baton, |s| format!("{:.0}", s.ops_per_sec)),
                    col(&row.etcd, |s| fmt_ms(s.p50_ms)),
                    col(&row.baton, |s| fmt_ms(s.p50_ms)),
                    col(&row.etcd, |s| fmt_ms(s.p99_ms)),
                    col(&row.baton, |s| fmt_ms(s.p99_ms)),
                );
            }
            if group == Group::Locks && self.rows.iter().any(|r| r.ratio_against.is_some()) {
                let _ = writeln!(
                    out,
                    "\nbaton.v1 rows: Baton's own Acquire/Release, which etcd has no equivalent \
                     of; their ratio is against etcd's v3lock row of the same shape."
                );
            }
            let _ = writeln!(out);
        }
        let failed: Vec<String> = self
            .rows
            .iter()
            .flat_map(|row| {
                [("etcd", &row.etcd), ("baton", &row.baton)]
                    .into_iter()
                    .filter_map(move |(name, s)| match s {
                        Some(s) if s.errors > 0 => Some(format!(
                            "{}: {name} had {} failed requests or checks",
                            row.label, s.errors
                        )),
                        _ => None,
                    })
            })
            .collect();
        if !failed.is_empty() {
            let _ = writeln!(
                out,
                "Errors (see the JSON for the first message of each run):"
            );
            for line in failed {
                let _ = writeln!(out, "- {line}");
            }
            let _ = writeln!(out);
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "Not run:");
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        out
    }
}

/// Sub-millisecond latencies need a third decimal to be told apart; larger ones don't.
fn fmt_ms(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.2}")
    }
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
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
    }
}
