//! Protobuf messages and gRPC services spoken by Baton.
//!
//! Baton presents itself to the outside world as an etcd v3 server, so that
//! unmodified etcd clients (`etcdctl`, the `etcd-client` crate, the Go
//! `clientv3` package, ...) can talk to it. gRPC/protobuf compatibility is
//! decided purely by what travels on the wire: the fully-qualified service and
//! method names (which form the HTTP/2 `:path`, e.g. `/etcdserverpb.KV/Range`)
//! and the field *numbers* and wire types inside each message. The `.proto`
//! files in this crate's `proto/` directory are therefore hand-written
//! replicas of etcd's API with **frozen** package, service, method, message
//! and field names and numbers. Changing any of them silently breaks every
//! existing client; new fields may only be appended with fresh numbers.
//!
//! Only Baton's own package ([`baton::v1`]) is free to evolve, and even there
//! shipped field numbers must never be reused.
//!
//! The protos are compiled at build time by `protox` (pure Rust, no system
//! `protoc`) and `tonic-prost-build`. Note that prost converts field names to
//! `snake_case`, so etcd's camelCase / upper-case fields get Rust names such
//! as `ttl` (`TTL`), `id` (`ID`), `peer_ur_ls` (`peerURLs`), `db_size`
//! (`dbSize`) and `key_permission` (`keyPermission`). The wire encoding is
//! unaffected.

#![warn(missing_docs)]

pub mod codec;

/// etcd's MVCC storage types: `KeyValue` and watch `Event`s.
#[allow(clippy::all, missing_docs)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// etcd's authentication types: users, roles and permissions.
#[allow(clippy::all, missing_docs)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// etcd's client API: the KV, Watch, Lease, Cluster, Maintenance and Auth
/// services with their request/response messages.
#[allow(clippy::all, missing_docs)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// etcd's distributed lock service (`v3lockpb.Lock`).
#[allow(clippy::all, missing_docs)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// etcd's leader election service (`v3electionpb.Election`).
#[allow(clippy::all, missing_docs)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// Baton's own (non-etcd) protobuf packages.
pub mod baton {
    /// Version 1 of Baton's own API (`baton.v1`).
    #[allow(clippy::all, missing_docs)]
    pub mod v1 {
        tonic::include_proto!("baton.v1");
    }

    /// Baton's internal peer-to-peer service (`baton.raft.v1`): Raft replication between
    /// members and requests forwarded to the leader. Served on peer URLs only; payloads are
    /// bincode and change with Baton's build, so every member must run the same one.
    pub mod raft {
        /// Version 1 of the peer service.
        #[allow(clippy::all, missing_docs)]
        pub mod v1 {
            tonic::include_proto!("baton.raft.v1");
        }
    }
}

/// Encoded `google.protobuf.FileDescriptorSet` covering every proto file in
/// this crate (imports included), for gRPC server reflection, JSON gateways
/// and other descriptor-driven tooling.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/baton_descriptor.bin"));

#[cfg(test)]
mod tests {
    use super::etcdserverpb::{
        compare, request_op, Compare, PutRequest, RangeRequest, RequestOp, TxnRequest,
    };
    use super::mvccpb::KeyValue;
    use prost::Message;

    #[test]
    fn put_request_wire_bytes() {
        let req = PutRequest {
            key: b"a".to_vec(),
            value: b"b".to_vec(),
            lease: 5,
            ..Default::default()
        };
        // field 1 (key, LEN), field 2 (value, LEN), field 3 (lease, VARINT)
        assert_eq!(
            req.encode_to_vec(),
            vec![0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 5]
        );
    }

    #[test]
    fn range_request_roundtrip_and_wire_bytes() {
        let req = RangeRequest {
            key: b"foo".to_vec(),
            range_end: b"fop".to_vec(),
            limit: 10,
            serializable: true,
            ..Default::default()
        };
        let bytes = req.encode_to_vec();
        assert_eq!(
            bytes,
            vec![
                0x0a, 3, b'f', b'o', b'o', // key = 1
                0x12, 3, b'f', b'o', b'p', // range_end = 2
                0x18, 10, // limit = 3
                0x38, 1, // serializable = 7
            ]
        );
        assert_eq!(RangeRequest::decode(bytes.as_slice()).unwrap(), req);
    }

    #[test]
    fn compare_range_end_uses_field_64() {
        let cmp = Compare {
            range_end: b"z".to_vec(),
            ..Default::default()
        };
        // field 64, wire type 2 => tag 0x202 => varint [0x82, 0x04]
        assert_eq!(cmp.encode_to_vec(), vec![0x82, 0x04, 1, b'z']);

        let cmp = Compare {
            target_union: Some(compare::TargetUnion::Lease(7)),
            ..Default::default()
        };
        assert_eq!(cmp.encode_to_vec(), vec![0x40, 7]);
    }

    #[test]
    fn nested_txn_roundtrip() {
        let txn = TxnRequest {
            compare: vec![],
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(TxnRequest {
                    success: vec![RequestOp {
                        request: Some(request_op::Request::RequestPut(PutRequest {
                            key: b"k".to_vec(),
                            ..Default::default()
                        })),
                    }],
                    ..Default::default()
                })),
            }],
            failure: vec![],
        };
        let bytes = txn.encode_to_vec();
        assert_eq!(TxnRequest::decode(bytes.as_slice()).unwrap(), txn);
    }

    #[test]
    fn key_value_lease_is_field_6() {
        let kv = KeyValue {
            lease: 1,
            ..Default::default()
        };
        assert_eq!(kv.encode_to_vec(), vec![0x30, 1]);
    }

    #[test]
    fn descriptor_set_is_present() {
        let set = prost_types_free_check(super::FILE_DESCRIPTOR_SET);
        assert!(set);
    }

    /// Cheap sanity check without depending on `prost-types`: the encoded set
    /// must mention every package we compile.
    fn prost_types_free_check(bytes: &[u8]) -> bool {
        let s = String::from_utf8_lossy(bytes);
        [
            "mvccpb",
            "authpb",
            "etcdserverpb",
            "v3lockpb",
            "v3electionpb",
            "baton.v1",
            "baton.raft.v1",
        ]
        .iter()
        .all(|p| s.contains(p))
    }
}
