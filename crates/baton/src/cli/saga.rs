//! `baton saga list|show|retry|skip|cancel`: the saga log of `baton-txn` (feature `saga`)
//! from the command line. It reads and writes the records directly in Baton through
//! [`SagaLog`], so it needs neither the saga definitions nor a running orchestrator; the
//! operator actions are compare-and-set writes on the record that the orchestrator picks up
//! (it watches for them), each kept in the record's audit trail with its reason.

use anyhow::{anyhow, Result};
use baton_txn::saga::{
    AuditEntry, PhaseRecord, PhaseState, SagaLog, SagaRecord, SagaStatus, StepRecord,
};
use clap::{Args, Subcommand};
use serde_json::json;

use super::client::{connect, finish, ClientArgs};
use super::output::{cut, emit, one_line, utc, Format, Table};

#[derive(Args, Debug)]
#[command(
    about = "Inspect sagas and resolve stuck ones (retry, skip, cancel)",
    long_about = "Inspect the sagas of a namespace kept in Baton by baton-txn's saga \
                  orchestrator, and act on them. A saga whose compensation kept failing is \
                  `stuck`: it waits for an operator to `retry` it (after fixing the cause) or \
                  to `skip` that compensation with a reason (after undoing the effect by \
                  hand, or deciding it may stay). Every action is recorded in the saga's \
                  audit trail (`show`).\n\n\
                  Output: --output table (default), simple (tab-separated, no header) or \
                  json (one saga record per line).",
    after_help = "Examples:\n  \
                  baton saga list --state stuck\n  \
                  baton saga show order-42\n  \
                  baton saga retry order-42 --reason \"payment gateway is back\"\n  \
                  baton saga skip order-42 --step 1 --reason \"refunded by hand, ticket 1234\"\n  \
                  baton saga cancel order-43 --reason \"customer withdrew\""
)]
pub struct SagaArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The namespace the orchestrators run in.
    #[arg(
        long,
        short = 'n',
        default_value = "default",
        env = "BATON_SAGA_NAMESPACE",
        global = true
    )]
    pub namespace: String,
    #[command(subcommand)]
    pub command: SagaCommand,
}

#[derive(Subcommand, Debug)]
pub enum SagaCommand {
    List(ListArgs),
    Show(ShowArgs),
    Retry(RetryArgs),
    Skip(SkipArgs),
    Cancel(CancelArgs),
}

#[derive(Args, Debug)]
#[command(about = "List sagas with their state, current step, attempts and last error")]
pub struct ListArgs {
    /// Only sagas in this state: running, compensating, completed, compensated, stuck.
    #[arg(long)]
    pub state: Option<String>,
    /// Only sagas that are not finished (running, compensating, stuck).
    #[arg(long, conflicts_with = "state")]
    pub open: bool,
}

#[derive(Args, Debug)]
#[command(
    about = "Show one saga: its steps, attempts, last errors and audit trail (outputs with -o json)"
)]
pub struct ShowArgs {
    /// The saga's id.
    pub id: String,
}

#[derive(Args, Debug)]
#[command(about = "Retry a stuck saga's compensation (its failure count starts again)")]
pub struct RetryArgs {
    /// The saga's id.
    pub id: String,
    /// Why (kept in the audit trail).
    #[arg(long, default_value = "retried by an operator")]
    pub reason: String,
}

#[derive(Args, Debug)]
#[command(about = "Skip a stuck saga's compensation of one step, with a reason")]
pub struct SkipArgs {
    /// The saga's id.
    pub id: String,
    /// The step whose compensation to skip: its index (as `show` prints it) or name. It must
    /// be the step the saga is stuck on.
    #[arg(long)]
    pub step: String,
    /// Why the compensation may be skipped (kept in the audit trail).
    #[arg(long)]
    pub reason: String,
}

#[derive(Args, Debug)]
#[command(about = "Cancel a running saga: it stops going forward and compensates")]
pub struct CancelArgs {
    /// The saga's id.
    pub id: String,
    /// Why (kept in the audit trail).
    #[arg(long)]
    pub reason: String,
}

/// Runs `baton saga …`; returns the process exit status.
pub async fn run(args: SagaArgs) -> i32 {
    let name = match &args.command {
        SagaCommand::List(_) => "saga list",
        SagaCommand::Show(_) => "saga show",
        SagaCommand::Retry(_) => "saga retry",
        SagaCommand::Skip(_) => "saga skip",
        SagaCommand::Cancel(_) => "saga cancel",
    };
    finish(name, run_inner(args).await)
}

