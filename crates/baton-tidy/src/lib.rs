//! # baton-tidy
//!
//! Rules of ARCHITECTURE.md that check themselves. The tests in `tests/tidy.rs` run in
//! `cargo test --workspace` (so in `scripts/test` and CI) and fail when
//!
//! - a crate depends on a Baton crate the table in ARCHITECTURE.md ("Crate dependencies")
//!   does not allow, or the table allows an edge the manifests no longer have
//!   ([`table`], [`workspace`]);
//! - a crate declares a dependency none of its sources names ([`unused`]);
//! - files of a crate import each other in a cycle, or a file reaches back into an item of
//!   the module that declares it ([`modules`]).
//!
//! Each test keeps its known exceptions in a commented allow-list that may only shrink: an
//! entry that no longer matches anything fails the test too.
//!
//! The crate reads source text and `cargo metadata --no-deps` only, with one small
//! tokenizer ([`lex`]) instead of `syn`, so the checks cost CI a few seconds and no build of
//! the rest of the workspace.

#![deny(missing_docs)]

pub mod lex;
pub mod modules;
pub mod table;
pub mod unused;
pub mod workspace;
