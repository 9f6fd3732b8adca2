//! `snapshot(CHILD)` — LeapIO's versioned drive: copy-on-write snapshots and clones of a drive,
//! with readers pinned to a version while writers advance the head, and every version's map kept
//! on the child so the drive survives power cuts.
//!
//! # Spec forms
//! - `snapshot(CHILD)` — the live head, writable.
//! - `snapshot(CHILD)?at=NAME` — a read-only view of snapshot NAME (writes fail with
//!   `Unsupported`); it can be open next to the head, and sees the snapshot's data however the
//!   head changes.
//! - `snapshot(CHILD)?branch=NAME` — the writable clone NAME.
//! - `snapshot(CHILD)?format=1[&chunk=64K][&size=SIZE][&maps=8]` — formats CHILD first (refused
//!   when CHILD already holds a snapshot drive; `kura drive format --force` overwrites one).
//!
//! [`SnapshotVolume`] holds the control operations: [`SnapshotVolume::take_snapshot`],
//! [`SnapshotVolume::rollback`], [`SnapshotVolume::clone_version`],
//! [`SnapshotVolume::delete`], [`SnapshotVolume::list`].
//!
//! Open a drive once per process and take every handle from that [`SnapshotVolume`]
//! ([`SnapshotDrive::volume`] gives it back from a handle): the head, any number of views
//! ([`SnapshotVolume::reader`]) and one writer per clone then share one child, one allocator and
//! one set of maps, and a snapshot with an open view cannot be deleted. Two spec strings opened
//! separately on the same child are two volumes that know nothing of each other: a view opened
//! that way is not protected from a delete through the other, and two writers would corrupt
//! the drive.
//!
//! # Design
//! The child holds two superblock slots (blocks 0 and 1), two metadata halves, and a data area
//! cut into chunks (64 KiB by default). Each version (the head, snapshots, clones) is a map from
//! virtual chunk to physical chunk; a chunk no version maps is free, so the allocator is the
//! reference counts rebuilt from the maps at open. Taking a snapshot copies the head's map and
//! bumps the counts (metadata only, no data copy). A write to a chunk its version shares with
//! another (count > 1) copies the chunk to a fresh one first (copy-on-write); a write to a chunk
//! never written gets a fresh chunk whose rest is zeroes, so no block ever shows data that was
//! not written to it; a write to a chunk the version owns alone goes in place, straight to the
//! child at queue depth.
//!
//! Crash consistency comes from ordering and copy-on-write of the metadata itself: a flush on a
//! writable version (and every control operation) waits for the child, flushes the data, writes
//! the whole metadata blob to the half the current superblock does *not* name, flushes, writes
//! the superblock slot for the new generation (generation parity picks slot and half), and
//! flushes again. A crash at any point leaves the older superblock and its blob intact, and a
//! new superblock is only ever written after its blob is durable. Chunks a version stops using
//! are quarantined until the commit that drops them is durable, so a crash can never bring back a
//! map whose chunk was reused meanwhile. So after a power cut the drive opens at the last
//! completed commit: every write acknowledged before the last completed flush is there, every
//! snapshot whose operation returned is intact, and writes after it may or may not be.
//!
//! The metadata area is sized at format for `maps` full maps; frozen snapshots cost what they
//! map, writable versions reserve a full map, and a snapshot or clone that would overflow it is
//! refused ([`SnapshotError::MetadataFull`]), so a commit never runs out of room. When the data
//! area is full a write completes with ENOSPC (`DeviceError::Io`) and changes nothing it did
//! not already own. Every on-disk byte is described in `docs/snapshot-format.md`.

pub mod drive;
pub mod format;
pub mod volume;

pub use drive::SnapshotDrive;
pub use volume::{FormatOptions, SpaceInfo, VersionInfo, VersionKind};

use drive::{lock, Shared};
use kura_engine::open::ChildOpener;
use kura_engine::{BlockDevice, DeviceError, Errno, Opcode, OpenError, Spec};
use std::sync::{Arc, Mutex};
use volume::Core;

/// Options of `snapshot(...)`.
pub const SNAPSHOT_OPTIONS: &[&str] = &["at", "branch", "format", "chunk", "size", "maps"];

