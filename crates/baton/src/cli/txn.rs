//! Reading the transaction of `baton kv txn` from stdin, in one of two forms:
//!
//! - **etcdctl's format** (what `etcdctl txn` reads from a pipe), so existing scripts and
//!   habits carry over: three blocks separated by an empty line — comparisons, success
//!   requests, failure requests — one item per line. A comparison is
//!   `TARGET("KEY") OP "VALUE"`; a request is a `baton kv` command line without the
//!   `baton kv` (`put k v --lease 1f`, `get k --prefix`, `del k`), parsed with the very
//!   same flag definitions, so a flag means the same in a txn as on the command line.
//! - **JSON**, when the input starts with `{`: easier to generate from a program and
//!   unambiguous about quoting (see the `kv txn --help` text for the shape).

use anyhow::{anyhow, bail, Result};
use baton_client::{Compare, CompareOp, Op, Txn};
use clap::Parser;
use serde::Deserialize;

use super::client::parse_lease;
use super::ops::{DelArgs, GetArgs, PutArgs};

/// Parses a transaction in either form.
pub fn parse(input: &str) -> Result<Txn> {
    if input.trim_start().starts_with('{') {
        parse_json(input)
    } else {
        parse_etcdctl(input)
    }
}

/// One request line of a txn: the `kv` subcommands that make sense inside one.
#[derive(Parser, Debug)]
#[command(no_binary_name = true)]
enum RequestLine {
    Get(GetArgs),
    Put(PutArgs),
    #[command(alias = "delete")]
    Del(DelArgs),
}

fn parse_etcdctl(input: &str) -> Result<Txn> {
    let mut compares = Vec::new();
    let mut branches: [Vec<Op>; 2] = [Vec::new(), Vec::new()];
    let mut section = 0;
    for (i, raw) in input.lines().enumerate() {
        let line = raw.trim();
        let at = |e: String| anyhow!("line {}: {e}", i + 1);
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            // As in etcdctl: every empty line ends the current block.
            section += 1;
            continue;
        }
        match section {
            0 => compares.push(parse_compare(line).map_err(at)?),
            1 | 2 => branches[section - 1].push(parse_request(line).map_err(at)?),
            _ => {
                return Err(at(format!(
                    "unexpected {line:?} after the failure block (a transaction has three \
                     blocks: comparisons, success requests, failure requests)"
                )))
            }
        }
    }
    let [success, failure] = branches;
    Ok(Txn::new().when(compares).and_then(success).or_else(failure))
}

/// `TARGET("KEY") OP "VALUE"`, e.g. `mod("config") > "0"` or `value("k") = "v"`.
fn parse_compare(line: &str) -> Result<Compare, String> {
    let words = split_words(line)?;
    let malformed = || {
        format!(
            "malformed comparison {line:?}: expected TARGET(\"KEY\") OP \"VALUE\", e.g. \
             mod(\"k\") > \"0\""
        )
    };
    let [target_key, op, value] = words.as_slice() else {
        return Err(malformed());
    };
    let (target, key) = target_key
        .strip_suffix(')')
        .and_then(|t| t.split_once('('))
        .ok_or_else(malformed)?;
    compare(
        target,
        key.to_string(),
        op,
        CompareValue::Text(value.clone()),
        false,
    )
}

/// A comparison's right-hand side as written: text (etcdctl's format, JSON strings) or a
/// JSON number.
enum CompareValue {
    Text(String),
    Number(i64),
}

impl CompareValue {
    fn number(&self, what: &str) -> Result<i64, String> {
        match self {
            CompareValue::Number(n) => Ok(*n),
            CompareValue::Text(t) => t
                .trim()
                .parse()
                .map_err(|_| format!("{what} must be a number, not {t:?}")),
        }
    }
}

