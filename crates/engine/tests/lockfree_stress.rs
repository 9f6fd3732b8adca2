//! Many-thread stress of the engine's shared-memory structures: the redirect channel (caller and
//! proxy process exchanging slots through atomics and futexes) and the buffer pool (buffers
//! handed between threads near exhaustion).
//!
//! The checks are on data, not on timing: every block read back must hold exactly the last
//! write to it, every request completes once, and no two live pool buffers overlap. On x86-64
//! the hardware's strong ordering hides most missing barriers; `scripts/aarch64.sh` runs this
//! binary built for aarch64 as well. `KURA_STRESS_SCALE=N` multiplies the rounds for long runs
//! on real ARM hardware.

use kura_engine::backend::redirect;
use kura_engine::{BlockDevice, BufferPool, Completion, IoBuf, Request, Spec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Held by each test for its whole run, so the redirect test forks while no other test's
/// threads run (see there).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn scale() -> usize {
    std::env::var("KURA_STRESS_SCALE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The content of block `lba` after write number `generation` by `thread`: every 8 bytes say
/// which write they belong to, so a stale, torn or misplaced block is recognised.
fn pattern(thread: u64, lba: u64, generation: u64, len: usize) -> Vec<u8> {
    let word = (thread << 56) ^ (lba << 24) ^ generation;
    (0..len / 8)
        .flat_map(|i| (word ^ (i as u64).rotate_left(40)).to_le_bytes())
        .collect()
}

/// One thread's device: rounds of mixed reads and writes to distinct blocks, up to the queue
/// depth in flight, reaped with a varying `min_complete` so the caller both spins and sleeps on
/// the completion futex while the proxy sleeps and wakes on the submission futex.
fn hammer(thread: u64, dev: &mut dyn BlockDevice, rounds: usize) {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let blocks = geo.num_blocks.min(256);
    let qd = geo.queue_depth as usize;
    let mut rng = SmallRng::seed_from_u64(0x5eed ^ thread);
    let mut generation: HashMap<u64, u64> = HashMap::new();
    let mut done: Vec<Completion> = Vec::new();
    for round in 0..rounds {
        let mut lbas: Vec<u64> = Vec::new();
        while lbas.len() < rng.gen_range(1..=qd) {
            let lba = rng.gen_range(0..blocks);
            if !lbas.contains(&lba) {
                lbas.push(lba);
            }
        }
        // Reads of a block expect its state before this round; the batch touches each block once.
        let mut reads: HashMap<u64, u64> = HashMap::new();
        for (tag, &lba) in lbas.iter().enumerate() {
            let tag = tag as u64;
            let req = if rng.gen_bool(0.5) {
                let g = round as u64 + 1;
                generation.insert(lba, g);
                Request::write(tag, lba, 1, IoBuf::from_slice(&pattern(thread, lba, g, bs)))
            } else {
                reads.insert(tag, lba);
                Request::read(tag, lba, 1, IoBuf::zeroed(bs))
            };
            dev.submit(req).expect("submit within the queue depth");
        }
        let before: HashMap<u64, u64> = reads
            .values()
            .map(|&lba| (lba, generation.get(&lba).copied().unwrap_or(0)))
            .collect();
        done.clear();
        while dev.in_flight() > 0 {
            let min = rng.gen_range(1..=dev.in_flight());
            dev.poll(&mut done, min).expect("poll");
        }
        assert_eq!(done.len(), lbas.len(), "thread {thread} round {round}");
        let mut seen = vec![false; lbas.len()];
        for c in done.drain(..) {
            let tag = c.tag as usize;
            assert!(!std::mem::replace(&mut seen[tag], true), "tag {tag} twice");
            c.status
                .unwrap_or_else(|e| panic!("thread {thread} tag {tag}: {e}"));
            if let Some(&lba) = reads.get(&c.tag) {
                let buf = c.buf.expect("a read hands its buffer back");
                let g = before[&lba];
                let want = if g == 0 {
                    vec![0u8; bs]
                } else {
                    pattern(thread, lba, g, bs)
                };
                assert!(
                    buf[..] == want[..],
                    "thread {thread} round {round}: block {lba} is not generation {g}"
                );
            }
        }
    }
}

#[test]
fn redirect_channels_on_many_threads_return_exactly_the_last_write() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let rounds = 150 * scale();
    // Every device (a fork of this process) is opened before the stress threads start, and no
    // other test of this file runs meanwhile: the channels are what is under test, and under
    // qemu-user a fork taken while other threads run emulated code can leave the child stuck in
    // the emulator's own state (about one run in ten under qemu-aarch64 had a proxy that never
    // answered while the parent polled for 60 s).
    let devices: Vec<_> = (0..6u64)
        .map(|t| {
            let spec = format!(
                "redirect:{}/s{t}.img?size=1M&qd={}",
                dir.path().display(),
                [4, 8, 16, 32, 8, 16][t as usize]
            );
            (
                t,
                redirect::open(&Spec::parse(&spec).expect("spec")).expect("open redirect"),
            )
        })
        .collect();
    let threads: Vec<_> = devices
        .into_iter()
        .map(|(t, mut dev)| std::thread::spawn(move || hammer(t, &mut dev, rounds)))
        .collect();
    for t in threads {
        t.join().expect("a stress thread failed");
    }
}

#[test]
fn pool_buffers_held_across_threads_never_overlap() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const CAPACITY: usize = 1 << 20;
    let pool = BufferPool::new(CAPACITY).expect("pool");
    let rounds = 400 * scale();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t);
                let mut held: Vec<(IoBuf, u8)> = Vec::new();
                for i in 0..rounds {
                    // Up to 4 buffers of up to 64 KiB per thread: 8 threads can want 2 MiB of a
                    // 1 MiB arena, so allocations wait on frees from other threads.
                    if held.len() < 4 && rng.gen_bool(0.6) {
                        let len = 4096 << rng.gen_range(0..5);
                        let mut b = pool
                            .alloc_wait(len, Duration::from_secs(30))
                            .expect("a free comes within the timeout");
                        assert_eq!(b.as_ptr() as usize % 4096, 0, "pool buffers are aligned");
                        let mark = (t as u8) << 5 | (i % 31) as u8;
                        b.fill(mark);
                        held.push((b, mark));
                    } else if !held.is_empty() {
                        let (b, mark) = held.swap_remove(rng.gen_range(0..held.len()));
                        assert!(
                            b.iter().all(|&x| x == mark),
                            "thread {t}: a held buffer was written by another owner"
                        );
                    }
                    if i % 16 == 0 {
                        std::thread::yield_now();
                    }
                }
                for (b, mark) in held {
                    assert!(b.iter().all(|&x| x == mark));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a stress thread failed");
    }
    let stats = pool.stats();
    assert_eq!(stats.free, CAPACITY, "every buffer went back");
    assert!(stats.peak_used <= CAPACITY && stats.peak_used >= 64 << 10);
}
