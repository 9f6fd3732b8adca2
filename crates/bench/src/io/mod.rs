//! `kura bench io`: the paper's Fig. 2 and Fig. 5 on this machine, with fio as the peer.
//!
//! Sections, each on one image file that is filled with written data first (ext4 answers reads of
//! unwritten extents without touching the disk, which would flatter every number):
//! 1. tight-loop latency (queue depth 1) of read, write and write+flush by size, per backend;
//! 2. 4 KiB random read and write IOPS by queue depth;
//! 3. 1 MiB sequential read and write bandwidth;
//! 4. the null device's commands per second through the full interface;
//! 5. head to head: kura's `uring` and fio (plain, and with `--registerfiles --fixedbufs` as
//!    kura registers its file and buffers) on the same file with the same patterns, taken in
//!    turn in each of `--rounds` rounds, and kura against the better fio configuration; QD1
//!    4 KiB reads on `uring` against `redirect` the same way. Ratios are median [min–max] of the
//!    rounds' pairs, judged by [`crate::stats`].
//!
//! The page cache is dropped for the image before every point, so the kernel-mediated backends
//! (`sync`, `redirect`) read from the disk like the direct path does.
//!
//! With `--device`, sections 1–3 run on the named devices instead (see [`target`]): each one's
//! measured region is written through it first, and the first device is compared with the rest
//! (the user-space NVMe driver against passthrough and the block layer, for one).
//!
//! Modules: the arguments and [`run`] are here; `measure.rs` runs sections 1–3 on one target,
//! `image.rs` the default run over a temp image (sections 4 and 5), `report.rs` holds what was
//! measured and prints the tables, `ratios.rs` compares kura with its peers; [`workload`] drives
//! a device, [`fio`] runs the peer, [`target`] names what is measured, [`plot`] is the script.

pub mod fio;
mod image;
mod measure;
pub mod plot;
mod ratios;
mod report;
pub mod target;
pub mod workload;

pub use measure::drop_page_cache;
pub use report::{LatencyPoint, Ratio, Report, ThroughputPoint};

use crate::output::{plot_help, RunArgs};
use anyhow::{bail, Context};
use image::measure_image;
use kura_engine::BlockDevice;
use measure::{bar, measure_targets, points};
use ratios::device_ratios;
use report::{new_report, print_report};
use std::path::PathBuf;
use std::time::Duration;

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
    /// Rounds of each head-to-head figure, kura and fio interleaved (default 5, or 2 with
    /// --quick); median and min-max are reported.
    #[arg(long)]
    pub rounds: Option<usize>,
    #[command(flatten)]
    pub run: RunArgs,
    /// Do not run fio even when it is installed.
    #[arg(long)]
    pub no_fio: bool,
    /// Keep the test image afterwards.
    #[arg(long)]
    pub keep_image: bool,
}

struct Plan {
    latency_sizes: Vec<usize>,
    depths: Vec<usize>,
    point: Duration,
    /// Rounds of each head-to-head figure.
    rounds: usize,
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
        rounds: crate::stats::rounds(args.rounds, args.run.quick, 2),
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
        let mut report = new_report(args, "devices".into(), "devices".into(), size, &plan);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
            rounds: None,
            run: RunArgs {
                quick: true,
                output: crate::output::OutputArgs {
                    json: Some(dir.join("io.json")),
                    plot: Some(dir.join("io.png")),
                    no_plot: false,
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
