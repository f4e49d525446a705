//! Data-driven script tests: every `testdata/*.txt` is a sequence of blocks
//!
//! ```text
//! # comment
//! put foo bar
//! ----
//! rev=2
//! ev PUT foo=bar c=2 m=2 v=1
//! ```
//!
//! i.e. a command (one line, or a `txn` … `end` block), `----`, then the expected trace up to
//! the next blank line. Run with `UPDATE_EXPECT=1` to rewrite the expectations from the
//! actual output (then review the diff: the point is that a human checked each trace once).
//!
//! Commands (keys and values accept `\0`, `\xNN`, `\\`; `""` is the empty string):
//! - `put K V [--lease=N] [--prev-kv] [--ignore-value] [--ignore-lease]`
//! - `del K [RANGE] [--prev-kv]`
//! - `get K [RANGE] [--rev=N] [--limit=N] [--sort=key|version|create|mod|value]
//!   [--order=none|asc|desc] [--keys-only] [--count-only] [--min-mod=N] [--max-mod=N]
//!   [--min-create=N] [--max-create=N]`
//!   where RANGE is `--prefix`, `--from-key` or `--end=E`
//! - `txn` / `if K[..E] version|create|mod|value|lease =|!=|>|< X` / `then` / `else` / ops /
//!   nested `txn` … `end` / `repeat N LINE` (LINE N times, `{i}` = 0..N) / `end`
//! - `compact N`, `noop`, `lease-grant ID TTL`, `lease-revoke ID`, `expire ID…`,
//!   `expire-in-term TERM ID…` (entries are of term 1), `checkpoint ID=MS…`, `leases`, `status`, `history K [RANGE] --from=N [--max=N]`,
//!   `snapshot-restore`
//! - locks and fences: `lock-enqueue NAME LEASE [VALUE] [--delay=MS]`,
//!   `lock-force NAME [--token=N] REASON…`, `lock NAME [--max=N]` (queue and registry record),
//!   `lock-pred NAME REV KEY`, `fence RESOURCE TOKEN`, `fence-get RESOURCE`, `advance MS`
//!   (moves the leader clock forward: entry `i` is stamped `i * 100 + advanced`)
//! - de-duplication: `client-register TIMEOUT_MS`, `client-unregister ID`, `clients`,
//!   `dedup CLIENT SEQ ACK CMD…` (CMD: a `put`, `del`, `fence` or any other one-line command,
//!   wrapped in `Command::Deduplicated`)
//! - `watch-hub MAX_PENDING` (new hub), `watch NAME K [RANGE] [--rev=N] [--no-put]
//!   [--no-delete] [--prev-kv]`, `watch-take NAME [--max=N]`, `watch-cancel NAME`,
//!   `watch-synced NAME`
//!
//! Every applied entry's events are published to the hub, as the server does.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use baton_core::*;

// ---- bytes ----------------------------------------------------------------------------

fn parse_bytes(s: &str) -> Vec<u8> {
    if s == "\"\"" {
        return Vec::new();
    }
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            match b[i + 1] {
                b'0' => {
                    out.push(0);
                    i += 2;
                }
                b'\\' => {
                    out.push(b'\\');
                    i += 2;
                }
                b'x' if i + 3 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 2..i + 4]).expect("ascii");
                    out.push(u8::from_str_radix(hex, 16).expect("bad \\x escape"));
                    i += 4;
                }
                _ => panic!("bad escape in {s:?}"),
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn show(b: &[u8]) -> String {
    let mut s = String::new();
    for &c in b {
        match c {
            b'\\' => s.push_str("\\\\"),
            0x21..=0x7e => s.push(c as char),
            _ => write!(s, "\\x{c:02x}").expect("string write"),
        }
    }
    s
}

fn show_kv(kv: &KeyValue) -> String {
    let mut s = format!(
        "{}={} c={} m={} v={}",
        show(&kv.key),
        show(&kv.value),
        kv.create_revision.0,
        kv.mod_revision.0,
        kv.version
    );
    if !kv.lease.is_none() {
        write!(s, " lease={}", kv.lease.0).expect("string write");
    }
    s
}

