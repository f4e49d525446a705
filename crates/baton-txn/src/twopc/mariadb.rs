//! MariaDB (10.5 and later) as a two-phase-commit participant through XA (feature `mariadb`).
//!
//! A branch is one XA transaction: [`MariaDbResource::begin`] takes a pooled connection and
//! issues `XA START` with the branch's xid, the application runs its SQL on
//! [`MariaDbBranch::conn`], and [`Branch::prepare`] writes the marker row, then `XA END` and
//! `XA PREPARE`. Phase 2 and recovery go through the [`Resource`] side, from any connection of
//! any process: `XA COMMIT`, `XA ROLLBACK` and `XA RECOVER`.
//!
//! # Why this is safe on MariaDB, and where it is not
//!
//! - **Prepared branches survive a disconnect and a crash only since 10.5** (MDEV-742):
//!   before, MariaDB rolled a prepared XA transaction back when its connection closed, which
//!   breaks the YES vote's promise. [`Resource::preflight`] refuses older servers.
//! - **A prepared branch belongs to its session until that session ends.** Until then
//!   `XA COMMIT` from any other connection answers `XAER_NOTA` (1397, "unknown XID") although
//!   `XA RECOVER` lists the branch. So a successful `prepare` closes its connection (the
//!   prepared transaction stays, detached), and phase 2 treats 1397 as "already gone" only
//!   when `XA RECOVER` does not list the branch either; while it is listed, the request is
//!   retried briefly (the session's disconnect is still being processed) and then reported
//!   as [`ParticipantError::Unavailable`].
//! - **One XA transaction per connection**, and none while a normal transaction is open
//!   (error 1400): a branch owns its connection from `XA START` until it is prepared or rolled
//!   back. Statements that commit implicitly (DDL) fail inside it.
//! - **Isolation: at least REPEATABLE READ** (MariaDB's default; SERIALIZABLE is what the XA
//!   documentation recommends). [`Resource::preflight`] warns about a lower global level.
//! - **The binary log.** Writing user XA to the binary log is not crash-safe on 10.x (the
//!   prepared part and the commit are logged separately, MDEV-742 says it "does not address
//!   crash-safe logging", MDEV-21469 is still open): after a crash a replica can disagree with
//!   the primary about a branch. [`Resource::preflight`] returns a warning when `log_bin` is
//!   ON. Galera does not support XA at all; preflight refuses a node with `wsrep_on`.
//! - **The marker row** (invariant I4): each branch inserts its GID into
//!   [`MARKER_TABLE`] inside the XA transaction before `XA PREPARE`. After phase 2 finds a
//!   branch gone (`XAER_NOTA`), [`Resource::marker_exists`] tells a commit (the row is there)
//!   from a rollback (it is not).
//!
//! xids are sent as hex literals (`X'..',X'..',1`), so no quoting or character set can change
//! them; `XA RECOVER` is read in its raw format (`formatID`, `gtrid_length`, `bqual_length`,
//! `data`) and only format 1 xids that parse as GIDs of this namespace and this resource's
//! branch id are listed: other software's XA transactions are never touched.

use std::fmt::Write as _;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Pool};

/// The driver, re-exported so the application's SQL on [`MariaDbBranch::conn`] uses the
/// same version.
pub use mysql_async;

use super::ids::{BranchId, Gid};
use super::participant::{BoxFuture, Branch, Finish, ParticipantError, PreparedBranch, Resource};

/// The marker table, in the connection's default database (created by
/// [`MariaDbResource::migrate`]).
pub const MARKER_TABLE: &str = "baton_txn_xa_marker";

/// The XA formatID of every xid made here (MariaDB's default, so an xid pasted from
/// `XA RECOVER FORMAT='SQL'` by hand is the same one).
const FORMAT_ID: i64 = 1;

/// How long phase 2 keeps retrying while a prepared branch is still attached to the session
/// that prepared it (that session's disconnect is being processed).
const ATTACHED_RETRY: Duration = Duration::from_secs(2);

