//! What operators and tools ask about the cluster rather than the data: the answering
//! member's status, the member list, and the locks the server's registry holds.

use baton_proto::baton::v1 as bpb;
use baton_proto::baton::v1::lock_client::LockClient;
use baton_proto::etcdserverpb as pb;
use baton_proto::etcdserverpb::cluster_client::ClusterClient;
use baton_proto::etcdserverpb::maintenance_client::MaintenanceClient;

use crate::client::{request, Client, Deadline, Retry};
use crate::error::{Error, Result};

pub use bpb::{InspectResponse, ListLocksResponse, LockEntry, LockSummary};
pub use pb::{Member, MemberListResponse, StatusResponse};

/// The chunks of [`Client::snapshot`].
pub struct SnapshotStream {
    inner: tonic::Streaming<pb::SnapshotResponse>,
}

impl SnapshotStream {
    /// The next chunk, `None` at the end of the stream.
    pub async fn next(&mut self) -> Result<Option<pb::SnapshotResponse>> {
        self.inner.message().await.map_err(Error::from_status)
    }
}

/// Options of [`Client::list_locks`]: which names, from where, how many.
#[derive(Debug, Clone, Default)]
pub struct ListLocksOptions {
    req: bpb::ListLocksRequest,
}

impl ListLocksOptions {
    /// Every lock, from the first name, at most the server's default page (1000).
    pub fn new() -> Self {
        Self::default()
    }
    /// Only names starting with `prefix`.
    pub fn with_prefix(mut self, prefix: impl Into<Vec<u8>>) -> Self {
        self.req.prefix = prefix.into();
        self
    }
    /// Only names after `name` (pass the last name of the previous page to page on).
    pub fn after(mut self, name: impl Into<Vec<u8>>) -> Self {
        self.req.after = name.into();
        self
    }
    /// At most `n` locks (the server caps a page at 10000).
    pub fn with_limit(mut self, n: usize) -> Self {
        self.req.limit = n.min(i64::MAX as usize) as i64;
        self
    }
}

