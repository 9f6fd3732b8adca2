//! Open files: positioned and streaming access with `std::io` adapters, so ordinary Rust
//! parsers (`BufReader`, `io::copy`, …) work on AccelFS files.

use super::{FileSystem, Metadata};
use crate::error::FsError;
use std::io::{self, Read, Seek, SeekFrom, Write};

/// How to open a file (as `std::fs::OpenOptions`).
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub(crate) read: bool,
    pub(crate) write: bool,
    pub(crate) append: bool,
    pub(crate) create: bool,
    pub(crate) create_new: bool,
    pub(crate) truncate: bool,
}

impl OpenOptions {
    pub fn new() -> Self {
        OpenOptions::default()
    }
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Every write goes to the end of the file.
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Fails with `Exists` when the file is already there.
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
}

/// An open AccelFS file. Dropping it needs no I/O: data lives in the shared cache until a sync.
#[derive(Debug)]
pub struct File {
    fs: FileSystem,
    ino: u64,
    generation: u32,
    pos: u64,
    readable: bool,
    writable: bool,
    append: bool,
}

impl File {
    pub(crate) fn new(fs: FileSystem, ino: u64, generation: u32, o: &OpenOptions) -> File {
        File {
            fs,
            ino,
            generation,
            pos: 0,
            readable: o.read,
            writable: o.write || o.append,
            append: o.append,
        }
    }

    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The generation of the inode this handle was opened on: `(ino, generation)` names one
    /// file for the life of the file system, even after its inode number is reused.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    fn need(&self, write: bool) -> Result<(), FsError> {
        if write && !self.writable {
            return Err(FsError::BadHandle("file not opened for writing".into()));
        }
        if !write && !self.readable {
            return Err(FsError::BadHandle("file not opened for reading".into()));
        }
        Ok(())
    }

    /// Reads at `offset` without moving the position; returns bytes read (0 at the end).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<usize, FsError> {
        self.need(false)?;
        self.fs
            .read_file(self.ino, Some(self.generation), offset, out)
    }

    /// Streams up to `len` bytes from `offset` to `deliver`, in order and without copying: each
    /// slice is the engine buffer the device read into, and the device is kept busy with many
    /// large commands in flight. The way to read a big file at device bandwidth. Returns the
    /// number of bytes delivered (less than `len` at the end of the file).
    pub fn read_stream(
        &self,
        offset: u64,
        len: u64,
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<u64, FsError> {
        self.need(false)?;
        self.fs
            .read_stream_file(self.ino, self.generation, offset, len, &mut |buf, range| {
                deliver(&buf[range])
            })
    }

    /// [`File::read_stream`] that hands over the engine buffers themselves, each with the part
    /// of it that belongs to the file range: a consumer on another thread (a parser) can then
    /// read the device's buffers with no copy at all. A buffer held goes back to the pool when
    /// dropped; until then the pool has that much less to lend, so hold a bounded number.
    pub fn read_stream_owned(
        &self,
        offset: u64,
        len: u64,
        mut deliver: impl FnMut(kura_engine::IoBuf, std::ops::Range<usize>),
    ) -> Result<u64, FsError> {
        self.need(false)?;
        self.fs
            .read_stream_file(self.ino, self.generation, offset, len, &mut deliver)
    }

    /// Reads exactly `out.len()` bytes at `offset`, or fails with `Invalid` at the end.
    pub fn read_exact_at(&self, offset: u64, out: &mut [u8]) -> Result<(), FsError> {
        let n = self.read_at(offset, out)?;
        if n != out.len() {
            return Err(FsError::Invalid(format!(
                "read of {} bytes at {offset} found only {n} before the end of the file",
                out.len()
            )));
        }
        Ok(())
    }

    /// Writes all of `data` at `offset` (growing the file as needed).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<usize, FsError> {
        self.need(true)?;
        self.fs
            .write_file(self.ino, Some(self.generation), offset, data)
    }

    /// Appends `data` at the end of the file; returns the offset it was written at.
    pub fn append(&mut self, data: &[u8]) -> Result<u64, FsError> {
        self.need(true)?;
        let ino = self.ino;
        let at = self.fs.with_handle(ino, self.generation, |g| {
            let at = g.inode(ino)?.size;
            g.write_at(ino, at, data)?;
            Ok(at)
        })?;
        self.pos = at + data.len() as u64;
        Ok(at)
    }

    pub fn set_len(&self, size: u64) -> Result<(), FsError> {
        self.need(true)?;
        self.fs
            .with_handle(self.ino, self.generation, |g| g.set_len(self.ino, size))
    }

    /// Makes this file's data and metadata durable, with every other metadata change made
    /// before it (the journal commits all pending metadata at once) and the data of files whose
    /// size or block map changed; other files' overwrites in place stay in the cache (format §7,
    /// "What an fsync writes"; `FileSystem::sync` writes everything). fsyncs of many threads
    /// that overlap share one commit and one flush (group commit).
    pub fn sync_all(&self) -> Result<(), FsError> {
        self.fs.group_commit(Some((self.ino, self.generation)))
    }

    /// Makes this file's data durable (fdatasync): after an overwrite that changed neither the
    /// size nor the block map, one write of the dirty blocks and one flush, without a journal
    /// commit; otherwise the same as [`File::sync_all`].
    pub fn sync_data(&self) -> Result<(), FsError> {
        self.fs.sync_data_of(self.ino, self.generation)
    }

    pub fn metadata(&self) -> Result<Metadata, FsError> {
        self.fs.check_handle(self.ino, self.generation)?;
        self.fs.metadata_of(self.ino)
    }

    pub fn len(&self) -> Result<u64, FsError> {
        Ok(self.metadata()?.size)
    }

    /// The byte ranges of the file that hold data, in order and merged, below its size;
    /// everything else below the size is a hole that reads as zeroes. A copy tool writes these
    /// ranges and leaves the rest as holes (seeking past them, then setting the length), so a
    /// sparse file — up to 2³² blocks are legal — never turns into that many zero bytes.
    pub fn allocated_ranges(&self) -> Result<Vec<std::ops::Range<u64>>, FsError> {
        self.fs
            .with_handle(self.ino, self.generation, |g| g.allocated_ranges(self.ino))
    }

    pub fn is_empty(&self) -> Result<bool, FsError> {
        Ok(self.len()? == 0)
    }
}

fn io_error(e: FsError) -> io::Error {
    io::Error::new(io::Error::from_raw_os_error(e.errno()).kind(), e)
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.read_at(self.pos, buf).map_err(io_error)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.append {
            self.append(buf).map_err(io_error)?;
            return Ok(buf.len());
        }
        let n = self.write_at(self.pos, buf).map_err(io_error)?;
        self.pos += n as u64;
        Ok(n)
    }

    /// Data is already in the file system's cache, where every handle sees it; durability is
    /// `sync_all`, as with `std::fs::File`.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(n) => {
                self.pos = n;
                return Ok(n);
            }
            SeekFrom::Current(d) => (self.pos, d),
            SeekFrom::End(d) => (self.len().map_err(io_error)?, d),
        };
        let pos = base.0.checked_add_signed(base.1).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the file",
            )
        })?;
        self.pos = pos;
        Ok(pos)
    }
}
