//! `etcdserverpb.Watch`: one task per stream, feeding from the node-local watch hub.
//!
//! Ordering rules kept here (etcd's `api_guarantees.md`): a watcher's `created` response
//! precedes its events; events arrive in revision order, each revision whole (unless the
//! client asked for fragments); a progress response is sent only when every watcher on the
//! stream has been handed everything up to the revision it names.

use std::collections::BTreeMap;
use std::pin::Pin;

use baton_core::{KeyRange, Revision, WatchOutput, WatchSpec, WatcherId, MAX_REQUEST_BYTES};
use baton_proto::etcdserverpb as pb;
use baton_proto::mvccpb;
use futures::{Stream, StreamExt};
use prost::Message;
use tokio::sync::mpsc;
use tonic::{Request, Status, Streaming};

use crate::conn::ClientConnectInfo;
use crate::convert::event_to_pb;
use crate::errors::{auth_status, go_status_text};
use crate::Shared;

/// How often a stream with watchers looks for a changed auth store (a revoked permission
/// cancels the watchers it no longer covers).
const AUTH_RECHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// Responses queued per stream before the stream's task waits for the client to read.
const STREAM_QUEUE: usize = 128;
/// Watchers one stream may hold; beyond it creates are refused.
pub const MAX_WATCHERS_PER_STREAM: usize = 10_000;
/// Events handed to one watcher per turn, so one busy watcher cannot starve the others.
const EVENTS_PER_TURN: usize = 1000;

/// etcd's `mvcc.ErrEmptyWatcherRange`: a range that holds no key can never fire.
pub const EMPTY_WATCHER_RANGE: &str = "mvcc: watcher range is empty";
/// etcd's `mvcc.ErrWatcherDuplicateID`.
pub const DUPLICATE_WATCH_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";

/// The start revision to watch from for the one asked. etcd passes a negative one to its
/// store as it is: the history read from there is empty (the revision's bytes sort after
/// every real one), so the watcher starts from now; but once anything has been compacted,
/// a start below the compact revision is compacted (`watcherGroup.chooseAll`). Revision 1
/// gets the same answer here through the hub's own compaction check. (A store's compact
/// revision is 1 until its first compaction.)
///
/// A start *at* the compact revision `c` is accepted, as etcd accepts it (it refuses only
/// `minRev < compactRev`), and starts at `c + 1`: compaction keeps every key's value as of
/// `c` (a `Range` at `c` reads it) but not the record of what changed at `c`, so Baton
/// cannot send that revision's events whole. etcd sends what its backend still holds of
/// revision `c` (its puts, not its deletes: a tombstone at the compact revision is
/// dropped); Baton sends no part of a revision rather than a part (`docs/quota.md`). Only
/// a new watch is moved so: a watcher already running that still needs revision `c` when
/// compaction reaches it is told `Compacted`, as before, since it would miss events.
fn start_revision(asked: i64, compact_revision: Revision) -> Revision {
    if compact_revision > Revision(1) && asked < 0 {
        Revision(1)
    } else if compact_revision > Revision(1) && asked == compact_revision.0 {
        Revision(asked + 1)
    } else {
        Revision(asked)
    }
}

