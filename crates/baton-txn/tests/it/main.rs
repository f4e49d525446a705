//! The crate's integration tests, one test binary (one link, not one per file): each
//! module is what was once a file of its own under tests/.

mod common;
mod crash;
mod http;
mod idempotency;
mod inbox;
mod mariadb_xa;
mod outbox;
mod overview;
mod relay_amqp;
mod relay_ha;
mod relay_nats;
mod saga_common;
mod saga_crash;
mod saga_ops;
mod saga_order;
mod twopc_bank;
mod twopc_cli;
mod twopc_pg;
