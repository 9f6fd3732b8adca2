//! `kura bench genome`: the application against the tool bioinformaticians use. The same reads
//! (pywgsim's, as the issue defines them, when pywgsim is installed; kura's own simulator
//! otherwise) are mapped by the whole kura pipeline on each I/O path and by `minimap2 -ax sr`
//! with the same threads, alternating over `--rounds` rounds (A B A B), each run a child process
//! so its wall time and peak RSS (`wait4`) are its own. kura and minimap2 are compared on the
//! same figure, each whole process's wall time (median [min–max] of the rounds' pairs); the
//! pipeline's stage total is reported beside it. Accuracy of both is scored from the read names. Read loading is set
//! against the device's sequential read bandwidth measured on the same image file.

use crate::genome_peers::{build_index, map, measured, which, Index, Tool};
use crate::io::workload::{Job, Pattern};
use crate::output::{plot_help, RunArgs};
use crate::stats::{compare, lower_by, quotient, Compared, Spread};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_engine::BlockDevice;
use kura_genome::paths::{drop_page_cache, IoPath, Workspace, MG1655};
use kura_genome::pipeline;
use kura_genome::truth::{score_sam, ScoreOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const PLOT: &str = include_str!("../../../scripts/plot_genome.py");

#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("quick", |a| a.help("A short run for smoke tests (at most 20k reads, one round; with --matrix 2000 reads per cell and references of at most 1M)")), mut_arg("plot", |a| plot_help(a, "genome")))]
pub struct GenomeBenchArgs {
    /// Directory for the dataset, the images and the outputs (a disk file system).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Single-end 150 bp reads simulated from the reference (default 200000; with --matrix,
    /// reads or pairs per cell, default 10000).
    #[arg(long)]
    pub reads: Option<u64>,
    /// Reference FASTA (default: MG1655 from ragout-examples, else a synthetic genome).
    #[arg(long = "ref")]
    pub reference: Option<PathBuf>,
    /// Threads for kura and every peer alike.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// kura's I/O paths, comma-separated (accelfs, host, redirect).
    #[arg(long, default_value = "accelfs,host,redirect")]
    pub paths: String,
    /// Rounds per system (alternating); median and min-max are reported. Default 5, or 1 with
    /// --quick.
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Every tool (kura genome map, minimap2, bwa mem, bowtie2) over a grid of error rates,
    /// indel rates, single/paired reads and reference sizes, instead of the I/O-path comparison.
    #[arg(long)]
    pub matrix: bool,
    #[command(flatten)]
    pub grid: crate::genome_matrix::MatrixArgs,
    /// A real Illumina read set instead of simulated reads: every tool maps it, and each SAM is
    /// reported by mapping rate, properly-paired rate, samtools flagstat/stats and agreement
    /// with minimap2 (there is no truth). Default reads: SPAdes' E. coli test pair
    /// (apt-get install spades) on MG1655 (ragout-examples).
    #[arg(long, conflicts_with = "matrix")]
    pub real: bool,
    /// --real: the FASTQ files (plain or gzip), one for single-end or two for pairs,
    /// comma-separated.
    #[arg(long, value_delimiter = ',', requires = "real")]
    pub real_reads: Vec<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// One system's best round.
#[derive(Debug, Clone, Serialize)]
pub struct SystemPoint {
    pub system: String,
    /// Short name for plots.
    pub label: String,
    /// End-to-end seconds, the figure kura and minimap2 are compared on: the whole child
    /// process's wall time (median over the rounds; kura's includes copying the dataset into its
    /// image).
    pub seconds: f64,
    /// The process wall time over the rounds.
    pub seconds_range: Spread,
    /// kura only: the pipeline's stage total (load reference … write SAM), median.
    pub pipeline_seconds: Option<f64>,
    /// The command line, as run (the last round's).
    pub command: String,
    pub peak_rss_mib: f64,
    pub correct: u64,
    pub reads: u64,
    pub misplaced_mapq_ge_20: u64,
    /// kura only: seconds in each stage of the median round.
    pub stages: Vec<(String, f64)>,
    /// kura only: bytes of reads per second of the "load reads" stage (I/O and parsing).
    pub load_reads_mb_s: Option<f64>,
    /// Systems mapping from a prebuilt index (kura genome map, bwa mem, bowtie2): its build,
    /// timed apart from the mapping rounds.
    pub index: Option<Index>,
    /// The highest MAPQ the system wrote, where read back (bowtie2's scale ends at 42, the
    /// others' at 60; misplaced reads are counted at MAPQ >= 20 for all).
    pub max_mapq: Option<u8>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub reads: u64,
    pub reference: String,
    pub simulator: String,
    pub threads: usize,
    pub rounds: usize,
    pub systems: Vec<SystemPoint>,
    /// Each kura path against minimap2, process wall time per round pair (kura / minimap2).
    pub versus_minimap2: Vec<(String, Compared)>,
    /// The direct path against redirect, pipeline totals per round (the fraction lower).
    pub direct_vs_redirect: Option<Compared>,
    /// The file system of `--dir` (statfs), where the dataset, images and outputs live.
    pub file_system: String,
    pub minimap2_version: Option<String>,
    /// Version of every peer that ran.
    pub versions: Vec<(String, String)>,
    /// Peers that did not run, with why.
    pub skipped: Vec<String>,
    /// Sequential read of the reads file's size from the image with 1 MiB commands at QD 32.
    pub device_seq_read_mb_s: f64,
    /// The reads file streamed from AccelFS on the direct engine, without parsing.
    pub accelfs_stream_mb_s: f64,
    pub notes: Vec<String>,
}

pub fn run(args: &GenomeBenchArgs) -> anyhow::Result<()> {
    if args.matrix {
        return crate::genome_matrix::run(args);
    }
    if args.real {
        return crate::genome_real::run(args);
    }
    let reads = args.reads.unwrap_or(200_000);
    let reads = if args.run.quick {
        reads.min(20_000)
    } else {
        reads
    };
    let rounds = crate::stats::rounds(args.rounds, args.run.quick, 1);
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
    let mut skipped = Vec::new();
    if let Err(why) = Tool::Minimap2.available() {
        println!("{why}");
        skipped.push(why);
    }
    // kura's own map command and the peers that map from a prebuilt index: built once, timed.
    let mut indexed: Vec<Index> = Vec::new();
    for tool in [Tool::Kura, Tool::Bwa, Tool::Bowtie2] {
        match tool.available() {
            Ok(()) => indexed.push(build_index(
                tool,
                &kura,
                &reference,
                dir.path(),
                args.threads,
            )?),
            Err(why) => {
                println!("{why}");
                skipped.push(why);
            }
        }
    }
    let bar = ProgressBar::new((rounds * (paths.len() + 1 + indexed.len())) as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    let mut all: Vec<Vec<SystemPoint>> = vec![Vec::new(); paths.len() + 1 + indexed.len()];
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
            all[i].push(p);
            bar.inc(1);
        }
        if let Some(mm) = &minimap2 {
            bar.set_message(format!("round {}: minimap2", round + 1));
            let p = run_minimap2(mm, &reference, &reads_fq, dir.path(), args.threads)?;
            all[paths.len()].push(p);
        }
        bar.inc(1);
        for (j, index) in indexed.iter().enumerate() {
            bar.set_message(format!("round {}: {}", round + 1, index.tool.name()));
            let sam = dir.path().join("mapped.sam");
            let m = map(
                index,
                &kura,
                std::slice::from_ref(&reads_fq),
                &sam,
                args.threads,
            )?;
            all[paths.len() + 1 + j].push(indexed_point(index, m));
            bar.inc(1);
        }
    }
    let walls = |v: &[SystemPoint]| v.iter().map(|p| p.seconds).collect::<Vec<f64>>();
    let peer = walls(&all[paths.len()]);
    let versus_minimap2 = if peer.is_empty() {
        Vec::new()
    } else {
        paths
            .iter()
            .zip(&all)
            .map(|(p, v)| {
                (
                    format!("kura {} / minimap2", p.name()),
                    compare(&walls(v), &peer, quotient, None),
                )
            })
            .collect()
    };
    let pipeline = |p: IoPath| {
        paths.iter().position(|&x| x == p).map(|i| {
            all[i]
                .iter()
                .filter_map(|s| s.pipeline_seconds)
                .collect::<Vec<f64>>()
        })
    };
    let direct_vs_redirect = match (pipeline(IoPath::Direct), pipeline(IoPath::Redirect)) {
        (Some(d), Some(r)) => Some(compare(&d, &r, lower_by, None)),
        _ => None,
    };
    bar.set_message("device bandwidth");
    let (device, stream) = read_bandwidth(dir.path(), &reads_fq)?;
    bar.finish_and_clear();
    let mut report = Report {
        reads,
        reference: reference_name,
        simulator,
        threads: args.threads,
        rounds,
        systems: all.into_iter().filter_map(summarise).collect(),
        versus_minimap2,
        direct_vs_redirect,
        file_system: crate::stats::fs_name(&args.dir),
        minimap2_version: minimap2
            .as_ref()
            .map(|m| crate::stats::tool_version(&m.display().to_string(), "--version")),
        versions: indexed
            .iter()
            .map(|i| (i.tool.name().to_string(), i.tool.version(&kura)))
            .collect(),
        skipped,
        device_seq_read_mb_s: device,
        accelfs_stream_mb_s: stream,
        notes: Vec::new(),
    };
    report.notes.push(
        "kura and minimap2 are compared on whole-process wall time (kura: copy the dataset into its workspace, load reference, index, save and load the index, load reads, match, write SAM; minimap2: load, index, map, write SAM); kura's pipeline total is shown beside it, and direct vs redirect compares pipeline totals".into(),
    );
    report.notes.push(
        "peak RSS: each child process's own VmHWM, sampled every 2 ms (wait4's maxrss would include this process's, inherited at spawn); kura's includes copying the dataset into its image before the pipeline starts".into(),
    );
    report.notes.push(
        "kura genome map, bwa mem and bowtie2 map from an index built beforehand by a separate timed command (index: seconds, peak RSS, bytes, command); their seconds are the mapping process alone, so they are not set against minimap2's row, which indexes in-process (kura bench genome --matrix compares all four from prebuilt indexes)".into(),
    );
    report.notes.push(
        "accuracy of every system is scored by the same code (primary SAM records, within 10 bp of the simulated origin; misplaced with MAPQ >= 20 on each tool's own scale, max_mapq shows it: 42 for bowtie2, 60 for the others)".into(),
    );
    print_report(&report);
    args.run.output.emit("genome", PLOT, &report)
}

/// One system's rounds as one point: the median round (by process wall time) with the spread
/// of every round and the median pipeline total.
fn summarise(mut rounds: Vec<SystemPoint>) -> Option<SystemPoint> {
    let walls: Vec<f64> = rounds.iter().map(|p| p.seconds).collect();
    let pipelines: Vec<f64> = rounds.iter().filter_map(|p| p.pipeline_seconds).collect();
    rounds.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mid = rounds.len().checked_sub(1)? / 2;
    let mut p = rounds.swap_remove(mid);
    p.seconds_range = Spread::of(&walls);
    p.seconds = p.seconds_range.median;
    p.pipeline_seconds = (!pipelines.is_empty()).then(|| Spread::of(&pipelines).median);
    Some(p)
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
    let name = source.display().to_string();
    Ok((plain_fasta(&source, &out)?, name))
}

/// `source` (FASTA, plain or gzip) written to `out` as plain FASTA, which every mapper reads.
pub(crate) fn plain_fasta(source: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let store = kura_genome::store::Store::host("");
    let name = source.display().to_string();
    let records = kura_genome::fasta::FastaReader::new(store.open_stream(&name)?, name.as_str())
        .read_all()?;
    kura_genome::simulate::write_fasta(
        std::io::BufWriter::new(std::fs::File::create(out)?),
        &records,
        80,
    )?;
    Ok(out.to_path_buf())
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
    let command = format!("{cmd:?}");
    let run = measured(&mut cmd)?;
    let (wall, rss) = (run.wall, run.peak_rss_mib);
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
        system: format!("kura ({})", describe_path(path, r["spec"].as_str())),
        label: format!("kura {}", path.name()),
        seconds: wall.as_secs_f64(),
        seconds_range: Spread::of(&[wall.as_secs_f64()]),
        pipeline_seconds: Some(f(&r["total_s"])),
        command,
        peak_rss_mib: rss,
        correct: u(&r["accuracy"]["correct"]),
        reads: u(&r["accuracy"]["reads"]),
        misplaced_mapq_ge_20: u(&r["accuracy"]["misplaced_mapq_ge_20"]),
        stages,
        load_reads_mb_s: (load > 0.0).then(|| f(&r["read_bytes"]) / 1e6 / load),
        index: None,
        max_mapq: None,
    })
}

