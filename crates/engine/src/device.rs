//! The one device interface every backend and every virtual drive implements.
//!
//! It follows NVMe queue-pair semantics: a caller *submits* commands on LBA ranges, rings the
//! doorbell, and later *polls* completions, which may arrive in any order and carry their own
//! status. One `BlockDevice` value is one queue pair, driven from one thread (`&mut self`); layers
//! that need sharing wrap it. Commands larger than [`Geometry::max_transfer`] are split by the
//! backend and completed as one.

use crate::buffer::IoBuf;
use crate::error::{DeviceError, DeviceResult, OpenError};
use std::fmt;

/// The shape of a device: how it is addressed and how much it accepts at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes; every LBA addresses one such block.
    pub block_size: u32,
    /// Number of logical blocks.
    pub num_blocks: u64,
    /// Largest transfer of one command in bytes; bigger requests are split into commands of this size.
    pub max_transfer: u32,
    /// Commands that may be in flight at once on this queue pair.
    pub queue_depth: u32,
    /// Alignment in bytes that data buffers must have (e.g. 512 or 4096 with O_DIRECT; 1 when any).
    pub buffer_alignment: u32,
}

impl Geometry {
    /// Capacity in bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.num_blocks * u64::from(self.block_size)
    }

    /// Largest transfer of one command in blocks.
    pub fn max_transfer_blocks(&self) -> u32 {
        (self.max_transfer / self.block_size).max(1)
    }
}

/// Default largest transfer per command (1 MiB, as NVMe drives and SNAcc split at).
pub const DEFAULT_MAX_TRANSFER: u32 = 1 << 20;
/// Default queue depth of one queue pair.
pub const DEFAULT_QUEUE_DEPTH: u32 = 128;
/// Largest queue depth any backend accepts.
pub const MAX_QUEUE_DEPTH: u32 = 4096;

/// What a command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// Read blocks into the request's buffer.
    Read,
    /// Write the request's buffer to blocks.
    Write,
    /// Make every completed write durable.
    Flush,
    /// Set blocks to zero without a data buffer.
    WriteZeroes,
    /// Tell the device the blocks' contents are no longer needed; they read back as zeroes here.
    Discard,
}

impl Opcode {
    /// True for commands that change the device's contents or durability.
    pub fn is_mutation(self) -> bool {
        !matches!(self, Opcode::Read)
    }

    /// True for commands that carry a data buffer.
    pub fn has_data(self) -> bool {
        matches!(self, Opcode::Read | Opcode::Write)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Opcode::Read => "read",
            Opcode::Write => "write",
            Opcode::Flush => "flush",
            Opcode::WriteZeroes => "write-zeroes",
            Opcode::Discard => "discard",
        })
    }
}

/// One command. The buffer moves into the device with the request and comes back with its
/// completion, so the data cannot be touched while the device owns it.
#[derive(Debug)]
pub struct Request {
    /// Caller's identifier, returned in the completion.
    pub tag: u64,
    pub op: Opcode,
    /// First block.
    pub lba: u64,
    /// Number of blocks (zero for `Flush`).
    pub blocks: u64,
    /// Data for `Read`/`Write`, at least `blocks * block_size` bytes; `None` otherwise.
    pub buf: Option<IoBuf>,
}

impl Request {
    /// Read `blocks` blocks at `lba` into `buf`.
    pub fn read(tag: u64, lba: u64, blocks: u64, buf: IoBuf) -> Self {
        Request {
            tag,
            op: Opcode::Read,
            lba,
            blocks,
            buf: Some(buf),
        }
    }

    /// Write the first `blocks` blocks of `buf` at `lba`.
    pub fn write(tag: u64, lba: u64, blocks: u64, buf: IoBuf) -> Self {
        Request {
            tag,
            op: Opcode::Write,
            lba,
            blocks,
            buf: Some(buf),
        }
    }

    /// Make every write completed so far durable.
    pub fn flush(tag: u64) -> Self {
        Request {
            tag,
            op: Opcode::Flush,
            lba: 0,
            blocks: 0,
            buf: None,
        }
    }

