//! `baton kv get|put|del|watch|txn`: the key-value API from the command line, on
//! `baton-client` (so it gets the client's endpoint failover and per-call deadlines, and a
//! watch that resumes after a reconnect without losing or repeating events).
//!
//! Flags follow etcdctl's where etcdctl has one (`--prefix`, `--from-key`, `--rev`,
//! `--limit`, `--keys-only`, `--sort-by`, `--order`, `--prev-kv`, `--lease`), so muscle
//! memory carries over; the output formats are described in [`super::output`].

use std::io::Read;

use anyhow::{anyhow, Context, Result};
use baton_client::proto::etcdserverpb::response_op::Response as OpResponse;
use baton_client::{
    Client, DeleteRangeResponse, EventKind, PutResponse, RangeResponse, TxnResponse, WatchEvent,
    WatchOptions,
};
use clap::{Args, Subcommand};
use futures::StreamExt;
use serde_json::{json, Map, Value};

use super::client::{connect, describe, finish, ClientArgs};
use super::ops::{DelArgs, GetArgs, PutArgs, FROM_KEY_END};
use super::output::{emit, kv_json, kv_simple, kv_table, plural, short, text, Format};
use super::signals::Signals;

#[derive(Args, Debug)]
#[command(
    about = "Read, write, delete, watch and transact on keys",
    long_about = "Read, write, delete, watch and transact on keys (etcd's KV and Watch API; \
                  flags follow etcdctl's).\n\n\
                  Output: --output table (default, for people), simple (tab-separated, no \
                  header, for shell scripts) or json (one object per line, for programs).",
    after_help = "Examples:\n  \
                  baton kv put greeting hello\n  \
                  baton kv get greet --prefix\n  \
                  baton kv get '' --prefix --keys-only -o simple\n  \
                  baton kv watch jobs/ --prefix\n  \
                  printf 'mod(\"cfg\") = \"0\"\\n\\nput cfg v1\\n\\nget cfg\\n' | baton kv txn"
)]
pub struct KvArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: KvCommand,
}

#[derive(Subcommand, Debug)]
pub enum KvCommand {
    Get(GetArgs),
    Put(PutArgs),
    #[command(visible_alias = "delete")]
    Del(DelArgs),
    Watch(WatchArgs),
    Txn(TxnArgs),
}

#[derive(Args, Debug, Clone)]
#[command(
    about = "Print changes to a key, range or prefix as they happen, until Ctrl-C",
    long_about = "Print every change (PUT or DELETE) to a key, a range [KEY, RANGE_END), a \
                  prefix, or every key from KEY on, as it happens, until Ctrl-C or SIGTERM \
                  (exit status 0). With --rev, start from that revision, replaying history \
                  first. If the connection breaks the watch resumes after the last printed \
                  event (on another endpoint if needed): no event is lost or repeated unless \
                  the history it needs was compacted (then it fails).\n\n\
                  --output json prints one JSON object per event (JSON Lines)."
)]
pub struct WatchArgs {
    pub key: String,
    /// End of the range, exclusive.
    #[arg(conflicts_with_all = ["prefix", "from_key"])]
    pub range_end: Option<String>,
    /// Every key that starts with KEY.
    #[arg(long, conflicts_with = "from_key")]
    pub prefix: bool,
    /// Every key greater than or equal to KEY.
    #[arg(long)]
    pub from_key: bool,
    /// Start at this revision (inclusive), replaying history first (0: from now).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub rev: i64,
    /// Also print each key's previous value.
    #[arg(long)]
    pub prev_kv: bool,
}

