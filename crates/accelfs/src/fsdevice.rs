//! AccelFS blocks on an engine device: block `n` of `B` bytes is `B / device_block_size` device
//! blocks from LBA `n × B / device_block_size`, read and written through the blocking API.
//!
//! [`FsDevice::sibling`] views another queue pair of the same device the same way, so that
//! threads can do I/O side by side, each on a queue of its own; siblings share what describes
//! the device as a whole (read-only, the overlay, whether writes await a flush).

use crate::error::FsError;
use kura_engine::OpenError;
use kura_engine::{BlockDevice, BlockingIo, BufferPool, DeviceError, IoBuf, Request};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One read or write of whole AccelFS blocks for [`FsDevice::batch`].
#[derive(Debug)]
pub struct BatchOp {
    pub write: bool,
    pub block: u64,
    pub buf: IoBuf,
}

/// One piece of a [`FsDevice::stream_read`]: device blocks to read, or zeroes (a file hole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamPart {
    Device { block: u64, bytes: usize },
    Zero { bytes: usize },
}

/// A device seen in AccelFS blocks.
pub struct FsDevice {
    dev: Box<dyn BlockDevice>,
    block_size: usize,
    per_block: u64,
    blocks: u64,
    /// Set for a read-only mount: every write, zero and flush is refused with this reason, so
    /// nothing that mount path forgets to guard can change the image.
    read_only: Option<String>,
    /// Blocks whose newest contents are not on the device (journal images a read-only mount
    /// replayed in memory): every read returns these in their place.
    overlay: Arc<BTreeMap<u64, Vec<u8>>>,
    /// Whether a write or zero was issued, on this queue or a sibling, since the last completed
    /// flush (so it may not be durable yet): a journal commit flushes first when set, so that
    /// ordered data is durable before a commit block that makes it reachable can be. A flush
    /// on any queue covers writes completed on all of them (`BlockDevice::new_queue`).
    unflushed: Arc<AtomicBool>,
}

impl FsDevice {
    /// Views `dev` in blocks of `block_size` bytes, which must be a multiple of its block size.
    pub fn new(dev: Box<dyn BlockDevice>, block_size: usize) -> Result<Self, FsError> {
        let g = dev.geometry();
        let dbs = g.block_size as usize;
        if block_size < dbs || !block_size.is_multiple_of(dbs) {
            return Err(FsError::Invalid(format!("AccelFS block size {block_size} is not a multiple of the device's {dbs}-byte blocks")));
        }
        let per_block = (block_size / dbs) as u64;
        Ok(FsDevice {
            blocks: g.num_blocks / per_block,
            dev,
            block_size,
            per_block,
            read_only: None,
            overlay: Arc::default(),
            unflushed: Arc::default(),
        })
    }

    /// The same view of another queue pair of the device, for another thread's I/O; `None`
    /// when the device has a single queue (then threads must share this one).
    pub fn sibling(&self) -> Option<Result<FsDevice, OpenError>> {
        let dev = match self.dev.new_queue()? {
            Ok(dev) => dev,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(FsDevice {
            dev,
            block_size: self.block_size,
            per_block: self.per_block,
            blocks: self.blocks,
            read_only: self.read_only.clone(),
            overlay: Arc::clone(&self.overlay),
            unflushed: Arc::clone(&self.unflushed),
        }))
    }

    /// From now on refuses every write, zero and flush (a read-only mount), and serves reads of
    /// the blocks in `overlay` from it instead of the device. Siblings made before are not
    /// changed: call it before making any.
    pub fn make_read_only(&mut self, why: &str, overlay: BTreeMap<u64, Vec<u8>>) {
        self.read_only = Some(why.to_string());
        self.overlay = Arc::new(overlay);
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.read_only.is_some()
    }