/// The path as it really ran: `spec` is the device spec `kura genome run` mounted (its JSON's
/// `spec`), `file:` where io_uring was refused for the direct path.
fn describe_path(path: IoPath, spec: Option<&str>) -> String {
    match spec {
        Some(s) if path == IoPath::Direct && s.starts_with("file:") => {
            "AccelFS on the direct engine's file backend; io_uring refused".into()
        }
        _ => path.describe().to_string(),
    }
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
    let command = format!("{cmd:?}");
    let run = measured(&mut cmd)?;
    let (wall, rss) = (run.wall, run.peak_rss_mib);
    let score = score_sam(
        std::io::BufReader::new(std::fs::File::open(&sam)?),
        &sam.display().to_string(),
        ScoreOptions::default(),
    )?;
    Ok(SystemPoint {
        system: "minimap2 -ax sr".into(),
        label: "minimap2".into(),
        seconds: wall.as_secs_f64(),
        seconds_range: Spread::of(&[wall.as_secs_f64()]),
        pipeline_seconds: None,
        command,
        peak_rss_mib: rss,
        correct: score.correct,
        reads: score.total,
        misplaced_mapq_ge_20: score.misplaced_confident,
        stages: Vec::new(),
        load_reads_mb_s: None,
        index: None,
        max_mapq: None,
    })
}

