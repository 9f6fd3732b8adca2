//! `kura bench vm`: kura as the disk of a virtual machine (issue 24), seen from inside the guest.
//! One QEMU guest (TCG: emulated, so a relative view only) boots through
//! `scripts/nvme-vm/run.sh` with `init-vm-bench` as its `/init` and five virtio-blk disks, each
//! on its own copy of one prepared image (kura opens every image exclusively, so two disks
//! cannot share one file):
//!
//! - `kura`: `kura serve --vhost-user` over `file:` (pass-through),
//! - `qemu`: QEMU's own virtio-blk on the image (`aio=io_uring,cache=none`; `aio=native` where
//!   QEMU refuses io_uring, and the report says so),
//! - `nbd`: QEMU's NBD client as the guest's virtio-blk disk, to `kura serve`'s NBD export,
//! - `snapshot`: vhost-user over `snapshot(file:)`, the head after a snapshot of the data (its
//!   first write to each chunk copies it),
//! - `mirror`: vhost-user over `mirror(file:,file:)`.
//!
//! In the guest fio runs 4 KiB random reads and writes at QD 1 and 32 and 1 MiB sequential reads
//! and writes at QD 4, each job on each disk in turn, for `--rounds` rounds. The host reads the
//! guest's console ([`parse_console`]), and reports per job and disk the median and min–max of
//! IOPS, MiB/s and mean latency, and per round pair the ratios kura÷virtio-blk, kura÷NBD and
//! layer÷pass-through, with the targets at 4 KiB QD 32 (kura ≥ 1.0x virtio-blk and
//! ≥ 1.5x NBD). The JSON holds every sample, the kura serve, QEMU and fio command lines.

use crate::output::RunArgs;
use crate::stats::{compare, quotient, Compared, Goal, Spread};
use anyhow::{bail, ensure, Context};
use rand::{RngCore, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One fio job the guest runs on every disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Job {
    pub name: &'static str,
    pub rw: &'static str,
    pub bs: &'static str,
    pub qd: u32,
}

/// Every job, in the order the guest runs them.
pub const JOBS: [Job; 6] = [
    job("randread-4k-qd1", "randread", "4k", 1),
    job("randread-4k-qd32", "randread", "4k", 32),
    job("randwrite-4k-qd1", "randwrite", "4k", 1),
    job("randwrite-4k-qd32", "randwrite", "4k", 32),
    job("read-1m-qd4", "read", "1m", 4),
    job("write-1m-qd4", "write", "1m", 4),
];

const fn job(name: &'static str, rw: &'static str, bs: &'static str, qd: u32) -> Job {
    Job { name, rw, bs, qd }
}

/// One of the guest's disks: its virtio serial (the vhost-user export's name) and what serves it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Disk {
    pub serial: &'static str,
    pub what: &'static str,
}

/// The guest's disks. `kura` is the pass-through every layer is compared with.
pub const DISKS: [Disk; 5] = [
    Disk {
        serial: "kura",
        what: "kura serve --vhost-user over file: (pass-through)",
    },
    Disk {
        serial: "qemu",
        what: "QEMU's own virtio-blk on the image file",
    },
    Disk {
        serial: "nbd",
        what: "QEMU's NBD client (virtio-blk in the guest) to kura serve's NBD export of file:",
    },
    Disk {
        serial: "snapshot",
        what: "kura serve --vhost-user over snapshot(file:), the head after a snapshot of the data",
    },
    Disk {
        serial: "mirror",
        what: "kura serve --vhost-user over mirror(file:,file:)",
    },
];

/// The ratios reported per job: (name, numerator disk, denominator disk, target at 4K QD 32).
const RATIOS: [(&str, &str, &str, Option<f64>); 4] = [
    ("kura/qemu", "kura", "qemu", Some(1.0)),
    ("kura/nbd", "kura", "nbd", Some(1.5)),
    ("snapshot/kura", "snapshot", "kura", None),
    ("mirror/kura", "mirror", "kura", None),
];

/// The jobs the targets are judged on.
const TARGET_JOBS: [&str; 2] = ["randread-4k-qd32", "randwrite-4k-qd32"];

/// Guest vCPUs (`# kura-vm-cpus:` in init-vm-bench) and so virtqueues per disk.
const GUEST_CPUS: u32 = 2;

const INIT: &str = "init-vm-bench";

/// QEMU's accelerator, as scripts/nvme-vm/run.sh picks it (`KURA_VM_ACCEL`, default tcg).
fn accelerator() -> String {
    std::env::var("KURA_VM_ACCEL")
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "tcg".into())
}

