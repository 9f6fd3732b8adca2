//! The whole application on each I/O path, side by side (the paper's Table 2 per path, Fig. 8):
//! the dataset (given files, or reads simulated from a reference: the real E. coli genome when
//! Debian's ragout-examples is installed, else a seeded synthetic one), the [`Workspace`] that
//! holds it as host files and in an AccelFS image, the pipeline run on each path with the page
//! cache dropped first, and the report: each path's [`RunReport`], the end-to-end reductions of
//! the direct path against the others, and the JSON `kura genome run --json` writes.
//!
//! The caller (the `kura genome run` command, `kura demo`) sees progress through an
//! [`Observer`] and prints; nothing here writes to the terminal.

use crate::fasta::FastaReader;
use crate::index::IndexParams;
use crate::paths::{IoPath, Workspace, MG1655};
use crate::pipeline::{self, Event, OutputFormat, PipelineError, RunOptions, RunReport};
use crate::simulate::{self, GenomeOptions, ReadOptions};
use crate::store::Store;
use std::path::{Path, PathBuf};

/// Seed of the reads `run_paths` simulates.
const SEED: u64 = 42;

fn host(what: String) -> impl FnOnce(std::io::Error) -> PipelineError {
    move |source| PipelineError::Host { what, source }
}

/// The input files of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    pub reference: PathBuf,
    pub reads: PathBuf,
    /// Second mates (paired-end).
    pub mates: Option<PathBuf>,
}

impl Dataset {
    /// The files in order: reference, reads, mates.
    pub fn files(&self) -> Vec<&Path> {
        let mut files = vec![self.reference.as_path(), self.reads.as_path()];
        files.extend(self.mates.as_deref());
        files
    }
}

/// What [`simulate_dataset`] writes.
#[derive(Debug, Clone)]
pub struct DatasetOptions<'a> {
    /// Simulate from this FASTA (plain or gzip) instead of a synthetic genome.
    pub from: Option<&'a Path>,
    /// Size of the synthetic genome (when `from` is `None`).
    pub genome_size: usize,
    /// Reads, or pairs with `paired`.
    pub reads: u64,
    pub paired: bool,
    pub seed: u64,
    /// gzip the FASTQ.
    pub gzip: bool,
}

/// Writes `reference.fa` (a copy of `from`, or a synthetic genome) and simulated reads
/// (`reads_1.fq`, `reads_2.fq` when paired, `.fq.gz` with gzip) into `dir`.
pub fn simulate_dataset(dir: &Path, opts: &DatasetOptions<'_>) -> Result<Dataset, PipelineError> {
    std::fs::create_dir_all(dir).map_err(host(format!("creating {}", dir.display())))?;
    let genome = match opts.from {
        Some(path) => {
            let store = Store::host("");
            let name = path.display().to_string();
            FastaReader::new(store.open_stream(&name)?, name.as_str()).read_all()?
        }
        None => simulate::synthetic_genome(&GenomeOptions::with_total(opts.seed, opts.genome_size)),
    };
    let reference = dir.join("reference.fa");
    let file = std::fs::File::create(&reference)
        .map_err(host(format!("creating {}", reference.display())))?;
    simulate::write_fasta(std::io::BufWriter::new(file), &genome, 80)
        .map_err(host(format!("writing {}", reference.display())))?;
    let ext = if opts.gzip { "fq.gz" } else { "fq" };
    let first = dir.join(format!("reads_1.{ext}"));
    let second = dir.join(format!("reads_2.{ext}"));
    let reads = ReadOptions {
        seed: opts.seed,
        n: opts.reads,
        ..ReadOptions::default()
    };
    simulate::write_reads(
        &genome,
        &reads,
        &first,
        opts.paired.then_some(&*second),
        opts.gzip,
    )
    .map_err(host(format!("writing reads into {}", dir.display())))?;
    Ok(Dataset {
        reference,
        reads: first,
        mates: opts.paired.then_some(second),
    })
}

/// Where a run's input files come from.
#[derive(Debug, Clone)]
pub enum Inputs {
    /// These files.
    Files(Dataset),
    /// Reads simulated into the work directory (with [`simulate_dataset`], seed 42, 150 bp).
    Simulate {
        /// The reference to simulate from; `None`: MG1655 where installed, else synthetic.
        reference: Option<PathBuf>,
        /// Size of the synthetic genome.
        genome_size: usize,
        /// Reads, or pairs with `paired`.
        reads: u64,
        paired: bool,
    },
}

