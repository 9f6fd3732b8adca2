//! Read mapping: seeds (the read's minimizers looked up in the [`Index`]) are grouped by strand and
//! diagonal, the strongest groups are extended over the whole read with [`crate::align`], and the
//! gap between the best and second-best alignment gives the mapping quality. Paired-end reads are
//! mapped mate by mate and then paired within an insert-size window (given, or estimated from the
//! batch), which sets the proper-pair flag; a mate left without a proper partner is searched for
//! across its partner's insert window (mate rescue).
//!
//! Batches are split into chunks that `threads` scoped threads take from a shared counter; results
//! are put back in input order, so the output does not depend on the thread count.

use crate::align::{align_ungapped, Aligner, Alignment, Cigar, Scoring};
use crate::index::{minimizers, Index, Minimizer};
use crate::pack::{encode_base, reverse_complement_codes};
use std::sync::atomic::{AtomicUsize, Ordering};
use thiserror::Error;

/// A mate is searched for near its partner only when the partner is placed at least this surely.
pub const RESCUE_MIN_MAPQ: u8 = 20;
/// Longest stretch of reference searched for a missing mate (bounds the full-width alignment).
const MAX_RESCUE_SPAN: u64 = 4000;
/// Most diagonals a seed group's spread may add to the alignment band on each side.
const MAX_EXTRA_BAND: usize = 64;
/// Reads per unit of work handed to a thread.
const CHUNK: usize = 256;
/// Most positions a repetitive minimizer may have and still seed a read whose seeds are mostly
/// repetitive (minimap2's short-read preset filters at 1000).
const REPEAT_MAX_OCC: usize = 1000;
/// Most anchors such a read may collect from its repetitive minimizers.
const REPEAT_MAX_ANCHORS: usize = 2000;
/// Mismatches an ungapped alignment may have and still skip the banded aligner.
const UNGAPPED_MAX_MISMATCHES: u32 = 2;
/// MAPQ points per mismatch's worth of score between the best and second-best alignment: a read
/// whose runner-up differs by one mismatch gets 6, by four gets 24, so a repeat copy that differs
/// from the read's true origin in only a few bases never earns MAPQ 20 or more.
const MAPQ_PER_MISMATCH: i32 = 6;
/// Highest MAPQ reported (as BWA and minimap2).
pub const MAX_MAPQ: u8 = 60;
/// Insert window used when the batch has too few confidently paired reads to estimate one.
pub const DEFAULT_INSERT: InsertWindow = InsertWindow { min: 0, max: 1000 };
/// Confident pairs needed before the insert window is estimated from the data.
const MIN_PAIRS_FOR_ESTIMATE: usize = 16;
/// Score a pair may give up against the two mates' best unpaired alignments and still be
/// preferred as a proper pair (BWA's unpaired penalty).
const PAIR_PENALTY: i32 = 17;

/// Why a batch could not be mapped.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapError {
    /// The two mate lists differ in length.
    #[error("paired-end input has {first} first mates but {second} second mates")]
    MateCountMismatch {
        /// Number of first mates.
        first: usize,
        /// Number of second mates.
        second: usize,
    },
    /// A mapping thread panicked.
    #[error("a mapping thread failed")]
    ThreadFailed,
}

/// A read to map: the FASTQ parser's record (name, ASCII bases, Phred+33 qualities or empty), so
/// parsed batches go to the mapper without copying. Bases other than ACGT are ambiguous.
pub use crate::fastq::FastqRecord as Read;

/// Allowed outer distance (leftmost to rightmost aligned base) of a proper pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertWindow {
    /// Smallest insert accepted.
    pub min: u64,
    /// Largest insert accepted.
    pub max: u64,
}

/// Mapping settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapOptions {
    /// Worker threads (at least one is used).
    pub threads: usize,
    /// Half-width of the alignment band in diagonals.
    pub band: usize,
    /// Alignment scores.
    pub scoring: Scoring,
    /// Skip minimizers with more positions than this; `None` uses the index's cutoff.
    pub max_occ: Option<u32>,
    /// Most seed groups extended per read.
    pub max_candidates: usize,
    /// Alignments scoring below this are not reported (minimap2 `-ax sr` uses 40 too).
    pub min_score: i32,
    /// Proper-pair insert window; `None` estimates it from each paired batch.
    pub insert: Option<InsertWindow>,
}