/// What kind of machine the figures come from, for the table, the JSON and the plot.
fn machine_label(accel: &str) -> String {
    match accel {
        "tcg" => format!(
            "emulated (TCG): QEMU software emulation, {GUEST_CPUS} vCPUs; a relative view only"
        ),
        other => format!("QEMU accelerator {other}, {GUEST_CPUS} vCPUs"),
    }
}

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("quick", |a| a.help(
    "One round of 1 s per job, 4 KiB QD 32 reads and writes only (the jobs --jobs names win)"
)))]
#[command(mut_arg("plot", |a| crate::output::plot_help(a, "vm")))]
pub struct VmArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// Interleaved rounds (default 3; --quick: 1).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Seconds fio runs each job on each disk (default 3; --quick: 1).
    #[arg(long)]
    pub secs: Option<u32>,
    /// The jobs to run, comma-separated (default: all): randread-4k-qd1, randread-4k-qd32,
    /// randwrite-4k-qd1, randwrite-4k-qd32, read-1m-qd4, write-1m-qd4.
    #[arg(long, value_delimiter = ',')]
    pub jobs: Vec<String>,
    /// Size of each disk's image (fio uses the first three quarters).
    #[arg(long, default_value = "64M", value_parser = kura_engine::spec::parse_size)]
    pub image_size: u64,
    /// Directory for the images and sockets (default: the system's temporary directory). It
    /// must not be tmpfs (kura and QEMU open the images with O_DIRECT) and its path must have
    /// no white space or commas (QEMU's option syntax).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The kura binary that serves the disks (default: this one).
    #[arg(long)]
    pub kura: Option<PathBuf>,
    /// fio on the host, copied into the guest with the libraries it links.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,
    /// scripts/nvme-vm of a kura checkout (run.sh, build-initramfs.sh, init-vm-bench); default:
    /// the one this binary was built from.
    #[arg(long)]
    pub scripts: Option<PathBuf>,
    /// The guest's time limit in seconds (default: boot time plus the jobs' time, generously).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Passed to `kura serve --vhost-zero-copy`: on, data in one aligned descriptor goes to the
    /// drive in place in guest memory; off, every request is copied through kura's buffer pool.
    /// Recorded in the JSON with the serve command line.
    #[arg(long, value_name = "on|off", default_value = "on", action = clap::ArgAction::Set,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub vhost_zero_copy: bool,
}

/// One fio run in the guest, as its `BENCH` line gave it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub round: usize,
    pub job: String,
    pub disk: String,
    /// KiB fio moved, its bandwidth (KiB/s), IOPS, runtime (ms) and mean total latency (µs):
    /// terse v3 fields of the job's direction.
    pub io_kib: f64,
    pub kib_s: f64,
    pub iops: f64,
    pub runtime_ms: f64,
    pub lat_us: f64,
}

/// What the guest printed: its samples, the fio command per job and disk, and fio's failures.
#[derive(Debug, Default, PartialEq)]
pub struct Console {
    pub samples: Vec<Sample>,
    pub fio_cmds: BTreeMap<(String, String), String>,
    pub errors: Vec<String>,
    pub done: bool,
}

/// Reads the guest's console log (see `init-vm-bench`): `BENCH key=value ...` lines,
/// `FIO-CMD job=J disk=D COMMAND`, `BENCH-ERROR ...` and the final `GUEST-RESULT vm-bench done`.
/// A `BENCH` line with a missing, unparsable or non-zero error field counts as an error.
pub fn parse_console(text: &str) -> Console {
    let mut out = Console::default();
    for line in text.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(rest) = line.strip_prefix("BENCH ") {
            match parse_bench(rest) {
                Some(s) => out.samples.push(s),
                None => out.errors.push(line.to_string()),
            }
        } else if line.starts_with("BENCH-ERROR") {
            out.errors.push(line.to_string());
        } else if let Some(rest) = line.strip_prefix("FIO-CMD ") {
            let mut it = rest.splitn(3, ' ');
            if let (Some(j), Some(d), Some(cmd)) = (it.next(), it.next(), it.next()) {
                if let (Some(j), Some(d)) = (j.strip_prefix("job="), d.strip_prefix("disk=")) {
                    out.fio_cmds.insert((j.into(), d.into()), cmd.into());
                }
            }
        } else if line.contains("GUEST-RESULT vm-bench done") {
            out.done = true;
        }
    }
    out
}

fn parse_bench(rest: &str) -> Option<Sample> {
    let kv: BTreeMap<&str, &str> = rest
        .split_whitespace()
        .filter_map(|f| f.split_once('='))
        .collect();
    let num = |k: &str| kv.get(k)?.parse::<f64>().ok().filter(|v| v.is_finite());
    if kv.get("err")? != &"0" {
        return None;
    }
    Some(Sample {
        round: kv.get("round")?.parse().ok()?,
        job: kv.get("job")?.to_string(),
        disk: kv.get("disk")?.to_string(),
        io_kib: num("io_kib")?,
        kib_s: num("kib_s")?,
        iops: num("iops")?,
        runtime_ms: num("runtime_ms")?,
        lat_us: num("lat_us")?,
    })
}

