//! Seeded synthetic genomes with planted repeats and reads with known origins, for the mapping,
//! index and SAM tests (independent of the crate's own simulator so the mapper is checked against
//! data it did not generate).
#![allow(dead_code)]

use kura_genome::index::{Index, IndexParams};
use kura_genome::map::{Hit, Read};
use kura_genome::pack::PackedRef;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub const BASES: &[u8; 4] = b"ACGT";

/// A genome: contigs as ASCII, plus the global spans of every planted repeat copy.
pub struct Genome {
    pub contigs: Vec<(String, Vec<u8>)>,
    /// (contig, start, end) of every copy of a repeated segment.
    pub repeats: Vec<(usize, usize, usize)>,
}

/// Random contigs of the given sizes with `n_repeats` segments (1-4 kb) copied 2-5 times across
/// contigs, half exactly and half with about 1 % divergence, and a few N runs.
pub fn genome(seed: u64, sizes: &[usize], n_repeats: usize) -> Genome {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut contigs: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            (
                format!("chr{}", i + 1),
                (0..n).map(|_| BASES[rng.gen_range(0..4)]).collect(),
            )
        })
        .collect();
    let mut repeats = Vec::new();
    for r in 0..n_repeats {
        let len = rng.gen_range(1000..4000);
        let src_c = rng.gen_range(0..contigs.len());
        let src_len = contigs[src_c].1.len();
        let src = rng.gen_range(0..src_len - len);
        let segment: Vec<u8> = contigs[src_c].1[src..src + len].to_vec();
        repeats.push((src_c, src, src + len));
        let copies = rng.gen_range(1..5);
        for _ in 0..copies {
            let c = rng.gen_range(0..contigs.len());
            let at = rng.gen_range(0..contigs[c].1.len() - len);
            let mut seg = segment.clone();
            if r % 2 == 1 {
                for b in seg.iter_mut() {
                    if rng.gen_bool(0.01) {
                        *b = BASES[rng.gen_range(0..4)];
                    }
                }
            }
            contigs[c].1[at..at + len].copy_from_slice(&seg);
            repeats.push((c, at, at + len));
        }
    }
    for _ in 0..sizes.len() {
        let c = rng.gen_range(0..contigs.len());
        let n = contigs[c].1.len();
        let at = rng.gen_range(0..n - 200);
        let l = rng.gen_range(1..200);
        contigs[c].1[at..at + l].fill(b'N');
    }
    Genome { contigs, repeats }
}

pub fn packed(g: &Genome) -> PackedRef {
    let mut p = PackedRef::new();
    for (name, seq) in &g.contigs {
        p.push_contig(name, seq).expect("valid contig");
    }
    p
}

pub fn index(g: &Genome) -> Index {
    Index::build(packed(g), IndexParams::default(), 2).expect("index builds")
}

/// Where a simulated read came from: contig, reference span, strand.
#[derive(Debug, Clone, Copy)]
pub struct Truth {
    pub contig: usize,
    pub start: usize,
    pub end: usize,
    pub reverse: bool,
}

/// Reverse complement of ASCII bases (anything but ACGT becomes N).
pub fn revcomp(s: &[u8]) -> Vec<u8> {
    s.iter()
        .rev()
        .map(|&b| match b {
            b'A' => b'T',
            b'C' => b'G',
            b'G' => b'C',
            b'T' => b'A',
            _ => b'N',
        })
        .collect()
}

