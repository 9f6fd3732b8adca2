//! The raw-device target's on-device encoding (`docs/ingest-protocol.md` §5–§6): the two
//! superblock copies and the 64-byte index entries, each with its own CRC32C. Pure
//! encoders/decoders; [`crate::store`] does the I/O.

use kura_engine::crc32c::crc32c;

/// Every region is counted in 4096-byte units.
pub const UNIT: u64 = 4096;
/// Superblock magic.
pub const SB_MAGIC: [u8; 8] = *b"KURAIDEV";
/// Layout version.
pub const LAYOUT_VERSION: u32 = 1;
/// Byte offset of the index: after superblocks A and B.
pub const INDEX_START: u64 = 2 * UNIT;
/// Bytes of one index entry.
pub const ENTRY_LEN: usize = 64;
/// Entries per index unit.
pub const ENTRIES_PER_UNIT: u64 = UNIT / ENTRY_LEN as u64;
/// `label` when the record has none.
pub const NO_LABEL: u8 = 255;

/// Why on-device bytes are not a valid superblock or entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    #[error("not a kura ingest target (magic {0:02x?})")]
    Magic([u8; 8]),
    #[error("layout version {0} (this build reads 1)")]
    Version(u32),
    #[error("unit {0} (must be 4096)")]
    Unit(u32),
    #[error("superblock CRC {found:#010x}, computed {computed:#010x}")]
    Crc { found: u32, computed: u32 },
    #[error("superblock regions do not fit: {0}")]
    Regions(String),
}

/// One superblock copy (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub capacity: u64,
    pub index_slots: u64,
    pub data_start: u64,
    pub generation: u64,
    pub format_id: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

/// Where the data region starts for an index of `slots` entries.
pub fn data_start_for(slots: u64) -> u64 {
    (INDEX_START + slots * ENTRY_LEN as u64).div_ceil(UNIT) * UNIT
}

impl Superblock {
    /// The unit's bytes.
    pub fn encode(&self) -> [u8; UNIT as usize] {
        let mut b = [0u8; UNIT as usize];
        b[..8].copy_from_slice(&SB_MAGIC);
        b[8..12].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(UNIT as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.capacity.to_le_bytes());
        b[24..32].copy_from_slice(&INDEX_START.to_le_bytes());
        b[32..40].copy_from_slice(&self.index_slots.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_start.to_le_bytes());
        b[48..56].copy_from_slice(&self.generation.to_le_bytes());
        b[56..64].copy_from_slice(&self.format_id.to_le_bytes());
        let crc = crc32c(&b[..4092]);
        b[4092..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks one copy (at least 4096 bytes).
    pub fn decode(b: &[u8]) -> Result<Superblock, LayoutError> {
        if b.len() < UNIT as usize {
            return Err(LayoutError::Regions(format!("{} bytes", b.len())));
        }
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&b[..8]);
        if magic != SB_MAGIC {
            return Err(LayoutError::Magic(magic));
        }
        let found = u32_at(b, 4092);
        let computed = crc32c(&b[..4092]);
        if found != computed {
            return Err(LayoutError::Crc { found, computed });
        }
        let version = u32_at(b, 8);
        if version != LAYOUT_VERSION {
            return Err(LayoutError::Version(version));
        }
        let unit = u32_at(b, 12);
        if u64::from(unit) != UNIT {
            return Err(LayoutError::Unit(unit));
        }
        let sb = Superblock {
            capacity: u64_at(b, 16),
            index_slots: u64_at(b, 32),
            data_start: u64_at(b, 40),
            generation: u64_at(b, 48),
            format_id: u64_at(b, 56),
        };
        let index_start = u64_at(b, 24);
        if index_start != INDEX_START {
            return Err(LayoutError::Regions(format!("index_start {index_start}")));
        }
        if sb.index_slots == 0 || sb.index_slots > (1 << 40) {
            return Err(LayoutError::Regions(format!(
                "index_slots {}",
                sb.index_slots
            )));
        }
        if sb.data_start != data_start_for(sb.index_slots) || sb.data_start >= sb.capacity {
            return Err(LayoutError::Regions(format!(
                "data_start {} for {} slots and capacity {}",
                sb.data_start, sb.index_slots, sb.capacity
            )));
        }
        if b[64..4092].iter().any(|&x| x != 0) {
            return Err(LayoutError::Regions("reserved bytes are not zero".into()));
        }
        Ok(sb)
    }

    /// The current superblock of two copies: the valid one with the higher generation (both
    /// valid but of different formats is an error).
    pub fn pick(a: &[u8], b: &[u8]) -> Result<Superblock, LayoutError> {
        match (Superblock::decode(a), Superblock::decode(b)) {
            (Ok(x), Ok(y)) if x.format_id != y.format_id => Err(LayoutError::Regions(
                "superblocks A and B belong to different formats".into(),
            )),
            (Ok(x), Ok(y)) => Ok(if x.generation >= y.generation { x } else { y }),
            (Ok(x), Err(_)) | (Err(_), Ok(x)) => Ok(x),
            (Err(e), Err(_)) => Err(e),
        }
    }
}

/// One index entry (§6): where a record is and what its stage found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub generation: u64,
    pub offset: u64,
    pub stored_len: u64,
    pub orig_len: u64,
    pub crc: u32,
    pub stage: u8,
    pub label: u8,
    pub seq: u64,
}

