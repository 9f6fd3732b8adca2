//! Streaming FASTA parsing into contigs, and the parse error type shared with [`crate::fastq`].
//!
//! Accepted input: any number of records, each a `>` header line followed by zero or more
//! sequence lines of any length; LF or CRLF line ends; blank lines anywhere; gzip through
//! [`crate::source::ByteSource`]. The header's name runs to the first space or tab, the rest
//! (trimmed) is the description.
//!
//! Sequence normalisation (so every later stage sees only `ACGTN`):
//! - `acgt` are uppercased to `ACGT`;
//! - every other letter (`N`, IUPAC ambiguity codes such as `R`, `Y`, `K`, and any other letter)
//!   becomes `N` — ambiguity codes cannot be matched exactly, and minimap2 likewise treats them as
//!   ambiguous; runs of `N` are kept, so coordinates stay those of the input;
//! - spaces and tabs inside sequence lines are skipped;
//! - anything else (digits, `-`, `*`, `.`, control bytes) is an error naming the line.
//!
//! Errors: an empty input (no record), a FASTQ file, sequence before the first header, a header
//! with an empty name, a header that is not UTF-8 and a line longer than [`MAX_FASTA_LINE`] are
//! reported with the file and 1-based line number.

use crate::source::{LineError, Lines};
use std::fmt;
use std::io::{self, BufRead};

/// Longest FASTA line accepted (whole chromosomes on one line are common, so this is large).
pub const MAX_FASTA_LINE: usize = 1 << 30;

/// One FASTA record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FastaRecord {
    /// The header up to the first space or tab.
    pub name: String,
    /// The rest of the header, trimmed (empty when there is none).
    pub description: String,
    /// The sequence, normalised to `ACGTN`.
    pub seq: Vec<u8>,
}

/// What is wrong with a FASTA or FASTQ input.
#[derive(Debug, thiserror::Error)]
pub enum ParseErrorKind {
    /// The underlying read failed (including corrupt gzip data).
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
    /// No record at all.
    #[error("empty file: no records")]
    Empty,
    /// A line over the parser's limit (binary data or a file without newlines).
    #[error("line longer than {0} bytes (not a text sequence file?)")]
    LineTooLong(usize),
    /// Header bytes that are not UTF-8.
    #[error("header is not valid UTF-8")]
    NotUtf8,
    /// FASTA: sequence lines before the first `>` header.
    #[error("sequence before the first '>' header (not a FASTA file?)")]
    SequenceBeforeHeader,
    /// FASTA: the input is FASTQ, not FASTA.
    #[error("this is a FASTQ file ('@' header), not FASTA: the reference must be FASTA")]
    FastqNotFasta,
    /// FASTA: a `>` header whose name is empty.
    #[error("'>' header with an empty name")]
    EmptyName,
    /// FASTA: a byte that is neither a letter nor blank in a sequence line.
    #[error("invalid character {} in sequence (column {col})", show_byte(*byte))]
    FastaChar {
        /// The offending byte.
        byte: u8,
        /// Its 1-based column.
        col: usize,
    },
    /// FASTQ: the input is FASTA, not FASTQ.
    #[error("this is a FASTA file ('>' header), not FASTQ: reads must be FASTQ")]
    FastaNotFastq,
    /// FASTQ: a record line does not start with `@`.
    #[error("expected a record header starting with '@', found {}", show_start(.0))]
    MissingAt(Vec<u8>),
    /// FASTQ: the name after `@` is empty.
    #[error("'@' header with an empty read name")]
    EmptyReadName,
    /// FASTQ: a read name byte outside printable ASCII, which SAM's QNAME cannot hold.
    #[error("read name has {} at column {col}; names must be printable ASCII", show_byte(*byte))]
    BadReadName {
        /// The offending byte.
        byte: u8,
        /// Its 1-based column in the header line.
        col: usize,
    },
    /// FASTQ: the third line of a record does not start with `+`.
    #[error("expected the '+' separator line, found {} (multi-line FASTQ is not supported)", show_start(.0))]
    MissingPlus(Vec<u8>),
    /// FASTQ: the input ends inside a record.
    #[error("truncated record: the file ends before the {missing} line of the record that starts at line {record_line}")]
    Truncated {
        /// The line that is missing: "sequence", "'+' separator" or "quality".
        missing: &'static str,
        /// The line of the record's `@` header.
        record_line: u64,
    },
    /// FASTQ: a sequence byte outside `ACGTNacgtn`.
    #[error("invalid base {} in sequence (column {col}; only A, C, G, T, N are accepted)", show_byte(*byte))]
    BadBase {
        /// The offending byte.
        byte: u8,
        /// Its 1-based column.
        col: usize,
    },
    /// FASTQ: a quality byte outside `!`..=`~`.
    #[error("invalid quality character {} (column {col}; must be '!'..'~')", show_byte(*byte))]
    BadQuality {
        /// The offending byte.
        byte: u8,
        /// Its 1-based column.
        col: usize,
    },
    /// FASTQ: sequence and quality of different lengths.
    #[error("quality length {qual} differs from sequence length {seq}")]
    LengthMismatch {
        /// Sequence length.
        seq: usize,
        /// Quality length.
        qual: usize,
    },
    /// Paired FASTQ: one file has more records than the other.
    #[error("the mate files have different numbers of reads: {0} ends first")]
    MateCount(String),
    /// Paired FASTQ: mates' names differ (after removing a `/1`, `/2` suffix).
    #[error("mate names differ: {0:?} vs {1:?}")]
    MateName(String, String),
}

fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

fn show_start(line: &[u8]) -> String {
    if line.is_empty() {
        return "an empty line".into();
    }
    let cut = &line[..line.len().min(20)];
    let ell = if line.len() > 20 { "…" } else { "" };
    format!("{:?}{ell}", String::from_utf8_lossy(cut))
}

/// A parse error with where it happened.
#[derive(Debug)]
pub struct ParseError {
    /// The file as given by the caller.
    pub path: String,
    /// 1-based line number (0 when the error is not tied to a line, such as an empty file).
    pub line: u64,
    /// What is wrong.
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path, self.kind)
        } else {
            write!(f, "{}:{}: {}", self.path, self.line, self.kind)
        }
    }
}

impl std::error::Error for ParseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ParseErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Sequence byte classes besides the base to store: a byte to skip, or an invalid byte.
const SKIP: u8 = 0;
const BAD: u8 = 1;

const FASTA_TABLE: [u8; 256] = {
    let mut t = [BAD; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        if b.is_ascii_alphabetic() {
            t[c] = match b.to_ascii_uppercase() {
                x @ (b'A' | b'C' | b'G' | b'T') => x,
                _ => b'N',
            };
        }
        c += 1;
    }
    t[b' ' as usize] = SKIP;
    t[b'\t' as usize] = SKIP;
    t[b'\r' as usize] = SKIP;
    t
};

/// Streaming FASTA reader; an iterator of records. After the first error it yields nothing more.
pub struct FastaReader<R> {
    lines: Lines<R>,
    path: String,
    /// The header line of the next record, already read (empty when there is none).
    header: Vec<u8>,
    header_line: u64,
    started: bool,
    finished: bool,
}

impl<R: BufRead> FastaReader<R> {
    /// A reader over `src`; `path` names the input in errors.
    pub fn new(src: R, path: impl Into<String>) -> Self {
        Self {
            lines: Lines::new(src, MAX_FASTA_LINE),
            path: path.into(),
            header: Vec::new(),
            header_line: 0,
            started: false,
            finished: false,
        }
    }

    /// Reads every record.
    ///
    /// # Errors
    /// The first parse or read error.
    pub fn read_all(self) -> Result<Vec<FastaRecord>, ParseError> {
        self.collect()
    }

