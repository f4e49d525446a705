//! Declared dependencies that no source file of the right kind names.
//!
//! A dependency counts as used when a path starts with its library name (`tokio::spawn`,
//! `#[tokio::main]`, `#[derive(serde::Serialize)]`, `use serde::{Deserialize, Serialize}` —
//! a derive needs its macro in scope, so derive-only crates are seen through the `use`), or it
//! is named by `use name`/`extern crate name`. Where it must be named depends on its kind:
//! - `[dependencies]`: in `src/` (the lib and bins; a normal dependency only the tests name
//!   belongs in `[dev-dependencies]`);
//! - `[dev-dependencies]`: anywhere but `build.rs` (tests, benches, examples, `#[cfg(test)]`);
//! - `[build-dependencies]`: in the build script.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::lex::{tokenize, Tok};
use crate::workspace::{Kind, Package};

/// A dependency nobody names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unused {
    /// The package declaring it.
    pub package: String,
    /// The dependency's package name.
    pub dep: String,
    /// Where it is declared.
    pub kind: Kind,
}

/// Every unused dependency of `pkg` (a package depending on itself, to turn on its own
/// features for its tests, is not reported).
pub fn unused(pkg: &Package) -> Vec<Unused> {
    let build_scripts: Vec<PathBuf> = pkg
        .targets
        .iter()
        .filter(|t| t.kinds.iter().any(|k| k == "custom-build"))
        .map(|t| t.src_path.clone())
        .collect();
    let mut all = Vec::new();
    rust_files(&pkg.dir, &mut all);
    let src = pkg.dir.join("src");
    let in_src: Vec<&PathBuf> = all.iter().filter(|f| f.starts_with(&src)).collect();
    let not_build: Vec<&PathBuf> = all.iter().filter(|f| !build_scripts.contains(f)).collect();
    let named = |files: &[&PathBuf]| -> BTreeSet<String> {
        files.iter().flat_map(|f| crate_names(f)).collect()
    };
    let normal = named(&in_src);
    let dev = named(&not_build);
    let build = named(&build_scripts.iter().collect::<Vec<_>>());
    let mut out: Vec<Unused> = pkg
        .deps
        .iter()
        .filter(|d| d.package != pkg.name)
        .filter(|d| {
            let seen = match d.kind {
                Kind::Normal => &normal,
                Kind::Dev => &dev,
                Kind::Build => &build,
            };
            !seen.contains(&d.lib())
        })
        .map(|d| Unused {
            package: pkg.name.clone(),
            dep: d.package.clone(),
            kind: d.kind,
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The `.rs` files under `dir`, skipping build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Names that start a path (`x::…`, not `a::x::…` or `.x::`), or follow `use`/`extern crate`.
fn crate_names(file: &Path) -> BTreeSet<String> {
    let text = fs::read_to_string(file).unwrap_or_default();
    let t = tokenize(&text);
    let mut names = BTreeSet::new();
    for i in 0..t.len() {
        let Some(word) = t[i].ident() else { continue };
        let prev = i.checked_sub(1).map(|p| &t[p]);
        // A leading `::` (`::tokio::spawn`) follows a non-path token.
        let leading_sep = prev.is_some_and(|p| p.tok == Tok::PathSep)
            && (i < 2 || !(t[i - 2].ident().is_some() || t[i - 2].is('>')));
        let starts = !prev.is_some_and(|p| p.tok == Tok::PathSep || p.is('.')) || leading_sep;
        let next_sep = t.get(i + 1).is_some_and(|n| n.tok == Tok::PathSep);
        let after_use = prev.and_then(|p| p.ident()) == Some("use")
            || (prev.and_then(|p| p.ident()) == Some("crate")
                && i >= 2
                && t[i - 2].ident() == Some("extern"));
        if (starts && next_sep) || after_use {
            names.insert(word.to_owned());
        }
    }
    names
}
