//! The seed's order saga — create order → charge card → reserve stock → schedule shipment,
//! compensated by cancel order ← refund ← release stock — over four participant "services",
//! each a set of tables in one PostgreSQL schema, each applying its effect in its own
//! transaction guarded by a `StepFence`.
//!
//! Every applied effect also writes a row to `effects (service, key, phase)` in the same
//! transaction, so counting rows per idempotency key counts effects; every call (refused or
//! not) writes a row to `calls` on its own, so tests can see attempts and their times.
//!
//! Failures are driven by the data and by the database, so a child process and the test see
//! the same world:
//! - a SKU without stock makes `reserve_stock` fail (fatal: "insufficient stock");
//! - a row in `outages (service, remaining)` makes that service's calls fail (retryable)
//!   `remaining` more times (`-1`: always); `service` is a service name (`payments`) or a
//!   service's actions or compensations only (`payments/compensation`);
//! - `gate_charge`: the charge waits for an advisory lock the test holds (a step in flight);
//! - `late_reserve_ms`: the reservation request is "sent" (a detached task applies it after
//!   that many ms) and the action never answers: its timeout makes the outcome unknown.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use baton_client::{Client, ClientConfig};
use baton_txn::pg::Schema;
use baton_txn::saga::{
    CompensationPolicy, FenceAction, FenceUndo, Jitter, Orchestrator, OrchestratorConfig, Phase,
    RetryPolicy, SagaDef, StepCtx, StepError, StepFence,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_postgres::types::ToSql;

use crate::common;

/// The saga's data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub amount_cents: i64,
    pub sku: String,
    pub qty: i32,
    #[serde(default)]
    pub gate_charge: bool,
    #[serde(default)]
    pub late_reserve_ms: Option<u64>,
}

impl Order {
    pub fn new(order_id: &str, sku: &str) -> Order {
        Order {
            order_id: order_id.into(),
            amount_cents: 4200,
            sku: sku.into(),
            qty: 2,
            gate_charge: false,
            late_reserve_ms: None,
        }
    }
}

/// SKUs the stock table starts with.
pub const IN_STOCK: &str = "widget";
pub const OUT_OF_STOCK: &str = "unobtainium";

pub const STEPS: [&str; 4] = [
    "create_order",
    "charge_card",
    "reserve_stock",
    "schedule_shipment",
];