fn compare(
    target: &str,
    key: String,
    op: &str,
    value: CompareValue,
    prefix: bool,
) -> Result<Compare, String> {
    let op = match op {
        "=" | "==" => CompareOp::Equal,
        "!=" => CompareOp::NotEqual,
        "<" => CompareOp::Less,
        ">" => CompareOp::Greater,
        other => return Err(format!("unknown comparison {other:?} (use = != < >)")),
    };
    let c = match target.trim() {
        "val" | "value" => match value {
            CompareValue::Text(v) => Compare::value(key, op, v),
            CompareValue::Number(n) => Compare::value(key, op, n.to_string()),
        },
        "ver" | "version" => Compare::version(key, op, value.number("a version")?),
        "c" | "create" => Compare::create_revision(key, op, value.number("a revision")?),
        "m" | "mod" => Compare::mod_revision(key, op, value.number("a revision")?),
        "lease" => {
            let id = match value {
                CompareValue::Number(n) => n,
                CompareValue::Text(t) => parse_lease(&t)?,
            };
            Compare::lease(key, op, id)
        }
        other => {
            return Err(format!(
                "unknown comparison target {other:?} (use value, version, create, mod or lease)"
            ))
        }
    };
    Ok(if prefix { c.with_prefix() } else { c })
}

fn parse_request(line: &str) -> Result<Op, String> {
    let words = split_words(line)?;
    let request = RequestLine::try_parse_from(&words).map_err(|e| {
        // clap's first line says what is wrong; the rest is usage for a terminal.
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        format!(
            "{} (requests: get KEY [flags], put KEY VALUE [--lease HEX], del KEY [flags])",
            first.trim_start_matches("error: ")
        )
    })?;
    Ok(match request {
        RequestLine::Get(a) => Op::get(a.key.clone(), a.options()),
        RequestLine::Put(a) => {
            let value = a
                .value
                .clone()
                .ok_or_else(|| format!("put {}: no value (a txn cannot read stdin)", a.key))?;
            Op::put(a.key.clone(), value, a.options())
        }
        RequestLine::Del(a) => Op::delete(a.key.clone(), a.options()),
    })
}

