//! `kura bench io`: the paper's Fig. 2 and Fig. 5 on this machine, with fio as the peer.
//!
//! Sections, each on one image file that is filled with written data first (ext4 answers reads of
//! unwritten extents without touching the disk, which would flatter every number):
//! 1. tight-loop latency (queue depth 1) of read, write and write+flush by size, per backend;
//! 2. 4 KiB random read and write IOPS by queue depth;
//! 3. 1 MiB sequential read and write bandwidth;
//! 4. the null device's commands per second through the full interface;
//! 5. fio on the same file with the same patterns, and kura/fio ratios.
//!
//! The page cache is dropped for the image before every point, so the kernel-mediated backends
//! (`sync`, `redirect`) read from the disk like the direct path does.

pub mod fio;
pub mod plot;
pub mod workload;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_engine::BlockDevice;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use workload::{Job, Outcome, Pattern};

/// Backends `--backends` accepts.
pub const BACKENDS: &[&str] = &["uring", "sync", "redirect", "redirect-modeled", "null"];

/// Arguments of `kura bench io`.
#[derive(Debug, Clone, clap::Args)]
pub struct IoArgs {
    /// Directory for the test image (must allow O_DIRECT: not tmpfs).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Image size (default 1G, or 256M with --quick).
    #[arg(long)]
    pub size: Option<String>,
    /// Comma-separated backends: uring, sync, redirect, redirect-modeled, null.
    #[arg(long, default_value = "uring,sync,redirect,redirect-modeled,null")]
    pub backends: String,
    /// Seconds per measured point (default 1, or 0.25 with --quick).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// A short run (under a minute): fewer sizes and depths, shorter points.
    #[arg(long)]
    pub quick: bool,
    /// Write every figure as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a PNG plot to this file (default: next to --json, else bench-out/io.png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Do not run fio even when it is installed.
    #[arg(long)]
    pub no_fio: bool,
    /// Keep the test image afterwards.
    #[arg(long)]
    pub keep_image: bool,
}

/// One latency point.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyPoint {
    pub backend: String,
    pub op: String,
    pub bytes: usize,
    pub ops: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub modeled: bool,
}

/// One throughput point.
#[derive(Debug, Clone, Serialize)]
pub struct ThroughputPoint {
    pub backend: String,
    pub pattern: String,
    pub bytes: usize,
    pub depth: usize,
    pub iops: f64,
    pub mib_per_s: f64,
    pub mean_us: f64,
    pub modeled: bool,
}

/// kura against fio, or against another backend, for one figure.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub what: String,
    pub kura: f64,
    pub peer: f64,
    pub ratio: f64,
    pub target: Option<String>,
    pub met: Option<bool>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub date_unix: u64,
    pub kernel: String,
    pub cpu: String,
    pub image: String,
    pub image_bytes: u64,
    pub seconds_per_point: f64,
    pub devices: Vec<(String, String)>,
    pub latency: Vec<LatencyPoint>,
    pub throughput: Vec<ThroughputPoint>,
    pub null_cmds_per_sec: Option<f64>,
    pub fio_status: String,
    pub fio: Vec<fio::FioResult>,
    pub ratios: Vec<Ratio>,
}

struct Plan {
    latency_sizes: Vec<usize>,
    depths: Vec<usize>,
    point: Duration,
}

/// Runs `kura bench io`.
pub fn run(args: &IoArgs) -> anyhow::Result<()> {
    if std::env::var_os("KURA_POOL_MIB").is_none() {
        // Deep queues of 1 MiB buffers need more than the default arena; set before first use.
        std::env::set_var("KURA_POOL_MIB", "512");
    }
    let backends: Vec<&str> = args
        .backends
        .split(',')
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .collect();
    for b in &backends {
        if !BACKENDS.contains(b) {
            bail!("unknown backend `{b}`; choose from {}", BACKENDS.join(", "));
        }
    }
    let size = kura_engine::spec::parse_size(args.size.as_deref().unwrap_or(if args.quick {
        "256M"
    } else {
        "1G"
    }))
    .map_err(anyhow::Error::msg)?;
    if size < (16 << 20) {
        bail!("--size must be at least 16M");
    }
    let seconds = args.seconds.unwrap_or(if args.quick { 0.25 } else { 1.0 });
    if !(0.01..=600.0).contains(&seconds) {
        bail!("--seconds must be between 0.01 and 600");
    }
    let plan = Plan {
        latency_sizes: if args.quick {
            vec![4 << 10, 64 << 10, 1 << 20]
        } else {
            vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
        },
        depths: if args.quick {
            vec![1, 8, 32, 128]
        } else {
            vec![1, 2, 4, 8, 16, 32, 64, 128]
        },
        point: Duration::from_secs_f64(seconds),
    };
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let image = args.dir.join("kura-bench-io.img");
    let report = measure(args, &backends, &plan, &image, size);
    if !args.keep_image {
        let _ = std::fs::remove_file(&image);
    }
    let report = report?;
    print_report(&report);
    let json_path = args.json.clone();
    if let Some(path) = &json_path {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nJSON: {}", path.display());
    }
    let png = args.plot.clone().unwrap_or_else(|| match &json_path {
        Some(j) => j.with_extension("png"),
        None => PathBuf::from("bench-out/io.png"),
    });
    match plot::render(&report, &png) {
        Ok(()) => println!("plot: {}", png.display()),
        Err(e) => println!("plot skipped: {e}"),
    }
    Ok(())
}

