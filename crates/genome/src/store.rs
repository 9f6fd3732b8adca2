//! Where the pipeline's files live, behind one small interface: host files through plain system
//! calls, or files on a mounted AccelFS (on the direct engine, or on `redirect` for the paper's
//! host-mediated path).
//!
//! Files are streamed by a reader thread ([`ByteSource::read_ahead`]) so parsing overlaps the I/O.
//! AccelFS files are read with `File::read_stream_owned`, which keeps 1 MiB commands in flight
//! and hands over the engine buffers themselves: a thread of its own streams one 8 MiB segment
//! at a time and passes its buffers to the parser as chunks, so the bytes the device wrote are
//! the bytes the parser reads, with no copy (gzip files go through the decoder instead). The
//! file system's lock is held for one segment and never while waiting for the consumer (the
//! buffers are sent after `read_stream_owned` returns), so a consumer that writes to the same
//! file system (SAM output) cannot deadlock it. At most two segments' buffers are held outside
//! the pool: the one being read and the one waiting for the parser.

use crate::source::{ByteSource, Chunk, SourceOptions};
use kura_accelfs::fs::{File as FsFile, FileSystem};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Read-ahead chunk for host files (see [`Store::open_stream`]).
const HOST_CHUNK: usize = 512 << 10;

/// Bytes per `read_stream_owned` call: 8 commands of 1 MiB in flight reach the device's
/// sequential bandwidth, while the buffers waiting for the parser stay few.
const SEGMENT: u64 = 8 << 20;
/// Chunks (1 MiB device buffers) ready ahead of the parser: one segment.
const CHUNKS_AHEAD: usize = 8;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

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
    /// AccelFS). A host output that is not a regular file (`/dev/null`, a pipe, a terminal)
    /// has nothing to sync, and fsync would fail on it with EINVAL.
    pub fn finish(self) -> Result<(), StoreError> {
        let path = self.path;
        match self.inner {
            WriterKind::Host(w) => {
                let host_err = |e| StoreError::host(Path::new(&path), e);
                let file = w.into_inner().map_err(|e| host_err(e.into_error()))?;
                if file.metadata().map_err(host_err)?.is_file() {
                    file.sync_all().map_err(host_err)?;
                }
                Ok(())
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

    /// Reads up to `buf.len()` bytes from the start of a file, without starting a stream (for
    /// looking at a file's magic); returns how many.
    pub fn read_head(&self, path: &str, buf: &mut [u8]) -> Result<usize, StoreError> {
        match self {
            Store::Host { root } => {
                use std::io::Read;
                let p = Self::host_path(root, path);
                let mut file = std::fs::File::open(&p).map_err(|e| StoreError::host(&p, e))?;
                let mut got = 0;
                while got < buf.len() {
                    match file.read(&mut buf[got..]) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(StoreError::host(&p, e)),
                    }
                }
                Ok(got)
            }
            Store::AccelFs(fs) => {
                let p = Self::accel_path(path);
                let fs_err = |source| StoreError::Fs {
                    path: p.clone(),
                    source,
                };
                fs.open(&p).and_then(|f| f.read_at(0, buf)).map_err(fs_err)
            }
        }
    }

    /// Opens a file for streaming: large reads on a thread of their own, gzip detected and
    /// decompressed, the parser reading from memory.
    pub fn open_stream(&self, path: &str) -> Result<ByteSource, StoreError> {
        let opts = match self {
            // Host files come through the page cache, where 512 KiB reads, one waiting, already
            // stream at memory speed; four 4 MiB chunks in flight would only be resident memory.
            Store::Host { .. } => SourceOptions {
                chunk: HOST_CHUNK,
                depth: 1,
            },
            Store::AccelFs(_) => SourceOptions::default(),
        };
        self.open_stream_with(path, opts)
    }

    /// [`Self::open_stream`] with the read-ahead's chunk size and depth given, for readers that
    /// need less memory in flight than the read sets' 4 MiB chunks. A plain AccelFS file streams
    /// in the device's own buffers either way.
    pub fn open_stream_with(
        &self,
        path: &str,
        opts: SourceOptions,
    ) -> Result<ByteSource, StoreError> {
        match self {
            Store::Host { root } => {
                let p = Self::host_path(root, path);
                let file = std::fs::File::open(&p).map_err(|e| StoreError::host(&p, e))?;
                ByteSource::read_ahead(file, opts).map_err(|e| StoreError::host(&p, e))
            }
            Store::AccelFs(fs) => {
                let p = Self::accel_path(path);
                let file = fs.open(&p).map_err(|source| StoreError::Fs {
                    path: p.clone(),
                    source,
                })?;
                let mut magic = [0u8; 2];
                let head = file
                    .read_at(0, &mut magic)
                    .map_err(|source| StoreError::Fs {
                        path: p.clone(),
                        source,
                    })?;
                if head == 2 && magic == GZIP_MAGIC {
                    // Compressed: the decoder needs a `Read`; a plain read-ahead does it.
                    return ByteSource::read_ahead(file, opts)
                        .map_err(|e| StoreError::Host { path: p, source: e });
                }
                let name = p.clone();
                ByteSource::produced(
                    move |emit, _spare| {
                        let mut offset = 0u64;
                        loop {
                            let mut segment = Vec::new();
                            let got = file.read_stream_owned(offset, SEGMENT, |buf, range| {
                                segment.push(Chunk::device(buf, range));
                            });
                            match got {
                                Ok(0) => return Ok(()),
                                Ok(n) => offset += n,
                                Err(e) => return Err(io::Error::other(format!("{name}: {e}"))),
                            }
                            for chunk in segment {
                                if !emit(chunk) {
                                    return Ok(());
                                }
                            }
                        }
                    },
                    CHUNKS_AHEAD,
                )
                .map_err(|e| StoreError::Host { path: p, source: e })
            }
        }
    }

    /// Creates (or truncates) a file for writing, with a 256 KiB buffer for a host file (the
    /// page cache takes writes of any size; a larger buffer is only resident memory) and 1 MiB
    /// for an AccelFS file.
    pub fn create(&self, path: &str) -> Result<StoreWriter, StoreError> {
        match self {
            Store::Host { root } => {
                let p = Self::host_path(root, path);
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| StoreError::host(dir, e))?;
                }
                let file = std::fs::File::create(&p).map_err(|e| StoreError::host(&p, e))?;
                Ok(StoreWriter {
                    inner: WriterKind::Host(BufWriter::with_capacity(256 << 10, file)),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `-o /dev/null` is how a mapping is timed without keeping its output: writing to a
    /// character device must not fail at the end for want of fsync.
    #[test]
    fn host_output_to_a_device_finishes_without_fsync() {
        let store = Store::host("");
        let mut w = store.create("/dev/null").expect("create /dev/null");
        w.write_all(b"@HD\tVN:1.6\n").expect("write");
        w.finish().expect("finish");
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::host(dir.path());
        let mut w = store.create("out.sam").expect("create");
        w.write_all(b"@HD\tVN:1.6\n").expect("write");
        w.finish().expect("finish a regular file");
        let text = std::fs::read(dir.path().join("out.sam")).expect("read");
        assert_eq!(text, b"@HD\tVN:1.6\n");
    }
}