fn show_event(e: &Event) -> String {
    let mut s = match e.kind {
        EventKind::Put => format!("PUT {}", show_kv(&e.kv)),
        EventKind::Delete => {
            // A delete's kv carries only key and revision; check the rest really is zero.
            assert_eq!(
                (
                    e.kv.create_revision.0,
                    e.kv.version,
                    e.kv.lease.0,
                    e.kv.value.len()
                ),
                (0, 0, 0, 0),
                "delete event kv must be zero apart from key and mod_revision"
            );
            format!("DELETE {} m={}", show(&e.kv.key), e.kv.mod_revision.0)
        }
    };
    if let Some(p) = &e.prev_kv {
        write!(s, " prev=({})", show_kv(p)).expect("string write");
    }
    s
}

/// etcd's `GetPrefixRangeEnd`.
fn prefix_end(key: &[u8]) -> Vec<u8> {
    let mut end = key.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("non-empty") += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

// ---- arguments --------------------------------------------------------------------------

struct Args {
    cmd: String,
    pos: Vec<String>,
    flags: BTreeMap<String, Option<String>>,
}

impl Args {
    fn parse(line: &str) -> Args {
        let mut words = line.split_whitespace();
        let cmd = words.next().expect("empty command").to_string();
        let mut pos = Vec::new();
        let mut flags = BTreeMap::new();
        for w in words {
            if let Some(f) = w.strip_prefix("--") {
                match f.split_once('=') {
                    Some((k, v)) => flags.insert(k.to_string(), Some(v.to_string())),
                    None => flags.insert(f.to_string(), None),
                };
            } else {
                pos.push(w.to_string());
            }
        }
        Args { cmd, pos, flags }
    }

    fn flag(&mut self, name: &str) -> bool {
        match self.flags.remove(name) {
            None => false,
            Some(None) => true,
            Some(Some(v)) => panic!("--{name} takes no value, got {v}"),
        }
    }

    fn num(&mut self, name: &str) -> Option<i64> {
        self.flags.remove(name).map(|v| {
            v.unwrap_or_else(|| panic!("--{name} needs a value"))
                .parse()
                .unwrap_or_else(|e| panic!("--{name}: {e}"))
        })
    }

    fn text(&mut self, name: &str) -> Option<String> {
        self.flags
            .remove(name)
            .map(|v| v.unwrap_or_else(|| panic!("--{name} needs a value")))
    }

    fn pos(&self, i: usize) -> &str {
        self.pos
            .get(i)
            .unwrap_or_else(|| panic!("{}: missing argument {}", self.cmd, i + 1))
    }

    fn pos_num(&self, i: usize) -> i64 {
        self.pos(i)
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e}", self.cmd))
    }

    fn range(&mut self) -> KeyRange {
        let key = parse_bytes(self.pos(0));
        let range_end = if self.flag("prefix") {
            prefix_end(&key)
        } else if self.flag("from-key") {
            vec![0]
        } else if let Some(e) = self.text("end") {
            parse_bytes(&e)
        } else {
            Vec::new()
        };
        KeyRange { key, range_end }
    }

    /// Every flag must have been consumed: a typo must fail the test, not be ignored.
    fn done(&self) {
        assert!(
            self.flags.is_empty(),
            "{}: unknown flags {:?}",
            self.cmd,
            self.flags.keys().collect::<Vec<_>>()
        );
    }
}

fn parse_put(a: &mut Args) -> PutRequest {
    let req = PutRequest {
        key: parse_bytes(a.pos(0)),
        value: a.pos.get(1).map(|v| parse_bytes(v)).unwrap_or_default(),
        lease: LeaseId(a.num("lease").unwrap_or(0)),
        prev_kv: a.flag("prev-kv"),
        ignore_value: a.flag("ignore-value"),
        ignore_lease: a.flag("ignore-lease"),
    };
    a.done();
    req
}

fn parse_del(a: &mut Args) -> DeleteRangeRequest {
    let req = DeleteRangeRequest {
        range: a.range(),
        prev_kv: a.flag("prev-kv"),
    };
    a.done();
    req
}

