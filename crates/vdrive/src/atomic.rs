//! `atomic(CHILD)?log=SIZE` — LeapIO's atomic-write drive: groups of writes that reach the media
//! all or nothing across a crash.
//!
//! The last `log` bytes of the child (4 MiB by default) are a redo log; the drive's capacity is
//! the child's minus the log. A group ([`AtomicDrive::write_atomic`], a list of `(lba, data)`
//! writes committed as one) is made durable in three steps:
//! 1. **commit**: one log record (a header naming every write's LBA and length, with a CRC-32C
//!    of the header and one of the data, followed by the data) is written at the start of the
//!    log, then the child is flushed. From here the group survives a crash.
//! 2. **apply**: the writes go to their home blocks, then the child is flushed.
//! 3. **checkpoint**: the record's first block is overwritten with zeroes, then the child is
//!    flushed, so a later crash can never replay the group over newer data.
//!
//! On open, a record whose header and data checksums both hold is replayed (apply and
//! checkpoint again, which is idempotent); a torn record (a checksum fails) was never
//! acknowledged and is dropped. So after a crash each group is entirely old or entirely new, and
//! every acknowledged group is there.
//!
//! Through the [`BlockDevice`] interface, a `Write` of more than one block that fits the log
//! (header included) is one atomic group, so it too is all or nothing, and is durable once
//! acknowledged. Writes waiting at the same doorbell are committed together as one group (group
//! commit: fewer flushes, and each write is still all or nothing). Larger writes, and
//! write-zeroes and discards, go straight to the child and are as atomic as the child makes them
//! (one block, for the engine's devices); single-block writes go straight through too, a block
//! being the child's unit of atomicity. Reads and flushes pass through. A group waits for every
//! command already on the child, so atomic writes are serialised with the rest of the traffic.
//! If a step after the commit fails the drive refuses further mutations (the group is replayed at
//! the next open); reads keep working.

use kura_engine::backend::common::hand_over;
use kura_engine::crc32c::crc32c;
use kura_engine::open::ChildOpener;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, BlockingIo, Completion, DeviceError, DeviceResult, Geometry, Opcode, OpenError,
    Rejected, Request, Spec,
};
use std::collections::{HashMap, VecDeque};

/// Options of `atomic(...)`.
pub const ATOMIC_OPTIONS: &[&str] = &["log"];
/// Log area when none is given.
pub const DEFAULT_LOG_BYTES: u64 = 4 << 20;
/// First eight bytes of a log record.
const MAGIC: &[u8; 8] = b"KURAATOM";
/// Fixed part of a record header: magic, sequence, entry count, data blocks, data CRC, header CRC.
const HEADER_FIXED: usize = 32;
/// Bytes per write named in a header: LBA and block count.
const ENTRY_BYTES: usize = 16;

/// Why an atomic group was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AtomicError {
    /// The group's data and header do not fit the log.
    #[error("atomic group of {blocks} block(s) plus a {header_blocks}-block header does not fit the {log_blocks}-block log")]
    TooLarge {
        blocks: u64,
        header_blocks: u64,
        log_blocks: u64,
    },
    /// A group with no writes.
    #[error("atomic group has no writes")]
    Empty,
    /// One write's length is zero or not a whole number of blocks.
    #[error("atomic write at LBA {lba} has {len} bytes, not a non-zero multiple of the {block_size}-byte block")]
    BadLength {
        lba: u64,
        len: usize,
        block_size: u32,
    },
    /// One write ends past the drive's capacity.
    #[error(
        "atomic write of {blocks} block(s) at LBA {lba} is past the end ({capacity_blocks} blocks)"
    )]
    OutOfRange {
        lba: u64,
        blocks: u64,
        capacity_blocks: u64,
    },
    /// The child failed a step.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Counts of what the drive did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AtomicStats {
    /// Groups committed (each record written to the log).
    pub groups: u64,
    /// Caller writes inside those groups.
    pub group_writes: u64,
    /// Multi-block writes too large for the log, passed straight through.
    pub large_passthrough: u64,
    /// Groups replayed from the log when the drive was opened.
    pub replayed: u64,
    /// Torn records dropped when the drive was opened.
    pub torn: u64,
}