#[derive(Args, Debug, Clone)]
#[command(
    about = "Run a transaction read from stdin (etcdctl's format, or JSON)",
    long_about = "Run one transaction, read from stdin: if every comparison holds, the \
                  success requests run, otherwise the failure requests; all of it as one \
                  revision. Exit status 0 either way (the first line of output says SUCCESS \
                  or FAILURE).\n\n\
                  etcdctl's format: three blocks separated by an empty line: comparisons, \
                  then success requests, then failure requests, one per line. A comparison \
                  is TARGET(\"KEY\") OP \"VALUE\" with TARGET one of value (val), version \
                  (ver), create (c), mod (m), lease (hex id) and OP one of = != < >. A \
                  request is a `baton kv` command line without `baton kv`: get KEY [flags], \
                  put KEY VALUE [--lease HEX], del KEY [flags]; quote words with spaces. \
                  Lines starting with # are ignored.\n\n\
                  JSON (when the input starts with `{`): {\"compare\": [{\"target\": \
                  \"mod\", \"key\": \"k\", \"op\": \"=\", \"value\": 0, \"prefix\": false}], \
                  \"success\": [{\"put\": {\"key\": \"k\", \"value\": \"v\", \"lease\": \
                  \"HEX\"}}, {\"get\": {\"key\": \"k\", \"prefix\": true}}, {\"delete\": \
                  {\"key\": \"k\"}}], \"failure\": [...]}; get and delete take the flags of \
                  `kv get`/`kv del` as fields (range_end, prefix, from_key, keys_only, \
                  count_only, limit, rev, prev_kv).",
    after_help = "Example (create `cfg` only if it does not exist, else read it):\n  \
                  printf '%s\\n' 'create(\"cfg\") = \"0\"' '' 'put cfg v1' '' 'get cfg' | baton kv txn"
)]
pub struct TxnArgs {}

/// Runs `baton kv …`; returns the process exit status.
pub async fn run(args: KvArgs) -> i32 {
    let name = match &args.command {
        KvCommand::Get(_) => "kv get",
        KvCommand::Put(_) => "kv put",
        KvCommand::Del(_) => "kv del",
        KvCommand::Watch(_) => "kv watch",
        KvCommand::Txn(_) => "kv txn",
    };
    finish(name, run_inner(args).await)
}

async fn run_inner(args: KvArgs) -> Result<i32> {
    let format = args.client.output;
    // Read the transaction before connecting: a typo is reported without a server.
    let txn = match &args.command {
        KvCommand::Txn(_) => {
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .context("reading the transaction from stdin")?;
            Some(super::txn::parse(&input)?)
        }
        _ => None,
    };
    let client = connect(&args.client).await?;
    match args.command {
        KvCommand::Get(a) => {
            let resp = client
                .get(a.key.clone(), a.options())
                .await
                .map_err(describe)?;
            emit(&render_range(&resp, !a.keys_only, a.count_only, format));
        }
        KvCommand::Put(a) => {
            let opts = a.options();
            let value = match a.value {
                Some(v) => v.into_bytes(),
                None => {
                    let mut v = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut v)
                        .context("reading the value from stdin")?;
                    v
                }
            };
            let resp = client.put(a.key, value, opts).await.map_err(describe)?;
            emit(&render_put(&resp, format));
        }
        KvCommand::Del(a) => {
            let resp = client
                .delete(a.key.clone(), a.options())
                .await
                .map_err(describe)?;
            emit(&render_delete(&resp, a.prev_kv, format));
        }
        KvCommand::Watch(a) => return watch(&client, a, format).await,
        KvCommand::Txn(_) => {
            let txn = txn.expect("parsed above");
            let resp = client.txn(txn).await.map_err(describe)?;
            emit(&render_txn(&resp, format));
        }
    }
    Ok(0)
}

async fn watch(client: &Client, a: WatchArgs, format: Format) -> Result<i32> {
    let mut signals = Signals::install()?;
    let mut opts = WatchOptions::new().with_start_revision(a.rev);
    if a.prefix {
        opts = opts.with_prefix();
    } else if a.from_key {
        opts = opts.with_range_end(FROM_KEY_END);
    } else if let Some(end) = &a.range_end {
        opts = opts.with_range_end(end.as_bytes());
    }
    if a.prev_kv {
        opts = opts.with_prev_kv();
    }
    let mut events = client.watch(a.key.clone(), opts);
    if format == Format::Table {
        emit(&event_line(
            "TYPE",
            "REVISION",
            "KEY",
            "VALUE",
            a.prev_kv.then_some("PREVIOUS"),
        ));
    }
    loop {
        tokio::select! {
            // Ctrl-C is how a watch is meant to end: not an error.
            _ = signals.recv() => return Ok(0),
            ev = events.next() => match ev {
                Some(Ok(ev)) => emit(&render_event(&ev, a.prev_kv, format)),
                Some(Err(e)) => return Err(describe(e)),
                None => return Err(anyhow!("the watch ended unexpectedly")),
            },
        }
    }
}

