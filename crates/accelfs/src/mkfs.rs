//! `mkfs`: writes an empty AccelFS — superblock and backup, a zeroed journal, bitmaps, the inode
//! table and the root directory — then flushes.

use crate::bitmap::Bitmap;
use crate::dir;
use crate::error::FsError;
use crate::extent::Extent;
use crate::fsdevice::FsDevice;
use crate::header::{seal, BlockKind};
use crate::inode::{Inode, Kind, INODE_SIZE};
use crate::journal::JournalArea;
use crate::layout::{Layout, Superblock, DEFAULT_BLOCK_SIZE, ROOT_INODE};
use crate::wal::write_empty_supers;

/// Choices made at mkfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MkfsOptions {
    pub block_size: u32,
    /// Inode count; one per 64 KiB of capacity when `None`.
    pub inodes: Option<u64>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            block_size: DEFAULT_BLOCK_SIZE,
            inodes: None,
        }
    }
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Formats the device behind `io` (whose block size must be `opts.block_size`).
pub fn mkfs(io: &mut FsDevice, opts: MkfsOptions) -> Result<Superblock, FsError> {
    let bs = opts.block_size as usize;
    if io.block_size() != bs {
        return Err(FsError::Invalid(format!(
            "device is viewed in {}-byte blocks, mkfs asked for {bs}",
            io.block_size()
        )));
    }
    let layout = Layout::plan(opts.block_size, io.blocks(), opts.inodes)?;
    let now = now_ns();
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&now.to_le_bytes());
    uuid[8..].copy_from_slice(
        &(std::process::id() as u64 ^ layout.total_blocks.rotate_left(17)).to_le_bytes(),
    );
    let sb = Superblock {
        layout,
        uuid,
        mkfs_time_ns: now,
        features: crate::layout::FEATURE_POSIX,
    };
    let root_block = layout.data_start;

    // A journal left by an earlier file system must never be replayed into this one.
    // Real zero writes rather than write-zeroes: on a file-backed image, write-zeroes leaves
    // unwritten extents, and every first write into one would make the host's fdatasync commit
    // its own journal, slowing each of the log's commits until the log has wrapped once.
    let zeroes = vec![0u8; bs * 128];
    let mut at = 0;
    while at < layout.journal_len {
        let n = (layout.journal_len - at).min(128);
        io.write(layout.journal_start + at, &zeroes[..n as usize * bs])?;
        at += n;
    }
    let area = JournalArea {
        start: layout.journal_start,
        len: layout.journal_len,
    };
    write_empty_supers(io, area, bs)?;

    let mut blocks = Bitmap::new(layout.total_blocks);
    blocks.set_range(0, layout.data_start + 1, true);
    blocks.set(layout.backup_superblock(), true);
    for i in 0..layout.block_bitmap_len {
        let n = layout.block_bitmap_start + i;
        io.write(n, &blocks.encode_block(i, bs, BlockKind::BlockBitmap, n))?;
    }
    let mut inodes = Bitmap::new(layout.inode_count);
    inodes.set(0, true);
    inodes.set(ROOT_INODE, true);
    for i in 0..layout.inode_bitmap_len {
        let n = layout.inode_bitmap_start + i;
        io.write(n, &inodes.encode_block(i, bs, BlockKind::InodeBitmap, n))?;
    }

    let mut root = Inode::new(Kind::Directory, 0o755, ROOT_INODE, now);
    root.size = bs as u64;
    root.blocks = 1;
    root.extent_count = 1;
    root.inline[0] = Extent {
        logical: 0,
        length: 1,
        physical: root_block,
    };
    let per = Layout::inodes_per_block(opts.block_size);
    let mut table = Vec::with_capacity(bs * 64);
    for i in 0..layout.inode_table_len {
        let n = layout.inode_table_start + i;
        let mut b = vec![0u8; bs];
        for slot in 0..per {
            let ino = i * per + slot;
            let inode = if ino == ROOT_INODE {
                root.clone()
            } else {
                Inode::free()
            };
            let at = crate::header::HEADER_LEN + slot as usize * INODE_SIZE;
            b[at..at + INODE_SIZE].copy_from_slice(&inode.encode());
        }
        seal(&mut b, BlockKind::InodeTable, n);
        table.extend_from_slice(&b);
        if table.len() >= bs * 64 || i + 1 == layout.inode_table_len {
            let first = n + 1 - (table.len() / bs) as u64;
            io.write(first, &table)?;
            table.clear();
        }
    }
    let root_dir = dir::encode_block(&[], bs, root_block)
        .ok_or_else(|| FsError::Invalid("empty directory does not fit a block".into()))?;
    io.write(root_block, &root_dir)?;
    io.write(0, &sb.encode(0))?;
    io.write(
        layout.backup_superblock(),
        &sb.encode(layout.backup_superblock()),
    )?;
    io.flush()?;
    Ok(sb)
}
