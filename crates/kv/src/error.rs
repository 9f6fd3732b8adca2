//! Errors of the key-value store: what LevelDB reported, or what the file system underneath did.

/// An error from the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// LevelDB found damaged data (a table, log or MANIFEST that does not decode or checksum).
    #[error("corruption: {0}")]
    Corruption(String),
    /// The location holds no database and `create_if_missing` was off, or is not a database.
    #[error("not a database: {0}")]
    NotFound(String),
    /// Another handle holds the database's LOCK.
    #[error("database is locked: {0}")]
    Locked(String),
    /// The device is full.
    #[error("no space left: {0}")]
    NoSpace(String),
    /// Any other failure of LevelDB or of the storage under it.
    #[error("{0}")]
    Io(String),
    /// Mounting or formatting the AccelFS device failed.
    #[error("file system: {0}")]
    Fs(#[from] kura_accelfs::FsError),
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The C++ side ran out of memory (`std::bad_alloc` caught at the bridge). The call failed
    /// as a whole; the process and the database handle go on.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// Any other C++ exception caught at the bridge (its `what()`, or that it was not a
    /// `std::exception`), instead of unwinding into Rust.
    #[error("C++ exception: {0}")]
    CppException(String),
    /// This build has no LevelDB engine (libleveldb-dev was missing at build time).
    #[error("{0}")]
    Unavailable(String),
}