impl Default for MapOptions {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            band: 16,
            scoring: Scoring::default(),
            max_occ: None,
            max_candidates: 30,
            min_score: 40,
            insert: None,
        }
    }
}

/// Where a read aligned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Contig index in the reference.
    pub contig: usize,
    /// 0-based position in the contig of the leftmost aligned reference base.
    pub pos: u64,
    /// True when the reverse complement of the read aligned.
    pub reverse: bool,
    /// CIGAR in reference orientation (as SAM wants it).
    pub cigar: Cigar,
    /// Alignment score.
    pub score: i32,
    /// Edit distance over the aligned part.
    pub nm: u32,
    /// Mapping quality, 0..=[`MAX_MAPQ`].
    pub mapq: u8,
}

impl Hit {
    /// 0-based position just past the rightmost aligned reference base.
    pub fn end(&self) -> u64 {
        self.pos + self.cigar.ref_len()
    }
}

/// Result for a single-end read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The primary alignment, or `None` when unmapped.
    pub hit: Option<Hit>,
}

/// Result for a read pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairMapping {
    /// First mate's alignment.
    pub first: Option<Hit>,
    /// Second mate's alignment.
    pub second: Option<Hit>,
    /// Mates on one contig, opposite strands, facing each other, within the insert window.
    pub proper: bool,
}

/// One seed hit: strand, diagonal (reference position of read base 0 in the read's aligned
/// orientation) and the seed's offset in that orientation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Anchor {
    reverse: bool,
    diag: i64,
    qpos: u32,
}

/// Seeds on one strand within a band of nearby diagonals.
#[derive(Debug, Clone, Copy)]
struct Group {
    reverse: bool,
    dmin: i64,
    dmax: i64,
    anchors: u32,
    /// The diagonal holding the most of the group's anchors (the first such), and their number.
    peak: i64,
    peak_anchors: u32,
}

impl Group {
    /// Whether the group spans more diagonals than the widened band around one centre covers.
    fn is_wide(&self) -> bool {
        ((self.dmax - self.dmin) / 2) as usize > MAX_EXTRA_BAND
    }
}

/// Appends the anchors of minimizer `mz` at its reference positions `hits` (each position
/// shifted left by one with the strand in bit 0).
fn push_anchors<'h>(
    anchors: &mut Vec<Anchor>,
    mz: &Minimizer,
    hits: impl Iterator<Item = &'h u64>,
    m: i64,
    k: i64,
) {
    for &v in hits {
        let gpos = (v >> 1) as i64;
        let reverse = mz.rev != (v & 1 == 1);
        let qpos = if reverse {
            m - k - i64::from(mz.pos)
        } else {
            i64::from(mz.pos)
        };
        anchors.push(Anchor {
            reverse,
            diag: gpos - qpos,
            qpos: qpos as u32,
        });
    }
}

/// Per-thread buffers reused from read to read.
#[derive(Debug, Default)]
struct Scratch {
    aligner: Aligner,
    fwd: Vec<u8>,
    rc: Vec<u8>,
    mins: Vec<Minimizer>,
    anchors: Vec<Anchor>,
    /// (occurrences, index in `mins`) of the read's minimizers above the cutoff.
    repetitive: Vec<(usize, usize)>,
    groups: Vec<Group>,
    /// (contig, position, strand) of the hits aligned from wide groups.
    in_arrays: Vec<(usize, u64, bool)>,
    window: Vec<u8>,
}

/// All scored placements of a read, best first, with the MAPQ of the best.
#[derive(Debug, Clone, Default)]
struct Candidates {
    hits: Vec<Hit>,
    /// Groups as strong as the best that were not extended (beyond `max_candidates`).
    unextended_ties: u32,
}

/// Maps reads against an index.
#[derive(Debug)]
pub struct Mapper<'a> {
    index: &'a Index,
    opts: MapOptions,
    max_occ: usize,
}

impl<'a> Mapper<'a> {
    /// A mapper over `index` with `opts`.
    pub fn new(index: &'a Index, opts: MapOptions) -> Self {
        let max_occ = opts.max_occ.unwrap_or_else(|| index.max_occ()) as usize;
        Self {
            index,
            opts,
            max_occ,
        }
    }