fn spec_for(backend: &str, image: &Path) -> String {
    let p = image.display();
    match backend {
        "uring" => format!("uring:{p}"),
        "sync" => format!("sync:{p}"),
        "redirect" => format!("redirect:{p}"),
        "redirect-modeled" => format!("redirect:{p}?link=aurora"),
        _ => "null:1G".to_string(),
    }
}

fn bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

fn measure(
    args: &IoArgs,
    backends: &[&str],
    plan: &Plan,
    image: &Path,
    size: u64,
) -> anyhow::Result<Report> {
    let file_backends: Vec<&str> = backends.iter().copied().filter(|b| *b != "null").collect();
    let fio_bin = if args.no_fio { None } else { fio::find() };
    let lat_points = file_backends.len() * plan.latency_sizes.len() * 3;
    let tput_points = file_backends.len() * plan.depths.len() * 2 + file_backends.len() * 2;
    let fio_points = if fio_bin.is_some() {
        plan.latency_sizes.len() + plan.depths.len() * 2 + 2
    } else {
        0
    };
    let progress = bar((lat_points + tput_points + fio_points + 2) as u64);

    progress.set_message("filling the image with written data");
    fill_image(image, size)?;
    progress.inc(1);

    let mut report = Report {
        date_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        cpu: cpu_model(),
        image: image.display().to_string(),
        image_bytes: size,
        seconds_per_point: plan.point.as_secs_f64(),
        devices: Vec::new(),
        latency: Vec::new(),
        throughput: Vec::new(),
        null_cmds_per_sec: None,
        fio_status: String::new(),
        fio: Vec::new(),
        ratios: Vec::new(),
    };

    for &backend in &file_backends {
        let spec = spec_for(backend, image);
        let mut dev = kura_engine::open(&spec).with_context(|| format!("opening {spec}"))?;
        let modeled = backend == "redirect-modeled";
        report.devices.push((backend.to_string(), dev.describe()));
        // The modeled link costs ~43 µs a call: fewer ops keep the run short without changing the mean much.
        let point = if modeled {
            plan.point.min(Duration::from_millis(500))
        } else {
            plan.point
        };
        for pattern in [
            Pattern::RandRead,
            Pattern::RandWrite,
            Pattern::RandWriteFlush,
        ] {
            for &bytes in &plan.latency_sizes {
                progress.set_message(format!("{backend} {} {}K QD1", pattern.name(), bytes >> 10));
                let out = point_run(&mut *dev, image, pattern, bytes, 1, point, size)?;
                report.latency.push(LatencyPoint {
                    backend: backend.to_string(),
                    op: pattern.name().to_string(),
                    bytes,
                    ops: out.ops(),
                    mean_us: out.mean_us(),
                    p50_us: out.percentile_us(50.0),
                    p99_us: out.percentile_us(99.0),
                    modeled,
                });
                progress.inc(1);
            }
        }
        let depths: Vec<usize> = if backend == "uring" {
            plan.depths.clone()
        } else {
            vec![1, 32]
        };
        for pattern in [Pattern::RandRead, Pattern::RandWrite] {
            for &depth in &depths {
                progress.set_message(format!("{backend} 4K rand{} QD{depth}", pattern.name()));
                let out = point_run(&mut *dev, image, pattern, 4096, depth, point, size)?;
                report
                    .throughput
                    .push(tput(backend, pattern, 4096, depth, &out, modeled));
                progress.inc(1);
            }
        }
        for pattern in [Pattern::SeqRead, Pattern::SeqWrite] {
            progress.set_message(format!("{backend} 1M {} QD8", pattern.name()));
            let out = point_run(&mut *dev, image, pattern, 1 << 20, 8, point, size)?;
            report
                .throughput
                .push(tput(backend, pattern, 1 << 20, 8, &out, modeled));
            progress.inc(1);
        }
        if backend != "uring" {
            progress.inc(((plan.depths.len() - 2) * 2) as u64);
        }
    }

    if backends.contains(&"null") {
        progress.set_message("null device commands/s");
        let mut dev = kura_engine::open("null:1G")?;
        report.devices.push(("null".into(), dev.describe()));
        let job = Job {
            pattern: Pattern::RandRead,
            bytes: 4096,
            depth: 128,
            duration: plan.point.max(Duration::from_millis(500)),
            max_ops: u64::MAX,
            seed: 9,
        };
        report.null_cmds_per_sec = Some(workload::run(&mut *dev, &job)?.iops());
    }
    progress.inc(1);

    match &fio_bin {
        None if args.no_fio => {
            report.fio_status = "fio: not run (--no-fio) — ratios skipped".into()
        }
        None => {
            report.fio_status = "fio: not installed — ratios skipped (apt-get install fio)".into()
        }
        Some(bin) => {
            report.fio_status = format!("fio: {}", fio_version(bin));
            let mut jobs: Vec<(&str, usize, usize)> = plan
                .latency_sizes
                .iter()
                .map(|&b| ("randread", b, 1))
                .collect();
            for &d in &plan.depths {
                jobs.push(("randread", 4096, d));
                jobs.push(("randwrite", 4096, d));
            }
            jobs.push(("read", 1 << 20, 8));
            jobs.push(("write", 1 << 20, 8));
            for (rw, bytes, depth) in jobs {
                progress.set_message(format!("fio {rw} {}K QD{depth}", bytes >> 10));
                drop_page_cache(image)?;
                if !(rw == "randread"
                    && bytes == 4096
                    && depth == 1
                    && report
                        .fio
                        .iter()
                        .any(|f| f.rw == "randread" && f.bytes == 4096 && f.depth == 1))
                {
                    report.fio.push(fio::run(
                        bin,
                        image,
                        rw,
                        bytes,
                        depth,
                        plan.point,
                        fio_budget(size, bytes),
                    )?);
                }
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    report.ratios = ratios(&report);
    Ok(report)
}

fn tput(
    backend: &str,
    pattern: Pattern,
    bytes: usize,
    depth: usize,
    out: &Outcome,
    modeled: bool,
) -> ThroughputPoint {
    ThroughputPoint {
        backend: backend.to_string(),
        pattern: pattern.name().to_string(),
        bytes,
        depth,
        iops: out.iops(),
        mib_per_s: out.mib_per_s(),
        mean_us: out.mean_us(),
        modeled,
    }
}

/// One measured point, with the image evicted from the page cache first and reads bounded to
/// half the image so that a buffered backend cannot serve them from memory it filled itself.
fn point_run(
    dev: &mut dyn BlockDevice,
    image: &Path,
    pattern: Pattern,
    bytes: usize,
    depth: usize,
    point: Duration,
    size: u64,
) -> anyhow::Result<Outcome> {
    drop_page_cache(image)?;
    let max_ops = fio_budget(size, bytes) / bytes as u64;
    let job = Job {
        pattern,
        bytes,
        depth,
        duration: point,
        max_ops,
        seed: bytes as u64 ^ depth as u64,
    };
    workload::run(dev, &job)
}

/// Bytes one point may move: half the image (at least 64 requests), for kura and fio alike, so a
/// buffered backend cannot re-read what it cached and both sides do the same work.
fn fio_budget(size: u64, bytes: usize) -> u64 {
    (size / 2 / bytes as u64).max(64) * bytes as u64
}

/// Creates the image and writes all of it (pseudo-random data), then flushes.
fn fill_image(image: &Path, size: u64) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(image);
    let mut dev = kura_engine::open(&format!("uring:{}?size={size}", image.display()))
        .or_else(|_| kura_engine::open(&format!("sync:{}?size={size}", image.display())))
        .with_context(|| format!("creating {}", image.display()))?;
    let job = Job {
        pattern: Pattern::SeqWrite,
        bytes: 1 << 20,
        depth: 8,
        duration: Duration::from_secs(3600),
        max_ops: size >> 20,
        seed: 5,
    };
    let out = workload::run(&mut *dev, &job)?;
    if out.bytes < size & !((1 << 20) - 1) {
        bail!("filling the image wrote {} of {size} bytes", out.bytes);
    }
    kura_engine::BlockingIo::flush_all(&mut *dev)?;
    Ok(())
}

/// Evicts the image from the page cache (no root needed).
pub fn drop_page_cache(path: &Path) -> anyhow::Result<()> {
    kura_engine::backend::file::drop_page_cache(path)
        .with_context(|| format!("evicting {} from the page cache", path.display()))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn fio_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "unknown version".into())
}

fn find_tput<'a>(
    r: &'a Report,
    backend: &str,
    pattern: &str,
    bytes: usize,
    depth: usize,
) -> Option<&'a ThroughputPoint> {
    r.throughput.iter().find(|t| {
        t.backend == backend && t.pattern == pattern && t.bytes == bytes && t.depth == depth
    })
}

