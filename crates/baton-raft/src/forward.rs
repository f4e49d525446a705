//! Follower → leader forwarding, batched: what a follower sends its leader (proposals,
//! keep-alives, TimeToLive, grant checks, ReadIndex) goes out as `ForwardBatch` calls carrying
//! every request that queued up meanwhile.
//!
//! Why: in a 3-member cluster two thirds of the clients are connected to followers, and one
//! peer gRPC exchange per forwarded request (HTTP/2 frames, a handler task and a bincode
//! envelope at both ends) cost about as much CPU as serving the request itself; with 100
//! writers a follower made hundreds of calls per leader batch. Here a request is sent at once
//! while fewer than `in_flight` batches to that leader are outstanding (no added latency under
//! light load); otherwise it waits for a slot and leaves with everything queued behind it
//! (group commit, as the proposer does in front of Raft). The leader serves a batch's items
//! concurrently, its proposals together so they land in one Raft entry, and answers with one
//! response per item in order.
//!
//! Per-request semantics are those of a call of its own, which `routing::Router::route` relies on:
//! each item gets its own answer (an item's `NotLeader` says nothing about the others), its
//! own deadline (a waiter gives up at its deadline with `PeerError::Timeout`; an item whose
//! waiter is gone before the batch leaves is not sent), and a batch's transport failure is
//! every item's failure, classified as for a single call (not delivered, or perhaps done).
//! A batch goes to one leader: requests are queued per leader id, so when leadership moves,
//! requests still queued for the old leader are answered `NotLeader` by it and retried by
//! `route`. Queue memory is bounded per leader (items and bytes); beyond it a request is
//! refused at once as "too many requests" (nothing was sent).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::network::{Method, PeerError, Peers};
use crate::types::Member;
use crate::wire::{self, LeaderResponse};

/// How many batches to one leader may be outstanding at once. A request arriving while
/// fewer are out leaves at once; beyond it, requests queue into the next batch. The bound
/// is a backstop, not the batching: the leader's proposer already puts everything that
/// arrived during its batch in flight into one Raft entry, so a follower that holds its
/// requests back only adds a queue in front of that one. With 2, under load a follower's
/// two slots were always taken (3 members, 50 distinct locks: ~1000 batches/s, each out for
/// ~2 ms), a forwarded write waited for a whole round before leaving, and the contenders
/// on followers made 0.6× the cycles of those on the leader. Measured (3 members, client
/// over all three, alternating runs): 50 distinct locks 10.34k/10.17k cycles/s with 2,
/// 11.18k/10.95k with 8 (4: 10.66k, 16: 10.81k, 64: 10.95k); put with 100 clients
/// 32.6k/34.4k with 2, 34.6k/36.9k with 8. Under light load nothing changes (1 client
/// never has two out).
pub(crate) const MAX_BATCHES_IN_FLIGHT: usize = 8;

/// How long a forwarded lease keep-alive may wait for company before its batch leaves.
/// Keep-alives arrive spread evenly (every client renews each lease every TTL/3), so without
/// a wait nearly every batch carried one of them: 10k leases at TTL 10 s over 3 members were
/// ~2000 peer calls a second into the leader, which spent ~11 % of a core on them (single node:
/// 3 %). A keep-alive's answer is needed within seconds, not milliseconds (the client renews
/// at a third of the TTL), so a few milliseconds cost nothing and batch ~10 per call.
pub(crate) const KEEP_ALIVE_LINGER: Duration = Duration::from_millis(5);

/// Sizes and bounds of the batcher (a struct so tests can shrink them).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Batches to one leader outstanding at once.
    pub(crate) in_flight: usize,
    /// Items per batch.
    pub(crate) batch_items: usize,
    /// Encoded request bytes per batch (a single larger item still goes, alone). Well below
    /// the 16 MiB peer message limit, which must also hold the answers.
    pub(crate) batch_bytes: usize,
    /// Items waiting for a slot, per leader.
    pub(crate) queued_items: usize,
    /// Encoded bytes waiting for a slot, per leader.
    pub(crate) queued_bytes: usize,
    /// How long a request that may wait (a keep-alive) lingers for company.
    pub(crate) linger: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            in_flight: MAX_BATCHES_IN_FLIGHT,
            batch_items: 1024,
            batch_bytes: 4 << 20,
            queued_items: 100_000,
            queued_bytes: 256 << 20,
            linger: KEEP_ALIVE_LINGER,
        }
    }
}

