//! Streaming byte sources for the FASTA and FASTQ parsers: any `std::io::Read` (a host file, an
//! AccelFS `kura_accelfs::fs::File`, stdin) read in large chunks
//! (default [`DEFAULT_CHUNK`], 4 MiB) with gzip (and bgzip, which is multi-member gzip) decoded
//! transparently when the data starts with the gzip magic.
//!
//! Two modes:
//! - [`ByteSource::inline`]: the caller's thread reads (and decompresses) a chunk whenever the
//!   parser has used up the previous one;
//! - [`ByteSource::read_ahead`]: a reader thread reads and decompresses chunks into a bounded
//!   channel (`depth` chunks in flight), so parsing runs while the next read is outstanding.
//!   Memory stays bounded at `(depth + 2) × chunk` bytes; emptied buffers go back to the reader
//!   thread so steady-state streaming does not allocate.
//!
//! [`SourceStats`] counts raw bytes read from the underlying reader (compressed bytes for gzip),
//! bytes delivered after decompression, and how long the consumer waited on I/O, so callers can
//! compute read throughput and how much of the I/O was hidden behind parsing.

use flate2::read::MultiGzDecoder;
use kura_engine::IoBuf;
use std::io::{self, BufRead, Read};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Default chunk size for reads from the underlying reader: 4 MiB.
pub const DEFAULT_CHUNK: usize = 4 << 20;

/// Default number of chunks the reader thread may have ready ahead of the parser.
pub const DEFAULT_DEPTH: usize = 2;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// How a [`ByteSource`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceOptions {
    /// Bytes requested from the underlying reader per read (clamped to at least 1).
    pub chunk: usize,
    /// Chunks the reader thread may have ready ahead of the parser (read-ahead mode only;
    /// clamped to at least 1).
    pub depth: usize,
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self {
            chunk: DEFAULT_CHUNK,
            depth: DEFAULT_DEPTH,
        }
    }
}

/// Byte counters of a [`ByteSource`], shared with its reader thread.
#[derive(Debug, Default)]
pub struct SourceStats {
    raw: AtomicU64,
    delivered: AtomicU64,
    wait_ns: AtomicU64,
    /// 0: not known yet, 1: plain, 2: gzip.
    gzip: AtomicU8,
}

impl SourceStats {
    /// Bytes read from the underlying reader so far (compressed bytes when the input is gzip).
    pub fn raw_bytes(&self) -> u64 {
        self.raw.load(Ordering::Relaxed)
    }

