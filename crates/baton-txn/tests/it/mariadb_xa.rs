//! The MariaDB XA participant against a real MariaDB 10.11 (`scripts/services` starts one;
//! `BATON_TEST_MARIADB_URL` points at another). A missing server fails these tests.
//!
//! Each test has branch ids (and a data table) of its own, so the tests run in parallel and a
//! test starts by rolling back what an earlier, failed run of it left prepared.

use std::time::{Duration, Instant};

use baton_txn::twopc::mariadb::mysql_async::prelude::Queryable;
use baton_txn::twopc::mariadb::mysql_async::{self, Conn, Pool};
use baton_txn::twopc::mariadb::{MariaDbBranch, MariaDbResource, MARKER_TABLE};
use baton_txn::twopc::{
    Branch, BranchId, Finish, Gid, ParticipantError, PreparedBranch, Resource, TxId,
};

/// The server `scripts/services` starts.
const DEFAULT_URL: &str = "mysql://baton:baton@127.0.0.1:53306/baton";

fn url() -> String {
    std::env::var("BATON_TEST_MARIADB_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

fn pool() -> Pool {
    Pool::from_url(url()).expect("BATON_TEST_MARIADB_URL is a mysql:// URL")
}

/// A plain connection (not in any XA transaction). A missing server is a failure.
async fn connect(pool: &Pool) -> Conn {
    match pool.get_conn().await {
        Ok(conn) => conn,
        Err(e) => panic!(
            "MariaDB is not reachable at {}: {e}\n\
             These tests need a real server: run `scripts/services` (scripts/test does this \
             first) or point BATON_TEST_MARIADB_URL at a MariaDB 10.5+ with XA.",
            url()
        ),
    }
}

fn branch_id(name: &str) -> BranchId {
    BranchId::new(name).unwrap()
}

fn gid(ns: &str, branch: &str) -> Gid {
    Gid::new(ns, TxId::generate(), branch_id(branch))
}

/// The prepared XA transactions of the server, raw: (formatID, gtrid, bqual).
async fn xa_recover(conn: &mut Conn) -> Vec<(i64, Vec<u8>, Vec<u8>)> {
    let rows: Vec<(i64, usize, usize, Vec<u8>)> = conn.query("XA RECOVER").await.unwrap();
    rows.into_iter()
        .map(|(f, g, _, data)| (f, data[..g].to_vec(), data[g..].to_vec()))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// A resource named `branch` with the marker table in place (migrate runs twice: the second
/// finds it), and a fresh data table `table`, after rolling back whatever an earlier run left
/// prepared with a bqual in `cleanup` or a gtrid starting with one of them.
async fn setup(branch: &str, cleanup: &[&str], table: &str) -> MariaDbResource {
    let pool = pool();
    let mut conn = connect(&pool).await;
    for (format_id, gtrid, bqual) in xa_recover(&mut conn).await {
        if cleanup
            .iter()
            .any(|c| c.as_bytes() == bqual || gtrid.starts_with(c.as_bytes()))
        {
            let xid = format!("X'{}',X'{}',{format_id}", hex(&gtrid), hex(&bqual));
            match conn.query_drop(format!("XA ROLLBACK {xid}")).await {
                // 1402: a read-only branch, rolled back when its session ended.
                Err(mysql_async::Error::Server(e)) if e.code == 1402 || e.code == 1397 => {}
                other => other.unwrap(),
            }
        }
    }
    conn.query_drop(format!(
        "DROP TABLE IF EXISTS {table}; \
         CREATE TABLE {table} (id INT PRIMARY KEY, body VARCHAR(64) NOT NULL) ENGINE=InnoDB"
    ))
    .await
    .unwrap();
    let resource = MariaDbResource::new(branch_id(branch), pool);
    resource.migrate().await.unwrap();
    resource.migrate().await.unwrap();
    resource
}

async fn rows(pool: &Pool, table: &str) -> Vec<i32> {
    let mut conn = connect(pool).await;
    conn.query(format!("SELECT id FROM {table} ORDER BY id"))
        .await
        .unwrap()
}

/// Inserts `id` from a connection of its own, waiting at most 3 s for a row lock: proves that
/// no open or prepared branch holds the row.
async fn insert_unlocked(pool: &Pool, table: &str, id: i32) {
    let mut conn = connect(pool).await;
    conn.query_drop("SET SESSION innodb_lock_wait_timeout = 3")
        .await
        .unwrap();
    conn.query_drop(format!("INSERT INTO {table} VALUES ({id}, 'outside')"))
        .await
        .unwrap();
}

async fn work(branch: &mut MariaDbBranch, table: &str, id: i32) {
    branch
        .conn()
        .query_drop(format!("INSERT INTO {table} VALUES ({id}, 'branch')"))
        .await
        .unwrap();
}

async fn listed(resource: &MariaDbResource, ns: &str) -> Vec<Gid> {
    resource
        .list_prepared(ns)
        .await
        .unwrap()
        .into_iter()
        .map(|PreparedBranch { gid, age }| {
            assert_eq!(age, None, "XA RECOVER has no age");
            gid
        })
        .collect()
}

#[tokio::test]
async fn prepare_then_commit() {
    let table = "xa_commit_t";
    let r = setup("mx-commit", &["mx-commit"], table).await;
    let g = gid("mxc", "mx-commit");
    let mut b = r.begin(&g).await.unwrap();
    assert_eq!(Branch::resource(&b), r.id());
    work(&mut b, table, 1).await;
    b.prepare(&g).await.unwrap();
    // A second prepare of the same GID is the same YES vote.
    b.prepare(&g).await.unwrap();
    assert_eq!(rows(r.pool(), table).await, Vec::<i32>::new());
    assert_eq!(listed(&r, "mxc").await, vec![g.clone()]);

    assert_eq!(r.commit_prepared(&g).await.unwrap(), Finish::Done);
    assert_eq!(rows(r.pool(), table).await, vec![1]);
    assert!(r.marker_exists(&g).await.unwrap());
    assert_eq!(r.commit_prepared(&g).await.unwrap(), Finish::AlreadyGone);
    assert_eq!(r.rollback_prepared(&g).await.unwrap(), Finish::AlreadyGone);
    assert!(r.marker_exists(&g).await.unwrap());
    assert_eq!(listed(&r, "mxc").await, Vec::<Gid>::new());
    // A branch that is finished keeps nothing locked.
    insert_unlocked(r.pool(), table, 2).await;
}

#[tokio::test]
async fn prepare_then_rollback() {
    let table = "xa_rollback_t";
    let r = setup("mx-rollback", &["mx-rollback"], table).await;
    let g = gid("mxr", "mx-rollback");
    let mut b = r.begin(&g).await.unwrap();
    work(&mut b, table, 1).await;
    b.prepare(&g).await.unwrap();
    // Only rollback_prepared finishes a prepared branch.
    assert!(matches!(
        Box::new(b).rollback().await,
        Err(ParticipantError::Refused(_))
    ));
    assert_eq!(listed(&r, "mxr").await, vec![g.clone()]);

    assert_eq!(r.rollback_prepared(&g).await.unwrap(), Finish::Done);
    assert_eq!(rows(r.pool(), table).await, Vec::<i32>::new());
    assert_eq!(r.rollback_prepared(&g).await.unwrap(), Finish::AlreadyGone);
    assert_eq!(r.commit_prepared(&g).await.unwrap(), Finish::AlreadyGone);
    assert!(!r.marker_exists(&g).await.unwrap());
    assert_eq!(listed(&r, "mxr").await, Vec::<Gid>::new());
    insert_unlocked(r.pool(), table, 1).await;
}

#[tokio::test]
async fn a_prepared_branch_outlives_its_connection_and_pool() {
    let table = "xa_survive_t";
    let r = setup("mx-survive", &["mx-survive"], table).await;
    // The branch on a pool of its own, which is then shut down entirely.
    let other_pool = pool();
    let r1 = MariaDbResource::new(branch_id("mx-survive"), other_pool.clone());
    let g = gid("mxs", "mx-survive");
    let mut b = r1.begin(&g).await.unwrap();
    let session: u32 = b.conn().id();
    work(&mut b, table, 7).await;
    b.prepare(&g).await.unwrap();
    drop(b);
    drop(r1);
    other_pool.disconnect().await.unwrap();

    // The session is gone; the branch is not.
    let mut conn = connect(r.pool()).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive: Option<i64> = conn
            .exec_first(
                "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = ?",
                (session,),
            )
            .await
            .unwrap();
        if alive.is_none() {
            break;
        }
        assert!(Instant::now() < deadline, "session {session} did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(listed(&r, "mxs").await, vec![g.clone()]);
    assert_eq!(r.commit_prepared(&g).await.unwrap(), Finish::Done);
    assert_eq!(rows(r.pool(), table).await, vec![7]);
    assert!(r.marker_exists(&g).await.unwrap());
}

/// While the session that prepared a branch is still connected, other sessions get
/// XAER_NOTA for it although XA RECOVER lists it: that must not read as "already gone".
#[tokio::test]
async fn commit_waits_for_a_branch_still_attached_to_its_session() {
    let table = "xa_attached_t";
    let r = setup("mx-attached", &["mx-attached"], table).await;
    let g = gid("mxt", "mx-attached");
    let xid = format!(
        "X'{}',X'{}',1",
        hex(g.xa_gtrid().as_bytes()),
        hex(g.xa_bqual().as_bytes())
    );
    // Prepared by hand on a connection that stays open for a while.
    let mut holder = connect(r.pool()).await;
    holder
        .query_drop(format!(
            "XA START {xid}; INSERT INTO {table} VALUES (3, 'by hand'); \
             INSERT INTO {MARKER_TABLE} (gid) VALUES ('{g}'); XA END {xid}; XA PREPARE {xid}"
        ))
        .await
        .unwrap();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        holder.disconnect().await.unwrap();
    });
    let started = Instant::now();
    assert_eq!(r.commit_prepared(&g).await.unwrap(), Finish::Done);
    assert!(started.elapsed() >= Duration::from_millis(250));
    release.await.unwrap();
    assert_eq!(rows(r.pool(), table).await, vec![3]);
}

#[tokio::test]
async fn list_prepared_shows_only_this_namespace_and_resource() {
    let table = "xa_list_t";
    let r = setup("mx-list", &["mx-list", "mx-list-other", "foreign-"], table).await;
    let other = MariaDbResource::new(branch_id("mx-list-other"), r.pool().clone());
    let mine = gid("mxl", "mx-list");
    let other_ns = gid("mxl2", "mx-list");
    let other_resource = gid("mxl", "mx-list-other");
    for (i, (res, g)) in [(&r, &mine), (&r, &other_ns), (&other, &other_resource)]
        .into_iter()
        .enumerate()
    {
        let mut b = res.begin(g).await.unwrap();
        work(&mut b, table, i as i32).await;
        b.prepare(g).await.unwrap();
    }
    // Other software's XA transactions: a plain xid, one that looks like ours but has another
    // formatID (so XA COMMIT of our xid would not find it), and a bqual that is not UTF-8.
    // (MariaDB tells xids apart by gtrid and bqual only: the same pair with another formatID
    // is XAER_DUPID.)
    let mut foreign = connect(r.pool()).await;
    let look_alike = gid("mxl", "mx-list");
    let foreign_xids = [
        format!("'foreign-{}', 'foreign', 1", TxId::generate()),
        format!(
            "X'{}', X'{}', 7",
            hex(look_alike.xa_gtrid().as_bytes()),
            hex(b"mx-list")
        ),
        format!(
            "X'{}', X'ff00', 1",
            hex(format!("foreign-{}", TxId::generate()).as_bytes())
        ),
    ];
    for xid in &foreign_xids {
        foreign
            .query_drop(format!("XA START {xid}; XA END {xid}; XA PREPARE {xid}"))
            .await
            .unwrap();
        // A fresh session for the next one (this one holds the prepared branch).
        foreign.disconnect().await.unwrap();
        foreign = connect(r.pool()).await;
    }

    assert_eq!(listed(&r, "mxl").await, vec![mine.clone()]);
    assert_eq!(listed(&r, "mxl2").await, vec![other_ns.clone()]);
    assert_eq!(listed(&other, "mxl").await, vec![other_resource.clone()]);
    assert_eq!(listed(&r, "nothing-here").await, Vec::<Gid>::new());
    // A resource never finishes another resource's branch.
    assert!(matches!(
        r.commit_prepared(&other_resource).await,
        Err(ParticipantError::Refused(_))
    ));

    for (res, g) in [(&r, &mine), (&r, &other_ns), (&other, &other_resource)] {
        assert_eq!(res.rollback_prepared(g).await.unwrap(), Finish::Done);
    }
    for xid in &foreign_xids {
        // A read-only branch: MariaDB answers XA_RBROLLBACK (1402) to finishing it once its
        // session is gone, and it is gone then all the same.
        match foreign.query_drop(format!("XA ROLLBACK {xid}")).await {
            Ok(()) => {}
            Err(mysql_async::Error::Server(e)) if e.code == 1402 => {}
            Err(e) => panic!("XA ROLLBACK {xid}: {e}"),
        }
    }
    let left: Vec<_> = xa_recover(&mut foreign)
        .await
        .into_iter()
        .filter(|(_, gtrid, bqual)| {
            gtrid.starts_with(b"foreign") || bqual == b"mx-list" || bqual == b"mx-list-other"
        })
        .collect();
    assert_eq!(left, Vec::new(), "everything rolled back");
}

#[tokio::test]
async fn a_failed_prepare_is_a_no_vote_that_leaves_nothing_prepared() {
    let table = "xa_novote_t";
    let r = setup("mx-novote", &["mx-novote"], table).await;

    // The marker row cannot be written (the GID was used before): the prepare fails.
    let g = gid("mxn", "mx-novote");
    connect(r.pool())
        .await
        .exec_drop(
            format!("INSERT INTO {MARKER_TABLE} (gid) VALUES (?)"),
            (g.to_string(),),
        )
        .await
        .unwrap();
    let mut b = r.begin(&g).await.unwrap();
    work(&mut b, table, 1).await;
    // The application's own duplicate-key error leaves the branch usable.
    let dup = b
        .conn()
        .query_drop(format!("INSERT INTO {table} VALUES (1, 'again')"))
        .await
        .unwrap_err();
    assert!(matches!(dup, mysql_async::Error::Server(ref e) if e.code == 1062));
    let e = b.prepare(&g).await.unwrap_err();
    assert!(matches!(e, ParticipantError::Refused(_)), "{e:?}");
    assert!(e.to_string().contains("1062"), "{e}");
    // Prepared or rolled back, the branch takes no second vote; rollback is a no-op.
    assert!(b.prepare(&g).await.is_err());
    Box::new(b).rollback().await.unwrap();
    assert_eq!(listed(&r, "mxn").await, Vec::<Gid>::new());
    assert_eq!(rows(r.pool(), table).await, Vec::<i32>::new());
    insert_unlocked(r.pool(), table, 1).await;

    // The application ended the XA transaction itself: the marker insert fails (1399).
    let g = gid("mxn", "mx-novote");
    let mut b = r.begin(&g).await.unwrap();
    work(&mut b, table, 2).await;
    let xid = format!(
        "X'{}',X'{}',1",
        hex(g.xa_gtrid().as_bytes()),
        hex(g.xa_bqual().as_bytes())
    );
    b.conn().query_drop(format!("XA END {xid}")).await.unwrap();
    assert!(matches!(
        b.prepare(&g).await,
        Err(ParticipantError::Refused(_))
    ));
    assert!(!r.marker_exists(&g).await.unwrap());

    // Prepared under another GID than the one begun with.
    let g2 = gid("mxn", "mx-novote");
    let mut b = r.begin(&g2).await.unwrap();
    work(&mut b, table, 3).await;
    let wrong = gid("mxn", "mx-novote");
    assert!(matches!(
        b.prepare(&wrong).await,
        Err(ParticipantError::Refused(_))
    ));

    assert_eq!(listed(&r, "mxn").await, Vec::<Gid>::new());
    assert_eq!(rows(r.pool(), table).await, vec![1]);
    insert_unlocked(r.pool(), table, 2).await;
    insert_unlocked(r.pool(), table, 3).await;
}

#[tokio::test]
async fn rollback_of_a_branch_that_was_not_prepared() {
    let table = "xa_unprepared_t";
    let r = setup("mx-unprep", &["mx-unprep"], table).await;

    // Active.
    let g = gid("mxu", "mx-unprep");
    let mut b = r.begin(&g).await.unwrap();
    work(&mut b, table, 1).await;
    Box::new(b).rollback().await.unwrap();

    // Idle (the application issued XA END itself).
    let idle = gid("mxu", "mx-unprep");
    let mut b = r.begin(&idle).await.unwrap();
    work(&mut b, table, 2).await;
    let xid = format!(
        "X'{}',X'{}',1",
        hex(idle.xa_gtrid().as_bytes()),
        hex(idle.xa_bqual().as_bytes())
    );
    b.conn().query_drop(format!("XA END {xid}")).await.unwrap();
    Box::new(b).rollback().await.unwrap();

    // Dropped without a word: its connection closes, which rolls it back.
    let g = gid("mxu", "mx-unprep");
    let mut b = r.begin(&g).await.unwrap();
    work(&mut b, table, 3).await;
    drop(b);

    assert_eq!(rows(r.pool(), table).await, Vec::<i32>::new());
    for id in 1..=3 {
        insert_unlocked(r.pool(), table, id).await;
    }
    assert_eq!(listed(&r, "mxu").await, Vec::<Gid>::new());
    // Nothing of a rolled-back branch is left in the server: its GID can start again.
    let mut b = r.begin(&idle).await.unwrap();
    work(&mut b, table, 4).await;
    b.prepare(&idle).await.unwrap();
    assert_eq!(r.commit_prepared(&idle).await.unwrap(), Finish::Done);
    assert_eq!(rows(r.pool(), table).await, vec![1, 2, 3, 4]);
}

#[tokio::test]
async fn begin_refuses_a_gid_of_another_resource_or_in_use() {
    let table = "xa_begin_t";
    let r = setup("mx-begin", &["mx-begin"], table).await;
    assert!(matches!(
        r.begin(&gid("mxb", "mx-elsewhere")).await,
        Err(ParticipantError::Refused(_))
    ));
    let g = gid("mxb", "mx-begin");
    let mut b = r.begin(&g).await.unwrap();
    work(&mut b, table, 1).await;
    b.prepare(&g).await.unwrap();
    // 1440 XAER_DUPID: the GID is prepared.
    let e = r.begin(&g).await.unwrap_err();
    assert!(e.to_string().contains("1440"), "{e}");
    assert_eq!(r.rollback_prepared(&g).await.unwrap(), Finish::Done);
}

#[tokio::test]
async fn preflight_passes_and_warns_about_the_binary_log_only_when_it_is_on() {
    let r = setup("mx-preflight", &[], "xa_preflight_t").await;
    let warnings = r.preflight().await.unwrap();
    let mut conn = connect(r.pool()).await;
    let log_bin: i64 = conn.query_first("SELECT @@log_bin").await.unwrap().unwrap();
    assert_eq!(
        warnings.iter().any(|w| w.contains("log_bin")),
        log_bin == 1,
        "{warnings:?}"
    );

    // A database without the marker table.
    conn.query_drop("CREATE DATABASE IF NOT EXISTS baton_xa_nomarker")
        .await
        .unwrap();
    let mut opts =
        mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&url()).unwrap());
    opts = opts.db_name(Some("baton_xa_nomarker"));
    let bare = MariaDbResource::new(branch_id("mx-preflight"), Pool::new(opts));
    match bare.preflight().await {
        Err(ParticipantError::Unsupported(m)) => assert!(m.contains("migrate"), "{m}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }

    // Nothing listens: unavailable, not refused.
    let gone = MariaDbResource::from_url(
        branch_id("mx-preflight"),
        "mysql://baton:baton@127.0.0.1:1/baton",
    )
    .unwrap();
    assert!(matches!(
        gone.preflight().await,
        Err(ParticipantError::Unavailable(_))
    ));
}