/// Splits a line into words like a shell: blanks separate words, `"…"` (with `\"`, `\\`,
/// `\n`, `\t`, `\r`) and `'…'` (literal) quote, and quoted parts join the word they touch
/// (`--lease="1f"`, `val("my key")`).
fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        None => return Err(format!("unterminated \" in {line:?}")),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('n') => word.push('\n'),
                            Some('t') => word.push('\t'),
                            Some('r') => word.push('\r'),
                            Some(c @ ('"' | '\\')) => word.push(c),
                            Some(c) => {
                                return Err(format!(
                                    "unknown escape \\{c} in {line:?} (use \\\" \\\\ \\n \\t \\r)"
                                ))
                            }
                            None => return Err(format!("unterminated \" in {line:?}")),
                        },
                        Some(c) => word.push(c),
                    }
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        None => return Err(format!("unterminated ' in {line:?}")),
                        Some('\'') => break,
                        Some(c) => word.push(c),
                    }
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// The JSON form. Unknown fields are refused: a misspelt `"prefx": true` silently ignored
/// would turn a prefix delete into a single-key delete.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonTxn {
    #[serde(default, alias = "compares")]
    compare: Vec<JsonCompare>,
    #[serde(default)]
    success: Vec<JsonRequest>,
    #[serde(default)]
    failure: Vec<JsonRequest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonCompare {
    target: String,
    key: String,
    op: String,
    value: serde_json::Value,
    #[serde(default)]
    prefix: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum JsonRequest {
    Get(JsonGet),
    Put(JsonPut),
    #[serde(alias = "del")]
    Delete(JsonDelete),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonGet {
    key: String,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    prefix: bool,
    #[serde(default)]
    from_key: bool,
    #[serde(default)]
    keys_only: bool,
    #[serde(default)]
    count_only: bool,
    #[serde(default)]
    limit: i64,
    #[serde(default)]
    rev: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonPut {
    key: String,
    value: String,
    /// Hex, as everywhere else.
    #[serde(default)]
    lease: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDelete {
    key: String,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    prefix: bool,
    #[serde(default)]
    from_key: bool,
    #[serde(default)]
    prev_kv: bool,
}

fn parse_json(input: &str) -> Result<Txn> {
    let t: JsonTxn =
        serde_json::from_str(input).map_err(|e| anyhow!("the transaction JSON: {e}"))?;
    let mut compares = Vec::new();
    for (i, c) in t.compare.into_iter().enumerate() {
        let value = match c.value {
            serde_json::Value::String(s) => CompareValue::Text(s),
            serde_json::Value::Number(n) if n.is_i64() => {
                CompareValue::Number(n.as_i64().expect("checked"))
            }
            other => bail!("compare[{i}]: value must be a string or an integer, not {other}"),
        };
        compares.push(
            compare(&c.target, c.key, &c.op, value, c.prefix)
                .map_err(|e| anyhow!("compare[{i}]: {e}"))?,
        );
    }
    let ops = |list: Vec<JsonRequest>, branch: &str| -> Result<Vec<Op>> {
        list.into_iter()
            .enumerate()
            .map(|(i, r)| json_request(r).map_err(|e| anyhow!("{branch}[{i}]: {e}")))
            .collect()
    };
    let success = ops(t.success, "success")?;
    let failure = ops(t.failure, "failure")?;
    Ok(Txn::new().when(compares).and_then(success).or_else(failure))
}

/// Maps a JSON request onto the command-line flag structs, so both forms build requests
/// through the same code.
fn json_request(r: JsonRequest) -> Result<Op, String> {
    Ok(match r {
        JsonRequest::Get(g) => {
            if g.range_end.is_some() as u8 + g.prefix as u8 + g.from_key as u8 > 1 {
                return Err("use only one of range_end, prefix, from_key".into());
            }
            let a = GetArgs {
                key: g.key,
                range_end: g.range_end,
                prefix: g.prefix,
                from_key: g.from_key,
                rev: g.rev,
                limit: g.limit,
                keys_only: g.keys_only,
                count_only: g.count_only,
                sort_by: None,
                order: None,
            };
            Op::get(a.key.clone(), a.options())
        }
        JsonRequest::Put(p) => {
            let lease = p.lease.as_deref().map(parse_lease).transpose()?;
            let a = PutArgs {
                key: p.key,
                value: Some(p.value),
                lease,
            };
            Op::put(
                a.key.clone(),
                a.value.clone().unwrap_or_default(),
                a.options(),
            )
        }
        JsonRequest::Delete(d) => {
            if d.range_end.is_some() as u8 + d.prefix as u8 + d.from_key as u8 > 1 {
                return Err("use only one of range_end, prefix, from_key".into());
            }
            let a = DelArgs {
                key: d.key,
                range_end: d.range_end,
                prefix: d.prefix,
                from_key: d.from_key,
                prev_kv: d.prev_kv,
            };
            Op::delete(a.key.clone(), a.options())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_like_a_shell() {
        assert_eq!(
            split_words(r#"put "my key" 'a b' --lease="1f""#).unwrap(),
            ["put", "my key", "a b", "--lease=1f"]
        );
        assert_eq!(
            split_words(r#"val("k") = """#).unwrap(),
            ["val(k)", "=", ""]
        );
        assert_eq!(split_words(r#""a\"b\n""#).unwrap(), ["a\"b\n"]);
        assert!(split_words(r#"put "open"#).is_err());
    }

    #[test]
    fn etcdctl_format_reads_three_blocks() {
        let t = parse(
            "mod(\"k\") > \"0\"\nvalue(\"k\") = \"v\"\n\nput k w --lease 1f\nget k --prefix\n\n\
             del k\n",
        )
        .unwrap();
        let dbg = format!("{t:?}");
        assert_eq!(dbg.matches("Compare {").count(), 2, "{dbg}");
        assert!(dbg.contains("lease: 31"), "{dbg}");
        assert!(parse("mod(k) >\n").is_err());
        assert!(parse("size(\"k\") = \"1\"\n").is_err());
        let err = parse("\nfrob k\n").unwrap_err().to_string();
        assert!(err.starts_with("line 2:"), "{err}");
        assert!(parse("\n\n\nput a b\n").is_err(), "a fourth block");
    }

    #[test]
    fn json_form_refuses_unknown_fields() {
        let ok = parse(
            r#"{"compare": [{"target": "version", "key": "k", "op": "=", "value": 0}],
                "success": [{"put": {"key": "k", "value": "v"}}],
                "failure": [{"get": {"key": "k"}}, {"del": {"key": "k", "prefix": true}}]}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
        let err = parse(r#"{"success": [{"delete": {"key": "k", "prefx": true}}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("prefx"), "{err}");
        assert!(
            parse(r#"{"compare": [{"target": "mod", "key": "k", "op": "=", "value": "x"}]}"#)
                .is_err()
        );
    }
}
