//! SAM and PAF output for [`Mapping`]s and [`PairMapping`]s.
//!
//! SAM follows the v1 specification as samtools reads it: `@HD`, one `@SQ` per contig, `@PG`;
//! 1-based POS; SEQ and QUAL reverse-complemented for reverse-strand hits; RNEXT/PNEXT/TLEN for
//! pairs (TLEN positive for the leftmost mate); `NM` and `AS` tags on mapped records. PAF is
//! minimap2's pairwise format (mapped records only, `tp`, `NM`, `AS` and `cg` tags).

use crate::map::{Hit, Mapping, PairMapping, Read};
use crate::pack::PackedRef;
use std::io::{self, Write};
use thiserror::Error;

/// Why a record could not be written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SamError {
    /// The writer failed.
    #[error("writing alignments: {0}")]
    Io(#[from] io::Error),
    /// The read cannot be represented in SAM.
    #[error("read {name:?}: {detail}")]
    BadRead {
        /// Read name.
        name: String,
        /// What is wrong.
        detail: String,
    },
}

const PAIRED: u16 = 0x1;
const PROPER: u16 = 0x2;
const UNMAPPED: u16 = 0x4;
const MATE_UNMAPPED: u16 = 0x8;
const REVERSE: u16 = 0x10;
const MATE_REVERSE: u16 = 0x20;
const FIRST: u16 = 0x40;
const SECOND: u16 = 0x80;

/// Writes the header: `@HD`, `@SQ` for every contig, `@PG` with `command_line`.
pub fn write_header<W: Write>(
    w: &mut W,
    reference: &PackedRef,
    command_line: &str,
) -> Result<(), SamError> {
    writeln!(w, "@HD\tVN:1.6\tSO:unsorted")?;
    for c in reference.contigs() {
        writeln!(w, "@SQ\tSN:{}\tLN:{}", c.name, c.len)?;
    }
    let cl: String = command_line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    writeln!(
        w,
        "@PG\tID:kura\tPN:kura genome\tVN:{}\tCL:{cl}",
        env!("CARGO_PKG_VERSION")
    )?;
    Ok(())
}

/// Writes one single-end record.
pub fn write_single<W: Write>(
    w: &mut W,
    reference: &PackedRef,
    read: &Read,
    mapping: &Mapping,
) -> Result<(), SamError> {
    let rec = Record {
        read,
        hit: mapping.hit.as_ref(),
        mate: None,
        flag: 0,
    };
    rec.write(w, reference)
}

/// Writes the two records of a pair, first mate then second.
pub fn write_pair<W: Write>(
    w: &mut W,
    reference: &PackedRef,
    first: &Read,
    second: &Read,
    pair: &PairMapping,
) -> Result<(), SamError> {
    let (a, b) = (pair.first.as_ref(), pair.second.as_ref());
    let proper = if pair.proper && a.is_some() && b.is_some() {
        PROPER
    } else {
        0
    };
    let mate_flags = |mate: Option<&Hit>| match mate {
        None => MATE_UNMAPPED,
        Some(h) if h.reverse => MATE_REVERSE,
        Some(_) => 0,
    };
    let r1 = Record {
        read: first,
        hit: a,
        mate: Some(b),
        flag: PAIRED | proper | FIRST | mate_flags(b),
    };
    let r2 = Record {
        read: second,
        hit: b,
        mate: Some(a),
        flag: PAIRED | proper | SECOND | mate_flags(a),
    };
    r1.write(w, reference)?;
    r2.write(w, reference)
}

struct Record<'a> {
    read: &'a Read,
    hit: Option<&'a Hit>,
    /// `Some(mate's hit)` for paired reads.
    mate: Option<Option<&'a Hit>>,
    flag: u16,
}

fn qname(read: &Read) -> Result<&str, SamError> {
    let name = read.name.split_ascii_whitespace().next().unwrap_or("");
    let ok = !name.is_empty()
        && name.len() <= 254
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b'@');
    if ok {
        Ok(name)
    } else {
        Err(bad(read, "name is not a valid SAM QNAME"))
    }
}

fn bad(read: &Read, detail: &str) -> SamError {
    SamError::BadRead {
        name: read.name.clone(),
        detail: detail.to_string(),
    }
}

fn complement(b: u8) -> u8 {
    match b {
        b'A' => b'T',
        b'C' => b'G',
        b'G' => b'C',
        b'T' => b'A',
        b'a' => b't',
        b'c' => b'g',
        b'g' => b'c',
        b't' => b'a',
        _ => b'N',
    }
}

fn check_read(read: &Read) -> Result<(), SamError> {
    if read.seq.is_empty() {
        return Err(bad(read, "empty sequence"));
    }
    if !read.seq.iter().all(|b| b.is_ascii_alphabetic()) {
        return Err(bad(read, "sequence holds a character that is not a letter"));
    }
    if !read.qual.is_empty() && read.qual.len() != read.seq.len() {
        return Err(bad(read, "quality length differs from sequence length"));
    }
    if !read.qual.iter().all(|&q| (b'!'..=b'~').contains(&q)) {
        return Err(bad(read, "quality outside Phred+33 range"));
    }
    Ok(())
}

