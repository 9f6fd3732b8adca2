//! A blocking convenience API over the asynchronous interface, for simple callers (tools, tests,
//! metadata paths). Each call submits, waits and returns; it needs an idle queue pair so that it
//! never swallows someone else's completion.

use crate::buffer::{BufferPool, IoBuf, POOL_ALIGN};
use crate::device::{BlockDevice, Completion, Request};
use crate::error::{DeviceError, DeviceResult};

/// Largest chunk a blocking call moves per command batch.
const CHUNK_BYTES: usize = 4 << 20;

/// Blocking helpers, available on every [`BlockDevice`].
pub trait BlockingIo: BlockDevice {
    /// Submits one request and waits for its completion.
    fn run(&mut self, req: Request) -> DeviceResult<Completion> {
        if self.in_flight() > 0 {
            return Err(DeviceError::Busy {
                in_flight: self.in_flight(),
            });
        }
        self.submit(req)?;
        let mut out = Vec::with_capacity(1);
        while out.is_empty() {
            self.poll(&mut out, 1)?;
        }
        // The queue was idle before, so the only completion is ours.
        out.pop().ok_or(DeviceError::Offline {
            reason: "completion lost".into(),
        })
    }

    /// Reads `out.len()` bytes (a whole number of blocks) starting at block `lba`.
    fn read_blocks(&mut self, lba: u64, out: &mut [u8]) -> DeviceResult<()> {
        let bs = self.block_len(out.len())?;
        for (i, chunk) in out.chunks_mut(CHUNK_BYTES).enumerate() {
            let first = lba + (i * CHUNK_BYTES / bs) as u64;
            let buf = io_buffer(chunk.len());
            let done = self.run(Request::read(0, first, (chunk.len() / bs) as u64, buf))?;
            done.status?;
            if let Some(buf) = done.buf {
                chunk.copy_from_slice(&buf[..chunk.len()]);
            }
        }
        Ok(())
    }

    /// Writes `data` (a whole number of blocks) starting at block `lba`.
    fn write_blocks(&mut self, lba: u64, data: &[u8]) -> DeviceResult<()> {
        let bs = self.block_len(data.len())?;
        for (i, chunk) in data.chunks(CHUNK_BYTES).enumerate() {
            let first = lba + (i * CHUNK_BYTES / bs) as u64;
            let mut buf = io_buffer(chunk.len());
            buf.copy_from_slice(chunk);
            self.run(Request::write(0, first, (chunk.len() / bs) as u64, buf))?
                .status?;
        }
        Ok(())
    }

    /// Makes every completed write durable.
    fn flush_all(&mut self) -> DeviceResult<()> {
        self.run(Request::flush(0))?.status
    }

    /// Zeroes `blocks` blocks at `lba`.
    fn zero_blocks(&mut self, lba: u64, blocks: u64) -> DeviceResult<()> {
        self.run(Request::write_zeroes(0, lba, blocks))?.status
    }

    /// Discards `blocks` blocks at `lba`.
    fn discard_blocks(&mut self, lba: u64, blocks: u64) -> DeviceResult<()> {
        self.run(Request::discard(0, lba, blocks))?.status
    }

    /// The block size, after checking that `len` is a non-zero whole number of blocks.
    fn block_len(&self, len: usize) -> DeviceResult<usize> {
        let bs = self.geometry().block_size as usize;
        if len == 0 || !len.is_multiple_of(bs) {
            return Err(DeviceError::Misaligned {
                what: "transfer length",
                value: len as u64,
                required: bs as u64,
            });
        }
        Ok(bs)
    }
}

impl<D: BlockDevice + ?Sized> BlockingIo for D {}

/// A page-aligned buffer from the global pool, or the heap when the pool is busy.
fn io_buffer(len: usize) -> IoBuf {
    BufferPool::global()
        .alloc(len)
        .unwrap_or_else(|_| IoBuf::heap(len, POOL_ALIGN))
}
