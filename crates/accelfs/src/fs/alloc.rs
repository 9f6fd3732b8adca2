//! Block and inode allocation for a mounted file system, with the freed-after-commit rule.
//!
//! Two views of the block bitmap are kept. `recorded` is what the next transaction writes: a
//! block freed by the running transaction is already clear there. `taken` additionally keeps
//! such blocks set until that transaction has committed, so they cannot be handed to another
//! file first: a crash before the commit then leaves the old owner intact, pointing at its own
//! data (format §7).

use crate::bitmap::Bitmap;
use crate::header::BlockKind;
use crate::layout::Layout;
use std::collections::BTreeSet;

pub(crate) struct Allocator {
    recorded: Bitmap,
    taken: Bitmap,
    freed_uncommitted: Vec<(u64, u64)>,
    inodes: Bitmap,
    dirty_block_bitmap: BTreeSet<u64>,
    dirty_inode_bitmap: BTreeSet<u64>,
    bits_per_block: u64,
    layout: Layout,
    inode_rotor: u64,
}

impl Allocator {
    pub(crate) fn new(layout: Layout, blocks: Bitmap, inodes: Bitmap) -> Self {
        Allocator {
            taken: blocks.clone(),
            recorded: blocks,
            freed_uncommitted: Vec::new(),
            inodes,
            dirty_block_bitmap: BTreeSet::new(),
            dirty_inode_bitmap: BTreeSet::new(),
            bits_per_block: Layout::bits_per_bitmap_block(layout.block_size),
            layout,
            inode_rotor: 2,
        }
    }

    /// Allocates up to `want` contiguous data blocks, preferring to start at `goal`. Returns
    /// (first, count); `None` when the device is full.
    pub(crate) fn alloc_blocks(&mut self, goal: u64, want: u64) -> Option<(u64, u64)> {
        let lo = self.layout.data_start;
        let hi = self.layout.backup_superblock();
        let goal = if goal < lo || goal >= hi { lo } else { goal };
        let (start, len) = self.taken.find_clear_run(want.max(1), goal)?;
        if start < lo || start >= hi {
            return None;
        }
        let len = len.min(hi - start);
        self.taken.set_range(start, len, true);
        self.recorded.set_range(start, len, true);
        self.touch_blocks(start, len);
        Some((start, len))
    }

    /// Whether every one of `len` blocks from `start` is in use (allocated, or freed by the
    /// running transaction but not yet reusable).
    pub(crate) fn all_taken(&self, start: u64, len: u64) -> bool {
        self.taken.count_range(start, len) == len
    }

    /// Frees blocks in the running transaction; they become allocatable after it commits.
    pub(crate) fn free_blocks(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        self.recorded.set_range(start, len, false);
        self.touch_blocks(start, len);
        self.freed_uncommitted.push((start, len));
    }

    /// What the running transaction freed, handed to its commit (the blocks stay taken until
    /// [`Allocator::committed`] is given them back once that commit is durable).
    pub(crate) fn take_freed(&mut self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.freed_uncommitted)
    }

    /// A transaction that freed `freed` is durable: those blocks may be reused.
    pub(crate) fn committed(&mut self, freed: Vec<(u64, u64)>) {
        for (start, len) in freed {
            self.taken.set_range(start, len, false);
        }
    }

    pub(crate) fn alloc_inode(&mut self) -> Option<u64> {
        let ino = self.inodes.find_clear(self.inode_rotor)?;
        if ino < 2 {
            return None;
        }
        self.inodes.set(ino, true);
        self.inode_rotor = ino + 1;
        self.dirty_inode_bitmap.insert(ino / self.bits_per_block);
        Some(ino)
    }

    pub(crate) fn free_inode(&mut self, ino: u64) {
        self.inodes.set(ino, false);
        self.dirty_inode_bitmap.insert(ino / self.bits_per_block);
    }

    /// Bitmap blocks changed by the running transaction, as (device block, image).
    pub(crate) fn dirty_images(&self, block_size: usize) -> Vec<(u64, Vec<u8>)> {
        let l = &self.layout;
        let mut out = Vec::new();
        for &i in &self.dirty_block_bitmap {
            let n = l.block_bitmap_start + i;
            out.push((
                n,
                self.recorded
                    .encode_block(i, block_size, BlockKind::BlockBitmap, n),
            ));
        }
        for &i in &self.dirty_inode_bitmap {
            let n = l.inode_bitmap_start + i;
            out.push((
                n,
                self.inodes
                    .encode_block(i, block_size, BlockKind::InodeBitmap, n),
            ));
        }
        out
    }

    pub(crate) fn dirty_count(&self) -> usize {
        self.dirty_block_bitmap.len() + self.dirty_inode_bitmap.len()
    }

    pub(crate) fn clear_dirty(&mut self) {
        self.dirty_block_bitmap.clear();
        self.dirty_inode_bitmap.clear();
    }

    /// Data blocks free now (blocks freed by the running transaction count as used).
    pub(crate) fn free_block_count(&self) -> u64 {
        self.taken.len() - self.taken.count_ones()
    }

    pub(crate) fn free_inode_count(&self) -> u64 {
        self.inodes.len() - self.inodes.count_ones()
    }

    fn touch_blocks(&mut self, start: u64, len: u64) {
        let first = start / self.bits_per_block;
        let last = (start + len - 1) / self.bits_per_block;
        self.dirty_block_bitmap.extend(first..=last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocator() -> Allocator {
        let layout = Layout::plan(4096, 1024, None).expect("layout");
        let mut blocks = Bitmap::new(layout.total_blocks);
        blocks.set_range(0, layout.data_start, true);
        blocks.set(layout.backup_superblock(), true);
        let mut inodes = Bitmap::new(layout.inode_count);
        inodes.set_range(0, 2, true);
        Allocator::new(layout, blocks, inodes)
    }

    #[test]
    fn freed_blocks_are_not_reused_before_commit() {
        let mut a = allocator();
        let (first, n) = a.alloc_blocks(0, 8).expect("space");
        assert_eq!(n, 8);
        assert!(first >= a.layout.data_start);
        a.free_blocks(first, 8);
        let (again, _) = a.alloc_blocks(first, 8).expect("space");
        assert!(
            again >= first + 8,
            "reused a block freed by the running transaction"
        );
        let freed = a.take_freed();
        a.committed(freed);
        assert_eq!(a.alloc_blocks(first, 8), Some((first, 8)));
    }

    #[test]
    fn allocation_stays_in_the_data_region_and_reports_full() {
        let mut a = allocator();
        let free = a.free_block_count();
        let mut got = 0;
        while let Some((start, n)) = a.alloc_blocks(0, 1000) {
            assert!(start >= a.layout.data_start && start + n <= a.layout.backup_superblock());
            got += n;
        }
        assert_eq!(got, free);
        assert_eq!(a.free_block_count(), 0);
        assert!(a.dirty_count() > 0);
    }
}
