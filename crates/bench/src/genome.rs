//! `kura bench genome`: the application against the tool bioinformaticians use. The same reads
//! (pywgsim's, as the issue defines them, when pywgsim is installed; kura's own simulator
//! otherwise) are mapped by the whole kura pipeline on each I/O path and by `minimap2 -ax sr`
//! with the same threads, alternating, each run a child process so its wall time and peak RSS
//! (`wait4`) are its own. Accuracy of both is scored from the read names. Read loading is set
//! against the device's sequential read bandwidth measured on the same image file.

use crate::io::workload::{Job, Pattern};
use crate::output::{plot_help, RunArgs};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_engine::BlockDevice;
use kura_genome::paths::{drop_page_cache, IoPath, Workspace, MG1655};
use kura_genome::pipeline;
use kura_genome::truth::{score_sam, ScoreOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PLOT: &str = include_str!("../../../scripts/plot_genome.py");

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("quick", |a| a.help("A short run for smoke tests (at most 20k reads, one round)")), mut_arg("plot", |a| plot_help(a, "genome")))]
pub struct GenomeBenchArgs {
    /// Directory for the dataset, the images and the outputs (a disk file system).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Single-end 150 bp reads simulated from the reference.
    #[arg(long, default_value_t = 200_000)]
    pub reads: u64,
    /// Reference FASTA (default: MG1655 from ragout-examples, else a synthetic genome).
    #[arg(long = "ref")]
    pub reference: Option<PathBuf>,
    /// Threads for kura and minimap2 alike.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// kura's I/O paths, comma-separated (accelfs, host, redirect).
    #[arg(long, default_value = "accelfs,host,redirect")]
    pub paths: String,
    /// Rounds per system (alternating); the fastest counts.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    #[command(flatten)]
    pub run: RunArgs,
}

/// One system's best round.
#[derive(Debug, Clone, Serialize)]
pub struct SystemPoint {
    pub system: String,
    /// Short name for plots.
    pub label: String,
    /// End-to-end seconds: kura's pipeline total (load reference … write SAM), minimap2's wall.
    pub seconds: f64,
    /// Wall time of the whole child process (kura's includes copying the dataset into its image).
    pub process_seconds: f64,
    pub peak_rss_mib: f64,
    pub correct: u64,
    pub reads: u64,
    pub misplaced_mapq_ge_20: u64,
    /// kura only: seconds in each stage of the best round.
    pub stages: Vec<(String, f64)>,
    /// kura only: bytes of reads per second of the "load reads" stage (I/O and parsing).
    pub load_reads_mb_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub reads: u64,
    pub reference: String,
    pub simulator: String,
    pub threads: usize,
    pub rounds: usize,
    pub systems: Vec<SystemPoint>,
    /// Sequential read of the reads file's size from the image with 1 MiB commands at QD 32.
    pub device_seq_read_mb_s: f64,
    /// The reads file streamed from AccelFS on the direct engine, without parsing.
    pub accelfs_stream_mb_s: f64,
    pub notes: Vec<String>,
}