    /// Bytes handed to the consumer so far (after decompression).
    pub fn bytes(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Time the consumer spent waiting for data: the whole read time in inline mode, only the
    /// part not hidden behind parsing in read-ahead mode.
    pub fn wait(&self) -> Duration {
        Duration::from_nanos(self.wait_ns.load(Ordering::Relaxed))
    }

    /// Whether the input is gzip; `None` until the first bytes have been looked at.
    pub fn is_gzip(&self) -> Option<bool> {
        match self.gzip.load(Ordering::Relaxed) {
            1 => Some(false),
            2 => Some(true),
            _ => None,
        }
    }

    fn add_wait(&self, since: Instant) {
        let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.wait_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Counts bytes read through it into [`SourceStats::raw`].
struct Counting<R> {
    inner: R,
    stats: Arc<SourceStats>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.stats.raw.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

type BoxRead = Box<dyn Read + Send>;

/// Wraps `reader` so it yields decompressed bytes when it starts with the gzip magic, and the
/// bytes unchanged otherwise. The first bytes are peeked and then replayed in front of the rest.
fn decoded(reader: BoxRead, stats: &SourceStats) -> io::Result<BoxRead> {
    let mut reader = reader;
    let mut head = [0u8; 2];
    let mut got = 0;
    while got < head.len() {
        match reader.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let replay = io::Cursor::new(head[..got].to_vec()).chain(reader);
    let gzip = got == 2 && head == GZIP_MAGIC;
    stats
        .gzip
        .store(if gzip { 2 } else { 1 }, Ordering::Relaxed);
    if gzip {
        Ok(Box::new(MultiGzDecoder::new(replay)))
    } else {
        Ok(Box::new(replay))
    }
}

/// Reads until `buf` holds `chunk` bytes or the reader is at its end, so each chunk is as large
/// as asked. Every read asks for all the room left: `read_to_end` would start each chunk with
/// small reads and grow them, which on AccelFS turns one big bypass read into many cached small
/// ones. A recycled buffer keeps its length, so only a fresh one is zeroed. On an error the bytes
/// that arrived before it are kept.
fn fill(reader: &mut dyn Read, buf: &mut Vec<u8>, chunk: usize) -> io::Result<()> {
    if buf.len() != chunk {
        buf.resize(chunk, 0);
    }
    let mut filled = 0;
    while filled < chunk {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                buf.truncate(filled);
                return Err(e);
            }
        }
    }
    buf.truncate(filled);
    Ok(())
}

/// One piece of a stream as the consumer sees it: bytes a reader filled, or the part of an
/// engine buffer that a device read into, handed over without a copy.
#[derive(Default)]
pub struct Chunk(ChunkBuf);

/// The buffer a [`Chunk`]'s bytes are in: a vector of its own, or a range of an engine buffer.
enum ChunkBuf {
    Bytes(Vec<u8>),
    Device(IoBuf, Range<usize>),
}

impl Default for ChunkBuf {
    fn default() -> Self {
        ChunkBuf::Bytes(Vec::new())
    }
}

impl Chunk {
    /// Bytes in a buffer of their own.
    pub fn bytes(bytes: Vec<u8>) -> Self {
        Chunk(ChunkBuf::Bytes(bytes))
    }

    /// The `range` part of a device buffer (clamped to the buffer).
    pub fn device(buf: IoBuf, range: Range<usize>) -> Self {
        let end = range.end.min(buf.len());
        let start = range.start.min(end);
        Chunk(ChunkBuf::Device(buf, start..end))
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            ChunkBuf::Bytes(v) => v,
            ChunkBuf::Device(buf, range) => &buf[range.clone()],
        }
    }

    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The byte buffer back, for reuse; a device buffer goes back to its pool when dropped.
    fn into_vec(self) -> Option<Vec<u8>> {
        match self.0 {
            ChunkBuf::Bytes(v) => Some(v),
            ChunkBuf::Device(..) => None,
        }
    }
}

type ChunkMsg = io::Result<Chunk>;

enum Mode {
    Inline {
        reader: Option<BoxRead>,
        decoding: bool,
        chunk: usize,
        pending: Option<io::Error>,
    },
    Threaded {
        rx: Receiver<ChunkMsg>,
        recycle: SyncSender<Vec<u8>>,
        thread: Option<JoinHandle<()>>,
    },
}

/// A streaming byte source; implements [`Read`] and [`BufRead`] (each `fill_buf` hands out what is
/// left of the current chunk, so parsers can scan large slices with `memchr`).
pub struct ByteSource {
    mode: Mode,
    cur: Chunk,
    pos: usize,
    done: bool,
    failed: bool,
    stats: Arc<SourceStats>,
}

impl ByteSource {
    /// A source that reads on the caller's thread, `opts.chunk` bytes at a time.
    pub fn inline<R: Read + Send + 'static>(reader: R, opts: SourceOptions) -> Self {
        let stats = Arc::new(SourceStats::default());
        let counted: BoxRead = Box::new(Counting {
            inner: reader,
            stats: Arc::clone(&stats),
        });
        Self::start(
            Mode::Inline {
                reader: Some(counted),
                decoding: false,
                chunk: opts.chunk.max(1),
                pending: None,
            },
            stats,
        )
    }

    /// A source whose reader thread reads and decompresses up to `opts.depth` chunks ahead of the
    /// consumer. The thread ends when the input ends, on the first read error (which the consumer
    /// then receives), or at its next chunk after the source is dropped (it is not joined on drop,
    /// so dropping never waits on a blocked read such as a terminal's stdin).
    ///
    /// # Errors
    /// Fails only if the thread cannot be spawned.
    pub fn read_ahead<R: Read + Send + 'static>(
        reader: R,
        opts: SourceOptions,
    ) -> io::Result<Self> {
        let stats = Arc::new(SourceStats::default());
        let chunk = opts.chunk.max(1);
        let depth = opts.depth.max(1);
        let (tx, rx) = mpsc::sync_channel::<ChunkMsg>(depth);
        // One more than the channel holds: the consumer's current chunk returns here too.
        let (recycle, spare) = mpsc::sync_channel::<Vec<u8>>(depth + 2);
        let counted: BoxRead = Box::new(Counting {
            inner: reader,
            stats: Arc::clone(&stats),
        });
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("kura-genome-read".into())
            .spawn(move || reader_thread(counted, &thread_stats, chunk, &tx, &spare))?;
        Ok(Self::threaded(rx, recycle, thread, stats))
    }

