//! Stress test of the queue pair's memory ordering against a controller that runs *concurrently*.
//!
//! The simulated controller ([`crate::sim`]) runs each command inside the doorbell write, on the
//! driver's own thread, so it never races the driver. Here a device thread plays the controller
//! the way real hardware does: it polls the tail doorbell, reads submission entries out of the
//! driver's queue memory, and posts completions body first and status word (phase tag) last,
//! while the driver keeps filling the submission queue and consuming completions. Every
//! completion carries a value computed from the whole submission entry it answers, so an entry
//! read before the driver finished writing it, a completion read before its body landed, a
//! command identifier seen twice or never, or a head pointer off the ring fails the test.
//!
//! Small rings (8 entries) make both rings wrap thousands of times, flipping the phase tag on
//! every pass. On x86-64 the hardware orders stores and loads far more strongly than aarch64
//! does; `scripts/aarch64.sh` runs this test as an aarch64 binary too (under qemu-aarch64).
//! `KURA_STRESS_SCALE=N` multiplies the command count for long runs on real ARM hardware.

use crate::bus::Bus;
use crate::cmd::{Cqe, Sqe, CQE_SIZE, SQE_SIZE};
use crate::error::NvmeError;
use crate::qpair::QueuePair;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const QID: u16 = 1;
const STRIDE: u32 = 4;
const ENTRIES: u16 = 8;

/// The two doorbells of queue pair [`QID`], as the device thread sees them.
#[derive(Default)]
struct Doorbells {
    sq_tail: AtomicU32,
    cq_head: AtomicU32,
    stop: AtomicBool,
}

/// Register access that only records the doorbells; DMA needs no mapping (I/O address =
/// virtual address, as on the simulated and VFIO buses).
struct ThreadedBus {
    bells: Arc<Doorbells>,
}

impl Bus for ThreadedBus {
    fn read32(&self, _off: u32) -> u32 {
        0
    }

    fn write32(&self, off: u32, val: u32) {
        // A doorbell write is the device's signal: Release, as an MMIO store is ordered after
        // the queue entries by the driver's barrier.
        if off == crate::regs::sq_tail_doorbell(QID, STRIDE) {
            self.bells.sq_tail.store(val, Ordering::Release);
        } else if off == crate::regs::cq_head_doorbell(QID, STRIDE) {
            self.bells.cq_head.store(val, Ordering::Release);
        }
    }

    fn map_dma(&self, _addr: u64, _len: usize) -> Result<(), NvmeError> {
        Ok(())
    }

    fn unmap_dma(&self, _addr: u64, _len: usize) {}

    fn describe(&self) -> String {
        "threaded stress device".into()
    }
}

/// What the device answers for `sqe`: depends on every field the driver wrote, so a torn or
/// stale entry gives a different value.
fn answer(sqe: &Sqe) -> u32 {
    let mut h = u32::from(sqe.opcode) ^ u32::from(sqe.cid).rotate_left(8) ^ sqe.nsid;
    h ^= (sqe.prp1 as u32) ^ ((sqe.prp1 >> 32) as u32).rotate_left(3);
    h ^= (sqe.prp2 as u32).rotate_left(5) ^ ((sqe.prp2 >> 32) as u32).rotate_left(7);
    for (i, d) in sqe.cdw.iter().enumerate() {
        h = h.rotate_left(5) ^ d.wrapping_mul(2 * i as u32 + 1);
    }
    h
}

