//! Where everything lives on an AccelFS device (format §3–§4): the region arithmetic done at
//! mkfs, and the superblock that records it.

use crate::error::FormatError;
use crate::header::{
    read_u32, read_u64, seal, verify, write_u32, write_u64, BlockKind, HEADER_LEN,
};

/// Format version written by this code.
pub const VERSION: u32 = 1;
/// Feature flag `posix` (format §4): symbolic links, special files, hard links, extended
/// attributes. Set by mkfs.
pub const FEATURE_POSIX: u32 = 1;
/// Every feature flag this code understands; any other bit refuses the image.
pub const KNOWN_FEATURES: u32 = FEATURE_POSIX;
/// Default block size.
pub const DEFAULT_BLOCK_SIZE: u32 = 8192;
/// Bytes of one inode.
pub const INODE_SIZE: usize = 256;
/// The root directory's inode number.
pub const ROOT_INODE: u64 = 1;
/// Capacity per inode when mkfs chooses the inode count.
pub const BYTES_PER_INODE: u64 = 64 << 10;
/// The longest journal mkfs lays out (blocks), and so the longest any superblock may state.
/// Recovery holds at most the log's blocks in memory, so this also caps replay memory:
/// 16384 × the block size (128 MiB at 8 KiB blocks).
pub const MAX_JOURNAL_BLOCKS: u64 = 16384;
/// The shortest journal mkfs lays out (blocks).
pub const MIN_JOURNAL_BLOCKS: u64 = 64;

/// The regions of one file system, all in AccelFS blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u32,
    pub total_blocks: u64,
    pub inode_count: u64,
    pub journal_start: u64,
    pub journal_len: u64,
    pub block_bitmap_start: u64,
    pub block_bitmap_len: u64,
    pub inode_bitmap_start: u64,
    pub inode_bitmap_len: u64,
    pub inode_table_start: u64,
    pub inode_table_len: u64,
    pub data_start: u64,
}

impl Layout {
    /// Bits one bitmap block holds.
    pub fn bits_per_bitmap_block(block_size: u32) -> u64 {
        (block_size as u64 - HEADER_LEN as u64) * 8
    }

    /// Inodes one inode-table block holds.
    pub fn inodes_per_block(block_size: u32) -> u64 {
        (block_size as usize - HEADER_LEN) as u64 / INODE_SIZE as u64
    }

    /// The layout mkfs gives a device of `total_blocks` blocks of `block_size` bytes, with
    /// `inode_count` inodes (or one per 64 KiB when `None`).
    pub fn plan(
        block_size: u32,
        total_blocks: u64,
        inode_count: Option<u64>,
    ) -> Result<Layout, FormatError> {
        if !(4096..=65536).contains(&block_size) || !block_size.is_power_of_two() {
            return Err(FormatError::BadSuperblock(format!(
                "block size {block_size} must be a power of two from 4K to 64K"
            )));
        }
        let capacity = total_blocks.saturating_mul(u64::from(block_size));
        let inode_count = inode_count.unwrap_or(capacity / BYTES_PER_INODE).max(64);
        let journal_len = Self::planned_journal_len(total_blocks);
        let bits = Self::bits_per_bitmap_block(block_size);
        let block_bitmap_len = total_blocks.div_ceil(bits);
        let inode_bitmap_len = inode_count.div_ceil(bits);
        let inode_table_len = inode_count.div_ceil(Self::inodes_per_block(block_size));
        let journal_start = 1;
        let block_bitmap_start = journal_start + journal_len;
        let inode_bitmap_start = block_bitmap_start + block_bitmap_len;
        let inode_table_start = inode_bitmap_start + inode_bitmap_len;
        let data_start = inode_table_start + inode_table_len;
        // Room for the root directory's first block, a few files, and the backup superblock.
        let minimum = data_start + 16 + 1;
        if total_blocks < minimum {
            return Err(FormatError::BadSuperblock(format!(
                "device of {total_blocks} blocks of {block_size} bytes is too small: AccelFS needs at least {minimum}"
            )));
        }
        Ok(Layout {
            block_size,
            total_blocks,
            inode_count,
            journal_start,
            journal_len,
            block_bitmap_start,
            block_bitmap_len,
            inode_bitmap_start,
            inode_bitmap_len,
            inode_table_start,
            inode_table_len,
            data_start,
        })
    }

