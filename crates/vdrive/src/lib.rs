//! Composable virtual drives: each implements the engine's [`BlockDevice`] and wraps other
//! devices, so they stack through the same spec strings as the engine's backends.
//!
//! | spec | module | what it is |
//! |------|--------|------------|
//! | `split(CHILD)?offset=SIZE&len=SIZE` | [`split`] | a window (partition) of one child |
//! | `concat(A,B,...)` | [`concat`] | children end to end |
//! | `stripe(A,B,...)?chunk=SIZE` | [`stripe`] | RAID-0, 64 KiB chunks by default |
//! | `mirror(A,B,...)` | [`mirror`] | RAID-1 with degraded legs and rebuild |
//! | `cache(CHILD)?size=SIZE&mode=wt\|wb` | [`cache`] | LRU block cache, 32 MiB, write-through or write-back |
//! | `coalesce(CHILD)?max=SIZE` | [`coalesce`] | merges contiguous requests within half the child's average latency |
//! | `priority(CHILD)?weights=8:1&bgdepth=4&bgchunk=SIZE` | [`priority`] | weighted classes sharing one child; the spec opens class 0, [`Priority::classes`] gives every class a handle |
//! | `atomic(CHILD)?log=4M` | [`atomic`] | all-or-nothing multi-block writes through a redo log at the child's end (capacity shrinks by `log`) |
//! | `spill(LOCAL,REMOTE)?local=SIZE&chunk=SIZE` | [`spill`] | REMOTE's capacity; first-written 1 MiB chunks placed on LOCAL until full, with a crash-safe chunk map |
//! | `placed(A,B,...)?map=PATH&rule=0&replicas=2&chunk=4M&read=primary\|balanced` | [`placed`] | chunks placed on the legs (leg i = OSD id i) by a CRUSH map and rule, `replicas` copies each; survives `replicas`-1 failed legs |
//! | `throttle(CHILD)?mbps=N&lat_us=N&slow_us=N&slow_pct=P&seed=S` | [`throttle`] | the child slowed on purpose: a modeled link of `mbps` MB/s and per-command latencies, some slow (tests and benches) |
//! | `qos(CHILD)?iops=N&bw=RATE&burst=TIME` | [`qos`] | a tenant's limits: token buckets per direction (commands and bytes per second) hold requests back above them; changeable while running through a [`QosHandle`] |
//! | `snapshot(CHILD)?at=NAME\|branch=NAME\|format=1` | [`snapshot`] | copy-on-write snapshots and clones with crash-safe maps on the child; `at` is a read-only snapshot view |
//!
//! Children are any spec, of this crate or of the engine, so
//! `mirror(stripe(mem:32M,mem:32M),cache(file:/tmp/x.img?size=64M))` and
//! `fault(stripe(mem:8M,mem:8M))?write_eio=3` both open with [`open()`] (or through any
//! [`Registry`] this crate's [`register`] has added its kinds to). Children of one drive
//! must share one block size. Drives that cut requests (split, concat, stripe, mirror) keep many
//! commands in flight on their children and complete the caller's request once every piece has;
//! completions come back in any order, each accepted request completes exactly once, and a failed
//! flush poisons the drive, as the engine's contract requires.

#![forbid(unsafe_code)]

pub mod atomic;
pub mod cache;
pub mod coalesce;
pub mod concat;
mod fanout;
pub mod mapped;
pub mod mirror;
pub mod partition;
pub mod placed;
pub mod priority;
pub mod qos;
pub mod snapshot;
pub mod spill;
pub mod stripe;
pub mod throttle;

pub use atomic::{AtomicDrive, AtomicError, AtomicStats};
pub use cache::{Cache, CacheMode, CacheStats};
pub use coalesce::{Coalesce, CoalesceStats};
pub use concat::Concat;
pub use mapped::{ChildCommand, Layout, MappedDrive};
pub use mirror::{rebuild, LegHealth, LegStatus, Mirror, MirrorError};
pub use partition::Partition;
pub use placed::{Placed, PlacedOptions};
pub use priority::{ClassHandle, ClassStats, Priority, PriorityOptions};
pub use qos::{Qos, QosHandle, QosLimits, QosStats};
pub use snapshot::{SnapshotDrive, SnapshotError, SnapshotVolume};
pub use spill::{Spill, SpillStats};
pub use stripe::Stripe;
pub use throttle::{Throttle, ThrottleOptions, ThrottleStats};

