//! Records written by the first version of the saga log, pinned byte for byte
//! (`tests/golden/saga-*.json`, written by that version's code and never regenerated): they
//! must decode and encode again to the same bytes, and the same sagas driven through
//! `transition` today must encode to them. A change to the stored JSON fails here; a new
//! format gets new files beside these, which stay.

use serde_json::{json, Value};

use super::def::{CompensationPolicy, Jitter, RetryPolicy, SagaDef, StepCtx, StepError};
use super::plan::{plan, Plan};
use super::record::{Phase, SagaRecord};
use super::transition::{transition, Driver, Event, Move, Outcome, Request};

const T0: u64 = 1_700_000_000_000;
const TAG: &str = "orch-1 (token 7)";
const BY: &str = "ops@host-1 (pid 4242)";

fn noop(_: StepCtx<Value>) -> crate::saga::BoxFuture<'static, Result<Value, StepError>> {
    Box::pin(async { Ok(Value::Null) })
}

fn def() -> SagaDef<Value> {
    let retry = RetryPolicy {
        max_attempts: 3,
        jitter: Jitter::None,
        ..RetryPolicy::default()
    };
    let comp = CompensationPolicy {
        retry: retry.clone(),
        park_after: 2,
    };
    SagaDef::builder("order")
        .step("create", noop)
        .compensate(noop)
        .retry(retry.clone())
        .compensation_policy(comp.clone())
        .step("charge", noop)
        .compensate(noop)
        .retry(retry.clone())
        .compensation_policy(comp)
        .step("ship", noop)
        .retry(retry)
        .build()
        .unwrap()
}

fn fresh(def: &SagaDef<Value>, id: &str) -> SagaRecord {
    let data = json!({"order": id, "cents": 1250, "items": ["a", "b"]});
    def.new_record(id, &data, T0).unwrap()
}

/// Applies `event` at `now`, which must change the record.
fn apply(r: &mut SagaRecord, event: &Event<'_>, now: u64) {
    *r = transition(r, event, now).unwrap().expect("the event fits");
}

fn orchestrate(r: &mut SagaRecord, def: &SagaDef<Value>, m: Move<'_>, now: u64) {
    let specs = def.steps();
    let driver = Driver {
        tag: TAG,
        specs: &specs,
    };
    apply(r, &Event::Orchestrator(&driver, m), now);
}

fn begin(r: &mut SagaRecord, def: &SagaDef<Value>, step: usize, phase: Phase, now: u64) {
    assert_eq!(plan(r, now), Plan::Run { step, phase });
    orchestrate(r, def, Move::Start { step, phase }, now);
}

fn end(
    r: &mut SagaRecord,
    def: &SagaDef<Value>,
    step: usize,
    phase: Phase,
    outcome: Outcome,
    now: u64,
) {
    let attempt = r.steps[step].phase(phase).unwrap().attempts;
    let m = Move::End {
        step,
        phase,
        attempt,
        outcome: &outcome,
        jitter: 0.5,
    };
    orchestrate(r, def, m, now);
}

/// What the orchestrator does when the plan needs no call.
fn follow(r: &mut SagaRecord, def: &SagaDef<Value>, now: u64) {
    let m = Move::carrying_out(plan(r, now)).expect("a move");
    assert!(!matches!(m, Move::Start { .. }), "not a call: {m:?}");
    orchestrate(r, def, m, now);
}

fn operator(r: &mut SagaRecord, request: Request, reason: &str, now: u64) {
    let event = Event::Operator {
        by: BY,
        reason,
        request,
    };
    apply(r, &event, now);
}

fn ok(v: Value) -> Outcome {
    Outcome::Ok(v)
}

