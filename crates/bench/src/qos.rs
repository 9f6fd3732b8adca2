//! `kura bench qos`: two tenants on one server — export `limited` behind a `qos` drive, export
//! `free` without limits, each over its own image in the same directory — read at random by two
//! NBD clients at once. It reports the limited tenant's achieved rate against its limit, its p99
//! latency, and the free tenant's throughput under contention against the same tenant alone,
//! measured in interleaved rounds (alone, together, alone, together, …).
//!
//! The load is [`closed_loop`]: a client keeping `qd` random reads in flight for a while and
//! recording each completion's time and latency, also used by the CLI's QoS tests.

use crate::output::RunArgs;
use crate::stats::{self, Spread};
use anyhow::Context;
use kura_engine::{BlockDevice, BufferPool, Completion, Request};
use kura_nbd::{Export, ServeOptions};
use kura_vdrive::{Qos, QosHandle, QosLimits};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
#[command(mut_arg("quick", |a| a.help("One round of 1 s phases instead of 3 rounds of 3 s")))]
pub struct QosArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Directory for the two images (64 MiB each).
    #[arg(long, default_value = "/tmp")]
    pub dir: std::path::PathBuf,
    /// The limited tenant's read IOPS limit (4 KiB reads).
    #[arg(long, default_value_t = 500.0)]
    pub iops: f64,
    /// The limited tenant's read bandwidth limit in bytes per second (64 KiB reads).
    #[arg(long, default_value = "8M")]
    pub bw: String,
    /// Rounds (default 3, 1 under --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
}

/// What one client measured: each completion's time since the start and its latency.
#[derive(Debug, Default)]
pub struct Load {
    pub completions: Vec<(Duration, Duration)>,
    pub bytes_per_op: u64,
}

impl Load {
    /// Operations per second completed in `[from, to)` since the start.
    pub fn rate_between(&self, from: Duration, to: Duration) -> f64 {
        let n = self
            .completions
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .count();
        n as f64 / (to - from).as_secs_f64()
    }

    /// The `q` quantile (0 to 1) of the latencies of completions in `[from, to)`, in µs.
    pub fn latency_us(&self, q: f64, from: Duration, to: Duration) -> f64 {
        let mut v: Vec<f64> = self
            .completions
            .iter()
            .filter(|(t, _)| *t >= from && *t < to)
            .map(|(_, l)| l.as_secs_f64() * 1e6)
            .collect();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

/// Keeps `qd` random reads of `blocks` blocks in flight on `dev` for `run`, then waits for the
/// last ones.
pub fn closed_loop(
    dev: &mut dyn BlockDevice,
    qd: usize,
    blocks: u64,
    run: Duration,
    seed: u64,
) -> anyhow::Result<Load> {
    let geo = dev.geometry();
    let pool = BufferPool::global();
    let bytes = blocks * u64::from(geo.block_size);
    let slots = geo.num_blocks / blocks;
    anyhow::ensure!(slots > 0, "the device is smaller than one read");
    let mut rng = seed | 1;
    let mut next_lba = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % slots) * blocks
    };
    let start = Instant::now();
    let mut sent = vec![start; qd];
    let mut load = Load {
        completions: Vec::new(),
        bytes_per_op: bytes,
    };
    let mut comps: Vec<Completion> = Vec::new();
    for (tag, at) in sent.iter_mut().enumerate() {
        let buf = pool.alloc(bytes as usize).context("buffer")?;
        *at = Instant::now();
        dev.submit(Request::read(tag as u64, next_lba(), blocks, buf))
            .map_err(|r| r.error)?;
    }
    while dev.in_flight() > 0 {
        dev.poll(&mut comps, 1)?;
        let now = Instant::now();
        for c in comps.drain(..) {
            c.status?;
            let tag = c.tag as usize;
            load.completions
                .push((now - start, now.saturating_duration_since(sent[tag])));
            if now - start < run {
                if let Some(buf) = c.buf {
                    sent[tag] = now;
                    dev.submit(Request::read(c.tag, next_lba(), blocks, buf))
                        .map_err(|r| r.error)?;
                }
            }
        }
    }
    Ok(load)
}

/// One row: a limit on the limited tenant and what both tenants got.
#[derive(Debug, Serialize)]
struct Row {
    limit: String,
    unit: &'static str,
    limit_value: f64,
    /// The limited tenant's achieved rate (in `unit`) per contended round.
    limited_achieved: Spread,
    /// Achieved / limit.
    limited_ratio: Spread,
    limited_p99_us: Spread,
    free_alone_iops: Spread,
    free_contended_iops: Spread,
    /// Contended / alone, round by round.
    free_kept: Spread,
}

#[derive(Debug, Serialize)]
struct Report {
    bench: &'static str,
    rounds: usize,
    phase_secs: f64,
    setup: String,
    peer: String,
    rows: Vec<Row>,
}

/// A server with `limited` = qos(uring:DIR/limited.img) and `free` = uring:DIR/free.img.
fn start(dir: &std::path::Path, handle: &QosHandle) -> anyhow::Result<kura_nbd::Server> {
    let open = |name: &str| -> anyhow::Result<Box<dyn BlockDevice>> {
        let spec = format!(
            "uring:{}?size=64M",
            dir.join(format!("{name}.img")).display()
        );
        kura_vdrive::open(&spec).with_context(|| format!("opening {spec}"))
    };
    let limited: Box<dyn BlockDevice> = Box::new(Qos::new(open("limited")?, handle.clone()));
    let exports = vec![
        Export::new("limited", limited),
        Export::new("free", open("free")?),
    ];
    let listener = kura_nbd::server::bind_loopback(0)?;
    Ok(kura_nbd::serve(
        listener,
        exports,
        ServeOptions {
            device_min_block_size: true,
            ..ServeOptions::default()
        },
    )?)
}