/// One watch event in the table layout: the type and revision in fixed-width columns (the
/// widths of a stream cannot be known in advance), key and value after them.
fn event_line(kind: &str, rev: &str, key: &str, value: &str, prev: Option<&str>) -> String {
    let mut line = format!("{kind:<6}  {rev:<8}  {key}  {value}");
    if let Some(p) = prev {
        line.push_str("  ");
        line.push_str(p);
    }
    line.trim_end().to_string()
}

fn kind_name(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Put => "PUT",
        EventKind::Delete => "DELETE",
    }
}

fn render_event(ev: &WatchEvent, with_prev: bool, format: Format) -> String {
    let kind = kind_name(ev.kind);
    let prev = ev.prev_kv.as_ref().map(|p| p.value.as_slice());
    match format {
        Format::Table => event_line(
            kind,
            &ev.revision().to_string(),
            &text(&ev.kv.key),
            // A deletion has no value; an empty one is shown as such, so the columns
            // after it stay put.
            &match ev.kind {
                EventKind::Delete => "-".to_string(),
                EventKind::Put if ev.kv.value.is_empty() => "\"\"".to_string(),
                EventKind::Put => short(&ev.kv.value),
            },
            with_prev
                .then(|| prev.map_or("-".to_string(), short))
                .as_deref(),
        ),
        Format::Simple => {
            let mut fields = vec![
                kind.to_string(),
                ev.revision().to_string(),
                text(&ev.kv.key),
                text(&ev.kv.value),
            ];
            if with_prev {
                fields.push(prev.map_or(String::new(), text));
            }
            fields.join("\t")
        }
        Format::Json => {
            let mut m = Map::new();
            m.insert("type".into(), json!(kind));
            m.insert("revision".into(), json!(ev.revision()));
            m.insert("kv".into(), kv_json(&ev.kv, ev.kind == EventKind::Put));
            if with_prev {
                m.insert(
                    "prev_kv".into(),
                    ev.prev_kv
                        .as_ref()
                        .map_or(Value::Null, |p| kv_json(p, true)),
                );
            }
            Value::Object(m).to_string()
        }
    }
}

fn revision_of(header: &Option<baton_client::proto::etcdserverpb::ResponseHeader>) -> i64 {
    header.as_ref().map_or(0, |h| h.revision)
}

fn range_json(resp: &RangeResponse, with_value: bool) -> Value {
    json!({
        "revision": revision_of(&resp.header),
        "count": resp.count,
        "more": resp.more,
        "kvs": resp.kvs.iter().map(|kv| kv_json(kv, with_value)).collect::<Vec<_>>(),
    })
}

/// A read's result. Tables end with a line saying how many keys there were at which
/// revision (the revision to pass to `--rev` for a consistent follow-up read), and whether
/// `--limit` cut the list.
fn render_range(
    resp: &RangeResponse,
    with_value: bool,
    count_only: bool,
    format: Format,
) -> String {
    let revision = revision_of(&resp.header);
    match format {
        Format::Json => range_json(resp, with_value).to_string(),
        Format::Simple if count_only => resp.count.to_string(),
        Format::Simple => kv_simple(&resp.kvs, with_value),
        Format::Table => {
            let count = resp.count.max(0) as u64;
            let summary = if resp.more || (resp.kvs.len() as u64) < count && !count_only {
                format!(
                    "({} of {} at revision {revision}; raise --limit to see more)",
                    resp.kvs.len(),
                    plural(count, "key", "keys")
                )
            } else {
                format!("({} at revision {revision})", plural(count, "key", "keys"))
            };
            if resp.kvs.is_empty() {
                return summary;
            }
            format!("{}{summary}", kv_table(&resp.kvs, with_value).render())
        }
    }
}

fn put_json(resp: &PutResponse) -> Value {
    json!({ "revision": revision_of(&resp.header) })
}

fn render_put(resp: &PutResponse, format: Format) -> String {
    let revision = revision_of(&resp.header);
    match format {
        Format::Table => format!("OK (revision {revision})"),
        Format::Simple => revision.to_string(),
        Format::Json => put_json(resp).to_string(),
    }
}

