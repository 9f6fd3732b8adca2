//! Streaming FASTQ parsing with file/line errors, in batches for multithreaded mapping, and a
//! paired reader that keeps two mate files in step.
//!
//! Accepted input: 4-line records (`@name [comment]`, sequence, `+[anything, usually nothing or
//! the name again]`, quality); LF or CRLF; blank lines between records; gzip through
//! [`crate::source::ByteSource`]. The read name is the header up to the first space or tab
//! (the comment is dropped, as SAM's QNAME has no room for it) and must be printable ASCII. Sequences may hold `ACGTN` in
//! either case and are uppercased; qualities must be `!`..=`~` and as long as the sequence.
//!
//! Multi-line FASTQ (sequence wrapped over several lines) is not supported: the second sequence
//! line is reported where the `+` separator was expected, and the message says so.
//!
//! Every error ([`ParseError`]) names the file, the 1-based line and what is wrong: truncated
//! record, missing `@`, missing `+`, length mismatch, bad base, bad quality, empty input, or a
//! FASTA file given where reads were expected.

pub use crate::fasta::{ParseError, ParseErrorKind};
use crate::source::{LineError, Lines};
use std::io::BufRead;

/// Longest FASTQ line accepted (long reads fit; binary junk without newlines does not).
pub const MAX_FASTQ_LINE: usize = 16 << 20;

/// One read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FastqRecord {
    /// The header after `@`, up to the first space or tab.
    pub name: String,
    /// Bases, uppercase `ACGTN`.
    pub seq: Vec<u8>,
    /// Phred+33 qualities, as long as `seq`.
    pub qual: Vec<u8>,
}

/// Whether `b` is one of `ACGTNacgtn`. Clearing bit 5 uppercases ASCII letters and maps no
/// other byte onto a capital letter, so one mask and five compares decide, branch-free, which
/// lets the whole-line check below vectorise.
fn is_base(b: u8) -> bool {
    matches!(b & 0xdf, b'A' | b'C' | b'G' | b'T' | b'N')
}

fn is_qual(q: u8) -> bool {
    q.wrapping_sub(b'!') <= b'~' - b'!'
}

/// Streaming FASTQ reader. Use [`FastqReader::next_batch`] (or [`FastqReader::read_record`]) to
/// reuse record buffers, or iterate for owned records. After an error it yields nothing more.
pub struct FastqReader<R> {
    lines: Lines<R>,
    path: String,
    scratch: Vec<u8>,
    records: u64,
    record_line: u64,
    failed: bool,
}

impl<R: BufRead> FastqReader<R> {
    /// A reader over `src`; `path` names the input in errors.
    pub fn new(src: R, path: impl Into<String>) -> Self {
        Self {
            lines: Lines::new(src, MAX_FASTQ_LINE),
            path: path.into(),
            scratch: Vec::new(),
            records: 0,
            record_line: 0,
            failed: false,
        }
    }

    /// The path given at construction.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Records read so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The line of the most recent record's `@` header.
    pub fn record_line(&self) -> u64 {
        self.record_line
    }

    fn err(&mut self, line: u64, kind: ParseErrorKind) -> ParseError {
        self.failed = true;
        ParseError {
            path: self.path.clone(),
            line,
            kind,
        }
    }

    fn line_err(&mut self, e: LineError) -> ParseError {
        let kind = match e {
            LineError::Io(e) => ParseErrorKind::Io(e),
            LineError::TooLong => ParseErrorKind::LineTooLong(MAX_FASTQ_LINE),
        };
        let line = self.lines.line() + 1;
        self.err(line, kind)
    }

    /// Reads the next line of the record into `out` (cleared); a missing line is a truncated
    /// record.
    fn record_part(&mut self, out: &mut Vec<u8>, missing: &'static str) -> Result<(), ParseError> {
        out.clear();
        match self.lines.append_line(out) {
            Ok(true) => Ok(()),
            Ok(false) => {
                let (line, record_line) = (self.lines.line() + 1, self.record_line);
                Err(self.err(
                    line,
                    ParseErrorKind::Truncated {
                        missing,
                        record_line,
                    },
                ))
            }
            Err(e) => Err(self.line_err(e)),
        }
    }

