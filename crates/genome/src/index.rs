//! The minimizer index over a [`PackedRef`] and its versioned, checksummed on-disk format
//! (`docs/genome-index-format.md` draws every byte).
//!
//! Every `(w, k)`-minimizer of the reference is recorded as a canonical k-mer hashed by an
//! invertible mix, so distinct k-mers never share a hash. The file holds three flat sorted arrays
//! (distinct hashes, start offsets, positions), so saving is three sequential writes and loading is
//! three sequential reads with no per-entry allocation. In memory ([`table`]) a prefix table over
//! the top bits of the hash narrows each lookup to a few slots, and a slot keeps only the hash's
//! lower bits and, for the hashes seen once (nearly all), the position itself: 8 bytes a hash
//! instead of the file's 20, built from the file's sections as they stream in.
//!
//! The build runs on `std::thread::scope` threads: the reference is cut into 1 Mb pieces that the
//! threads take from a shared counter, each thread sorts its minimizers into buckets by the top
//! bits of the hash, and then each bucket is sorted on its own thread. Two passes with no locks and
//! no dependency beyond std; rayon would add a thread pool the rest of kura does not use.

use crate::pack::{Contig, PackedRef, AMBIGUOUS, MAX_NAME_LEN};
use kura_engine::crc32c::{crc32c, Crc32c};
use std::collections::{HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use thiserror::Error;

mod table;

pub use table::Hits;
use table::{Filler, Table};

/// First bytes of every index file.
pub const MAGIC: [u8; 8] = *b"KURAGIX\0";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes in the fixed header.
pub const HEADER_LEN: usize = 64;

const PIECE_LEN: u64 = 1 << 20;
const BUCKET_BITS: u32 = 8;
/// Fraction of distinct minimizers, the most frequent, whose hits are skipped (as minimap2 `-f`).
const SKIP_FRACTION: f64 = 0.0002;
/// Minimizers seen at most this often are never skipped, so short repeats still get seeds.
const MIN_MAX_OCC: u32 = 10;
const IO_CHUNK: usize = 1 << 16;

/// What went wrong building, saving or loading an index.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The underlying reader or writer failed.
    #[error("I/O error in index {section}: {source}")]
    Io {
        /// Which part was being read or written.
        section: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The input does not start with the index magic.
    #[error("not a kura genome index (bad magic)")]
    BadMagic,
    /// The input was written by another format version.
    #[error("unsupported index format version {found} (this build reads version {supported})")]
    UnsupportedVersion {
        /// Version found in the header.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The input ended early.
    #[error("index truncated in {section}")]
    Truncated {
        /// The part that was cut short.
        section: &'static str,
    },
    /// A stored checksum does not match the bytes.
    #[error(
        "checksum mismatch in index {section} (stored {stored:#010x}, computed {computed:#010x})"
    )]
    Checksum {
        /// The part whose checksum failed.
        section: &'static str,
        /// Checksum stored in the file.
        stored: u32,
        /// Checksum of the bytes read.
        computed: u32,
    },
    /// The bytes are intact but describe something impossible.
    #[error("malformed index {section}: {detail}")]
    Malformed {
        /// The part that is inconsistent.
        section: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// `k` or `w` out of range.
    #[error("invalid index parameters: {0}")]
    BadParams(String),
    /// The reference exceeds what the format addresses.
    #[error("reference too large for the index: {0}")]
    TooLarge(String),
}

/// Minimizer parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexParams {
    /// k-mer length, odd, 11..=31 (odd so that no k-mer is its own reverse complement).
    pub k: u8,
    /// Window: one minimizer is kept per `w` consecutive k-mers, 1..=64.
    pub w: u8,
}

impl Default for IndexParams {
    /// k=19, w=10: long enough that a 4.6 Mb bacterial genome has almost no chance hits, short
    /// enough that a 150 bp read with a few differences keeps several exact seeds.
    fn default() -> Self {
        Self { k: 19, w: 10 }
    }
}

impl IndexParams {
    fn check(&self) -> Result<(), IndexError> {
        if !(11..=31).contains(&self.k) || self.k.is_multiple_of(2) {
            return Err(IndexError::BadParams(format!(
                "k={} must be odd and in 11..=31",
                self.k
            )));
        }
        if !(1..=64).contains(&self.w) {
            return Err(IndexError::BadParams(format!(
                "w={} must be in 1..=64",
                self.w
            )));
        }
        Ok(())
    }
}

