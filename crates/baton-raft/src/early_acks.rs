//! What followers answered the leader's early AppendEntries (`early_append`), so that
//! openraft's own AppendEntries for entries a follower already acknowledged is answered
//! from that acknowledgement instead of travelling again ([`EarlyAcks::covers`], used by
//! `network::PeerClient::append_entries`).
//!
//! Why: openraft 0.9 replicates an entry only after the leader's own flush and learns a
//! follower's progress only from the answers to its own requests. With early appends the
//! follower usually has the entries durably before openraft's request leaves, so that
//! request was a second, serial round trip on every write's critical path (issue 19's hop
//! budget: ~0.4 ms of a ~1.3 ms 3-member put) and one more message each way on every member's
//! CPU. Answering it from the early answer makes a write's critical path
//! max(leader fsync, round trip + follower fsync), which is what the early append was for.
//!
//! Safety: a follower's success answer to an AppendEntries of vote `v` whose last entry is
//! `l` says that its log matched the leader's up to `l` when it answered, durably (openraft
//! answers after the flush). Raft's commit rule counts exactly such facts, and a fact does not
//! expire: a later leader could overwrite that follower's entries only after being elected
//! with its vote, which it gives only to a log at least as up to date — the very argument that
//! makes a delayed answer to an ordinary request safe to count. So an early answer counts for
//! any later request of the same vote whose entries end at or before `l` (the leader of a
//! vote never rewrites its own log, so its entries up to `l` are those the follower holds).
//! Nothing is answered across votes: a new vote starts from nothing.
//!
//! One thing the answer carries that the acknowledgement does not: openraft stamps it with the
//! time it sent its own request (its leader clock, `millis_since_quorum_ack`, read by the
//! `has_leader` metric). So only an acknowledgement of a request sent within [`FRESH_FOR`]
//! stands in; an older one would make the follower look more recently heard from than it is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::types::{LogId, MemberMap, Vote};

/// How recently the acknowledged early request must have been sent to stand in for
/// openraft's (see the module docs). Well below the election timeout that clock is compared
/// with (1 s by default), and above the leader's fsync on a busy disk: an acknowledgement
/// older than this means the leader's own write took that long, and then one more round trip
/// is a small part of the write.
pub(crate) const FRESH_FOR: Duration = Duration::from_millis(100);

/// The early requests to one follower under the leader's current vote.
#[derive(Debug, Default)]
struct Progress {
    /// The vote the requests below were sent under; a request of another vote starts afresh.
    vote: Option<Vote>,
    /// The last entry of the furthest acknowledged request, and when that request was sent.
    acked: Option<(LogId, Instant)>,
    /// Requests awaiting their answer: ticket number and the index of their last entry.
    pending: Vec<(u64, u64)>,
    next_ticket: u64,
    /// The furthest committed id the follower was told under this vote: in an early request
    /// it accepted, or in a commit notice ([`EarlyAcks::commit_news`]).
    committed_sent: Option<LogId>,
}

/// Per follower, the early requests sent and answered (held by `network::Peers`).
#[derive(Default)]
pub(crate) struct EarlyAcks {
    targets: Mutex<MemberMap<Arc<watch::Sender<Progress>>>>,
    /// How many of openraft's requests an early answer stood in for (all followers).
    stood_in: AtomicU64,
}

/// What [`EarlyAcks::covers`] found at one look.
enum Look {
    Covered,
    Pending,
    Not,
}

impl EarlyAcks {
    fn target(&self, target: u64) -> Arc<watch::Sender<Progress>> {
        self.targets
            .lock()
            .entry(target)
            .or_insert_with(|| Arc::new(watch::channel(Progress::default()).0))
            .clone()
    }

    /// Records an early request to `target` of `vote` ending with entry `last`, about to be
    /// sent. The ticket reports its answer; dropped unanswered, it counts as refused.
    pub(crate) fn sent(
        &self,
        target: u64,
        vote: Vote,
        last: LogId,
        committed: Option<LogId>,
    ) -> Ticket {
        let tx = self.target(target);
        let mut id = 0;
        tx.send_modify(|p| {
            if p.vote.as_ref() != Some(&vote) {
                p.vote = Some(vote);
                p.acked = None;
                p.pending.clear();
                p.committed_sent = None;
            }
            id = p.next_ticket;
            p.next_ticket += 1;
            p.pending.push((id, last.index));
        });
        Ticket {
            tx,
            id,
            vote,
            last,
            committed,
            sent_at: Instant::now(),
            answered: false,
        }
    }

