//! `kura genome`: the paper's application. `index` and `map` work on host files or, with
//! `--dev SPEC`, on the AccelFS of a device; `simulate` writes a reference and reads whose names
//! carry their true origin; `run` is the whole pipeline (Table 2) on each I/O path (Fig. 8), on
//! given files or on a dataset it makes (the real E. coli genome when Debian's ragout-examples is
//! installed, else a seeded synthetic one).

use crate::fs::human;
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_accelfs::fs::{FileSystem, MountOptions};
use kura_genome::index::IndexParams;
use kura_genome::paths::{IoPath, Workspace, MG1655};
use kura_genome::pipeline::{self, Event, MapJob, OutputFormat, RunOptions, RunReport};
use kura_genome::simulate::{self, GenomeOptions, ReadOptions};
use kura_genome::store::Store;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, clap::Subcommand)]
pub enum GenomeCommand {
    /// Index a reference (FASTA, plain or gzip) and save the index.
    Index {
        /// Reference FASTA.
        reference: String,
        /// Index file to write.
        #[arg(short, long, default_value = "reference.kgi")]
        output: String,
        #[command(flatten)]
        common: Common,
        /// k-mer length of the minimizers.
        #[arg(short, default_value_t = 19)]
        k: u8,
        /// Minimizer window (in k-mers).
        #[arg(short, default_value_t = 10)]
        w: u8,
    },
    /// Map reads (FASTQ, plain or gzip; a second file for paired-end) to a reference FASTA or a
    /// saved index, writing SAM (samtools reads it) or PAF.
    Map {
        /// Reference FASTA or index made by `kura genome index`.
        reference: String,
        reads: String,
        /// Second mates (paired-end).
        mates: Option<String>,
        /// Output file, `-` for standard output.
        #[arg(short, long, default_value = "-")]
        output: String,
        #[arg(long, value_enum, default_value_t = Format::Sam)]
        format: Format,
        #[command(flatten)]
        common: Common,
        /// Print accuracy against the true origins in the read names (simulated reads) to stderr.
        #[arg(long)]
        score: bool,
    },
    /// Write a reference and simulated reads (wgsim-like errors, SNPs and indels; names
    /// `CONTIG|START|END|…|…|idx` as pywgsim writes them).
    Simulate {
        /// Output directory (reference.fa, reads_1.fq, reads_2.fq with --paired).
        #[arg(short, long)]
        output: PathBuf,
        /// Simulate from this FASTA instead of a synthetic genome.
        #[arg(long)]
        reference: Option<PathBuf>,
        /// Size of the synthetic genome.
        #[arg(long, default_value = "4600000")]
        genome_size: String,
        /// Reads (or pairs with --paired).
        #[arg(long, default_value_t = 200_000)]
        reads: u64,
        #[arg(long)]
        paired: bool,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// gzip the FASTQ.
        #[arg(long)]
        gzip: bool,
    },
    /// The whole pipeline with every stage timed (the paper's Table 2) on each I/O path, side by
    /// side (Fig. 8): AccelFS on the direct engine, host files with plain system calls, AccelFS
    /// on redirect.
    Run(RunArgs),
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Sam,
    Paf,
}

#[derive(Debug, clap::Args)]
pub struct Common {
    /// Files live on the AccelFS of this device spec (e.g. file:/tmp/kura.img) instead of the
    /// host file system.
    #[arg(long)]
    dev: Option<String>,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    threads: Option<usize>,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Reference FASTA (default: MG1655 from ragout-examples, else a synthetic genome).
    #[arg(long = "ref")]
    reference: Option<PathBuf>,
    /// Reads FASTQ (default: simulated from the reference).
    #[arg(long)]
    reads: Option<PathBuf>,
    /// Second mates (paired-end).
    #[arg(long, requires = "reads")]
    mates: Option<PathBuf>,
    /// Reads simulated when --reads is not given.
    #[arg(long, default_value_t = 200_000)]
    simulate: u64,
    /// Simulate paired-end reads.
    #[arg(long)]
    paired: bool,
    /// Size of the synthetic genome, used when no reference is given and MG1655 is not installed.
    #[arg(long, default_value = "4600000")]
    genome_size: String,
    /// I/O paths to run, comma-separated: accelfs, host, redirect.
    #[arg(long, default_value = "accelfs,host,redirect")]
    pub paths: String,
    /// Work directory for the dataset and the image (default: a temp dir, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Skip writing SAM (map only).
    #[arg(long)]
    no_output: bool,
    /// Write the reports as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

impl RunArgs {
    /// A small run for `kura demo`.
    pub fn demo(dir: &Path, reads: u64) -> Self {
        RunArgs {
            reference: None,
            reads: None,
            mates: None,
            simulate: reads,
            paired: false,
            genome_size: "4600000".into(),
            paths: "accelfs,host,redirect".into(),
            dir: Some(dir.to_path_buf()),
            threads: None,
            no_output: false,
            json: None,
            quiet: false,
        }
    }
}

fn threads(t: Option<usize>) -> usize {
    t.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1)
}

