//! `coalesce(CHILD)?max=SIZE` — DeLiBA's self-tuning scheduler: contiguous requests of the same
//! kind submitted close together are merged into one child command.
//!
//! Accepted requests wait in a FIFO of *batches*. A new read, write, write-zeroes or discard joins
//! a waiting batch of the same kind when it continues it (starts where the batch ends) or precedes
//! it (ends where the batch starts), the merged batch stays within `max` bytes (1 MiB by default,
//! never more than the child's largest transfer), and no batch queued after that one overlaps it
//! with a write on either side (so joining never moves a request past a conflicting one).
//! Otherwise it starts a new batch.
//!
//! A batch goes to the child at a doorbell or poll once it has waited the *window*: half the
//! average child latency, an exponentially weighted moving average (1/8 weight per sample) that
//! the drive measures itself from each child command's dispatch to its completion, capped at
//! [`MAX_WINDOW`]. The window is also self-tuning in the other direction: while fewer than 1 in
//! 32 recent requests merged (a random workload), it is zero, so nothing waits for neighbours
//! that do not come; requests submitted together before a doorbell still merge, which brings
//! the window back when a sequential stream starts. Full batches and batches ahead of a flush go at once. Batches leave in FIFO
//! order, and a batch that overlaps a command still in flight on the child with a write on either
//! side waits for that command, so the child never sees two conflicting commands at once. A flush
//! is a barrier: nothing queued after it is merged with or sent before anything queued ahead of
//! it, and it goes to the child only once every earlier child command has completed.
//!
//! A merged write is gathered into one scratch buffer; a merged read is read into one and
//! scattered back; a batch of one request carries the caller's own buffer. The child command's
//! status becomes every merged request's status. A failed flush poisons the drive. Requests still
//! waiting when the drive is dropped are dropped with it (poll to completion first).

use crate::fanout::scratch;
use kura_engine::backend::common::hand_over;
use kura_engine::open::ChildOpener;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Geometry, Opcode, OpenError, Rejected,
    Request, Spec,
};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Options of `coalesce(...)`.
pub const COALESCE_OPTIONS: &[&str] = &["max"];
/// Largest merged command when none is given.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
/// The longest a request ever waits for neighbours, however slow the child.
pub const MAX_WINDOW: Duration = Duration::from_millis(2);
/// How many waiting batches a new request is compared with.
const MERGE_LOOKBACK: usize = 64;
/// The merge rate (fixed point, 1024 = every request merged) below which no batch waits:
/// a random workload then pays nothing for the window. Requests submitted together before a
/// doorbell still merge, so the rate climbs back as soon as neighbours show up.
const MIN_MERGE_RATE: u32 = 1024 / 32;

/// Counts of what the scheduler did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalesceStats {
    /// Caller requests accepted (flushes included).
    pub requests: u64,
    /// Commands sent to the child (flushes included).
    pub child_commands: u64,
    /// Requests that joined a batch instead of starting one.
    pub merged: u64,
}

struct Batch {
    op: Opcode,
    lba: u64,
    blocks: u64,
    parts: Vec<Request>,
    since: Instant,
}

impl Batch {
    fn conflicts(&self, op: Opcode, lba: u64, blocks: u64) -> bool {
        overlaps(self.lba, self.blocks, lba, blocks) && (self.op.is_mutation() || op.is_mutation())
    }
}

fn overlaps(a: u64, an: u64, b: u64, bn: u64) -> bool {
    a < b + bn && b < a + an
}

enum Entry {
    Batch(Batch),
    Flush(Request),
}

/// A command on the child: the batch it carries (or a flush) and when it left.
struct Sent {
    op: Opcode,
    lba: u64,
    blocks: u64,
    parts: Vec<Request>,
    /// The child command carries a scratch buffer, not the single part's own.
    scratch: bool,
    at: Instant,
}

/// Why dispatching stopped.
enum Stall {
    /// Nothing waits.
    Empty,
    /// The head batch waits for neighbours until then.
    Until(Instant),
    /// The head waits for child commands to complete.
    Child,
}

/// The coalescing scheduler.
pub struct Coalesce {
    child: Box<dyn BlockDevice>,
    geo: Geometry,
    max_blocks: u64,
    waiting: VecDeque<Entry>,
    sent: HashMap<u64, Sent>,
    next_tag: u64,
    ready: VecDeque<Completion>,
    /// Caller requests accepted and not yet returned by `poll`.
    accepted: usize,
    /// Average child latency in nanoseconds; zero until measured.
    ewma_ns: u64,
    /// Moving average of the fraction of requests that joined a batch (1024 = all), 1/16
    /// weight per request; starts high so a fresh drive waits until it knows better.
    merge_rate: u32,
    poison: FlushPoison,
    stats: CoalesceStats,
}

