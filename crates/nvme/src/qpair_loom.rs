//! Model check of the queue pair's orderings against a concurrent controller (`--cfg loom`,
//! scripts/loom.sh): the real [`QueuePair`] (its `push`, `ring`, `pop`, `release`, with
//! [`crate::bus::doorbell_barrier`] and [`crate::bus::dma_rmb`] as loom fences) over
//! [`crate::bus::DmaMem`] made of loom atomics, and a device thread that behaves as
//! `qpair_stress`'s: it acquires the tail doorbell, reads the submission entry, writes the
//! completion body, a release fence (a device's posted writes arrive in order), then the word
//! with the phase tag, and never overwrites a completion the driver has not released.
//!
//! Doorbells are *relaxed* stores here: an MMIO write orders nothing by itself, so only the
//! driver's barrier can make the entries visible before it. loom lets every relaxed load return
//! any store the memory model allows, so an entry read before it was published, or a completion
//! body read before its phase tag, gives a wrong answer in some explored execution (removing
//! either barrier from `qpair.rs` fails this test). Rings of 3 entries (2 usable) and 5 commands
//! make both rings wrap and the driver consume second-pass completions, whose phase tag is 0.

use crate::bus::Bus;
use crate::cmd::{Cqe, Sqe, CQE_SIZE, SQE_SIZE};
use crate::error::NvmeError;
use crate::qpair::QueuePair;
use crate::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

const QID: u16 = 1;
const STRIDE: u32 = 4;
const ENTRIES: u16 = 3;
const COMMANDS: u16 = 5;

#[derive(Default)]
struct Doorbells {
    sq_tail: AtomicU32,
    cq_head: AtomicU32,
}

struct ModelBus {
    bells: Arc<Doorbells>,
}

impl Bus for ModelBus {
    fn read32(&self, _off: u32) -> u32 {
        0
    }

    fn write32(&self, off: u32, val: u32) {
        if off == crate::regs::sq_tail_doorbell(QID, STRIDE) {
            self.bells.sq_tail.store(val, Ordering::Relaxed);
        } else if off == crate::regs::cq_head_doorbell(QID, STRIDE) {
            self.bells.cq_head.store(val, Ordering::Relaxed);
        }
    }

    fn map_dma(&self, _addr: u64, _len: usize) -> Result<(), NvmeError> {
        Ok(())
    }

    fn unmap_dma(&self, _addr: u64, _len: usize) {}

    fn describe(&self) -> String {
        "loom model device".into()
    }
}

/// What the device answers for `sqe`: depends on every word the driver wrote.
fn answer(sqe: &Sqe) -> u32 {
    let mut h = u32::from(sqe.opcode) ^ u32::from(sqe.cid).rotate_left(8) ^ sqe.nsid;
    h ^= (sqe.prp1 as u32) ^ ((sqe.prp1 >> 32) as u32).rotate_left(3);
    h ^= (sqe.prp2 as u32).rotate_left(5) ^ ((sqe.prp2 >> 32) as u32).rotate_left(7);
    for (i, d) in sqe.cdw.iter().enumerate() {
        h = h.rotate_left(5) ^ d.wrapping_mul(2 * i as u32 + 1);
    }
    h
}

fn device(bells: &Doorbells, sq: &[AtomicU32], cq: &[AtomicU32]) {
    let n = ENTRIES;
    let (mut head, mut cq_tail, mut phase) = (0u16, 0u16, 1u16);
    for _ in 0..COMMANDS {
        // Acquire: as a device's reads after the doorbell see what was visible before it.
        while bells.sq_tail.load(Ordering::Acquire) as u16 == head {
            loom::thread::yield_now();
        }
        while (cq_tail + 1) % n == bells.cq_head.load(Ordering::Acquire) as u16 {
            loom::thread::yield_now();
        }
        let at = usize::from(head) * SQE_SIZE / 4;
        let mut raw = [0u8; SQE_SIZE];
        for (i, w) in raw.chunks_exact_mut(4).enumerate() {
            w.copy_from_slice(&sq[at + i].load(Ordering::Relaxed).to_le_bytes());
        }
        let sqe = Sqe::from_bytes(&raw);
        head = (head + 1) % n;
        let cqe = Cqe {
            result: answer(&sqe),
            sq_head: head,
            sq_id: QID,
            cid: sqe.cid,
            status: phase,
        }
        .to_bytes();
        let at = usize::from(cq_tail) * CQE_SIZE / 4;
        let word = |i: usize| u32::from_le_bytes([cqe[i], cqe[i + 1], cqe[i + 2], cqe[i + 3]]);
        for i in 0..3 {
            cq[at + i].store(word(4 * i), Ordering::Relaxed);
        }
        fence(Ordering::Release);
        // cid and the status word (phase tag) share the last word.
        cq[at + 3].store(word(12), Ordering::Relaxed);
        cq_tail = (cq_tail + 1) % n;
        if cq_tail == 0 {
            phase ^= 1;
        }
    }
}

#[test]
fn the_device_sees_whole_entries_and_the_driver_whole_completions() {
    loom::model(|| {
        let bells = Arc::new(Doorbells::default());
        let bus: Arc<dyn Bus> = Arc::new(ModelBus {
            bells: Arc::clone(&bells),
        });
        let mut qp = QueuePair::new(&bus, QID, ENTRIES, STRIDE).expect("queue pair");
        let (sq, cq) = qp.model_memory();
        let dev_bells = Arc::clone(&bells);
        let dev = loom::thread::spawn(move || device(&dev_bells, &sq, &cq));

        let mut expected: Vec<Option<u32>> = vec![None; usize::from(COMMANDS)];
        let (mut sent, mut done) = (0u16, 0u16);
        while done < COMMANDS {
            let mut progressed = false;
            while sent < COMMANDS && !qp.is_full() {
                let seq = 0x9e37_79b9u32.wrapping_mul(u32::from(sent) + 1);
                let mut sqe = Sqe::rw(2, seq, u64::from(seq) << 7, 1, u64::from(!seq) << 12, 7);
                sqe.cid = sent;
                expected[usize::from(sent)] = Some(answer(&sqe));
                assert!(qp.push(&sqe));
                sent += 1;
                progressed = true;
            }
            qp.ring(bus.as_ref());
            while let Some(cqe) = qp.pop() {
                let want = expected[usize::from(cqe.cid)].take();
                assert_eq!(
                    Some(cqe.result),
                    want,
                    "cid {}: torn entry or completion",
                    cqe.cid
                );
                done += 1;
                progressed = true;
            }
            qp.release(bus.as_ref());
            if !progressed {
                loom::thread::yield_now();
            }
        }
        dev.join().expect("device thread");
    });
}