/// One minimizer: hash of the canonical k-mer, start of the k-mer, and whether the canonical form
/// is the reverse complement of the sequence as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minimizer {
    /// Invertible hash of the canonical k-mer (fits in `2k` bits).
    pub hash: u64,
    /// Offset of the k-mer's first base.
    pub pos: u32,
    /// True when the canonical k-mer is the reverse complement.
    pub rev: bool,
}

/// Invertible mix of a `2k`-bit k-mer code: odd multipliers and right xor-shifts are both
/// bijections on `2k`-bit words, so distinct k-mers keep distinct hashes.
#[inline]
fn mix(x: u64, k: u32, mask: u64) -> u64 {
    let mut x = x.wrapping_mul(0xD6E8_FEB8_6659_FD93) & mask;
    x ^= x >> k;
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15) & mask;
    x ^= x >> (k + 3).min(2 * k - 1);
    x.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) & mask
}

/// Appends the `(w, k)` minimizers of `codes` (base codes, [`AMBIGUOUS`] allowed) to `out`.
/// Windows never span an ambiguous base; a minimizer kept by several consecutive windows is
/// emitted once; ties go to the leftmost k-mer. Positions are `u32`, so only the first 2^32 − 1
/// bases are scanned (the index feeds 1 Mb pieces, the mapper single reads).
pub fn minimizers(codes: &[u8], params: IndexParams, out: &mut Vec<Minimizer>) {
    let codes = &codes[..codes.len().min(u32::MAX as usize)];
    let k = u32::from(params.k);
    let w = usize::from(params.w);
    let mask = if k >= 32 {
        u64::MAX
    } else {
        (1u64 << (2 * k)) - 1
    };
    let shift = 2 * (k - 1);
    let mut fwd = 0u64;
    let mut rev = 0u64;
    let mut valid = 0u32;
    let mut window: VecDeque<Minimizer> = VecDeque::with_capacity(w + 1);
    let mut kmers_in_run = 0usize;
    let mut last_emitted: Option<u32> = None;
    for (i, &c) in codes.iter().enumerate() {
        if c >= AMBIGUOUS {
            valid = 0;
            kmers_in_run = 0;
            window.clear();
            continue;
        }
        fwd = ((fwd << 2) | u64::from(c)) & mask;
        rev = (rev >> 2) | (u64::from(3 - c) << shift);
        valid += 1;
        if valid < k {
            continue;
        }
        let start = (i + 1 - k as usize) as u32;
        if fwd == rev {
            continue;
        }
        let (canon, is_rev) = if fwd < rev { (fwd, false) } else { (rev, true) };
        let m = Minimizer {
            hash: mix(canon, k, mask),
            pos: start,
            rev: is_rev,
        };
        while window.back().is_some_and(|b| b.hash > m.hash) {
            window.pop_back();
        }
        window.push_back(m);
        kmers_in_run += 1;
        let first_in_window = start.saturating_sub(params.w as u32 - 1);
        while window.front().is_some_and(|f| f.pos < first_in_window) {
            window.pop_front();
        }
        if kmers_in_run >= w {
            if let Some(&front) = window.front() {
                if last_emitted != Some(front.pos) {
                    out.push(front);
                    last_emitted = Some(front.pos);
                }
            }
        }
    }
}

/// The minimizer index: the packed reference plus, for every distinct minimizer hash, the sorted
/// list of its positions, each stored as `global_position << 1 | reverse` (in memory as
/// [`table`] lays them out).
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    params: IndexParams,
    max_occ: u32,
    reference: PackedRef,
    table: Table,
}

type Pair = (u64, u64);