    /// A source whose chunks come from `producer`, run on a thread of its own, for inputs that
    /// can hand over whole chunks without going through `Read`, such as an AccelFS stream whose
    /// device buffers become chunks with no copy at all. `producer` gets `emit` (returns false
    /// once the consumer is gone) and `spare` (a recycled byte buffer, or a new one); an error it
    /// returns reaches the consumer after the chunks before it. Up to `depth` chunks wait for the
    /// consumer. The chunks must be plain data: no gzip detection happens here.
    ///
    /// # Errors
    /// Fails only if the thread cannot be spawned.
    pub fn produced<P>(producer: P, depth: usize) -> io::Result<Self>
    where
        P: FnOnce(&mut dyn FnMut(Chunk) -> bool, &mut dyn FnMut() -> Vec<u8>) -> io::Result<()>
            + Send
            + 'static,
    {
        let stats = Arc::new(SourceStats::default());
        stats.gzip.store(1, Ordering::Relaxed);
        let depth = depth.max(1);
        let (tx, rx) = mpsc::sync_channel::<ChunkMsg>(depth);
        let (recycle, spare) = mpsc::sync_channel::<Vec<u8>>(depth + 2);
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("kura-genome-produce".into())
            .spawn(move || {
                let mut emit = |chunk: Chunk| {
                    thread_stats
                        .raw
                        .fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    tx.send(Ok(chunk)).is_ok()
                };
                let mut take_spare = || spare.try_recv().unwrap_or_default();
                if let Err(e) = producer(&mut emit, &mut take_spare) {
                    let _ = tx.send(Err(e));
                }
            })?;
        Ok(Self::threaded(rx, recycle, thread, stats))
    }

    /// A source in `mode`, before its first chunk.
    fn start(mode: Mode, stats: Arc<SourceStats>) -> Self {
        Self {
            mode,
            cur: Chunk::default(),
            pos: 0,
            done: false,
            failed: false,
            stats,
        }
    }

    /// A source fed by `thread` through `rx`, with spent buffers going back through `recycle`.
    fn threaded(
        rx: Receiver<ChunkMsg>,
        recycle: SyncSender<Vec<u8>>,
        thread: JoinHandle<()>,
        stats: Arc<SourceStats>,
    ) -> Self {
        Self::start(
            Mode::Threaded {
                rx,
                recycle,
                thread: Some(thread),
            },
            stats,
        )
    }

    /// Opens a host file with read-ahead and the default options.
    ///
    /// # Errors
    /// The file cannot be opened or the reader thread cannot be spawned.
    pub fn open_path(path: &std::path::Path) -> io::Result<Self> {
        Self::read_ahead(std::fs::File::open(path)?, SourceOptions::default())
    }

    /// The byte counters (shared; they keep counting while the source is read).
    pub fn stats(&self) -> Arc<SourceStats> {
        Arc::clone(&self.stats)
    }

    /// Replaces the exhausted current chunk with the next; `Ok(false)` at the end of input.
    /// After an error every later call fails too, so a failed read never looks like a clean end.
    fn next_chunk(&mut self) -> io::Result<bool> {
        if self.failed {
            return Err(io::Error::other("an earlier read from this source failed"));
        }
        let res = self.next_chunk_inner();
        self.failed = res.is_err();
        res
    }