use kura_engine::open::ChildOpener;
use kura_engine::registry::ReadOnly;
use kura_engine::{
    BlockDevice, DeviceError, DeviceResult, IoBuf, Kind, Opcode, OpenError, Registry, Request, Spec,
};

const DRIVES: &str = "Virtual drives (kura-vdrive), composable with everything else";

/// Adds this crate's kinds to `registry`; their children open through the registry they are
/// opened with, so they hold any kind it knows.
pub fn register(registry: &mut Registry) {
    for kind in [
        Kind {
            name: "split",
            group: DRIVES,
            usage: "split(CHILD)?offset=SIZE&len=SIZE",
            help: "a window of the child (a partition)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(partition::open(spec, &children_of(r))),
        },
        Kind {
            name: "concat",
            group: DRIVES,
            usage: "concat(A,B,...)",
            help: "children end to end",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(concat::open(spec, &children_of(r))),
        },
        Kind {
            name: "stripe",
            group: DRIVES,
            usage: "stripe(A,B,...)?chunk=64K",
            help: "RAID-0",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(stripe::open(spec, &children_of(r))),
        },
        Kind {
            name: "mirror",
            group: DRIVES,
            usage: "mirror(A,B,...)",
            help: "RAID-1: reads balanced, writes to all legs; a failing leg is\n\
                   marked degraded and the drive keeps serving",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(mirror::open(spec, &children_of(r))),
        },
        Kind {
            name: "placed",
            group: DRIVES,
            usage: "placed(A,B,...)?map=PATH&rule=0&replicas=2&chunk=4M",
            help: "chunks placed on the legs by a CRUSH map and rule (leg i is\n\
                   OSD id i; no map: a flat straw2 map), each on `replicas` legs;\n\
                   reads from the primary, or the least busy copy (read=balanced)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(placed::open(spec, &children_of(r))),
        },
        Kind {
            name: "cache",
            group: DRIVES,
            usage: "cache(CHILD)?size=32M&mode=wt|wb",
            help: "LRU block cache, write-through or write-back",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(cache::open(spec, &children_of(r))),
        },
        Kind {
            name: "coalesce",
            group: DRIVES,
            usage: "coalesce(CHILD)?max=1M",
            help: "merges contiguous requests that arrive within half the\n\
                   child's measured average latency (at most 2 ms)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(coalesce::open(spec, &children_of(r))),
        },
        Kind {
            name: "spill",
            group: DRIVES,
            usage: "spill(LOCAL,REMOTE)?local=SIZE&chunk=1M",
            help: "REMOTE's size; first-written chunks live on LOCAL until\n\
                   it is full (chunk map in LOCAL's header, crash-safe)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(spill::open(spec, &children_of(r))),
        },
        Kind {
            name: "priority",
            group: DRIVES,
            usage: "priority(CHILD)?weights=8:1&bgdepth=4",
            help: "weighted classes on one child (opens class 0; see docs)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(priority::open(spec, &children_of(r))),
        },
        Kind {
            name: "atomic",
            group: DRIVES,
            usage: "atomic(CHILD)?log=4M",
            help: "all-or-nothing multi-block writes; log takes the child's end",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(atomic::open(spec, &children_of(r))),
        },
        Kind {
            name: "snapshot",
            group: DRIVES,
            usage: "snapshot(CHILD)?at=NAME|branch=NAME",
            help: "copy-on-write snapshots and clones (the head; ?at= a read-only\n\
                   snapshot view; ?branch= a clone; ?format=1&chunk=64K creates;\n\
                   manage with `kura drive`)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(snapshot::open(spec, &children_of(r))),
        },
        Kind {
            name: "throttle",
            group: DRIVES,
            usage: "throttle(CHILD)?mbps=N&lat_us=N&slow_us=N&slow_pct=P",
            help: "the child slowed on purpose: a link of mbps MB/s, every command\n\
                   lat_us late, slow_pct % of them slow_us late (seed=S)",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(throttle::open(spec, &children_of(r))),
        },
        Kind {
            name: "qos",
            group: DRIVES,
            usage: "qos(CHILD)?iops=N&bw=RATE&burst=100ms",
            help: "a tenant's limits: commands and bytes per second per direction\n\
                   (read_iops/write_iops/read_bw/write_bw set one), requests\n\
                   above them held back; burst = how much may be saved up",
            read_only: ReadOnly::ThroughChildren,
            open: |spec, r| boxed(qos::open(spec, &children_of(r))),
        },
    ] {
        registry.add(kind);
    }
}

/// The engine's kinds and this crate's.
pub fn registry() -> Registry {
    let mut registry = Registry::engine();
    register(&mut registry);
    registry
}

