//! Seed extension: banded affine-gap alignment of a whole read against a reference window
//! (free reference ends, read ends soft-clipped only when that beats aligning them), and the
//! ungapped fast path for reads that sit on one diagonal.
//!
//! Sequences are base codes (see [`crate::pack`]); an ambiguous base on either side costs
//! [`Scoring::ambiguous`] and counts in NM, as samtools counts it.

use crate::pack::AMBIGUOUS;
use std::fmt;

/// Alignment scores; defaults are minimap2's short-read preset (`-A2 -B8 -O12 -E2`, end bonus 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scoring {
    /// Added for each matching base.
    pub matched: i32,
    /// Subtracted for each mismatching base.
    pub mismatch: i32,
    /// Subtracted once when a gap opens (on top of `gap_extend` for its first base).
    pub gap_open: i32,
    /// Subtracted for every gap base.
    pub gap_extend: i32,
    /// Subtracted when either base is ambiguous.
    pub ambiguous: i32,
    /// Subtracted for soft-clipping each read end (the price of not reaching the end).
    pub clip: i32,
}

impl Default for Scoring {
    fn default() -> Self {
        Self {
            matched: 2,
            mismatch: 8,
            gap_open: 12,
            gap_extend: 2,
            ambiguous: 1,
            clip: 10,
        }
    }
}

/// One CIGAR operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CigarOp {
    /// Aligned base, match or mismatch (`M`).
    Match,
    /// Base in the read only (`I`).
    Ins,
    /// Base in the reference only (`D`).
    Del,
    /// Read base left unaligned (`S`).
    SoftClip,
}

impl CigarOp {
    /// The SAM letter.
    pub fn letter(self) -> char {
        match self {
            CigarOp::Match => 'M',
            CigarOp::Ins => 'I',
            CigarOp::Del => 'D',
            CigarOp::SoftClip => 'S',
        }
    }

    /// Whether the operation consumes read bases.
    pub fn consumes_read(self) -> bool {
        !matches!(self, CigarOp::Del)
    }

    /// Whether the operation consumes reference bases.
    pub fn consumes_ref(self) -> bool {
        matches!(self, CigarOp::Match | CigarOp::Del)
    }
}

/// A run-length encoded CIGAR.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cigar(pub Vec<(CigarOp, u32)>);

impl Cigar {
    fn push(&mut self, op: CigarOp, n: u32) {
        if n == 0 {
            return;
        }
        match self.0.last_mut() {
            Some((last, len)) if *last == op => *len += n,
            _ => self.0.push((op, n)),
        }
    }

    /// Read bases consumed (must equal the read length).
    pub fn read_len(&self) -> u64 {
        self.0
            .iter()
            .filter(|(op, _)| op.consumes_read())
            .map(|&(_, n)| u64::from(n))
            .sum()
    }

    /// Reference bases consumed.
    pub fn ref_len(&self) -> u64 {
        self.0
            .iter()
            .filter(|(op, _)| op.consumes_ref())
            .map(|&(_, n)| u64::from(n))
            .sum()
    }
}

impl fmt::Display for Cigar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("*");
        }
        for &(op, n) in &self.0 {
            write!(f, "{n}{}", op.letter())?;
        }
        Ok(())
    }
}

/// A read aligned to a reference window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alignment {
    /// Alignment score under the [`Scoring`] used (clip penalties included).
    pub score: i32,
    /// Offset in the window of the first aligned reference base.
    pub ref_start: usize,
    /// Offset in the window just past the last aligned reference base.
    pub ref_end: usize,
    /// The CIGAR, read order.
    pub cigar: Cigar,
    /// Mismatching aligned bases (ambiguous ones included).
    pub mismatches: u32,
    /// Inserted read bases.
    pub inserted: u32,
    /// Deleted reference bases.
    pub deleted: u32,
}

impl Alignment {
    /// Edit distance to the reference over the aligned part (SAM `NM`).
    pub fn nm(&self) -> u32 {
        self.mismatches + self.inserted + self.deleted
    }
}

#[inline]
fn pair_score(a: u8, b: u8, sc: &Scoring) -> i32 {
    if a >= AMBIGUOUS || b >= AMBIGUOUS {
        -sc.ambiguous
    } else if a == b {
        sc.matched
    } else {
        -sc.mismatch
    }
}

