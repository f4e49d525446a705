//! The module graph of one crate target, built from the paths its files mention, and the
//! cycles in it.
//!
//! Granularity: one node per *file* under `src/` (`lib.rs`, `wal/record.rs`, `cli/kv.rs`), named by
//! its path relative to `src/`. Inline modules count as the file they are written in, except
//! `#[cfg(test)]` ones, which are left out: they are compiled only into the test binary, and a
//! test reaching into another module's helpers does not tangle the build that ships.
//!
//! A file `A` depends on a file `B` when `A` mentions a path into `B`: `crate::b::…`,
//! `super::…`, `self::…`, or a child module's name (`b::…` in the file that declares `mod b`),
//! in `use` trees (`use crate::{b::X, c::{Y, Z}}`) and in expressions alike. A path to an item
//! is followed through `use`/`pub use` re-exports to the file that defines it, so
//! `crate::Node` reaches `lib.rs` only if `lib.rs` itself defines `Node`.
//!
//! Two kinds of findings:
//! - a *reach-back*: a file using an item of one of its ancestors (a child of `lib.rs` using a
//!   helper defined in `lib.rs`, `cli/kv.rs` one defined in `cli/mod.rs`). The ancestor
//!   declares the child, so this is always a cycle; it is reported on its own, by file.
//! - a *cycle* among the other edges: each strongly connected component of more than one
//!   file, with every edge inside it and where it comes from.
//!
//! Not seen: macros used by textual scope (`macro_rules!` before `mod x;`) and `#[path]`
//! attributes (Baton has neither); a local name that shadows a child module's name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::lex::{tokenize, Tok, Token};

/// A module path from the target's root: `[]` is the root, `["cli", "kv"]` is `cli/kv.rs`.
type ModPath = Vec<String>;

/// One file of a module tree.
struct FileMod {
    /// Path relative to `src/`, the node's name in reports.
    rel: String,
    tokens: Vec<Token>,
    /// Names of the items this file defines (`fn`, `struct`, `mod`, …), at any depth.
    defs: BTreeSet<String>,
}

/// A path found in a file, as written.
struct Mention {
    /// The module path the path is relative to (the anchor's module).
    base: ModPath,
    /// Segments after the anchor; a glob ends in `*`.
    segs: Vec<String>,
    /// The name a `use` binds (`as` alias or last segment), if this was a top-level `use`.
    binds: Option<String>,
    line: u32,
}

/// A dependency edge between two files with the first place it was seen.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The file that mentions the path.
    pub from: String,
    /// The file the path leads into.
    pub to: String,
    /// `from`'s line and the path as written, for the report.
    pub evidence: String,
    /// Every path from `from` into `to`, as written (what would have to move to break it).
    pub paths: BTreeSet<String>,
}

/// What the analysis of one crate target found.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every edge, one per (from, to), first evidence kept.
    pub edges: Vec<Edge>,
    /// Edges from a file into one of its ancestors.
    pub reach_backs: Vec<Edge>,
    /// Strongly connected components (more than one file) among the other edges, sorted.
    pub cycles: Vec<BTreeSet<String>>,
}

/// Loads the module tree rooted at `root` (a `lib.rs` or `main.rs`) and analyses it.
pub fn analyse(root: &Path) -> Result<Graph, String> {
    let src = root.parent().ok_or("root has no directory")?.to_path_buf();
    let mut files = BTreeMap::new();
    load(&src, root, Vec::new(), &mut files)?;
    Ok(graph(&files))
}

