//! Reading a [`Snapshot`] from the cluster, as a client like `baton status` and `baton saga
//! list`: `baton-client` for members, locks and leases, `baton-txn`'s readers for sagas and
//! 2PC. Every call carries the visitor's token (with auth on), so the server's permission
//! checks decide what each visitor sees, and every list is cut to the bounds in `config.rs`
//! before it is kept.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use baton_client::{Client, ClientConfig, Error, GetOptions, ListLocksOptions, ServerKind};
use baton_txn::coordination::LogError;
use baton_txn::saga::{SagaError, SagaLog};
use baton_txn::twopc::{BatonDecisionLog, DecisionLog};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::config::{
    DashboardConfig, CALL_TIMEOUT, GATHER_TIMEOUT, MAX_LEASES, MAX_LEASE_KEYS, MAX_LOCKS,
    MAX_MEMBERS, MAX_NAMESPACES, MAX_OPEN_TXNS, MAX_RECENT_TXNS, MAX_VALUE_BYTES, MAX_WAITERS,
    MEMBER_CONNECT_TIMEOUT,
};
use super::scrape;
use super::snapshot::{
    LeaseListing, LeaseReading, LockListing, LockReading, MemberReading, MemberStatus,
    NamespaceReading, QueueEntry, Reading, Snapshot, TwoPcReading, TxnListing,
};
use crate::cli::output::now_ms;

/// Calls in flight at once within one section (inspects, lease TTLs): enough to hide
/// round trips, few enough that one page is a small load.
const CONCURRENT_CALLS: usize = 4;

/// Sagas and 2PC transactions take many reads per namespace and change slowly: read them
/// every this often, and show the last reading in between.
const TXN_REFRESH: Duration = Duration::from_secs(5);
/// Watcher counts cost an HTTP connection to every member: as often as sagas.
const WATCHERS_REFRESH: Duration = TXN_REFRESH;
/// etcd's `LeaseLeases` has no limit: with 100k leases each answer is ~1 MB for the member
/// to build. The list is read this often; the TTLs of the leases shown, every refresh.
const LEASE_LIST_REFRESH: Duration = TXN_REFRESH;

/// The visitor's token was refused (expired, or the auth store changed): they must log in
/// again, and nothing read with it is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRefused;

/// One visitor's connections to the cluster, kept while their page is open.
pub struct Reader {
    config: DashboardConfig,
    token: Option<String>,
    user: Option<String>,
    main: Client,
    /// One client per member (keyed by id and URL), to ask each for its own status.
    members: Mutex<HashMap<(u64, String), Client>>,
    /// The last reading of sagas and 2PC, and when it was taken.
    txns: Mutex<Option<(Instant, Reading<TxnListing>)>>,
    /// The last watcher count read from each member, and when.
    watchers: Mutex<HashMap<u64, (Instant, Option<u64>)>>,
    /// From the last lease listing: when, how many leases, and the first ids shown.
    lease_ids: Mutex<Option<(Instant, usize, Vec<i64>)>>,
}