/// Scores `read` against `reference[offset..offset + read.len()]` with no gaps and no clipping;
/// `None` when the window is too short.
pub fn align_ungapped(
    read: &[u8],
    reference: &[u8],
    offset: usize,
    sc: &Scoring,
) -> Option<Alignment> {
    let r = reference.get(offset..offset.checked_add(read.len())?)?;
    let mut score = 0;
    let mut mismatches = 0;
    for (&a, &b) in read.iter().zip(r) {
        score += pair_score(a, b, sc);
        mismatches += u32::from(a != b || a >= AMBIGUOUS || b >= AMBIGUOUS);
    }
    Some(Alignment {
        score,
        ref_start: offset,
        ref_end: offset + read.len(),
        cigar: Cigar(vec![(CigarOp::Match, read.len() as u32)]),
        mismatches,
        inserted: 0,
        deleted: 0,
    })
}

const NEG: i32 = i32::MIN / 4;
// Traceback byte: bits 0-1 say where H came from, bit 2 whether E extended, bit 3 whether F did.
const FROM_DIAG: u8 = 0;
const FROM_E: u8 = 1;
const FROM_F: u8 = 2;
const FROM_CLIP: u8 = 3;
const E_EXTEND: u8 = 4;
const F_EXTEND: u8 = 8;

/// Reusable buffers so that aligning millions of reads allocates nothing per read.
#[derive(Debug, Default)]
pub struct Aligner {
    h: Vec<i32>,
    e: Vec<i32>,
    f: Vec<i32>,
    h_prev: Vec<i32>,
    f_prev: Vec<i32>,
    trace: Vec<u8>,
}

impl Aligner {
    /// New aligner with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Aligns the whole `read` against `reference` within `band` diagonals of `diagonal` (the
    /// window offset where read base 0 is expected). Reference ends are free; each read end may
    /// be soft-clipped at [`Scoring::clip`]. `None` when the band misses the window entirely.
    pub fn align(
        &mut self,
        read: &[u8],
        reference: &[u8],
        diagonal: isize,
        band: usize,
        sc: &Scoring,
    ) -> Option<Alignment> {
        let m = read.len();
        let n = reference.len() as isize;
        if m == 0 || n == 0 {
            return None;
        }
        let width = 2 * band + 1;
        let lo = diagonal - band as isize;
        let open = sc.gap_open + sc.gap_extend;
        for v in [
            &mut self.h,
            &mut self.e,
            &mut self.f,
            &mut self.h_prev,
            &mut self.f_prev,
        ] {
            v.clear();
            v.resize(width, NEG);
        }
        self.trace.clear();
        self.trace.resize((m + 1) * width, 0);
        // Row 0: no read base used yet; any reference start inside the band is free.
        for c in 0..width {
            let j = lo + c as isize;
            if (0..=n).contains(&j) {
                self.h_prev[c] = 0;
            }
        }
        let mut best = (NEG, 0usize, 0usize);
        let mut row_best;
        for i in 1..=m {
            let a = read[i - 1];
            let clip_start = -sc.clip;
            row_best = (NEG, 0usize);
            let mut e_left = NEG;
            let mut h_left = NEG;
            for c in 0..width {
                // Column c in row i is reference prefix length j = i + lo + c.
                let j = i as isize + lo + c as isize;
                let idx = i * width + c;
                if j < 0 || j > n {
                    self.h[c] = NEG;
                    self.e[c] = NEG;
                    self.f[c] = NEG;
                    e_left = NEG;
                    h_left = NEG;
                    continue;
                }
                let mut t = 0u8;
                let e_open = h_left.saturating_sub(open);
                let e_ext = e_left.saturating_sub(sc.gap_extend);
                let e = if e_ext > e_open {
                    t |= E_EXTEND;
                    e_ext
                } else {
                    e_open
                };
                let (up_h, up_f) = if c + 1 < width {
                    (self.h_prev[c + 1], self.f_prev[c + 1])
                } else {
                    (NEG, NEG)
                };
                let f_open = up_h.saturating_sub(open);
                let f_ext = up_f.saturating_sub(sc.gap_extend);
                let f = if f_ext > f_open {
                    t |= F_EXTEND;
                    f_ext
                } else {
                    f_open
                };
                let diag = if j >= 1 && self.h_prev[c] > NEG / 2 {
                    self.h_prev[c] + pair_score(a, reference[(j - 1) as usize], sc)
                } else {
                    NEG
                };
                let mut h = diag;
                let mut from = FROM_DIAG;
                if e > h {
                    h = e;
                    from = FROM_E;
                }
                if f > h {
                    h = f;
                    from = FROM_F;
                }
                // A fresh start after soft-clipping read[..i]: the band must allow reference
                // prefix j, and the first aligned base then follows.
                if j >= 1 {
                    let start = clip_start + pair_score(a, reference[(j - 1) as usize], sc);
                    if start > h {
                        h = start;
                        from = FROM_CLIP;
                    }
                }
                self.trace[idx] = t | from;
                self.h[c] = h;
                self.e[c] = e;
                self.f[c] = f;
                e_left = e;
                h_left = h;
                if h > row_best.0 {
                    row_best = (h, c);
                }
            }
            let end_score = if i == m {
                row_best.0
            } else {
                row_best.0.saturating_sub(sc.clip)
            };
            if end_score > best.0 {
                best = (end_score, i, row_best.1);
            }
            std::mem::swap(&mut self.h, &mut self.h_prev);
            std::mem::swap(&mut self.f, &mut self.f_prev);
        }
        if best.0 <= NEG / 2 {
            return None;
        }
        Some(self.traceback(read, reference, best, lo, width))
    }