    /// The options in use.
    pub fn options(&self) -> &MapOptions {
        &self.opts
    }

    /// Maps one read on the calling thread.
    pub fn map_read(&self, read: &Read) -> Mapping {
        let mut s = Scratch::default();
        self.map_one(&mut s, read)
    }

    /// Maps a batch on [`MapOptions::threads`] threads; results are in input order.
    pub fn map_batch(&self, reads: &[Read]) -> Result<Vec<Mapping>, MapError> {
        par_map(reads, self.opts.threads, |s, r| self.map_one(s, r))
    }

    /// Maps a batch of pairs (`first[i]` with `second[i]`); results are in input order. The
    /// insert window is [`MapOptions::insert`] or, when that is `None`, estimated from this batch
    /// (see [`Self::estimate_insert`]).
    pub fn map_pairs(&self, first: &[Read], second: &[Read]) -> Result<Vec<PairMapping>, MapError> {
        self.map_pairs_with_window(first, second)
            .map(|(out, _)| out)
    }

    /// [`Self::map_pairs`], also returning the insert window it used. The window it estimates is
    /// the one [`Self::estimate_insert`] gives for the same batch (both take each mate's primary
    /// placement), so a caller can keep it for later batches without mapping this one twice.
    pub fn map_pairs_with_window(
        &self,
        first: &[Read],
        second: &[Read],
    ) -> Result<(Vec<PairMapping>, InsertWindow), MapError> {
        if first.len() != second.len() {
            return Err(MapError::MateCountMismatch {
                first: first.len(),
                second: second.len(),
            });
        }
        let idx: Vec<usize> = (0..first.len()).collect();
        let cands = par_map(&idx, self.opts.threads, |s, &i| {
            (
                self.candidates(s, &first[i]),
                self.candidates(s, &second[i]),
            )
        })?;
        let window = self.opts.insert.unwrap_or_else(|| {
            estimate_window(cands.iter().map(|(a, b)| (a.hits.first(), b.hits.first())))
        });
        let out = par_map(&idx, self.opts.threads, |s, &i| {
            let (a, b) = &cands[i];
            let pair = pair_up(a, b, window);
            if pair.proper {
                pair
            } else {
                self.rescue(s, pair, &first[i], &second[i], window)
            }
        })?;
        Ok((out, window))
    }

    /// For a pair that did not pair up, looks for each mate inside the insert window of the other
    /// (when that one is placed with MAPQ ≥ [`RESCUE_MIN_MAPQ`]) with a full-width alignment, which
    /// finds mates too divergent to have kept an exact seed. A rescued mate is reported with MAPQ
    /// 0: its placement rests on its mate's, not on its own sequence.
    fn rescue(
        &self,
        s: &mut Scratch,
        pair: PairMapping,
        first: &Read,
        second: &Read,
        window: InsertWindow,
    ) -> PairMapping {
        let keep_or_take = |own: &Option<Hit>, found: Option<Hit>| match (own, found) {
            (Some(o), Some(f)) if f.score + PAIR_PENALTY < o.score => None,
            (_, found) => found,
        };
        if let Some(a) = pair.first.as_ref().filter(|h| h.mapq >= RESCUE_MIN_MAPQ) {
            let found = self.rescue_mate(s, a, second, window);
            if let Some(h) = keep_or_take(&pair.second, found) {
                return PairMapping {
                    first: pair.first.clone(),
                    second: Some(h),
                    proper: true,
                };
            }
        }
        if let Some(b) = pair.second.as_ref().filter(|h| h.mapq >= RESCUE_MIN_MAPQ) {
            let found = self.rescue_mate(s, b, first, window);
            if let Some(h) = keep_or_take(&pair.first, found) {
                return PairMapping {
                    first: Some(h),
                    second: pair.second.clone(),
                    proper: true,
                };
            }
        }
        pair
    }