impl Index {
    /// Indexes `reference` on `threads` threads (at least one is used).
    pub fn build(
        reference: PackedRef,
        params: IndexParams,
        threads: usize,
    ) -> Result<Self, IndexError> {
        params.check()?;
        if reference.total_len() >= 1 << 62 {
            return Err(IndexError::TooLarge(format!(
                "{} bases",
                reference.total_len()
            )));
        }
        let pieces = pieces(&reference, params);
        let threads = threads.clamp(1, 256);
        let buckets = 1usize << BUCKET_BITS;
        let hash_bits = 2 * u32::from(params.k);
        let next = AtomicUsize::new(0);
        let per_thread: Result<Vec<Vec<Vec<Pair>>>, IndexError> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine: Vec<Vec<Pair>> = vec![Vec::new(); buckets];
                        let mut codes = Vec::new();
                        let mut mins = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&(start, len)) = pieces.get(i) else {
                                break;
                            };
                            codes.clear();
                            mins.clear();
                            reference.fetch(start, len, &mut codes);
                            minimizers(&codes, params, &mut mins);
                            for m in &mins {
                                let b = (m.hash >> (hash_bits - BUCKET_BITS)) as usize;
                                let v = ((start + u64::from(m.pos)) << 1) | u64::from(m.rev);
                                mine[b].push((m.hash, v));
                            }
                        }
                        mine
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| thread_failed()))
                .collect()
        });
        // Hand each bucket's per-thread parts to one sorting thread by move, round-robin (the
        // hash spreads minimizers evenly over buckets), so every part is freed as soon as it is
        // merged and the build never holds two copies of all minimizers.
        let mut work: Vec<Vec<(usize, Vec<Vec<Pair>>)>> =
            (0..threads).map(|_| Vec::new()).collect();
        for b in 0..buckets {
            work[b % threads].push((b, Vec::with_capacity(threads)));
        }
        for mine in per_thread? {
            for (b, part) in mine.into_iter().enumerate() {
                work[b % threads][b / threads].1.push(part);
            }
        }
        let mut sorted: Vec<(usize, Vec<Pair>)> = std::thread::scope(|s| {
            let handles: Vec<_> = work
                .into_iter()
                .map(|assigned| {
                    s.spawn(move || {
                        let mut done = Vec::with_capacity(assigned.len());
                        for (b, parts) in assigned {
                            let mut all: Vec<Pair> =
                                Vec::with_capacity(parts.iter().map(Vec::len).sum());
                            for part in parts {
                                all.extend_from_slice(&part);
                            }
                            all.sort_unstable();
                            all.dedup();
                            done.push((b, all));
                        }
                        done
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(buckets);
            for h in handles {
                all.extend(h.join().map_err(|_| thread_failed())?);
            }
            Ok::<_, IndexError>(all)
        })?;
        sorted.sort_unstable_by_key(|(b, _)| *b);
        let total: usize = sorted.iter().map(|(_, v)| v.len()).sum();
        if total >= u32::MAX as usize {
            return Err(IndexError::TooLarge(format!("{total} minimizer positions")));
        }
        let mut keys = Vec::new();
        let mut starts = Vec::new();
        let mut positions = Vec::with_capacity(total);
        for (_, bucket) in sorted {
            for (h, v) in bucket {
                if keys.last() != Some(&h) {
                    keys.push(h);
                    starts.push(positions.len() as u32);
                }
                positions.push(v);
            }
        }
        starts.push(positions.len() as u32);
        check_counts(&starts)?;
        let max_occ = frequency_cutoff(&starts);
        Ok(Self::assemble(
            params, max_occ, reference, keys, starts, positions,
        ))
    }

    fn assemble(
        params: IndexParams,
        max_occ: u32,
        reference: PackedRef,
        keys: Vec<u64>,
        starts: Vec<u32>,
        positions: Vec<u64>,
    ) -> Self {
        let hash_bits = 2 * u32::from(params.k);
        let table = Table::from_arrays(keys, &starts, &positions, hash_bits, reference.total_len());
        Self {
            params,
            max_occ,
            reference,
            table,
        }
    }

    /// The minimizer parameters.
    pub fn params(&self) -> IndexParams {
        self.params
    }

    /// Minimizers with more positions than this are skipped when seeding (the top 0.02 % most
    /// frequent distinct minimizers, but never one seen 10 times or fewer).
    pub fn max_occ(&self) -> u32 {
        self.max_occ
    }

    /// The packed reference.
    pub fn reference(&self) -> &PackedRef {
        &self.reference
    }

    /// Number of distinct minimizers.
    pub fn distinct_minimizers(&self) -> usize {
        self.table.len()
    }

    /// Number of stored minimizer positions.
    pub fn total_positions(&self) -> usize {
        self.table.positions()
    }

    /// Positions of a minimizer hash, each `global_position << 1 | reverse`, in index order
    /// (empty when the hash is not indexed).
    #[inline]
    pub fn get(&self, hash: u64) -> Hits<'_> {
        self.table.get(hash)
    }

    /// Writes the index in the format of `docs/genome-index-format.md`.
    pub fn write_to<W: Write>(&self, mut w: W) -> Result<(), IndexError> {
        let r = &self.reference;
        let mut header = [0u8; HEADER_LEN];
        header[0..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        header[12] = self.params.k;
        header[13] = self.params.w;
        header[16..20].copy_from_slice(&self.max_occ.to_le_bytes());
        header[20..24].copy_from_slice(&(SECTIONS.len() as u32).to_le_bytes());
        header[24..32].copy_from_slice(&(r.contigs().len() as u64).to_le_bytes());
        header[32..40].copy_from_slice(&r.total_len().to_le_bytes());
        header[40..48].copy_from_slice(&(self.table.len() as u64).to_le_bytes());
        header[48..56].copy_from_slice(&(self.table.positions() as u64).to_le_bytes());
        header[56..60].copy_from_slice(&(r.ambiguous_runs().len() as u32).to_le_bytes());
        let crc = crc32c(&header[..60]);
        header[60..64].copy_from_slice(&crc.to_le_bytes());
        w.write_all(&header).map_err(|e| io_err("header", e))?;

        let mut contigs = Vec::new();
        for c in r.contigs() {
            contigs.extend_from_slice(&(c.name.len() as u32).to_le_bytes());
            contigs.extend_from_slice(c.name.as_bytes());
            contigs.extend_from_slice(&c.len.to_le_bytes());
        }
        write_section(&mut w, 0, &contigs)?;
        write_section(&mut w, 1, r.packed_bytes())?;
        let runs: Vec<u64> = r
            .ambiguous_runs()
            .iter()
            .flat_map(|&(s, l)| [s, l])
            .collect();
        write_words(&mut w, 2, runs.len(), runs.iter().copied())?;
        let t = &self.table;
        write_words(&mut w, 3, t.len(), t.keys())?;
        write_words(&mut w, 4, t.len() + 1, t.starts())?;
        write_words(&mut w, 5, t.positions(), t.all_positions())?;
        w.flush().map_err(|e| io_err("flush", e))
    }

    /// Reads an index written by [`Self::write_to`], checking every checksum and every structural
    /// invariant; any defect is a typed error.
    pub fn read_from<R: Read>(mut r: R) -> Result<Self, IndexError> {
        let mut header = [0u8; HEADER_LEN];
        // The magic is checked before the rest of the header is read, so a short file that is not
        // an index at all is reported as such rather than as a truncated index.
        read_exact(&mut r, &mut header[..8], "header")?;
        if header[0..8] != MAGIC {
            return Err(IndexError::BadMagic);
        }
        read_exact(&mut r, &mut header[8..], "header")?;
        let stored = le_u32(&header[60..64]);
        let computed = crc32c(&header[..60]);
        if stored != computed {
            return Err(IndexError::Checksum {
                section: "header",
                stored,
                computed,
            });
        }
        let version = le_u32(&header[8..12]);
        if version != FORMAT_VERSION {
            return Err(IndexError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let params = IndexParams {
            k: header[12],
            w: header[13],
        };
        params
            .check()
            .map_err(|e| malformed("header", e.to_string()))?;
        let max_occ = le_u32(&header[16..20]);
        let n_sections = le_u32(&header[20..24]);
        if n_sections as usize != SECTIONS.len() {
            return Err(malformed(
                "header",
                format!("{n_sections} sections, expected 6"),
            ));
        }
        let n_contigs = le_u64(&header[24..32]);
        let total_len = le_u64(&header[32..40]);
        let n_keys = le_u64(&header[40..48]);
        let n_positions = le_u64(&header[48..56]);
        let n_runs = u64::from(le_u32(&header[56..60]));
        if n_contigs == 0 || total_len == 0 || total_len >= 1 << 62 {
            return Err(malformed(
                "header",
                format!("{n_contigs} contigs of {total_len} bases"),
            ));
        }
        if n_positions >= u64::from(u32::MAX) || n_keys > n_positions {
            return Err(malformed(
                "header",
                format!("{n_keys} keys, {n_positions} positions"),
            ));
        }

        let contig_bytes = read_section(
            &mut r,
            0,
            n_contigs.saturating_mul(12 + MAX_NAME_LEN as u64),
            false,
        )?;
        let contigs = parse_contigs(&contig_bytes, n_contigs, total_len)?;
        drop(contig_bytes);
        let packed = read_section(&mut r, 1, total_len.div_ceil(4), true)?;
        let runs = read_words::<u64, _>(&mut r, 2, n_runs.saturating_mul(2))?;
        let runs: Vec<(u64, u64)> = runs.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        check_runs(&runs, total_len)?;
        let keys = read_words::<u64, _>(&mut r, 3, n_keys)?;
        let hash_limit = 1u64 << (2 * u32::from(params.k));
        if keys.windows(2).any(|p| p[0] >= p[1]) || keys.last().is_some_and(|&h| h >= hash_limit) {
            return Err(malformed(
                SECTIONS[3],
                "hashes not strictly increasing or out of range".into(),
            ));
        }
        // The offsets become each hash's count in its slot as they stream in (no array of
        // them is kept); they are judged after the section's checksum, before any position.
        let mut table = Table::new(keys, 2 * u32::from(params.k), total_len);
        let (mut prev, mut at) = (None::<u32>, 0usize);
        let mut increasing = true;
        let mut max_count = 0u32;
        read_words_with::<u32, _>(&mut r, 4, n_keys + 1, |s| {
            match prev {
                None => increasing &= s == 0,
                Some(p) => {
                    increasing &= s > p;
                    let count = s.wrapping_sub(p);
                    max_count = max_count.max(count);
                    table.set_count(at, count);
                    at += 1;
                }
            }
            prev = Some(s);
        })?;
        if !increasing || prev.map(u64::from) != Some(n_positions) {
            return Err(malformed(
                SECTIONS[4],
                "offsets not strictly increasing from 0 to the position count".into(),
            ));
        }
        check_max_count(max_count)?;
        // The positions go straight into the table (most into their hash's slot), checked as
        // they pass and the verdict given after the section's checksum, as for the others.
        let k = u64::from(params.k);
        let mut past_end = false;
        let mut fill = Filler::default();
        read_words_with::<u64, _>(&mut r, 5, n_positions, |v| {
            past_end |= (v >> 1) + k > total_len;
            fill.push(&mut table, v);
        })?;
        if past_end {
            return Err(malformed(
                SECTIONS[5],
                "a position lies past the reference".into(),
            ));
        }
        let reference = PackedRef::from_parts(contigs, packed, runs, total_len);
        Ok(Self {
            params,
            max_occ,
            reference,
            table,
        })
    }
}

/// Section names, in file order; the tag of a section is its position here.
pub const SECTIONS: [&str; 6] = [
    "contig table",
    "packed sequence",
    "ambiguous runs",
    "hashes",
    "offsets",
    "positions",
];

fn pieces(reference: &PackedRef, params: IndexParams) -> Vec<(u64, u64)> {
    let overlap = u64::from(params.k) + u64::from(params.w) - 2;
    let mut out = Vec::new();
    for c in reference.contigs() {
        let mut s = 0;
        while s < c.len {
            let e = (s + PIECE_LEN).min(c.len);
            let fetch_end = (e + overlap).min(c.len);
            out.push((c.offset + s, fetch_end - s));
            s = e;
        }
    }
    out
}

/// A single hash may hold at most 2^31 − 1 positions: the limit earlier builds kept (a count field
/// of 31 bits), so every build accepts the same files.
fn check_counts(starts: &[u32]) -> Result<(), IndexError> {
    check_max_count(starts.windows(2).map(|p| p[1] - p[0]).max().unwrap_or(0))
}

fn check_max_count(c: u32) -> Result<(), IndexError> {
    if c >= 1 << 31 {
        return Err(IndexError::TooLarge(format!(
            "one minimizer occurs {c} times"
        )));
    }
    Ok(())
}

fn frequency_cutoff(starts: &[u32]) -> u32 {
    let mut counts: Vec<u32> = starts.windows(2).map(|p| p[1] - p[0]).collect();
    if counts.is_empty() {
        return MIN_MAX_OCC;
    }
    let skip = (counts.len() as f64 * SKIP_FRACTION) as usize;
    let nth = counts.len() - 1 - skip.min(counts.len() - 1);
    let (_, &mut v, _) = counts.select_nth_unstable(nth);
    v.max(MIN_MAX_OCC)
}

fn thread_failed() -> IndexError {
    malformed("build", "an index build thread panicked".into())
}

fn io_err(section: &'static str, source: io::Error) -> IndexError {
    IndexError::Io { section, source }
}

fn malformed(section: &'static str, detail: String) -> IndexError {
    IndexError::Malformed { section, detail }
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn read_exact<R: Read>(r: &mut R, buf: &mut [u8], section: &'static str) -> Result<(), IndexError> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            IndexError::Truncated { section }
        } else {
            io_err(section, e)
        }
    })
}

fn write_section<W: Write>(w: &mut W, tag: u32, payload: &[u8]) -> Result<(), IndexError> {
    let section = SECTIONS[tag as usize];
    let mut head = [0u8; 12];
    head[0..4].copy_from_slice(&tag.to_le_bytes());
    head[4..12].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    w.write_all(&head).map_err(|e| io_err(section, e))?;
    w.write_all(payload).map_err(|e| io_err(section, e))?;
    w.write_all(&crc32c(payload).to_le_bytes())
        .map_err(|e| io_err(section, e))
}

/// A fixed-width little-endian word stored in a section.
trait Word: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

impl Word for u64 {
    const SIZE: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        le_u64(b)
    }
}

impl Word for u32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        le_u32(b)
    }
}

