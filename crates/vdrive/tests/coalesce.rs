//! The coalescing scheduler: neighbours merge into fewer child commands, every caller gets its own
//! bytes back, conflicting requests keep their order, flushes are barriers, and the window tunes
//! itself from the child's measured latency.

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::{BlockDevice, BlockingIo, Completion, IoBuf, Request};
use kura_vdrive::coalesce::MAX_WINDOW;
use kura_vdrive::Coalesce;
use std::time::Duration;

const BS: usize = 4096;

fn coalesce(max: u64) -> Coalesce {
    let child = MemDevice::new(4 << 20, QueueOptions::default());
    Coalesce::new(Box::new(child), max).expect("coalesce over mem")
}

fn block_of(id: u8) -> IoBuf {
    let mut b = IoBuf::zeroed(BS);
    b.fill(id);
    b
}

fn drain(dev: &mut dyn BlockDevice) -> Vec<Completion> {
    let mut done = Vec::new();
    dev.ring_doorbell().expect("doorbell");
    while dev.in_flight() > 0 {
        dev.poll(&mut done, 1).expect("poll");
    }
    for c in &done {
        assert!(c.status.is_ok(), "tag {} failed: {:?}", c.tag, c.status);
    }
    done
}

#[test]
fn sequential_writes_and_reads_merge_and_keep_their_bytes() {
    let mut dev = coalesce(1 << 20);
    for i in 0..64u64 {
        dev.submit(Request::write(i, i, 1, block_of(i as u8 + 1)))
            .unwrap();
    }
    assert_eq!(drain(&mut dev).len(), 64);
    let after_writes = dev.stats();
    assert_eq!(after_writes.requests, 64);
    assert!(
        after_writes.child_commands < 64 && after_writes.merged > 0,
        "64 contiguous writes submitted together must merge: {after_writes:?}"
    );
    // Reads submitted in reverse order merge by preceding the batch and scatter back correctly.
    for i in (0..64u64).rev() {
        dev.submit(Request::read(100 + i, i, 1, IoBuf::zeroed(BS)))
            .unwrap();
    }
    let done = drain(&mut dev);
    assert_eq!(done.len(), 64);
    for c in done {
        let want = (c.tag - 100) as u8 + 1;
        let buf = c.buf.expect("a read hands its buffer back");
        assert!(
            buf.iter().all(|&b| b == want),
            "tag {} read wrong bytes",
            c.tag
        );
    }
    assert!(dev.stats().child_commands - after_writes.child_commands < 64);
}

#[test]
fn merged_commands_never_exceed_max() {
    let mut dev = coalesce(16 << 10);
    for i in 0..32u64 {
        dev.submit(Request::write(i, i, 1, block_of(7))).unwrap();
    }
    drain(&mut dev);
    let s = dev.stats();
    assert!(
        s.child_commands >= 32 / 4,
        "16K max means at least 8 commands for 32 blocks: {s:?}"
    );
    let mut whole = vec![0u8; 32 * BS];
    dev.read_blocks(0, &mut whole).unwrap();
    assert!(whole.iter().all(|&b| b == 7));
}

#[test]
fn overlapping_writes_apply_in_submission_order() {
    let mut dev = coalesce(1 << 20);
    // 0..4 as one growing batch, then an overwrite of block 2, then a neighbour of the first
    // batch that must not jump ahead of the overwrite by joining the earlier batch.
    for i in 0..4u64 {
        dev.submit(Request::write(i, i, 1, block_of(1))).unwrap();
    }
    dev.submit(Request::write(10, 2, 1, block_of(2))).unwrap();
    dev.submit(Request::write(11, 4, 1, block_of(3))).unwrap();
    dev.submit(Request::write(12, 2, 2, {
        let mut b = IoBuf::zeroed(2 * BS);
        b.fill(4);
        b
    }))
    .unwrap();
    drain(&mut dev);
    let mut whole = vec![0u8; 5 * BS];
    dev.read_blocks(0, &mut whole).unwrap();
    let ids: Vec<u8> = whole.chunks(BS).map(|b| b[0]).collect();
    assert_eq!(ids, vec![1, 1, 4, 4, 3]);
}

#[test]
fn a_read_after_a_write_sees_it_and_a_flush_is_a_barrier() {
    let mut dev = coalesce(1 << 20);
    dev.submit(Request::write(1, 8, 1, block_of(5))).unwrap();
    dev.submit(Request::read(2, 8, 1, IoBuf::zeroed(BS)))
        .unwrap();
    dev.submit(Request::flush(3)).unwrap();
    dev.submit(Request::write(4, 9, 1, block_of(6))).unwrap();
    dev.submit(Request::write(5, 8, 1, block_of(7))).unwrap();
    let done = drain(&mut dev);
    assert_eq!(done.len(), 5);
    let read = done.iter().find(|c| c.tag == 2).unwrap();
    assert!(read.buf.as_ref().unwrap().iter().all(|&b| b == 5));
    let mut two = vec![0u8; 2 * BS];
    dev.read_blocks(8, &mut two).unwrap();
    assert_eq!((two[0], two[BS]), (7, 6));
}

#[test]
fn the_window_follows_the_measured_child_latency() {
    let mut dev = coalesce(1 << 20);
    assert_eq!(dev.window().as_nanos(), 0, "no samples, no waiting");
    for i in 0..16u64 {
        dev.write_blocks(i * 4, &vec![1u8; BS]).unwrap();
    }
    assert!(dev.average_latency().as_nanos() > 0);
    assert!(dev.window() <= MAX_WINDOW);
    assert!(dev.window() <= dev.average_latency());
}

#[test]
fn bad_max_is_refused_with_the_reason() {
    for spec in ["coalesce(mem:1M)?max=1000", "coalesce(mem:1M)?max=0"] {
        let err = kura_vdrive::open(spec).err().expect("must be refused");
        assert!(err.to_string().contains("max"), "{spec}: {err}");
    }
    assert!(kura_vdrive::open("coalesce(mem:1M,mem:1M)").is_err());
    assert!(kura_vdrive::open("coalesce(mem:1M)?window=3").is_err());
}

#[test]
fn random_requests_stop_waiting_and_sequential_bursts_bring_the_window_back() {
    let mut dev = coalesce(1 << 20);
    // One request at a time, far apart: nothing can merge, so the drive stops waiting.
    for i in 0..200u64 {
        dev.write_blocks((i * 37) % 900, &vec![2u8; BS]).unwrap();
    }
    assert!(dev.merge_rate() < 1024 / 32, "rate {}", dev.merge_rate());
    assert_eq!(dev.window().as_nanos(), 0, "random I/O pays no window");
    // A burst of neighbours submitted before one doorbell still merges, and the rate recovers.
    for round in 0..8u64 {
        for i in 0..32u64 {
            let tag = round * 100 + i;
            dev.submit(Request::write(tag, round * 64 + i, 1, block_of(3)))
                .unwrap();
        }
        drain(&mut dev);
    }
    assert!(dev.merge_rate() >= 1024 / 32, "rate {}", dev.merge_rate());
    assert!(dev.window() > Duration::ZERO || dev.average_latency().is_zero());
}
