//! Where the pipeline's files live, behind one small interface: host files through plain system
//! calls, or files on a mounted AccelFS (on the direct engine, or on `redirect` for the paper's
//! host-mediated path).
//!
//! Reads of big files on AccelFS use `File::read_stream`, which keeps the device busy with many
//! large commands; a thread streams one segment at a time and hands the bytes over through a
//! bounded channel, so parsing overlaps the I/O. The stream never holds the file system while it
//! waits for the consumer: a segment is collected under the file system's lock and sent after it
//! is released, so a consumer that writes to the same file system (SAM output) cannot deadlock it.

use crate::source::{ByteSource, SourceOptions};
use kura_accelfs::fs::{File as FsFile, FileSystem};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// Bytes collected per `read_stream` call: large enough to keep 32 commands busy.
const SEGMENT: u64 = 32 << 20;
/// Segments the streaming thread may have ready ahead of the parser.
const SEGMENTS_AHEAD: usize = 2;

/// A failure to reach a file, with its path.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Host { path: String, source: io::Error },
    #[error("{path} (AccelFS): {source}")]
    Fs {
        path: String,
        source: kura_accelfs::FsError,
    },
}

impl StoreError {
    fn host(path: &Path, source: io::Error) -> Self {
        StoreError::Host {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Where files are read and written.
#[derive(Clone)]
pub enum Store {
    /// Host files, paths relative to `root` (or absolute), through plain system calls.
    Host { root: PathBuf },
    /// A mounted AccelFS.
    AccelFs(FileSystem),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Store::Host { root } => write!(f, "host files under {}", root.display()),
            Store::AccelFs(_) => write!(f, "AccelFS"),
        }
    }
}

/// A file being written; [`StoreWriter::finish`] makes it durable.
pub struct StoreWriter {
    inner: WriterKind,
    path: String,
}

enum WriterKind {
    Host(BufWriter<std::fs::File>),
    Accel(BufWriter<FsFile>),
}

impl Write for StoreWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.inner {
            WriterKind::Host(w) => w.write(buf),
            WriterKind::Accel(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.inner {
            WriterKind::Host(w) => w.flush(),
            WriterKind::Accel(w) => w.flush(),
        }
    }
}

impl StoreWriter {
    /// Writes what is buffered and syncs the file (fsync on the host, a journal commit on
    /// AccelFS).
    pub fn finish(self) -> Result<(), StoreError> {
        let path = self.path;
        match self.inner {
            WriterKind::Host(w) => {
                let file = w
                    .into_inner()
                    .map_err(|e| StoreError::host(Path::new(&path), e.into_error()))?;
                file.sync_all()
                    .map_err(|e| StoreError::host(Path::new(&path), e))
            }
            WriterKind::Accel(w) => {
                let file = w.into_inner().map_err(|e| StoreError::Host {
                    path: path.clone(),
                    source: e.into_error(),
                })?;
                file.sync_all()
                    .map_err(|source| StoreError::Fs { path, source })
            }
        }
    }
}

impl Store {
    /// Host files under `root`.
    pub fn host(root: impl Into<PathBuf>) -> Self {
        Store::Host { root: root.into() }
    }

    fn host_path(root: &Path, path: &str) -> PathBuf {
        root.join(path)
    }

    fn accel_path(path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        }
    }

    /// Size of a file in bytes.
    pub fn len(&self, path: &str) -> Result<u64, StoreError> {
        match self {
            Store::Host { root } => {
                let p = Self::host_path(root, path);
                std::fs::metadata(&p)
                    .map(|m| m.len())
                    .map_err(|e| StoreError::host(&p, e))
            }
            Store::AccelFs(fs) => {
                let p = Self::accel_path(path);
                fs.metadata(&p)
                    .map(|m| m.len())
                    .map_err(|source| StoreError::Fs { path: p, source })
            }
        }
    }

    /// Opens a file for streaming: large reads on a thread of their own, gzip detected and
    /// decompressed, the parser reading from memory.
    pub fn open_stream(&self, path: &str) -> Result<ByteSource, StoreError> {
        match self {
            Store::Host { root } => {
                let p = Self::host_path(root, path);
                let file = std::fs::File::open(&p).map_err(|e| StoreError::host(&p, e))?;
                ByteSource::read_ahead(file, SourceOptions::default())
                    .map_err(|e| StoreError::host(&p, e))
            }
            Store::AccelFs(fs) => {
                let p = Self::accel_path(path);
                let file = fs.open(&p).map_err(|source| StoreError::Fs {
                    path: p.clone(),
                    source,
                })?;
                let reader = AccelStream::start(file, p.clone())
                    .map_err(|e| StoreError::Host { path: p, source: e })?;
                Ok(ByteSource::inline(reader, SourceOptions::default()))
            }
        }
    }

    /// Creates (or truncates) a file for writing, with a 1 MiB buffer.
    pub fn create(&self, path: &str) -> Result<StoreWriter, StoreError> {
        match self {
            Store::Host { root } => {
                let p = Self::host_path(root, path);
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| StoreError::host(dir, e))?;
                }
                let file = std::fs::File::create(&p).map_err(|e| StoreError::host(&p, e))?;
                Ok(StoreWriter {
                    inner: WriterKind::Host(BufWriter::with_capacity(1 << 20, file)),
                    path: p.display().to_string(),
                })
            }
            Store::AccelFs(fs) => {
                let p = Self::accel_path(path);
                if let Some((dir, _)) = p.rsplit_once('/') {
                    if !dir.is_empty() {
                        fs.create_dir_all(dir).map_err(|source| StoreError::Fs {
                            path: dir.to_string(),
                            source,
                        })?;
                    }
                }
                let file = fs.create(&p).map_err(|source| StoreError::Fs {
                    path: p.clone(),
                    source,
                })?;
                Ok(StoreWriter {
                    inner: WriterKind::Accel(BufWriter::with_capacity(1 << 20, file)),
                    path: p,
                })
            }
        }
    }
}

/// A `Read` over an AccelFS file fed by a thread that streams it a segment at a time.
struct AccelStream {
    rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    pos: usize,
    done: bool,
}

impl AccelStream {
    fn start(file: FsFile, path: String) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(SEGMENTS_AHEAD);
        std::thread::Builder::new()
            .name("kura-genome-stream".into())
            .spawn(move || {
                let mut offset = 0u64;
                loop {
                    let mut segment = Vec::with_capacity(SEGMENT as usize);
                    let got = file.read_stream(offset, SEGMENT, |piece| {
                        segment.extend_from_slice(piece);
                    });
                    match got {
                        Ok(0) => return,
                        Ok(n) => {
                            offset += n;
                            if tx.send(Ok(segment)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let err = io::Error::other(format!("{path}: {e}"));
                            let _ = tx.send(Err(err));
                            return;
                        }
                    }
                }
            })?;
        Ok(AccelStream {
            rx,
            current: Vec::new(),
            pos: 0,
            done: false,
        })
    }
}

impl Read for AccelStream {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            if self.done {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Ok(segment)) => {
                    self.current = segment;
                    self.pos = 0;
                }
                Ok(Err(e)) => {
                    self.done = true;
                    return Err(e);
                }
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = out.len().min(self.current.len() - self.pos);
        out[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