fn parse_get(a: &mut Args) -> RangeRequest {
    let range = a.range();
    let sort_target = match a.text("sort").as_deref() {
        None | Some("key") => SortTarget::Key,
        Some("version") => SortTarget::Version,
        Some("create") => SortTarget::Create,
        Some("mod") => SortTarget::Mod,
        Some("value") => SortTarget::Value,
        Some(o) => panic!("bad --sort={o}"),
    };
    let sort_order = match a.text("order").as_deref() {
        None | Some("none") => SortOrder::None,
        Some("asc") => SortOrder::Ascend,
        Some("desc") => SortOrder::Descend,
        Some(o) => panic!("bad --order={o}"),
    };
    let req = RangeRequest {
        range,
        limit: a.num("limit").unwrap_or(0),
        revision: a.num("rev").unwrap_or(0),
        sort_order,
        sort_target,
        keys_only: a.flag("keys-only"),
        count_only: a.flag("count-only"),
        min_mod_revision: a.num("min-mod").unwrap_or(0),
        max_mod_revision: a.num("max-mod").unwrap_or(0),
        min_create_revision: a.num("min-create").unwrap_or(0),
        max_create_revision: a.num("max-create").unwrap_or(0),
    };
    a.done();
    req
}

fn parse_compare(line: &str) -> Compare {
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        w.len(),
        5,
        "compare is `if KEY[..END] TARGET OP VALUE`: {line}"
    );
    let range = match w[1].split_once("..") {
        Some((k, e)) => KeyRange {
            key: parse_bytes(k),
            range_end: parse_bytes(e),
        },
        None => KeyRange {
            key: parse_bytes(w[1]),
            range_end: Vec::new(),
        },
    };
    let n = || w[4].parse::<i64>().expect("numeric compare operand");
    let target = match w[2] {
        "version" => CompareTarget::Version(n()),
        "create" => CompareTarget::Create(n()),
        "mod" => CompareTarget::Mod(n()),
        "lease" => CompareTarget::Lease(n()),
        "value" => CompareTarget::Value(parse_bytes(w[4])),
        t => panic!("bad compare target {t}"),
    };
    let result = match w[3] {
        "=" => CompareResult::Equal,
        "!=" => CompareResult::NotEqual,
        ">" => CompareResult::Greater,
        "<" => CompareResult::Less,
        o => panic!("bad compare op {o}"),
    };
    Compare {
        range,
        result,
        target,
    }
}

/// Parses the body of a `txn` block (after the `txn` line) up to its `end`.
fn parse_txn<'a>(lines: &mut impl Iterator<Item = &'a str>) -> TxnRequest {
    let mut t = TxnRequest::default();
    let mut branch: Option<bool> = None;
    loop {
        let line = lines.next().expect("txn without end").trim();
        match line.split_whitespace().next().unwrap_or("") {
            "end" => return t,
            "then" => branch = Some(true),
            "else" => branch = Some(false),
            "txn" => {
                let nested = RequestOp::Txn(parse_txn(lines));
                push_op(&mut t, branch, nested, line);
            }
            "repeat" => {
                // `repeat N LINE`: LINE N times, `{i}` replaced by 0..N (for op-count limits).
                let mut w = line.splitn(3, ' ');
                w.next();
                let n: usize = w.next().expect("repeat N").parse().expect("repeat N");
                let body = w.next().expect("repeat N LINE");
                for i in 0..n {
                    txn_line(&mut t, branch, &body.replace("{i}", &i.to_string()));
                }
            }
            _ => txn_line(&mut t, branch, line),
        }
    }
}

/// One compare or single-line op of a txn.
fn txn_line(t: &mut TxnRequest, branch: Option<bool>, line: &str) {
    let op = match line.split_whitespace().next().unwrap_or("") {
        "if" => {
            assert!(branch.is_none(), "compare after then/else: {line}");
            t.compare.push(parse_compare(line));
            return;
        }
        "put" => RequestOp::Put(parse_put(&mut Args::parse(line))),
        "del" => RequestOp::DeleteRange(parse_del(&mut Args::parse(line))),
        "get" => RequestOp::Range(parse_get(&mut Args::parse(line))),
        other => panic!("bad txn line {other:?}"),
    };
    push_op(t, branch, op, line);
}

fn push_op(t: &mut TxnRequest, branch: Option<bool>, op: RequestOp, line: &str) {
    match branch {
        Some(true) => t.success.push(op),
        Some(false) => t.failure.push(op),
        None => panic!("txn op before then/else: {line}"),
    }
}

// ---- printing responses -------------------------------------------------------------------

fn print_range(out: &mut Vec<String>, indent: &str, r: &RangeResponse) {
    out.push(format!("{indent}count={} more={}", r.count, r.more));
    for kv in &r.kvs {
        out.push(format!("{indent}  {}", show_kv(kv)));
    }
}