/// MariaDB error codes this module tells apart.
mod code {
    /// `XAER_NOTA`: unknown XID (or one still attached to another session).
    pub const XAER_NOTA: u16 = 1397;
    /// `XA_RBROLLBACK`: the branch was rolled back (a read-only one at disconnect, say).
    pub const XA_RBROLLBACK: u16 = 1402;
    /// `XA_RBTIMEOUT`.
    pub const XA_RBTIMEOUT: u16 = 1613;
    /// `XA_RBDEADLOCK`: rolled back by a deadlock.
    pub const XA_RBDEADLOCK: u16 = 1614;
    /// `ER_SERVER_SHUTDOWN`.
    pub const SERVER_SHUTDOWN: u16 = 1053;
    /// `ER_CONNECTION_KILLED`.
    pub const CONNECTION_KILLED: u16 = 1927;
    /// `ER_NO_SUCH_TABLE`.
    pub const NO_SUCH_TABLE: u16 = 1146;

    /// The `XA_RB*` codes: the branch no longer exists, rolled back.
    pub fn rolled_back(code: u16) -> bool {
        matches!(code, XA_RBROLLBACK | XA_RBTIMEOUT | XA_RBDEADLOCK)
    }
}

fn server_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

/// Server errors are the server's answer (a NO vote in phase 1); everything else (I/O, the
/// driver, a server going down) may pass and is retried.
fn participant_error(what: &str, e: mysql_async::Error) -> ParticipantError {
    match &e {
        mysql_async::Error::Server(s)
            if s.code == code::SERVER_SHUTDOWN || s.code == code::CONNECTION_KILLED =>
        {
            ParticipantError::Unavailable(format!("{what}: {e}"))
        }
        mysql_async::Error::Server(s) if s.code == code::NO_SUCH_TABLE => {
            ParticipantError::Refused(format!(
                "{what}: {e} (create the marker table with MariaDbResource::migrate)"
            ))
        }
        mysql_async::Error::Server(_) => ParticipantError::Refused(format!("{what}: {e}")),
        _ => ParticipantError::Unavailable(format!("{what}: {e}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The xid of `gid` as SQL: `X'<gtrid>',X'<bqual>',1`.
fn xid(gid: &Gid) -> String {
    format!(
        "X'{}',X'{}',{FORMAT_ID}",
        hex(gid.xa_gtrid().as_bytes()),
        hex(gid.xa_bqual().as_bytes())
    )
}

/// The GIDs among the prepared XA transactions `XA RECOVER` lists (other xids are skipped).
async fn recover(conn: &mut Conn) -> Result<Vec<Gid>, mysql_async::Error> {
    let rows: Vec<(i64, i64, i64, Vec<u8>)> = conn.query("XA RECOVER").await?;
    Ok(rows
        .into_iter()
        .filter_map(|(format_id, gtrid_len, bqual_len, data)| {
            if format_id != FORMAT_ID {
                return None;
            }
            let gtrid_len = usize::try_from(gtrid_len).ok()?;
            let bqual_len = usize::try_from(bqual_len).ok()?;
            if data.len() != gtrid_len.checked_add(bqual_len)? {
                return None;
            }
            let (gtrid, bqual) = data.split_at(gtrid_len);
            Gid::from_xa(
                std::str::from_utf8(gtrid).ok()?,
                std::str::from_utf8(bqual).ok()?,
            )
        })
        .collect())
}

/// A MariaDB database taking part in 2PC under a stable [`BranchId`].
///
/// Cheap to clone (the pool is shared). The pool's connections need the privileges of
/// `XA RECOVER` and of committing other sessions' XA transactions (in practice ALL
/// PRIVILEGES) and a default database, where the marker table lives.
#[derive(Clone)]
pub struct MariaDbResource {
    id: BranchId,
    pool: Pool,
}

impl std::fmt::Debug for MariaDbResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MariaDbResource")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl MariaDbResource {
    /// A resource over `pool`, named `id` (the name must stay the same across restarts:
    /// recovery finds its branches by it).
    pub fn new(id: BranchId, pool: Pool) -> MariaDbResource {
        MariaDbResource { id, pool }
    }

    /// A resource over a new pool for `url` (`mysql://user:password@host:port/database`).
    pub fn from_url(id: BranchId, url: &str) -> Result<MariaDbResource, ParticipantError> {
        let opts = Opts::from_url(url)
            .map_err(|e| ParticipantError::Unsupported(format!("MariaDB URL: {e}")))?;
        Ok(MariaDbResource::new(id, Pool::new(opts)))
    }

    /// The connection pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the marker table if it does not exist (idempotent).
    pub async fn migrate(&self) -> Result<(), ParticipantError> {
        let mut conn = self.conn().await?;
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (
                 gid VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
                 created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
             ) ENGINE=InnoDB"
        ))
        .await
        .map_err(|e| participant_error("creating the marker table", e))
    }

    /// Opens the branch `gid` of this resource: a pooled connection with `XA START` issued.
    ///
    /// MariaDB needs the xid when the transaction starts, not at prepare time, so the GID is
    /// given here (the coordinator knows it once the global transaction has its id) and
    /// [`Branch::prepare`] must be called with the same GID.
    pub async fn begin(&self, gid: &Gid) -> Result<MariaDbBranch, ParticipantError> {
        self.check_own(gid)?;
        let mut conn = self.conn().await?;
        if let Err(e) = conn.query_drop(format!("XA START {}", xid(gid))).await {
            // 1440 XAER_DUPID: this GID is in use (prepared, or open on another connection).
            let _ = conn.disconnect().await;
            return Err(participant_error(&format!("XA START {gid}"), e));
        }
        Ok(MariaDbBranch {
            resource: self.id.clone(),
            gid: gid.clone(),
            conn: Some(conn),
            state: State::Active,
        })
    }

    async fn conn(&self) -> Result<Conn, ParticipantError> {
        self.pool
            .get_conn()
            .await
            .map_err(|e| participant_error("connecting to MariaDB", e))
    }

    /// A GID of another resource could name another database's branch on the same server.
    fn check_own(&self, gid: &Gid) -> Result<(), ParticipantError> {
        if gid.branch() == &self.id {
            Ok(())
        } else {
            Err(ParticipantError::Refused(format!(
                "{gid} is a branch of {}, not of this resource ({})",
                gid.branch(),
                self.id
            )))
        }
    }

    /// `XA COMMIT` or `XA ROLLBACK` of a prepared branch.
    async fn finish(&self, gid: &Gid, commit: bool) -> Result<Finish, ParticipantError> {
        self.check_own(gid)?;
        let verb = if commit { "XA COMMIT" } else { "XA ROLLBACK" };
        let what = format!("{verb} {gid}");
        let statement = format!("{verb} {}", xid(gid));
        let mut conn = self.conn().await?;
        let deadline = tokio::time::Instant::now() + ATTACHED_RETRY;
        let mut pause = Duration::from_millis(5);
        loop {
            let e = match conn.query_drop(statement.as_str()).await {
                Ok(()) => return Ok(Finish::Done),
                Err(e) => e,
            };
            match server_code(&e) {
                Some(code::XAER_NOTA) => {
                    // Unknown to this session: finished, never prepared, or still attached
                    // to the session that prepared it, which XA RECOVER tells apart.
                    let listed = recover(&mut conn)
                        .await
                        .map_err(|e| participant_error("XA RECOVER", e))?
                        .contains(gid);
                    if !listed {
                        return Ok(Finish::AlreadyGone);
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(ParticipantError::Unavailable(format!(
                            "{what}: the branch is prepared but still attached to a session"
                        )));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                // The branch was rolled back (a commit finds it gone; a rollback is done).
                Some(c) if code::rolled_back(c) => {
                    return Ok(if commit {
                        Finish::AlreadyGone
                    } else {
                        Finish::Done
                    });
                }
                _ => return Err(participant_error(&what, e)),
            }
        }
    }
}

impl Resource for MariaDbResource {
    fn id(&self) -> &BranchId {
        &self.id
    }

    /// `XA COMMIT`; `XAER_NOTA` (with the branch not in `XA RECOVER`) or an `XA_RB*` answer
    /// is [`Finish::AlreadyGone`].
    fn commit_prepared<'a>(
        &'a self,
        gid: &'a Gid,
    ) -> BoxFuture<'a, Result<Finish, ParticipantError>> {
        Box::pin(self.finish(gid, true))
    }

    /// `XA ROLLBACK`; `XAER_NOTA` (with the branch not in `XA RECOVER`) is
    /// [`Finish::AlreadyGone`].
    fn rollback_prepared<'a>(
        &'a self,
        gid: &'a Gid,
    ) -> BoxFuture<'a, Result<Finish, ParticipantError>> {
        Box::pin(self.finish(gid, false))
    }

    /// `XA RECOVER`, keeping this resource's GIDs of `namespace` (MariaDB does not say when
    /// a branch was prepared: `age` is `None`).
    fn list_prepared<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PreparedBranch>, ParticipantError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let gids = recover(&mut conn)
                .await
                .map_err(|e| participant_error("XA RECOVER", e))?;
            Ok(gids
                .into_iter()
                .filter(|gid| gid.namespace() == namespace && gid.branch() == &self.id)
                .map(|gid| PreparedBranch { gid, age: None })
                .collect())
        })
    }

    fn marker_exists<'a>(&'a self, gid: &'a Gid) -> BoxFuture<'a, Result<bool, ParticipantError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let found: Option<i64> = conn
                .exec_first(
                    format!("SELECT 1 FROM {MARKER_TABLE} WHERE gid = ?"),
                    (gid.to_string(),),
                )
                .await
                .map_err(|e| participant_error("reading the marker table", e))?;
            Ok(found.is_some())
        })
    }

    fn purge_markers(&self, older_than: Duration) -> BoxFuture<'_, Result<u64, ParticipantError>> {
        Box::pin(async move {
            // Branches still prepared keep their markers (in any namespace: the table is
            // shared, and a marker's GID says which branch it belongs to).
            let mut conn = self.conn().await?;
            let prepared: Vec<(i64, usize, usize, Vec<u8>)> = conn
                .query("XA RECOVER")
                .await
                .map_err(|e| participant_error("XA RECOVER", e))?;
            let keep: Vec<String> = prepared
                .into_iter()
                .filter_map(|(_, g, b, data)| {
                    let gtrid = std::str::from_utf8(data.get(..g)?).ok()?;
                    let bqual = std::str::from_utf8(data.get(g..g + b)?).ok()?;
                    Some(format!("{gtrid}:{bqual}"))
                })
                .collect();
            conn.exec_drop(
                format!(
                    "DELETE FROM {MARKER_TABLE}
                      WHERE created_at < NOW(6) - INTERVAL ? MICROSECOND
                        AND NOT JSON_CONTAINS(?, JSON_QUOTE(gid))"
                ),
                (
                    older_than.as_micros() as u64,
                    serde_json::to_string(&keep).expect("strings encode"),
                ),
            )
            .await
            .map_err(|e| participant_error("purging the marker table", e))?;
            Ok(conn.affected_rows())
        })
    }

    /// Refuses a server before 10.5 (prepared branches die with their connection), a
    /// Galera node (`wsrep_on`), a server that is not MariaDB, a missing marker table or a
    /// user that may not run `XA RECOVER`; warns about `log_bin` and an isolation level below
    /// REPEATABLE READ.
    fn preflight(&self) -> BoxFuture<'_, Result<Vec<String>, ParticipantError>> {
        Box::pin(async move {
            let mut conn = self.conn().await?;
            let variables: Vec<(String, String)> = conn
                .query(
                    "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
                     ('version', 'wsrep_on', 'log_bin', 'tx_isolation')",
                )
                .await
                .map_err(|e| participant_error("reading the server's variables", e))?;
            let get = |name: &str| {
                variables
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.as_str())
            };
            let version = get("version").unwrap_or_default();
            if !version.contains("MariaDB") {
                return Err(ParticipantError::Unsupported(format!(
                    "server version {version:?} is not MariaDB (this participant relies on \
                     MariaDB's XA semantics)"
                )));
            }
            let mut numbers = version
                .split(['.', '-'])
                .map(|part| part.parse::<u32>().unwrap_or(0));
            let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
            if (major, minor) < (10, 5) {
                return Err(ParticipantError::Unsupported(format!(
                    "MariaDB {version}: before 10.5 a prepared XA transaction is rolled back \
                     when its connection closes (MDEV-742), so a YES vote would not hold"
                )));
            }
            if get("wsrep_on").is_some_and(|v| v.eq_ignore_ascii_case("ON")) {
                return Err(ParticipantError::Unsupported(
                    "wsrep_on is ON: Galera cluster does not support XA transactions".into(),
                ));
            }
            let database: Option<Option<String>> = conn
                .query_first("SELECT DATABASE()")
                .await
                .map_err(|e| participant_error("SELECT DATABASE()", e))?;
            let Some(Some(database)) = database else {
                return Err(ParticipantError::Unsupported(
                    "no default database: name one in the URL (the marker table lives there)"
                        .into(),
                ));
            };
            let table: Option<i64> = conn
                .exec_first(
                    "SELECT 1 FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                    (MARKER_TABLE,),
                )
                .await
                .map_err(|e| participant_error("looking for the marker table", e))?;
            if table.is_none() {
                return Err(ParticipantError::Unsupported(format!(
                    "the marker table {database}.{MARKER_TABLE} is missing: call \
                     MariaDbResource::migrate first"
                )));
            }
            if let Err(e) = conn.query_drop("XA RECOVER").await {
                return Err(match e {
                    mysql_async::Error::Server(_) => ParticipantError::Unsupported(format!(
                        "XA RECOVER is refused ({e}): recovery needs it (grant the user the \
                         privileges for XA RECOVER and XA COMMIT of other sessions' branches)"
                    )),
                    e => participant_error("XA RECOVER", e),
                });
            }
            let mut warnings = Vec::new();
            if get("log_bin").is_some_and(|v| v.eq_ignore_ascii_case("ON")) {
                warnings.push(
                    "log_bin is ON: MariaDB 10.x writes user XA to the binary log in a way that \
                     is not crash-safe (MDEV-21469): after a crash replicas may disagree with \
                     this server about a prepared branch"
                        .to_string(),
                );
            }
            if let Some(level @ ("READ-UNCOMMITTED" | "READ-COMMITTED")) = get("tx_isolation") {
                warnings.push(format!(
                    "the global isolation level is {level}: XA transactions need at least \
                     REPEATABLE READ (SERIALIZABLE is recommended)"
                ));
            }
            Ok(warnings)
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `XA START` done; the connection is the branch's.
    Active,
    /// `XA PREPARE` done; the connection is closed and the branch waits for phase 2.
    Prepared,
    /// Rolled back (or its prepare failed and it was rolled back).
    Ended,
}

