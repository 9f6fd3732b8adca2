//! True read origins from simulated read names, and scoring of SAM output (kura's or
//! minimap2's) against them.
//!
//! Names are pywgsim's (and [`crate::simulate`]'s): `CONTIG|START|END|e:s:i|e:s:i|IDX`, split
//! from the right into six fields, so contig names may themselves contain `|`. In pywgsim both
//! mates of a pair carry the same name; the fragment's forward-strand read starts at START (the
//! 1-based leftmost reference base) and its reverse-strand read ends at END (the 1-based
//! rightmost reference base). Which FASTQ file holds the forward read is random per pair, so the
//! true coordinate of a read follows from the strand it came from, not from its mate number: a
//! read aligned forward is scored by its leftmost aligned base (SAM `POS`) against START, a read
//! aligned reverse by its rightmost aligned base (`POS` + reference length of the CIGAR − 1)
//! against END. A read aligned to the wrong strand is therefore compared with the other end of
//! its fragment and counts as misplaced, as it should.
//!
//! A primary alignment is correct when its contig is the true one and that coordinate is within
//! [`ScoreOptions::tolerance`] (10 bp) of the truth. Secondary (0x100) and supplementary (0x800)
//! records are skipped. For paired records the mates are matched by name and checked for
//! consistency (mate fields agree with the mate's own record, opposite strands on one contig)
//! and for the proper-pair flag (0x2): set exactly when both mates are correct.

use std::collections::HashMap;
use std::fmt;
use std::io::BufRead;

/// Why a name or SAM text could not be scored.
#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    /// A read name without a simulated origin.
    #[error("read name {0:?} has no simulated origin (expected CONTIG|START|END|...|...|IDX as pywgsim writes)")]
    Name(String),
    /// A malformed SAM line.
    #[error("{path}:{line}: {msg}")]
    Sam {
        /// The SAM file as given.
        path: String,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        msg: String,
    },
    /// Reading the SAM text failed.
    #[error("{path}: read failed: {source}")]
    Io {
        /// The SAM file as given.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// Where a simulated read pair came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrueOrigin {
    /// The contig.
    pub contig: String,
    /// 1-based leftmost reference base of the forward-strand read.
    pub start: u64,
    /// 1-based rightmost reference base of the reverse-strand read.
    pub end: u64,
}

impl TrueOrigin {
    /// Parses a simulated read name (a `/1` or `/2` suffix is ignored).
    ///
    /// # Errors
    /// [`TruthError::Name`] when the name does not have the six fields or START/END are not
    /// numbers.
    pub fn parse(name: &str) -> Result<Self, TruthError> {
        let bad = || TruthError::Name(name.to_string());
        let base = crate::fastq::mate_base_name(name);
        let mut it = base.rsplitn(6, '|');
        let (_idx, _e2, _e1) = (it.next(), it.next(), it.next());
        let end = it.next().ok_or_else(bad)?;
        let start = it.next().ok_or_else(bad)?;
        let contig = it.next().ok_or_else(bad)?;
        if contig.is_empty() {
            return Err(bad());
        }
        Ok(Self {
            contig: contig.to_string(),
            start: start.parse().map_err(|_| bad())?,
            end: end.parse().map_err(|_| bad())?,
        })
    }

    /// The true coordinate of the read of this pair that lies on the given strand: START for
    /// the forward read (its leftmost base), END for the reverse read (its rightmost base).
    pub fn coordinate(&self, reverse: bool) -> u64 {
        if reverse {
            self.end
        } else {
            self.start
        }
    }

    /// Whether an alignment to `contig` spanning 1-based `leftmost..=rightmost` on the given
    /// strand is within `tolerance` of this origin.
    pub fn is_correct(
        &self,
        contig: &str,
        leftmost: u64,
        rightmost: u64,
        reverse: bool,
        tolerance: u64,
    ) -> bool {
        let got = if reverse { rightmost } else { leftmost };
        contig == self.contig && got.abs_diff(self.coordinate(reverse)) <= tolerance
    }
}