/// Opens a device from its spec string: this crate's kinds and every engine kind, nested freely.
pub fn open(spec: &str) -> Result<Box<dyn BlockDevice>, OpenError> {
    registry().open(spec)
}

/// Opens a parsed spec; see [`open()`].
pub fn open_spec(spec: &Spec) -> Result<Box<dyn BlockDevice>, OpenError> {
    registry().open_spec(spec)
}

/// The child opener wrappers take, opening through `registry`.
fn children_of(
    registry: &Registry,
) -> impl Fn(&Spec) -> Result<Box<dyn BlockDevice>, OpenError> + '_ {
    |child| registry.open_spec(child)
}

/// Opens a `mirror(...)` spec as a [`Mirror`], for callers that need its status or rebuild.
pub fn open_mirror(spec: &str) -> Result<Mirror, OpenError> {
    let spec = Spec::parse(spec)?;
    if spec.kind != "mirror" {
        return Err(OpenError::Invalid(format!(
            "{spec}: not a mirror(...) spec"
        )));
    }
    mirror::open(&spec, &children_of(&registry()))
}

fn boxed<D: BlockDevice + 'static>(
    opened: Result<D, OpenError>,
) -> Result<Box<dyn BlockDevice>, OpenError> {
    opened.map(|d| Box::new(d) as Box<dyn BlockDevice>)
}

/// Checks the number of children of `spec` and opens them in order.
pub(crate) fn open_children(
    spec: &Spec,
    children: ChildOpener<'_>,
    min: usize,
    max: Option<usize>,
) -> Result<Vec<Box<dyn BlockDevice>>, OpenError> {
    let n = spec.children.len();
    if spec.target.is_some() {
        return Err(OpenError::Invalid(format!(
            "{spec}: `{}` wraps devices, as in `{}(mem:64M,...)`, and takes no `:` target",
            spec.kind, spec.kind
        )));
    }
    let wanted = match max {
        Some(max) if max == min => format!("exactly {min} device{}", plural(min)),
        Some(max) => format!("{min} to {max} devices"),
        None => format!("at least {min} device{}", plural(min)),
    };
    if n < min || max.is_some_and(|max| n > max) {
        return Err(OpenError::Invalid(format!(
            "{spec}: `{}` takes {wanted}, got {n}",
            spec.kind
        )));
    }
    spec.children.iter().map(children).collect()
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Puts the spec text in front of a construction error's message.
pub(crate) fn in_spec(spec: &Spec, e: OpenError) -> OpenError {
    match e {
        OpenError::Invalid(m) => OpenError::Invalid(format!("{spec}: {m}")),
        other => other,
    }
}

/// Opens the drive of a `spec` that wraps exactly one child and takes one size option: checks
/// the options against `allowed`, reads `key` (`default` when absent), opens the child and builds
/// the drive with `new`, whose errors are prefixed with the spec.
pub(crate) fn open_with_one_child<D>(
    spec: &Spec,
    children: ChildOpener<'_>,
    allowed: &[&str],
    (key, default): (&str, u64),
    new: impl FnOnce(Box<dyn BlockDevice>, u64) -> Result<D, OpenError>,
) -> Result<D, OpenError> {
    spec.check_options(allowed)?;
    let size = spec.size_option(key)?.unwrap_or(default);
    let child = open_children(spec, children, 1, Some(1))?.remove(0);
    new(child, size).map_err(|e| in_spec(spec, e))
}

/// Rings `child`'s doorbell when it has commands in flight (a child with nothing to do is left
/// alone): the doorbell of a drive that passes commands to one child.
pub(crate) fn ring_if_busy(child: &mut dyn BlockDevice) -> DeviceResult<()> {
    if child.in_flight() > 0 {
        child.ring_doorbell()?;
    }
    Ok(())
}

/// The error a drive's `poll` returns when it is waiting for completions that nothing it sent can
/// bring: `drive` (as in "atomic drive") lost track of a request in flight.
pub(crate) fn lost_track(drive: &str) -> DeviceError {
    DeviceError::Offline {
        reason: format!("{drive} lost track of a request in flight"),
    }
}

/// A request for a child device (a piece of a caller's request, or one the drive makes itself):
/// `op` on `blocks` blocks at `lba` with `buf`. Its tag is 0 until the drive sends it and gives it
/// one of its own.
pub(crate) fn child_request(op: Opcode, lba: u64, blocks: u64, buf: Option<IoBuf>) -> Request {
    Request {
        tag: 0,
        op,
        lba,
        blocks,
        buf,
    }
}