    /// The journal length mkfs gives a device of `total_blocks` blocks: 1/64 of it, at least
    /// [`MIN_JOURNAL_BLOCKS`] and at most [`MAX_JOURNAL_BLOCKS`]. A superblock may state no
    /// longer journal than this, so a crafted superblock on a small (or sparse) device cannot
    /// make recovery read and hold more than 1/64 of the device (or 64 blocks).
    pub fn planned_journal_len(total_blocks: u64) -> u64 {
        (total_blocks / 64).clamp(MIN_JOURNAL_BLOCKS, MAX_JOURNAL_BLOCKS)
    }

    /// The largest size a file may state: 2³² − 1 blocks (format §9; extents count file blocks
    /// in `u32`), beyond which no byte could be mapped. A larger stated size is corrupt.
    pub fn max_file_bytes(&self) -> u64 {
        u64::from(u32::MAX) * u64::from(self.block_size)
    }

    /// Most blocks a directory can have. A directory gains a block only when no block has room
    /// for a record of the longest name (272 bytes), so each of its blocks but the last was over
    /// `capacity − 272` full when it grew; and it never lists more than every inode. Removals do
    /// not shrink it, so this bounds the largest it can have been, and a larger directory is
    /// corrupt (and would make loading it read and hold far more than the file system can list).
    pub fn max_dir_blocks(&self) -> u64 {
        let longest = crate::dir::record_len(255) as u64;
        let capacity = crate::dir::capacity(self.block_size as usize) as u64;
        let per_block = (capacity - longest) / longest;
        (self.inode_count / per_block.max(1) + 1).min(self.data_blocks())
    }

    /// What is impossible about an inode's stated size and extent count in this layout, if
    /// anything: a file past [`Layout::max_file_bytes`], a directory that is not whole blocks or
    /// is past [`Layout::max_dir_blocks`], or more extents than data blocks (extents never share
    /// a block). Checked before anything is read or allocated on the size's or count's word.
    pub fn inode_problem(&self, ino: u64, inode: &crate::inode::Inode) -> Option<String> {
        use crate::inode::Kind;
        let bs = u64::from(self.block_size);
        if u64::from(inode.extent_count) > self.data_blocks() {
            return Some(format!(
                "inode {ino} says it has {} extents but the data region has only {} blocks",
                inode.extent_count,
                self.data_blocks()
            ));
        }
        match inode.kind {
            Kind::File if inode.size > self.max_file_bytes() => Some(format!(
                "inode {ino}: size {} is past the largest file AccelFS can map ({} bytes)",
                inode.size,
                self.max_file_bytes()
            )),
            Kind::Directory if !inode.size.is_multiple_of(bs) => Some(format!(
                "directory inode {ino}: size {} is not a whole number of blocks",
                inode.size
            )),
            Kind::Directory if inode.size / bs > self.max_dir_blocks() => Some(format!(
                "directory inode {ino}: {} blocks is past the largest directory this file system can hold ({} blocks)",
                inode.size / bs,
                self.max_dir_blocks()
            )),
            _ => None,
        }
    }

    /// Block number of the backup superblock.
    pub fn backup_superblock(&self) -> u64 {
        self.total_blocks - 1
    }

    /// Blocks files can use: the data region without the backup superblock.
    pub fn data_blocks(&self) -> u64 {
        self.backup_superblock() - self.data_start
    }