    /// Zero `blocks` blocks at `lba`.
    pub fn write_zeroes(tag: u64, lba: u64, blocks: u64) -> Self {
        Request {
            tag,
            op: Opcode::WriteZeroes,
            lba,
            blocks,
            buf: None,
        }
    }

    /// Discard `blocks` blocks at `lba`.
    pub fn discard(tag: u64, lba: u64, blocks: u64) -> Self {
        Request {
            tag,
            op: Opcode::Discard,
            lba,
            blocks,
            buf: None,
        }
    }

    /// Checks the request against a geometry: range, length, buffer size and alignment.
    /// Every backend calls this before accepting a command.
    pub fn validate(&self, geo: &Geometry) -> DeviceResult<()> {
        if self.op == Opcode::Flush {
            return Ok(());
        }
        if self.blocks == 0 {
            return Err(DeviceError::ZeroLength {
                op: self.op,
                lba: self.lba,
            });
        }
        let end = self.lba.checked_add(self.blocks);
        if end.is_none_or(|end| end > geo.num_blocks) {
            return Err(DeviceError::OutOfRange {
                op: self.op,
                lba: self.lba,
                blocks: self.blocks,
                capacity_blocks: geo.num_blocks,
            });
        }
        if self.op.has_data() {
            let need = self.blocks.saturating_mul(u64::from(geo.block_size));
            let have = self.buf.as_ref().map_or(0, |b| b.len() as u64);
            if have < need {
                return Err(DeviceError::BadBuffer {
                    op: self.op,
                    blocks: self.blocks,
                    need,
                    have,
                });
            }
            if let Some(buf) = &self.buf {
                let align = u64::from(geo.buffer_alignment.max(1));
                let addr = buf.as_ptr() as u64;
                if !addr.is_multiple_of(align) {
                    return Err(DeviceError::Misaligned {
                        what: "buffer address",
                        value: addr,
                        required: align,
                    });
                }
            }
        }
        Ok(())
    }

    /// The checks every backend makes before accepting a command: back-pressure when
    /// `in_flight` has reached the queue depth, then [`Request::validate`]. Hands the request
    /// back inside [`Rejected`] when it cannot be accepted.
    pub fn admit(self, geo: &Geometry, in_flight: usize) -> Result<Request, Rejected> {
        if in_flight >= geo.queue_depth as usize {
            return Err(Rejected::new(
                self,
                DeviceError::QueueFull {
                    depth: geo.queue_depth,
                },
            ));
        }
        match self.validate(geo) {
            Ok(()) => Ok(self),
            Err(e) => Err(Rejected::new(self, e)),
        }
    }

    /// Bytes of data this request transfers.
    pub fn data_bytes(&self, geo: &Geometry) -> u64 {
        if self.op.has_data() {
            self.blocks * u64::from(geo.block_size)
        } else {
            0
        }
    }
}

/// The outcome of one request: its tag, its status and its buffer back.
#[derive(Debug)]
pub struct Completion {
    pub tag: u64,
    pub op: Opcode,
    pub status: DeviceResult<()>,
    pub buf: Option<IoBuf>,
}

impl Completion {
    /// A completion for `req` with `status`, handing the buffer back.
    pub fn of(req: Request, status: DeviceResult<()>) -> Self {
        Completion {
            tag: req.tag,
            op: req.op,
            status,
            buf: req.buf,
        }
    }
}

/// A request the device did not accept, handed back whole with the reason.
#[derive(Debug)]
pub struct Rejected {
    pub request: Request,
    pub error: DeviceError,
}

impl Rejected {
    pub fn new(request: Request, error: DeviceError) -> Self {
        Rejected { request, error }
    }
}

impl From<Rejected> for DeviceError {
    fn from(r: Rejected) -> Self {
        r.error
    }
}

