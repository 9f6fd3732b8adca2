//! The journal at run time (format §7): commit, checkpoint, and recovery at mount.
//!
//! `commit` writes a transaction into the circular log and flushes once (twice when data
//! writes are not yet flushed: they are made durable first, so that no commit can reach the
//! media before the ordered data it makes reachable); it is durable when `commit` returns. Home blocks are updated later by `checkpoint` (when the log fills, or at
//! unmount), which flushes the home writes before advancing the journal superblock, so log space
//! is reused only once what it protected is on disk. Until then, [`Journal::image`] serves the
//! committed contents of a block whose home copy is stale.

use crate::error::{FormatError, FsError};
use crate::fsdevice::{BatchOp, FsDevice};
use crate::journal::{self, blocks_needed, JournalArea, JournalSuper, Transaction};
use kura_engine::IoBuf;
use std::collections::{BTreeMap, BTreeSet};

/// Block number → the newest committed contents of that block.
pub type Images = BTreeMap<u64, Vec<u8>>;

/// Home blocks a checkpoint hands the device at once.
const CHECKPOINT_BATCH: usize = 256;

/// What recovery did at mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Committed transactions found in the log and replayed.
    pub replayed: usize,
    /// Home blocks rewritten.
    pub blocks_written: usize,
}

/// The journal of a mounted file system.
#[derive(Debug)]
pub struct Journal {
    area: JournalArea,
    block_size: usize,
    super_: JournalSuper,
    /// Next free log position (modulo the log's slots).
    head: u64,
    next_seq: u64,
    /// Log slots used since the last checkpoint.
    used: u64,
    /// Committed but not checkpointed: the newest image of each block.
    pending: BTreeMap<u64, Vec<u8>>,
}

impl Journal {
    /// Replays every committed transaction to its home blocks, makes that durable, and returns a
    /// journal ready for new commits.
    pub fn recover(io: &mut FsDevice, area: JournalArea) -> Result<(Journal, Recovery), FsError> {
        let (mut j, recovery) = Journal::load(io, area)?;
        if recovery.replayed > 0 {
            j.used = 1; // forces the checkpoint to advance the superblock past the replayed log
            j.checkpoint(io)?;
        }
        Ok((j, recovery))
    }

    /// Recovery for a read-only mount: finds the committed transactions as [`Journal::recover`]
    /// does but writes nothing. Returns the newest committed image of every block they touch
    /// (for the caller to serve in place of the stale home copies) and a journal with nothing
    /// pending, which must not be committed to. Memory: at most one image per log slot, so
    /// `(journal length − 2) × block size` (see [`crate::layout::MAX_JOURNAL_BLOCKS`]).
    pub fn recover_in_memory(
        io: &mut FsDevice,
        area: JournalArea,
    ) -> Result<(Journal, Recovery, Images), FsError> {
        let (mut j, recovery) = Journal::load(io, area)?;
        let images = std::mem::take(&mut j.pending);
        Ok((j, recovery, images))
    }

    /// Reads the log: the journal positioned after its last committed transaction, with the
    /// newest image of every block those transactions wrote pending.
    fn load(io: &mut FsDevice, area: JournalArea) -> Result<(Journal, Recovery), FsError> {
        let block_size = io.block_size();
        let (first, second) = (io.read(area.start)?, io.read(area.start + 1)?);
        let super_ = JournalSuper::newest(area, &first, &second)?;
        let (txns, end) = journal::scan(super_, area, block_size, |n| io.read(n))?;
        let mut j = Journal {
            area,
            block_size,
            super_,
            head: end,
            next_seq: super_.oldest_seq + txns.len() as u64,
            used: 0,
            pending: BTreeMap::new(),
        };
        let replayed = txns.len();
        // Images move from the transactions into `pending` (no copy): the scan already bounded
        // them to one pass over the log.
        for t in txns {
            for (target, image) in t.images {
                if target < area.start + area.len
                    || target >= io.blocks()
                    || image.len() != block_size
                {
                    return Err(FormatError::BadSuperblock(format!(
                        "journal transaction {} writes block {target}, which it may not touch",
                        t.seq
                    ))
                    .into());
                }
                j.pending.insert(target, image);
            }
        }
        let recovery = Recovery {
            replayed,
            blocks_written: j.pending.len(),
        };
        Ok((j, recovery))
    }