impl Coalesce {
    /// A scheduler in front of `child` (idle) merging up to `max_bytes` per child command.
    pub fn new(child: Box<dyn BlockDevice>, max_bytes: u64) -> Result<Self, OpenError> {
        let geo = child.geometry();
        let bs = u64::from(geo.block_size);
        if max_bytes < bs || !max_bytes.is_multiple_of(bs) {
            return Err(OpenError::Invalid(format!(
                "coalesce({}): max {max_bytes} is not a non-zero multiple of the block size ({bs})",
                child.describe()
            )));
        }
        let max_blocks = (max_bytes / bs).min(u64::from(geo.max_transfer_blocks()));
        Ok(Coalesce {
            child,
            geo,
            max_blocks,
            waiting: VecDeque::new(),
            sent: HashMap::new(),
            next_tag: 1,
            ready: VecDeque::new(),
            accepted: 0,
            ewma_ns: 0,
            merge_rate: 1024,
            poison: FlushPoison::default(),
            stats: CoalesceStats::default(),
        })
    }

    pub fn stats(&self) -> CoalesceStats {
        self.stats
    }

    /// How long a request now waits for neighbours: half the average child latency, or nothing
    /// while recent requests have found no neighbours to merge with.
    pub fn window(&self) -> Duration {
        if self.merge_rate < MIN_MERGE_RATE {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.ewma_ns / 2).min(MAX_WINDOW)
    }

    /// Recent fraction of requests merged, in 1/1024.
    pub fn merge_rate(&self) -> u32 {
        self.merge_rate
    }

    fn note_merge(&mut self, merged: bool) {
        let sample = if merged { 1024 } else { 0 };
        self.merge_rate = self.merge_rate - self.merge_rate / 16 + sample / 16;
    }

    /// The average child latency measured so far.
    pub fn average_latency(&self) -> Duration {
        Duration::from_nanos(self.ewma_ns)
    }

    fn enqueue(&mut self, req: Request) {
        if req.op == Opcode::Flush {
            self.waiting.push_back(Entry::Flush(req));
            return;
        }
        let (op, lba, blocks) = (req.op, req.lba, req.blocks);
        let mut target = None;
        for (i, entry) in self.waiting.iter().enumerate().rev().take(MERGE_LOOKBACK) {
            let Entry::Batch(b) = entry else { break };
            let fits = b.blocks + blocks <= self.max_blocks;
            if b.op == op && fits && (b.lba + b.blocks == lba || lba + blocks == b.lba) {
                target = Some(i);
                break;
            }
            if b.conflicts(op, lba, blocks) {
                break;
            }
        }
        if let Some(Entry::Batch(b)) = target.and_then(|i| self.waiting.get_mut(i)) {
            b.lba = b.lba.min(lba);
            b.blocks += blocks;
            b.parts.push(req);
            self.stats.merged += 1;
            self.note_merge(true);
            return;
        }
        self.note_merge(false);
        self.waiting.push_back(Entry::Batch(Batch {
            op,
            lba,
            blocks,
            parts: vec![req],
            since: Instant::now(),
        }));
    }

    /// Sends waiting batches in order while they are due and the child takes them.
    fn dispatch(&mut self) -> Stall {
        let window = self.window();
        let flush_at = self
            .waiting
            .iter()
            .position(|e| matches!(e, Entry::Flush(_)));
        let mut index = 0;
        loop {
            let Some(entry) = self.waiting.front() else {
                return Stall::Empty;
            };
            match entry {
                Entry::Flush(_) => {
                    if !self.sent.is_empty() {
                        return Stall::Child;
                    }
                }
                Entry::Batch(b) => {
                    let forced = flush_at.is_some_and(|f| index < f) || b.blocks >= self.max_blocks;
                    let due = b.since + window;
                    if !forced && Instant::now() < due {
                        return Stall::Until(due);
                    }
                    if self
                        .sent
                        .values()
                        .any(|s| s.op != Opcode::Flush && b.conflicts(s.op, s.lba, s.blocks))
                    {
                        return Stall::Child;
                    }
                }
            }
            let Some(entry) = self.waiting.pop_front() else {
                return Stall::Empty;
            };
            if let Err(entry) = self.send(entry) {
                self.waiting.push_front(entry);
                return Stall::Child;
            }
            index += 1;
        }
    }

    /// Sends one entry to the child; hands it back when the child's queue is full.
    fn send(&mut self, entry: Entry) -> Result<(), Entry> {
        let bs = self.geo.block_size as usize;
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        let (req, sent) = match entry {
            Entry::Flush(f) => (
                Request::flush(tag),
                Sent {
                    op: Opcode::Flush,
                    lba: 0,
                    blocks: 0,
                    parts: vec![f],
                    scratch: false,
                    at: Instant::now(),
                },
            ),
            Entry::Batch(mut b) => {
                let single = b.parts.len() == 1;
                let buf = match b.op {
                    Opcode::Write | Opcode::Read if single => b.parts[0].buf.take(),
                    Opcode::Write => {
                        let mut buf = scratch(b.blocks as usize * bs);
                        for p in &b.parts {
                            let at = (p.lba - b.lba) as usize * bs;
                            let len = p.blocks as usize * bs;
                            if let Some(src) = &p.buf {
                                buf[at..at + len].copy_from_slice(&src[..len]);
                            }
                        }
                        Some(buf)
                    }
                    Opcode::Read => Some(scratch(b.blocks as usize * bs)),
                    _ => None,
                };
                let req = Request {
                    tag,
                    op: b.op,
                    lba: b.lba,
                    blocks: b.blocks,
                    buf,
                };
                let sent = Sent {
                    op: b.op,
                    lba: b.lba,
                    blocks: b.blocks,
                    parts: b.parts,
                    scratch: !single && b.op.has_data(),
                    at: Instant::now(),
                };
                (req, sent)
            }
        };
        match self.child.submit(req) {
            Ok(()) => {
                self.stats.child_commands += 1;
                self.sent.insert(tag, sent);
                Ok(())
            }
            Err(r) if matches!(r.error, DeviceError::QueueFull { .. }) => {
                Err(Self::unsend(sent, r.request))
            }
            Err(r) => {
                self.finish(sent, Completion::of(r.request, Err(r.error)));
                Ok(())
            }
        }
    }