fn ratio(what: String, kura: f64, peer: f64, target: Option<(&str, bool)>) -> Ratio {
    Ratio {
        what,
        kura,
        peer,
        ratio: if peer > 0.0 { kura / peer } else { 0.0 },
        target: target.map(|t| t.0.to_string()),
        met: target.map(|t| t.1),
    }
}

/// kura/fio ratios and the targets, from what was measured.
fn ratios(r: &Report) -> Vec<Ratio> {
    let mut out = Vec::new();
    for f in &r.fio {
        let (pattern, kura) = match f.rw.as_str() {
            "randread" if f.depth == 1 => {
                if let Some(l) = r
                    .latency
                    .iter()
                    .find(|l| l.backend == "uring" && l.op == "read" && l.bytes == f.bytes)
                {
                    out.push(ratio(
                        format!(
                            "QD1 {}K read latency µs, uring vs fio (lower is better)",
                            f.bytes >> 10
                        ),
                        l.mean_us,
                        f.mean_lat_us,
                        None,
                    ));
                }
                ("read", find_tput(r, "uring", "read", f.bytes, 1))
            }
            "randread" => ("read", find_tput(r, "uring", "read", f.bytes, f.depth)),
            "randwrite" => ("write", find_tput(r, "uring", "write", f.bytes, f.depth)),
            "read" => (
                "seqread",
                find_tput(r, "uring", "seqread", f.bytes, f.depth),
            ),
            _ => (
                "seqwrite",
                find_tput(r, "uring", "seqwrite", f.bytes, f.depth),
            ),
        };
        let Some(k) = kura else { continue };
        if f.bytes >= 1 << 20 {
            out.push(ratio(
                format!("1M {pattern} QD{} MiB/s, uring/fio", f.depth),
                k.mib_per_s,
                f.mib_per_s,
                None,
            ));
        } else {
            let target = (pattern == "read" && f.depth == 32 && f.bytes == 4096)
                .then_some(("≥ 1.0", k.iops >= f.iops));
            out.push(ratio(
                format!("4K rand{pattern} QD{} IOPS, uring/fio", f.depth),
                k.iops,
                f.iops,
                target,
            ));
        }
    }
    let lat = |b: &str| {
        r.latency
            .iter()
            .find(|l| l.backend == b && l.op == "read" && l.bytes == 4096)
    };
    if let (Some(u), Some(d)) = (lat("uring"), lat("redirect")) {
        let lower = 1.0 - u.mean_us / d.mean_us;
        out.push(Ratio {
            what: "QD1 4K read latency, uring lower than redirect by".into(),
            kura: u.mean_us,
            peer: d.mean_us,
            ratio: lower,
            target: Some("≥ 50 %".into()),
            met: Some(lower >= 0.5),
        });
    }
    if let (Some(u), Some(d)) = (lat("uring"), lat("redirect-modeled")) {
        out.push(Ratio {
            what: "QD1 4K read latency, uring lower than redirect (modeled Aurora link) by".into(),
            kura: u.mean_us,
            peer: d.mean_us,
            ratio: 1.0 - u.mean_us / d.mean_us,
            target: None,
            met: None,
        });
    }
    if let Some(n) = r.null_cmds_per_sec {
        out.push(Ratio {
            what: "null device commands/s on one core (millions)".into(),
            kura: n / 1e6,
            peer: 5.0,
            ratio: n / 5e6,
            target: Some("≥ 5 M/s".into()),
            met: Some(n >= 5e6),
        });
    }
    out
}