pub fn run(args: &GenomeBenchArgs) -> anyhow::Result<()> {
    let reads = if args.run.quick {
        args.reads.min(20_000)
    } else {
        args.reads
    };
    let rounds = if args.run.quick {
        1
    } else {
        args.rounds.max(1)
    };
    let kura = std::env::current_exe().context("finding the kura binary")?;
    let minimap2 = which("minimap2");
    let dir = tempfile::Builder::new()
        .prefix("kura-bench-genome")
        .tempdir_in(&args.dir)
        .with_context(|| format!("creating a work dir in {}", args.dir.display()))?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let (reference, reference_name) = reference(args, &data)?;
    let (reads_fq, simulator) = simulate(&kura, &reference, &data, reads)?;
    let paths = IoPath::parse_list(&args.paths).map_err(|e| anyhow::anyhow!("--paths: {e}"))?;
    let bar = ProgressBar::new((rounds * (paths.len() + 1)) as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut best: Vec<Option<SystemPoint>> = vec![None; paths.len() + 1];
    for round in 0..rounds {
        for (i, path) in paths.iter().enumerate() {
            bar.set_message(format!("round {}: kura on {}", round + 1, path.name()));
            let p = run_kura(
                &kura,
                *path,
                &reference,
                &reads_fq,
                dir.path(),
                args.threads,
            )?;
            keep_best(&mut best[i], p);
            bar.inc(1);
        }
        match &minimap2 {
            Some(mm) => {
                bar.set_message(format!("round {}: minimap2", round + 1));
                let p = run_minimap2(mm, &reference, &reads_fq, dir.path(), args.threads)?;
                keep_best(&mut best[paths.len()], p);
            }
            None => bar.println("minimap2 is not installed (apt-get install minimap2): no peer"),
        }
        bar.inc(1);
    }
    bar.set_message("device bandwidth");
    let (device, stream) = read_bandwidth(dir.path(), &reads_fq)?;
    bar.finish_and_clear();
    let mut report = Report {
        reads,
        reference: reference_name,
        simulator,
        threads: args.threads,
        rounds,
        systems: best.into_iter().flatten().collect(),
        device_seq_read_mb_s: device,
        accelfs_stream_mb_s: stream,
        notes: Vec::new(),
    };
    report.notes.push(
        "kura's time is the pipeline's total (load reference, index, save index, load index, load reads, match, write SAM); minimap2's is its process wall time (load, index, map, write SAM)".into(),
    );
    report.notes.push(
        "peak RSS by wait4 of each child process; kura's includes copying the dataset into its image before the pipeline starts".into(),
    );
    print_report(&report);
    args.run.output.emit("genome", PLOT, &report)
}

fn keep_best(slot: &mut Option<SystemPoint>, p: SystemPoint) {
    if slot.as_ref().is_none_or(|b| p.seconds < b.seconds) {
        *slot = Some(p);
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// The reference as a plain FASTA in `data` (minimap2 and kura read the same file).
fn reference(args: &GenomeBenchArgs, data: &Path) -> anyhow::Result<(PathBuf, String)> {
    let out = data.join("reference.fa");
    let source = match &args.reference {
        Some(r) => r.clone(),
        None if Path::new(MG1655).exists() => PathBuf::from(MG1655),
        None => {
            let status = Command::new(std::env::current_exe()?)
                .args(["genome", "simulate", "--reads", "0", "-o"])
                .arg(data)
                .stdout(Stdio::null())
                .status()?;
            if !status.success() {
                bail!("kura genome simulate failed");
            }
            return Ok((out, "synthetic 4.6 Mb genome (seed 42)".into()));
        }
    };
    let store = kura_genome::store::Store::host("");
    let name = source.display().to_string();
    let records = kura_genome::fasta::FastaReader::new(store.open_stream(&name)?, name.as_str())
        .read_all()?;
    kura_genome::simulate::write_fasta(
        std::io::BufWriter::new(std::fs::File::create(&out)?),
        &records,
        80,
    )?;
    Ok((out, name))
}

/// Single-end reads: pywgsim's (the issue's definition) when installed, else kura's simulator.
fn simulate(
    kura: &Path,
    reference: &Path,
    data: &Path,
    reads: u64,
) -> anyhow::Result<(PathBuf, String)> {
    let r1 = data.join("reads_1.fq");
    if let Some(pywgsim) = which("pywgsim") {
        let r2 = data.join("pywgsim_2.fq");
        let status = Command::new(pywgsim)
            .args([
                "-e", "0.002", "-r", "0.001", "-S", "42", "-1", "150", "-2", "150", "-N",
            ])
            .arg(reads.to_string())
            .arg(reference)
            .arg(&r1)
            .arg(&r2)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            std::fs::remove_file(&r2).ok();
            return Ok((
                r1,
                "pywgsim -e 0.002 -r 0.001 -S 42, 150 bp, first mates".into(),
            ));
        }
    }
    let status = Command::new(kura)
        .args(["genome", "simulate", "--reference"])
        .arg(reference)
        .args(["--reads", &reads.to_string(), "-o"])
        .arg(data)
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("kura genome simulate failed");
    }
    Ok((
        r1,
        "kura's simulator (pywgsim not installed): wgsim-like, seed 42".into(),
    ))
}

/// Runs a child to completion; returns (wall, peak RSS in MiB).
#[allow(unsafe_code)] // wait4(2) for the child's rusage
fn measured(cmd: &mut Command) -> anyhow::Result<(Duration, f64)> {
    let t = Instant::now();
    let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in; the pid is our own child, not yet reaped.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to locals for the duration of the call.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = t.elapsed();
    if rc != pid {
        bail!("wait4 on {cmd:?}: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{cmd:?} failed (wait status {status:#x})");
    }
    Ok((wall, usage.ru_maxrss as f64 / 1024.0))
}

fn run_kura(
    kura: &Path,
    path: IoPath,
    reference: &Path,
    reads: &Path,
    dir: &Path,
    threads: usize,
) -> anyhow::Result<SystemPoint> {
    let json = dir.join(format!("kura-{}.json", path.name()));
    let work = dir.join(format!("kura-{}", path.name()));
    let mut cmd = Command::new(kura);
    cmd.args(["genome", "run", "--quiet", "--ref"])
        .arg(reference)
        .arg("--reads")
        .arg(reads)
        .args(["--paths", path.name(), "--threads", &threads.to_string()])
        .arg("--dir")
        .arg(&work)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null());
    let (wall, rss) = measured(&mut cmd)?;
    std::fs::remove_dir_all(&work).ok();
    let text = std::fs::read_to_string(&json).with_context(|| format!("{}", json.display()))?;
    let runs: serde_json::Value = serde_json::from_str(&text)?;
    let r = &runs[0];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0);
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let stages: Vec<(String, f64)> = r["stages_s"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| (p[0].as_str().unwrap_or("?").to_string(), f(&p[1])))
                .collect()
        })
        .unwrap_or_default();
    let load = stages
        .iter()
        .find(|(k, _)| k == "load reads")
        .map_or(0.0, |(_, s)| *s);
    Ok(SystemPoint {
        system: format!("kura ({})", path.describe()),
        label: format!("kura {}", path.name()),
        seconds: f(&r["total_s"]),
        process_seconds: wall.as_secs_f64(),
        peak_rss_mib: rss,
        correct: u(&r["accuracy"]["correct"]),
        reads: u(&r["accuracy"]["reads"]),
        misplaced_mapq_ge_20: u(&r["accuracy"]["misplaced_mapq_ge_20"]),
        stages,
        load_reads_mb_s: (load > 0.0).then(|| f(&r["read_bytes"]) / 1e6 / load),
    })
}

