//! How AccelFS scales with threads (issue 14 item 2): N threads each doing fsync'd 4 KiB
//! appends to its own file, then N threads doing 4 KiB random reads of cached data (each of its
//! own file, then all of one shared file), the same cached reads while one more thread does
//! fsync'd appends or 1 MiB writes (with the reads' latency percentiles: do commits or device
//! writes stall readers?), and 4 KiB
//! random reads that miss a 1 MiB cache, on a fresh image file.
//!
//! ```text
//! cargo run --release -p kura-accelfs --example threads -- [SPEC] [THREADS,...] [SECONDS]
//! ```
//!
//! SPEC defaults to `file:/tmp/kura-threads.img?size=512M` (the image is formatted: everything
//! on it is lost; `mem:512M` measures the file system's CPU cost alone, without the uncached
//! reads), THREADS to `1,2,4,8`, SECONDS (per measurement) to 2. Prints one line per
//! workload and thread count, plus the journal commits the appends needed (fewer commits than
//! fsyncs means fsyncs shared a commit).

use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

type Error = Box<dyn std::error::Error + Send + Sync>;

const BLOCK: usize = 4096;
/// Bytes of each file the read workloads read (all cached).
const READ_FILE_BYTES: u64 = 4 << 20;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = args
        .first()
        .cloned()
        .unwrap_or_else(|| "file:/tmp/kura-threads.img?size=512M".into());
    let threads: Vec<usize> = match args.get(1) {
        Some(list) => list
            .split(',')
            .map(|n| n.parse())
            .collect::<Result<_, _>>()?,
        None => vec![1, 2, 4, 8],
    };
    let secs: f64 = args.get(2).map_or(Ok(2.0), |s| s.parse())?;
    let span = Duration::from_secs_f64(secs);
    println!("spec {spec}, {secs} s per point, {} cores", cores());
    for &n in &threads {
        let fs = FileSystem::format(
            kura_engine::open(&spec)?,
            MkfsOptions::default(),
            MountOptions::default(),
        )?;
        let before = fs.statfs().commits;
        let ops = run(n, span, |t, stop| {
            let mut f = fs.create(&format!("/append-{t}"))?;
            let buf = vec![t as u8; BLOCK];
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::io::Write::write_all(&mut f, &buf)?;
                f.sync_all()?;
                ops += 1;
            }
            Ok(ops)
        })?;
        let commits = fs.statfs().commits - before;
        report("fsync'd 4 KiB appends", n, ops, span, Some(commits));
        for t in 0..n {
            fs.write(&format!("/read-{t}"), &pattern(t))?;
        }
        fs.write("/shared", &pattern(99))?;
        fs.sync()?;
        // Warm the cache: every block is read once before timing.
        for t in 0..n {
            fs.read(&format!("/read-{t}"))?;
        }
        fs.read("/shared")?;
        let ops = run(n, span, |t, stop| {
            random_reads(&fs, &format!("/read-{t}"), t, stop)
        })?;
        report("4 KiB random reads, own file", n, ops, span, None);
        let ops = run(n, span, |t, stop| random_reads(&fs, "/shared", t, stop))?;
        report("4 KiB random reads, one file", n, ops, span, None);
        // Cached reads while one more thread does fsync'd appends (do commits stall readers?)
        // or 1 MiB writes that bypass the cache (do device writes stall them?).
        for writer in [Writer::FsyncAppends, Writer::LargeWrites] {
            beside(&fs, n, span, writer)?;
        }
        fs.unmount()?;
        if spec.starts_with("mem:") {
            // A RAM disk does not outlive its mount: nothing to mount again.
            continue;
        }
        // Reads that miss the cache: a 1 MiB cache under files of 4 MiB.
        let fs = FileSystem::mount(
            kura_engine::open(&spec)?,
            MountOptions {
                cache_bytes: 1 << 20,
                ..MountOptions::default()
            },
        )?;
        let ops = run(n, span, |t, stop| {
            random_reads(&fs, &format!("/read-{t}"), t, stop)
        })?;
        report("4 KiB random reads, uncached", n, ops, span, None);
        fs.unmount()?;
    }
    Ok(())
}

/// What the extra thread does in [`beside`].
#[derive(Clone, Copy)]
enum Writer {
    FsyncAppends,
    LargeWrites,
}

