//! A bank for the 2PC tests: accounts in PostgreSQL schemas (and MariaDB databases), money
//! moved between them by global transactions, and the checks that prove atomicity (the sum
//! never changes; every transfer is recorded on both sides or on neither).

use std::sync::Arc;

use baton_txn::pg::Schema;
use baton_txn::twopc::pg::{PgBranch, PgResource};
use baton_txn::twopc::{BranchId, Coordinator, Outcome, TxError};

use super::{connect, pg_url};

/// The opening balance of every account.
pub const OPENING: i64 = 1_000;

/// A PostgreSQL "bank": schema `name` with the crate's tables (the 2PC marker table among
/// them), `accounts` and `transfers` (one row per transfer that touched this bank).
pub async fn fresh_pg_bank(name: &str, accounts: i32) -> Arc<PgResource> {
    let schema = super::fresh_schema(name).await;
    let client = connect().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE {name}.accounts (id int PRIMARY KEY, balance bigint NOT NULL);
             CREATE TABLE {name}.transfers (id text PRIMARY KEY, amount bigint NOT NULL);
             INSERT INTO {name}.accounts SELECT g, {OPENING} FROM generate_series(1, {accounts}) g;"
        ))
        .await
        .unwrap();
    Arc::new(pg_resource(name, &schema))
}

pub fn pg_resource(name: &str, schema: &Schema) -> PgResource {
    PgResource::new(
        BranchId::new(name.replace('_', "-")).unwrap(),
        pg_url().parse().unwrap(),
        schema.clone(),
    )
}

/// The branch work: `delta` on `account`, and the transfer's row.
pub async fn pg_work(
    bank: &PgResource,
    schema: &str,
    transfer: &str,
    account: i32,
    delta: i64,
) -> PgBranch {
    let b = bank.begin().await.unwrap();
    b.client()
        .execute(
            &format!("UPDATE {schema}.accounts SET balance = balance + $1 WHERE id = $2"),
            &[&delta, &account],
        )
        .await
        .unwrap();
    b.client()
        .execute(
            &format!("INSERT INTO {schema}.transfers (id, amount) VALUES ($1, $2)"),
            &[&transfer, &delta],
        )
        .await
        .unwrap();
    b
}

/// Moves `amount` from `from` in bank `a` to `to` in bank `b`, both PostgreSQL.
pub async fn pg_transfer(
    coord: &Coordinator,
    (a, a_schema): (&PgResource, &str),
    (b, b_schema): (&PgResource, &str),
    from: i32,
    to: i32,
    amount: i64,
) -> Result<Outcome, TxError> {
    let mut tx = coord.begin();
    let id = tx.id().to_string();
    tx.enlist(pg_work(a, a_schema, &id, from, -amount).await)?;
    tx.enlist(pg_work(b, b_schema, &id, to, amount).await)?;
    tx.commit().await
}

/// The sum of a PostgreSQL bank's balances and its transfer ids.
pub async fn pg_state(schema: &str) -> (i64, Vec<String>) {
    let c = connect().await;
    let sum: i64 = c
        .query_one(
            &format!("SELECT sum(balance)::bigint FROM {schema}.accounts"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let mut ids: Vec<String> = c
        .query(&format!("SELECT id FROM {schema}.transfers"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.sort();
    (sum, ids)
}

/// GIDs of `namespace` still prepared in the test PostgreSQL.
pub async fn pg_prepared(namespace: &str) -> Vec<String> {
    let c = connect().await;
    c.query(
        "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, $1) ORDER BY gid",
        &[&format!("bt1:{namespace}:")],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}
