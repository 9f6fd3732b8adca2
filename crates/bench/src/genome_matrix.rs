//! `kura bench genome --matrix`: kura against every peer mapper over a grid of read sets.
//!
//! For each reference size a repeat-rich synthetic genome is drawn
//! ([`kura_genome::repeats`]; or the `--ref` FASTA), every tool builds its index once with a
//! timed command of its own (seconds, peak RSS, bytes on disk), then for each error rate ×
//! indel rate reads are simulated (kura's wgsim-like simulator, names carrying the truth) and
//! mapped single-end (the first mates) and paired-end by every tool from its index, the tools
//! alternating over `--rounds` rounds. Each cell reports every tool's process wall time, peak
//! RSS and accuracy (scored by the same code, [`crate::genome_peers`]), kura's time against
//! minimap2's per round pair, and whether each of issue 19's targets holds there.

use crate::genome::GenomeBenchArgs;
use crate::genome_peers::{build_index, map, Index, Mapped, Tool};
use crate::stats::{compare, quotient, Compared, Spread};
use anyhow::{bail, Context};
use kura_genome::repeats::{repeat_genome, RepeatGenomeOptions};
use kura_genome::simulate::{write_fasta, write_reads, ReadOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};

const PLOT: &str = include_str!("../../../scripts/plot_genome_matrix.py");

/// SNP rate of the simulated haplotype: wgsim's default `-r 0.001 -R 0.15` leaves 0.085 % SNPs.
const SNP_RATE: f64 = 0.00085;

/// The grid of `--matrix` (ignored without it).
#[derive(Debug, Clone, clap::Args)]
pub struct MatrixArgs {
    /// --matrix: per-base sequencing error rates (substitutions), comma-separated.
    #[arg(long, default_value = "0.002,0.01,0.02")]
    pub errors: String,
    /// --matrix: per-base indel rates of the sampled haplotype (wgsim's -r × -R; SNPs stay at
    /// 0.085 %), comma-separated.
    #[arg(long, default_value = "0.001")]
    pub indels: String,
    /// --matrix: read layouts, comma-separated: single, paired.
    #[arg(long, default_value = "single,paired")]
    pub modes: String,
    /// --matrix: sizes of the synthetic references in bases (k, M, G suffixes), comma-separated;
    /// ignored with --ref. --quick caps them at 1M.
    #[arg(long, default_value = "2M")]
    pub ref_sizes: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Reference {
    pub name: String,
    pub bases: u64,
    pub contigs: usize,
    /// How it was made (generator and options, or the file).
    pub source: String,
    /// Every tool's index build.
    pub indexes: Vec<Index>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolCell {
    pub tool: String,
    /// Process wall time over the rounds.
    pub seconds: Spread,
    /// User + system CPU seconds over the rounds (the process and its descendants).
    pub cpu_seconds: Spread,
    /// Peak RSS over the rounds (median).
    pub peak_rss_mib: f64,
    pub reads: u64,
    pub mapped: u64,
    pub correct: u64,
    pub misplaced_mapq_ge_20: u64,
    pub proper_right: u64,
    pub max_mapq: u8,
    pub command: String,
}

/// Whether each of issue 19's targets holds in a cell (`None`: its peer did not run).
#[derive(Debug, Clone, Serialize)]
pub struct Targets {
    /// kura's correct placements ≥ the most accurate peer's.
    pub correct: Option<bool>,
    /// kura's misplaced reads with MAPQ ≥ 20 ≤ the most accurate peer's.
    pub misplaced: Option<bool>,
    /// kura's process wall time ≤ 0.8 × minimap2's (median of the per-round ratios).
    pub time: Option<bool>,
    /// kura's peak RSS ≤ minimap2's.
    pub rss: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub reference: String,
    pub ref_bases: u64,
    pub error_rate: f64,
    pub indel_rate: f64,
    pub mode: String,
    pub tools: Vec<ToolCell>,
    /// kura / minimap2 process wall time, per round pair.
    pub kura_vs_minimap2: Option<Compared>,
    /// kura / minimap2 CPU time (user + system), per round pair.
    pub kura_vs_minimap2_cpu: Option<Compared>,
    /// The peer with the most correct placements (fewest misplaced MAPQ ≥ 20 on a tie).
    pub most_accurate_peer: Option<String>,
    pub targets: Targets,
}

#[derive(Debug, Clone, Serialize)]
pub struct MatrixReport {
    pub threads: usize,
    pub rounds: usize,
    /// Reads (single) or pairs (paired) simulated per cell.
    pub reads_per_cell: u64,
    pub read_model: String,
    pub host: String,
    pub file_system: String,
    pub versions: Vec<(String, String)>,
    /// Tools that did not run, with why.
    pub skipped: Vec<String>,
    pub references: Vec<Reference>,
    pub cells: Vec<Cell>,
    pub notes: Vec<String>,
}

/// A size such as `500k`, `20M`, `1.5G` (decimal multiples of bases).
fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1e3),
        Some('m' | 'M') => (&s[..s.len() - 1], 1e6),
        Some('g' | 'G') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .with_context(|| format!("--ref-sizes: {s:?} is not a size such as 500k or 20M"))?;
    if !(v.is_finite() && v > 0.0) {
        bail!("--ref-sizes: {s:?} must be positive");
    }
    Ok((v * mult) as u64)
}

