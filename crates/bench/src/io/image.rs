//! The default run of `kura bench io`: every backend over one temp image filled with written
//! data, the null device's commands per second, and fio on the same image as the peer.

use super::measure::{bar, drop_page_cache, fill_device, fio_budget, measure_targets, points};
use super::ratios::ratios;
use super::report::{new_report, Report};
use super::target::Target;
use super::workload::{self, Job, Pattern};
use super::{fio, IoArgs, Opener, Plan};
use anyhow::Context;
use std::path::Path;
use std::time::Duration;

/// The default run: every backend over one temp image, the null device, and fio on the image.
pub(super) fn measure_image(
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

/// Creates the image and writes all of it (pseudo-random data), then flushes.
fn fill_image(image: &Path, size: u64) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(image);
    let mut dev = kura_engine::open(&format!("uring:{}?size={size}", image.display()))
        .or_else(|_| kura_engine::open(&format!("sync:{}?size={size}", image.display())))
        .with_context(|| format!("creating {}", image.display()))?;
    fill_device(&mut *dev, size)
}

fn fio_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "unknown version".into())
}
