//! Why a file could not be read (or written).

/// A file that is not a bbolt database Baton can read, or a damaged one. Each names what
/// was found, so an operator can tell a truncated copy from a file of another kind.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a bbolt database: {0}")]
    NotBbolt(String),
    #[error("bbolt file format version {found} is not supported (version {supported} is)")]
    Version { found: u32, supported: u32 },
    #[error("both meta pages are damaged (checksum mismatch)")]
    MetaChecksum,
    #[error("the file is truncated: {needed} bytes expected, {found} found")]
    Truncated { needed: u64, found: u64 },
    #[error("page {page}: {what}")]
    Corrupt { page: u64, what: String },
    #[error("keys out of order in bucket {bucket:?}")]
    Order { bucket: String },
    #[error("{0}")]
    Input(String),
}

impl Error {
    pub(crate) fn corrupt(page: u64, what: impl Into<String>) -> Error {
        Error::Corrupt {
            page,
            what: what.into(),
        }
    }
}

/// An I/O error stays itself (a writer's sink may report that its reader went away); the
/// rest become `InvalidData`.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        match e {
            Error::Io(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
        }
    }
}