/// One job on one disk over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub job: String,
    pub disk: String,
    pub iops: Spread,
    pub mib_s: Spread,
    pub lat_us: Spread,
}

/// One ratio of one job, over the rounds' pairs.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub job: String,
    /// e.g. `kura/qemu`: the numerator disk's IOPS over the denominator's, same round.
    pub name: String,
    /// The target (a minimum), where the issue sets one.
    pub target: Option<f64>,
    pub compared: Compared,
}

#[derive(Debug, Clone, Serialize)]
pub struct QemuArgs {
    /// What run.sh gives every guest (see scripts/nvme-vm/run.sh).
    pub base: String,
    /// Guest RAM in a shared memfd, which vhost-user needs.
    pub memory: String,
    /// The -chardev/-drive/-device arguments of each disk, by serial.
    pub disks: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub bench: &'static str,
    pub label: String,
    pub host_cpu: String,
    pub host_cores: usize,
    pub host_kernel: String,
    pub qemu_version: String,
    pub fio_version: String,
    pub guest_kernel: String,
    pub guest_cpus: u32,
    /// QEMU's aio mode for its own virtio-blk disk, and why when it is not io_uring.
    pub qemu_aio: String,
    pub qemu_aio_note: Option<String>,
    pub rounds: usize,
    pub secs_per_job: u32,
    pub image_bytes: u64,
    pub fio_size: String,
    pub dir: String,
    pub fs: String,
    pub images: String,
    pub disks: Vec<Disk>,
    pub jobs: Vec<Job>,
    /// The host commands that prepared the snapshot disk's image.
    pub prepare: Vec<String>,
    pub kura_serve: String,
    pub qemu: QemuArgs,
    /// The fio command the guest ran, per job (`/dev/vdX` as the guest named each disk).
    pub fio: BTreeMap<String, BTreeMap<String, String>>,
    pub samples: Vec<Sample>,
    pub cells: Vec<Cell>,
    pub ratios: Vec<Ratio>,
    /// Seconds the guest ran (QEMU start to power-off), on the host's clock.
    pub guest_seconds: f64,
    /// kura serve stopped on SIGTERM with every export flushed, exit status 0.
    pub serve_stopped_clean: bool,
    /// The counters kura serve printed for each export and layer as it stopped (requests,
    /// bytes, latencies: kura's own side of the guest's figures).
    pub serve_counters: Vec<String>,
}

/// What the run is asked to do, resolved from [`VmArgs`].
#[derive(Debug)]
struct Plan {
    jobs: Vec<Job>,
    rounds: usize,
    secs: u32,
    fio_size: u64,
}

fn plan(args: &VmArgs) -> anyhow::Result<Plan> {
    let quick = args.run.quick;
    let jobs: Vec<Job> = if !args.jobs.is_empty() {
        args.jobs
            .iter()
            .map(|name| {
                JOBS.iter()
                    .copied()
                    .find(|j| j.name == name.trim())
                    .with_context(|| {
                        let all: Vec<&str> = JOBS.iter().map(|j| j.name).collect();
                        format!("--jobs: no job {name:?} (jobs: {})", all.join(", "))
                    })
            })
            .collect::<anyhow::Result<_>>()?
    } else if quick {
        JOBS.iter()
            .copied()
            .filter(|j| TARGET_JOBS.contains(&j.name))
            .collect()
    } else {
        JOBS.to_vec()
    };
    let rounds = args.rounds.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let secs = args.secs.unwrap_or(if quick { 1 } else { 3 }).max(1);
    ensure!(
        args.image_size >= 8 << 20 && args.image_size.is_multiple_of(1 << 20),
        "--image-size must be a whole number of MiB, at least 8 MiB"
    );
    Ok(Plan {
        jobs,
        rounds,
        secs,
        fio_size: args.image_size / 4 * 3,
    })
}