fn run_minimap2(
    minimap2: &Path,
    reference: &Path,
    reads: &Path,
    dir: &Path,
    threads: usize,
) -> anyhow::Result<SystemPoint> {
    let sam = dir.join("minimap2.sam");
    drop_page_cache(reference)?;
    drop_page_cache(reads)?;
    let mut cmd = Command::new(minimap2);
    cmd.args(["-ax", "sr", "-t", &threads.to_string()])
        .arg(reference)
        .arg(reads)
        .stdout(std::fs::File::create(&sam)?)
        .stderr(Stdio::null());
    let (wall, rss) = measured(&mut cmd)?;
    let score = score_sam(
        std::io::BufReader::new(std::fs::File::open(&sam)?),
        &sam.display().to_string(),
        ScoreOptions::default(),
    )?;
    Ok(SystemPoint {
        system: "minimap2 -ax sr".into(),
        label: "minimap2".into(),
        seconds: wall.as_secs_f64(),
        process_seconds: wall.as_secs_f64(),
        peak_rss_mib: rss,
        correct: score.correct,
        reads: score.total,
        misplaced_mapq_ge_20: score.misplaced_confident,
        stages: Vec::new(),
        load_reads_mb_s: None,
    })
}

/// (device sequential read MB/s, AccelFS raw stream MB/s) for the reads file on one image.
fn read_bandwidth(dir: &Path, reads: &Path) -> anyhow::Result<(f64, f64)> {
    let work = Workspace::prepare(&dir.join("bandwidth"), &[("reads", reads)], &mut |_, _| {})?;
    let bytes = std::fs::metadata(reads)?.len();
    let opened = work.open(IoPath::Direct)?;
    let (streamed, took) = pipeline::raw_read_throughput(&opened.store, "reads")?;
    opened.close()?;
    let stream = streamed as f64 / 1e6 / took.as_secs_f64().max(1e-9);
    drop_page_cache(work.image())?;
    let spec = work
        .spec(IoPath::Direct)
        .context("no device for the direct path")?;
    let mut dev = kura_engine::open(&spec)?;
    let device = sequential_read(&mut *dev, bytes)?;
    Ok((device, stream))
}

