//! The fault schedule of one run, drawn from its seed before the run starts (so the same
//! seed always injects the same faults at the same simulated times).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

/// One fault, applied at `at` and healed at `until` (or when faults stop).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Members `a` and `b` cannot talk (both directions).
    Partition { a: usize, b: usize },
    /// Nothing from `from` reaches `to`; the other direction works.
    OneWay { from: usize, to: usize },
    /// The member is cut off from everybody (members and clients).
    Isolate { member: usize },
    /// The member crashes; unsynced log bytes are lost (part of them kept if `torn`), and it
    /// restarts when the fault ends.
    Crash { member: usize, torn: bool },
    /// Every member crashes at once (a power loss) and restarts when the fault ends.
    CrashAll { torn: bool },
    /// Everything the member sends or is sent is held, then delivered at once when the fault
    /// ends: its peers see a paused process (its own timers keep running).
    Pause { member: usize },
    /// The member's wall clock jumps by `delta_ms` (and stays jumped).
    ClockJump { member: usize, delta_ms: i64 },
    /// Every batch of the member's log writer takes `ms`.
    SlowDisk { member: usize, ms: u64 },
    /// Messages between members take up to `max_ms` (delay; reordering across connections).
    Latency { max_ms: u64 },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Partition { a, b } => write!(f, "partition m{} <-> m{}", a + 1, b + 1),
            Fault::OneWay { from, to } => write!(f, "one-way m{} -> m{}", from + 1, to + 1),
            Fault::Isolate { member } => write!(f, "isolate m{}", member + 1),
            Fault::Crash { member, torn } => {
                write!(
                    f,
                    "crash m{}{}",
                    member + 1,
                    if *torn { " (torn)" } else { "" }
                )
            }
            Fault::CrashAll { torn } => {
                write!(f, "crash all{}", if *torn { " (torn)" } else { "" })
            }
            Fault::Pause { member } => write!(f, "pause m{}", member + 1),
            Fault::ClockJump { member, delta_ms } => {
                write!(f, "clock m{} jumps {delta_ms:+} ms", member + 1)
            }
            Fault::SlowDisk { member, ms } => write!(f, "slow disk m{} ({ms} ms)", member + 1),
            Fault::Latency { max_ms } => write!(f, "latency up to {max_ms} ms"),
        }
    }
}

/// A fault with its window.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    pub at: Duration,
    pub until: Duration,
    pub fault: Fault,
}

/// Draws `count` faults in `[start, end)` for `members` members.
pub fn schedule(
    rng: &mut StdRng,
    members: usize,
    count: usize,
    start: Duration,
    end: Duration,
    allow_crash_all: bool,
) -> Vec<Scheduled> {
    let span = (end - start).as_millis() as u64;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let at = start + Duration::from_millis(rng.gen_range(0..span));
        let len = Duration::from_millis(rng.gen_range(200..3000));
        let until = (at + len).min(end);
        let m = rng.gen_range(0..members);
        let other = (m + rng.gen_range(1..members)) % members;
        let fault = match rng.gen_range(0..if allow_crash_all { 10 } else { 9 }) {
            0 => Fault::Partition { a: m, b: other },
            1 => Fault::OneWay { from: m, to: other },
            2 => Fault::Isolate { member: m },
            3 => Fault::Crash {
                member: m,
                torn: rng.gen_bool(0.5),
            },
            4 => Fault::Pause { member: m },
            5 => Fault::ClockJump {
                member: m,
                delta_ms: if rng.gen_bool(0.5) { 1 } else { -1 } * rng.gen_range(1_000..120_000),
            },
            6 => Fault::SlowDisk {
                member: m,
                ms: rng.gen_range(5..300),
            },
            7 => Fault::Latency {
                max_ms: rng.gen_range(5..200),
            },
            8 => Fault::Crash {
                member: m,
                torn: true,
            },
            _ => Fault::CrashAll {
                torn: rng.gen_bool(0.5),
            },
        };
        out.push(Scheduled { at, until, fault });
    }
    out.sort_by_key(|s| s.at);
    out
}