pub fn run(args: &VmArgs) -> anyhow::Result<()> {
    let plan = plan(args)?;
    let kura = match &args.kura {
        Some(k) => k.clone(),
        None => std::env::current_exe().context("finding this kura binary")?,
    };
    let scripts = args
        .scripts
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nvme-vm"));
    ensure!(
        scripts.join("run.sh").exists() && scripts.join(INIT).exists(),
        "{} has no run.sh and {INIT}: name a kura checkout's scripts/nvme-vm with --scripts",
        scripts.display()
    );
    let fio = find_tool(&args.fio).context("fio runs in the guest (apt-get install fio)")?;
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = tempfile::Builder::new()
        .prefix("kura-bench-vm-")
        .tempdir_in(&base)
        .with_context(|| format!("a scratch directory in {}", base.display()))?;
    let text = work.path().display().to_string();
    ensure!(
        !text.contains(|c: char| c.is_whitespace() || c == ','),
        "--dir {text}: QEMU's arguments cannot hold white space or commas in a path"
    );
    match measure(args, &plan, &kura, &scripts, &fio, work.path()) {
        Ok(report) => {
            print_report(&report);
            args.run
                .output
                .emit("vm", include_str!("../../../scripts/plot_vm.py"), &report)
        }
        Err(e) => {
            let kept = work.keep();
            eprintln!("kura bench vm: logs kept in {}", kept.display());
            Err(e)
        }
    }
}