/// What went wrong with a snapshot drive or one of its operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The device holds no snapshot-drive superblock.
    #[error("{device} is not a snapshot drive (format it with `kura drive format` or `snapshot(...)?format=1`)")]
    NotSnapshotDrive { device: String },
    /// Formatting was asked for on a device that already holds a snapshot drive.
    #[error(
        "{device} already holds a snapshot drive (use `kura drive format --force` to overwrite it)"
    )]
    AlreadyFormatted { device: String },
    /// The on-disk metadata fails a check.
    #[error("snapshot drive metadata is corrupt: {what}")]
    Corrupt { what: String },
    #[error("no snapshot or clone named `{name}`")]
    NoSuchSnapshot { name: String },
    #[error("`{name}` exists already")]
    NameExists { name: String },
    #[error("bad name `{name}`: {why}")]
    BadName { name: String, why: String },
    /// A read-only view was asked of a writable version, or the other way round.
    #[error("`{name}` is a {is}, not a {wanted}")]
    WrongKind {
        name: String,
        is: &'static str,
        wanted: &'static str,
    },
    #[error("cannot {what}")]
    HeadReserved { what: &'static str },
    /// The version is open (a view or a writer) and cannot be deleted or opened again for writing.
    #[error("`{name}` is open; close its views and writers first")]
    Busy { name: String },
    /// The metadata area cannot hold another map.
    #[error("metadata area full: {needed} bytes needed, {room} available (delete a snapshot, or format with a larger maps=)")]
    MetadataFull { needed: u64, room: u64 },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl SnapshotError {
    /// The error as a device command's status.
    pub(crate) fn into_device(self, op: Opcode) -> DeviceError {
        match self {
            SnapshotError::Device(e) => e,
            SnapshotError::MetadataFull { .. } => DeviceError::Io {
                op,
                lba: 0,
                errno: Errno(libc::ENOSPC),
            },
            other => DeviceError::Offline {
                reason: other.to_string(),
            },
        }
    }
}

impl From<SnapshotError> for OpenError {
    fn from(e: SnapshotError) -> Self {
        OpenError::Invalid(e.to_string())
    }
}

/// A snapshot drive: its versions and the operations on them. Cheap to clone; every clone and
/// every [`SnapshotDrive`] handle share one state.
#[derive(Clone)]
pub struct SnapshotVolume {
    core: Shared,
}

impl SnapshotVolume {
    /// Formats `child` as an empty snapshot drive, overwriting whatever it held.
    pub fn format(
        child: Box<dyn BlockDevice>,
        opts: FormatOptions,
    ) -> Result<SnapshotVolume, SnapshotError> {
        Ok(SnapshotVolume {
            core: Arc::new(Mutex::new(Core::format(child, opts)?)),
        })
    }

    /// Opens the snapshot drive on `child`.
    pub fn open(child: Box<dyn BlockDevice>) -> Result<SnapshotVolume, SnapshotError> {
        Ok(SnapshotVolume {
            core: Arc::new(Mutex::new(Core::open(child)?)),
        })
    }

    /// Opens the drive on `child`, or formats it when it holds none; refuses to format over an
    /// existing or damaged one.
    pub fn create(
        mut child: Box<dyn BlockDevice>,
        opts: FormatOptions,
    ) -> Result<SnapshotVolume, SnapshotError> {
        let device = child.describe();
        let bs = child.geometry().block_size as usize;
        let mut first = vec![0u8; bs * 2];
        use kura_engine::BlockingIo;
        child.read_blocks(0, &mut first)?;
        if first.chunks(bs).any(|b| b.starts_with(format::SB_MAGIC)) {
            return Err(SnapshotError::AlreadyFormatted { device });
        }
        SnapshotVolume::format(child, opts)
    }

    /// The writable head.
    pub fn head(&self) -> Result<SnapshotDrive, SnapshotError> {
        self.writer(format::HEAD)
    }

    /// A writable handle on the head or on clone `name`; one writer per version at a time.
    pub fn writer(&self, name: &str) -> Result<SnapshotDrive, SnapshotError> {
        let mut core = lock(&self.core);
        let vi = core.find(name)?;
        let v = &mut core.versions[vi];
        if !v.writable {
            return Err(SnapshotError::WrongKind {
                name: name.into(),
                is: "snapshot (read-only; open it with ?at=)",
                wanted: "writable clone",
            });
        }
        if v.writer {
            return Err(SnapshotError::Busy { name: name.into() });
        }
        v.writer = true;
        Ok(SnapshotDrive::new(self.core.clone(), &mut core, vi, true))
    }

    /// A read-only view pinned to snapshot `name`; the snapshot cannot be deleted while it is
    /// open.
    pub fn reader(&self, name: &str) -> Result<SnapshotDrive, SnapshotError> {
        let mut core = lock(&self.core);
        let vi = core.find(name)?;
        let v = &mut core.versions[vi];
        if v.writable {
            return Err(SnapshotError::WrongKind {
                name: name.into(),
                is: if name == format::HEAD {
                    "head"
                } else {
                    "writable clone (open it with ?branch=)"
                },
                wanted: "snapshot",
            });
        }
        v.readers += 1;
        Ok(SnapshotDrive::new(self.core.clone(), &mut core, vi, false))
    }

    /// Freezes the head as snapshot `name` (metadata only) and commits.
    pub fn take_snapshot(&self, name: &str) -> Result<(), SnapshotError> {
        lock(&self.core).add_version(format::HEAD, name, false)
    }

    /// Makes writable clone `new` from version `from` and commits.
    pub fn clone_version(&self, from: &str, new: &str) -> Result<(), SnapshotError> {
        lock(&self.core).add_version(from, new, true)
    }

    /// Makes the head equal version `name` and commits; the head's own data since is dropped.
    pub fn rollback(&self, name: &str) -> Result<(), SnapshotError> {
        lock(&self.core).rollback(name)
    }

    /// Removes snapshot or clone `name`, freeing chunks no other version uses, and commits.
    pub fn delete(&self, name: &str) -> Result<(), SnapshotError> {
        lock(&self.core).delete(name)
    }

    /// Every version, in creation order.
    pub fn list(&self) -> Vec<VersionInfo> {
        lock(&self.core).list()
    }

    pub fn space(&self) -> SpaceInfo {
        lock(&self.core).space()
    }
}

/// Format options from a spec (`chunk`, `size`, `maps`).
fn format_options(spec: &Spec) -> Result<FormatOptions, OpenError> {
    let mut opts = FormatOptions::default();
    if let Some(chunk) = spec.size_option("chunk")? {
        opts.chunk_bytes = u32::try_from(chunk)
            .map_err(|_| OpenError::Invalid(format!("{spec}: chunk={chunk} is too large")))?;
    }
    opts.virtual_bytes = spec.size_option("size")?;
    if let Some(maps) = spec.num_option("maps")? {
        opts.maps = maps;
    }
    Ok(opts)
}

/// Opens `snapshot(CHILD)` with its options; see the module docs.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<SnapshotDrive, OpenError> {
    spec.check_options(SNAPSHOT_OPTIONS)?;
    let formatting = spec.bool_option("format")?.unwrap_or(false);
    if !formatting {
        if let Some(k) = ["chunk", "size", "maps"]
            .into_iter()
            .find(|k| spec.option(k).is_some())
        {
            return Err(OpenError::Invalid(format!(
                "{spec}: `{k}` applies only when formatting (add format=1)"
            )));
        }
    }
    let (at, branch) = (spec.option("at"), spec.option("branch"));
    if at.is_some() && branch.is_some() {
        return Err(OpenError::Invalid(format!(
            "{spec}: give `at` (a snapshot view) or `branch` (a clone), not both"
        )));
    }
    let opts = format_options(spec)?;
    let mut kids = crate::open_children(spec, children, 1, Some(1))?;
    let child = kids.remove(0);
    let opened = if formatting {
        SnapshotVolume::create(child, opts)
    } else {
        SnapshotVolume::open(child)
    };
    let volume = opened.map_err(|e| OpenError::Invalid(format!("{spec}: {e}")))?;
    let drive = match (at, branch) {
        (Some(name), _) => volume.reader(name),
        (_, Some(name)) => volume.writer(name),
        _ => volume.head(),
    };
    drive.map_err(|e| OpenError::Invalid(format!("{spec}: {e}")))
}
