//! A file's block map (format §5): sorted, non-overlapping extents from file blocks to device
//! blocks, merged when contiguous so that a sequentially written file needs a handful, and
//! encoded in sealed extent blocks when they do not fit in the inode.

use crate::error::FormatError;
use crate::header::{
    read_u32, read_u64, seal, verify, write_u32, write_u64, BlockKind, HEADER_LEN,
};

/// `length` file blocks from `logical` live at device blocks from `physical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub logical: u32,
    pub length: u32,
    pub physical: u64,
}

impl Extent {
    pub const EMPTY: Extent = Extent {
        logical: 0,
        length: 0,
        physical: 0,
    };

    /// One past the last file block.
    pub fn end(&self) -> u64 {
        u64::from(self.logical) + u64::from(self.length)
    }

    pub fn encode(&self, out: &mut [u8]) {
        write_u32(out, 0, self.logical);
        write_u32(out, 4, self.length);
        write_u64(out, 8, self.physical);
    }

    pub fn decode(b: &[u8]) -> Extent {
        Extent {
            logical: read_u32(b, 0),
            length: read_u32(b, 4),
            physical: read_u64(b, 8),
        }
    }
}

/// Why a list of extents is not a valid block map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtentError {
    #[error("extent {0} is empty")]
    Empty(usize),
    #[error("extent {0} overlaps or is out of order with the one before")]
    Order(usize),
    /// Two extents share device blocks: the same block would be read (and written) as two
    /// places of the file, so a few crafted extents could make a tiny image look huge.
    #[error("extent {index} (device blocks {start}..{end}) overlaps device blocks an earlier extent already maps")]
    PhysicalOverlap { index: usize, start: u64, end: u64 },
    #[error(
        "extent {index} (device blocks {start}..{end}) lies outside the data region {lo}..{hi}"
    )]
    OutOfBounds {
        index: usize,
        start: u64,
        end: u64,
        lo: u64,
        hi: u64,
    },
}

/// The block map of one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtentMap {
    extents: Vec<Extent>,
}

