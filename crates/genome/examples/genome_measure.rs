//! Release-mode measurement of the mapping core on real data: index a FASTA reference, map a
//! pywgsim FASTQ (single-end, or paired with a second file), write SAM, and score the placements
//! against the true origins in the read names (`CONTIG|START|END|…|…|idx`, 1-based fragment
//! span). With `--score FILE.sam` it scores another mapper's SAM by the same rule instead.
//!
//! ```text
//! cargo run --release -p kura-genome --example genome_measure -- REF.fa R1.fq [R2.fq] \
//!     [--threads N] [--sam OUT.sam] [--index FILE]
//! cargo run --release -p kura-genome --example genome_measure -- --score OTHER.sam
//! ```
//!
//! A read is correct when it maps to the right contig and its leftmost aligned base (forward
//! strand) is within 10 bp of START or its rightmost (reverse strand) within 10 bp of END.
//! The FASTA/FASTQ readers here are minimal on purpose (plain text, no gzip): the crate's own
//! streaming parsers are the product; this binary measures the mapper.

use anyhow::{bail, Context, Result};
use kura_genome::index::{Index, IndexParams};
use kura_genome::map::{MapOptions, Mapper, Read};
use kura_genome::pack::PackedRef;
use kura_genome::sam;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::time::{Duration, Instant};

const BATCH: usize = 50_000;

#[derive(Default)]
struct Score {
    total: u64,
    mapped: u64,
    correct: u64,
    wrong_hi: u64,
    wrong_lo: u64,
}

impl Score {
    /// `pos1` is the 1-based leftmost aligned base, `end1` the 1-based rightmost.
    fn add(&mut self, name: &str, hit: Option<(&str, u64, u64, bool, u8)>) {
        self.total += 1;
        let Some((contig, pos1, end1, reverse, mapq)) = hit else {
            return;
        };
        self.mapped += 1;
        let fields: Vec<&str> = name.rsplitn(6, '|').collect();
        let ok = fields.len() == 6 && {
            let (t_contig, t_start, t_end) = (fields[5], fields[4], fields[3]);
            let start: u64 = t_start.parse().unwrap_or(u64::MAX);
            let end: u64 = t_end.parse().unwrap_or(u64::MAX);
            t_contig == contig
                && if reverse {
                    end1.abs_diff(end) <= 10
                } else {
                    pos1.abs_diff(start) <= 10
                }
        };
        if ok {
            self.correct += 1;
        } else if mapq >= 20 {
            self.wrong_hi += 1;
        } else {
            self.wrong_lo += 1;
        }
    }

    fn print(&self, label: &str) {
        println!(
            "{label}: {} reads, {} mapped, {} correct ({:.3} %), misplaced MAPQ>=20: {}, misplaced MAPQ<20: {}",
            self.total,
            self.mapped,
            self.correct,
            100.0 * self.correct as f64 / self.total.max(1) as f64,
            self.wrong_hi,
            self.wrong_lo
        );
    }
}

fn read_fasta(path: &str) -> Result<PackedRef> {
    let mut r = PackedRef::new();
    let mut name: Option<String> = None;
    let mut seq = Vec::new();
    for line in BufReader::with_capacity(1 << 20, File::open(path)?).split(b'\n') {
        let line = line?;
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if let Some(h) = line.strip_prefix(b">") {
            if let Some(n) = name.take() {
                r.push_contig(&n, &seq)?;
            }
            seq.clear();
            let h = String::from_utf8_lossy(h);
            name = Some(h.split_whitespace().next().unwrap_or("").to_string());
        } else {
            seq.extend_from_slice(line);
        }
    }
    if let Some(n) = name {
        r.push_contig(&n, &seq)?;
    }
    Ok(r)
}

fn read_batch(
    lines: &mut impl Iterator<Item = std::io::Result<Vec<u8>>>,
    n: usize,
) -> Result<Vec<Read>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let Some(h) = lines.next() else { break };
        let h = h?;
        let (Some(s), Some(_), Some(q)) = (lines.next(), lines.next(), lines.next()) else {
            bail!("truncated FASTQ record");
        };
        let name = String::from_utf8_lossy(h.strip_prefix(b"@").context("not FASTQ")?).into_owned();
        out.push(Read {
            name,
            seq: s?,
            qual: q?,
        });
    }
    Ok(out)
}