/// `tool` as given when it has a `/`, else the first on PATH.
fn find_tool(tool: &Path) -> anyhow::Result<PathBuf> {
    if tool.components().count() > 1 {
        ensure!(tool.exists(), "{} does not exist", tool.display());
        return Ok(tool.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .with_context(|| format!("{} is not on PATH", tool.display()))
}

/// Runs a host command to completion, failing with its output.
fn run_ok(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The images: one of random data, copied for every plain disk and both mirror legs, and a
/// snapshot drive whose head holds the same data, frozen as snapshot `base`. Returns the
/// commands that prepared the snapshot drive.
fn prepare_images(kura: &Path, dir: &Path, size: u64) -> anyhow::Result<Vec<String>> {
    let data = dir.join("data.img");
    {
        let mut rng = rand::rngs::StdRng::seed_from_u64(24);
        let mut buf = vec![0u8; 1 << 20];
        let mut f = std::fs::File::create(&data)?;
        for _ in 0..size >> 20 {
            rng.fill_bytes(&mut buf);
            std::io::Write::write_all(&mut f, &buf)?;
        }
        f.sync_all()?;
    }
    for name in ["kura", "qemu", "nbd", "mirror-a", "mirror-b"] {
        let copy = dir.join(format!("{name}.img"));
        std::fs::copy(&data, &copy)?;
        // On disk before the guest starts, so no image's write-back runs under a measurement.
        std::fs::File::open(&copy)?.sync_all()?;
    }
    let snap = dir.join("snapshot.img");
    // Room for the data, a copy of every chunk the guest writes after the snapshot (fio writes
    // within the first three quarters) and the drive's maps.
    let snap_size = 2 * size + size / 4;
    let mut cmds = vec![
        cmd(
            kura,
            &["drive", "format"],
            &format!("file:{}?size={snap_size}", snap.display()),
        ),
        cmd(
            kura,
            &["dev", "write", "--input"],
            &data.display().to_string(),
        ),
        cmd(
            kura,
            &["drive", "snapshot"],
            &format!("file:{}", snap.display()),
        ),
    ];
    cmds[1].arg(format!("snapshot(file:{})", snap.display()));
    cmds[2].arg("base");
    let mut shown = Vec::new();
    for c in &mut cmds {
        shown.push(show(c));
        run_ok(c)?;
    }
    std::fs::remove_file(&data)?;
    Ok(shown)
}

fn cmd(program: &Path, args: &[&str], last: &str) -> Command {
    let mut c = Command::new(program);
    c.args(args).arg(last);
    c
}

/// A running `kura serve`, stopped (SIGTERM) by [`Serve::stop`] or killed when dropped.
struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then at most a minute for kura to answer, flush and exit: whether it did
    /// cleanly, and the counters it printed.
    fn stop(mut self) -> anyhow::Result<(bool, Vec<String>)> {
        run_ok(Command::new("kill").args(["-TERM", &self.child.id().to_string()]))?;
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait()? {
                break st;
            }
            ensure!(
                start.elapsed() < Duration::from_secs(60),
                "kura serve did not stop within 60 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = self.log_text();
        let counters = log
            .lines()
            .filter(|l| l.starts_with("kura serve: export"))
            .map(str::to_string)
            .collect();
        Ok((
            status.success() && log.contains("every export flushed"),
            counters,
        ))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_command(kura: &Path, dir: &Path, zero_copy: bool) -> Command {
    let img = |n: &str| dir.join(format!("{n}.img")).display().to_string();
    let mut c = Command::new(kura);
    c.arg("serve")
        .args(["--vhost-user", &format!("kura=file:{}", img("kura"))])
        .args([
            "--vhost-user",
            &format!("snapshot=snapshot(file:{})", img("snapshot")),
        ])
        .args([
            "--vhost-user",
            &format!(
                "mirror=mirror(file:{},file:{})",
                img("mirror-a"),
                img("mirror-b")
            ),
        ])
        .arg("--socket")
        .arg(dir.join("{name}.sock"))
        .args(["--vhost-queues", &GUEST_CPUS.to_string()])
        .args(["--vhost-zero-copy", if zero_copy { "on" } else { "off" }])
        .arg("--unix")
        .arg(dir.join("nbd.sock"))
        .arg(format!("nbd=file:{}", img("nbd")));
    c
}

fn start_serve(kura: &Path, dir: &Path, zero_copy: bool) -> anyhow::Result<(Serve, String)> {
    let mut c = serve_command(kura, dir, zero_copy);
    let shown = show(&c);
    let log = dir.join("serve.log");
    let child = c
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", kura.display()))?;
    let mut serve = Serve { child, log };
    let sockets = ["kura", "snapshot", "mirror", "nbd"].map(|n| dir.join(format!("{n}.sock")));
    let start = Instant::now();
    while !sockets.iter().all(|s| s.exists()) {
        if let Some(st) = serve.child.try_wait()? {
            bail!("kura serve exited ({st}): {}", serve.log_text());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "kura serve made no sockets within 60 s: {}",
            serve.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((serve, shown))
}

fn qemu_args(dir: &Path, aio: &str) -> QemuArgs {
    let accel = accelerator();
    let q = GUEST_CPUS;
    let mut disks = BTreeMap::new();
    for name in ["kura", "snapshot", "mirror"] {
        disks.insert(
            name.to_string(),
            format!(
                "-chardev socket,id=c-{name},path={} -device vhost-user-blk-pci,chardev=c-{name},num-queues={q}",
                dir.join(format!("{name}.sock")).display()
            ),
        );
    }
    disks.insert(
        "qemu".into(),
        format!(
            "-drive file={},format=raw,if=none,id=d-qemu,aio={aio},cache=none -device virtio-blk-pci,drive=d-qemu,serial=qemu,num-queues={q}",
            dir.join("qemu.img").display()
        ),
    );
    disks.insert(
        "nbd".into(),
        format!(
            "-drive driver=nbd,server.type=unix,server.path={},export=nbd,if=none,id=d-nbd,cache=none -device virtio-blk-pci,drive=d-nbd,serial=nbd,num-queues={q}",
            dir.join("nbd.sock").display()
        ),
    );
    QemuArgs {
        base: format!(
            "scripts/nvme-vm/run.sh: qemu-system-x86_64 -accel {accel} -m 1024 -smp {q} -nographic -machine q35 \
             -device intel-iommu,aw-bits=48 -kernel VMLINUZ -initrd INITRAMFS (busybox, fio, {INIT} as /init) \
             -append 'console=ttyS0 quiet loglevel=5 intel_iommu=on panic=-1 kura_vm_...' \
             plus an emulated NVMe controller the guest does not use"
        ),
        memory: "-object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem".into(),
        disks,
    }
}

/// A guest run: run.sh's exit status, the console text and the seconds it took.
struct GuestRun {
    status: Option<i32>,
    console: String,
    seconds: f64,
}

/// Boots the guest and prints its results as they come (run.sh writes the console to a file).
fn boot(
    scripts: &Path,
    vm: &Path,
    fio: &Path,
    qemu: &QemuArgs,
    append: &str,
    limit: u64,
) -> anyhow::Result<GuestRun> {
    let all_disks: Vec<&str> = qemu.disks.values().map(String::as_str).collect();
    let extra = format!("{} {}", qemu.memory, all_disks.join(" "));
    let started = Instant::now();
    let mut child = Command::new(scripts.join("run.sh"))
        .arg(vm)
        .arg(scripts.join(INIT))
        .arg(limit.to_string())
        .arg(fio)
        .env("KURA_VM_QEMU_ARGS", extra)
        .env("KURA_VM_APPEND", append)
        .stdout(Stdio::null())
        .spawn()
        .context("starting run.sh")?;
    let log = vm.join("console.log");
    let mut seen = 0u64;
    let mut partial = String::new();
    let mut follow = |seen: &mut u64| {
        let Ok(mut f) = std::fs::File::open(&log) else {
            return;
        };
        let mut chunk = Vec::new();
        if f.seek(SeekFrom::Start(*seen)).is_ok() && f.read_to_end(&mut chunk).is_ok() {
            *seen += chunk.len() as u64;
            partial.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(n) = partial.find('\n') {
                let line: String = partial.drain(..=n).collect();
                let line = line.trim_end();
                if line.starts_with("BENCH") || line.starts_with("GUEST") {
                    println!("  {line}");
                }
            }
        }
    };
    let status = loop {
        follow(&mut seen);
        if let Some(st) = child.try_wait()? {
            break st;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    follow(&mut seen);
    if status.code() == Some(77) {
        let why = std::fs::read_to_string(vm.join("skipped")).unwrap_or_default();
        bail!("cannot boot a guest here: {}", why.trim());
    }
    Ok(GuestRun {
        status: status.code(),
        console: std::fs::read_to_string(&log).unwrap_or_default(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn measure(
    args: &VmArgs,
    plan: &Plan,
    kura: &Path,
    scripts: &Path,
    fio: &Path,
    dir: &Path,
) -> anyhow::Result<Report> {
    println!(
        "kura bench vm ({}): {} rounds of {} jobs x {} disks, {} s each; images in {}",
        machine_label(&accelerator()),
        plan.rounds,
        plan.jobs.len(),
        DISKS.len(),
        plan.secs,
        dir.display()
    );
    println!(
        "preparing {} identical {} MiB images ...",
        DISKS.len() + 1,
        args.image_size >> 20
    );
    let prepare = prepare_images(kura, dir, args.image_size)?;
    let (serve, kura_serve) = start_serve(kura, dir, args.vhost_zero_copy)?;
    let jobs: Vec<String> = plan
        .jobs
        .iter()
        .map(|j| format!("{}:{}:{}:{}", j.name, j.rw, j.bs, j.qd))
        .collect();
    let append = format!(
        "kura_vm_jobs={} kura_vm_rounds={} kura_vm_secs={} kura_vm_size={}M",
        jobs.join(","),
        plan.rounds,
        plan.secs,
        plan.fio_size >> 20
    );
    // Boot (~1 min under TCG on a busy host), then each run takes its seconds plus fio's start.
    let runs = (plan.rounds * plan.jobs.len() * DISKS.len()) as u64;
    let limit = args
        .timeout
        .unwrap_or(240 + runs * (u64::from(plan.secs) + 10));
    let vm = dir.join("vm");
    let mut aio = "io_uring";
    let mut aio_note = None;
    println!("booting the guest (at most {limit} s); each fio run prints a line:");
    let mut qemu = qemu_args(dir, aio);
    let mut guest = boot(scripts, &vm, fio, &qemu, &append, limit)?;
    if guest.status != Some(0)
        && !guest.console.contains("BENCH")
        && guest.console.contains("io_uring")
    {
        let line = guest
            .console
            .lines()
            .find(|l| l.contains("io_uring"))
            .unwrap_or("")
            .trim()
            .to_string();
        println!("QEMU refused aio=io_uring ({line}); booting again with aio=native");
        aio = "native";
        aio_note = Some(format!("QEMU refused aio=io_uring: {line}"));
        qemu = qemu_args(dir, aio);
        guest = boot(scripts, &vm, fio, &qemu, &append, limit)?;
    }
    let (serve_stopped_clean, serve_counters) = serve.stop()?;
    let console = parse_console(&guest.console);
    let log_at = vm.join("console.log");
    ensure!(
        guest.status == Some(0) && console.done,
        "the guest did not finish (run.sh status {:?}); console log {}",
        guest.status,
        log_at.display()
    );
    ensure!(
        console.errors.is_empty(),
        "fio failed in the guest:\n{}",
        console.errors.join("\n")
    );
    let fio_cmds = check_complete(&console, plan)?;
    let (cells, ratios) = summarise(&console.samples, &plan.jobs);
    let guest_kernel = guest
        .console
        .lines()
        .find_map(|l| l.split("GUEST kernel ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("unknown")
        .to_string();
    Ok(Report {
        bench: "vm",
        label: machine_label(&accelerator()),
        host_cpu: crate::stats::cpu_model(),
        host_cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        host_kernel: crate::stats::kernel(),
        qemu_version: crate::stats::tool_version("qemu-system-x86_64", "--version"),
        fio_version: crate::stats::tool_version(&fio.display().to_string(), "--version"),
        guest_kernel,
        guest_cpus: GUEST_CPUS,
        qemu_aio: aio.into(),
        qemu_aio_note: aio_note,
        rounds: plan.rounds,
        secs_per_job: plan.secs,
        image_bytes: args.image_size,
        fio_size: format!("{}M", plan.fio_size >> 20),
        dir: dir.parent().unwrap_or(dir).display().to_string(),
        fs: crate::stats::fs_name(dir),
        images: "every plain disk and both mirror legs on its own identical copy of one image of \
                 random data (kura opens images exclusively, so disks cannot share a file); the \
                 snapshot disk's head holds the same data, frozen as snapshot `base` before the guest \
                 boots"
            .into(),
        disks: DISKS.to_vec(),
        jobs: plan.jobs.clone(),
        prepare,
        kura_serve,
        qemu,
        fio: fio_cmds,
        samples: console.samples,
        cells,
        ratios,
        guest_seconds: guest.seconds,
        serve_stopped_clean,
        serve_counters,
    })
}

/// Every job ran on every disk in every round, and its fio command was printed; returns the
/// commands by job and disk.
fn check_complete(
    console: &Console,
    plan: &Plan,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, String>>> {
    let mut cmds: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for j in &plan.jobs {
        for d in &DISKS {
            for r in 1..=plan.rounds {
                ensure!(
                    console
                        .samples
                        .iter()
                        .any(|s| s.round == r && s.job == j.name && s.disk == d.serial),
                    "the guest gave no result for {} on disk {} in round {r}",
                    j.name,
                    d.serial
                );
            }
            let cmd = console
                .fio_cmds
                .get(&(j.name.to_string(), d.serial.to_string()))
                .with_context(|| format!("no fio command for {} on {}", j.name, d.serial))?;
            cmds.entry(j.name.into())
                .or_default()
                .insert(d.serial.into(), cmd.clone());
        }
    }
    Ok(cmds)
}

/// The samples of `job` on `disk`, in round order.
fn series(samples: &[Sample], job: &str, disk: &str, f: impl Fn(&Sample) -> f64) -> Vec<f64> {
    let mut v: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.job == job && s.disk == disk)
        .collect();
    v.sort_by_key(|s| s.round);
    v.into_iter().map(f).collect()
}

/// Per job and disk the spreads, per job the ratios of each round's pair.
pub fn summarise(samples: &[Sample], jobs: &[Job]) -> (Vec<Cell>, Vec<Ratio>) {
    let mut cells = Vec::new();
    let mut ratios = Vec::new();
    for j in jobs {
        for d in &DISKS {
            cells.push(Cell {
                job: j.name.into(),
                disk: d.serial.into(),
                iops: Spread::of(&series(samples, j.name, d.serial, |s| s.iops)),
                mib_s: Spread::of(&series(samples, j.name, d.serial, |s| s.kib_s / 1024.0)),
                lat_us: Spread::of(&series(samples, j.name, d.serial, |s| s.lat_us)),
            });
        }
        for (name, num, den, target) in RATIOS {
            let target = target.filter(|_| TARGET_JOBS.contains(&j.name));
            ratios.push(Ratio {
                job: j.name.into(),
                name: name.into(),
                target,
                compared: compare(
                    &series(samples, j.name, num, |s| s.iops),
                    &series(samples, j.name, den, |s| s.iops),
                    quotient,
                    target.map(Goal::AtLeast),
                ),
            });
        }
    }
    (cells, ratios)
}

fn print_report(r: &Report) {
    println!(
        "\nkura bench vm — {} — {} rounds, {} s per job; QEMU virtio-blk aio={} cache=none",
        r.label, r.rounds, r.secs_per_job, r.qemu_aio
    );
    if let Some(note) = &r.qemu_aio_note {
        println!("NOTE: {note}");
    }
    println!("IOPS, median [min–max] over the rounds (1 MiB jobs: MiB/s = IOPS):");
    print!("{:<18}", "job");
    for d in &DISKS {
        print!(" {:>22}", d.serial);
    }
    println!();
    for j in &r.jobs {
        print!("{:<18}", j.name);
        for d in &DISKS {
            let c = r
                .cells
                .iter()
                .find(|c| c.job == j.name && c.disk == d.serial);
            print!(" {:>22}", c.map_or("-".into(), |c| c.iops.show(0)));
        }
        println!();
    }
    println!("\nratios of IOPS, each round's pair, median [min–max]:");
    print!("{:<18}", "job");
    for (name, ..) in RATIOS {
        print!(" {:>20}", name);
    }
    println!();
    for j in &r.jobs {
        print!("{:<18}", j.name);
        for (name, ..) in RATIOS {
            let x = r.ratios.iter().find(|x| x.job == j.name && x.name == name);
            print!(
                " {:>20}",
                x.map_or("-".into(), |x| format!("{}x", x.compared.ratio.show(2)))
            );
        }
        println!();
    }
    println!();
    for x in r.ratios.iter().filter(|x| x.target.is_some()) {
        let t = x.target.unwrap_or_default();
        println!(
            "target {} {} ≥ {t}x: {}x, {}",
            x.job,
            x.name,
            x.compared.ratio.show(2),
            x.compared.verdict.map_or("", |v| v.word())
        );
    }
    println!(
        "guest ran {:.0} s; kura serve {}",
        r.guest_seconds,
        if r.serve_stopped_clean {
            "stopped cleanly (every export flushed)"
        } else {
            "did NOT stop cleanly"
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_serve_command_carries_the_zero_copy_choice() {
        let args = |on: bool| -> Vec<String> {
            serve_command(Path::new("kura"), Path::new("/d"), on)
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        for (on, word) in [(true, "on"), (false, "off")] {
            let got = args(on);
            let at = got
                .iter()
                .position(|a| a == "--vhost-zero-copy")
                .expect("flag passed");
            assert_eq!(got[at + 1], word);
        }
    }

    const CONSOLE: &str = "\
[    1.0] booting\r
GUEST disks: kura=/dev/vda qemu=/dev/vdb\r
GUEST kernel 6.1.0-41-amd64 cpus 2\r
FIO-CMD job=randwrite-4k-qd32 disk=kura fio --name=b --filename=/dev/vda --rw=randwrite\r
BENCH round=1 job=randwrite-4k-qd32 disk=kura err=0 io_kib=4000 kib_s=4000 iops=1000 runtime_ms=1000 lat_us=31.5\r
BENCH round=1 job=randwrite-4k-qd32 disk=qemu err=0 io_kib=2000 kib_s=2000 iops=500 runtime_ms=1000 lat_us=64\r
BENCH round=1 job=randwrite-4k-qd32 disk=nbd err=5 io_kib=0 kib_s=0 iops=0 runtime_ms=0 lat_us=0\r
BENCH-ERROR round=1 job=randread-4k-qd1 disk=mirror fio: bad\r
GUEST-RESULT vm-bench done\r
";

    #[test]
    fn the_console_gives_samples_commands_and_errors() {
        let c = parse_console(CONSOLE);
        assert!(c.done);
        assert_eq!(c.samples.len(), 2);
        assert_eq!(c.samples[0].iops, 1000.0);
        assert_eq!(c.samples[0].lat_us, 31.5);
        assert_eq!(c.samples[1].disk, "qemu");
        assert_eq!(c.errors.len(), 2, "{:?}", c.errors);
        assert_eq!(
            c.fio_cmds[&("randwrite-4k-qd32".into(), "kura".into())],
            "fio --name=b --filename=/dev/vda --rw=randwrite"
        );
    }

    #[test]
    fn malformed_lines_are_errors_not_samples() {
        for line in [
            "BENCH round=1 job=x disk=kura err=0 iops=1",
            "BENCH round=x job=x disk=kura err=0 io_kib=1 kib_s=1 iops=1 runtime_ms=1 lat_us=1",
            "BENCH round=1 job=x disk=kura io_kib=1 kib_s=1 iops=NaN runtime_ms=1 lat_us=1",
            "BENCH garbage",
        ] {
            let c = parse_console(line);
            assert!(c.samples.is_empty(), "{line}");
            assert_eq!(c.errors.len(), 1, "{line}");
        }
    }

    #[test]
    fn ratios_pair_the_same_round() {
        let mut samples = Vec::new();
        for (round, kura, qemu) in [(1, 100.0, 50.0), (2, 90.0, 100.0)] {
            for (disk, iops) in [("kura", kura), ("qemu", qemu)] {
                samples.push(Sample {
                    round,
                    job: "randread-4k-qd32".into(),
                    disk: disk.into(),
                    io_kib: 1.0,
                    kib_s: iops * 4.0,
                    iops,
                    runtime_ms: 1.0,
                    lat_us: 1.0,
                });
            }
        }
        let (cells, ratios) = summarise(&samples, &JOBS[1..2]);
        assert_eq!(cells.len(), DISKS.len());
        let kq = ratios.iter().find(|r| r.name == "kura/qemu").unwrap();
        assert_eq!((kq.compared.ratio.min, kq.compared.ratio.max), (0.9, 2.0));
        assert_eq!(kq.target, Some(1.0));
        assert_eq!(
            kq.compared.verdict,
            Some(crate::stats::Verdict::WithinNoise)
        );
        // No NBD samples: no ratio, not a division by zero.
        let kn = ratios.iter().find(|r| r.name == "kura/nbd").unwrap();
        assert_eq!(kn.compared.ratio.rounds, 0);
    }

    #[test]
    fn jobs_are_chosen_by_name_and_unknown_ones_refused() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            vm: VmArgs,
        }
        let args = Cli::parse_from(["x", "--jobs", "write-1m-qd4,randread-4k-qd1"]).vm;
        let p = plan(&args).unwrap();
        assert_eq!(
            p.jobs.iter().map(|j| j.name).collect::<Vec<_>>(),
            ["write-1m-qd4", "randread-4k-qd1"]
        );
        assert_eq!((p.rounds, p.secs, p.fio_size), (3, 3, 48 << 20));
        let quick = Cli::parse_from(["x", "--quick"]).vm;
        assert_eq!(plan(&quick).unwrap().jobs.len(), 2);
        let bad = Cli::parse_from(["x", "--jobs", "nope"]).vm;
        assert!(plan(&bad)
            .unwrap_err()
            .to_string()
            .contains("no job \"nope\""));
    }
}