impl Record<'_> {
    fn write<W: Write>(&self, w: &mut W, reference: &PackedRef) -> Result<(), SamError> {
        check_read(self.read)?;
        let name = qname(self.read)?;
        // Mates share one QNAME in SAM (it names the template); FASTQ pairs often tell them
        // apart with `/1` and `/2`, which minimap2, bwa and bowtie2 drop too.
        let name = if self.mate.is_some() {
            crate::fastq::mate_base_name(name)
        } else {
            name
        };
        let mut flag = self.flag;
        let mate = self.mate.flatten();
        // An unmapped read with a mapped mate takes the mate's place, as the SAM spec asks.
        let place = self.hit.or(mate);
        if self.hit.is_none() {
            flag |= UNMAPPED;
        }
        if self.hit.is_some_and(|h| h.reverse) {
            flag |= REVERSE;
        }
        let contig_name = |h: &Hit| reference.contigs()[h.contig].name.as_str();
        let (rname, pos) = match place {
            Some(h) => (contig_name(h), h.pos + 1),
            None => ("*", 0),
        };
        let (mapq, cigar) = match self.hit {
            Some(h) => (h.mapq, h.cigar.to_string()),
            None => (0, "*".to_string()),
        };
        let (rnext, pnext, tlen) = match (self.mate, mate) {
            (Some(_), Some(m)) => {
                let same = place.is_some_and(|p| p.contig == m.contig);
                let rnext = if same { "=" } else { contig_name(m) };
                let tlen = match self.hit {
                    Some(h) if h.contig == m.contig => {
                        let span = (h.end().max(m.end()) - h.pos.min(m.pos)) as i64;
                        let leftmost = h.pos < m.pos || (h.pos == m.pos && self.flag & FIRST != 0);
                        if leftmost {
                            span
                        } else {
                            -span
                        }
                    }
                    _ => 0,
                };
                (rnext, m.pos + 1, tlen)
            }
            (Some(None), None) if self.hit.is_some() => ("=", pos, 0),
            _ => ("*", 0, 0),
        };
        let reverse = self.hit.is_some_and(|h| h.reverse);
        let (seq, qual): (Vec<u8>, Vec<u8>) = if reverse {
            (
                self.read.seq.iter().rev().map(|&b| complement(b)).collect(),
                self.read.qual.iter().rev().copied().collect(),
            )
        } else {
            (self.read.seq.clone(), self.read.qual.clone())
        };
        write!(
            w,
            "{name}\t{flag}\t{rname}\t{pos}\t{mapq}\t{cigar}\t{rnext}\t{pnext}\t{tlen}\t"
        )?;
        w.write_all(&seq)?;
        w.write_all(b"\t")?;
        if qual.is_empty() {
            w.write_all(b"*")?;
        } else {
            w.write_all(&qual)?;
        }
        if let Some(h) = self.hit {
            write!(w, "\tNM:i:{}\tAS:i:{}", h.nm, h.score)?;
        }
        w.write_all(b"\n")?;
        Ok(())
    }
}

/// Writes the PAF line of a single-end read; unmapped reads write nothing.
pub fn write_paf<W: Write>(
    w: &mut W,
    reference: &PackedRef,
    read: &Read,
    mapping: &Mapping,
) -> Result<(), SamError> {
    check_read(read)?;
    let Some(h) = &mapping.hit else {
        return Ok(());
    };
    let name = qname(read)?;
    let contig = &reference.contigs()[h.contig];
    let ops = &h.cigar.0;
    let clip = |op: Option<&(crate::align::CigarOp, u32)>| match op {
        Some(&(crate::align::CigarOp::SoftClip, n)) => u64::from(n),
        _ => 0,
    };
    let (lead, trail) = (clip(ops.first()), clip(ops.last()));
    let qlen = read.seq.len() as u64;
    // The CIGAR runs along the reference; on the reverse strand its leading clip is the read's end.
    let (qstart, qend) = if h.reverse {
        (trail, qlen - lead)
    } else {
        (lead, qlen - trail)
    };
    let block: u64 = ops
        .iter()
        .filter(|(op, _)| *op != crate::align::CigarOp::SoftClip)
        .map(|&(_, n)| u64::from(n))
        .sum();
    let aligned: u64 = ops
        .iter()
        .filter(|(op, _)| *op == crate::align::CigarOp::Match)
        .map(|&(_, n)| u64::from(n))
        .sum();
    let matches = aligned.saturating_sub(u64::from(h.nm) - indel_bases(h));
    let cg: String = h
        .cigar
        .0
        .iter()
        .filter(|(op, _)| *op != crate::align::CigarOp::SoftClip)
        .map(|&(op, n)| format!("{n}{}", op.letter()))
        .collect();
    writeln!(
        w,
        "{name}\t{qlen}\t{qstart}\t{qend}\t{}\t{}\t{}\t{}\t{}\t{matches}\t{block}\t{}\ttp:A:P\tNM:i:{}\tAS:i:{}\tcg:Z:{cg}",
        if h.reverse { '-' } else { '+' },
        contig.name,
        contig.len,
        h.pos,
        h.end(),
        h.mapq,
        h.nm,
        h.score,
    )?;
    Ok(())
}

fn indel_bases(h: &Hit) -> u64 {
    h.cigar
        .0
        .iter()
        .filter(|(op, _)| matches!(op, crate::align::CigarOp::Ins | crate::align::CigarOp::Del))
        .map(|&(_, n)| u64::from(n))
        .sum()
}
