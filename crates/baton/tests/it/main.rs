//! The crate's integration tests, one test binary (one link, not one per file): each
//! module is what was once a file of its own under tests/.

mod auth;
mod authority;
mod bench_smoke;
mod chaos;
mod cli_kv;
mod cli_lease;
mod cli_status;
mod client_load;
mod cluster;
mod common;
mod datadir_v1;
mod disk_full;
mod durability;
mod etcd3gw;
mod etcd_client;
mod etcd_parity;
mod etcdctl;
mod etcdctl_locks;
mod exactly_once;
mod fence_keys;
mod fencing;
mod gateway;
mod gateway_parity;
mod gateway_readme;
mod lease_safety;
mod leases_failover;
mod lock_cli;
mod membership;
mod metrics;
mod monitoring;
mod peer_tls;
mod snapshot;
mod steady_state;
mod tls;
mod ui;
