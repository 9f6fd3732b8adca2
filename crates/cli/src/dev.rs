//! `kura dev`: create, inspect, read, write and verify block devices named by spec strings.

use crate::interrupt::Interrupted;
use crate::pattern;
use crate::stream::{self, progress};
use anyhow::{bail, Context};
use kura_engine::registry::{Kind, ReadOnly};
use kura_engine::{BlockDevice, BlockingIo, BufferPool, Registry};
use std::io::Write;
use std::sync::OnceLock;

/// The spec syntax `kura specs` explains before listing the kinds.
const SPECS_SYNTAX: &str = "\
Device spec strings

  KIND:TARGET[?OPTION=VALUE&...]        a backend
  KIND(SPEC[,SPEC...])[?OPTION=VALUE&...]  a wrapper around other devices
";

/// What `kura specs` says after the kinds.
const SPECS_NOTES: &str = "\
Options every backend takes
  bs=4096             logical block size (512 to 64K, a power of two)
  qd=128              queue depth of the queue pair
  max_transfer=1M     largest command; bigger requests are split and completed as one

[ro=1] after a kind: it takes ro=1 (refuses writes); commands that only read add it

Examples
  mem:256M   file:/tmp/kura.img?size=1G   uring:/dev/loop0?sqpoll=1   sync:/tmp/a.img?direct=1
  redirect:/tmp/a.img?link=aurora   fault(mem:64M)?flush_eio=1   nbd://127.0.0.1:10809/disk
  mirror(stripe(mem:64M,mem:64M),cache(file:/tmp/b.img?size=128M)?mode=wb)
";

/// What `kura specs` writes after the usage of a kind that takes `ro=1`.
pub const RO_MARK: &str = " [ro=1]";

/// Every kind the CLI opens: the engine's, the virtual drives, user-space NVMe, NBD and Ceph
/// RBD. Built once; every command that opens a spec goes through it.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut registry = Registry::engine();
        kura_vdrive::register(&mut registry);
        kura_nvme::register(&mut registry);
        kura_nbd::register(&mut registry);
        kura_rbd::register(&mut registry);
        registry
    })
}

/// `kura specs`: the syntax, then every registered kind under its group, then the shared options.
pub fn specs_help(registry: &Registry) -> String {
    // Descriptions line up in a column per group; a usage longer than MAX_COLUMN gets its
    // description on the next line.
    const MIN_COLUMN: usize = 18;
    const MAX_COLUMN: usize = 38;
    let mut out = SPECS_SYNTAX.to_string();
    let kinds = registry.kinds();
    // A kind a read-only open marks with ro=1 says so after its usage.
    let shown = |k: &Kind| {
        let ro = if k.read_only == ReadOnly::RoOption {
            RO_MARK
        } else {
            ""
        };
        format!("{}{ro}", k.usage)
    };
    for (i, kind) in kinds.iter().enumerate() {
        let column = kinds
            .iter()
            .filter(|k| k.group == kind.group)
            .map(|k| shown(k).len())
            .filter(|&len| len <= MAX_COLUMN)
            .fold(MIN_COLUMN, usize::max)
            + 2;
        if i == 0 || kinds[i - 1].group != kind.group {
            out.push_str(&format!("\n{}\n", kind.group));
        }
        let usage = shown(kind);
        let mut lines = kind.help.lines();
        let first = lines.next().unwrap_or("");
        if usage.len() <= MAX_COLUMN {
            out.push_str(&format!("  {usage:<column$}{first}\n"));
        } else {
            out.push_str(&format!("  {usage}\n  {:<column$}{first}\n", ""));
        }
        for line in lines {
            out.push_str(&format!("  {:<column$}{line}\n", ""));
        }
    }
    out.push('\n');
    out.push_str(SPECS_NOTES);
    out
}

