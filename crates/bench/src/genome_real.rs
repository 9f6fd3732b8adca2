//! `kura bench genome --real`: real Illumina reads, where no truth exists (issue 19 part 3).
//!
//! The default read set is the one real paired-end Illumina run Debian ships: SPAdes' test
//! dataset (`apt-get install spades`), 2,054 pairs of E. coli K-12 MG1655 reads from an Illumina
//! Genome Analyzer run, mapped to the whole MG1655 genome (`ragout-examples`). Every tool (kura,
//! minimap2, bwa mem, bowtie2) maps them from its own prebuilt index, rounds interleaved, each
//! run a child process measured whole. Without truth, each SAM is described by what can be
//! counted on its own (mapping rate, properly-paired rate, MAPQ ≥ 20 rate, `samtools flagstat`
//! and `samtools stats`) and compared with minimap2's primary placement of every read: the
//! same contig and strand with unclipped starts within [`AGREE_BP`] is agreement. The reads on
//! which a tool and minimap2 differ are listed, so a reader can look at them.

use crate::genome::GenomeBenchArgs;
use crate::genome_peers::{build_index, run_mapper, which, Index, Measured, Tool};
use crate::stats::Spread;
use anyhow::{bail, Context};
use kura_genome::paths::MG1655;
use serde::Serialize;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;

/// SPAdes' real E. coli read pair, as Debian's `spades` installs it.
pub const SPADES_READS: [&str; 2] = [
    "/usr/share/spades/test_dataset/ecoli_1K_1.fq.gz",
    "/usr/share/spades/test_dataset/ecoli_1K_2.fq.gz",
];

/// Placements whose unclipped starts differ by at most this many bases agree (the simulated
/// matrix scores "correct" with the same window).
pub const AGREE_BP: u64 = 10;

/// Disagreements of each kind kept in the report, in read-name order.
const LISTED: usize = 25;

/// A primary SAM record's placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub contig: String,
    /// SAM POS (1-based leftmost aligned base).
    pub pos: u64,
    /// POS less the leading clips: where the read's first base would lie, comparable across
    /// tools that clip differently.
    pub unclipped_start: i64,
    pub reverse: bool,
    pub mapq: u8,
    pub cigar: String,
    /// Flag 0x2: the tool calls the pair proper.
    pub proper: bool,
}

/// What one SAM says of its primary records.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SamSummary {
    pub records: u64,
    pub mapped: u64,
    pub properly_paired: u64,
    pub mapq_ge_20: u64,
    /// Each primary record by (read name without /1 or /2, mate 0/1/2); `None` when unmapped.
    #[serde(skip)]
    pub placements: HashMap<(String, u8), Option<Placement>>,
}

impl SamSummary {
    fn rate(&self, n: u64) -> f64 {
        if self.records == 0 {
            0.0
        } else {
            n as f64 / self.records as f64
        }
    }
}

/// Reads the primary records of SAM text. A record with fewer than 6 fields, or a flag, POS or
/// MAPQ that is not a number, is an error naming the line, never skipped.
pub fn summarise_sam(sam: impl BufRead, name: &str) -> anyhow::Result<SamSummary> {
    let mut s = SamSummary::default();
    for (i, line) in sam.lines().enumerate() {
        let line = line.with_context(|| format!("reading {name}"))?;
        if line.starts_with('@') || line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.splitn(7, '\t').collect();
        if f.len() < 6 {
            bail!(
                "{name}:{}: a SAM record has {} fields, not 11",
                i + 1,
                f.len()
            );
        }
        let number = |what: &str, v: &str| -> anyhow::Result<u64> {
            v.parse()
                .with_context(|| format!("{name}:{}: {what} {v:?} is not a number", i + 1))
        };
        let flag = number("FLAG", f[1])?;
        if flag & 0x900 != 0 {
            continue; // secondary or supplementary
        }
        let mate = if flag & 0x40 != 0 {
            1
        } else if flag & 0x80 != 0 {
            2
        } else {
            0
        };
        let read = f[0]
            .strip_suffix("/1")
            .or_else(|| f[0].strip_suffix("/2"))
            .unwrap_or(f[0]);
        s.records += 1;
        let placement = if flag & 0x4 == 0 {
            let pos = number("POS", f[3])?;
            let mapq = u8::try_from(number("MAPQ", f[4])?.min(255)).unwrap_or(u8::MAX);
            let proper = flag & 0x2 != 0;
            s.mapped += 1;
            s.properly_paired += u64::from(proper);
            s.mapq_ge_20 += u64::from(mapq >= 20);
            Some(Placement {
                contig: f[2].to_string(),
                pos,
                unclipped_start: pos as i64 - leading_clip(f[5]) as i64,
                reverse: flag & 0x10 != 0,
                mapq,
                cigar: f[5].to_string(),
                proper,
            })
        } else {
            None
        };
        if s.placements
            .insert((read.to_string(), mate), placement)
            .is_some()
        {
            bail!(
                "{name}:{}: a second primary record of {read} mate {mate}",
                i + 1
            );
        }
    }
    Ok(s)
}