    /// Reads the next record into `rec`, reusing its buffers; `Ok(false)` at the end of input.
    ///
    /// # Errors
    /// The first malformed record or read failure; an input with no record is
    /// [`ParseErrorKind::Empty`].
    pub fn read_record(&mut self, rec: &mut FastqRecord) -> Result<bool, ParseError> {
        if self.failed {
            return Ok(false);
        }
        let mut head = std::mem::take(&mut self.scratch);
        let res = self.read_into(rec, &mut head);
        self.scratch = head;
        res
    }

    fn read_into(&mut self, rec: &mut FastqRecord, head: &mut Vec<u8>) -> Result<bool, ParseError> {
        loop {
            head.clear();
            match self.lines.append_line(head) {
                Ok(true) if head.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(true) => break,
                Ok(false) if self.records == 0 => return Err(self.err(0, ParseErrorKind::Empty)),
                Ok(false) => return Ok(false),
                Err(e) => return Err(self.line_err(e)),
            }
        }
        self.record_line = self.lines.line();
        let line = self.record_line;
        match head.first() {
            Some(b'@') => {}
            Some(b'>') if self.records == 0 => {
                return Err(self.err(line, ParseErrorKind::FastaNotFastq))
            }
            _ => return Err(self.err(line, ParseErrorKind::MissingAt(head.clone()))),
        }
        let name_end = memchr::memchr2(b' ', b'\t', head).unwrap_or(head.len());
        let name = &head[1..name_end];
        if name.is_empty() {
            return Err(self.err(line, ParseErrorKind::EmptyReadName));
        }
        if let Some(i) = name.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(self.err(
                line,
                ParseErrorKind::BadReadName {
                    byte: name[i],
                    col: i + 2,
                },
            ));
        }
        // Printable ASCII is UTF-8, so the conversion cannot fail; the error keeps it total.
        let Ok(name) = std::str::from_utf8(name) else {
            return Err(self.err(line, ParseErrorKind::NotUtf8));
        };
        rec.name.clear();
        rec.name.push_str(name);

        self.record_part(&mut rec.seq, "sequence")?;
        // Check the whole line without early exits (vectorised); locate the culprit only on failure.
        if rec
            .seq
            .iter()
            .fold(0u8, |bad, &b| bad | u8::from(!is_base(b)))
            != 0
        {
            let i = rec.seq.iter().position(|&b| !is_base(b)).unwrap_or(0);
            let kind = ParseErrorKind::BadBase {
                byte: rec.seq[i],
                col: i + 1,
            };
            return Err(self.err(line + 1, kind));
        }
        for b in &mut rec.seq {
            *b &= 0xdf;
        }

        self.record_part(head, "'+' separator")?;
        if head.first() != Some(&b'+') {
            return Err(self.err(line + 2, ParseErrorKind::MissingPlus(head.clone())));
        }

        self.record_part(&mut rec.qual, "quality")?;
        if rec
            .qual
            .iter()
            .fold(0u8, |bad, &q| bad | u8::from(!is_qual(q)))
            != 0
        {
            let i = rec.qual.iter().position(|&q| !is_qual(q)).unwrap_or(0);
            let kind = ParseErrorKind::BadQuality {
                byte: rec.qual[i],
                col: i + 1,
            };
            return Err(self.err(line + 3, kind));
        }
        if rec.qual.len() != rec.seq.len() {
            let kind = ParseErrorKind::LengthMismatch {
                seq: rec.seq.len(),
                qual: rec.qual.len(),
            };
            return Err(self.err(line + 3, kind));
        }
        self.records += 1;
        Ok(true)
    }

    /// Fills `batch` with the next records until they hold at least `max_bases` bases (always at
    /// least one record unless the input is at its end). Entries already in `batch` are reused,
    /// so a loop over batches does not allocate once warm. Returns the number of records (0 at
    /// the end of input); `batch` is truncated to it.
    ///
    /// # Errors
    /// As [`FastqReader::read_record`].
    pub fn next_batch(
        &mut self,
        batch: &mut Vec<FastqRecord>,
        max_bases: usize,
    ) -> Result<usize, ParseError> {
        let mut n = 0;
        let mut bases = 0;
        while n == 0 || bases < max_bases {
            if n == batch.len() {
                batch.push(FastqRecord::default());
            }
            if !self.read_record(&mut batch[n])? {
                break;
            }
            bases += batch[n].seq.len();
            n += 1;
        }
        batch.truncate(n);
        Ok(n)
    }
}