#[derive(Debug, clap::Subcommand)]
pub enum DevCommand {
    /// Create a device (an image file with `file:PATH?size=SIZE`) and optionally fill it with data.
    Create {
        /// Device spec, e.g. `file:/tmp/kura.img?size=1G` (see `kura specs`).
        spec: String,
        /// Write the verifiable pattern over the whole device (so reads hit real data).
        #[arg(long)]
        fill: bool,
        /// Seed of the pattern written by --fill.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Print a device's geometry and backend.
    Info {
        /// Device spec (see `kura specs`).
        spec: String,
    },
    /// Read blocks and print them as a hex dump, or save them to a file.
    Read {
        /// Device spec (see `kura specs`).
        spec: String,
        /// First logical block.
        #[arg(long, default_value_t = 0)]
        lba: u64,
        /// Number of blocks.
        #[arg(long, default_value_t = 1)]
        blocks: u64,
        /// Write the bytes to this file instead of printing a hex dump.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Write blocks from a file or a verifiable pattern, then flush.
    Write {
        /// Device spec (see `kura specs`).
        spec: String,
        /// First logical block.
        #[arg(long, default_value_t = 0)]
        lba: u64,
        /// Number of blocks (default: the whole input file, or to the end of the device).
        #[arg(long)]
        blocks: Option<u64>,
        /// Take the data from this file (its length must be a whole number of blocks).
        #[arg(long, conflicts_with = "pattern")]
        input: Option<std::path::PathBuf>,
        /// Write the verifiable pattern with this seed (check it later with `kura dev verify`).
        #[arg(long)]
        pattern: Option<u64>,
        /// Commands in flight.
        #[arg(long, default_value_t = 32)]
        depth: usize,
    },
    /// Check that blocks hold the pattern written by `kura dev write --pattern SEED`.
    Verify {
        /// Device spec (see `kura specs`).
        spec: String,
        /// Seed the pattern was written with.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// First logical block.
        #[arg(long, default_value_t = 0)]
        lba: u64,
        /// Number of blocks (default: to the end of the device).
        #[arg(long)]
        blocks: Option<u64>,
        /// Commands in flight.
        #[arg(long, default_value_t = 32)]
        depth: usize,
    },
}

pub fn run(cmd: DevCommand) -> anyhow::Result<()> {
    // Long streams stop cleanly on a signal (see `crate::interrupt`); short commands keep the
    // default action.
    if matches!(
        cmd,
        DevCommand::Create { fill: true, .. }
            | DevCommand::Write { .. }
            | DevCommand::Verify { .. }
    ) {
        crate::interrupt::install()?;
    }
    match cmd {
        DevCommand::Create { spec, fill, seed } => {
            let mut dev = open_dev(&spec)?;
            print_info(&*dev);
            if fill {
                let blocks = dev.geometry().num_blocks;
                write_pattern(&mut *dev, 0, blocks, seed, 32)?;
            }
            Ok(())
        }
        DevCommand::Info { spec } => {
            print_info(&*open_dev_read_only(&spec)?);
            Ok(())
        }
        DevCommand::Read {
            spec,
            lba,
            blocks,
            out,
        } => {
            let mut dev = open_dev_read_only(&spec)?;
            let bs = u64::from(dev.geometry().block_size);
            let len = blocks
                .checked_mul(bs)
                .filter(|&l| l <= 1 << 30)
                .context("read at most 1 GiB at a time")?;
            let mut data = vec![0u8; len as usize];
            dev.read_blocks(lba, &mut data)
                .with_context(|| format!("reading {blocks} block(s) at LBA {lba}"))?;
            match out {
                Some(path) => std::fs::write(&path, &data)
                    .with_context(|| format!("writing {}", path.display()))?,
                None => hexdump(&data, lba * bs)?,
            }
            Ok(())
        }
        DevCommand::Write {
            spec,
            lba,
            blocks,
            input,
            pattern,
            depth,
        } => {
            let mut dev = open_dev(&spec)?;
            let geo = dev.geometry();
            match (input, pattern) {
                (Some(path), _) => {
                    let data = std::fs::read(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    let bs = geo.block_size as usize;
                    if data.is_empty() || data.len() % bs != 0 {
                        bail!(
                            "{} holds {} bytes, not a whole number of {bs}-byte blocks",
                            path.display(),
                            data.len()
                        );
                    }
                    let n = blocks
                        .unwrap_or((data.len() / bs) as u64)
                        .min((data.len() / bs) as u64);
                    dev.write_blocks(lba, &data[..n as usize * bs])
                        .with_context(|| format!("writing {n} block(s) at LBA {lba}"))?;
                    dev.flush_all().context("flushing")?;
                    println!(
                        "wrote {n} block(s) at LBA {lba} from {} and flushed",
                        path.display()
                    );
                }
                (None, Some(seed)) => {
                    let n = blocks.unwrap_or(geo.num_blocks.saturating_sub(lba));
                    write_pattern(&mut *dev, lba, n, seed, depth)?;
                }
                (None, None) => bail!("say what to write: --input FILE or --pattern SEED"),
            }
            Ok(())
        }
        DevCommand::Verify {
            spec,
            seed,
            lba,
            blocks,
            depth,
        } => {
            let mut dev = open_dev_read_only(&spec)?;
            let n = blocks.unwrap_or(dev.geometry().num_blocks.saturating_sub(lba));
            let bad = verify_pattern(&mut *dev, lba, n, seed, depth)?;
            if bad > 0 {
                bail!("{bad} of {n} block(s) do not hold pattern {seed}");
            }
            Ok(())
        }
    }
}

/// Opens `spec` with every kind the CLI knows ([`registry`]).
pub fn open_dev(spec: &str) -> anyhow::Result<Box<dyn BlockDevice>> {
    if let Some(rest) = spec.strip_prefix("nbd://") {
        return Ok(Box::new(
            kura_nbd::open::open_address(rest)
                .with_context(|| format!("connecting to `{spec}`"))?,
        ));
    }
    let parsed = kura_engine::Spec::parse(spec)
        .with_context(|| format!("opening `{spec}` (see `kura specs` for the syntax)"))?;
    registry()
        .open_spec(&parsed)
        .with_context(|| format!("opening `{spec}`"))
}

/// Opens `spec` for reading only: every image file or block device in it is opened `ro=1`
/// (`O_RDONLY` and a shared lock, so inspection runs beside other readers, never beside a writer,
/// and can never change the image). Other kinds are opened as they are.
pub fn open_dev_read_only(spec: &str) -> anyhow::Result<Box<dyn BlockDevice>> {
    if spec.starts_with("nbd://") {
        return open_dev(spec);
    }
    let mut parsed = kura_engine::Spec::parse(spec)
        .with_context(|| format!("opening `{spec}` (see `kura specs` for the syntax)"))?;
    let registry = registry();
    registry.mark_read_only(&mut parsed);
    registry
        .open_spec(&parsed)
        .with_context(|| format!("opening `{spec}` read-only"))
}

fn print_info(dev: &dyn BlockDevice) {
    let g = dev.geometry();
    let pool = BufferPool::global().stats();
    println!("device:        {}", dev.describe());
    println!(
        "capacity:      {} bytes ({:.1} MiB), {} blocks of {} bytes",
        g.capacity_bytes(),
        g.capacity_bytes() as f64 / 1048576.0,
        g.num_blocks,
        g.block_size
    );
    println!("max transfer:  {} bytes", g.max_transfer);
    println!("queue depth:   {}", g.queue_depth);
    println!("buffer align:  {} bytes", g.buffer_alignment);
    println!(
        "buffer pool:   {} MiB arena, {}",
        pool.capacity >> 20,
        if pool.hugepages {
            "2 MiB hugepages"
        } else {
            "ordinary pages (no hugepages reserved)"
        }
    );
}

/// Writes the pattern over a range, flushes, and reports the rate.
pub fn write_pattern(
    dev: &mut dyn BlockDevice,
    lba: u64,
    blocks: u64,
    seed: u64,
    depth: usize,
) -> anyhow::Result<stream::StreamStats> {
    let geo = dev.geometry();
    check_range(dev, lba, blocks)?;
    let bs = geo.block_size as usize;
    let bar = progress("write", blocks * bs as u64);
    let chunk = chunk_blocks(dev);
    let stats = stream::write_range(dev, lba, blocks, chunk, depth, &bar, |buf, first| {
        for (i, block) in buf.chunks_mut(bs).enumerate() {
            pattern::fill_block(block, seed, first + i as u64);
        }
    })?;
    dev.flush_all().context("flushing")?;
    bar.finish_and_clear();
    if let Some((signal, at)) = stats.stopped {
        return Err(Interrupted {
            signal,
            kept: format!(
                "pattern {seed} written to LBA {lba}..{at} ({} of {blocks} block(s)) and flushed; \
                 the rest is untouched",
                at - lba
            ),
        }
        .into());
    }
    println!(
        "wrote pattern {seed} to {blocks} block(s) at LBA {lba}: {:.1} MiB/s, flushed",
        stats.mib_per_s()
    );
    Ok(stats)
}

/// Reads a range back and counts blocks that do not hold the pattern.
pub fn verify_pattern(
    dev: &mut dyn BlockDevice,
    lba: u64,
    blocks: u64,
    seed: u64,
    depth: usize,
) -> anyhow::Result<u64> {
    check_range(dev, lba, blocks)?;
    let bs = dev.geometry().block_size as usize;
    let bar = progress("verify", blocks * bs as u64);
    let mut bad = 0u64;
    let mut first_bad = None;
    let mut scratch = Vec::new();
    let chunk = chunk_blocks(dev);
    let stats = stream::read_range(dev, lba, blocks, chunk, depth, &bar, |buf, first| {
        for (i, block) in buf.chunks(bs).enumerate() {
            if !pattern::check_block(block, seed, first + i as u64, &mut scratch) {
                bad += 1;
                first_bad.get_or_insert(first + i as u64);
            }
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    if let Some((signal, at)) = stats.stopped {
        return Err(Interrupted {
            signal,
            kept: format!(
                "verified LBA {lba}..{at} ({} of {blocks} block(s)): {bad} differ from pattern {seed}",
                at - lba
            ),
        }
        .into());
    }
    match first_bad {
        None => println!(
            "verified {blocks} block(s) at LBA {lba}: all hold pattern {seed} ({:.1} MiB/s)",
            stats.mib_per_s()
        ),
        Some(at) => println!(
            "MISMATCH: {bad} of {blocks} block(s) differ from pattern {seed}; first at LBA {at}"
        ),
    }
    Ok(bad)
}

fn chunk_blocks(dev: &dyn BlockDevice) -> u64 {
    let g = dev.geometry();
    u64::from(g.max_transfer_blocks())
}

fn check_range(dev: &dyn BlockDevice, lba: u64, blocks: u64) -> anyhow::Result<()> {
    let n = dev.geometry().num_blocks;
    if blocks == 0 || lba.checked_add(blocks).is_none_or(|end| end > n) {
        bail!("range of {blocks} block(s) at LBA {lba} does not fit a device of {n} blocks");
    }
    Ok(())
}

fn hexdump(data: &[u8], base: u64) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for (i, line) in data.chunks(16).enumerate() {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        let text: String = line
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        writeln!(
            out,
            "{:010x}  {:<47}  |{text}|",
            base + (i * 16) as u64,
            hex.join(" ")
        )?;
    }
    Ok(())
}
