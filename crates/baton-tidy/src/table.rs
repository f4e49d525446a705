//! The crate dependency table of ARCHITECTURE.md, parsed.
//!
//! The table is the rule: the tidy test compares it with the manifests both ways, so the
//! document and the build cannot drift. Its rows look like
//!
//! ```text
//! | `baton-server` | `baton-core`, `baton-proto`, `baton-raft` | … why … |
//! ```
//!
//! The first cell is the crate, the second the Baton crates it may depend on (`—` for none);
//! a name followed by `(dev)` is allowed only as a dev-dependency. Later cells are prose.

use std::collections::BTreeMap;

/// May-depend-on edges: crate → (Baton dependency → dev-only?).
pub type Allowed = BTreeMap<String, BTreeMap<String, bool>>;

/// The heading the table lives under.
pub const HEADING: &str = "## Crate dependencies";

/// Parses the first table after [`HEADING`] in `doc`.
pub fn parse(doc: &str) -> Result<Allowed, String> {
    let start = doc
        .find(HEADING)
        .ok_or_else(|| format!("ARCHITECTURE.md has no `{HEADING}` section"))?;
    let mut allowed = Allowed::new();
    let mut in_table = false;
    for line in doc[start..].lines().skip(1) {
        let line = line.trim();
        if !line.starts_with('|') {
            if in_table {
                break;
            }
            continue;
        }
        in_table = true;
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [krate, deps, ..] = cells[..] else {
            return Err(format!("a row with fewer than two cells: {line}"));
        };
        // The header and the `|---|` line name no crate in backticks.
        let Some(name) = backticked(krate).into_iter().next() else {
            continue;
        };
        let mut to = BTreeMap::new();
        for part in deps.split(',') {
            let part = part.trim();
            if part.is_empty() || part == "—" {
                continue;
            }
            let dep = backticked(part)
                .into_iter()
                .next()
                .ok_or_else(|| format!("`{part}` in the row of {name} is not a `crate`"))?;
            to.insert(dep, part.ends_with("(dev)"));
        }
        if allowed.insert(name.clone(), to).is_some() {
            return Err(format!("{name} has two rows"));
        }
    }
    if allowed.is_empty() {
        return Err(format!("no table rows under `{HEADING}`"));
    }
    Ok(allowed)
}

/// The `code spans` in a cell.
fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse() {
        let doc = "x\n## Crate dependencies\n\ntext\n\n| crate | may use | why |\n|---|---|---|\n\
                   | `a` | — | leaf |\n| `b` | `a`, `c` (dev) | x |\n\nafter | `z` | — |\n";
        let t = parse(doc).unwrap();
        assert_eq!(t.len(), 2);
        assert!(t["a"].is_empty());
        assert!(!t["b"]["a"]);
        assert!(t["b"]["c"]);
    }
}
