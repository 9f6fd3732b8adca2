//! `kura genome`: the paper's application. `index` and `map` work on host files or, with
//! `--dev SPEC`, on the AccelFS of a device; `simulate` writes a reference and reads whose names
//! carry their true origin; `run` is the whole pipeline (Table 2) on each I/O path (Fig. 8), on
//! given files or on a dataset it makes (the real E. coli genome when Debian's ragout-examples is
//! installed, else a seeded synthetic one).

//!
//! This file is the command line only (arguments, progress bars, printing); the pipeline on each
//! path, the dataset, the workspace and the report live in `kura_genome::run`.

use crate::fs::human;
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_genome::index::IndexParams;
use kura_genome::paths::{IoPath, Opened};
use kura_genome::pipeline::{self, Event, MapJob, OutputFormat, RunReport};
use kura_genome::run::{self as genome_run, Dataset, DatasetOptions, Inputs, PathRun, RunPlan};
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
fn store_of(dev: Option<&str>, read_only: bool) -> anyhow::Result<Opened> {
    Ok(match dev {
        Some(spec) if read_only => {
            Opened::mount_read_only(crate::dev::open_dev_read_only(spec)?, spec)?
        }
        Some(spec) => Opened::mount(crate::dev::open_dev(spec)?, spec)?,
        None => Opened::host(""),
    })
}

fn close(opened: Opened) -> anyhow::Result<()> {
    opened.unmount().context("unmounting AccelFS")
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
            let opened = store_of(common.dev.as_deref(), false)?;
            let store = &opened.store;
            let bar = spinner("loading the reference", false);
            let pref = pipeline::load_reference(store, &reference)?;
            let (contigs, bases) = (pref.contigs().len(), pref.total_len());
            bar.set_message("indexing");
            let index = pipeline::build_index(pref, params, threads(common.threads))?;
            bar.set_message("saving the index");
            let bytes = pipeline::save_index(store, &index, &output)?;
            bar.finish_and_clear();
            close(opened)?;
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
            let opened = store_of(common.dev.as_deref(), to_stdout)?;
            let store = &opened.store;
            let bar = spinner("loading the reference", to_stdout);
            let index = if pipeline::is_index(store, &reference)? {
                pipeline::load_index(store, &reference)?
            } else {
                let pref = pipeline::load_reference(store, &reference)?;
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
            let report = pipeline::map_reads(store, &index, &job, &mut |e| {
                if let Event::Reads { bytes, total } = e {
                    bar.set_length(total);
                    bar.set_position(bytes);
                }
            })?;
            bar.finish_and_clear();
            close(opened)?;
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
            let dataset = genome_run::simulate_dataset(
                &output,
                &DatasetOptions {
                    from: reference.as_deref(),
                    genome_size: usize::try_from(size).context("--genome-size")?,
                    reads,
                    paired,
                    seed,
                    gzip,
                },
            )?;
            for f in dataset.files() {
                println!("{}", f.display());
            }
            Ok(())
        }
        GenomeCommand::Run(args) => run_paths(&args).map(|_| ()),
    }
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

/// The progress bars and Table 2 of `kura genome run`.
struct Progress<'a> {
    args: &'a RunArgs,
    threads: usize,
    simulating: Option<ProgressBar>,
    copying: Option<ProgressBar>,
    stage: Option<(ProgressBar, ProgressBar)>,
}

