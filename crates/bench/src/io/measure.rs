//! The measured sections of `kura bench io` on one target: QD1 latency by op and size, 4 KiB
//! random IOPS by queue depth and 1 MiB sequential bandwidth, each point on a page cache dropped
//! first; and filling a device's region with written data before it is measured.

use super::report::{LatencyPoint, Report, ThroughputPoint};
use super::target::{self, Target};
use super::workload::{self, Job, Outcome, Pattern};
use super::{Opener, Plan};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_engine::BlockDevice;
use std::path::Path;
use std::time::Duration;

pub(super) fn bar(len: u64) -> ProgressBar {
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
pub(super) fn points(t: &Target, plan: &Plan) -> u64 {
    let depths = if t.full_sweep { plan.depths.len() } else { 2 };
    (plan.latency_sizes.len() * 3 + depths * 2 + 2) as u64
}

/// Measures every target into `report`. With `fill`, each device's region is written through the
/// device first (the default run fills its shared image once instead).
pub(super) fn measure_targets(
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

pub(super) fn measure_one(
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

pub(super) fn tput(
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
pub(super) fn point_run(
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
pub(super) fn fio_budget(size: u64, bytes: usize) -> u64 {
    (size / 2 / bytes as u64).max(64) * bytes as u64
}

/// Writes the first `size` bytes of `dev` (pseudo-random data, 1 MiB at QD8), then flushes.
pub(super) fn fill_device(dev: &mut dyn BlockDevice, size: u64) -> anyhow::Result<()> {
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