/// Writes a section of `count` words in bounded chunks, so saving never doubles the index in
/// memory.
fn write_words<W: Write, T: Word>(
    w: &mut W,
    tag: u32,
    count: usize,
    words: impl Iterator<Item = T>,
) -> Result<(), IndexError> {
    let section = SECTIONS[tag as usize];
    let mut head = [0u8; 12];
    head[0..4].copy_from_slice(&tag.to_le_bytes());
    head[4..12].copy_from_slice(&((count * T::SIZE) as u64).to_le_bytes());
    w.write_all(&head).map_err(|e| io_err(section, e))?;
    let mut digest = Crc32c::new();
    let mut buf = Vec::with_capacity(IO_CHUNK);
    let mut written = 0usize;
    for x in words {
        x.put(&mut buf);
        written += 1;
        if buf.len() >= IO_CHUNK {
            digest.update(&buf);
            w.write_all(&buf).map_err(|e| io_err(section, e))?;
            buf.clear();
        }
    }
    debug_assert_eq!(written, count, "section {section} word count");
    digest.update(&buf);
    w.write_all(&buf).map_err(|e| io_err(section, e))?;
    let crc = digest.finalize();
    w.write_all(&crc.to_le_bytes())
        .map_err(|e| io_err(section, e))
}

fn read_section_head<R: Read>(r: &mut R, tag: u32) -> Result<u64, IndexError> {
    let section = SECTIONS[tag as usize];
    let mut head = [0u8; 12];
    read_exact(r, &mut head, section)?;
    let found = le_u32(&head[0..4]);
    if found != tag {
        return Err(malformed(
            section,
            format!("section tag {found}, expected {tag}"),
        ));
    }
    Ok(le_u64(&head[4..12]))
}

