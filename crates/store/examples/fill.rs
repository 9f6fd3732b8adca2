//! A rough fill measurement: N puts of 100-byte values under distinct keys into a store on a
//! RAM disk with 1 MiB segments and a 256 KiB memtable (so it flushes and compacts throughout),
//! then N gets and one full scan; prints the timings and the store's statistics.
//!
//! `cargo run --release -p kura-store --example fill -- [N]` (default 50000). A RAM disk has no
//! device latency: this measures the store's CPU cost, nothing about a real device.

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_store::{Store, StoreError, StoreOptions};
use std::time::Instant;

fn key(i: u64) -> Vec<u8> {
    format!("key{:010}", i.wrapping_mul(2_654_435_761) % 1_000_000_007).into_bytes()
}

fn main() -> Result<(), StoreError> {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50_000);
    let opts = StoreOptions {
        segment_shift: 20,
        memtable_bytes: 256 << 10,
        ..StoreOptions::default()
    };
    let dev = MemDevice::new(256 << 20, QueueOptions::default());
    let store = Store::create(Box::new(dev), &opts)?;
    let value = [0x5au8; 100];
    let t = Instant::now();
    for i in 0..n {
        store.put(&key(i), &value, false)?;
    }
    store.sync()?;
    let put = t.elapsed();
    let t = Instant::now();
    for i in 0..n {
        if store.get(&key(i))?.is_none() {
            return Err(StoreError::Invalid(format!("key {i} is missing")));
        }
    }
    let get = t.elapsed();
    let t = Instant::now();
    let all = store.scan(None, None, usize::MAX, false)?.len();
    let scan = t.elapsed();
    let s = store.stats();
    println!(
        "{n} puts: {:.2} s ({:.0}/s); {n} gets: {:.2} s ({:.0}/s); scan of {all}: {:.2} s",
        put.as_secs_f64(),
        n as f64 / put.as_secs_f64(),
        get.as_secs_f64(),
        n as f64 / get.as_secs_f64(),
        scan.as_secs_f64()
    );
    println!(
        "flushes {} compactions {} runs per level {:?} write amplification {:.2}",
        s.flushes,
        s.compactions,
        s.runs_per_level,
        s.write_amplification()
    );
    Ok(())
}
