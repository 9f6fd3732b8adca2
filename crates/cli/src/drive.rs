//! `kura drive`: the snapshot drive's control operations — format, snapshot, list, rollback,
//! clone, delete — on a device named by a spec string, and `rebalance` for placed drives.

use anyhow::{bail, Context};
use kura_vdrive::snapshot::{FormatOptions, VersionKind};
use kura_vdrive::SnapshotVolume;

/// `kura drive --help`.
pub const ABOUT: &str = "\
Snapshot drives (`snapshot(CHILD)` in spec strings): copy-on-write snapshots and clones whose
maps live on CHILD and survive power cuts.

SPEC names the device that holds the drive: the child itself (`file:/tmp/a.img`) or the same
wrapped as `snapshot(file:/tmp/a.img)`. Each command opens the drive, does one operation,
commits it durably and exits. Read and write versions with the `kura dev` commands:
  snapshot(CHILD)              the writable head
  snapshot(CHILD)?at=NAME      a read-only view of snapshot NAME
  snapshot(CHILD)?branch=NAME  the writable clone NAME
Do not run these while another process has the drive open.

Example:
  kura drive format file:/tmp/a.img?size=1G
  kura dev write 'snapshot(file:/tmp/a.img)' --pattern 5
  kura drive snapshot file:/tmp/a.img before
  kura dev verify 'snapshot(file:/tmp/a.img)?at=before' --seed 5
  kura drive rollback file:/tmp/a.img before

Placed drives (`placed(LEGS)?...`): `kura drive rebalance SPEC` moves the chunks whose replica
set SPEC's map changes (a leg added at the end of LEGS, reweighted or emptied in `map=`).";

/// Operations on a snapshot drive; see [`ABOUT`].
#[derive(Debug, clap::Subcommand)]
pub enum DriveCommand {
    /// Format a device as an empty snapshot drive (refuses one that holds a drive, unless --force).
    Format {
        /// The device, e.g. `file:/tmp/a.img?size=1G`.
        spec: String,
        /// Copy-on-write unit: a power of two from the block size to 16M.
        #[arg(long, default_value = "64K")]
        chunk: String,
        /// Size of the head and every version (default: the whole data area, thin-provisioned
        /// with the snapshots' copies).
        #[arg(long)]
        size: Option<String>,
        /// Metadata room in full-size maps; each writable version (head, clones) takes one.
        #[arg(long, default_value_t = 8)]
        maps: u32,
        /// Overwrite a device that already holds a snapshot drive (its versions are lost).
        #[arg(long)]
        force: bool,
    },
    /// Freeze the head as snapshot NAME (metadata only, no data copied).
    Snapshot {
        spec: String,
        /// 1 to 64 letters, digits, `.`, `_` or `-`.
        name: String,
    },
    /// List the versions: the head, snapshots and clones, with the chunks each holds.
    List { spec: String },
    /// Make the head equal snapshot (or clone) NAME; the head's changes since are dropped.
    Rollback { spec: String, name: String },
    /// Grow or shrink an image file (file:, uring: or sync: spec, bare or under cache, qos,
    /// throttle, coalesce or priority; other drives are refused with the reason). Growing adds
    /// zeroes (a hole); shrinking is refused when the image holds a kura format or data past the new end,
    /// unless --force. An image a `kura serve --ctl` exports is resized with `kura serve ctl
    /// resize` instead.
    Resize {
        spec: String,
        /// New size in bytes (K/M/G/T suffixes), a multiple of 4096.
        #[arg(long)]
        size: String,
        /// Shrink even though data past the new end, or the image's format, is cut.
        #[arg(long)]
        force: bool,
    },
    /// Make NEW, a writable clone of snapshot (or clone) FROM; open it with `?branch=NEW`.
    Clone {
        spec: String,
        from: String,
        new: String,
    },
    /// Delete snapshot or clone NAME, freeing the chunks no other version uses.
    Delete { spec: String, name: String },
    /// Move a placed drive's chunks to where SPEC's map puts them: only the chunks whose
    /// replica set changed are copied. SPEC is `placed(LEGS)?map=NEW&...`; new legs go at the
    /// end of LEGS and must be blank; a leg being emptied stays listed with weight 0 in NEW.
    /// Rerun the same command after a crash to finish.
    Rebalance {
        spec: String,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
        /// Leg index whose copies may be stale (a host that was down while the drive took
        /// writes): its table is emptied and its chunks copied back from the other legs.
        /// Repeatable.
        #[arg(long)]
        resync: Vec<usize>,
    },
}

/// The child spec inside `SPEC`: `snapshot(CHILD)` is unwrapped, anything else is the child.
fn child_spec(spec: &str) -> anyhow::Result<String> {
    let parsed = kura_engine::Spec::parse(spec)
        .with_context(|| format!("reading `{spec}` (see `kura specs` for the syntax)"))?;
    if parsed.kind != "snapshot" {
        return Ok(spec.to_string());
    }
    if !parsed.options.is_empty() {
        bail!("`{spec}`: give the drive without options (`at`, `branch`, `format` belong to `kura dev`); `kura drive format` takes --chunk, --size, --maps");
    }
    match parsed.children.as_slice() {
        [child] => Ok(child.to_string()),
        _ => bail!("`{spec}`: snapshot(...) wraps exactly one device"),
    }
}

fn open_volume(spec: &str) -> anyhow::Result<SnapshotVolume> {
    let child = child_spec(spec)?;
    let dev = crate::dev::open_dev(&child)?;
    SnapshotVolume::open(dev).with_context(|| format!("opening the snapshot drive on `{child}`"))
}

