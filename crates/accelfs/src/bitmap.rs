//! Allocation bitmaps (format §3): one bit per block or inode, stored in sealed metadata blocks
//! of `(block_size − 16) × 8` bits each, held in memory as words for fast searching.

use crate::error::FormatError;
use crate::header::{seal, verify, BlockKind, HEADER_LEN};

/// A bitmap of `len` bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u64,
    ones: u64,
}

impl Bitmap {
    /// All bits clear.
    pub fn new(len: u64) -> Self {
        Bitmap {
            words: vec![0; len.div_ceil(64) as usize],
            len,
            ones: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bits set.
    pub fn count_ones(&self) -> u64 {
        self.ones
    }

    pub fn get(&self, bit: u64) -> bool {
        bit < self.len && self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }

    /// Sets or clears `bit`; returns its previous value. Bits past the end are ignored.
    pub fn set(&mut self, bit: u64, value: bool) -> bool {
        if bit >= self.len {
            return false;
        }
        let word = &mut self.words[(bit / 64) as usize];
        let mask = 1u64 << (bit % 64);
        let was = *word & mask != 0;
        if value && !was {
            *word |= mask;
            self.ones += 1;
        } else if !value && was {
            *word &= !mask;
            self.ones -= 1;
        }
        was
    }

    /// Sets or clears `count` bits from `start` (a word at a time: ranges can be as long as the
    /// device). Bits past the end are ignored.
    pub fn set_range(&mut self, start: u64, count: u64, value: bool) {
        let end = start.saturating_add(count).min(self.len);
        let mut bit = start;
        while bit < end {
            let (word, mask, next) = Self::word_mask(bit, end);
            let w = &mut self.words[word];
            let before = u64::from((*w & mask).count_ones());
            if value {
                *w |= mask;
                self.ones += u64::from(mask.count_ones()) - before;
            } else {
                *w &= !mask;
                self.ones -= before;
            }
            bit = next;
        }
    }

    /// Bits set among `count` bits from `start`.
    pub fn count_range(&self, start: u64, count: u64) -> u64 {
        let end = start.saturating_add(count).min(self.len);
        let mut bit = start;
        let mut n = 0;
        while bit < end {
            let (word, mask, next) = Self::word_mask(bit, end);
            n += u64::from((self.words[word] & mask).count_ones());
            bit = next;
        }
        n
    }

    /// The first bit in `from..end` that is `value`.
    pub fn first_in(&self, from: u64, end: u64, value: bool) -> Option<u64> {
        let end = end.min(self.len);
        let mut bit = from;
        while bit < end {
            let (word, mask, next) = Self::word_mask(bit, end);
            let w = if value {
                self.words[word]
            } else {
                !self.words[word]
            };
            let hits = w & mask;
            if hits != 0 {
                return Some(word as u64 * 64 + u64::from(hits.trailing_zeros()));
            }
            bit = next;
        }
        None
    }

    /// The word holding `bit`, the mask of its bits from `bit` up to `end`, and the first bit
    /// after them.
    fn word_mask(bit: u64, end: u64) -> (usize, u64, u64) {
        let word = bit / 64;
        let word_end = ((word + 1) * 64).min(end);
        let lo = bit % 64;
        let n = word_end - bit;
        let mask = if n == 64 { !0 } else { ((1u64 << n) - 1) << lo };
        (word as usize, mask, word_end)
    }

    /// The first clear bit at or after `from`, wrapping around once.
    pub fn find_clear(&self, from: u64) -> Option<u64> {
        self.find_clear_run(1, from).map(|(start, _)| start)
    }

    /// The first run of clear bits of length `want` (or the longest shorter run when none is that
    /// long) searching from `from` and wrapping once. Returns (start, length).
    pub fn find_clear_run(&self, want: u64, from: u64) -> Option<(u64, u64)> {
        if self.ones == self.len || want == 0 {
            return None;
        }
        let from = if from >= self.len { 0 } else { from };
        let mut best: Option<(u64, u64)> = None;
        for (lo, hi) in [(from, self.len), (0, from)] {
            let mut bit = lo;
            while bit < hi {
                // Skip full words quickly.
                if bit % 64 == 0 && bit + 64 <= hi && self.words[(bit / 64) as usize] == u64::MAX {
                    bit += 64;
                    continue;
                }
                if self.get(bit) {
                    bit += 1;
                    continue;
                }
                let start = bit;
                while bit < hi && !self.get(bit) && bit - start < want {
                    bit += 1;
                }
                let run = bit - start;
                if run >= want {
                    return Some((start, want));
                }
                if best.is_none_or(|(_, b)| run > b) {
                    best = Some((start, run));
                }
            }
        }
        best
    }

    /// Bits stored per on-disk block.
    pub fn bits_per_block(block_size: usize) -> u64 {
        ((block_size - HEADER_LEN) * 8) as u64
    }

    /// Encodes the `index`th block of the bitmap, to be stored at block number `number`.
    /// Bit `k` of a block is bit `k % 8` of byte `k / 8`, which is exactly the little-endian
    /// layout of the in-memory words, so whole words are copied (a block's bit count is a
    /// multiple of 64 for every allowed block size).
    pub fn encode_block(
        &self,
        index: u64,
        block_size: usize,
        kind: BlockKind,
        number: u64,
    ) -> Vec<u8> {
        let mut b = vec![0u8; block_size];
        let per_words = (Self::bits_per_block(block_size) / 64) as usize;
        let first = index as usize * per_words;
        let words = self.words.get(first..).unwrap_or(&[]);
        for (i, w) in words.iter().take(per_words).enumerate() {
            b[HEADER_LEN + i * 8..HEADER_LEN + i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        seal(&mut b, kind, number);
        b
    }

    /// Decodes block `index` (read from block `number`) into this bitmap. Bits past the
    /// bitmap's length are ignored.
    pub fn decode_block(
        &mut self,
        index: u64,
        block: &[u8],
        kind: BlockKind,
        number: u64,
    ) -> Result<(), FormatError> {
        verify(block, kind, number)?;
        let per_words = (Self::bits_per_block(block.len()) / 64) as usize;
        let first = index as usize * per_words;
        let total_words = self.words.len();
        for i in 0..per_words {
            let w = first + i;
            if w >= total_words {
                break;
            }
            let at = HEADER_LEN + i * 8;
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&block[at..at + 8]);
            let mut value = u64::from_le_bytes(bytes);
            let valid = self.len - w as u64 * 64;
            if valid < 64 {
                value &= (1u64 << valid) - 1;
            }
            self.ones -= u64::from(self.words[w].count_ones());
            self.ones += u64::from(value.count_ones());
            self.words[w] = value;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_are_found_and_counts_kept() {
        let mut b = Bitmap::new(300);
        b.set_range(0, 100, true);
        b.set_range(150, 10, true);
        assert_eq!(b.count_ones(), 110);
        assert_eq!(b.find_clear(0), Some(100));
        assert_eq!(b.find_clear_run(50, 0), Some((100, 50)));
        assert_eq!(
            b.find_clear_run(60, 0),
            Some((160, 60)),
            "the first run long enough"
        );
        assert_eq!(
            b.find_clear_run(200, 0),
            Some((160, 140)),
            "else the longest"
        );
        assert_eq!(b.find_clear(290), Some(290));
        b.set_range(160, 140, true);
        assert_eq!(b.find_clear(200), Some(100), "wraps around");
        b.set_range(100, 50, true);
        assert_eq!(b.find_clear(0), None);
    }

    #[test]
    fn blocks_round_trip_and_corruption_is_caught() {
        let mut b = Bitmap::new(100_000);
        for i in (0..100_000).step_by(7) {
            b.set(i, true);
        }
        let per = Bitmap::bits_per_block(4096);
        let blocks = 100_000u64.div_ceil(per);
        let mut back = Bitmap::new(100_000);
        for i in 0..blocks {
            let enc = b.encode_block(i, 4096, BlockKind::BlockBitmap, 10 + i);
            back.decode_block(i, &enc, BlockKind::BlockBitmap, 10 + i)
                .unwrap();
        }
        assert_eq!(back, b);
        let mut enc = b.encode_block(0, 4096, BlockKind::BlockBitmap, 10);
        enc[100] ^= 4;
        assert!(back
            .decode_block(0, &enc, BlockKind::BlockBitmap, 10)
            .is_err());
    }

    proptest! {
        #[test]
        fn matches_a_vec_of_bools(ops in proptest::collection::vec((0u64..500, any::<bool>()), 0..300), want in 1u64..40, from in 0u64..500) {
            let mut b = Bitmap::new(500);
            let mut model = vec![false; 500];
            for (bit, v) in ops {
                b.set(bit, v);
                model[bit as usize] = v;
            }
            prop_assert_eq!(b.count_ones(), model.iter().filter(|&&x| x).count() as u64);
            if let Some((start, len)) = b.find_clear_run(want, from) {
                prop_assert!(len >= 1 && len <= want);
                prop_assert!((start..start + len).all(|i| !model[i as usize]));
            } else {
                prop_assert!(model.iter().all(|&x| x));
            }
        }

        #[test]
        fn range_operations_match_bit_by_bit(ranges in proptest::collection::vec((0u64..520, 0u64..200, any::<bool>()), 0..20), q in (0u64..520, 0u64..520)) {
            let mut b = Bitmap::new(500);
            let mut model = vec![false; 500];
            for (start, count, v) in ranges {
                b.set_range(start, count, v);
                for i in start..(start + count).min(500) {
                    model[i as usize] = v;
                }
                prop_assert_eq!(b.count_ones(), model.iter().filter(|&&x| x).count() as u64);
            }
            let (from, count) = q;
            let end = (from + count).min(500);
            let want = (from..end).filter(|&i| model[i as usize]).count() as u64;
            prop_assert_eq!(b.count_range(from, count), want);
            for value in [true, false] {
                let first = (from..end).find(|&i| model[i as usize] == value);
                prop_assert_eq!(b.first_in(from, from + count, value), first);
            }
        }
    }
}