impl<R: BufRead> Iterator for FastqReader<R> {
    type Item = Result<FastqRecord, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut rec = FastqRecord::default();
        match self.read_record(&mut rec) {
            Ok(true) => Some(Ok(rec)),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// The read name with a trailing `/1` or `/2` removed, the form mates share.
pub fn mate_base_name(name: &str) -> &str {
    name.strip_suffix("/1")
        .or_else(|| name.strip_suffix("/2"))
        .unwrap_or(name)
}

/// Two FASTQ readers in step: record `i` of the first file is the mate of record `i` of the
/// second. Errors if one file ends before the other or mates' names differ (ignoring a `/1` `/2`
/// suffix).
pub struct PairedReader<R1, R2> {
    first: FastqReader<R1>,
    second: FastqReader<R2>,
}

impl<R1: BufRead, R2: BufRead> PairedReader<R1, R2> {
    /// Pairs two readers.
    pub fn new(first: FastqReader<R1>, second: FastqReader<R2>) -> Self {
        Self { first, second }
    }

    /// Pairs read so far.
    pub fn pairs(&self) -> u64 {
        self.first.records()
    }

    /// Reads the next pair into `a` and `b`; `Ok(false)` when both files end together.
    ///
    /// # Errors
    /// Either file's parse error, [`ParseErrorKind::MateCount`] at the file that still has a
    /// record, or [`ParseErrorKind::MateName`] at the second file's record.
    pub fn read_pair(
        &mut self,
        a: &mut FastqRecord,
        b: &mut FastqRecord,
    ) -> Result<bool, ParseError> {
        let more_a = self.first.read_record(a)?;
        let more_b = self.second.read_record(b)?;
        match (more_a, more_b) {
            (false, false) => Ok(false),
            (true, false) => {
                let ended = self.second.path.clone();
                let line = self.first.record_line;
                Err(self.first.err(line, ParseErrorKind::MateCount(ended)))
            }
            (false, true) => {
                let ended = self.first.path.clone();
                let line = self.second.record_line;
                Err(self.second.err(line, ParseErrorKind::MateCount(ended)))
            }
            (true, true) => {
                if mate_base_name(&a.name) != mate_base_name(&b.name) {
                    let line = self.second.record_line;
                    let kind = ParseErrorKind::MateName(a.name.clone(), b.name.clone());
                    return Err(self.second.err(line, kind));
                }
                Ok(true)
            }
        }
    }

    /// Fills `first` and `second` with the next pairs until the first mates hold at least
    /// `max_bases` bases, reusing entries as [`FastqReader::next_batch`] does. Returns the
    /// number of pairs (0 at the end of both files).
    ///
    /// # Errors
    /// As [`PairedReader::read_pair`].
    pub fn next_batch(
        &mut self,
        first: &mut Vec<FastqRecord>,
        second: &mut Vec<FastqRecord>,
        max_bases: usize,
    ) -> Result<usize, ParseError> {
        let mut n = 0;
        let mut bases = 0;
        while n == 0 || bases < max_bases {
            if n == first.len() {
                first.push(FastqRecord::default());
            }
            if n == second.len() {
                second.push(FastqRecord::default());
            }
            if !self.read_pair(&mut first[n], &mut second[n])? {
                break;
            }
            bases += first[n].seq.len();
            n += 1;
        }
        first.truncate(n);
        second.truncate(n);
        Ok(n)
    }
}