    /// Aligns `mate` across the stretch of reference where a proper partner of `anchor` must lie.
    fn rescue_mate(
        &self,
        s: &mut Scratch,
        anchor: &Hit,
        mate: &Read,
        window: InsertWindow,
    ) -> Option<Hit> {
        let reference = self.index.reference();
        let contig = reference.contigs().get(anchor.contig)?;
        let m = mate.seq.len() as u64;
        let (lo, hi, reverse) = if anchor.reverse {
            (anchor.end().saturating_sub(window.max), anchor.end(), false)
        } else {
            (anchor.pos, anchor.pos.saturating_add(window.max), true)
        };
        let hi = hi.min(contig.len);
        if m == 0 || hi <= lo || hi - lo < m || hi - lo > MAX_RESCUE_SPAN {
            return None;
        }
        s.window.clear();
        reference.fetch(contig.offset + lo, hi - lo, &mut s.window);
        s.fwd.clear();
        s.fwd.extend(mate.seq.iter().map(|&b| encode_base(b)));
        if reverse {
            reverse_complement_codes(&mut s.fwd);
        }
        let slack = ((hi - lo - m) / 2) as usize;
        let aln = s.aligner.align(
            &s.fwd,
            &s.window,
            slack as isize,
            slack + 1,
            &self.opts.scoring,
        )?;
        let hit = Hit {
            contig: anchor.contig,
            pos: lo + aln.ref_start as u64,
            reverse,
            nm: aln.nm(),
            score: aln.score,
            cigar: aln.cigar,
            mapq: 0,
        };
        (hit.score >= self.opts.min_score && is_proper(anchor, &hit, window)).then_some(hit)
    }

    /// Estimates the insert window from pairs whose mates both map uniquely (MAPQ ≥ 30) to one
    /// contig facing each other: quartiles ± 3 interquartile ranges, or [`DEFAULT_INSERT`] when
    /// fewer than 16 such pairs exist.
    pub fn estimate_insert(
        &self,
        first: &[Read],
        second: &[Read],
    ) -> Result<InsertWindow, MapError> {
        if first.len() != second.len() {
            return Err(MapError::MateCountMismatch {
                first: first.len(),
                second: second.len(),
            });
        }
        let idx: Vec<usize> = (0..first.len()).collect();
        let best = par_map(&idx, self.opts.threads, |s, &i| {
            (
                self.map_one(s, &first[i]).hit,
                self.map_one(s, &second[i]).hit,
            )
        })?;
        Ok(estimate_window(
            best.iter().map(|(a, b)| (a.as_ref(), b.as_ref())),
        ))
    }

    fn map_one(&self, s: &mut Scratch, read: &Read) -> Mapping {
        let c = self.candidates(s, read);
        Mapping {
            hit: c.hits.into_iter().next(),
        }
    }