/// An open XA transaction on its own connection (see [`MariaDbResource::begin`]).
///
/// Dropped while still open (neither prepared nor rolled back), it closes its connection,
/// which makes MariaDB roll the XA transaction back.
pub struct MariaDbBranch {
    resource: BranchId,
    gid: Gid,
    conn: Option<Conn>,
    state: State,
}

impl std::fmt::Debug for MariaDbBranch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MariaDbBranch")
            .field("gid", &self.gid)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl MariaDbBranch {
    /// The branch's GID (given to [`MariaDbResource::begin`]).
    pub fn gid(&self) -> &Gid {
        &self.gid
    }

    /// The connection to run the application's SQL on, inside the XA transaction.
    ///
    /// # Panics
    ///
    /// After the branch was prepared or rolled back (its connection is gone then).
    pub fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("the branch is prepared or rolled back: its connection is gone")
    }

    /// The NO-vote path: rolls back whatever is left of the XA transaction, best effort, and
    /// closes the connection (MariaDB rolls back a transaction that is not prepared when its
    /// connection closes, so closing is the backstop).
    async fn abandon(&mut self) {
        self.state = State::Ended;
        if let Some(mut conn) = self.conn.take() {
            let xid = xid(&self.gid);
            let _ = conn.query_drop(format!("XA END {xid}")).await;
            let _ = conn.query_drop(format!("XA ROLLBACK {xid}")).await;
            let _ = conn.disconnect().await;
        }
    }
}