fn check_crc<R: Read>(r: &mut R, section: &'static str, computed: u32) -> Result<(), IndexError> {
    let mut tail = [0u8; 4];
    read_exact(r, &mut tail, section)?;
    let stored = u32::from_le_bytes(tail);
    if stored != computed {
        return Err(IndexError::Checksum {
            section,
            stored,
            computed,
        });
    }
    Ok(())
}

/// Reads one byte section; `exact` demands the length be `expected`, otherwise it is a bound.
/// Beyond a first reservation of at most 64 MiB (not touched until bytes arrive), memory grows
/// with the bytes actually read, so a corrupt length cannot force a huge allocation.
fn read_section<R: Read>(
    r: &mut R,
    tag: u32,
    expected: u64,
    exact: bool,
) -> Result<Vec<u8>, IndexError> {
    let section = SECTIONS[tag as usize];
    let len = read_section_head(r, tag)?;
    if (exact && len != expected) || len > expected {
        return Err(malformed(
            section,
            format!("length {len}, expected {expected}"),
        ));
    }
    // Room for the whole section up front, so reading it does not grow the buffer by doubling
    // and copying.
    let mut out = Vec::with_capacity(len.min(1 << 26) as usize);
    let got = r
        .by_ref()
        .take(len)
        .read_to_end(&mut out)
        .map_err(|e| io_err(section, e))?;
    if got as u64 != len {
        return Err(IndexError::Truncated { section });
    }
    check_crc(r, section, crc32c(&out))?;
    Ok(out)
}

