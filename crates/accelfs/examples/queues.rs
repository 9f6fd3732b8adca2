//! Device I/O of many threads at once (issue 14 item 2, a queue pair per thread): N threads
//! each reading 1 MiB pieces of its own file at random offsets (large reads go straight from
//! the device into the caller's buffer), streaming its file whole, and overwriting 1 MiB pieces
//! of it (whole blocks straight to the device), on a fresh image file. These are the paths that
//! hold the disk lock shared, each thread on a queue of its own; with a single queue they take
//! turns. Prints MB/s per workload and thread count.
//!
//! ```text
//! cargo run --release -p kura-accelfs --example queues -- [SPEC] [THREADS,...] [SECONDS]
//! ```
//!
//! SPEC defaults to `file:/tmp/kura-queues.img?size=512M` (formatted: everything on it is
//! lost), THREADS to `1,2,4`, SECONDS (per measurement) to 2.

use kura_accelfs::{FileSystem, MkfsOptions, MountOptions, OpenOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

const PIECE: usize = 1 << 20;
/// Bytes of each thread's file.
const FILE_BYTES: usize = 32 << 20;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = args
        .first()
        .cloned()
        .unwrap_or_else(|| "file:/tmp/kura-queues.img?size=512M".into());
    let threads: Vec<usize> = match args.get(1) {
        Some(list) => list
            .split(',')
            .map(|n| n.parse())
            .collect::<Result<_, _>>()?,
        None => vec![1, 2, 4],
    };
    let secs: f64 = args.get(2).map_or(Ok(2.0), |s| s.parse())?;
    let span = Duration::from_secs_f64(secs);
    let most = threads.iter().copied().max().unwrap_or(1);
    let fs = FileSystem::format(
        kura_engine::open(&spec)?,
        MkfsOptions::default(),
        MountOptions {
            cache_bytes: 1 << 20,
            ..MountOptions::default()
        },
    )?;
    let data = vec![0x5au8; FILE_BYTES];
    for t in 0..most {
        fs.write(&format!("/f{t}"), &data)?;
    }
    fs.sync()?;
    println!("spec {spec}, {secs} s per point");
    for &n in &threads {
        let mb = run(n, span, |t, stop, bytes| {
            let f = fs.open(&format!("/f{t}"))?;
            let mut rng = SmallRng::seed_from_u64(t as u64);
            let mut buf = vec![0u8; PIECE];
            while !stop.load(Ordering::Relaxed) {
                let at = rng.gen_range(0..FILE_BYTES / PIECE) * PIECE;
                f.read_exact_at(at as u64, &mut buf)?;
                bytes.fetch_add(PIECE as u64, Ordering::Relaxed);
            }
            Ok(())
        })?;
        println!("1 MiB random reads   threads {n:2}: {mb:8.1} MB/s");
        let mb = run(n, span, |t, stop, bytes| {
            let f = fs.open(&format!("/f{t}"))?;
            while !stop.load(Ordering::Relaxed) {
                let got = f.read_stream(0, FILE_BYTES as u64, |_| {})?;
                bytes.fetch_add(got, Ordering::Relaxed);
            }
            Ok(())
        })?;
        println!("streamed reads       threads {n:2}: {mb:8.1} MB/s");
        let mb = run(n, span, |t, stop, bytes| {
            let f = fs.open_with(&format!("/f{t}"), OpenOptions::new().read(true).write(true))?;
            let mut rng = SmallRng::seed_from_u64(100 + t as u64);
            let buf = vec![t as u8; PIECE];
            while !stop.load(Ordering::Relaxed) {
                let at = rng.gen_range(0..FILE_BYTES / PIECE) * PIECE;
                f.write_at(at as u64, &buf)?;
                bytes.fetch_add(PIECE as u64, Ordering::Relaxed);
            }
            Ok(())
        })?;
        println!("1 MiB overwrites     threads {n:2}: {mb:8.1} MB/s");
        fs.sync()?;
    }
    fs.unmount()?;
    Ok(())
}

/// Runs `work(thread, stop, bytes)` on `n` threads for `span`; returns MB/s over all of them.
fn run(
    n: usize,
    span: Duration,
    work: impl Fn(usize, &AtomicBool, &AtomicU64) -> Result<(), Error> + Sync,
) -> Result<f64, Error> {
    let stop = AtomicBool::new(false);
    let bytes = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..n)
            .map(|t| {
                let (work, stop, bytes) = (&work, &stop, &bytes);
                s.spawn(move || work(t, stop, bytes))
            })
            .collect();
        std::thread::sleep(span);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| Error::from("a worker panicked"))?)
    })?;
    Ok(bytes.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64() / 1e6)
}
