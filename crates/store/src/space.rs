//! Who owns which segment slot, the seg_seq lease, and the current superblock: the state every
//! allocation and every superblock update goes through.

use crate::error::StoreError;
use crate::format::superblock::Superblock;
use crate::format::SegRef;
use crate::segments::{self, RawSegments};
use kura_engine::BlockDevice;
use std::collections::BTreeSet;

/// seg_seqs taken per superblock write (format section 3, "seg_seq leases").
pub(crate) const LEASE: u64 = 1 << 16;

pub(crate) struct Space {
    pub(crate) segs: RawSegments,
    sb: Superblock,
    /// The copy the next superblock write goes to: the one not holding `sb`.
    next_copy: usize,
    next_seg_seq: u64,
    used: BTreeSet<u64>,
}

impl Space {
    /// Formats: both superblock copies for an empty store whose log starts at page 0 of slot 0.
    pub(crate) fn format(
        mut segs: RawSegments,
        segment_shift: u32,
        inline_threshold: u32,
    ) -> Result<Space, StoreError> {
        if segs.slot_count() < 2 {
            return Err(StoreError::Invalid(format!(
                "the device holds {} segment slots of {} bytes; at least 2 are needed",
                segs.slot_count(),
                1u64 << segment_shift
            )));
        }
        let sb = Superblock {
            generation: 1,
            store_id: rand::random(),
            segment_shift,
            slot_count: segs.slot_count(),
            seg_seq_limit: LEASE,
            log_start: SegRef {
                slot: 0,
                seg_seq: 0,
            },
            log_start_page: 0,
            inline_threshold,
            log_start_lsn: 1,
            manifest_head: SegRef::NONE,
        };
        segs.write_superblock(0, &sb)?;
        let sb = Superblock {
            generation: 2,
            ..sb
        };
        segs.write_superblock(1, &sb)?;
        Ok(Space {
            segs,
            next_copy: 0,
            next_seg_seq: sb.seg_seq_limit,
            sb,
            used: BTreeSet::new(),
        })
    }

    /// The current superblock of a store on `segs`, and a fresh seg_seq lease taken by writing
    /// it back before anything is allocated.
    pub(crate) fn open(
        mut dev: Box<dyn BlockDevice>,
    ) -> Result<(Space, Option<String>), StoreError> {
        let [a, b] = segments::read_superblocks(dev.as_mut())?;
        // A damaged copy is reported, and the next superblock write replaces it.
        let (sb, held, damaged) = match (a, b) {
            (Ok(a), Ok(b)) if b.generation > a.generation => (b, 1, None),
            (Ok(a), Ok(_)) => (a, 0, None),
            (Ok(a), Err(e)) => (a, 0, Some(format!("superblock copy B: {e}"))),
            (Err(e), Ok(b)) => (b, 1, Some(format!("superblock copy A: {e}"))),
            (Err(a), Err(b)) => return Err(StoreError::NoSuperblock { a, b }),
        };
        let segs = RawSegments::new(dev, sb.segment_shift)?;
        if sb.slot_count > segs.slot_count() {
            return Err(StoreError::Invalid(format!(
                "the superblock names {} segment slots; the device holds {}",
                sb.slot_count,
                segs.slot_count()
            )));
        }
        let mut space = Space {
            segs,
            next_copy: 1 - held,
            next_seg_seq: sb.seg_seq_limit,
            sb,
            used: BTreeSet::new(),
        };
        space.renew_lease()?;
        Ok((space, damaged))
    }

    pub(crate) fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Marks `slot` as holding data the store still needs.
    pub(crate) fn claim(&mut self, slot: u64) {
        self.used.insert(slot);
    }

    pub(crate) fn is_claimed(&self, slot: u64) -> bool {
        self.used.contains(&slot)
    }

    /// Gives `slot` back for allocation: nothing durable names it any more.
    pub(crate) fn free(&mut self, slot: u64) {
        self.used.remove(&slot);
    }

    /// Slots in use.
    pub(crate) fn used(&self) -> u64 {
        self.used.len() as u64
    }

    /// Records `head` as the manifest's first segment in the superblock (written and flushed).
    pub(crate) fn set_manifest_head(&mut self, head: SegRef) -> Result<(), StoreError> {
        let next = Superblock {
            generation: self.sb.generation + 1,
            manifest_head: head,
            ..self.sb.clone()
        };
        self.write_superblock(next)
    }

    fn write_superblock(&mut self, next: Superblock) -> Result<(), StoreError> {
        self.segs.write_superblock(self.next_copy, &next)?;
        self.sb = next;
        self.next_copy = 1 - self.next_copy;
        Ok(())
    }

    /// A free slot under a seg_seq never used before.
    pub(crate) fn allocate(&mut self) -> Result<SegRef, StoreError> {
        let slots = self.sb.slot_count;
        let slot = (0..slots)
            .find(|s| !self.used.contains(s))
            .ok_or(StoreError::Full { slots })?;
        if self.next_seg_seq >= self.sb.seg_seq_limit {
            self.renew_lease()?;
        }
        let seg = SegRef {
            slot,
            seg_seq: self.next_seg_seq,
        };
        self.next_seg_seq += 1;
        self.used.insert(slot);
        Ok(seg)
    }

    /// Moves `seg_seq_limit` one lease up and makes that durable, so every seg_seq from the old
    /// limit on is this instance's alone.
    fn renew_lease(&mut self) -> Result<(), StoreError> {
        let start = self.sb.seg_seq_limit;
        let next = Superblock {
            generation: self.sb.generation + 1,
            seg_seq_limit: start + LEASE,
            ..self.sb.clone()
        };
        self.write_superblock(next)?;
        self.next_seg_seq = start;
        Ok(())
    }
}
