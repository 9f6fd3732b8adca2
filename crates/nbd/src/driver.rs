//! The device side of one export: a thread that owns the export's [`BlockDevice`] queue pair and
//! turns byte-addressed NBD jobs from every connection into device commands.
//!
//! All connections of an export send [`Job`]s to one driver, which keeps the device's queue full
//! (submits until `queue_depth`, rings the doorbell, polls, submits more), so requests from many
//! clients are in flight together, and routes each completion to the connection that asked
//! ([`Outgoing`] on that connection's reply channel). A `FUA` mutation is followed by a flush
//! before it is answered.
//!
//! **Sub-block I/O.** NBD addresses bytes; the device addresses blocks. Unless the server
//! advertises the device's block size as the minimum (`ServeOptions::device_min_block_size`,
//! which `kura serve` does; clients that agreed to it then get `EINVAL` for unaligned requests
//! before they reach this driver), the minimum is 1 and the driver serves unaligned requests:
//! an unaligned read reads the covering blocks and replies with the requested bytes; an unaligned
//! write or write-zeroes is a read-modify-write of its partial first and last blocks (whole blocks
//! in between are written directly). Read-modify-write runs only once every command in flight has
//! completed, and nothing else is submitted until it is done, so it is atomic with respect to all
//! other clients' I/O on the export. An unaligned trim discards only the whole blocks it covers
//! (trim is advisory). Aligned I/O never waits for this.
//!
//! **Block status.** `NBD_CMD_BLOCK_STATUS` asks the device ([`BlockDevice::allocation`]) about
//! the blocks covering the range, also once nothing is in flight (so every write answered
//! before is reflected), and reports holes as `HOLE|ZERO` and everything else (including a
//! device that cannot tell) as data, clipped to the bytes asked about, at most
//! [`MAX_EXTENTS`] extents (one with `REQ_ONE`).

use crate::protocol::{state_flags, BlockStatusExtent, ErrorCode, MAX_EXTENTS};
use kura_engine::buffer::POOL_ALIGN;
use kura_engine::{
    Allocation, BlockDevice, BlockingIo, BufferPool, Completion, DeviceError, DeviceResult,
    DriveStats, Geometry, IoBuf, Rejected, Request,
};
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

/// What the driver's channel carries: NBD requests, and requests for the device's counters
/// (answered between two rounds of I/O; see [`BlockDevice::stats`]).
pub(crate) enum ToDriver {
    Job(Job),
    Stats(Sender<Vec<DriveStats>>),
    /// Change the device once every earlier job is answered; the answer is its new capacity.
    Swap(Swap, Sender<Result<u64, String>>),
}

/// Changes an export's device in place (reopens it at a new size, say), on an idle queue. An
/// `Err` with `lost` set means the device in the slot can no longer serve: every later job fails.
pub type Swap = Box<dyn FnOnce(&mut Box<dyn BlockDevice>) -> Result<(), SwapError> + Send>;

/// Why a [`Swap`] failed.
#[derive(Debug, Clone)]
pub struct SwapError {
    pub message: String,
    /// The slot's device is not usable any more.
    pub lost: bool,
}

/// One NBD request, already checked against the export, on its way to the device.
pub(crate) struct Job {
    pub cookie: u64,
    /// Reply only after the command's writes are durable.
    pub fua: bool,
    pub kind: JobKind,
    /// Where the reply goes.
    pub reply: Sender<Outgoing>,
    /// In-flight bytes this request holds on its connection; handed back with the reply.
    pub cost: u64,
}

/// What a job does, in bytes of the export.
pub(crate) enum JobKind {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        data: IoBuf,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
    },
    Zero {
        offset: u64,
        len: u32,
    },
    /// `base:allocation` of the range; `one`: only the first extent (`REQ_ONE`).
    BlockStatus {
        offset: u64,
        len: u32,
        one: bool,
    },
}

