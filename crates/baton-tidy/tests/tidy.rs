//! The tidy tests: rules of ARCHITECTURE.md checked on every `cargo test --workspace`.
//!
//! Each allow-list below holds today's known exceptions, each with its reason. A list may
//! only shrink: an entry that no longer matches anything fails the test as surely as a new
//! violation does, so fixing a cycle or dropping a dependency means deleting its line.

use std::collections::{BTreeMap, BTreeSet};

use baton_tidy::workspace::{self, Kind, Package};
use baton_tidy::{modules, table, unused};

/// Dependencies no source file names, kept on purpose: (crate, dependency, kind, why).
const UNUSED_ALLOWED: &[(&str, &str, Kind, &str)] = &[
    // None today. A crate needed only for its features or its link-time effect (a global
    // allocator, a `links` crate) would go here, with the reason.
];

/// Known module cycles, as the exact set of files of each strongly connected component.
/// (crate, files, what it would take to break).
const CYCLES_ALLOWED: &[(&str, &[&str], &str)] = &[];

/// Files that use items of a module that declares them (an ancestor file), per ancestor:
/// (crate, ancestor file, the exact set of files reaching into it, why).
const REACH_BACKS_ALLOWED: &[(&str, &str, &[&str], &str)] = &[(
    "baton-proto",
    "lib.rs",
    &["codec.rs"],
    // The generated messages are `include!`d into inline modules of lib.rs (that is
    // where tonic-build's output must go), and the codec is about exactly those messages.
    "the codec reads the generated messages, which live in lib.rs by construction",
)];

fn packages() -> Vec<Package> {
    workspace::packages()
}

fn baton_crates(pkgs: &[Package]) -> BTreeSet<String> {
    pkgs.iter().map(|p| p.name.clone()).collect()
}

