//! CPU time the hypervisor gave to other guests while this machine wanted it ("steal", the
//! eighth column of `/proc/stat`'s `cpu` line).
//!
//! Why the benchmark records it: on a shared VM the host can take half of the vCPUs' time
//! for minutes (seen here: `top` at 50 % steal while etcd's own 3-member put with 1 client
//! ranged 528–1499 ops/s between runs), and a run taken then measures the host, not the
//! servers. Each run's share is in the JSON, the progress line and, above a threshold, the
//! notes, so a reader can tell a slow run from a slow server.

/// A run whose stolen share is at least this is named in the notes.
pub const NOTABLE_STEAL_PCT: f64 = 2.0;

/// The machine-wide CPU time counters at one moment, in clock ticks summed over all CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuClock {
    /// Time taken by the hypervisor for others.
    steal: u64,
    /// All time: user, nice, system, idle, iowait, irq, softirq and steal (guest time is
    /// already inside user and nice).
    total: u64,
}

impl CpuClock {
    /// Now, or `None` where `/proc/stat` cannot be read.
    pub fn now() -> Option<CpuClock> {
        parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The share of all CPU time since `earlier` that was stolen, in percent.
    pub fn steal_pct_since(&self, earlier: &CpuClock) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        (total > 0).then(|| steal as f64 * 100.0 / total as f64)
    }
}

/// The aggregate `cpu` line of `/proc/stat` (kernels since 2.6.11 have the steal column).
pub fn parse_proc_stat(stat: &str) -> Option<CpuClock> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if fields.len() < 8 {
        return None;
    }
    Some(CpuClock {
        steal: fields[7],
        total: fields.iter().sum(),
    })
}

/// Samples the clock around a piece of work: `start` before, `pct` after.
#[derive(Clone, Copy, Debug)]
pub struct StealWindow(Option<CpuClock>);

impl StealWindow {
    pub fn start() -> StealWindow {
        StealWindow(CpuClock::now())
    }

    /// The stolen share since `start`, in percent (`None` without `/proc/stat`).
    pub fn pct(&self) -> Option<f64> {
        CpuClock::now()?.steal_pct_since(self.0.as_ref()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_aggregate_line() {
        let stat = "cpu  100 5 50 800 10 0 5 30 7 0\ncpu0 50 2 25 400 5 0 2 15 3 0\nintr 1\n";
        let c = parse_proc_stat(stat).unwrap();
        assert_eq!(
            c,
            CpuClock {
                steal: 30,
                total: 100 + 5 + 50 + 800 + 10 + 5 + 30
            }
        );
        assert_eq!(parse_proc_stat("cpu0 1 2 3\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 3 4\n"), None);
    }

    #[test]
    fn share_between_two_readings() {
        let a = CpuClock {
            steal: 30,
            total: 1000,
        };
        let b = CpuClock {
            steal: 80,
            total: 1200,
        };
        assert_eq!(b.steal_pct_since(&a), Some(25.0));
        assert_eq!(a.steal_pct_since(&a), None);
        assert_eq!(a.steal_pct_since(&b), None);
    }
}