/// Reads `bytes` from the start of the device with 1 MiB commands, 32 in flight (the io
/// benchmark's sequential-read job); MB/s.
fn sequential_read(dev: &mut dyn BlockDevice, bytes: u64) -> anyhow::Result<f64> {
    let job = Job {
        pattern: Pattern::SeqRead,
        bytes: 1 << 20,
        depth: 32,
        duration: Duration::from_secs(3600),
        max_ops: bytes.div_ceil(1 << 20).max(1),
        seed: 1,
    };
    let out = crate::io::workload::run(dev, &job)?;
    Ok(out.bytes as f64 / 1e6 / out.elapsed.as_secs_f64().max(1e-9))
}

fn print_report(r: &Report) {
    println!(
        "kura bench genome: {} reads from {} ({}), {} threads, best of {} rounds",
        r.reads, r.reference, r.simulator, r.threads, r.rounds
    );
    println!(
        "{:<58} {:>9} {:>9} {:>10} {:>10}",
        "system", "seconds", "RSS MiB", "correct %", "bad MAPQ20"
    );
    for s in &r.systems {
        println!(
            "{:<58} {:>9.3} {:>9.1} {:>10.3} {:>10}",
            s.system,
            s.seconds,
            s.peak_rss_mib,
            100.0 * s.correct as f64 / s.reads.max(1) as f64,
            s.misplaced_mapq_ge_20
        );
    }
    let peer = r.systems.iter().find(|s| s.system.starts_with("minimap2"));
    let direct = r.systems.iter().find(|s| s.system.contains("direct"));
    let redirect = r.systems.iter().find(|s| s.system.contains("redirect"));
    if let (Some(k), Some(m)) = (direct, peer) {
        println!(
            "kura direct / minimap2: time {:.2}x, peak RSS {:.2}x, correct {} vs {} ({:+})",
            k.seconds / m.seconds.max(1e-9),
            k.peak_rss_mib / m.peak_rss_mib.max(1e-9),
            k.correct,
            m.correct,
            k.correct as i64 - m.correct as i64
        );
    }
    if let (Some(d), Some(x)) = (direct, redirect) {
        println!(
            "direct vs redirect: end-to-end {:.1} % lower (paper: 33-46 %)",
            100.0 * (1.0 - d.seconds / x.seconds.max(1e-9))
        );
    }
    if let Some(load) = direct.and_then(|d| d.load_reads_mb_s) {
        println!(
            "read loading: the reads streamed from AccelFS without parsing {:.0} MB/s = {:.0} % of the device's sequential read ({:.0} MB/s); the pipeline's \"load reads\" stage passes {load:.0} MB/s through the parser (its reader thread prefetches while batches are matched, so that rate is not the I/O rate)",
            r.accelfs_stream_mb_s,
            100.0 * r.accelfs_stream_mb_s / r.device_seq_read_mb_s.max(1e-9),
            r.device_seq_read_mb_s
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}