/// The controller's side: consumes entries up to the tail doorbell, posts one completion each,
/// never overwrites a completion the driver has not released. Returns the commands served.
fn device(bells: &Doorbells, sq_base: u64, cq_base: u64) -> u64 {
    let n = ENTRIES;
    let (mut head, mut cq_tail, mut phase, mut served) = (0u16, 0u16, 1u16, 0u64);
    loop {
        let tail = bells.sq_tail.load(Ordering::Acquire) as u16;
        if tail == head {
            if bells.stop.load(Ordering::Acquire) {
                return served;
            }
            std::hint::spin_loop();
            continue;
        }
        // One slot of the CQ stays empty, as for the SQ: wait for the driver to release.
        if (cq_tail + 1) % n == bells.cq_head.load(Ordering::Acquire) as u16 {
            std::hint::spin_loop();
            continue;
        }
        let mut raw = [0u8; SQE_SIZE];
        for (i, b) in raw.iter_mut().enumerate() {
            let at = (sq_base + u64::from(head) * SQE_SIZE as u64) as *const u8;
            // SAFETY: inside the SQ's DMA memory (head < ENTRIES); the tail doorbell (Acquire)
            // published this entry, and the driver does not rewrite it before its completion.
            *b = unsafe { std::ptr::read_volatile(at.add(i)) };
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
        let at = (cq_base + u64::from(cq_tail) * CQE_SIZE as u64) as *mut u8;
        for (i, b) in cqe[..14].iter().enumerate() {
            // SAFETY: inside the CQ's DMA memory; the driver released this slot (checked above).
            unsafe { std::ptr::write_volatile(at.add(i), *b) };
        }
        // The body before the phase tag, as a device's posted writes are ordered.
        fence(Ordering::Release);
        let status = u16::from_le_bytes([cqe[14], cqe[15]]);
        // SAFETY: the status word of the same slot, 2-byte aligned (16-byte entries).
        unsafe { std::ptr::write_volatile(at.add(14).cast::<u16>(), status) };
        served += 1;
        cq_tail += 1;
        if cq_tail == n {
            cq_tail = 0;
            phase ^= 1;
        }
    }
}

fn commands() -> u64 {
    let scale = std::env::var("KURA_STRESS_SCALE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1)
        .max(1);
    20_000 * scale
}

#[test]
fn a_concurrent_controller_sees_whole_entries_and_the_driver_whole_completions() {
    let bells = Arc::new(Doorbells::default());
    let bus: Arc<dyn Bus> = Arc::new(ThreadedBus {
        bells: Arc::clone(&bells),
    });
    let mut qp = QueuePair::new(&bus, QID, ENTRIES, STRIDE).expect("queue pair");
    let (sq_base, cq_base) = (qp.sq_iova(), qp.cq_iova());
    let dev_bells = Arc::clone(&bells);
    let dev = std::thread::spawn(move || device(&dev_bells, sq_base, cq_base));

    let total = commands();
    // Expected answer per command identifier; None while the identifier is free.
    let mut expected: Vec<Option<u32>> = vec![None; usize::from(ENTRIES)];
    let mut free: Vec<u16> = (0..ENTRIES).collect();
    let (mut sent, mut done, mut seq) = (0u64, 0u64, 0u32);
    let deadline = Instant::now() + Duration::from_secs(300);
    while done < total {
        assert!(Instant::now() < deadline, "stalled: {done} of {total} done");
        // Vary the batch so the device sees the tail move by 1..ENTRIES-1 at a time.
        let batch = 1 + (seq % u32::from(ENTRIES - 1));
        for _ in 0..batch {
            if sent == total || qp.is_full() {
                break;
            }
            let Some(cid) = free.pop() else { break };
            seq = seq.wrapping_add(0x9e37_79b9);
            let mut sqe = Sqe::rw(
                (seq & 0x7f) as u8,
                seq,
                u64::from(seq) << 7,
                1,
                u64::from(!seq) << 12,
                u64::from(seq.rotate_left(13)),
            );
            sqe.cid = cid;
            sqe.cdw[3..].copy_from_slice(&[seq ^ 1, seq ^ 2, seq ^ 3]);
            expected[usize::from(cid)] = Some(answer(&sqe));
            assert!(qp.push(&sqe), "push refused while not full");
            sent += 1;
        }
        qp.ring(bus.as_ref());
        while let Some(cqe) = qp.pop() {
            let slot = expected
                .get_mut(usize::from(cqe.cid))
                .unwrap_or_else(|| panic!("completion for unknown cid {}", cqe.cid));
            let want = slot
                .take()
                .unwrap_or_else(|| panic!("cid {} completed twice", cqe.cid));
            assert_eq!(cqe.result, want, "cid {}: torn entry", cqe.cid);
            assert!(cqe.sq_head < ENTRIES && cqe.sq_id == QID, "{cqe:?}");
            free.push(cqe.cid);
            done += 1;
        }
        qp.release(bus.as_ref());
    }
    bells.stop.store(true, Ordering::Release);
    let served = dev.join().expect("device thread");
    assert_eq!(
        served, total,
        "the device served every command exactly once"
    );
    assert!(expected.iter().all(Option::is_none));
}
