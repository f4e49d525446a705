//! The crate's integration tests, one test binary (one link, not one per file): each
//! module is what was once a file of its own under tests/.

#[macro_use]
mod common;
mod client;
mod lock_loss;
mod recipes;
