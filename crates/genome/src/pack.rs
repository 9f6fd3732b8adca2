//! The 2-bit packed reference: every contig's bases laid end to end in one global coordinate space,
//! four bases per byte, with the names, offsets and lengths of the contigs and the runs of
//! ambiguous bases (`N` and any other non-ACGT letter) kept apart so that they never seed and
//! always score as a mismatch.
//!
//! Base codes used throughout the crate: `A=0, C=1, G=2, T=3`, and [`AMBIGUOUS`] (4) for anything
//! else; the complement of a code `c < 4` is `3 - c`.

use thiserror::Error;

/// Code of an ambiguous base (`N` or any IUPAC letter other than A, C, G, T).
pub const AMBIGUOUS: u8 = 4;

/// Longest contig name accepted; SAM allows any printable name, this bound keeps a corrupt index
/// from asking for a huge allocation.
pub const MAX_NAME_LEN: usize = 1 << 16;

/// Why a contig was refused.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum PackError {
    /// The contig has no bases.
    #[error("contig {name:?} is empty")]
    EmptyContig {
        /// The contig's name.
        name: String,
    },
    /// The name is empty, too long, or holds whitespace or control characters (SAM forbids them).
    #[error("contig name {name:?} is not a valid SAM reference name")]
    BadName {
        /// The offending name.
        name: String,
    },
    /// Two contigs share a name.
    #[error("contig name {name:?} appears twice")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
}

/// One contig of the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contig {
    /// Name as in the FASTA header (up to the first whitespace).
    pub name: String,
    /// Start of the contig in the global coordinate space.
    pub offset: u64,
    /// Number of bases.
    pub len: u64,
}

/// The packed reference.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedRef {
    contigs: Vec<Contig>,
    packed: Vec<u8>,
    /// `(global start, length)` of each maximal run of ambiguous bases, sorted by start.
    ambiguous_runs: Vec<(u64, u64)>,
    total_len: u64,
}

/// Maps an ASCII base to its code.
#[inline]
pub fn encode_base(b: u8) -> u8 {
    match b {
        b'A' | b'a' => 0,
        b'C' | b'c' => 1,
        b'G' | b'g' => 2,
        b'T' | b't' => 3,
        _ => AMBIGUOUS,
    }
}

/// Maps a code back to an upper-case ASCII base.
#[inline]
pub fn decode_base(c: u8) -> u8 {
    match c {
        0 => b'A',
        1 => b'C',
        2 => b'G',
        3 => b'T',
        _ => b'N',
    }
}

/// Reverse complement of a code sequence, in place.
pub fn reverse_complement_codes(codes: &mut [u8]) {
    codes.reverse();
    for c in codes.iter_mut() {
        if *c < AMBIGUOUS {
            *c = 3 - *c;
        }
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_graphic())
        && !name.starts_with('*')
        && !name.starts_with('=')
}

impl PackedRef {
    /// An empty reference.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a contig given as ASCII bases (any case; letters other than ACGT become ambiguous).
    pub fn push_contig(&mut self, name: &str, seq: &[u8]) -> Result<(), PackError> {
        if !valid_name(name) {
            return Err(PackError::BadName {
                name: name.to_string(),
            });
        }
        if seq.is_empty() {
            return Err(PackError::EmptyContig {
                name: name.to_string(),
            });
        }
        if self.contigs.iter().any(|c| c.name == name) {
            return Err(PackError::DuplicateName {
                name: name.to_string(),
            });
        }
        let offset = self.total_len;
        let needed = (offset + seq.len() as u64).div_ceil(4) as usize;
        self.packed.resize(needed, 0);
        let mut run_start: Option<u64> = None;
        for (i, &b) in seq.iter().enumerate() {
            let g = offset + i as u64;
            let code = encode_base(b);
            if code == AMBIGUOUS {
                run_start.get_or_insert(g);
            } else {
                if let Some(s) = run_start.take() {
                    self.ambiguous_runs.push((s, g - s));
                }
                self.packed[(g >> 2) as usize] |= code << ((g & 3) * 2);
            }
        }
        let end = offset + seq.len() as u64;
        if let Some(s) = run_start {
            self.ambiguous_runs.push((s, end - s));
        }
        self.contigs.push(Contig {
            name: name.to_string(),
            offset,
            len: seq.len() as u64,
        });
        self.total_len = end;
        Ok(())
    }