/// Why a forwarded request got no answer from the leader.
#[derive(Debug, Clone)]
pub(crate) enum ForwardError {
    /// The call carrying it failed (or its deadline passed); see `PeerError` for whether it
    /// may have been processed.
    Peer(PeerError),
    /// The queue to that leader is full: refused here, nothing was sent.
    QueueFull,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One `ForwardBatch` call: the encoded `Vec<LeaderRequest>` in, the encoded
/// `Vec<LeaderResponse>` out. A trait so the batcher can be tested without a network.
pub(crate) trait BatchTransport: Send + Sync + 'static {
    fn call(
        &self,
        target: u64,
        node: &Member,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, PeerError>>;
}

impl BatchTransport for Arc<Peers> {
    fn call(
        &self,
        target: u64,
        node: &Member,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> BoxFuture<Result<Vec<u8>, PeerError>> {
        let peers = self.clone();
        let node = node.clone();
        Box::pin(async move {
            Peers::call(
                &peers,
                target,
                &node,
                Method::ForwardBatch,
                payload,
                timeout,
            )
            .await
        })
    }
}

type Answer = Result<LeaderResponse, PeerError>;

struct Item {
    /// The encoded `LeaderRequest`.
    payload: Vec<u8>,
    deadline: Instant,
    done: oneshot::Sender<Answer>,
}

/// Whether a newly queued request starts a batch.
enum Start {
    /// A batch is out or lingering and will take it.
    No,
    Now,
    /// After `Limits::linger`.
    AfterLinger,
}

/// The requests waiting to go to one leader.
#[derive(Default)]
struct Lane {
    /// Where the leader is (the membership's entry as of the last request queued).
    node: Option<Member>,
    queue: VecDeque<Item>,
    queued_bytes: usize,
    /// Batches sent and not yet answered (including a lingering one).
    in_flight: usize,
    /// A slot is taken by a batch that waits `Limits::linger` before it leaves.
    lingering: bool,
}

pub(crate) struct Forwarder {
    transport: Box<dyn BatchTransport>,
    limits: Limits,
    lanes: Mutex<HashMap<u64, Lane>>,
}

impl Forwarder {
    pub(crate) fn new(transport: impl BatchTransport, limits: Limits) -> Arc<Self> {
        Arc::new(Forwarder {
            transport: Box::new(transport),
            limits,
            lanes: Mutex::new(HashMap::new()),
        })
    }

    /// Sends one encoded `LeaderRequest` to `leader` (at `node`) with the next batch and
    /// waits for its answer until `deadline`. A request that `may_linger` (a keep-alive)
    /// starts no batch at once: it waits up to `Limits::linger` for others (any request that
    /// may not wait sends everything queued, the lingering ones included).
    pub(crate) async fn forward(
        self: &Arc<Self>,
        leader: u64,
        node: Member,
        payload: Vec<u8>,
        deadline: Instant,
        may_linger: bool,
    ) -> Result<LeaderResponse, ForwardError> {
        let (done, rx) = oneshot::channel();
        let start = {
            let mut lanes = self.lanes.lock();
            let lane = lanes.entry(leader).or_default();
            let bytes = payload.len();
            if lane.queue.len() >= self.limits.queued_items
                || lane.queued_bytes.saturating_add(bytes) > self.limits.queued_bytes
            {
                metrics::counter!("baton_forward_refused_total").increment(1);
                return Err(ForwardError::QueueFull);
            }
            lane.node = Some(node);
            lane.queued_bytes += bytes;
            lane.queue.push_back(Item {
                payload,
                deadline,
                done,
            });
            let free = lane.in_flight < self.limits.in_flight;
            match (free, may_linger) {
                (false, _) => Start::No,
                (true, true) if lane.lingering => Start::No,
                (true, true) => {
                    lane.in_flight += 1;
                    lane.lingering = true;
                    Start::AfterLinger
                }
                (true, false) => {
                    lane.in_flight += 1;
                    Start::Now
                }
            }
        };
        // A task of its own: the batch carries other callers' requests too, so it must not be
        // cancelled with this caller.
        match start {
            Start::No => {}
            Start::Now => {
                tokio::spawn(self.clone().drive(leader));
            }
            Start::AfterLinger => {
                let me = self.clone();
                let linger = self.limits.linger;
                tokio::spawn(async move {
                    tokio::time::sleep(linger).await;
                    if let Some(lane) = me.lanes.lock().get_mut(&leader) {
                        lane.lingering = false;
                    }
                    me.drive(leader).await;
                });
            }
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Err(_) => Err(ForwardError::Peer(PeerError::Timeout {
                target: leader,
                after: deadline.saturating_duration_since(Instant::now()),
            })),
            // Dropped unanswered: only if the runtime is going away.
            Ok(Err(_)) => Err(ForwardError::Peer(PeerError::Failed {
                target: leader,
                reason: "forwarding stopped".into(),
            })),
            Ok(Ok(answer)) => answer.map_err(ForwardError::Peer),
        }
    }