/// Reads `file` as module `path` and, recursively, the files its `mod x;` lines declare.
fn load(
    src: &Path,
    file: &Path,
    path: ModPath,
    files: &mut BTreeMap<ModPath, FileMod>,
) -> Result<(), String> {
    let text = fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let tokens = tokenize(&text);
    let is_dir_owner = path.is_empty() || file.file_name().is_some_and(|n| n == "mod.rs");
    let dir: PathBuf = if is_dir_owner {
        file.parent().unwrap_or(src).to_path_buf()
    } else {
        file.with_extension("")
    };
    let mut children = Vec::new();
    for i in 0..tokens.len() {
        if tokens[i].ident() == Some("mod") && inline_depth(&tokens, i) == 0 {
            if let (Some(name), Some(semi)) =
                (tokens.get(i + 1).and_then(Token::ident), tokens.get(i + 2))
            {
                if semi.is(';') && !is_cfg_test(&tokens, i) {
                    children.push(name.to_owned());
                }
            }
        }
    }
    let rel = file
        .strip_prefix(src)
        .map_err(|_| format!("{} is outside {}", file.display(), src.display()))?
        .to_string_lossy()
        .into_owned();
    let defs = definitions(&tokens);
    files.insert(path.clone(), FileMod { rel, tokens, defs });
    for child in children {
        let flat = dir.join(format!("{child}.rs"));
        let nested = dir.join(&child).join("mod.rs");
        let found = if flat.exists() { flat } else { nested };
        let mut p = path.clone();
        p.push(child);
        load(src, &found, p, files)?;
    }
    Ok(())
}

/// How many inline `mod x {` blocks enclose token `i` (counting braces from the start).
fn inline_depth(tokens: &[Token], i: usize) -> usize {
    let mut stack: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    for (j, t) in tokens[..i].iter().enumerate() {
        if t.is('{') {
            if j >= 2 && tokens[j - 2].ident() == Some("mod") {
                stack.push(depth);
            }
            depth += 1;
        } else if t.is('}') {
            depth = depth.saturating_sub(1);
            if stack.last() == Some(&depth) {
                stack.pop();
            }
        }
    }
    stack.len()
}

/// Whether the `mod` at token `i` carries `#[cfg(test)]` (before an optional `pub(…)`).
fn is_cfg_test(tokens: &[Token], i: usize) -> bool {
    let mut j = i;
    if j >= 1 && tokens[j - 1].is(')') {
        while j > 0 && !tokens[j - 1].is('(') {
            j -= 1;
        }
        j = j.saturating_sub(2);
    } else if j >= 1 && tokens[j - 1].ident() == Some("pub") {
        j -= 1;
    }
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    j >= want.len()
        && tokens[j - want.len()..j]
            .iter()
            .zip(want)
            .all(|(t, w)| match &t.tok {
                Tok::Ident(s) => s == w,
                Tok::Punct(c) => w.len() == 1 && w.starts_with(*c),
                Tok::PathSep => false,
            })
}

/// Names defined by item keywords anywhere in the file.
fn definitions(tokens: &[Token]) -> BTreeSet<String> {
    const ITEM: [&str; 10] = [
        "fn",
        "struct",
        "enum",
        "trait",
        "type",
        "const",
        "static",
        "union",
        "mod",
        "macro_rules",
    ];
    let mut defs = BTreeSet::new();
    for w in tokens.windows(3) {
        let Some(kw) = w[0].ident() else { continue };
        if !ITEM.contains(&kw) {
            continue;
        }
        // `macro_rules! name`; `const fn`/`const _` are skipped by the ident check.
        let name = if kw == "macro_rules" { &w[2] } else { &w[1] };
        if let Some(n) = name.ident() {
            defs.insert(n.to_owned());
        }
    }
    defs
}