fn print_report(r: &Report) {
    println!(
        "kura bench io — {} ({} MiB image, {:.2} s per point), kernel {}, {}",
        r.image,
        r.image_bytes >> 20,
        r.seconds_per_point,
        r.kernel,
        r.cpu
    );
    for (name, d) in &r.devices {
        println!("  {name:<17} {d}");
    }
    println!("\nQD1 latency (µs), page cache dropped before each point:");
    println!(
        "{:<26} {:<12} {:>8} {:>8} {:>10} {:>10} {:>10}",
        "backend", "op", "size", "ops", "mean", "p50", "p99"
    );
    for l in &r.latency {
        let name = if l.modeled {
            format!("{} (modeled)", l.backend)
        } else {
            l.backend.clone()
        };
        println!(
            "{name:<26} {:<12} {:>7}K {:>8} {:>10.1} {:>10.1} {:>10.1}",
            l.op,
            l.bytes >> 10,
            l.ops,
            l.mean_us,
            l.p50_us,
            l.p99_us
        );
    }
    println!("\nThroughput:");
    println!(
        "{:<26} {:<10} {:>8} {:>5} {:>12} {:>10} {:>10}",
        "backend", "pattern", "size", "QD", "IOPS", "MiB/s", "mean µs"
    );
    for t in &r.throughput {
        let name = if t.modeled {
            format!("{} (modeled)", t.backend)
        } else {
            t.backend.clone()
        };
        println!(
            "{name:<26} {:<10} {:>7}K {:>5} {:>12.0} {:>10.1} {:>10.1}",
            t.pattern,
            t.bytes >> 10,
            t.depth,
            t.iops,
            t.mib_per_s,
            t.mean_us
        );
    }
    if let Some(n) = r.null_cmds_per_sec {
        println!(
            "\nnull device: {:.2} M commands/s on one core (4 KiB reads, QD 128, full interface)",
            n / 1e6
        );
    }
    println!("\n{}", r.fio_status);
    for f in &r.fio {
        println!(
            "  fio {:<10} {:>7}K QD{:<4} {:>10.0} IOPS {:>9.1} MiB/s {:>9.1} µs mean",
            f.rw,
            f.bytes >> 10,
            f.depth,
            f.iops,
            f.mib_per_s,
            f.mean_lat_us
        );
    }
    println!("\nRatios and targets:");
    for x in &r.ratios {
        let verdict = match (&x.target, x.met) {
            (Some(t), Some(true)) => format!("target {t}: met"),
            (Some(t), Some(false)) => format!("target {t}: NOT met"),
            _ => String::new(),
        };
        let value = if x.what.contains("lower than") {
            format!("{:.1} %", x.ratio * 100.0)
        } else {
            format!("{:.2}", x.ratio)
        };
        println!(
            "  {:<72} {:>10.2} vs {:>10.2} → {value:>8}  {verdict}",
            x.what, x.kura, x.peer
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_run_writes_json_with_every_section() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("io.json");
        let args = IoArgs {
            dir: dir.path().to_path_buf(),
            size: Some("16M".into()),
            backends: "sync,null".into(),
            seconds: Some(0.02),
            quick: true,
            json: Some(json.clone()),
            plot: Some(dir.path().join("io.png")),
            no_fio: true,
            keep_image: false,
        };
        run(&args).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(
            v["latency"].as_array().unwrap().len(),
            9,
            "3 ops × 3 sizes for one backend"
        );
        assert!(v["throughput"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["iops"].as_f64().unwrap() > 0.0));
        assert!(v["null_cmds_per_sec"].as_f64().unwrap() > 0.0);
        assert!(v["fio_status"].as_str().unwrap().contains("--no-fio"));
        assert!(
            !dir.path().join("kura-bench-io.img").exists(),
            "image removed"
        );
    }

    #[test]
    fn unknown_backends_and_bad_sizes_are_clear_errors() {
        let args = IoArgs {
            dir: std::env::temp_dir(),
            size: None,
            backends: "uring,spdk".into(),
            seconds: None,
            quick: true,
            json: None,
            plot: None,
            no_fio: true,
            keep_image: false,
        };
        assert!(run(&args)
            .unwrap_err()
            .to_string()
            .contains("unknown backend `spdk`"));
        let args = IoArgs {
            backends: "null".into(),
            size: Some("1M".into()),
            ..args
        };
        assert!(run(&args).unwrap_err().to_string().contains("at least 16M"));
    }
}
