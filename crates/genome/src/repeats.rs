//! Larger synthetic references with a repeat landscape closer to real genomes than
//! [`crate::simulate::synthetic_genome`]'s: many contigs of unequal length, interspersed repeat
//! families present in many diverged copies, and tandem repeats. Deterministic for a seed, and
//! cheap enough to draw 100 Mbp in seconds, so a benchmark can pick its reference size.
//!
//! The model, roughly after how eukaryotic and large bacterial genomes look to a short-read
//! mapper:
//! - **Background**: independent bases at a GC content of 41 %.
//! - **Interspersed families** (transposon-like): each family has a consensus (short ones of
//!   150-400 bp, SINE-like, and long ones of 1-6 kbp, LINE-like) and an age: its copies differ
//!   from the consensus by a per-copy divergence drawn around the family's (0-20 %; young
//!   families give near-identical copies, which no mapper can place uniquely). 90 % of the
//!   differences are substitutions, 10 % 1-3 bp indels. Long-family copies are often 5'
//!   truncated, and every copy lands on either strand. Copies overwrite the background at random
//!   positions until they cover [`RepeatGenomeOptions::interspersed`] of the genome.
//! - **Tandem repeats**: arrays of a unit of 1-6 bp (microsatellites, 20-200 bp long), 10-60 bp
//!   (minisatellites, 100 bp to 2 kbp) or 100-200 bp (satellites, 1-5 kbp), each copy of the
//!   unit diverged by 0-5 %, covering [`RepeatGenomeOptions::tandem`] of the genome.
//! - A few runs of `N` (assembly gaps).

use crate::fasta::FastaRecord;
use crate::simulate::complement;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BASES: [u8; 4] = *b"ACGT";

/// Shape of a repeat-rich synthetic genome.
#[derive(Debug, Clone, PartialEq)]
pub struct RepeatGenomeOptions {
    /// Seed: the same options always give the same genome.
    pub seed: u64,
    /// Total bases over all contigs.
    pub total: usize,
    /// Number of contigs (lengths drawn unequal, summing to `total`); named `chr1`, `chr2`, ...
    pub contigs: usize,
    /// Number of interspersed repeat families.
    pub families: usize,
    /// Fraction of the genome covered by interspersed repeat copies.
    pub interspersed: f64,
    /// Fraction of the genome covered by tandem repeat arrays.
    pub tandem: f64,
}

impl RepeatGenomeOptions {
    /// A genome of `total` bases: one contig per 2 Mbp (at least 2, at most 24), one family per
    /// 200 kbp (at least 4), 12 % interspersed repeats and 3 % tandem repeats.
    pub fn with_total(seed: u64, total: usize) -> Self {
        Self {
            seed,
            total,
            contigs: (total / 2_000_000).clamp(2, 24),
            families: (total / 200_000).max(4),
            interspersed: 0.12,
            tandem: 0.03,
        }
    }
}

