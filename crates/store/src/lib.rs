//! kura-store: kura's native key-value store (issue 18), built for the engine rather than
//! ported: an LSM tree (`docs/kvstore-design.md`) on a raw device with its own superblock (and,
//! later, as files on AccelFS).
//!
//! This crate owns the on-disk format of `docs/kvstore-format.md` ([`format`]: encoders and
//! checked decoders of every record and page), sorted runs ([`run`]) and the store ([`Store`]:
//! group commit into the log, the memtable with snapshots, get/put/delete/batch/scan merged over
//! the memtable and the runs, memtable flush into level-0 runs once it passes
//! [`StoreOptions::memtable_bytes`], level merges and [`Store::compact`], the manifest that
//! records runs and the log start, freeing of log segments and replaced runs, recovery from
//! superblock + manifest + log tail, [`StoreStats`]), flush and compaction on a background
//! thread the store owns, and one memory budget ([`StoreOptions::memory_budget`]: memtables,
//! the page cache of run pages and the runs' bloom filters and footers). Readers read run pages
//! and values on device queues of their own (siblings of the store's, `reads.rs`) through a
//! sharded page cache of shared pages, so gets do not wait on one device lock. For now values
//! above the inline threshold are copied into the runs (not separated into the log as the
//! design plans).

#![forbid(unsafe_code)]

mod cache;
mod error;
pub mod format;
mod log;
mod manifest;
mod memtable;
mod reads;
pub mod run;
mod segments;
mod space;
mod store;
mod tree;

pub use error::StoreError;
pub use memtable::Pair;
pub use store::{
    Snapshot, Store, StoreOptions, StoreStats, WriteBatch, DEFAULT_CACHE_BYTES, MAX_MERGE_PARTS,
};
