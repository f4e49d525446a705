//! go-grpc-prometheus' server families, as etcd exports them: `grpc_server_started_total`,
//! `grpc_server_handled_total`, `grpc_server_msg_received_total`, `grpc_server_msg_sent_total`
//! and `grpc_server_handling_seconds`, labelled `grpc_type`, `grpc_service`, `grpc_method`
//! (and `grpc_code`), plus etcd's `etcd_network_client_grpc_{received,sent}_bytes_total`.
//!
//! The label values come from a table made once from the services' `.proto` descriptors
//! (`baton_proto::FILE_DESCRIPTOR_SET`), never from the request: a path outside the table
//! is counted under one `unknown` service and method, so clients cannot add series. Every
//! method of the table gets its series at start (zero), as go-grpc-prometheus' `Register`
//! does, so dashboards and rates see them before the first call. The handles are made once,
//! so a call costs a hash lookup of its path and a few atomic adds.
//!
//! What is counted when (go-grpc-prometheus' rules, with tonic's shapes): a call is
//! *started* when the layer sees it (or, for the unary KV calls, `kv_fast_path` in front of
//! it, which counts the calls it serves by the same rules); a message is *received* or *sent* when a whole
//! length-prefixed gRPC message has passed through the request or response body (its
//! payload bytes, without the 5-byte prefix, are etcd's client gRPC bytes); a call is
//! *handled* with the status it ends with — from the headers of a trailers-only answer,
//! from the trailers otherwise — or `Canceled` when the response is dropped before its
//! status went out (the client reset the stream or closed the connection: grpc-go's
//! handler sees its context cancelled then, which etcd's watch answers with `Canceled`).
//! The handling time runs from the start to that moment.

use std::collections::HashMap;
use std::sync::OnceLock;

use baton_proto::baton::v1::{exactly_once_server, fence_server, lock_server};
use baton_proto::etcdserverpb::{
    auth_server, cluster_server, kv_server, lease_server, maintenance_server, watch_server,
};
use baton_proto::v3electionpb::election_server;
use baton_proto::v3lockpb::lock_server as v3lock_server;
use metrics::{Counter, Histogram};
use prost::Message;

/// The services `grpc_router` serves, by their gRPC names. A service added there without
/// being named here is counted as `unknown` (the test `every_served_service_is_in_the_table`
/// lists what the table holds).
const SERVED: [&str; 11] = [
    kv_server::SERVICE_NAME,
    watch_server::SERVICE_NAME,
    lease_server::SERVICE_NAME,
    cluster_server::SERVICE_NAME,
    maintenance_server::SERVICE_NAME,
    auth_server::SERVICE_NAME,
    v3lock_server::SERVICE_NAME,
    election_server::SERVICE_NAME,
    lock_server::SERVICE_NAME,
    fence_server::SERVICE_NAME,
    exactly_once_server::SERVICE_NAME,
];

/// The `grpc_service`/`grpc_method`/`grpc_type` value of everything outside the table.
pub(crate) const UNKNOWN: &str = "unknown";

/// gRPC status codes by number, as go-grpc-prometheus writes them (`codes.Code.String()`).
pub(crate) const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
pub(crate) const OK_CODE: usize = 0;
pub(crate) const CANCELED: usize = 1;
pub(crate) const UNKNOWN_CODE: usize = 2;

/// A status code's index in [`CODES`] from a `grpc-status` value (`Unknown` if it is none).
pub(crate) fn code_index(value: &[u8]) -> usize {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|c| *c < CODES.len())
        .unwrap_or(UNKNOWN_CODE)
}

/// One method as the descriptors declare it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MethodInfo {
    pub(crate) service: String,
    pub(crate) method: String,
    pub(crate) grpc_type: &'static str,
}

impl MethodInfo {
    pub(crate) fn path(&self) -> String {
        format!("/{}/{}", self.service, self.method)
    }
}