    /// Whether `committed`, which openraft's request of `vote` to `target` carried, is news
    /// to that follower; if so it is recorded as sent (the caller sends it).
    ///
    /// Why: a request answered from an early answer does not travel, and the committed id it
    /// carried must still reach the follower, or it would apply nothing until the next
    /// heartbeat. openraft sends a commit heartbeat of its own only while no entries wait to
    /// be replicated — under steady writes, the committed id rides on the next entries'
    /// request, which is then answered early too.
    pub(crate) fn commit_news(&self, target: u64, vote: &Vote, committed: Option<LogId>) -> bool {
        let Some(tx) = self.targets.lock().get(&target).cloned() else {
            return true;
        };
        let mut news = true;
        tx.send_if_modified(|p| {
            if p.vote.as_ref() == Some(vote) {
                news = committed > p.committed_sent;
                if news {
                    p.committed_sent = committed;
                }
            }
            false
        });
        news
    }

    /// Gives back the claim `commit_news` made for `committed`, if no later one replaced it:
    /// the notice carrying it was not taken, so the next one must go.
    pub(crate) fn commit_not_taken(&self, target: u64, vote: &Vote, committed: Option<LogId>) {
        let Some(tx) = self.targets.lock().get(&target).cloned() else {
            return;
        };
        tx.send_if_modified(|p| {
            if p.vote.as_ref() == Some(vote) && p.committed_sent == committed {
                p.committed_sent = None;
            }
            false
        });
    }

    /// Counts one of openraft's requests answered from an early answer.
    pub(crate) fn stood_in(&self) {
        self.stood_in.fetch_add(1, Ordering::Relaxed);
    }

    /// How many of openraft's requests were answered from early answers so far.
    pub(crate) fn stood_in_total(&self) -> u64 {
        self.stood_in.load(Ordering::Relaxed)
    }

    /// Whether `target` has acknowledged (in an answer to an early request of `vote` sent
    /// within [`FRESH_FOR`]) every entry up to `last`. If an early request that would cover
    /// it is still in flight, waits up to `wait` for its answer.
    pub(crate) async fn covers(
        &self,
        target: u64,
        vote: &Vote,
        last: LogId,
        wait: Duration,
    ) -> bool {
        let Some(tx) = self.targets.lock().get(&target).cloned() else {
            return false;
        };
        let mut rx = tx.subscribe();
        let deadline = Instant::now() + wait;
        loop {
            let look = {
                let p = rx.borrow_and_update();
                if p.vote.as_ref() != Some(vote) {
                    Look::Not
                } else if p.acked.as_ref().is_some_and(|(acked, sent_at)| {
                    acked.index >= last.index && sent_at.elapsed() < FRESH_FOR
                }) {
                    Look::Covered
                } else if p.pending.iter().any(|(_, index)| *index >= last.index) {
                    Look::Pending
                } else {
                    Look::Not
                }
            };
            match look {
                Look::Covered => return true,
                Look::Not => return false,
                Look::Pending => match tokio::time::timeout_at(deadline, rx.changed()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) | Err(_) => return false,
                },
            }
        }
    }
}

/// One early request in flight (see [`EarlyAcks::sent`]).
pub(crate) struct Ticket {
    tx: Arc<watch::Sender<Progress>>,
    id: u64,
    vote: Vote,
    last: LogId,
    /// The committed id the request carries (a follower that accepts it learns it).
    committed: Option<LogId>,
    sent_at: Instant,
    answered: bool,
}

impl Ticket {
    /// Reports the answer: `acknowledged` when the follower answered success (it durably
    /// holds every entry up to the request's last, its log matching the leader's).
    pub(crate) fn answered(mut self, acknowledged: bool) {
        self.answered = true;
        self.settle(acknowledged);
    }