/// A deterministic repeat-rich genome (see the module docs). Sizes too small for a repeat leave
/// it out, so any options (even a total of 0) are accepted.
pub fn repeat_genome(opts: &RepeatGenomeOptions) -> Vec<FastaRecord> {
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let lengths = contig_lengths(&mut rng, opts.total, opts.contigs.max(1));
    let mut contigs: Vec<FastaRecord> = lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| FastaRecord {
            name: format!("chr{}", i + 1),
            description: format!(
                "kura repeat-rich synthetic genome seed={} contig {}",
                opts.seed,
                i + 1
            ),
            seq: (0..n).map(|_| background_base(&mut rng)).collect(),
        })
        .collect();
    let total = opts.total as f64;
    let families: Vec<Family> = (0..opts.families)
        .map(|i| Family::draw(&mut rng, i % 3 == 0))
        .collect();
    if !families.is_empty() {
        let mut covered = 0.0;
        let budget = opts.interspersed.clamp(0.0, 0.9) * total;
        // Give up after many copies that do not fit (tiny contigs).
        let mut misses = 0;
        while covered < budget && misses < 1000 {
            let f = &families[rng.gen_range(0..families.len())];
            let copy = f.copy(&mut rng);
            match place(&mut rng, &contigs, copy.len()) {
                Some((c, at)) => {
                    contigs[c].seq[at..at + copy.len()].copy_from_slice(&copy);
                    covered += copy.len() as f64;
                }
                None => misses += 1,
            }
        }
    }
    let mut covered = 0.0;
    let budget = opts.tandem.clamp(0.0, 0.5) * total;
    let mut misses = 0;
    while covered < budget && misses < 1000 {
        let array = tandem_array(&mut rng);
        match place(&mut rng, &contigs, array.len()) {
            Some((c, at)) => {
                contigs[c].seq[at..at + array.len()].copy_from_slice(&array);
                covered += array.len() as f64;
            }
            None => misses += 1,
        }
    }
    for _ in 0..contigs.len() * 2 {
        let len = rng.gen_range(10..=500);
        if let Some((c, at)) = place(&mut rng, &contigs, len) {
            contigs[c].seq[at..at + len].fill(b'N');
        }
    }
    contigs
}

/// `n` lengths summing to `total`, each a weight in [1, 4) of the mean, largest first.
fn contig_lengths(rng: &mut ChaCha8Rng, total: usize, n: usize) -> Vec<usize> {
    let weights: Vec<f64> = (0..n).map(|_| rng.gen_range(1.0..4.0)).collect();
    let sum: f64 = weights.iter().sum();
    let mut lengths: Vec<usize> = weights
        .iter()
        .map(|w| (w / sum * total as f64) as usize)
        .collect();
    let short = total - lengths.iter().sum::<usize>();
    lengths[0] += short;
    lengths.sort_unstable_by(|a, b| b.cmp(a));
    lengths
}

/// A background base at 41 % GC.
fn background_base(rng: &mut ChaCha8Rng) -> u8 {
    let x: f64 = rng.gen();
    match x {
        x if x < 0.295 => b'A',
        x if x < 0.59 => b'T',
        x if x < 0.795 => b'C',
        _ => b'G',
    }
}

/// An interspersed repeat family.
struct Family {
    consensus: Vec<u8>,
    /// Mean divergence of its copies from the consensus.
    age: f64,
    /// Long (LINE-like) families' copies are often 5' truncated.
    long: bool,
}

impl Family {
    fn draw(rng: &mut ChaCha8Rng, long: bool) -> Self {
        let len = if long {
            rng.gen_range(1000..=6000)
        } else {
            rng.gen_range(150..=400)
        };
        Self {
            consensus: (0..len).map(|_| background_base(rng)).collect(),
            age: rng.gen_range(0.0..0.2),
            long,
        }
    }

    /// One copy: truncated (long families, half the time), diverged, on a random strand.
    fn copy(&self, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let start = if self.long && rng.gen_bool(0.5) {
            rng.gen_range(0..self.consensus.len() * 4 / 5)
        } else {
            0
        };
        let divergence = (self.age + rng.gen_range(-0.02..0.02)).clamp(0.0, 0.3);
        let mut copy = diverge(rng, &self.consensus[start..], divergence);
        if rng.gen_bool(0.5) {
            copy.reverse();
            for b in &mut copy {
                *b = complement(*b);
            }
        }
        copy
    }
}

/// `seq` with a fraction `d` of its positions changed: 90 % substitutions, 10 % 1-3 bp indels.
fn diverge(rng: &mut ChaCha8Rng, seq: &[u8], d: f64) -> Vec<u8> {
    let mut out = Vec::with_capacity(seq.len() + 8);
    let mut i = 0;
    while i < seq.len() {
        let b = seq[i];
        if !rng.gen_bool(d) {
            out.push(b);
            i += 1;
        } else if rng.gen_bool(0.9) {
            out.push(other_base(rng, b));
            i += 1;
        } else if rng.gen_bool(0.5) {
            i += rng.gen_range(1..=3);
        } else {
            out.push(b);
            for _ in 0..rng.gen_range(1..=3) {
                out.push(BASES[rng.gen_range(0..4)]);
            }
            i += 1;
        }
    }
    out
}

