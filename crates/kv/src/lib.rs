//! kura-kv: Google LevelDB with every file it writes (log, tables, MANIFEST, CURRENT, LOCK,
//! LOG) on AccelFS, through LevelDB's `Env` seam — the paper's port of LevelDB onto the
//! accelerator file system, so applications need no change.
//!
//! `cpp/kura_leveldb.cc` holds the `Env` (file calls go to AccelFS through callbacks in
//! [`ffi`]; LevelDB's background compaction thread and clock are the default Env's) and a small
//! C ABI over `leveldb::DB`; [`Db`] is the safe API. The same API opens a host directory through
//! LevelDB's own POSIX Env, so the two compare one for one.

mod db;
mod error;
#[allow(unsafe_code)]
// the only unsafe code: the bridge's C ABI, the handles over it, the Env callbacks
mod ffi;

pub use db::{Db, DbOptions, Location, Pair, Snapshot, WriteBatch};
pub use error::KvError;

/// Whether this build has the LevelDB engine. Without it (`libleveldb-dev` missing at build time,
/// or `KURA_NO_LEVELDB=1`), every [`Db::open`] fails with [`KvError::Unavailable`], saying how to
/// install it.
pub fn leveldb_available() -> bool {
    !cfg!(kura_no_leveldb)
}

/// Fault injection into the C++ bridge, compiled in only with the `test-hooks` feature (which
/// only this crate's tests turn on): makes the bridge throw so tests can check that no C++
/// exception reaches Rust and each becomes a [`KvError`].
#[cfg(feature = "test-hooks")]
pub mod test_hooks {
    /// Where the armed exception is thrown: the next such point on the calling thread.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Site {
        /// The next bridge entry point (put, get, write, scan, open, ...).
        BridgeCall = 1,
        /// The next Env or file method LevelDB calls (open a file, read, append, ...).
        EnvCall = 2,
        /// The next name the Rust listing hands GetChildren (the C++ callback Rust calls).
        ListedName = 3,
    }

    /// What is thrown.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Throw {
        BadAlloc = 1,
        /// A `std::runtime_error("injected by kura_test_throw")`.
        RuntimeError = 2,
        /// An `int`: not a `std::exception`, so only `catch (...)` sees it.
        NotStdException = 3,
    }

    /// Arms one throw of `what` at the next `site` on this thread.
    pub fn throw_once(site: Site, what: Throw) {
        crate::ffi::test_throw(site as std::ffi::c_int, what as std::ffi::c_int);
    }
}