/// The Watch service.
pub struct WatchService {
    pub(crate) shared: Shared,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::watch_server::Watch for WatchService {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<tonic::Response<Self::WatchStream>, Status> {
        let wants_leader = request
            .metadata()
            .get("hasleader")
            .and_then(|v| v.to_str().ok())
            == Some("true");
        if wants_leader {
            self.shared.require_leader()?;
        }
        let identity = (
            request.metadata().clone(),
            request.extensions().get::<ClientConnectInfo>().cloned(),
        );
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let auth_seen = self.shared.node.read(|sm| sm.auth_revision());
        let session = Session {
            identity,
            auth_seen,
            shared: self.shared.clone(),
            tx,
            watchers: BTreeMap::new(),
            next_auto_id: 0,
            progress_pending: false,
            pump_needed: false,
        };
        let open = crate::monitor::WatchStream::open();
        tokio::spawn(async move {
            session.run(inbound).await;
            drop(open);
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

struct Watcher {
    hub_id: WatcherId,
    /// What it watches, for re-checking the caller's permission.
    range: KeyRange,
    fragment: bool,
    progress_notify: bool,
    /// Events were sent since the last periodic progress notification.
    sent_since_tick: bool,
}

struct Session {
    /// The stream's metadata (its token) and connection (a client certificate): the caller
    /// is resolved from them at each create and each auth check.
    identity: (tonic::metadata::MetadataMap, Option<ClientConnectInfo>),
    /// The auth revision the watchers' permissions were last checked at.
    auth_seen: u64,
    shared: Shared,
    tx: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    next_auto_id: i64,
    progress_pending: bool,
    /// Some watcher may have something to hand over: a revision was applied, or a watcher
    /// was created behind the current revision. Without it every request on the stream
    /// walked every watcher, and 10,000 creates sent back to back cost 50 million hub
    /// visits (seconds, while the creates behind them waited unread in h2).
    pump_needed: bool,
}

/// The client went away; the session ends.
struct Gone;

impl Session {
    async fn run(mut self, mut inbound: Streaming<pb::WatchRequest>) {
        let mut revisions = self.shared.node.subscribe_revision();
        let mut ticker = tokio::time::interval(self.shared.config.watch_progress_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        let mut auth_ticker = tokio::time::interval(AUTH_RECHECK);
        auth_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A client that closes its side of the stream still gets its watchers' events, as
        // from etcd (whose receive loop ends at EOF and leaves the stream open): a JSON
        // gateway client sends its creates in a request body that ends at once. The session
        // ends when the client goes away (the response stream is dropped).
        let mut inbound_open = true;
        let gone = self.tx.clone();
        loop {
            if self.pump_needed {
                if self.pump().await.is_err() {
                    break;
                }
                self.pump_needed = false;
            }
            if self.progress_pending && self.try_send_progress().await.is_err() {
                break;
            }
            tokio::select! {
                msg = inbound.next(), if inbound_open => match msg {
                    Some(Ok(req)) => {
                        if self.handle(req).await.is_err() {
                            break;
                        }
                    }
                    // etcd's recvLoop returns what receiving failed with and the stream
                    // ends with it (a message over the receive limit: RESOURCE_EXHAUSTED).
                    Some(Err(status)) => {
                        let _ = self.tx.send(Err(status)).await;
                        break;
                    }
                    None => inbound_open = false,
                },
                _ = gone.closed() => break,
                changed = revisions.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.pump_needed = true;
                }
                _ = ticker.tick() => {
                    if self.progress_tick().await.is_err() {
                        break;
                    }
                }
                _ = auth_ticker.tick(), if !self.watchers.is_empty() => {
                    if self.recheck_auth().await.is_err() {
                        break;
                    }
                }
            }
        }
        let ids: Vec<WatcherId> = self.watchers.values().map(|w| w.hub_id).collect();
        self.shared.node.with_watch_hub(|hub, _| {
            for id in ids {
                hub.remove(id);
            }
        });
        baton_raft::cached_gauge!("baton_watchers").decrement(self.watchers.len() as f64);
    }

    async fn send(&self, resp: pb::WatchResponse) -> Result<(), Gone> {
        self.tx.send(Ok(resp)).await.map_err(|_| Gone)
    }

    async fn handle(&mut self, req: pb::WatchRequest) -> Result<(), Gone> {
        use pb::watch_request::RequestUnion;
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => {
                // A watch from "now" starts after every write this member has answered
                // (`member_guard`: the stream's own call waited only at its start).
                if let Err(e) = self.shared.node.caught_up().await {
                    let status = crate::errors::propose_status(&e);
                    return self.refuse_create(go_status_text(&status)).await;
                }
                self.create(c).await
            }
            Some(RequestUnion::CancelRequest(c)) => {
                if let Some(w) = self.watchers.remove(&c.watch_id) {
                    self.shared
                        .node
                        .with_watch_hub(|hub, _| hub.remove(w.hub_id));
                    baton_raft::cached_gauge!("baton_watchers").decrement(1.0);
                    self.send(pb::WatchResponse {
                        header: Some(self.shared.header()),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                    .await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // Its revision covers every write this member has answered (a client that
                // wrote here and asks for progress may wait for one at its write's
                // revision); without the apply in time it still goes, at a lower one.
                let _ = self.shared.node.caught_up().await;
                self.progress_pending = true;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// etcd checks a watch's permission when it is created; Baton also cancels a running
    /// watcher once the caller may no longer read its range (a revoked role or
    /// permission, a deleted user), with etcd's "permission denied" as the reason.
    async fn recheck_auth(&mut self) -> Result<(), Gone> {
        let (enabled, revision) = self
            .shared
            .node
            .read(|sm| (sm.auth_enabled(), sm.auth_revision()));
        if revision == self.auth_seen {
            return Ok(());
        }
        self.auth_seen = revision;
        if !enabled {
            return Ok(());
        }
        let caller = self
            .shared
            .caller_from(&self.identity.0, self.identity.1.as_ref())
            .ok()
            .flatten()
            .map(|mut c| {
                // A JWT names the revision it was issued at; the question here is only
                // whether the user may read, now.
                c.revision = revision;
                c
            });
        let denied: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| {
                let r = &w.range;
                self.shared
                    .check_perm(&caller, baton_core::PermType::Read, &r.key, &r.range_end)
                    .is_err()
            })
            .map(|(id, _)| *id)
            .collect();
        for watch_id in denied {
            let Some(w) = self.watchers.remove(&watch_id) else {
                continue;
            };
            self.shared
                .node
                .with_watch_hub(|hub, _| hub.remove(w.hub_id));
            baton_raft::cached_gauge!("baton_watchers").decrement(1.0);
            let reason = go_status_text(&auth_status(baton_core::AuthError::PermissionDenied));
            self.send(pb::WatchResponse {
                header: Some(self.shared.header()),
                watch_id,
                canceled: true,
                cancel_reason: reason,
                ..Default::default()
            })
            .await?;
        }
        Ok(())
    }

    async fn refuse_create(&self, reason: String) -> Result<(), Gone> {
        self.send(pb::WatchResponse {
            header: Some(self.shared.header()),
            watch_id: -1,
            created: true,
            canceled: true,
            cancel_reason: reason,
            ..Default::default()
        })
        .await
    }

    /// etcd's checks and their order (`recvLoop`, `watchStream.Watch`): an empty range,
    /// then a duplicate id. Any other id is taken as given, negative ones included (-1 too,
    /// `InvalidWatchID`, as etcd does); 0 asks for the next free one. A negative start
    /// revision is not refused either (see [`start_revision`]).
    async fn create(&mut self, c: pb::WatchCreateRequest) -> Result<(), Gone> {
        use pb::watch_create_request::FilterType;
        // etcd treats an empty key as "\0" (the smallest key).
        let key = if c.key.is_empty() {
            vec![0]
        } else {
            c.key.clone()
        };
        // A range end of "\0" means every key from `key` on; any other must come after it.
        if !c.range_end.is_empty() && c.range_end != [0] && key >= c.range_end {
            return self.refuse_create(EMPTY_WATCHER_RANGE.into()).await;
        }
        // etcd's `isWatchPermitted`, before the duplicate-id check.
        let permitted = self
            .shared
            .caller_from(&self.identity.0, self.identity.1.as_ref())
            .and_then(|caller| {
                self.shared
                    .check_perm(&caller, baton_core::PermType::Read, &c.key, &c.range_end)
            });
        if let Err(status) = permitted {
            return self.refuse_create(go_status_text(&status)).await;
        }
        if c.watch_id != 0 && self.watchers.contains_key(&c.watch_id) {
            return self.refuse_create(DUPLICATE_WATCH_ID.into()).await;
        }
        if self.watchers.len() >= MAX_WATCHERS_PER_STREAM {
            return self
                .refuse_create(format!(
                    "baton: too many watchers on one stream (limit {MAX_WATCHERS_PER_STREAM})"
                ))
                .await;
        }
        let watch_id = if c.watch_id == 0 {
            while self.watchers.contains_key(&self.next_auto_id) {
                self.next_auto_id += 1;
            }
            let id = self.next_auto_id;
            self.next_auto_id += 1;
            id
        } else {
            c.watch_id
        };
        let mut spec = WatchSpec {
            range: KeyRange {
                key,
                range_end: c.range_end.clone(),
            },
            start_revision: Revision(c.start_revision),
            no_put: c.filters().any(|f| f == FilterType::Noput),
            no_delete: c.filters().any(|f| f == FilterType::Nodelete),
            prev_kv: c.prev_kv,
        };
        let (hub_id, revision, synced) = self.shared.node.with_watch_hub(|hub, sm| {
            spec.start_revision = start_revision(c.start_revision, sm.compact_revision());
            let id = hub.add(spec, sm.revision());
            (id, sm.revision(), hub.is_synced(id, sm))
        });
        // A watcher starting from history is caught up by the next pump.
        self.pump_needed |= !synced;
        self.watchers.insert(
            watch_id,
            Watcher {
                hub_id,
                range: KeyRange {
                    key: c.key.clone(),
                    range_end: c.range_end.clone(),
                },
                fragment: c.fragment,
                progress_notify: c.progress_notify,
                sent_since_tick: false,
            },
        );
        baton_raft::cached_gauge!("baton_watchers").increment(1.0);
        self.send(pb::WatchResponse {
            header: Some(self.shared.header_at(revision.0, self.shared.term())),
            watch_id,
            created: true,
            ..Default::default()
        })
        .await
    }

    /// Hands every watcher what is ready, round-robin, until nothing is.
    async fn pump(&mut self) -> Result<(), Gone> {
        loop {
            let mut progressed = false;
            let ids: Vec<i64> = self.watchers.keys().copied().collect();
            for watch_id in ids {
                let Some(w) = self.watchers.get(&watch_id) else {
                    continue;
                };
                let hub_id = w.hub_id;
                let (out, revision) = self.shared.node.with_watch_hub(|hub, sm| {
                    (hub.take(hub_id, sm, EVENTS_PER_TURN), sm.revision())
                });
                let Some(out) = out else { continue };
                progressed = true;
                let header = self.shared.header_at(revision.0, self.shared.term());
                match out {
                    WatchOutput::Events(events) => {
                        let fragment = w.fragment;
                        let events: Vec<mvccpb::Event> =
                            events.into_iter().map(event_to_pb).collect();
                        baton_raft::cached_counter!("baton_watch_events_sent_total")
                            .increment(events.len() as u64);
                        baton_raft::cached_counter!("etcd_debugging_mvcc_events_total")
                            .increment(events.len() as u64);
                        if let Some(w) = self.watchers.get_mut(&watch_id) {
                            w.sent_since_tick = true;
                        }
                        self.send_events(watch_id, header, events, fragment).await?;
                    }
                    // Still behind, a batch with nothing it wants: its next turn reads on,
                    // after the runtime's other tasks have had theirs (no send to wait on).
                    WatchOutput::Skipped => tokio::task::yield_now().await,
                    WatchOutput::Compacted { compact_revision } => {
                        self.watchers.remove(&watch_id);
                        baton_raft::cached_gauge!("baton_watchers").decrement(1.0);
                        // As etcd sends it (`sendLoop`): no cancel reason (clients tell a
                        // compaction by `compact_revision`), and a header at revision 0,
                        // the revision of the store's compaction notice.
                        self.send(pb::WatchResponse {
                            header: Some(self.shared.header_at(0, self.shared.term())),
                            watch_id,
                            canceled: true,
                            compact_revision: compact_revision.0,
                            ..Default::default()
                        })
                        .await?;
                    }
                }
            }
            if !progressed {
                return Ok(());
            }
        }
    }

    /// Sends events in one response, or in fragments under the request-size limit when the
    /// watcher asked for fragments and the response would be too large.
    async fn send_events(
        &self,
        watch_id: i64,
        header: pb::ResponseHeader,
        events: Vec<mvccpb::Event>,
        fragment: bool,
    ) -> Result<(), Gone> {
        let whole = pb::WatchResponse {
            header: Some(header),
            watch_id,
            events,
            ..Default::default()
        };
        if !fragment || whole.encoded_len() <= MAX_REQUEST_BYTES {
            return self.send(whole).await;
        }
        let mut chunks: Vec<Vec<mvccpb::Event>> = vec![Vec::new()];
        let mut size = 0usize;
        for ev in whole.events {
            let len = ev.encoded_len() + 8;
            if size + len > MAX_REQUEST_BYTES && !chunks.last().is_none_or(Vec::is_empty) {
                chunks.push(Vec::new());
                size = 0;
            }
            size += len;
            chunks.last_mut().expect("one chunk").push(ev);
        }
        let last = chunks.len() - 1;
        for (i, events) in chunks.into_iter().enumerate() {
            self.send(pb::WatchResponse {
                header: Some(header),
                watch_id,
                events,
                fragment: i != last,
                ..Default::default()
            })
            .await?;
        }
        Ok(())
    }

    /// Answers a progress request once every watcher is synced (checked in the same critical
    /// section that reads the revision, so the revision named is covered by what was sent).
    async fn try_send_progress(&mut self) -> Result<(), Gone> {
        let ids: Vec<WatcherId> = self.watchers.values().map(|w| w.hub_id).collect();
        let synced_at = self.shared.node.with_watch_hub(|hub, sm| {
            ids.iter()
                .all(|id| hub.is_synced(*id, sm))
                .then(|| sm.revision())
        });
        if let Some(revision) = synced_at {
            self.progress_pending = false;
            self.send(pb::WatchResponse {
                header: Some(self.shared.header_at(revision.0, self.shared.term())),
                watch_id: -1,
                ..Default::default()
            })
            .await?;
        }
        Ok(())
    }

    /// Periodic progress for watchers that asked for it and received nothing since the last
    /// tick.
    async fn progress_tick(&mut self) -> Result<(), Gone> {
        let due: Vec<(i64, WatcherId)> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify && !w.sent_since_tick)
            .map(|(id, w)| (*id, w.hub_id))
            .collect();
        for w in self.watchers.values_mut() {
            w.sent_since_tick = false;
        }
        for (watch_id, hub_id) in due {
            let synced_at = self
                .shared
                .node
                .with_watch_hub(|hub, sm| hub.is_synced(hub_id, sm).then(|| sm.revision()));
            if let Some(revision) = synced_at {
                self.send(pb::WatchResponse {
                    header: Some(self.shared.header_at(revision.0, self.shared.term())),
                    watch_id,
                    ..Default::default()
                })
                .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd refuses only a start below the compact revision; a start at it is accepted and
    /// moved past it (its events are not kept whole), a negative one reads from 1.
    #[test]
    fn a_watch_may_start_at_the_compact_revision() {
        let c = Revision(7);
        assert_eq!(start_revision(7, c), Revision(8));
        assert_eq!(
            start_revision(6, c),
            Revision(6),
            "compacted, told so by the hub"
        );
        assert_eq!(start_revision(8, c), Revision(8));
        assert_eq!(start_revision(0, c), Revision(0));
        assert_eq!(start_revision(-1, c), Revision(1));
        // Nothing compacted yet: every start as asked.
        assert_eq!(start_revision(1, Revision(1)), Revision(1));
        assert_eq!(start_revision(-1, Revision(1)), Revision(-1));
    }
}
