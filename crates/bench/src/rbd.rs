//! `kura bench rbd`: kura on a Ceph RBD image against librbd's own tools, on one cluster (a
//! throw-away one from `scripts/ceph/start.sh` unless `--conf` names a running one).
//!
//! - **Interface cost**: 4 KiB random read and write at QD 1 and 32 and 1 MiB sequential read
//!   at QD 16, `rbd bench` (librbd directly) against kura's `rbd:` device driven by the bench
//!   runner with the same operation count, depth and image. Target: kura ≥ 1.0x at QD 32.
//! - **DeLiBA's stack**: `cache(coalesce(rbd:…))?size=32M` (DeLiBA's order: NBD → LRU cache →
//!   coalescing scheduler → librbd) and the other order, against pass-through `rbd:`: a 4 KiB
//!   QD 32 random read over a hot set that fits the cache, after one sequential pass warms it
//!   (target ≥ 2x), and a cold 1 MiB sequential read of the whole image (target ≤ 5 % lower);
//!   the cache's hits and misses, and how many 4 KiB sequential writes at QD 32 the coalescing
//!   scheduler merged on its own.
//! - **NBD**: kura's export of `rbd:` against `qemu-nbd -f raw rbd:POOL/IMAGE:conf=…` (Debian's
//!   qemu-block-extra) on a copy of the image (`rbd cp`: one writer per image): `nbdcopy` reading the whole image (same connection
//!   count), and `fio --ioengine=nbd` 4 KiB random read at QD 1 and 32 and random write at
//!   QD 32. Target ≥ 1.0x.
//!
//! Every pair alternates in rounds (`--rounds`, 3 by default) and reports median [min–max]
//! ([`crate::stats`]); every peer's command line is in the JSON.

use crate::io::workload::{self, Job, Pattern};
use crate::output::{plot_help, RunArgs};
use crate::stats::{compare, interleave, lower_by, quotient, Compared, Goal};
use anyhow::{bail, Context};
use kura_engine::{BlockDevice, Registry};
use kura_rbd::testing::TestCluster;
use kura_vdrive::{Cache, CacheMode, Coalesce};
use serde::Serialize;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PLOT: &str = include_str!("../../../scripts/plot_rbd.py");
const IMAGE: &str = "kura-bench";
/// qemu-nbd's image in the NBD part: a copy of [`IMAGE`], since one image takes one writer
/// (kura's `rbd:` holds the image's exclusive lock while its export is up).
const PEER_IMAGE: &str = "kura-bench-peer";

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("plot", |a| plot_help(a, "rbd")))]
pub struct RbdBenchArgs {
    /// ceph.conf of a running cluster with an `rbd` pool (default: start a throw-away cluster
    /// with scripts/ceph/start.sh and stop it at the end).
    #[arg(long)]
    pub conf: Option<PathBuf>,
    /// Size of the bench image (created, filled, removed at the end).
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Operations per QD 32 point (QD 1 points take an eighth).
    #[arg(long, default_value_t = 8000)]
    pub ops: u64,
    /// The hot set of the cache test (must fit the 32 MiB cache).
    #[arg(long, default_value = "16M")]
    pub hot: String,
    /// Rounds per point (default 3, 1 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub test: String,
    pub unit: String,
    pub kura_spec: String,
    pub peer: String,
    pub peer_command: String,
    pub compared: Compared,
    pub target: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rounds: usize,
    pub image_bytes: u64,
    pub cluster: String,
    pub interface: Vec<Point>,
    pub deliba: Vec<Point>,
    pub nbd: Vec<Point>,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub coalesce_requests: u64,
    pub coalesce_child_commands: u64,
    pub coalesce_merged: u64,
    pub notes: Vec<String>,
}

/// One point of the interface comparison.
struct Case {
    test: &'static str,
    pattern: Pattern,
    bytes: usize,
    depth: usize,
    ops: u64,
    /// Judged against the ≥ 1.0x target.
    judged: bool,
}

