//! The crate's integration tests, one test binary (one link, not one per file): each
//! module is what was once a file of its own under tests/.

mod golden;
mod model;
mod mvcc_ops;
mod script;
