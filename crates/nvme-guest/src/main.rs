//! The test program the guest harness (`scripts/nvme-vm/`, `tests/vm.rs`) runs inside a QEMU
//! guest with an emulated NVMe controller:
//!
//! - `kura-nvme-guest pt /dev/ng0n1` — the device-interface suite every backend passes
//!   (`kura_engine::conformance`) through io_uring passthrough, a marker block for the host to
//!   find, and the cost per 4 KiB read; then the same suite and cost through the engine's
//!   `uring` backend on `/dev/nvme0n1`;
//! - `kura-nvme-guest vfio 0000:00:04.0` — the same through the user-space driver at two block sizes,
//!   an out-of-range read answered by the controller's status, four queue pairs on four
//!   threads, a controller reset and re-initialisation, shutdown and a second bring-up, a marker
//!   block and the cost per read;
//! - `kura-nvme-guest fs 0000:00:04.0` — AccelFS on namespace 2 through the user-space driver:
//!   mkfs, write a tree, fsck, remount and read it back;
//! - `bind`/`unbind BDF` move the controller between vfio-pci and the kernel driver, and
//!   `verify /dev/ngXnY` reads the marker blocks back through the kernel afterwards.
//!
//! Every line it prints starts with `PASS`, `FAIL`, `COST` or `GUEST-RESULT`.

use kura_engine::conformance;
use kura_engine::{BlockDevice, BlockingIo, DeviceError, IoBuf, Request};
use kura_nvme::NvmeQueue;
use std::time::Instant;

/// 4 KiB block the pt run marks, and the one the vfio run marks; the host checks both.
const PT_MARK: u64 = 3000;
const VFIO_MARK: u64 = 3001;

fn marker(tag: &str) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (i, x) in b.iter_mut().enumerate() {
        *x = tag.as_bytes()[i % tag.len()];
    }
    b
}

fn model_region(
    dev: &mut dyn BlockDevice,
    base: u64,
    blocks: u64,
    seeds: std::ops::Range<u64>,
) -> Result<String, String> {
    conformance::model_region(dev, base, blocks, seeds, 6)
}

/// The device-interface suite every backend passes (`kura_engine::conformance`), one step per
/// check, named `PREFIX CHECK`.
fn suite(dev: &mut dyn BlockDevice, prefix: &str, base: u64, blocks: u64, failed: &mut bool) {
    for (check, outcome) in conformance::suite(dev, base, blocks, base) {
        step(failed, &format!("{prefix} {check}"), outcome);
    }
}