    /// The committed contents of `block` if its home copy is not yet up to date.
    pub fn image(&self, block: u64) -> Option<&[u8]> {
        self.pending.get(&block).map(Vec::as_slice)
    }

    /// Whether any of the `count` blocks from `start` has committed contents newer than its home
    /// copy (so reading it from home would return stale data).
    pub fn has_image_in(&self, start: u64, count: u64) -> bool {
        count > 0
            && self
                .pending
                .range(start..start.saturating_add(count))
                .next()
                .is_some()
    }

    /// The blocks with committed contents newer than their home copy, in order; `None` when
    /// there are more than `limit`.
    pub fn image_blocks(&self, limit: usize) -> Option<BTreeSet<u64>> {
        (self.pending.len() <= limit).then(|| self.pending.keys().copied().collect())
    }

    /// Blocks the largest transaction may hold.
    pub fn max_transaction_blocks(&self) -> usize {
        let mut n = (self.area.slots() / 2) as usize;
        while n > 0 && blocks_needed(n, self.block_size) > self.area.slots() / 2 {
            n -= 1;
        }
        n
    }

    /// Writes `images` (block number, full block contents) as one transaction and flushes.
    /// Returns its sequence number; it survives any crash from now on.
    pub fn commit(&mut self, io: &mut FsDevice, images: &[(u64, Vec<u8>)]) -> Result<u64, FsError> {
        self.commit_with_data(io, images, Vec::new())
    }

    /// Like [`Journal::commit`], and also writes `data` (ordered data blocks) first. When any
    /// write is not yet flushed — `data`, or data written home earlier (a large write's direct
    /// blocks, cache evictions) — a flush makes it durable before the log is written: the device
    /// does not order writes in flight, so a commit block issued beside a data block could reach
    /// the media without it, and replay would then make a newly allocated block reachable with
    /// whatever a previous owner left in it.
    pub fn commit_with_data(
        &mut self,
        io: &mut FsDevice,
        images: &[(u64, Vec<u8>)],
        data: Vec<BatchOp>,
    ) -> Result<u64, FsError> {
        if images.len() > self.max_transaction_blocks() {
            return Err(FsError::Invalid(format!(
                "a transaction of {} blocks exceeds the journal's limit of {}",
                images.len(),
                self.max_transaction_blocks()
            )));
        }
        if let Some((t, img)) = images
            .iter()
            .find(|(t, img)| img.len() != self.block_size || *t < self.area.start + self.area.len)
        {
            return Err(FsError::Invalid(format!(
                "journal image for block {t} ({} bytes) is not a metadata block image",
                img.len()
            )));
        }
        let need = blocks_needed(images.len(), self.block_size);
        if self.used + need > self.area.slots() {
            self.checkpoint(io)?;
        }
        let txn = Transaction {
            seq: self.next_seq,
            images: images.to_vec(),
        };
        if !data.is_empty() {
            io.batch(data)?;
        }
        if io.has_unflushed_writes() {
            io.flush()?;
        }
        let mut ops = Vec::new();
        // The log blocks of a transaction are contiguous except where the log wraps: each run
        // goes out as one command.
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (block, b) in journal::encode(&txn, self.area, self.head, self.block_size) {
            match runs.last_mut() {
                Some((first, run)) if *first + (run.len() / self.block_size) as u64 == block => {
                    run.extend_from_slice(&b)
                }
                _ => runs.push((block, b)),
            }
        }
        ops.extend(runs.into_iter().map(|(block, run)| BatchOp {
            write: true,
            block,
            buf: IoBuf::from_slice(&run),
        }));
        io.batch(ops)?;
        io.flush()?;
        for (t, img) in images {
            self.pending.insert(*t, img.clone());
        }
        self.head = (self.head + need) % self.area.slots();
        self.used += need;
        self.next_seq += 1;
        Ok(txn.seq)
    }

