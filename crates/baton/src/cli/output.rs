//! How the client commands (`baton kv`, `baton lease`, `baton status`) print results, in
//! one of three formats chosen with `--output`:
//!
//! - `table` (default), for people: listings are aligned columns under a header, single
//!   results a short sentence. Keys and values are shown as text with control characters
//!   escaped (`\n`, `\t`, `\xNN` for bytes that are not UTF-8) and long values cut at
//!   [`TABLE_VALUE_CHARS`] characters, so one odd value cannot wreck the layout.
//! - `simple`, for shell scripts: no header and no decoration, one item per line, fields
//!   separated by a tab (`cut -f2`), the same escaping but nothing cut.
//! - `json`, for programs: exactly one JSON object per line (streams such as `kv watch`
//!   print one per event: JSON Lines). Keys and values are JSON strings when they are
//!   UTF-8, otherwise the field is named `<field>_base64` and holds base64, so no byte is
//!   lost. Lease, member and cluster ids are lowercase hex strings, as the commands take
//!   them (a 64-bit id does not survive a JavaScript number).

use std::io::Write;

use base64::Engine as _;
use baton_client::KeyValue;
use clap::ValueEnum;
use serde_json::{json, Map, Value};

/// Values longer than this (in characters, after escaping) are cut in tables.
pub const TABLE_VALUE_CHARS: usize = 64;

/// The `--output` choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Aligned columns with a header (for people).
    Table,
    /// Tab-separated fields, no header (for shell scripts).
    Simple,
    /// One JSON object per line (for programs).
    Json,
}

/// Writes `text` (plus a newline unless it ends with one) to stdout and flushes, so
/// streamed output reaches a pipe at once. Empty text prints nothing: in `simple` output
/// "no keys" is no lines, not an empty one.
///
/// A closed pipe (`baton kv watch k | head -1`) ends the program quietly with status 0:
/// the reader has what it wanted, and an error message about it would only be noise.
pub fn emit(text: &str) {
    if text.is_empty() {
        return;
    }
    let mut out = std::io::stdout().lock();
    let mut write = || -> std::io::Result<()> {
        out.write_all(text.as_bytes())?;
        if !text.ends_with('\n') {
            out.write_all(b"\n")?;
        }
        out.flush()
    };
    if let Err(e) = write() {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("baton: cannot write to stdout: {e}");
        std::process::exit(super::exit::EXIT_ERROR);
    }
}

/// Emits one JSON value on one line.
pub fn emit_json(value: &Value) {
    emit(&value.to_string());
}