/// Drops and recreates `name` with the services' tables and the step fence.
pub async fn fresh_services(name: &str) -> Schema {
    let schema = Schema::new(name).unwrap();
    let mut client = common::connect().await;
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
        .await
        .unwrap();
    let fence = StepFence::new(&schema);
    fence.create(&mut client).await.unwrap();
    // A second run finds everything in place.
    fence.create(&mut client).await.unwrap();
    client
        .batch_execute(&format!(
            "CREATE TABLE {name}.orders (order_id text PRIMARY KEY, state text NOT NULL);
             CREATE TABLE {name}.payments (order_id text NOT NULL, cents bigint NOT NULL,
                                           kind text NOT NULL);
             CREATE TABLE {name}.stock (sku text PRIMARY KEY, available int NOT NULL);
             CREATE TABLE {name}.reservations (order_id text NOT NULL, sku text NOT NULL,
                                               qty int NOT NULL, released bool NOT NULL DEFAULT false);
             CREATE TABLE {name}.shipments (order_id text PRIMARY KEY, state text NOT NULL);
             CREATE TABLE {name}.effects (id bigserial PRIMARY KEY, service text NOT NULL,
                                          key text NOT NULL, phase text NOT NULL,
                                          at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE {name}.calls (id bigserial PRIMARY KEY, service text NOT NULL,
                                        key text NOT NULL, attempt int NOT NULL,
                                        outcome text NOT NULL,
                                        at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE {name}.outages (service text PRIMARY KEY, remaining int NOT NULL);
             INSERT INTO {name}.stock VALUES ('{IN_STOCK}', 1000000), ('{OUT_OF_STOCK}', 0);"
        ))
        .await
        .unwrap();
    schema
}

/// `service` fails its next `times` calls (`-1`: every call until cleared).
pub async fn set_outage(schema: &Schema, service: &str, times: i32) {
    let client = common::connect().await;
    client
        .execute(
            &format!(
                "INSERT INTO {}.outages VALUES ($1, $2)
                 ON CONFLICT (service) DO UPDATE SET remaining = $2",
                schema.name()
            ),
            &[&service, &times],
        )
        .await
        .unwrap();
}

pub async fn clear_outage(schema: &Schema, service: &str) {
    let client = common::connect().await;
    client
        .execute(
            &format!("DELETE FROM {}.outages WHERE service = $1", schema.name()),
            &[&service],
        )
        .await
        .unwrap();
}

/// The services, as the saga's steps call them.
pub struct Services {
    schema: Schema,
    fence: StepFence,
}

fn unavailable(e: impl std::fmt::Display) -> StepError {
    StepError::Retryable(format!("database: {e}"))
}

impl Services {
    pub fn new(schema: &Schema) -> Arc<Services> {
        Arc::new(Services {
            schema: schema.clone(),
            fence: StepFence::new(schema),
        })
    }

    fn sql(&self, sql: &str) -> String {
        sql.replace("{s}", self.schema.name())
    }

    async fn log_call(&self, service: &str, cx: &StepCtx<Order>, outcome: &str) {
        if let Ok(client) = common::try_connect().await {
            let _ = client
                .execute(
                    &self.sql(
                        "INSERT INTO {s}.calls (service, key, attempt, outcome) VALUES ($1, $2, $3, $4)",
                    ),
                    &[&service, &cx.key(), &(cx.attempt() as i32), &outcome],
                )
                .await;
        }
    }

    /// One call of `service`: the outage check, then in one transaction the fence, the
    /// effect (`sql` with `params`; no row changed = refused, fatal) and its `effects` row.
    async fn apply(
        &self,
        service: &str,
        cx: &StepCtx<Order>,
        gate: bool,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        refusal: &str,
    ) -> Result<Value, StepError> {
        let result = self
            .apply_inner(service, cx, gate, sql, params, refusal)
            .await;
        let outcome = match &result {
            Ok(v) => v["verdict"].as_str().unwrap_or("ok").to_string(),
            Err(e) => format!("error: {e}"),
        };
        self.log_call(service, cx, &outcome).await;
        result
    }

    async fn apply_inner(
        &self,
        service: &str,
        cx: &StepCtx<Order>,
        gate: bool,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        refusal: &str,
    ) -> Result<Value, StepError> {
        let mut client = common::try_connect().await.map_err(unavailable)?;
        let down = client
            .query_opt(
                &self.sql(
                    "UPDATE {s}.outages SET remaining = remaining - 1
                     WHERE service IN ($1, $1 || '/' || $2) AND remaining <> 0
                     RETURNING remaining",
                ),
                &[&service, &cx.phase().to_string()],
            )
            .await
            .map_err(unavailable)?;
        if down.is_some() {
            return Err(StepError::Retryable(format!("{service} is unavailable")));
        }
        let tx = client.transaction().await.map_err(unavailable)?;
        if gate {
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext('gate:' || $1::text))",
                &[&cx.data().order_id],
            )
            .await
            .map_err(unavailable)?;
        }
        let verdict = match cx.phase() {
            Phase::Action => match self
                .fence
                .before_action(&tx, cx.step_key())
                .await
                .map_err(unavailable)?
            {
                FenceAction::Proceed => "applied",
                FenceAction::AlreadyDone => "already_done",
                FenceAction::RejectedCompensated => "rejected",
            },
            Phase::Compensation => match self
                .fence
                .before_undo(&tx, cx.step_key())
                .await
                .map_err(unavailable)?
            {
                FenceUndo::Proceed => "applied",
                FenceUndo::AlreadyCompensated => "already_compensated",
                FenceUndo::NothingToUndo => "nothing_to_undo",
            },
        };
        if verdict == "applied" {
            let n = tx
                .execute(&self.sql(sql), params)
                .await
                .map_err(unavailable)?;
            if n == 0 {
                // Dropping the transaction rolls the fence row back too: nothing happened.
                return Err(StepError::Fatal(refusal.to_string()));
            }
            tx.execute(
                &self.sql("INSERT INTO {s}.effects (service, key, phase) VALUES ($1, $2, $3)"),
                &[&service, &cx.key(), &cx.phase().to_string()],
            )
            .await
            .map_err(unavailable)?;
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(json!({ "service": service, "verdict": verdict }))
    }

    pub async fn create_order(&self, cx: StepCtx<Order>) -> Result<Value, StepError> {
        let o = cx.data().clone();
        self.apply(
            "orders",
            &cx,
            false,
            "INSERT INTO {s}.orders VALUES ($1, 'created')",
            &[&o.order_id],
            "",
        )
        .await
    }

    pub async fn cancel_order(&self, cx: StepCtx<Order>) -> Result<Value, StepError> {
        let o = cx.data().clone();
        self.apply(
            "orders",
            &cx,
            false,
            "UPDATE {s}.orders SET state = 'cancelled' WHERE order_id = $1",
            &[&o.order_id],
            "no such order",
        )
        .await
    }

    pub async fn charge_card(&self, cx: StepCtx<Order>) -> Result<Value, StepError> {
        let o = cx.data().clone();
        self.apply(
            "payments",
            &cx,
            o.gate_charge,
            "INSERT INTO {s}.payments VALUES ($1, $2, 'charge')",
            &[&o.order_id, &o.amount_cents],
            "",
        )
        .await
    }

    pub async fn refund(&self, cx: StepCtx<Order>) -> Result<Value, StepError> {
        let o = cx.data().clone();
        self.apply(
            "payments",
            &cx,
            false,
            "INSERT INTO {s}.payments VALUES ($1, $2, 'refund')",
            &[&o.order_id, &-o.amount_cents],
            "",
        )
        .await
    }

    async fn reserve(&self, cx: &StepCtx<Order>) -> Result<Value, StepError> {
        let o = cx.data().clone();
        self.apply(
            "stock",
            cx,
            false,
            "WITH taken AS (UPDATE {s}.stock SET available = available - $3
                            WHERE sku = $2 AND available >= $3 RETURNING sku)
             INSERT INTO {s}.reservations (order_id, sku, qty) SELECT $1, sku, $3 FROM taken",
            &[&o.order_id, &o.sku, &o.qty],
            "insufficient stock",
        )
        .await
    }

    pub async fn reserve_stock(self: Arc<Self>, cx: StepCtx<Order>) -> Result<Value, StepError> {
        if let Some(ms) = cx.data().late_reserve_ms {
            // The request is on the wire and will be processed late; no answer comes back.
            let me = self.clone();
            let late = cx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let _ = me.reserve(&late).await;
            });
            return std::future::pending().await;
        }
        self.reserve(&cx).await
    }

    pub async fn release_stock(&self, cx: StepCtx<Order>) -> Result<Value, StepError> {
        let o = cx.data().clone();
        self.apply(
            "stock",
            &cx,
            false,
            "WITH released AS (UPDATE {s}.reservations SET released = true
                               WHERE order_id = $1 AND NOT released RETURNING sku, qty)
             UPDATE {s}.stock s SET available = available + r.qty FROM released r
             WHERE s.sku = r.sku",
            &[&o.order_id],
            "no reservation to release",
        )
        .await
    }

    pub async fn schedule_shipment(&self, cx: StepCtx<Order>) -> Result<Value, StepError> {
        let o = cx.data().clone();
        self.apply(
            "shipments",
            &cx,
            false,
            "INSERT INTO {s}.shipments VALUES ($1, 'scheduled')",
            &[&o.order_id],
            "",
        )
        .await
    }
}

