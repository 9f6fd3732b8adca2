//! The `kura` command line: one binary for every layer's tools and benchmarks.

#![forbid(unsafe_code)]

mod crush;
mod demo;
mod dev;
mod drive;
mod fs;
mod genome;
mod ingest;
mod interrupt;
mod kv;
mod mkfs_fsck;
mod mount;
mod nvme;
mod pattern;
mod resize;
mod serve;
mod serve_ctl;
mod serve_share;
mod serve_ublk;
mod serve_vhost;
mod stream;

use clap::{Parser, Subcommand};

/// kura: direct user-space storage for accelerators and offload cores.
///
/// Devices are named by spec strings, e.g. `mem:256M`, `file:/tmp/a.img?size=1G`,
/// `uring:/dev/loop0?sqpoll=1`, `sync:/tmp/a.img`, `redirect:/tmp/a.img?link=aurora`,
/// `fault(mem:64M)?write_eio=3`. Run `kura specs` for the full list of kinds and options.
#[derive(Debug, Parser)]
#[command(name = "kura", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, inspect, read, write and verify block devices.
    #[command(subcommand)]
    Dev(dev::DevCommand),
    /// Benchmarks, each measured against a peer in the same run.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Format a device with AccelFS.
    Mkfs(mkfs_fsck::MkfsArgs),
    /// Check an AccelFS device and report every inconsistency (exit 0 clean, 1 problems, 2 unreadable).
    Fsck(mkfs_fsck::FsckArgs),
    /// File tools on an AccelFS device: ls, put, get, cat, rm, mkdir, stat, df.
    #[command(subcommand)]
    Fs(fs::FsCommand),
    /// Mount an AccelFS device on a directory through FUSE (serves until unmounted).
    Mount(mount::MountArgs),
    /// Export devices over NBD (nbdinfo, nbdcopy, qemu-img and nbdfuse are clients).
    Serve(serve::ServeArgs),
    /// NVMe controllers for the user-space driver: list, identify, bind to vfio-pci, unbind.
    #[command(subcommand)]
    Nvme(nvme::NvmeCommand),
    /// Genome sequence matching, the paper's application: index, map, simulate, and the whole
    /// pipeline per I/O path.
    #[command(subcommand)]
    Genome(genome::GenomeCommand),
    /// Snapshot drives: format, snapshot, list, rollback, clone, delete.
    #[command(subcommand, long_about = drive::ABOUT)]
    Drive(drive::DriveCommand),
    /// CRUSH placement on Ceph's compiled maps: `test` (crushtool --test's output), `map`.
    #[command(subcommand)]
    Crush(crush::CrushCommand),
    /// Streaming network-to-storage ingest: format, serve, send, get, ls (docs/ingest-protocol.md).
    #[command(subcommand)]
    Ingest(ingest::IngestCommand),
    /// Key-value stores from the shell: put, get, del, scan, import, export, stats, compact,
    /// check, on LevelDB or kura's native store.
    #[command(subcommand, long_about = kv::ABOUT)]
    Kv(kv::KvCommand),
    /// Explain the device spec strings every command accepts.
    Specs,
    /// The main job on an embedded default: a file-backed image in a temp dir, written through
    /// io_uring at depth, verified, and timed against the kernel-mediated paths.
    Demo(demo::DemoArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Device I/O: latency by size, random IOPS by queue depth, sequential bandwidth, null-device
    /// commands per second; fio in the same run when installed (the paper's Fig. 2 and 5).
    Io(kura_bench::io::IoArgs),
    /// CRC32C: table-driven vs the crc32 instruction vs vectorized folding, 64 B to 1 MiB.
    Crc(kura_bench::crc::CrcArgs),
    /// QoS: a limited and an unlimited tenant on one NBD server; the limited one's rate vs its
    /// limit and p99 latency, the unlimited one's throughput beside it vs alone.
    Qos(kura_bench::qos::QosArgs),
    /// File system: read/write/write+sync latency by size on AccelFS, the raw engine, ext4
    /// syscalls and redirect; fsync'd appends/s; sequential read bandwidth (the paper's Fig. 5).
    Fs(kura_bench::fs::FsBenchArgs),
    /// Key-value store: db_bench workloads and YCSB A-F on LevelDB over AccelFS, ext4 and
    /// redirect, and RocksDB on ext4, with the same trace (the paper's Fig. 6-7).
    Kv(kura_bench::kv::KvBenchArgs),
    /// Virtual drives: each layer's overhead against pass-through on the same image, and the NBD
    /// export against qemu-nbd and nbdkit with nbdcopy.
    Drives(kura_bench::drives::DrivesArgs),
    /// Genome pipeline: kura on each I/O path against minimap2 -ax sr (time, peak RSS,
    /// accuracy), and read loading against the device's sequential bandwidth.
    Genome(kura_bench::genome::GenomeBenchArgs),
    /// CRUSH: kura's mapper (scalar and SIMD, one thread and all) against crushtool --test on
    /// straw2, straw, list, tree and uniform maps of several sizes.
    Crush(kura_bench::crush::CrushBenchArgs),
    /// Streaming ingest over loopback TCP: against fio's sequential write on the same image and
    /// a naive recv()+write()+fdatasync path; CPU per GB, peak RSS, in- vs out-of-order, stages.
    Ingest(kura_bench::ingest::IngestBenchArgs),
    /// Ceph RBD: kura's rbd: against rbd bench (4 KiB random QD 1/32, 1 MiB sequential),
    /// DeLiBA's stack (cache, coalesce) against pass-through, kura serve against qemu-nbd.
    Rbd(kura_bench::rbd::RbdBenchArgs),
    /// NBD block status: nbdcopy of a large sparse image from kura serve with base:allocation
    /// against the same export without it (time ratio, bytes read, time against data).
    Nbdcopy(kura_bench::nbdcopy::NbdcopyArgs),
    /// kura as a VM's disk: fio in a QEMU (TCG) guest on kura's vhost-user-blk disk against
    /// QEMU's virtio-blk and NBD on copies of one image, and over snapshot/mirror layers.
    ///
    /// One guest (scripts/nvme-vm/run.sh, init-vm-bench) sees five virtio-blk disks, each on its
    /// own identical copy of one image: `kura` (kura serve --vhost-user, file:), `qemu` (QEMU's
    /// virtio-blk, aio=io_uring cache=none), `nbd` (QEMU's NBD client to kura serve), `snapshot`
    /// and `mirror` (vhost-user over snapshot(file:) and mirror(file:,file:)). fio runs 4 KiB
    /// random read/write at QD 1 and 32 and 1 MiB sequential read/write at QD 4 on each disk in
    /// turn, round after round; the table gives median [min-max] IOPS and the per-round ratios
    /// kura/qemu (target >= 1.0x at 4K QD32), kura/nbd (>= 1.5x) and layer/pass-through. Every
    /// figure is emulated (TCG): a relative view, not a hardware result.
    Vm(kura_bench::vm::VmArgs),
    /// Every benchmark in turn, then DIR/report.md and DIR/report.html: the environment and
    /// one section per seed figure, each labelled measured or modeled (--quick: a smoke run).
    All(kura_bench::all::AllArgs),
}

