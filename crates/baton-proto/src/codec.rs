//! The codec of every generated client and server: prost's, except that a txn nested in a
//! txn is decoded one level at a time.
//!
//! etcd accepts a txn nested up to 129 levels deep (`checkTxnRequest` gives a nested txn the
//! `--max-txn-ops` budget its parents left, and every level above the last spends at least
//! one op on the nested txn) and answers anything deeper with "too many operations in txn
//! request"; its Go decoder has no depth limit. prost refuses any message nested more than
//! 100 deep, and a level of txn costs two (`TxnRequest` → `RequestOp` → `TxnRequest`), so a
//! 50-level txn came back as an internal decoding error. prost's only other option,
//! `no-recursion-limit`, lifts the limit for every message and every field, unknown groups
//! included, so a 2 MiB message could nest a million deep and overflow the stack.
//!
//! Here the limit stays, but applies per level: the messages that nest a txn are decoded
//! through mirror types ([`TxnRequestLevel`] …) whose nested-txn field is the raw bytes of
//! the inner message, each level with prost's full budget, and the levels are counted and
//! capped at [`MAX_TXN_LEVELS`]. No hand-written protobuf parsing: the mirrors are prost
//! messages with etcd's field numbers, and a bytes field and a message field are the same
//! on the wire.

use std::any::Any;
use std::marker::PhantomData;

use prost::bytes::{Buf, Bytes};
use prost::Message;
use tonic::codec::{DecodeBuf, Decoder};
use tonic::Status;

use crate::baton::v1 as bv1;
use crate::etcdserverpb as pb;

/// The deepest txn decoded, counting the outermost as level 1. Twice what etcd can accept
/// (129 with its default 128 ops), so every txn etcd judges by its own order of checks
/// reaches those same checks (`baton_core`'s `validate`); deeper ones are refused here, as
/// etcd refuses them, without building them.
pub const MAX_TXN_LEVELS: usize = 258;

/// etcd's answer to a txn nested deeper than its op budget allows
/// (`rpctypes.ErrGRPCTooManyOps`); the server's error table pins it.
pub const TOO_MANY_OPS: &str = "etcdserver: too many operations in txn request";

/// prost's codec with [`TxnDecoder`] for decoding; named by `build.rs` (`codec_path`).
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = TxnDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        TxnDecoder(PhantomData)
    }
}

/// Decodes `U` with prost, or level by level when `U` nests a txn.
pub struct TxnDecoder<U>(PhantomData<U>);

impl<U: Message + Default + 'static> Decoder for TxnDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        decode_message(buf).map(Some)
    }
}

/// Rust has no specialization, so the four message types that nest a txn are picked out by
/// type; every other message is prost's own decoding, unchanged.
pub fn decode_message<U: Message + Default + 'static>(mut buf: impl Buf) -> Result<U, Status> {
    let mut msg = U::default();
    let slot: &mut dyn Any = &mut msg;
    if let Some(m) = slot.downcast_mut::<pb::TxnRequest>() {
        *m = txn_request(whole(buf), 1)?;
    } else if let Some(m) = slot.downcast_mut::<pb::TxnResponse>() {
        *m = txn_response(whole(buf), 1)?;
    } else if let Some(m) = slot.downcast_mut::<bv1::ExactlyOnceTxnRequest>() {
        let level = decode::<ExactlyOnceTxnRequestLevel>(whole(buf))?;
        *m = bv1::ExactlyOnceTxnRequest {
            id: level.id,
            acknowledged_below: level.acknowledged_below,
            request: level.request.map(|b| txn_request(b, 1)).transpose()?,
        };
    } else if let Some(m) = slot.downcast_mut::<bv1::ExactlyOnceTxnResponse>() {
        let level = decode::<ExactlyOnceTxnResponseLevel>(whole(buf))?;
        *m = bv1::ExactlyOnceTxnResponse {
            response: level.response.map(|b| txn_response(b, 1)).transpose()?,
            replayed: level.replayed,
        };
    } else {
        msg.merge(&mut buf).map_err(decode_error)?;
    }
    Ok(msg)
}