fn read_words<T: Word, R: Read>(r: &mut R, tag: u32, count: u64) -> Result<Vec<T>, IndexError> {
    let mut out = Vec::with_capacity(count.min(1 << 20) as usize);
    read_words_with(r, tag, count, |x| out.push(x))?;
    Ok(out)
}

/// Reads a section of `count` words in bounded chunks, handing each to `each` in order, and then
/// checks the section's checksum.
fn read_words_with<T: Word, R: Read>(
    r: &mut R,
    tag: u32,
    count: u64,
    mut each: impl FnMut(T),
) -> Result<(), IndexError> {
    let section = SECTIONS[tag as usize];
    let len = read_section_head(r, tag)?;
    let expected = count.saturating_mul(T::SIZE as u64);
    if len != expected {
        return Err(malformed(
            section,
            format!("length {len}, expected {expected}"),
        ));
    }
    let mut digest = Crc32c::new();
    let mut buf = vec![0u8; IO_CHUNK.min(len as usize)];
    let mut left = len;
    while left > 0 {
        let n = left.min(IO_CHUNK as u64) as usize;
        read_exact(r, &mut buf[..n], section)?;
        digest.update(&buf[..n]);
        buf[..n]
            .chunks_exact(T::SIZE)
            .map(T::get)
            .for_each(&mut each);
        left -= n as u64;
    }
    check_crc(r, section, digest.finalize())
}

