//! The report of `kura bench io`: the points and ratios it keeps (the JSON's shape), the
//! machine it ran on, and the tables printed to the terminal.

use super::{fio, IoArgs, Plan};
use serde::Serialize;

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

pub(super) fn new_report(args: &IoArgs, image: String, size: u64, plan: &Plan) -> Report {
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

pub(super) fn print_report(r: &Report) {
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