/// The message as one `Bytes`, so the nested levels' bytes fields are slices of it rather
/// than copies (a `DecodeBuf` hands out its buffer without copying).
fn whole(mut buf: impl Buf) -> Bytes {
    buf.copy_to_bytes(buf.remaining())
}

fn decode<M: Message + Default>(bytes: Bytes) -> Result<M, Status> {
    M::decode(bytes).map_err(decode_error)
}

/// tonic-prost's mapping of a decoding error (gRPC's INTERNAL for a message that does not
/// parse).
fn decode_error(e: prost::DecodeError) -> Status {
    Status::internal(e.to_string())
}

fn check_level(level: usize) -> Result<(), Status> {
    if level > MAX_TXN_LEVELS {
        return Err(Status::invalid_argument(TOO_MANY_OPS));
    }
    Ok(())
}

/// Recursion here is bounded by [`MAX_TXN_LEVELS`], a few hundred bytes of stack a level.
fn txn_request(bytes: Bytes, level: usize) -> Result<pb::TxnRequest, Status> {
    check_level(level)?;
    let t = decode::<TxnRequestLevel>(bytes)?;
    let ops = |ops: Vec<RequestOpLevel>| {
        ops.into_iter()
            .map(|op| request_op(op, level))
            .collect::<Result<Vec<_>, Status>>()
    };
    Ok(pb::TxnRequest {
        compare: t.compare,
        success: ops(t.success)?,
        failure: ops(t.failure)?,
    })
}

fn request_op(op: RequestOpLevel, level: usize) -> Result<pb::RequestOp, Status> {
    use pb::request_op::Request;
    let request = match op.request {
        None => None,
        Some(RequestLevel::Range(r)) => Some(Request::RequestRange(r)),
        Some(RequestLevel::Put(p)) => Some(Request::RequestPut(p)),
        Some(RequestLevel::DeleteRange(d)) => Some(Request::RequestDeleteRange(d)),
        Some(RequestLevel::Txn(b)) => Some(Request::RequestTxn(txn_request(b, level + 1)?)),
    };
    Ok(pb::RequestOp { request })
}

fn txn_response(bytes: Bytes, level: usize) -> Result<pb::TxnResponse, Status> {
    check_level(level)?;
    let t = decode::<TxnResponseLevel>(bytes)?;
    Ok(pb::TxnResponse {
        header: t.header,
        succeeded: t.succeeded,
        responses: t
            .responses
            .into_iter()
            .map(|op| response_op(op, level))
            .collect::<Result<Vec<_>, Status>>()?,
    })
}

fn response_op(op: ResponseOpLevel, level: usize) -> Result<pb::ResponseOp, Status> {
    use pb::response_op::Response;
    let response = match op.response {
        None => None,
        Some(ResponseLevel::Range(r)) => Some(Response::ResponseRange(r)),
        Some(ResponseLevel::Put(p)) => Some(Response::ResponsePut(p)),
        Some(ResponseLevel::DeleteRange(d)) => Some(Response::ResponseDeleteRange(d)),
        Some(ResponseLevel::Txn(b)) => Some(Response::ResponseTxn(txn_response(b, level + 1)?)),
    };
    Ok(pb::ResponseOp { response })
}

// The mirrors: etcd's field numbers (`rpc.proto`, `baton.proto`), the nested txn as bytes.
// A nested message field that appears twice is merged by prost but replaced here (and by
// etcd's gogo-generated decoder, which replaces a oneof's message).

/// `etcdserverpb.TxnRequest`, each op one level.
#[derive(Clone, PartialEq, prost::Message)]
struct TxnRequestLevel {
    #[prost(message, repeated, tag = "1")]
    compare: Vec<pb::Compare>,
    #[prost(message, repeated, tag = "2")]
    success: Vec<RequestOpLevel>,
    #[prost(message, repeated, tag = "3")]
    failure: Vec<RequestOpLevel>,
}

/// `etcdserverpb.RequestOp` with `request_txn` as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RequestOpLevel {
    #[prost(oneof = "RequestLevel", tags = "1, 2, 3, 4")]
    request: Option<RequestLevel>,
}