fn parse_contigs(bytes: &[u8], n: u64, total_len: u64) -> Result<Vec<Contig>, IndexError> {
    let section = SECTIONS[0];
    let mut contigs = Vec::new();
    let mut names = HashSet::new();
    let mut at = 0usize;
    let mut offset = 0u64;
    for _ in 0..n {
        let name_len = bytes
            .get(at..at + 4)
            .map(le_u32)
            .ok_or_else(|| malformed(section, "entry cut short".into()))?
            as usize;
        at += 4;
        let name = bytes
            .get(at..at + name_len)
            .ok_or_else(|| malformed(section, "name cut short".into()))?;
        at += name_len;
        let name = std::str::from_utf8(name)
            .map_err(|_| malformed(section, "name is not UTF-8".into()))?
            .to_string();
        let len = bytes
            .get(at..at + 8)
            .map(le_u64)
            .ok_or_else(|| malformed(section, "length cut short".into()))?;
        at += 8;
        if len == 0 || name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(malformed(
                section,
                format!("bad contig {name:?} of length {len}"),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(malformed(section, format!("contig {name:?} appears twice")));
        }
        contigs.push(Contig { name, offset, len });
        offset = offset.saturating_add(len);
    }
    if at != bytes.len() || offset != total_len {
        return Err(malformed(
            section,
            format!("contigs cover {offset} bases, header says {total_len}"),
        ));
    }
    Ok(contigs)
}

fn check_runs(runs: &[(u64, u64)], total_len: u64) -> Result<(), IndexError> {
    let mut prev_end = 0u64;
    for &(s, l) in runs {
        if l == 0 || s < prev_end || s.saturating_add(l) > total_len {
            return Err(malformed(
                SECTIONS[2],
                format!("bad run at {s} of length {l}"),
            ));
        }
        prev_end = s + l;
    }
    Ok(())
}
