//! Test support shared by this crate's unit tests and its integration tests (`tests/`); not
//! part of the file system's API.
//!
//! [`bit_flips`] is the damage both the fsck test ("every flip is noticed") and the repair test
//! ("every flip is repaired") apply to a fresh image, one flip at a time.

use crate::layout::Layout;

/// The blocks of a freshly made image that hold checked metadata: the superblock and its backup,
/// the journal superblock and the first log block, the bitmaps, the inode table and the root
/// directory. (Unused journal log blocks hold nothing to check.)
pub fn fresh_metadata_blocks(l: &Layout) -> Vec<u64> {
    let mut blocks = vec![
        0,
        l.backup_superblock(),
        l.journal_start,
        l.journal_start + 1,
    ];
    blocks.extend(l.block_bitmap_start..l.data_start + 1);
    blocks
}

/// One single-bit change to an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitFlip {
    /// Which flip of the sequence this is, from 0.
    pub round: usize,
    /// The file-system block it falls in.
    pub block: u64,
    /// Its byte offset in the image.
    pub at: usize,
    /// The bit flipped in that byte.
    pub mask: u8,
}

impl BitFlip {
    /// Makes `image` a copy of `pristine` with this one bit flipped.
    pub fn apply(&self, image: &mut [u8], pristine: &[u8]) {
        image.copy_from_slice(pristine);
        image[self.at] ^= self.mask;
    }
}

/// `rounds` flips, each of one bit in a byte of one of `blocks` (each `block_size` bytes), picked
/// by a xorshift generator seeded with `seed`: the same seed gives the same flips on every run.
pub fn bit_flips(
    seed: u64,
    rounds: usize,
    blocks: &[u64],
    block_size: usize,
) -> impl Iterator<Item = BitFlip> + '_ {
    let mut state = seed;
    (0..rounds).map(move |round| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let block = blocks[(state % blocks.len() as u64) as usize];
        BitFlip {
            round,
            block,
            at: block as usize * block_size + (state >> 20) as usize % block_size,
            mask: 1 << (state >> 60 & 7),
        }
    })
}