fn parse_rates(flag: &str, s: &str) -> anyhow::Result<Vec<f64>> {
    s.split(',')
        .map(|x| {
            let v: f64 = x
                .trim()
                .parse()
                .with_context(|| format!("{flag}: {x:?} is not a number"))?;
            if !(0.0..0.5).contains(&v) {
                bail!("{flag}: {v} is not a per-base rate in [0, 0.5)");
            }
            Ok(v)
        })
        .collect()
}

fn parse_modes(s: &str) -> anyhow::Result<Vec<bool>> {
    s.split(',')
        .map(|m| match m.trim() {
            "single" => Ok(false),
            "paired" => Ok(true),
            other => bail!("--modes: {other:?} is neither single nor paired"),
        })
        .collect()
}

/// The read simulation of one cell.
fn read_options(reads: u64, error_rate: f64, indel_rate: f64) -> ReadOptions {
    let mutation_rate = SNP_RATE + indel_rate;
    ReadOptions {
        n: reads,
        error_rate,
        mutation_rate,
        indel_fraction: indel_rate / mutation_rate,
        ..ReadOptions::default()
    }
}

pub fn run(args: &GenomeBenchArgs) -> anyhow::Result<()> {
    let quick = args.run.quick;
    let g = &args.grid;
    let errors = parse_rates("--errors", &g.errors)?;
    let indels = parse_rates("--indels", &g.indels)?;
    let modes = parse_modes(&g.modes)?;
    let mut sizes = g
        .ref_sizes
        .split(',')
        .map(parse_size)
        .collect::<anyhow::Result<Vec<u64>>>()?;
    if quick {
        sizes.iter_mut().for_each(|s| *s = (*s).min(1_000_000));
    }
    let reads = args.reads.unwrap_or(10_000);
    let reads = if quick { reads.min(2000) } else { reads };
    let rounds = args.rounds.unwrap_or(if quick { 1 } else { 3 }).max(1);
    let kura = std::env::current_exe().context("finding the kura binary")?;
    let mut tools = Vec::new();
    let mut skipped = Vec::new();
    for t in Tool::ALL {
        match t.available() {
            Ok(()) => tools.push(t),
            Err(why) => {
                println!("{why}");
                skipped.push(why);
            }
        }
    }
    let work = tempfile::Builder::new()
        .prefix("kura-bench-genome-matrix")
        .tempdir_in(&args.dir)
        .with_context(|| format!("creating a work dir in {}", args.dir.display()))?;
    let refs: Vec<Option<u64>> = match &args.reference {
        Some(_) => vec![None],
        None => sizes.iter().map(|&s| Some(s)).collect(),
    };
    let mut references = Vec::new();
    let mut cells = Vec::new();
    for size in refs {
        let dir = work.path().join(format!("ref-{}", references.len()));
        std::fs::create_dir_all(&dir)?;
        let fasta = dir.join("reference.fa");
        let (genome, name, source) = match size {
            Some(total) => {
                let opts = RepeatGenomeOptions::with_total(19, total as usize);
                let genome = repeat_genome(&opts);
                let name = human_bases(total);
                let source = format!(
                    "kura_genome::repeats seed {} ({} contigs, {} interspersed families covering {:.0} %, tandem repeats {:.0} %)",
                    opts.seed,
                    opts.contigs,
                    opts.families,
                    opts.interspersed * 100.0,
                    opts.tandem * 100.0
                );
                (genome, name, source)
            }
            None => {
                let path = args.reference.as_ref().context("no --ref and no size")?;
                let n = path.display().to_string();
                let store = kura_genome::store::Store::host("");
                let genome =
                    kura_genome::fasta::FastaReader::new(store.open_stream(&n)?, n.as_str())
                        .read_all()?;
                (genome, n.clone(), format!("the FASTA {n}"))
            }
        };
        write_fasta(
            std::io::BufWriter::new(std::fs::File::create(&fasta)?),
            &genome,
            80,
        )?;
        let bases: u64 = genome.iter().map(|c| c.seq.len() as u64).sum();
        println!(
            "reference {name}: {bases} bases in {} contigs; building every index",
            genome.len()
        );
        let mut indexes = Vec::new();
        for &t in &tools {
            let i = build_index(t, &kura, &fasta, &dir, args.threads)?;
            println!(
                "  {:<9} index {:>8.2} s {:>8.1} MiB RSS {:>8.1} MiB on disk",
                t.name(),
                i.seconds,
                i.peak_rss_mib,
                i.bytes as f64 / (1 << 20) as f64
            );
            indexes.push(i);
        }
        references.push(Reference {
            name: name.clone(),
            bases,
            contigs: genome.len(),
            source,
            indexes,
        });
        let here = references.len() - 1;
        for &e in &errors {
            for &ind in &indels {
                let r1 = dir.join("reads_1.fq");
                let r2 = dir.join("reads_2.fq");
                write_reads(&genome, &read_options(reads, e, ind), &r1, Some(&r2), false)?;
                for &paired in &modes {
                    let files: Vec<PathBuf> = if paired {
                        vec![r1.clone(), r2.clone()]
                    } else {
                        vec![r1.clone()]
                    };
                    let cell = run_cell(
                        &references[here].indexes,
                        &kura,
                        &files,
                        &dir,
                        args.threads,
                        rounds,
                    )?;
                    let cell = Cell {
                        reference: name.clone(),
                        ref_bases: bases,
                        error_rate: e,
                        indel_rate: ind,
                        mode: if paired { "paired" } else { "single" }.into(),
                        ..cell
                    };
                    print_cell(&cell);
                    cells.push(cell);
                    checkpoint(args, &references, &cells)?;
                }
            }
        }
        drop(genome);
        std::fs::remove_dir_all(&dir).ok();
    }
    let report = MatrixReport {
        threads: args.threads,
        rounds,
        reads_per_cell: reads,
        read_model: format!(
            "kura_genome::simulate (wgsim-like): 150 bp reads, fragments 500 ± 50 bp, substitution errors at the cell's rate, haplotype SNPs {:.3} % and indels at the cell's rate (1-4 bp, extended with p 0.3), seed 42; single = the first mates",
            SNP_RATE * 100.0
        ),
        host: format!(
            "{} ({} CPUs), Linux {}",
            crate::stats::cpu_model(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            crate::stats::kernel()
        ),
        file_system: crate::stats::fs_name(&args.dir),
        versions: tools
            .iter()
            .map(|t| (t.name().to_string(), t.version(&kura)))
            .collect(),
        skipped,
        references,
        cells,
        notes: vec![
            "every tool maps from an index built beforehand by its own timed command (references[].indexes); a cell's seconds are each mapping process's wall time, from start to exit, with the page cache of the reads and the index dropped before each run".into(),
            "peak RSS: the sum of VmHWM over the process and its descendants (bowtie2 is a Perl wrapper around bowtie2-align-s), sampled every 2 ms; CPU s: user + system time from wait4, descendants included (on a loaded host, wall time includes waiting for a CPU and CPU time does not)".into(),
            "accuracy: primary SAM records, correct within 10 bp of the simulated origin, misplaced with MAPQ >= 20 counted on each tool's own MAPQ scale (max_mapq: 60 for kura, minimap2 and bwa, 42 for bowtie2); bowtie2 runs with -X 1000 in paired cells (its default maximum fragment, 500, is the simulated mean)".into(),
            "targets (issue 19): correct >= the most accurate peer's, misplaced MAPQ>=20 <= that peer's, wall <= 0.8x minimap2's (median of the per-round ratios), peak RSS <= minimap2's".into(),
        ],
    };
    print_summary(&report);
    args.run.output.emit("genome-matrix", PLOT, &report)
}

/// The cells so far, next to `--json` (`NAME.partial.json`), so a long matrix that is stopped
/// still leaves what it measured; the finished run writes `--json` itself.
fn checkpoint(
    args: &GenomeBenchArgs,
    references: &[Reference],
    cells: &[Cell],
) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Partial<'a> {
        complete: bool,
        references: &'a [Reference],
        cells: &'a [Cell],
    }
    if let Some(json) = &args.run.output.json {
        let path = json.with_extension("partial.json");
        let partial = Partial {
            complete: false,
            references,
            cells,
        };
        std::fs::write(&path, serde_json::to_string_pretty(&partial)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn human_bases(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n % 100_000 == 0 => format!("{} Mbp", n as f64 / 1e6),
        n if n >= 1000 && n % 100 == 0 => format!("{} kbp", n as f64 / 1e3),
        n => format!("{n} bp"),
    }
}

/// Every tool over the rounds on one read set; the cell's coordinates are filled in by the
/// caller.
fn run_cell(
    indexes: &[Index],
    kura: &Path,
    reads: &[PathBuf],
    dir: &Path,
    threads: usize,
    rounds: usize,
) -> anyhow::Result<Cell> {
    let mut runs: Vec<Vec<Mapped>> = vec![Vec::new(); indexes.len()];
    let sam = dir.join("out.sam");
    for _ in 0..rounds {
        for (i, index) in indexes.iter().enumerate() {
            runs[i].push(map(index, kura, reads, &sam, threads)?);
        }
    }
    std::fs::remove_file(&sam).ok();
    let tools: Vec<ToolCell> = indexes
        .iter()
        .zip(&runs)
        .map(|(index, r)| tool_cell(index.tool, r))
        .collect();
    let figure = |t: Tool, f: fn(&Mapped) -> f64| {
        indexes
            .iter()
            .position(|i| i.tool == t)
            .map(|i| runs[i].iter().map(f).collect::<Vec<f64>>())
    };
    let versus = |f: fn(&Mapped) -> f64| match (figure(Tool::Kura, f), figure(Tool::Minimap2, f)) {
        (Some(k), Some(m)) => Some(compare(&k, &m, quotient, None)),
        _ => None,
    };
    let kura_vs_minimap2 = versus(|m| m.seconds);
    let kura_vs_minimap2_cpu = versus(|m| m.cpu_seconds);
    let (most_accurate_peer, targets) = judge(&tools, kura_vs_minimap2.as_ref());
    Ok(Cell {
        reference: String::new(),
        ref_bases: 0,
        error_rate: 0.0,
        indel_rate: 0.0,
        mode: String::new(),
        tools,
        kura_vs_minimap2,
        kura_vs_minimap2_cpu,
        most_accurate_peer,
        targets,
    })
}

/// A tool's rounds in one cell: the wall-time spread, the median peak RSS and the first
/// round's accuracy (the same input gives the same placements).
fn tool_cell(tool: Tool, rounds: &[Mapped]) -> ToolCell {
    let first = &rounds[0];
    let rss: Vec<f64> = rounds.iter().map(|m| m.peak_rss_mib).collect();
    ToolCell {
        tool: tool.name().into(),
        seconds: Spread::of(&rounds.iter().map(|m| m.seconds).collect::<Vec<f64>>()),
        cpu_seconds: Spread::of(&rounds.iter().map(|m| m.cpu_seconds).collect::<Vec<f64>>()),
        peak_rss_mib: Spread::of(&rss).median,
        reads: first.reads,
        mapped: first.mapped,
        correct: first.correct,
        misplaced_mapq_ge_20: first.misplaced_mapq_ge_20,
        proper_right: first.proper_right,
        max_mapq: first.max_mapq,
        command: first.command.clone(),
    }
}

/// The most accurate peer and whether each target holds for kura in a cell.
fn judge(tools: &[ToolCell], vs_minimap2: Option<&Compared>) -> (Option<String>, Targets) {
    let kura = tools.iter().find(|t| t.tool == Tool::Kura.name());
    let best = tools
        .iter()
        .filter(|t| t.tool != Tool::Kura.name())
        .max_by(|a, b| {
            a.correct
                .cmp(&b.correct)
                .then(b.misplaced_mapq_ge_20.cmp(&a.misplaced_mapq_ge_20))
        });
    let minimap2 = tools.iter().find(|t| t.tool == Tool::Minimap2.name());
    let targets = Targets {
        correct: kura.zip(best).map(|(k, b)| k.correct >= b.correct),
        misplaced: kura
            .zip(best)
            .map(|(k, b)| k.misplaced_mapq_ge_20 <= b.misplaced_mapq_ge_20),
        time: vs_minimap2
            .filter(|c| c.ratio.rounds > 0)
            .map(|c| c.ratio.median <= 0.8),
        rss: kura
            .zip(minimap2)
            .map(|(k, m)| k.peak_rss_mib <= m.peak_rss_mib),
    };
    (best.map(|b| b.tool.clone()), targets)
}

fn flag(x: Option<bool>) -> &'static str {
    match x {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    }
}