fn print_put(out: &mut Vec<String>, indent: &str, head: &str, r: &PutResponse) {
    match &r.prev_kv {
        Some(p) => out.push(format!("{indent}{head}prev=({})", show_kv(p))),
        None => out.push(format!("{indent}{head}ok")),
    }
}

fn print_delete(out: &mut Vec<String>, indent: &str, head: &str, r: &DeleteRangeResponse) {
    out.push(format!("{indent}{head}deleted={}", r.deleted));
    for kv in &r.prev_kvs {
        out.push(format!("{indent}  prev=({})", show_kv(kv)));
    }
}

fn print_txn(out: &mut Vec<String>, indent: &str, r: &TxnResponse) {
    let inner = format!("{indent}  ");
    // Runs of identical responses (op-limit tests) print once, with a count.
    let mut i = 0;
    while i < r.responses.len() {
        let op = &r.responses[i];
        let run = r.responses[i..].iter().take_while(|o| *o == op).count();
        let times = if run > 1 {
            format!(" (x{run})")
        } else {
            String::new()
        };
        match op {
            ResponseOp::Range(r) => {
                out.push(format!("{inner}get:{times}"));
                print_range(out, &format!("{inner}  "), r);
            }
            ResponseOp::Put(r) => print_put(out, &inner, &format!("put:{times} "), r),
            ResponseOp::DeleteRange(r) => print_delete(out, &inner, &format!("del:{times} "), r),
            ResponseOp::Txn(r) => {
                out.push(format!("{inner}txn:{times} succeeded={}", r.succeeded));
                print_txn(out, &inner, r);
            }
        }
        i += run;
    }
}

// ---- the runner ---------------------------------------------------------------------------

struct Runner {
    sm: StateMachine,
    hub: WatchHub,
    watchers: BTreeMap<String, WatcherId>,
    index: u64,
    /// Added to every entry's time stamp (`advance`).
    advanced_ms: u64,
}

impl Runner {
    fn new() -> Self {
        Runner {
            sm: StateMachine::new(),
            hub: WatchHub::new(100),
            watchers: BTreeMap::new(),
            index: 0,
            advanced_ms: 0,
        }
    }

    /// Applies one command as the next log entry, publishes its events, and checks the
    /// cross-cutting promises every entry must keep.
    fn apply(&mut self, command: Command) -> Applied {
        self.index += 1;
        let before = self.sm.revision();
        let validated = StateMachine::validate(&command);
        let applied = self.sm.apply(&Entry {
            index: CommandIndex(self.index),
            term: Term(1),
            time_ms: self.index * 100 + self.advanced_ms,
            command,
        });
        if let Err(e) = validated {
            assert_eq!(
                applied.response,
                Response::Error(e),
                "apply re-runs validate"
            );
        }
        // One revision per entry that changed something, none otherwise.
        let expected = if applied.events.is_empty() {
            before
        } else {
            Revision(before.0 + 1)
        };
        assert_eq!(applied.revision, expected);
        assert_eq!(self.sm.revision(), expected);
        assert_eq!(self.sm.last_applied(), (CommandIndex(self.index), Term(1)));
        self.sm.check_invariants().expect("invariants");
        self.hub.publish(&applied.events);
        applied
    }

    fn print_applied(out: &mut Vec<String>, a: &Applied) {
        for e in &a.events {
            out.push(format!("ev {}", show_event(e)));
        }
    }