    /// Seeds, groups, extends and ranks the placements of one read; the first hit carries the
    /// read's MAPQ.
    fn candidates(&self, s: &mut Scratch, read: &Read) -> Candidates {
        let m = read.seq.len();
        let k = i64::from(self.index.params().k);
        s.fwd.clear();
        s.fwd.extend(read.seq.iter().map(|&b| encode_base(b)));
        s.rc.clear();
        s.rc.extend_from_slice(&s.fwd);
        reverse_complement_codes(&mut s.rc);
        s.mins.clear();
        minimizers(&s.fwd, self.index.params(), &mut s.mins);
        s.anchors.clear();
        s.repetitive.clear();
        for (i, mz) in s.mins.iter().enumerate() {
            let hits = self.index.get(mz.hash);
            if hits.len() > self.max_occ {
                s.repetitive.push((hits.len(), i));
                continue;
            }
            push_anchors(&mut s.anchors, mz, hits.iter(), m as i64, k);
        }
        // A read from a repeat copy keeps few seeds under the cutoff, often only ones shared with
        // another copy, and would be placed on it with full confidence. When most of its seeds
        // are repetitive, the rarest of them seed too (bounded, so a read of a satellite cannot
        // make the work unbounded), so the copies compete and the MAPQ says so.
        if s.repetitive.len() * 2 >= s.mins.len() && !s.repetitive.is_empty() {
            s.repetitive.sort_unstable();
            for &(occ, i) in &s.repetitive {
                if occ > REPEAT_MAX_OCC || s.anchors.len() + occ > REPEAT_MAX_ANCHORS {
                    break;
                }
                let mz = &s.mins[i];
                push_anchors(
                    &mut s.anchors,
                    mz,
                    self.index.get(mz.hash).iter(),
                    m as i64,
                    k,
                );
            }
        }
        s.anchors.sort_unstable();
        s.groups.clear();
        let band = self.opts.band as i64;
        // Anchors on the diagonal being counted, for each group's peak.
        let mut run = 0u32;
        for a in &s.anchors {
            match s.groups.last_mut() {
                Some(g) if g.reverse == a.reverse && a.diag - g.dmax <= band => {
                    run = if a.diag == g.dmax { run + 1 } else { 1 };
                    g.dmax = a.diag;
                    g.anchors += 1;
                    if run > g.peak_anchors {
                        (g.peak, g.peak_anchors) = (a.diag, run);
                    }
                }
                _ => {
                    run = 1;
                    s.groups.push(Group {
                        reverse: a.reverse,
                        dmin: a.diag,
                        dmax: a.diag,
                        anchors: 1,
                        peak: a.diag,
                        peak_anchors: 1,
                    });
                }
            }
        }
        let mut out = Candidates::default();
        let Some(best_anchors) = s.groups.iter().map(|g| g.anchors).max() else {
            return out;
        };
        s.groups.sort_by(|a, b| {
            b.anchors
                .cmp(&a.anchors)
                .then(a.reverse.cmp(&b.reverse))
                .then(a.dmin.cmp(&b.dmin))
        });
        let keep = s
            .groups
            .iter()
            .take_while(|g| g.anchors * 4 >= best_anchors)
            .count()
            .min(self.opts.max_candidates);
        out.unextended_ties = s.groups[keep..]
            .iter()
            .filter(|g| g.anchors == best_anchors)
            .count() as u32;
        let groups = std::mem::take(&mut s.groups);
        s.in_arrays.clear();
        for g in &groups[..keep] {
            if let Some(h) = self.extend(s, g, m) {
                if h.score >= self.opts.min_score {
                    if g.is_wide() {
                        s.in_arrays.push((h.contig, h.pos, h.reverse));
                    }
                    out.hits.push(h);
                }
            }
        }
        s.groups = groups;
        rank(&mut out, m, &self.opts.scoring, name_hash(&read.name));
        // A placement inside a seed group wider than its alignment window (a tandem array) had
        // rivals in the same group that were never aligned: it cannot be told apart from them.
        // Otherwise confidence rests on the unique seeds: a read most of whose minimizers are
        // repetitive may come from a copy that none of its seeds tell apart (minimap2 scales its
        // MAPQ by the same fraction).
        if let Some(best) = out.hits.first_mut() {
            if s.in_arrays.contains(&(best.contig, best.pos, best.reverse)) {
                best.mapq = 0;
            } else {
                let unique = s.mins.len() - s.repetitive.len();
                best.mapq = (usize::from(best.mapq) * unique / s.mins.len().max(1)) as u8;
            }
        }
        out
    }

    /// Aligns the read over one seed group's diagonals, clipped to the group's contig.
    fn extend(&self, s: &mut Scratch, g: &Group, m: usize) -> Option<Hit> {
        let reference = self.index.reference();
        // A group smeared over many diagonals (a tandem repeat) is aligned around its centre with
        // a bounded band, so one odd read cannot make the aligner's work quadratic.
        let half = ((g.dmax - g.dmin) / 2) as usize;
        let spread = half.min(MAX_EXTRA_BAND);
        // A group wider than the band can cover (a tandem array, seeds from every copy) is
        // aligned around its densest diagonal, where the read matches its copy best, rather than
        // around the middle of the array.
        let centre = if g.is_wide() {
            g.peak
        } else {
            g.dmin + (g.dmax - g.dmin) / 2
        };
        let band = self.opts.band + spread;
        let probe = (centre + m as i64 / 2).clamp(0, reference.total_len() as i64 - 1) as u64;
        let (ci, _) = reference.locate(probe)?;
        let contig = &reference.contigs()[ci];
        let cstart = contig.offset as i64;
        let cend = cstart + contig.len as i64;
        let ws = (centre - band as i64).max(cstart);
        let we = (centre + m as i64 + band as i64).min(cend);
        if we <= ws {
            return None;
        }
        s.window.clear();
        reference.fetch(ws as u64, (we - ws) as u64, &mut s.window);
        let read = if g.reverse { &s.rc } else { &s.fwd };
        let diag = centre - ws;
        let sc = &self.opts.scoring;
        let ungapped = if g.dmin == g.dmax && diag >= 0 {
            align_ungapped(read, &s.window, diag as usize, sc)
                .filter(|a| a.mismatches <= UNGAPPED_MAX_MISMATCHES)
        } else {
            None
        };
        let aln: Alignment = match ungapped {
            Some(a) => a,
            // Seeds on one diagonal: the fill's answer, usually without filling.
            None if g.dmin == g.dmax && diag >= 0 => {
                s.aligner
                    .align_on_diagonal(read, &s.window, diag as usize, band, sc)?
            }
            None => s.aligner.align(read, &s.window, diag as isize, band, sc)?,
        };
        Some(Hit {
            contig: ci,
            pos: (ws - cstart) as u64 + aln.ref_start as u64,
            reverse: g.reverse,
            nm: aln.nm(),
            score: aln.score,
            cigar: aln.cigar,
            mapq: 0,
        })
    }
}

