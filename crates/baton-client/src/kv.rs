//! Key-value operations: get, put, delete and transactions, with builders for their
//! options. Responses are etcd's protobuf messages ([`crate::proto::etcdserverpb`]),
//! re-exported so callers need not depend on `baton-proto` themselves.

use baton_proto::etcdserverpb as pb;
use baton_proto::etcdserverpb::kv_client::KvClient;

use crate::client::{request, write_request, Client, Deadline, Retry};
use crate::error::Result;
use crate::util::prefix_end;

pub use pb::range_request::{SortOrder, SortTarget};
pub use pb::{DeleteRangeResponse, PutResponse, RangeResponse, TxnResponse};

/// Options of [`Client::get`]: which keys, at which revision, how many, in what order.
#[derive(Debug, Clone, Default)]
pub struct GetOptions {
    req: pb::RangeRequest,
    prefix: bool,
}

impl GetOptions {
    /// One key, latest revision, linearizable.
    pub fn new() -> Self {
        Self::default()
    }
    /// Every key starting with the given key.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
    /// Keys in `[key, end)`.
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.req.range_end = end.into();
        self
    }
    /// At most `n` keys (`0`: no limit).
    pub fn with_limit(mut self, n: i64) -> Self {
        self.req.limit = n;
        self
    }
    /// As of this store revision (`0`: latest).
    pub fn with_revision(mut self, rev: i64) -> Self {
        self.req.revision = rev;
        self
    }
    /// Sorted by `target` in `order`.
    pub fn with_sort(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.req.sort_target = target as i32;
        self.req.sort_order = order as i32;
        self
    }
    /// Keys only, no values.
    pub fn with_keys_only(mut self) -> Self {
        self.req.keys_only = true;
        self
    }
    /// Only the count.
    pub fn with_count_only(mut self) -> Self {
        self.req.count_only = true;
        self
    }
    /// Serve from the contacted member's state without a linearizability round trip.
    pub fn with_serializable(mut self) -> Self {
        self.req.serializable = true;
        self
    }
    /// Only keys created at or before `rev`.
    pub fn with_max_create_revision(mut self, rev: i64) -> Self {
        self.req.max_create_revision = rev;
        self
    }
    /// Only keys created at or after `rev`.
    pub fn with_min_create_revision(mut self, rev: i64) -> Self {
        self.req.min_create_revision = rev;
        self
    }

    pub(crate) fn into_request(self, key: Vec<u8>) -> pb::RangeRequest {
        let mut req = self.req;
        if self.prefix {
            req.range_end = prefix_end(&key);
        }
        req.key = key;
        req
    }
}

/// Options of [`Client::put`].
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    req: pb::PutRequest,
}

impl PutOptions {
    /// No lease, no previous value.
    pub fn new() -> Self {
        Self::default()
    }
    /// Attach the key to lease `id`: it is deleted when the lease ends.
    pub fn with_lease(mut self, id: i64) -> Self {
        self.req.lease = id;
        self
    }
    /// Return the previous key-value pair.
    pub fn with_prev_kv(mut self) -> Self {
        self.req.prev_kv = true;
        self
    }
    pub(crate) fn into_request(self, key: Vec<u8>, value: Vec<u8>) -> pb::PutRequest {
        let mut req = self.req;
        req.key = key;
        req.value = value;
        req
    }
}

/// Options of [`Client::delete`].
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    req: pb::DeleteRangeRequest,
    prefix: bool,
}

impl DeleteOptions {
    /// One key.
    pub fn new() -> Self {
        Self::default()
    }
    /// Every key starting with the given key.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }
    /// Keys in `[key, end)` (`end = [0]`: every key from the given one on).
    pub fn with_range_end(mut self, end: impl Into<Vec<u8>>) -> Self {
        self.req.range_end = end.into();
        self
    }
    /// Return the deleted pairs.
    pub fn with_prev_kv(mut self) -> Self {
        self.req.prev_kv = true;
        self
    }
    pub(crate) fn into_request(self, key: Vec<u8>) -> pb::DeleteRangeRequest {
        let mut req = self.req;
        if self.prefix {
            req.range_end = prefix_end(&key);
        }
        req.key = key;
        req
    }
}

