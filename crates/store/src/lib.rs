//! kura-store: kura's native key-value store (issue 18), built for the engine rather than
//! ported: an LSM of keys whose values live in the write-ahead log (`docs/kvstore-design.md`),
//! on a raw device with its own superblock (and, later, as files on AccelFS).
//!
//! This crate owns the on-disk format of `docs/kvstore-format.md` ([`format`]: encoders and
//! checked decoders of every record and page), sorted runs ([`run`]) and the store's write path
//! ([`Store`]: group commit into the log, the memtable with snapshots, get/put/delete/batch/scan,
//! recovery by log replay). Flushing the memtable into runs, the manifest, compaction and
//! iterators are specified and come next; until then every key lives in the memtable and the
//! log only grows (see the design's plan).

#![forbid(unsafe_code)]

mod error;
pub mod format;
mod log;
mod memtable;
pub mod run;
mod segments;
mod space;
mod store;

pub use error::StoreError;
pub use memtable::Pair;
pub use store::{Snapshot, Store, StoreOptions, StoreStats, WriteBatch};
