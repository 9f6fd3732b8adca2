//! Segment storage on a raw device (format section 2): the two superblock copies at bytes 0 and
//! 4096 and segment slot `i` at byte `S * (i + 1)`. The AccelFS placement (a file per slot) will
//! offer the same calls; the store touches the device only through them.

use crate::error::StoreError;
use crate::format::superblock::Superblock;
use crate::format::{FormatError, PAGE_SIZE};
use kura_engine::{BlockDevice, BlockingIo, BufferPool, IoBuf, Request};

/// Reads up to this size reuse their queue's buffer (kept between reads); larger ones (big
/// separated values) take a fresh one, so an idle queue holds no more than this.
const KEPT_BUFFER: usize = 256 << 10;

/// Refuses devices whose blocks do not tile a page.
fn check_device(dev: &dyn BlockDevice) -> Result<(), StoreError> {
    let bs = dev.geometry().block_size as usize;
    if bs == 0
        || !PAGE_SIZE.is_multiple_of(bs)
        || dev.geometry().capacity_bytes() < 2 * PAGE_SIZE as u64
    {
        return Err(StoreError::Invalid(format!(
            "{}: block size {bs} does not divide the {PAGE_SIZE}-byte page, or the device is smaller than two pages",
            dev.describe()
        )));
    }
    Ok(())
}

/// Both superblock copies of the store on `dev`, each decoded on its own.
pub(crate) fn read_superblocks(
    dev: &mut dyn BlockDevice,
) -> Result<[Result<Superblock, FormatError>; 2], StoreError> {
    check_device(dev)?;
    let mut both = vec![0u8; 2 * PAGE_SIZE];
    dev.read_blocks(0, &mut both)?;
    Ok([
        Superblock::decode(&both[..PAGE_SIZE]),
        Superblock::decode(&both[PAGE_SIZE..]),
    ])
}

pub(crate) struct RawSegments {
    dev: DevQueue,
    at: Placement,
    slot_count: u64,
}

/// Where page `page` of segment slot `slot` starts, in device blocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    segment_shift: u32,
    block_size: u64,
}

impl Placement {
    /// The device byte of byte `byte` of segment slot `slot` (slot 0 follows the superblock
    /// area, one segment long).
    fn byte(self, slot: u64, byte: u64) -> u64 {
        ((slot + 1) << self.segment_shift) + byte
    }

    pub(crate) fn lba(self, slot: u64, page: u32) -> u64 {
        self.byte(slot, u64::from(page) * PAGE_SIZE as u64) / self.block_size
    }
}

/// One queue of the device and the I/O buffer its reads reuse, so a page read costs no
/// allocation: the device fills the kept buffer and the caller copies out only what it keeps.
/// Run pages are written on such queues too (`Dev::write`).
pub(crate) struct DevQueue {
    dev: Box<dyn BlockDevice>,
    buf: Option<IoBuf>,
}

impl DevQueue {
    pub(crate) fn new(dev: Box<dyn BlockDevice>) -> Self {
        DevQueue { dev, buf: None }
    }

    /// Writes whole pages at `page` of `slot` (durable once a flush on any queue of the device
    /// that was submitted after this write completed has completed).
    pub(crate) fn write(
        &mut self,
        at: Placement,
        slot: u64,
        page: u32,
        data: &[u8],
    ) -> Result<(), StoreError> {
        debug_assert!(data.len().is_multiple_of(PAGE_SIZE));
        self.dev.write_blocks(at.lba(slot, page), data)?;
        Ok(())
    }

