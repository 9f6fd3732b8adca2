//! `kura bench fs --threads N,...`: how AccelFS scales with threads against the host file system
//! (issue 14 item 5). For each thread count N, four workloads run on AccelFS and on the host file
//! system of `--dir` through plain system calls, the two taking turns round by round (A B A B,
//! [`interleave`]):
//!
//! - `read own`: N threads each reading 4 KiB at random offsets of its own cached file;
//! - `read shared`: the same, all N threads on one shared cached file;
//! - `fsync append`: N threads each appending 4 KiB to its own file and making it durable
//!   (AccelFS `File::sync_all`, a journal commit that group commit may share; the host file's
//!   `fdatasync`, as `kura bench fs` does);
//! - `metadata`: N threads each creating a small file in one shared directory, writing 512 bytes,
//!   closing it, stat-ing and unlinking it (one operation is the whole cycle; nothing is synced).
//!
//! Each point is operations per second over a fixed time; each system's figure is the median
//! and min–max over the rounds ([`Spread`]), with the AccelFS/host ratio per round pair and each
//! system's scaling ratio (N-thread over smallest-N throughput, round by round). Every read
//! checks the block it got carries its file's pattern. This module owns the workloads, the
//! table, the JSON report and the plot; `fs.rs` calls [`run`] when `--threads` is given.

use crate::fs::write_host_file;
use crate::output::RunArgs;
use crate::stats::{compare, interleave, quotient, Compared, Spread};
use anyhow::{bail, Context};
use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use serde::Serialize;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The thread-scaling options of `kura bench fs` (flattened into its arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct ThreadArgs {
    /// Run the thread-scaling benchmark instead of the latency sweep: comma-separated thread
    /// counts (`--threads` alone: 1,2,4). Random 4 KiB reads of cached data (own file, one
    /// shared file), fsync'd 4 KiB appends and create/stat/unlink, AccelFS against the host fs.
    #[arg(long, num_args = 0..=1, default_missing_value = "1,2,4", value_name = "N,...")]
    pub threads: Option<String>,
    /// Seconds each (workload, thread count, system) point runs per round (--quick: 0.1 at most).
    #[arg(long, default_value_t = 1.0)]
    pub thread_secs: f64,
    /// Rounds of every point, AccelFS and the host taking turns (default 5; --quick 1).
    #[arg(long)]
    pub thread_rounds: Option<usize>,
}

/// One system's throughput for one workload at one thread count.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub workload: String,
    pub system: String,
    pub threads: usize,
    /// Operations per second over the rounds.
    pub ops_per_s: Spread,
    /// Each round's operations per second, in round order.
    pub rounds_ops_per_s: Vec<f64>,
    /// This N's throughput over the smallest N's, round by round (1.0 at the smallest N).
    pub scaling: Spread,
    /// CPU time this process used (user + system, every thread) per second of the point: the
    /// cores the threads actually got, which bounds the scaling on a busy machine.
    pub cores_used: Spread,
    /// Operations per CPU-second of this process (work the kernel does in its own threads, such
    /// as ext4's journal thread or io_uring workers, is not counted).
    pub ops_per_cpu_s: Spread,
    /// AccelFS appends only: journal commits over all rounds, and the fsyncs they made durable
    /// (fewer commits than fsyncs: group commit shared them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commits: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsyncs: Option<u64>,
}

/// AccelFS against the host at one (workload, N).
#[derive(Debug, Clone, Serialize)]
pub struct Versus {
    pub workload: String,
    pub threads: usize,
    /// AccelFS / host operations per second, per round pair.
    pub accelfs_over_host: Compared,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `fs-threads`, so `kura bench all` and readers can tell it from the latency report.
    pub bench: String,
    /// The file system of `--dir` (statfs), which the host rows run on.
    pub file_system: String,
    /// The systems in the order of the table: AccelFS, then the host's `NAME syscalls`.
    pub systems: Vec<String>,
    pub workloads: Vec<String>,
    pub threads: Vec<usize>,
    /// The thread count scaling ratios are taken against (the smallest asked).
    pub base_threads: usize,
    pub cores: usize,
    pub rounds: usize,
    pub secs_per_point: f64,
    pub read_file_bytes: u64,
    pub cache_bytes: u64,
    pub points: Vec<Point>,
    pub versus: Vec<Versus>,
    pub notes: Vec<String>,
}

