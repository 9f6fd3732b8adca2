//! Seeded synthetic genomes and simulated reads whose names carry their true origin, so the whole
//! pipeline can be run and scored without downloaded data.
//!
//! [`synthetic_genome`] draws contigs with uniform bases (GC ≈ 50 %), plants repeat families
//! (segments copied across contigs, half exact and half about 1 % diverged, so some reads have no
//! unique placement and MAPQ matters) and a few runs of `N`.
//!
//! [`ReadSim`] imitates `wgsim` as packaged by `pywgsim` (the read simulator): per contig
//! it mutates a haplotype (SNPs at `mutation_rate × (1 − indel_fraction)`, indels otherwise;
//! insertions of 1-4 random bases, deletions extended with probability `indel_extend`), draws
//! fragments with outer length ~ Normal(`insert_mean`, `insert_sd`) uniformly over the contig
//! (contigs shorter than `insert_mean + 3 × insert_sd` are skipped, and each contig gets reads in
//! proportion to its length, as wgsim does), takes the first read from the fragment's left end
//! on the forward strand and the second from its right end reverse-complemented, adds
//! substitution errors at `error_rate`, and swaps which file gets which with probability ½.
//! Differences from wgsim: the genome is haploid (wgsim's default is diploid), sequencing errors
//! pick any other base (wgsim's `(c + 1) & 3` is a recurrent error) and the read index in the
//! name counts over all contigs so names stay unique.
//!
//! Read names follow pywgsim exactly: `CONTIG|START|END|e1:s1:i1|e2:s2:i2|IDX`, where START is
//! the 1-based leftmost reference base of the forward-strand read, END the 1-based rightmost
//! reference base of the reverse-strand read, `e:s:i` the sequencing errors, substitutions and
//! indels in each read and IDX a hexadecimal counter; both mates carry the same name. The truth
//! parser ([`crate::truth::TrueOrigin::parse`]) reads these and pywgsim's names alike.

use crate::fasta::FastaRecord;
use crate::fastq::FastqRecord;
use flate2::write::GzEncoder;
use flate2::Compression;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

const BASES: [u8; 4] = *b"ACGT";

/// Shape of a synthetic genome.
#[derive(Debug, Clone, PartialEq)]
pub struct GenomeOptions {
    /// Seed: the same options always give the same genome.
    pub seed: u64,
    /// Contig lengths; contigs are named `chr1`, `chr2`, ...
    pub lengths: Vec<usize>,
    /// Number of repeat families.
    pub repeat_families: usize,
    /// Shortest and longest repeat segment.
    pub repeat_len: (usize, usize),
    /// Extra copies of each family's segment (at least 1).
    pub copies: usize,
    /// Number of `N` runs (each 10-200 bases).
    pub n_runs: usize,
}

impl GenomeOptions {
    /// A genome of about `total` bases in three contigs (1/2, 1/3, 1/6 of it) with one repeat
    /// family per 100 kb and one N run per contig.
    pub fn with_total(seed: u64, total: usize) -> Self {
        Self {
            seed,
            lengths: vec![total / 2, total / 3, total - total / 2 - total / 3],
            repeat_families: (total / 100_000).max(1),
            repeat_len: (1000, 3000),
            copies: 2,
            n_runs: 3,
        }
    }
}