fn registry() -> Registry {
    let mut r = Registry::engine();
    kura_vdrive::register(&mut r);
    kura_rbd::register(&mut r);
    r
}

fn open(spec: &str) -> anyhow::Result<Box<dyn BlockDevice>> {
    registry()
        .open(spec)
        .with_context(|| format!("opening {spec}"))
}

/// One measurement of `job` on a freshly opened `spec` over its first `span` bytes.
fn kura_point(spec: &str, job: &Job, span: u64) -> anyhow::Result<workload::Outcome> {
    let mut dev = open(spec)?;
    workload::run_within(&mut *dev, job, span)
}

fn job(pattern: Pattern, bytes: usize, depth: usize, ops: u64) -> Job {
    Job {
        pattern,
        bytes,
        depth,
        duration: Duration::from_secs(600),
        max_ops: ops,
        seed: 7,
    }
}

/// `rbd bench` on the bench image; returns (ops/s, MiB/s) and its command line.
fn rbd_bench(
    conf: &str,
    io_type: &str,
    pattern: &str,
    bytes: usize,
    threads: usize,
    ops: u64,
) -> anyhow::Result<(f64, f64, String)> {
    let total = (bytes as u64 * ops).to_string();
    let args = [
        "-c",
        conf,
        "bench",
        "--io-type",
        io_type,
        "--io-size",
        &bytes.to_string(),
        "--io-threads",
        &threads.to_string(),
        "--io-pattern",
        pattern,
        "--io-total",
        &total,
        &format!("rbd/{IMAGE}"),
    ];
    let cmd = format!("rbd {}", args.join(" "));
    let out = Command::new("rbd")
        .args(args)
        .output()
        .context("running rbd bench")?;
    if !out.status.success() {
        bail!("{cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // Last line: "elapsed: 3   ops: 4096   ops/sec: 1234.5   bytes/sec: 4.8 MiB/s"
    let line = text
        .lines()
        .rfind(|l| l.contains("ops/sec:"))
        .with_context(|| format!("{cmd}: no summary in {text}"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let ops_s: f64 = words
        .iter()
        .position(|w| *w == "ops/sec:")
        .and_then(|i| words.get(i + 1))
        .and_then(|w| w.parse().ok())
        .filter(|r: &f64| r.is_finite() && *r > 0.0)
        .with_context(|| format!("{cmd}: no usable ops/sec in {line}"))?;
    Ok((ops_s, ops_s * bytes as f64 / 1048576.0, cmd))
}

/// Times `nbdcopy URL null:` (4 connections); MiB/s of `bytes`.
fn nbdcopy_read(url: &str, bytes: u64) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let out = Command::new("nbdcopy")
        .args(["--connections=4", url, "null:"])
        .output()
        .context("running nbdcopy")?;
    if !out.status.success() {
        bail!("nbdcopy {url}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(bytes as f64 / 1048576.0 / t0.elapsed().as_secs_f64())
}

/// IOPS of `fio --ioengine=nbd` on `url` for `seconds`.
fn fio_nbd(url: &str, rw: &str, depth: usize, seconds: u32) -> anyhow::Result<f64> {
    let out = Command::new("fio")
        .args([
            "--name=nbd",
            "--ioengine=nbd",
            &format!("--uri={url}"),
            &format!("--rw={rw}"),
            "--bs=4k",
            &format!("--iodepth={depth}"),
            "--time_based",
            &format!("--runtime={seconds}"),
            "--output-format=json",
        ])
        .output()
        .context("running fio")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("fio on {url}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // fio's nbd engine prints a line before the JSON.
    let json: serde_json::Value = serde_json::from_str(&text[text.find('{').unwrap_or(0)..])
        .with_context(|| format!("fio's JSON: {text}"))?;
    let side = if rw.contains("write") {
        "write"
    } else {
        "read"
    };
    json["jobs"][0][side]["iops"]
        .as_f64()
        .with_context(|| format!("no {side} IOPS in fio's JSON"))
}

/// One NBD point: `(test, unit, [kura samples, qemu samples], client)`.
type NbdSamples = (&'static str, &'static str, Vec<Vec<f64>>, &'static str);

/// The NBD points, each interleaved between kura's export and qemu-nbd's.
fn nbd_points(
    rounds: usize,
    kura: &str,
    qemu: &str,
    size: u64,
    seconds: u32,
) -> anyhow::Result<Vec<NbdSamples>> {
    let mut out = vec![(
        "read of the whole image",
        "MiB/s",
        interleave(
            rounds,
            &mut [&mut |_| nbdcopy_read(kura, size), &mut |_| {
                nbdcopy_read(qemu, size)
            }],
        )?,
        "nbdcopy --connections=4",
    )];
    if installed("fio") {
        for (test, rw, depth) in [
            ("4K randread QD1", "randread", 1),
            ("4K randread QD32", "randread", 32),
            ("4K randwrite QD32", "randwrite", 32),
        ] {
            let samples = interleave(
                rounds,
                &mut [&mut |_| fio_nbd(kura, rw, depth, seconds), &mut |_| {
                    fio_nbd(qemu, rw, depth, seconds)
                }],
            )?;
            out.push((test, "IOPS", samples, "fio --ioengine=nbd"));
        }
    }
    Ok(out)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn point(
    test: &str,
    unit: &str,
    kura_spec: &str,
    peer: &str,
    peer_command: String,
    compared: Compared,
    target: Option<&str>,
) -> Point {
    Point {
        test: test.into(),
        unit: unit.into(),
        kura_spec: kura_spec.into(),
        peer: peer.into(),
        peer_command,
        compared,
        target: target.map(str::to_owned),
    }
}

pub fn run(args: &RbdBenchArgs) -> anyhow::Result<()> {
    let rounds = args
        .rounds
        .unwrap_or(if args.run.quick { 1 } else { 3 })
        .max(1);
    let size = kura_engine::spec::parse_size(&args.size).map_err(anyhow::Error::msg)?;
    let hot = kura_engine::spec::parse_size(&args.hot).map_err(anyhow::Error::msg)?;
    let ops = if args.run.quick {
        args.ops / 8
    } else {
        args.ops
    }
    .max(64);
    let _cluster;
    let conf = match &args.conf {
        Some(c) => c.display().to_string(),
        None => {
            eprintln!("starting a throw-away cluster (scripts/ceph/start.sh)...");
            let c = TestCluster::start().map_err(anyhow::Error::msg)?;
            eprintln!("cluster up in {:.1} s", c.start_secs);
            let conf = c.conf().display().to_string();
            _cluster = c;
            conf
        }
    };
    let rbd = format!("rbd:rbd/{IMAGE}?conf={conf}");
    // A fresh image, filled so every read reaches the OSDs (and no copy left by an earlier run).
    for image in [IMAGE, PEER_IMAGE] {
        let _ = Command::new("rbd")
            .args(["-c", &conf, "rm", &format!("rbd/{image}")])
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status();
    }
    {
        let mut dev = open(&format!("{rbd}&create={size}"))?;
        let fill = job(Pattern::SeqWrite, 1 << 20, 16, size >> 20);
        workload::run(&mut *dev, &fill).context("filling the image")?;
        kura_engine::BlockingIo::flush_all(&mut *dev)?;
    }
    let mut report = Report {
        rounds,
        image_bytes: size,
        cluster: conf.clone(),
        interface: Vec::new(),
        deliba: Vec::new(),
        nbd: Vec::new(),
        cache_hits: 0,
        cache_misses: 0,
        coalesce_requests: 0,
        coalesce_child_commands: 0,
        coalesce_merged: 0,
        notes: vec![
            "memstore OSDs on one host: the cluster is CPU-bound, not disk-bound".into(),
            "librbd's cache: the cluster's settings for both sides; kura's rbd: writes back from \
             the first write (rbd bench's writes are cached the same way)"
                .into(),
        ],
    };

    // 1. The interface: kura rbd: against rbd bench.
    let case = |test, pattern, bytes, depth, n, judged| Case {
        test,
        pattern,
        bytes,
        depth,
        ops: n,
        judged,
    };
    // QD 1 points run an eighth of the operations, but never so few that rbd bench's own
    // rate (ops over its elapsed time) stops meaning anything.
    let qd1_ops = (ops / 8).max(256);
    let cases = [
        case(
            "4K randread QD1",
            Pattern::RandRead,
            4096,
            1,
            qd1_ops,
            false,
        ),
        case("4K randread QD32", Pattern::RandRead, 4096, 32, ops, true),
        case(
            "4K randwrite QD1",
            Pattern::RandWrite,
            4096,
            1,
            qd1_ops,
            false,
        ),
        case("4K randwrite QD32", Pattern::RandWrite, 4096, 32, ops, true),
        case(
            "1M seqread QD16",
            Pattern::SeqRead,
            1 << 20,
            16,
            size >> 20,
            false,
        ),
    ];
    for Case {
        test,
        pattern,
        bytes,
        depth,
        ops: n,
        judged,
    } in cases
    {
        let io_type = if pattern == Pattern::RandWrite {
            "write"
        } else {
            "read"
        };
        let pat = if pattern == Pattern::SeqRead {
            "seq"
        } else {
            "rand"
        };
        let mut cmd = String::new();
        let j = job(pattern, bytes, depth, n.max(16));
        let unit = if bytes >= 1 << 20 { "MiB/s" } else { "IOPS" };
        let pick = |o: &workload::Outcome| {
            if bytes >= 1 << 20 {
                o.mib_per_s()
            } else {
                o.iops()
            }
        };
        let samples = interleave(
            rounds,
            &mut [
                &mut |_| kura_point(&rbd, &j, u64::MAX).map(|o| pick(&o)),
                &mut |_| {
                    rbd_bench(&conf, io_type, pat, bytes, depth, n.max(16)).map(|(o, m, c)| {
                        cmd = c;
                        if bytes >= 1 << 20 {
                            m
                        } else {
                            o
                        }
                    })
                },
            ],
        )?;
        let goal = judged.then_some(Goal::AtLeast(1.0));
        let c = compare(&samples[0], &samples[1], quotient, goal);
        eprintln!(
            "{test}: kura {} vs rbd bench {} {unit}",
            c.kura.show(0),
            c.peer.show(0)
        );
        report.interface.push(point(
            test,
            unit,
            &rbd,
            "rbd bench",
            cmd,
            c,
            judged.then_some("kura ≥ 1.0x"),
        ));
    }

    // 2. DeLiBA's stack against pass-through.
    let stack = format!("cache(coalesce({rbd}))?size=32M");
    let other = format!("coalesce(cache({rbd})?size=32M)");
    let hot_job = job(Pattern::RandRead, 4096, 32, ops);
    let warm = job(Pattern::SeqRead, 1 << 20, 8, hot >> 20);
    let mut hits = 0;
    let mut misses = 0;
    let samples = interleave(
        rounds,
        &mut [
            &mut |_| kura_point(&rbd, &hot_job, hot).map(|o| o.iops()),
            &mut |_| {
                // The stack built by hand so the cache's counters can be read afterwards.
                let child = open(&rbd)?;
                let co = Coalesce::new(child, 1 << 20)?;
                let mut cache = Cache::new(Box::new(co), 32 << 20, CacheMode::WriteThrough)?;
                workload::run_within(&mut cache, &warm, hot)?;
                let before = cache.stats();
                let o = workload::run_within(&mut cache, &hot_job, hot)?;
                let after = cache.stats();
                hits += after.hits - before.hits;
                misses += after.misses - before.misses;
                Ok::<f64, anyhow::Error>(o.iops())
            },
            &mut |_| {
                let mut dev = open(&other)?;
                workload::run_within(&mut *dev, &warm, hot)?;
                Ok(workload::run_within(&mut *dev, &hot_job, hot)?.iops())
            },
        ],
    )?;
    report.cache_hits = hits;
    report.cache_misses = misses;
    let c = compare(&samples[1], &samples[0], quotient, Some(Goal::AtLeast(2.0)));
    eprintln!(
        "hot-set 4K randread QD32: stack {} vs pass-through {} IOPS (cache hits {hits}, misses {misses})",
        c.kura.show(0),
        c.peer.show(0)
    );
    report.deliba.push(point(
        "hot-set 4K randread QD32, warm 32 MiB cache",
        "IOPS",
        &stack,
        "rbd: pass-through",
        rbd.clone(),
        c,
        Some("stack ≥ 2x"),
    ));
    let c = compare(&samples[2], &samples[0], quotient, None);
    report.deliba.push(point(
        "hot-set 4K randread QD32, other order",
        "IOPS",
        &other,
        "rbd: pass-through",
        rbd.clone(),
        c,
        None,
    ));
    let cold = job(Pattern::SeqRead, 1 << 20, 16, size >> 20);
    let cache_only = format!("cache({rbd})?size=32M");
    let coalesce_only = format!("coalesce({rbd})");
    let samples = interleave(
        rounds,
        &mut [
            &mut |_| kura_point(&rbd, &cold, u64::MAX).map(|o| o.mib_per_s()),
            &mut |_| kura_point(&stack, &cold, u64::MAX).map(|o| o.mib_per_s()),
            &mut |_| kura_point(&cache_only, &cold, u64::MAX).map(|o| o.mib_per_s()),
            &mut |_| kura_point(&coalesce_only, &cold, u64::MAX).map(|o| o.mib_per_s()),
        ],
    )?;
    // Which layer costs what on a stream: each alone against the same pass-through rounds.
    for (i, (name, spec)) in [
        (2, ("cache alone", &cache_only)),
        (3, ("coalesce alone", &coalesce_only)),
    ] {
        let c = compare(&samples[i], &samples[0], lower_by, None);
        report.deliba.push(point(
            &format!("cold 1M seqread QD16, {name} (fraction lower)"),
            "MiB/s",
            spec,
            "rbd: pass-through",
            rbd.clone(),
            c,
            None,
        ));
    }
    let c = compare(&samples[1], &samples[0], lower_by, Some(Goal::AtMost(0.05)));
    eprintln!(
        "cold 1M seqread: stack {} vs pass-through {} MiB/s",
        c.kura.show(0),
        c.peer.show(0)
    );
    report.deliba.push(point(
        "cold 1M seqread QD16 (fraction lower)",
        "MiB/s",
        &stack,
        "rbd: pass-through",
        rbd.clone(),
        c,
        Some("≤ 5 % lower"),
    ));
    // The scheduler alone on a stream it can merge.
    let seqw = job(Pattern::SeqWrite, 4096, 32, ops);
    let mut merged = (0, 0, 0);
    let samples = interleave(
        rounds,
        &mut [
            &mut |_| kura_point(&rbd, &seqw, u64::MAX).map(|o| o.iops()),
            &mut |_| {
                let mut co = Coalesce::new(open(&rbd)?, 1 << 20)?;
                let o = workload::run(&mut co, &seqw)?;
                let s = co.stats();
                merged = (s.requests, s.child_commands, s.merged);
                Ok::<f64, anyhow::Error>(o.iops())
            },
        ],
    )?;
    (
        report.coalesce_requests,
        report.coalesce_child_commands,
        report.coalesce_merged,
    ) = merged;
    let c = compare(&samples[1], &samples[0], quotient, None);
    eprintln!(
        "4K seqwrite QD32: coalesce {} vs pass-through {} IOPS ({} of {} requests merged)",
        c.kura.show(0),
        c.peer.show(0),
        merged.2,
        merged.0
    );
    report.deliba.push(point(
        "4K seqwrite QD32 through coalesce",
        "IOPS",
        &format!("coalesce({rbd})"),
        "rbd: pass-through",
        rbd.clone(),
        c,
        None,
    ));

    // 3. NBD: kura's export of rbd: against qemu-nbd on a copy of it (one writer per image).
    if installed("nbdcopy") && installed("qemu-nbd") {
        let listener = kura_nbd::bind_loopback(0)?;
        let addr = listener.local_addr()?;
        let server = kura_nbd::serve(
            listener,
            vec![kura_nbd::Export::new("disk", open(&rbd)?)],
            kura_nbd::ServeOptions::default(),
        )?;
        let kura_url = format!("nbd://{addr}/disk");
        let copied = Command::new("rbd")
            .args([
                "-c",
                &conf,
                "cp",
                &format!("rbd/{IMAGE}"),
                &format!("rbd/{PEER_IMAGE}"),
            ])
            .output()
            .context("running rbd cp")?;
        if !copied.status.success() {
            bail!(
                "rbd cp rbd/{IMAGE} rbd/{PEER_IMAGE}: {}",
                String::from_utf8_lossy(&copied.stderr)
            );
        }
        let port = free_port()?;
        let qemu_args = vec![
            "-f".to_string(),
            "raw".into(),
            "-t".into(),
            "-e".into(),
            "4".into(),
            "-x".into(),
            "disk".into(),
            "-b".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            format!("rbd:rbd/{PEER_IMAGE}:conf={conf}"),
        ];
        let qemu_cmd = format!("qemu-nbd {}", qemu_args.join(" "));
        let mut qemu = Command::new("qemu-nbd")
            .args(&qemu_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting qemu-nbd")?;
        let qemu_url = format!("nbd://127.0.0.1:{port}/disk");
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = qemu.kill();
                bail!("qemu-nbd did not listen within 30 s: {qemu_cmd}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let result = nbd_points(
            rounds,
            &kura_url,
            &qemu_url,
            size,
            if args.run.quick { 1 } else { 3 },
        );
        let _ = qemu.kill();
        let _ = qemu.wait();
        server.stop();
        for (test, unit, samples, client) in result? {
            let c = compare(&samples[0], &samples[1], quotient, Some(Goal::AtLeast(1.0)));
            eprintln!(
                "NBD {test}: kura serve {} vs qemu-nbd {} {unit}",
                c.kura.show(0),
                c.peer.show(0)
            );
            report.nbd.push(point(
                &format!("{test} ({client})"),
                unit,
                &rbd,
                "qemu-nbd",
                qemu_cmd.clone(),
                c,
                Some("kura ≥ 1.0x"),
            ));
        }
    } else {
        report
            .notes
            .push("NBD part skipped: nbdcopy or qemu-nbd not installed".into());
    }

    for image in [IMAGE, PEER_IMAGE] {
        let _ = Command::new("rbd")
            .args(["-c", &conf, "rm", &format!("rbd/{image}")])
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status();
    }
    print_table(&report);
    args.run.output.emit("rbd", PLOT, &report)
}

/// True when `tool` is on `PATH`.
fn installed(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn print_table(report: &Report) {
    println!(
        "kura bench rbd: {} rounds, image {} MiB, cluster {}",
        report.rounds,
        report.image_bytes >> 20,
        report.cluster
    );
    println!(
        "{:<46} {:>22} {:>22} {:>18}  target",
        "test", "kura", "peer", "ratio"
    );
    for p in report
        .interface
        .iter()
        .chain(&report.deliba)
        .chain(&report.nbd)
    {
        let verdict = p
            .compared
            .verdict
            .map(|v| format!("{} ({})", p.target.clone().unwrap_or_default(), v.word()))
            .unwrap_or_default();
        println!(
            "{:<46} {:>22} {:>22} {:>18}  {verdict}",
            format!("{} [{}] vs {}", p.test, p.unit, p.peer),
            p.compared.kura.show(0),
            p.compared.peer.show(0),
            p.compared.ratio.show(2),
        );
    }
    println!(
        "cache: {} hits, {} misses in the hot-set runs; coalesce: {} requests, {} child commands, {} merged",
        report.cache_hits,
        report.cache_misses,
        report.coalesce_requests,
        report.coalesce_child_commands,
        report.coalesce_merged
    );
}