    fn settle(&self, acknowledged: bool) {
        self.tx.send_modify(|p| {
            p.pending.retain(|(id, _)| *id != self.id);
            if !acknowledged || p.vote.as_ref() != Some(&self.vote) {
                return;
            }
            p.committed_sent = p.committed_sent.max(self.committed);
            let further = p
                .acked
                .as_ref()
                .is_none_or(|(acked, _)| acked.index <= self.last.index);
            if further {
                p.acked = Some((self.last, self.sent_at));
            }
        });
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.answered {
            self.settle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn vote(term: u64) -> Vote {
        Vote::new_committed(term, 1)
    }

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[tokio::test(start_paused = true)]
    async fn an_acknowledged_request_covers_its_entries_and_those_before() {
        let acks = EarlyAcks::default();
        acks.sent(2, vote(3), log_id(3, 10), None).answered(true);
        let wait = Duration::from_millis(10);
        assert!(acks.covers(2, &vote(3), log_id(3, 10), wait).await);
        assert!(acks.covers(2, &vote(3), log_id(2, 7), wait).await);
        assert!(
            !acks.covers(2, &vote(3), log_id(3, 11), wait).await,
            "beyond it"
        );
        assert!(
            !acks.covers(3, &vote(3), log_id(3, 10), wait).await,
            "another follower"
        );
        assert!(
            !acks.covers(2, &vote(4), log_id(3, 10), wait).await,
            "another vote"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_or_lost_request_covers_nothing() {
        let acks = EarlyAcks::default();
        acks.sent(2, vote(3), log_id(3, 10), None).answered(false);
        drop(acks.sent(2, vote(3), log_id(3, 11), None));
        let wait = Duration::from_millis(10);
        assert!(!acks.covers(2, &vote(3), log_id(3, 10), wait).await);
        assert!(!acks.covers(2, &vote(3), log_id(3, 11), wait).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_acknowledgement_does_not_stand_in() {
        let acks = EarlyAcks::default();
        acks.sent(2, vote(3), log_id(3, 10), None).answered(true);
        tokio::time::advance(FRESH_FOR).await;
        assert!(
            !acks
                .covers(2, &vote(3), log_id(3, 10), Duration::ZERO)
                .await
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_vote_forgets_the_old_ones_acknowledgements() {
        let acks = EarlyAcks::default();
        let old = acks.sent(2, vote(3), log_id(3, 10), None);
        acks.sent(2, vote(4), log_id(4, 11), None).answered(true);
        // The old vote's answer arrives last: it must not count for the new vote.
        old.answered(true);
        let wait = Duration::from_millis(10);
        assert!(!acks.covers(2, &vote(3), log_id(3, 10), wait).await);
        assert!(acks.covers(2, &vote(4), log_id(4, 11), wait).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_is_waited_for() {
        let acks = Arc::new(EarlyAcks::default());
        let ticket = acks.sent(2, vote(3), log_id(3, 10), None);
        let waiting = {
            let acks = acks.clone();
            tokio::spawn(async move {
                acks.covers(2, &vote(3), log_id(3, 10), Duration::from_millis(20))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        ticket.answered(true);
        assert!(waiting.await.unwrap());

        // Refused while waited for: not covered, at once.
        let ticket = acks.sent(2, vote(3), log_id(3, 12), None);
        let waiting = {
            let acks = acks.clone();
            tokio::spawn(async move {
                acks.covers(2, &vote(3), log_id(3, 12), Duration::from_secs(1))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let before = Instant::now();
        ticket.answered(false);
        assert!(!waiting.await.unwrap());
        assert!(before.elapsed() < Duration::from_millis(1));
    }

    #[test]
    fn a_committed_id_is_news_once() {
        let acks = EarlyAcks::default();
        // Unknown follower: news (nothing was sent to it early).
        assert!(acks.commit_news(2, &vote(3), Some(log_id(3, 8))));
        // Carried by an early request that was refused: still news (and now sent).
        drop(acks.sent(2, vote(3), log_id(3, 10), Some(log_id(3, 8))));
        assert!(acks.commit_news(2, &vote(3), Some(log_id(3, 8))));
        assert!(
            !acks.commit_news(2, &vote(3), Some(log_id(3, 8))),
            "sent as a notice"
        );
        // Carried by an early request the follower accepted: not news.
        acks.sent(2, vote(3), log_id(3, 11), Some(log_id(3, 9)))
            .answered(true);
        assert!(
            !acks.commit_news(2, &vote(3), Some(log_id(3, 9))),
            "accepted early"
        );
        assert!(!acks.commit_news(2, &vote(3), Some(log_id(3, 7))));
        assert!(acks.commit_news(2, &vote(3), Some(log_id(3, 10))));
        // Another vote than the early requests': always sent.
        assert!(acks.commit_news(2, &vote(4), Some(log_id(3, 10))));
    }

    #[test]
    fn a_notice_not_taken_gives_its_claim_back() {
        let acks = EarlyAcks::default();
        drop(acks.sent(2, vote(3), log_id(3, 10), None));
        assert!(acks.commit_news(2, &vote(3), Some(log_id(3, 9))));
        assert!(acks.commit_news(2, &vote(3), Some(log_id(3, 10))));
        // The earlier notice's refusal does not undo the later claim.
        acks.commit_not_taken(2, &vote(3), Some(log_id(3, 9)));
        assert!(
            !acks.commit_news(2, &vote(3), Some(log_id(3, 10))),
            "still claimed"
        );
        acks.commit_not_taken(2, &vote(3), Some(log_id(3, 10)));
        assert!(
            acks.commit_news(2, &vote(3), Some(log_id(3, 10))),
            "given back: the next notice goes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_is_bounded() {
        let acks = EarlyAcks::default();
        let _in_flight = acks.sent(2, vote(3), log_id(3, 10), None);
        let before = Instant::now();
        assert!(
            !acks
                .covers(2, &vote(3), log_id(3, 10), Duration::from_millis(20))
                .await
        );
        assert_eq!(before.elapsed(), Duration::from_millis(20));
    }
}