/// A deterministic synthetic genome (see the module docs). Repeats and N runs that do not fit in
/// a contig are left out, so any lengths (even 0) are accepted.
pub fn synthetic_genome(opts: &GenomeOptions) -> Vec<FastaRecord> {
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut contigs: Vec<FastaRecord> = opts
        .lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| FastaRecord {
            name: format!("chr{}", i + 1),
            description: format!("kura synthetic genome seed={} contig {}", opts.seed, i + 1),
            seq: (0..n).map(|_| BASES[rng.gen_range(0..4)]).collect(),
        })
        .collect();
    let (lo, hi) = (
        opts.repeat_len.0.max(1),
        opts.repeat_len.1.max(opts.repeat_len.0.max(1)),
    );
    for family in 0..opts.repeat_families {
        let len = rng.gen_range(lo..=hi);
        let Some(src) = place(&mut rng, &contigs, len) else {
            continue;
        };
        let segment = contigs[src.0].seq[src.1..src.1 + len].to_vec();
        for _ in 0..opts.copies.max(1) {
            let Some((c, at)) = place(&mut rng, &contigs, len) else {
                continue;
            };
            let dst = &mut contigs[c].seq[at..at + len];
            dst.copy_from_slice(&segment);
            if family % 2 == 1 {
                for b in dst.iter_mut() {
                    if rng.gen_bool(0.01) {
                        *b = BASES[rng.gen_range(0..4)];
                    }
                }
            }
        }
    }
    for _ in 0..opts.n_runs {
        let len = rng.gen_range(10..=200);
        if let Some((c, at)) = place(&mut rng, &contigs, len) {
            contigs[c].seq[at..at + len].fill(b'N');
        }
    }
    contigs
}

/// A random (contig, start) for a segment of `len` bases, or `None` when no contig is long enough.
fn place(rng: &mut ChaCha8Rng, contigs: &[FastaRecord], len: usize) -> Option<(usize, usize)> {
    let fits: Vec<usize> = (0..contigs.len())
        .filter(|&c| contigs[c].seq.len() > len)
        .collect();
    if fits.is_empty() {
        return None;
    }
    let c = fits[rng.gen_range(0..fits.len())];
    Some((c, rng.gen_range(0..contigs[c].seq.len() - len)))
}

/// Read simulation parameters; the defaults are the (`pywgsim -e 0.002 -r 0.001`,
/// 150 bp reads, wgsim's insert size 500 ± 50).
#[derive(Debug, Clone, PartialEq)]
pub struct ReadOptions {
    /// Seed: the same genome and options always give the same reads.
    pub seed: u64,
    /// Number of reads (single-end) or pairs.
    pub n: u64,
    /// Length of the first read of a pair (`-1`).
    pub len1: usize,
    /// Length of the second read (`-2`).
    pub len2: usize,
    /// Per-base sequencing error rate (`-e`).
    pub error_rate: f64,
    /// Per-base mutation rate of the haplotype (`-r`).
    pub mutation_rate: f64,
    /// Fraction of mutations that are indels (`-R`).
    pub indel_fraction: f64,
    /// Probability an indel is extended (`-X`).
    pub indel_extend: f64,
    /// Mean outer distance between the ends of a pair (`-d`).
    pub insert_mean: f64,
    /// Its standard deviation (`-s`).
    pub insert_sd: f64,
    /// Reads with a larger fraction of `N` are drawn again (`-A`).
    pub max_n_ratio: f64,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            seed: 42,
            n: 1000,
            len1: 150,
            len2: 150,
            error_rate: 0.002,
            mutation_rate: 0.001,
            indel_fraction: 0.15,
            indel_extend: 0.3,
            insert_mean: 500.0,
            insert_sd: 50.0,
            max_n_ratio: 0.05,
        }
    }
}

/// One haplotype position: the base, plus what the mutation did there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Site {
    Same(u8),
    Snp(u8),
    Deleted,
    /// The reference base followed by up to 4 inserted bases.
    Ins(u8, [u8; 4], u8),
}

/// A read pair as the two FASTQ files receive it (`first` goes to file 1, `second` to file 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPair {
    /// The read for the first file (single-end simulations use only this one).
    pub first: FastqRecord,
    /// The read for the second file.
    pub second: FastqRecord,
}

/// The read simulator: an iterator of pairs, contig by contig (see the module docs).
pub struct ReadSim<'g> {
    genome: &'g [FastaRecord],
    opts: ReadOptions,
    rng: ChaCha8Rng,
    contig: usize,
    haplotype: Vec<Site>,
    left: u64,
    next_idx: u64,
    total_len: u64,
    qual: u8,
}