    /// Rebuilds a reference from its stored parts; the caller (the index loader) has checked that
    /// the parts are consistent.
    pub(crate) fn from_parts(
        contigs: Vec<Contig>,
        packed: Vec<u8>,
        ambiguous_runs: Vec<(u64, u64)>,
        total_len: u64,
    ) -> Self {
        Self {
            contigs,
            packed,
            ambiguous_runs,
            total_len,
        }
    }

    /// The contigs in input order.
    pub fn contigs(&self) -> &[Contig] {
        &self.contigs
    }

    /// Total number of bases over all contigs.
    pub fn total_len(&self) -> u64 {
        self.total_len
    }

    /// The packed bases, four per byte, lowest bits first; ambiguous bases hold 0 here.
    pub fn packed_bytes(&self) -> &[u8] {
        &self.packed
    }

    /// The runs of ambiguous bases as `(global start, length)`, sorted.
    pub fn ambiguous_runs(&self) -> &[(u64, u64)] {
        &self.ambiguous_runs
    }

    /// The contig holding global position `g`, with the offset of `g` inside it.
    pub fn locate(&self, g: u64) -> Option<(usize, u64)> {
        if g >= self.total_len {
            return None;
        }
        let i = self.contigs.partition_point(|c| c.offset <= g) - 1;
        Some((i, g - self.contigs[i].offset))
    }

    /// Code of the base at global position `g` (which must be below [`Self::total_len`]),
    /// ignoring ambiguity: use [`Self::fetch`] when N runs matter.
    #[inline]
    pub(crate) fn raw_code(&self, g: u64) -> u8 {
        (self.packed[(g >> 2) as usize] >> ((g & 3) * 2)) & 3
    }

    /// Appends to `out` the codes of global positions `start..start+len`, clipped to the
    /// reference, with ambiguous bases as [`AMBIGUOUS`].
    pub fn fetch(&self, start: u64, len: u64, out: &mut Vec<u8>) {
        let end = start.saturating_add(len).min(self.total_len);
        if start >= end {
            return;
        }
        let base = out.len();
        out.extend((start..end).map(|g| self.raw_code(g)));
        let first = self
            .ambiguous_runs
            .partition_point(|&(s, l)| s + l <= start);
        for &(s, l) in &self.ambiguous_runs[first..] {
            if s >= end {
                break;
            }
            let a = s.max(start);
            let b = (s + l).min(end);
            for g in a..b {
                out[base + (g - start) as usize] = AMBIGUOUS;
            }
        }
    }

    /// Like [`Self::fetch`] but appends the reverse complement of the window.
    pub fn fetch_revcomp(&self, start: u64, len: u64, out: &mut Vec<u8>) {
        let base = out.len();
        self.fetch(start, len, out);
        reverse_complement_codes(&mut out[base..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_marks_ambiguous_and_spans_contigs() {
        let mut r = PackedRef::new();
        r.push_contig("a", b"ACGTNNacgt").unwrap();
        r.push_contig("b", b"GGRTT").unwrap();
        let mut out = Vec::new();
        r.fetch(0, 15, &mut out);
        assert_eq!(out, vec![0, 1, 2, 3, 4, 4, 0, 1, 2, 3, 2, 2, 4, 3, 3]);
        let text: Vec<u8> = out.iter().map(|&c| decode_base(c)).collect();
        assert_eq!(text, b"ACGTNNACGTGGNTT");
        assert_eq!(r.locate(11), Some((1, 1)));
        assert_eq!(r.locate(15), None);
        out.clear();
        r.fetch_revcomp(10, 5, &mut out);
        assert_eq!(out, vec![0, 0, 4, 1, 1]);
        assert_eq!(r.ambiguous_runs(), &[(4, 2), (12, 1)]);
    }

    #[test]
    fn bad_contigs_are_refused() {
        let mut r = PackedRef::new();
        assert!(matches!(
            r.push_contig("x y", b"A"),
            Err(PackError::BadName { .. })
        ));
        assert!(matches!(
            r.push_contig("x", b""),
            Err(PackError::EmptyContig { .. })
        ));
        r.push_contig("x", b"A").unwrap();
        assert!(matches!(
            r.push_contig("x", b"A"),
            Err(PackError::DuplicateName { .. })
        ));
    }
}