/// A block device with NVMe-style queue-pair semantics.
///
/// Contract for implementors:
/// - `submit` validates with [`Request::validate`] and returns the request inside [`Rejected`] when
///   it is invalid or when `in_flight() == queue_depth` (`QueueFull`); it never blocks or panics.
/// - Completions may be returned in any order; every accepted request completes exactly once.
/// - A failed flush poisons the device: later writes, write-zeroes, discards and flushes complete
///   with [`DeviceError::Poisoned`]. Reads still work.
///
/// # More queue pairs
///
/// One value is one queue pair, used from one thread. A program with several threads asks an
/// open device for more with [`BlockDevice::new_queue`], one per thread (or a small pool handed
/// out per call), as NVMe intends, rather than sharing one queue under a lock. The queues of one
/// device ("siblings") are independent: each has its own depth, in-flight requests and
/// completions, and none sees another's. They address the same blocks:
/// - a write completed on one queue is seen by every read submitted on any queue after that
///   completion (no order is promised between commands in flight on different queues);
/// - a flush on any queue makes durable every write that completed, on any queue, before the
///   flush was submitted (NVMe's flush covers the namespace; on files it is `fdatasync`, which
///   covers the whole file);
/// - a failed flush poisons every sibling, since what it lost may have been written through
///   any of them;
/// - what the device holds for its lifetime (an image's lock, the controller) is released when
///   the last sibling is dropped, whichever it is.
pub trait BlockDevice: Send {
    /// The device's geometry; constant for the device's lifetime.
    fn geometry(&self) -> Geometry;

    /// A short description of the backend and its target, for reports (e.g. `uring:/dev/loop0`).
    fn describe(&self) -> String;

    /// Queue one command. The command may not reach the device until [`BlockDevice::ring_doorbell`]
    /// or [`BlockDevice::poll`] is called, so callers can batch submissions.
    fn submit(&mut self, req: Request) -> Result<(), Rejected>;

    /// Send every queued command to the device without waiting for completions.
    fn ring_doorbell(&mut self) -> DeviceResult<()>;

    /// Ring the doorbell, then move completed commands into `out`, waiting until at least
    /// `min_complete` have been returned by this call (clamped to the number in flight).
    /// Returns how many were added. An `Err` means the queue itself broke, not one command.
    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize>;

    /// Commands accepted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;

    /// Appends this device's counters to `out`, then those of the devices it drives, each one
    /// level deeper ([`child_stats`]), so a stack reports top-down, e.g. `coalesce(cache(uring:..))`
    /// gives `[coalesce, cache, uring]`. Layers that forward to others must call this on them
    /// even when they count nothing themselves, or the stack below is hidden. The default appends
    /// nothing. Meant for reports (`kura serve` prints it when it stops), so it may allocate;
    /// it never changes the device.
    fn stats(&self, out: &mut Vec<DriveStats>) {
        let _ = out;
    }

    /// Which of the `blocks` blocks at `lba` hold data and which are holes that read as zeroes,
    /// as in-order [`Extent`]s covering exactly the range (see [`push_extent`]), or `None` when
    /// this device cannot tell (then every block counts as data). Callers ask only with nothing
    /// in flight, so completed writes are what the answer reflects. A block reported as a hole
    /// must read back as zeroes; when in doubt an implementation says data. The range is
    /// checked like a read's (`OutOfRange`, `ZeroLength`). The default says `None`.
    fn allocation(&mut self, lba: u64, blocks: u64) -> DeviceResult<Option<Vec<Extent>>> {
        check_range(&self.geometry(), lba, blocks)?;
        Ok(None)
    }

    /// Opens another queue pair on this open device, with the same geometry and options and
    /// nothing in flight (see "More queue pairs" above for what siblings share). `None` when
    /// this kind has a single queue: the default, and the right answer for a layer whose state
    /// (a cache, a fault model, a translation table) would be bypassed by a second queue to its
    /// child; callers then share the one queue. `Some(Err(..))` when the kind has more queues
    /// but none could be opened now (the controller's are all in use, the kernel refused a ring).
    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
        None
    }
}

/// What a run of blocks holds, as [`BlockDevice::allocation`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Allocation {
    /// The blocks may hold data (reads return what was written).
    Data,
    /// Nothing is stored: the blocks read as zeroes.
    Hole,
}

