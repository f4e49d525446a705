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
//! by the caller as sent, the answer as received; the other way round on the callee).
//!
//! **Round trips, as etcd reports them.** etcd's `etcd_network_peer_round_trip_time_seconds`
//! is not one sample per probe: rafthttp probes each peer every few seconds, keeps a smoothed
//! round trip (`github.com/xiang90/probing`: SRTT ← 0.875·SRTT + 0.125·RTT, from 0) and
//! observes that SRTT into the histogram every 30 s (the first time after 5 s). Upstream's
//! `etcdMemberCommunicationSlow` alert (p99 over 5 m > 0.15 s) is tuned for those values.
//! Baton times the leader's heartbeats instead (`AppendEntries` without entries, so no disk
//! write in them; only the leader reports), smooths them the same way and observes the SRTT
//! on the same schedule ([`report_round_trips`]) — so one heartbeat delayed by a busy
//! machine moves the series as little as it moves etcd's, instead of putting the p99 over
//! the alert's threshold on its own.

use std::sync::{Arc, Weak};
use std::time::Duration;

use metrics::{Counter, Histogram};
use parking_lot::Mutex;

use crate::types::MemberMap;

/// At most this many peers get meters (members ever seen, removed ones included).
pub(crate) const MAX_PEERS: usize = 256;

/// The weight of a new round trip in the smoothed one (the prober's α).
const SRTT_ALPHA: f64 = 0.125;
/// When the smoothed round trip is first observed, and then how often (rafthttp's
/// `statusErrorInterval` and `statusMonitoringInterval`).
pub(crate) const ROUND_TRIP_FIRST_REPORT: Duration = Duration::from_secs(5);
pub(crate) const ROUND_TRIP_REPORT_EVERY: Duration = Duration::from_secs(30);

/// One peer's handles.
pub(crate) struct PeerMeter {
    pub(crate) sent_bytes: Counter,
    pub(crate) received_bytes: Counter,
    pub(crate) sent_failures: Counter,
    round_trip: Histogram,
    srtt: Mutex<SmoothedRoundTrip>,
}

/// A peer's smoothed round trip.
#[derive(Default)]
struct SmoothedRoundTrip {
    seconds: f64,
    /// A round trip was timed since the last report (a member that is not the leader times
    /// none, and reports nothing rather than a stale value).
    fresh: bool,
}

impl PeerMeter {
    fn new(id: u64) -> PeerMeter {
        let hex = format!("{id:x}");
        PeerMeter {
            sent_bytes: metrics::counter!("etcd_network_peer_sent_bytes_total", "To" => hex.clone()),
            received_bytes: metrics::counter!("etcd_network_peer_received_bytes_total", "From" => hex.clone()),
            sent_failures: metrics::counter!("etcd_network_peer_sent_failures_total", "To" => hex.clone()),
            round_trip: metrics::histogram!("etcd_network_peer_round_trip_time_seconds", "To" => hex),
            srtt: Mutex::new(SmoothedRoundTrip::default()),
        }
    }

    /// Counts one timed round trip into the smoothed one (observed by [`report_round_trips`]).
    pub(crate) fn timed_round_trip(&self, rtt: Duration) {
        let mut s = self.srtt.lock();
        s.seconds = (1.0 - SRTT_ALPHA) * s.seconds + SRTT_ALPHA * rtt.as_secs_f64();
        s.fresh = true;
    }

    /// Observes the smoothed round trip, if one was timed since the last report.
    fn report_round_trip(&self) {
        let mut s = self.srtt.lock();
        if std::mem::take(&mut s.fresh) {
            self.round_trip.record(s.seconds);
        }
    }
}

/// The meters of every peer, shared by the peer client and the peer service.
#[derive(Default)]
pub(crate) struct PeerMeters {
    by_id: Mutex<MemberMap<Arc<PeerMeter>>>,
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

    fn report_round_trips(&self) {
        for m in self.by_id.lock().values() {
            m.report_round_trip();
        }
    }
}

/// Observes every peer's smoothed round trip on etcd's schedule (see the module docs), for
/// as long as the meters exist.
pub(crate) async fn report_round_trips(meters: Weak<PeerMeters>) {
    let mut wait = ROUND_TRIP_FIRST_REPORT;
    loop {
        tokio::time::sleep(wait).await;
        let Some(m) = meters.upgrade() else { return };
        m.report_round_trips();
        wait = ROUND_TRIP_REPORT_EVERY;
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

    #[test]
    fn the_round_trip_is_smoothed_as_etcds_prober_smooths_it() {
        let meters = PeerMeters::default();
        let m = meters.of_member(7).unwrap();
        let srtt = |m: &PeerMeter| m.srtt.lock().seconds;
        // From 0, each sample weighs 1/8: ten 1 ms round trips, then one of 200 ms.
        for _ in 0..10 {
            m.timed_round_trip(Duration::from_millis(1));
        }
        let before = srtt(&m);
        assert!((before - 0.001 * (1.0 - 0.875f64.powi(10))).abs() < 1e-12);
        m.timed_round_trip(Duration::from_millis(200));
        let after = srtt(&m);
        assert!((after - (0.875 * before + 0.125 * 0.2)).abs() < 1e-12);
        assert!(
            after < 0.15 / 4.0,
            "one slow heartbeat stays far below the alert's 0.15 s"
        );
        // Reported once per timed stretch: nothing new, nothing observed.
        assert!(m.srtt.lock().fresh);
        meters.report_round_trips();
        assert!(!m.srtt.lock().fresh);
    }

    #[tokio::test(start_paused = true)]
    async fn the_report_stops_with_the_meters() {
        let meters = Arc::new(PeerMeters::default());
        let m = meters.of_member(1).unwrap();
        m.timed_round_trip(Duration::from_millis(1));
        let task = tokio::spawn(report_round_trips(Arc::downgrade(&meters)));
        tokio::time::sleep(ROUND_TRIP_FIRST_REPORT + Duration::from_millis(1)).await;
        assert!(!m.srtt.lock().fresh, "reported after the first 5 s");
        drop(meters);
        tokio::time::sleep(ROUND_TRIP_REPORT_EVERY).await;
        assert!(task.await.is_ok(), "ended");
    }
}