    fn traceback(
        &self,
        read: &[u8],
        reference: &[u8],
        best: (i32, usize, usize),
        lo: isize,
        width: usize,
    ) -> Alignment {
        let m = read.len();
        let (score, end_i, end_c) = best;
        let mut ops: Vec<CigarOp> = Vec::with_capacity(m + 8);
        ops.extend(std::iter::repeat_n(CigarOp::SoftClip, m - end_i));
        let (mut i, mut c) = (end_i, end_c);
        let ref_end = (end_i as isize + lo + end_c as isize) as usize;
        let (mut mismatches, mut inserted, mut deleted) = (0u32, 0u32, 0u32);
        // 0: in H, 1: in E (deletion run), 2: in F (insertion run).
        let mut state = 0u8;
        while i > 0 {
            let t = self.trace[i * width + c];
            let j = (i as isize + lo + c as isize) as usize;
            match state {
                1 => {
                    ops.push(CigarOp::Del);
                    deleted += 1;
                    if t & E_EXTEND == 0 {
                        state = 0;
                    }
                    c -= 1;
                    continue;
                }
                2 => {
                    ops.push(CigarOp::Ins);
                    inserted += 1;
                    if t & F_EXTEND == 0 {
                        state = 0;
                    }
                    i -= 1;
                    c += 1;
                    continue;
                }
                _ => {}
            }
            match t & 3 {
                FROM_E => state = 1,
                FROM_F => state = 2,
                from => {
                    ops.push(CigarOp::Match);
                    let (a, b) = (read[i - 1], reference[j - 1]);
                    mismatches += u32::from(a != b || a >= AMBIGUOUS || b >= AMBIGUOUS);
                    i -= 1;
                    if from == FROM_CLIP {
                        ops.extend(std::iter::repeat_n(CigarOp::SoftClip, i));
                        let ref_start = j - 1;
                        return finish(
                            score, ref_start, ref_end, ops, mismatches, inserted, deleted,
                        );
                    }
                }
            }
        }
        let ref_start = (lo + c as isize) as usize;
        finish(
            score, ref_start, ref_end, ops, mismatches, inserted, deleted,
        )
    }
}

fn finish(
    score: i32,
    ref_start: usize,
    ref_end: usize,
    mut ops: Vec<CigarOp>,
    mismatches: u32,
    inserted: u32,
    deleted: u32,
) -> Alignment {
    ops.reverse();
    let mut cigar = Cigar::default();
    for op in ops {
        cigar.push(op, 1);
    }
    Alignment {
        score,
        ref_start,
        ref_end,
        cigar,
        mismatches,
        inserted,
        deleted,
    }
}
