//! Model check of the buffer pool's waiting and freeing (`kura_engine::BufferPool`) on loom's
//! mutex, condition variable and `Arc` (`RUSTFLAGS="--cfg loom"`, see scripts/loom.sh).
//!
//! Threads contend for a two-page pool with `alloc_wait`, each writing its own pattern into what
//! it got, yielding, and checking the pattern before dropping the buffer. loom's `wait_timeout`
//! never times out, so a free that fails to wake a waiter that could now allocate is a deadlock
//! loom reports; two threads handed overlapping memory fail the pattern check in the
//! interleaving where the other writes in between; memory not merged back fails the last check.
#![cfg(loom)]

use kura_engine::BufferPool;
use std::time::Duration;

/// Longer than any model run: only a wake-up ends a wait.
const FOREVER: Duration = Duration::from_secs(3600);

fn hold(pool: &BufferPool, len: usize, fill: u8) {
    let mut buf = pool.alloc_wait(len, FOREVER).expect("room comes back");
    buf.fill(fill);
    loom::thread::yield_now();
    assert!(
        buf.iter().all(|&b| b == fill),
        "buffer shared with another holder"
    );
}

#[test]
fn waiters_are_woken_and_buffers_never_overlap() {
    loom::model(|| {
        let pool = BufferPool::new(2 * 4096).expect("pool");
        let threads: Vec<_> = [(2 * 4096, 1u8), (4096, 2u8)]
            .into_iter()
            .map(|(len, fill)| {
                let pool = pool.clone();
                loom::thread::spawn(move || hold(&pool, len, fill))
            })
            .collect();
        hold(&pool, 4096, 3);
        for t in threads {
            t.join().expect("holder");
        }
        let stats = pool.stats();
        assert_eq!(stats.free, stats.capacity, "every page merged back");
    });
}
