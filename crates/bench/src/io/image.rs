//! The default run of `kura bench io`: every backend over one temp image filled with written
//! data, the null device's commands per second in rounds, and the head-to-head figures: kura's
//! `uring` and fio (plain and with registered files and buffers) taken in turn in every round on
//! the same image, and QD1 reads on `uring` and the redirect backends the same way.

use super::measure::{
    bar, drop_page_cache, fill_device, fio_budget, measure_targets, point_run, points,
};
use super::ratios::ratios;
use super::report::{new_report, HeadToHead, Report, Sample};
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
    let jobs = fio_jobs(plan);
    let redirects: Vec<&Target> = targets
        .iter()
        .filter(|t| t.name.starts_with("redirect"))
        .collect();
    let has_uring = backends.contains(&"uring");
    let head_points = if fio_bin.is_some() && has_uring {
        jobs.len() * plan.rounds
    } else {
        0
    } + if has_uring && !redirects.is_empty() {
        plan.rounds
    } else {
        0
    };
    let target_points: u64 = targets.iter().map(|t| points(t, plan)).sum();
    let progress = bar(target_points + head_points as u64 + 2);

    progress.set_message("filling the image with written data");
    fill_image(image, size)?;
    progress.inc(1);

    let fs_name = crate::stats::fs_name(image.parent().unwrap_or(image));
    let mut report = new_report(args, image.display().to_string(), fs_name, size, plan);
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
        for _ in 0..plan.rounds {
            report
                .null_rounds
                .push(workload::run(&mut *dev, &job)?.iops());
        }
        report.null_cmds_per_sec = Some(crate::stats::Spread::of(&report.null_rounds).median);
    }
    progress.inc(1);

    if has_uring && !redirects.is_empty() {
        latency_rounds(&mut report, image, &redirects, plan, size, open, &progress)?;
    }

    match &fio_bin {
        None if args.no_fio => {
            report.fio_status = "fio: not run (--no-fio) — ratios against fio skipped".into()
        }
        None => {
            report.fio_status =
                "fio: not installed — ratios against fio skipped (apt-get install fio)".into()
        }
        Some(_) if !has_uring => {
            report.fio_status = "fio: not run (uring is not among --backends)".into()
        }
        Some(bin) => {
            report.fio_status = format!("fio: {}", fio_version(bin));
            let spec = format!("uring:{}", image.display());
            let mut dev = open(&spec).with_context(|| format!("opening {spec}"))?;
            for (rw, bytes, depth) in jobs {
                progress.set_message(format!("kura and fio {rw} {}K QD{depth}", bytes >> 10));
                let mut h = HeadToHead {
                    rw: rw.to_string(),
                    bytes,
                    depth,
                    kura: Vec::new(),
                    fio: Vec::new(),
                    fio_registered: Vec::new(),
                    fio_command: String::new(),
                    fio_registered_command: String::new(),
                };
                let pattern = match rw {
                    "randread" => Pattern::RandRead,
                    "randwrite" => Pattern::RandWrite,
                    "read" => Pattern::SeqRead,
                    _ => Pattern::SeqWrite,
                };
                for _ in 0..plan.rounds {
                    let out = point_run(
                        &mut *dev,
                        Some(image),
                        pattern,
                        bytes,
                        depth,
                        plan.point,
                        size,
                    )?;
                    h.kura.push(Sample {
                        iops: out.iops(),
                        mean_us: out.mean_us(),
                        mib_per_s: out.mib_per_s(),
                    });
                    for registered in [false, true] {
                        drop_page_cache(image)?;
                        let r = fio::run(
                            bin,
                            &fio::FioJob {
                                file: image,
                                rw,
                                bytes,
                                depth,
                                runtime: plan.point,
                                io_bytes: fio_budget(size, bytes),
                                registered,
                            },
                        )?;
                        let sample = Sample {
                            iops: r.iops,
                            mean_us: r.mean_lat_us,
                            mib_per_s: r.mib_per_s,
                        };
                        if registered {
                            h.fio_registered.push(sample);
                            h.fio_registered_command.clone_from(&r.command);
                        } else {
                            h.fio.push(sample);
                            h.fio_command.clone_from(&r.command);
                        }
                        report.fio_runs.push(r);
                    }
                    progress.inc(1);
                }
                report.fio.extend(better_median(&report.fio_runs, &h));
                report.head_to_head.push(h);
            }
        }
    }
    progress.finish_and_clear();
    report.ratios = ratios(&report);
    Ok(report)
}

