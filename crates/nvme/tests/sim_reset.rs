//! Buffers of commands lost in a controller reset go back to the pool only once the controller
//! confirmed it stopped (CSTS.RDY=0); a controller that ignores being disabled keeps them
//! forever (leaked, counted) and is failed for good. One test in its own process: it takes the
//! whole global buffer pool to show that leaked buffers are never handed out again.

use kura_engine::{BlockDevice, BlockingIo, BufferPool, DeviceError, IoBuf, Request, Spec};
use kura_nvme::{open_sim, Leaked, NvmeError, NvmeQueue, SimController};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn sim(spec: &str) -> (NvmeQueue, Arc<SimController>) {
    open_sim(&Spec::parse(spec).expect("spec parses")).expect("simulated controller opens")
}

/// Polls until `n` requests completed.
fn complete(q: &mut NvmeQueue, n: usize) -> Vec<kura_engine::Completion> {
    let mut done = Vec::new();
    while done.len() < n {
        let want = n - done.len();
        q.poll(&mut done, want).expect("poll");
    }
    done
}

#[test]
fn buffers_of_lost_commands_return_to_the_pool_only_after_rdy_0() {
    // 8 MiB of 4 KiB blocks, so "allocate everything" is quick.
    assert!(
        BufferPool::request_global_bytes(8 << 20),
        "this test is the first user of the pool"
    );
    let pool = BufferPool::global();

    // A reset that confirms RDY=0: the lost command's pool buffer comes back with it.
    let (mut q, s) = sim("nvme-sim:1M?timeout_ms=50");
    let free = pool.stats().free;
    s.set_hang_io(true);
    s.set_ignore_abort(true);
    let buf = pool.alloc(4096).expect("pool buffer");
    let addr = buf.as_ptr();
    q.submit(Request::read(1, 0, 8, buf)).expect("submit");
    let done = complete(&mut q, 1);
    assert_eq!(
        done[0].status.as_ref().err().map(DeviceError::errno),
        Some(libc::ETIMEDOUT)
    );
    assert_eq!(
        done[0].buf.as_ref().map(IoBuf::as_ptr),
        Some(addr),
        "buffer returned"
    );
    assert_eq!(q.stats().resets, 1);
    assert_eq!(q.failed(), None);
    assert_eq!(q.leaked(), Leaked::default());
    drop(done);
    assert_eq!(pool.stats().free, free, "everything back in the pool");
    s.set_hang_io(false);
    let mut back = vec![0u8; 512];
    q.read_blocks(0, &mut back)
        .expect("the controller works after the reset");
    drop(q);

    // A controller that ignores CC.EN=0: CSTS.RDY stays 1, it still holds the commands.
    let (mut q, s) = sim("nvme-sim:1M?timeout_ms=50&queues=2");
    let mut other = q.new_queue().expect("second queue pair");
    let free = pool.stats().free;
    s.set_hang_io(true);
    s.set_ignore_abort(true);
    s.set_stuck_enabled(true);
    let a = pool.alloc(4096).expect("pool buffer");
    let a_addr = a.as_ptr();
    q.submit(Request::read(1, 0, 8, a))
        .expect("read into a pool buffer");
    // A heap buffer goes through a pool bounce buffer, which the device is given instead.
    q.submit(Request::write(2, 8, 8, IoBuf::heap(4096, 4096)))
        .expect("write from the heap");
    q.ring_doorbell().expect("ring");
    let c = pool.alloc(4096).expect("pool buffer");
    let c_addr = c.as_ptr();
    other
        .submit(Request::read(3, 16, 8, c))
        .expect("read on the other queue pair");
    other.ring_doorbell().expect("ring");
    assert_eq!(s.held_commands(), 3, "all three are on the device");

    let t = Instant::now();
    let done = complete(&mut q, 2);
    assert!(t.elapsed() < Duration::from_secs(5), "bounded by CAP.TO");
    for d in &done {
        assert!(d.status.is_err(), "{:?}", d.status);
    }
    let read = done.iter().find(|d| d.tag == 1).expect("read completed");
    let write = done.iter().find(|d| d.tag == 2).expect("write completed");
    assert!(
        read.buf.is_none(),
        "the device may still write the read's buffer: leaked"
    );
    assert!(
        write.buf.is_some(),
        "the heap buffer was never given to the device: returned"
    );
    let why = q.failed().expect("controller failed").to_string();
    assert!(why.contains("could not confirm it stopped"), "{why}");
    assert_eq!(
        q.leaked(),
        Leaked {
            buffers: 2,
            bytes: 8192
        },
        "the read's buffer and the write's bounce buffer"
    );
    drop(done);

    // The other queue pair learns of the failure and leaks its command's buffer too.
    let done = complete(&mut other, 1);
    assert!(done[0].status.is_err() && done[0].buf.is_none());
    assert_eq!(q.leaked().buffers, 3);
    assert_eq!(other.stats().leaked_buffers, 1);
    drop(done);

    // Every later command fails with the typed error, and nothing more reaches the device.
    let admin_before = s.stats().admin_commands;
    for dev in [&mut q, &mut other] {
        let r = dev
            .submit(Request::read(9, 0, 1, IoBuf::heap(512, 4096)))
            .expect_err("refused");
        assert!(
            matches!(&r.error, DeviceError::Offline { reason } if reason.contains("controller failed")),
            "{}",
            r.error
        );
    }
    assert!(matches!(q.new_queue(), Err(NvmeError::Failed { .. })));
    assert!(matches!(
        q.reset_controller(),
        Err(NvmeError::Failed { .. })
    ));
    assert_eq!(s.stats().admin_commands, admin_before);

    // The pool never hands the leaked buffers out again: its free space stays 3 blocks short,
    // and taking every block it has yields none of them.
    assert_eq!(pool.stats().free, free - 3 * 4096);
    let mut all = Vec::new();
    while let Ok(b) = pool.alloc(4096) {
        all.push(b);
    }
    assert_eq!(all.len() * 4096, free - 3 * 4096);
    assert!(all
        .iter()
        .all(|b| b.as_ptr() != a_addr && b.as_ptr() != c_addr));
    drop(all);
    drop(other);
    drop(q);
}