impl Client {
    /// One lock in detail (Baton's `baton.v1.Lock/Inspect`): the holder (key, fencing
    /// token, lease and its remaining TTL), the first 1000 waiters in queue order and their
    /// total, the lock-delay state and the recent force-releases. Baton only
    /// ([`Error::Unsupported`] on etcd).
    ///
    /// ```
    /// # baton_client::testing::doctest(|endpoint| async move {
    /// use baton_client::{Client, ClientConfig, Mutex, Session, SessionOptions};
    ///
    /// let client = Client::connect(ClientConfig::new([endpoint])).await?;
    /// let session = Session::new(&client, SessionOptions::new()).await?;
    /// let guard = Mutex::new(&session).acquire("deploy").await?;
    /// let lock = client.inspect_lock("deploy").await?;
    /// assert_eq!(lock.holder.unwrap().key, guard.key());
    /// assert_eq!(lock.waiter_count, 0);
    /// # Ok(()) });
    /// ```
    pub async fn inspect_lock(&self, name: impl Into<Vec<u8>>) -> Result<InspectResponse> {
        let req = bpb::InspectRequest { name: name.into() };
        let r = self
            .call(
                "baton.v1.Lock/Inspect",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = request(req.clone(), t);
                    async move { LockClient::new(ch).inspect(r).await }
                },
            )
            .await;
        match r {
            Err(Error::Unsupported(_)) => Err(Error::Unsupported("inspecting locks")),
            r => r,
        }
    }

    /// The status of the member this client is connected to (etcd's `Maintenance.Status`):
    /// its id and the leader's in the header and `leader`, Raft term and indexes, database
    /// size, and the store revision (`header.revision`).
    pub async fn status(&self) -> Result<StatusResponse> {
        self.call(
            "Maintenance/Status",
            Retry::Idempotent,
            Deadline::Default,
            |ch, t| {
                let r = request(pb::StatusRequest {}, t);
                async move { MaintenanceClient::new(ch).status(r).await }
            },
        )
        .await
    }

    /// A snapshot of the member's store in etcd's format (etcd's `Maintenance.Snapshot`,
    /// served by the member this client is connected to): chunks of a bbolt database, each
    /// saying how many bytes are still to come, then one with the SHA-256 of all of them.
    /// Only obtaining the stream has the request deadline; reading it has none (a large
    /// store takes as long as it takes). With auth on, root only.
    pub async fn snapshot(&self) -> Result<SnapshotStream> {
        let inner = self
            .call(
                "Maintenance/Snapshot",
                Retry::Idempotent,
                Deadline::Default,
                |ch, _| {
                    let r = request(pb::SnapshotRequest {}, None);
                    async move { MaintenanceClient::new(ch).snapshot(r).await }
                },
            )
            .await?;
        Ok(SnapshotStream { inner })
    }

    /// The hash of the member's key space up to `revision` (0: its current revision), with
    /// the revision it covers and the member's compaction revision (etcd's
    /// `Maintenance.HashKV`, answered by the member itself: how replicas are compared).
    pub async fn hash_kv(&self, revision: i64) -> Result<pb::HashKvResponse> {
        self.call(
            "Maintenance/HashKV",
            Retry::Idempotent,
            Deadline::Default,
            |ch, t| {
                let r = request(pb::HashKvRequest { revision }, t);
                async move { MaintenanceClient::new(ch).hash_kv(r).await }
            },
        )
        .await
    }

    /// The cluster's members (etcd's `Cluster.MemberList`), linearizable: a member that
    /// lost contact with the leader does not answer with a stale list.
    pub async fn member_list(&self) -> Result<MemberListResponse> {
        self.call(
            "Cluster/MemberList",
            Retry::Idempotent,
            Deadline::Default,
            |ch, t| {
                let r = request(pb::MemberListRequest { linearizable: true }, t);
                async move { ClusterClient::new(ch).member_list(r).await }
            },
        )
        .await
    }

    /// Adds a member with `peer_urls` (etcd's `Cluster.MemberAdd`); a learner if
    /// `is_learner`. The response names the new member (its id) and lists every member.
    /// Sent once: a repeated add would add a second member.
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<pb::MemberAddResponse> {
        self.call(
            "Cluster/MemberAdd",
            Retry::Once,
            Deadline::Default,
            |ch, t| {
                let r = request(
                    pb::MemberAddRequest {
                        peer_ur_ls: peer_urls.clone(),
                        is_learner,
                    },
                    t,
                );
                async move { ClusterClient::new(ch).member_add(r).await }
            },
        )
        .await
    }

    /// Removes a member (etcd's `Cluster.MemberRemove`).
    pub async fn member_remove(&self, id: u64) -> Result<pb::MemberRemoveResponse> {
        self.call(
            "Cluster/MemberRemove",
            Retry::Once,
            Deadline::Default,
            |ch, t| {
                let r = request(pb::MemberRemoveRequest { id }, t);
                async move { ClusterClient::new(ch).member_remove(r).await }
            },
        )
        .await
    }

    /// Gives a member new peer URLs (etcd's `Cluster.MemberUpdate`).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<pb::MemberUpdateResponse> {
        self.call(
            "Cluster/MemberUpdate",
            Retry::Once,
            Deadline::Default,
            |ch, t| {
                let r = request(
                    pb::MemberUpdateRequest {
                        id,
                        peer_ur_ls: peer_urls.clone(),
                    },
                    t,
                );
                async move { ClusterClient::new(ch).member_update(r).await }
            },
        )
        .await
    }

    /// Makes a learner that has caught up a voter (etcd's `Cluster.MemberPromote`).
    pub async fn member_promote(&self, id: u64) -> Result<pb::MemberPromoteResponse> {
        self.call(
            "Cluster/MemberPromote",
            Retry::Once,
            Deadline::Default,
            |ch, t| {
                let r = request(pb::MemberPromoteRequest { id }, t);
                async move { ClusterClient::new(ch).member_promote(r).await }
            },
        )
        .await
    }

    /// Hands leadership to `target` (etcd's `Maintenance.MoveLeader`). Only the leader
    /// accepts it ("etcdserver: not leader" elsewhere): connect to the leader's endpoint.
    pub async fn move_leader(&self, target: u64) -> Result<pb::MoveLeaderResponse> {
        self.call(
            "Maintenance/MoveLeader",
            Retry::Once,
            Deadline::Default,
            |ch, t| {
                let r = request(pb::MoveLeaderRequest { target_id: target }, t);
                async move { MaintenanceClient::new(ch).move_leader(r).await }
            },
        )
        .await
    }

    /// Locks in the server's lock registry, in name order, each with its holder (key,
    /// fencing token, lease) and number of waiters; `more` says a next page exists.
    /// Baton only: etcd has no lock registry ([`Error::Unsupported`]).
    ///
    /// The registry knows every lock taken through the server's lock services (this
    /// crate's [`crate::Mutex`] on Baton, etcd's `v3lock` and `v3election` APIs); keys that
    /// only etcd's client-side recipes wrote (`etcdctl lock`) show up once a server-side
    /// acquisition names the same lock.
    ///
    /// ```
    /// # baton_client::testing::doctest(|endpoint| async move {
    /// use baton_client::{Client, ClientConfig, ListLocksOptions, Mutex, Session, SessionOptions};
    ///
    /// let client = Client::connect(ClientConfig::new([endpoint])).await?;
    /// let session = Session::new(&client, SessionOptions::new()).await?;
    /// let guard = Mutex::new(&session).acquire("deploy").await?;
    /// let list = client.list_locks(ListLocksOptions::new()).await?;
    /// let deploy = &list.locks[0];
    /// assert_eq!(deploy.name, b"deploy");
    /// assert_eq!(deploy.holder.as_ref().unwrap().create_revision, guard.fencing_token().get());
    /// assert_eq!((deploy.waiter_count, list.more), (0, false));
    /// # Ok(()) });
    /// ```
    pub async fn list_locks(&self, opts: ListLocksOptions) -> Result<ListLocksResponse> {
        let req = opts.req;
        let r = self
            .call(
                "baton.v1.Lock/List",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = request(req.clone(), t);
                    async move { LockClient::new(ch).list(r).await }
                },
            )
            .await;
        match r {
            Err(Error::Unsupported(_)) => Err(Error::Unsupported("listing locks")),
            r => r,
        }
    }
}