/// Reference bases a SAM CIGAR string covers (`M`, `D`, `N`, `=`, `X`).
///
/// # Errors
/// A message for a malformed CIGAR.
pub fn cigar_ref_len(cigar: &str) -> Result<u64, String> {
    let mut n: u64 = 0;
    let mut total = 0;
    let mut digits = 0;
    for c in cigar.bytes() {
        if c.is_ascii_digit() {
            n = n
                .checked_mul(10)
                .and_then(|x| x.checked_add(u64::from(c - b'0')))
                .ok_or_else(|| format!("CIGAR {cigar:?}: length overflows"))?;
            digits += 1;
            continue;
        }
        if digits == 0 {
            return Err(format!("CIGAR {cigar:?}: operation without a length"));
        }
        match c {
            b'M' | b'D' | b'N' | b'=' | b'X' => total += n,
            b'I' | b'S' | b'H' | b'P' => {}
            _ => {
                return Err(format!(
                    "CIGAR {cigar:?}: unknown operation {:?}",
                    c as char
                ))
            }
        }
        n = 0;
        digits = 0;
    }
    if digits != 0 || cigar.is_empty() {
        return Err(format!("CIGAR {cigar:?}: incomplete"));
    }
    Ok(total)
}

/// Scoring thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreOptions {
    /// Largest distance from the true coordinate that still counts as correct.
    pub tolerance: u64,
    /// MAPQ at and above which a misplaced read counts as confidently misplaced.
    pub min_mapq: u8,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        Self {
            tolerance: 10,
            min_mapq: 20,
        }
    }
}

/// Accuracy of a SAM file against the truth in its read names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Score {
    /// Primary records (reads; both mates count for pairs).
    pub total: u64,
    /// Primary records that are mapped.
    pub mapped: u64,
    /// Mapped records placed correctly.
    pub correct: u64,
    /// Mapped records placed wrongly.
    pub misplaced: u64,
    /// Misplaced records with MAPQ at or above [`ScoreOptions::min_mapq`].
    pub misplaced_confident: u64,
    /// Unmapped records.
    pub unmapped: u64,
    /// Pairs seen with both mates (records with flag 0x1).
    pub pairs: u64,
    /// Pairs flagged proper (0x2) with both mates correct.
    pub proper_right: u64,
    /// Pairs flagged proper although a mate is misplaced or unmapped.
    pub proper_wrong: u64,
    /// Pairs with both mates correct but not flagged proper.
    pub proper_missed: u64,
    /// Pairs whose mate fields (RNEXT, PNEXT, 0x20, 0x40/0x80, 0x8) disagree with the mate's own
    /// record, or whose proper flag differs between the mates.
    pub mate_inconsistent: u64,
    /// Paired records whose mate never appeared.
    pub orphans: u64,
}

impl Score {
    /// Correct records as a fraction of all records.
    pub fn fraction_correct(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.correct as f64 / self.total as f64
        }
    }
}

impl fmt::Display for Score {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reads, {} mapped, {} correct ({:.3} %), {} misplaced ({} with MAPQ >= 20), {} unmapped",
            self.total,
            self.mapped,
            self.correct,
            100.0 * self.fraction_correct(),
            self.misplaced,
            self.misplaced_confident,
            self.unmapped
        )?;
        if self.pairs > 0 {
            write!(
                f,
                "; {} pairs: {} proper and right, {} flagged proper wrongly, {} proper missed, {} inconsistent mates",
                self.pairs, self.proper_right, self.proper_wrong, self.proper_missed, self.mate_inconsistent
            )?;
            if self.orphans > 0 {
                write!(f, ", {} mates missing", self.orphans)?;
            }
        }
        Ok(())
    }
}

/// The parts of a primary paired record the mate check needs.
#[derive(Debug, Clone)]
struct MateView {
    flag: u16,
    rname: String,
    pos: u64,
    rnext: String,
    pnext: u64,
    correct: bool,
}

