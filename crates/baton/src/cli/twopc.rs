//! `baton 2pc list|show`: the two-phase-commit decision log of `baton-txn` (feature `twopc`)
//! from the command line. It reads the records directly in Baton through
//! [`BatonDecisionLog`], so it needs neither the participants' databases nor a running
//! coordinator or Recoverer.
//!
//! It only reads. Finishing a transaction is the Recoverer's job: it holds an election and
//! fences its log writes with it, and it applies a decision to the databases in the same
//! step as it records the outcome. A CLI writing decisions or branch states beside it could
//! record an outcome no database has.
//!
//! "txn" means etcd's transaction only (`baton kv txn`, parsed in `cli/txn.rs`): this command was
//! `baton txn` before, and that name stays a hidden alias for one release.

use anyhow::{anyhow, Result};
use baton_txn::twopc::{
    BatonDecisionLog, BranchRecord, BranchState, DecisionLog, Gid, TxId, TxRecord, TxState,
};
use clap::{Args, Subcommand};
use serde_json::Value;

use super::client::{connect, finish, ClientArgs};
use super::output::{cut, emit, now_ms, one_line, span, utc, Format, Table};

#[derive(Args, Debug)]
#[command(
    about = "Inspect two-phase-commit transactions (the 2PC decision log)",
    long_about = "Inspect the global transactions of a namespace kept in Baton by baton-txn's \
                  two-phase-commit coordinator (its decision log): their state, the decision \
                  and who made it, and where every branch stands. Read-only: the Recoverer \
                  finishes transactions.\n\n\
                  States and what to do:\n  \
                  preparing   intent recorded, no decision yet; branches may be prepared and \
                  hold their locks. Within its deadline the coordinator is still working. \
                  Past its deadline the Recoverer aborts it on its next pass; if it stays, \
                  check that a Recoverer runs for this namespace.\n  \
                  committing  decided commit, some branch not committed yet (a database \
                  was down). The Recoverer finishes it; `baton 2pc show` has each branch's \
                  attempts and last error.\n  \
                  aborting    decided abort, some branch not rolled back yet. As committing.\n  \
                  committed   every branch committed.\n  \
                  aborted     every branch rolled back (or never prepared).\n  \
                  heuristic   finished, but some branch ended against the decision: someone \
                  committed or rolled back a prepared branch by hand (COMMIT/ROLLBACK \
                  PREPARED, XA COMMIT/ROLLBACK). Atomicity is broken; nothing retries it. \
                  Reconcile the branches' data by hand.\n\n\
                  Output: --output table (default), simple (tab-separated, no header) or \
                  json (one record per line, with its `state`).",
    after_help = "Examples:\n  \
                  baton 2pc list --open\n  \
                  baton 2pc list --state heuristic --namespace payments\n  \
                  baton 2pc show 018f3a5c7b2e4d1a9c0b8e7f6a5d4c3b\n  \
                  baton 2pc show bt1:payments:018f3a5c7b2e4d1a9c0b8e7f6a5d4c3b:pg-ledger  \
                  # a GID from pg_prepared_xacts"
)]
pub struct TwoPcArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The namespace the coordinators and the Recoverer use (it is also the second part of
    /// every GID: `bt1:<namespace>:…`).
    #[arg(
        long,
        short = 'n',
        default_value = "default",
        env = "BATON_TXN_NAMESPACE",
        global = true
    )]
    pub namespace: String,
    #[command(subcommand)]
    pub command: TwoPcCommand,
}

#[derive(Subcommand, Debug)]
pub enum TwoPcCommand {
    List(ListArgs),
    Show(ShowArgs),
}

#[derive(Args, Debug)]
#[command(about = "List transactions, newest first, with their state, decision and branches")]
pub struct ListArgs {
    /// Only transactions in this state: preparing, committing, aborting, committed, aborted,
    /// heuristic.
    #[arg(long)]
    pub state: Option<String>,
    /// Only transactions that are not finished (preparing, committing, aborting).
    #[arg(long, conflicts_with = "state")]
    pub open: bool,
    /// At most this many transactions. Finished ones are looked for among the newest this
    /// many; unfinished ones (`--open`, `--state preparing|committing|aborting`) are found
    /// however old, since the log keeps a set of them.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
}

