//! The superblock (format section 3): one page, stored twice, naming the segment geometry, the
//! seg_seq lease, where log replay starts and where the manifest is.

use super::{
    check_crc, seal_crc, FormatError, Reader, SegRef, MAX_KEY, MAX_SEGMENT_SHIFT,
    MIN_SEGMENT_SHIFT, PAGE_SIZE,
};

const MAGIC: [u8; 8] = *b"KURAKVS\0";
const CRC_AT: usize = 8;
/// Version this build writes; it reads any 1.x.
pub const MAJOR: u16 = 1;
pub const MINOR: u16 = 1;
/// Bytes of the page the fields use; the rest is reserved.
const USED: usize = 112;

/// The decoded fields of one superblock copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub generation: u64,
    pub store_id: [u8; 16],
    pub segment_shift: u32,
    pub slot_count: u64,
    /// Every seg_seq ever allocated is below this.
    pub seg_seq_limit: u64,
    pub log_start: SegRef,
    pub log_start_page: u32,
    pub inline_threshold: u32,
    /// Operations with a lower LSN are in runs and skipped on replay.
    pub log_start_lsn: u64,
    /// [`SegRef::NONE`] while the store has no manifest.
    pub manifest_head: SegRef,
}

impl Superblock {
    /// Segment size in bytes.
    pub fn segment_size(&self) -> u64 {
        1u64 << self.segment_shift
    }

    /// Pages per segment.
    pub fn segment_pages(&self) -> u32 {
        (self.segment_size() / PAGE_SIZE as u64) as u32
    }

    /// The store tag frames carry: the first 8 bytes of the store id.
    pub fn store_tag(&self) -> u64 {
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&self.store_id[..8]);
        u64::from_le_bytes(tag)
    }

    /// The page as stored.
    pub fn encode(&self) -> [u8; PAGE_SIZE] {
        let mut v = Vec::with_capacity(USED);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&[0; 4]);
        v.extend_from_slice(&MAJOR.to_le_bytes());
        v.extend_from_slice(&MINOR.to_le_bytes());
        v.extend_from_slice(&self.generation.to_le_bytes());
        v.extend_from_slice(&self.store_id);
        v.extend_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        v.extend_from_slice(&self.segment_shift.to_le_bytes());
        v.extend_from_slice(&self.slot_count.to_le_bytes());
        v.extend_from_slice(&self.seg_seq_limit.to_le_bytes());
        self.log_start.put(&mut v);
        v.extend_from_slice(&self.log_start_page.to_le_bytes());
        v.extend_from_slice(&self.inline_threshold.to_le_bytes());
        v.extend_from_slice(&self.log_start_lsn.to_le_bytes());
        self.manifest_head.put(&mut v);
        debug_assert_eq!(v.len(), USED);
        let mut page = [0u8; PAGE_SIZE];
        page[..USED].copy_from_slice(&v);
        seal_crc(&mut page, CRC_AT);
        page
    }

    /// Decodes and checks one copy: magic, CRC, version and the ranges of every field.
    pub fn decode(page: &[u8]) -> Result<Superblock, FormatError> {
        const WHAT: &str = "superblock";
        if page.len() != PAGE_SIZE {
            return Err(FormatError::Truncated {
                what: WHAT,
                need: PAGE_SIZE,
                have: page.len(),
            });
        }
        let mut r = Reader::new(WHAT, page);
        if r.bytes(8)? != MAGIC {
            return Err(FormatError::BadMagic { what: WHAT });
        }
        check_crc(WHAT, page, CRC_AT)?;
        r.u32()?;
        let (major, minor) = (r.u16()?, r.u16()?);
        if major != MAJOR {
            return Err(FormatError::UnsupportedVersion { major, minor });
        }
        let generation = r.u64()?;
        let mut store_id = [0u8; 16];
        store_id.copy_from_slice(r.bytes(16)?);
        let page_size = r.u32()?;
        if page_size as usize != PAGE_SIZE {
            return Err(FormatError::BadField {
                what: "superblock page size",
                value: page_size.into(),
            });
        }
        let segment_shift = r.u32()?;
        if !(MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT).contains(&segment_shift) {
            return Err(FormatError::BadField {
                what: "superblock segment_shift",
                value: segment_shift.into(),
            });
        }
        let sb = Superblock {
            generation,
            store_id,
            segment_shift,
            slot_count: r.u64()?,
            seg_seq_limit: r.u64()?,
            log_start: SegRef::get(&mut r)?,
            log_start_page: r.u32()?,
            inline_threshold: r.u32()?,
            log_start_lsn: r.u64()?,
            manifest_head: SegRef::get(&mut r)?,
        };
        if sb.slot_count == 0 {
            return Err(FormatError::BadField {
                what: "superblock slot_count",
                value: 0,
            });
        }
        if sb.log_start.slot >= sb.slot_count {
            return Err(FormatError::BadField {
                what: "superblock log start slot",
                value: sb.log_start.slot,
            });
        }
        if sb.log_start_page >= sb.segment_pages() {
            return Err(FormatError::BadField {
                what: "superblock log start page",
                value: sb.log_start_page.into(),
            });
        }
        if sb.log_start.seg_seq >= sb.seg_seq_limit {
            return Err(FormatError::BadField {
                what: "superblock log start seg_seq (not below seg_seq_limit)",
                value: sb.log_start.seg_seq,
            });
        }
        if sb.inline_threshold as usize > MAX_KEY {
            return Err(FormatError::BadField {
                what: "superblock inline_threshold",
                value: sb.inline_threshold.into(),
            });
        }
        if sb.manifest_head != SegRef::NONE && sb.manifest_head.slot >= sb.slot_count {
            return Err(FormatError::BadField {
                what: "superblock manifest head slot",
                value: sb.manifest_head.slot,
            });
        }
        Ok(sb)
    }
}