fn delete_json(resp: &DeleteRangeResponse, with_prev: bool) -> Value {
    let mut m = Map::new();
    m.insert("revision".into(), json!(revision_of(&resp.header)));
    m.insert("deleted".into(), json!(resp.deleted));
    if with_prev {
        m.insert(
            "prev_kvs".into(),
            resp.prev_kvs.iter().map(|kv| kv_json(kv, true)).collect(),
        );
    }
    Value::Object(m)
}

fn render_delete(resp: &DeleteRangeResponse, with_prev: bool, format: Format) -> String {
    let revision = revision_of(&resp.header);
    match format {
        Format::Table => {
            let mut out = format!(
                "deleted {} (revision {revision})",
                plural(resp.deleted.max(0) as u64, "key", "keys")
            );
            if with_prev && !resp.prev_kvs.is_empty() {
                out.push('\n');
                out.push_str(&kv_table(&resp.prev_kvs, true).render());
            }
            out
        }
        Format::Simple => {
            let mut out = format!("{}\n", resp.deleted);
            if with_prev {
                out.push_str(&kv_simple(&resp.prev_kvs, true));
            }
            out
        }
        Format::Json => delete_json(resp, with_prev).to_string(),
    }
}

fn txn_json(resp: &TxnResponse) -> Value {
    let responses: Vec<Value> = resp
        .responses
        .iter()
        .filter_map(|r| r.response.as_ref())
        .map(|r| match r {
            OpResponse::ResponseRange(g) => json!({ "get": range_json(g, true) }),
            OpResponse::ResponsePut(p) => json!({ "put": put_json(p) }),
            OpResponse::ResponseDeleteRange(d) => {
                json!({ "delete": delete_json(d, !d.prev_kvs.is_empty()) })
            }
            OpResponse::ResponseTxn(t) => json!({ "txn": txn_json(t) }),
        })
        .collect();
    json!({
        "succeeded": resp.succeeded,
        "revision": revision_of(&resp.header),
        "responses": responses,
    })
}

/// A transaction's result: SUCCESS or FAILURE (which branch ran), then the result of each
/// request of that branch in order, each as its own command would print it.
fn render_txn(resp: &TxnResponse, format: Format) -> String {
    if format == Format::Json {
        return txn_json(resp).to_string();
    }
    let outcome = if resp.succeeded { "SUCCESS" } else { "FAILURE" };
    let mut blocks = vec![if format == Format::Table {
        format!("{outcome} (revision {})", revision_of(&resp.header))
    } else {
        outcome.to_string()
    }];
    for r in resp.responses.iter().filter_map(|r| r.response.as_ref()) {
        let block = match r {
            OpResponse::ResponseRange(g) => {
                let count_only = g.kvs.is_empty() && g.count > 0;
                render_range(g, true, count_only, format)
            }
            OpResponse::ResponsePut(p) => render_put(p, format),
            OpResponse::ResponseDeleteRange(d) => render_delete(d, !d.prev_kvs.is_empty(), format),
            OpResponse::ResponseTxn(t) => render_txn(t, format),
        };
        blocks.push(block.trim_end().to_string());
    }
    let separator = if format == Format::Table {
        "\n\n"
    } else {
        "\n"
    };
    blocks.join(separator)
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_client::proto::etcdserverpb::ResponseHeader;
    use baton_client::KeyValue;

    fn header(revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            ..Default::default()
        })
    }

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.into(),
            create_revision: 2,
            mod_revision: 3,
            version: 2,
            lease: 0,
        }
    }

    #[test]
    fn a_limited_read_says_so() {
        let resp = RangeResponse {
            header: header(9),
            kvs: vec![kv("a", "1")],
            more: true,
            count: 3,
        };
        let t = render_range(&resp, true, false, Format::Table);
        assert!(
            t.ends_with("(1 of 3 keys at revision 9; raise --limit to see more)"),
            "{t}"
        );
        assert_eq!(render_range(&resp, true, false, Format::Simple), "a\t1\n");
    }

    #[test]
    fn watch_lines_keep_type_and_revision_aligned() {
        assert_eq!(
            event_line("PUT", "12", "k", "v", None),
            "PUT     12        k  v"
        );
        assert_eq!(
            event_line("DELETE", "13", "k", "", None),
            "DELETE  13        k"
        );
    }
}
