//! The paper's whole application (Table 2) as stages over a [`Store`]: load the reference, index
//! it, save the index, load it back, then stream the reads in batches and match them, writing
//! SAM or PAF. Every stage is timed on its own; the batches alternate between loading (I/O and
//! parsing) and matching (mapping and formatting), so the stage times add up to the wall time
//! and show where it goes, as the paper's table does. Accuracy is scored in memory against the
//! true origin in simulated read names (`CONTIG|START|END|…|…|idx`) when the names carry one.

use crate::fasta::{FastaReader, ParseError};
use crate::fastq::{FastqReader, FastqRecord, PairedReader};
use crate::index::{Index, IndexError, IndexParams, MAGIC};
use crate::map::{Hit, MapError, MapOptions, Mapper, Mapping};
use crate::pack::{PackError, PackedRef};
use crate::sam::{self, SamError};
use crate::source::SourceOptions;
use crate::store::{Store, StoreError};
use crate::truth::TrueOrigin;
use std::io::Write;
use std::time::{Duration, Instant};

/// Bases per batch of reads: about 1.3 MB of 150 bp reads, enough to keep every thread busy.
pub const DEFAULT_BATCH_BASES: usize = 2_000_000;

/// Bases a single-end batch holds at most for each mapping thread: four of the mapper's
/// 256-read work chunks of 150 bp reads, enough to keep each thread busy to the batch's end.
const SINGLE_BATCH_BASES_PER_THREAD: usize = 160_000;
/// The least a single-end batch is capped at, whatever the thread count.
const SINGLE_BATCH_BASES_MIN: usize = 300_000;
/// A placement within this many bases of the truth is correct (the rule).
pub const TOLERANCE: u64 = 10;
/// Misplaced reads at or above this MAPQ are the ones that count against a mapper.
pub const CONFIDENT_MAPQ: u8 = 20;

/// What went wrong in a stage.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("reference {path}: {source}")]
    Pack { path: String, source: PackError },
    #[error("reference {0}: no sequences")]
    EmptyReference(String),
    #[error("index {path}: {source}")]
    Index { path: String, source: IndexError },
    #[error(transparent)]
    Map(#[from] MapError),
    #[error("output {path}: {source}")]
    Output { path: String, source: SamError },
    #[error("device {spec}: {source}")]
    Device {
        spec: String,
        source: kura_engine::OpenError,
    },
    /// Mounting the AccelFS of a device (read-write) failed.
    #[error("mounting AccelFS from {spec}")]
    Mount {
        spec: String,
        source: kura_accelfs::FsError,
    },
    /// Mounting the AccelFS of a device read-only failed.
    #[error("mounting AccelFS read-only from {spec}")]
    MountReadOnly {
        spec: String,
        source: kura_accelfs::FsError,
    },
    /// A stage failed on one I/O path (`run::run_paths`).
    #[error("the pipeline on the {path} path")]
    OnPath {
        path: &'static str,
        source: Box<PipelineError>,
    },
    /// A host file or directory outside a [`Store`] (the dataset, the JSON report): `what` says
    /// what was being done (`creating …`, `writing …`).
    #[error("{what}")]
    Host {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Output format of mapped reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Sam,
    Paf,
}

/// Time spent in each stage of Table 2.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stages {
    pub load_reference: Duration,
    pub index: Duration,
    pub save_index: Duration,
    pub load_index: Duration,
    /// Reading and parsing the reads.
    pub load_reads: Duration,
    /// Mapping the reads.
    pub matching: Duration,
    /// Formatting and writing SAM/PAF, and syncing it.
    pub write_output: Duration,
}

