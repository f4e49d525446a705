//! The crate's integration tests, one test binary (one link, not one per file): each
//! module is what was once a file of its own under tests/.

// Tests drive replicas from outside: their timeouts and measurements are real time.
#![allow(clippy::disallowed_methods)]

mod cluster;
mod membership;
mod node;