impl genome_run::Observer for Progress<'_> {
    fn simulating(&mut self, from: Option<&Path>) {
        let args = self.args;
        self.simulating = Some(spinner(
            &format!(
                "simulating {} {} from {}",
                args.simulate,
                if args.paired { "pairs" } else { "reads" },
                from.map_or(format!("a synthetic {} bp genome", args.genome_size), |p| p
                    .display()
                    .to_string())
            ),
            args.quiet,
        ));
    }

    fn simulated(&mut self, from: Option<&Path>) {
        if let Some(bar) = self.simulating.take() {
            bar.finish_and_clear();
        }
        let args = self.args;
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
    }

    fn copying(&mut self, done: u64, total: u64) {
        let bar = self.copying.get_or_insert_with(|| {
            byte_bar(
                "copying the dataset into the AccelFS image",
                self.args.quiet,
            )
        });
        bar.set_length(total);
        bar.set_position(done);
    }

    fn copied(&mut self) {
        if let Some(bar) = self.copying.take() {
            bar.finish_and_clear();
        }
    }

    fn path_started(&mut self, path: IoPath) {
        let quiet = self.args.quiet;
        self.stage = Some((
            spinner(&format!("{}: starting", path.name()), quiet),
            byte_bar(&format!("{}: load reads + match", path.name()), quiet),
        ));
    }

    fn event(&mut self, path: IoPath, event: Event) {
        let Some((stage, bytes)) = &self.stage else {
            return;
        };
        match event {
            Event::Stage(s) => stage.set_message(format!("{}: {s}", path.name())),
            Event::Reads { bytes: b, total } => {
                bytes.set_length(total);
                bytes.set_position(b);
            }
        }
    }

    fn path_done(&mut self, run: &PathRun) {
        if let Some((stage, bytes)) = self.stage.take() {
            stage.finish_and_clear();
            bytes.finish_and_clear();
        }
        print_table2(run.path, run.spec.as_deref(), &run.report, self.threads);
    }
}

/// Prepares the dataset and runs the pipeline on each path; prints Table 2 for each and the
/// side-by-side comparison.
pub fn run_paths(args: &RunArgs) -> anyhow::Result<Vec<PathRun>> {
    let paths = IoPath::parse_list(&args.paths).map_err(|e| anyhow::anyhow!("--paths: {e}"))?;
    let threads = threads(args.threads);
    let inputs = match (&args.reference, &args.reads) {
        (Some(r), Some(q)) => Inputs::Files(Dataset {
            reference: r.clone(),
            reads: q.clone(),
            mates: args.mates.clone(),
        }),
        (None, Some(_)) => bail!("--reads needs --ref"),
        (reference, None) => {
            let size =
                kura_engine::spec::parse_size(&args.genome_size).map_err(anyhow::Error::msg)?;
            Inputs::Simulate {
                reference: reference.clone(),
                genome_size: usize::try_from(size).context("--genome-size")?,
                reads: args.simulate,
                paired: args.paired,
            }
        }
    };
    let plan = RunPlan {
        inputs,
        paths,
        dir: args.dir.clone(),
        threads,
        write_output: !args.no_output,
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let mut progress = Progress {
        args,
        threads,
        simulating: None,
        copying: None,
        stage: None,
    };
    let runs = genome_run::run_paths(&plan, &mut progress)?;
    if runs.len() > 1 {
        print_side_by_side(&runs);
    }
    if let Some(json) = &args.json {
        genome_run::write_json(json, &runs, threads)?;
    }
    Ok(runs)
}

/// What a path really stood on: `spec` is the device spec the run mounted
/// (`kura_genome::run::PathRun::spec`), `file:` where io_uring was refused for the direct path.
fn opened_as(path: IoPath, spec: Option<&str>) -> String {
    match spec {
        Some(s) if path == IoPath::Direct && s.starts_with("file:") => {
            "AccelFS on the direct engine's synchronous file backend (io_uring refused)".into()
        }
        _ => path.describe().to_string(),
    }
}

fn print_table2(path: IoPath, spec: Option<&str>, r: &RunReport, threads: usize) {
    let describe = opened_as(path, spec);
    println!();
    println!(
        "path {}: {describe}{}",
        path.name(),
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
    for r in genome_run::reductions(runs) {
        let (label, paper) = match r.other {
            IoPath::Redirect => ("redirect", " (paper: 33-46 % reduction)"),
            _ => ("host files", ""),
        };
        println!(
            "end to end: direct {:.3} s vs {label} {:.3} s: {:+.1} % reduction{paper}",
            r.direct_s, r.other_s, r.percent
        );
    }
}
