//! `kura mkfs` and `kura fsck`: format a device with AccelFS and check one.

use crate::dev::{open_dev, open_dev_read_only};
use anyhow::Context;
use kura_accelfs::fsdevice::FsDevice;
use kura_accelfs::{fsck, mkfs, MkfsOptions};

#[derive(Debug, clap::Args)]
pub struct MkfsArgs {
    /// Device spec (see `kura specs`), e.g. `file:/tmp/fs.img?size=1G`.
    spec: String,
    /// AccelFS block size: 4K to 64K, a power of two.
    #[arg(long, default_value = "8K")]
    block_size: String,
    /// Number of inodes (default: one per 64 KiB of capacity).
    #[arg(long)]
    inodes: Option<u64>,
}

#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    /// Device spec (see `kura specs`).
    spec: String,
    /// Fix what is safely repairable first (bitmaps, link counts, bad records and inodes,
    /// orphans into /lost+found, a damaged superblock from its copy), then check again.
    #[arg(long)]
    repair: bool,
    /// With --repair: also turn on the `posix` feature of an image made before it (symbolic
    /// links, special files, hard links, extended attributes); older kura then refuses it.
    #[arg(long, requires = "repair")]
    enable_posix: bool,
}

pub fn run_mkfs(args: &MkfsArgs) -> anyhow::Result<()> {
    let block_size = kura_engine::spec::parse_size(&args.block_size).map_err(anyhow::Error::msg)?;
    let block_size = u32::try_from(block_size).context("block size too large")?;
    if !(4096..=65536).contains(&block_size) || !block_size.is_power_of_two() {
        anyhow::bail!("block size {block_size} must be a power of two from 4K to 64K");
    }
    let dev = open_dev(&args.spec)?;
    let mut io = FsDevice::new(dev, block_size as usize)?;
    let sb = mkfs(
        &mut io,
        MkfsOptions {
            block_size,
            inodes: args.inodes,
        },
    )?;
    let l = sb.layout;
    println!(
        "AccelFS on {}: {} blocks of {} bytes ({:.1} MiB)",
        args.spec,
        l.total_blocks,
        l.block_size,
        (l.total_blocks * u64::from(l.block_size)) as f64 / 1048576.0
    );
    println!(
        "  journal {} blocks, {} inodes, data region {} blocks from block {}",
        l.journal_len,
        l.inode_count,
        l.data_blocks(),
        l.data_start
    );
    println!(
        "  format version {}, features: {}",
        kura_accelfs::layout::VERSION,
        if sb.features & kura_accelfs::layout::FEATURE_POSIX != 0 {
            "posix (symbolic links, hard links, special files, extended attributes)"
        } else {
            "none"
        }
    );
    Ok(())
}

/// Runs fsck and returns the process exit code: 0 clean, 1 problems found, 2 unreadable.
pub fn run_fsck(args: &FsckArgs) -> i32 {
    if args.repair {
        let dev = match open_dev(&args.spec) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("kura fsck: {e:#}");
                return 2;
            }
        };
        let opts = kura_accelfs::repair::RepairOptions {
            enable_posix: args.enable_posix,
        };
        match kura_accelfs::repair::repair_with(dev, opts) {
            Err(e) => {
                eprintln!("kura fsck --repair: {}: {e}", args.spec);
                return 2;
            }
            Ok(r) => {
                for f in &r.fixed {
                    println!("FIXED: {f}");
                }
                for u in &r.unrepairable {
                    println!("NOT REPAIRED: {u}");
                }
                println!(
                    "repair: {} fixed, {} left as they are; checking again",
                    r.fixed.len(),
                    r.unrepairable.len()
                );
            }
        }
    }
    // Checking never writes: the image is opened read-only (beside other readers, never beside
    // a writer) and the journal is replayed in memory.
    let dev = match open_dev_read_only(&args.spec) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("kura fsck: {e:#}");
            return 2;
        }
    };
    match fsck(dev) {
        Err(e) => {
            eprintln!("kura fsck: {}: {e}", args.spec);
            2
        }
        Ok(report) => {
            for n in &report.notes {
                println!("note: {n}");
            }
            for p in &report.problems {
                println!("PROBLEM: {p}");
            }
            println!(
                "{}: {} directories, {} files, {} of {} blocks used; {}",
                args.spec,
                report.directories,
                report.files,
                report.used_blocks,
                report.total_blocks,
                if report.is_clean() {
                    "clean".to_string()
                } else {
                    format!("{} problem(s)", report.problems.len())
                }
            );
            i32::from(!report.is_clean())
        }
    }
}
