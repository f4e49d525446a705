//! Shared set-up: a connection to the test PostgreSQL and a fresh schema per test, so tests
//! run in parallel without seeing each other's rows.
#![allow(dead_code)]

use baton_txn::pg::{Client, Schema};
use tokio_postgres::NoTls;

/// The server `scripts/services` starts (and `scripts/test` starts before the tests).
pub const DEFAULT_PG_URL: &str = "postgres://baton@127.0.0.1:55432/baton";

pub fn pg_url() -> String {
    std::env::var("BATON_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string())
}

/// A new connection. A missing server is a failure, never a skip: these tests are the proof
/// that the store works on a real PostgreSQL.
pub async fn connect() -> Client {
    let url = pg_url();
    match tokio_postgres::connect(&url, NoTls).await {
        Ok((client, connection)) => {
            tokio::spawn(async move {
                let _ = connection.await;
            });
            client
        }
        Err(e) => panic!(
            "PostgreSQL is not reachable at {url}: {e}\n\
             The baton-txn tests need a real server: run `scripts/services` (scripts/test \
             does this first) or point BATON_TEST_PG_URL at one."
        ),
    }
}

/// Drops and recreates `name` with the crate's tables plus `effects`, the table the tests'
/// "work" writes to (one row per execution, so counting rows counts executions).
pub async fn fresh_schema(name: &str) -> Schema {
    let schema = Schema::new(name).unwrap();
    let mut client = connect().await;
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
        .await
        .unwrap();
    schema.migrate(&mut client).await.unwrap();
    // A second run finds everything in place.
    schema.migrate(&mut client).await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE {name}.effects (id bigserial PRIMARY KEY, tenant text NOT NULL,
                                          key text NOT NULL, body text NOT NULL)"
        ))
        .await
        .unwrap();
    schema
}

pub async fn count_effects(client: &Client, schema: &Schema, tenant: &str, key: &str) -> i64 {
    client
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.effects WHERE tenant = $1 AND key = $2",
                schema.name()
            ),
            &[&tenant, &key],
        )
        .await
        .unwrap()
        .get(0)
}
