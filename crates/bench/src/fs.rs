//! `kura bench fs`: the paper's Fig. 5 for the file system. Read, write and write+sync latency by
//! size on AccelFS (direct, io_uring), on the raw engine under it, on ext4 through plain system
//! calls, and on AccelFS over `redirect` (every command crosses to a proxy process); then
//! fsync'd 4 KiB appends per second (AccelFS vs ext4) and sequential read bandwidth of a large
//! file (AccelFS vs the raw engine), with the cache's peak memory against its budget.
//!
//! Every system works on files in the same directory of the same host file system, so they share
//! the device. Reads are cold: the AccelFS cache is kept far smaller than the region read at
//! random, and the page cache is dropped for the ext4 file before each read point.

use crate::io::drop_page_cache;
use crate::output::{plot_help, RunArgs};
use crate::stats::{compare, quotient, Compared, Spread};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_accelfs::fsdevice::{BatchOp, FsDevice, StreamPart};
use kura_accelfs::{FileSystem, MkfsOptions, MountOptions, OpenOptions};
use kura_engine::IoBuf;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

const PLOT: &str = include_str!("../../../scripts/plot_fsbench.py");

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("quick", |a| a.help("A short run for smoke tests: small region, sizes and files")), mut_arg("plot", |a| plot_help(a, "fs")))]
pub struct FsBenchArgs {
    /// Directory for the images and the ext4 file (a real disk file system, not tmpfs).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Comma-separated request sizes for the latency sweep.
    #[arg(long, default_value = "4K,16K,64K,256K,1M")]
    pub sizes: String,
    /// Timed operations per (system, operation, size).
    #[arg(long, default_value_t = 200)]
    pub iters: usize,
    /// Bytes of the region read and written at random offsets.
    #[arg(long, default_value = "256M")]
    pub region: String,
    /// fsync'd 4 KiB appends timed per system.
    #[arg(long, default_value_t = 2000)]
    pub appends: usize,
    /// Size of the file read sequentially.
    #[arg(long, default_value = "1G")]
    pub seq_size: String,
    /// AccelFS block size for the benchmark image.
    #[arg(long, default_value = "4K")]
    pub block_size: String,
    /// AccelFS buffer-cache budget.
    #[arg(long, default_value = "16M")]
    pub cache: String,
    /// Skip AccelFS over `redirect`.
    #[arg(long)]
    pub no_redirect: bool,
    /// `--threads`: the thread-scaling benchmark (fs_threads.rs) instead of the latency sweep.
    #[command(flatten)]
    pub threads: crate::fs_threads::ThreadArgs,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyPoint {
    pub system: String,
    pub op: String,
    pub bytes: usize,
    /// The median over the rounds of each round's mean latency.
    pub mean_us: f64,
    /// Each round's mean latency: median and min–max.
    pub mean_us_rounds: Spread,
    /// Percentiles of every round's samples together (a round has too few for a tail).
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub latency: Vec<LatencyPoint>,
    /// fsync'd 4 KiB appends per second, by system.
    pub appends_per_s: Vec<(String, f64)>,
    /// Sequential read bandwidth in MiB/s, by system.
    pub seq_read_mib_s: Vec<(String, f64)>,
    pub seq_bytes: u64,
    pub cache_budget_bytes: u64,
    pub cache_peak_bytes: u64,
    pub peak_rss_bytes: u64,
    pub block_size: u32,
    /// The file system of `--dir` (statfs), which the host-file rows run on.
    pub file_system: String,
    /// fsync'd appends per second over the rounds, by system (median in `appends_per_s`).
    pub appends_rounds: Vec<(String, Spread)>,
    /// Sequential read over the rounds, by system (median in `seq_read_mib_s`).
    pub seq_read_rounds: Vec<(String, Spread)>,
    /// AccelFS against the host file system's appends, per round pair.
    pub appends_ratio: Option<Compared>,
    pub notes: Vec<String>,
}

const RAW: &str = "raw engine";
const ACCELFS: &str = "AccelFS";
/// AccelFS's large reads through `File::read_stream`: the engine buffers the device read into,
/// handed over with no copy, as the raw engine's reads are (`read_at` adds the copy into the
/// caller's memory).
const ACCELFS_STREAM: &str = "AccelFS read_stream";
/// Reads at least this large are also timed through `read_stream` (the cache's bypass size).
const STREAM_FROM_BYTES: usize = 256 << 10;
/// The host file system's row: `NAME syscalls`, NAME from statfs on `--dir`.
fn host_name(fs: &str) -> String {
    format!("{fs} syscalls")
}
const REDIRECT: &str = "AccelFS/redirect";

struct Plan {
    sizes: Vec<usize>,
    iters: usize,
    region: u64,
    appends: usize,
    seq: u64,
    block_size: u32,
    cache: u64,
}

fn size_arg(s: &str) -> anyhow::Result<u64> {
    kura_engine::spec::parse_size(s).map_err(anyhow::Error::msg)
}

/// A latency point from each round's samples: the mean is the median of the rounds' means, the
/// percentiles are over every sample.
fn stats(system: &str, op: &str, bytes: usize, rounds: &[Vec<f64>]) -> LatencyPoint {
    let means: Vec<f64> = rounds
        .iter()
        .filter(|r| !r.is_empty())
        .map(|r| r.iter().sum::<f64>() / r.len() as f64)
        .collect();
    let mut us: Vec<f64> = rounds.concat();
    us.sort_by(f64::total_cmp);
    let pick = |p: f64| {
        us.get(((us.len().max(1) - 1) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let mean_us_rounds = Spread::of(&means);
    LatencyPoint {
        system: system.into(),
        op: op.into(),
        bytes,
        mean_us: mean_us_rounds.median,
        mean_us_rounds,
        p50_us: pick(0.5),
        p99_us: pick(0.99),
    }
}

fn offsets(n: usize, region: u64, bytes: usize, seed: u64) -> Vec<u64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let slots = (region / bytes as u64).max(1);
    (0..n)
        .map(|_| rng.gen_range(0..slots) * bytes as u64)
        .collect()
}

fn progress(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

pub fn run(args: &FsBenchArgs) -> anyhow::Result<()> {
    if let Some(list) = &args.threads.threads {
        return crate::fs_threads::run(&args.dir, &args.threads, &args.run, list);
    }
    let mut plan = Plan {
        sizes: args
            .sizes
            .split(',')
            .map(|s| size_arg(s.trim()).map(|v| v as usize))
            .collect::<anyhow::Result<_>>()?,
        iters: args.iters.max(1),
        region: size_arg(&args.region)?,
        appends: args.appends.max(1),
        seq: size_arg(&args.seq_size)?,
        block_size: u32::try_from(size_arg(&args.block_size)?).context("block size")?,
        cache: size_arg(&args.cache)?,
    };
    if args.run.quick {
        plan.sizes = vec![4096, 65536, 1 << 20];
        plan.iters = plan.iters.min(30);
        plan.region = plan.region.min(16 << 20);
        plan.appends = plan.appends.min(100);
        plan.seq = plan.seq.min(32 << 20);
        plan.cache = plan.cache.min(2 << 20);
    }
    if let Some(&s) = plan
        .sizes
        .iter()
        .find(|&&s| s == 0 || s % 4096 != 0 || s as u64 > plan.region)
    {
        bail!("request size {s} must be a non-zero multiple of 4K no larger than --region");
    }
    let dir = tempfile::Builder::new()
        .prefix("kura-bench-fs")
        .tempdir_in(&args.dir)
        .with_context(|| format!("creating a work directory in {}", args.dir.display()))?;
    let bar = progress((plan.sizes.len() * 3 + 2) as u64);
    let mut report = Report {
        latency: Vec::new(),
        appends_per_s: Vec::new(),
        seq_read_mib_s: Vec::new(),
        seq_bytes: plan.seq,
        cache_budget_bytes: plan.cache,
        cache_peak_bytes: 0,
        peak_rss_bytes: 0,
        block_size: plan.block_size,
        file_system: crate::stats::fs_name(&args.dir),
        appends_rounds: Vec::new(),
        seq_read_rounds: Vec::new(),
        appends_ratio: None,
        notes: Vec::new(),
    };
    let host = host_name(&report.file_system);
    let fs_image = dir.path().join("accelfs.img");
    let redirect_image = dir.path().join("accelfs-redirect.img");
    let raw_image = dir.path().join("raw.img");
    let ext4_file = dir.path().join("ext4.dat");
    let image_bytes = (plan.region + plan.seq) * 5 / 4 + (64 << 20);
    let opts = MountOptions {
        cache_bytes: plan.cache,
        stream_depth: SEQ_DEPTH,
        ..MountOptions::default()
    };

    // Every image is written in full first: reads of never-written extents would not reach the
    // disk, and first writes into them would be host-side allocations.
    bar.set_message("preparing the raw image");
    write_host_file(&raw_image, image_bytes)?;
    let mut raw = FsDevice::new(
        kura_engine::open(&format!("uring:{}", raw_image.display()))?,
        4096,
    )?;
    fill_raw(&mut raw, 0, plan.region.max(plan.seq))?;
    bar.set_message("preparing AccelFS");
    let fs = formatted(&fs_image, image_bytes, "uring", &plan, opts)?;
    let region = fs.open_with("/region", OpenOptions::new().read(true).write(true))?;
    let redirected = if args.no_redirect {
        None
    } else {
        bar.set_message("preparing AccelFS over redirect");
        let rfs = formatted(
            &redirect_image,
            plan.region * 5 / 4 + (64 << 20),
            "redirect",
            &plan,
            opts,
        )?;
        let rregion = rfs.open_with("/region", OpenOptions::new().read(true).write(true))?;
        Some((rfs, rregion))
    };
    bar.set_message("preparing the ext4 file");
    let ext4 = ext4_region(&ext4_file, plan.region)?;

    // Latency: for each size and operation, the systems take turns in rounds so that every one
    // sees the same drift of the shared disk.
    for &bytes in &plan.sizes {
        for (op, seed) in [("read", 1u64), ("write", 2), ("write+sync", 3)] {
            bar.set_message(format!("{op} {}", size_label(bytes)));
            // Per system, each round's samples.
            let mut samples: Vec<Vec<Vec<f64>>> = vec![Vec::new(); 5];
            let per_round = plan.iters.div_ceil(LATENCY_ROUNDS);
            for round in 0..LATENCY_ROUNDS as u64 {
                let offs = offsets(per_round, plan.region, bytes, seed * 100 + round);
                fs.sync()?;
                ext4.sync_all()?;
                drop_page_cache(&ext4_file)?;
                samples[0].push(time_ops(&mut Target::Raw(&mut raw), op, &offs, bytes)?);
                samples[1].push(time_ops(&mut Target::Fs(&region), op, &offs, bytes)?);
                samples[2].push(time_ops(&mut Target::Ext4(&ext4), op, &offs, bytes)?);
                if let Some((rfs, rregion)) = &redirected {
                    rfs.sync()?;
                    // The proxy reads through the page cache: cold reads for it, too.
                    drop_page_cache(&redirect_image)?;
                    samples[3].push(time_ops(&mut Target::Fs(rregion), op, &offs, bytes)?);
                }
                if op == "read" && bytes >= STREAM_FROM_BYTES {
                    samples[4].push(time_ops(&mut Target::FsStream(&region), op, &offs, bytes)?);
                }
            }
            for (system, us) in [RAW, ACCELFS, &host, REDIRECT, ACCELFS_STREAM]
                .into_iter()
                .zip(samples)
            {
                if !us.is_empty() {
                    report.latency.push(stats(system, op, bytes, &us));
                }
            }
            bar.inc(1);
        }
    }

    // fsync'd appends, alternating in rounds; each side's median round is reported.
    bar.set_message("fsync'd appends");
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let per_round = plan.appends.div_ceil(APPEND_ROUNDS);
    for _ in 0..APPEND_ROUNDS {
        rounds[0].push(fs_appends(&fs, per_round)?);
        rounds[1].push(ext4_appends(&dir.path().join("ext4.log"), per_round)?);
        if let Some((rfs, _)) = &redirected {
            rounds[2].push(fs_appends(rfs, per_round)?);
        }
    }
    if let (Some(a), Some(e)) = (rounds.first(), rounds.get(1)) {
        report.appends_ratio = Some(compare(a, e, quotient, None));
    }
    for (system, r) in [ACCELFS, &host, REDIRECT].into_iter().zip(rounds) {
        if !r.is_empty() {
            let spread = Spread::of(&r);
            report.appends_per_s.push((system.into(), spread.median));
            report.appends_rounds.push((system.into(), spread));
        }
    }
    bar.inc(1);

    // Sequential read, alternating raw and AccelFS (A B A B), median of three rounds each.
    bar.set_message("sequential read");
    let seq = fs.create("/sequential")?;
    fill_file(&seq, plan.seq)?;
    fs.sync()?;
    let mut raw_side = |_| raw_seq_read(&mut raw, plan.seq);
    let mut stream_side = |_| fs_seq_read(&fs, "/sequential", plan.seq);
    let mut copy_side = |_| fs_seq_read_at(&fs, "/sequential", plan.seq);
    let seq_rounds = crate::stats::interleave(
        SEQ_ROUNDS,
        &mut [&mut raw_side, &mut stream_side, &mut copy_side],
    )?;
    for (name, r) in [
        RAW.to_string(),
        ACCELFS.to_string(),
        format!("{ACCELFS} read_at"),
    ]
    .into_iter()
    .zip(seq_rounds)
    {
        let spread = Spread::of(&r);
        report.seq_read_mib_s.push((name.clone(), spread.median));
        report.seq_read_rounds.push((name, spread));
    }
    bar.inc(1);
    report.cache_peak_bytes = fs.statfs().cache.peak_bytes;
    drop((region, seq, raw, ext4));
    fs.unmount()?;
    if let Some((rfs, rregion)) = redirected {
        drop(rregion);
        rfs.unmount()?;
    }
    bar.finish_and_clear();

    report.peak_rss_bytes = peak_rss();
    report.notes.push(format!(
        "AccelFS block size {} B; reads are cold (cache budget {} B, region {} B at random offsets; page cache dropped for the {} file)",
        plan.block_size, plan.cache, plan.region, report.file_system
    ));
    report.notes.push(
        "AccelFS write = write into the buffer cache below 256 KiB (bypass above); host write = buffered pwrite; raw write = device write. write+sync adds fdatasync (AccelFS File::sync_data: an overwrite needs no journal commit) / fdatasync / flush. Appends use File::sync_all (a journal commit: the size changes) against the host file's fdatasync".into(),
    );
    print_report(&report);
    args.run.output.emit("fs", PLOT, &report)
}

pub(crate) fn write_host_file(path: &Path, bytes: u64) -> anyhow::Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let chunk = vec![0u8; 8 << 20];
    let mut at = 0;
    while at < bytes {
        let n = (chunk.len() as u64).min(bytes - at) as usize;
        f.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    f.sync_all()?;
    drop(f);
    drop_page_cache(path)
}

fn fill_raw(raw: &mut FsDevice, first_byte: u64, bytes: u64) -> anyhow::Result<()> {
    let chunk = 16u64 << 20;
    let mut at = 0;
    while at < bytes {
        let n = chunk.min(bytes - at);
        let ops = (0..n.div_ceil(1 << 20))
            .map(|i| {
                let len = (1u64 << 20).min(n - i * (1 << 20)) as usize;
                let mut buf = IoBuf::zeroed(len);
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(j, b)| *b = (j as u8) ^ 0x5a);
                BatchOp {
                    write: true,
                    block: (first_byte + at + i * (1 << 20)) / 4096,
                    buf,
                }
            })
            .collect();
        raw.batch(ops)?;
        at += n;
    }
    raw.flush()?;
    Ok(())
}

/// Rounds per latency point; the systems take turns within each.
const LATENCY_ROUNDS: usize = 4;

/// A host image written in full, formatted with AccelFS, mounted through `kind` (`uring` or
/// `redirect`), with `/region` filled.
fn formatted(
    path: &Path,
    bytes: u64,
    kind: &str,
    plan: &Plan,
    opts: MountOptions,
) -> anyhow::Result<FileSystem> {
    write_host_file(path, bytes)?;
    let fs = FileSystem::format(
        kura_engine::open(&format!("{kind}:{}", path.display()))?,
        MkfsOptions {
            block_size: plan.block_size,
            inodes: None,
        },
        opts,
    )?;
    fill_file(&fs.create("/region")?, plan.region)?;
    fs.sync()?;
    Ok(fs)
}

/// The ext4 peer's file, written in full and made durable.
fn ext4_region(path: &Path, bytes: u64) -> anyhow::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    let chunk: Vec<u8> = (0..(8usize << 20)).map(|j| (j as u8) ^ 0xa5).collect();
    let mut at = 0;
    while at < bytes {
        let n = (chunk.len() as u64).min(bytes - at) as usize;
        f.write_all_at(&chunk[..n], at)?;
        at += n as u64;
    }
    f.sync_all()?;
    Ok(f)
}

/// One system under test.
enum Target<'a> {
    /// The engine under AccelFS: one command per operation, flush for write+sync.
    Raw(&'a mut FsDevice),
    /// A file on AccelFS: `read_at` / `write_at` / `sync_data`.
    Fs(&'a kura_accelfs::File),
    /// A file on AccelFS read with `read_stream` (reads only).
    FsStream(&'a kura_accelfs::File),
    /// A file on the host's ext4: `pread` / `pwrite` / `fdatasync`.
    Ext4(&'a std::fs::File),
}

/// Times `op` at each offset; microseconds per operation.
fn time_ops(t: &mut Target<'_>, op: &str, offs: &[u64], bytes: usize) -> anyhow::Result<Vec<f64>> {
    let data = vec![0x3cu8; bytes];
    let mut buf = vec![0u8; bytes];
    let mut us = Vec::with_capacity(offs.len());
    for &off in offs {
        let start = Instant::now();
        match t {
            Target::Raw(raw) => {
                let mut io = kura_engine::BufferPool::global()
                    .alloc(bytes)
                    .unwrap_or_else(|_| IoBuf::zeroed(bytes));
                if op != "read" {
                    io.copy_from_slice(&data);
                }
                raw.batch(vec![BatchOp {
                    write: op != "read",
                    block: off / 4096,
                    buf: io,
                }])?;
                if op == "write+sync" {
                    raw.flush()?;
                }
            }
            Target::Fs(f) => match op {
                "read" => f.read_exact_at(off, &mut buf)?,
                "write" => {
                    f.write_at(off, &data)?;
                }
                _ => {
                    f.write_at(off, &data)?;
                    f.sync_data()?;
                }
            },
            Target::FsStream(f) => {
                anyhow::ensure!(op == "read", "read_stream times reads only, not {op}");
                let mut seen = 0usize;
                let got = f.read_stream(off, bytes as u64, |piece| seen += piece.len())?;
                anyhow::ensure!(
                    got == bytes as u64 && seen == bytes,
                    "read_stream at {off} delivered {seen} of {bytes} bytes"
                );
            }
            Target::Ext4(f) => match op {
                "read" => f.read_exact_at(&mut buf, off)?,
                "write" => f.write_all_at(&data, off)?,
                _ => {
                    f.write_all_at(&data, off)?;
                    f.sync_data()?;
                }
            },
        }
        us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    Ok(us)
}

fn fill_file(f: &kura_accelfs::File, bytes: u64) -> anyhow::Result<()> {
    let chunk: Vec<u8> = (0..(8usize << 20)).map(|j| (j as u8) ^ 0xa5).collect();
    let mut at = 0;
    while at < bytes {
        let n = (chunk.len() as u64).min(bytes - at) as usize;
        f.write_at(at, &chunk[..n])?;
        at += n as u64;
    }
    Ok(())
}

const APPEND_ROUNDS: usize = 5;
/// Rounds of the sequential read, the systems taking turns.
const SEQ_ROUNDS: usize = 3;

fn fs_appends(fs: &FileSystem, n: usize) -> anyhow::Result<f64> {
    let mut f = fs.create("/appends")?;
    let block = vec![0x11u8; 4096];
    let t = Instant::now();
    for _ in 0..n {
        f.append(&block)?;
        f.sync_all()?;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    drop(f);
    fs.remove_file("/appends")?;
    Ok(rate)
}

/// Commands in flight for the sequential reads, on both sides.
const SEQ_DEPTH: usize = 32;

/// The whole file through `File::read_stream`: 1 MiB commands, 32 in flight, no copy.
fn fs_seq_read(fs: &FileSystem, path: &str, bytes: u64) -> anyhow::Result<f64> {
    let f = fs.open(path)?;
    let mut sum = 0u64;
    let t = Instant::now();
    let n = f.read_stream(0, bytes, |chunk| sum += u64::from(chunk[chunk.len() - 1]))?;
    let secs = t.elapsed().as_secs_f64();
    if n != bytes {
        bail!("sequential file ended at {n} of {bytes} bytes");
    }
    std::hint::black_box(sum);
    Ok(bytes as f64 / 1048576.0 / secs)
}

/// The whole file through `read_at` with 16 MiB calls into a caller's buffer (one copy).
fn fs_seq_read_at(fs: &FileSystem, path: &str, bytes: u64) -> anyhow::Result<f64> {
    let f = fs.open(path)?;
    let mut buf = vec![0u8; 16 << 20];
    let t = Instant::now();
    let mut at = 0;
    while at < bytes {
        let n = f.read_at(at, &mut buf)?;
        if n == 0 {
            bail!("sequential file ended at {at} of {bytes} bytes");
        }
        at += n as u64;
    }
    Ok(bytes as f64 / 1048576.0 / t.elapsed().as_secs_f64())
}

/// The same stream on the raw engine: 1 MiB commands, 32 in flight, each handed over in order.
fn raw_seq_read(raw: &mut FsDevice, bytes: u64) -> anyhow::Result<f64> {
    let pieces: Vec<StreamPart> = (0..bytes.div_ceil(1 << 20))
        .map(|i| StreamPart::Device {
            block: i * (1 << 20) / 4096,
            bytes: (1u64 << 20).min(bytes - i * (1 << 20)) as usize,
        })
        .collect();
    let mut sum = 0u64;
    let t = Instant::now();
    raw.stream_read(&pieces, SEQ_DEPTH, |chunk| {
        sum += u64::from(chunk[chunk.len() - 1])
    })?;
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    Ok(bytes as f64 / 1048576.0 / secs)
}

fn ext4_appends(path: &Path, n: usize) -> anyhow::Result<f64> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
    let block = vec![0x11u8; 4096];
    let t = Instant::now();
    for _ in 0..n {
        std::io::Write::write_all(&mut f, &block)?;
        f.sync_data()?;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    drop(f);
    std::fs::remove_file(path)?;
    Ok(rate)
}

/// Peak resident set of this process (VmHWM), in bytes.
pub(crate) fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn find(r: &Report, system: &str, op: &str, bytes: usize) -> Option<f64> {
    r.latency
        .iter()
        .find(|p| p.system == system && p.op == op && p.bytes == bytes)
        .map(|p| p.mean_us)
}

fn size_label(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else {
        format!("{}K", b >> 10)
    }
}

fn print_report(r: &Report) {
    let host = host_name(&r.file_system);
    let systems = [RAW, ACCELFS, host.as_str(), REDIRECT];
    let mut sizes: Vec<usize> = r.latency.iter().map(|p| p.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    println!("latency, mean µs: the median of {LATENCY_ROUNDS} interleaved rounds' means (p99 in the JSON)");
    println!(
        "{:<11} {:>5} {:>11} {:>11} {:>13} {:>17} {:>10} {:>10}",
        "op", "size", RAW, ACCELFS, host, REDIRECT, "fs/raw", "fs/host"
    );
    for op in ["read", "write", "write+sync"] {
        for &b in &sizes {
            let cell = |s: &str| find(r, s, op, b).map_or("-".into(), |v| format!("{v:.1}"));
            let ratio = |a: &str, c: &str| match (find(r, a, op, b), find(r, c, op, b)) {
                (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
                _ => "-".into(),
            };
            println!(
                "{:<11} {:>5} {:>11} {:>11} {:>13} {:>17} {:>10} {:>10}",
                op,
                size_label(b),
                cell(systems[0]),
                cell(systems[1]),
                cell(systems[2]),
                cell(systems[3]),
                ratio(ACCELFS, RAW),
                ratio(ACCELFS, &host)
            );
        }
    }
    for &b in &sizes {
        if let (Some(s), Some(raw)) = (find(r, ACCELFS_STREAM, "read", b), find(r, RAW, "read", b))
        {
            println!(
                "read {:>4} through read_stream (no copy into the caller's memory): {s:.1} µs = {:.2}x the raw engine",
                size_label(b),
                s / raw
            );
        }
    }
    println!();
    for (name, rate) in &r.appends_rounds {
        println!("fsync'd 4 KiB appends/s  {name:<17} {:>26}", rate.show(0));
    }
    if let Some(c) = &r.appends_ratio {
        println!(
            "  AccelFS / {} = {}x (per round pair)",
            r.file_system,
            c.ratio.show(2)
        );
    }
    for (name, bw) in &r.seq_read_rounds {
        println!(
            "sequential read of {} MiB  {name:<11} {:>26} MiB/s",
            r.seq_bytes >> 20,
            bw.show(0)
        );
    }
    let get = |v: &[(String, f64)], s: &str| v.iter().find(|(n, _)| n == s).map(|(_, x)| *x);
    if let (Some(a), Some(raw)) = (get(&r.seq_read_mib_s, ACCELFS), get(&r.seq_read_mib_s, RAW)) {
        println!(
            "  AccelFS (read_stream) / raw engine = {:.0}% (medians)",
            a / raw * 100.0
        );
    }
    println!(
        "cache: peak {} KiB of a {} KiB budget; process peak RSS {} MiB",
        r.cache_peak_bytes >> 10,
        r.cache_budget_bytes >> 10,
        r.peak_rss_bytes >> 20
    );
    for n in &r.notes {
        println!("note: {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_point_is_the_median_of_its_rounds_means() {
        // Round means 2, 10 and 4: the median is 4, whatever the pooled mean (5.33) says.
        let p = stats(
            "AccelFS",
            "read",
            4096,
            &[vec![1.0, 3.0], vec![10.0], vec![4.0, 4.0, 4.0], vec![]],
        );
        assert_eq!(p.mean_us, 4.0);
        assert_eq!(
            (
                p.mean_us_rounds.min,
                p.mean_us_rounds.max,
                p.mean_us_rounds.rounds
            ),
            (2.0, 10.0, 3)
        );
        assert_eq!((p.p50_us, p.p99_us), (4.0, 10.0));
        assert!(stats("x", "read", 1, &[]).p99_us.is_nan());
    }
}