#[derive(Args, Debug)]
#[command(
    about = "Show one transaction: intent, decision, and every branch's state, attempts and last error (outputs with -o json)"
)]
pub struct ShowArgs {
    /// The transaction's id (32 hex digits, as `list` prints it), or the GID of one of its
    /// branches as a database shows it (`bt1:<namespace>:<id>:<branch>`).
    pub id: String,
}

/// Runs `baton 2pc …`; returns the process exit status.
pub async fn run(args: TwoPcArgs) -> i32 {
    let name = match &args.command {
        TwoPcCommand::List(_) => "2pc list",
        TwoPcCommand::Show(_) => "2pc show",
    };
    finish(name, run_inner(args).await)
}

const STATES: [&str; 6] = [
    "preparing",
    "committing",
    "aborting",
    "committed",
    "aborted",
    "heuristic",
];

async fn run_inner(args: TwoPcArgs) -> Result<i32> {
    let format = args.client.output;
    // Check what can be checked before connecting, so a typo is not reported as a
    // connection problem.
    let target = match &args.command {
        TwoPcCommand::Show(a) => Some(parse_target(&a.id, &args.namespace)?),
        TwoPcCommand::List(a) => {
            if let Some(state) = &a.state {
                if !STATES.contains(&state.as_str()) {
                    return Err(anyhow!(
                        "unknown state {state:?}; use one of {}",
                        STATES.join(", ")
                    ));
                }
            }
            None
        }
    };
    let client = connect(&args.client).await?;
    let log = BatonDecisionLog::new(&client, &args.namespace).map_err(|e| anyhow!("{e}"))?;
    let now = now_ms();
    match args.command {
        TwoPcCommand::List(a) => {
            let limit = a.limit as usize;
            let unfinished_only = a.open || a.state.as_deref().is_some_and(is_unfinished_name);
            let mut txs = log.list(limit).await.map_err(|e| anyhow!("{e}"))?;
            if unfinished_only {
                // The open set is complete, however old its transactions; the newest
                // `limit` may add one the open set lacks (an in-doubt branch the log had no
                // intent for, decided by the Recoverer but not finished).
                let open = log.open().await.map_err(|e| anyhow!("{e}"))?;
                txs.extend(open);
                txs.sort_by_key(|t| std::cmp::Reverse(t.tx));
                txs.dedup_by_key(|t| t.tx);
            }
            if let Some(state) = &a.state {
                txs.retain(|t| state_name(t.state()) == state);
            }
            if a.open {
                txs.retain(|t| is_unfinished(t.state()));
            }
            let matched = txs.len();
            txs.truncate(limit);
            let mut out = render_list(&txs, now, format);
            if format == Format::Table && matched > txs.len() {
                out.push_str(&format!(
                    "(showing {} of {matched}; raise --limit)\n",
                    txs.len()
                ));
            }
            emit(&out);
        }
        TwoPcCommand::Show(_) => {
            let tx = target.expect("parsed above");
            let rec = log
                .get(tx)
                .await
                .map_err(|e| anyhow!("{e}"))?
                .ok_or_else(|| {
                    anyhow!(
                        "no transaction {tx} in namespace {} (wrong --namespace?)",
                        args.namespace
                    )
                })?;
            emit(&render_show(&rec, &args.namespace, now, format));
        }
    }
    Ok(0)
}

/// The transaction `show` is about: an id, or a branch's GID (which must be of `namespace`,
/// so the GID and the log read cannot silently disagree).
fn parse_target(text: &str, namespace: &str) -> Result<TxId> {
    if text.contains(':') {
        let gid: Gid = text.parse().map_err(|e| anyhow!("{e}"))?;
        if gid.namespace() != namespace {
            return Err(anyhow!(
                "GID {text} belongs to namespace {}; pass --namespace {}",
                gid.namespace(),
                gid.namespace()
            ));
        }
        return Ok(gid.tx());
    }
    text.parse().map_err(|e| anyhow!("{e}"))
}

pub(crate) fn state_name(s: TxState) -> &'static str {
    match s {
        TxState::Preparing => "preparing",
        TxState::Committing => "committing",
        TxState::Aborting => "aborting",
        TxState::Committed => "committed",
        TxState::Aborted => "aborted",
        TxState::Heuristic => "heuristic",
    }
}

fn is_unfinished(s: TxState) -> bool {
    matches!(
        s,
        TxState::Preparing | TxState::Committing | TxState::Aborting
    )
}