/// A round of a system that maps from a prebuilt index.
fn indexed_point(index: &Index, m: crate::genome_peers::Mapped) -> SystemPoint {
    let (system, label) = match index.tool {
        Tool::Kura => ("kura genome map (host files, prebuilt index)", "kura map"),
        Tool::Minimap2 => ("minimap2 -ax sr (prebuilt index)", "minimap2 idx"),
        Tool::Bwa => ("bwa mem", "bwa mem"),
        Tool::Bowtie2 => ("bowtie2 (end-to-end, --sensitive)", "bowtie2"),
    };
    SystemPoint {
        system: system.into(),
        label: label.into(),
        seconds: m.seconds,
        seconds_range: Spread::of(&[m.seconds]),
        pipeline_seconds: None,
        command: m.command,
        peak_rss_mib: m.peak_rss_mib,
        correct: m.correct,
        reads: m.reads,
        misplaced_mapq_ge_20: m.misplaced_mapq_ge_20,
        stages: Vec::new(),
        load_reads_mb_s: None,
        index: Some(index.clone()),
        max_mapq: Some(m.max_mapq),
    }
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
        "kura bench genome: {} reads from {} ({}), {} threads, median [min–max] of {} round(s), on {}",
        r.reads, r.reference, r.simulator, r.threads, r.rounds, r.file_system
    );
    println!(
        "{:<58} {:>22} {:>10} {:>9} {:>10} {:>10}",
        "system", "process wall s", "pipeline s", "RSS MiB", "correct %", "bad MAPQ20"
    );
    for s in &r.systems {
        println!(
            "{:<58} {:>22} {:>10} {:>9.1} {:>10.3} {:>10}",
            s.system,
            s.seconds_range.show(3),
            s.pipeline_seconds.map_or("-".into(), |p| format!("{p:.3}")),
            s.peak_rss_mib,
            100.0 * s.correct as f64 / s.reads.max(1) as f64,
            s.misplaced_mapq_ge_20
        );
    }
    for (what, c) in &r.versus_minimap2 {
        println!(
            "{what}: process wall time {}x (per round pair; below 1 is kura faster)",
            c.ratio.show(2)
        );
    }
    let peer = r.systems.iter().find(|s| s.system.starts_with("minimap2"));
    let direct = r.systems.iter().find(|s| s.label == "kura accelfs");
    if let (Some(k), Some(m)) = (direct, peer) {
        println!(
            "kura accelfs vs minimap2: peak RSS {:.2}x, correct {} vs {} ({:+})",
            k.peak_rss_mib / m.peak_rss_mib.max(1e-9),
            k.correct,
            m.correct,
            k.correct as i64 - m.correct as i64
        );
    }
    if let Some(c) = &r.direct_vs_redirect {
        println!(
            "direct (accelfs) vs redirect: pipeline total {} % lower (per round; paper: 33-46 %)",
            c.ratio.scaled(100.0).show(1)
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
    for s in &r.systems {
        if let Some(i) = &s.index {
            println!(
                "  {}: index built in {:.2} s, peak RSS {:.1} MiB, {:.1} MiB on disk; highest MAPQ written {}",
                s.label,
                i.seconds,
                i.peak_rss_mib,
                i.bytes as f64 / (1 << 20) as f64,
                s.max_mapq.unwrap_or(0)
            );
        }
    }
    for s in &r.systems {
        println!("  {}: {}", s.label, s.command);
        if let Some(i) = &s.index {
            println!("  {} index: {}", s.label, i.command);
        }
    }
    for s in &r.skipped {
        println!("skipped: {s}");
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(label: &str, seconds: f64, pipeline: Option<f64>) -> SystemPoint {
        SystemPoint {
            system: label.into(),
            label: label.into(),
            seconds,
            seconds_range: Spread::of(&[seconds]),
            pipeline_seconds: pipeline,
            command: String::new(),
            peak_rss_mib: 0.0,
            correct: 0,
            reads: 0,
            misplaced_mapq_ge_20: 0,
            stages: Vec::new(),
            load_reads_mb_s: None,
            index: None,
            max_mapq: None,
        }
    }

    #[test]
    fn a_system_is_its_median_round_with_the_spread_of_all() {
        let p = summarise(vec![
            point("k", 3.0, Some(2.0)),
            point("k", 1.0, Some(0.5)),
            point("k", 2.0, Some(1.5)),
        ])
        .unwrap();
        assert_eq!(p.seconds, 2.0);
        assert_eq!((p.seconds_range.min, p.seconds_range.max), (1.0, 3.0));
        assert_eq!(p.pipeline_seconds, Some(1.5));
        assert!(summarise(Vec::new()).is_none());
        let m = summarise(vec![point("minimap2", 4.0, None)]).unwrap();
        assert_eq!(m.pipeline_seconds, None, "minimap2 has no pipeline total");
    }
}
