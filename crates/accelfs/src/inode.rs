//! Inodes (format §5): 256 bytes each, with a CRC of their own so fsck can name the single bad
//! inode, and up to four extents inline.

use crate::extent::Extent;
use crate::header::{read_u32, read_u64, write_u32, write_u64};
use kura_engine::crc32c::crc32c_skipping;

pub const INODE_SIZE: usize = 256;
/// Extents stored in the inode itself.
pub const INLINE_EXTENTS: usize = 4;
const CRC_AT: usize = 252;

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Free,
    File,
    Directory,
}

impl Kind {
    fn code(self) -> u16 {
        match self {
            Kind::Free => 0,
            Kind::File => 1,
            Kind::Directory => 2,
        }
    }

    fn from_code(code: u16) -> Option<Kind> {
        match code {
            0 => Some(Kind::Free),
            1 => Some(Kind::File),
            2 => Some(Kind::Directory),
            _ => None,
        }
    }
}

/// An inode as held in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub kind: Kind,
    pub mode: u16,
    pub links: u32,
    pub size: u64,
    pub blocks: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub generation: u32,
    pub extent_count: u32,
    /// First extent block, or 0.
    pub extent_block: u64,
    pub parent: u64,
    pub inline: [Extent; INLINE_EXTENTS],
}

/// Why 256 bytes are not a valid inode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InodeError {
    #[error("inode {0}: checksum mismatch")]
    Checksum(u64),
    #[error("inode {0}: unknown kind {1}")]
    Kind(u64, u16),
    #[error("inode {0}: {1}")]
    Invalid(u64, String),
}

impl Inode {
    /// A fresh inode of `kind`.
    pub fn new(kind: Kind, mode: u16, parent: u64, now_ns: u64) -> Self {
        Inode {
            kind,
            mode,
            links: if kind == Kind::Free { 0 } else { 1 },
            size: 0,
            blocks: 0,
            mtime_ns: now_ns,
            ctime_ns: now_ns,
            generation: 0,
            extent_count: 0,
            extent_block: 0,
            parent,
            inline: [Extent::EMPTY; INLINE_EXTENTS],
        }
    }

    /// The free inode.
    pub fn free() -> Self {
        Inode::new(Kind::Free, 0, 0, 0)
    }

    pub fn encode(&self) -> [u8; INODE_SIZE] {
        let mut b = [0u8; INODE_SIZE];
        b[0..2].copy_from_slice(&self.kind.code().to_le_bytes());
        b[2..4].copy_from_slice(&self.mode.to_le_bytes());
        write_u32(&mut b, 4, self.links);
        write_u64(&mut b, 8, self.size);
        write_u64(&mut b, 16, self.blocks);
        write_u64(&mut b, 24, self.mtime_ns);
        write_u64(&mut b, 32, self.ctime_ns);
        write_u32(&mut b, 40, self.generation);
        write_u32(&mut b, 44, self.extent_count);
        write_u64(&mut b, 48, self.extent_block);
        write_u64(&mut b, 56, self.parent);
        for (i, e) in self.inline.iter().enumerate() {
            e.encode(&mut b[64 + i * 16..80 + i * 16]);
        }
        let crc = crc32c_skipping(&b, CRC_AT);
        write_u32(&mut b, CRC_AT, crc);
        b
    }

    /// Decodes inode number `ino` from its 256 bytes.
    pub fn decode(ino: u64, b: &[u8]) -> Result<Inode, InodeError> {
        if b.len() < INODE_SIZE {
            return Err(InodeError::Invalid(ino, format!("only {} bytes", b.len())));
        }
        let b = &b[..INODE_SIZE];
        if read_u32(b, CRC_AT) != crc32c_skipping(b, CRC_AT) {
            return Err(InodeError::Checksum(ino));
        }
        let code = u16::from_le_bytes([b[0], b[1]]);
        let kind = Kind::from_code(code).ok_or(InodeError::Kind(ino, code))?;
        let mut inline = [Extent::EMPTY; INLINE_EXTENTS];
        for (i, e) in inline.iter_mut().enumerate() {
            *e = Extent::decode(&b[64 + i * 16..80 + i * 16]);
        }
        let inode = Inode {
            kind,
            mode: u16::from_le_bytes([b[2], b[3]]),
            links: read_u32(b, 4),
            size: read_u64(b, 8),
            blocks: read_u64(b, 16),
            mtime_ns: read_u64(b, 24),
            ctime_ns: read_u64(b, 32),
            generation: read_u32(b, 40),
            extent_count: read_u32(b, 44),
            extent_block: read_u64(b, 48),
            parent: read_u64(b, 56),
            inline,
        };
        if inode.kind != Kind::Free && inode.links == 0 {
            return Err(InodeError::Invalid(ino, "in use with no links".into()));
        }
        if inode.extent_count as usize <= INLINE_EXTENTS && inode.extent_block != 0 {
            return Err(InodeError::Invalid(
                ino,
                "extent block set for an inode whose extents fit inline".into(),
            ));
        }
        Ok(inode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_and_detects_damage() {
        let mut i = Inode::new(Kind::File, 0o644, 1, 123);
        i.size = 10_000;
        i.extent_count = 1;
        i.inline[0] = Extent {
            logical: 0,
            length: 2,
            physical: 900,
        };
        let b = i.encode();
        assert_eq!(Inode::decode(7, &b), Ok(i.clone()));
        let mut bad = b;
        bad[9] ^= 1;
        assert_eq!(Inode::decode(7, &bad), Err(InodeError::Checksum(7)));
        let mut weird = i.clone();
        weird.links = 0;
        assert!(matches!(
            Inode::decode(7, &weird.encode()),
            Err(InodeError::Invalid(7, _))
        ));
        assert_eq!(Inode::decode(0, &Inode::free().encode()), Ok(Inode::free()));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Inode::decode(1, &bytes);
        }
    }
}
