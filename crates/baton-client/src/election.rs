//! Leader election over etcd's `v3electionpb.Election` service, which both Baton and etcd
//! 3.4 serve (on Baton it runs on the same lock queues as `baton.v1.Lock`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use baton_proto::mvccpb::KeyValue;
use baton_proto::v3electionpb as epb;
use baton_proto::v3electionpb::election_client::ElectionClient;
use futures::Stream;
use tokio::sync::mpsc;
use tonic::Code;

use crate::client::{request, write_request, Client, Deadline, Retry};
use crate::error::{Error, Result};
use crate::lost::LostReason;
use crate::monitor::Holding;
use crate::recipe::guarded;
use crate::session::Session;
use crate::token::FencingToken;
use crate::util::{backoff, show, AbortOnDrop};

/// The election `name`: candidates queue as keys `name/<lease hex>` holding their
/// proposals; the oldest is the leader.
///
/// ```
/// # baton_client::testing::doctest(|endpoint| async move {
/// use baton_client::{Client, ClientConfig, Election, Session, SessionOptions};
/// use futures::StreamExt;
///
/// let client = Client::connect(ClientConfig::new([endpoint])).await?;
/// let election = Election::new(&client, "scheduler");
/// let mut leaders = election.observe();
///
/// let a = Session::new(&client, SessionOptions::new()).await?;
/// let leader = election.campaign(&a, "node-a").await?;
/// assert_eq!(leaders.next().await.unwrap()?.value, b"node-a");
/// leader.proclaim("node-a (draining)").await?;
/// assert_eq!(leaders.next().await.unwrap()?.value, b"node-a (draining)");
///
/// let b = Session::new(&client, SessionOptions::new()).await?;
/// let next = tokio::spawn({ let e = election.clone(); async move { e.campaign(&b, "node-b").await } });
/// let first = leader.fencing_token();
/// leader.resign().await?;
/// let next = next.await.unwrap()?;
/// assert_eq!(election.leader().await?.unwrap().value, b"node-b");
/// assert!(next.fencing_token() > first);
/// # Ok(()) });
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: Vec<u8>,
}

impl Election {
    /// The election `name`.
    pub fn new(client: &Client, name: impl Into<Vec<u8>>) -> Election {
        Election {
            client: client.clone(),
            name: name.into(),
        }
    }

