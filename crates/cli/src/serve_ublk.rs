//! `kura serve --ublk NAME=SPEC`: kura devices as Linux block devices `/dev/ublkbN` through the
//! kernel's ublk driver (kura-ublk), beside the NBD exports of the same `kura serve`. Each export
//! is one ublk device with `--ublk-queues` queues, each served by its own thread, feeding the one
//! thread that drives the export's drive; on stop each queue's counters are printed, then their
//! sum. On stop the block devices are
//! removed (the kernel writes back and drains them first), the ublk devices deleted, and the
//! kura devices flushed. With `--ublk-id N` a device left behind by a killed `kura serve` is
//! recovered instead of created: it keeps its `/dev/ublkbN`, and the I/O the kernel held while no
//! server ran is reissued.

use anyhow::Context;
use kura_engine::BlockingIo;
use kura_ublk::{UblkConfig, UblkDevice};

#[derive(Debug, clap::Args)]
pub struct UblkArgs {
    /// Also serve NAME=SPEC (`:ro` appended: read-only), or NAME=@OTHER (the drive of export
    /// OTHER, see EXPORTS), as a Linux block device /dev/ublkbN through the ublk driver (Linux
    /// 6.0+, `modprobe ublk_drv`, root); repeatable.
    #[arg(long = "ublk", value_name = "NAME=SPEC")]
    pub ublk: Vec<String>,
    /// Device id of the first --ublk export (the next ones take N+1, ...). A device of that id
    /// that a killed `kura serve` left behind is recovered: it keeps its /dev/ublkbN and the
    /// requests held meanwhile are reissued. Default: any free id, always a new device.
    #[arg(long, value_name = "N")]
    ublk_id: Option<u32>,
    /// Queues of each ublk device, each served by a thread of its own, all feeding the one
    /// thread that drives the drive (the kernel caps them at the CPU count). Each queue keeps a
    /// buffer of --ublk-max-io-kib per tag (128 x 512 KiB = 64 MiB by default), taken from
    /// kura's buffer pool while it lasts. Default: the CPU count, at most 4.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=4096))]
    ublk_queues: Option<u16>,
    /// Requests in flight per ublk queue (capped by the drive's queue depth).
    #[arg(long, default_value_t = 128, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    ublk_queue_depth: u16,
    /// Largest ublk request in KiB (capped by the drive's largest transfer).
    #[arg(long, default_value_t = 512, value_name = "KIB",
          value_parser = clap::value_parser!(u32).range(4..=4096))]
    ublk_max_io_kib: u32,
}

/// The ublk exports being served.
pub struct Running {
    devices: Vec<(String, UblkDevice)>,
}

/// Starts the device of every `--ublk` export (opened by [`crate::serve_share::open_all`]); on
/// any failure the ones already started are stopped again.
pub fn start(args: &UblkArgs, exports: Vec<crate::serve_share::Opened>) -> anyhow::Result<Running> {
    let mut running = Running {
        devices: Vec::new(),
    };
    for (i, export) in exports.into_iter().enumerate() {
        match start_one(args, i, export) {
            Ok(dev) => running.devices.push(dev),
            Err(e) => {
                stop(running, &mut Vec::new());
                return Err(e);
            }
        }
    }
    Ok(running)
}

fn start_one(
    args: &UblkArgs,
    i: usize,
    export: crate::serve_share::Opened,
) -> anyhow::Result<(String, UblkDevice)> {
    let crate::serve_share::Opened {
        name,
        spec,
        read_only,
        dev,
        ..
    } = export;
    let name = name.as_str();
    let dev_id = match args.ublk_id {
        Some(first) => Some(
            u32::try_from(i)
                .ok()
                .and_then(|i| first.checked_add(i))
                .context("--ublk-id too large")?,
        ),
        None => None,
    };
    let cfg = UblkConfig {
        dev_id,
        queues: args.ublk_queues.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(4) as u16)
        }),
        queue_depth: args.ublk_queue_depth,
        max_io_bytes: args.ublk_max_io_kib << 10,
        read_only,
        user_recovery: true,
    };
    let device = UblkDevice::start(dev, &cfg)
        .with_context(|| format!("serving `{spec}` as ublk export {name}"))?;
    eprintln!(
        "kura: ublk export {name}: {} ({}, {} queue(s), driver features {:#x}) over {spec}",
        device.block_path(),
        if device.recovered() {
            "recovered from a previous server"
        } else {
            "new"
        },
        device.queues(),
        device.driver_features()
    );
    Ok((name.to_string(), device))
}

/// The resize hook of every ublk export, for `kura serve ctl resize`: the drive is reopened on
/// the export's driver thread and the kernel told the new size (`UPDATE_SIZE`); on kernels
/// without it the hook refuses before anything changes.
pub fn resizers(running: &Running) -> Vec<(String, crate::serve_ctl::Resizer)> {
    running
        .devices
        .iter()
        .map(|(name, device)| {
            let r = device.resizer();
            let hook: crate::serve_ctl::Resizer = Box::new(move |change| {
                r.resize(Box::new(move |slot| change(slot).map_err(|e| e.message)))
                    .map_err(|e| e.to_string())
            });
            (name.clone(), hook)
        })
        .collect()
}

/// Removes every ublk device, flushes its kura device and prints its counters; names that could
/// not be stopped or flushed cleanly go to `failed`.
pub fn stop(running: Running, failed: &mut Vec<String>) {
    for (name, device) in running.devices {
        let path = device.block_path();
        let (dev, counters, result) = device.stop();
        if let Err(e) = result {
            eprintln!("kura: stopping ublk export {name} ({path}): {e}");
            failed.push(name.clone());
        }
        let mut total = kura_ublk::queue::QueueCounters::default();
        for (q, c) in counters.iter().enumerate() {
            total.add(c);
            eprintln!(
                "kura serve: ublk export {name}: queue {q}: reads={} writes={} flushes={} \
                 discards={} write_zeroes={} errors={}",
                c.reads, c.writes, c.flushes, c.discards, c.write_zeroes, c.errors
            );
        }
        eprintln!(
            "kura serve: ublk export {name}: reads={} writes={} flushes={} discards={} \
             write_zeroes={} errors={}",
            total.reads,
            total.writes,
            total.flushes,
            total.discards,
            total.write_zeroes,
            total.errors
        );
        if let Some(mut dev) = dev {
            if let Err(e) = dev.flush_all() {
                eprintln!("kura: flushing ublk export {name}: {e}");
                failed.push(name.clone());
            }
            crate::serve::print_stats(&name, &kura_engine::device::stats_of(dev.as_mut()));
        }
    }
}
