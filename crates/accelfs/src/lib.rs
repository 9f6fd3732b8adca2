//! AccelFS: a file system built for kura's direct I/O engine (format: `docs/accelfs-format.md`).
//!
//! Work in progress (issue 3): this crate so far holds the on-disk encoding of the format, each
//! piece with tests: checksums ([`crc`]), sealed metadata block headers ([`header`]), the
//! superblock and region layout ([`layout`]), allocation bitmaps ([`bitmap`]), inodes
//! ([`inode`]), block maps ([`extent`]), directory blocks ([`dir`]), journal records and the
//! recovery scan ([`journal`]), the journal at run time — commit, checkpoint, recovery —
//! ([`wal`]), [`mkfs`] and a read-only [`fsck`]. Mounting, the file API, the cache, FUSE and
//! the tools come next.

#![deny(unsafe_code)]

pub mod bitmap;
pub mod blockio;
pub mod crc;
pub mod dir;
pub mod error;
pub mod extent;
pub mod fs;
pub mod fsck;
pub mod header;
pub mod inode;
pub mod journal;
pub mod layout;
pub mod mkfs;
pub mod repair;
pub mod wal;

pub use error::{FormatError, FsError};
pub use fs::{
    DirEntryInfo, File, FileSystem, FileType, FsStats, Metadata, MountOptions, OpenOptions,
};
pub use fsck::{fsck, FsckReport};
pub use mkfs::{mkfs, MkfsOptions};