impl<'g> ReadSim<'g> {
    /// A simulator over `genome`. Read lengths of 0 are raised to 1.
    pub fn new(genome: &'g [FastaRecord], mut opts: ReadOptions) -> Self {
        opts.len1 = opts.len1.max(1);
        opts.len2 = opts.len2.max(1);
        let qual = if opts.error_rate <= 0.0 {
            b'I'
        } else {
            let q = (-10.0 * opts.error_rate.log10() + 0.499).clamp(0.0, 93.0);
            // Truncation is intended: wgsim's `(int)` cast.
            33 + q as u8
        };
        let total_len = genome.iter().map(|c| c.seq.len() as u64).sum();
        let rng = ChaCha8Rng::seed_from_u64(opts.seed);
        Self {
            genome,
            opts,
            rng,
            contig: 0,
            haplotype: Vec::new(),
            left: 0,
            next_idx: 0,
            total_len,
            qual,
        }
    }

    /// Moves to the next contig long enough for a fragment; `false` when none is left.
    fn enter_next_contig(&mut self) -> bool {
        let min_len = self.opts.insert_mean + 3.0 * self.opts.insert_sd;
        while self.contig < self.genome.len() {
            let c = &self.genome[self.contig];
            let l = c.seq.len();
            let longest_read = self.opts.len1.max(self.opts.len2);
            if (l as f64) < min_len || l < longest_read || self.total_len == 0 {
                self.contig += 1;
                continue;
            }
            // Truncation is intended: wgsim rounds `l / total * N + 0.5` down.
            self.left = (l as f64 / self.total_len as f64 * self.opts.n as f64 + 0.5) as u64;
            self.haplotype = mutate(&mut self.rng, &c.seq, &self.opts);
            return true;
        }
        false
    }

    /// One attempt at a pair from the current contig; `None` when the attempt must be redrawn.
    fn try_pair(&mut self) -> Option<SimPair> {
        let contig = &self.genome[self.contig];
        let l = contig.seq.len();
        let longest = self.opts.len1.max(self.opts.len2);
        let d = (normal(&mut self.rng) * self.opts.insert_sd + self.opts.insert_mean + 0.5).floor();
        let d = if d.is_finite() && d > longest as f64 {
            d as usize
        } else {
            longest
        };
        if d > l {
            return None;
        }
        let pos = self.rng.gen_range(0..=l - d);
        let flip = self.rng.gen_bool(0.5);
        let (s0, s1) = if flip {
            (self.opts.len2, self.opts.len1)
        } else {
            (self.opts.len1, self.opts.len2)
        };
        let hap = &self.haplotype;
        let fwd = gen_read(hap, pos, s0, true)?;
        let mut rev = gen_read(hap, pos + d - 1, s1, false)?;
        for b in &mut rev.seq {
            *b = complement(*b);
        }
        let mut reads = [fwd, rev];
        for r in &mut reads {
            let mut n_count = 0;
            for b in &mut r.seq {
                if *b == b'N' {
                    n_count += 1;
                } else if self.rng.gen_bool(self.opts.error_rate.clamp(0.0, 1.0)) {
                    let others: Vec<u8> = BASES.iter().copied().filter(|x| x != b).collect();
                    *b = others[self.rng.gen_range(0..3)];
                    r.errors += 1;
                }
            }
            if n_count as f64 / r.seq.len().max(1) as f64 > self.opts.max_n_ratio {
                return None;
            }
        }
        let [fwd, rev] = reads;
        let name = format!(
            "{}|{}|{}|{}:{}:{}|{}:{}:{}|{:x}",
            contig.name,
            fwd.coord + 1,
            rev.coord + 1,
            fwd.errors,
            fwd.subs,
            fwd.indels,
            rev.errors,
            rev.subs,
            rev.indels,
            self.next_idx
        );
        let rec = |r: GenRead| FastqRecord {
            name: name.clone(),
            qual: vec![self.qual; r.seq.len()],
            seq: r.seq,
        };
        let (a, b) = (rec(fwd), rec(rev));
        let (first, second) = if flip { (b, a) } else { (a, b) };
        Some(SimPair { first, second })
    }
}