fn print_cell(c: &Cell) {
    println!(
        "{} | errors {:.1} % | indels {:.2} % | {} ({} records)",
        c.reference,
        c.error_rate * 100.0,
        c.indel_rate * 100.0,
        c.mode,
        c.tools.first().map_or(0, |t| t.reads)
    );
    println!(
        "  {:<9} {:>22} {:>22} {:>9} {:>9} {:>11} {:>8}",
        "tool", "wall s", "CPU s", "RSS MiB", "correct", "bad MAPQ20", "max MAPQ"
    );
    for t in &c.tools {
        println!(
            "  {:<9} {:>22} {:>22} {:>9.1} {:>9} {:>11} {:>8}",
            t.tool,
            t.seconds.show(3),
            t.cpu_seconds.show(3),
            t.peak_rss_mib,
            t.correct,
            t.misplaced_mapq_ge_20,
            t.max_mapq
        );
    }
    if let (Some(r), Some(cpu)) = (&c.kura_vs_minimap2, &c.kura_vs_minimap2_cpu) {
        println!(
            "  kura / minimap2 wall time {}x, CPU time {}x",
            r.ratio.show(2),
            cpu.ratio.show(2)
        );
    }
}

fn print_summary(r: &MatrixReport) {
    println!(
        "\nkura bench genome --matrix: {} reads/pairs per cell, {} threads, median [min–max] of {} round(s), {}",
        r.reads_per_cell, r.threads, r.rounds, r.host
    );
    println!("index builds (seconds / MiB on disk):");
    for reference in &r.references {
        let parts: Vec<String> = reference
            .indexes
            .iter()
            .map(|i| {
                format!(
                    "{} {:.2} s / {:.1} MiB",
                    i.tool.name(),
                    i.seconds,
                    i.bytes as f64 / (1 << 20) as f64
                )
            })
            .collect();
        println!("  {}: {}", reference.name, parts.join("; "));
    }
    println!(
        "{:<10} {:>6} {:>6} {:<7} {:>10} {:>10} {:>10} {:>8} {:>12} {:>8} {:>8} {:>5} {:>5}",
        "reference",
        "err %",
        "indel%",
        "mode",
        "kura/mm2 t",
        "cpu ratio",
        "kura RSS",
        "mm2 RSS",
        "best peer",
        "correct",
        "bad20",
        "time",
        "rss"
    );
    for c in &r.cells {
        let kura = c.tools.iter().find(|t| t.tool == "kura");
        let mm2 = c.tools.iter().find(|t| t.tool == "minimap2");
        println!(
            "{:<10} {:>6.1} {:>6.2} {:<7} {:>10} {:>10} {:>10} {:>8} {:>12} {:>8} {:>8} {:>5} {:>5}",
            c.reference,
            c.error_rate * 100.0,
            c.indel_rate * 100.0,
            c.mode,
            c.kura_vs_minimap2
                .as_ref()
                .map_or("-".into(), |k| format!("{:.2}x", k.ratio.median)),
            c.kura_vs_minimap2_cpu
                .as_ref()
                .map_or("-".into(), |k| format!("{:.2}x", k.ratio.median)),
            kura.map_or("-".into(), |k| format!("{:.1}", k.peak_rss_mib)),
            mm2.map_or("-".into(), |m| format!("{:.1}", m.peak_rss_mib)),
            c.most_accurate_peer.as_deref().unwrap_or("-"),
            flag(c.targets.correct),
            flag(c.targets.misplaced),
            flag(c.targets.time),
            flag(c.targets.rss)
        );
    }
    let held = |f: fn(&Targets) -> Option<bool>| {
        let v: Vec<bool> = r.cells.iter().filter_map(|c| f(&c.targets)).collect();
        format!("{}/{}", v.iter().filter(|&&x| x).count(), v.len())
    };
    println!(
        "targets held in cells: correct >= best peer {}, misplaced MAPQ>=20 <= best peer {}, wall <= 0.8x minimap2 {}, RSS <= minimap2 {}",
        held(|t| t.correct),
        held(|t| t.misplaced),
        held(|t| t.time),
        held(|t| t.rss)
    );
    for v in &r.versions {
        println!("  {}: {}", v.0, v.1);
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

    #[test]
    fn sizes_rates_and_modes_parse_or_say_why_not() {
        assert_eq!(parse_size("500k").unwrap(), 500_000);
        assert_eq!(parse_size("2.5M").unwrap(), 2_500_000);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("abc").unwrap_err().to_string().contains("abc"));
        assert!(parse_size("-1M").is_err());
        assert_eq!(
            parse_rates("--errors", "0.002,0.01").unwrap(),
            [0.002, 0.01]
        );
        assert!(parse_rates("--errors", "0.7").is_err());
        assert!(parse_rates("--errors", "x").is_err());
        assert_eq!(parse_modes("single,paired").unwrap(), [false, true]);
        assert!(parse_modes("triple").is_err());
    }

    #[test]
    fn an_indel_rate_is_split_from_the_snps() {
        let o = read_options(10, 0.01, 0.005);
        assert!((o.mutation_rate * o.indel_fraction - 0.005).abs() < 1e-12);
        assert!((o.mutation_rate * (1.0 - o.indel_fraction) - SNP_RATE).abs() < 1e-12);
    }

    fn cell(tool: &str, correct: u64, bad: u64, rss: f64) -> ToolCell {
        ToolCell {
            tool: tool.into(),
            seconds: Spread::of(&[1.0]),
            cpu_seconds: Spread::of(&[1.0]),
            peak_rss_mib: rss,
            reads: 100,
            mapped: 100,
            correct,
            misplaced_mapq_ge_20: bad,
            proper_right: 0,
            max_mapq: 60,
            command: String::new(),
        }
    }

    #[test]
    fn targets_are_judged_against_the_most_accurate_peer_and_minimap2() {
        let tools = [
            cell("kura", 95, 1, 50.0),
            cell("minimap2", 94, 0, 60.0),
            cell("bwa mem", 96, 2, 10.0),
            cell("bowtie2", 96, 1, 10.0),
        ];
        let c = compare(&[0.7, 0.9], &[1.0, 1.0], quotient, None);
        let (best, t) = judge(&tools, Some(&c));
        assert_eq!(
            best.as_deref(),
            Some("bowtie2"),
            "a tie goes to fewer misplaced"
        );
        assert_eq!(t.correct, Some(false));
        assert_eq!(t.misplaced, Some(true));
        assert_eq!(t.time, Some(true), "median of 0.7 and 0.9");
        assert_eq!(t.rss, Some(true));
        let (best, t) = judge(&tools[..1], None);
        assert_eq!(best, None);
        assert_eq!((t.correct, t.time, t.rss), (None, None, None));
    }
}