    fn next_chunk_inner(&mut self) -> io::Result<bool> {
        if self.done {
            return Ok(false);
        }
        let t0 = Instant::now();
        let got = match &mut self.mode {
            Mode::Inline {
                reader,
                decoding,
                chunk,
                pending,
            } => {
                if let Some(e) = pending.take() {
                    return Err(e);
                }
                let Some(mut r) = reader.take() else {
                    return Ok(false);
                };
                if !*decoding {
                    r = decoded(r, &self.stats)?;
                    *decoding = true;
                }
                let mut bytes = std::mem::take(&mut self.cur).into_vec().unwrap_or_default();
                let res = fill(r.as_mut(), &mut bytes, *chunk);
                // A short chunk is the end of input (see `reader_thread`): no further read.
                let more = bytes.len() == *chunk;
                self.cur = Chunk::bytes(bytes);
                if more || res.is_err() {
                    *reader = Some(r);
                }
                match res {
                    // Hand out what arrived before the error; the error comes on the next call.
                    Err(e) if !self.cur.is_empty() => {
                        *pending = Some(e);
                        true
                    }
                    Err(e) => return Err(e),
                    Ok(()) => !self.cur.is_empty(),
                }
            }
            Mode::Threaded {
                rx,
                recycle,
                thread,
            } => match rx.recv() {
                Ok(Ok(next)) => {
                    let old = std::mem::replace(&mut self.cur, next);
                    // The thread may already be gone (input ended); the buffer is then dropped.
                    if let Some(bytes) = old.into_vec() {
                        let _ = recycle.try_send(bytes);
                    }
                    true
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(mpsc::RecvError) => {
                    // The thread hung up: either the input ended or the thread panicked, which
                    // must not pass for a clean end of input.
                    if let Some(t) = thread.take() {
                        if t.join().is_err() {
                            self.done = true;
                            return Err(io::Error::other("the read-ahead thread panicked"));
                        }
                    }
                    false
                }
            },
        };
        self.stats.add_wait(t0);
        self.pos = 0;
        if got {
            self.stats
                .delivered
                .fetch_add(self.cur.len() as u64, Ordering::Relaxed);
        } else {
            self.cur = Chunk::default();
            self.done = true;
        }
        Ok(got)
    }
}

fn reader_thread(
    reader: BoxRead,
    stats: &SourceStats,
    chunk: usize,
    tx: &SyncSender<ChunkMsg>,
    spare: &Receiver<Vec<u8>>,
) {
    let mut reader = match decoded(reader, stats) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Err(e));
            return;
        }
    };
    loop {
        let mut buf = spare.try_recv().unwrap_or_default();
        match fill(reader.as_mut(), &mut buf, chunk) {
            Ok(()) if buf.is_empty() => return,
            Ok(()) => {
                // A short chunk means the reader said end of input: stop here rather than zero
                // a whole fresh chunk (resident memory) only to read nothing into it.
                let last = buf.len() < chunk;
                // A send error means the consumer dropped the source: stop reading.
                if tx.send(Ok(Chunk::bytes(buf))).is_err() || last {
                    return;
                }
            }
            Err(e) => {
                if !buf.is_empty() && tx.send(Ok(Chunk::bytes(buf))).is_err() {
                    return;
                }
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

impl BufRead for ByteSource {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos >= self.cur.len() {
            if !self.next_chunk()? {
                return Ok(&[]);
            }
        }
        Ok(&self.cur.as_slice()[self.pos..])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.cur.len());
    }
}

impl Read for ByteSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl std::fmt::Debug for ByteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.mode {
            Mode::Inline { .. } => "inline",
            Mode::Threaded { .. } => "read-ahead",
        };
        f.debug_struct("ByteSource")
            .field("mode", &mode)
            .field("bytes", &self.stats.bytes())
            .finish()
    }
}

/// Line-at-a-time access to a [`BufRead`] for the parsers: `memchr` finds each newline in the
/// source's current chunk and the line is copied once, straight into the caller's buffer.
/// A trailing `\r` (CRLF files) is dropped; line numbers are 1-based.
pub(crate) struct Lines<R> {
    src: R,
    /// Lines handed out so far, so the last one handed out has this number.
    line: u64,
    /// Longest line accepted, so input without newlines cannot exhaust memory.
    max_line: usize,
}

/// Why [`Lines::append_line`] failed.
#[derive(Debug)]
pub(crate) enum LineError {
    Io(io::Error),
    /// The line is longer than the reader's limit (its number is `line() + 1`).
    TooLong,
}

impl From<io::Error> for LineError {
    fn from(e: io::Error) -> Self {
        LineError::Io(e)
    }
}

impl<R: BufRead> Lines<R> {
    pub(crate) fn new(src: R, max_line: usize) -> Self {
        Self {
            src,
            line: 0,
            max_line,
        }
    }

    /// The number of the line most recently read (0 before the first).
    pub(crate) fn line(&self) -> u64 {
        self.line
    }

    /// The first byte of the next line without consuming it; `None` at the end of input.
    pub(crate) fn peek(&mut self) -> io::Result<Option<u8>> {
        Ok(self.src.fill_buf()?.first().copied())
    }

    /// Appends the next line (without its `\n` or `\r\n`) to `out`; `Ok(false)` at the end of
    /// input, when nothing was appended.
    pub(crate) fn append_line(&mut self, out: &mut Vec<u8>) -> Result<bool, LineError> {
        let start = out.len();
        let mut any = false;
        loop {
            let buf = self.src.fill_buf()?;
            if buf.is_empty() {
                break;
            }
            any = true;
            let room = self
                .max_line
                .saturating_add(1)
                .saturating_sub(out.len() - start);
            match memchr::memchr(b'\n', buf) {
                Some(i) if i > room => return Err(LineError::TooLong),
                None if buf.len() > room => return Err(LineError::TooLong),
                Some(i) => {
                    out.extend_from_slice(&buf[..i]);
                    self.src.consume(i + 1);
                    break;
                }
                None => {
                    let n = buf.len();
                    out.extend_from_slice(buf);
                    self.src.consume(n);
                }
            }
        }
        if !any {
            return Ok(false);
        }
        if out.len() > start && out.last() == Some(&b'\r') {
            out.pop();
        }
        self.line += 1;
        Ok(true)
    }
}
