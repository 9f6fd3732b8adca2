//! Seed extension: banded affine-gap alignment of a whole read against a reference window
//! (free reference ends, read ends soft-clipped only when that beats aligning them), and the
//! ungapped fast path for reads that sit on one diagonal. The banded fill runs row by row in
//! passes that the compiler vectorises, in 16-bit lanes when the scores fit; its tests keep the
//! cell-by-cell kernel it replaced as the oracle.
//!
//! Sequences are base codes (see [`crate::pack`]); an ambiguous base on either side costs
//! [`Scoring::ambiguous`] and counts in NM, as samtools counts it.

use crate::pack::AMBIGUOUS;
use std::fmt;

mod diagonal;

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

/// Whether aligning `a` to `b` counts in NM: different bases, or either ambiguous.
#[inline]
fn mismatched(a: u8, b: u8) -> bool {
    a != b || a >= AMBIGUOUS || b >= AMBIGUOUS
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
        mismatches += u32::from(mismatched(a, b));
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

// Traceback byte: bits 0-1 say where H came from, bit 2 whether E extended, bit 3 whether F did.
const FROM_DIAG: u8 = 0;
const FROM_E: u8 = 1;
const FROM_F: u8 = 2;
const FROM_CLIP: u8 = 3;
const E_EXTEND: u8 = 4;
// The kernel computes the source as the count of earlier sources that did not reach H.
const _: () = assert!(FROM_DIAG == 0 && FROM_E == 1 && FROM_F == 2 && FROM_CLIP == 3);
const F_EXTEND: u8 = 8;
/// Largest magnitude a score may reach for the 16-bit kernel to be used (its "no path" marker sits
/// at -16384 and real scores must stay clear of the -8192 validity threshold).
const NARROW_LIMIT: i64 = 8000;

/// A score cell of the DP kernel: 16-bit when every reachable score fits (twice the lanes per
/// vector register for the compiler's auto-vectorisation), 32-bit otherwise. Both keep the same
/// "no path" convention so that they fill identical traceback matrices along every real path.
trait Lane: Copy + Ord + fmt::Debug {
    /// Marks a cell no alignment reaches.
    const NEG: Self;
    /// Scores above this are real; at or below it they derive from [`Lane::NEG`].
    const VALID: Self;
    const ZERO: Self;
    /// Converts a score known to fit.
    fn of(v: i32) -> Self;
    fn get(self) -> i32;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
}

impl Lane for i16 {
    const NEG: Self = i16::MIN / 2;
    const VALID: Self = i16::MIN / 4;
    const ZERO: Self = 0;
    fn of(v: i32) -> Self {
        v.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16
    }
    fn get(self) -> i32 {
        i32::from(self)
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.saturating_add(o)
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self.saturating_sub(o)
    }
}

impl Lane for i32 {
    const NEG: Self = i32::MIN / 4;
    const VALID: Self = i32::MIN / 8;
    const ZERO: Self = 0;
    fn of(v: i32) -> Self {
        v
    }
    fn get(self) -> i32 {
        self
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.saturating_add(o)
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self.saturating_sub(o)
    }
}

/// Row buffers of one lane width, each `width + 1` long so the cell above-right of the last
/// column reads a "no path" marker.
#[derive(Debug, Default)]
struct Rows<T> {
    h: Vec<T>,
    e: Vec<T>,
    f: Vec<T>,
    h_prev: Vec<T>,
    f_prev: Vec<T>,
    diag: Vec<T>,
    /// max(diagonal, F, fresh start): H before the row's left-to-right E recurrence.
    partial: Vec<T>,
    /// `gap_extend * k` at k.
    ramp: Vec<T>,
    /// `pair_score(x, reference[p])` at `x * n + p` for every read code x, so a row's scores are
    /// one contiguous slice.
    profile: Vec<T>,
}

/// Reusable buffers so that aligning millions of reads allocates nothing per read.
#[derive(Debug, Default)]
pub struct Aligner {
    narrow: Rows<i16>,
    wide: Rows<i32>,
    trace: Vec<u8>,
    relaxation: diagonal::Relaxation,
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
        if m == 0 || reference.is_empty() {
            return None;
        }
        let width = 2 * band + 1;
        let lo = diagonal - band as isize;
        self.trace.clear();
        self.trace.resize((m + 1) * width, 0);
        let best = if score_bound(m, width, sc) < NARROW_LIMIT {
            fill(
                &mut self.narrow,
                &mut self.trace,
                read,
                reference,
                lo,
                width,
                sc,
            )
        } else {
            fill(
                &mut self.wide,
                &mut self.trace,
                read,
                reference,
                lo,
                width,
                sc,
            )
        }?;
        Some(self.traceback(read, reference, best, lo, width))
    }

    /// [`Self::align`] for a read whose seeds all sit on `diagonal`: the same alignment, found
    /// without filling the band when a cheaper pass proves the ungapped path on that diagonal is
    /// what the fill would return (the usual case for reads with only substitutions).
    pub fn align_on_diagonal(
        &mut self,
        read: &[u8],
        reference: &[u8],
        diagonal: usize,
        band: usize,
        sc: &Scoring,
    ) -> Option<Alignment> {
        if let Some(a) = self.relaxation.prove(read, reference, diagonal, band, sc) {
            return Some(a);
        }
        self.align(read, reference, diagonal as isize, band, sc)
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
                    mismatches += u32::from(mismatched(a, b));
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

/// Largest magnitude any cell of a `m`-row, `width`-column band can hold (scores of real paths
/// and the gap runs leading out of them).
fn score_bound(m: usize, width: usize, sc: &Scoring) -> i64 {
    let p = |v: i32| i64::from(v.unsigned_abs());
    let (m, width) = (m as i64, width as i64);
    p(sc.clip)
        + p(sc.mismatch).max(p(sc.ambiguous))
        + 2 * p(sc.gap_open)
        + p(sc.gap_extend) * (2 * m + width + 2)
        + p(sc.matched) * m
}

/// Fills the banded DP matrix row by row and records the traceback bytes; returns the best end
/// cell `(score, row, column)`, or `None` when the band misses the window.
///
/// Each row is three passes so that the two independent ones vectorise: (1) the diagonal, the
/// vertical gap F and a fresh start after clipping, which depend on the previous row only;
/// (2) the horizontal gap E, a left-to-right recurrence, with the row maximum; (3) the traceback
/// byte. Ties break as in a cell-by-cell evaluation in the order diagonal, E, F, fresh start.
fn fill<T: Lane>(
    r: &mut Rows<T>,
    trace: &mut [u8],
    read: &[u8],
    reference: &[u8],
    lo: isize,
    width: usize,
    sc: &Scoring,
) -> Option<(i32, usize, usize)> {
    let m = read.len();
    let n = reference.len();
    let neg = T::NEG;
    let open = T::of(sc.gap_open + sc.gap_extend);
    let ext = T::of(sc.gap_extend);
    let clip = T::of(sc.clip);
    for v in [
        &mut r.h,
        &mut r.e,
        &mut r.f,
        &mut r.h_prev,
        &mut r.f_prev,
        &mut r.diag,
        &mut r.partial,
    ] {
        v.clear();
        v.resize(width + 1, neg);
    }
    r.ramp.clear();
    r.ramp
        .extend((0..=width).map(|k| T::of(sc.gap_extend.saturating_mul(k as i32))));
    r.profile.clear();
    for x in 0..=AMBIGUOUS {
        r.profile
            .extend(reference.iter().map(|&b| T::of(pair_score(x, b, sc))));
    }
    // Row 0: no read base used yet; any reference start inside the band is free.
    for c in 0..width {
        let j = lo + c as isize;
        if (0..=n as isize).contains(&j) {
            r.h_prev[c] = T::ZERO;
        }
    }
    let mut best = (neg, 0usize, 0usize);
    for i in 1..=m {
        let a = usize::from(read[i - 1].min(AMBIGUOUS));
        // Column c of row i is reference prefix length j = j0 + c; cells outside 0..=n are empty.
        let j0 = i as isize + lo;
        let cs = (-j0).clamp(0, width as isize) as usize;
        let ce = (n as isize - j0 + 1).clamp(0, width as isize) as usize;
        r.h[..width].fill(neg);
        r.f[..width].fill(neg);
        let mut row_best = (neg, 0usize);
        if cs < ce {
            let row_trace = &mut trace[i * width..(i + 1) * width];
            // The j = 0 cell: nothing to its diagonal, no base to start on, only F.
            let c1 = if j0 + cs as isize == 0 {
                let (up_h, up_f) = (r.h_prev[cs + 1], r.f_prev[cs + 1]);
                let (f_open, f_ext) = (up_h.sub(open), up_f.sub(ext));
                r.f[cs] = f_open.max(f_ext);
                r.diag[cs] = neg;
                r.partial[cs] = neg.max(r.f[cs]);
                row_trace[cs] = F_EXTEND * u8::from(f_ext > f_open);
                cs + 1
            } else {
                cs
            };
            // E(c) = max(H(c-1) - open, E(c-1) - ext) with H = max(partial, E) unrolls (open >=
            // ext) to max over c' < c of partial(c') - open - ext * (c - 1 - c'): a running
            // maximum of q(c') = partial(c') + ext * (c' - cs), one dependent operation per cell
            // instead of three, and everything else in the row vectorises. q is kept in h.
            r.h[cs] = r.partial[cs];
            if c1 < ce {
                let from = (j0 + c1 as isize - 1) as usize;
                let scores = &r.profile[a * n + from..a * n + from + (ce - c1)];
                let cells = r.f[c1..ce]
                    .iter_mut()
                    .zip(&mut r.diag[c1..ce])
                    .zip(&mut r.partial[c1..ce])
                    .zip(&mut row_trace[c1..ce])
                    .zip(r.h[c1..ce].iter_mut().zip(&r.ramp[c1 - cs..ce - cs]));
                let prev = r.h_prev[c1..ce]
                    .iter()
                    .zip(&r.h_prev[c1 + 1..=ce])
                    .zip(&r.f_prev[c1 + 1..=ce])
                    .zip(scores);
                for (((((f, d), p), t), (q, &k)), (((&hd, &up_h), &up_f), &s)) in cells.zip(prev) {
                    let (f_open, f_ext) = (up_h.sub(open), up_f.sub(ext));
                    *f = f_open.max(f_ext);
                    *t = F_EXTEND * u8::from(f_ext > f_open);
                    *d = if hd > T::VALID { hd.add(s) } else { neg };
                    *p = (*d).max(*f).max(s.sub(clip));
                    *q = p.add(k);
                }
            }
            let mut run = neg;
            for (e, &q) in r.e[cs..ce].iter_mut().zip(&r.h[cs..ce]) {
                *e = run;
                run = run.max(q);
            }
            // The row's first cell has nothing to its left: its E is no path.
            r.e[cs] = neg.sub(ext);
            r.h[cs] = r.partial[cs].max(r.e[cs]);
            let mut top = r.h[cs];
            let rest = r.e[cs + 1..ce].iter_mut().zip(&r.ramp);
            for ((h, &p), (e, &k)) in r.h[cs + 1..ce]
                .iter_mut()
                .zip(&r.partial[cs + 1..ce])
                .zip(rest)
            {
                *e = e.sub(open).sub(k);
                *h = p.max(*e);
                top = top.max(*h);
            }
            // At the first cell E extends a "no path" left neighbour, as the recurrence says.
            row_trace[cs] |= E_EXTEND * u8::from(neg.sub(ext) > neg.sub(open));
            let cells = r.h[cs..ce]
                .iter()
                .zip(&r.diag[cs..ce])
                .zip(&r.e[cs..ce])
                .zip(&r.f[cs..ce]);
            for (t, (((&h, &d), &e), &f)) in row_trace[cs..ce].iter_mut().zip(cells) {
                // 0 diagonal, 1 E, 2 F, 3 fresh start: the first source, in that order, that
                // reaches H.
                let not_d = u8::from(d != h);
                let not_e = not_d & u8::from(e != h);
                *t |= FROM_DIAG + not_d + not_e + (not_e & u8::from(f != h));
            }
            let left = r.h[cs..ce - 1].iter().zip(&r.e[cs..ce - 1]);
            for (t, (&hl, &el)) in row_trace[cs + 1..ce].iter_mut().zip(left) {
                *t |= E_EXTEND * u8::from(el.sub(ext) > hl.sub(open));
            }
            if top > neg {
                if let Some(k) = r.h[cs..ce].iter().position(|&h| h == top) {
                    row_best = (top, cs + k);
                }
            }
        }
        let end_score = if i == m {
            row_best.0
        } else {
            row_best.0.sub(clip)
        };
        if end_score > best.0 {
            best = (end_score, i, row_best.1);
        }
        std::mem::swap(&mut r.h, &mut r.h_prev);
        std::mem::swap(&mut r.f, &mut r.f_prev);
    }
    (best.0 > T::VALID).then_some((best.0.get(), best.1, best.2))
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

#[cfg(test)]
mod tests {
    //! The row-pass kernel against the cell-by-cell scalar kernel it replaced, kept here as the
    //! oracle: same score, CIGAR, span and counts on random reads with substitutions and indels,
    //! for extension-sized bands and rescue-sized (window-wide) ones, in both lane widths.

    use super::*;
    use proptest::prelude::*;

    const NEG: i32 = i32::MIN / 4;

    /// The previous scalar kernel, cell by cell, unchanged apart from owning its buffers.
    fn oracle(
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
        let (mut h, mut e, mut f) = (vec![NEG; width], vec![NEG; width], vec![NEG; width]);
        let (mut h_prev, mut f_prev) = (vec![NEG; width], vec![NEG; width]);
        let mut trace = vec![0u8; (m + 1) * width];
        for (c, hp) in h_prev.iter_mut().enumerate() {
            if (0..=n).contains(&(lo + c as isize)) {
                *hp = 0;
            }
        }
        let mut best = (NEG, 0usize, 0usize);
        for i in 1..=m {
            let a = read[i - 1];
            let mut row_best = (NEG, 0usize);
            let (mut e_left, mut h_left) = (NEG, NEG);
            for c in 0..width {
                let j = i as isize + lo + c as isize;
                if j < 0 || j > n {
                    (h[c], e[c], f[c], e_left, h_left) = (NEG, NEG, NEG, NEG, NEG);
                    continue;
                }
                let mut t = 0u8;
                let e_open = h_left.saturating_sub(open);
                let e_ext = e_left.saturating_sub(sc.gap_extend);
                let ev = if e_ext > e_open {
                    t |= E_EXTEND;
                    e_ext
                } else {
                    e_open
                };
                let (up_h, up_f) = if c + 1 < width {
                    (h_prev[c + 1], f_prev[c + 1])
                } else {
                    (NEG, NEG)
                };
                let f_open = up_h.saturating_sub(open);
                let f_ext = up_f.saturating_sub(sc.gap_extend);
                let fv = if f_ext > f_open {
                    t |= F_EXTEND;
                    f_ext
                } else {
                    f_open
                };
                let diag = if j >= 1 && h_prev[c] > NEG / 2 {
                    h_prev[c] + pair_score(a, reference[(j - 1) as usize], sc)
                } else {
                    NEG
                };
                let (mut hv, mut from) = (diag, FROM_DIAG);
                if ev > hv {
                    (hv, from) = (ev, FROM_E);
                }
                if fv > hv {
                    (hv, from) = (fv, FROM_F);
                }
                if j >= 1 {
                    let start = -sc.clip + pair_score(a, reference[(j - 1) as usize], sc);
                    if start > hv {
                        (hv, from) = (start, FROM_CLIP);
                    }
                }
                trace[i * width + c] = t | from;
                (h[c], e[c], f[c], e_left, h_left) = (hv, ev, fv, ev, hv);
                if hv > row_best.0 {
                    row_best = (hv, c);
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
            std::mem::swap(&mut h, &mut h_prev);
            std::mem::swap(&mut f, &mut f_prev);
        }
        if best.0 <= NEG / 2 {
            return None;
        }
        let tb = Aligner {
            trace,
            ..Aligner::default()
        };
        Some(tb.traceback(read, reference, best, lo, width))
    }

    fn base() -> impl Strategy<Value = u8> {
        prop_oneof![60 => 0u8..4, 1 => Just(AMBIGUOUS)]
    }

    /// A read drawn from `reference` at `start` with substitutions, insertions and deletions.
    fn mutate(reference: &[u8], start: usize, len: usize, edits: &[(usize, u8, u8)]) -> Vec<u8> {
        let end = (start + len).min(reference.len());
        let mut read = reference[start.min(end)..end].to_vec();
        for &(at, kind, b) in edits {
            if read.len() < 10 {
                break;
            }
            let at = at % read.len();
            match kind {
                0 | 1 => read[at] = b,
                2 => read.insert(at, b),
                _ => {
                    read.remove(at);
                }
            }
        }
        read
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(250))]

        #[test]
        fn same_alignment_as_scalar_kernel(
            reference in proptest::collection::vec(base(), 100..400),
            start in 0usize..120,
            len in 30usize..200,
            edits in proptest::collection::vec((0usize..200, 0u8..4, 0u8..5), 0..12),
            shift in -20isize..20,
            band in 0usize..24,
        ) {
            let read = mutate(&reference, start, len, &edits);
            let sc = Scoring::default();
            let diag = start as isize + shift;
            let mut al = Aligner::new();
            prop_assert_eq!(al.align(&read, &reference, diag, band, &sc), oracle(&read, &reference, diag, band, &sc));
        }

        #[test]
        fn same_alignment_as_scalar_kernel_full_width(
            reference in proptest::collection::vec(base(), 150..700),
            start in 0usize..500,
            len in 30usize..160,
            edits in proptest::collection::vec((0usize..200, 0u8..4, 0u8..5), 0..12),
        ) {
            // Mate rescue: a band as wide as the window around its middle.
            let read = mutate(&reference, start, len, &edits);
            let sc = Scoring::default();
            let slack = reference.len().saturating_sub(read.len()) / 2;
            let mut al = Aligner::new();
            prop_assert_eq!(
                al.align(&read, &reference, slack as isize, slack + 1, &sc),
                oracle(&read, &reference, slack as isize, slack + 1, &sc)
            );
        }

        #[test]
        fn wide_lanes_match_narrow_lanes_and_scalar(
            reference in proptest::collection::vec(base(), 100..300),
            start in 0usize..80,
            len in 30usize..150,
            edits in proptest::collection::vec((0usize..200, 0u8..4, 0u8..5), 0..12),
            shift in -10isize..10,
        ) {
            let read = mutate(&reference, start, len, &edits);
            let sc = Scoring::default();
            let (diag, band) = (start as isize + shift, 16);
            let width = 2 * band + 1;
            let lo = diag - band as isize;
            let mut al = Aligner::new();
            let mut trace = vec![0u8; (read.len() + 1) * width];
            let narrow = fill(&mut al.narrow, &mut trace, &read, &reference, lo, width, &sc);
            let narrow_trace = trace.clone();
            trace.fill(0);
            let wide = fill(&mut al.wide, &mut trace, &read, &reference, lo, width, &sc);
            prop_assert_eq!(narrow, wide);
            if let Some(best) = wide {
                al.trace = trace;
                let w = al.traceback(&read, &reference, best, lo, width);
                al.trace = narrow_trace;
                prop_assert_eq!(&al.traceback(&read, &reference, best, lo, width), &w);
                prop_assert_eq!(Some(w), oracle(&read, &reference, diag, band, &sc));
            }
        }
    }

    /// Reads drawn on one diagonal with substitutions only (the shortcut's case), sometimes an
    /// indel or a low-complexity reference (where it must give way to the fill).
    fn one_diagonal_case() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, usize, usize)> {
        (
            proptest::collection::vec(base(), 160..400),
            0usize..40,
            30usize..150,
            proptest::collection::vec((0usize..200, 0u8..8, 0u8..5), 0..10),
            0usize..20,
            0u8..4,
        )
            .prop_map(|(mut reference, start, len, edits, band, repeat)| {
                if repeat == 0 {
                    // A tandem repeat: other diagonals of the band match as well as the read's.
                    let unit = reference[..3].to_vec();
                    for (k, b) in reference.iter_mut().enumerate() {
                        *b = unit[k % 3];
                    }
                }
                // Mostly substitutions: kinds 0-5 substitute, 6 inserts, 7 deletes.
                let edits: Vec<(usize, u8, u8)> = edits
                    .into_iter()
                    .map(|(at, kind, b)| (at, if kind < 6 { 0 } else { kind - 4 }, b))
                    .collect();
                let read = mutate(&reference, start, len, &edits);
                (reference, read, start, band)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn one_diagonal_shortcut_is_the_fill_whenever_it_answers((reference, read, start, band) in one_diagonal_case()) {
            let sc = Scoring::default();
            let mut al = Aligner::new();
            let want = oracle(&read, &reference, start as isize, band, &sc);
            if let Some(got) = al.relaxation.prove(&read, &reference, start, band, &sc) {
                prop_assert_eq!(Some(got), want.clone());
            }
            prop_assert_eq!(al.align_on_diagonal(&read, &reference, start, band, &sc), want);
        }
    }

    #[test]
    fn one_diagonal_shortcut_answers_for_substitutions_and_declines_gaps() {
        let mut x = 99u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        let sc = Scoring::default();
        let mut al = Aligner::new();
        let (mut answered, mut declined_gapped) = (0, 0);
        for _ in 0..200 {
            let reference: Vec<u8> = (0..400).map(|_| (next() % 4) as u8).collect();
            let start = 20 + (next() % 100) as usize;
            // Four substitutions, spread over the read: beyond the two the ungapped check in
            // `map` accepts, and far from a reason to open a gap.
            let mut read = reference[start..start + 150].to_vec();
            for k in 0..4 {
                let at = 10 + 35 * k + (next() % 10) as usize;
                read[at] = (read[at] + 1 + (next() % 3) as u8) % 4;
            }
            let want = oracle(&read, &reference, start as isize, 16, &sc);
            if let Some(got) = al.relaxation.prove(&read, &reference, start, 16, &sc) {
                assert_eq!(Some(got), want);
                answered += 1;
            }
            // The same read with a deletion in its middle aligns with a gap: no shortcut.
            read.remove(75);
            read.remove(75);
            let gapped = oracle(&read, &reference, start as isize, 16, &sc).unwrap();
            assert!(gapped.deleted > 0 || gapped.inserted > 0);
            if al
                .relaxation
                .prove(&read, &reference, start, 16, &sc)
                .is_none()
            {
                declined_gapped += 1;
            }
        }
        assert!(answered >= 190, "shortcut answered {answered} of 200");
        assert_eq!(declined_gapped, 200);
    }

    #[test]
    fn long_reads_take_the_wide_lanes_and_agree() {
        // 5 kbp: beyond the 16-bit kernel's range.
        let mut x = 12345u64;
        let reference: Vec<u8> = (0..5200)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 62) as u8
            })
            .collect();
        let read = mutate(
            &reference,
            100,
            5000,
            &[(700, 0, 1), (1900, 2, 3), (3100, 3, 0)],
        );
        let sc = Scoring::default();
        assert!(score_bound(read.len(), 17, &sc) >= NARROW_LIMIT);
        let got = Aligner::new().align(&read, &reference, 100, 8, &sc);
        assert_eq!(got, oracle(&read, &reference, 100, 8, &sc));
        assert!(got.is_some_and(|a| a.score > 9000));
    }
}