/// A write named in a log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    lba: u64,
    blocks: u64,
}

/// The atomic-write drive.
pub struct AtomicDrive {
    child: Box<dyn BlockDevice>,
    geo: Geometry,
    /// First block of the log on the child.
    log_start: u64,
    log_blocks: u64,
    seq: u64,
    /// Multi-block writes waiting to be committed.
    pending: VecDeque<Request>,
    /// Pass-through commands the child refused for now.
    backlog: VecDeque<Request>,
    /// Child tag → caller's tag.
    sent: HashMap<u64, u64>,
    next_tag: u64,
    ready: VecDeque<Completion>,
    accepted: usize,
    poison: FlushPoison,
    /// Set when a step after a commit failed: mutations are refused from then on.
    broken: Option<String>,
    stats: AtomicStats,
}

impl AtomicDrive {
    /// Opens the drive over `child` (idle), reserving its last `log_bytes` for the log, and
    /// replays a committed group left by a crash.
    pub fn new(child: Box<dyn BlockDevice>, log_bytes: u64) -> Result<Self, OpenError> {
        let cgeo = child.geometry();
        let bs = u64::from(cgeo.block_size);
        let name = child.describe();
        if log_bytes < 2 * bs || !log_bytes.is_multiple_of(bs) {
            return Err(OpenError::Invalid(format!(
                "atomic({name}): log {log_bytes} must be a multiple of the block size ({bs}) and at least two blocks"
            )));
        }
        let log_blocks = log_bytes / bs;
        if log_blocks >= cgeo.num_blocks {
            return Err(OpenError::Invalid(format!(
                "atomic({name}): the {log_bytes}-byte log leaves no room on a {}-byte device",
                cgeo.capacity_bytes()
            )));
        }
        let log_start = cgeo.num_blocks - log_blocks;
        let geo = Geometry {
            num_blocks: log_start,
            ..cgeo
        };
        let mut drive = AtomicDrive {
            child,
            geo,
            log_start,
            log_blocks,
            seq: 0,
            pending: VecDeque::new(),
            backlog: VecDeque::new(),
            sent: HashMap::new(),
            next_tag: 1,
            ready: VecDeque::new(),
            accepted: 0,
            poison: FlushPoison::default(),
            broken: None,
            stats: AtomicStats::default(),
        };
        drive.recover().map_err(|e| {
            OpenError::Invalid(format!("atomic({name}): recovering the log failed: {e}"))
        })?;
        Ok(drive)
    }

    pub fn stats(&self) -> AtomicStats {
        self.stats
    }

    /// Blocks of the log area.
    pub fn log_blocks(&self) -> u64 {
        self.log_blocks
    }

    /// Header blocks a record of `entries` writes needs.
    fn header_blocks(&self, entries: usize) -> u64 {
        let bs = self.geo.block_size as usize;
        (HEADER_FIXED + entries * ENTRY_BYTES).div_ceil(bs) as u64
    }