/// Every crate-internal path mentioned in `file` (module `path`), test modules skipped.
fn mentions(files: &BTreeMap<ModPath, FileMod>, path: &ModPath) -> Vec<Mention> {
    let file = &files[path];
    let t = &file.tokens;
    let children: BTreeSet<&str> = files
        .keys()
        .filter(|k| k.len() == path.len() + 1 && k.starts_with(path))
        .map(|k| k[path.len()].as_str())
        .collect();
    // (name, brace depth it opened at, is a #[cfg(test)] module)
    let mut inline: Vec<(String, usize, bool)> = Vec::new();
    let mut depth = 0usize;
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if t[i].is('{') {
            if i >= 2 && t[i - 2].ident() == Some("mod") {
                let name = t[i - 1].ident().unwrap_or("").to_owned();
                inline.push((name, depth, is_cfg_test(t, i - 2)));
            }
            depth += 1;
        } else if t[i].is('}') {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|m| m.1 == depth) {
                inline.pop();
            }
        }
        let in_test = inline.iter().any(|m| m.2);
        let prev_sep = i > 0 && (t[i - 1].tok == Tok::PathSep || t[i - 1].is('.'));
        let next_sep = t.get(i + 1).is_some_and(|n| n.tok == Tok::PathSep);
        let Some(word) = t[i].ident() else {
            i += 1;
            continue;
        };
        if in_test || prev_sep || !next_sep {
            i += 1;
            continue;
        }
        let mut cur = path.clone();
        cur.extend(inline.iter().map(|m| m.0.clone()));
        let is_use = i > 0 && t[i - 1].ident() == Some("use") && inline.is_empty() && depth == 0;
        let line = t[i].line;
        let (base, start) = match word {
            "crate" => (Vec::new(), i + 2),
            "self" => (cur, i + 2),
            "super" => {
                let mut b = cur;
                let mut j = i;
                while t.get(j).and_then(Token::ident) == Some("super")
                    && t.get(j + 1).is_some_and(|n| n.tok == Tok::PathSep)
                {
                    b.pop();
                    j += 2;
                }
                (b, j)
            }
            w if inline.is_empty() && children.contains(w) => (cur, i),
            _ => {
                i += 1;
                continue;
            }
        };
        let mut leaves = Vec::new();
        let end = tree(t, start, Vec::new(), &mut leaves);
        for (segs, alias) in leaves {
            let binds = is_use.then(|| alias.or_else(|| segs.last().cloned()).unwrap_or_default());
            out.push(Mention {
                base: base.clone(),
                segs,
                binds,
                line,
            });
        }
        i = end.max(i + 1);
    }
    out
}

/// Parses a path or `use` tree starting at `i` (after the anchor's `::`); pushes each leaf's
/// segments (and `as` alias) onto `leaves`; returns the index after it.
fn tree(
    t: &[Token],
    mut i: usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let Some(tok) = t.get(i) else {
        leaves.push((prefix, None));
        return i;
    };
    if tok.is('{') {
        i += 1;
        while i < t.len() && !t[i].is('}') {
            i = tree(t, i, prefix.clone(), leaves);
            if t.get(i).is_some_and(|x| x.is(',')) {
                i += 1;
            } else if !t.get(i).is_some_and(|x| x.is('}')) {
                break;
            }
        }
        return i + 1;
    }
    if tok.is('*') {
        let mut p = prefix;
        p.push("*".into());
        leaves.push((p, None));
        return i + 1;
    }
    let Some(word) = tok.ident() else {
        leaves.push((prefix, None));
        return i;
    };
    let mut p = prefix;
    if word != "self" {
        p.push(word.to_owned());
    }
    let sep = t.get(i + 1).is_some_and(|x| x.tok == Tok::PathSep);
    let more = t
        .get(i + 2)
        .is_some_and(|x| x.ident().is_some() || x.is('{') || x.is('*'));
    if sep && more {
        return tree(t, i + 2, p, leaves);
    }
    if t.get(i + 1).and_then(Token::ident) == Some("as") {
        let alias = t.get(i + 2).and_then(Token::ident).map(str::to_owned);
        leaves.push((p, alias));
        return i + 3;
    }
    leaves.push((p, None));
    i + 1
}

/// The longest prefix of `m` that is a file.
fn file_of(files: &BTreeMap<ModPath, FileMod>, m: &[String]) -> ModPath {
    (0..=m.len())
        .rev()
        .map(|n| m[..n].to_vec())
        .find(|p| files.contains_key(p))
        .unwrap_or_default()
}