pub fn run(args: &QosArgs) -> anyhow::Result<()> {
    let quick = args.run.quick;
    let rounds = match args.rounds {
        Some(r) => r.max(1),
        None if quick => 1,
        None => 3,
    };
    let phase = Duration::from_secs(if quick { 1 } else { 3 });
    // Completions before this are the bucket's burst and the ramp-up; not measured.
    let settle = Duration::from_millis(300);
    let bw = kura_engine::spec::parse_size(&args.bw).map_err(anyhow::Error::msg)?;
    let dir = tempfile::Builder::new()
        .prefix("kura-bench-qos")
        .tempdir_in(&args.dir)
        .with_context(|| format!("a directory in {}", args.dir.display()))?;
    let handle = QosHandle::new(QosLimits::default());
    let server = start(dir.path(), &handle)?;
    let addr = server.local_addr();
    let connect = |name: &str| kura_nbd::open::open_address(&format!("{addr}/{name}"));
    let mut rows = Vec::new();
    let cases = [
        (format!("read_iops={}", args.iops), "IOPS", args.iops, 1u64),
        (
            format!("read_bw={}", args.bw),
            "MB/s",
            bw as f64 / 1e6,
            16u64,
        ),
    ];
    for (limit, unit, limit_value, blocks) in cases {
        handle.set(QosLimits::default().parse_list(&limit)?);
        let mut achieved = Vec::new();
        let mut p99 = Vec::new();
        let mut alone = Vec::new();
        let mut together = Vec::new();
        for round in 0..rounds {
            let mut free = connect("free")?;
            let solo = closed_loop(&mut free, 16, 1, phase, round as u64 + 1)?;
            alone.push(solo.rate_between(settle, phase));
            let mut limited = connect("limited")?;
            let (lim, both) = std::thread::scope(|s| {
                let t = s.spawn(|| closed_loop(&mut limited, 16, blocks, phase, 99));
                let both = closed_loop(&mut free, 16, 1, phase, round as u64 + 7);
                (t.join().expect("limited client"), both)
            });
            let (lim, both) = (lim?, both?);
            let rate = lim.rate_between(settle, phase);
            achieved.push(if unit == "IOPS" {
                rate
            } else {
                rate * lim.bytes_per_op as f64 / 1e6
            });
            p99.push(lim.latency_us(0.99, settle, phase));
            together.push(both.rate_between(settle, phase));
        }
        let kept = stats::compare(&together, &alone, stats::quotient, None);
        let ratios: Vec<f64> = achieved.iter().map(|a| a / limit_value).collect();
        rows.push(Row {
            limit,
            unit,
            limit_value,
            limited_achieved: Spread::of(&achieved),
            limited_ratio: Spread::of(&ratios),
            limited_p99_us: Spread::of(&p99),
            free_alone_iops: kept.peer,
            free_contended_iops: kept.kura,
            free_kept: kept.ratio,
        });
    }
    drop(server);
    println!(
        "kura bench qos: two NBD exports on one server, `limited` = qos(uring:IMG) and `free` = \
         uring:IMG; each client keeps 16 random reads in flight (limited: 4 KiB for the IOPS \
         row, 64 KiB for the bandwidth row; free: 4 KiB); {rounds} round(s) of {}s phases, the \
         first {} ms of each left out",
        phase.as_secs(),
        settle.as_millis()
    );
    println!(
        "{:<18} {:>22} {:>16} {:>16} {:>18} {:>20} {:>14}",
        "limit",
        "limited achieved",
        "achieved/limit",
        "limited p99 us",
        "free alone IOPS",
        "free contended IOPS",
        "free kept"
    );
    for r in &rows {
        println!(
            "{:<18} {:>22} {:>16} {:>16} {:>18} {:>20} {:>14}",
            r.limit,
            format!("{} {}", r.limited_achieved.show(1), r.unit),
            r.limited_ratio.show(3),
            r.limited_p99_us.show(0),
            r.free_alone_iops.show(0),
            r.free_contended_iops.show(0),
            r.free_kept.show(2)
        );
    }
    let report = Report {
        bench: "qos",
        rounds,
        phase_secs: phase.as_secs_f64(),
        setup: "in-process kura NBD server: limited=qos(uring:DIR/limited.img?size=64M) \
                free=uring:DIR/free.img?size=64M; clients kura_nbd nbd:ADDR/EXPORT, QD 16 \
                random reads"
            .into(),
        peer: "the free tenant alone (same client, same export) in the round before each \
               contended phase"
            .into(),
        rows,
    };
    args.run.output.emit("qos", PLOT, &report)
}

const PLOT: &str = r#"
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
d = json.load(open(sys.argv[1]))
rows = d["rows"]
fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
ax[0].bar([r["limit"] for r in rows], [r["limited_ratio"]["median"] for r in rows])
ax[0].axhline(1.0, color="k", lw=0.8)
ax[0].set_ylabel("limited tenant: achieved / limit")
x = range(len(rows))
ax[1].bar([i - 0.2 for i in x], [r["free_alone_iops"]["median"] for r in rows], 0.4, label="alone")
ax[1].bar([i + 0.2 for i in x], [r["free_contended_iops"]["median"] for r in rows], 0.4, label="beside limited")
ax[1].set_xticks(list(x), [r["limit"] for r in rows])
ax[1].set_ylabel("free tenant IOPS")
ax[1].legend()
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=100)
"#;