/// How a [`Compare`] relates the key's field to the given value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
    /// `>`
    Greater,
    /// `<`
    Less,
}

impl CompareOp {
    fn pb(self) -> i32 {
        use pb::compare::CompareResult as R;
        (match self {
            CompareOp::Equal => R::Equal,
            CompareOp::NotEqual => R::NotEqual,
            CompareOp::Greater => R::Greater,
            CompareOp::Less => R::Less,
        }) as i32
    }
}

/// One condition of a [`Txn`]. A key that does not exist has create revision, mod revision,
/// version and lease `0`; `create_revision(key) == 0` is therefore "the key is absent".
#[derive(Debug, Clone)]
pub struct Compare(pub(crate) pb::Compare);

impl Compare {
    fn new(key: impl Into<Vec<u8>>, op: CompareOp, target: pb::compare::CompareTarget) -> Self {
        Compare(pb::Compare {
            key: key.into(),
            result: op.pb(),
            target: target as i32,
            ..Default::default()
        })
    }
    /// Compares the key's create revision.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, rev: i64) -> Self {
        let mut c = Self::new(key, op, pb::compare::CompareTarget::Create);
        c.0.target_union = Some(pb::compare::TargetUnion::CreateRevision(rev));
        c
    }
    /// Compares the key's last modification revision.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, rev: i64) -> Self {
        let mut c = Self::new(key, op, pb::compare::CompareTarget::Mod);
        c.0.target_union = Some(pb::compare::TargetUnion::ModRevision(rev));
        c
    }
    /// Compares the key's version (number of puts since creation).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Self {
        let mut c = Self::new(key, op, pb::compare::CompareTarget::Version);
        c.0.target_union = Some(pb::compare::TargetUnion::Version(version));
        c
    }
    /// Compares the key's value (bytewise).
    pub fn value(key: impl Into<Vec<u8>>, op: CompareOp, value: impl Into<Vec<u8>>) -> Self {
        let mut c = Self::new(key, op, pb::compare::CompareTarget::Value);
        c.0.target_union = Some(pb::compare::TargetUnion::Value(value.into()));
        c
    }
    /// Compares the key's lease.
    pub fn lease(key: impl Into<Vec<u8>>, op: CompareOp, lease: i64) -> Self {
        let mut c = Self::new(key, op, pb::compare::CompareTarget::Lease);
        c.0.target_union = Some(pb::compare::TargetUnion::Lease(lease));
        c
    }
    /// Applies the comparison to every key starting with the key (each must satisfy it).
    pub fn with_prefix(mut self) -> Self {
        self.0.range_end = prefix_end(&self.0.key);
        self
    }
}

/// One operation of a [`Txn`] branch.
#[derive(Debug, Clone)]
pub struct Op(pub(crate) pb::RequestOp);

impl Op {
    fn of(r: pb::request_op::Request) -> Op {
        Op(pb::RequestOp { request: Some(r) })
    }
    /// A get (see [`GetOptions`]).
    pub fn get(key: impl Into<Vec<u8>>, opts: GetOptions) -> Op {
        Op::of(pb::request_op::Request::RequestRange(
            opts.into_request(key.into()),
        ))
    }
    /// A put (see [`PutOptions`]).
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, opts: PutOptions) -> Op {
        Op::of(pb::request_op::Request::RequestPut(
            opts.into_request(key.into(), value.into()),
        ))
    }
    /// A delete (see [`DeleteOptions`]).
    pub fn delete(key: impl Into<Vec<u8>>, opts: DeleteOptions) -> Op {
        Op::of(pb::request_op::Request::RequestDeleteRange(
            opts.into_request(key.into()),
        ))
    }
    /// A nested transaction.
    pub fn txn(txn: Txn) -> Op {
        Op::of(pb::request_op::Request::RequestTxn(txn.into_request()))
    }
}

