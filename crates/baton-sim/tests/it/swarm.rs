//! The CI swarm: 200 seeds of the quick configuration (`SimConfig::quick`), in four tests so
//! that they run in parallel; it is one of the long tests (README: `BATON_LONG_TESTS`, which
//! scripts/test sets), so by hand each test runs 5 seeds unless that is set.
//! `BATON_SIM_SEEDS` overrides the number of seeds per test either way.

use baton_sim::{swarm, SimConfig};

fn run_range(start: u64) {
    let per_test: u64 = std::env::var("BATON_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var_os("BATON_LONG_TESTS").is_some() {
            50
        } else {
            5
        });
    let base = SimConfig::quick(start);
    let report = swarm(&base, start, per_test, false, |_, _| {});
    let mut msg = String::new();
    for (seed, e) in &report.failed {
        let mut c = base.clone();
        c.seed = *seed;
        msg.push_str(&format!(
            "seed {seed}: {e}\n  replay: {}\n",
            c.replay_command()
        ));
    }
    eprintln!(
        "seeds {start}..{}: {} passed in {:.1} s",
        start + per_test,
        report.passed,
        report.elapsed.as_secs_f64()
    );
    assert!(report.failed.is_empty(), "failing seeds:\n{msg}");
}

#[test]
fn swarm_seeds_0_to_49() {
    run_range(0);
}

#[test]
fn swarm_seeds_50_to_99() {
    run_range(50);
}

#[test]
fn swarm_seeds_100_to_149() {
    run_range(100);
}

#[test]
fn swarm_seeds_150_to_199() {
    run_range(150);
}
