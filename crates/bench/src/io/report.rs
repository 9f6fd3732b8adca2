//! The report of `kura bench io`: the points and ratios it keeps (the JSON's shape), the
//! machine it ran on, and the tables printed to the terminal.

use super::{fio, IoArgs, Plan};
use crate::stats::{Spread, Verdict};
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

/// kura against fio, or against another backend, for one figure, over interleaved rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub what: String,
    pub kura: Spread,
    /// The peer's figure; `None` when kura's figure is judged against the target alone.
    pub peer: Option<Spread>,
    /// Who the peer is (`fio --registerfiles --fixedbufs`, `redirect`, a device).
    pub peer_name: Option<String>,
    /// Each round's ratio (kura/peer, or the fraction lower for "lower than" lines).
    pub ratio: Spread,
    /// The ratio is a fraction printed in percent.
    pub percent: bool,
    pub target: Option<String>,
    pub verdict: Option<Verdict>,
    /// A side's numbers come from a modeled link (`link=aurora`).
    pub modeled: bool,
}

/// Per-round values of one measured point (kura's or fio's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    pub iops: f64,
    pub mean_us: f64,
    pub mib_per_s: f64,
}

/// One figure measured head to head: kura's `uring` and fio in both configurations, taken in
/// turn (kura, fio, fio registered) in each round on the same image.
#[derive(Debug, Clone, Serialize)]
pub struct HeadToHead {
    /// fio's name of the pattern (`randread`, `randwrite`, `read`, `write`).
    pub rw: String,
    pub bytes: usize,
    pub depth: usize,
    pub kura: Vec<Sample>,
    pub fio: Vec<Sample>,
    pub fio_registered: Vec<Sample>,
    /// fio's command lines, as run (the last round's).
    pub fio_command: String,
    pub fio_registered_command: String,
}

/// Everything one run measured. `Default` is a report with nothing measured and no facts about
/// the run, for filling in field by field.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub date_unix: u64,
    pub kernel: String,
    pub cpu: String,
    /// The file system the image is on (statfs), or `devices`.
    pub file_system: String,
    /// Rounds of each head-to-head figure (kura and its peers interleaved).
    pub rounds: usize,
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
    /// The null device's commands per second in each round.
    pub null_rounds: Vec<f64>,
    pub fio_status: String,
    /// For each point, the median round of the better fio configuration (what the plot draws).
    pub fio: Vec<fio::FioResult>,
    /// Every fio run, both configurations, every round.
    pub fio_runs: Vec<fio::FioResult>,
    /// kura's `uring` against fio, point by point, round by round.
    pub head_to_head: Vec<HeadToHead>,
    /// QD1 4 KiB reads on `uring` and on each redirect backend, round by round.
    pub latency_rounds: Vec<(String, Vec<f64>)>,
    pub ratios: Vec<Ratio>,
}

pub(super) fn new_report(
    args: &IoArgs,
    image: String,
    file_system: String,
    size: u64,
    plan: &Plan,
) -> Report {
    Report {
        date_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        kernel: crate::stats::kernel(),
        cpu: crate::stats::cpu_model(),
        file_system,
        rounds: plan.rounds,
        label: args.label.clone(),
        image,
        image_bytes: size,
        seconds_per_point: plan.point.as_secs_f64(),
        ..Report::default()
    }
}

pub(super) fn print_report(r: &Report) {
    println!(
        "kura bench io — {} ({}, {:.2} s per point, {} round(s) head to head), kernel {}, {}",
        r.image,
        if r.image == "devices" {
            format!("up to {} MiB of each", r.image_bytes >> 20)
        } else {
            format!("{} MiB image on {}", r.image_bytes >> 20, r.file_system)
        },
        r.seconds_per_point,
        r.rounds,
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
            "\nnull device: {} M commands/s on one core (4 KiB reads, QD 128, full interface; median [min–max] of {} rounds)",
            crate::stats::Spread::of(&r.null_rounds).scaled(1e-6).show(2),
            r.null_rounds.len().max(usize::from(n > 0.0))
        );
    }
    println!("\n{}", r.fio_status);
    if !r.head_to_head.is_empty() {
        println!(
            "kura uring and fio side by side, interleaved (kura, fio, fio --registerfiles --fixedbufs) over {} round(s); median [min–max]:",
            r.rounds
        );
        println!(
            "  {:<22} {:<6} {:>26} {:>26} {:>26}",
            "point", "unit", "kura uring", "fio", "fio registered"
        );
        for h in &r.head_to_head {
            let (get, unit, _) = super::image::metric(h);
            let col = |v: &[Sample]| {
                let vals: Vec<f64> = v.iter().map(get).collect();
                crate::stats::Spread::of(&vals).show(if unit == "IOPS" { 0 } else { 1 })
            };
            println!(
                "  {:<22} {unit:<6} {:>26} {:>26} {:>26}",
                format!("{}K {} QD{}", h.bytes >> 10, h.rw, h.depth),
                col(&h.kura),
                col(&h.fio),
                col(&h.fio_registered)
            );
        }
        if let Some(h) = r.head_to_head.first() {
            println!("  fio: {}", h.fio_command);
            println!("  fio registered: {}", h.fio_registered_command);
        }
    }
    println!("\nRatios and targets (median [min–max] over the rounds' pairs; a target is met only when the whole range is on its side):");
    for x in &r.ratios {
        println!("  {}", ratio_line(x));
    }
}

/// One ratio as printed: what, kura vs the peer, the ratio and the verdict.
pub fn ratio_line(x: &Ratio) -> String {
    let what = if x.modeled && !x.what.contains("modeled") {
        format!("{} (modeled)", x.what)
    } else {
        x.what.clone()
    };
    let value = if x.percent {
        format!("{} %", x.ratio.scaled(100.0).show(1))
    } else {
        x.ratio.show(2)
    };
    let verdict = match (&x.target, x.verdict) {
        (Some(t), Some(v)) => format!("  target {t}: {}", v.word()),
        _ => String::new(),
    };
    match (&x.peer, &x.peer_name) {
        (Some(p), name) => format!(
            "{what}: {} vs {} {} → {value}{verdict}",
            x.kura.show(decimals(x.kura.median)),
            name.as_deref().unwrap_or("peer"),
            p.show(decimals(p.median))
        ),
        (None, _) => format!("{what}: {value}{verdict}"),
    }
}

/// Decimals worth printing for a figure of this size.
fn decimals(x: f64) -> usize {
    if x.abs() >= 1000.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    }
}
