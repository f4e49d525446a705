//! OpenStack's etcd3gw (PyPI, pinned by `scripts/install-deps` into
//! `target/etcd3gw-venv`) drives the JSON gateway: put/get, leases, locks and watches
//! (`etcd3gw/exercise.py`). The same script runs against etcd 3.4, and both runs must print
//! the same lines.

use std::process::Command;

use crate::common::{Baton, Etcd};

/// The interpreter with etcd3gw installed: `ETCD3GW_PYTHON`, else the workspace's venv.
fn python() -> String {
    if let Ok(p) = std::env::var("ETCD3GW_PYTHON") {
        return p;
    }
    let venv = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../target/etcd3gw-venv/bin/python"
    );
    assert!(
        std::path::Path::new(venv).exists(),
        "{venv} is missing: run scripts/install-deps (it installs etcd3gw from PyPI)"
    );
    venv.to_string()
}

fn run(port: u16) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/etcd3gw/exercise.py");
    let out = Command::new(python())
        .args([script, "127.0.0.1", &port.to_string()])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "etcd3gw against port {port} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn etcd3gw_put_get_lease_lock_watch_as_against_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let baton = Baton::start(&dir.path().join("b"));
    let on_baton = run(baton.client_port);
    assert!(on_baton.ends_with("done\n"), "{on_baton}");
    let etcd = Etcd::start();
    // etcd answers once it has a leader.
    for _ in 0..100 {
        if crate::gateway::curl(&[&format!("http://{}/health", etcd.endpoint())]).status == 200 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let on_etcd = run(etcd.client_port);
    assert_eq!(on_baton, on_etcd);
}
