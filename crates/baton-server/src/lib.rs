//! # baton-server
//!
//! Baton's network face: the etcd v3 gRPC services over one [`baton_raft::Node`], HTTP
//! `/health`, `/metrics` and `/version`, etcd's JSON gateway ([`gateway`]) beside gRPC on
//! every client port ([`protocol`]), and the single table that maps internal errors to
//! etcd's exact status codes and messages ([`errors`]).
//!
//! Auto-compaction ([`compactor`], etcd's periodic and revision compactors) runs beside
//! the services, started by the binary.
//!
//! Locks, elections and fencing (`v3lock`, `election`, `baton_v1`) share one engine,
//! [`locks::LockEngine`], created per [`serve`] call.
//!
//! Every response header is built by [`Shared::header_at`] so `cluster_id`, `member_id`,
//! `revision` and `raft_term` agree across all services (`etcdctl endpoint status` compares
//! them).

mod access;
pub mod auth;
pub mod auth_service;
pub mod authority;
pub mod baton_v1;
mod call_session;
pub mod client_server;
mod client_verifier;
pub mod cluster;
pub mod compactor;
pub mod conn;
pub mod convert;
pub mod election;
pub mod errors;
pub mod exactly_once;
pub mod gateway;
pub mod grpc_deadline;
pub mod http;
pub mod kv;
pub mod kv_fast_path;
pub mod lease;
pub mod locks;
pub mod maintenance;
pub mod member_guard;
pub mod metrics_layer;
pub mod monitor;
pub mod peer_tls;
pub mod protocol;
pub mod recv_limit_layer;
mod shared;
pub mod tls;
pub mod transport;
pub mod v3lock;
pub mod watch;

use std::net::SocketAddr;

use futures::FutureExt as _;

pub use access::Caller;
/// The request limits etcd's `--max-request-bytes` and `--max-txn-ops` name. Baton's are
/// fixed at etcd's defaults; re-exported so that `baton serve` can accept those flags at
/// exactly these values without depending on the core.
pub use baton_core::{MAX_REQUEST_BYTES, MAX_TXN_OPS};
pub use shared::{ServerConfig, Shared, MAX_GRPC_RECV_BYTES};

/// Serves gRPC, the JSON gateway and HTTP on every client address, and HTTP on every metrics
/// address, until `shutdown` resolves.
pub async fn serve(
    shared: Shared,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let locks = locks::LockEngine::new(shared.clone());
    serve_with_locks(shared, locks, metrics, shutdown).await
}

/// [`serve`] with a lock engine the caller keeps a handle on (tests read its
/// [`locks::LockStats`]). The engine must have been made from the same `shared`.
pub async fn serve_with_locks(
    shared: Shared,
    locks: locks::LockEngine,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let mut tasks = tokio::task::JoinSet::new();
    let builder = client_server::connection_builder(
        shared.config.max_concurrent_streams,
        shared.config.keepalive,
    );
    for client in shared.config.client_listeners.clone() {
        let incoming = bind(&client).await?;
        let routes = grpc_routes(&shared, &locks);
        let gateway = gateway::Gateway::new(
            gateway_stack(&shared, routes.clone()),
            shared.config.max_concurrent_streams,
        );
        let http = http::router(shared.clone(), metrics.clone()).merge(gateway.router());
        // Outermost the client's `grpc-timeout` (tonic's server honoured it for every call).
        let grpc = tower::ServiceBuilder::new()
            .layer(grpc_deadline::GrpcDeadlineLayer)
            .layer(grpc_layers(&shared))
            .service(routes.prepare());
        let service = tower::Layer::layer(&protocol::ProtocolSplitLayer::new(http), grpc);
        tasks.spawn(
            client_server::serve(incoming, service, builder.clone(), stop_rx.clone()).map(Ok),
        );
    }
    for listener in shared.config.metrics_listeners.clone() {
        let incoming = bind(&listener).await?;
        let http = http::router(shared.clone(), metrics.clone());
        // No gRPC here: the split sends everything to `http`, so the routes are never called.
        let service = tower::Layer::layer(
            &protocol::ProtocolSplitLayer::http_only(http),
            tonic::service::Routes::default().prepare(),
        );
        tasks.spawn(
            client_server::serve(incoming, service, builder.clone(), stop_rx.clone()).map(Ok),
        );
    }
    tracing::info!(
        client = ?shared.config.client_listeners.iter().map(|l| l.addr).collect::<Vec<_>>(),
        tls = ?shared.config.client_listeners.iter().map(|l| l.security.clone()).collect::<Vec<_>>(),
        metrics = ?shared.config.metrics_listeners.iter().map(|l| l.addr).collect::<Vec<_>>(),
        "serving"
    );
    // Once told to stop, connections get SHUTDOWN_GRACE to finish; streams that never end by
    // themselves (watches, keep-alives, lock waits) would otherwise hold the shutdown
    // forever, and a member that does not stop on SIGINT/SIGTERM is one an operator kills.
    let mut stop = stop_rx.clone();
    let mut grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            res = tasks.join_next() => match res {
                None => return Ok(()),
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => return Err(e),
                Some(Err(e)) => return Err(ServeError::Transport(e.to_string())),
            },
            _ = stop.wait_for(|s| *s), if grace.is_none() => {
                grace = Some(Box::pin(tokio::time::sleep(SHUTDOWN_GRACE)));
            }
            _ = async { grace.as_mut().expect("guarded").await }, if grace.is_some() => {
                tracing::info!(
                    grace = ?SHUTDOWN_GRACE,
                    "closing the client connections still open"
                );
                tasks.abort_all();
                return Ok(());
            }
        }
    }
}