/// go-grpc-prometheus' `grpc_type` of a method.
fn grpc_type(client_streaming: bool, server_streaming: bool) -> &'static str {
    match (client_streaming, server_streaming) {
        (false, false) => "unary",
        (true, false) => "client_stream",
        (false, true) => "server_stream",
        (true, true) => "bidi_stream",
    }
}

/// Every method of the served services, from the compiled descriptors.
pub(crate) fn served_methods() -> Vec<MethodInfo> {
    let set = prost_types::FileDescriptorSet::decode(baton_proto::FILE_DESCRIPTOR_SET)
        .expect("baton-proto's descriptor set decodes");
    let mut methods = Vec::new();
    for file in &set.file {
        let package = file.package();
        for service in &file.service {
            let full = if package.is_empty() {
                service.name().to_owned()
            } else {
                format!("{package}.{}", service.name())
            };
            if !SERVED.contains(&full.as_str()) {
                continue;
            }
            for m in &service.method {
                methods.push(MethodInfo {
                    service: full.clone(),
                    method: m.name().to_owned(),
                    grpc_type: grpc_type(m.client_streaming(), m.server_streaming()),
                });
            }
        }
    }
    methods
}

/// One method's handles.
pub(crate) struct MethodMeters {
    started: Counter,
    received: Counter,
    sent: Counter,
    handled: [Counter; CODES.len()],
    handling: Histogram,
}

impl MethodMeters {
    fn new(service: &str, method: &str, grpc_type: &'static str) -> MethodMeters {
        // In name order, as Prometheus' Go client writes them (the exporter keeps the order
        // given; etcd's e2e test matches whole lines).
        let labels = [
            ("grpc_method", method.to_owned()),
            ("grpc_service", service.to_owned()),
            ("grpc_type", grpc_type.to_owned()),
        ];
        MethodMeters {
            started: metrics::counter!("grpc_server_started_total", &labels),
            received: metrics::counter!("grpc_server_msg_received_total", &labels),
            sent: metrics::counter!("grpc_server_msg_sent_total", &labels),
            handled: CODES.map(|code| {
                let mut with_code = vec![("grpc_code", code.to_owned())];
                with_code.extend(labels.iter().cloned());
                metrics::counter!("grpc_server_handled_total", &with_code)
            }),
            handling: metrics::histogram!("grpc_server_handling_seconds", &labels),
        }
    }

    pub(crate) fn started(&self) {
        self.started.increment(1);
    }

    pub(crate) fn handled(&self, code: usize, seconds: f64) {
        self.handled[code].increment(1);
        self.handling.record(seconds);
    }
}

/// Every method's handles, plus the unknown one and the byte counters.
pub(crate) struct GrpcMeters {
    by_path: HashMap<String, MethodMeters>,
    unknown: MethodMeters,
    received_bytes: Counter,
    sent_bytes: Counter,
}

impl GrpcMeters {
    /// The handles of the method at `path` (the unknown method's if it is not served).
    pub(crate) fn method(&self, path: &str) -> &MethodMeters {
        self.by_path.get(path).unwrap_or(&self.unknown)
    }

    /// Messages received (whole ones) and their payload bytes.
    pub(crate) fn received(&self, m: &MethodMeters, messages: u64, bytes: u64) {
        if messages > 0 {
            m.received.increment(messages);
        }
        if bytes > 0 {
            self.received_bytes.increment(bytes);
        }
    }

    /// Messages sent (whole ones) and their payload bytes.
    pub(crate) fn sent(&self, m: &MethodMeters, messages: u64, bytes: u64) {
        if messages > 0 {
            m.sent.increment(messages);
        }
        if bytes > 0 {
            self.sent_bytes.increment(bytes);
        }
    }
}