impl Branch for MariaDbBranch {
    fn resource(&self) -> &BranchId {
        &self.resource
    }

    /// Inserts the marker row, then `XA END` and `XA PREPARE`, and closes the connection (the
    /// prepared branch stays, detached, for [`Resource::commit_prepared`] or
    /// [`Resource::rollback_prepared`] from any connection).
    ///
    /// A server error is a NO vote ([`ParticipantError::Refused`]) after the XA transaction
    /// was rolled back. A lost connection ([`ParticipantError::Unavailable`]) rolls back a
    /// branch that was not prepared yet, but if it was lost during `XA PREPARE` the branch may
    /// be prepared: the coordinator rolls it back by GID after its Abort decision (the GID is
    /// in the log before the prepare).
    fn prepare<'a>(&'a mut self, gid: &'a Gid) -> BoxFuture<'a, Result<(), ParticipantError>> {
        Box::pin(async move {
            match self.state {
                State::Prepared if gid == &self.gid => return Ok(()),
                State::Prepared => {
                    return Err(ParticipantError::Refused(format!(
                        "prepare({gid}): the branch is prepared as {}",
                        self.gid
                    )))
                }
                State::Ended => {
                    return Err(ParticipantError::Refused(format!(
                        "prepare({gid}): the branch was rolled back"
                    )))
                }
                State::Active => {}
            }
            if gid != &self.gid {
                self.abandon().await;
                return Err(ParticipantError::Refused(format!(
                    "prepare({gid}) of the branch begun as {}",
                    self.gid
                )));
            }
            let xid = xid(gid);
            let conn = self
                .conn
                .as_mut()
                .expect("an active branch has its connection");
            let result = async {
                conn.exec_drop(
                    format!("INSERT INTO {MARKER_TABLE} (gid) VALUES (?)"),
                    (gid.to_string(),),
                )
                .await
                .map_err(|e| participant_error(&format!("marker row of {gid}"), e))?;
                conn.query_drop(format!("XA END {xid}"))
                    .await
                    .map_err(|e| participant_error(&format!("XA END {gid}"), e))?;
                conn.query_drop(format!("XA PREPARE {xid}"))
                    .await
                    .map_err(|e| participant_error(&format!("XA PREPARE {gid}"), e))
            }
            .await;
            match result {
                Ok(()) => {
                    self.state = State::Prepared;
                    if let Some(conn) = self.conn.take() {
                        // The prepared branch stays whether or not the goodbye arrives.
                        let _ = conn.disconnect().await;
                    }
                    Ok(())
                }
                Err(e) => {
                    self.abandon().await;
                    Err(e)
                }
            }
        })
    }