/// ARCHITECTURE.md's "Crate dependencies" table is exactly the graph of the manifests: no
/// crate depends on a Baton crate its row does not name, dev-only names are only
/// dev-dependencies, and every named edge exists (so the table cannot go stale either).
#[test]
fn crate_dependencies_follow_the_table() {
    let doc = std::fs::read_to_string(workspace::root().join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md is readable");
    let allowed = table::parse(&doc).unwrap_or_else(|e| panic!("{e}"));
    let pkgs = packages();
    let ours = baton_crates(&pkgs);
    let mut problems = Vec::new();
    for name in allowed.keys() {
        if !ours.contains(name) {
            problems.push(format!(
                "the table has a row for {name}, which is not a workspace crate"
            ));
        }
    }
    for p in &pkgs {
        let Some(row) = allowed.get(&p.name) else {
            problems.push(format!("{} has no row in the table", p.name));
            continue;
        };
        // Baton dependency → declared only as a dev-dependency?
        let mut actual: BTreeMap<String, bool> = BTreeMap::new();
        for d in p
            .deps
            .iter()
            .filter(|d| ours.contains(&d.package) && d.package != p.name)
        {
            let dev_only = actual.get(&d.package).copied().unwrap_or(true) && d.kind == Kind::Dev;
            actual.insert(d.package.clone(), dev_only);
        }
        for (dep, &dev_only) in &actual {
            match row.get(dep) {
                None => problems.push(format!(
                    "{} depends on {dep}, which ARCHITECTURE.md does not allow",
                    p.name
                )),
                Some(true) if !dev_only => problems.push(format!(
                    "{} depends on {dep} outside [dev-dependencies]; the table allows it only \
                     as a dev-dependency",
                    p.name
                )),
                Some(false) if dev_only => problems.push(format!(
                    "{} depends on {dep} only as a dev-dependency: mark it `(dev)` in the table",
                    p.name
                )),
                Some(_) => {}
            }
        }
        for dep in row.keys() {
            if !actual.contains_key(dep) {
                problems.push(format!(
                    "the table lets {} depend on {dep}, but it does not: remove it from the row",
                    p.name
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's crate dependency table and the manifests disagree:\n  {}\n\
         (change the table only with the rule it encodes in mind)",
        problems.join("\n  ")
    );
}

/// Every declared dependency is named by a source file of its kind.
#[test]
fn no_unused_dependencies() {
    let found: BTreeSet<(String, String, Kind)> = packages()
        .iter()
        .flat_map(unused::unused)
        .map(|u| (u.package, u.dep, u.kind))
        .collect();
    let allowed: BTreeSet<(String, String, Kind)> = UNUSED_ALLOWED
        .iter()
        .map(|(p, d, k, _)| (p.to_string(), d.to_string(), *k))
        .collect();
    let new: Vec<_> = found.difference(&allowed).collect();
    let stale: Vec<_> = allowed.difference(&found).collect();
    assert!(
        new.is_empty() && stale.is_empty(),
        "unused dependencies (remove them, or move a test-only one to [dev-dependencies]):\n  \
         {new:?}\nallow-listed but used after all (delete the UNUSED_ALLOWED entry): {stale:?}"
    );
}

/// No file-level import cycles inside a crate, and no file using its parent module's items,
/// beyond the allow-lists.
#[test]
fn no_module_cycles() {
    let mut cycles: BTreeSet<(String, BTreeSet<String>)> = BTreeSet::new();
    let mut reach: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut report = Vec::new();
    for p in packages() {
        for t in p.targets.iter().filter(|t| {
            t.kinds.iter().any(|k| k == "lib" || k == "bin")
                && t.src_path.starts_with(p.dir.join("src"))
        }) {
            let g = modules::analyse(&t.src_path).unwrap_or_else(|e| panic!("{}: {e}", p.name));
            for c in &g.cycles {
                cycles.insert((p.name.clone(), c.clone()));
                report.push(format!("{}: cycle {:?}", p.name, c));
                for e in g
                    .edges
                    .iter()
                    .filter(|e| c.contains(&e.from) && c.contains(&e.to))
                {
                    report.push(format!("    {} -> {}: {:?}", e.from, e.to, e.paths));
                }
            }
            for e in &g.reach_backs {
                reach
                    .entry((p.name.clone(), e.to.clone()))
                    .or_default()
                    .insert(e.from.clone());
                report.push(format!(
                    "{}: {} reaches back into {}: {:?}",
                    p.name, e.from, e.to, e.paths
                ));
            }
        }
    }
    let allowed_cycles: BTreeSet<(String, BTreeSet<String>)> = CYCLES_ALLOWED
        .iter()
        .map(|(p, files, _)| (p.to_string(), files.iter().map(|f| f.to_string()).collect()))
        .collect();
    let allowed_reach: BTreeMap<(String, String), BTreeSet<String>> = REACH_BACKS_ALLOWED
        .iter()
        .map(|(p, to, from, _)| {
            (
                (p.to_string(), to.to_string()),
                from.iter().map(|f| f.to_string()).collect(),
            )
        })
        .collect();
    let mut problems = Vec::new();
    for c in cycles.difference(&allowed_cycles) {
        problems.push(format!("new cycle in {}: {:?}", c.0, c.1));
    }
    for c in allowed_cycles.difference(&cycles) {
        problems.push(format!(
            "CYCLES_ALLOWED lists {} {:?}, which is no longer a cycle as listed: shrink the entry",
            c.0, c.1
        ));
    }
    for (key, from) in &reach {
        if allowed_reach.get(key) != Some(from) {
            problems.push(format!(
                "{}: files reaching back into {} are {:?}, REACH_BACKS_ALLOWED says {:?}",
                key.0,
                key.1,
                from,
                allowed_reach.get(key)
            ));
        }
    }
    for key in allowed_reach.keys().filter(|k| !reach.contains_key(*k)) {
        problems.push(format!(
            "REACH_BACKS_ALLOWED lists {} {}, which nothing reaches back into any more: delete it",
            key.0, key.1
        ));
    }
    assert!(
        problems.is_empty(),
        "module cycles:\n  {}\n\nwhat was found:\n{}",
        problems.join("\n  "),
        report.join("\n")
    );
}

/// The replica crates' clippy.toml files (OS randomness and clocks only through
/// `Environment`) are one rule in three copies, because clippy reads the nearest file only:
/// the copies must stay equal, and each crate of the rule must have one.
#[test]
fn replica_crates_share_one_clippy_config() {
    let root = workspace::root();
    let read = |c: &str| {
        std::fs::read_to_string(root.join("crates").join(c).join("clippy.toml"))
            .unwrap_or_else(|e| panic!("crates/{c}/clippy.toml: {e}"))
    };
    let raft = read("baton-raft");
    assert!(raft.contains("rand::random") && raft.contains("std::time::SystemTime::now"));
    for c in ["baton-core", "baton-server"] {
        assert_eq!(
            read(c),
            raft,
            "crates/{c}/clippy.toml differs from baton-raft's"
        );
    }
}
