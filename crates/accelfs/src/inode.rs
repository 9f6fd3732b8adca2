//! Inodes (format §5): 256 bytes each, with a CRC of their own so fsck can name the single bad
//! inode, up to four extents inline, owner, times, device number, the extended-attribute block
//! and a fast symbolic link's target.

use crate::extent::Extent;
use crate::header::{read_u32, read_u64, write_u32, write_u64};
use kura_engine::crc32c::crc32c_skipping;

pub const INODE_SIZE: usize = 256;
/// Extents stored in the inode itself.
pub const INLINE_EXTENTS: usize = 4;
const CRC_AT: usize = 252;
/// Where a fast symbolic link's target is stored, and how long it may be.
const TARGET_AT: usize = 168;
/// Longest symbolic-link target stored in the inode itself (a fast symlink).
pub const INLINE_TARGET: usize = CRC_AT - TARGET_AT;
/// Longest symbolic-link target (`PATH_MAX` − 1).
pub const MAX_TARGET: usize = 4095;
/// Inode flag: uid and gid are recorded.
pub const FLAG_OWNER: u32 = 1;

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Free,
    File,
    Directory,
    /// Symbolic link (`posix` feature).
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    /// The kind's code in inodes and directory records (format §5, §6).
    pub fn code(self) -> u16 {
        match self {
            Kind::Free => 0,
            Kind::File => 1,
            Kind::Directory => 2,
            Kind::Symlink => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::CharDevice => 6,
            Kind::BlockDevice => 7,
        }
    }

    pub fn from_code(code: u16) -> Option<Kind> {
        match code {
            0 => Some(Kind::Free),
            1 => Some(Kind::File),
            2 => Some(Kind::Directory),
            3 => Some(Kind::Symlink),
            4 => Some(Kind::Fifo),
            5 => Some(Kind::Socket),
            6 => Some(Kind::CharDevice),
            7 => Some(Kind::BlockDevice),
            _ => None,
        }
    }

    /// Kinds that exist only on images with the `posix` feature.
    pub fn needs_posix(self) -> bool {
        self.code() >= 3
    }

    /// FIFOs, sockets and devices: no data, no blocks.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            Kind::Fifo | Kind::Socket | Kind::CharDevice | Kind::BlockDevice
        )
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
    /// Meaningful for directories only (`..`); other kinds may have several parents.
    pub parent: u64,
    pub inline: [Extent; INLINE_EXTENTS],
    /// [`FLAG_OWNER`].
    pub flags: u32,
    pub uid: u32,
    pub gid: u32,
    /// 0: never recorded.
    pub atime_ns: u64,
    /// Device number of a character or block device.
    pub rdev: u64,
    /// Extended-attribute block, or 0.
    pub xattr_block: u64,
    /// A fast symbolic link's target (the first `size` bytes), else zero.
    pub target: [u8; INLINE_TARGET],
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
            flags: 0,
            uid: 0,
            gid: 0,
            atime_ns: now_ns,
            rdev: 0,
            xattr_block: 0,
            target: [0; INLINE_TARGET],
        }
    }

    /// uid and gid, when recorded.
    pub fn owner(&self) -> Option<(u32, u32)> {
        (self.flags & FLAG_OWNER != 0).then_some((self.uid, self.gid))
    }

    /// Whether this is a symbolic link whose target is in the inode.
    pub fn is_fast_symlink(&self) -> bool {
        self.kind == Kind::Symlink && self.size as usize <= INLINE_TARGET
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
        write_u32(&mut b, 128, self.flags);
        write_u32(&mut b, 132, self.uid);
        write_u32(&mut b, 136, self.gid);
        write_u64(&mut b, 144, self.atime_ns);
        write_u64(&mut b, 152, self.rdev);
        write_u64(&mut b, 160, self.xattr_block);
        b[TARGET_AT..CRC_AT].copy_from_slice(&self.target);
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
            flags: read_u32(b, 128),
            uid: read_u32(b, 132),
            gid: read_u32(b, 136),
            atime_ns: read_u64(b, 144),
            rdev: read_u64(b, 152),
            xattr_block: read_u64(b, 160),
            target: [0; INLINE_TARGET],
        };
        let mut inode = inode;
        inode.target.copy_from_slice(&b[TARGET_AT..CRC_AT]);
        if inode.kind != Kind::Free && inode.links == 0 {
            return Err(InodeError::Invalid(ino, "in use with no links".into()));
        }
        if inode.extent_count as usize <= INLINE_EXTENTS && inode.extent_block != 0 {
            return Err(InodeError::Invalid(
                ino,
                "extent block set for an inode whose extents fit inline".into(),
            ));
        }
        if inode.flags & !FLAG_OWNER != 0 {
            return Err(InodeError::Invalid(
                ino,
                format!("unknown inode flags {:#x}", inode.flags),
            ));
        }
        if inode.kind.is_special() && (inode.size != 0 || inode.extent_count != 0) {
            return Err(InodeError::Invalid(
                ino,
                "a FIFO, socket or device node with data".into(),
            ));
        }
        if inode.kind == Kind::Symlink {
            let len = inode.size as usize;
            if len == 0 || inode.size > MAX_TARGET as u64 {
                return Err(InodeError::Invalid(
                    ino,
                    format!("symbolic link of {} bytes (1 to {MAX_TARGET})", inode.size),
                ));
            }
            if len <= INLINE_TARGET && (inode.extent_count != 0 || inode.target[..len].contains(&0))
            {
                return Err(InodeError::Invalid(
                    ino,
                    "fast symbolic link with extents or a NUL in its target".into(),
                ));
            }
            if len > INLINE_TARGET && inode.extent_count != 1 {
                return Err(InodeError::Invalid(
                    ino,
                    "symbolic link target is not one block".into(),
                ));
            }
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

    #[test]
    fn posix_fields_round_trip_and_are_checked() {
        let mut l = Inode::new(Kind::Symlink, 0o777, 1, 5);
        l.size = 3;
        l.target[..3].copy_from_slice(b"a/b");
        l.flags = FLAG_OWNER;
        l.uid = 1000;
        l.gid = 100;
        l.atime_ns = 77;
        l.xattr_block = 4242;
        assert_eq!(Inode::decode(3, &l.encode()), Ok(l.clone()));
        assert_eq!(l.owner(), Some((1000, 100)));
        let mut nul = l.clone();
        nul.target[1] = 0;
        assert!(Inode::decode(3, &nul.encode()).is_err());
        let mut empty = l.clone();
        empty.size = 0;
        assert!(Inode::decode(3, &empty.encode()).is_err());
        let mut dev = Inode::new(Kind::CharDevice, 0o600, 1, 5);
        dev.rdev = 0x0103;
        assert_eq!(Inode::decode(4, &dev.encode()), Ok(dev.clone()));
        dev.size = 1;
        assert!(Inode::decode(4, &dev.encode()).is_err());
        let mut flags = Inode::new(Kind::File, 0o644, 1, 5);
        flags.flags = 2;
        assert!(Inode::decode(4, &flags.encode()).is_err());
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Inode::decode(1, &bytes);
        }
    }
}