/// The store of `--dev` (mounted) or the host file system (paths as given). A job that only
/// reads from the device (`map` writing to stdout) mounts it read-only: the image is opened
/// `ro=1` and not a byte of it changes.
fn store_of(dev: Option<&str>, read_only: bool) -> anyhow::Result<(Store, Option<FileSystem>)> {
    match dev {
        Some(spec) if read_only => {
            let dev = crate::dev::open_dev_read_only(spec)?;
            let fs = FileSystem::mount_read_only(dev, MountOptions::default())
                .with_context(|| format!("mounting AccelFS read-only from {spec}"))?;
            Ok((Store::AccelFs(fs), None))
        }
        Some(spec) => {
            let dev = crate::dev::open_dev(spec)?;
            let fs = FileSystem::mount(dev, MountOptions::default())
                .with_context(|| format!("mounting AccelFS from {spec}"))?;
            Ok((Store::AccelFs(fs.clone()), Some(fs)))
        }
        None => Ok((Store::host(""), None)),
    }
}

fn close(fs: Option<FileSystem>) -> anyhow::Result<()> {
    if let Some(fs) = fs {
        fs.unmount().context("unmounting AccelFS")?;
    }
    Ok(())
}

fn spinner(msg: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(msg.to_string());
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

fn byte_bar(msg: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(msg.to_string());
    bar
}

/// I/O buffers the genome tools keep in flight at most: a few 8 MiB read chunks, 1 MiB output
/// writes and the index's sections; the pool default (128 MiB, pinned by io_uring) would only
/// inflate the resident set. Larger transient needs fall back to heap buffers.
const GENOME_POOL_BYTES: usize = 32 << 20;

pub fn run(cmd: GenomeCommand) -> anyhow::Result<()> {
    kura_engine::BufferPool::request_global_bytes(GENOME_POOL_BYTES);
    match cmd {
        GenomeCommand::Index {
            reference,
            output,
            common,
            k,
            w,
        } => {
            let params = IndexParams { k, w };
            let (store, fs) = store_of(common.dev.as_deref(), false)?;
            let bar = spinner("loading the reference", false);
            let pref = pipeline::load_reference(&store, &reference)?;
            let (contigs, bases) = (pref.contigs().len(), pref.total_len());
            bar.set_message("indexing");
            let index = pipeline::build_index(pref, params, threads(common.threads))?;
            bar.set_message("saving the index");
            let bytes = pipeline::save_index(&store, &index, &output)?;
            bar.finish_and_clear();
            close(fs)?;
            println!(
                "{output}: {contigs} contigs, {bases} bases, {} minimizers at {} positions, {}",
                index.distinct_minimizers(),
                index.total_positions(),
                human(bytes)
            );
            Ok(())
        }
        GenomeCommand::Map {
            reference,
            reads,
            mates,
            output,
            format,
            common,
            score,
        } => {
            let to_stdout = output == "-";
            let (store, fs) = store_of(common.dev.as_deref(), to_stdout)?;
            let bar = spinner("loading the reference", to_stdout);
            let index = if pipeline::is_index(&store, &reference)? {
                pipeline::load_index(&store, &reference)?
            } else {
                let pref = pipeline::load_reference(&store, &reference)?;
                bar.set_message("indexing");
                pipeline::build_index(pref, IndexParams::default(), threads(common.threads))?
            };
            bar.finish_and_clear();
            let command_line = std::env::args().collect::<Vec<_>>().join(" ");
            let format = match format {
                Format::Sam => OutputFormat::Sam,
                Format::Paf => OutputFormat::Paf,
            };
            let job = MapJob {
                reads: &reads,
                mates: mates.as_deref(),
                output: Some((&output, format)),
                threads: threads(common.threads),
                batch_bases: pipeline::DEFAULT_BATCH_BASES,
                command_line: &command_line,
            };
            let bar = byte_bar("mapping", to_stdout);
            let report = pipeline::map_reads(&store, &index, &job, &mut |e| {
                if let Event::Reads { bytes, total } = e {
                    bar.set_length(total);
                    bar.set_position(bytes);
                }
            })?;
            bar.finish_and_clear();
            close(fs)?;
            eprintln!(
                "{} reads ({}) mapped in {:.2} s (load {:.2} s, match {:.2} s, write {:.2} s)",
                report.reads,
                human(report.read_bytes),
                (report.load_reads + report.matching + report.write_output).as_secs_f64(),
                report.load_reads.as_secs_f64(),
                report.matching.as_secs_f64(),
                report.write_output.as_secs_f64()
            );
            if score {
                eprintln!("{}", accuracy_line(&report.accuracy));
            }
            Ok(())
        }
        GenomeCommand::Simulate {
            output,
            reference,
            genome_size,
            reads,
            paired,
            seed,
            gzip,
        } => {
            let size = kura_engine::spec::parse_size(&genome_size).map_err(anyhow::Error::msg)?;
            let files = simulate_dataset(
                &output,
                reference.as_deref(),
                usize::try_from(size).context("--genome-size")?,
                reads,
                paired,
                seed,
                gzip,
            )?;
            for f in files {
                println!("{}", f.display());
            }
            Ok(())
        }
        GenomeCommand::Run(args) => run_paths(&args).map(|_| ()),
    }
}

/// Writes `reference.fa` (a copy of `from`, or a synthetic genome) and simulated reads into
/// `dir`; returns the files written.
fn simulate_dataset(
    dir: &Path,
    from: Option<&Path>,
    genome_size: usize,
    reads: u64,
    paired: bool,
    seed: u64,
    gzip: bool,
) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let genome = match from {
        Some(path) => {
            let store = Store::host("");
            let name = path.display().to_string();
            kura_genome::fasta::FastaReader::new(store.open_stream(&name)?, name.as_str())
                .read_all()?
        }
        None => simulate::synthetic_genome(&GenomeOptions::with_total(seed, genome_size)),
    };
    let reference = dir.join("reference.fa");
    let file = std::fs::File::create(&reference)
        .with_context(|| format!("creating {}", reference.display()))?;
    simulate::write_fasta(std::io::BufWriter::new(file), &genome, 80)
        .with_context(|| format!("writing {}", reference.display()))?;
    let ext = if gzip { "fq.gz" } else { "fq" };
    let first = dir.join(format!("reads_1.{ext}"));
    let second = dir.join(format!("reads_2.{ext}"));
    let opts = ReadOptions {
        seed,
        n: reads,
        ..ReadOptions::default()
    };
    simulate::write_reads(&genome, &opts, &first, paired.then_some(&*second), gzip)
        .with_context(|| format!("writing reads into {}", dir.display()))?;
    let mut files = vec![reference, first];
    if paired {
        files.push(second);
    }
    Ok(files)
}