fn is_unfinished_name(s: &str) -> bool {
    matches!(s, "preparing" | "committing" | "aborting")
}

fn branch_state_name(s: BranchState) -> &'static str {
    match s {
        BranchState::Pending => "pending",
        BranchState::Committed => "committed",
        BranchState::RolledBack => "rolled_back",
        BranchState::HeuristicRollback => "heuristic_rollback",
        BranchState::HeuristicCommit => "heuristic_commit",
    }
}

/// When the transaction began: its intent's time, or (no intent: a prepared branch the log
/// never had an intent for) the time in its id.
pub(crate) fn created_ms(rec: &TxRecord) -> u64 {
    rec.intent
        .as_ref()
        .map_or_else(|| rec.tx.created_ms(), |i| i.created_ms)
}

/// `(final, total)` branches.
pub(crate) fn progress(rec: &TxRecord) -> (usize, usize) {
    let ids = rec.branch_ids();
    let done = ids
        .iter()
        .filter(|b| rec.branches.get(*b).is_some_and(|r| r.state.is_final()))
        .count();
    (done, ids.len())
}

fn branches_cell(rec: &TxRecord) -> String {
    let (done, total) = progress(rec);
    if rec.decision.is_some() && done < total {
        format!("{done}/{total} final")
    } else {
        total.to_string()
    }
}

/// The deadline as it matters: only an undecided transaction has one that is still running.
fn deadline_cell(rec: &TxRecord, now: u64) -> String {
    match (&rec.intent, rec.state()) {
        (Some(i), TxState::Preparing) if now < i.deadline_ms => {
            format!("{} left", span(i.deadline_ms - now))
        }
        (Some(i), TxState::Preparing) => format!("passed {} ago", span(now - i.deadline_ms)),
        (None, TxState::Preparing) => "none (no intent)".into(),
        _ => "-".into(),
    }
}

fn coordinator(rec: &TxRecord) -> String {
    rec.intent
        .as_ref()
        .map_or_else(|| "- (no intent)".into(), |i| i.coordinator.clone())
}

/// The record as JSON with its `state` added (the state is derived, not stored).
fn record_json(rec: &TxRecord) -> Value {
    let mut v = serde_json::to_value(rec).expect("records encode");
    v["state"] = Value::String(state_name(rec.state()).into());
    v
}