impl Stages {
    /// The stages in the paper's order, with their names.
    pub fn named(&self) -> [(&'static str, Duration); 7] {
        [
            ("load reference", self.load_reference),
            ("index", self.index),
            ("save index", self.save_index),
            ("load index", self.load_index),
            ("load reads", self.load_reads),
            ("match", self.matching),
            ("write output", self.write_output),
        ]
    }

    pub fn total(&self) -> Duration {
        self.named().iter().map(|(_, d)| *d).sum()
    }

    /// Time spent loading data from storage (reference, index and reads).
    pub fn loading(&self) -> Duration {
        self.load_reference + self.load_index + self.load_reads
    }
}

/// Placements scored against the truth in the read names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Accuracy {
    /// Reads scored (each mate counts).
    pub reads: u64,
    pub mapped: u64,
    /// Right contig, leftmost (forward) or rightmost (reverse) base within [`TOLERANCE`].
    pub correct: u64,
    /// Wrong place with MAPQ ≥ [`CONFIDENT_MAPQ`].
    pub misplaced_confident: u64,
    /// Wrong place with a lower MAPQ (repeats).
    pub misplaced_low: u64,
    /// Reads whose names carry no true origin (not scored).
    pub without_truth: u64,
    /// Pairs marked proper (paired-end only).
    pub proper_pairs: u64,
}

impl Accuracy {
    pub fn fraction_correct(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            self.correct as f64 / self.reads as f64
        }
    }

    fn add(&mut self, reference: &PackedRef, name: &str, hit: Option<&Hit>) {
        let Ok(origin) = TrueOrigin::parse(name) else {
            self.without_truth += 1;
            return;
        };
        self.reads += 1;
        let Some(hit) = hit else { return };
        self.mapped += 1;
        let contig = reference
            .contigs()
            .get(hit.contig)
            .map_or("", |c| c.name.as_str());
        let (leftmost, rightmost) = (hit.pos + 1, hit.end());
        if origin.is_correct(contig, leftmost, rightmost, hit.reverse, TOLERANCE) {
            self.correct += 1;
        } else if hit.mapq >= CONFIDENT_MAPQ {
            self.misplaced_confident += 1;
        } else {
            self.misplaced_low += 1;
        }
    }
}

/// What the pipeline reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunReport {
    pub stages: Stages,
    /// Wall time of the whole run (the stages plus what lies between them).
    pub wall: Duration,
    pub contigs: usize,
    pub reference_bases: u64,
    pub index_bytes: u64,
    /// Reads mapped (each mate counts).
    pub reads: u64,
    /// Bytes of read files taken from storage (compressed size for gzip).
    pub read_bytes: u64,
    pub accuracy: Accuracy,
}

/// What the pipeline is doing, for progress displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A stage starts.
    Stage(&'static str),
    /// Bytes of the read files loaded so far, of `total`.
    Reads { bytes: u64, total: u64 },
}

/// Settings of a whole run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub reference: String,
    pub reads: String,
    /// Second mates, for paired-end reads.
    pub mates: Option<String>,
    /// Where the index is saved and loaded back from.
    pub index: String,
    /// Where mapped reads go (`-` for standard output); `None` maps without writing.
    pub output: Option<(String, OutputFormat)>,
    pub threads: usize,
    pub params: IndexParams,
    pub batch_bases: usize,
    /// Recorded in the SAM header.
    pub command_line: String,
}

/// Loads a FASTA (plain or gzip) into a packed reference.
pub fn load_reference(store: &Store, path: &str) -> Result<PackedRef, PipelineError> {
    let mut reference = PackedRef::new();
    for record in FastaReader::new(store.open_stream(path)?, path) {
        let record = record?;
        reference
            .push_contig(&record.name, &record.seq)
            .map_err(|source| PipelineError::Pack {
                path: path.to_string(),
                source,
            })?;
    }
    if reference.contigs().is_empty() {
        return Err(PipelineError::EmptyReference(path.to_string()));
    }
    Ok(reference)
}

fn index_error(path: &str) -> impl FnOnce(IndexError) -> PipelineError + '_ {
    move |source| PipelineError::Index {
        path: path.to_string(),
        source,
    }
}