fn score_sam(path: &str) -> Result<()> {
    let mut score = Score::default();
    for line in BufReader::new(File::open(path)?).lines() {
        let line = line?;
        if line.starts_with('@') {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let flag: u16 = f[1].parse()?;
        if flag & 0x900 != 0 {
            continue;
        }
        let hit = if flag & 4 != 0 {
            None
        } else {
            let pos: u64 = f[3].parse()?;
            let mut ref_len = 0u64;
            let mut num = 0u64;
            for c in f[5].bytes() {
                if c.is_ascii_digit() {
                    num = num * 10 + u64::from(c - b'0');
                } else {
                    if matches!(c, b'M' | b'D' | b'N' | b'=' | b'X') {
                        ref_len += num;
                    }
                    num = 0;
                }
            }
            Some((
                f[2],
                pos,
                pos + ref_len - 1,
                flag & 0x10 != 0,
                f[4].parse()?,
            ))
        };
        score.add(f[0], hit);
    }
    score.print(path);
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--score") {
        return score_sam(args.get(1).context("--score needs a SAM file")?);
    }
    let mut files = Vec::new();
    let mut threads = 2usize;
    let mut sam_out: Option<String> = None;
    let mut index_file: Option<String> = None;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--threads" => threads = it.next().context("--threads N")?.parse()?,
            "--sam" => sam_out = it.next(),
            "--index" => index_file = it.next(),
            _ => files.push(a),
        }
    }
    if files.len() < 2 {
        bail!(
            "usage: genome_measure REF.fa R1.fq [R2.fq] [--threads N] [--sam OUT] [--index FILE]"
        );
    }
    let t = Instant::now();
    let reference = read_fasta(&files[0])?;
    let t_load = t.elapsed();
    let t = Instant::now();
    let mut index = Index::build(reference, IndexParams::default(), threads)?;
    let t_index = t.elapsed();
    let (mut t_save, mut t_reload) = (Duration::ZERO, Duration::ZERO);
    if let Some(path) = &index_file {
        let t = Instant::now();
        index.write_to(BufWriter::new(File::create(path)?))?;
        t_save = t.elapsed();
        let t = Instant::now();
        index = Index::read_from(BufReader::with_capacity(1 << 20, File::open(path)?))?;
        t_reload = t.elapsed();
    }
    let mapper = Mapper::new(
        &index,
        MapOptions {
            threads,
            ..MapOptions::default()
        },
    );
    let mut out: Box<dyn Write> = match &sam_out {
        Some(p) => Box::new(BufWriter::with_capacity(1 << 20, File::create(p)?)),
        None => Box::new(std::io::sink()),
    };
    sam::write_header(&mut out, index.reference(), "genome_measure")?;
    let mut r1 = BufReader::with_capacity(1 << 20, File::open(&files[1])?).split(b'\n');
    let mut r2 = match files.get(2) {
        Some(p) => Some(BufReader::with_capacity(1 << 20, File::open(p)?).split(b'\n')),
        None => None,
    };
    let (mut score, mut proper, mut pairs) = (Score::default(), 0u64, 0u64);
    let (mut t_reads, mut t_map, mut t_write) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let contigs = index.reference().contigs();
    loop {
        let t = Instant::now();
        let a = read_batch(&mut r1, BATCH)?;
        let b = match &mut r2 {
            Some(r) => Some(read_batch(r, BATCH)?),
            None => None,
        };
        t_reads += t.elapsed();
        if a.is_empty() {
            break;
        }
        let t = Instant::now();
        match &b {
            None => {
                let m = mapper.map_batch(&a)?;
                t_map += t.elapsed();
                let t = Instant::now();
                for (r, m) in a.iter().zip(&m) {
                    sam::write_single(&mut out, index.reference(), r, m)?;
                    let h = m.hit.as_ref().map(|h| {
                        (
                            contigs[h.contig].name.as_str(),
                            h.pos + 1,
                            h.end(),
                            h.reverse,
                            h.mapq,
                        )
                    });
                    score.add(&r.name, h);
                }
                t_write += t.elapsed();
            }
            Some(b) => {
                let m = mapper.map_pairs(&a, b)?;
                t_map += t.elapsed();
                let t = Instant::now();
                for ((x, y), p) in a.iter().zip(b).zip(&m) {
                    sam::write_pair(&mut out, index.reference(), x, y, p)?;
                    pairs += 1;
                    proper += u64::from(p.proper);
                    for (r, h) in [(x, &p.first), (y, &p.second)] {
                        let h = h.as_ref().map(|h| {
                            (
                                contigs[h.contig].name.as_str(),
                                h.pos + 1,
                                h.end(),
                                h.reverse,
                                h.mapq,
                            )
                        });
                        score.add(&r.name, h);
                    }
                }
                t_write += t.elapsed();
            }
        }
    }
    out.flush()?;
    println!(
        "load reference {:.3} s, index {:.3} s, save index {:.3} s, load index {:.3} s, read FASTQ {:.3} s, map {:.3} s, write SAM {:.3} s",
        t_load.as_secs_f64(),
        t_index.as_secs_f64(),
        t_save.as_secs_f64(),
        t_reload.as_secs_f64(),
        t_reads.as_secs_f64(),
        t_map.as_secs_f64(),
        t_write.as_secs_f64()
    );
    if pairs > 0 {
        println!("{pairs} pairs, {proper} proper");
    }
    score.print("kura");
    Ok(())
}