impl Inputs {
    /// The reference reads are simulated from: the one given, else MG1655 where installed;
    /// `None` for a synthetic genome (and for given files).
    pub fn simulated_from(&self) -> Option<PathBuf> {
        match self {
            Inputs::Files(_) => None,
            Inputs::Simulate {
                reference: Some(r), ..
            } => Some(r.clone()),
            Inputs::Simulate {
                reference: None, ..
            } => Some(PathBuf::from(MG1655)).filter(|p| p.exists()),
        }
    }
}

/// A run of the pipeline on several I/O paths.
#[derive(Debug, Clone)]
pub struct RunPlan {
    pub inputs: Inputs,
    /// The paths, in the order they run.
    pub paths: Vec<IoPath>,
    /// Work directory for the dataset and the image; `None`: a temp dir, removed afterwards.
    pub dir: Option<PathBuf>,
    pub threads: usize,
    /// Write SAM (`mapped.sam`); `false` maps only.
    pub write_output: bool,
    /// Recorded in the SAM header.
    pub command_line: String,
}

/// Progress of [`run_paths`], in the order the calls come; every method does nothing unless
/// overridden.
pub trait Observer {
    /// Simulation starts; `from` is the reference (`None`: a synthetic genome).
    fn simulating(&mut self, _from: Option<&Path>) {}
    /// The simulated dataset is written.
    fn simulated(&mut self, _from: Option<&Path>) {}
    /// Copying the dataset into the workspace (`done` of `total` bytes into the image).
    fn copying(&mut self, _done: u64, _total: u64) {}
    /// The workspace is ready.
    fn copied(&mut self) {}
    /// The store of `path` is open (page cache dropped); the pipeline starts.
    fn path_started(&mut self, _path: IoPath) {}
    /// A pipeline event on `path`.
    fn event(&mut self, _path: IoPath, _event: Event) {}
    /// The pipeline on a path finished and its store is closed.
    fn path_done(&mut self, _run: &PathRun) {}
}

/// An observer that ignores everything.
impl Observer for () {}

/// One path's result.
#[derive(Debug, Clone)]
pub struct PathRun {
    pub path: IoPath,
    /// The device spec the image was actually mounted with (`file:` where the direct path fell
    /// back from io_uring; `None` for host files).
    pub spec: Option<String>,
    pub report: RunReport,
}

/// Prepares the dataset and the workspace and runs the pipeline on each path of `plan`.
pub fn run_paths(
    plan: &RunPlan,
    observer: &mut dyn Observer,
) -> Result<Vec<PathRun>, PipelineError> {
    let temp = match &plan.dir {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("kura-genome")
                .tempdir()
                .map_err(host("creating a temp dir".into()))?,
        ),
    };
    let dir = match (&plan.dir, &temp) {
        (Some(d), _) => d.clone(),
        (_, Some(t)) => t.path().to_path_buf(),
        (None, None) => unreachable!("a temp dir is made when no dir is given"),
    };
    let dataset = match &plan.inputs {
        Inputs::Files(files) => files.clone(),
        Inputs::Simulate {
            genome_size,
            reads,
            paired,
            ..
        } => {
            let from = plan.inputs.simulated_from();
            observer.simulating(from.as_deref());
            let dataset = simulate_dataset(
                &dir.join("data"),
                &DatasetOptions {
                    from: from.as_deref(),
                    genome_size: *genome_size,
                    reads: *reads,
                    paired: *paired,
                    seed: SEED,
                    gzip: false,
                },
            )?;
            observer.simulated(from.as_deref());
            dataset
        }
    };
    let mut inputs: Vec<(&str, &Path)> = vec![
        ("reference", &dataset.reference),
        ("reads_1", &dataset.reads),
    ];
    if let Some(m) = &dataset.mates {
        inputs.push(("reads_2", m));
    }
    let work = Workspace::prepare(&dir.join("work"), &inputs, &mut |done, total| {
        observer.copying(done, total)
    })?;
    observer.copied();
    let opts = RunOptions {
        reference: "reference".into(),
        reads: "reads_1".into(),
        mates: dataset.mates.as_ref().map(|_| "reads_2".to_string()),
        index: "reference.kgi".into(),
        output: plan
            .write_output
            .then(|| ("mapped.sam".to_string(), OutputFormat::Sam)),
        threads: plan.threads,
        params: IndexParams::default(),
        batch_bases: pipeline::DEFAULT_BATCH_BASES,
        command_line: plan.command_line.clone(),
    };
    let mut runs = Vec::new();
    for &path in &plan.paths {
        let opened = work.open(path)?;
        observer.path_started(path);
        let report = pipeline::run(&opened.store, &opts, &mut |e| observer.event(path, e))
            .map_err(|e| PipelineError::OnPath {
                path: path.name(),
                source: Box::new(e),
            })?;
        let spec = opened.spec.clone();
        opened.close()?;
        let run = PathRun { path, spec, report };
        observer.path_done(&run);
        runs.push(run);
    }
    Ok(runs)
}

