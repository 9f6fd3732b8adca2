//! The on-disk format of `docs/kvstore-format.md`, one module per structure: encoders that write
//! the documented bytes and decoders that check every field and CRC before returning anything.
//! Decoders take untrusted bytes and answer a [`FormatError`], never a panic.

pub mod frame;
pub mod manifest;
pub mod page;
pub mod superblock;

use thiserror::Error;

/// The page size of format version 1: the unit of checksums, of run pages and of log frames.
pub const PAGE_SIZE: usize = 4096;
/// Longest key.
pub const MAX_KEY: usize = 1024;
/// Smallest and largest `segment_shift` (1 MiB and 1 GiB segments).
pub const MIN_SEGMENT_SHIFT: u32 = 20;
pub const MAX_SEGMENT_SHIFT: u32 = 30;

/// Why bytes are not a valid structure of the format.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("{what}: {have} bytes where {need} are needed")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("{what}: bad magic")]
    BadMagic { what: &'static str },
    #[error("{what}: checksum {stored:#010x} stored, {computed:#010x} computed")]
    BadChecksum {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
    #[error("format version {major}.{minor} is not supported (this build reads 1.x)")]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("{what}: invalid value {value}")]
    BadField { what: &'static str, value: u64 },
    #[error("{what}: belongs to segment allocation {found}, expected {expected}")]
    WrongSegment {
        what: &'static str,
        expected: u64,
        found: u64,
    },
    #[error("{what}: written by another store")]
    ForeignStore { what: &'static str },
    #[error("{what}: {extra} bytes left over after the last item")]
    TrailingBytes { what: &'static str, extra: usize },
    #[error("{what}: does not fit ({need} bytes, {room} available)")]
    TooLarge {
        what: &'static str,
        need: usize,
        room: usize,
    },
}

/// A segment slot and the sequence number it was allocated under; stale contents of a reused
/// slot carry another `seg_seq` and never validate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SegRef {
    pub slot: u64,
    pub seg_seq: u64,
}

impl SegRef {
    pub const ENCODED_LEN: usize = 16;
    /// The "no segment" value (manifest head of a store without a manifest).
    pub const NONE: SegRef = SegRef {
        slot: u64::MAX,
        seg_seq: 0,
    };

    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&self.seg_seq.to_le_bytes());
    }

    fn get(r: &mut Reader<'_>) -> Result<SegRef, FormatError> {
        Ok(SegRef {
            slot: r.u64()?,
            seg_seq: r.u64()?,
        })
    }
}

/// Reads little-endian fields from a slice, each read checked against the end.
pub(crate) struct Reader<'a> {
    what: &'static str,
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, data: &'a [u8]) -> Self {
        Reader { what, data, at: 0 }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or(FormatError::Truncated {
                what: self.what,
                need: self.at.saturating_add(n),
                have: self.data.len(),
            })?;
        let out = &self.data[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.at
    }

    /// Fails unless every byte was read.
    pub(crate) fn finish(&self) -> Result<(), FormatError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(FormatError::TrailingBytes {
                what: self.what,
                extra,
            }),
        }
    }
}

/// The stored checksum at `field` of `data` against the one computed with that field zero.
pub(crate) fn check_crc(what: &'static str, data: &[u8], field: usize) -> Result<(), FormatError> {
    let stored = u32::from_le_bytes([
        data[field],
        data[field + 1],
        data[field + 2],
        data[field + 3],
    ]);
    let computed = kura_engine::crc32c::crc32c_skipping(data, field);
    if stored != computed {
        return Err(FormatError::BadChecksum {
            what,
            stored,
            computed,
        });
    }
    Ok(())
}

/// Stores the checksum of `data` (with the field zero) at `field`.
pub(crate) fn seal_crc(data: &mut [u8], field: usize) {
    let crc = kura_engine::crc32c::crc32c_skipping(data, field);
    data[field..field + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A length that the format stores in fewer bits than `usize`, refused when it does not fit.
pub(crate) fn narrow<T: TryFrom<usize>>(
    what: &'static str,
    n: usize,
    room: usize,
) -> Result<T, FormatError> {
    T::try_from(n).map_err(|_| FormatError::TooLarge {
        what,
        need: n,
        room,
    })
}