/// The policies of a test run: short pauses so tests stay quick.
#[derive(Clone)]
pub struct Policies {
    pub retry: RetryPolicy,
    pub compensation: CompensationPolicy,
    pub reserve_timeout: Option<Duration>,
}

impl Default for Policies {
    fn default() -> Self {
        let retry = RetryPolicy {
            initial: Duration::from_millis(20),
            multiplier: 2.0,
            max_interval: Duration::from_millis(200),
            max_attempts: 3,
            jitter: Jitter::Equal,
        };
        Policies {
            retry: retry.clone(),
            compensation: CompensationPolicy {
                retry,
                park_after: 5,
            },
            reserve_timeout: None,
        }
    }
}

macro_rules! call {
    ($svc:expr, $method:ident) => {{
        let svc = $svc.clone();
        move |cx: StepCtx<Order>| {
            let svc = svc.clone();
            async move { svc.$method(cx).await }
        }
    }};
}

/// The order saga over `services`.
pub fn order_saga(services: &Arc<Services>, p: &Policies) -> SagaDef<Order> {
    let mut reserve = SagaDef::builder("order")
        .step("create_order", call!(services, create_order))
        .compensate(call!(services, cancel_order))
        .retry(p.retry.clone())
        .compensation_policy(p.compensation.clone())
        .step("charge_card", call!(services, charge_card))
        .compensate(call!(services, refund))
        .retry(p.retry.clone())
        .compensation_policy(p.compensation.clone())
        .step("reserve_stock", call!(services, reserve_stock))
        .compensate(call!(services, release_stock))
        .retry(p.retry.clone())
        .compensation_policy(p.compensation.clone());
    if let Some(t) = p.reserve_timeout {
        reserve = reserve.timeout(t);
    }
    reserve
        .step("schedule_shipment", call!(services, schedule_shipment))
        .retry(p.retry.clone())
        .build()
        .unwrap()
}