    /// `XA END` (unless the transaction is already idle) and `XA ROLLBACK`. Refused for a
    /// prepared branch: only [`Resource::rollback_prepared`], after an Abort decision, rolls
    /// that back.
    fn rollback(mut self: Box<Self>) -> BoxFuture<'static, Result<(), ParticipantError>> {
        Box::pin(async move {
            match self.state {
                State::Prepared => {
                    return Err(ParticipantError::Refused(format!(
                        "{} is prepared: roll it back with Resource::rollback_prepared",
                        self.gid
                    )))
                }
                State::Ended => return Ok(()),
                State::Active => {}
            }
            self.state = State::Ended;
            let mut conn = self
                .conn
                .take()
                .expect("an active branch has its connection");
            let xid = xid(&self.gid);
            // Fails (1399 XAER_RMFAIL) when the application ended it already, or with XA_RB*
            // when the server rolled it back (a deadlock): XA ROLLBACK settles either way.
            if let Err(e) = conn.query_drop(format!("XA END {xid}")).await {
                if server_code(&e).is_none() {
                    let _ = conn.disconnect().await;
                    return Err(participant_error(&format!("XA END {}", self.gid), e));
                }
            }
            match conn.query_drop(format!("XA ROLLBACK {xid}")).await {
                Ok(()) => Ok(()),
                Err(e)
                    if server_code(&e)
                        .is_some_and(|c| c == code::XAER_NOTA || code::rolled_back(c)) =>
                {
                    Ok(())
                }
                Err(e) => {
                    let _ = conn.disconnect().await;
                    Err(participant_error(&format!("XA ROLLBACK {}", self.gid), e))
                }
            }
        })
    }
}

impl Drop for MariaDbBranch {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Still open: closing the connection rolls the XA transaction back. (Returned to
            // the pool instead, it would be reset only if the pool resets connections.)
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = conn.disconnect().await;
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::twopc::TxId;

    #[test]
    fn xids_are_hex_literals_of_gtrid_and_bqual() {
        let gid = Gid::new("ns", TxId::generate(), BranchId::new("m-1").unwrap());
        let x = xid(&gid);
        assert!(x.starts_with(&format!("X'{}'", hex(gid.xa_gtrid().as_bytes()))));
        assert!(x.ends_with(",X'6d2d31',1"), "{x}");
        assert_eq!(hex(b"bt1:"), "6274313a");
    }
}