/// `n` threads of cached 4 KiB random reads beside one thread of `writer`: the readers'
/// throughput and latency percentiles, and the writer's rate.
fn beside(fs: &FileSystem, n: usize, span: Duration, writer: Writer) -> Result<(), Error> {
    let writes = std::sync::atomic::AtomicU64::new(0);
    let mut latencies: Vec<u32> = Vec::new();
    let ops = {
        let lat = std::sync::Mutex::new(&mut latencies);
        run(n + 1, span, |t, stop| {
            if t == n {
                let mut f = fs.create("/writer")?;
                match writer {
                    Writer::FsyncAppends => {
                        let buf = vec![7u8; BLOCK];
                        while !stop.load(Ordering::Relaxed) {
                            std::io::Write::write_all(&mut f, &buf)?;
                            f.sync_all()?;
                            writes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Writer::LargeWrites => {
                        let buf = vec![9u8; 1 << 20];
                        let mut at = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            f.write_at(at, &buf)?;
                            at = (at + buf.len() as u64) % (32 << 20);
                            writes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                return Ok(0);
            }
            let mut mine = Vec::with_capacity(1 << 20);
            let ops = timed_reads(fs, &format!("/read-{t}"), t, stop, &mut mine)?;
            lat.lock().map_err(|_| "poisoned")?.extend(mine);
            Ok(ops)
        })?
    };
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |&ns| f64::from(ns) / 1000.0)
    };
    let (what, unit) = match writer {
        Writer::FsyncAppends => ("cached reads beside fsyncs", "fsync'd appends"),
        Writer::LargeWrites => ("cached reads beside 1 MiB writes", "1 MiB writes"),
    };
    println!(
        "{what:32} threads {n:2}: {:10.0} ops/s, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us ({:.0} {unit}/s beside)",
        ops as f64 / span.as_secs_f64(),
        pct(0.99),
        pct(0.999),
        pct(1.0),
        writes.load(Ordering::Relaxed) as f64 / span.as_secs_f64()
    );
    Ok(())
}

/// [`random_reads`] recording each read's latency (ns) in `lat`.
fn timed_reads(
    fs: &FileSystem,
    path: &str,
    seed: usize,
    stop: &AtomicBool,
    lat: &mut Vec<u32>,
) -> Result<u64, Error> {
    let f = fs.open(path)?;
    let blocks = READ_FILE_BYTES / BLOCK as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed as u64;
    let mut buf = vec![0u8; BLOCK];
    let mut ops = 0u64;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t0 = std::time::Instant::now();
        f.read_exact_at((x % blocks) * BLOCK as u64, &mut buf)?;
        lat.push(t0.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
        ops += 1;
    }
    Ok(ops)
}

fn pattern(seed: usize) -> Vec<u8> {
    (0..READ_FILE_BYTES as usize)
        .map(|i| (i / BLOCK + seed) as u8)
        .collect()
}

fn random_reads(fs: &FileSystem, path: &str, seed: usize, stop: &AtomicBool) -> Result<u64, Error> {
    let f = fs.open(path)?;
    let blocks = READ_FILE_BYTES / BLOCK as u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed as u64;
    let mut buf = vec![0u8; BLOCK];
    let mut ops = 0u64;
    while !stop.load(Ordering::Relaxed) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        f.read_exact_at((x % blocks) * BLOCK as u64, &mut buf)?;
        ops += 1;
    }
    Ok(ops)
}

type Work<'a> = dyn Fn(usize, &AtomicBool) -> Result<u64, Error> + Sync + 'a;

/// Runs `work` on `n` threads for `span`; returns the operations they did in total.
fn run(
    n: usize,
    span: Duration,
    work: impl Fn(usize, &AtomicBool) -> Result<u64, Error> + Sync,
) -> Result<u64, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let work: &Work = &work;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                let stop = stop.clone();
                s.spawn(move || work(t, &stop))
            })
            .collect();
        std::thread::sleep(span);
        stop.store(true, Ordering::Relaxed);
        let mut total = 0;
        for h in handles {
            total += h.join().map_err(|_| "a worker thread panicked")??;
        }
        Ok(total)
    })
}

fn report(what: &str, n: usize, ops: u64, span: Duration, commits: Option<u64>) {
    let rate = ops as f64 / span.as_secs_f64();
    let extra = commits.map_or(String::new(), |c| format!(", {c} commits for {ops} fsyncs"));
    println!("{what:32} threads {n:2}: {rate:10.0} ops/s{extra}");
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