fn other_base(rng: &mut ChaCha8Rng, b: u8) -> u8 {
    loop {
        let x = BASES[rng.gen_range(0..4)];
        if x != b {
            return x;
        }
    }
}

/// A tandem array: a micro-, mini- or satellite unit repeated, each copy slightly diverged.
fn tandem_array(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let (unit_len, len) = match rng.gen_range(0..10) {
        0..=5 => (rng.gen_range(1..=6), rng.gen_range(20..=200)),
        6..=8 => (rng.gen_range(10..=60), rng.gen_range(100..=2000)),
        _ => (rng.gen_range(100..=200), rng.gen_range(1000..=5000)),
    };
    let unit: Vec<u8> = (0..unit_len).map(|_| background_base(rng)).collect();
    let divergence = rng.gen_range(0.0..0.05);
    let mut out = Vec::with_capacity(len + unit_len);
    while out.len() < len {
        out.extend(diverge(rng, &unit, divergence));
    }
    out.truncate(len);
    out
}

/// A random (contig, start) for a segment of `len` bases, a contig chosen in proportion to its
/// length; `None` when the chosen contig is too short.
fn place(rng: &mut ChaCha8Rng, contigs: &[FastaRecord], len: usize) -> Option<(usize, usize)> {
    let total: usize = contigs.iter().map(|c| c.seq.len()).sum();
    if total == 0 || len == 0 {
        return None;
    }
    let mut x = rng.gen_range(0..total);
    let c = contigs.iter().position(|c| {
        if x < c.seq.len() {
            true
        } else {
            x -= c.seq.len();
            false
        }
    })?;
    let n = contigs[c].seq.len();
    (n > len).then(|| (c, rng.gen_range(0..n - len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_genome_has_its_size_and_is_deterministic() {
        let opts = RepeatGenomeOptions::with_total(7, 1_000_000);
        let g = repeat_genome(&opts);
        assert_eq!(g, repeat_genome(&opts));
        assert_eq!(g.len(), 2);
        assert_eq!(g.iter().map(|c| c.seq.len()).sum::<usize>(), 1_000_000);
        assert!(g[0].seq.len() >= g[1].seq.len());
        let other = repeat_genome(&RepeatGenomeOptions { seed: 8, ..opts });
        assert_ne!(g, other);
        for c in &g {
            assert!(c.seq.iter().all(|b| b"ACGTN".contains(b)));
        }
    }

    #[test]
    fn repeats_make_kmers_recur() {
        // 31-mers of a uniform random 1 Mbp sequence are almost all unique; repeat copies make a
        // share of them recur.
        let count_repeated = |g: &[FastaRecord]| {
            let mut seen = std::collections::HashMap::new();
            for c in g {
                for w in c.seq.windows(31).step_by(7) {
                    *seen.entry(w.to_vec()).or_insert(0u32) += 1;
                }
            }
            seen.values().filter(|&&n| n > 1).count()
        };
        let plain = repeat_genome(&RepeatGenomeOptions {
            interspersed: 0.0,
            tandem: 0.0,
            ..RepeatGenomeOptions::with_total(3, 1_000_000)
        });
        let rich = repeat_genome(&RepeatGenomeOptions::with_total(3, 1_000_000));
        assert!(count_repeated(&rich) > 10 * count_repeated(&plain).max(10));
    }

    #[test]
    fn degenerate_options_give_a_genome_without_panicking() {
        for (total, contigs) in [(0, 1), (5, 3), (300, 10), (10_000, 0)] {
            let g = repeat_genome(&RepeatGenomeOptions {
                contigs,
                ..RepeatGenomeOptions::with_total(1, total)
            });
            assert_eq!(g.iter().map(|c| c.seq.len()).sum::<usize>(), total);
        }
    }
}
