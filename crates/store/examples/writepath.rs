//! Times puts alone, for profiling the write path: N puts of V-byte values under keys in a
//! scrambled order (as db_bench's fillrandom) into a store on a buffered `file:` image, then a
//! sync; prints the put rate and the store's statistics.
//!
//! `cargo run --release -p kura-store --example writepath -- IMAGE [N] [V] [MEMTABLE] [L1_RUNS]`
//! (defaults 200000 puts, 1024-byte values, 4 MiB memtable, the store's default L1 runs). IMAGE is created (1 GiB, sparse).

use kura_store::{Store, StoreError, StoreOptions};
use std::time::Instant;

fn key(i: u64) -> Vec<u8> {
    format!("{:016}", i.wrapping_mul(2_654_435_761) % 1_000_000_007).into_bytes()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let image = args
        .next()
        .ok_or("usage: writepath IMAGE [N] [V] [MEMTABLE] [L1_RUNS]")?;
    let mut num = |d: u64| args.next().and_then(|a| a.parse().ok()).unwrap_or(d);
    let (n, v, mem) = (num(200_000), num(1024) as usize, num(4 << 20) as usize);
    let f = std::fs::File::create(&image)?;
    f.set_len(1 << 30)?;
    drop(f);
    let dev = kura_engine::open(&format!("file:{image}?direct=0"))?;
    let defaults = StoreOptions::default();
    let opts = StoreOptions {
        memtable_bytes: mem,
        l1_runs: num(defaults.l1_runs as u64) as usize,
        ..defaults
    };
    let store = Store::create(dev, &opts)?;
    let value = vec![0x5au8; v];
    let t = Instant::now();
    for i in 0..n {
        store.put(&key(i), &value, false)?;
    }
    store.sync()?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{n} puts of {v} B: {secs:.3} s, {:.0} ops/s",
        n as f64 / secs
    );
    println!("{:?}", store.stats());
    store.close().map_err(|e: StoreError| e.into())
}