fn main() -> anyhow::Result<()> {
    let result = run(Cli::parse());
    if let Some(stopped) = result
        .as_ref()
        .err()
        .and_then(|e| e.downcast_ref::<interrupt::Interrupted>())
    {
        eprintln!("kura: {stopped}");
        std::process::exit(stopped.exit_code());
    }
    result
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Dev(cmd) => dev::run(cmd),
        Command::Drive(cmd) => drive::run(cmd),
        Command::Bench(BenchCommand::Io(args)) => kura_bench::io::run(&args, &dev::open_dev),
        Command::Bench(BenchCommand::Crc(args)) => kura_bench::crc::run(&args),
        Command::Bench(BenchCommand::Qos(args)) => kura_bench::qos::run(&args),
        Command::Bench(BenchCommand::Fs(args)) => kura_bench::fs::run(&args),
        Command::Bench(BenchCommand::Kv(args)) => kura_bench::kv::run(&args),
        Command::Bench(BenchCommand::Drives(args)) => kura_bench::drives::run(&args),
        Command::Bench(BenchCommand::Nbdcopy(args)) => kura_bench::nbdcopy::run(&args),
        Command::Bench(BenchCommand::Vm(args)) => kura_bench::vm::run(&args),
        Command::Bench(BenchCommand::Genome(args)) => kura_bench::genome::run(&args),
        Command::Bench(BenchCommand::Crush(args)) => kura_bench::crush::run(&args),
        Command::Bench(BenchCommand::Ingest(args)) => kura_bench::ingest::run(&args),
        Command::Bench(BenchCommand::Rbd(args)) => kura_bench::rbd::run(&args),
        Command::Bench(BenchCommand::All(args)) => kura_bench::all::run(&args, &dev::open_dev),
        Command::Demo(args) => demo::run(&args),
        Command::Mkfs(args) => mkfs_fsck::run_mkfs(&args),
        Command::Fsck(args) => std::process::exit(mkfs_fsck::run_fsck(&args)),
        Command::Mount(args) => mount::run(&args),
        Command::Fs(cmd) => fs::run(cmd),
        Command::Serve(args) => serve::run(&args),
        Command::Nvme(cmd) => nvme::run(cmd),
        Command::Genome(cmd) => genome::run(cmd),
        Command::Crush(cmd) => crush::run(cmd),
        Command::Ingest(cmd) => ingest::run(cmd),
        Command::Kv(cmd) => kv::run(cmd),
        Command::Specs => {
            print!("{}", dev::specs_help(dev::registry()));
            Ok(())
        }
    }
}