    /// Checks that the regions are in order, inside the device and big enough for their contents,
    /// so a corrupt superblock cannot send the code outside the device.
    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |m: String| Err(FormatError::BadSuperblock(m));
        // Block size and minimum device size are checked the same way mkfs checks them.
        Layout::plan(self.block_size, self.total_blocks, Some(self.inode_count))?;
        if self.journal_start != 1 || self.journal_len < MIN_JOURNAL_BLOCKS {
            return bad(format!(
                "journal at {} of {} blocks is not where it must be",
                self.journal_start, self.journal_len
            ));
        }
        let longest = Self::planned_journal_len(self.total_blocks);
        if self.journal_len > longest {
            return bad(format!(
                "journal of {} blocks is longer than the {longest} a device of {} blocks has (at most {MAX_JOURNAL_BLOCKS})",
                self.journal_len, self.total_blocks
            ));
        }
        let bits = Self::bits_per_bitmap_block(self.block_size);
        let regions = [
            (
                "journal",
                self.journal_start,
                self.journal_len,
                self.block_bitmap_start,
            ),
            (
                "block bitmap",
                self.block_bitmap_start,
                self.block_bitmap_len,
                self.inode_bitmap_start,
            ),
            (
                "inode bitmap",
                self.inode_bitmap_start,
                self.inode_bitmap_len,
                self.inode_table_start,
            ),
            (
                "inode table",
                self.inode_table_start,
                self.inode_table_len,
                self.data_start,
            ),
        ];
        for (name, start, len, next) in regions {
            if start.checked_add(len) != Some(next) {
                return bad(format!(
                    "{name} region {start}+{len} does not end where the next begins ({next})"
                ));
            }
        }
        if self.block_bitmap_len * bits < self.total_blocks
            || self.inode_bitmap_len * bits < self.inode_count
            || self.inode_table_len * Self::inodes_per_block(self.block_size) < self.inode_count
        {
            return bad(
                "a bitmap or the inode table is too small for the counts it must hold".into(),
            );
        }
        if self.data_start >= self.backup_superblock() {
            return bad(format!(
                "no data region: data starts at {} of {} blocks",
                self.data_start, self.total_blocks
            ));
        }
        Ok(())
    }
}

/// The superblock: the layout plus identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub layout: Layout,
    pub uuid: [u8; 16],
    pub mkfs_time_ns: u64,
    pub features: u32,
}

impl Superblock {
    /// Encodes into a block of `layout.block_size` bytes sealed as block `number`.
    pub fn encode(&self, number: u64) -> Vec<u8> {
        let l = &self.layout;
        let mut b = vec![0u8; l.block_size as usize];
        write_u32(&mut b, 16, VERSION);
        write_u32(&mut b, 20, l.block_size);
        write_u64(&mut b, 24, l.total_blocks);
        write_u64(&mut b, 32, l.inode_count);
        write_u64(&mut b, 40, l.journal_start);
        write_u64(&mut b, 48, l.journal_len);
        write_u64(&mut b, 56, l.block_bitmap_start);
        write_u64(&mut b, 64, l.block_bitmap_len);
        write_u64(&mut b, 72, l.inode_bitmap_start);
        write_u64(&mut b, 80, l.inode_bitmap_len);
        write_u64(&mut b, 88, l.inode_table_start);
        write_u64(&mut b, 96, l.inode_table_len);
        write_u64(&mut b, 104, l.data_start);
        write_u64(&mut b, 112, ROOT_INODE);
        b[120..136].copy_from_slice(&self.uuid);
        write_u64(&mut b, 136, self.mkfs_time_ns);
        write_u32(&mut b, 144, self.features);
        seal(&mut b, BlockKind::Superblock, number);
        b
    }