    fn err(&self, line: u64, kind: ParseErrorKind) -> ParseError {
        ParseError {
            path: self.path.clone(),
            line,
            kind,
        }
    }

    fn line_err(&self, e: LineError) -> ParseError {
        let kind = match e {
            LineError::Io(e) => ParseErrorKind::Io(e),
            LineError::TooLong => ParseErrorKind::LineTooLong(MAX_FASTA_LINE),
        };
        self.err(self.lines.line() + 1, kind)
    }

    /// Reads lines up to the first header into `self.header`; `Ok(false)` if the input has none.
    fn first_header(&mut self) -> Result<bool, ParseError> {
        let mut line = Vec::new();
        loop {
            line.clear();
            if !self
                .lines
                .append_line(&mut line)
                .map_err(|e| self.line_err(e))?
            {
                return Ok(false);
            }
            if line.first() == Some(&b'>') {
                self.header = line;
                self.header_line = self.lines.line();
                return Ok(true);
            }
            if line.first() == Some(&b'@') {
                return Err(self.err(self.lines.line(), ParseErrorKind::FastqNotFasta));
            }
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                return Err(self.err(self.lines.line(), ParseErrorKind::SequenceBeforeHeader));
            }
        }
    }

    fn next_record(&mut self) -> Result<Option<FastaRecord>, ParseError> {
        if !self.started {
            self.started = true;
            if !self.first_header()? {
                return Err(self.err(0, ParseErrorKind::Empty));
            }
        }
        if self.header.is_empty() {
            return Ok(None);
        }
        let (name, description) =
            split_header(&self.header[1..]).map_err(|k| self.err(self.header_line, k))?;
        self.header.clear();
        let mut seq = Vec::new();
        loop {
            match self
                .lines
                .peek()
                .map_err(|e| self.err(self.lines.line() + 1, e.into()))?
            {
                None => break,
                Some(b'>') => {
                    let mut h = std::mem::take(&mut self.header);
                    self.lines
                        .append_line(&mut h)
                        .map_err(|e| self.line_err(e))?;
                    self.header = h;
                    self.header_line = self.lines.line();
                    break;
                }
                Some(_) => {
                    let start = seq.len();
                    self.lines
                        .append_line(&mut seq)
                        .map_err(|e| self.line_err(e))?;
                    normalise(&mut seq, start).map_err(|k| self.err(self.lines.line(), k))?;
                }
            }
        }
        Ok(Some(FastaRecord {
            name,
            description,
            seq,
        }))
    }
}

/// Splits a header (without `>`) into name and trimmed description.
fn split_header(h: &[u8]) -> Result<(String, String), ParseErrorKind> {
    let h = std::str::from_utf8(h).map_err(|_| ParseErrorKind::NotUtf8)?;
    let (name, rest) = h.split_once([' ', '\t']).unwrap_or((h, ""));
    if name.is_empty() {
        return Err(ParseErrorKind::EmptyName);
    }
    Ok((name.to_string(), rest.trim().to_string()))
}

/// Normalises `seq[start..]` in place (see the module docs), dropping skipped bytes.
fn normalise(seq: &mut Vec<u8>, start: usize) -> Result<(), ParseErrorKind> {
    let mut w = start;
    for r in start..seq.len() {
        let b = seq[r];
        match FASTA_TABLE[usize::from(b)] {
            SKIP => {}
            BAD => {
                return Err(ParseErrorKind::FastaChar {
                    byte: b,
                    col: r - start + 1,
                })
            }
            x => {
                seq[w] = x;
                w += 1;
            }
        }
    }
    seq.truncate(w);
    Ok(())
}

impl<R: BufRead> Iterator for FastaReader<R> {
    type Item = Result<FastaRecord, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        match self.next_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.finished = true;
                None
            }
            Err(e) => {
                self.finished = true;
                Some(Err(e))
            }
        }
    }
}