impl Entry {
    /// The entry's 64 bytes.
    pub fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.stored_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.orig_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.crc.to_le_bytes());
        b[44] = self.stage;
        b[45] = self.label;
        b[48..56].copy_from_slice(&self.seq.to_le_bytes());
        let crc = crc32c(&b[..60]);
        b[60..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes 64 bytes whose CRC and reserved fields are right; `None` otherwise (a zeroed
    /// slot, a torn one, garbage). Placement rules are the store's (§7).
    pub fn decode(b: &[u8]) -> Option<Entry> {
        let b = b.get(..ENTRY_LEN)?;
        if u32_at(b, 60) != crc32c(&b[..60]) || b[46] != 0 || b[47] != 0 || u32_at(b, 56) != 0 {
            return None;
        }
        Some(Entry {
            id: u64_at(b, 0),
            generation: u64_at(b, 8),
            offset: u64_at(b, 16),
            stored_len: u64_at(b, 24),
            orig_len: u64_at(b, 32),
            crc: u32_at(b, 40),
            stage: b[44],
            label: b[45],
            seq: u64_at(b, 48),
        })
    }

    /// Where the next record's bytes start.
    pub fn end(&self) -> u64 {
        self.offset + self.stored_len.div_ceil(UNIT) * UNIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb() -> Superblock {
        Superblock {
            capacity: 1 << 30,
            index_slots: 1000,
            data_start: data_start_for(1000),
            generation: 3,
            format_id: 0xfeed,
        }
    }

    #[test]
    fn superblock_round_trips_and_every_flip_is_caught() {
        let b = sb().encode();
        assert_eq!(Superblock::decode(&b), Ok(sb()));
        for byte in [0usize, 9, 17, 33, 49, 100, 4093] {
            let mut bad = b;
            bad[byte] ^= 1;
            assert!(Superblock::decode(&bad).is_err(), "flip at {byte}");
        }
    }

    #[test]
    fn the_higher_valid_generation_wins() {
        let a = sb().encode();
        let newer = Superblock {
            generation: 4,
            ..sb()
        };
        let mut b = newer.encode();
        assert_eq!(Superblock::pick(&a, &b), Ok(newer));
        b[70] = 1; // torn B
        assert_eq!(Superblock::pick(&a, &b), Ok(sb()));
    }

    #[test]
    fn entry_round_trips_and_a_zeroed_slot_is_none() {
        let e = Entry {
            id: 5,
            generation: 2,
            offset: 1 << 20,
            stored_len: 4097,
            orig_len: 9000,
            crc: 0xabcd,
            stage: 2,
            label: NO_LABEL,
            seq: 77,
        };
        assert_eq!(Entry::decode(&e.encode()), Some(e));
        assert_eq!(e.end(), (1 << 20) + 8192);
        assert_eq!(Entry::decode(&[0u8; 64]), None);
    }
}