    /// One in-flight slot to `leader`: sends batches while requests are queued, then frees
    /// the slot.
    async fn drive(self: Arc<Self>, leader: u64) {
        loop {
            let Some((node, batch)) = self.take_batch(leader) else {
                return;
            };
            self.send(leader, &node, batch).await;
        }
    }

    /// The next batch for `leader`, or `None` (and the slot freed) when nothing waits.
    fn take_batch(&self, leader: u64) -> Option<(Member, Vec<Item>)> {
        let mut lanes = self.lanes.lock();
        let lane = lanes
            .get_mut(&leader)
            .expect("a lane with a slot taken exists");
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some(item) = lane.queue.front() {
            if batch.len() >= self.limits.batch_items
                || (!batch.is_empty()
                    && bytes.saturating_add(item.payload.len()) > self.limits.batch_bytes)
            {
                break;
            }
            let item = lane.queue.pop_front().expect("front exists");
            lane.queued_bytes -= item.payload.len();
            // A caller that stopped waiting (deadline, cancelled) gets nothing sent for it.
            if item.done.is_closed() {
                continue;
            }
            bytes += item.payload.len();
            batch.push(item);
        }
        if batch.is_empty() {
            lane.in_flight -= 1;
            if lane.in_flight == 0 && lane.queue.is_empty() {
                lanes.remove(&leader);
            }
            return None;
        }
        let node = lane.node.clone().expect("set with every queued item");
        Some((node, batch))
    }