/// Copies `len` read bases from `src[start..]` applying mutations (SNPs at `mut_rate`, a tenth of
/// them 1-3 base indels) and sequencing errors at `err_rate`; returns the read and the reference
/// span it covers.
fn fragment(
    rng: &mut SmallRng,
    src: &[u8],
    start: usize,
    len: usize,
    mut_rate: f64,
    err_rate: f64,
) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(len);
    let mut i = start;
    while out.len() < len && i < src.len() {
        if rng.gen_bool(mut_rate) {
            if rng.gen_bool(0.1) {
                let l = rng.gen_range(1..4);
                if rng.gen_bool(0.5) {
                    i += l;
                    continue;
                }
                for _ in 0..l {
                    out.push(BASES[rng.gen_range(0..4)]);
                }
            } else {
                out.push(
                    BASES[(BASES.iter().position(|&b| b == src[i]).unwrap_or(0)
                        + rng.gen_range(1..4))
                        % 4],
                );
                i += 1;
                continue;
            }
        }
        out.push(src[i]);
        i += 1;
    }
    out.truncate(len);
    for b in out.iter_mut() {
        if rng.gen_bool(err_rate) {
            *b = BASES[rng.gen_range(0..4)];
        }
    }
    (out, i)
}

/// `n` reads of `len` bases from random positions on random strands.
pub fn reads(
    g: &Genome,
    seed: u64,
    n: usize,
    len: usize,
    mut_rate: f64,
    err_rate: f64,
) -> Vec<(Read, Truth)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let c = rng.gen_range(0..g.contigs.len());
        let src = &g.contigs[c].1;
        let start = rng.gen_range(0..src.len() - len - 10);
        let (seq, end) = fragment(&mut rng, src, start, len, mut_rate, err_rate);
        if seq.len() < len || seq.iter().filter(|&&b| b == b'N').count() > 5 {
            continue;
        }
        let reverse = rng.gen_bool(0.5);
        let seq = if reverse { revcomp(&seq) } else { seq };
        let name = format!(
            "r{}_{}_{}_{}",
            out.len(),
            c,
            start,
            if reverse { '-' } else { '+' }
        );
        let qual = vec![b'I'; seq.len()];
        out.push((
            Read { name, seq, qual },
            Truth {
                contig: c,
                start,
                end,
                reverse,
            },
        ));
    }
    out
}

/// Pairs from fragments of `insert` ± 10 % (first mate forward from the fragment start, second
/// reverse from its end, or the mates swapped).
pub fn pairs(
    g: &Genome,
    seed: u64,
    n: usize,
    len: usize,
    insert: usize,
) -> Vec<(Read, Read, Truth, Truth)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let c = rng.gen_range(0..g.contigs.len());
        let src = &g.contigs[c].1;
        let frag = rng.gen_range(insert * 9 / 10..insert * 11 / 10);
        let start = rng.gen_range(0..src.len() - frag - 10);
        let (s1, e1) = fragment(&mut rng, src, start, len, 0.001, 0.002);
        let rstart = start + frag - len;
        let (s2, e2) = fragment(&mut rng, src, rstart, len, 0.001, 0.002);
        if s1.len() < len || s2.len() < len || s1.contains(&b'N') || s2.contains(&b'N') {
            continue;
        }
        let t1 = Truth {
            contig: c,
            start,
            end: e1,
            reverse: false,
        };
        let t2 = Truth {
            contig: c,
            start: rstart,
            end: e2,
            reverse: true,
        };
        let s2 = revcomp(&s2);
        let name = format!("p{}", out.len());
        let q = vec![b'I'; len];
        let a = Read {
            name: name.clone(),
            seq: s1,
            qual: q.clone(),
        };
        let b = Read {
            name,
            seq: s2,
            qual: q,
        };
        if rng.gen_bool(0.5) {
            out.push((a, b, t1, t2));
        } else {
            out.push((b, a, t2, t1));
        }
    }
    out
}

/// The criterion: right contig and strand, and the leftmost aligned base (forward) or
/// rightmost (reverse) within 10 bp of the truth.
pub fn correct(hit: &Hit, t: &Truth) -> bool {
    if hit.contig != t.contig || hit.reverse != t.reverse {
        return false;
    }
    if t.reverse {
        (hit.end() as i64 - t.end as i64).abs() <= 10
    } else {
        (hit.pos as i64 - t.start as i64).abs() <= 10
    }
}

/// Whether a read's origin overlaps a planted repeat copy.
pub fn in_repeat(g: &Genome, t: &Truth) -> bool {
    g.repeats
        .iter()
        .any(|&(c, s, e)| c == t.contig && t.start < e && t.end > s)
}