fn cost(dev: &mut dyn BlockDevice, label: &str, depth: usize, n: u64) -> Result<(), String> {
    let mut bufs: Vec<IoBuf> = (0..depth).map(|_| IoBuf::zeroed(4096)).collect();
    let blocks = dev.geometry().num_blocks.min(4096);
    let per_block = 4096 / u64::from(dev.geometry().block_size);
    let mut done = Vec::new();
    let t = Instant::now();
    let cpu0 = cpu_seconds();
    let mut submit_time = std::time::Duration::ZERO;
    let mut sent = 0u64;
    while sent < n {
        let t_submit = Instant::now();
        while let Some(b) = bufs.pop() {
            let lba = (sent * 7919 % (blocks / per_block)) * per_block;
            dev.submit(Request::read(sent, lba, per_block, b))
                .map_err(|r| r.error.to_string())?;
            sent += 1;
        }
        dev.ring_doorbell().map_err(|e| e.to_string())?;
        submit_time += t_submit.elapsed();
        dev.poll(&mut done, 1).map_err(|e| e.to_string())?;
        for c in done.drain(..) {
            c.status.map_err(|e| e.to_string())?;
            bufs.extend(c.buf);
        }
    }
    while dev.in_flight() > 0 {
        dev.poll(&mut done, 1).map_err(|e| e.to_string())?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let cpu_us = (cpu_seconds() - cpu0) * 1e6 / n as f64;
    let sub_us = submit_time.as_secs_f64() * 1e6 / n as f64;
    println!(
        "COST {label} 4K read QD{depth}: {us:.1} us wall, {cpu_us:.1} us process CPU, {sub_us:.1} us submit+doorbell per command ({n} commands, emulated controller under TCG)"
    );
    Ok(())
}

/// User plus system CPU time of this process so far.
#[allow(unsafe_code)] // getrusage: the only unsafe in this crate
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills a zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Drives the timeout path against QEMU's controller: with a zero timeout every command still
/// outstanding at a check is aborted (QEMU answers "not aborted"), so the driver resets the
/// controller and fails what was in flight; afterwards the queue pair must work again.
fn timeout_recovery(q: &mut NvmeQueue) -> Result<String, String> {
    let before = q.stats();
    q.set_io_timeout(std::time::Duration::ZERO);
    let per = 128u64;
    let mut done = Vec::new();
    let mut rounds = 0;
    let (mut completions, mut ok, mut timed_out, mut cancelled) = (0, 0, 0, 0);
    // Checks run once a millisecond; keep 32 large reads in flight until one catches them.
    while rounds < 200 && q.stats().aborts == before.aborts {
        rounds += 1;
        for i in 0..32u64 {
            let buf = IoBuf::zeroed((per * 4096) as usize);
            q.submit(Request::read(i, i * per, per, buf))
                .map_err(|r| r.error.to_string())?;
        }
        while q.in_flight() > 0 {
            q.poll(&mut done, 1).map_err(|e| e.to_string())?;
        }
        // Count and let the buffers go back to the pool before the next round.
        for c in done.drain(..) {
            completions += 1;
            match c.status {
                Ok(()) => ok += 1,
                Err(DeviceError::Io { errno, .. }) if errno.0 == libc::ETIMEDOUT => timed_out += 1,
                Err(DeviceError::Io { errno, .. }) if errno.0 == libc::ECANCELED => cancelled += 1,
                Err(e) => return Err(format!("unexpected error: {e}")),
            }
        }
    }
    q.set_io_timeout(std::time::Duration::from_secs(20));
    let after = q.stats();
    if completions != 32 * rounds || after.aborts == before.aborts || timed_out == 0 {
        return Err(format!(
            "{completions} completions in {rounds} rounds, {timed_out} timed out, aborts {} -> {}",
            before.aborts, after.aborts
        ));
    }
    let mut b = vec![0u8; 4096];
    q.read_blocks(0, &mut b)
        .map_err(|e| format!("after recovery: {e}"))?;
    Ok(format!(
        "{rounds} rounds of 32 reads: {ok} completed, {timed_out} timed out, {cancelled} cancelled by the reset; aborts {}, resets {}; the queue works again",
        after.aborts - before.aborts,
        after.resets - before.resets
    ))
}

fn step(failed: &mut bool, name: &str, r: Result<String, String>) {
    match r {
        Ok(detail) => println!("PASS {name}: {detail}"),
        Err(e) => {
            println!("FAIL {name}: {e}");
            *failed = true;
        }
    }
}

fn open(spec: &str) -> Result<Box<dyn BlockDevice>, String> {
    let parsed = kura_engine::Spec::parse(spec).map_err(|e| e.to_string())?;
    kura_nvme::open_nvme_kind(&parsed)
        .ok_or_else(|| format!("{spec}: not an nvme kind"))?
        .map_err(|e| format!("{spec}: {e}"))
}

fn open_vfio(spec: &str) -> Result<NvmeQueue, String> {
    let parsed = kura_engine::Spec::parse(spec).map_err(|e| e.to_string())?;
    kura_nvme::vfio::open(&parsed).map_err(|e| format!("{spec}: {e}"))
}

fn run_pt(path: &str, failed: &mut bool) {
    let mut dev = match open(&format!("nvme-pt:{path}?bs=4096&qd=32")) {
        Ok(d) => d,
        Err(e) => return step(failed, "pt open", Err(e)),
    };
    println!("PASS pt open: {} {:?}", dev.describe(), dev.geometry());
    suite(&mut *dev, "pt", 0, 512, failed);
    step(
        failed,
        "pt marker",
        dev.write_blocks(PT_MARK, &marker("KURA-PT-"))
            .and_then(|()| dev.flush_all())
            .map(|()| format!("block {PT_MARK}"))
            .map_err(|e| e.to_string()),
    );
    step(
        failed,
        "pt cost",
        cost(&mut *dev, "nvme-pt", 1, 2000)
            .and_then(|()| cost(&mut *dev, "nvme-pt", 32, 4000))
            .map(|()| String::new()),
    );
    drop(dev);
    // The engine's io_uring backend on the block device of the same namespace, for comparison.
    let block = path.replace("/dev/ng", "/dev/nvme");
    match kura_engine::open(&format!("uring:{block}?bs=4096&qd=32")) {
        Ok(mut dev) => {
            suite(&mut *dev, "uring", 512, 512, failed);
            step(
                failed,
                "uring cost",
                cost(&mut *dev, "uring", 1, 2000)
                    .and_then(|()| cost(&mut *dev, "uring", 32, 4000))
                    .map(|()| String::new()),
            )
        }
        Err(e) => step(failed, "uring open", Err(e.to_string())),
    }
}

fn run_vfio(bdf: &str, failed: &mut bool) {
    // 512-byte blocks: the namespace's own, so unaligned offsets inside pages occur.
    match open_vfio(&format!("nvme:{bdf}?qd=16&timeout_ms=20000")) {
        Ok(mut q) => {
            let info = q.info().clone();
            println!(
                "PASS vfio open: {} model '{}' serial '{}' version {:?} mdts {:?} queues {} ns {:?}",
                q.describe(),
                info.model,
                info.serial,
                info.version,
                info.max_transfer,
                info.io_queues,
                info.ns
            );
            suite(&mut q, "vfio bs=512", 4096, 2048, failed);
            let end = info.ns.blocks;
            step(
                failed,
                "vfio out-of-range status",
                match q.raw_read(end - 1, 2, IoBuf::zeroed(1024)) {
                    Err(e @ DeviceError::OutOfRange { .. }) => Ok(format!("controller said: {e}")),
                    other => Err(format!("expected OutOfRange, got {other:?}")),
                },
            );
        }
        Err(e) => return step(failed, "vfio open", Err(e)),
    }
    // A second bring-up after the first controller shut down (CC.SHN) on drop.
    let mut q = match open_vfio(&format!(
        "nvme:{bdf}?bs=4096&qd=32&queues=4&timeout_ms=20000"
    )) {
        Ok(q) => q,
        Err(e) => return step(failed, "vfio reopen", Err(e)),
    };
    println!("PASS vfio reopen after shutdown: {:?}", q.geometry());
    suite(&mut q, "vfio bs=4096", 1024, 512, failed);
    let mut threads = Vec::new();
    for i in 0..3u64 {
        match q.new_queue() {
            Ok(mut other) => threads.push(std::thread::spawn(move || {
                model_region(&mut other, 1536 + i * 256, 256, 20 + i..21 + i)
            })),
            Err(e) => step(failed, "vfio new queue", Err(e.to_string())),
        }
    }
    let own = model_region(&mut q, 2304, 256, 30..31);
    let mut results = vec![own];
    results.extend(
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("thread panicked".into()))),
    );
    step(
        failed,
        "vfio 4 queues on 4 threads",
        results
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.join("; ")),
    );
    step(
        failed,
        "vfio reset",
        q.reset_controller()
            .map(|()| "controller reset, queue re-created".into())
            .map_err(|e| e.to_string()),
    );
    step(
        failed,
        "vfio timeout, abort, reset",
        timeout_recovery(&mut q),
    );
    step(
        failed,
        "vfio model after reset",
        model_region(&mut q, 2560, 256, 40..42),
    );
    step(
        failed,
        "vfio marker",
        q.write_blocks(VFIO_MARK, &marker("KURA-VFIO-"))
            .and_then(|()| q.flush_all())
            .map(|()| format!("block {VFIO_MARK}, stats {:?}", q.stats()))
            .map_err(|e| e.to_string()),
    );
    step(
        failed,
        "vfio cost",
        cost(&mut q, "nvme", 1, 2000)
            .and_then(|()| cost(&mut q, "nvme", 32, 4000))
            .map(|()| String::new()),
    );
}

