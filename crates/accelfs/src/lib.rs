//! AccelFS: a file system built for kura's direct I/O engine (format: `docs/accelfs-format.md`).
//!
//! Work in progress (issue 3): this crate so far holds the on-disk encoding of the format —
//! checksums, metadata block headers and the superblock/layout — each with tests.

#![deny(unsafe_code)]

pub mod crc;
pub mod error;
pub mod header;
pub mod layout;

pub use error::FormatError;
