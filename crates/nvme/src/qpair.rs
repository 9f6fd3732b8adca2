//! One submission/completion queue pair in DMA memory: writing entries at the tail, ringing the
//! tail doorbell, and consuming completions by phase tag. Used for the admin queue and for every
//! I/O queue.

use crate::bus::{dma_rmb, doorbell_barrier, Bus, DmaMem};
use crate::cmd::{Cqe, Sqe, CQE_SIZE, SQE_SIZE};
use crate::error::NvmeError;
use crate::regs;
use crate::ring::{CqRing, SqRing};
use std::sync::Arc;

pub(crate) struct QueuePair {
    pub qid: u16,
    pub entries: u16,
    sq_mem: DmaMem,
    cq_mem: DmaMem,
    sq: SqRing,
    cq: CqRing,
    sq_db: u32,
    cq_db: u32,
    /// Entries written since the last tail doorbell.
    unrung: bool,
    /// Completions consumed since the last head doorbell.
    unreleased: bool,
}

impl QueuePair {
    pub fn new(
        bus: &Arc<dyn Bus>,
        qid: u16,
        entries: u16,
        stride: u32,
    ) -> Result<QueuePair, NvmeError> {
        Ok(QueuePair {
            qid,
            entries,
            sq_mem: DmaMem::new(bus, usize::from(entries) * SQE_SIZE)?,
            cq_mem: DmaMem::new(bus, usize::from(entries) * CQE_SIZE)?,
            sq: SqRing::new(entries),
            cq: CqRing::new(entries),
            sq_db: regs::sq_tail_doorbell(qid, stride),
            cq_db: regs::cq_head_doorbell(qid, stride),
            unrung: false,
            unreleased: false,
        })
    }

    pub fn sq_iova(&self) -> u64 {
        self.sq_mem.iova(0)
    }

    pub fn cq_iova(&self) -> u64 {
        self.cq_mem.iova(0)
    }

    /// The rings' memory, for the model's device thread.
    #[cfg(all(test, loom))]
    pub fn model_memory(&self) -> (crate::bus::ModelWords, crate::bus::ModelWords) {
        (self.sq_mem.model_words(), self.cq_mem.model_words())
    }

    /// Back to the state of a freshly created queue, for re-creation after a controller reset.
    pub fn reset(&mut self) {
        self.sq_mem.zero();
        self.cq_mem.zero();
        self.sq = SqRing::new(self.entries);
        self.cq = CqRing::new(self.entries);
        self.unrung = false;
        self.unreleased = false;
    }

    pub fn is_full(&self) -> bool {
        self.sq.is_full()
    }

    /// Writes `sqe` at the tail; false when the queue is full.
    pub fn push(&mut self, sqe: &Sqe) -> bool {
        match self.sq.push() {
            Some(slot) => {
                self.sq_mem
                    .write(usize::from(slot) * SQE_SIZE, &sqe.to_bytes());
                self.unrung = true;
                true
            }
            None => false,
        }
    }

    /// Tells the controller about every entry written since the last call.
    pub fn ring(&mut self, bus: &dyn Bus) {
        if self.unrung {
            // The entries must be visible in memory before the doorbell write reaches the device.
            doorbell_barrier();
            bus.write32(self.sq_db, u32::from(self.sq.tail()));
            self.unrung = false;
        }
    }

    /// The next completion, if the controller posted one.
    pub fn pop(&mut self) -> Option<Cqe> {
        let off = usize::from(self.cq.head()) * CQE_SIZE;
        let status: [u8; 2] = self.cq_mem.read_volatile(off + 14);
        if !self.cq.is_new(u16::from_le_bytes(status)) {
            return None;
        }
        // The rest of the entry was written before its phase bit; read it only after seeing it.
        dma_rmb();
        let cqe = Cqe::from_bytes(&self.cq_mem.read_volatile(off));
        self.cq.advance();
        self.sq.set_head(cqe.sq_head);
        self.unreleased = true;
        Some(cqe)
    }

    /// Hands consumed completion slots back to the controller.
    pub fn release(&mut self, bus: &dyn Bus) {
        if self.unreleased {
            // The consumed entries are read before the head write lets the device reuse them.
            dma_rmb();
            bus.write32(self.cq_db, u32::from(self.cq.head()));
            self.unreleased = false;
        }
    }
}