    fn writable(&self) -> Result<(), FsError> {
        match &self.read_only {
            Some(why) => Err(FsError::ReadOnly(why.clone())),
            None => Ok(()),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Whole AccelFS blocks on the device.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    pub fn read(&mut self, block: u64) -> Result<Vec<u8>, FsError> {
        self.read_many(block, 1)
    }

    /// `count` consecutive blocks from `block`, in one buffer.
    pub fn read_many(&mut self, block: u64, count: u64) -> Result<Vec<u8>, FsError> {
        self.check(block, count)?;
        let mut out = vec![0u8; count as usize * self.block_size];
        self.dev.read_blocks(block * self.per_block, &mut out)?;
        apply_overlay(&self.overlay, self.block_size, block, &mut out);
        Ok(out)
    }

    /// Writes whole blocks from `block`.
    pub fn write(&mut self, block: u64, data: &[u8]) -> Result<(), FsError> {
        self.writable()?;
        if data.is_empty() || !data.len().is_multiple_of(self.block_size) {
            return Err(FsError::Invalid(format!(
                "write of {} bytes is not whole {}-byte blocks",
                data.len(),
                self.block_size
            )));
        }
        self.check(block, (data.len() / self.block_size) as u64)?;
        self.unflushed.store(true, Ordering::Relaxed);
        self.dev.write_blocks(block * self.per_block, data)?;
        Ok(())
    }

    /// Zeroes `count` blocks from `block`.
    pub fn zero(&mut self, block: u64, count: u64) -> Result<(), FsError> {
        self.writable()?;
        self.check(block, count)?;
        self.unflushed.store(true, Ordering::Relaxed);
        self.dev
            .zero_blocks(block * self.per_block, count * self.per_block)?;
        Ok(())
    }

    pub fn flush(&mut self) -> Result<(), FsError> {
        self.writable()?;
        self.dev.flush_all()?;
        self.unflushed.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// Whether a write or zero was issued since the last completed flush.
    pub fn has_unflushed_writes(&self) -> bool {
        self.unflushed.load(Ordering::Relaxed)
    }

    /// Waits, for a bounded time, until no command is in flight on this queue, dropping the
    /// completions (and so the buffers) of any that were; errors on the way are ignored, since
    /// whoever submitted those commands is being told of a failure. Called when a poll fails
    /// with commands in flight: left there, they would complete into the next batch on this
    /// queue under tags that batch also uses, and hand it another read's bytes.
    fn settle(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let mut sink = Vec::new();
        while self.dev.in_flight() > 0 && std::time::Instant::now() < deadline {
            if self.dev.poll(&mut sink, 1).is_err() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            sink.clear();
        }
    }

    /// Runs every operation at queue depth (submitting until the queue is full, reaping as
    /// completions arrive) and returns them with their buffers, reads filled in. Every operation
    /// is waited for even after a failure, so no buffer is left with the device; the first error
    /// is returned.
    pub fn batch(&mut self, ops: Vec<BatchOp>) -> Result<Vec<BatchOp>, FsError> {
        self.batch_each(ops, |_, _| {})
    }

    /// Like [`FsDevice::batch`], calling `on_done(index, buffer)` for each operation that
    /// succeeds as soon as it completes, while the others are still in flight (so a reader can
    /// copy one piece out while the device fills the next).
    pub fn batch_each(
        &mut self,
        mut ops: Vec<BatchOp>,
        mut on_done: impl FnMut(usize, &IoBuf),
    ) -> Result<Vec<BatchOp>, FsError> {
        for op in &ops {
            if op.write {
                self.writable()?;
                self.unflushed.store(true, Ordering::Relaxed);
            }
            if op.buf.is_empty() || !op.buf.len().is_multiple_of(self.block_size) {
                return Err(FsError::Invalid(format!(
                    "batched I/O of {} bytes is not whole {}-byte blocks",
                    op.buf.len(),
                    self.block_size
                )));
            }
            self.check(op.block, (op.buf.len() / self.block_size) as u64)?;
        }
        let mut first_error: Option<DeviceError> = None;
        let mut done = Vec::with_capacity(ops.len());
        let mut next = 0;
        let mut taken: Vec<Option<IoBuf>> = ops
            .iter_mut()
            .map(|op| Some(std::mem::replace(&mut op.buf, IoBuf::heap(0, 1))))
            .collect();
        while next < ops.len() || self.dev.in_flight() > 0 {
            while next < ops.len() && first_error.is_none() {
                let op = &ops[next];
                let Some(buf) = taken[next].take() else { break };
                let blocks = (buf.len() / self.block_size) as u64 * self.per_block;
                let lba = op.block * self.per_block;
                let req = if op.write {
                    Request::write(next as u64, lba, blocks, buf)
                } else {
                    Request::read(next as u64, lba, blocks, buf)
                };
                match self.dev.submit(req) {
                    Ok(()) => next += 1,
                    Err(rejected) => {
                        taken[next] = rejected.request.buf;
                        if matches!(rejected.error, DeviceError::QueueFull { .. })
                            && self.dev.in_flight() > 0
                        {
                            break;
                        }
                        first_error = Some(rejected.error);
                    }
                }
            }
            if first_error.is_some() {
                next = ops.len();
            }
            if self.dev.in_flight() == 0 {
                break;
            }
            let before = done.len();
            if let Err(e) = self.dev.poll(&mut done, 1) {
                first_error.get_or_insert(e);
                self.settle();
                break;
            }
            for c in &mut done[before..] {
                match (&c.status, &mut c.buf) {
                    (Err(e), _) => {
                        first_error.get_or_insert_with(|| e.clone());
                    }
                    (Ok(()), Some(buf)) if first_error.is_none() => {
                        if let Some(op) = ops.get(c.tag as usize).filter(|op| !op.write) {
                            apply_overlay(&self.overlay, self.block_size, op.block, buf);
                        }
                        on_done(c.tag as usize, buf)
                    }
                    _ => {}
                }
            }
        }
        for c in done {
            if let (Some(slot), Some(buf)) = (taken.get_mut(c.tag as usize), c.buf) {
                *slot = Some(buf);
            }
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
        for (op, buf) in ops.iter_mut().zip(taken) {
            if let Some(buf) = buf {
                op.buf = buf;
            }
        }
        Ok(ops)
    }

    /// Reads `pieces` with up to `depth` commands in flight continuously (a new one is submitted
    /// as each completes) and hands each piece's bytes to `deliver` in order, straight from the
    /// engine buffer the device read into. Memory stays bounded by `depth` pieces.
    pub fn stream_read(
        &mut self,
        pieces: &[StreamPart],
        depth: usize,
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<(), FsError> {
        self.stream_read_owned(pieces, depth, |buf| deliver(&buf))
    }

    /// [`FsDevice::stream_read`] that hands over the buffers themselves (a zeroed one for a hole):
    /// the caller may keep them, so a consumer on another thread reads the device's buffers with
    /// no copy. Held buffers are no longer the pool's to lend, so the caller should bound them.
    pub fn stream_read_owned(
        &mut self,
        pieces: &[StreamPart],
        depth: usize,
        mut deliver: impl FnMut(IoBuf),
    ) -> Result<(), FsError> {
        for p in pieces {
            if let StreamPart::Device { block, bytes } = *p {
                if bytes == 0 || !bytes.is_multiple_of(self.block_size) {
                    return Err(FsError::Invalid(format!(
                        "streamed read of {bytes} bytes is not whole {}-byte blocks",
                        self.block_size
                    )));
                }
                self.check(block, (bytes / self.block_size) as u64)?;
            }
        }
        let depth = depth.max(1);
        // Completed pieces waiting for their turn: a buffer, or a count of zero bytes.
        let mut ready: std::collections::BTreeMap<usize, Result<IoBuf, usize>> = Default::default();
        let (mut next_submit, mut next_deliver) = (0usize, 0usize);
        let mut failure: Option<DeviceError> = None;
        let mut done = Vec::new();
        while next_deliver < pieces.len() && failure.is_none() {
            while next_submit < pieces.len() && self.dev.in_flight() + ready.len() < depth {
                match pieces[next_submit] {
                    StreamPart::Zero { bytes } => {
                        ready.insert(next_submit, Err(bytes));
                    }
                    StreamPart::Device { block, bytes } => {
                        let buf = BufferPool::global()
                            .alloc(bytes)
                            .unwrap_or_else(|_| IoBuf::zeroed(bytes));
                        let blocks = (bytes / self.block_size) as u64 * self.per_block;
                        let req =
                            Request::read(next_submit as u64, block * self.per_block, blocks, buf);
                        if let Err(rejected) = self.dev.submit(req) {
                            if matches!(rejected.error, DeviceError::QueueFull { .. })
                                && self.dev.in_flight() > 0
                            {
                                break;
                            }
                            failure = Some(rejected.error);
                            break;
                        }
                    }
                }
                next_submit += 1;
            }
            while let Some(piece) = ready.remove(&next_deliver) {
                match piece {
                    Ok(buf) => deliver(buf),
                    Err(bytes) => deliver(IoBuf::zeroed(bytes)),
                }
                next_deliver += 1;
            }
            if next_deliver == pieces.len() || failure.is_some() || self.dev.in_flight() == 0 {
                continue;
            }
            done.clear();
            if let Err(e) = self.dev.poll(&mut done, 1) {
                failure = Some(e);
                break;
            }
            for c in done.drain(..) {
                match c.status {
                    Ok(()) => match c.buf {
                        Some(mut buf) => {
                            if let Some(StreamPart::Device { block, .. }) =
                                pieces.get(c.tag as usize)
                            {
                                apply_overlay(&self.overlay, self.block_size, *block, &mut buf);
                            }
                            ready.insert(c.tag as usize, Ok(buf));
                        }
                        None => {
                            failure.get_or_insert(DeviceError::Offline {
                                reason: "a read completed without its buffer".into(),
                            });
                        }
                    },
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
        }
        // Never leave a buffer with the device.
        while self.dev.in_flight() > 0 {
            done.clear();
            if let Err(e) = self.dev.poll(&mut done, 1) {
                failure.get_or_insert(e);
                self.settle();
                break;
            }
        }
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Gives the device back.
    pub fn into_device(self) -> Box<dyn BlockDevice> {
        self.dev
    }

    fn check(&self, block: u64, count: u64) -> Result<(), FsError> {
        if block.checked_add(count).is_none_or(|end| end > self.blocks) {
            return Err(FsError::Invalid(format!(
                "blocks {block}+{count} are past the end of a {}-block device",
                self.blocks
            )));
        }
        Ok(())
    }
}

/// Lays `overlay`'s images over `buf`, which holds the blocks from `block` on.
fn apply_overlay(overlay: &BTreeMap<u64, Vec<u8>>, block_size: usize, block: u64, buf: &mut [u8]) {
    if overlay.is_empty() {
        return;
    }
    let count = (buf.len() / block_size) as u64;
    for (&b, img) in overlay.range(block..block.saturating_add(count)) {
        let at = (b - block) as usize * block_size;
        buf[at..at + block_size].copy_from_slice(&img[..block_size]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kura_engine::backend::common::QueueOptions;
    use kura_engine::backend::mem::MemDevice;
    use kura_engine::device::{Completion, Geometry, Rejected};
    use kura_engine::DeviceResult;

    /// A RAM disk whose queue breaks once: the first poll with commands in flight fails and
    /// hands nothing back, as an `io_uring_enter` error would; later polls work.
    struct BreaksOnce {
        inner: MemDevice,
        broken: bool,
    }

    impl BlockDevice for BreaksOnce {
        fn geometry(&self) -> Geometry {
            self.inner.geometry()
        }
        fn describe(&self) -> String {
            "breaks-once".into()
        }
        fn submit(&mut self, req: Request) -> Result<(), Rejected> {
            self.inner.submit(req)
        }
        fn ring_doorbell(&mut self) -> DeviceResult<()> {
            self.inner.ring_doorbell()
        }
        fn poll(&mut self, out: &mut Vec<Completion>, min: usize) -> DeviceResult<usize> {
            if !self.broken && self.inner.in_flight() > 0 {
                self.broken = true;
                return Err(DeviceError::Offline {
                    reason: "the queue broke".into(),
                });
            }
            self.inner.poll(out, min)
        }
        fn in_flight(&self) -> usize {
            self.inner.in_flight()
        }
    }

    fn read_op(block: u64) -> BatchOp {
        BatchOp {
            write: false,
            block,
            buf: IoBuf::zeroed(4096),
        }
    }

    /// Sixteen blocks, block `b` filled with `b + 1`, seen through a queue that breaks once.
    fn breaking() -> FsDevice {
        let mem = MemDevice::new(64 << 10, QueueOptions::default());
        let storage = mem.storage();
        let mut dev = FsDevice::new(Box::new(mem), 4096).unwrap();
        for b in 0..16u64 {
            dev.write(b, &vec![b as u8 + 1; 4096]).unwrap();
        }
        let inner = MemDevice::with_storage(storage, QueueOptions::default());
        FsDevice::new(
            Box::new(BreaksOnce {
                inner,
                broken: false,
            }),
            4096,
        )
        .unwrap()
    }

    #[test]
    fn a_batch_cut_short_by_a_broken_poll_leaves_nothing_for_the_next() {
        let mut dev = breaking();
        assert!(dev.batch(vec![read_op(1), read_op(2)]).is_err());
        assert_eq!(dev.dev.in_flight(), 0, "commands were left in flight");
        // Without the wait, blocks 1 and 2 would complete into this batch as its ops 0 and 1.
        let done = dev.batch(vec![read_op(7), read_op(9)]).unwrap();
        assert!(done[0].buf.iter().all(|&b| b == 8));
        assert!(done[1].buf.iter().all(|&b| b == 10));
    }

    #[test]
    fn a_stream_cut_short_by_a_broken_poll_leaves_nothing_for_the_next() {
        let mut dev = breaking();
        let pieces = [
            StreamPart::Device {
                block: 1,
                bytes: 4096,
            },
            StreamPart::Device {
                block: 2,
                bytes: 4096,
            },
        ];
        assert!(dev.stream_read(&pieces, 4, |_| {}).is_err());
        assert_eq!(dev.dev.in_flight(), 0, "commands were left in flight");
        let mut got = Vec::new();
        let again = [StreamPart::Device {
            block: 5,
            bytes: 4096,
        }];
        dev.stream_read(&again, 4, |b| got.extend_from_slice(b))
            .unwrap();
        assert!(got.len() == 4096 && got.iter().all(|&b| b == 6));
    }
}