    /// Joins as a candidate proposing `value` and waits until elected (or the session is
    /// lost). Cancel by dropping the future: the server then withdraws the candidacy.
    pub async fn campaign(
        &self,
        session: &Session,
        value: impl Into<Vec<u8>>,
    ) -> Result<Leadership> {
        let req = epb::CampaignRequest {
            name: self.name.clone(),
            lease: session.lease(),
            value: value.into(),
        };
        let mut attempt = 0;
        loop {
            let id = self.client.next_request_id();
            let call = self.client.call(
                "Election/Campaign",
                Retry::Once,
                Deadline::Never,
                |ch, _| {
                    let r = write_request(req.clone(), None, id);
                    async move { ElectionClient::new(ch).campaign(r).await }
                },
            );
            match guarded(session, call).await {
                Ok(resp) => {
                    let leader = resp.leader.ok_or_else(|| Error::Server {
                        code: Code::Internal,
                        message: "campaign answered without a leader key".into(),
                    })?;
                    return Ok(Leadership {
                        holding: Holding::start(session, leader.key.clone(), leader.rev),
                        client: self.client.clone(),
                        session: session.clone(),
                        leader,
                        resigned: false,
                    });
                }
                // Campaigning again with the same lease finds the same key: safe to retry.
                Err(e) if e.is_transient() => {
                    attempt += 1;
                    let pause = backoff(attempt, Duration::from_millis(50), Duration::from_secs(2));
                    guarded(session, async {
                        tokio::time::sleep(pause).await;
                        Ok(())
                    })
                    .await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The current leader's key and proposal, `None` if there is no leader.
    pub async fn leader(&self) -> Result<Option<KeyValue>> {
        let req = epb::LeaderRequest {
            name: self.name.clone(),
        };
        let r = self
            .client
            .call(
                "Election/Leader",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = request(req.clone(), t);
                    async move { ElectionClient::new(ch).leader(r).await }
                },
            )
            .await;
        match r {
            Ok(resp) => Ok(resp.kv),
            Err(Error::Server { message, .. }) if message.contains("election: no leader") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// A stream of leaders: the current one first, then every change of leader or of its
    /// proclaimed value. Survives reconnects (it re-observes and skips what it already
    /// reported); ends only on a permanent error or when dropped.
    pub fn observe(&self) -> ObserveStream {
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(observe(self.client.clone(), self.name.clone(), tx));
        ObserveStream {
            rx,
            _task: AbortOnDrop(task),
        }
    }
}

async fn observe(client: Client, name: Vec<u8>, tx: mpsc::Sender<Result<KeyValue>>) {
    let mut last: Option<(Vec<u8>, i64)> = None;
    let mut failures = 0u32;
    loop {
        if failures > 0 {
            let pause = backoff(failures, Duration::from_millis(50), Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = tx.closed() => return,
            }
        }
        failures += 1;
        let conn = tokio::select! {
            c = client.conn() => match c { Ok(c) => c, Err(_) => continue },
            _ = tx.closed() => return,
        };
        let req = epb::LeaderRequest { name: name.clone() };
        let mut rpc = ElectionClient::new(conn.channel.clone());
        let opened = tokio::select! {
            r = rpc.observe(req) => r,
            _ = tx.closed() => return,
        };
        let mut stream = match opened {
            Ok(s) => s.into_inner(),
            Err(s) if crate::error::connection_failure(&s) => {
                client.invalidate(&conn);
                continue;
            }
            Err(s) => {
                let _ = tx.send(Err(Error::from_status(s))).await;
                return;
            }
        };
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = tx.closed() => return,
            };
            match msg {
                Ok(Some(resp)) => {
                    failures = 0;
                    let Some(kv) = resp.kv else { continue };
                    let id = (kv.key.clone(), kv.mod_revision);
                    if last.as_ref() == Some(&id) {
                        continue;
                    }
                    last = Some(id);
                    if tx.send(Ok(kv)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(s) => {
                    if crate::error::connection_failure(&s) {
                        client.invalidate(&conn);
                    }
                    break;
                }
            }
        }
    }
}

/// The leaders of an election, as [`Election::observe`] reports them.
pub struct ObserveStream {
    rx: mpsc::Receiver<Result<KeyValue>>,
    _task: AbortOnDrop,
}

impl std::fmt::Debug for ObserveStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObserveStream").finish_non_exhaustive()
    }
}

impl Stream for ObserveStream {
    type Item = Result<KeyValue>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Being the leader: the leader key, its revision (a fencing token, like a lock's), and a
/// loss signal. Dropping it without [`Leadership::resign`] resigns in the background (best
/// effort; the session's end does otherwise).
pub struct Leadership {
    client: Client,
    session: Session,
    leader: epb::LeaderKey,
    holding: Holding,
    resigned: bool,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("key", &show(&self.leader.key))
            .field("rev", &self.leader.rev)
            .finish()
    }
}

impl Leadership {
    /// The leader key (`name/<lease hex>`).
    pub fn key(&self) -> &[u8] {
        &self.leader.key
    }
    /// The leader key's create revision: larger for every later leader, usable as a
    /// fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken::new(self.leader.rev)
    }
    /// The session leadership is held with.
    pub fn session(&self) -> &Session {
        &self.session
    }
    /// Completes when leadership is lost (session lost, or the key deleted), with the
    /// reason. Does not borrow.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.holding.lost()
    }
    /// Why leadership was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.holding.reason()
    }

    /// Replaces the proposal, only while still the leader ([`Error::NotLeader`] otherwise).
    pub async fn proclaim(&self, value: impl Into<Vec<u8>>) -> Result<()> {
        let req = epb::ProclaimRequest {
            leader: Some(self.leader.clone()),
            value: value.into(),
        };
        let id = self.client.next_request_id();
        self.client
            .call(
                "Election/Proclaim",
                Retry::Idempotent,
                Deadline::Default,
                |ch, t| {
                    let r = write_request(req.clone(), t, id);
                    async move { ElectionClient::new(ch).proclaim(r).await }
                },
            )
            .await
            .map(|_| ())
    }

    /// Steps down: deletes the leader key if it is still this leadership's, so the next
    /// candidate is elected at once.
    pub async fn resign(mut self) -> Result<()> {
        self.resigned = true;
        resign(&self.client, self.leader.clone()).await
    }
}

async fn resign(client: &Client, leader: epb::LeaderKey) -> Result<()> {
    let req = epb::ResignRequest {
        leader: Some(leader),
    };
    let id = client.next_request_id();
    client
        .call(
            "Election/Resign",
            Retry::Idempotent,
            Deadline::Default,
            |ch, t| {
                let r = write_request(req.clone(), t, id);
                async move { ElectionClient::new(ch).resign(r).await }
            },
        )
        .await
        .map(|_| ())
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if self.resigned {
            return;
        }
        let client = self.client.clone();
        let leader = self.leader.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = resign(&client, leader).await;
            });
        }
    }
}