impl Iterator for ReadSim<'_> {
    type Item = SimPair;

    fn next(&mut self) -> Option<SimPair> {
        loop {
            if self.left == 0 {
                if !self.haplotype.is_empty() {
                    self.contig += 1;
                    self.haplotype.clear();
                }
                if !self.enter_next_contig() {
                    return None;
                }
                continue;
            }
            // A contig made mostly of N could redraw forever; give up on it after many tries.
            for _ in 0..10_000 {
                if let Some(p) = self.try_pair() {
                    self.left -= 1;
                    self.next_idx += 1;
                    return Some(p);
                }
            }
            self.left = 0;
        }
    }
}

/// A read as generated, before it becomes a FASTQ record.
struct GenRead {
    seq: Vec<u8>,
    /// 0-based reference coordinate of the read's first generated base.
    coord: usize,
    errors: u32,
    subs: u32,
    indels: u32,
}

/// Walks the haplotype from `start` (rightwards when `forward`, else leftwards) collecting `len`
/// bases, as wgsim's `__gen_read` does: the read starts at the first unchanged or substituted
/// site, deletions are skipped, insertions add their bases. `None` when the contig ends first.
fn gen_read(hap: &[Site], start: usize, len: usize, forward: bool) -> Option<GenRead> {
    let mut r = GenRead {
        seq: Vec::with_capacity(len),
        coord: usize::MAX,
        errors: 0,
        subs: 0,
        indels: 0,
    };
    let mut i = start;
    while r.seq.len() < len {
        let site = *hap.get(i)?;
        let leading = r.coord == usize::MAX;
        if !leading || matches!(site, Site::Same(_) | Site::Snp(_)) {
            if leading {
                r.coord = i;
            }
            match site {
                Site::Same(b) => r.seq.push(b),
                Site::Snp(b) => {
                    r.seq.push(b);
                    r.subs += 1;
                }
                Site::Deleted => r.indels += 1,
                Site::Ins(b, ins, n) => {
                    r.indels += 1;
                    r.seq.push(b);
                    for &x in &ins[..usize::from(n)] {
                        if r.seq.len() < len {
                            r.seq.push(x);
                        }
                    }
                }
            }
        }
        if r.seq.len() >= len {
            break;
        }
        i = if forward { i + 1 } else { i.checked_sub(1)? };
    }
    (r.coord != usize::MAX).then_some(r)
}