/// Content of test file `i` of `len` bytes: recognisable on the image from the host.
fn fs_file(i: usize, len: usize) -> Vec<u8> {
    let tag = format!("KURA-FS-FILE-{i}-");
    (0..len).map(|j| tag.as_bytes()[j % tag.len()]).collect()
}

const FS_FILES: &[(&str, usize)] = &[
    ("/a/one-byte", 1),
    ("/a/b/small", 5000),
    ("/a/b/medium", 300 << 10),
    ("/big", 2 << 20),
];

/// AccelFS on namespace 2 through the user-space driver: mkfs, a tree written and unmounted,
/// fsck clean, then mounted again and read back. Every step reopens the controller.
fn run_fs(bdf: &str, failed: &mut bool) {
    use kura_accelfs::{fsck, mkfs, FileSystem, MkfsOptions, MountOptions};
    use std::io::{Read, Write};
    let spec = format!("nvme:{bdf}?nsid=2&bs=4096&qd=32&timeout_ms=20000");
    let dev = || -> Result<Box<dyn BlockDevice>, String> { Ok(Box::new(open_vfio(&spec)?)) };
    let write_tree = || -> Result<String, String> {
        let opts = MkfsOptions::default();
        let mut io = kura_accelfs::fsdevice::FsDevice::new(dev()?, opts.block_size as usize)
            .map_err(|e| e.to_string())?;
        mkfs(&mut io, opts).map_err(|e| format!("mkfs: {e}"))?;
        let fs = FileSystem::mount(io.into_device(), MountOptions::default())
            .map_err(|e| format!("mount: {e}"))?;
        fs.create_dir_all("/a/b").map_err(|e| e.to_string())?;
        for (i, (path, len)) in FS_FILES.iter().enumerate() {
            let mut f = fs.create(path).map_err(|e| format!("{path}: {e}"))?;
            f.write_all(&fs_file(i, *len))
                .map_err(|e| format!("{path}: {e}"))?;
            f.sync_all().map_err(|e| format!("{path}: {e}"))?;
        }
        fs.unmount().map_err(|e| format!("unmount: {e}"))?;
        Ok(format!("{} files", FS_FILES.len()))
    };
    step(failed, "fs mkfs and write a tree", write_tree());
    let check = || -> Result<String, String> {
        let r = fsck(dev()?).map_err(|e| e.to_string())?;
        if !r.is_clean() {
            return Err(format!("fsck problems: {:?}", r.problems));
        }
        Ok(format!(
            "clean: {} files, {} directories, {} of {} blocks used",
            r.files, r.directories, r.used_blocks, r.total_blocks
        ))
    };
    step(failed, "fs fsck", check());
    let read_back = || -> Result<String, String> {
        let fs = FileSystem::mount(dev()?, MountOptions::default())
            .map_err(|e| format!("mount: {e}"))?;
        for (i, (path, len)) in FS_FILES.iter().enumerate() {
            let mut f = fs.open(path).map_err(|e| format!("{path}: {e}"))?;
            let mut got = Vec::new();
            f.read_to_end(&mut got)
                .map_err(|e| format!("{path}: {e}"))?;
            if got != fs_file(i, *len) {
                return Err(format!(
                    "{path}: content differs ({} bytes read)",
                    got.len()
                ));
            }
        }
        fs.unmount().map_err(|e| format!("unmount: {e}"))?;
        Ok("every file read back after a remount".into())
    };
    step(failed, "fs read back", read_back());
    let genome = || -> Result<String, String> {
        let fs = FileSystem::mount(dev()?, MountOptions::default())
            .map_err(|e| format!("mount: {e}"))?;
        let report = genome_pipeline(&fs)?;
        fs.unmount().map_err(|e| format!("unmount: {e}"))?;
        Ok(report)
    };
    step(failed, "fs genome pipeline", genome());
}