fn records() -> Vec<(&'static str, SagaRecord)> {
    let d = def();
    let (a, c) = (Phase::Action, Phase::Compensation);
    let mut out = Vec::new();

    // Mid-action: charge timed out once and is in its second attempt.
    let mut r = fresh(&d, "o-running");
    begin(&mut r, &d, 0, a, T0 + 1);
    end(&mut r, &d, 0, a, ok(json!({"order_id": 17})), T0 + 10);
    begin(&mut r, &d, 1, a, T0 + 20);
    end(
        &mut r,
        &d,
        1,
        a,
        Outcome::Unknown("timed out after 5s".into()),
        T0 + 30,
    );
    begin(&mut r, &d, 1, a, T0 + 230);
    out.push(("saga-running.json", r));

    // Compensating: charge cut short, then declined; its refund in a second attempt.
    let mut r = fresh(&d, "o-compensating");
    begin(&mut r, &d, 0, a, T0 + 1);
    end(&mut r, &d, 0, a, ok(json!({"order_id": 18})), T0 + 10);
    begin(&mut r, &d, 1, a, T0 + 20);
    follow(&mut r, &d, T0 + 25);
    begin(&mut r, &d, 1, a, T0 + 30);
    let declined = Outcome::Failed(StepError::Fatal("card declined".into()));
    end(&mut r, &d, 1, a, declined, T0 + 40);
    begin(&mut r, &d, 1, c, T0 + 50);
    let down = Outcome::Failed(StepError::Retryable("refund service down".into()));
    end(&mut r, &d, 1, c, down, T0 + 60);
    begin(&mut r, &d, 1, c, T0 + 260);
    out.push(("saga-compensating.json", r));

    // Completed.
    let mut r = fresh(&d, "o-completed");
    for (step, v) in [json!({"order_id": 19}), json!("ch_19"), Value::Null]
        .into_iter()
        .enumerate()
    {
        let t = T0 + 10 * step as u64;
        begin(&mut r, &d, step, a, t + 1);
        end(&mut r, &d, step, a, ok(v), t + 5);
    }
    follow(&mut r, &d, T0 + 40);
    out.push(("saga-completed.json", r));

    // Cancelled by an operator after charge; the refund refused for good: stuck.
    let mut r = fresh(&d, "o-stuck");
    begin(&mut r, &d, 0, a, T0 + 1);
    end(&mut r, &d, 0, a, ok(json!({"order_id": 20})), T0 + 10);
    begin(&mut r, &d, 1, a, T0 + 20);
    end(
        &mut r,
        &d,
        1,
        a,
        ok(json!({"charge": "ch_20", "cents": 1250})),
        T0 + 30,
    );
    operator(&mut r, Request::Cancel, "customer asked", T0 + 40);
    follow(&mut r, &d, T0 + 50);
    begin(&mut r, &d, 1, c, T0 + 60);
    let refused = Outcome::Failed(StepError::Fatal("refund refused: card closed".into()));
    end(&mut r, &d, 1, c, refused, T0 + 70);
    out.push(("saga-stuck.json", r.clone()));

    // The same saga retried, cut short, parked again, skipped, and compensated.
    r.id = "o-compensated".into();
    operator(&mut r, Request::Retry, "card reopened", T0 + 80);
    begin(&mut r, &d, 1, c, T0 + 90);
    follow(&mut r, &d, T0 + 100);
    begin(&mut r, &d, 1, c, T0 + 110);
    let again = Outcome::Failed(StepError::Retryable("still refused".into()));
    end(&mut r, &d, 1, c, again, T0 + 120);
    begin(&mut r, &d, 1, c, T0 + 320);
    let again = Outcome::Unknown("panicked: boom".into());
    end(&mut r, &d, 1, c, again, T0 + 330);
    operator(
        &mut r,
        Request::Skip { step: 1 },
        "refunded by hand",
        T0 + 340,
    );
    begin(&mut r, &d, 0, c, T0 + 350);
    end(&mut r, &d, 0, c, ok(json!({"cancelled": true})), T0 + 360);
    follow(&mut r, &d, T0 + 370);
    out.push(("saga-compensated.json", r));
    out
}

fn path(name: &str) -> String {
    format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn golden_records_decode_and_encode_byte_for_byte() {
    for (name, rec) in records() {
        let bytes = crate::coordination::encode(&rec);
        let file = std::fs::read(path(name)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&file),
            "{name}: this version's encoding"
        );
        // (Not `decoded == rec`: an output of `null` reads back as no output.)
        let decoded: SagaRecord = serde_json::from_slice(&file).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&crate::coordination::encode(&decoded)),
            String::from_utf8_lossy(&file),
            "{name}: decoded and encoded again"
        );
    }
}