/// The most bytes of descriptors one block-status reply holds: what such a request costs
/// against a connection's in-flight budget.
pub(crate) const MAX_STATUS_BYTES: u64 = 8 * MAX_EXTENTS as u64;

/// A reply for a connection's writer.
pub(crate) struct Outgoing {
    pub cookie: u64,
    /// Zero or an NBD error value.
    pub error: u32,
    /// For a successful read: the buffer and the slice of it to send.
    pub data: Option<ReadData>,
    /// For a successful block status: the extents.
    pub extents: Option<Vec<BlockStatusExtent>>,
    pub cost: u64,
}

/// Data of a read reply: `buf[skip..skip + len]`, the export's bytes at `offset`.
pub(crate) struct ReadData {
    pub buf: IoBuf,
    pub skip: usize,
    pub len: usize,
    pub offset: u64,
}

impl ReadData {
    pub fn bytes(&self) -> &[u8] {
        self.buf.get(self.skip..self.skip + self.len).unwrap_or(&[])
    }
}

/// A page-aligned buffer from the global pool, or the heap when the pool has no room. Only
/// requests the server's budgets admitted get here (`server.rs`: each connection's and the
/// global in-flight bytes), so the heap fallback never grows past the global budget.
pub(crate) fn alloc_buf(len: usize) -> IoBuf {
    BufferPool::global()
        .alloc(len)
        .unwrap_or_else(|_| IoBuf::heap(len, POOL_ALIGN))
}

/// The NBD error value for a device error.
pub(crate) fn error_code(e: &DeviceError) -> ErrorCode {
    ErrorCode::from_errno(e.errno())
}

/// What a command in flight is for.
enum Stage {
    /// Reply with `len` bytes from `skip` in the buffer (the export's bytes at `offset`).
    Read {
        skip: usize,
        len: usize,
        offset: u64,
    },
    /// A write, write-zeroes or discard; `advisory` ones (discard) succeed even when unsupported.
    Mutation { fua: bool, advisory: bool },
    /// The flush after a FUA mutation, or an NBD flush.
    Flush,
}

struct Pending {
    cookie: u64,
    reply: Sender<Outgoing>,
    cost: u64,
    stage: Stage,
}

impl Pending {
    fn send(self, error: u32, data: Option<ReadData>) {
        // The connection may be gone; its writer still drains the channel, and if even that is
        // gone there is nobody left to tell.
        let _ = self.reply.send(Outgoing {
            cookie: self.cookie,
            error,
            data,
            extents: None,
            cost: self.cost,
        });
    }
}

fn answer(job: Job, status: DeviceResult<()>) {
    answer_with(job, status.map(|()| None));
}

/// Answers `job` with its status and, on success, block-status extents if any.
fn answer_with(job: Job, status: DeviceResult<Option<Vec<BlockStatusExtent>>>) {
    let (error, extents) = match status {
        Ok(extents) => (0, extents),
        Err(e) => (error_code(&e).code(), None),
    };
    let _ = job.reply.send(Outgoing {
        cookie: job.cookie,
        error,
        data: None,
        extents,
        cost: job.cost,
    });
}