/// A run of `blocks` blocks with one [`Allocation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub blocks: u64,
    pub state: Allocation,
}

/// Appends `blocks` blocks of `state` to `out`, merged with the last extent when it has the same
/// state; zero blocks append nothing.
pub fn push_extent(out: &mut Vec<Extent>, blocks: u64, state: Allocation) {
    if blocks == 0 {
        return;
    }
    match out.last_mut() {
        Some(last) if last.state == state => last.blocks += blocks,
        _ => out.push(Extent { blocks, state }),
    }
}

/// Appends a child's answer for `blocks` blocks (`None`: all data) to `out`: what layers that
/// map a range onto one child pass up.
pub fn push_child_extents(out: &mut Vec<Extent>, child: Option<Vec<Extent>>, blocks: u64) {
    match child {
        Some(extents) => extents
            .into_iter()
            .for_each(|e| push_extent(out, e.blocks, e.state)),
        None => push_extent(out, blocks, Allocation::Data),
    }
}

/// The range check of [`BlockDevice::allocation`]: non-empty and inside the device.
pub fn check_range(geo: &Geometry, lba: u64, blocks: u64) -> DeviceResult<()> {
    if blocks == 0 {
        return Err(DeviceError::ZeroLength {
            op: Opcode::Read,
            lba,
        });
    }
    if lba
        .checked_add(blocks)
        .is_none_or(|end| end > geo.num_blocks)
    {
        return Err(DeviceError::OutOfRange {
            op: Opcode::Read,
            lba,
            blocks,
            capacity_blocks: geo.num_blocks,
        });
    }
    Ok(())
}

/// One layer of a device stack and its counters, as [`BlockDevice::stats`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveStats {
    /// The layer's kind as spec strings name it (`cache`, `coalesce`, `uring`).
    pub kind: String,
    /// How far below the device asked this layer sits: 0 for that device, 1 for its children.
    pub depth: usize,
    /// Counters since the layer was opened, in the layer's own order.
    pub counters: Vec<(&'static str, u64)>,
}

impl DriveStats {
    /// A layer of kind `kind` with no counters yet, at depth 0.
    pub fn new(kind: impl Into<String>) -> Self {
        DriveStats {
            kind: kind.into(),
            depth: 0,
            counters: Vec::new(),
        }
    }

    /// Adds the counter `name`.
    pub fn with(mut self, name: &'static str, value: u64) -> Self {
        self.counters.push((name, value));
        self
    }

    /// The counter `name`, if this layer has one.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
    }
}

/// `kind name=value name=value`, without the depth.
impl fmt::Display for DriveStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind)?;
        for (name, value) in &self.counters {
            write!(f, " {name}={value}")?;
        }
        Ok(())
    }
}

/// Appends what `child` reports to `out`, one level deeper than the caller: what a layer calls
/// for each device it drives, after appending its own entry.
pub fn child_stats(child: &(impl BlockDevice + ?Sized), out: &mut Vec<DriveStats>) {
    let from = out.len();
    child.stats(out);
    for entry in &mut out[from..] {
        entry.depth += 1;
    }
}

/// Every layer's counters of the stack under `dev`, top-down.
pub fn stats_of(dev: &(impl BlockDevice + ?Sized)) -> Vec<DriveStats> {
    let mut out = Vec::new();
    dev.stats(&mut out);
    out
}

impl<D: BlockDevice + ?Sized> BlockDevice for Box<D> {
    fn geometry(&self) -> Geometry {
        (**self).geometry()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        (**self).submit(req)
    }
    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        (**self).ring_doorbell()
    }
    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        (**self).poll(out, min_complete)
    }
    fn in_flight(&self) -> usize {
        (**self).in_flight()
    }
    fn stats(&self, out: &mut Vec<DriveStats>) {
        (**self).stats(out)
    }
    fn allocation(&mut self, lba: u64, blocks: u64) -> DeviceResult<Option<Vec<Extent>>> {
        (**self).allocation(lba, blocks)
    }
    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
        (**self).new_queue()
    }
}