/// The paper's application on the user-space driver: a small synthetic genome and simulated
/// reads are written to AccelFS, then loaded, indexed, saved, reloaded and matched, every
/// stage's file I/O going through `nvme:`. Passes when the placements are right.
fn genome_pipeline(fs: &kura_accelfs::FileSystem) -> Result<String, String> {
    use kura_genome::pipeline::{self, OutputFormat, RunOptions};
    use kura_genome::simulate::{self, GenomeOptions, ReadOptions, ReadSim};
    use kura_genome::store::Store;
    use std::io::Write;
    let genome = simulate::synthetic_genome(&GenomeOptions::with_total(11, 200_000));
    let store = Store::AccelFs(fs.clone());
    let mut out = store.create("genome/ref.fa").map_err(|e| e.to_string())?;
    simulate::write_fasta(&mut out, &genome, 80).map_err(|e| e.to_string())?;
    out.finish().map_err(|e| e.to_string())?;
    let opts = ReadOptions {
        seed: 5,
        n: 1000,
        ..ReadOptions::default()
    };
    let mut out = store.create("genome/reads.fq").map_err(|e| e.to_string())?;
    for pair in ReadSim::new(&genome, opts) {
        simulate::write_fastq_record(&mut out, &pair.first).map_err(|e| e.to_string())?;
    }
    out.flush().map_err(|e| e.to_string())?;
    out.finish().map_err(|e| e.to_string())?;
    let run = RunOptions {
        reference: "genome/ref.fa".into(),
        reads: "genome/reads.fq".into(),
        mates: None,
        index: "genome/ref.kgi".into(),
        output: Some(("genome/out.sam".into(), OutputFormat::Sam)),
        threads: 1,
        params: Default::default(),
        batch_bases: pipeline::DEFAULT_BATCH_BASES,
        command_line: "kura-nvme-guest".into(),
    };
    let r = pipeline::run(&store, &run, &mut |_| {}).map_err(|e| e.to_string())?;
    let a = r.accuracy;
    if a.reads != 1000 || a.fraction_correct() < 0.95 || a.misplaced_confident > 0 {
        return Err(format!("poor placements on nvme: {a:?}"));
    }
    let stages: Vec<String> = r
        .stages
        .named()
        .iter()
        .map(|(n, d)| format!("{n} {:.3}s", d.as_secs_f64()))
        .collect();
    Ok(format!(
        "{} of {} reads placed correctly (emulated controller; stages: {})",
        a.correct,
        a.reads,
        stages.join(", ")
    ))
}

