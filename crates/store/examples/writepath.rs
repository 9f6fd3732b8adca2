//! Times puts alone, for profiling the write path: N puts of V-byte values under keys in a
//! scrambled order (as db_bench's fillrandom) into a store on a buffered `file:` image, then a
//! sync; prints the put rate and the store's statistics.
//!
//! `cargo run --release -p kura-store --example writepath -- IMAGE [N] [V] [MEMTABLE] [L1_RUNS] [IMAGE_MIB] [PASSES] [seq]`
//! (defaults 200000 puts, 1024-byte values, 4 MiB memtable, the store's default L1 runs, a
//! 1024 MiB image, one pass). IMAGE is created sparse. With PASSES > 1 the same N keys are
//! written again in each pass (db_bench's overwrite after its load). With `seq` the keys go in
//! ascending order (db_bench's fillseq). The environment variable `MERGE_THREADS` sets
//! `StoreOptions::merge_threads` (default 0: the host's cores).

use kura_store::{Store, StoreError, StoreOptions};
use std::time::Instant;

fn key(i: u64, in_order: bool) -> Vec<u8> {
    if in_order {
        return format!("{i:016}").into_bytes();
    }
    format!("{:016}", i.wrapping_mul(2_654_435_761) % 1_000_000_007).into_bytes()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let image = args
        .next()
        .ok_or("usage: writepath IMAGE [N] [V] [MEMTABLE] [L1_RUNS] [IMAGE_MIB] [PASSES] [seq]")?;
    let mut num = |d: u64| args.next().and_then(|a| a.parse().ok()).unwrap_or(d);
    let (n, v, mem) = (num(200_000), num(1024) as usize, num(4 << 20) as usize);
    let defaults = StoreOptions::default();
    let opts = StoreOptions {
        memtable_bytes: mem,
        l1_runs: num(defaults.l1_runs as u64) as usize,
        merge_threads: std::env::var("MERGE_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        ..defaults
    };
    let (image_mib, passes) = (num(1024), num(1));
    let in_order = args.next().is_some_and(|a| a == "seq");
    let f = std::fs::File::create(&image)?;
    f.set_len(image_mib << 20)?;
    drop(f);
    let dev = kura_engine::open(&format!("file:{image}?direct=0"))?;
    let store = Store::create(dev, &opts)?;
    let value = vec![0x5au8; v];
    let t = Instant::now();
    for _ in 0..passes {
        for i in 0..n {
            if let Err(e) = store.put(&key(i, in_order), &value, false) {
                eprintln!("put {i}: {e}\n{:?}", store.stats());
                return Err(e.into());
            }
        }
    }
    store.sync()?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{} puts of {v} B: {secs:.3} s, {:.0} ops/s",
        n * passes,
        (n * passes) as f64 / secs
    );
    println!("{:?}", store.stats());
    store.close().map_err(|e: StoreError| e.into())
}
