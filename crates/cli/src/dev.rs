//! `kura dev`: create, inspect, read, write and verify block devices named by spec strings.

use crate::interrupt::Interrupted;
use crate::pattern;
use crate::stream::{self, progress};
use anyhow::{bail, Context};
use kura_engine::{BlockDevice, BlockingIo, BufferPool};
use std::io::Write;

/// Printed by `kura specs`.
pub const SPECS_HELP: &str = "\
Device spec strings

  KIND:TARGET[?OPTION=VALUE&...]        a backend
  KIND(SPEC[,SPEC...])[?OPTION=VALUE&...]  a wrapper around other devices

Backends
  mem:SIZE            RAM disk (SIZE like 64M, 1G). Options: shuffle=SEED (completions out of order)
  null:SIZE           completes every command at once, stores nothing (measures the stack's own cost)
  file:PATH           image file on the best path the kernel allows: io_uring + O_DIRECT, else
                      buffered io_uring, else plain system calls. Options: size=SIZE creates or grows it
  uring:PATH          io_uring on a file or block device (e.g. /dev/loop0). Options: size=, direct=0|1,
                      sqpoll=0|1, iopoll=0|1, fixed=0|1 (registered file and buffers),
                      batch=0|1 (hold commands until the doorbell), spin_us=N (hybrid polling)
  sync:PATH           plain pread/pwrite/fdatasync through the page cache, the kernel-mediated
                      baseline. Options: size=, direct=0|1
  redirect:PATH       every command served by a separate proxy process over shared memory, which
                      does buffered system calls and copies the data back (the paper's baseline).
                      Options: size=, link=none|aurora, call_us=F, copy_gbps=F (a modeled link;
                      results that use it are labelled \"modeled\")

User-space NVMe (kura-nvme; root, a controller bound to vfio-pci)
  nvme:BDF            polled NVMe driver over VFIO, e.g. nvme:0000:00:04.0 (own queues and
                      doorbells, DMA straight from the buffer pool)
  nvme-pt:/dev/ngXnY  raw NVMe commands through io_uring passthrough to the kernel's char device
  nvme-sim:SIZE       an in-process simulated controller (testing the driver without hardware)

Wrappers
  fault(SPEC)         injects faults: read_eio=N, write_eio=N, flush_eio=N (the Nth command fails with
                      EIO), cut_after=N (power cut at the Nth write: unflushed blocks survive with
                      probability keep=P, seeded by seed=S), record=1 (trace writes and flushes)

Options every backend takes
  bs=4096             logical block size (512 to 64K, a power of two)
  qd=128              queue depth of the queue pair
  max_transfer=1M     largest command; bigger requests are split and completed as one

Virtual drives (kura-vdrive), composable with everything else
  split(CHILD)?offset=SIZE&len=SIZE    a window of the child (a partition)
  concat(A,B,...)                      children end to end
  stripe(A,B,...)?chunk=64K            RAID-0
  mirror(A,B,...)                      RAID-1: reads balanced, writes to all legs; a failing leg is
                                       marked degraded and the drive keeps serving
  cache(CHILD)?size=32M&mode=wt|wb     LRU block cache, write-through or write-back
  coalesce(CHILD)?max=1M               merges contiguous requests that arrive within half the
                                       child's measured average latency (at most 2 ms)
  spill(LOCAL,REMOTE)?local=SIZE&chunk=1M  REMOTE's size; first-written chunks live on LOCAL until
                                       it is full (chunk map in LOCAL's header, crash-safe)
  priority(CHILD)?weights=8:1&bgdepth=4  weighted classes on one child (opens class 0; see docs)
  atomic(CHILD)?log=4M                 all-or-nothing multi-block writes; log takes the child's end
  snapshot(CHILD)?at=NAME|branch=NAME  copy-on-write snapshots and clones (the head; ?at= a read-only
                                       snapshot view; ?branch= a clone; ?format=1&chunk=64K creates;
                                       manage with `kura drive`)

Remote devices
  nbd:HOST:PORT/EXPORT   an NBD export (kura serve, qemu-nbd, nbdkit); also nbd://HOST[:PORT][/EXPORT]
  remote:HOST[:PORT][/EXPORT]?tls=1&ca=PATH&timeout=10&reconnect=1   an NBD export with bounded
                         waits, one reconnect per drop (unacknowledged commands replayed; a flush
                         across it fails if acknowledged writes were unflushed) and TLS

Examples
  mem:256M   file:/tmp/kura.img?size=1G   uring:/dev/loop0?sqpoll=1   sync:/tmp/a.img?direct=1
  redirect:/tmp/a.img?link=aurora   fault(mem:64M)?flush_eio=1   nbd://127.0.0.1:10809/disk
  mirror(stripe(mem:64M,mem:64M),cache(file:/tmp/b.img?size=128M)?mode=wb)
";

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

pub fn open_dev(spec: &str) -> anyhow::Result<Box<dyn BlockDevice>> {
    if let Some(rest) = spec.strip_prefix("nbd://") {
        return open_nbd(rest).with_context(|| format!("connecting to `{spec}`"));
    }
    let parsed = kura_engine::Spec::parse(spec)
        .with_context(|| format!("opening `{spec}` (see `kura specs` for the syntax)"))?;
    open_any(&parsed).with_context(|| format!("opening `{spec}`"))
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
    mark_read_only(&mut parsed);
    open_any(&parsed).with_context(|| format!("opening `{spec}` read-only"))
}

/// Adds `ro=1` to every file-backed leaf of `spec` that does not say otherwise.
fn mark_read_only(spec: &mut kura_engine::Spec) {
    const FILE_BACKED: &[&str] = &["file", "uring", "sync", "redirect"];
    if FILE_BACKED.contains(&spec.kind.as_str()) && spec.option("ro").is_none() {
        spec.options.push(("ro".into(), "1".into()));
    }
    for child in &mut spec.children {
        mark_read_only(child);
    }
}

/// Every kind the CLI knows, nested to any depth: the virtual drives (`kura-vdrive`), NBD
/// exports (`nbd:HOST:PORT/EXPORT`), and the engine's backends and wrappers.
fn open_any(spec: &kura_engine::Spec) -> Result<Box<dyn BlockDevice>, kura_engine::OpenError> {
    if spec.kind == "remote" {
        return kura_nbd::remote::open(spec).map(|d| Box::new(d) as Box<dyn BlockDevice>);
    }
    if spec.kind == "nbd" {
        let target = spec.target.as_deref().unwrap_or("");
        return open_nbd(target)
            .map_err(|e| kura_engine::OpenError::Invalid(format!("nbd:{target}: {e:#}")));
    }
    if let Some(opened) = kura_vdrive::open_vdrive_kind(spec, &open_any) {
        return opened;
    }
    if let Some(opened) = kura_nvme::open_nvme_kind(spec) {
        return opened;
    }
    kura_engine::open::open_engine_kind(spec, &open_any).unwrap_or_else(|| {
        let known: Vec<&str> = kura_vdrive::VDRIVE_KINDS
            .iter()
            .chain(kura_engine::open::ENGINE_KINDS)
            .chain(kura_nvme::NVME_KINDS)
            .chain(&["nbd", "remote"])
            .copied()
            .collect();
        Err(kura_engine::open::unknown_kind(spec, &known))
    })
}

/// `HOST[:PORT][/EXPORT]`: an export of any NBD server (another `kura serve`, qemu-nbd,
/// nbdkit) used as a device. The default port is 10809 and the default export the server's.
fn open_nbd(rest: &str) -> anyhow::Result<Box<dyn BlockDevice>> {
    let (host, export) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        anyhow::bail!("no host in the NBD address");
    }
    let addr = if host.contains(':') && !host.ends_with(']') {
        host.to_string()
    } else {
        format!("{host}:10809")
    };
    Ok(Box::new(kura_nbd::connect(addr.as_str(), export)?))
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
