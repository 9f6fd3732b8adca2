//! The read path alone, for profiling: loads `RECORDS` 1 KiB values in a random order into a
//! store on a buffered image file (the settings `kura bench kv` gives kura-store: a 4 MiB
//! memtable, a 16 MiB memory budget), then times `GETS` random gets on each of `THREADS`
//! threads and prints gets per second and the store's statistics.
//!
//! `cargo run --release -p kura-store --example readpath -- IMAGE [RECORDS] [GETS] [THREADS]`
//! (defaults 98304, 200000, 1: 96 MiB of values, 6x the budget). Run it under `perf record` to
//! see where a get's time goes.

use kura_store::{Store, StoreError, StoreOptions};
use std::time::Instant;

fn key(i: u64) -> Vec<u8> {
    format!("user{:012}", i.wrapping_mul(2_654_435_761) % 1_000_000_007).into_bytes()
}

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let image = std::env::args()
        .nth(1)
        .ok_or("usage: readpath IMAGE [RECORDS] [GETS] [THREADS]")?;
    let records = arg(2, 98_304);
    let gets = arg(3, 200_000);
    let threads = arg(4, 1).max(1);
    let bytes = (records * 1024 * 3).max(64 << 20);
    let dev = kura_engine::open(&format!("file:{image}?direct=0&size={bytes}"))?;
    let opts = StoreOptions {
        memtable_bytes: 4 << 20,
        memory_budget: (8 << 20) + 2 * (4 << 20),
        ..StoreOptions::default()
    };
    let store = Store::create(dev, &opts)?;
    let mut value = vec![0u8; 1024];
    let t = Instant::now();
    for i in 0..records {
        value[..8].copy_from_slice(&i.to_le_bytes());
        store.put(&key(i), &value, false)?;
    }
    store.sync()?;
    println!("load: {:.2}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    std::thread::scope(|s| -> Result<(), StoreError> {
        let handles: Vec<_> = (0..threads)
            .map(|th| {
                let store = &store;
                s.spawn(move || -> Result<(), StoreError> {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ th;
                    for _ in 0..gets {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let i = x % records;
                        let got = store.get(&key(i))?;
                        assert!(got.is_some_and(|v| v[..8] == i.to_le_bytes()));
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("reader")?;
        }
        Ok(())
    })?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "gets: {} on {threads} thread(s) in {secs:.2}s: {:.0}/s",
        gets * threads,
        (gets * threads) as f64 / secs
    );
    println!("{:#?}", store.stats());
    store.close()?;
    Ok(())
}
