//! The dashboard `baton serve` answers at `/ui`: members, locks with their queues,
//! elections, leases, watchers, sagas and 2PC transactions, updated live.
//!
//! It is a client of the cluster like `baton status` (`gather.rs`), mounted on the
//! member's HTTP router through `ServerConfig::http_extension`, so the server crate knows
//! nothing of it. Layers, each in its own file: `config.rs` (what `serve` passes, the
//! bounds), `snapshot.rs` (what one refresh reads), `gather.rs` (reading it), `scrape.rs`
//! (watcher counts from `/metrics`), `view.rs` (the view model: order and cuts, pure and
//! unit-tested), `render.rs` (HTML, escaped by maud), `session.rs` (login and the session
//! cookie), `routes.rs` (the axum routes and the live stream).

mod config;
mod gather;
mod render;
mod routes;
mod scrape;
mod session;
mod snapshot;
mod view;

pub use config::DashboardConfig;
pub use routes::router;