/// FNV-1a of the read name: a per-read value that does not depend on batching or threads.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// Sorts hits best first, merges hits that are the same placement, and sets the best hit's MAPQ.
/// Among equally good placements the primary is chosen by `tie_hash`, so reads from a repeat are
/// spread over its copies (as BWA and minimap2 do) instead of piling onto the first copy.
fn rank(c: &mut Candidates, m: usize, sc: &Scoring, tie_hash: u64) {
    c.hits.sort_by(|a, b| {
        b.score
            .cmp(&a.score)
            .then(a.contig.cmp(&b.contig))
            .then(a.pos.cmp(&b.pos))
            .then(a.reverse.cmp(&b.reverse))
    });
    let near = (m / 2) as u64;
    let mut kept: Vec<Hit> = Vec::with_capacity(c.hits.len());
    for h in c.hits.drain(..) {
        let dup = kept.iter().any(|k| {
            k.contig == h.contig && k.reverse == h.reverse && k.pos.abs_diff(h.pos) < near
        });
        if !dup {
            kept.push(h);
        }
    }
    c.hits = kept;
    let Some(best) = c.hits.first().map(|h| h.score) else {
        return;
    };
    let extended_ties = c.hits.iter().filter(|h| h.score == best).count();
    c.hits.swap(0, (tie_hash % extended_ties as u64) as usize);
    let ties = extended_ties as u32 + c.unextended_ties;
    let mapq = if ties > 1 {
        0
    } else {
        match c.hits.get(1) {
            None => MAX_MAPQ,
            Some(second) => {
                let unit = (sc.matched + sc.mismatch).max(1);
                let q = (best - second.score) * MAPQ_PER_MISMATCH / unit;
                q.clamp(0, i32::from(MAX_MAPQ)) as u8
            }
        }
    };
    c.hits[0].mapq = mapq;
}

/// Chooses the placements of two mates: the best-scoring proper pair when it costs at most
/// [`PAIR_PENALTY`] against the mates' separate bests, otherwise each mate's own best.
fn pair_up(a: &Candidates, b: &Candidates, window: InsertWindow) -> PairMapping {
    let best_a = a.hits.first().map_or(0, |h| h.score);
    let best_b = b.hits.first().map_or(0, |h| h.score);
    // Among equally scored proper pairs (mates in a repeat), the insert nearest the middle of
    // the window is the likelier one; the pair stays ambiguous (MAPQ 0) all the same.
    let middle = window.min / 2 + window.max / 2;
    let mut chosen: Option<(i32, u64, usize, usize)> = None;
    let mut equal_pairs = 0u32;
    for (i, x) in a.hits.iter().enumerate() {
        for (j, y) in b.hits.iter().enumerate() {
            let Some(insert) = insert(x, y).filter(|v| (window.min..=window.max).contains(v))
            else {
                continue;
            };
            let sum = x.score + y.score;
            let off = insert.abs_diff(middle);
            match chosen {
                Some((s, _, _, _)) if sum < s => {}
                Some((s, o, _, _)) if sum == s => {
                    equal_pairs += 1;
                    if off < o {
                        chosen = Some((sum, off, i, j));
                    }
                }
                _ => {
                    chosen = Some((sum, off, i, j));
                    equal_pairs = 1;
                }
            }
        }
    }
    match chosen {
        Some((sum, _, i, j)) if sum >= best_a + best_b - PAIR_PENALTY => {
            let pick = |c: &Candidates, n: usize| {
                let mut h = c.hits[n].clone();
                // A placement other than the mate's own best, or one of several equally good
                // pairs, is only as certain as the pairing: report it as ambiguous.
                if n != 0 || equal_pairs > 1 {
                    h.mapq = 0;
                }
                h
            };
            PairMapping {
                first: Some(pick(a, i)),
                second: Some(pick(b, j)),
                proper: true,
            }
        }
        _ => PairMapping {
            first: a.hits.first().cloned(),
            second: b.hits.first().cloned(),
            proper: false,
        },
    }
}