pub fn run(cmd: DriveCommand) -> anyhow::Result<()> {
    match cmd {
        DriveCommand::Format {
            spec,
            chunk,
            size,
            maps,
            force,
        } => {
            let child = child_spec(&spec)?;
            let chunk_bytes = kura_engine::spec::parse_size(&chunk)
                .map_err(anyhow::Error::msg)
                .and_then(|c| u32::try_from(c).context("chunk too large"))
                .with_context(|| format!("--chunk {chunk}"))?;
            let virtual_bytes = size
                .as_deref()
                .map(kura_engine::spec::parse_size)
                .transpose()
                .map_err(anyhow::Error::msg)
                .context("--size")?;
            let opts = FormatOptions {
                chunk_bytes,
                virtual_bytes,
                maps,
            };
            let dev = crate::dev::open_dev(&child)?;
            let vol = if force {
                SnapshotVolume::format(dev, opts)
            } else {
                SnapshotVolume::create(dev, opts)
            }
            .with_context(|| format!("formatting `{child}`"))?;
            let space = vol.space();
            println!(
                "formatted snapshot({child}): {} bytes per version, {} data chunks of {} bytes",
                space.virtual_bytes, space.data_chunks, space.chunk_bytes
            );
        }
        DriveCommand::Snapshot { spec, name } => {
            open_volume(&spec)?
                .take_snapshot(&name)
                .with_context(|| format!("taking snapshot `{name}`"))?;
            println!("snapshot `{name}` taken");
        }
        DriveCommand::List { spec } => {
            let vol = open_volume(&spec)?;
            let space = vol.space();
            println!(
                "{:<24} {:<9} {:>10} {:>10}",
                "NAME", "KIND", "CHUNKS", "EXCLUSIVE"
            );
            for v in vol.list() {
                let kind = match v.kind {
                    VersionKind::Head => "head",
                    VersionKind::Snapshot => "snapshot",
                    VersionKind::Clone => "clone",
                };
                println!(
                    "{:<24} {:<9} {:>10} {:>10}",
                    v.name, kind, v.mapped_chunks, v.exclusive_chunks
                );
            }
            println!(
                "{} of {} chunks of {} bytes free; versions are {} bytes; metadata generation {}",
                space.free_chunks,
                space.data_chunks,
                space.chunk_bytes,
                space.virtual_bytes,
                space.generation
            );
        }
        DriveCommand::Resize { spec, size, force } => crate::resize::run(&spec, &size, force)?,
        DriveCommand::Rollback { spec, name } => {
            open_volume(&spec)?
                .rollback(&name)
                .with_context(|| format!("rolling back to `{name}`"))?;
            println!("head rolled back to `{name}`");
        }
        DriveCommand::Clone { spec, from, new } => {
            open_volume(&spec)?
                .clone_version(&from, &new)
                .with_context(|| format!("cloning `{from}` as `{new}`"))?;
            println!("clone `{new}` made from `{from}`; open it as snapshot(...)?branch={new}");
        }
        DriveCommand::Rebalance {
            spec,
            quiet,
            resync,
        } => rebalance(&spec, quiet, &resync)?,
        DriveCommand::Delete { spec, name } => {
            open_volume(&spec)?
                .delete(&name)
                .with_context(|| format!("deleting `{name}`"))?;
            println!("`{name}` deleted");
        }
    }
    Ok(())
}

/// `kura drive rebalance SPEC`: progress bar over the chunks, then what moved against the
/// fewest copies any rebalance must make.
fn rebalance(spec: &str, quiet: bool, resync: &[usize]) -> anyhow::Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    let parsed = kura_engine::Spec::parse(spec)
        .with_context(|| format!("reading `{spec}` (see `kura specs` for the syntax)"))?;
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} chunks {elapsed_precise} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let registry = crate::dev::registry();
    let opener = |child: &kura_engine::Spec| registry.open_spec(child);
    let report =
        kura_vdrive::placed::rebalance_spec(&parsed, &opener, resync, &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
        .with_context(|| format!("rebalancing `{spec}`"))?;
    bar.finish_and_clear();
    let ratio = if report.minimum == 0 {
        if report.copies == 0 {
            "nothing to move".to_string()
        } else {
            "minimum 0".to_string()
        }
    } else {
        format!(
            "{:.3}x the minimum",
            report.copies as f64 / report.minimum as f64
        )
    };
    println!(
        "rebalanced {} chunks: {} chunks moved, {} copies made ({:.2}% of {} placements), {} old copies dropped; minimum {} copies ({:.2}%): {ratio}{}",
        report.chunks,
        report.chunks_moved,
        report.copies,
        100.0 * report.moved_fraction(),
        report.placements,
        report.dropped,
        report.minimum,
        100.0 * report.minimum_fraction(),
        if report.formatted > 0 {
            format!("; {} new legs formatted", report.formatted)
        } else {
            String::new()
        }
    );
    if !report.resynced.is_empty() {
        let marked: Vec<usize> = report
            .resynced
            .iter()
            .copied()
            .filter(|l| !resync.contains(l))
            .collect();
        println!(
            "resync of legs {:?}{}: {} stale copies forgotten, refilled from the other legs",
            report.resynced,
            if marked.is_empty() {
                String::new()
            } else {
                format!(" ({marked:?} marked stale by the other legs)")
            },
            report.forgotten
        );
    }
    Ok(())
}