    /// Decodes and validates a superblock read from block `number`.
    pub fn decode(b: &[u8], number: u64) -> Result<Superblock, FormatError> {
        if b.len() < 4096 {
            return Err(FormatError::NotAccelFs(format!(
                "block {number} is only {} bytes",
                b.len()
            )));
        }
        let magic = read_u32(b, 0);
        if magic != BlockKind::Superblock.magic() {
            return Err(FormatError::NotAccelFs(format!(
                "block {number} holds no AccelFS superblock (magic {magic:#010x})"
            )));
        }
        let block_size = read_u32(b, 20);
        if !(4096..=65536).contains(&block_size)
            || !block_size.is_power_of_two()
            || block_size as usize > b.len()
        {
            return Err(FormatError::BadSuperblock(format!(
                "block size {block_size} is not valid"
            )));
        }
        verify(&b[..block_size as usize], BlockKind::Superblock, number)?;
        let version = read_u32(b, 16);
        if version != VERSION {
            return Err(FormatError::BadSuperblock(format!(
                "format version {version}; this kura reads version {VERSION}"
            )));
        }
        let features = read_u32(b, 144);
        if features & !KNOWN_FEATURES != 0 {
            return Err(FormatError::BadSuperblock(format!(
                "unknown feature flags {:#x} (this kura knows {KNOWN_FEATURES:#x})",
                features & !KNOWN_FEATURES
            )));
        }
        if read_u64(b, 112) != ROOT_INODE {
            return Err(FormatError::BadSuperblock(format!(
                "root inode {} is not {ROOT_INODE}",
                read_u64(b, 112)
            )));
        }
        let layout = Layout {
            block_size,
            total_blocks: read_u64(b, 24),
            inode_count: read_u64(b, 32),
            journal_start: read_u64(b, 40),
            journal_len: read_u64(b, 48),
            block_bitmap_start: read_u64(b, 56),
            block_bitmap_len: read_u64(b, 64),
            inode_bitmap_start: read_u64(b, 72),
            inode_bitmap_len: read_u64(b, 80),
            inode_table_start: read_u64(b, 88),
            inode_table_len: read_u64(b, 96),
            data_start: read_u64(b, 104),
        };
        layout.validate()?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[120..136]);
        Ok(Superblock {
            layout,
            uuid,
            mkfs_time_ns: read_u64(b, 136),
            features,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plan_places_regions_in_order_and_refuses_tiny_devices() {
        let l = Layout::plan(8192, 131072, None).unwrap(); // 1 GiB
        assert_eq!(l.journal_len, 2048);
        assert_eq!(l.inode_count, 16384);
        assert!(l.data_start < l.backup_superblock());
        l.validate().unwrap();
        assert!(Layout::plan(8192, 50, None).is_err());
        assert!(Layout::plan(3000, 131072, None).is_err());
    }

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let sb = Superblock {
            layout: Layout::plan(8192, 131072, None).unwrap(),
            uuid: [3; 16],
            mkfs_time_ns: 99,
            features: 0,
        };
        let b = sb.encode(0);
        assert_eq!(Superblock::decode(&b, 0), Ok(sb));
        assert!(matches!(
            Superblock::decode(&b, 131071),
            Err(FormatError::Misdirected { .. })
        ));
        assert!(matches!(
            Superblock::decode(&vec![0u8; 8192], 0),
            Err(FormatError::NotAccelFs(_))
        ));
        let mut torn = b.clone();
        torn[60] ^= 0x10;
        assert!(matches!(
            Superblock::decode(&torn, 0),
            Err(FormatError::BadChecksum { .. })
        ));
    }

    #[test]
    fn a_validly_sealed_but_inconsistent_layout_is_refused() {
        let mut layout = Layout::plan(8192, 131072, None).unwrap();
        layout.data_start = layout.total_blocks + 5;
        let sb = Superblock {
            layout,
            uuid: [0; 16],
            mkfs_time_ns: 0,
            features: 0,
        };
        assert!(matches!(
            Superblock::decode(&sb.encode(0), 0),
            Err(FormatError::BadSuperblock(_))
        ));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let _ = Superblock::decode(&bytes, 0);
        }

        #[test]
        fn every_planned_layout_validates(bs_shift in 12u32..=16, blocks in 200u64..10_000_000) {
            if let Ok(l) = Layout::plan(1 << bs_shift, blocks, None) {
                prop_assert!(l.validate().is_ok());
                prop_assert!(l.data_blocks() >= 16);
            }
        }
    }
}
