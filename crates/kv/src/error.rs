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

/// What [`KvError::Unavailable`] says in a build without LevelDB.
pub(crate) const NO_LEVELDB: &str =
    "kura-kv was built without Google LevelDB: install libleveldb-dev and rebuild";

/// Prefixes the bridge gives messages about C++ exceptions it caught (`kOutOfMemory`,
/// `kCppException` in `cpp/kura_leveldb.cc`); they may sit inside a LevelDB status message
/// ("IO error: ...") when an Env method caught them.
const BRIDGE_OOM: &str = "kura-bridge: out of memory";
const BRIDGE_EXCEPTION: &str = "kura-bridge: C++ exception";

impl KvError {
    /// The typed error for a message from the bridge (a LevelDB status string or a caught C++
    /// exception).
    pub(crate) fn from_bridge(msg: String) -> KvError {
        if msg.contains(BRIDGE_OOM) {
            KvError::OutOfMemory(msg)
        } else if msg.contains(BRIDGE_EXCEPTION) {
            KvError::CppException(msg)
        } else if msg.starts_with("Corruption") {
            KvError::Corruption(msg)
        } else if msg.contains("does not exist") || msg.starts_with("NotFound") {
            KvError::NotFound(msg)
        } else if msg.contains("lock ") && msg.contains("already held") {
            KvError::Locked(msg)
        } else if msg.contains("no space left") {
            KvError::NoSpace(msg)
        } else if msg.starts_with("Invalid argument") {
            KvError::Invalid(msg)
        } else {
            KvError::Io(msg)
        }
    }

    /// The error of every call in a build without LevelDB.
    pub(crate) fn no_leveldb() -> KvError {
        KvError::Unavailable(NO_LEVELDB.into())
    }
}