impl ExtentMap {
    /// A map from extents already in order (as decoded); checked with [`ExtentMap::validate`].
    pub fn from_extents(extents: Vec<Extent>) -> Self {
        ExtentMap { extents }
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    pub fn len(&self) -> usize {
        self.extents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }

    /// Device blocks mapped.
    pub fn mapped_blocks(&self) -> u64 {
        self.extents.iter().map(|e| u64::from(e.length)).sum()
    }

    /// Where file block `block` lives and how many following file blocks are contiguous with it
    /// on the device (so a large read becomes one command); `None` for a hole.
    pub fn lookup(&self, block: u32) -> Option<(u64, u32)> {
        let i = self
            .extents
            .partition_point(|e| e.end() <= u64::from(block));
        let e = self.extents.get(i)?;
        if e.logical > block {
            return None;
        }
        let off = block - e.logical;
        Some((e.physical + u64::from(off), e.length - off))
    }

    /// The first mapped file block after `block` (which is a hole), or `None` past the last
    /// extent: how long a hole is, without a lookup per block.
    pub fn next_mapped_after(&self, block: u32) -> Option<u64> {
        let i = self
            .extents
            .partition_point(|e| e.end() <= u64::from(block));
        self.extents
            .get(i)
            .map(|e| u64::from(e.logical).max(u64::from(block) + 1))
    }

    /// Maps `length` file blocks from `logical` to device blocks from `physical`. The file range
    /// must be a hole (callers allocate only for holes); adjacent extents merge.
    pub fn insert(&mut self, logical: u32, length: u32, physical: u64) {
        if length == 0 {
            return;
        }
        let i = self.extents.partition_point(|e| e.logical < logical);
        let new = Extent {
            logical,
            length,
            physical,
        };
        debug_assert!(
            i == 0 || self.extents[i - 1].end() <= u64::from(logical),
            "insert over mapped blocks"
        );
        let merges_prev = i > 0 && {
            let p = self.extents[i - 1];
            p.end() == u64::from(logical)
                && p.physical + u64::from(p.length) == physical
                && p.length.checked_add(length).is_some()
        };
        if merges_prev {
            self.extents[i - 1].length += length;
        } else {
            self.extents.insert(i, new);
        }
        let at = if merges_prev { i - 1 } else { i };
        if let Some(next) = self.extents.get(at + 1).copied() {
            let cur = self.extents[at];
            if cur.end() == u64::from(next.logical)
                && cur.physical + u64::from(cur.length) == next.physical
                && cur.length.checked_add(next.length).is_some()
            {
                self.extents[at].length += next.length;
                self.extents.remove(at + 1);
            }
        }
    }

    /// Unmaps every file block at or after `from`; returns the device ranges freed.
    pub fn truncate(&mut self, from: u32) -> Vec<(u64, u32)> {
        let mut freed = Vec::new();
        let keep = self.extents.partition_point(|e| e.end() <= u64::from(from));
        let tail: Vec<Extent> = self.extents.drain(keep..).collect();
        for e in tail {
            if e.logical >= from {
                freed.push((e.physical, e.length));
            } else {
                let kept = from - e.logical;
                freed.push((e.physical + u64::from(kept), e.length - kept));
                self.extents.push(Extent { length: kept, ..e });
            }
        }
        freed
    }

    /// Unmaps file blocks `from..to`; returns the extents (file and device ranges) removed.
    pub fn punch(&mut self, from: u32, to: u32) -> Vec<Extent> {
        if from >= to {
            return Vec::new();
        }
        let mut removed = Vec::new();
        let mut kept = Vec::with_capacity(self.extents.len() + 1);
        for e in self.extents.drain(..) {
            let (lo, hi) = (u64::from(e.logical), e.end());
            let (cut_lo, cut_hi) = (lo.max(u64::from(from)), hi.min(u64::from(to)));
            if cut_lo >= cut_hi {
                kept.push(e);
                continue;
            }
            if lo < cut_lo {
                kept.push(Extent {
                    length: (cut_lo - lo) as u32,
                    ..e
                });
            }
            removed.push(Extent {
                logical: cut_lo as u32,
                length: (cut_hi - cut_lo) as u32,
                physical: e.physical + (cut_lo - lo),
            });
            if cut_hi < hi {
                kept.push(Extent {
                    logical: cut_hi as u32,
                    length: (hi - cut_hi) as u32,
                    physical: e.physical + (cut_hi - lo),
                });
            }
        }
        self.extents = kept;
        removed
    }

    /// Checks order, non-emptiness, that every extent lies in device blocks `lo..hi`, and that
    /// no two extents share a device block. The error names the first extent (in file order)
    /// that breaks a rule, so everything before it is a valid map (repair keeps that prefix).
    pub fn validate(&self, lo: u64, hi: u64) -> Result<(), ExtentError> {
        // Device ranges of the extents checked so far, start -> end: a new extent overlaps one
        // of them iff it overlaps its nearest neighbour on either side.
        let mut taken: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
        for (i, e) in self.extents.iter().enumerate() {
            if e.length == 0 {
                return Err(ExtentError::Empty(i));
            }
            if i > 0 && self.extents[i - 1].end() > u64::from(e.logical) {
                return Err(ExtentError::Order(i));
            }
            let end = e.physical.saturating_add(u64::from(e.length));
            if e.physical < lo || end > hi {
                return Err(ExtentError::OutOfBounds {
                    index: i,
                    start: e.physical,
                    end,
                    lo,
                    hi,
                });
            }
            let before = taken
                .range(..=e.physical)
                .next_back()
                .is_some_and(|(_, &end_before)| end_before > e.physical);
            let after = taken
                .range(e.physical..)
                .next()
                .is_some_and(|(&start_after, _)| start_after < end);
            if before || after {
                return Err(ExtentError::PhysicalOverlap {
                    index: i,
                    start: e.physical,
                    end,
                });
            }
            taken.insert(e.physical, end);
        }
        Ok(())
    }

    /// The first of `blocks` that one of the extents maps, if any (used when loading a map, to
    /// check that its extent blocks are not also its data). O((extents + blocks) log extents).
    pub fn first_mapped_of(&self, blocks: &[u64]) -> Option<u64> {
        let mut by_device: Vec<(u64, u64)> = self
            .extents
            .iter()
            .map(|e| (e.physical, e.physical.saturating_add(u64::from(e.length))))
            .collect();
        by_device.sort_unstable();
        blocks.iter().copied().find(|&b| {
            let i = by_device.partition_point(|&(start, _)| start <= b);
            i > 0 && by_device[i - 1].1 > b
        })
    }

    /// Byte ranges of file data that have device blocks, in order, adjacent extents merged and
    /// clipped to `size`; everything else below `size` is a hole that reads as zeroes.
    pub fn allocated_ranges(&self, block_size: u64, size: u64) -> Vec<std::ops::Range<u64>> {
        let mut out: Vec<std::ops::Range<u64>> = Vec::new();
        for e in &self.extents {
            let lo = u64::from(e.logical) * block_size;
            let hi = (e.end() * block_size).min(size);
            if lo >= hi {
                break;
            }
            match out.last_mut() {
                Some(last) if last.end == lo => last.end = hi,
                _ => out.push(lo..hi),
            }
        }
        out
    }

    /// Extents one extent block holds.
    pub fn per_block(block_size: usize) -> usize {
        (block_size - 32) / 16
    }

    /// Encodes `extents` into one extent block stored at `number`, chained to `next` (0 = last).
    pub fn encode_block(extents: &[Extent], next: u64, block_size: usize, number: u64) -> Vec<u8> {
        let mut b = vec![0u8; block_size];
        write_u64(&mut b, HEADER_LEN, next);
        write_u32(&mut b, HEADER_LEN + 8, extents.len() as u32);
        for (i, e) in extents.iter().take(Self::per_block(block_size)).enumerate() {
            e.encode(&mut b[32 + i * 16..48 + i * 16]);
        }
        seal(&mut b, BlockKind::Extents, number);
        b
    }

    /// Decodes an extent block read from `number`: its extents and the next block in the chain.
    pub fn decode_block(b: &[u8], number: u64) -> Result<(Vec<Extent>, u64), FormatError> {
        verify(b, BlockKind::Extents, number)?;
        let next = read_u64(b, HEADER_LEN);
        let count = read_u32(b, HEADER_LEN + 8) as usize;
        if count > Self::per_block(b.len()) {
            return Err(FormatError::BadSuperblock(format!(
                "extent block {number} claims {count} extents"
            )));
        }
        Ok((
            (0..count)
                .map(|i| Extent::decode(&b[32 + i * 16..48 + i * 16]))
                .collect(),
            next,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn contiguous_inserts_merge_and_lookup_reports_runs() {
        let mut m = ExtentMap::default();
        m.insert(0, 10, 100);
        m.insert(10, 5, 110);
        m.insert(20, 5, 500);
        m.insert(15, 5, 115);
        assert_eq!(m.len(), 2, "{:?}", m.extents());
        assert_eq!(m.lookup(3), Some((103, 17)));
        assert_eq!(m.lookup(22), Some((502, 3)));
        assert_eq!(m.lookup(25), None);
        assert_eq!(m.truncate(12), vec![(112, 8), (500, 5)]);
        assert_eq!(m.mapped_blocks(), 12);
        m.validate(100, 1000).unwrap();
        assert!(matches!(
            m.validate(101, 1000),
            Err(ExtentError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn extents_sharing_device_blocks_are_refused() {
        let shared = ExtentMap::from_extents(vec![
            Extent {
                logical: 0,
                length: 4,
                physical: 100,
            },
            Extent {
                logical: 10,
                length: 4,
                physical: 50,
            },
            Extent {
                logical: 20,
                length: 2,
                physical: 103,
            },
        ]);
        assert_eq!(
            shared.validate(0, 1000),
            Err(ExtentError::PhysicalOverlap {
                index: 2,
                start: 103,
                end: 105
            })
        );
        let contained = ExtentMap::from_extents(vec![
            Extent {
                logical: 0,
                length: 1,
                physical: 102,
            },
            Extent {
                logical: 1,
                length: 10,
                physical: 100,
            },
        ]);
        assert!(matches!(
            contained.validate(0, 1000),
            Err(ExtentError::PhysicalOverlap { index: 1, .. })
        ));
        assert_eq!(
            shared.allocated_ranges(10, 1000),
            vec![0..40, 100..140, 200..220]
        );
        assert_eq!(shared.allocated_ranges(10, 105), vec![0..40, 100..105]);
    }

    #[test]
    fn extent_blocks_round_trip() {
        let ext: Vec<Extent> = (0..100)
            .map(|i| Extent {
                logical: i * 3,
                length: 2,
                physical: 1000 + u64::from(i) * 7,
            })
            .collect();
        let b = ExtentMap::encode_block(&ext, 77, 8192, 55);
        assert_eq!(ExtentMap::decode_block(&b, 55).unwrap(), (ext, 77));
        assert!(ExtentMap::decode_block(&b, 56).is_err());
    }

    proptest! {
        #[test]
        fn matches_a_block_by_block_model(runs in proptest::collection::vec((0u32..200, 1u32..20, 0u64..5000), 0..40), cut in 0u32..250) {
            let mut m = ExtentMap::default();
            let mut model: BTreeMap<u32, u64> = BTreeMap::new();
            let mut used = std::collections::BTreeSet::new();
            for (logical, length, physical) in runs {
                // A valid map never shares a device block between two file blocks.
                if (logical..logical + length).any(|b| model.contains_key(&b))
                    || (physical..physical + u64::from(length)).any(|p| used.contains(&p))
                {
                    continue;
                }
                used.extend(physical..physical + u64::from(length));
                m.insert(logical, length, physical);
                for k in 0..length {
                    model.insert(logical + k, physical + u64::from(k));
                }
            }
            prop_assert!(m.validate(0, u64::MAX).is_ok());
            for b in 0..260 {
                prop_assert_eq!(m.lookup(b).map(|(p, _)| p), model.get(&b).copied());
            }
            let freed: u64 = m.truncate(cut).iter().map(|&(_, n)| u64::from(n)).sum();
            let expect_freed = model.range(cut..).count() as u64;
            prop_assert_eq!(freed, expect_freed);
            prop_assert_eq!(m.mapped_blocks(), model.range(..cut).count() as u64);
        }
    }
}
