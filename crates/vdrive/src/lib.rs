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
//! | `snapshot(CHILD)?at=NAME\|branch=NAME\|format=1` | [`snapshot`] | copy-on-write snapshots and clones with crash-safe maps on the child; `at` is a read-only snapshot view |
//!
//! Children are any spec, of this crate or of the engine, so
//! `mirror(stripe(mem:32M,mem:32M),cache(file:/tmp/x.img?size=64M))` and
//! `fault(stripe(mem:8M,mem:8M))?write_eio=3` both open with [`open()`]. Children of one drive
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
pub mod priority;
pub mod snapshot;
pub mod spill;
pub mod split;
pub mod stripe;

pub use atomic::{AtomicDrive, AtomicError, AtomicStats};
pub use cache::{Cache, CacheMode, CacheStats};
pub use coalesce::{Coalesce, CoalesceStats};
pub use concat::Concat;
pub use mapped::{Layout, MappedDrive, Piece};
pub use mirror::{rebuild, LegHealth, LegStatus, Mirror, MirrorError};
pub use priority::{ClassHandle, ClassStats, Priority, PriorityOptions};
pub use snapshot::{SnapshotDrive, SnapshotError, SnapshotVolume};
pub use spill::{Spill, SpillStats};
pub use split::Split;
pub use stripe::Stripe;

use kura_engine::open::{open_engine_kind, unknown_kind, ChildOpener, ENGINE_KINDS};
use kura_engine::{BlockDevice, OpenError, Spec};

/// The kinds this crate adds to the engine's.
pub const VDRIVE_KINDS: &[&str] = &[
    "split", "concat", "stripe", "mirror", "cache", "coalesce", "spill", "priority", "atomic",
    "snapshot",
];

/// Opens a device from its spec string: this crate's kinds and every engine kind, nested freely.
pub fn open(spec: &str) -> Result<Box<dyn BlockDevice>, OpenError> {
    open_spec(&Spec::parse(spec)?)
}

/// Opens a parsed spec; see [`open()`].
pub fn open_spec(spec: &Spec) -> Result<Box<dyn BlockDevice>, OpenError> {
    if let Some(opened) = open_vdrive_kind(spec, &open_spec) {
        return opened;
    }
    open_engine_kind(spec, &open_spec).unwrap_or_else(|| {
        let known: Vec<&str> = VDRIVE_KINDS.iter().chain(ENGINE_KINDS).copied().collect();
        Err(unknown_kind(spec, &known))
    })
}

/// Opens `spec` if its kind is one of this crate's, with `children` opening the wrapped specs
/// (for layers above that add kinds of their own). `None` for other kinds.
pub fn open_vdrive_kind(
    spec: &Spec,
    children: ChildOpener<'_>,
) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
    Some(match spec.kind.as_str() {
        "split" => boxed(split::open(spec, children)),
        "concat" => boxed(concat::open(spec, children)),
        "stripe" => boxed(stripe::open(spec, children)),
        "mirror" => boxed(mirror::open(spec, children)),
        "cache" => boxed(cache::open(spec, children)),
        "coalesce" => boxed(coalesce::open(spec, children)),
        "priority" => boxed(priority::open(spec, children)),
        "atomic" => boxed(atomic::open(spec, children)),
        "spill" => boxed(spill::open(spec, children)),
        "snapshot" => boxed(snapshot::open(spec, children)),
        _ => return None,
    })
}

/// Opens a `mirror(...)` spec as a [`Mirror`], for callers that need its status or rebuild.
pub fn open_mirror(spec: &str) -> Result<Mirror, OpenError> {
    let spec = Spec::parse(spec)?;
    if spec.kind != "mirror" {
        return Err(OpenError::Invalid(format!(
            "{spec}: not a mirror(...) spec"
        )));
    }
    mirror::open(&spec, &open_spec)
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
