use crate::key::KeyError;

/// Errors of the stores. Outcomes of a claim (replay, in flight, mismatch) are not errors;
/// they are [`crate::pg::Claim`] values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The idempotency key is empty, too long or has characters outside printable ASCII.
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// A schema name must be a plain lower-case SQL identifier, so it can be spliced into
    /// statements without quoting.
    #[error("invalid schema name {0:?}: use 1-63 of [a-z0-9_], not starting with a digit")]
    InvalidSchema(String),
    /// The claim's lease ran out before the work transaction locked it, and another request
    /// with the same key took it over. The work transaction must roll back (the helpers that
    /// return this have already dropped it); the other request's work is the one that counts.
    #[error("the claim on this idempotency key was taken over by another request after its lease ran out; the work was rolled back")]
    ClaimLost,
    /// The database said no or the connection failed.
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The relay's progress write was refused by its [`crate::relay::Fence`]: another relay
    /// holds a newer fencing token, so this one must stop (what it published may go out
    /// again; nothing is lost).
    #[error("the relay was fenced off: {0}")]
    Fenced(String),
    /// A fencing token's signature did not verify against the configured public keys
    /// (forged, altered, another cluster's, an unknown key id, or unsigned): refused before
    /// anything was written or locked.
    #[error("fencing token refused: {0}")]
    InvalidFencingSignature(baton_fencing::VerifyError),
    /// A connection for claims could not be had (see [`crate::http::ClaimConnections`]).
    #[error("no database connection: {0}")]
    Connection(String),
}