    /// Rebuilds the waiting entry of a command the child refused for now.
    fn unsend(mut sent: Sent, req: Request) -> Entry {
        if sent.op == Opcode::Flush {
            return Entry::Flush(sent.parts.remove(0));
        }
        if !sent.scratch && sent.op.has_data() {
            sent.parts[0].buf = req.buf;
        }
        Entry::Batch(Batch {
            op: sent.op,
            lba: sent.lba,
            blocks: sent.blocks,
            parts: sent.parts,
            since: sent.at,
        })
    }

    /// Completes every caller request a child command carried.
    fn finish(&mut self, sent: Sent, done: Completion) {
        let bs = self.geo.block_size as usize;
        let mut parts = sent.parts;
        if sent.op.has_data() && !sent.scratch {
            if let Some(p) = parts.first_mut() {
                p.buf = done.buf;
            }
        } else if sent.op == Opcode::Read && done.status.is_ok() {
            if let Some(src) = &done.buf {
                for p in &mut parts {
                    let at = (p.lba - sent.lba) as usize * bs;
                    let len = p.blocks as usize * bs;
                    if let Some(dst) = p.buf.as_mut() {
                        dst[..len].copy_from_slice(&src[at..at + len]);
                    }
                }
            }
        }
        for p in parts {
            self.poison.observe(p.op, &done.status);
            self.ready.push_back(Completion::of(p, done.status.clone()));
        }
    }

    fn retire(&mut self, got: Vec<Completion>) {
        let now = Instant::now();
        for c in got {
            let Some(sent) = self.sent.remove(&c.tag) else {
                continue;
            };
            if sent.op != Opcode::Flush {
                let sample = now
                    .duration_since(sent.at)
                    .as_nanos()
                    .min(u128::from(u64::MAX)) as u64;
                self.ewma_ns = if self.ewma_ns == 0 {
                    sample
                } else {
                    self.ewma_ns - self.ewma_ns / 8 + sample / 8
                };
            }
            self.finish(sent, c);
        }
    }

    fn collect(&mut self, wait: bool) -> DeviceResult<()> {
        let mut got = Vec::new();
        if self.child.in_flight() > 0 {
            self.child.ring_doorbell()?;
            self.child.poll(&mut got, usize::from(wait))?;
        }
        self.retire(got);
        Ok(())
    }
}

impl BlockDevice for Coalesce {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        format!(
            "coalesce({})?max={}",
            self.child.describe(),
            self.max_blocks * u64::from(self.geo.block_size)
        )
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = self.stats;
        out.push(
            kura_engine::DriveStats::new("coalesce")
                .with("requests", s.requests)
                .with("merged", s.merged)
                .with("child_commands", s.child_commands),
        );
        kura_engine::device::child_stats(&*self.child, out);
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight())?;
        self.stats.requests += 1;
        if let Err(e) = self.poison.check(req.op) {
            self.accepted += 1;
            self.ready.push_back(Completion::of(req, Err(e)));
            return Ok(());
        }
        self.accepted += 1;
        self.enqueue(req);
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        self.dispatch();
        crate::ring_if_busy(self.child.as_mut())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let target = min_complete.min(self.in_flight());
        let mut n = 0;
        loop {
            let stall = self.dispatch();
            self.collect(false)?;
            n += hand_over(self.ready.drain(..), out, &mut self.accepted);
            if n >= target {
                return Ok(n);
            }
            match stall {
                Stall::Until(due) => {
                    let left = due.saturating_duration_since(Instant::now());
                    if left > Duration::from_micros(50) {
                        std::thread::sleep(left.min(Duration::from_micros(200)));
                    } else {
                        std::thread::yield_now();
                    }
                }
                _ if !self.sent.is_empty() => self.collect(true)?,
                _ => return Err(crate::lost_track("coalesce")),
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.accepted
    }
}

/// Opens `coalesce(CHILD)?max=SIZE`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Coalesce, OpenError> {
    let size = ("max", DEFAULT_MAX_BYTES);
    crate::open_with_one_child(spec, children, COALESCE_OPTIONS, size, Coalesce::new)
}