/// Scores SAM text (header lines are skipped).
///
/// # Errors
/// Read failures, malformed lines and read names without a simulated origin, with the line.
pub fn score_sam<R: BufRead>(sam: R, path: &str, opts: ScoreOptions) -> Result<Score, TruthError> {
    let mut s = Score::default();
    let mut pending: HashMap<String, MateView> = HashMap::new();
    for (i, line) in sam.lines().enumerate() {
        let line_no = i as u64 + 1;
        let line = line.map_err(|source| TruthError::Io {
            path: path.to_string(),
            source,
        })?;
        let err = |msg: String| TruthError::Sam {
            path: path.to_string(),
            line: line_no,
            msg,
        };
        if line.starts_with('@') || line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 11 {
            return Err(err(format!(
                "{} fields, a SAM record has at least 11",
                f.len()
            )));
        }
        let flag: u16 = f[1]
            .parse()
            .map_err(|_| err(format!("FLAG {:?} is not a number", f[1])))?;
        if flag & 0x900 != 0 {
            continue;
        }
        s.total += 1;
        let pos: u64 = f[3]
            .parse()
            .map_err(|_| err(format!("POS {:?} is not a number", f[3])))?;
        let mapq: u8 = f[4]
            .parse()
            .map_err(|_| err(format!("MAPQ {:?} is not a number", f[4])))?;
        let pnext: u64 = f[7]
            .parse()
            .map_err(|_| err(format!("PNEXT {:?} is not a number", f[7])))?;
        let mut correct = false;
        if flag & 0x4 != 0 {
            s.unmapped += 1;
        } else {
            s.mapped += 1;
            if pos == 0 || f[2] == "*" {
                return Err(err("mapped record without RNAME/POS".into()));
            }
            let truth = TrueOrigin::parse(f[0]).map_err(|e| err(e.to_string()))?;
            let span = cigar_ref_len(f[5]).map_err(err)?;
            let rightmost = pos + span.max(1) - 1;
            correct = truth.is_correct(f[2], pos, rightmost, flag & 0x10 != 0, opts.tolerance);
            if correct {
                s.correct += 1;
            } else {
                s.misplaced += 1;
                if mapq >= opts.min_mapq {
                    s.misplaced_confident += 1;
                }
            }
        }
        if flag & 0x1 != 0 {
            let rnext = if f[6] == "=" { f[2] } else { f[6] };
            let view = MateView {
                flag,
                rname: f[2].to_string(),
                pos,
                rnext: rnext.to_string(),
                pnext,
                correct,
            };
            match pending.remove(f[0]) {
                None => {
                    pending.insert(f[0].to_string(), view);
                }
                Some(mate) => score_pair(&mut s, &mate, &view),
            }
        }
    }
    s.orphans = pending.len() as u64;
    Ok(s)
}

fn score_pair(s: &mut Score, a: &MateView, b: &MateView) {
    s.pairs += 1;
    let proper = a.flag & 0x2 != 0;
    let both_correct = a.correct && b.correct;
    match (proper, both_correct) {
        (true, true) => s.proper_right += 1,
        (true, false) => s.proper_wrong += 1,
        (false, true) => s.proper_missed += 1,
        (false, false) => {}
    }
    let points_at = |x: &MateView, mate: &MateView| {
        let mate_unmapped = mate.flag & 0x4 != 0;
        let unmapped_flag_ok = (x.flag & 0x8 != 0) == mate_unmapped;
        let strand_ok = mate_unmapped || (x.flag & 0x20 != 0) == (mate.flag & 0x10 != 0);
        let place_ok = mate_unmapped || (x.rnext == mate.rname && x.pnext == mate.pos);
        unmapped_flag_ok && strand_ok && place_ok
    };
    let order_ok = (a.flag & 0xc0 == 0x40 && b.flag & 0xc0 == 0x80)
        || (a.flag & 0xc0 == 0x80 && b.flag & 0xc0 == 0x40);
    let proper_agrees = (a.flag & 0x2) == (b.flag & 0x2);
    if !(points_at(a, b) && points_at(b, a) && order_ok && proper_agrees) {
        s.mate_inconsistent += 1;
    }
}
