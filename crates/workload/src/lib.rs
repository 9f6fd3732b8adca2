//! kura-workload: the operation streams `kura bench kv` drives key-value stores with —
//! db_bench-style fills, reads and deletes, and the YCSB core workloads A–F — plus a trace
//! format that hands the exact same sequence to a peer process (`crates/bench/peers/kv_replay.cc`
//! replays it on RocksDB and LMDB).
//!
//! - [`keys`]: key naming (YCSB `user…`, db_bench 16 digits) and the value pool.
//! - [`dist`]: request distributions (uniform, zipfian, scrambled zipfian, latest).
//! - [`ops`]: [`Op`], [`Workload`], [`ycsb`] and [`db_bench`].
//! - [`trace`]: the binary trace format, its writer and reader.
//! - [`rng`]: the crate's own deterministic generator.
//!
//! ```
//! use kura_workload::{db_bench, ycsb, Op};
//!
//! let w = ycsb('B', 10_000, 100_000, 1000, 1)?;
//! for op in w.load() {
//!     // db.put(op.key().as_bytes(), w.value(&op).unwrap())
//!     assert!(matches!(op, Op::Insert { .. }));
//! }
//! let reads = w.run().filter(|op| matches!(op, Op::Read { .. })).count();
//! assert!(reads > 90_000);
//!
//! let fill = db_bench("fillrandom", 1000, 256, 1)?;
//! assert_eq!(fill.run().count(), 1000);
//! # Ok::<(), kura_workload::Error>(())
//! ```

#![forbid(unsafe_code)]

pub mod dist;
pub mod keys;
pub mod ops;
pub mod rng;
pub mod trace;

pub use keys::{Key, KeyStyle, Value, ValuePool};
pub use ops::{
    db_bench, ycsb, Op, OpKind, Ops, RequestDistribution, Workload, YcsbSpec, DB_BENCH_WORKLOADS,
    YCSB_DEFAULT_VALUE_LEN, YCSB_WORKLOADS,
};
pub use trace::{write_workload, TraceError, TraceHeader, TraceReader, TraceRecord, TraceWriter};

/// A workload that cannot be built as asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Not one of YCSB's core workloads.
    #[error("unknown YCSB workload {0:?}: the core workloads are A, B, C, D, E and F")]
    UnknownYcsb(char),
    /// Not one of the db_bench workloads this crate knows.
    #[error("unknown db_bench workload {name:?}: known are {known}")]
    UnknownDbBench {
        /// The name asked for.
        name: String,
        /// The names known, comma-separated.
        known: String,
    },
    /// A parameter out of range.
    #[error("invalid {name}: {reason}")]
    InvalidParameter {
        /// Which parameter.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}