async fn run_inner(args: SagaArgs) -> Result<i32> {
    let format = args.client.output;
    let client = connect(&args.client).await?;
    let log = SagaLog::new(&client, &args.namespace).map_err(|e| anyhow!("{e}"))?;
    match args.command {
        SagaCommand::List(a) => {
            let mut sagas = log.list().await.map_err(|e| anyhow!("{e}"))?;
            if let Some(state) = &a.state {
                const STATES: [&str; 5] = [
                    "running",
                    "compensating",
                    "completed",
                    "compensated",
                    "stuck",
                ];
                if !STATES.contains(&state.as_str()) {
                    return Err(anyhow!(
                        "unknown state {state:?}; use one of {}",
                        STATES.join(", ")
                    ));
                }
                sagas.retain(|s| s.status.name() == state);
            }
            if a.open {
                sagas.retain(|s| !s.status.is_final());
            }
            emit(&render_list(&sagas, format));
        }
        SagaCommand::Show(a) => {
            let rec = log
                .get(&a.id)
                .await
                .map_err(|e| anyhow!("{e}"))?
                .ok_or_else(|| anyhow!("no saga {} in namespace {}", a.id, args.namespace))?;
            emit(&render_show(&rec, format));
        }
        SagaCommand::Retry(a) => {
            let rec = log
                .retry_stuck(&a.id, &a.reason)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            emit(&acted(&rec, "retried", format));
        }
        SagaCommand::Skip(a) => {
            let current = log
                .get(&a.id)
                .await
                .map_err(|e| anyhow!("{e}"))?
                .ok_or_else(|| anyhow!("no saga {} in namespace {}", a.id, args.namespace))?;
            let step = parse_step(&current, &a.step)?;
            let rec = log
                .skip_step(&a.id, step, &a.reason)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            emit(&acted(&rec, "skipped", format));
        }
        SagaCommand::Cancel(a) => {
            let rec = log
                .cancel(&a.id, &a.reason)
                .await
                .map_err(|e| anyhow!("{e}"))?;
            emit(&acted(&rec, "cancel requested for", format));
        }
    }
    Ok(0)
}

/// A step given as an index or a name.
fn parse_step(rec: &SagaRecord, text: &str) -> Result<usize> {
    if let Ok(i) = text.parse::<usize>() {
        if i < rec.steps.len() {
            return Ok(i);
        }
        return Err(anyhow!(
            "saga {} has steps 0 to {}",
            rec.id,
            rec.steps.len() - 1
        ));
    }
    rec.steps
        .iter()
        .position(|s| s.name == text)
        .ok_or_else(|| anyhow!("saga {} has no step {text:?}", rec.id))
}

/// The step a saga is at, for the listing: `(index, attempts, last error)` of the step in
/// progress — the forward step while running, the compensation while compensating or stuck.
pub(crate) fn current(rec: &SagaRecord) -> Option<(usize, u32, Option<&str>)> {
    match &rec.status {
        SagaStatus::Running => rec
            .steps
            .iter()
            .position(|s| s.action.state != PhaseState::Done)
            .map(|i| {
                let a = &rec.steps[i].action;
                (i, a.attempts, a.last_error.as_deref())
            }),
        SagaStatus::Compensating => rec.steps.iter().enumerate().rev().find_map(|(i, s)| {
            let c = s.compensation.as_ref()?;
            matches!(c.state, PhaseState::Pending | PhaseState::Running)
                .then(|| (i, c.attempts, c.last_error.as_deref()))
        }),
        SagaStatus::Stuck {
            step,
            attempts,
            last_error,
        } => Some((*step, *attempts, Some(last_error.as_str()))),
        SagaStatus::Completed | SagaStatus::Compensated => None,
    }
}