    /// Commits `writes` as one group: after a crash either all of them are on the drive or none.
    /// Returns once the group is durable. Waits for every command in flight on the drive first.
    pub fn write_atomic(&mut self, writes: &[(u64, &[u8])]) -> Result<(), AtomicError> {
        let bs = self.geo.block_size as usize;
        let mut entries = Vec::with_capacity(writes.len());
        for &(lba, data) in writes {
            if data.is_empty() || !data.len().is_multiple_of(bs) {
                return Err(AtomicError::BadLength {
                    lba,
                    len: data.len(),
                    block_size: self.geo.block_size,
                });
            }
            let blocks = (data.len() / bs) as u64;
            if lba
                .checked_add(blocks)
                .is_none_or(|end| end > self.geo.num_blocks)
            {
                return Err(AtomicError::OutOfRange {
                    lba,
                    blocks,
                    capacity_blocks: self.geo.num_blocks,
                });
            }
            entries.push(Entry { lba, blocks });
        }
        self.fits(&entries)?;
        self.check_mutable(Opcode::Write)?;
        self.drain()?;
        self.commit(&entries, |out| {
            let mut at = 0;
            for &(_, data) in writes {
                out[at..at + data.len()].copy_from_slice(data);
                at += data.len();
            }
        })
    }

    fn fits(&self, entries: &[Entry]) -> Result<(), AtomicError> {
        if entries.is_empty() {
            return Err(AtomicError::Empty);
        }
        let blocks: u64 = entries.iter().map(|e| e.blocks).sum();
        let header_blocks = self.header_blocks(entries.len());
        if blocks + header_blocks > self.log_blocks {
            return Err(AtomicError::TooLarge {
                blocks,
                header_blocks,
                log_blocks: self.log_blocks,
            });
        }
        Ok(())
    }