/// Same contig, opposite strands, forward mate leftmost, outer distance inside the window.
pub fn is_proper(x: &Hit, y: &Hit, window: InsertWindow) -> bool {
    insert(x, y).is_some_and(|insert| (window.min..=window.max).contains(&insert))
}

/// Outer distance of two mates on one contig facing each other, forward mate leftmost.
fn insert(x: &Hit, y: &Hit) -> Option<u64> {
    if x.contig != y.contig || x.reverse == y.reverse {
        return None;
    }
    let (f, r) = if x.reverse { (y, x) } else { (x, y) };
    r.end().checked_sub(f.pos)
}

fn estimate_window<'h>(
    pairs: impl Iterator<Item = (Option<&'h Hit>, Option<&'h Hit>)>,
) -> InsertWindow {
    let wide = InsertWindow {
        min: 0,
        max: u64::MAX,
    };
    let mut inserts: Vec<u64> = pairs
        .filter_map(|(a, b)| {
            let (a, b) = (a?, b?);
            if a.mapq < 30 || b.mapq < 30 || !is_proper(a, b, wide) {
                return None;
            }
            Some(a.end().max(b.end()) - a.pos.min(b.pos))
        })
        .collect();
    if inserts.len() < MIN_PAIRS_FOR_ESTIMATE {
        return DEFAULT_INSERT;
    }
    inserts.sort_unstable();
    let q1 = inserts[inserts.len() / 4];
    let q3 = inserts[inserts.len() * 3 / 4];
    let iqr = q3 - q1;
    InsertWindow {
        min: q1.saturating_sub(3 * iqr),
        max: q3 + 3 * iqr,
    }
}

/// Applies `f` to every item on up to `threads` threads, keeping input order.
fn par_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&mut Scratch, &T) -> R + Sync,
) -> Result<Vec<R>, MapError> {
    let chunks = items.len().div_ceil(CHUNK);
    let threads = threads.clamp(1, chunks.max(1));
    if threads == 1 {
        let mut s = Scratch::default();
        return Ok(items.iter().map(|x| f(&mut s, x)).collect());
    }
    let next = AtomicUsize::new(0);
    let mut parts: Vec<(usize, Vec<R>)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                sc.spawn(|| {
                    let mut s = Scratch::default();
                    let mut done = Vec::new();
                    loop {
                        let c = next.fetch_add(1, Ordering::Relaxed);
                        if c >= chunks {
                            break;
                        }
                        let part = &items[c * CHUNK..((c + 1) * CHUNK).min(items.len())];
                        done.push((c, part.iter().map(|x| f(&mut s, x)).collect()));
                    }
                    done
                })
            })
            .collect();
        let mut all = Vec::with_capacity(chunks);
        for h in handles {
            all.extend(h.join().map_err(|_| MapError::ThreadFailed)?);
        }
        Ok::<_, MapError>(all)
    })?;
    parts.sort_unstable_by_key(|(c, _)| *c);
    // Sized once and filled part by part, each part freed as it is moved: collecting the
    // flattened parts would grow the result by doubling, copying it while the parts still live.
    let mut out = Vec::with_capacity(items.len());
    for (_, v) in parts {
        out.extend(v);
    }
    Ok(out)
}
