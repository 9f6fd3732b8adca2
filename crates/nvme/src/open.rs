//! Spec strings for this crate's kinds:
//!
//! - `nvme:BDF` — a controller bound to vfio-pci (e.g. `nvme:0000:00:04.0`), driven from user space;
//! - `nvme-sim:SIZE` — the simulated controller over a RAM namespace, for tests;
//! - `nvme-pt:/dev/ngXnY` — NVMe passthrough through io_uring (see [`crate::pt`]).
//!
//! Options: `bs` (engine block, a multiple of the namespace's; default the namespace's),
//! `qd`, `max_transfer`, `nsid`, `queues` (I/O queue pairs to ask for), `entries` (per queue),
//! `timeout_ms` (I/O command timeout before abort/reset); `nvme-sim` adds `lba` (namespace block
//! size) and `mdts`.

use crate::bus::Bus;
use crate::ctrl::{CtrlOptions, Shared};
use crate::error::NvmeError;
use crate::queue::NvmeQueue;
use crate::sim::{SimConfig, SimController};
use kura_engine::device::DEFAULT_QUEUE_DEPTH;
use kura_engine::registry::ReadOnly;
use kura_engine::{BlockDevice, Kind, OpenError, Registry, Spec};
use std::sync::Arc;
use std::time::Duration;

/// Kinds this crate opens.
pub const NVME_KINDS: &[&str] = &["nvme", "nvme-sim", "nvme-pt"];

pub(crate) const CTRL_OPTIONS: &[&str] = &[
    "bs",
    "qd",
    "max_transfer",
    "nsid",
    "queues",
    "entries",
    "timeout_ms",
];

/// Opens `spec` if its kind is one of this crate's; `None` for other kinds.
pub fn open_nvme_kind(spec: &Spec) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
    Some(match spec.kind.as_str() {
        "nvme-sim" => open_sim(spec).map(|(q, _)| Box::new(q) as Box<dyn BlockDevice>),
        "nvme" => crate::vfio::open(spec).map(|q| Box::new(q) as Box<dyn BlockDevice>),
        "nvme-pt" => crate::pt::open(spec).map(|q| Box::new(q) as Box<dyn BlockDevice>),
        _ => return None,
    })
}

const NVME: &str = "User-space NVMe (kura-nvme; root, a controller bound to vfio-pci)";

/// Adds this crate's kinds to `registry`.
pub fn register(registry: &mut Registry) {
    for kind in [
        Kind {
            name: "nvme",
            group: NVME,
            usage: "nvme:BDF",
            help: "polled NVMe driver over VFIO, e.g. nvme:0000:00:04.0 (own queues and\n\
                   doorbells, DMA straight from the buffer pool)",
            read_only: ReadOnly::NotEnforced,
            open: |spec, _| crate::vfio::open(spec).map(|q| Box::new(q) as Box<dyn BlockDevice>),
        },
        Kind {
            name: "nvme-pt",
            group: NVME,
            usage: "nvme-pt:/dev/ngXnY",
            help: "raw NVMe commands through io_uring passthrough to the kernel's char device",
            read_only: ReadOnly::NotEnforced,
            open: |spec, _| crate::pt::open(spec).map(|q| Box::new(q) as Box<dyn BlockDevice>),
        },
        Kind {
            name: "nvme-sim",
            group: NVME,
            usage: "nvme-sim:SIZE",
            help: "an in-process simulated controller (testing the driver without hardware)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, _| open_sim(spec).map(|(q, _)| Box::new(q) as Box<dyn BlockDevice>),
        },
    ] {
        registry.add(kind);
    }
}

/// Queue shape asked for in a spec.
pub(crate) struct QueueSpec {
    pub block_size: Option<u32>,
    pub queue_depth: u32,
    pub max_transfer: u32,
    pub ctrl: CtrlOptions,
}

pub(crate) fn queue_spec(spec: &Spec) -> Result<QueueSpec, OpenError> {
    let d = CtrlOptions::default();
    let block_size = spec.size_option("bs")?.map(|b| b as u32);
    let queue_depth = spec.num_option::<u32>("qd")?.unwrap_or(DEFAULT_QUEUE_DEPTH);
    if !(1..=kura_engine::device::MAX_QUEUE_DEPTH).contains(&queue_depth) {
        return Err(OpenError::Invalid(format!(
            "{spec}: qd {queue_depth} out of range"
        )));
    }
    let max_transfer = spec
        .size_option("max_transfer")?
        .unwrap_or(u64::from(u32::MAX))
        .min(u64::from(u32::MAX)) as u32;
    let ctrl = CtrlOptions {
        nsid: spec.num_option("nsid")?.unwrap_or(d.nsid),
        io_queues: spec.num_option("queues")?.unwrap_or(d.io_queues),
        queue_entries: spec.num_option("entries")?.unwrap_or(d.queue_entries),
        io_timeout: spec
            .num_option::<u64>("timeout_ms")?
            .map_or(d.io_timeout, Duration::from_millis),
        admin_timeout: d.admin_timeout,
    };
    if ctrl.io_queues == 0 || ctrl.queue_entries < 2 {
        return Err(OpenError::Invalid(format!(
            "{spec}: queues must be ≥ 1 and entries ≥ 2"
        )));
    }
    Ok(QueueSpec {
        block_size,
        queue_depth,
        max_transfer,
        ctrl,
    })
}

/// Brings up the controller behind `bus` and opens its first I/O queue pair.
pub fn open_queue(
    bus: Arc<dyn Bus>,
    ctrl: CtrlOptions,
    block_size: Option<u32>,
    queue_depth: u32,
    max_transfer: u32,
) -> Result<NvmeQueue, NvmeError> {
    let sh = Shared::bring_up(bus, ctrl)?;
    let qid = sh
        .take_qid()
        .ok_or_else(|| NvmeError::Unsupported("the controller granted no I/O queue".into()))?;
    let bs = block_size.unwrap_or(sh.info.ns.lba_size);
    NvmeQueue::create(sh, qid, bs, queue_depth, max_transfer)
}

/// Opens `nvme-sim:SIZE?…` and returns the simulated controller too, so tests can inject faults.
pub fn open_sim(spec: &Spec) -> Result<(NvmeQueue, Arc<SimController>), OpenError> {
    let mut allowed = CTRL_OPTIONS.to_vec();
    allowed.extend(["lba", "mdts"]);
    spec.check_options(&allowed)?;
    let size = kura_engine::spec::parse_size(spec.require_target()?)
        .map_err(|e| OpenError::Invalid(format!("{spec}: {e}")))?;
    let q = queue_spec(spec)?;
    let lba_size = spec.size_option("lba")?.unwrap_or(512) as u32;
    if !(512..=65536).contains(&lba_size) || !lba_size.is_power_of_two() {
        return Err(OpenError::Invalid(format!(
            "{spec}: lba {lba_size} must be a power of two from 512 to 64K"
        )));
    }
    let blocks = size / u64::from(lba_size);
    if blocks == 0 || size > (1 << 32) {
        return Err(OpenError::Invalid(format!(
            "{spec}: size must hold one block and be at most 4G"
        )));
    }
    let cfg = SimConfig {
        lba_size,
        blocks,
        mdts: spec
            .num_option("mdts")?
            .unwrap_or(SimConfig::default().mdts),
        ..SimConfig::default()
    };
    let sim = Arc::new(SimController::new(cfg));
    let bus: Arc<dyn Bus> = sim.clone();
    let queue = open_queue(bus, q.ctrl, q.block_size, q.queue_depth, q.max_transfer)?;
    Ok((queue, sim))
}
