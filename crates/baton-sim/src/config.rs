//! One run's parameters ([`SimConfig`]) and the addresses every member uses.

use std::time::Duration;

/// Port of every member's client API (etcd's).
pub const CLIENT_PORT: u16 = 2379;
/// Port of every member's peer service.
pub const PEER_PORT: u16 = 2380;
/// Keys of the KV workload (and the watched range).
pub const KEY_PREFIX: &str = "k/";

/// One run's parameters. Everything except `seed` has a default suited to the swarm.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub members: usize,
    pub clients: usize,
    /// Clients contending for one lock with leases and fenced writes.
    pub lock_clients: usize,
    pub keys: usize,
    /// Faults are injected in `[1 s, 1 s + fault_window)`; the workload runs that long too.
    pub fault_window: Duration,
    pub faults: usize,
    /// After faults stop, every member must accept a write within this.
    pub liveness_bound: Duration,
    /// Time given to replicas to apply everything before they are compared.
    pub settle: Duration,
    /// After the clients are done, every member must reach the same applied index within
    /// this. It covers a connection that a partition left stalled: turmoil drops segments
    /// sent into a partition and never retransmits them, so such a connection is replaced
    /// only when HTTP/2 keep-alive gives up on it (5 s + 5 s on peer channels).
    pub convergence_bound: Duration,
    /// Disks ignore fsync (a planted bug: the checkers must catch lost writes).
    pub lying_disks: bool,
    /// turmoil's step: every host and client runs once per step of simulated time.
    pub tick: Duration,
    /// Made by [`SimConfig::quick`] (for the replay command).
    pub quick: bool,
}

impl SimConfig {
    pub fn new(seed: u64) -> Self {
        SimConfig {
            seed,
            members: 3,
            clients: 3,
            lock_clients: 2,
            keys: 3,
            fault_window: Duration::from_secs(8),
            faults: 6,
            liveness_bound: Duration::from_secs(15),
            settle: Duration::from_secs(3),
            convergence_bound: Duration::from_secs(20),
            lying_disks: false,
            tick: Duration::from_millis(1),
            quick: false,
        }
    }

    /// A shorter run for CI in debug builds: half the fault window and load, the same
    /// fault kinds and checks.
    pub fn quick(seed: u64) -> Self {
        SimConfig {
            clients: 2,
            lock_clients: 1,
            fault_window: Duration::from_secs(4),
            faults: 4,
            settle: Duration::from_secs(1),
            tick: Duration::from_millis(2),
            quick: true,
            ..SimConfig::new(seed)
        }
    }

    /// The one-line command that replays this run.
    pub fn replay_command(&self) -> String {
        // Bit-for-bit replay needs tokio's `select!` RNG seeded, which only a `--cfg
        // tokio_unstable` build allows (.cargo/config.toml sets it). A run built without it
        // (a RUSTFLAGS in the environment replaces that list) is replayed with it: as
        // closely as such a run can be replayed at all (docs/simulation.md).
        let prefix = if cfg!(tokio_unstable) {
            ""
        } else {
            "RUSTFLAGS=\"--cfg tokio_unstable\" "
        };
        let mut cmd = format!(
            "{prefix}cargo run --release -p baton-sim -- replay --seed {} --members {}",
            self.seed, self.members
        );
        if self.quick {
            cmd.push_str(" --quick");
        }
        if self.lying_disks {
            cmd.push_str(" --lying-disks");
        }
        cmd
    }
}
