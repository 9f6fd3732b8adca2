//! The one-diagonal shortcut of the banded aligner. Most reads whose seeds all sit on one
//! diagonal align there without gaps, but a few mismatches are enough to make the ungapped check
//! in `map` give up and fill the whole band. This module proves, in one cheap pass over the same
//! band, that the banded fill would return the ungapped path on that diagonal (with the fill's own
//! clipping and tie-breaking), and then builds that path without filling anything.
//!
//! The proof is a relaxation of the banded fill: every alignment the fill can score that leaves the
//! diagonal, or lies on another one, maps to a path of the relaxation that scores at least as much.
//! Insertions (read bases against no reference, a step down the band to the previous row's next
//! column) are kept exactly, per column; a deletion of any length becomes a jump from the
//! previous row's best cell to any column at the price of the shortest gap. When the best of
//! those paths still ends strictly below the diagonal's own best end, no cell that the fill's
//! choice of end or its traceback reads can hold anything but the diagonal's path, so the fill's
//! answer is that path. Otherwise the caller fills the band as before. Each row of the relaxation
//! is a few operations per column, all on the previous row, so it vectorises fully, unlike the
//! fill's left-to-right deletion recurrence. (Relaxing insertions the same way made a pair of
//! adjacent mismatches tie with "insert both bases, land back on the diagonal", and the proof
//! failed on a third of the reads it was meant for.)
//!
//! Why the strict inequality is enough: if a path with a gap reached a cell of the diagonal's
//! route with a score at or above the route's, following the diagonal from there to the route's
//! end would be a gapped alignment scoring at or above the route's best, which the relaxation
//! bounds. So on the route the fill's diagonal source (or its fresh start) is the unique maximum,
//! and its end cell is the unique best of its row.

use super::{
    finish, mismatched, pair_score, score_bound, Alignment, CigarOp, Scoring, NARROW_LIMIT,
};
use crate::pack::AMBIGUOUS;

/// "No path" in the relaxation's 16-bit lanes; real scores stay far above it (see `prove`).
const NEG: i16 = i16::MIN / 2;

/// Buffers of the relaxation, reused from read to read.
#[derive(Debug, Default)]
pub(super) struct Relaxation {
    /// `pair_score(x, reference[p])` at `x * stride + band + p`, with `band` "no path" entries
    /// padding each end, so a row's scores are one slice even where the band overhangs the window.
    profile: Vec<i16>,
    /// Best path ending at this column that stayed on its diagonal since it started.
    pure: Vec<i16>,
    /// Upper bound on every path with at least one gap whose last step aligned a base here.
    gapped: Vec<i16>,
    /// Upper bound on every path whose last step inserted a read base here (vertical gap).
    inserting: Vec<i16>,
    /// The next row's `inserting`, built from this row's cells one column to the right.
    inserting_next: Vec<i16>,
}