/// Runs the driver of one export until every job sender is gone and all work is done, then
/// hands the device back.
pub(crate) fn run(device: Box<dyn BlockDevice>, jobs: Receiver<ToDriver>) -> Box<dyn BlockDevice> {
    let geo = device.geometry();
    let mut d = Driver {
        dev: device,
        geo,
        bs: u64::from(geo.block_size.max(1)),
        backlog: VecDeque::new(),
        retry: VecDeque::new(),
        pending: HashMap::new(),
        next_tag: 1,
        broken: None,
        comps: Vec::new(),
    };
    let mut open = true;
    loop {
        if open && d.idle() {
            match jobs.recv() {
                Ok(msg) => d.take(msg),
                Err(_) => open = false,
            }
        }
        while open {
            match jobs.try_recv() {
                Ok(msg) => d.take(msg),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        if !open && d.idle() {
            break;
        }
        d.issue();
        d.reap();
    }
    d.dev
}

struct Driver {
    dev: Box<dyn BlockDevice>,
    geo: Geometry,
    bs: u64,
    backlog: VecDeque<Job>,
    /// Commands the device refused with `QueueFull`, to submit before anything else.
    retry: VecDeque<(Request, Pending)>,
    pending: HashMap<u64, Pending>,
    next_tag: u64,
    /// Set when `poll` failed: the queue is gone and every job fails with EIO.
    broken: Option<String>,
    comps: Vec<Completion>,
}

impl Driver {
    /// Queues a job, or answers a request for the device's counters at once.
    fn take(&mut self, msg: ToDriver) {
        match msg {
            ToDriver::Job(job) => self.backlog.push_back(job),
            // The asker may have given up waiting; then nobody needs the answer.
            ToDriver::Stats(reply) => {
                let _ = reply.send(kura_engine::device::stats_of(&self.dev));
            }
            ToDriver::Swap(swap, reply) => {
                let _ = reply.send(self.swap(swap));
            }
        }
    }

    /// Answers every job taken so far, then lets `swap` change the device and takes on its
    /// geometry. Jobs sent after the swap are still in the channel, so they meet the new device.
    fn swap(&mut self, swap: Swap) -> Result<u64, String> {
        while !self.idle() {
            self.issue();
            self.reap();
        }
        if let Some(reason) = &self.broken {
            return Err(format!(
                "the export's device queue failed earlier: {reason}"
            ));
        }
        let outcome = swap(&mut self.dev);
        if let Err(e) = &outcome {
            if e.lost {
                self.broken = Some(e.message.clone());
            }
        }
        self.geo = self.dev.geometry();
        self.bs = u64::from(self.geo.block_size.max(1));
        outcome
            .map(|()| self.geo.capacity_bytes())
            .map_err(|e| e.message)
    }

    fn idle(&self) -> bool {
        self.backlog.is_empty() && self.retry.is_empty() && self.pending.is_empty()
    }

    fn unaligned(&self, offset: u64, len: u64) -> bool {
        !offset.is_multiple_of(self.bs) || !len.is_multiple_of(self.bs)
    }

    /// Jobs that run synchronously on an idle queue: read-modify-writes and block status.
    fn needs_idle(&self, job: &Job) -> bool {
        match &job.kind {
            JobKind::Write { offset, data } => self.unaligned(*offset, data.len() as u64),
            JobKind::Zero { offset, len } => self.unaligned(*offset, u64::from(*len)),
            JobKind::BlockStatus { .. } => true,
            _ => false,
        }
    }

    /// Submits what the queue has room for: retries first, then the backlog in order.
    fn issue(&mut self) {
        while let Some((req, p)) = self.retry.pop_front() {
            if !self.submit(req, p) {
                return;
            }
        }
        while let Some(job) = self.backlog.pop_front() {
            if self.broken.is_some() {
                answer(
                    job,
                    Err(DeviceError::Offline {
                        reason: "device queue failed".into(),
                    }),
                );
                continue;
            }
            if self.needs_idle(&job) {
                if !self.pending.is_empty() {
                    self.backlog.push_front(job);
                    return;
                }
                if let JobKind::BlockStatus { offset, len, one } = job.kind {
                    let status = self.block_status(offset, len, one);
                    answer_with(job, status.map(Some));
                } else {
                    self.run_rmw(job);
                }
                continue;
            }
            if self.pending.len() >= self.geo.queue_depth as usize {
                self.backlog.push_front(job);
                return;
            }
            self.start(job);
            if !self.retry.is_empty() {
                return;
            }
        }
        if let Err(e) = self.dev.ring_doorbell() {
            self.fail_all(&e);
        }
    }

    /// Submits `req` for `p`; false when the device was full and the pair waits in `retry`.
    fn submit(&mut self, mut req: Request, p: Pending) -> bool {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        req.tag = tag;
        match self.dev.submit(req) {
            Ok(()) => {
                self.pending.insert(tag, p);
                true
            }
            Err(Rejected {
                request,
                error: DeviceError::QueueFull { .. },
            }) if !self.pending.is_empty() => {
                self.retry.push_front((request, p));
                false
            }
            Err(Rejected { request, error }) => {
                self.complete(p, Err(error), request.buf);
                true
            }
        }
    }

    fn start(&mut self, job: Job) {
        let bs = self.bs;
        let Job {
            cookie,
            fua,
            kind,
            reply,
            cost,
        } = job;
        let pending = |stage| Pending {
            cookie,
            reply,
            cost,
            stage,
        };
        let mutation = |advisory| Stage::Mutation { fua, advisory };
        match kind {
            JobKind::Read { offset, len } => {
                let first = offset / bs;
                let end = (offset + u64::from(len)).div_ceil(bs);
                let blocks = end - first;
                let skip = (offset - first * bs) as usize;
                let buf = alloc_buf((blocks * bs) as usize);
                let p = pending(Stage::Read {
                    skip,
                    len: len as usize,
                    offset,
                });
                self.submit(Request::read(0, first, blocks, buf), p);
            }
            JobKind::Write { offset, data } => {
                let blocks = data.len() as u64 / bs;
                let p = pending(mutation(false));
                self.submit(Request::write(0, offset / bs, blocks, data), p);
            }
            JobKind::Flush => {
                let p = pending(Stage::Flush);
                self.submit(Request::flush(0), p);
            }
            JobKind::Trim { offset, len } => {
                let first = offset.div_ceil(bs);
                let end = (offset + u64::from(len)) / bs;
                let p = pending(mutation(true));
                if end <= first {
                    // No whole block to discard; trim is only a hint.
                    p.send(0, None);
                    return;
                }
                self.submit(Request::discard(0, first, end - first), p);
            }
            JobKind::Zero { offset, len } => {
                let p = pending(mutation(false));
                let blocks = u64::from(len) / bs;
                self.submit(Request::write_zeroes(0, offset / bs, blocks), p);
            }
            // issue() runs these itself on an idle queue.
            JobKind::BlockStatus { .. } => pending(Stage::Flush).send(ErrorCode::Io.code(), None),
        }
    }

    /// The outcome of one command: reply, or go on to the FUA flush.
    fn complete(&mut self, p: Pending, status: DeviceResult<()>, buf: Option<IoBuf>) {
        match (status, &p.stage) {
            (Err(DeviceError::Unsupported { .. }), Stage::Mutation { advisory: true, .. }) => {
                p.send(0, None)
            }
            (Err(e), _) => p.send(error_code(&e).code(), None),
            (Ok(()), Stage::Read { skip, len, offset }) => {
                let (skip, len, offset) = (*skip, *len, *offset);
                match buf {
                    Some(buf) if buf.len() >= skip + len => p.send(
                        0,
                        Some(ReadData {
                            buf,
                            skip,
                            len,
                            offset,
                        }),
                    ),
                    _ => p.send(ErrorCode::Io.code(), None),
                }
            }
            (Ok(()), Stage::Mutation { fua: true, .. }) => {
                let p = Pending {
                    stage: Stage::Flush,
                    ..p
                };
                self.submit(Request::flush(0), p);
            }
            (Ok(()), _) => p.send(0, None),
        }
    }

    /// Polls at least one completion when anything is in flight.
    fn reap(&mut self) {
        if self.pending.is_empty() || self.broken.is_some() {
            return;
        }
        let mut comps = std::mem::take(&mut self.comps);
        match self.dev.poll(&mut comps, 1) {
            Ok(_) => {
                for c in comps.drain(..) {
                    if let Some(p) = self.pending.remove(&c.tag) {
                        self.complete(p, c.status, c.buf);
                    }
                }
            }
            Err(e) => self.fail_all(&e),
        }
        self.comps = comps;
    }

    /// The queue broke: every job in flight or waiting fails with EIO, and so will later ones.
    fn fail_all(&mut self, e: &DeviceError) {
        self.broken = Some(e.to_string());
        for (_, p) in self.pending.drain() {
            p.send(ErrorCode::Io.code(), None);
        }
        for (_, p) in self.retry.drain(..) {
            p.send(ErrorCode::Io.code(), None);
        }
    }

    /// The `base:allocation` extents of `len` bytes at `offset` (see the module docs): at least
    /// one, covering a prefix of the range (all of it unless clipped to [`MAX_EXTENTS`] or
    /// `one`).
    fn block_status(
        &mut self,
        offset: u64,
        len: u32,
        one: bool,
    ) -> DeviceResult<Vec<BlockStatusExtent>> {
        let bs = self.bs;
        let end = offset + u64::from(len);
        let first = offset / bs;
        let blocks = end.div_ceil(bs) - first;
        let mut out: Vec<BlockStatusExtent> = Vec::new();
        let mut at = first * bs;
        for e in self.dev.allocation(first, blocks)?.unwrap_or_default() {
            let e_end = at + e.blocks * bs;
            let (from, to) = (at.max(offset), e_end.min(end));
            at = e_end;
            if to <= from {
                continue;
            }
            let flags = match e.state {
                Allocation::Hole => state_flags::HOLE | state_flags::ZERO,
                Allocation::Data => 0,
            };
            // Within one request's u32 length, so the cast cannot truncate.
            let length = (to - from) as u32;
            let full = out.len() >= MAX_EXTENTS;
            match out.last_mut() {
                Some(last) if last.flags == flags => last.length += length,
                _ if full => break,
                _ => out.push(BlockStatusExtent { length, flags }),
            }
        }
        if out.is_empty() {
            // The device cannot tell: all data.
            out.push(BlockStatusExtent {
                length: len,
                flags: 0,
            });
        }
        if one {
            out.truncate(1);
        }
        Ok(out)
    }

    /// An unaligned write or write-zeroes, on an idle queue (see the module docs).
    fn run_rmw(&mut self, job: Job) {
        let status = match &job.kind {
            JobKind::Write { offset, data } => {
                self.rmw(*offset, data.len() as u64, Some(&data[..]))
            }
            JobKind::Zero { offset, len } => self.rmw(*offset, u64::from(*len), None),
            _ => Ok(()),
        };
        let status = status.and_then(|()| {
            if job.fua {
                self.dev.flush_all()
            } else {
                Ok(())
            }
        });
        answer(job, status);
    }

    /// Writes `data` (or zeroes when `None`) over `len` bytes at byte `offset`: partial blocks
    /// by read-modify-write, whole blocks directly.
    fn rmw(&mut self, offset: u64, len: u64, data: Option<&[u8]>) -> DeviceResult<()> {
        let bs = self.bs;
        let end = offset + len;
        let mut pos = offset;
        let mut block = vec![0u8; bs as usize];
        while pos < end {
            let lba = pos / bs;
            let in_block = (pos % bs) as usize;
            let block_end = (lba + 1) * bs;
            let src = (pos - offset) as usize;
            if in_block != 0 || end < block_end {
                let n = (block_end.min(end) - pos) as usize;
                self.dev.read_blocks(lba, &mut block)?;
                let dst = &mut block[in_block..in_block + n];
                match data {
                    Some(d) => dst.copy_from_slice(&d[src..src + n]),
                    None => dst.fill(0),
                }
                self.dev.write_blocks(lba, &block)?;
                pos += n as u64;
            } else {
                let run_end = end / bs * bs;
                let n = (run_end - pos) as usize;
                match data {
                    Some(d) => self.dev.write_blocks(lba, &d[src..src + n])?,
                    None => self.dev.zero_blocks(lba, n as u64 / bs)?,
                }
                pos = run_end;
            }
        }
        Ok(())
    }
}