    /// Writes every committed image home, flushes, then advances the journal superblock (to the
    /// other copy) and flushes again.
    pub fn checkpoint(&mut self, io: &mut FsDevice) -> Result<(), FsError> {
        if self.used == 0 && self.pending.is_empty() {
            return Ok(());
        }
        // In batches, so the copies into device buffers add a bounded amount of memory to the
        // images (a whole replayed journal can be large).
        let pending: Vec<(&u64, &Vec<u8>)> = self.pending.iter().collect();
        for part in pending.chunks(CHECKPOINT_BATCH) {
            let homes = part
                .iter()
                .map(|(t, img)| BatchOp {
                    write: true,
                    block: **t,
                    buf: IoBuf::from_slice(img),
                })
                .collect();
            io.batch(homes)?;
        }
        io.flush()?;
        let js = JournalSuper {
            oldest_seq: self.next_seq,
            oldest_pos: self.head,
            generation: self.super_.generation + 1,
        };
        let n = self.area.super_block(js.generation);
        io.write(n, &js.encode(self.block_size, n))?;
        io.flush()?;
        self.super_ = js;
        self.pending.clear();
        self.used = 0;
        Ok(())
    }
}

/// Writes both superblock copies of an empty journal in `area` (`bs`-byte blocks): recovery
/// starts at sequence 1, log position 0. This is how mkfs leaves a journal and how repair resets
/// one; the log itself is the caller's to clear, and nothing here flushes.
pub fn write_empty_supers(io: &mut FsDevice, area: JournalArea, bs: usize) -> Result<(), FsError> {
    for generation in [0, 1] {
        let js = JournalSuper {
            oldest_seq: 1,
            oldest_pos: 0,
            generation,
        };
        let n = area.super_block(generation);
        io.write(n, &js.encode(bs, n))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kura_engine::backend::common::QueueOptions;
    use kura_engine::backend::mem::MemDevice;
    use kura_engine::fault::{materialize, FaultDevice, FaultPlan, TraceEvent};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::sync::{Arc, Mutex};

    const BS: usize = 4096;
    const BLOCKS: u64 = 256;
    const AREA: JournalArea = JournalArea { start: 1, len: 34 };
    const HOME: std::ops::Range<u64> = 40..56;

    fn blank_journal(io: &mut FsDevice) {
        io.zero(AREA.start, AREA.len).unwrap();
        write_empty_supers(io, AREA, BS).unwrap();
        io.flush().unwrap();
    }

    fn home_state(image: &[u8]) -> Vec<Vec<u8>> {
        HOME.map(|b| image[b as usize * BS..(b as usize + 1) * BS].to_vec())
            .collect()
    }

    #[test]
    fn commits_survive_remount_with_and_without_checkpoint() {
        let dev = MemDevice::new(BLOCKS * BS as u64, QueueOptions::default());
        let storage = dev.storage();
        let mut io = FsDevice::new(Box::new(dev), BS).unwrap();
        blank_journal(&mut io);
        let (mut j, rec) = Journal::recover(&mut io, AREA).unwrap();
        assert_eq!(rec, Recovery::default());
        j.commit(&mut io, &[(40, vec![1; BS]), (41, vec![2; BS])])
            .unwrap();
        assert_eq!(j.image(40), Some(&[1u8; BS][..]));
        assert_eq!(
            io.read(40).unwrap(),
            vec![0; BS],
            "home not written before checkpoint"
        );
        drop((j, io));
        let mut io = FsDevice::new(
            Box::new(MemDevice::with_storage(
                storage.clone(),
                QueueOptions::default(),
            )),
            BS,
        )
        .unwrap();
        let (mut j, rec) = Journal::recover(&mut io, AREA).unwrap();
        assert_eq!(
            rec,
            Recovery {
                replayed: 1,
                blocks_written: 2
            }
        );
        assert_eq!(io.read(41).unwrap(), vec![2; BS]);
        let (_, again) = Journal::recover(&mut io, AREA).unwrap();
        assert_eq!(
            again.replayed, 0,
            "recovery advanced the journal superblock"
        );
        // Many commits wrap the log through checkpoints.
        for i in 0..50u8 {
            j.commit(&mut io, &[(42 + u64::from(i % 4), vec![i; BS])])
                .unwrap();
        }
        j.checkpoint(&mut io).unwrap();
        assert_eq!(io.read(43).unwrap(), vec![49; BS]);
        assert!(
            j.commit(&mut io, &vec![(44, vec![0; BS]); 100]).is_err(),
            "oversized transaction refused"
        );
        assert!(
            j.commit(&mut io, &[(3, vec![0; BS])]).is_err(),
            "the log itself is not a target"
        );
    }

    /// Crash harness for the journal: record the write/flush stream of random commits and
    /// checkpoints, cut it at many points (unflushed blocks kept at random), recover, and check
    /// that the home blocks equal the state after some transaction between the last one
    /// acknowledged before the cut and the last one begun.
    #[test]
    fn every_crash_point_recovers_an_acknowledged_prefix() {
        let points: usize = std::env::var("KURA_CRASH_POINTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600);
        let mem = MemDevice::new(BLOCKS * BS as u64, QueueOptions::default());
        let fault = FaultDevice::new(
            Box::new(mem),
            FaultPlan {
                record: true,
                ..FaultPlan::default()
            },
        );
        let control = fault.control();
        let mut io = FsDevice::new(Box::new(fault), BS).unwrap();
        blank_journal(&mut io);
        let (mut j, _) = Journal::recover(&mut io, AREA).unwrap();
        let mut rng = SmallRng::seed_from_u64(11);
        let mut state = vec![vec![0u8; BS]; HOME.count()];
        let mut states = vec![state.clone()];
        let mut began = vec![control.trace().len()];
        let mut acked = vec![control.trace().len()];
        for i in 0..60 {
            let n = rng.gen_range(1..5);
            let images: Vec<(u64, Vec<u8>)> = (0..n)
                .map(|_| (rng.gen_range(HOME), vec![rng.gen::<u8>() | 1; BS]))
                .collect();
            began.push(control.trace().len());
            j.commit(&mut io, &images).unwrap();
            acked.push(control.trace().len());
            for (t, img) in &images {
                state[(*t - HOME.start) as usize] = img.clone();
            }
            states.push(state.clone());
            if i % 7 == 6 {
                j.checkpoint(&mut io).unwrap();
            }
        }
        let trace = control.trace();
        assert!(trace.iter().filter(|e| **e == TraceEvent::Flush).count() > 60);
        let base = vec![0u8; BLOCKS as usize * BS];
        let mut rng = SmallRng::seed_from_u64(99);
        for p in 0..points {
            let cut = rng.gen_range(acked[0]..=trace.len());
            let image = materialize(&base, &trace, cut, BS, 0.5, p as u64);
            let storage = Arc::new(Mutex::new(image));
            let mut io = FsDevice::new(
                Box::new(MemDevice::with_storage(
                    storage.clone(),
                    QueueOptions::default(),
                )),
                BS,
            )
            .unwrap();
            Journal::recover(&mut io, AREA)
                .unwrap_or_else(|e| panic!("cut {cut}: recovery failed: {e}"));
            let after = home_state(&storage.lock().unwrap());
            let lo = acked.iter().rposition(|&a| a <= cut).unwrap();
            let hi = began.iter().rposition(|&b| b < cut).unwrap_or(0).max(lo);
            assert!(
                (lo..=hi).any(|k| states[k] == after),
                "cut {cut}: home blocks match no state between acknowledged transaction {lo} and begun {hi}"
            );
        }
    }
}