/// Builds the minimizer index on `threads` threads.
pub fn build_index(
    reference: PackedRef,
    params: IndexParams,
    threads: usize,
) -> Result<Index, PipelineError> {
    Index::build(reference, params, threads).map_err(index_error("(in memory)"))
}

/// Saves the index durably; returns its size in bytes.
pub fn save_index(store: &Store, index: &Index, path: &str) -> Result<u64, PipelineError> {
    let mut out = store.create(path)?;
    index.write_to(&mut out).map_err(index_error(path))?;
    out.finish()?;
    Ok(store.len(path)?)
}

/// Loads an index saved by [`save_index`], checking every section.
pub fn load_index(store: &Store, path: &str) -> Result<Index, PipelineError> {
    // The index is parsed as fast as it is read, so 256 KiB chunks, one waiting, keep up; the
    // read sets' 4 MiB chunks, four in flight, would be 16 MiB resident for nothing.
    let opts = SourceOptions {
        chunk: 256 << 10,
        depth: 1,
    };
    Index::read_from(store.open_stream_with(path, opts)?).map_err(index_error(path))
}

/// Whether the file starts like a saved index (so `map` takes either a FASTA or an index).
pub fn is_index(store: &Store, path: &str) -> Result<bool, PipelineError> {
    let mut head = [0u8; MAGIC.len()];
    let got = store.read_head(path, &mut head)?;
    Ok(got == head.len() && head == MAGIC)
}

/// Reads to map and where the results go.
#[derive(Debug, Clone)]
pub struct MapJob<'a> {
    pub reads: &'a str,
    pub mates: Option<&'a str>,
    pub output: Option<(&'a str, OutputFormat)>,
    pub threads: usize,
    pub batch_bases: usize,
    pub command_line: &'a str,
}

/// What mapping the reads took and found.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MapReport {
    pub load_reads: Duration,
    pub matching: Duration,
    pub write_output: Duration,
    pub reads: u64,
    pub read_bytes: u64,
    pub accuracy: Accuracy,
}

/// Where mapped reads are written: a file of the store, or standard output (path `-`).
enum OutFile {
    Store(crate::store::StoreWriter),
    Stdout(std::io::BufWriter<std::io::Stdout>),
}

impl Write for OutFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            OutFile::Store(w) => w.write(buf),
            OutFile::Stdout(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            OutFile::Store(w) => w.flush(),
            OutFile::Stdout(w) => w.flush(),
        }
    }
}

enum Sink {
    None,
    Out {
        writer: OutFile,
        format: OutputFormat,
        path: String,
    },
}

impl Sink {
    fn open(
        store: &Store,
        output: Option<(&str, OutputFormat)>,
        reference: &PackedRef,
        command_line: &str,
    ) -> Result<Self, PipelineError> {
        let Some((path, format)) = output else {
            return Ok(Sink::None);
        };
        let mut writer = if path == "-" {
            OutFile::Stdout(std::io::BufWriter::with_capacity(
                1 << 20,
                std::io::stdout(),
            ))
        } else {
            OutFile::Store(store.create(path)?)
        };
        if format == OutputFormat::Sam {
            sam::write_header(&mut writer, reference, command_line).map_err(|source| {
                PipelineError::Output {
                    path: path.to_string(),
                    source,
                }
            })?;
        }
        Ok(Sink::Out {
            writer,
            format,
            path: path.to_string(),
        })
    }

