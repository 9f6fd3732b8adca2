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
mod ffi;

pub use db::{Db, DbOptions, Pair, Snapshot, Store, WriteBatch};
pub use error::KvError;
