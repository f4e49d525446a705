//! Mechanical conversions between etcd's wire types and the core's own types.
//!
//! The core does not depend on the protos (it is a leaf crate), so this is the one place
//! where field-by-field mapping lives.

use baton_core as core;
use baton_proto::etcdserverpb as pb;
use baton_proto::mvccpb;

pub fn kv_to_pb(kv: core::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision.0,
        mod_revision: kv.mod_revision.0,
        version: kv.version,
        value: kv.value,
        lease: kv.lease.0,
    }
}

pub fn event_to_pb(ev: core::Event) -> mvccpb::Event {
    let kind = match ev.kind {
        core::EventKind::Put => mvccpb::event::EventType::Put,
        core::EventKind::Delete => mvccpb::event::EventType::Delete,
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(kv_to_pb(ev.kv)),
        prev_kv: ev.prev_kv.map(kv_to_pb),
    }
}

fn key_range(key: Vec<u8>, range_end: Vec<u8>) -> core::KeyRange {
    core::KeyRange { key, range_end }
}

pub fn range_from_pb(r: pb::RangeRequest) -> core::RangeRequest {
    use pb::range_request::{SortOrder, SortTarget};
    let sort_order = match r.sort_order() {
        SortOrder::None => core::SortOrder::None,
        SortOrder::Ascend => core::SortOrder::Ascend,
        SortOrder::Descend => core::SortOrder::Descend,
    };
    let sort_target = match r.sort_target() {
        SortTarget::Key => core::SortTarget::Key,
        SortTarget::Version => core::SortTarget::Version,
        SortTarget::Create => core::SortTarget::Create,
        SortTarget::Mod => core::SortTarget::Mod,
        SortTarget::Value => core::SortTarget::Value,
    };
    core::RangeRequest {
        range: key_range(r.key, r.range_end),
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    }
}

/// etcd refuses a value together with `ignore_value`, and a lease together with
/// `ignore_lease`, rather than silently dropping one of them.
pub fn put_from_pb(p: pb::PutRequest) -> Result<core::PutRequest, tonic::Status> {
    if p.ignore_value && !p.value.is_empty() {
        return Err(tonic::Status::invalid_argument(
            "etcdserver: value is provided",
        ));
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(tonic::Status::invalid_argument(
            "etcdserver: lease is provided",
        ));
    }
    Ok(core::PutRequest {
        key: p.key,
        value: p.value,
        lease: core::LeaseId(p.lease),
        prev_kv: p.prev_kv,
        ignore_value: p.ignore_value,
        ignore_lease: p.ignore_lease,
    })
}

pub fn delete_from_pb(d: pb::DeleteRangeRequest) -> core::DeleteRangeRequest {
    core::DeleteRangeRequest {
        range: key_range(d.key, d.range_end),
        prev_kv: d.prev_kv,
    }
}

/// Malformed txn parts (an op with no request, a compare with no operand) are refused here
/// with etcd's wording rather than guessed at.
pub fn txn_from_pb(t: pb::TxnRequest) -> Result<core::TxnRequest, tonic::Status> {
    let compare = t
        .compare
        .into_iter()
        .map(compare_from_pb)
        .collect::<Result<Vec<_>, _>>()?;
    let success = ops_from_pb(t.success)?;
    let failure = ops_from_pb(t.failure)?;
    Ok(core::TxnRequest {
        compare,
        success,
        failure,
    })
}

fn ops_from_pb(ops: Vec<pb::RequestOp>) -> Result<Vec<core::RequestOp>, tonic::Status> {
    use pb::request_op::Request;
    ops.into_iter()
        .map(|op| match op.request {
            Some(Request::RequestRange(r)) => Ok(core::RequestOp::Range(range_from_pb(r))),
            Some(Request::RequestPut(p)) => Ok(core::RequestOp::Put(put_from_pb(p)?)),
            Some(Request::RequestDeleteRange(d)) => {
                Ok(core::RequestOp::DeleteRange(delete_from_pb(d)))
            }
            Some(Request::RequestTxn(t)) => Ok(core::RequestOp::Txn(txn_from_pb(t)?)),
            // etcd 3.4's checkRequestOp answers an empty op with ErrGRPCKeyNotFound.
            None => Err(crate::errors::kv_status(&baton_core::KvError::KeyNotFound)),
        })
        .collect()
}