const ACCELFS: &str = "AccelFS";
const BLOCK: usize = 4096;
/// Bytes written into each file of the metadata storm.
const SMALL_FILE: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    ReadOwn,
    ReadShared,
    Append,
    Metadata,
}

const WORKLOADS: [Workload; 4] = [
    Workload::ReadOwn,
    Workload::ReadShared,
    Workload::Append,
    Workload::Metadata,
];

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::ReadOwn => "read own",
            Workload::ReadShared => "read shared",
            Workload::Append => "fsync append",
            Workload::Metadata => "metadata",
        }
    }
}

/// The thread counts of `--threads`: positive, at most 1024, sorted, no repeats.
pub fn parse_threads(list: &str) -> anyhow::Result<Vec<usize>> {
    let mut v = Vec::new();
    for part in list.split(',').map(str::trim) {
        let n: usize = part
            .parse()
            .with_context(|| format!("--threads: {part:?} is not a thread count"))?;
        if n == 0 || n > 1024 {
            bail!("--threads: {n} must be between 1 and 1024");
        }
        v.push(n);
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Runs the thread-scaling benchmark in `dir` and emits its report as the bench `fs-threads`.
pub fn run(dir: &Path, args: &ThreadArgs, run: &RunArgs, threads: &str) -> anyhow::Result<()> {
    let threads = parse_threads(threads)?;
    if !(args.thread_secs.is_finite() && args.thread_secs > 0.0) {
        bail!("--thread-secs must be a positive number of seconds");
    }
    let secs = if run.quick {
        args.thread_secs.min(0.1)
    } else {
        args.thread_secs
    };
    let rounds = crate::stats::rounds(args.thread_rounds, run.quick, 1);
    let file_bytes: u64 = if run.quick { 1 << 20 } else { 4 << 20 };
    let max_n = *threads.last().context("--threads is empty")?;
    let report = measure(dir, &threads, secs, rounds, file_bytes, max_n)?;
    print_report(&report);
    run.output.emit("fs-threads", PLOT, &report)
}

fn measure(
    dir: &Path,
    threads: &[usize],
    secs: f64,
    rounds: usize,
    file_bytes: u64,
    max_n: usize,
) -> anyhow::Result<Report> {
    let work = tempfile::Builder::new()
        .prefix("kura-bench-fs-threads")
        .tempdir_in(dir)
        .with_context(|| format!("creating a work directory in {}", dir.display()))?;
    let file_system = crate::stats::fs_name(dir);
    let host_label = format!("{file_system} syscalls");
    let span = Duration::from_secs_f64(secs);

    // AccelFS on an image written in full (no host-side allocation under its appends), with a
    // cache that holds every read file twice over.
    let files = max_n as u64 + 1;
    let cache_bytes = files * file_bytes * 2 + (16 << 20);
    let image = work.path().join("accelfs.img");
    let image_bytes = (files * file_bytes * 3 + (256 << 20)).max(512 << 20);
    write_host_file(&image, image_bytes)?;
    let fs = FileSystem::format(
        kura_engine::open(&format!("uring:{}", image.display()))?,
        MkfsOptions::default(),
        MountOptions {
            cache_bytes,
            ..MountOptions::default()
        },
    )?;
    let host_dir = work.path().join("host");
    std::fs::create_dir(&host_dir)?;
    let accel = Sys::Accel(&fs);
    let host = Sys::Host(&host_dir);
    for sys in [&accel, &host] {
        sys.prepare(max_n, file_bytes)?;
    }

    let base = threads[0];
    let mut points = Vec::new();
    let mut versus = Vec::new();
    for wl in WORKLOADS {
        // Per system: each N's round samples, in `threads` order.
        let mut per_n: Vec<[Vec<f64>; 2]> = Vec::new();
        let mut per_n_cpu: Vec<[Vec<Sample>; 2]> = Vec::new();
        let mut commits = Vec::new();
        for &n in threads {
            let before = fs.statfs().commits;
            let mut accel_ops = 0u64;
            let mut cpu: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
            let samples = {
                let [accel_cpu, host_cpu] = &mut cpu;
                let mut a = |_: usize| {
                    accel.point(wl, n, span, file_bytes).map(|s| {
                        accel_ops += s.ops;
                        accel_cpu.push(s);
                        s.rate
                    })
                };
                let mut b = |_: usize| {
                    host.point(wl, n, span, file_bytes).map(|s| {
                        host_cpu.push(s);
                        s.rate
                    })
                };
                interleave(rounds, &mut [&mut a, &mut b])?
            };
            let after = fs.statfs().commits;
            commits.push((after - before, accel_ops));
            let [accel_rounds, host_rounds]: [Vec<f64>; 2] = samples
                .try_into()
                .map_err(|_| anyhow::anyhow!("two sides give two sample lists"))?;
            versus.push(Versus {
                workload: wl.name().into(),
                threads: n,
                accelfs_over_host: compare(&accel_rounds, &host_rounds, quotient, None),
            });
            per_n.push([accel_rounds, host_rounds]);
            per_n_cpu.push(cpu);
        }
        for (i, system) in [ACCELFS, host_label.as_str()].into_iter().enumerate() {
            for (k, &n) in threads.iter().enumerate() {
                let r = &per_n[k][i];
                let scaling = compare(r, &per_n[0][i], quotient, None).ratio;
                let (c, f) = commits[k];
                let group = wl == Workload::Append && i == 0;
                let cpu = &per_n_cpu[k][i];
                let of = |f: fn(&Sample) -> f64| Spread::of(&cpu.iter().map(f).collect::<Vec<_>>());
                points.push(Point {
                    workload: wl.name().into(),
                    system: system.into(),
                    threads: n,
                    ops_per_s: Spread::of(r),
                    rounds_ops_per_s: r.clone(),
                    scaling,
                    cores_used: of(|s| s.cores),
                    ops_per_cpu_s: of(|s| s.per_cpu_s),
                    commits: group.then_some(c),
                    fsyncs: group.then_some(f),
                });
            }
        }
    }
    fs.unmount()?;

    let notes = vec![
        format!(
            "{} s per point, {rounds} round(s), AccelFS and {host_label} taking turns per point; ops/s are median [min–max] over the rounds; scaling = N-thread / {base}-thread throughput, round by round",
            secs
        ),
        format!(
            "reads: 4 KiB at random block offsets of {} KiB files read once before each point (cached: AccelFS cache {} MiB, the host's page cache); every read checks its block's pattern",
            file_bytes >> 10,
            cache_bytes >> 20
        ),
        "fsync append: AccelFS File::sync_all (journal commit, shared by group commit) against the host file's fdatasync (as kura bench fs); files removed after each point".into(),
        format!(
            "metadata: create, write {SMALL_FILE} B, close, stat, unlink in one shared directory per operation, no sync"
        ),
        format!(
            "AccelFS image: a fully written {} MiB file on {file_system}, opened with uring",
            image_bytes >> 20
        ),
    ];
    Ok(Report {
        bench: "fs-threads".into(),
        file_system,
        systems: vec![ACCELFS.into(), host_label],
        workloads: WORKLOADS.iter().map(|w| w.name().to_string()).collect(),
        threads: threads.to_vec(),
        base_threads: base,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        rounds,
        secs_per_point: secs,
        read_file_bytes: file_bytes,
        cache_bytes,
        points,
        versus,
        notes,
    })
}

/// A system under test: a mounted AccelFS, or a directory of the host file system.
enum Sys<'a> {
    Accel(&'a FileSystem),
    Host(&'a Path),
}

/// The byte every position of block `block` of read file `seed` holds.
fn pattern_byte(seed: usize, block: u64) -> u8 {
    (block as usize).wrapping_add(seed.wrapping_mul(31)) as u8
}

fn pattern(seed: usize, bytes: u64) -> Vec<u8> {
    (0..bytes as usize)
        .map(|i| pattern_byte(seed, (i / BLOCK) as u64))
        .collect()
}

/// The seed of the shared read file's pattern (the own files use their thread index).
const SHARED: usize = 4099;

impl Sys<'_> {
    fn accel_path(name: &str) -> String {
        format!("/{name}")
    }

    fn host_path(dir: &Path, name: &str) -> PathBuf {
        dir.join(name)
    }

    /// Writes the read files (one per thread of the largest N, and the shared one) and the
    /// metadata storm's directory, durably.
    fn prepare(&self, max_n: usize, bytes: u64) -> anyhow::Result<()> {
        let files = (0..max_n)
            .map(|t| (format!("read-{t}"), t))
            .chain([("shared".to_string(), SHARED)]);
        match self {
            Sys::Accel(fs) => {
                for (name, seed) in files {
                    fs.write(&Self::accel_path(&name), &pattern(seed, bytes))?;
                }
                fs.mkdir("/meta")?;
                fs.sync()?;
            }
            Sys::Host(dir) => {
                for (name, seed) in files {
                    let path = Self::host_path(dir, &name);
                    std::fs::write(&path, pattern(seed, bytes))
                        .with_context(|| format!("writing {}", path.display()))?;
                    std::fs::File::open(&path)?.sync_all()?;
                }
                std::fs::create_dir(Self::host_path(dir, "meta"))?;
                std::fs::File::open(dir)?.sync_all()?;
            }
        }
        Ok(())
    }

    /// Reads a file whole, so that its blocks are cached.
    fn warm(&self, name: &str) -> anyhow::Result<()> {
        match self {
            Sys::Accel(fs) => {
                fs.read(&Self::accel_path(name))?;
            }
            Sys::Host(dir) => {
                std::fs::read(Self::host_path(dir, name))?;
            }
        }
        Ok(())
    }

    /// One point: `wl` on `n` threads for `span`.
    fn point(
        &self,
        wl: Workload,
        n: usize,
        span: Duration,
        file_bytes: u64,
    ) -> anyhow::Result<Sample> {
        match wl {
            Workload::ReadOwn => {
                for t in 0..n {
                    self.warm(&format!("read-{t}"))?;
                }
                on_threads(n, span, |t, stop| {
                    self.reads(&format!("read-{t}"), t, t, file_bytes, stop)
                })
            }
            Workload::ReadShared => {
                self.warm("shared")?;
                on_threads(n, span, |t, stop| {
                    self.reads("shared", SHARED, t, file_bytes, stop)
                })
            }
            Workload::Append => {
                let done = on_threads(n, span, |t, stop| self.appends(t, stop))?;
                for t in 0..n {
                    self.remove(&format!("append-{t}"))?;
                }
                Ok(done)
            }
            Workload::Metadata => on_threads(n, span, |t, stop| self.metadata(t, stop)),
        }
    }

    fn remove(&self, name: &str) -> anyhow::Result<()> {
        match self {
            Sys::Accel(fs) => fs.remove_file(&Self::accel_path(name))?,
            Sys::Host(dir) => std::fs::remove_file(Self::host_path(dir, name))?,
        }
        Ok(())
    }

    /// Random 4 KiB reads of `name` (pattern `seed`) until `stop`, at least one.
    fn reads(
        &self,
        name: &str,
        seed: usize,
        thread: usize,
        file_bytes: u64,
        stop: &AtomicBool,
    ) -> anyhow::Result<u64> {
        let blocks = file_bytes / BLOCK as u64;
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (thread as u64 + 1);
        let mut buf = vec![0u8; BLOCK];
        let mut ops = 0u64;
        let accel;
        let host;
        let read: &dyn Fn(u64, &mut [u8]) -> anyhow::Result<()> = match self {
            Sys::Accel(fs) => {
                let f = fs.open(&Self::accel_path(name))?;
                accel = move |off: u64, b: &mut [u8]| -> anyhow::Result<()> {
                    Ok(f.read_exact_at(off, b)?)
                };
                &accel
            }
            Sys::Host(dir) => {
                let f = std::fs::File::open(Self::host_path(dir, name))?;
                host = move |off: u64, b: &mut [u8]| -> anyhow::Result<()> {
                    Ok(f.read_exact_at(b, off)?)
                };
                &host
            }
        };
        loop {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let block = x % blocks;
            read(block * BLOCK as u64, &mut buf)?;
            let want = pattern_byte(seed, block);
            if buf[0] != want || buf[BLOCK - 1] != want {
                bail!("{name}: block {block} read back {} (want {want})", buf[0]);
            }
            ops += 1;
            if stop.load(Ordering::Relaxed) {
                return Ok(ops);
            }
        }
    }

    /// fsync'd 4 KiB appends to `append-THREAD` until `stop`, at least one.
    fn appends(&self, thread: usize, stop: &AtomicBool) -> anyhow::Result<u64> {
        let name = format!("append-{thread}");
        let block = vec![thread as u8; BLOCK];
        let mut ops = 0u64;
        match self {
            Sys::Accel(fs) => {
                let mut f = fs.create(&Self::accel_path(&name))?;
                loop {
                    f.write_all(&block)?;
                    f.sync_all()?;
                    ops += 1;
                    if stop.load(Ordering::Relaxed) {
                        return Ok(ops);
                    }
                }
            }
            Sys::Host(dir) => {
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .truncate(false)
                    .open(Self::host_path(dir, &name))?;
                loop {
                    f.write_all(&block)?;
                    f.sync_data()?;
                    ops += 1;
                    if stop.load(Ordering::Relaxed) {
                        return Ok(ops);
                    }
                }
            }
        }
    }

    /// create, write, close, stat, unlink of `meta/THREAD-I` until `stop`, at least once.
    fn metadata(&self, thread: usize, stop: &AtomicBool) -> anyhow::Result<u64> {
        let data = vec![thread as u8; SMALL_FILE];
        let mut ops = 0u64;
        loop {
            let name = format!("meta/{thread}-{ops}");
            match self {
                Sys::Accel(fs) => {
                    let path = Self::accel_path(&name);
                    fs.create(&path)?.write_at(0, &data)?;
                    let len = fs.metadata(&path)?.len();
                    if len != SMALL_FILE as u64 {
                        bail!("{path}: stat says {len} bytes after writing {SMALL_FILE}");
                    }
                    fs.remove_file(&path)?;
                }
                Sys::Host(dir) => {
                    let path = Self::host_path(dir, &name);
                    std::fs::File::create(&path)?.write_all(&data)?;
                    let len = std::fs::metadata(&path)?.len();
                    if len != SMALL_FILE as u64 {
                        bail!(
                            "{}: stat says {len} bytes after writing {SMALL_FILE}",
                            path.display()
                        );
                    }
                    std::fs::remove_file(&path)?;
                }
            }
            ops += 1;
            if stop.load(Ordering::Relaxed) {
                return Ok(ops);
            }
        }
    }
}

/// What one point measured.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Operations done by all threads.
    ops: u64,
    /// Operations per second, from the threads' release to the last thread's end.
    rate: f64,
    /// CPU seconds of this process per second of the point.
    cores: f64,
    /// Operations per CPU-second of this process.
    per_cpu_s: f64,
}

/// CPU time this process has used, user and system, all threads (getrusage RUSAGE_SELF).
#[allow(unsafe_code)] // getrusage(2) into a local struct
fn cpu_seconds() -> anyhow::Result<f64> {
    // SAFETY: rusage is plain data that the call fills in.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the duration of the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrusage");
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// Runs `work` on `n` threads, released together, for `span`: the operations they did in total,
/// their rate over the time from release to the last thread's end, and the CPU time it took.
fn on_threads(
    n: usize,
    span: Duration,
    work: impl Fn(usize, &AtomicBool) -> anyhow::Result<u64> + Sync,
) -> anyhow::Result<Sample> {
    let stop = AtomicBool::new(false);
    let start = Barrier::new(n + 1);
    let work = &work;
    let (stop, start) = (&stop, &start);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|t| {
                s.spawn(move || {
                    start.wait();
                    work(t, stop)
                })
            })
            .collect();
        start.wait();
        let cpu0 = cpu_seconds()?;
        let t0 = Instant::now();
        std::thread::sleep(span);
        stop.store(true, Ordering::Relaxed);
        let mut total = 0u64;
        let mut failed = None;
        for h in handles {
            match h.join() {
                Ok(Ok(ops)) => total += ops,
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => failed = failed.or(Some(anyhow::anyhow!("a worker thread panicked"))),
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds()? - cpu0;
        match failed {
            Some(e) => Err(e),
            None => Ok(Sample {
                ops: total,
                rate: total as f64 / secs,
                cores: cpu / secs,
                per_cpu_s: if cpu > 0.0 {
                    total as f64 / cpu
                } else {
                    f64::NAN
                },
            }),
        }
    })
}

fn print_report(r: &Report) {
    let [accel, host] = [&r.systems[0], &r.systems[1]];
    println!(
        "fs threads: {accel} vs {host}, {} cores, {} s per point, {} round(s); ops/s median [min–max]; scaling = N / {}-thread throughput",
        r.cores, r.secs_per_point, r.rounds, r.base_threads
    );
    println!(
        "{:<13} {:>3} {:>26} {:>26} {:>20} {:>20} {:>20} {:>11}",
        "workload",
        "N",
        accel,
        host,
        "AccelFS/host",
        format!("scaling {accel}"),
        "scaling host",
        "cores A/H"
    );
    let point = |w: &str, s: &str, n: usize| {
        r.points
            .iter()
            .find(|p| p.workload == w && p.system == s && p.threads == n)
    };
    for w in &r.workloads {
        for &n in &r.threads {
            let (Some(a), Some(h)) = (point(w, accel, n), point(w, host, n)) else {
                continue;
            };
            let vs = r
                .versus
                .iter()
                .find(|v| &v.workload == w && v.threads == n)
                .map_or("-".into(), |v| v.accelfs_over_host.ratio.show(2));
            println!(
                "{:<13} {:>3} {:>26} {:>26} {:>20} {:>20} {:>20} {:>11}",
                w,
                n,
                a.ops_per_s.show(0),
                h.ops_per_s.show(0),
                vs,
                a.scaling.show(2),
                h.scaling.show(2),
                format!("{:.2}/{:.2}", a.cores_used.median, h.cores_used.median)
            );
        }
    }
    for p in r.points.iter().filter(|p| p.commits.is_some()) {
        if let (Some(c), Some(f)) = (p.commits, p.fsyncs) {
            println!(
                "AccelFS appends, {} thread(s): {c} journal commits for {f} fsyncs ({:.2} fsyncs per commit)",
                p.threads,
                f as f64 / c.max(1) as f64
            );
        }
    }
    println!(
        "cores A/H: median CPU-seconds per second this process used during AccelFS's / the host's points (the cores the threads got; ops per CPU-second in the JSON)"
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}

/// The plot: operations per second by thread count, one panel per workload, a line per system
/// with its min–max as error bars. Usage: python3 - REPORT.json OUT.png
const PLOT: &str = r#"
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

r = json.load(open(sys.argv[1]))
fig, axes = plt.subplots(1, len(r["workloads"]), figsize=(5 * len(r["workloads"]), 4.5))
if len(r["workloads"]) == 1:
    axes = [axes]
for ax, w in zip(axes, r["workloads"]):
    for s in r["systems"]:
        pts = sorted((p["threads"], p["ops_per_s"]) for p in r["points"] if p["workload"] == w and p["system"] == s)
        if not pts:
            continue
        xs = [n for n, _ in pts]
        med = [o["median"] for _, o in pts]
        lo = [o["median"] - o["min"] for _, o in pts]
        hi = [o["max"] - o["median"] for _, o in pts]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(r["threads"])
    ax.set_xticklabels([str(n) for n in r["threads"]])
    ax.set_xlabel("threads")
    ax.set_ylabel("operations/s")
    ax.set_ylim(bottom=0)
    ax.set_title(w)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle("kura bench fs --threads: %s, %d cores, median and min-max of %d round(s)" % (r["file_system"], r["cores"], r["rounds"]))
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_lists_are_sorted_and_checked() {
        assert_eq!(parse_threads("4, 1,2,2").unwrap(), vec![1, 2, 4]);
        assert!(parse_threads("0").is_err());
        assert!(parse_threads("1,x").is_err());
        assert!(parse_threads("").is_err());
        assert!(parse_threads("2000").is_err());
    }

    #[test]
    fn patterns_differ_between_blocks_and_files() {
        assert_ne!(pattern_byte(0, 0), pattern_byte(0, 1));
        assert_ne!(pattern_byte(0, 5), pattern_byte(1, 5));
        let p = pattern(3, 2 * BLOCK as u64);
        assert_eq!(p[BLOCK - 1], pattern_byte(3, 0));
        assert_eq!(p[BLOCK], pattern_byte(3, 1));
    }
}