    fn write(
        &mut self,
        reference: &PackedRef,
        reads: &[FastqRecord],
        mappings: &[Mapping],
    ) -> Result<(), PipelineError> {
        let Sink::Out {
            writer,
            format,
            path,
        } = self
        else {
            return Ok(());
        };
        for (read, m) in reads.iter().zip(mappings) {
            let done = match format {
                OutputFormat::Sam => sam::write_single(writer, reference, read, m),
                OutputFormat::Paf => sam::write_paf(writer, reference, read, m),
            };
            done.map_err(|source| PipelineError::Output {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    fn write_pairs(
        &mut self,
        reference: &PackedRef,
        first: &[FastqRecord],
        second: &[FastqRecord],
        pairs: &[crate::map::PairMapping],
    ) -> Result<(), PipelineError> {
        let Sink::Out {
            writer,
            format,
            path,
        } = self
        else {
            return Ok(());
        };
        for ((a, b), p) in first.iter().zip(second).zip(pairs) {
            let done = match format {
                OutputFormat::Sam => sam::write_pair(writer, reference, a, b, p),
                OutputFormat::Paf => sam::write_paf(
                    writer,
                    reference,
                    a,
                    &Mapping {
                        hit: p.first.clone(),
                    },
                )
                .and_then(|()| {
                    sam::write_paf(
                        writer,
                        reference,
                        b,
                        &Mapping {
                            hit: p.second.clone(),
                        },
                    )
                }),
            };
            done.map_err(|source| PipelineError::Output {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    fn finish(self) -> Result<(), PipelineError> {
        match self {
            Sink::None => Ok(()),
            Sink::Out {
                mut writer, path, ..
            } => {
                writer.flush().map_err(|e| {
                    PipelineError::Store(StoreError::Host {
                        path: path.clone(),
                        source: e,
                    })
                })?;
                match writer {
                    OutFile::Store(w) => Ok(w.finish()?),
                    OutFile::Stdout(_) => Ok(()),
                }
            }
        }
    }
}

/// Streams the reads (and mates) in batches, maps them and writes the results.
pub fn map_reads(
    store: &Store,
    index: &Index,
    job: &MapJob<'_>,
    on_event: &mut dyn FnMut(Event),
) -> Result<MapReport, PipelineError> {
    let reference = index.reference();
    let mut report = MapReport::default();
    let total = store.len(job.reads)? + job.mates.map_or(Ok(0), |m| store.len(m))?;
    let mut sink = Sink::open(store, job.output, reference, job.command_line)?;
    let opts = MapOptions {
        threads: job.threads.max(1),
        ..MapOptions::default()
    };
    let single = Mapper::new(index, opts.clone());
    let mut paired: Option<Mapper<'_>> = None;
    let batch_bases = job.batch_bases.max(1);
    let src1 = store.open_stream(job.reads)?;
    let stats1 = src1.stats();
    let mut reads1 = FastqReader::new(src1, job.reads);
    let (mut first, mut second) = (Vec::new(), Vec::new());
    // Single-end reads are mapped one by one, so where batches split cannot change a record;
    // smaller batches keep fewer parsed reads and results resident. Paired-end batches keep
    // `batch_bases`: the first one is the sample the insert window is estimated from.
    let single_batch = batch_bases.min(
        SINGLE_BATCH_BASES_MIN.max(SINGLE_BATCH_BASES_PER_THREAD.saturating_mul(opts.threads)),
    );
    match job.mates {
        None => loop {
            let t = Instant::now();
            let n = reads1.next_batch(&mut first, single_batch)?;
            report.load_reads += t.elapsed();
            if n == 0 {
                break;
            }
            let t = Instant::now();
            let mappings = single.map_batch(&first)?;
            report.matching += t.elapsed();
            let t = Instant::now();
            sink.write(reference, &first, &mappings)?;
            report.write_output += t.elapsed();
            for (read, m) in first.iter().zip(&mappings) {
                report.accuracy.add(reference, &read.name, m.hit.as_ref());
            }
            report.reads += n as u64;
            on_event(Event::Reads {
                bytes: stats1.raw_bytes(),
                total,
            });
        },
        Some(mates) => {
            let src2 = store.open_stream(mates)?;
            let stats2 = src2.stats();
            let mut pairs = PairedReader::new(reads1, FastqReader::new(src2, mates));
            loop {
                let t = Instant::now();
                let n = pairs.next_batch(&mut first, &mut second, batch_bases)?;
                report.load_reads += t.elapsed();
                if n == 0 {
                    break;
                }
                let t = Instant::now();
                // The insert window comes from the first batch and then stays fixed, so the
                // output does not depend on where batches happen to split. The first batch is
                // mapped once, estimating the window from its own placements.
                let mapped = match paired {
                    Some(ref m) => m.map_pairs(&first, &second)?,
                    None => {
                        let (mapped, window) = single.map_pairs_with_window(&first, &second)?;
                        let mut with_insert = opts.clone();
                        with_insert.insert = Some(window);
                        paired = Some(Mapper::new(index, with_insert));
                        mapped
                    }
                };
                report.matching += t.elapsed();
                let t = Instant::now();
                sink.write_pairs(reference, &first, &second, &mapped)?;
                report.write_output += t.elapsed();
                for ((a, b), p) in first.iter().zip(&second).zip(&mapped) {
                    report.accuracy.add(reference, &a.name, p.first.as_ref());
                    report.accuracy.add(reference, &b.name, p.second.as_ref());
                    report.accuracy.proper_pairs += u64::from(p.proper);
                }
                report.reads += 2 * n as u64;
                on_event(Event::Reads {
                    bytes: stats1.raw_bytes() + stats2.raw_bytes(),
                    total,
                });
            }
            report.read_bytes += stats2.raw_bytes();
        }
    }
    report.read_bytes += stats1.raw_bytes();
    let t = Instant::now();
    sink.finish()?;
    report.write_output += t.elapsed();
    Ok(report)
}

/// The whole pipeline, stage by stage.
pub fn run(
    store: &Store,
    opts: &RunOptions,
    on_event: &mut dyn FnMut(Event),
) -> Result<RunReport, PipelineError> {
    let wall = Instant::now();
    let mut report = RunReport::default();
    on_event(Event::Stage("load reference"));
    let t = Instant::now();
    let reference = load_reference(store, &opts.reference)?;
    report.stages.load_reference = t.elapsed();
    report.contigs = reference.contigs().len();
    report.reference_bases = reference.total_len();

    on_event(Event::Stage("index"));
    let t = Instant::now();
    let index = build_index(reference, opts.params, opts.threads)?;
    report.stages.index = t.elapsed();

    on_event(Event::Stage("save index"));
    let t = Instant::now();
    report.index_bytes = save_index(store, &index, &opts.index)?;
    report.stages.save_index = t.elapsed();
    drop(index);

    on_event(Event::Stage("load index"));
    let t = Instant::now();
    let index = load_index(store, &opts.index)?;
    report.stages.load_index = t.elapsed();

    on_event(Event::Stage("load reads + match"));
    let job = MapJob {
        reads: &opts.reads,
        mates: opts.mates.as_deref(),
        output: opts.output.as_ref().map(|(p, f)| (p.as_str(), *f)),
        threads: opts.threads,
        batch_bases: opts.batch_bases,
        command_line: &opts.command_line,
    };
    let mapped = map_reads(store, &index, &job, on_event)?;
    report.stages.load_reads = mapped.load_reads;
    report.stages.matching = mapped.matching;
    report.stages.write_output = mapped.write_output;
    report.reads = mapped.reads;
    report.read_bytes = mapped.read_bytes;
    report.accuracy = mapped.accuracy;
    report.wall = wall.elapsed();
    Ok(report)
}

/// Streams a file from the store without parsing (taking the source's own buffers, as the
/// parsers do) and returns (bytes, time): the read-loading ceiling the "load reads" stage is
/// compared with.
pub fn raw_read_throughput(store: &Store, path: &str) -> Result<(u64, Duration), PipelineError> {
    use std::io::BufRead;
    let t = Instant::now();
    let mut src = store.open_stream(path)?;
    let mut total = 0u64;
    loop {
        let n = match src.fill_buf() {
            Ok(b) => b.len(),
            Err(e) => {
                return Err(PipelineError::Store(StoreError::Host {
                    path: path.to_string(),
                    source: e,
                }))
            }
        };
        if n == 0 {
            break;
        }
        total += n as u64;
        src.consume(n);
    }
    Ok((total, t.elapsed()))
}
