//! AccelFS: a file system built for kura's direct I/O engine (format: `docs/accelfs-format.md`).
//!
//! The on-disk encoding, each piece with tests: sealed metadata block headers ([`header`], with
//! the engine's CRC32C, [`kura_engine::crc32c`]), the superblock and region layout with the
//! limits an image must respect ([`layout`]), allocation bitmaps ([`bitmap`]), inodes
//! ([`inode`]), block maps ([`extent`]), directory blocks ([`dir`]), extended-attribute blocks ([`xattr`]), journal records and the
//! recovery scan ([`journal`]); the journal at run time — commit, checkpoint, recovery, in-memory
//! replay for read-only mounts — ([`wal`]); [`mkfs`], [`fsck`] (never writes) and [`repair`]; and
//! the mounted file system ([`fs`]), read-write or read-only. Images are untrusted: every size,
//! count and pointer read from one is checked against the layout before use (format §11).

// Unsafe code only in the state lock (`fs/striped.rs`), allowed there by name.
#![deny(unsafe_code)]

pub mod bitmap;
pub mod dir;
pub mod error;
pub mod extent;
pub mod fs;
pub mod fsck;
pub mod fsdevice;
pub mod header;
pub mod inode;
pub mod journal;
pub mod layout;
pub mod mkfs;
pub mod repair;
#[doc(hidden)]
pub mod testing;
pub mod wal;
pub mod xattr;

pub use error::{FormatError, FsError};
pub use fs::{
    DirEntryInfo, Fallocate, File, FileSystem, FileType, FsStats, Metadata, MountOptions, NodeSpec,
    OpenOptions, RenameMode, XattrMode,
};
pub use fsck::{fsck, FsckReport};
pub use mkfs::{mkfs, MkfsOptions};
