//! The workspace as `cargo metadata --no-deps` describes it: packages, their declared
//! dependencies and their targets.
//!
//! `--no-deps` because that needs neither the network nor every platform's crates in the
//! local registry (the full resolve asks for Android- and Windows-only crates), and the checks
//! only need what the manifests declare. The one thing it lacks, a dependency's library name,
//! is its package name with `-` as `_` for every crate Baton uses (checked once by hand with
//! the full metadata); `Dep::lib` says where that assumption lives.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// How a dependency is declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `[dependencies]`.
    Normal,
    /// `[dev-dependencies]`.
    Dev,
    /// `[build-dependencies]`.
    Build,
}

/// One declared dependency.
#[derive(Clone, Debug)]
pub struct Dep {
    /// The package name (`tokio-postgres`).
    pub package: String,
    /// The name it is renamed to in the manifest, if any.
    pub rename: Option<String>,
    /// Normal, dev or build.
    pub kind: Kind,
}

impl Dep {
    /// The name code uses for it: the rename, else the package name with `-` as `_`.
    pub fn lib(&self) -> String {
        self.rename
            .as_deref()
            .unwrap_or(&self.package)
            .replace('-', "_")
    }
}

/// One build target of a package.
#[derive(Clone, Debug)]
pub struct Target {
    /// `lib`, `bin`, `test`, `example`, `bench`, `custom-build`, `proc-macro`, …
    pub kinds: Vec<String>,
    /// Its root source file.
    pub src_path: PathBuf,
}

/// One workspace member.
#[derive(Clone, Debug)]
pub struct Package {
    /// The package name (`baton-raft`).
    pub name: String,
    /// The directory holding its `Cargo.toml`.
    pub dir: PathBuf,
    /// Declared dependencies, as the manifest lists them.
    pub deps: Vec<Dep>,
    /// Its targets.
    pub targets: Vec<Target>,
}

/// The workspace root: two levels above this crate.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The workspace members, sorted by name.
pub fn packages() -> Vec<Package> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let mut pkgs: Vec<Package> = v["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(package)
        .collect();
    pkgs.sort_by(|a, b| a.name.cmp(&b.name));
    pkgs
}

fn package(p: &Value) -> Package {
    let s = |v: &Value| v.as_str().expect("a string").to_owned();
    let manifest = PathBuf::from(s(&p["manifest_path"]));
    let deps = p["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .map(|d| Dep {
            package: s(&d["name"]),
            rename: d["rename"].as_str().map(str::to_owned),
            kind: match d["kind"].as_str() {
                None => Kind::Normal,
                Some("dev") => Kind::Dev,
                Some("build") => Kind::Build,
                Some(k) => panic!("unknown dependency kind {k}"),
            },
        })
        .collect();
    let targets = p["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| Target {
            kinds: t["kind"].as_array().expect("kind").iter().map(s).collect(),
            src_path: PathBuf::from(s(&t["src_path"])),
        })
        .collect();
    Package {
        name: s(&p["name"]),
        dir: manifest.parent().expect("a directory").to_path_buf(),
        deps,
        targets,
    }
}