/// `etcdserverpb.RequestOp.request`.
#[derive(Clone, PartialEq, prost::Oneof)]
enum RequestLevel {
    #[prost(message, tag = "1")]
    Range(pb::RangeRequest),
    #[prost(message, tag = "2")]
    Put(pb::PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(pb::DeleteRangeRequest),
    #[prost(bytes = "bytes", tag = "4")]
    Txn(Bytes),
}

/// `etcdserverpb.TxnResponse`, each op one level.
#[derive(Clone, PartialEq, prost::Message)]
struct TxnResponseLevel {
    #[prost(message, optional, tag = "1")]
    header: Option<pb::ResponseHeader>,
    #[prost(bool, tag = "2")]
    succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    responses: Vec<ResponseOpLevel>,
}

/// `etcdserverpb.ResponseOp` with `response_txn` as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct ResponseOpLevel {
    #[prost(oneof = "ResponseLevel", tags = "1, 2, 3, 4")]
    response: Option<ResponseLevel>,
}

/// `etcdserverpb.ResponseOp.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
enum ResponseLevel {
    #[prost(message, tag = "1")]
    Range(pb::RangeResponse),
    #[prost(message, tag = "2")]
    Put(pb::PutResponse),
    #[prost(message, tag = "3")]
    DeleteRange(pb::DeleteRangeResponse),
    #[prost(bytes = "bytes", tag = "4")]
    Txn(Bytes),
}

/// `baton.v1.ExactlyOnceTxnRequest` with `request` as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct ExactlyOnceTxnRequestLevel {
    #[prost(message, optional, tag = "1")]
    id: Option<bv1::RequestId>,
    #[prost(uint64, tag = "2")]
    acknowledged_below: u64,
    #[prost(bytes = "bytes", optional, tag = "3")]
    request: Option<Bytes>,
}