/// The file a path leads into: down through file modules, then through re-exports.
fn resolve(
    files: &BTreeMap<ModPath, FileMod>,
    uses: &BTreeMap<ModPath, Vec<Mention>>,
    base: &[String],
    segs: &[String],
    depth: usize,
) -> ModPath {
    let mut m = base.to_vec();
    let mut k = 0;
    while k < segs.len() {
        let mut next = m.clone();
        next.push(segs[k].clone());
        if !files.contains_key(&next) {
            break;
        }
        m = next;
        k += 1;
    }
    let file = file_of(files, &m);
    match segs.get(k) {
        Some(item) if file == m && item != "*" && depth < 6 => {
            reexport(files, uses, &file, item, depth + 1).unwrap_or(file)
        }
        _ => file,
    }
}

/// Where `item`, named in file `file` but not defined there, comes from: a `use` of it in
/// that file, or a glob import of a file that has it.
fn reexport(
    files: &BTreeMap<ModPath, FileMod>,
    uses: &BTreeMap<ModPath, Vec<Mention>>,
    file: &ModPath,
    item: &str,
    depth: usize,
) -> Option<ModPath> {
    if files[file].defs.contains(item) {
        return None;
    }
    let top = uses.get(file)?;
    if let Some(u) = top.iter().find(|u| u.binds.as_deref() == Some(item)) {
        return Some(resolve(files, uses, &u.base, &u.segs, depth));
    }
    top.iter()
        .filter(|u| u.segs.last().is_some_and(|s| s == "*"))
        .map(|u| resolve(files, uses, &u.base, &u.segs, depth))
        .filter(|g| g != file)
        .find(|g| {
            files[g].defs.contains(item) || reexport(files, uses, g, item, depth + 1).is_some()
        })
}

fn graph(files: &BTreeMap<ModPath, FileMod>) -> Graph {
    let all: BTreeMap<ModPath, Vec<Mention>> = files
        .keys()
        .map(|p| (p.clone(), mentions(files, p)))
        .collect();
    let uses: BTreeMap<ModPath, Vec<Mention>> = all
        .iter()
        .map(|(p, ms)| {
            let top = ms
                .iter()
                .filter(|m| m.binds.is_some())
                .map(|m| Mention {
                    base: m.base.clone(),
                    segs: m.segs.clone(),
                    binds: m.binds.clone(),
                    line: m.line,
                })
                .collect();
            (p.clone(), top)
        })
        .collect();
    let mut seen: BTreeMap<(ModPath, ModPath), Edge> = BTreeMap::new();
    for (from, ms) in &all {
        for m in ms {
            let to = resolve(files, &uses, &m.base, &m.segs, 0);
            if &to == from {
                continue;
            }
            let path = written(&m.base, &m.segs);
            let e = seen
                .entry((from.clone(), to.clone()))
                .or_insert_with(|| Edge {
                    from: files[from].rel.clone(),
                    to: files[&to].rel.clone(),
                    evidence: format!("{}:{} mentions `{path}`", files[from].rel, m.line),
                    paths: BTreeSet::new(),
                });
            e.paths.insert(path);
        }
    }
    let mut g = Graph::default();
    let mut adj: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((from, to), e) in seen {
        if from.starts_with(&to) {
            g.reach_backs.push(e.clone());
        } else {
            adj.entry(e.from.clone()).or_default().insert(e.to.clone());
        }
        g.edges.push(e);
    }
    g.cycles = strongly_connected(&adj)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    g.cycles.sort();
    g
}

/// The path as `crate::…` for reports.
fn written(base: &[String], segs: &[String]) -> String {
    let mut p = vec!["crate".to_owned()];
    p.extend(base.iter().cloned());
    p.extend(segs.iter().cloned());
    p.join("::")
}

/// Tarjan's algorithm; the graph is small, so recursion depth is no concern.
fn strongly_connected(adj: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        adj: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.adj.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut c = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                c.insert(w.to_owned());
                if w == v {
                    break;
                }
            }
            s.out.push(c);
        }
    }
    let mut s = State {
        adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    let nodes: BTreeSet<&str> = adj
        .iter()
        .flat_map(|(k, vs)| std::iter::once(k.as_str()).chain(vs.iter().map(String::as_str)))
        .collect();
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}
