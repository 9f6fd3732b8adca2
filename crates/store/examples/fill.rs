//! A rough fill measurement: N puts of 100-byte values under distinct keys into a store on a
//! RAM disk with 1 MiB segments and a 256 KiB memtable (so it flushes and compacts throughout),
//! then N gets and one full scan; prints the timings, the put latency distribution (the longest
//! puts are those that waited for a flush or merge) and the store's statistics.
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
    let mut lat = Vec::with_capacity(n as usize);
    let t = Instant::now();
    for i in 0..n {
        let one = Instant::now();
        store.put(&key(i), &value, false)?;
        lat.push(one.elapsed());
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
    lat.sort();
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    println!(
        "put latency ms: p50 {:.4} p99 {:.4} p99.9 {:.3} p99.99 {:.2} max {:.2}; puts over 1 ms: {}",
        at(0.5),
        at(0.99),
        at(0.999),
        at(0.9999),
        at(1.0),
        lat.iter().filter(|d| d.as_secs_f64() > 1e-3).count()
    );
    println!(
        "{n} puts: {:.2} s ({:.0}/s); {n} gets: {:.2} s ({:.0}/s); scan of {all}: {:.2} s",
        put.as_secs_f64(),
        n as f64 / put.as_secs_f64(),
        get.as_secs_f64(),
        n as f64 / get.as_secs_f64(),
        scan.as_secs_f64()
    );
    println!(
        "flushes {} write stalls {} compactions {} runs per level {:?} write amplification {:.2}",
        s.flushes,
        s.write_stalls,
        s.compactions,
        s.runs_per_level,
        s.write_amplification()
    );
    Ok(())
}