/// The contig's haplotype with SNPs and small indels (see the module docs); `N` is never mutated.
fn mutate(rng: &mut ChaCha8Rng, seq: &[u8], opts: &ReadOptions) -> Vec<Site> {
    let mut hap = Vec::with_capacity(seq.len());
    let mut deleting = false;
    let p = |x: f64| x.clamp(0.0, 1.0);
    for &b in seq {
        if deleting {
            if rng.gen_bool(p(opts.indel_extend)) {
                hap.push(Site::Deleted);
                continue;
            }
            deleting = false;
        }
        if b == b'N' || !rng.gen_bool(p(opts.mutation_rate)) {
            hap.push(Site::Same(b));
        } else if !rng.gen_bool(p(opts.indel_fraction)) {
            let others: Vec<u8> = BASES.iter().copied().filter(|&x| x != b).collect();
            hap.push(Site::Snp(others[rng.gen_range(0..3)]));
        } else if rng.gen_bool(0.5) {
            hap.push(Site::Deleted);
            deleting = true;
        } else {
            let mut ins = [0u8; 4];
            let mut n = 0u8;
            loop {
                ins[usize::from(n)] = BASES[rng.gen_range(0..4)];
                n += 1;
                if n == 4 || !rng.gen_bool(p(opts.indel_extend)) {
                    break;
                }
            }
            hap.push(Site::Ins(b, ins, n));
        }
    }
    hap
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The complementary base (`N` stays `N`).
pub fn complement(b: u8) -> u8 {
    match b {
        b'A' => b'T',
        b'C' => b'G',
        b'G' => b'C',
        b'T' => b'A',
        x => x,
    }
}

/// Writes FASTA with `width` bases per line (0: the whole sequence on one line).
///
/// # Errors
/// The writer's errors.
pub fn write_fasta<W: Write>(mut w: W, records: &[FastaRecord], width: usize) -> io::Result<()> {
    for r in records {
        if r.description.is_empty() {
            writeln!(w, ">{}", r.name)?;
        } else {
            writeln!(w, ">{} {}", r.name, r.description)?;
        }
        let width = if width == 0 {
            r.seq.len().max(1)
        } else {
            width
        };
        for line in r.seq.chunks(width) {
            w.write_all(line)?;
            w.write_all(b"\n")?;
        }
    }
    w.flush()
}

/// Writes one FASTQ record.
///
/// # Errors
/// The writer's errors.
pub fn write_fastq_record<W: Write>(w: &mut W, r: &FastqRecord) -> io::Result<()> {
    w.write_all(b"@")?;
    w.write_all(r.name.as_bytes())?;
    w.write_all(b"\n")?;
    w.write_all(&r.seq)?;
    w.write_all(b"\n+\n")?;
    w.write_all(&r.qual)?;
    w.write_all(b"\n")
}

/// A buffered output file, gzip-compressed when asked; [`OutputFile::finish`] writes the gzip
/// trailer and flushes, reporting errors that a drop would swallow.
pub enum OutputFile {
    /// Plain text.
    Plain(BufWriter<File>),
    /// Gzip-compressed.
    Gzip(Box<GzEncoder<BufWriter<File>>>),
}

impl OutputFile {
    /// Creates (truncates) `path`.
    ///
    /// # Errors
    /// The file cannot be created.
    pub fn create(path: &Path, gzip: bool) -> io::Result<Self> {
        let f = BufWriter::with_capacity(1 << 20, File::create(path)?);
        Ok(if gzip {
            OutputFile::Gzip(Box::new(GzEncoder::new(f, Compression::fast())))
        } else {
            OutputFile::Plain(f)
        })
    }

    /// Completes the file.
    ///
    /// # Errors
    /// The final writes fail.
    pub fn finish(self) -> io::Result<()> {
        let mut inner = match self {
            OutputFile::Plain(w) => w,
            OutputFile::Gzip(g) => g.finish()?,
        };
        inner.flush()?;
        inner.get_ref().sync_all()
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            OutputFile::Plain(w) => w.write(buf),
            OutputFile::Gzip(g) => g.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            OutputFile::Plain(w) => w.flush(),
            OutputFile::Gzip(g) => g.flush(),
        }
    }
}

/// Simulates reads from `genome` into FASTQ files: `first` always, `second` for paired-end
/// (`None`: single-end, the first reads only). Returns the number of reads (or pairs) written.
///
/// # Errors
/// File creation or write errors.
pub fn write_reads(
    genome: &[FastaRecord],
    opts: &ReadOptions,
    first: &Path,
    second: Option<&Path>,
    gzip: bool,
) -> io::Result<u64> {
    let mut w1 = OutputFile::create(first, gzip)?;
    let mut w2 = second.map(|p| OutputFile::create(p, gzip)).transpose()?;
    let mut n = 0;
    for pair in ReadSim::new(genome, opts.clone()) {
        write_fastq_record(&mut w1, &pair.first)?;
        if let Some(w2) = w2.as_mut() {
            write_fastq_record(w2, &pair.second)?;
        }
        n += 1;
    }
    w1.finish()?;
    if let Some(w2) = w2 {
        w2.finish()?;
    }
    Ok(n)
}