/// The figures kura and fio are compared on: QD1 random reads by size, 4 KiB random reads and
/// writes by depth, 1 MiB sequential reads and writes at QD 8.
fn fio_jobs(plan: &Plan) -> Vec<(&'static str, usize, usize)> {
    let mut jobs: Vec<(&str, usize, usize)> = plan
        .latency_sizes
        .iter()
        .map(|&b| ("randread", b, 1))
        .collect();
    for &d in &plan.depths {
        if !jobs.contains(&("randread", 4096, d)) {
            jobs.push(("randread", 4096, d));
        }
        jobs.push(("randwrite", 4096, d));
    }
    jobs.push(("read", 1 << 20, 8));
    jobs.push(("write", 1 << 20, 8));
    jobs
}

/// The metric a head-to-head point is judged on, its unit, and whether higher is better: mean
/// latency at QD1, MiB/s for 1 MiB transfers, else IOPS.
pub(super) fn metric(h: &HeadToHead) -> (fn(&Sample) -> f64, &'static str, bool) {
    if h.depth == 1 {
        (|s| s.mean_us, "µs", false)
    } else if h.bytes >= 1 << 20 {
        (|s| s.mib_per_s, "MiB/s", true)
    } else {
        (|s| s.iops, "IOPS", true)
    }
}

/// Whether fio with registered files and buffers did better than plain fio (by median).
pub(super) fn registered_is_better(h: &HeadToHead) -> bool {
    let (get, _, higher) = metric(h);
    let med =
        |v: &[Sample]| crate::stats::Spread::of(&v.iter().map(get).collect::<Vec<_>>()).median;
    let (plain, reg) = (med(&h.fio), med(&h.fio_registered));
    if h.fio_registered.is_empty() {
        return false;
    }
    if higher {
        reg > plain
    } else {
        reg < plain
    }
}

/// The run of the better fio configuration whose metric is that configuration's median.
fn better_median(runs: &[fio::FioResult], h: &HeadToHead) -> Option<fio::FioResult> {
    let registered = registered_is_better(h);
    let (get, _, _) = metric(h);
    let mut mine: Vec<&fio::FioResult> = runs
        .iter()
        .filter(|r| {
            r.rw == h.rw && r.bytes == h.bytes && r.depth == h.depth && r.registered == registered
        })
        .collect();
    let key = |r: &fio::FioResult| {
        get(&Sample {
            iops: r.iops,
            mean_us: r.mean_lat_us,
            mib_per_s: r.mib_per_s,
        })
    };
    mine.sort_by(|a, b| key(a).total_cmp(&key(b)));
    mine.get(mine.len() / 2).map(|r| (*r).clone())
}

/// QD1 4 KiB random reads on `uring` and each redirect backend, in turn, `plan.rounds` times.
fn latency_rounds(
    report: &mut Report,
    image: &Path,
    redirects: &[&Target],
    plan: &Plan,
    size: u64,
    open: Opener,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<()> {
    // One image may have one writer at a time: each device is opened for its turn only.
    let mut specs = vec![("uring".to_string(), format!("uring:{}", image.display()))];
    for t in redirects {
        specs.push((t.name.clone(), t.spec.clone()));
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); specs.len()];
    for _ in 0..plan.rounds {
        progress.set_message("QD1 4K reads: uring and redirect in turn");
        for ((_, spec), s) in specs.iter().zip(samples.iter_mut()) {
            let mut dev = open(spec).with_context(|| format!("opening {spec}"))?;
            let out = point_run(
                &mut *dev,
                Some(image),
                Pattern::RandRead,
                4096,
                1,
                plan.point.min(Duration::from_millis(500)),
                size,
            )?;
            s.push(out.mean_us());
        }
        progress.inc(1);
    }
    report.latency_rounds = specs.into_iter().map(|(n, _)| n).zip(samples).collect();
    Ok(())
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