/// An atomic `if all(compares) then ops else ops`, applied as one revision.
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, Compare, CompareOp, GetOptions, Op, PutOptions, Txn};
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// // Create "config" only if it does not exist yet.
/// let create = || Txn::new()
///     .when([Compare::create_revision("config", CompareOp::Equal, 0)])
///     .and_then([Op::put("config", "v1", PutOptions::new())])
///     .or_else([Op::get("config", GetOptions::new())]);
/// assert!(client.txn(create()).await?.succeeded);
/// assert!(!client.txn(create()).await?.succeeded);
/// # Ok(()) });
/// ```
#[derive(Debug, Clone, Default)]
pub struct Txn {
    compare: Vec<pb::Compare>,
    success: Vec<pb::RequestOp>,
    failure: Vec<pb::RequestOp>,
}

impl Txn {
    /// An empty transaction (no conditions: the success branch runs).
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds conditions (all must hold).
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.compare.extend(compares.into_iter().map(|c| c.0));
        self
    }
    /// Adds operations to the branch run when every condition holds.
    pub fn and_then(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.success.extend(ops.into_iter().map(|o| o.0));
        self
    }
    /// Adds operations to the branch run otherwise.
    pub fn or_else(mut self, ops: impl IntoIterator<Item = Op>) -> Self {
        self.failure.extend(ops.into_iter().map(|o| o.0));
        self
    }
    pub(crate) fn into_request(self) -> pb::TxnRequest {
        pb::TxnRequest {
            compare: self.compare,
            success: self.success,
            failure: self.failure,
        }
    }
}

/// The range response of the `i`-th operation of a txn branch, if it was a get.
pub(crate) fn txn_range(resp: &TxnResponse, i: usize) -> Option<&RangeResponse> {
    match resp.responses.get(i)?.response.as_ref()? {
        pb::response_op::Response::ResponseRange(r) => Some(r),
        _ => None,
    }
}

impl Client {
    /// Reads a key (or a range: see [`GetOptions`]). Retried on another endpoint when the
    /// current one is unavailable.
    pub async fn get(&self, key: impl Into<Vec<u8>>, opts: GetOptions) -> Result<RangeResponse> {
        let req = opts.into_request(key.into());
        self.call("KV/Range", Retry::Idempotent, Deadline::Default, |ch, t| {
            let r = request(req.clone(), t);
            async move { KvClient::new(ch).range(r).await }
        })
        .await
    }

    /// Writes a key.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        opts: PutOptions,
    ) -> Result<PutResponse> {
        let req = opts.into_request(key.into(), value.into());
        let id = self.next_request_id();
        self.call("KV/Put", Retry::Once, Deadline::Default, |ch, t| {
            let r = write_request(req.clone(), t, id);
            async move { KvClient::new(ch).put(r).await }
        })
        .await
    }

    /// Deletes a key (or a range: see [`DeleteOptions`]).
    pub async fn delete(
        &self,
        key: impl Into<Vec<u8>>,
        opts: DeleteOptions,
    ) -> Result<DeleteRangeResponse> {
        let req = opts.into_request(key.into());
        let id = self.next_request_id();
        self.call("KV/DeleteRange", Retry::Once, Deadline::Default, |ch, t| {
            let r = write_request(req.clone(), t, id);
            async move { KvClient::new(ch).delete_range(r).await }
        })
        .await
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.txn_with_retry(txn, Retry::Once).await
    }

    /// A txn that the caller knows is safe to repeat (a conditional create of its own key,
    /// a compare-and-delete): recipes use this to ride out a failover.
    pub(crate) async fn txn_with_retry(&self, txn: Txn, retry: Retry) -> Result<TxnResponse> {
        let req = txn.into_request();
        let id = self.next_request_id();
        self.call("KV/Txn", retry, Deadline::Default, |ch, t| {
            let r = write_request(req.clone(), t, id);
            async move { KvClient::new(ch).txn(r).await }
        })
        .await
    }
}