/// The end-to-end time of the direct path against another path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reduction {
    /// The other path.
    pub other: IoPath,
    /// Stage total on the direct path, seconds.
    pub direct_s: f64,
    /// Stage total on the other path, seconds.
    pub other_s: f64,
    /// `100 × (1 − direct / other)`: positive when the direct path is faster.
    pub percent: f64,
}

/// The direct path against redirect (the paper reports 33–46 %) and against host files, for
/// those that ran.
pub fn reductions(runs: &[PathRun]) -> Vec<Reduction> {
    let total_of = |p: IoPath| {
        runs.iter()
            .find(|r| r.path == p)
            .map(|r| r.report.stages.total().as_secs_f64())
    };
    let Some(direct) = total_of(IoPath::Direct) else {
        return Vec::new();
    };
    [IoPath::Redirect, IoPath::Host]
        .into_iter()
        .filter_map(|other| {
            total_of(other).map(|them| Reduction {
                other,
                direct_s: direct,
                other_s: them,
                percent: 100.0 * (1.0 - direct / them.max(1e-9)),
            })
        })
        .collect()
}

/// The runs as JSON: an array with one object per path (stages as `[name, seconds]` pairs in
/// the paper's order, totals, sizes, accuracy).
pub fn runs_json(runs: &[PathRun], threads: usize) -> serde_json::Value {
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
    serde_json::Value::Array(list)
}

/// Writes [`runs_json`] (pretty-printed) to `path`, creating its directory.
pub fn write_json(path: &Path, runs: &[PathRun], threads: usize) -> Result<(), PipelineError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(host(format!("creating {}", parent.display())))?;
    }
    std::fs::write(
        path,
        serde_json::to_string_pretty(&runs_json(runs, threads))?,
    )
    .map_err(host(format!("writing {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_simulated_run_on_host_files_reports_and_serialises() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A synthetic genome: `Inputs::Simulate` would pick MG1655 where it is installed.
        let dataset = simulate_dataset(
            &dir.path().join("data"),
            &DatasetOptions {
                from: None,
                genome_size: 200_000,
                reads: 500,
                paired: true,
                seed: 7,
                gzip: false,
            },
        )
        .expect("simulate");
        assert_eq!(dataset.files().len(), 3);
        let plan = RunPlan {
            inputs: Inputs::Files(dataset),
            paths: vec![IoPath::Host],
            dir: Some(dir.path().to_path_buf()),
            threads: 2,
            write_output: true,
            command_line: "test".into(),
        };
        let runs = run_paths(&plan, &mut ()).expect("run");
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].path, IoPath::Host);
        assert_eq!(runs[0].spec, None);
        assert_eq!(runs[0].report.reads, 1000);
        assert!(reductions(&runs).is_empty(), "no direct path ran");
        let json = runs_json(&runs, 2);
        assert_eq!(json[0]["path"], "host");
        assert_eq!(json[0]["stages_s"].as_array().map(Vec::len), Some(7));
        assert!(dir.path().join("work/mapped.sam").exists());
    }

    #[test]
    fn reductions_compare_the_direct_path_with_the_others() {
        let run = |path, secs: u64| PathRun {
            path,
            spec: None,
            report: RunReport {
                stages: pipeline::Stages {
                    matching: std::time::Duration::from_secs(secs),
                    ..Default::default()
                },
                ..Default::default()
            },
        };
        let runs = [
            run(IoPath::Host, 4),
            run(IoPath::Direct, 2),
            run(IoPath::Redirect, 3),
        ];
        let r = reductions(&runs);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].other, IoPath::Redirect);
        assert!((r[0].percent - 100.0 / 3.0).abs() < 1e-9);
        assert_eq!(r[1].other, IoPath::Host);
        assert!((r[1].percent - 50.0).abs() < 1e-9);
    }
}
