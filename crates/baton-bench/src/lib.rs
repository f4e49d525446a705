//! `baton-bench`: the benchmark client behind `baton bench` (one workload against any
//! etcd-API server) and the orchestrator `baton-bench side-by-side` (Baton and etcd 3.4 on
//! this machine, alternately, same client, same workloads). See `bench/README.md`.

pub mod bench;
pub mod engine;
pub mod failover;
pub mod grpc;
pub mod kv;
pub mod lease;
pub mod report;
pub mod results;
pub mod security;
pub mod server;
pub mod session;
pub mod side;
pub mod steal;
pub mod v3lock;
pub mod watch;
pub mod watch_create;
