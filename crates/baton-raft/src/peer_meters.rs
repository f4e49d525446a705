//! Per-peer traffic, for etcd's `etcd_network_*` families: payload bytes sent to and received
//! from each peer, failed calls, and the round-trip time of heartbeats.
//!
//! The label is the peer's member id in hex, as etcd writes it (`To`/`From`). Its values are
//! bounded: a meter is made only for a peer this member calls (taken from the membership) or
//! a sender the membership lists, and never more than [`MAX_PEERS`] of them. The handles are
//! made once per peer, so counting a call is an atomic add, not a registry lookup.
//!
//! Where Baton differs from etcd: etcd's peers stream one-way Raft messages, Baton's call a
//! gRPC method and get an answer, so both directions of every call are counted (the request
//! by the caller as sent, the answer as received; the other way round on the callee). etcd
//! measures round trips with a prober every few seconds, from every member; Baton times the
//! leader's heartbeats (`AppendEntries` without entries, so no disk write in them), so only
//! the leader reports `etcd_network_peer_round_trip_time_seconds`.

use std::collections::HashMap;
use std::sync::Arc;

use metrics::{Counter, Histogram};
use parking_lot::Mutex;

/// At most this many peers get meters (members ever seen, removed ones included).
pub(crate) const MAX_PEERS: usize = 256;

/// One peer's handles.
pub(crate) struct PeerMeter {
    pub(crate) sent_bytes: Counter,
    pub(crate) received_bytes: Counter,
    pub(crate) sent_failures: Counter,
    pub(crate) round_trip: Histogram,
}

impl PeerMeter {
    fn new(id: u64) -> PeerMeter {
        let hex = format!("{id:x}");
        PeerMeter {
            sent_bytes: metrics::counter!("etcd_network_peer_sent_bytes_total", "To" => hex.clone()),
            received_bytes: metrics::counter!("etcd_network_peer_received_bytes_total", "From" => hex.clone()),
            sent_failures: metrics::counter!("etcd_network_peer_sent_failures_total", "To" => hex.clone()),
            round_trip: metrics::histogram!("etcd_network_peer_round_trip_time_seconds", "To" => hex),
        }
    }
}

/// The meters of every peer, shared by the peer client and the peer service.
#[derive(Default)]
pub(crate) struct PeerMeters {
    by_id: Mutex<HashMap<u64, Arc<PeerMeter>>>,
}

impl PeerMeters {
    /// The meter of `id` if it has one.
    pub(crate) fn known(&self, id: u64) -> Option<Arc<PeerMeter>> {
        self.by_id.lock().get(&id).cloned()
    }

    /// The meter of `id`, a member: made on first use, unless [`MAX_PEERS`] already have one.
    pub(crate) fn of_member(&self, id: u64) -> Option<Arc<PeerMeter>> {
        let mut by_id = self.by_id.lock();
        if let Some(m) = by_id.get(&id) {
            return Some(m.clone());
        }
        if by_id.len() >= MAX_PEERS {
            return None;
        }
        let m = Arc::new(PeerMeter::new(id));
        by_id.insert(id, m.clone());
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meters_are_bounded() {
        let meters = PeerMeters::default();
        for id in 0..MAX_PEERS as u64 {
            assert!(meters.of_member(id).is_some());
        }
        assert!(meters.of_member(u64::MAX).is_none());
        assert!(meters.known(3).is_some());
        assert!(meters.known(u64::MAX).is_none());
    }
}