    fn run(&mut self, block: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        let first = block[0].trim();
        let mut a = Args::parse(first);
        match a.cmd.as_str() {
            "txn" => {
                let mut lines = block[1..].iter().copied();
                let t = parse_txn(&mut lines);
                assert!(lines.next().is_none(), "lines after the txn's end");
                let applied = self.apply(Command::Txn(t));
                match &applied.response {
                    Response::Txn(r) => {
                        out.push(format!(
                            "rev={} succeeded={}",
                            applied.revision.0, r.succeeded
                        ));
                        print_txn(&mut out, "", r);
                    }
                    Response::Error(e) => {
                        out.push(format!("rev={} error: {e}", applied.revision.0))
                    }
                    r => panic!("unexpected {r:?}"),
                }
                Self::print_applied(&mut out, &applied);
                return out;
            }
            _ => assert_eq!(block.len(), 1, "only txn spans several lines"),
        }
        let result = |out: &mut Vec<String>, applied: &Applied, ok: String| {
            match &applied.response {
                Response::Error(e) => out.push(format!("rev={} error: {e}", applied.revision.0)),
                _ => out.push(format!("rev={}{ok}", applied.revision.0)),
            }
            Self::print_applied(out, applied);
        };
        match a.cmd.as_str() {
            "put" => {
                let applied = self.apply(Command::Put(parse_put(&mut a)));
                match &applied.response {
                    Response::Put(r) => {
                        print_put(&mut out, "", &format!("rev={} ", applied.revision.0), r)
                    }
                    Response::Error(e) => {
                        out.push(format!("rev={} error: {e}", applied.revision.0))
                    }
                    r => panic!("unexpected {r:?}"),
                }
                Self::print_applied(&mut out, &applied);
            }
            "del" => {
                let applied = self.apply(Command::DeleteRange(parse_del(&mut a)));
                match &applied.response {
                    Response::DeleteRange(r) => {
                        print_delete(&mut out, "", &format!("rev={} ", applied.revision.0), r)
                    }
                    Response::Error(e) => {
                        out.push(format!("rev={} error: {e}", applied.revision.0))
                    }
                    r => panic!("unexpected {r:?}"),
                }
                Self::print_applied(&mut out, &applied);
            }
            "get" => {
                let req = parse_get(&mut a);
                match self.sm.range(&req) {
                    Ok(r) => print_range(&mut out, "", &r),
                    Err(e) => out.push(format!("error: {e}")),
                }
            }
            "noop" => {
                a.done();
                let applied = self.apply(Command::Noop);
                result(&mut out, &applied, String::new());
            }
            "compact" => {
                let revision = Revision(a.pos_num(0));
                a.done();
                let applied = self.apply(Command::Compact { revision });
                result(&mut out, &applied, " ok".into());
            }
            "lease-grant" => {
                let (id, ttl_s) = (LeaseId(a.pos_num(0)), a.pos_num(1));
                a.done();
                let applied = self.apply(Command::LeaseGrant { id, ttl_s });
                let ok = match &applied.response {
                    Response::LeaseGrant { id, ttl_s } => format!(" lease={} ttl={ttl_s}", id.0),
                    _ => String::new(),
                };
                result(&mut out, &applied, ok);
            }
            "lease-revoke" => {
                let id = LeaseId(a.pos_num(0));
                a.done();
                let applied = self.apply(Command::LeaseRevoke { id });
                result(&mut out, &applied, " ok".into());
            }
            "expire" | "expire-in-term" => {
                let fenced = a.cmd == "expire-in-term";
                let first = usize::from(fenced);
                let ids = (first..a.pos.len())
                    .map(|i| LeaseId(a.pos_num(i)))
                    .collect();
                a.done();
                let applied = if fenced {
                    let term = Term(a.pos_num(0) as u64);
                    self.apply(Command::ExpireLeasesInTerm { term, ids })
                } else {
                    self.apply(Command::ExpireLeases { ids })
                };
                let ok = match &applied.response {
                    Response::ExpireLeases {
                        expired,
                        expired_holders,
                    } => {
                        let mut s = format!(
                            " expired={:?}",
                            expired.iter().map(|l| l.0).collect::<Vec<_>>()
                        );
                        if !expired_holders.is_empty() {
                            let keys: Vec<String> =
                                expired_holders.iter().map(|k| show(k)).collect();
                            write!(s, " holders=[{}]", keys.join(",")).expect("string write");
                        }
                        s
                    }
                    _ => String::new(),
                };
                result(&mut out, &applied, ok);
            }
            "checkpoint" => {
                let checkpoints = a
                    .pos
                    .iter()
                    .map(|p| {
                        let (id, ms) = p.split_once('=').expect("ID=MS");
                        (LeaseId(id.parse().expect("id")), ms.parse().expect("ms"))
                    })
                    .collect();
                a.done();
                let applied = self.apply(Command::LeaseCheckpoint { checkpoints });
                result(&mut out, &applied, " ok".into());
            }
            "leases" => {
                a.done();
                let ids = self.sm.lease_ids();
                if ids.is_empty() {
                    out.push("(no leases)".into());
                }
                for id in ids {
                    let l = self.sm.lease(id).expect("listed lease exists");
                    assert_eq!(l.id, id);
                    let mut keys = l.keys.iter().map(|k| show(k)).collect::<Vec<_>>();
                    let sorted = {
                        let mut s = l.keys.clone();
                        s.sort();
                        s
                    };
                    assert_eq!(l.keys, sorted, "lease keys are sorted");
                    if keys.is_empty() {
                        keys.push("-".into());
                    }
                    let cp = l
                        .checkpoint_remaining_ms
                        .map_or("-".to_string(), |ms| ms.to_string());
                    out.push(format!(
                        "lease {} ttl={} checkpoint={cp} keys={}",
                        id.0,
                        l.granted_ttl_s,
                        keys.join(",")
                    ));
                }
            }
            "status" => {
                a.done();
                let (index, term) = self.sm.last_applied();
                out.push(format!(
                    "rev={} compact={} keys={} applied={}/{} time={}",
                    self.sm.revision().0,
                    self.sm.compact_revision().0,
                    self.sm.key_count(),
                    index.0,
                    term.0,
                    self.sm.last_time_ms()
                ));
            }
            "history" => {
                let range = a.range();
                let from = Revision(a.num("from").expect("--from"));
                let max = a.num("max").unwrap_or(1000) as usize;
                a.done();
                match self.sm.history(&range, from, max, EventShape::ALL) {
                    Ok(b) => {
                        for e in &b.events {
                            out.push(show_event(e));
                        }
                        out.push(format!("next={}", b.next.0));
                    }
                    Err(e) => out.push(format!("error: {e}")),
                }
            }
            "snapshot-restore" => {
                a.done();
                let snap = self.sm.snapshot();
                let restored = StateMachine::restore(&snap).expect("restore");
                assert_eq!(
                    restored.snapshot(),
                    snap,
                    "restore∘snapshot is the identity"
                );
                assert_eq!(restored.hash_kv(0), self.sm.hash_kv(0));
                self.sm = restored;
                out.push("ok".into());
            }
            "lock-enqueue" => {
                let name = parse_bytes(a.pos(0));
                let lease = LeaseId(a.pos_num(1));
                let value = a.pos.get(2).map(|v| parse_bytes(v)).unwrap_or_default();
                let delay_ms = a.num("delay").map(|d| d as u64);
                a.done();
                let applied = self.apply(Command::LockEnqueue {
                    name,
                    lease,
                    value,
                    delay_ms,
                });
                let ok = match &applied.response {
                    Response::LockEnqueue { kv, created } => {
                        format!(" {} created={created}", show_kv(kv))
                    }
                    _ => String::new(),
                };
                result(&mut out, &applied, ok);
            }
            "lock-force" => {
                let name = parse_bytes(a.pos(0));
                let token = FencingToken(a.num("token").unwrap_or(0));
                let reason = a.pos[1..].join(" ");
                let reason = if reason == "\"\"" {
                    String::new()
                } else {
                    reason
                };
                a.done();
                let applied = self.apply(Command::LockForceRelease {
                    name,
                    token,
                    reason,
                });
                let ok = match &applied.response {
                    Response::LockForceRelease { released: Some(kv) } => {
                        format!(" released {}", show_kv(kv))
                    }
                    Response::LockForceRelease { released: None } => " released nothing".into(),
                    _ => String::new(),
                };
                result(&mut out, &applied, ok);
            }
            "fence" => {
                let resource = parse_bytes(a.pos(0));
                let token = FencingToken(a.pos_num(1));
                a.done();
                let applied = self.apply(Command::FenceCheck { resource, token });
                let ok = match &applied.response {
                    Response::FenceCheck { accepted, highest } => {
                        format!(" accepted={accepted} highest={highest}")
                    }
                    _ => String::new(),
                };
                result(&mut out, &applied, ok);
            }
            "client-register" => {
                let timeout_ms = a.pos_num(0) as u64;
                a.done();
                let applied = self.apply(Command::RegisterClient { timeout_ms });
                let ok = match &applied.response {
                    Response::ClientRegistered {
                        client_id,
                        timeout_ms,
                    } => format!(" client={client_id} timeout={timeout_ms}"),
                    _ => String::new(),
                };
                result(&mut out, &applied, ok);
            }
            "client-unregister" => {
                let client_id = a.pos_num(0) as u64;
                a.done();
                let applied = self.apply(Command::UnregisterClient { client_id });
                let ok = match &applied.response {
                    Response::ClientUnregistered { existed } => format!(" existed={existed}"),
                    _ => String::new(),
                };
                result(&mut out, &applied, ok);
            }
            "clients" => {
                a.done();
                out.push(format!("sessions={}", self.sm.client_sessions()));
            }
            "dedup" => {
                let words: Vec<&str> = first.split_whitespace().collect();
                assert!(words.len() > 4, "dedup CLIENT SEQ ACK CMD…");
                let num = |i: usize| words[i].parse::<u64>().expect("dedup: number");
                let mut inner = Args::parse(&words[4..].join(" "));
                let command = match inner.cmd.as_str() {
                    "put" => Command::Put(parse_put(&mut inner)),
                    "del" => Command::DeleteRange(parse_del(&mut inner)),
                    "fence" => Command::FenceCheck {
                        resource: parse_bytes(inner.pos(0)),
                        token: FencingToken(inner.pos_num(1)),
                    },
                    "lease-revoke" => Command::LeaseRevoke {
                        id: LeaseId(inner.pos_num(0)),
                    },
                    other => panic!("dedup: unsupported inner command {other}"),
                };
                inner.done();
                let applied = self.apply(Command::Deduplicated {
                    client_id: num(1),
                    sequence: num(2),
                    acknowledged_below: num(3),
                    command: Box::new(command),
                });
                match &applied.response {
                    Response::Deduplicated {
                        replayed,
                        revision,
                        response,
                    } => {
                        out.push(format!(
                            "rev={} replayed={replayed} at={}",
                            applied.revision.0, revision.0
                        ));
                        match &**response {
                            Response::Put(r) => print_put(&mut out, "  ", "", r),
                            Response::DeleteRange(r) => print_delete(&mut out, "  ", "", r),
                            Response::FenceCheck { accepted, highest } => {
                                out.push(format!("  accepted={accepted} highest={highest}"))
                            }
                            Response::Error(e) => out.push(format!("  error: {e}")),
                            r => panic!("unexpected {r:?}"),
                        }
                    }
                    Response::Error(e) => {
                        out.push(format!("rev={} error: {e}", applied.revision.0))
                    }
                    r => panic!("unexpected {r:?}"),
                }
                Self::print_applied(&mut out, &applied);
            }
            "fence-get" => {
                let resource = parse_bytes(a.pos(0));
                a.done();
                match self.sm.fence_highest(&resource) {
                    Some(h) => out.push(format!("highest={h}")),
                    None => out.push("(none)".into()),
                }
            }
            "lock" => {
                let name = parse_bytes(a.pos(0));
                let max = a.num("max").unwrap_or(100) as usize;
                a.done();
                let (kvs, len) = self.sm.lock_queue(&name, max);
                let head = self.sm.lock_head(&name);
                assert_eq!(head.as_ref(), kvs.first(), "head is the queue's first");
                out.push(format!("queue len={len}"));
                for kv in &kvs {
                    out.push(format!("  {}", show_kv(kv)));
                }
                match self.sm.lock_info(&name) {
                    None => out.push("(unregistered)".into()),
                    Some(info) => {
                        out.push(format!(
                            "delay={} delayed_until={}",
                            info.delay_ms, info.delayed_until_ms
                        ));
                        for r in &info.force_releases {
                            out.push(format!(
                                "  forced {} token={} at={} reason={:?}",
                                show(&r.key),
                                r.token,
                                r.at_ms,
                                r.reason
                            ));
                        }
                    }
                }
            }
            "lock-pred" => {
                let name = parse_bytes(a.pos(0));
                let rev = Revision(a.pos_num(1));
                let key = parse_bytes(a.pos(2));
                a.done();
                match self.sm.lock_predecessor(&name, rev, &key) {
                    Some(kv) => out.push(show_kv(&kv)),
                    None => out.push("(head)".into()),
                }
            }
            "advance" => {
                self.advanced_ms += a.pos_num(0) as u64;
                a.done();
                out.push(format!("advanced={}", self.advanced_ms));
            }
            "watch-hub" => {
                let max = a.pos_num(0) as usize;
                a.done();
                self.hub = WatchHub::new(max);
                self.watchers.clear();
                out.push("ok".into());
            }
            "watch" => {
                let name = a.pos(0).to_string();
                a.pos.remove(0);
                let spec = WatchSpec {
                    range: a.range(),
                    start_revision: Revision(a.num("rev").unwrap_or(0)),
                    no_put: a.flag("no-put"),
                    no_delete: a.flag("no-delete"),
                    prev_kv: a.flag("prev-kv"),
                };
                a.done();
                let id = self.hub.add(spec, self.sm.revision());
                self.watchers.insert(name, id);
                out.push(format!(
                    "watchers={} synced={}",
                    self.hub.len(),
                    self.hub.is_synced(id, &self.sm)
                ));
            }
            "watch-take" => {
                let id = self.watchers[a.pos(0)];
                let max = a.num("max").unwrap_or(1000) as usize;
                a.done();
                match self.hub.take(id, &self.sm, max) {
                    None => out.push("none".into()),
                    Some(WatchOutput::Events(evs)) => {
                        assert!(!evs.is_empty(), "Some(Events) is never empty");
                        for e in &evs {
                            out.push(show_event(e));
                        }
                    }
                    Some(WatchOutput::Compacted { compact_revision }) => {
                        out.push(format!("compacted at {}", compact_revision.0));
                    }
                    Some(WatchOutput::Skipped) => out.push("skipped".into()),
                }
            }
            "watch-cancel" => {
                let id = self.watchers.remove(a.pos(0)).expect("known watcher");
                a.done();
                self.hub.remove(id);
                out.push(format!("watchers={}", self.hub.len()));
            }
            "watch-synced" => {
                let id = self.watchers[a.pos(0)];
                a.done();
                out.push(format!("{}", self.hub.is_synced(id, &self.sm)));
            }
            other => panic!("unknown command {other:?}"),
        }
        // Cheap enough at script sizes, and catches any snapshot field that was forgotten.
        let snap = self.sm.snapshot();
        assert_eq!(
            StateMachine::restore(&snap).expect("restore").snapshot(),
            snap
        );
        out
    }
}