    /// Sends one batch and hands each item its answer.
    async fn send(&self, leader: u64, node: &Member, batch: Vec<Item>) {
        cached_histogram!("baton_forward_batch_size").record(batch.len() as f64);
        let now = Instant::now();
        // The call lasts as long as its most patient item; each waiter keeps its own deadline.
        let timeout = batch
            .iter()
            .map(|i| i.deadline.saturating_duration_since(now))
            .max()
            .unwrap_or_default();
        let payload = wire::encode_concatenated(batch.iter().map(|i| i.payload.as_slice()));
        let res = self.transport.call(leader, node, payload, timeout).await;
        let answers = res.and_then(|bytes| {
            let answers: Vec<LeaderResponse> =
                wire::decode(&bytes).map_err(|e| PeerError::Failed {
                    target: leader,
                    reason: e.to_string(),
                })?;
            if answers.len() != batch.len() {
                return Err(PeerError::Failed {
                    target: leader,
                    reason: format!("{} answers to {} requests", answers.len(), batch.len()),
                });
            }
            Ok(answers)
        });
        match answers {
            Ok(answers) => {
                for (item, answer) in batch.into_iter().zip(answers) {
                    let _ = item.done.send(Ok(answer));
                }
            }
            Err(e) => {
                for item in batch {
                    let _ = item.done.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LeaderRequest;
    use crate::ProposeError;
    use baton_core::LeaseId;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A leader stand-in: records every batch, answers each `TimeToLive(n)` with
    /// `TimeToLive(Some(n))`, `TimeToLive(-1)` with `NotLeader`, and holds each call until
    /// released (when `gate` is set).
    struct Fake {
        batches: Arc<Mutex<Vec<Vec<i64>>>>,
        gate: Option<Arc<tokio::sync::Semaphore>>,
        in_flight: Arc<AtomicUsize>,
        max_in_flight: Arc<AtomicUsize>,
        fail: Option<PeerError>,
    }

    impl BatchTransport for Fake {
        fn call(
            &self,
            _target: u64,
            _node: &Member,
            payload: Vec<u8>,
            _timeout: Duration,
        ) -> BoxFuture<Result<Vec<u8>, PeerError>> {
            let batches = self.batches.clone();
            let gate = self.gate.clone();
            let in_flight = self.in_flight.clone();
            let max = self.max_in_flight.clone();
            let fail = self.fail.clone();
            Box::pin(async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(now, Ordering::SeqCst);
                let reqs: Vec<LeaderRequest> = wire::decode(&payload).unwrap();
                let ids: Vec<i64> = reqs
                    .iter()
                    .map(|r| match r {
                        LeaderRequest::TimeToLive(id) => id.0,
                        other => panic!("{other:?}"),
                    })
                    .collect();
                batches.lock().push(ids.clone());
                if let Some(g) = gate {
                    g.acquire().await.unwrap().forget();
                }
                in_flight.fetch_sub(1, Ordering::SeqCst);
                if let Some(e) = fail {
                    return Err(e);
                }
                let answers: Vec<LeaderResponse> = ids
                    .into_iter()
                    .map(|id| {
                        if id < 0 {
                            LeaderResponse::Failed(ProposeError::NotLeader { leader: None })
                        } else {
                            LeaderResponse::TimeToLive(Some(id))
                        }
                    })
                    .collect();
                Ok(wire::encode(&answers).unwrap())
            })
        }
    }

    struct Harness {
        fwd: Arc<Forwarder>,
        batches: Arc<Mutex<Vec<Vec<i64>>>>,
        gate: Arc<tokio::sync::Semaphore>,
        max_in_flight: Arc<AtomicUsize>,
    }

    fn harness(limits: Limits, fail: Option<PeerError>) -> Harness {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let max_in_flight = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            batches: batches.clone(),
            gate: Some(gate.clone()),
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight: max_in_flight.clone(),
            fail,
        };
        Harness {
            fwd: Forwarder::new(fake, limits),
            batches,
            gate,
            max_in_flight,
        }
    }

    fn ttl(id: i64) -> Vec<u8> {
        wire::encode(&LeaderRequest::TimeToLive(LeaseId(id))).unwrap()
    }

    fn spawn_forward(
        fwd: &Arc<Forwarder>,
        id: i64,
        deadline: Instant,
    ) -> tokio::task::JoinHandle<Result<LeaderResponse, ForwardError>> {
        let fwd = fwd.clone();
        tokio::spawn(async move {
            fwd.forward(1, Member::default(), ttl(id), deadline, false)
                .await
        })
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    fn limits(in_flight: usize) -> Limits {
        Limits {
            in_flight,
            ..Limits::default()
        }
    }

    #[tokio::test]
    async fn queued_requests_leave_together_in_order_and_get_their_own_answers() {
        let h = harness(limits(1), None);
        let deadline = Instant::now() + Duration::from_secs(5);
        // The first goes at once; the rest queue behind it and leave as one batch.
        let first = spawn_forward(&h.fwd, 0, deadline);
        settle().await;
        let rest: Vec<_> = (1..=5)
            .map(|i| {
                let id = if i == 3 { -3 } else { i };
                spawn_forward(&h.fwd, id, deadline)
            })
            .collect();
        settle().await;
        assert_eq!(*h.batches.lock(), vec![vec![0]]);
        h.gate.add_permits(2);
        assert!(matches!(
            first.await.unwrap(),
            Ok(LeaderResponse::TimeToLive(Some(0)))
        ));
        for (i, t) in (1..=5).zip(rest) {
            match (i, t.await.unwrap()) {
                // One item refused by the "leader" leaves the others answered.
                (3, Ok(LeaderResponse::Failed(ProposeError::NotLeader { .. }))) => {}
                (i, Ok(LeaderResponse::TimeToLive(Some(got)))) => assert_eq!(got, i),
                (i, other) => panic!("{i}: {other:?}"),
            }
        }
        assert_eq!(*h.batches.lock(), vec![vec![0], vec![1, 2, -3, 4, 5]]);
        assert_eq!(h.max_in_flight.load(Ordering::SeqCst), 1);
        assert!(h.fwd.lanes.lock().is_empty(), "an idle lane is dropped");
    }

    #[tokio::test]
    async fn at_most_k_batches_in_flight() {
        let h = harness(limits(2), None);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for i in 0..10 {
            tasks.push(spawn_forward(&h.fwd, i, deadline));
            settle().await;
        }
        // Two went alone; the other eight wait for a slot.
        assert_eq!(*h.batches.lock(), vec![vec![0], vec![1]]);
        h.gate.add_permits(100);
        for (i, t) in tasks.into_iter().enumerate() {
            assert!(matches!(
                t.await.unwrap(),
                Ok(LeaderResponse::TimeToLive(Some(got))) if got == i as i64
            ));
        }
        assert_eq!(h.max_in_flight.load(Ordering::SeqCst), 2);
        let batches = h.batches.lock().clone();
        let flat: Vec<i64> = batches.iter().flatten().copied().collect();
        assert_eq!(flat, (0..10).collect::<Vec<_>>(), "order kept");
        assert!(
            batches.len() <= 4,
            "queued requests were batched: {batches:?}"
        );
    }

    #[tokio::test]
    async fn a_transport_failure_is_every_items_failure() {
        let fail = PeerError::Unreachable {
            target: 1,
            reason: "refused".into(),
        };
        let h = harness(limits(1), Some(fail));
        let deadline = Instant::now() + Duration::from_secs(5);
        let tasks: Vec<_> = (0..3).map(|i| spawn_forward(&h.fwd, i, deadline)).collect();
        settle().await;
        h.gate.add_permits(10);
        for t in tasks {
            match t.await.unwrap() {
                Err(ForwardError::Peer(e)) => assert!(e.not_delivered()),
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn each_item_keeps_its_deadline_and_expired_ones_are_not_sent() {
        let h = harness(limits(1), None);
        let now = Instant::now();
        let blocker = spawn_forward(&h.fwd, 0, now + Duration::from_secs(5));
        settle().await;
        let short = spawn_forward(&h.fwd, 1, now + Duration::from_millis(100));
        let long = spawn_forward(&h.fwd, 2, now + Duration::from_secs(5));
        settle().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        match short.await.unwrap() {
            Err(ForwardError::Peer(PeerError::Timeout { .. })) => {}
            other => panic!("{other:?}"),
        }
        h.gate.add_permits(10);
        assert!(blocker.await.unwrap().is_ok());
        assert!(matches!(
            long.await.unwrap(),
            Ok(LeaderResponse::TimeToLive(Some(2)))
        ));
        // The expired request was dropped from the queue, never sent.
        assert_eq!(*h.batches.lock(), vec![vec![0], vec![2]]);
    }

    #[tokio::test]
    async fn the_queue_is_bounded() {
        let h = harness(
            Limits {
                in_flight: 1,
                queued_items: 3,
                ..Limits::default()
            },
            None,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for i in 0..4 {
            tasks.push(spawn_forward(&h.fwd, i, deadline));
            settle().await;
        }
        // One in flight, three queued: the fifth is refused at once.
        match h
            .fwd
            .forward(1, Member::default(), ttl(99), deadline, false)
            .await
        {
            Err(ForwardError::QueueFull) => {}
            other => panic!("{other:?}"),
        }
        h.gate.add_permits(10);
        for t in tasks {
            assert!(t.await.unwrap().is_ok());
        }
        assert_eq!(*h.batches.lock(), vec![vec![0], vec![1, 2, 3]]);
    }

    #[tokio::test]
    async fn batches_are_cut_by_items_and_bytes() {
        let h = harness(
            Limits {
                in_flight: 1,
                batch_items: 2,
                ..Limits::default()
            },
            None,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut tasks = Vec::new();
        for i in 0..6 {
            tasks.push(spawn_forward(&h.fwd, i, deadline));
            settle().await;
        }
        h.gate.add_permits(10);
        for t in tasks {
            assert!(t.await.unwrap().is_ok());
        }
        assert_eq!(
            *h.batches.lock(),
            vec![vec![0], vec![1, 2], vec![3, 4], vec![5]]
        );
    }

    /// Requests that may wait (keep-alives) go out together after the linger, not one call
    /// each; one that may not wait takes them along at once.
    #[tokio::test]
    async fn keep_alives_linger_and_leave_together() {
        // Long enough that nothing on a loaded machine passes it by accident.
        let linger = Duration::from_millis(500);
        let h = harness(
            Limits {
                in_flight: 2,
                linger,
                ..Limits::default()
            },
            None,
        );
        h.gate.add_permits(100);
        let deadline = Instant::now() + Duration::from_secs(5);
        let lingering = |id: i64| {
            let fwd = h.fwd.clone();
            tokio::spawn(async move {
                fwd.forward(1, Member::default(), ttl(id), deadline, true)
                    .await
            })
        };
        let mut tasks: Vec<_> = (0..3).map(lingering).collect();
        settle().await;
        assert!(
            h.batches.lock().is_empty(),
            "nothing leaves before the linger"
        );
        tokio::time::sleep(linger + Duration::from_millis(50)).await;
        settle().await;
        assert_eq!(*h.batches.lock(), vec![vec![0, 1, 2]]);

        // A request that may not wait sends the lingering ones with it.
        tasks.extend((3..5).map(lingering));
        settle().await;
        tasks.push(spawn_forward(&h.fwd, 5, deadline));
        settle().await;
        assert_eq!(*h.batches.lock(), vec![vec![0, 1, 2], vec![3, 4, 5]]);
        for t in tasks {
            assert!(matches!(
                t.await.unwrap(),
                Ok(LeaderResponse::TimeToLive(Some(_)))
            ));
        }
        // The lingering slot wakes to an empty queue and frees itself.
        tokio::time::sleep(linger * 2).await;
        settle().await;
        assert!(h.fwd.lanes.lock().is_empty());
    }
}