/// `baton.v1.ExactlyOnceTxnResponse` with `response` as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct ExactlyOnceTxnResponseLevel {
    #[prost(bytes = "bytes", optional, tag = "1")]
    response: Option<Bytes>,
    #[prost(bool, tag = "2")]
    replayed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A txn `levels` deep: each level one put and the next level (the last only the put).
    fn nested(levels: usize) -> pb::TxnRequest {
        let put = |i: usize| pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                key: format!("k{i}").into_bytes(),
                ..Default::default()
            })),
        };
        let mut t = pb::TxnRequest {
            success: vec![put(levels)],
            ..Default::default()
        };
        for i in (1..levels).rev() {
            t = pb::TxnRequest {
                compare: vec![pb::Compare {
                    key: b"c".to_vec(),
                    ..Default::default()
                }],
                success: vec![put(i)],
                failure: vec![pb::RequestOp {
                    request: Some(pb::request_op::Request::RequestTxn(t)),
                }],
            };
        }
        t
    }

    fn nested_response(levels: usize) -> pb::TxnResponse {
        let mut t = pb::TxnResponse::default();
        for _ in 1..levels {
            t = pb::TxnResponse {
                header: Some(pb::ResponseHeader {
                    revision: 7,
                    ..Default::default()
                }),
                succeeded: true,
                responses: vec![pb::ResponseOp {
                    response: Some(pb::response_op::Response::ResponseTxn(t)),
                }],
            };
        }
        t
    }

    #[test]
    fn prost_alone_stops_at_about_fifty_levels() {
        // What this module is for: prost's own limit, two per level, refuses etcd's depths.
        let first_refused = (1..100)
            .find(|&n| pb::TxnRequest::decode(&nested(n).encode_to_vec()[..]).is_err())
            .unwrap();
        assert_eq!(first_refused, 51);
        let err = pb::TxnRequest::decode(&nested(51).encode_to_vec()[..]).unwrap_err();
        assert!(err.to_string().contains("recursion limit"), "{err}");
    }

    #[test]
    fn nested_txns_decode_as_prost_decodes_shallow_ones() {
        for levels in [1, 2, 49] {
            let t = nested(levels);
            let bytes = t.encode_to_vec();
            assert_eq!(decode_message::<pb::TxnRequest>(&bytes[..]).unwrap(), t);
            assert_eq!(pb::TxnRequest::decode(&bytes[..]).unwrap(), t);
            let r = nested_response(levels);
            let bytes = r.encode_to_vec();
            assert_eq!(decode_message::<pb::TxnResponse>(&bytes[..]).unwrap(), r);
            assert_eq!(pb::TxnResponse::decode(&bytes[..]).unwrap(), r);
        }
    }

    #[test]
    fn levels_up_to_the_limit_decode_and_deeper_get_etcds_answer() {
        let t = nested(MAX_TXN_LEVELS);
        assert_eq!(
            decode_message::<pb::TxnRequest>(&t.encode_to_vec()[..]).unwrap(),
            t
        );
        let r = nested_response(MAX_TXN_LEVELS);
        assert_eq!(
            decode_message::<pb::TxnResponse>(&r.encode_to_vec()[..]).unwrap(),
            r
        );

        let err = decode_message::<pb::TxnRequest>(&nested(MAX_TXN_LEVELS + 1).encode_to_vec()[..])
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(err.message(), TOO_MANY_OPS);
        let err = decode_message::<pb::TxnResponse>(
            &nested_response(MAX_TXN_LEVELS + 1).encode_to_vec()[..],
        )
        .unwrap_err();
        assert_eq!(err.message(), TOO_MANY_OPS);
    }

    #[test]
    fn a_maliciously_deep_txn_is_refused_without_deep_recursion() {
        // About a megabyte of `success { request_txn { … } }`, some 150k levels, written as
        // raw bytes from the inside out (as a message it would recurse to encode and drop).
        // Decoded on a runtime worker's 2 MiB stack, which unbounded recursion overflows.
        let mut headers: Vec<Vec<u8>> = Vec::new();
        let mut len = 0usize;
        while len < 1024 * 1024 {
            // RequestOp.request_txn (4) holds the txn, TxnRequest.success (2) holds the op.
            for tag in [0x22u8, 0x12] {
                let mut header = vec![tag];
                put_varint(&mut header, len);
                len += header.len();
                headers.push(header);
            }
        }
        let bytes: Vec<u8> = headers.into_iter().rev().flatten().collect();
        let err = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || decode_message::<pb::TxnRequest>(&bytes[..]).unwrap_err())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(err.message(), TOO_MANY_OPS);
    }

    #[test]
    fn exactly_once_txns_nest_like_txns_and_other_messages_are_prosts() {
        let req = bv1::ExactlyOnceTxnRequest {
            id: Some(bv1::RequestId {
                client_id: 3,
                sequence: 4,
            }),
            acknowledged_below: 2,
            request: Some(nested(100)),
        };
        assert_eq!(
            decode_message::<bv1::ExactlyOnceTxnRequest>(&req.encode_to_vec()[..]).unwrap(),
            req
        );
        let empty = bv1::ExactlyOnceTxnRequest::default();
        assert_eq!(
            decode_message::<bv1::ExactlyOnceTxnRequest>(&empty.encode_to_vec()[..]).unwrap(),
            empty
        );
        let present = bv1::ExactlyOnceTxnRequest {
            request: Some(pb::TxnRequest::default()),
            ..Default::default()
        };
        assert_eq!(
            decode_message::<bv1::ExactlyOnceTxnRequest>(&present.encode_to_vec()[..]).unwrap(),
            present
        );
        let resp = bv1::ExactlyOnceTxnResponse {
            response: Some(nested_response(100)),
            replayed: true,
        };
        assert_eq!(
            decode_message::<bv1::ExactlyOnceTxnResponse>(&resp.encode_to_vec()[..]).unwrap(),
            resp
        );
        let put = pb::PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            lease: 5,
            ..Default::default()
        };
        assert_eq!(
            decode_message::<pb::PutRequest>(&put.encode_to_vec()[..]).unwrap(),
            put
        );
        let err = decode_message::<pb::PutRequest>(&[0x0a, 0x05][..]).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal);
    }

    fn put_varint(out: &mut Vec<u8>, mut v: usize) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
}