fn accuracy_line(a: &pipeline::Accuracy) -> String {
    if a.reads == 0 {
        return "accuracy: read names carry no true origin (not simulated reads)".into();
    }
    let mut line = format!(
        "accuracy: {} of {} reads placed correctly ({:.3} %), {} mapped, misplaced with MAPQ>=20: {}, misplaced with MAPQ<20: {}",
        a.correct,
        a.reads,
        100.0 * a.fraction_correct(),
        a.mapped,
        a.misplaced_confident,
        a.misplaced_low
    );
    if a.proper_pairs > 0 {
        line += &format!(", proper pairs: {}", a.proper_pairs);
    }
    line
}

/// One path's result.
pub struct PathRun {
    pub path: IoPath,
    pub spec: Option<String>,
    pub report: RunReport,
}

/// Prepares the dataset and runs the pipeline on each path; prints Table 2 for each and the
/// side-by-side comparison.
pub fn run_paths(args: &RunArgs) -> anyhow::Result<Vec<PathRun>> {
    let paths = IoPath::parse_list(&args.paths).map_err(|e| anyhow::anyhow!("--paths: {e}"))?;
    let temp = match &args.dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("kura-genome")
                .tempdir()
                .context("creating a temp dir")?,
        ),
    };
    let dir = match (&args.dir, &temp) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.path().to_path_buf(),
        (None, None) => bail!("no work directory"),
    };
    let threads = threads(args.threads);
    let (reference, reads, mates) = dataset(args, &dir)?;
    let mut inputs: Vec<(&str, &Path)> = vec![("reference", &reference), ("reads_1", &reads)];
    if let Some(m) = &mates {
        inputs.push(("reads_2", m));
    }
    let bar = byte_bar("copying the dataset into the AccelFS image", args.quiet);
    let work = Workspace::prepare(&dir.join("work"), &inputs, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let opts = RunOptions {
        reference: "reference".into(),
        reads: "reads_1".into(),
        mates: mates.as_ref().map(|_| "reads_2".to_string()),
        index: "reference.kgi".into(),
        output: (!args.no_output).then(|| ("mapped.sam".to_string(), OutputFormat::Sam)),
        threads,
        params: IndexParams::default(),
        batch_bases: pipeline::DEFAULT_BATCH_BASES,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let mut runs = Vec::new();
    for path in paths {
        let opened = work.open(path)?;
        let stage = spinner(&format!("{}: starting", path.name()), args.quiet);
        let bytes = byte_bar(&format!("{}: load reads + match", path.name()), args.quiet);
        let report = pipeline::run(&opened.store, &opts, &mut |e| match e {
            Event::Stage(s) => stage.set_message(format!("{}: {s}", path.name())),
            Event::Reads { bytes: b, total } => {
                bytes.set_length(total);
                bytes.set_position(b);
            }
        })
        .with_context(|| format!("the pipeline on the {} path", path.name()))?;
        stage.finish_and_clear();
        bytes.finish_and_clear();
        opened.close()?;
        print_table2(path, work.spec(path).as_deref(), &report, threads);
        runs.push(PathRun {
            path,
            spec: work.spec(path),
            report,
        });
    }
    if runs.len() > 1 {
        print_side_by_side(&runs);
    }
    if let Some(json) = &args.json {
        write_json(json, &runs, threads)?;
    }
    Ok(runs)
}

/// The input files: given, or simulated into `dir`.
fn dataset(args: &RunArgs, dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, Option<PathBuf>)> {
    if let (Some(r), Some(q)) = (&args.reference, &args.reads) {
        return Ok((r.clone(), q.clone(), args.mates.clone()));
    }
    if args.reads.is_some() {
        bail!("--reads needs --ref");
    }
    let real = Path::new(MG1655);
    let from = match &args.reference {
        Some(r) => Some(r.as_path()),
        None if real.exists() => Some(real),
        None => None,
    };
    let bar = spinner(
        &format!(
            "simulating {} {} from {}",
            args.simulate,
            if args.paired { "pairs" } else { "reads" },
            from.map_or(format!("a synthetic {} bp genome", args.genome_size), |p| p
                .display()
                .to_string())
        ),
        args.quiet,
    );
    let size = kura_engine::spec::parse_size(&args.genome_size).map_err(anyhow::Error::msg)?;
    let files = simulate_dataset(
        &dir.join("data"),
        from,
        usize::try_from(size).context("--genome-size")?,
        args.simulate,
        args.paired,
        42,
        false,
    )?;
    bar.finish_and_clear();
    if !args.quiet {
        println!(
            "dataset: {} ({}), {} reads of 150 bp{}",
            from.map_or("synthetic genome".to_string(), |p| p.display().to_string()),
            if from.is_some() {
                "real"
            } else {
                "seeded synthetic; install ragout-examples for E. coli MG1655"
            },
            args.simulate,
            if args.paired { ", paired" } else { "" }
        );
    }
    let mut it = files.into_iter();
    let (Some(r), Some(q)) = (it.next(), it.next()) else {
        bail!("the simulator wrote no files");
    };
    Ok((r, q, it.next()))
}

fn print_table2(path: IoPath, spec: Option<&str>, r: &RunReport, threads: usize) {
    println!();
    println!(
        "path {}: {}{}",
        path.name(),
        path.describe(),
        spec.map_or(String::new(), |s| format!(" [{s}]"))
    );
    println!(
        "  reference {} contigs, {} bases; index {}; {} reads ({}); {threads} threads",
        r.contigs,
        r.reference_bases,
        human(r.index_bytes),
        r.reads,
        human(r.read_bytes)
    );
    let total = r.stages.total().as_secs_f64().max(1e-9);
    println!("  {:<16} {:>10} {:>8}", "stage", "seconds", "share");
    for (name, d) in r.stages.named() {
        println!(
            "  {:<16} {:>10.3} {:>7.1}%",
            name,
            d.as_secs_f64(),
            100.0 * d.as_secs_f64() / total
        );
    }
    println!("  {:<16} {:>10.3}", "total", total);
    println!(
        "  loading data: {:.1}% of the time; reads loaded at {:.0} MB/s",
        100.0 * r.stages.loading().as_secs_f64() / total,
        r.read_bytes as f64 / 1e6 / r.stages.load_reads.as_secs_f64().max(1e-9)
    );
    println!("  {}", accuracy_line(&r.accuracy));
}

fn print_side_by_side(runs: &[PathRun]) {
    println!();
    print!("{:<16}", "seconds");
    for run in runs {
        print!(" {:>10}", run.path.name());
    }
    println!();
    for (i, (name, _)) in runs[0].report.stages.named().iter().enumerate() {
        print!("{name:<16}");
        for run in runs {
            print!(" {:>10.3}", run.report.stages.named()[i].1.as_secs_f64());
        }
        println!();
    }
    print!("{:<16}", "total");
    for run in runs {
        print!(" {:>10.3}", run.report.stages.total().as_secs_f64());
    }
    println!();
    let total_of = |p: IoPath| {
        runs.iter()
            .find(|r| r.path == p)
            .map(|r| r.report.stages.total().as_secs_f64())
    };
    for (other, label, paper) in [
        (IoPath::Redirect, "redirect", " (paper: 33-46 % reduction)"),
        (IoPath::Host, "host files", ""),
    ] {
        if let (Some(direct), Some(them)) = (total_of(IoPath::Direct), total_of(other)) {
            println!(
                "end to end: direct {direct:.3} s vs {label} {them:.3} s: {:+.1} % reduction{paper}",
                100.0 * (1.0 - direct / them.max(1e-9))
            );
        }
    }
}

fn write_json(path: &Path, runs: &[PathRun], threads: usize) -> anyhow::Result<()> {
    let list: Vec<serde_json::Value> = runs
        .iter()
        .map(|run| {
            let r = &run.report;
            // An array, so the stages keep the paper's order.
            let stages: Vec<serde_json::Value> = r
                .stages
                .named()
                .iter()
                .map(|(n, d)| serde_json::json!([n, d.as_secs_f64()]))
                .collect();
            serde_json::json!({
                "path": run.path.name(),
                "spec": run.spec,
                "threads": threads,
                "stages_s": stages,
                "total_s": r.stages.total().as_secs_f64(),
                "wall_s": r.wall.as_secs_f64(),
                "contigs": r.contigs,
                "reference_bases": r.reference_bases,
                "index_bytes": r.index_bytes,
                "reads": r.reads,
                "read_bytes": r.read_bytes,
                "accuracy": {
                    "reads": r.accuracy.reads,
                    "mapped": r.accuracy.mapped,
                    "correct": r.accuracy.correct,
                    "misplaced_mapq_ge_20": r.accuracy.misplaced_confident,
                    "misplaced_mapq_lt_20": r.accuracy.misplaced_low,
                    "proper_pairs": r.accuracy.proper_pairs,
                },
            })
        })
        .collect();
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&list)?)
        .with_context(|| format!("writing {}", path.display()))
}