fn render_list(sagas: &[SagaRecord], format: Format) -> String {
    match format {
        Format::Json => sagas
            .iter()
            .map(|s| serde_json::to_string(s).expect("records encode"))
            .collect::<Vec<_>>()
            .join("\n"),
        Format::Simple => sagas
            .iter()
            .map(|s| {
                let (step, attempts, error) = match current(s) {
                    Some((i, a, e)) => (s.steps[i].name.clone(), a.to_string(), one_line(e)),
                    None => ("-".into(), "-".into(), String::new()),
                };
                format!(
                    "{}\t{}\t{}\t{step}\t{attempts}\t{error}\n",
                    s.id,
                    s.definition,
                    s.status.name()
                )
            })
            .collect(),
        Format::Table => {
            if sagas.is_empty() {
                return "no sagas".into();
            }
            let mut t = Table::new(&[
                "ID",
                "DEFINITION",
                "STATE",
                "STEP",
                "ATTEMPTS",
                "UPDATED",
                "LAST ERROR",
            ]);
            for s in sagas {
                let (step, attempts, error) = match current(s) {
                    Some((i, a, e)) => (
                        format!("{i} {}", s.steps[i].name),
                        a.to_string(),
                        cut(&one_line(e), 60),
                    ),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                t.row(vec![
                    s.id.clone(),
                    s.definition.clone(),
                    s.status.name().into(),
                    step,
                    attempts,
                    utc(s.updated_ms),
                    if error.is_empty() { "-".into() } else { error },
                ]);
            }
            t.render()
        }
    }
}

fn render_show(rec: &SagaRecord, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string(rec).expect("records encode"),
        Format::Simple => {
            // One line per step: index, name, state, attempts, compensation state, its
            // attempts, last error (the compensation's if it has one).
            let mut out = format!("{}\t{}\t{}\n", rec.id, rec.definition, rec.status.name());
            for (i, s) in rec.steps.iter().enumerate() {
                let c = s.compensation.as_ref();
                let error = c
                    .and_then(|c| c.last_error.as_deref())
                    .or(s.action.last_error.as_deref());
                out.push_str(&format!(
                    "{i}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                    s.name,
                    step_state(s),
                    s.action.attempts,
                    c.map_or("-", phase_state),
                    c.map_or(0, |c| c.attempts),
                    one_line(error)
                ));
            }
            out
        }
        Format::Table => {
            let mut head = Table::headless();
            head.row(vec!["saga".into(), rec.id.clone()]);
            head.row(vec!["definition".into(), rec.definition.clone()]);
            head.row(vec!["state".into(), status_line(rec)]);
            if let Some(r) = &rec.reason {
                head.row(vec!["compensating because".into(), one_line(Some(r))]);
            }
            if rec.cancel_requested {
                head.row(vec!["cancel".into(), "requested".into()]);
            }
            head.row(vec!["data".into(), cut(&rec.data.to_string(), 100)]);
            head.row(vec!["created".into(), utc(rec.created_ms)]);
            head.row(vec!["updated".into(), utc(rec.updated_ms)]);
            if let Some(f) = rec.finished_ms {
                head.row(vec!["finished".into(), utc(f)]);
            }
            if let Some(o) = &rec.orchestrator {
                head.row(vec!["orchestrator".into(), o.clone()]);
            }
            let mut steps = Table::new(&[
                "#",
                "STEP",
                "STATE",
                "ATTEMPTS",
                "LAST ERROR",
                "COMPENSATION",
                "ATTEMPTS",
                "LAST ERROR",
            ]);
            for (i, s) in rec.steps.iter().enumerate() {
                let c = s.compensation.as_ref();
                steps.row(vec![
                    i.to_string(),
                    s.name.clone(),
                    step_state(s),
                    s.action.attempts.to_string(),
                    cut(&one_line(s.action.last_error.as_deref()), 50),
                    c.map_or("-".into(), |c| phase_state(c).to_string()),
                    c.map_or("-".into(), |c| c.attempts.to_string()),
                    cut(&one_line(c.and_then(|c| c.last_error.as_deref())), 50),
                ]);
            }
            let mut out = format!("{}\n{}", head.render(), steps.render());
            if rec.audit.is_empty() {
                out.push_str("\naudit: no operator actions\n");
            } else {
                let mut audit = Table::new(&["AT", "ACTION", "STEP", "BY", "REASON"]);
                for a in &rec.audit {
                    audit.row(audit_row(a));
                }
                out.push_str(&format!("\naudit:\n{}", audit.render()));
            }
            out
        }
    }
}

fn audit_row(a: &AuditEntry) -> Vec<String> {
    vec![
        utc(a.at_ms),
        a.action.to_string(),
        a.step.map_or("-".into(), |s| s.to_string()),
        a.by.clone(),
        one_line(Some(&a.reason)),
    ]
}

fn status_line(rec: &SagaRecord) -> String {
    match &rec.status {
        SagaStatus::Stuck {
            step,
            attempts,
            last_error,
        } => format!(
            "stuck on the compensation of step {step} ({}) after {attempts} attempt{}: {}",
            rec.steps.get(*step).map_or("?", |s| s.name.as_str()),
            if *attempts == 1 { "" } else { "s" },
            one_line(Some(last_error))
        ),
        s => s.name().into(),
    }
}

fn step_state(s: &StepRecord) -> String {
    let state = phase_state(&s.action);
    if s.outcome_unknown && s.action.state != PhaseState::Done {
        format!("{state} (outcome unknown)")
    } else {
        state.into()
    }
}

/// An action's or a compensation's state (an action is never skipped, a compensation never
/// failed).
fn phase_state(p: &PhaseRecord) -> &'static str {
    match p.state {
        PhaseState::Pending if p.attempts > 0 => "retrying",
        PhaseState::Pending => "pending",
        PhaseState::Running => "running",
        PhaseState::Done => "done",
        PhaseState::Failed => "failed",
        PhaseState::Skipped => "skipped",
    }
}

fn acted(rec: &SagaRecord, verb: &str, format: Format) -> String {
    match format {
        Format::Json => json!({ "id": rec.id, "state": rec.status.name() }).to_string(),
        Format::Simple => format!("{}\t{}", rec.id, rec.status.name()),
        Format::Table => format!("{verb} saga {}; it is {}", rec.id, rec.status.name()),
    }
}
