//! Device writes planned under the state lock and turned into commands after it is released.
//!
//! A commit, an fdatasync or a large write decides under the state lock which device blocks
//! get which bytes; putting those bytes into command buffers (one buffer per run of contiguous
//! device blocks, up to the largest command) is a copy of every byte written, megabytes for a
//! table a LevelDB compaction syncs. [`PlannedWrites`] holds the plan: the runs, with each
//! block's bytes by reference (a cached block shared with the cache, or a slice of the caller's
//! data), so the copy happens in [`PlannedWrites::into_ops`], which the callers run holding only
//! the disk lock. A cached block stays valid meanwhile because the cache changes a block that a
//! plan still holds by copying it first (`Arc::make_mut`, see `cache.rs`).

use crate::fsdevice::BatchOp;
use kura_engine::{BufferPool, IoBuf};
use std::sync::Arc;

/// One block's bytes in a plan.
pub(crate) trait BlockBytes {
    fn bytes(&self) -> &[u8];

    /// The block as a command buffer of its own (a single-block run).
    fn into_buffer(self) -> IoBuf;
}

/// A cached block, shared with the cache until the write is issued.
impl BlockBytes for Arc<IoBuf> {
    fn bytes(&self) -> &[u8] {
        self
    }

    /// Without a copy when the cache no longer holds it (an evicted block).
    fn into_buffer(self) -> IoBuf {
        Arc::try_unwrap(self).unwrap_or_else(|shared| IoBuf::from_slice(&shared))
    }
}

/// A whole block of a caller's write.
impl BlockBytes for &[u8] {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn into_buffer(self) -> IoBuf {
        let mut buf = command_buffer(self.len());
        buf.copy_from_slice(self);
        buf
    }
}

/// Writes of whole blocks, grouped into runs of contiguous device blocks, each run at most one
/// command long.
pub(crate) struct PlannedWrites<B> {
    /// (first device block, the blocks' bytes in device order).
    runs: Vec<(u64, Vec<B>)>,
    bs: usize,
}

impl<B: BlockBytes> PlannedWrites<B> {
    pub(crate) fn none(bs: usize) -> Self {
        PlannedWrites {
            runs: Vec::new(),
            bs,
        }
    }

    /// Plans `blocks` (device block, bytes of one block), sorted by device block and merged
    /// into runs of at most `max_bytes` (at least one block each).
    pub(crate) fn of_blocks(mut blocks: Vec<(u64, B)>, bs: usize, max_bytes: usize) -> Self {
        blocks.sort_by_key(|(p, _)| *p);
        let per_command = (max_bytes / bs).max(1);
        let mut runs: Vec<(u64, Vec<B>)> = Vec::new();
        for (p, bytes) in blocks {
            match runs.last_mut() {
                Some((first, run)) if *first + run.len() as u64 == p && run.len() < per_command => {
                    run.push(bytes)
                }
                _ => runs.push((p, vec![bytes])),
            }
        }
        PlannedWrites { runs, bs }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Blocks written.
    pub(crate) fn block_count(&self) -> usize {
        self.runs.iter().map(|(_, run)| run.len()).sum()
    }

    /// Every device block written.
    pub(crate) fn targets(&self) -> Vec<u64> {
        self.runs
            .iter()
            .flat_map(|(first, run)| *first..*first + run.len() as u64)
            .collect()
    }

    /// Bytes written.
    pub(crate) fn bytes(&self) -> u64 {
        self.runs
            .iter()
            .map(|(_, run)| (run.len() * self.bs) as u64)
            .sum()
    }

    /// The commands, one per run: the copy into command buffers happens here.
    pub(crate) fn into_ops(self) -> Vec<BatchOp> {
        let bs = self.bs;
        self.runs
            .into_iter()
            .map(|(block, run)| {
                let buf = match <[B; 1]>::try_from(run) {
                    Ok([only]) => only.into_buffer(),
                    Err(run) => {
                        let mut buf = command_buffer(run.len() * bs);
                        for (i, bytes) in run.iter().enumerate() {
                            buf[i * bs..(i + 1) * bs].copy_from_slice(&bytes.bytes()[..bs]);
                        }
                        buf
                    }
                };
                BatchOp {
                    write: true,
                    block,
                    buf,
                }
            })
            .collect()
    }
}

/// A buffer for one command (a device read, or data about to be copied in whole): from the
/// registered pool when it has room, not zeroed, since every byte is overwritten before anyone
/// looks.
pub(crate) fn command_buffer(len: usize) -> IoBuf {
    BufferPool::global()
        .alloc(len)
        .unwrap_or_else(|_| IoBuf::zeroed(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(fill: u8, bs: usize) -> Arc<IoBuf> {
        let mut b = IoBuf::zeroed(bs);
        b.fill(fill);
        Arc::new(b)
    }

    #[test]
    fn contiguous_blocks_merge_into_commands_no_longer_than_the_largest() {
        let bs = 512;
        let blocks = vec![
            (12, block(3, bs)),
            (10, block(1, bs)),
            (11, block(2, bs)),
            (13, block(4, bs)),
            (20, block(9, bs)),
        ];
        let plan = PlannedWrites::of_blocks(blocks, bs, 3 * bs);
        assert_eq!(plan.targets(), vec![10, 11, 12, 13, 20]);
        assert_eq!(plan.bytes(), 5 * bs as u64);
        let ops = plan.into_ops();
        let shape: Vec<(u64, usize)> = ops.iter().map(|o| (o.block, o.buf.len())).collect();
        assert_eq!(shape, vec![(10, 3 * bs), (13, bs), (20, bs)]);
        assert!(ops.iter().all(|o| o.write));
        assert_eq!(&ops[0].buf[..bs], &[1u8; 512][..]);
        assert_eq!(&ops[0].buf[2 * bs..], &[3u8; 512][..]);
        assert_eq!(&ops[1].buf[..], &[4u8; 512][..]);
    }

    #[test]
    fn a_plan_keeps_the_bytes_it_was_given_while_the_cache_changes_its_copy() {
        let bs = 512;
        let mut cached = block(7, bs);
        let plan = PlannedWrites::of_blocks(vec![(5, Arc::clone(&cached))], bs, 8 * bs);
        Arc::make_mut(&mut cached).fill(8);
        let ops = plan.into_ops();
        assert_eq!(&ops[0].buf[..], &[7u8; 512][..]);
        assert_eq!(&cached[..], &[8u8; 512][..]);
    }

    #[test]
    fn slices_of_a_callers_write_are_copied_only_when_issued() {
        let bs = 256;
        let data = vec![5u8; 2 * bs];
        let plan =
            PlannedWrites::of_blocks(vec![(40, &data[..bs]), (41, &data[bs..])], bs, 1 << 20);
        let ops = plan.into_ops();
        assert_eq!(ops.len(), 1);
        assert_eq!(&ops[0].buf[..], &data[..]);
    }
}
