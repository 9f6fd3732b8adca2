//! The 16-byte header every metadata block starts with: magic, CRC32C of the block, and the
//! block's own number, so corruption and misdirected writes are caught on every read.

use crate::error::FormatError;
use kura_engine::crc32c::crc32c_skipping;

/// Bytes the header takes at the start of each metadata block.
pub const HEADER_LEN: usize = 16;
const CRC_AT: usize = 4;

/// The kinds of metadata block, with their magic numbers (ASCII `AK..` little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Superblock,
    JournalSuper,
    JournalDescriptor,
    JournalCommit,
    BlockBitmap,
    InodeBitmap,
    InodeTable,
    Directory,
    Extents,
    Xattrs,
}

impl BlockKind {
    pub fn magic(self) -> u32 {
        let tag: &[u8; 4] = match self {
            BlockKind::Superblock => b"AKFS",
            BlockKind::JournalSuper => b"AKJL",
            BlockKind::JournalDescriptor => b"AKJD",
            BlockKind::JournalCommit => b"AKJC",
            BlockKind::BlockBitmap => b"AKBM",
            BlockKind::InodeBitmap => b"AKIM",
            BlockKind::InodeTable => b"AKIT",
            BlockKind::Directory => b"AKDR",
            BlockKind::Extents => b"AKEX",
            BlockKind::Xattrs => b"AKXA",
        };
        u32::from_le_bytes(*tag)
    }

    pub fn name(self) -> &'static str {
        match self {
            BlockKind::Superblock => "superblock",
            BlockKind::JournalSuper => "journal superblock",
            BlockKind::JournalDescriptor => "journal descriptor",
            BlockKind::JournalCommit => "journal commit",
            BlockKind::BlockBitmap => "block bitmap",
            BlockKind::InodeBitmap => "inode bitmap",
            BlockKind::InodeTable => "inode table",
            BlockKind::Directory => "directory",
            BlockKind::Extents => "extent",
            BlockKind::Xattrs => "extended-attribute",
        }
    }
}

/// Stamps the header of `block` (which lives at block number `number`): magic, number, then the
/// CRC over everything.
pub fn seal(block: &mut [u8], kind: BlockKind, number: u64) {
    block[0..4].copy_from_slice(&kind.magic().to_le_bytes());
    block[8..16].copy_from_slice(&number.to_le_bytes());
    let crc = crc32c_skipping(block, CRC_AT);
    block[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Checks the header of `block`, read from block number `number`.
pub fn verify(block: &[u8], kind: BlockKind, number: u64) -> Result<(), FormatError> {
    if block.len() < HEADER_LEN {
        return Err(FormatError::BadMagic {
            block: number,
            kind: kind.name(),
            found: 0,
            expected: kind.magic(),
        });
    }
    let found = read_u32(block, 0);
    if found != kind.magic() {
        return Err(FormatError::BadMagic {
            block: number,
            kind: kind.name(),
            found,
            expected: kind.magic(),
        });
    }
    let stored = read_u32(block, CRC_AT);
    let computed = crc32c_skipping(block, CRC_AT);
    if stored != computed {
        return Err(FormatError::BadChecksum {
            block: number,
            kind: kind.name(),
            stored,
            computed,
        });
    }
    let claims = read_u64(block, 8);
    if claims != number {
        return Err(FormatError::Misdirected {
            block: number,
            kind: kind.name(),
            claims,
        });
    }
    Ok(())
}

/// Little-endian u32 at `at`; callers pass offsets inside fixed-size structures.
pub fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

/// Little-endian u64 at `at`.
pub fn read_u64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

pub fn write_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn write_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sealed_blocks_verify_and_say_what_is_wrong_otherwise() {
        let mut b = vec![7u8; 8192];
        seal(&mut b, BlockKind::Directory, 42);
        assert_eq!(verify(&b, BlockKind::Directory, 42), Ok(()));
        assert!(matches!(
            verify(&b, BlockKind::Extents, 42),
            Err(FormatError::BadMagic { .. })
        ));
        assert!(matches!(
            verify(&b, BlockKind::Directory, 43),
            Err(FormatError::Misdirected { claims: 42, .. })
        ));
        b[100] ^= 1;
        let err = verify(&b, BlockKind::Directory, 42).unwrap_err();
        assert!(
            err.to_string()
                .contains("block 42 (directory): checksum mismatch"),
            "{err}"
        );
        assert!(matches!(
            verify(&b[..3], BlockKind::Directory, 42),
            Err(FormatError::BadMagic { .. })
        ));
    }

    proptest! {
        #[test]
        fn any_single_bit_flip_is_caught(bit in 0usize..8192 * 8) {
            let mut b: Vec<u8> = (0..8192u32).map(|i| (i * 31 % 251) as u8).collect();
            seal(&mut b, BlockKind::InodeTable, 9);
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(verify(&b, BlockKind::InodeTable, 9).is_err());
        }
    }
}
