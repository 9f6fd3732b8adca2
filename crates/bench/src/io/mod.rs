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
//!
//! With `--device`, sections 1–3 run on the named devices instead (see [`target`]): each one's
//! measured region is written through it first, and the first device is compared with the rest
//! (the user-space NVMe driver against passthrough and the block layer, for one).

pub mod fio;
pub mod plot;
pub mod target;
pub mod workload;

use crate::output::{plot_help, RunArgs};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_engine::BlockDevice;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use target::Target;
use workload::{Job, Outcome, Pattern};

/// Backends `--backends` accepts.
pub const BACKENDS: &[&str] = &["uring", "sync", "redirect", "redirect-modeled", "null"];

/// Opens a device spec; the CLI passes its own so `--device` takes every kind it knows
/// (`nvme:`, `nvme-pt:`, virtual drives, NBD exports).
pub type Opener<'a> = &'a dyn Fn(&str) -> anyhow::Result<Box<dyn BlockDevice>>;

/// Arguments of `kura bench io`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "By default every backend runs over one temp image, and fio runs on the same \
file as the peer. With --device the named devices are measured instead, and compared with each \
other (the first against the rest): for example, an NVMe namespace through the user-space driver, \
io_uring passthrough and the block layer:\n\n  kura bench io --overwrite --rebind \\\n    \
--device nvme:0000:00:04.0 --device nvme-pt:/dev/ng0n1 --device uring:/dev/nvme0n1\n\n\
--device writes over the start of each device (--size of it, default 1G): its data there is lost.",
    mut_arg("quick", |a| a.help("A short run (under a minute): fewer sizes and depths, shorter points")),
    mut_arg("plot", |a| plot_help(a, "io"))
)]
pub struct IoArgs {
    /// Directory for the test image (must allow O_DIRECT: not tmpfs).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Image size; with --device, how much of each device is used (default 1G, or 256M with
    /// --quick; at most the device).
    #[arg(long)]
    pub size: Option<String>,
    /// Comma-separated backends over the temp image: uring, sync, redirect, redirect-modeled, null.
    #[arg(long, default_value = "uring,sync,redirect,redirect-modeled,null")]
    pub backends: String,
    /// Measure this device instead of the temp image (repeatable; any spec, see `kura specs`).
    /// Its data in the measured region is overwritten.
    #[arg(long = "device", value_name = "SPEC", conflicts_with = "backends")]
    pub devices: Vec<String>,
    /// Confirms that --device may overwrite data on the devices.
    #[arg(long)]
    pub overwrite: bool,
    /// For each `nvme:BDF` device: give the controller to vfio-pci for its turn and back to the
    /// kernel's driver afterwards, so `nvme-pt:` and `uring:` on the same controller can run in
    /// the same benchmark (root).
    #[arg(long, requires = "devices")]
    pub rebind: bool,
    /// A note printed with the results and kept in the JSON and plot (e.g. "emulated controller").
    #[arg(long)]
    pub label: Option<String>,
    /// Seconds per measured point (default 1, or 0.25 with --quick).
    #[arg(long)]
    pub seconds: Option<f64>,
    #[command(flatten)]
    pub run: RunArgs,
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
    /// `--label`, if given.
    pub label: Option<String>,
    /// The temp image, or `devices` when `--device` named them.
    pub image: String,
    /// Bytes of the image, or of each device, the points range over.
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

/// Runs `kura bench io`, opening `--device` specs with `open`.
pub fn run(args: &IoArgs, open: Opener) -> anyhow::Result<()> {
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
    if !args.devices.is_empty() && !args.overwrite {
        bail!(
            "--device overwrites the start of each device ({}); add --overwrite to confirm",
            args.size.as_deref().unwrap_or("1G, or 256M with --quick")
        );
    }
    let size = kura_engine::spec::parse_size(args.size.as_deref().unwrap_or(if args.run.quick {
        "256M"
    } else {
        "1G"
    }))
    .map_err(anyhow::Error::msg)?;
    if size < (16 << 20) {
        bail!("--size must be at least 16M");
    }
    let seconds = args
        .seconds
        .unwrap_or(if args.run.quick { 0.25 } else { 1.0 });
    if !(0.01..=600.0).contains(&seconds) {
        bail!("--seconds must be between 0.01 and 600");
    }
    let plan = Plan {
        latency_sizes: if args.run.quick {
            vec![4 << 10, 64 << 10, 1 << 20]
        } else {
            vec![4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
        },
        depths: if args.run.quick {
            vec![1, 8, 32, 128]
        } else {
            vec![1, 2, 4, 8, 16, 32, 64, 128]
        },
        point: Duration::from_secs_f64(seconds),
    };
    let report = if args.devices.is_empty() {
        std::fs::create_dir_all(&args.dir)
            .with_context(|| format!("creating {}", args.dir.display()))?;
        let image = args.dir.join("kura-bench-io.img");
        let targets = target::image_targets(&backends, &image);
        let report = measure_image(args, &backends, &targets, &plan, &image, size, open);
        if !args.keep_image {
            let _ = std::fs::remove_file(&image);
        }
        report?
    } else {
        let targets = target::device_targets(&args.devices, args.rebind)?;
        let mut report = new_report(args, "devices".into(), size, &plan);
        let progress = bar(targets.iter().map(|t| points(t, &plan) + 1).sum());
        measure_targets(&mut report, &targets, &plan, size, true, open, &progress)?;
        progress.finish_and_clear();
        report.fio_status =
            "fio: not run with --device (the devices are compared with each other)".into();
        report.ratios = device_ratios(&report);
        report
    };
    print_report(&report);
    if args.run.output.json.is_some() {
        println!();
    }
    args.run.output.emit("io", plot::SCRIPT, &report)
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

/// Measure points for one target: QD1 latency by op and size, random IOPS by depth, and
/// sequential bandwidth.
fn points(t: &Target, plan: &Plan) -> u64 {
    let depths = if t.full_sweep { plan.depths.len() } else { 2 };
    (plan.latency_sizes.len() * 3 + depths * 2 + 2) as u64
}

fn new_report(args: &IoArgs, image: String, size: u64, plan: &Plan) -> Report {
    Report {
        date_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        cpu: cpu_model(),
        label: args.label.clone(),
        image,
        image_bytes: size,
        seconds_per_point: plan.point.as_secs_f64(),
        devices: Vec::new(),
        latency: Vec::new(),
        throughput: Vec::new(),
        null_cmds_per_sec: None,
        fio_status: String::new(),
        fio: Vec::new(),
        ratios: Vec::new(),
    }
}

/// Measures every target into `report`. With `fill`, each device's region is written through the
/// device first (the default run fills its shared image once instead).
fn measure_targets(
    report: &mut Report,
    targets: &[Target],
    plan: &Plan,
    size: u64,
    fill: bool,
    open: Opener,
    progress: &ProgressBar,
) -> anyhow::Result<()> {
    for t in targets {
        let lease = match &t.rebind {
            Some(bdf) => {
                progress.set_message(format!("giving {bdf} to vfio-pci"));
                target::VfioLease::take(bdf)?
            }
            None => None,
        };
        target::wait_for_node(&t.spec);
        let mut dev = open(&t.spec).with_context(|| format!("opening {}", t.spec))?;
        let g = dev.geometry();
        let region = size.min(g.num_blocks * u64::from(g.block_size));
        let mut describe = dev.describe();
        if fill {
            progress.set_message(format!(
                "{}: writing its first {} MiB",
                t.name,
                region >> 20
            ));
            fill_device(&mut *dev, region)?;
            describe = format!(
                "{describe}; first {} MiB written, then measured",
                region >> 20
            );
            progress.inc(1);
        }
        report.devices.push((t.name.clone(), describe));
        measure_one(report, t, &mut *dev, plan, region, progress)?;
        drop(dev);
        if let Some(lease) = lease {
            progress.set_message(format!("giving {} back to its driver", t.name));
            lease.give_back()?;
        }
    }
    Ok(())
}

fn measure_one(
    report: &mut Report,
    t: &Target,
    dev: &mut dyn BlockDevice,
    plan: &Plan,
    region: u64,
    progress: &ProgressBar,
) -> anyhow::Result<()> {
    let name = t.name.as_str();
    let evict = t.evict.as_deref();
    // The modeled link costs ~43 µs a call: fewer ops keep the run short without changing the mean much.
    let point = if t.modeled {
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
            progress.set_message(format!("{name} {} {}K QD1", pattern.name(), bytes >> 10));
            let out = point_run(dev, evict, pattern, bytes, 1, point, region)?;
            report.latency.push(LatencyPoint {
                backend: name.to_string(),
                op: pattern.name().to_string(),
                bytes,
                ops: out.ops(),
                mean_us: out.mean_us(),
                p50_us: out.percentile_us(50.0),
                p99_us: out.percentile_us(99.0),
                modeled: t.modeled,
            });
            progress.inc(1);
        }
    }
    let depths: Vec<usize> = if t.full_sweep {
        plan.depths.clone()
    } else {
        vec![1, 32]
    };
    for pattern in [Pattern::RandRead, Pattern::RandWrite] {
        for &depth in &depths {
            progress.set_message(format!("{name} 4K rand{} QD{depth}", pattern.name()));
            let out = point_run(dev, evict, pattern, 4096, depth, point, region)?;
            report
                .throughput
                .push(tput(name, pattern, 4096, depth, &out, t.modeled));
            progress.inc(1);
        }
    }
    for pattern in [Pattern::SeqRead, Pattern::SeqWrite] {
        progress.set_message(format!("{name} 1M {} QD8", pattern.name()));
        let out = point_run(dev, evict, pattern, 1 << 20, 8, point, region)?;
        report
            .throughput
            .push(tput(name, pattern, 1 << 20, 8, &out, t.modeled));
        progress.inc(1);
    }
    Ok(())
}

/// The default run: every backend over one temp image, the null device, and fio on the image.
fn measure_image(
    args: &IoArgs,
    backends: &[&str],
    targets: &[Target],
    plan: &Plan,
    image: &Path,
    size: u64,
    open: Opener,
) -> anyhow::Result<Report> {
    let fio_bin = if args.no_fio { None } else { fio::find() };
    let fio_points = if fio_bin.is_some() {
        plan.latency_sizes.len() + plan.depths.len() * 2 + 2
    } else {
        0
    };
    let target_points: u64 = targets.iter().map(|t| points(t, plan)).sum();
    let progress = bar(target_points + fio_points as u64 + 2);

    progress.set_message("filling the image with written data");
    fill_image(image, size)?;
    progress.inc(1);

    let mut report = new_report(args, image.display().to_string(), size, plan);
    measure_targets(&mut report, targets, plan, size, false, open, &progress)?;

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

/// One measured point over the first `size` bytes, with `evict` dropped from the page cache
/// first and reads bounded to half the region so that a buffered backend cannot serve them from
/// memory it filled itself.
fn point_run(
    dev: &mut dyn BlockDevice,
    evict: Option<&Path>,
    pattern: Pattern,
    bytes: usize,
    depth: usize,
    point: Duration,
    size: u64,
) -> anyhow::Result<Outcome> {
    if let Some(path) = evict {
        drop_page_cache(path)?;
    }
    let max_ops = fio_budget(size, bytes) / bytes as u64;
    let job = Job {
        pattern,
        bytes,
        depth,
        duration: point,
        max_ops,
        seed: bytes as u64 ^ depth as u64,
    };
    workload::run_within(dev, &job, size)
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
    fill_device(&mut *dev, size)
}

/// Writes the first `size` bytes of `dev` (pseudo-random data, 1 MiB at QD8), then flushes.
fn fill_device(dev: &mut dyn BlockDevice, size: u64) -> anyhow::Result<()> {
    let job = Job {
        pattern: Pattern::SeqWrite,
        bytes: 1 << 20,
        depth: 8,
        duration: Duration::from_secs(3600),
        max_ops: size >> 20,
        seed: 5,
    };
    let out = workload::run_within(dev, &job, size)?;
    if out.bytes < size & !((1 << 20) - 1) {
        bail!(
            "filling {} wrote {} of {size} bytes",
            dev.describe(),
            out.bytes
        );
    }
    kura_engine::BlockingIo::flush_all(dev)?;
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

/// With `--device`: the first device against each of the others, on the figures that separate
/// software paths (QD1 latency is mostly per-command cost; QD32 IOPS is how it scales).
fn device_ratios(r: &Report) -> Vec<Ratio> {
    let mut out = Vec::new();
    let Some((first, _)) = r.devices.first() else {
        return out;
    };
    let lat = |b: &str| {
        r.latency
            .iter()
            .find(|l| l.backend == b && l.op == "read" && l.bytes == 4096)
    };
    for (other, _) in r.devices.iter().skip(1) {
        if let (Some(a), Some(b)) = (lat(first), lat(other)) {
            out.push(ratio(
                format!("QD1 4K read latency µs, {first}/{other} (lower is better)"),
                a.mean_us,
                b.mean_us,
                None,
            ));
        }
        for (pattern, bytes, depth) in [("read", 4096, 32), ("write", 4096, 32)] {
            if let (Some(a), Some(b)) = (
                find_tput(r, first, pattern, bytes, depth),
                find_tput(r, other, pattern, bytes, depth),
            ) {
                out.push(ratio(
                    format!("4K rand{pattern} QD{depth} IOPS, {first}/{other}"),
                    a.iops,
                    b.iops,
                    None,
                ));
            }
        }
        if let (Some(a), Some(b)) = (
            find_tput(r, first, "seqread", 1 << 20, 8),
            find_tput(r, other, "seqread", 1 << 20, 8),
        ) {
            out.push(ratio(
                format!("1M seqread QD8 MiB/s, {first}/{other}"),
                a.mib_per_s,
                b.mib_per_s,
                None,
            ));
        }
    }
    out
}

fn print_report(r: &Report) {
    println!(
        "kura bench io — {} ({}, {:.2} s per point), kernel {}, {}",
        r.image,
        if r.image == "devices" {
            format!("up to {} MiB of each", r.image_bytes >> 20)
        } else {
            format!("{} MiB image", r.image_bytes >> 20)
        },
        r.seconds_per_point,
        r.kernel,
        r.cpu
    );
    if let Some(label) = &r.label {
        println!("  note: {label}");
    }
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

    fn engine_open(spec: &str) -> anyhow::Result<Box<dyn BlockDevice>> {
        Ok(kura_engine::open(spec)?)
    }

    fn args(dir: &Path) -> IoArgs {
        IoArgs {
            dir: dir.to_path_buf(),
            size: Some("16M".into()),
            backends: "sync,null".into(),
            devices: Vec::new(),
            overwrite: false,
            rebind: false,
            label: None,
            seconds: Some(0.02),
            run: RunArgs {
                quick: true,
                output: crate::output::OutputArgs {
                    json: Some(dir.join("io.json")),
                    plot: Some(dir.join("io.png")),
                },
            },
            no_fio: true,
            keep_image: false,
        }
    }

    fn report(dir: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("io.json")).unwrap()).unwrap()
    }

    #[test]
    fn a_tiny_run_writes_json_with_every_section() {
        let dir = tempfile::tempdir().unwrap();
        run(&args(dir.path()), &engine_open).unwrap();
        let v = report(dir.path());
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
    fn named_devices_are_filled_measured_and_compared_first_against_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("dev.img");
        let a = IoArgs {
            devices: vec!["mem:32M".into(), format!("sync:{}?size=20M", img.display())],
            overwrite: true,
            label: Some("test devices".into()),
            ..args(dir.path())
        };
        run(&a, &engine_open).unwrap();
        let v = report(dir.path());
        assert_eq!(v["image"], "devices");
        assert_eq!(v["label"], "test devices");
        let devices = v["devices"].as_array().unwrap();
        assert_eq!(devices[0][0], "mem");
        assert_eq!(devices[1][0], "sync");
        assert!(devices[1][1]
            .as_str()
            .unwrap()
            .contains("first 16 MiB written"));
        let depths = v["throughput"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["backend"] == "sync" && t["pattern"] == "read")
            .count();
        assert_eq!(depths, 4, "every device gets the whole depth sweep");
        let ratios: Vec<&str> = v["ratios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["what"].as_str().unwrap())
            .collect();
        assert!(ratios.iter().any(|w| w.contains("mem/sync")), "{ratios:?}");
        assert!(v["null_cmds_per_sec"].is_null());
        assert!(
            std::fs::metadata(&img).unwrap().len() >= 16 << 20,
            "the file device was written"
        );
    }

    #[test]
    fn unknown_backends_bad_sizes_and_unconfirmed_overwrites_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let base = IoArgs {
            backends: "uring,spdk".into(),
            size: None,
            ..args(dir.path())
        };
        let err = |a: &IoArgs| run(a, &engine_open).unwrap_err().to_string();
        assert!(err(&base).contains("unknown backend `spdk`"));
        let small = IoArgs {
            backends: "null".into(),
            size: Some("1M".into()),
            ..base.clone()
        };
        assert!(err(&small).contains("at least 16M"));
        let unconfirmed = IoArgs {
            backends: "null".into(),
            devices: vec!["mem:32M".into()],
            ..base.clone()
        };
        assert!(err(&unconfirmed).contains("--overwrite"));
        let missing = IoArgs {
            backends: "null".into(),
            devices: vec!["nosuchkind:x".into()],
            overwrite: true,
            ..base
        };
        assert!(format!("{:#}", run(&missing, &engine_open).unwrap_err()).contains("nosuchkind"));
    }
}