/// A listener's accepted connections (TLS as its URLs say).
async fn bind(listener: &conn::ClientListener) -> Result<transport::Incoming, ServeError> {
    let addr = listener.addr;
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    Ok(transport::Incoming::with_security(
        tcp,
        listener.security.clone(),
    ))
}

/// How long a stopping member waits for its client connections to finish their calls.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The layers [`grpc_router`] stacks around the services: outermost the unary KV calls' own
/// path past tonic's router and codec (it counts, admits and answers the calls it serves as
/// the layers below would, and hands every other call to them); then metrics (it counts the
/// codes clients see), then the member's guard (a learner refuses; a follower first applies
/// every write it answered from the leader's apply), and innermost the receive-limit
/// rewrite.
pub type GrpcLayers = tower::layer::util::Stack<
    recv_limit_layer::RecvLimitLayer,
    tower::layer::util::Stack<
        member_guard::MemberGuardLayer,
        tower::layer::util::Stack<
            metrics_layer::GrpcMetricsLayer,
            tower::layer::util::Stack<kv_fast_path::KvFastPathLayer, tower::layer::util::Identity>,
        >,
    >,
>;

/// The gRPC router of every client-facing service over `shared` and `locks`, with the gRPC
/// layers; a simulation (`baton-sim`) serves it on its own simulated connections.
pub fn grpc_router(
    shared: &Shared,
    locks: &locks::LockEngine,
) -> tonic::transport::server::Router<
    tower::layer::util::Stack<GrpcLayers, tower::layer::util::Identity>,
> {
    transport::server_builder(
        shared.config.max_concurrent_streams,
        shared.config.keepalive,
    )
    .layer(grpc_layers(shared))
    .add_routes(grpc_routes(shared, locks))
}

/// The [`GrpcLayers`] over `shared`: one definition for the client port, the gateway and the
/// simulation alike.
fn grpc_layers(shared: &Shared) -> GrpcLayers {
    tower::ServiceBuilder::new()
        .layer(kv_fast_path::KvFastPathLayer::new(kv::KvService {
            shared: shared.clone(),
        }))
        .layer(metrics_layer::GrpcMetricsLayer)
        .layer(member_guard::MemberGuardLayer {
            node: shared.node.clone(),
        })
        .layer(recv_limit_layer::RecvLimitLayer)
        .into_inner()
}

/// The gRPC stack [`serve`] runs on a client port, as the JSON gateway calls it: the same
/// layers, in the same order, around the same services.
fn gateway_stack(shared: &Shared, routes: tonic::service::Routes) -> gateway::GrpcService {
    use tower::ServiceExt as _;
    let stack = tower::ServiceBuilder::new()
        .map_request(|request: ::http::Request<tonic::body::Body>| request)
        .layer(grpc_layers(shared))
        .service(routes)
        .map_response(|response: ::http::Response<_>| response.map(tonic::body::Body::new));
    tower::util::BoxCloneSyncService::new(stack)
}

/// Every client-facing gRPC service over `shared` and `locks`, each with its message limits.
pub fn grpc_routes(shared: &Shared, locks: &locks::LockEngine) -> tonic::service::Routes {
    use baton_proto::baton::v1::{
        exactly_once_server::ExactlyOnceServer, fence_server::FenceServer, lock_server::LockServer,
    };
    use baton_proto::etcdserverpb::{
        auth_server::AuthServer, cluster_server::ClusterServer, kv_server::KvServer,
        lease_server::LeaseServer, maintenance_server::MaintenanceServer,
        watch_server::WatchServer,
    };
    use baton_proto::v3electionpb::election_server::ElectionServer;
    use baton_proto::v3lockpb::lock_server::LockServer as V3LockServer;

    tonic::service::Routes::new(
        KvServer::new(kv::KvService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES)
        .max_encoding_message_size(usize::MAX),
    )
    .add_service(
        WatchServer::new(watch::WatchService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES)
        .max_encoding_message_size(usize::MAX),
    )
    .add_service(
        LeaseServer::new(lease::LeaseService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        ClusterServer::new(cluster::ClusterService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        MaintenanceServer::new(maintenance::MaintenanceService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        AuthServer::new(auth_service::AuthService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        V3LockServer::new(v3lock::V3LockService {
            engine: locks.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        ElectionServer::new(election::ElectionService {
            engine: locks.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        LockServer::new(baton_v1::LockService::new(locks.clone()))
            .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        FenceServer::new(baton_v1::FenceService {
            engine: locks.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
    .add_service(
        ExactlyOnceServer::new(exactly_once::ExactlyOnceService {
            shared: shared.clone(),
        })
        .max_decoding_message_size(MAX_GRPC_RECV_BYTES),
    )
}

/// Why serving stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("transport: {0}")]
    Transport(String),
}