// ---- files ----------------------------------------------------------------------------------

enum Item<'a> {
    /// A comment or blank line, kept verbatim.
    Verbatim(&'a str),
    Block {
        command: Vec<&'a str>,
        expected: Vec<&'a str>,
    },
}

fn parse_file(text: &str) -> Vec<Item<'_>> {
    let mut items = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() || line.starts_with('#') {
            items.push(Item::Verbatim(line));
            continue;
        }
        let mut command = vec![line];
        loop {
            let l = lines
                .next()
                .unwrap_or_else(|| panic!("block without ----: {line}"));
            if l == "----" {
                break;
            }
            command.push(l);
        }
        let mut expected = Vec::new();
        while let Some(l) = lines.peek() {
            if l.trim().is_empty() {
                break;
            }
            expected.push(*l);
            lines.next();
        }
        items.push(Item::Block { command, expected });
    }
    items
}

/// Runs one script; returns the rewritten file text and the mismatches.
fn run_file(text: &str) -> (String, Vec<String>) {
    let mut runner = Runner::new();
    let mut rewritten = String::new();
    let mut failures = Vec::new();
    for item in parse_file(text) {
        match item {
            Item::Verbatim(l) => {
                rewritten.push_str(l);
                rewritten.push('\n');
            }
            Item::Block { command, expected } => {
                let actual = runner.run(&command);
                assert!(
                    actual.iter().all(|l| !l.trim().is_empty()),
                    "output must not contain blank lines"
                );
                if actual != expected {
                    failures.push(format!(
                        "command:\n{}\nexpected:\n{}\nactual:\n{}\n",
                        command.join("\n"),
                        expected.join("\n"),
                        actual.join("\n")
                    ));
                }
                for l in command {
                    rewritten.push_str(l);
                    rewritten.push('\n');
                }
                rewritten.push_str("----\n");
                for l in actual {
                    rewritten.push_str(&l);
                    rewritten.push('\n');
                }
            }
        }
    }
    (rewritten, failures)
}

#[test]
fn scripts() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let update = std::env::var("UPDATE_EXPECT").is_ok_and(|v| v == "1");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 8,
        "expected the script files, found {files:?}"
    );
    let mut all_failures = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read script");
        let (rewritten, failures) = run_file(&text);
        if update {
            if rewritten != text {
                std::fs::write(&path, rewritten).expect("write script");
            }
        } else {
            for f in failures {
                all_failures.push(format!("{}:\n{f}", path.display()));
            }
        }
    }
    assert!(
        all_failures.is_empty(),
        "{} script mismatches (UPDATE_EXPECT=1 rewrites):\n\n{}",
        all_failures.len(),
        all_failures.join("\n")
    );
}
