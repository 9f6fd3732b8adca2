//! Test support shared by this crate's unit tests and its integration tests (`tests/`); not
//! part of the file system's API.
//!
//! [`bit_flips`] is the damage both the fsck test ("every flip is noticed") and the repair test
//! ("every flip is repaired") apply to a fresh image, one flip at a time; [`format_ram_disk`]
//! and [`reopen`] make the image and open it again for each check; [`ghost_entry_transaction`]
//! is the journal both the fsck and the repair test leave committed but not yet applied.
//! [`formatted_storage`], [`mount_storage`], [`fsck_problems`] and [`fault_device`] are the
//! image, mount, check and fault-injection steps the whole-file-system tests (`fs_threads`,
//! `fs_crash`, `read_only`, `posix`) all take.

use crate::dir::{self, DirEntry};
use crate::fsdevice::FsDevice;
use crate::inode::Kind;
use crate::journal::{self, JournalArea, Transaction};
use crate::layout::{Layout, Superblock};
use crate::mkfs::{mkfs, MkfsOptions};
use crate::{FileSystem, MountOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{FaultControl, FaultDevice, FaultPlan};
use kura_engine::BlockDevice;

/// A RAM disk of `bytes` with `device_block_size`-byte blocks, formatted by `mkfs` with
/// `block_size`-byte file-system blocks: its storage (to damage and inspect) and the superblock
/// written. Panics if `mkfs` fails: it is for tests.
pub fn format_ram_disk(
    bytes: u64,
    block_size: u32,
    device_block_size: u32,
) -> (MemStorage, Superblock) {
    let dev = MemDevice::new(
        bytes,
        QueueOptions {
            block_size: device_block_size,
            ..QueueOptions::default()
        },
    );
    let storage = dev.storage();
    let mut io = FsDevice::new(Box::new(dev), block_size as usize).expect("block io");
    let sb = mkfs(
        &mut io,
        MkfsOptions {
            block_size,
            inodes: None,
        },
    )
    .expect("mkfs");
    (storage, sb)
}

/// A new RAM disk (default queue options) over `storage`, for one fsck or repair to consume.
pub fn reopen(storage: &MemStorage) -> Box<dyn BlockDevice> {
    Box::new(MemDevice::with_storage(
        storage.clone(),
        QueueOptions::default(),
    ))
}

/// A RAM disk of `bytes` (default queue options) formatted by [`FileSystem::format`] with
/// 4 KiB blocks and unmounted again: its storage. Panics if either step fails: it is for tests.
pub fn formatted_storage(bytes: u64) -> MemStorage {
    let dev = MemDevice::new(bytes, QueueOptions::default());
    let storage = dev.storage();
    FileSystem::format(
        Box::new(dev),
        MkfsOptions {
            block_size: 4096,
            inodes: None,
        },
        MountOptions::default(),
    )
    .expect("format")
    .unmount()
    .expect("unmount");
    storage
}

/// The image in `storage` mounted with default options. Panics if the mount fails.
pub fn mount_storage(storage: &MemStorage) -> FileSystem {
    FileSystem::mount(reopen(storage), MountOptions::default()).expect("mount")
}

/// The problems fsck finds in the image in `storage`; one problem saying so when fsck cannot
/// read the image at all.
pub fn fsck_problems(storage: &MemStorage) -> Vec<String> {
    match crate::fsck(reopen(storage)) {
        Ok(r) => r.problems,
        Err(e) => vec![format!("fsck could not read the image: {e}")],
    }
}

/// A RAM disk over `storage` behind a fault device following `plan`, and the device's control.
pub fn fault_device(storage: &MemStorage, plan: FaultPlan) -> (FaultDevice, FaultControl) {
    let dev = FaultDevice::new(reopen(storage), plan);
    let control = dev.control();
    (dev, control)
}

/// [`fault_device`] with a plan that only records every write and flush (no faults).
pub fn recording_device(storage: &MemStorage) -> (FaultDevice, FaultControl) {
    fault_device(
        storage,
        FaultPlan {
            record: true,
            ..FaultPlan::default()
        },
    )
}

/// The blocks of a freshly made image that hold checked metadata: the superblock and its backup,
/// the journal superblock and the first log block, the bitmaps, the inode table and the root
/// directory. (Unused journal log blocks hold nothing to check.)
pub fn fresh_metadata_blocks(l: &Layout) -> Vec<u64> {
    let mut blocks = vec![
        0,
        l.backup_superblock(),
        l.journal_start,
        l.journal_start + 1,
    ];
    blocks.extend(l.block_bitmap_start..l.data_start + 1);
    blocks
}

/// One single-bit change to an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitFlip {
    /// Which flip of the sequence this is, from 0.
    pub round: usize,
    /// The file-system block it falls in.
    pub block: u64,
    /// Its byte offset in the image.
    pub at: usize,
    /// The bit flipped in that byte.
    pub mask: u8,
}

impl BitFlip {
    /// Makes `image` a copy of `pristine` with this one bit flipped.
    pub fn apply(&self, image: &mut [u8], pristine: &[u8]) {
        image.copy_from_slice(pristine);
        image[self.at] ^= self.mask;
    }
}

/// `rounds` flips, each of one bit in a byte of one of `blocks` (each `block_size` bytes), picked
/// by a xorshift generator seeded with `seed`: the same seed gives the same flips on every run.
pub fn bit_flips(
    seed: u64,
    rounds: usize,
    blocks: &[u64],
    block_size: usize,
) -> impl Iterator<Item = BitFlip> + '_ {
    let mut state = seed;
    (0..rounds).map(move |round| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let block = blocks[(state % blocks.len() as u64) as usize];
        BitFlip {
            round,
            block,
            at: block as usize * block_size + (state >> 20) as usize % block_size,
            mask: 1 << (state >> 60 & 7),
        }
    })
}

/// The journal blocks (number, bytes) of one committed transaction, sequence 1, written at the
/// start of the journal of a fresh image laid out as `l`: it rewrites the root directory's block
/// with one entry, `ghost`, naming inode 5, which is not in use. Only a check that replays the
/// journal as mount would sees the bad entry.
pub fn ghost_entry_transaction(l: &Layout) -> Vec<(u64, Vec<u8>)> {
    let bs = l.block_size as usize;
    let ghost = DirEntry {
        ino: 5,
        kind: Kind::File,
        name: b"ghost".to_vec(),
    };
    let image = dir::encode_block(&[ghost], bs, l.data_start).expect("one entry fits a block");
    let txn = Transaction {
        seq: 1,
        images: vec![(l.data_start, image)],
    };
    let area = JournalArea {
        start: l.journal_start,
        len: l.journal_len,
    };
    journal::encode(&txn, area, 0, bs)
}