/// The table, made (and every series registered) on first use: after the metrics recorder
/// is installed, since handles made before it count nowhere.
pub(crate) fn meters() -> &'static GrpcMeters {
    static METERS: OnceLock<GrpcMeters> = OnceLock::new();
    METERS.get_or_init(|| GrpcMeters {
        by_path: served_methods()
            .into_iter()
            .map(|m| {
                let meters = MethodMeters::new(&m.service, &m.method, m.grpc_type);
                (m.path(), meters)
            })
            .collect(),
        unknown: MethodMeters::new(UNKNOWN, UNKNOWN, UNKNOWN),
        received_bytes: metrics::counter!("etcd_network_client_grpc_received_bytes_total"),
        sent_bytes: metrics::counter!("etcd_network_client_grpc_sent_bytes_total"),
    })
}

/// Finds the gRPC messages in a body's bytes as they stream by: each is a 1-byte flag and a
/// 4-byte big-endian length, then the payload, and any of them may be split across chunks.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Frames {
    /// Prefix bytes of the next message seen so far (0..5).
    prefix_len: usize,
    prefix: [u8; 5],
    /// Payload bytes of the current message still to come.
    remaining: u64,
}

impl Frames {
    /// No message is partly seen.
    #[cfg(test)]
    fn between_messages(&self) -> bool {
        self.prefix_len == 0 && self.remaining == 0
    }

    /// Feeds one chunk; returns the messages it completed and the payload bytes it carried.
    pub(crate) fn feed(&mut self, mut data: &[u8]) -> (u64, u64) {
        let (mut messages, mut payload) = (0, 0);
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len() as u64);
                self.remaining -= n;
                payload += n;
                data = &data[n as usize..];
                if self.remaining == 0 {
                    messages += 1;
                }
                continue;
            }
            let n = (5 - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data = &data[n..];
            if self.prefix_len == 5 {
                self.prefix_len = 0;
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                self.remaining = u64::from(len);
                if len == 0 {
                    messages += 1;
                }
            }
        }
        (messages, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &[u8]) -> Vec<u8> {
        let mut m = vec![0];
        m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        m.extend_from_slice(payload);
        m
    }

    #[test]
    fn messages_are_found_however_the_bytes_are_chunked() {
        let mut stream = message(b"hello");
        stream.extend(message(b""));
        stream.extend(message(&[7; 300]));
        for chunk in [1, 2, 3, 5, 6, 7, 64, stream.len()] {
            let mut f = Frames::default();
            let (m, b) = stream
                .chunks(chunk)
                .map(|c| f.feed(c))
                .fold((0, 0), |(m, b), (m2, b2)| (m + m2, b + b2));
            assert_eq!((m, b), (3, 305), "chunks of {chunk}");
            assert!(f.between_messages(), "ends between messages");
        }
    }

    #[test]
    fn every_served_service_is_in_the_table() {
        let methods = served_methods();
        for service in SERVED {
            assert!(
                methods.iter().any(|m| m.service == service),
                "{service} has no methods in the descriptors"
            );
        }
        let kind = |path: &str| {
            methods
                .iter()
                .find(|m| m.path() == path)
                .map(|m| m.grpc_type)
        };
        assert_eq!(kind("/etcdserverpb.KV/Range"), Some("unary"));
        assert_eq!(kind("/etcdserverpb.Watch/Watch"), Some("bidi_stream"));
        assert_eq!(
            kind("/etcdserverpb.Lease/LeaseKeepAlive"),
            Some("bidi_stream")
        );
        assert_eq!(
            kind("/etcdserverpb.Maintenance/Snapshot"),
            Some("server_stream")
        );
        assert_eq!(
            kind("/v3electionpb.Election/Observe"),
            Some("server_stream")
        );
        // The peer service is not a client-facing one.
        assert!(!methods.iter().any(|m| m.service.starts_with("baton.raft")));
    }

    #[test]
    fn status_codes_by_number() {
        assert_eq!(CODES[code_index(b"0")], "OK");
        assert_eq!(CODES[code_index(b"1")], "Canceled");
        assert_eq!(CODES[code_index(b"16")], "Unauthenticated");
        assert_eq!(CODES[code_index(b"17")], "Unknown");
        assert_eq!(CODES[code_index(b"x")], "Unknown");
    }
}