/// Columns padded to their widest cell, two spaces apart, header first (if any). The last
/// column is not padded, so lines carry no trailing blanks.
#[derive(Debug, Default)]
pub struct Table {
    header: Option<Vec<String>>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with this header row.
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: Some(header.iter().map(|h| h.to_string()).collect()),
            rows: Vec::new(),
        }
    }

    /// A table without a header (a two-column "field value" block, say).
    pub fn headless() -> Table {
        Table::default()
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let all: Vec<&Vec<String>> = self.header.iter().chain(self.rows.iter()).collect();
        let columns = all.iter().map(|r| r.len()).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &all {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in all {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] - cell.chars().count();
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Bytes as one line of text: UTF-8 as is, except control characters (`\n`, `\t`, `\r`,
/// others as `\xNN`) and bytes that are not UTF-8 (`\xNN`), which are escaped so a value
/// cannot break a line-based format.
pub fn text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => {
                    for b in c.to_string().bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// [`text`], cut to [`TABLE_VALUE_CHARS`] characters with an ellipsis (for table cells).
pub fn short(bytes: &[u8]) -> String {
    let t = text(bytes);
    if t.chars().count() <= TABLE_VALUE_CHARS {
        return t;
    }
    let mut cut: String = t.chars().take(TABLE_VALUE_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Puts `bytes` into `map` as `field` (a UTF-8 string) or `field_base64`.
pub fn put_bytes(map: &mut Map<String, Value>, field: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            map.insert(field.to_string(), Value::String(s.to_string()));
        }
        Err(_) => {
            map.insert(
                format!("{field}_base64"),
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            );
        }
    }
}

/// An id as the commands print and take it: lowercase hex (etcd's `%x`; negative ids keep
/// their sign).
pub fn hex(id: i64) -> String {
    if id < 0 {
        format!("-{:x}", id.unsigned_abs())
    } else {
        format!("{id:x}")
    }
}

/// A member or cluster id (unsigned in etcd's API) in hex.
pub fn hex_u64(id: u64) -> String {
    format!("{id:x}")
}

/// A lease for a table cell: its hex id, or `-` for none.
pub fn lease_cell(lease: i64) -> String {
    if lease == 0 {
        "-".to_string()
    } else {
        hex(lease)
    }
}

/// A lease for JSON: its hex id, or `null` for none.
pub fn lease_json(lease: i64) -> Value {
    if lease == 0 {
        Value::Null
    } else {
        Value::String(hex(lease))
    }
}

/// A key-value pair as JSON (`value` left out for keys-only reads).
pub fn kv_json(kv: &KeyValue, with_value: bool) -> Value {
    let mut m = Map::new();
    put_bytes(&mut m, "key", &kv.key);
    if with_value {
        put_bytes(&mut m, "value", &kv.value);
    }
    m.insert("create_revision".into(), json!(kv.create_revision));
    m.insert("mod_revision".into(), json!(kv.mod_revision));
    m.insert("version".into(), json!(kv.version));
    m.insert("lease".into(), lease_json(kv.lease));
    Value::Object(m)
}

/// Key-value pairs as a table (the layout of `kv get`, `kv del --prev-kv` and txn reads).
pub fn kv_table(kvs: &[KeyValue], with_value: bool) -> Table {
    let mut header = vec!["KEY"];
    if with_value {
        header.push("VALUE");
    }
    header.extend(["CREATE_REV", "MOD_REV", "VERSION", "LEASE"]);
    let mut t = Table::new(&header);
    for kv in kvs {
        let mut row = vec![text(&kv.key)];
        if with_value {
            row.push(short(&kv.value));
        }
        row.extend([
            kv.create_revision.to_string(),
            kv.mod_revision.to_string(),
            kv.version.to_string(),
            lease_cell(kv.lease),
        ]);
        t.row(row);
    }
    t
}

/// Key-value pairs for `--output simple`: `key<TAB>value` (or the key alone) per line.
pub fn kv_simple(kvs: &[KeyValue], with_value: bool) -> String {
    let mut out = String::new();
    for kv in kvs {
        out.push_str(&text(&kv.key));
        if with_value {
            out.push('\t');
            out.push_str(&text(&kv.value));
        }
        out.push('\n');
    }
    out
}

/// "1 key" / "3 keys".
pub fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A byte size for people: `512 B`, `1.5 KiB`, `12.0 MiB`.
pub fn bytes_human(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Free text (an error message, say) on one line: runs of whitespace, newlines included,
/// become one space. `None` is the empty string.
pub fn one_line(text: Option<&str>) -> String {
    text.map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `text` cut to `max` characters with an ellipsis, or `-` when empty (for table cells,
/// where an empty cell would shift the eye to the next column).
pub fn cut(text: &str, max: usize) -> String {
    if text.is_empty() {
        return "-".into();
    }
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut c: String = text.chars().take(max - 1).collect();
    c.push('…');
    c
}

/// Unix milliseconds as UTC, `2024-05-01 12:34:56Z` (no time-zone database needed).
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// A span of time for people, to the precision that matters at its size: `850ms`, `42s`,
/// `3m05s`, `5h12m`, `2d03h`.
pub fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Unix milliseconds now, on this machine's clock (for ages and deadlines on display).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_without_trailing_blanks() {
        let mut t = Table::new(&["KEY", "VALUE", "REV"]);
        t.row(vec!["a".into(), "long value".into(), "2".into()]);
        t.row(vec!["longer-key".into(), "".into(), "10".into()]);
        assert_eq!(
            t.render(),
            "KEY         VALUE       REV\n\
             a           long value  2\n\
             longer-key              10\n"
        );
    }

    #[test]
    fn text_escapes_what_would_break_a_line() {
        assert_eq!(text(b"plain"), "plain");
        assert_eq!(text("grüße".as_bytes()), "grüße");
        assert_eq!(text(b"a\nb\tc\r"), "a\\nb\\tc\\r");
        assert_eq!(text(b"\x00\xff"), "\\x00\\xff");
        let long = "x".repeat(100);
        let cut = short(long.as_bytes());
        assert_eq!(cut.chars().count(), TABLE_VALUE_CHARS);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn json_keeps_every_byte() {
        let mut m = Map::new();
        put_bytes(&mut m, "value", b"hello");
        put_bytes(&mut m, "key", b"\xff\x00");
        assert_eq!(
            Value::Object(m),
            json!({"value": "hello", "key_base64": "/wA="})
        );
    }

    #[test]
    fn ids_and_sizes() {
        assert_eq!(hex(0x694d_8c4f), "694d8c4f");
        assert_eq!(hex(-255), "-ff");
        assert_eq!(bytes_human(512), "512 B");
        assert_eq!(bytes_human(1536), "1.5 KiB");
        assert_eq!(plural(1u64, "key", "keys"), "1 key");
        assert_eq!(plural(2u64, "key", "keys"), "2 keys");
    }

    #[test]
    fn dates_spans_and_cells() {
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(utc(1_714_566_896_789), "2024-05-01 12:34:56Z");
        assert_eq!(span(850), "850ms");
        assert_eq!(span(42_000), "42s");
        assert_eq!(span(185_000), "3m05s");
        assert_eq!(span(5 * 3_600_000 + 12 * 60_000), "5h12m");
        assert_eq!(span(2 * 86_400_000 + 3 * 3_600_000), "2d03h");
        assert_eq!(one_line(Some("a\n  b\tc")), "a b c");
        assert_eq!(cut("", 5), "-");
        assert_eq!(cut("abcdef", 4), "abc…");
    }
}