/// Moves the controller between drivers with the library's sysfs logic.
fn run_rebind(bdf: &str, driver: Option<&str>, failed: &mut bool) {
    let sys = kura_nvme::pci::Sysfs::default();
    println!("PASS list: {:?}", sys.list());
    step(
        failed,
        &format!("rebind to {}", driver.unwrap_or("kernel driver")),
        sys.rebind(bdf, driver, std::time::Duration::from_secs(10))
            .map(|d| format!("{bdf} now on {d}"))
            .map_err(|e| e.to_string()),
    );
}

/// Back on the kernel's driver: both marker blocks read through passthrough, so what the
/// user-space driver wrote is what the kernel sees.
fn run_verify(path: &str, failed: &mut bool) {
    let r = open(&format!("nvme-pt:{path}?bs=4096")).and_then(|mut dev| {
        let mut b = vec![0u8; 4096];
        dev.read_blocks(PT_MARK, &mut b)
            .map_err(|e| e.to_string())?;
        if b != marker("KURA-PT-") {
            return Err(format!("block {PT_MARK} lost the passthrough marker"));
        }
        dev.read_blocks(VFIO_MARK, &mut b)
            .map_err(|e| e.to_string())?;
        if b != marker("KURA-VFIO-") {
            return Err(format!(
                "block {VFIO_MARK} lacks the user-space driver's marker"
            ));
        }
        Ok("both markers read back through the kernel driver".to_string())
    });
    step(failed, "verify after rebind to kernel", r);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut failed = false;
    match (args.get(1).map(String::as_str), args.get(2)) {
        (Some("pt"), Some(path)) => run_pt(path, &mut failed),
        (Some("vfio"), Some(bdf)) => run_vfio(bdf, &mut failed),
        (Some("fs"), Some(bdf)) => run_fs(bdf, &mut failed),
        (Some("bind"), Some(bdf)) => run_rebind(bdf, Some("vfio-pci"), &mut failed),
        (Some("unbind"), Some(bdf)) => run_rebind(bdf, None, &mut failed),
        (Some("verify"), Some(path)) => run_verify(path, &mut failed),
        _ => {
            eprintln!("usage: kura-nvme-guest pt /dev/ngXnY | vfio BDF | fs BDF | bind BDF | unbind BDF | verify /dev/ngXnY");
            std::process::exit(2);
        }
    }
    println!(
        "GUEST-RESULT {} {}",
        args[1],
        if failed { "fail" } else { "pass" }
    );
}