impl Relaxation {
    /// The alignment `Aligner::align(read, reference, diag, band, sc)` returns, when the
    /// relaxation proves it is the ungapped path on `diag`; `None` when it cannot (then fill).
    pub(super) fn prove(
        &mut self,
        read: &[u8],
        reference: &[u8],
        diag: usize,
        band: usize,
        sc: &Scoring,
    ) -> Option<Alignment> {
        let (m, n) = (read.len(), reference.len());
        let width = 2 * band + 1;
        // The argument needs gaps and clips to cost something, and every score to fit i16 lanes
        // with room below for "no path" (the 16-bit fill's own limit).
        if m == 0
            || diag.checked_add(m)? > n
            || sc.gap_open < 0
            || sc.gap_extend < 0
            || sc.clip < 0
            || score_bound(m, width, sc) >= NARROW_LIMIT
        {
            return None;
        }
        let lane = |v: i32| v as i16;
        let (open, ext, clip) = (
            lane(sc.gap_open + sc.gap_extend),
            lane(sc.gap_extend),
            lane(sc.clip),
        );
        let stride = n + 2 * band;
        self.profile.clear();
        for x in 0..=AMBIGUOUS {
            self.profile.extend(std::iter::repeat_n(NEG, band));
            self.profile
                .extend(reference.iter().map(|&b| lane(pair_score(x, b, sc))));
            self.profile.extend(std::iter::repeat_n(NEG, band));
        }
        // Row 0: every reference offset inside the band is a free start.
        self.pure.clear();
        self.pure.extend((0..width).map(|c| {
            let j = (diag + c) as isize - band as isize;
            if (0..=n as isize).contains(&j) {
                0
            } else {
                NEG
            }
        }));
        for v in [
            &mut self.gapped,
            &mut self.inserting,
            &mut self.inserting_next,
        ] {
            v.clear();
            v.resize(width, NEG);
        }
        let on = band;
        let mut row_top = 0i16;
        // Largest end score of any path but the diagonal's own, and the diagonal's best end:
        // (score, row, first aligned row).
        let mut others = i32::from(NEG);
        let mut best = (i32::from(NEG), 0usize, 0usize);
        let mut first_row = 1usize;
        for i in 1..=m {
            let x = usize::from(read[i - 1].min(AMBIGUOUS));
            // Column c of row i scores read[i - 1] against reference[diag + i - 1 + c - band].
            let from = x * stride + diag + i - 1;
            let row = &self.profile[from..from + width];
            let before = self.pure[on];
            // Inserting read base i at column c comes from cell (i - 1, c + 1); the last column
            // has nothing to its right, so its entry stays "no path" in both buffers.
            let above = self
                .pure
                .iter()
                .zip(&self.gapped)
                .zip(&self.inserting)
                .skip(1);
            for (next, ((&p, &g), &f)) in self.inserting_next.iter_mut().zip(above) {
                *next = p
                    .max(g)
                    .max(f)
                    .saturating_sub(open)
                    .max(f.saturating_sub(ext));
            }
            // A deletion of any length out of the previous row's best cell, to any column.
            let jump = row_top.saturating_sub(open);
            let cells = self
                .pure
                .iter_mut()
                .zip(&mut self.gapped)
                .zip(&self.inserting);
            for (((p, g), &f), &s) in cells.zip(row) {
                *p = p.saturating_add(s).max(s.saturating_sub(clip));
                *g = (*g).max(f).max(jump).saturating_add(s);
            }
            std::mem::swap(&mut self.inserting, &mut self.inserting_next);
            let top = |v: &[i16]| v.iter().fold(NEG, |a, &b| a.max(b));
            let pure_elsewhere = top(&self.pure[..on]).max(top(&self.pure[on + 1..]));
            let on_diag = self.pure[on];
            let gapped = top(&self.gapped).max(top(&self.inserting));
            row_top = pure_elsewhere.max(on_diag).max(gapped);
            // Cells whose best path ends in a deletion score at most the row's best less a gap.
            let gapped_end = gapped.max(row_top.saturating_sub(open));
            let clip_here = if i == m { 0 } else { i32::from(clip) };
            others = others.max(i32::from(pure_elsewhere.max(gapped_end)) - clip_here);
            // The fill starts afresh only when that beats the diagonal strictly (ties continue).
            let s = row[on];
            if s.saturating_sub(clip) > before.saturating_add(s) {
                first_row = i;
            }
            let end = i32::from(on_diag) - clip_here;
            if end > best.0 {
                best = (end, i, first_row);
            }
        }
        let (score, last_row, first_row) = best;
        if others >= score {
            return None;
        }
        let mut ops = Vec::with_capacity(m);
        ops.extend(std::iter::repeat_n(CigarOp::SoftClip, m - last_row));
        ops.extend(std::iter::repeat_n(
            CigarOp::Match,
            last_row + 1 - first_row,
        ));
        ops.extend(std::iter::repeat_n(CigarOp::SoftClip, first_row - 1));
        let aligned = &read[first_row - 1..last_row];
        let against = &reference[diag + first_row - 1..diag + last_row];
        let mismatches = aligned
            .iter()
            .zip(against)
            .filter(|&(&a, &b)| mismatched(a, b))
            .count() as u32;
        Some(finish(
            score,
            diag + first_row - 1,
            diag + last_row,
            ops,
            mismatches,
            0,
            0,
        ))
    }
}