/// What a section's reading failed with: the server's words.
fn say(e: &Error) -> String {
    match e {
        Error::Server { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

fn client_config(
    config: &DashboardConfig,
    endpoints: Vec<String>,
    token: Option<&str>,
) -> ClientConfig {
    let mut c = ClientConfig::new(endpoints)
        .with_connect_timeout(MEMBER_CONNECT_TIMEOUT)
        .with_request_timeout(CALL_TIMEOUT)
        .with_server_kind(ServerKind::Baton);
    if let Some(tls) = &config.tls {
        c = c.with_tls(tls.clone());
    }
    if let Some(token) = token {
        c = c.with_token(token);
    }
    c
}

/// Runs a section with the overall deadline; a refused token ends the whole reading.
async fn section<T>(
    fut: impl Future<Output = Result<T, Error>>,
) -> Result<Reading<T>, TokenRefused> {
    match tokio::time::timeout(GATHER_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(Ok(v)),
        Ok(Err(e)) if e.is_token_refused() => Err(TokenRefused),
        Ok(Err(e)) => Ok(Err(say(&e))),
        Err(_) => Ok(Err(format!(
            "no answer within {}s",
            GATHER_TIMEOUT.as_secs()
        ))),
    }
}

impl Reader {
    /// Connects to this member's client URLs as the visitor (`token`: theirs, with auth on).
    pub async fn connect(
        config: &DashboardConfig,
        token: Option<String>,
        user: Option<String>,
    ) -> Result<Reader, Error> {
        let main = Client::connect(client_config(
            config,
            config.endpoints.clone(),
            token.as_deref(),
        ))
        .await?;
        Ok(Reader {
            config: config.clone(),
            token,
            user,
            main,
            members: Mutex::new(HashMap::new()),
            txns: Mutex::new(None),
            watchers: Mutex::new(HashMap::new()),
            lease_ids: Mutex::new(None),
        })
    }

    /// Reads everything the page shows.
    pub async fn snapshot(&self) -> Result<Snapshot, TokenRefused> {
        let (members, locks, leases, txns) = tokio::join!(
            section(self.members()),
            section(self.locks()),
            section(self.leases()),
            self.txns(),
        );
        Ok(Snapshot {
            taken_ms: now_ms(),
            user: self.user.clone(),
            members: members?,
            locks: locks?,
            leases: leases?,
            txns: txns?,
        })
    }

    async fn members(&self) -> Result<Vec<MemberReading>, Error> {
        let list = self.main.member_list().await?;
        let readings = list.members.iter().take(MAX_MEMBERS).map(|m| async move {
            let url = m.client_ur_ls.first().cloned();
            let (status, watchers) = tokio::join!(
                self.member_status(m.id, url.as_deref()),
                self.watchers(m.id, &m.client_ur_ls)
            );
            Ok::<_, Error>(MemberReading {
                id: m.id,
                name: m.name.clone(),
                is_learner: m.is_learner,
                client_urls: m.client_ur_ls.clone(),
                status: status?,
                watchers,
            })
        });
        futures::future::try_join_all(readings).await
    }

    /// A member's watcher count, read again once the last reading is [`WATCHERS_REFRESH`]
    /// old, from the `/metrics` its client URLs serve.
    async fn watchers(&self, id: u64, client_urls: &[String]) -> Option<u64> {
        if let Some((at, n)) = self.watchers.lock().await.get(&id) {
            if at.elapsed() < WATCHERS_REFRESH {
                return *n;
            }
        }
        let n = scrape::watchers(client_urls, self.config.tls.as_ref()).await;
        self.watchers.lock().await.insert(id, (Instant::now(), n));
        n
    }

    /// One member's own `Status`, over its client URL. Only a refused token is an error of
    /// the whole section; anything else is this member's row.
    async fn member_status(
        &self,
        id: u64,
        url: Option<&str>,
    ) -> Result<Reading<MemberStatus>, Error> {
        let Some(url) = url else {
            return Ok(Err("no client URL published yet".into()));
        };
        let key = (id, url.to_string());
        let cached = self.members.lock().await.get(&key).cloned();
        let client = match cached {
            Some(c) => c,
            None => match Client::connect(client_config(
                &self.config,
                vec![url.to_string()],
                self.token.as_deref(),
            ))
            .await
            {
                Ok(c) => {
                    self.members.lock().await.insert(key.clone(), c.clone());
                    c
                }
                Err(e) => return Ok(Err(say(&e))),
            },
        };
        match client.status().await {
            Ok(s) => Ok(Ok(MemberStatus {
                leader: s.leader,
                raft_term: s.raft_term,
                raft_index: s.raft_index,
                raft_applied_index: s.raft_applied_index,
                revision: s.header.map_or(0, |h| h.revision),
                db_size: s.db_size,
                errors: s.errors,
            })),
            Err(e) if e.is_token_refused() => Err(e),
            Err(e) => {
                // Connect afresh next time (the member may have restarted elsewhere).
                self.members.lock().await.remove(&key);
                Ok(Err(say(&e)))
            }
        }
    }

    async fn locks(&self) -> Result<LockListing, Error> {
        let list = self
            .main
            .list_locks(ListLocksOptions::new().with_limit(MAX_LOCKS))
            .await?;
        let names: Vec<Vec<u8>> = list
            .locks
            .iter()
            .take(MAX_LOCKS)
            .map(|l| l.name.clone())
            .collect();
        let locks = futures::stream::iter(names)
            .map(|name| self.lock(name))
            .buffered(CONCURRENT_CALLS)
            .try_collect()
            .await?;
        Ok(LockListing {
            total: list.total,
            locks,
        })
    }

    /// One lock's queue (Inspect), and its holder key's value (what tells an election).
    async fn lock(&self, name: Vec<u8>) -> Result<LockReading, Error> {
        let r = self.main.inspect_lock(name.clone()).await?;
        let entry = |e: &baton_client::LockEntry| QueueEntry {
            key: e.key.clone(),
            token: e.create_revision,
            lease: e.lease,
            ttl_s: e.lease_remaining_s,
        };
        let holder = r.holder.as_ref().map(entry);
        let holder_value = match &holder {
            Some(h) => {
                let got = self.main.get(h.key.clone(), GetOptions::new()).await?;
                got.kvs
                    .first()
                    .map(|kv| kv.value.iter().take(MAX_VALUE_BYTES).copied().collect())
                    .unwrap_or_default()
            }
            None => Vec::new(),
        };
        Ok(LockReading {
            name,
            holder,
            holder_value,
            waiters: r.waiters.iter().take(MAX_WAITERS).map(entry).collect(),
            waiter_count: r.waiter_count,
            lock_delay_ms: r.lock_delay_ms,
            delayed_until_ms: r.delayed_until_ms,
        })
    }

    async fn leases(&self) -> Result<LeaseListing, Error> {
        let (total, ids) = self.lease_ids().await?;
        let leases = futures::stream::iter(ids)
            .map(|id| async move {
                let r = self.main.lease_time_to_live_with_keys(id).await?;
                Ok::<_, Error>(LeaseReading {
                    id,
                    ttl_s: r.ttl,
                    granted_ttl_s: r.granted_ttl,
                    key_count: r.keys.len(),
                    keys: r.keys.into_iter().take(MAX_LEASE_KEYS).collect(),
                })
            })
            .buffered(CONCURRENT_CALLS)
            .try_collect()
            .await?;
        Ok(LeaseListing { total, leases })
    }

    /// How many leases there are and the first [`MAX_LEASES`] ids (smallest first), listed
    /// again once the last listing is [`LEASE_LIST_REFRESH`] old.
    async fn lease_ids(&self) -> Result<(usize, Vec<i64>), Error> {
        let mut last = self.lease_ids.lock().await;
        if let Some((at, total, ids)) = last.as_ref() {
            if at.elapsed() < LEASE_LIST_REFRESH {
                return Ok((*total, ids.clone()));
            }
        }
        let mut ids = self.main.lease_list().await?;
        ids.sort_unstable();
        let total = ids.len();
        ids.truncate(MAX_LEASES);
        *last = Some((Instant::now(), total, ids.clone()));
        Ok((total, ids))
    }

    /// The last reading of sagas and 2PC if it is recent, else a new one.
    async fn txns(&self) -> Result<Reading<TxnListing>, TokenRefused> {
        let mut last = self.txns.lock().await;
        if let Some((at, reading)) = last.as_ref() {
            if at.elapsed() < TXN_REFRESH {
                return Ok(reading.clone());
            }
        }
        let reading = match tokio::time::timeout(GATHER_TIMEOUT, self.read_txns()).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) if refused(&e) => return Err(TokenRefused),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {}s", GATHER_TIMEOUT.as_secs())),
        };
        *last = Some((Instant::now(), reading.clone()));
        Ok(reading)
    }

    async fn read_txns(&self) -> Result<TxnListing, LogError> {
        let found = baton_txn::coordination::namespaces(&self.main, MAX_NAMESPACES).await?;
        let mut namespaces = Vec::with_capacity(found.names.len());
        for name in found.names {
            let sagas = match SagaLog::new(&self.main, &name) {
                Ok(log) => log.overview(MAX_OPEN_TXNS, MAX_RECENT_TXNS).await,
                Err(e) => Err(e),
            };
            let sagas = match sagas {
                Err(SagaError::Log(e)) if refused(&e) => return Err(e),
                r => r.map_err(|e| e.to_string()),
            };
            let twopc = match self.twopc(&name).await {
                Err(e) if refused(&e) => return Err(e),
                r => r.map_err(|e| e.to_string()),
            };
            namespaces.push(NamespaceReading { name, sagas, twopc });
        }
        Ok(TxnListing {
            namespaces,
            more_namespaces: found.more,
        })
    }

    async fn twopc(&self, namespace: &str) -> Result<TwoPcReading, LogError> {
        let log = BatonDecisionLog::new(&self.main, namespace)?;
        let (open, open_total) = log.open_page(MAX_OPEN_TXNS).await?;
        let recent = log.list(MAX_RECENT_TXNS).await?;
        Ok(TwoPcReading {
            open,
            open_total,
            recent,
        })
    }
}

/// Whether a log's error is the server refusing the visitor's token.
fn refused(e: &LogError) -> bool {
    matches!(e, LogError::Baton(b) if b.is_token_refused())
}