/// Bases soft- or hard-clipped before the first aligned base (0 for `*` or a CIGAR that does
/// not start with a clip).
fn leading_clip(cigar: &str) -> u64 {
    let mut total = 0u64;
    let mut n = 0u64;
    for c in cigar.bytes() {
        match c {
            b'0'..=b'9' => n = n.saturating_mul(10).saturating_add(u64::from(c - b'0')),
            b'S' | b'H' => {
                total += n;
                n = 0;
            }
            _ => break,
        }
    }
    total
}

/// One read (or mate) on which a tool and minimap2 differ.
#[derive(Debug, Clone, Serialize)]
pub struct Disagreement {
    pub read: String,
    pub mate: u8,
    pub tool: Option<Placement>,
    pub minimap2: Option<Placement>,
}

/// A tool's placements against minimap2's, read by read.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Agreement {
    pub tool: String,
    pub both_mapped: u64,
    /// Same contig and strand, unclipped starts within [`AGREE_BP`].
    pub agree: u64,
    pub disagree: u64,
    pub only_tool_mapped: u64,
    pub only_minimap2_mapped: u64,
    pub neither_mapped: u64,
    /// Records in one SAM and not the other (should be 0: every tool writes every read).
    pub missing: u64,
    /// `agree / both_mapped`.
    pub agree_fraction: f64,
    /// The first few of each kind, by read name.
    pub placed_differently: Vec<Disagreement>,
    pub only_one_mapped: Vec<Disagreement>,
}

/// Compares `tool`'s placements with minimap2's.
pub fn agreement(tool: &str, ours: &SamSummary, minimap2: &SamSummary) -> Agreement {
    let mut a = Agreement {
        tool: tool.to_string(),
        ..Agreement::default()
    };
    let mut keys: Vec<&(String, u8)> = ours
        .placements
        .keys()
        .chain(minimap2.placements.keys())
        .collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let (Some(t), Some(m)) = (ours.placements.get(key), minimap2.placements.get(key)) else {
            a.missing += 1;
            continue;
        };
        let listed = |list: &mut Vec<Disagreement>| {
            if list.len() < LISTED {
                list.push(Disagreement {
                    read: key.0.clone(),
                    mate: key.1,
                    tool: t.clone(),
                    minimap2: m.clone(),
                });
            }
        };
        match (t, m) {
            (Some(x), Some(y)) => {
                a.both_mapped += 1;
                let same = x.contig == y.contig
                    && x.reverse == y.reverse
                    && x.unclipped_start.abs_diff(y.unclipped_start) <= AGREE_BP;
                if same {
                    a.agree += 1;
                } else {
                    a.disagree += 1;
                    listed(&mut a.placed_differently);
                }
            }
            (Some(_), None) => {
                a.only_tool_mapped += 1;
                listed(&mut a.only_one_mapped);
            }
            (None, Some(_)) => {
                a.only_minimap2_mapped += 1;
                listed(&mut a.only_one_mapped);
            }
            (None, None) => a.neither_mapped += 1,
        }
    }
    a.agree_fraction = if a.both_mapped == 0 {
        0.0
    } else {
        a.agree as f64 / a.both_mapped as f64
    };
    a
}

