//! What every service holds: the replica and the server's configuration, with the response
//! header and the status mapping all of them use. Apart from lib.rs so that the services,
//! which lib.rs declares and starts, do not reach back into it (the tidy test
//! `no_module_cycles`); lib.rs re-exports both types.

use std::time::Duration;

use baton_proto::etcdserverpb as pb;
use baton_raft::{Node, Proposed};
use tonic::Status;

use crate::conn::ClientListener;
use crate::errors;

/// etcd's gRPC receive limit: the request limit plus 512 KiB of framing headroom.
pub const MAX_GRPC_RECV_BYTES: usize = baton_core::MAX_REQUEST_BYTES + 512 * 1024;

/// What the server needs besides the replica.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to serve the etcd gRPC API, the JSON gateway and `/metrics`, `/health` and
    /// `/version`, and whether in plain text, TLS or both.
    pub client_listeners: Vec<ClientListener>,
    /// More listeners for `/metrics`, `/health` and `/version` alone
    /// (`--listen-metrics-urls`; `https://` ones with the client port's TLS settings, as
    /// etcd's).
    pub metrics_listeners: Vec<ClientListener>,
    /// The smallest lease TTL granted, in seconds (etcd: ceil(1.5 × election timeout)).
    pub min_lease_ttl_s: i64,
    /// Interval of progress notifications for watchers that asked for them.
    pub watch_progress_interval: Duration,
    /// HTTP/2 streams one client connection may have open at once (etcd's
    /// `--max-concurrent-streams`; default
    /// [`DEFAULT_MAX_CONCURRENT_STREAMS`](crate::transport::DEFAULT_MAX_CONCURRENT_STREAMS)).
    pub max_concurrent_streams: u32,
    /// HTTP/2 keep-alive pings to clients (etcd's `--grpc-keepalive-interval`/`-timeout`).
    pub keepalive: crate::transport::Keepalive,
    /// Tokens (`--auth-token`, `--auth-token-ttl`) and password hashing (`--bcrypt-cost`).
    pub auth: crate::auth::Authenticator,
    /// More HTTP routes, merged into [`crate::http::router`] beside `/health`, `/metrics`
    /// and `/version`: the `baton` binary's dashboard (`/ui`), which is a client of the
    /// cluster and so lives outside this crate. Its routes must not overlap those above.
    pub http_extension: Option<axum::Router>,
}

/// State shared by all services: the replica and the bits every handler needs.
#[derive(Clone)]
pub struct Shared {
    pub node: Node,
    pub config: ServerConfig,
}

impl Shared {
    /// A response header at `revision`, with this member's identity.
    pub fn header_at(&self, revision: i64, raft_term: u64) -> pb::ResponseHeader {
        let status = self.node.status();
        pb::ResponseHeader {
            cluster_id: status.cluster_id,
            member_id: status.member_id,
            revision,
            raft_term,
        }
    }

    /// A header at the current revision and term.
    pub fn header(&self) -> pb::ResponseHeader {
        let revision = self.node.read(|sm| sm.revision());
        self.header_at(revision.0, self.term())
    }

    /// The current Raft term.
    pub fn term(&self) -> u64 {
        self.node.status().term
    }

    /// Proposes a command, mapping replication failures to etcd's statuses.
    pub async fn propose(&self, command: baton_core::Command) -> Result<Proposed, Status> {
        self.node
            .propose(command)
            .await
            .map_err(|e| errors::propose_status(&e))
    }

    /// Waits until a linearizable read is safe.
    pub async fn read_barrier(&self) -> Result<(), Status> {
        self.node
            .read_barrier()
            .await
            .map_err(|e| errors::propose_status(&e))
    }

    /// Fails with etcd's "no leader" when this member knows of none (clients that send
    /// `hasleader=true` expect exactly that).
    pub fn require_leader(&self) -> Result<(), Status> {
        if self.node.status().leader_id.is_none() {
            return Err(Status::unavailable(errors::NO_LEADER));
        }
        Ok(())
    }
}