pub async fn baton(endpoint: &str) -> Client {
    Client::connect(ClientConfig::new([endpoint.to_string()]))
        .await
        .unwrap()
}

/// The session TTL the tests' orchestrators lead with (Baton's minimum).
pub const TTL: Duration = Duration::from_secs(2);

pub fn config(instance: &str) -> OrchestratorConfig {
    let mut c = OrchestratorConfig::new(instance);
    c.session = baton_client::SessionOptions::new().with_ttl(TTL);
    c.poll = Duration::from_millis(100);
    c
}

/// An orchestrator of the order saga in namespace `ns`.
pub async fn orchestrator(
    endpoint: &str,
    ns: &str,
    schema: &Schema,
    p: &Policies,
    instance: &str,
) -> Orchestrator {
    let services = Services::new(schema);
    Orchestrator::new(&baton(endpoint).await, ns, config(instance))
        .unwrap()
        .register(order_saga(&services, p))
}

/// Runs `orchestrator` in the background until the returned sender is dropped or sent to.
pub fn spawn_running(
    orchestrator: Orchestrator,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        orchestrator
            .run(async move {
                let _ = stopped.await;
            })
            .await
    });
    (stop, task)
}

/// Effects applied per `(service, key, phase)`.
pub async fn effect_count(schema: &Schema, key: &str, phase: &str) -> i64 {
    let client = common::connect().await;
    client
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.effects WHERE key = $1 AND phase = $2",
                schema.name()
            ),
            &[&key, &phase],
        )
        .await
        .unwrap()
        .get(0)
}

/// Every effect of the keys starting with `prefix`, in the order they committed:
/// `(service, phase)`.
pub async fn effects_in_order(schema: &Schema, prefix: &str) -> Vec<(String, String)> {
    let client = common::connect().await;
    client
        .query(
            &format!(
                "SELECT service, phase FROM {}.effects WHERE key LIKE $1 || '%' ORDER BY id",
                schema.name()
            ),
            &[&prefix],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The calls of `key`, in order: (attempt, outcome, time).
pub async fn calls(schema: &Schema, key: &str) -> Vec<(i32, String, std::time::SystemTime)> {
    let client = common::connect().await;
    client
        .query(
            &format!(
                "SELECT attempt, outcome, at FROM {}.calls WHERE key = $1 ORDER BY id",
                schema.name()
            ),
            &[&key],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The step key of `step` of saga `id` in `ns`.
pub fn step_key(ns: &str, id: &str, step: usize) -> String {
    format!("{ns}/{id}/{}", STEPS[step])
}

pub fn undo_key(ns: &str, id: &str, step: usize) -> String {
    format!("{}/undo", step_key(ns, id, step))
}