fn render_list(txs: &[TxRecord], now: u64, format: Format) -> String {
    match format {
        Format::Json => txs
            .iter()
            .map(|t| record_json(t).to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        Format::Simple => txs
            .iter()
            .map(|t| {
                let (done, total) = progress(t);
                format!(
                    "{}\t{}\t{}\t{done}/{total}\t{}\t{}\t{}\n",
                    t.tx,
                    state_name(t.state()),
                    t.decision
                        .as_ref()
                        .map_or("-".into(), |d| d.decision.to_string()),
                    utc(created_ms(t)),
                    t.intent.as_ref().map_or("-".into(), |i| utc(i.deadline_ms)),
                    coordinator(t)
                )
            })
            .collect(),
        Format::Table => {
            if txs.is_empty() {
                return "no transactions".into();
            }
            let mut t = Table::new(&[
                "ID",
                "STATE",
                "DECISION",
                "BRANCHES",
                "CREATED",
                "AGE",
                "DEADLINE",
                "COORDINATOR",
            ]);
            for tx in txs {
                let created = created_ms(tx);
                t.row(vec![
                    tx.tx.to_string(),
                    state_name(tx.state()).into(),
                    tx.decision
                        .as_ref()
                        .map_or("-".into(), |d| d.decision.to_string()),
                    branches_cell(tx),
                    utc(created),
                    span(now.saturating_sub(created)),
                    deadline_cell(tx, now),
                    coordinator(tx),
                ]);
            }
            t.render()
        }
    }
}

/// What the operator should make of the state, for `show`'s table.
fn advice(rec: &TxRecord, now: u64) -> Option<String> {
    match rec.state() {
        TxState::Preparing => match &rec.intent {
            Some(i) if now < i.deadline_ms => Some(
                "undecided; its coordinator is still within its deadline and may commit or \
                 abort it"
                    .into(),
            ),
            _ => Some(
                "undecided past its deadline: the Recoverer aborts it on its next pass (if it \
                 stays, check that a Recoverer runs for this namespace)"
                    .into(),
            ),
        },
        TxState::Committing | TxState::Aborting => Some(
            "decided; the Recoverer finishes the branches not final yet (their last errors \
             are below)"
                .into(),
        ),
        _ => None,
    }
}

/// The line `show` prints for a branch that ended against the decision. Loud on purpose:
/// this is the one outcome no process will ever fix.
fn heuristic_warning(branch: &str, gid: &str, r: &BranchRecord) -> String {
    let (found, decided) = match r.state {
        BranchState::HeuristicRollback => ("rolled back", "commit"),
        _ => ("committed", "abort"),
    };
    format!(
        "HEURISTIC: branch {branch} ({gid}) was found {found} although the decision was \
         {decided}: someone finished the prepared branch by hand. Atomicity is broken for \
         this transaction and nothing will retry it; a human must look and reconcile the \
         branches' data by hand.\n"
    )
}

fn render_show(rec: &TxRecord, namespace: &str, now: u64, format: Format) -> String {
    let gid_of = |b: &baton_txn::twopc::BranchId| -> String {
        rec.intent
            .as_ref()
            .and_then(|i| i.branches.iter().find(|ib| &ib.branch == b))
            .map_or_else(
                || Gid::new(namespace, rec.tx, b.clone()).to_string(),
                |ib| ib.gid.clone(),
            )
    };
    match format {
        Format::Json => record_json(rec).to_string(),
        Format::Simple => {
            // The transaction, then one line per branch: name, GID, state, attempts,
            // updated, last error.
            let mut out = format!(
                "{}\t{}\t{}\n",
                rec.tx,
                state_name(rec.state()),
                rec.decision
                    .as_ref()
                    .map_or("-".into(), |d| d.decision.to_string())
            );
            for b in rec.branch_ids() {
                let r = rec.branches.get(&b);
                out.push_str(&format!(
                    "{b}\t{}\t{}\t{}\t{}\t{}\n",
                    gid_of(&b),
                    r.map_or("none", |r| branch_state_name(r.state)),
                    r.map_or(0, |r| r.attempts),
                    r.map_or("-".into(), |r| utc(r.updated_ms)),
                    one_line(r.and_then(|r| r.last_error.as_deref()))
                ));
            }
            out
        }
        Format::Table => {
            let state = rec.state();
            let mut head = Table::headless();
            head.row(vec!["transaction".into(), rec.tx.to_string()]);
            head.row(vec!["namespace".into(), namespace.into()]);
            head.row(vec!["state".into(), state_name(state).into()]);
            if let Some(a) = advice(rec, now) {
                head.row(vec!["".into(), a]);
            }
            head.row(vec![
                "open".into(),
                if rec.open {
                    "yes (the Recoverer still works on it)".into()
                } else {
                    "no".into()
                },
            ]);
            let created = created_ms(rec);
            match &rec.intent {
                Some(i) => {
                    head.row(vec!["coordinator".into(), i.coordinator.clone()]);
                    head.row(vec![
                        "created".into(),
                        format!(
                            "{} ({} ago)",
                            utc(created),
                            span(now.saturating_sub(created))
                        ),
                    ]);
                    let deadline = if state == TxState::Preparing {
                        format!("{} ({})", utc(i.deadline_ms), deadline_cell(rec, now))
                    } else {
                        utc(i.deadline_ms)
                    };
                    head.row(vec!["deadline".into(), deadline]);
                }
                None => head.row(vec![
                    "intent".into(),
                    format!(
                        "none: a prepared branch the log had no intent for (id created {})",
                        utc(created)
                    ),
                ]),
            }
            match &rec.decision {
                Some(d) => {
                    head.row(vec!["decision".into(), d.decision.to_string()]);
                    head.row(vec!["decided by".into(), one_line(Some(&d.by))]);
                    head.row(vec![
                        "decided".into(),
                        format!(
                            "{} ({} after the intent)",
                            utc(d.decided_ms),
                            span(d.decided_ms.saturating_sub(created))
                        ),
                    ]);
                }
                None => head.row(vec!["decision".into(), "none yet".into()]),
            }
            let mut branches = Table::new(&[
                "BRANCH",
                "GID",
                "STATE",
                "ATTEMPTS",
                "UPDATED",
                "LAST ERROR",
            ]);
            let mut warnings = String::new();
            for b in rec.branch_ids() {
                let gid = gid_of(&b);
                let r = rec.branches.get(&b);
                branches.row(vec![
                    b.to_string(),
                    gid.clone(),
                    r.map_or("-".into(), |r| branch_state_name(r.state).to_string()),
                    r.map_or("0".into(), |r| r.attempts.to_string()),
                    r.map_or("-".into(), |r| utc(r.updated_ms)),
                    cut(&one_line(r.and_then(|r| r.last_error.as_deref())), 60),
                ]);
                if let Some(r) = r.filter(|r| r.state.is_heuristic()) {
                    warnings.push_str(&heuristic_warning(b.as_str(), &gid, r));
                }
            }
            let mut out = format!("{}\n{}", head.render(), branches.render());
            if !warnings.is_empty() {
                out.push('\n');
                out.push_str(&warnings);
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_txn::twopc::{BranchId, Decision, DecisionRecord, Intent, IntentBranch};
    use std::collections::BTreeMap;

    fn record(decision: Option<Decision>, states: &[BranchState]) -> TxRecord {
        let tx: TxId = "018f3a5c7b2e4d1a9c0b8e7f6a5d4c3b".parse().unwrap();
        let ids: Vec<BranchId> = (0..states.len())
            .map(|i| BranchId::new(format!("b{i}")).unwrap())
            .collect();
        TxRecord {
            tx,
            intent: Some(Intent {
                tx,
                branches: ids
                    .iter()
                    .map(|b| IntentBranch {
                        branch: b.clone(),
                        gid: Gid::new("ns", tx, b.clone()).to_string(),
                    })
                    .collect(),
                created_ms: 1_000_000,
                deadline_ms: 1_030_000,
                coordinator: "coordinator host/1".into(),
            }),
            decision: decision.map(|decision| DecisionRecord {
                decision,
                decided_ms: 1_000_250,
                by: "coordinator host/1: every branch voted yes".into(),
            }),
            branches: ids
                .into_iter()
                .zip(states)
                .filter(|(_, s)| **s != BranchState::Pending)
                .map(|(b, s)| {
                    (
                        b,
                        BranchRecord {
                            state: *s,
                            attempts: 1,
                            last_error: None,
                            updated_ms: 1_000_300,
                        },
                    )
                })
                .collect::<BTreeMap<_, _>>(),
            open: true,
        }
    }

    #[test]
    fn the_deadline_counts_only_while_undecided() {
        let rec = record(None, &[BranchState::Pending, BranchState::Pending]);
        assert_eq!(deadline_cell(&rec, 1_010_000), "20s left");
        assert_eq!(deadline_cell(&rec, 1_090_000), "passed 1m00s ago");
        assert_eq!(branches_cell(&rec), "2");
        let rec = record(
            Some(Decision::Commit),
            &[BranchState::Committed, BranchState::Pending],
        );
        assert_eq!(rec.state(), TxState::Committing);
        assert_eq!(deadline_cell(&rec, 1_090_000), "-");
        assert_eq!(branches_cell(&rec), "1/2 final");
    }

    #[test]
    fn heuristic_branches_are_flagged_and_json_carries_the_state() {
        let rec = record(
            Some(Decision::Commit),
            &[BranchState::Committed, BranchState::HeuristicRollback],
        );
        let out = render_show(&rec, "ns", 2_000_000, Format::Table);
        let warning = out
            .lines()
            .find(|l| l.starts_with("HEURISTIC: branch b1"))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(warning.contains("rolled back although the decision was commit"));
        assert!(warning.contains("a human must look"));
        assert!(out.contains("(250ms after the intent)"), "{out}");
        assert!(!out.contains("HEURISTIC: branch b0"));
        let v: Value = serde_json::from_str(&render_show(&rec, "ns", 0, Format::Json)).unwrap();
        assert_eq!(v["state"], "heuristic");
        assert_eq!(v["branches"]["b1"]["state"], "heuristic_rollback");
    }

    #[test]
    fn show_takes_an_id_or_a_gid_of_the_namespace() {
        let id = "018f3a5c7b2e4d1a9c0b8e7f6a5d4c3b";
        assert_eq!(parse_target(id, "ns").unwrap().to_string(), id);
        let gid = format!("bt1:ns:{id}:pg-a");
        assert_eq!(parse_target(&gid, "ns").unwrap().to_string(), id);
        let err = parse_target(&gid, "other").unwrap_err().to_string();
        assert!(err.contains("--namespace ns"), "{err}");
        assert!(parse_target("nope", "ns").is_err());
    }
}