    fn check_mutable(&self, op: Opcode) -> DeviceResult<()> {
        self.poison.check(op)?;
        match &self.broken {
            Some(cause) => Err(DeviceError::Poisoned {
                op,
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Writes the record (header, then the data `fill` lays out in entry order), flushes, applies
    /// and checkpoints. The child must be idle.
    fn commit(
        &mut self,
        entries: &[Entry],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<(), AtomicError> {
        let bs = self.geo.block_size as usize;
        let header_blocks = self.header_blocks(entries.len()) as usize;
        let data_blocks: u64 = entries.iter().map(|e| e.blocks).sum();
        let mut record = vec![0u8; (header_blocks + data_blocks as usize) * bs];
        let (header, data) = record.split_at_mut(header_blocks * bs);
        fill(data);
        self.seq += 1;
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&self.seq.to_le_bytes());
        header[16..20].copy_from_slice(&(entries.len() as u32).to_le_bytes());
        header[20..24].copy_from_slice(&(data_blocks as u32).to_le_bytes());
        header[24..28].copy_from_slice(&crc32c(data).to_le_bytes());
        for (i, e) in entries.iter().enumerate() {
            let at = HEADER_FIXED + i * ENTRY_BYTES;
            header[at..at + 8].copy_from_slice(&e.lba.to_le_bytes());
            header[at + 8..at + 16].copy_from_slice(&e.blocks.to_le_bytes());
        }
        let covered = HEADER_FIXED + entries.len() * ENTRY_BYTES;
        let header_crc = crc32c(&header[..covered]);
        header[28..32].copy_from_slice(&header_crc.to_le_bytes());
        self.child.write_blocks(self.log_start, &record)?;
        let committed = self.child.flush_all();
        self.poison.observe(Opcode::Flush, &committed);
        committed?;
        self.stats.groups += 1;
        self.stats.group_writes += entries.len() as u64;
        let data = &record[header_blocks * bs..];
        if let Err(e) = self.apply_and_checkpoint(entries, data) {
            self.broken = Some(format!(
                "applying committed atomic group {} failed ({e}); it is replayed at the next open",
                self.seq
            ));
            return Err(e.into());
        }
        Ok(())
    }

    fn apply_and_checkpoint(&mut self, entries: &[Entry], data: &[u8]) -> DeviceResult<()> {
        let bs = self.geo.block_size as usize;
        let mut at = 0;
        for e in entries {
            let len = e.blocks as usize * bs;
            self.child.write_blocks(e.lba, &data[at..at + len])?;
            at += len;
        }
        self.child.flush_all()?;
        self.child.write_blocks(self.log_start, &vec![0u8; bs])?;
        self.child.flush_all()
    }

    /// Replays a committed record left in the log; drops a torn one.
    fn recover(&mut self) -> DeviceResult<()> {
        let bs = self.geo.block_size as usize;
        let mut first = vec![0u8; bs];
        self.child.read_blocks(self.log_start, &mut first)?;
        if &first[..8] != MAGIC {
            return Ok(());
        }
        let seq = u64::from_le_bytes(le8(&first[8..16]));
        let n = u32::from_le_bytes(le4(&first[16..20])) as usize;
        let data_blocks = u64::from(u32::from_le_bytes(le4(&first[20..24])));
        let header_blocks = self.header_blocks(n);
        if n == 0 || header_blocks + data_blocks > self.log_blocks {
            return self.drop_torn();
        }
        let mut record = vec![0u8; (header_blocks + data_blocks) as usize * bs];
        self.child.read_blocks(self.log_start, &mut record)?;
        let (header, data) = record.split_at_mut(header_blocks as usize * bs);
        let want_header = u32::from_le_bytes(le4(&header[28..32]));
        let want_data = u32::from_le_bytes(le4(&header[24..28]));
        header[28..32].fill(0);
        let covered = HEADER_FIXED + n * ENTRY_BYTES;
        if crc32c(&header[..covered]) != want_header || crc32c(data) != want_data {
            return self.drop_torn();
        }
        let entries: Vec<Entry> = (0..n)
            .map(|i| {
                let at = HEADER_FIXED + i * ENTRY_BYTES;
                Entry {
                    lba: u64::from_le_bytes(le8(&header[at..at + 8])),
                    blocks: u64::from_le_bytes(le8(&header[at + 8..at + 16])),
                }
            })
            .collect();
        let sane = entries.iter().map(|e| e.blocks).sum::<u64>() == data_blocks
            && entries.iter().all(|e| {
                e.blocks > 0
                    && e.lba
                        .checked_add(e.blocks)
                        .is_some_and(|end| end <= self.geo.num_blocks)
            });
        if !sane {
            return self.drop_torn();
        }
        self.apply_and_checkpoint(&entries, data)?;
        self.seq = seq;
        self.stats.replayed += 1;
        Ok(())
    }

    fn drop_torn(&mut self) -> DeviceResult<()> {
        self.stats.torn += 1;
        let bs = self.geo.block_size as usize;
        self.child.write_blocks(self.log_start, &vec![0u8; bs])?;
        self.child.flush_all()
    }

    /// Waits for every pass-through command, so the child is idle.
    fn drain(&mut self) -> DeviceResult<()> {
        while !self.backlog.is_empty() || self.child.in_flight() > 0 {
            self.push_backlog();
            let mut got = Vec::new();
            self.child.poll(&mut got, 1)?;
            self.retire(got);
        }
        Ok(())
    }

    fn push_backlog(&mut self) {
        while let Some(req) = self.backlog.pop_front() {
            if let Err(req) = self.pass(req) {
                self.backlog.push_front(req);
                return;
            }
        }
    }

    /// Sends a caller's request to the child; hands it back when the child's queue is full.
    fn pass(&mut self, mut req: Request) -> Result<(), Request> {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        let caller = req.tag;
        req.tag = tag;
        match self.child.submit(req) {
            Ok(()) => {
                self.sent.insert(tag, caller);
                Ok(())
            }
            Err(r) => {
                let mut req = r.request;
                req.tag = caller;
                if matches!(r.error, DeviceError::QueueFull { .. }) {
                    return Err(req);
                }
                self.finish(Completion::of(req, Err(r.error)));
                Ok(())
            }
        }
    }

    fn finish(&mut self, done: Completion) {
        self.poison.observe(done.op, &done.status);
        self.ready.push_back(done);
    }

    fn retire(&mut self, got: Vec<Completion>) {
        for mut done in got {
            if let Some(caller) = self.sent.remove(&done.tag) {
                done.tag = caller;
                self.finish(done);
            }
        }
    }

    /// Commits the waiting multi-block writes, as many per group as the log holds.
    fn commit_pending(&mut self) -> DeviceResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.drain()?;
        while !self.pending.is_empty() {
            let mut group = Vec::new();
            let mut entries: Vec<Entry> = Vec::new();
            while let Some(req) = self.pending.front() {
                entries.push(Entry {
                    lba: req.lba,
                    blocks: req.blocks,
                });
                if !group.is_empty() && self.fits(&entries).is_err() {
                    entries.pop();
                    break;
                }
                if let Some(req) = self.pending.pop_front() {
                    group.push(req);
                }
            }
            let status = match self.check_mutable(Opcode::Write) {
                Err(e) => Err(e),
                Ok(()) => {
                    let bs = self.geo.block_size as usize;
                    let parts = &group;
                    self.commit(&entries, |out| {
                        let mut at = 0;
                        for r in parts {
                            let len = r.blocks as usize * bs;
                            if let Some(buf) = &r.buf {
                                out[at..at + len].copy_from_slice(&buf[..len]);
                            }
                            at += len;
                        }
                    })
                    .map_err(|e| match e {
                        AtomicError::Device(d) => d,
                        other => DeviceError::Offline {
                            reason: other.to_string(),
                        },
                    })
                }
            };
            for req in group {
                self.ready.push_back(Completion::of(req, status.clone()));
            }
        }
        Ok(())
    }
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[..8]);
    out
}

fn le4(b: &[u8]) -> [u8; 4] {
    let mut out = [0u8; 4];
    out.copy_from_slice(&b[..4]);
    out
}

impl BlockDevice for AtomicDrive {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        format!(
            "atomic({})?log={}",
            self.child.describe(),
            self.log_blocks * u64::from(self.geo.block_size)
        )
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = self.stats;
        out.push(
            kura_engine::DriveStats::new("atomic")
                .with("groups", s.groups)
                .with("group_writes", s.group_writes)
                .with("large_passthrough", s.large_passthrough)
                .with("replayed", s.replayed)
                .with("torn", s.torn),
        );
        kura_engine::device::child_stats(&*self.child, out);
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.accepted)?;
        self.accepted += 1;
        if let Err(e) = self.check_mutable(req.op) {
            self.ready.push_back(Completion::of(req, Err(e)));
            return Ok(());
        }
        let logged = req.op == Opcode::Write
            && req.blocks > 1
            && self
                .fits(&[Entry {
                    lba: req.lba,
                    blocks: req.blocks,
                }])
                .is_ok();
        if logged {
            self.pending.push_back(req);
            return Ok(());
        }
        if req.op == Opcode::Write && req.blocks > 1 {
            self.stats.large_passthrough += 1;
        }
        if let Err(req) = self.pass(req) {
            self.backlog.push_back(req);
        }
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.push_backlog();
        self.commit_pending()?;
        crate::ring_if_busy(self.child.as_mut())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let target = min_complete.min(self.accepted);
        let mut n = 0;
        loop {
            self.push_backlog();
            self.commit_pending()?;
            let mut got = Vec::new();
            if self.child.in_flight() > 0 {
                let want = usize::from(n + self.ready.len() < target);
                self.child.poll(&mut got, want)?;
            }
            self.retire(got);
            n += hand_over(self.ready.drain(..), out, &mut self.accepted);
            if n >= target {
                return Ok(n);
            }
            if self.child.in_flight() == 0 && self.backlog.is_empty() && self.pending.is_empty() {
                return Err(crate::lost_track("atomic drive"));
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.accepted
    }
}

/// Opens `atomic(CHILD)?log=SIZE`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<AtomicDrive, OpenError> {
    let size = ("log", DEFAULT_LOG_BYTES);
    crate::open_with_one_child(spec, children, ATOMIC_OPTIONS, size, AtomicDrive::new)
}