fn compare_from_pb(c: pb::Compare) -> Result<core::Compare, tonic::Status> {
    use pb::compare::{CompareResult, CompareTarget, TargetUnion};
    let result = match c.result() {
        CompareResult::Equal => core::CompareResult::Equal,
        CompareResult::Greater => core::CompareResult::Greater,
        CompareResult::Less => core::CompareResult::Less,
        CompareResult::NotEqual => core::CompareResult::NotEqual,
    };
    // etcd reads the operand from the oneof that matches `target`; a missing oneof is the
    // zero value of that target, as proto3 would give it.
    let target = match (c.target(), c.target_union) {
        (CompareTarget::Version, Some(TargetUnion::Version(v))) => core::CompareTarget::Version(v),
        (CompareTarget::Version, _) => core::CompareTarget::Version(0),
        (CompareTarget::Create, Some(TargetUnion::CreateRevision(v))) => {
            core::CompareTarget::Create(v)
        }
        (CompareTarget::Create, _) => core::CompareTarget::Create(0),
        (CompareTarget::Mod, Some(TargetUnion::ModRevision(v))) => core::CompareTarget::Mod(v),
        (CompareTarget::Mod, _) => core::CompareTarget::Mod(0),
        (CompareTarget::Value, Some(TargetUnion::Value(v))) => core::CompareTarget::Value(v),
        (CompareTarget::Value, _) => core::CompareTarget::Value(Vec::new()),
        (CompareTarget::Lease, Some(TargetUnion::Lease(v))) => core::CompareTarget::Lease(v),
        (CompareTarget::Lease, _) => core::CompareTarget::Lease(0),
    };
    Ok(core::Compare {
        range: key_range(c.key, c.range_end),
        result,
        target,
    })
}

pub fn range_resp_to_pb(r: core::RangeResponse, header: pb::ResponseHeader) -> pb::RangeResponse {
    pb::RangeResponse {
        header: Some(header),
        kvs: r.kvs.into_iter().map(kv_to_pb).collect(),
        more: r.more,
        count: r.count,
    }
}

pub fn put_resp_to_pb(r: core::PutResponse, header: pb::ResponseHeader) -> pb::PutResponse {
    pb::PutResponse {
        header: Some(header),
        prev_kv: r.prev_kv.map(kv_to_pb),
    }
}

pub fn delete_resp_to_pb(
    r: core::DeleteRangeResponse,
    header: pb::ResponseHeader,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header: Some(header),
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(kv_to_pb).collect(),
    }
}

/// The outer header is complete; etcd gives nested responses a header with only the
/// revision, and clients printing JSON show exactly that.
pub fn txn_resp_to_pb(r: core::TxnResponse, header: &pb::ResponseHeader) -> pb::TxnResponse {
    use pb::response_op::Response;
    let inner = pb::ResponseHeader {
        revision: header.revision,
        ..Default::default()
    };
    let responses = r
        .responses
        .into_iter()
        .map(|op| pb::ResponseOp {
            response: Some(match op {
                core::ResponseOp::Range(r) => Response::ResponseRange(range_resp_to_pb(r, inner)),
                core::ResponseOp::Put(p) => Response::ResponsePut(put_resp_to_pb(p, inner)),
                core::ResponseOp::DeleteRange(d) => {
                    Response::ResponseDeleteRange(delete_resp_to_pb(d, inner))
                }
                core::ResponseOp::Txn(t) => Response::ResponseTxn(txn_resp_to_pb(t, &inner)),
            }),
        })
        .collect();
    pb::TxnResponse {
        header: Some(*header),
        succeeded: r.succeeded,
        responses,
    }
}