/// One tool's runs on the real reads.
#[derive(Debug, Clone, Serialize)]
pub struct RealTool {
    pub tool: Tool,
    pub index: Index,
    pub seconds: Spread,
    pub cpu_seconds: Spread,
    pub peak_rss_mib: Spread,
    pub command: String,
    pub summary: SamSummary,
    pub mapped_fraction: f64,
    pub properly_paired_fraction: f64,
    pub mapq_ge_20_fraction: f64,
    /// `samtools flagstat` of the SAM, as printed (absent without samtools).
    pub flagstat: Option<String>,
    /// `samtools stats`' summary numbers (its SN lines), name and value.
    pub samtools_sn: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RealReport {
    pub reference: String,
    pub reads: Vec<String>,
    pub pairs: u64,
    pub threads: usize,
    pub rounds: usize,
    pub host: String,
    pub versions: Vec<(String, String)>,
    pub skipped: Vec<String>,
    pub tools: Vec<RealTool>,
    /// Every other tool against minimap2.
    pub versus_minimap2: Vec<Agreement>,
    pub notes: Vec<String>,
}

/// The read files: `--real-reads R1,R2`, else SPAdes' pair.
fn read_files(args: &GenomeBenchArgs) -> anyhow::Result<Vec<PathBuf>> {
    let files: Vec<PathBuf> = if args.real_reads.is_empty() {
        SPADES_READS.iter().map(PathBuf::from).collect()
    } else {
        args.real_reads.clone()
    };
    if !(1..=2).contains(&files.len()) {
        bail!(
            "--real-reads takes one FASTQ (single-end) or two (pairs), not {}",
            files.len()
        );
    }
    for f in &files {
        if !f.exists() {
            if args.real_reads.is_empty() {
                bail!(
                    "{} is missing: the default real read set is SPAdes' test data \
                     (apt-get install spades), or give --real-reads R1,R2",
                    f.display()
                );
            }
            bail!("{} does not exist", f.display());
        }
    }
    Ok(files)
}

/// Counts FASTQ records (4 lines each) of a plain or gzip file.
fn fastq_records(path: &Path) -> anyhow::Result<u64> {
    let name = path.display().to_string();
    let store = kura_genome::store::Store::host("");
    let stream = store.open_stream(&name)?;
    let mut n = 0;
    for record in kura_genome::fastq::FastqReader::new(stream, name.as_str()) {
        record.with_context(|| format!("reading {name}"))?;
        n += 1;
    }
    Ok(n)
}

pub fn run(args: &GenomeBenchArgs) -> anyhow::Result<()> {
    let reads = read_files(args)?;
    let source = match &args.reference {
        Some(r) => r.clone(),
        None if Path::new(MG1655).exists() => PathBuf::from(MG1655),
        None => bail!(
            "{MG1655} is missing: the real reads are E. coli K-12 MG1655's \
             (apt-get install ragout-examples), or give --ref"
        ),
    };
    let rounds = crate::stats::rounds(args.rounds, args.run.quick, 1);
    let kura = std::env::current_exe().context("finding the kura binary")?;
    let dir = tempfile::Builder::new()
        .prefix("kura-bench-genome-real")
        .tempdir_in(&args.dir)
        .with_context(|| format!("creating a work dir in {}", args.dir.display()))?;
    let reference = crate::genome::plain_fasta(&source, &dir.path().join("reference.fa"))?;
    let pairs = fastq_records(&reads[0])?;
    if reads.len() == 2 {
        let mates = fastq_records(&reads[1])?;
        if mates != pairs {
            bail!(
                "{} has {pairs} reads but {} has {mates}",
                reads[0].display(),
                reads[1].display()
            );
        }
    }
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
    if !tools.contains(&Tool::Minimap2) {
        bail!("minimap2 is the reference for agreement and is not installed (apt-get install minimap2)");
    }
    println!(
        "real reads: {} ({} {}), reference {}, {} threads, {rounds} round(s)",
        reads
            .iter()
            .map(|r| r.display().to_string())
            .collect::<Vec<_>>()
            .join(" + "),
        pairs,
        if reads.len() == 2 { "pairs" } else { "reads" },
        source.display(),
        args.threads
    );
    let mut indexes = Vec::new();
    for &t in &tools {
        let index = build_index(t, &kura, &reference, dir.path(), args.threads)
            .with_context(|| format!("{}: building the index", t.name()))?;
        println!("  index {:<9} {:.2} s", t.name(), index.seconds);
        indexes.push(index);
    }
    let mut runs: Vec<Vec<(Measured, String)>> = vec![Vec::new(); tools.len()];
    for round in 0..rounds {
        // The order moves on by one each round, so no tool always runs first.
        for k in 0..tools.len() {
            let i = (k + round) % tools.len();
            let sam = dir
                .path()
                .join(format!("{}.sam", tools[i].name().replace(' ', "-")));
            let run = run_mapper(&indexes[i], &kura, &reads, &sam, args.threads)
                .with_context(|| format!("{}: mapping", tools[i].name()))?;
            runs[i].push(run);
        }
    }
    let mut results = Vec::new();
    for ((&tool, index), runs) in tools.iter().zip(indexes).zip(runs) {
        let sam = dir
            .path()
            .join(format!("{}.sam", tool.name().replace(' ', "-")));
        let name = sam.display().to_string();
        let file = std::fs::File::open(&sam).with_context(|| name.clone())?;
        let summary = summarise_sam(std::io::BufReader::new(file), &name)?;
        let spread = |f: &dyn Fn(&Measured) -> f64| {
            Spread::of(&runs.iter().map(|(m, _)| f(m)).collect::<Vec<_>>())
        };
        results.push(RealTool {
            tool,
            seconds: spread(&|m| m.wall.as_secs_f64()),
            cpu_seconds: spread(&|m| m.cpu_seconds),
            peak_rss_mib: spread(&|m| m.peak_rss_mib),
            command: runs.last().map(|(_, c)| c.clone()).unwrap_or_default(),
            mapped_fraction: summary.rate(summary.mapped),
            properly_paired_fraction: summary.rate(summary.properly_paired),
            mapq_ge_20_fraction: summary.rate(summary.mapq_ge_20),
            flagstat: samtools(&["flagstat"], &sam),
            samtools_sn: samtools(&["stats"], &sam)
                .map(|s| stats_summary(&s))
                .unwrap_or_default(),
            summary,
            index,
        });
    }
    let minimap2 = results
        .iter()
        .find(|r| r.tool == Tool::Minimap2)
        .map(|r| r.summary.clone())
        .unwrap_or_default();
    let versus_minimap2: Vec<Agreement> = results
        .iter()
        .filter(|r| r.tool != Tool::Minimap2)
        .map(|r| agreement(r.tool.name(), &r.summary, &minimap2))
        .collect();
    if which("samtools").is_none() {
        skipped
            .push("samtools is not installed (apt-get install samtools): no flagstat/stats".into());
    }
    let report = RealReport {
        reference: source.display().to_string(),
        reads: reads.iter().map(|r| r.display().to_string()).collect(),
        pairs,
        threads: args.threads,
        rounds,
        host: format!(
            "{} ({} CPUs), Linux {}",
            crate::stats::cpu_model(),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            crate::stats::kernel()
        ),
        versions: tools
            .iter()
            .map(|t| (t.name().to_string(), t.version(&kura)))
            .collect(),
        skipped,
        tools: results,
        versus_minimap2,
        notes: vec![
            "no truth exists for real reads: rates are each tool's own flags (primary records; mapped = not flag 0x4, properly paired = flag 0x2, MAPQ >= 20 on each tool's own scale) and agreement is with minimap2's primary placement".into(),
            format!("agreement: same contig and strand and unclipped starts (POS less leading clips) within {AGREE_BP} bp"),
            "seconds: each mapping process's wall time from a prebuilt index (median [min-max] of the rounds, tools interleaved); peak RSS: VmHWM of the process tree sampled every 2 ms; CPU: user + system from wait4".into(),
        ],
    };
    print_report(&report);
    args.run.output.emit("genome-real", PLOT, &report)
}

const PLOT: &str = include_str!("../../../scripts/plot_genome_real.py");

/// `samtools ARGS sam`'s standard output, or `None` without samtools or when it fails.
fn samtools(args: &[&str], sam: &Path) -> Option<String> {
    which("samtools")?;
    let out = Command::new("samtools").args(args).arg(sam).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `SN` lines of `samtools stats` output: name (without its colon) and value.
fn stats_summary(stats: &str) -> Vec<(String, String)> {
    stats
        .lines()
        .filter_map(|l| l.strip_prefix("SN\t"))
        .filter_map(|l| {
            let mut f = l.split('\t');
            let name = f.next()?.trim_end_matches(':').to_string();
            Some((name, f.next()?.to_string()))
        })
        .collect()
}

fn print_report(r: &RealReport) {
    let pct = |x: f64| format!("{:.2} %", x * 100.0);
    println!(
        "\n{:<9} {:>17} {:>9} {:>9} {:>9} {:>10} {:>9} {:>10}",
        "tool", "wall s", "CPU s", "RSS MiB", "mapped", "proper", "MAPQ>=20", "agree mm2"
    );
    for t in &r.tools {
        let agree = r
            .versus_minimap2
            .iter()
            .find(|a| a.tool == t.tool.name())
            .map_or("-".to_string(), |a| pct(a.agree_fraction));
        println!(
            "{:<9} {:>6.3} [{:.3}–{:.3}] {:>9.3} {:>9.1} {:>9} {:>10} {:>9} {:>10}",
            t.tool.name(),
            t.seconds.median,
            t.seconds.min,
            t.seconds.max,
            t.cpu_seconds.median,
            t.peak_rss_mib.median,
            pct(t.mapped_fraction),
            pct(t.properly_paired_fraction),
            pct(t.mapq_ge_20_fraction),
            agree
        );
    }
    for a in &r.versus_minimap2 {
        println!(
            "{} vs minimap2: {} both mapped, {} agree, {} placed differently, {} mapped only by {}, {} only by minimap2, {} by neither",
            a.tool,
            a.both_mapped,
            a.agree,
            a.disagree,
            a.only_tool_mapped,
            a.tool,
            a.only_minimap2_mapped,
            a.neither_mapped
        );
        for d in a.placed_differently.iter().take(5) {
            let show = |p: &Option<Placement>| {
                p.as_ref().map_or("unmapped".to_string(), |p| {
                    format!(
                        "{}:{}{} MAPQ {} {}",
                        p.contig,
                        p.pos,
                        if p.reverse { "-" } else { "+" },
                        p.mapq,
                        p.cigar
                    )
                })
            };
            println!(
                "  {}/{}: {} {} | minimap2 {}",
                d.read,
                d.mate,
                a.tool,
                show(&d.tool),
                show(&d.minimap2)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAM: &str = "@HD\tVN:1.6\n\
        r1\t99\tchr\t100\t60\t3S97M\t=\t300\t300\tACGT\t*\n\
        r1\t147\tchr\t300\t60\t100M\t=\t100\t-300\tACGT\t*\n\
        r2/1\t73\tchr\t500\t12\t100M\t*\t0\t0\tACGT\t*\n\
        r2/2\t133\t*\t0\t0\t*\t*\t0\t0\tACGT\t*\n\
        r2/1\t2121\tchr\t900\t0\t50H50M\t*\t0\t0\tACGT\t*\n";

    #[test]
    fn summaries_count_primary_records_only_and_key_reads_by_name_and_mate() {
        let s = summarise_sam(SAM.as_bytes(), "t.sam").unwrap();
        assert_eq!(
            (s.records, s.mapped, s.properly_paired, s.mapq_ge_20),
            (4, 3, 2, 2)
        );
        let r1 = s.placements[&("r1".to_string(), 1)].as_ref().unwrap();
        assert_eq!((r1.pos, r1.unclipped_start, r1.reverse), (100, 97, false));
        assert!(
            s.placements[&("r1".to_string(), 2)]
                .as_ref()
                .unwrap()
                .reverse
        );
        assert!(s.placements[&("r2".to_string(), 2)].is_none());
        assert_eq!(s.placements.len(), 4);
    }

    #[test]
    fn damaged_sam_is_an_error_naming_the_line() {
        for bad in [
            "r\t99\tchr\n",
            "r\tx\tchr\t1\t60\t10M\n",
            "r\t0\tchr\t1\tq\t10M\n",
        ] {
            let e = summarise_sam(bad.as_bytes(), "bad.sam")
                .unwrap_err()
                .to_string();
            assert!(e.contains("bad.sam:1"), "{e}");
        }
        let twice = "r\t0\tc\t1\t60\t10M\nr\t0\tc\t1\t60\t10M\n";
        assert!(summarise_sam(twice.as_bytes(), "t").is_err());
    }

    #[test]
    fn agreement_uses_contig_strand_and_unclipped_start() {
        let ours = summarise_sam(SAM.as_bytes(), "a").unwrap();
        // minimap2: r1/1 without the clip (same unclipped start), r1/2 11 bp off, r2/1
        // unmapped and r2/2 mapped.
        let theirs = "r1\t99\tchr\t97\t60\t100M\t=\t311\t0\tA\t*\n\
            r1\t147\tchr\t311\t60\t100M\t=\t97\t0\tA\t*\n\
            r2\t77\t*\t0\t0\t*\t*\t0\t0\tA\t*\n\
            r2\t137\tchr\t800\t60\t100M\t*\t0\t0\tA\t*\n";
        let theirs = summarise_sam(theirs.as_bytes(), "b").unwrap();
        let a = agreement("kura", &ours, &theirs);
        assert_eq!((a.both_mapped, a.agree, a.disagree), (2, 1, 1));
        assert_eq!(
            (a.only_tool_mapped, a.only_minimap2_mapped, a.neither_mapped),
            (1, 1, 0)
        );
        assert_eq!(a.placed_differently[0].read, "r1");
        assert_eq!(a.placed_differently[0].mate, 2);
        assert_eq!(a.only_one_mapped.len(), 2);
        assert_eq!(a.missing, 0);
        assert!((a.agree_fraction - 0.5).abs() < 1e-9);
    }

    #[test]
    fn leading_clips_count_soft_and_hard() {
        assert_eq!(leading_clip("5H3S90M2S"), 8);
        assert_eq!(leading_clip("100M5S"), 0);
        assert_eq!(leading_clip("*"), 0);
    }
}
