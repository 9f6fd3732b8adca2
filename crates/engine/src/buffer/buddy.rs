//! The buddy system that carves the pool's arena into power-of-two blocks.
//!
//! Pure bookkeeping over offsets, no memory touched, so it is tested on its own. Blocks of order
//! `k` are `min_block << k` bytes and start at a multiple of their size; a freed block merges with
//! its buddy (`offset ^ size`) whenever that buddy is free too.

use std::collections::BTreeSet;

/// Free lists of one arena.
#[derive(Debug)]
pub struct Buddy {
    min_block: usize,
    max_order: u8,
    free: Vec<BTreeSet<usize>>,
    free_bytes: usize,
}

impl Buddy {
    /// An arena of `min_block << max_order` bytes, all free. `min_block` must be a power of two.
    pub fn new(min_block: usize, max_order: u8) -> Self {
        assert!(
            min_block.is_power_of_two(),
            "buddy block size must be a power of two"
        );
        let mut free = vec![BTreeSet::new(); usize::from(max_order) + 1];
        free[usize::from(max_order)].insert(0);
        Buddy {
            min_block,
            max_order,
            free,
            free_bytes: min_block << max_order,
        }
    }

    /// Total bytes managed.
    pub fn capacity(&self) -> usize {
        self.min_block << self.max_order
    }

    /// Bytes currently free (possibly fragmented).
    pub fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Smallest order whose blocks hold `len` bytes, or `None` when larger than the arena.
    pub fn order_for(&self, len: usize) -> Option<u8> {
        let blocks = len.max(1).div_ceil(self.min_block).next_power_of_two();
        let order = blocks.trailing_zeros() as u8;
        (order <= self.max_order).then_some(order)
    }

    /// Size in bytes of a block of `order`.
    pub fn block_size(&self, order: u8) -> usize {
        self.min_block << order
    }

    /// Takes a block of `order`, splitting larger ones as needed. Returns its offset.
    pub fn alloc(&mut self, order: u8) -> Option<usize> {
        let want = usize::from(order);
        let found = (want..self.free.len()).find(|&k| !self.free[k].is_empty())?;
        let offset = self.free[found].pop_first()?;
        for k in (want..found).rev() {
            self.free[k].insert(offset + (self.min_block << k));
        }
        self.free_bytes -= self.min_block << order;
        Some(offset)
    }

    /// Returns a block taken by [`Buddy::alloc`], merging it with free buddies.
    pub fn free(&mut self, mut offset: usize, order: u8) {
        self.free_bytes += self.min_block << order;
        let mut k = usize::from(order);
        while k < usize::from(self.max_order) {
            let buddy = offset ^ (self.min_block << k);
            if !self.free[k].remove(&buddy) {
                break;
            }
            offset = offset.min(buddy);
            k += 1;
        }
        let fresh = self.free[k].insert(offset);
        debug_assert!(fresh, "double free of buddy block at offset {offset}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_and_merges_back_to_one_block() {
        let mut b = Buddy::new(4096, 4);
        let a = b.alloc(0).unwrap();
        let c = b.alloc(1).unwrap();
        assert_eq!(b.free_bytes(), 16 * 4096 - 3 * 4096);
        b.free(a, 0);
        b.free(c, 1);
        assert_eq!(b.free_bytes(), 16 * 4096);
        assert_eq!(b.alloc(4), Some(0), "everything merged into the top block");
    }

    #[test]
    fn order_for_rounds_up_and_refuses_oversize() {
        let b = Buddy::new(4096, 3);
        assert_eq!(b.order_for(1), Some(0));
        assert_eq!(b.order_for(4097), Some(1));
        assert_eq!(b.order_for(8 * 4096), Some(3));
        assert_eq!(b.order_for(8 * 4096 + 1), None);
    }

    proptest! {
        #[test]
        fn blocks_never_overlap_and_all_memory_returns(ops in proptest::collection::vec((0u8..5, any::<bool>()), 1..200)) {
            let mut b = Buddy::new(4096, 6);
            let mut live: Vec<(usize, u8)> = Vec::new();
            for (order, free_one) in ops {
                if free_one && !live.is_empty() {
                    let (off, ord) = live.swap_remove(0);
                    b.free(off, ord);
                } else if let Some(off) = b.alloc(order) {
                    prop_assert_eq!(off % b.block_size(order), 0);
                    for &(o, k) in &live {
                        let disjoint = off + b.block_size(order) <= o || o + b.block_size(k) <= off;
                        prop_assert!(disjoint, "block {off}/{order} overlaps {o}/{k}");
                    }
                    live.push((off, order));
                }
                let used: usize = live.iter().map(|&(_, k)| b.block_size(k)).sum();
                prop_assert_eq!(b.free_bytes() + used, b.capacity());
            }
            for (off, ord) in live.drain(..) {
                b.free(off, ord);
            }
            prop_assert_eq!(b.alloc(6), Some(0));
        }
    }
}
