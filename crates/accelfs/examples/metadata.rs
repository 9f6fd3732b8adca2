//! The metadata storm of `kura bench fs --threads` on AccelFS alone, for profiling: N threads
//! each creating a small file in one shared directory, writing 512 bytes, stat-ing and
//! unlinking it, nothing synced; then N threads of cached 4 KiB random reads of their own files,
//! then of one shared file (the state lock's shared path).
//!
//! ```text
//! cargo run --release -p kura-accelfs --example metadata -- [SPEC] [THREADS,...] [SECONDS]
//! ```
//!
//! SPEC defaults to `mem:512M` (the file system's CPU cost alone), THREADS to `1,2,4`, SECONDS
//! (per point) to 1. Prints operations per second and the scaling over the first thread count.

use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

const BLOCK: usize = 4096;
const READ_FILE_BYTES: usize = 4 << 20;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = args.first().cloned().unwrap_or_else(|| "mem:512M".into());
    let threads: Vec<usize> = match args.get(1) {
        Some(list) => list
            .split(',')
            .map(|n| n.parse())
            .collect::<Result<_, _>>()?,
        None => vec![1, 2, 4],
    };
    let span = Duration::from_secs_f64(args.get(2).map_or(Ok(1.0), |s| s.parse())?);
    let max_n = threads.iter().copied().max().unwrap_or(1);
    let fs = FileSystem::format(
        kura_engine::open(&spec)?,
        MkfsOptions::default(),
        MountOptions {
            cache_bytes: (max_n as u64 + 1) * READ_FILE_BYTES as u64 * 2 + (16 << 20),
            ..MountOptions::default()
        },
    )?;
    fs.mkdir("/meta")?;
    for t in 0..=max_n {
        let data: Vec<u8> = (0..READ_FILE_BYTES)
            .map(|i| (i / BLOCK + t) as u8)
            .collect();
        fs.write(&format!("/read-{t}"), &data)?;
        fs.read(&format!("/read-{t}"))?;
    }
    fs.sync()?;
    let mut base = [0.0f64; 3];
    for &n in &threads {
        let meta = run(n, span, |t, stop| {
            let data = vec![t as u8; 512];
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let path = format!("/meta/{t}-{ops}");
                fs.create(&path)?.write_at(0, &data)?;
                if fs.metadata(&path)?.len() != data.len() as u64 {
                    return Err("stat after write saw the wrong size".into());
                }
                fs.remove_file(&path)?;
                ops += 1;
            }
            Ok(ops)
        })?;
        let reads = |t: usize, file: usize, stop: &AtomicBool| -> Result<u64, Error> {
            let f = fs.open(&format!("/read-{file}"))?;
            let blocks = (READ_FILE_BYTES / BLOCK) as u64;
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
            let mut buf = vec![0u8; BLOCK];
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let b = x % blocks;
                f.read_exact_at(b * BLOCK as u64, &mut buf)?;
                if buf[0] != (b as usize + file) as u8 {
                    return Err("a read returned another block".into());
                }
                ops += 1;
            }
            Ok(ops)
        };
        let own = run(n, span, |t, stop| reads(t, t, stop))?;
        let shared = run(n, span, |t, stop| reads(t, max_n, stop))?;
        for (i, (what, rate)) in [
            ("metadata storm", meta),
            ("cached reads, own file", own),
            ("cached reads, one file", shared),
        ]
        .into_iter()
        .enumerate()
        {
            if n == threads[0] {
                base[i] = rate;
            }
            println!(
                "{what:24} threads {n:2}: {rate:10.0} ops/s, {:.2}x",
                rate / base[i]
            );
        }
    }
    fs.unmount()?;
    Ok(())
}

/// Runs `work(thread, stop)` on `n` threads for `span`; operations per second of them all.
fn run(
    n: usize,
    span: Duration,
    work: impl Fn(usize, &AtomicBool) -> Result<u64, Error> + Sync,
) -> Result<f64, Error> {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let total = std::thread::scope(|s| -> Result<u64, Error> {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let (work, stop) = (&work, &stop);
                s.spawn(move || work(t, stop))
            })
            .collect();
        std::thread::sleep(span);
        stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for h in handles {
            total += h.join().map_err(|_| "a worker panicked")??;
        }
        Ok(total)
    })?;
    Ok(total as f64 / start.elapsed().as_secs_f64())
}