    /// Reads `pages` pages from page `page` of `slot` and hands them to `f`, in the kept
    /// buffer (or a fresh one for a large read).
    pub(crate) fn read_with<R>(
        &mut self,
        at: Placement,
        slot: u64,
        page: u32,
        pages: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, StoreError> {
        let lba = at.lba(slot, page);
        let len = pages * PAGE_SIZE;
        self.read_blocks_with(lba, len, f)
    }

    /// Reads `len` bytes (whole blocks) from block `lba` and hands them to `f`.
    fn read_blocks_with<R>(
        &mut self,
        lba: u64,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, StoreError> {
        let block_size = u64::from(self.dev.geometry().block_size);
        let mut buf = match self.buf.take() {
            Some(b) if b.capacity() >= len => b,
            _ => BufferPool::global()
                .alloc(len.max(PAGE_SIZE))
                .unwrap_or_else(|_| IoBuf::heap(len.max(PAGE_SIZE), PAGE_SIZE)),
        };
        buf.set_len(len);
        let blocks = (len as u64) / block_size;
        let done = self.dev.run(Request::read(0, lba, blocks, buf))?;
        done.status?;
        let Some(buf) = done.buf else {
            return Err(kura_engine::DeviceError::Offline {
                reason: "a read completed without its buffer".into(),
            }
            .into());
        };
        let out = f(&buf[..len]);
        if buf.capacity() <= KEPT_BUFFER {
            self.buf = Some(buf);
        }
        Ok(out)
    }

    /// A queue of this device's own for [`FrameWriter`], or `None` when it has one queue.
    pub(crate) fn frame_writer(&self) -> Option<Result<FrameWriter, StoreError>> {
        self.dev.new_queue().map(|r| {
            r.map(|dev| FrameWriter {
                dev,
                in_flight: false,
            })
            .map_err(|e| StoreError::Invalid(e.to_string()))
        })
    }

    /// Reads `len` bytes from byte `byte` of segment slot `slot`: the device blocks that hold
    /// them, from which only those bytes are copied out.
    pub(crate) fn read_bytes(
        &mut self,
        at: Placement,
        slot: u64,
        byte: u64,
        len: usize,
    ) -> Result<Vec<u8>, StoreError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let start = at.byte(slot, byte);
        let first = start / at.block_size;
        let blocks = (start + len as u64).div_ceil(at.block_size) - first;
        let skip = (start - first * at.block_size) as usize;
        let bytes = (blocks * at.block_size) as usize;
        self.read_blocks_with(first, bytes, |b| b[skip..skip + len].to_vec())
    }

    /// Another queue on the same device (see `BlockDevice::new_queue`), `None` when it has one.
    pub(crate) fn sibling(&self) -> Option<Result<DevQueue, StoreError>> {
        self.dev.new_queue().map(|r| {
            r.map(DevQueue::new)
                .map_err(|e| StoreError::Invalid(e.to_string()))
        })
    }
}

/// Writes the log's frames on a queue of their own without waiting for each write: a frame
/// is submitted and the committing writer goes on; the write is waited for before the next one
/// is submitted and before anything that must find it on the device ([`FrameWriter::settle`],
/// which a sync calls before its flush). One write at most is in flight, so frames reach the
/// device in log order. An unsynced frame has no durability promise, so a crash while its
/// write is in flight loses only what a crash before it would have.
pub(crate) struct FrameWriter {
    dev: Box<dyn BlockDevice>,
    in_flight: bool,
}

impl FrameWriter {
    /// Submits `data` (whole pages) for page `page` of `slot`, after the previous write ended.
    pub(crate) fn submit(
        &mut self,
        at: Placement,
        slot: u64,
        page: u32,
        data: &[u8],
    ) -> Result<(), StoreError> {
        self.settle()?;
        let block_size = u64::from(self.dev.geometry().block_size);
        let mut buf = BufferPool::global()
            .alloc(data.len())
            .unwrap_or_else(|_| IoBuf::heap(data.len(), PAGE_SIZE));
        buf.set_len(data.len());
        buf.copy_from_slice(data);
        let blocks = data.len() as u64 / block_size;
        self.dev
            .submit(Request::write(0, at.lba(slot, page), blocks, buf))
            .map_err(|r| StoreError::from(r.error))?;
        self.in_flight = true;
        self.dev.ring_doorbell()?;
        Ok(())
    }

    /// Waits for the write in flight, if any, and reports how it ended.
    pub(crate) fn settle(&mut self) -> Result<(), StoreError> {
        if !self.in_flight {
            return Ok(());
        }
        let mut done = Vec::with_capacity(1);
        while done.is_empty() {
            self.dev.poll(&mut done, 1)?;
        }
        self.in_flight = false;
        for c in done {
            c.status?;
        }
        Ok(())
    }
}

impl Drop for FrameWriter {
    /// A write still in flight completes before its queue closes (a store dropped without
    /// close still puts its last frame on the device); how it ended has no one to go to.
    fn drop(&mut self) {
        let _ = self.settle();
    }
}

impl RawSegments {
    /// The slots of `segment_shift`-sized segments that fit on `dev` after the superblock area.
    pub(crate) fn new(dev: Box<dyn BlockDevice>, segment_shift: u32) -> Result<Self, StoreError> {
        check_device(dev.as_ref())?;
        let slots = (dev.geometry().capacity_bytes() >> segment_shift).saturating_sub(1);
        let at = Placement {
            segment_shift,
            block_size: u64::from(dev.geometry().block_size),
        };
        Ok(RawSegments {
            dev: DevQueue::new(dev),
            at,
            slot_count: slots,
        })
    }

    pub(crate) fn slot_count(&self) -> u64 {
        self.slot_count
    }

    fn lba(&self, byte: u64) -> u64 {
        byte / self.at.block_size
    }

    /// How slots and pages map to device blocks, for reads on sibling queues.
    pub(crate) fn placement(&self) -> Placement {
        self.at
    }

    /// The device's own queue (writes, flushes, and reads when it has no siblings).
    pub(crate) fn queue(&mut self) -> &mut DevQueue {
        &mut self.dev
    }

    fn slot_byte(&self, slot: u64, page: u32) -> u64 {
        self.at.byte(slot, u64::from(page) * PAGE_SIZE as u64)
    }

    /// Writes copy `copy` (0 = A, 1 = B) and flushes.
    pub(crate) fn write_superblock(
        &mut self,
        copy: usize,
        sb: &Superblock,
    ) -> Result<(), StoreError> {
        let lba = self.lba((copy * PAGE_SIZE) as u64);
        self.dev.dev.write_blocks(lba, &sb.encode())?;
        self.dev.dev.flush_all()?;
        Ok(())
    }

    /// Writes whole pages at `page` of `slot` (not durable until [`RawSegments::flush`]).
    pub(crate) fn write(&mut self, slot: u64, page: u32, data: &[u8]) -> Result<(), StoreError> {
        debug_assert!(data.len().is_multiple_of(PAGE_SIZE) && slot < self.slot_count);
        let lba = self.lba(self.slot_byte(slot, page));
        self.dev.dev.write_blocks(lba, data)?;
        Ok(())
    }

    /// Reads `pages` pages at `page` of `slot`.
    pub(crate) fn read(
        &mut self,
        slot: u64,
        page: u32,
        pages: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let at = self.placement();
        self.dev.read_with(at, slot, page, pages, <[u8]>::to_vec)
    }

    pub(crate) fn flush(&mut self) -> Result<(), StoreError> {
        self.dev.dev.flush_all()?;
        Ok(())
    }
}
