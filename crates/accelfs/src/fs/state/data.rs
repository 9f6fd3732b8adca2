//! The data path: file reads and writes through the buffer cache, read-ahead for sequential
//! readers, and the bypass that sends large reads and writes to the engine as big commands at
//! queue depth.
//!
//! A read is [`Mounted::read_at`]: cached blocks are copied, missing ones fetched from the
//! device (with read-ahead) into the cache, large reads go straight to the device; a write is
//! [`Mounted::write_at`]: holes get blocks from the allocator, small writes land in the cache,
//! large whole blocks go straight to the device. Both submit through
//! [`crate::fsdevice::FsDevice`] only, after checkpointing the journal when it holds a newer
//! image of a block they touch.
//!
//! A small read that misses the cache can fetch with the state lock released
//! ([`Mounted::read_begin`] plans under it, [`FetchPlan::read`] needs only the disk lock,
//! [`Mounted::read_finish`] copies out and caches under it again, unless the file's data stamp
//! moved meanwhile: then the read starts again). Owns the fields `cache`, `next_sequential`,
//! `data_versions` and `data_clock` of [`Mounted`] (the buffer cache, the read-ahead state and
//! the data stamps) and hands dirty data to the commit ([`Mounted::take_dirty_data`],
//! [`Mounted::journaled`], [`Mounted::placed`]).

use super::{corrupt, Mounted};
use crate::error::FsError;
use crate::fs::cache::Victim;
use crate::fs::planned::{command_buffer, PlannedWrites};
use crate::fs::Fallocate;
use crate::fsdevice::{BatchOp, FsDevice, StreamPart};
use crate::inode::Kind;
use kura_engine::IoBuf;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A write is applied in steps of this many bytes, each its own metadata update, so that one
/// huge write cannot outgrow a journal transaction.
pub(crate) const WRITE_STEP: usize = 8 << 20;

/// Most blocks `Mounted::unsettled` tracks; beyond, it becomes unknown until the next device
/// read that looks at the journal under the disk lock makes it exact again.
pub(crate) const UNSETTLED_MAX: usize = 1 << 16;

/// Device commands (of `max_command_bytes`) a streaming read plans at once.
const STREAM_WINDOW_COMMANDS: u64 = 256;

impl Mounted {
    /// Fails unless `ino` is a regular file.
    pub(crate) fn file_node(&mut self, ino: u64) -> Result<(), FsError> {
        match self.node(ino)?.inode.kind {
            Kind::File => Ok(()),
            Kind::Directory => Err(FsError::IsADirectory(format!("inode {ino}"))),
            Kind::Free => Err(FsError::NotFound(format!("inode {ino} (removed)"))),
            k => Err(FsError::Invalid(format!(
                "inode {ino} is a {k:?}, not a regular file"
            ))),
        }
    }

    fn max_file_bytes(&self) -> u64 {
        (u64::from(u32::MAX)) * self.bs as u64
    }

    /// The byte ranges of file `ino` that have device blocks, below its size.
    pub(crate) fn allocated_ranges(
        &mut self,
        ino: u64,
    ) -> Result<Vec<std::ops::Range<u64>>, FsError> {
        self.file_node(ino)?;
        let bs = self.bs as u64;
        let node = self.node(ino)?;
        Ok(node.map.allocated_ranges(bs, node.inode.size))
    }

    /// Reads up to `out.len()` bytes at `offset`; returns how many (0 at or past the end).
    pub(crate) fn read_at(
        &mut self,
        ino: u64,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FsError> {
        self.file_node(ino)?;
        self.read_data(ino, offset, out)
    }

    /// [`Mounted::read_at`] without the check that `ino` is a regular file (a slow symbolic
    /// link's target is read this way). The whole read holds the state lock, device reads too.
    pub(super) fn read_data(
        &mut self,
        ino: u64,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FsError> {
        match self.read_begin(ino, offset, out)? {
            ReadStep::Done(n) => Ok(n),
            ReadStep::Fetch(plan) => {
                let fetched = plan.read(&mut self.disk.lock().dev, out)?;
                self.read_finish(&plan, fetched, out)?.ok_or_else(|| {
                    corrupt(format!("inode {ino}: changed during a read under the lock"))
                })
            }
        }
    }

    /// The part of a read done under the state lock before any device read: serves it from
    /// the cache ([`ReadStep::Done`]: every block cached, or all that is missing are holes) or
    /// from the device directly (a large read, still under the lock), or says which blocks to
    /// fetch ([`ReadStep::Fetch`]), which the caller may do with the state lock released (the
    /// journal has been checkpointed first if it held a newer copy of any of them) and then
    /// hand to [`Mounted::read_finish`].
    pub(crate) fn read_begin(
        &mut self,
        ino: u64,
        offset: u64,
        out: &mut [u8],
    ) -> Result<ReadStep, FsError> {
        let size = self.node(ino)?.inode.size;
        if offset >= size || out.is_empty() {
            return Ok(ReadStep::Done(0));
        }
        let n = (size - offset).min(out.len() as u64) as usize;
        let out = &mut out[..n];
        let bs = self.bs as u64;
        let first = (offset / bs) as u32;
        let last = ((offset + n as u64 - 1) / bs) as u32;
        // The common case of a small read: every block is cached. Copy, and nothing else.
        if n < self.opts.bypass_bytes && (first..=last).all(|b| self.cache.contains(ino, b)) {
            for b in first..=last {
                let lo = (u64::from(b) * bs).max(offset);
                let hi = (u64::from(b) * bs + bs).min(offset + n as u64);
                let within = (lo - u64::from(b) * bs) as usize;
                if let Some(slot) = self.cache.get(ino, b) {
                    out[(lo - offset) as usize..(hi - offset) as usize]
                        .copy_from_slice(&slot.bytes()[within..within + (hi - lo) as usize]);
                }
            }
            self.cache.stats.hits += u64::from(last - first + 1);
            self.set_next_sequential(ino, offset + n as u64);
            return Ok(ReadStep::Done(n));
        }
        let sequential = self
            .next_sequential
            .get(&ino)
            .is_some_and(|a| a.load(Ordering::Relaxed) == offset);
        // Large reads, and random reads of several blocks, skip the cache: caching them would
        // cost a copy per block and evict what sequential readers and small I/O need.
        let large = n >= self.opts.bypass_bytes || (!sequential && n >= 4 * self.bs);
        if large {
            let plan = self.plan_direct(ino, offset, out)?;
            if plan.runs.is_empty() {
                // Everything was cached or a hole: nothing for the device.
                return self
                    .read_finish(&plan, BTreeMap::new(), out)?
                    .map(ReadStep::Done)
                    .ok_or_else(|| corrupt(format!("inode {ino}: changed during a read")));
            }
            return Ok(ReadStep::Fetch(plan));
        }
        let ahead = if sequential {
            let eof_block = (size.div_ceil(bs)).saturating_sub(1) as u32;
            last.saturating_add(self.opts.readahead_blocks)
                .min(eof_block)
        } else {
            last
        };
        // Blocks not in the cache, by device run.
        let mut missing: Vec<(u32, u64)> = Vec::new();
        {
            let node = self.node(ino)?;
            let map = node.map.clone();
            for b in first..=ahead {
                if self.cache.contains(ino, b) {
                    continue;
                }
                if let Some((p, _)) = map.lookup(b) {
                    missing.push((b, p));
                }
            }
        }
        let plan = FetchPlan {
            ino,
            offset,
            version: self.data_version(ino),
            runs: self.fetch_runs(&missing),
            bs: self.bs,
            direct: None,
        };
        if missing.is_empty() {
            return self
                .read_finish(&plan, BTreeMap::new(), out)?
                .map(ReadStep::Done)
                .ok_or_else(|| corrupt(format!("inode {ino}: changed during a read")));
        }
        let device: Vec<(u64, u64)> = plan.runs.iter().map(|&(_, p, n)| (p, n as u64)).collect();
        self.before_device_reads(&device)?;
        Ok(ReadStep::Fetch(plan))
    }

    /// Completes a read [`Mounted::read_begin`] planned, with the blocks fetched: copies out and
    /// caches them. `None` when the file's data or block map changed since the plan (what was
    /// fetched may no longer be the file's): the caller starts again.
    pub(crate) fn read_finish(
        &mut self,
        plan: &FetchPlan,
        fetched: BTreeMap<u32, IoBuf>,
        out: &mut [u8],
    ) -> Result<Option<usize>, FsError> {
        let (ino, offset) = (plan.ino, plan.offset);
        if self.data_version(ino) != plan.version {
            return Ok(None);
        }
        if let Some(n) = plan.direct {
            // Read straight into `out`; the size cannot have changed (that moves the stamp).
            self.cache.stats.bypass_bytes += n as u64;
            self.set_next_sequential(ino, offset + n as u64);
            return Ok(Some(n));
        }
        let size = self.node(ino)?.inode.size;
        if offset >= size || out.is_empty() {
            return Ok(Some(0));
        }
        let n = (size - offset).min(out.len() as u64) as usize;
        let out = &mut out[..n];
        let bs = self.bs as u64;
        let first = (offset / bs) as u32;
        let last = ((offset + n as u64 - 1) / bs) as u32;
        // A block that was cached when the read was planned may have been evicted since (that
        // does not move the stamp): it is neither cached nor fetched now, but not a hole.
        self.node(ino)?;
        let Mounted { nodes, cache, .. } = &*self;
        let map = nodes.get(&ino).map(|n| &n.map);
        let evicted = (first..=last).any(|b| {
            !fetched.contains_key(&b)
                && !cache.contains(ino, b)
                && map.is_some_and(|m| m.lookup(b).is_some())
        });
        if evicted {
            return Ok(None);
        }
        self.cache.stats.readahead_blocks += fetched.keys().filter(|&&b| b > last).count() as u64;
        for b in first..=last {
            let lo = (u64::from(b) * bs).max(offset);
            let hi = (u64::from(b) * bs + bs).min(offset + n as u64);
            let dst = &mut out[(lo - offset) as usize..(hi - offset) as usize];
            let within = (lo - u64::from(b) * bs) as usize;
            if let Some(slot) = self.cache.get(ino, b) {
                dst.copy_from_slice(&slot.bytes()[within..within + dst.len()]);
                self.cache.stats.hits += 1;
            } else if let Some(buf) = fetched.get(&b) {
                self.cache.stats.misses += 1;
                dst.copy_from_slice(&buf[within..within + dst.len()]);
            } else {
                dst.fill(0); // a hole
            }
        }
        // Another reader may have cached some of these meanwhile (the same contents: the data
        // did not change); those stay as they are.
        let fresh: Vec<(u32, IoBuf)> = fetched
            .into_iter()
            .filter(|(b, _)| !self.cache.contains(ino, *b))
            .collect();
        let room = fresh.len().min(self.cache.budget_blocks());
        let victims = self.cache.make_room(room);
        self.write_victims(victims)?;
        for (b, buf) in fresh.into_iter().take(room) {
            self.cache.insert(ino, b, buf, false);
        }
        self.set_next_sequential(ino, offset + n as u64);
        Ok(Some(n))
    }

    /// A read of cached blocks under the *shared* state lock, beside other such reads: `None`
    /// unless the inode is loaded, is a regular file (of `generation`, when given), the read is
    /// below the bypass size and every block it covers is cached; the caller then reads under
    /// the exclusive lock ([`Mounted::read_begin`]), which also gives every error. Nothing can
    /// change the file meanwhile: every change takes the state lock exclusively. A sequential
    /// reader's position is advanced (so read-ahead goes on when it reaches blocks not cached);
    /// a random reader's is left as it is, so that random readers of one file do not all write
    /// one cache line.
    pub(crate) fn read_cached(
        &self,
        ino: u64,
        generation: Option<u32>,
        offset: u64,
        out: &mut [u8],
    ) -> Option<usize> {
        let node = self.nodes.get(&ino)?;
        if node.inode.kind != Kind::File || generation.is_some_and(|g| g != node.inode.generation) {
            return None;
        }
        let size = node.inode.size;
        if offset >= size || out.is_empty() {
            return Some(0);
        }
        let n = (size - offset).min(out.len() as u64) as usize;
        let bs = self.bs as u64;
        let end = offset + n as u64;
        let (first, last) = ((offset / bs) as u32, ((end - 1) / bs) as u32);
        // A large read is served here only when every block is cached (looked up before any
        // copy, so a miss costs lookups, not copies): then its copy, milliseconds for a few
        // MiB, runs beside other readers instead of holding the state lock exclusively. One
        // with blocks to fetch goes to the device in big commands (`plan_direct`).
        if n >= self.opts.bypass_bytes && !(first..=last).all(|b| self.cache.contains(ino, b)) {
            return None;
        }
        for b in first..=last {
            let buf = self.cache.peek(ino, b)?;
            let lo = (u64::from(b) * bs).max(offset);
            let hi = (u64::from(b) * bs + bs).min(end);
            let within = (lo - u64::from(b) * bs) as usize;
            out[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&buf[within..within + (hi - lo) as usize]);
        }
        self.cache.shared_hits.add(u64::from(last - first + 1));
        if let Some(next) = self.next_sequential.get(&ino) {
            // Lost races between two readers of one file only cost read-ahead.
            if next.load(Ordering::Relaxed) == offset {
                next.store(end, Ordering::Relaxed);
            }
        }
        Some(n)
    }

    /// Records where a sequential read of file `ino` would continue.
    fn set_next_sequential(&mut self, ino: u64, at: u64) {
        *self.next_sequential.entry(ino).or_default().get_mut() = at;
    }

    /// The stamp of file `ino`'s data and block map (see [`Mounted::data_changed`]).
    pub(crate) fn data_version(&self, ino: u64) -> u64 {
        self.data_versions.get(&ino).copied().unwrap_or(0)
    }

    /// Records that file `ino`'s data or block map changed (a write, a truncation, a hole
    /// punched or filled, the inode freed): a read that fetched blocks of it with the state lock
    /// released must not use them.
    fn data_changed(&mut self, ino: u64) {
        self.data_clock += 1;
        self.data_versions.insert(ino, self.data_clock);
    }

    /// A large read: cached blocks (which may be newer than the device) are copied from the
    /// cache and holes zeroed now; the plan returned reads the rest straight from the device
    /// into `out` in big commands at queue depth ([`FetchPlan::read`]).
    fn plan_direct(&mut self, ino: u64, offset: u64, out: &mut [u8]) -> Result<FetchPlan, FsError> {
        let bs = self.bs as u64;
        let first = (offset / bs) as u32;
        let last = ((offset + out.len() as u64 - 1) / bs) as u32;
        let max_blocks = (self.opts.max_command_bytes / self.bs).max(1);
        let map = self.node(ino)?.map.clone();
        // (first file block, device block, blocks)
        let mut runs: Vec<(u32, u64, usize)> = Vec::new();
        for b in first..=last {
            let cached = self.cache.get(ino, b).map(|slot| {
                let lo = (u64::from(b) * bs).max(offset);
                let hi = (u64::from(b) * bs + bs).min(offset + out.len() as u64);
                let within = (lo - u64::from(b) * bs) as usize;
                out[(lo - offset) as usize..(hi - offset) as usize]
                    .copy_from_slice(&slot.bytes()[within..within + (hi - lo) as usize]);
            });
            if cached.is_some() {
                self.cache.stats.hits += 1;
                continue;
            }
            let Some((p, _)) = map.lookup(b) else {
                let lo = (u64::from(b) * bs).max(offset);
                let hi = (u64::from(b) * bs + bs).min(offset + out.len() as u64);
                out[(lo - offset) as usize..(hi - offset) as usize].fill(0);
                continue;
            };
            match runs.last_mut() {
                Some((lb, lp, len))
                    if *lb + *len as u32 == b && *lp + *len as u64 == p && *len < max_blocks =>
                {
                    *len += 1
                }
                _ => runs.push((b, p, 1)),
            }
        }
        let device: Vec<(u64, u64)> = runs.iter().map(|&(_, p, n)| (p, n as u64)).collect();
        self.before_device_reads(&device)?;
        Ok(FetchPlan {
            ino,
            offset,
            version: self.data_version(ino),
            runs,
            bs: self.bs,
            direct: Some(out.len()),
        })
    }

    /// fdatasync's plan for file `ino`: `None` when its size or block map changed in the
    /// running transaction (then only a commit makes the data reachable after a crash), else
    /// the writes of its dirty blocks (now marked clean), which one flush then makes durable;
    /// the new times follow with the next commit (format §7).
    pub(crate) fn sync_data_plan(
        &mut self,
        ino: u64,
    ) -> Result<Option<PlannedWrites<Arc<IoBuf>>>, FsError> {
        self.writable()?;
        if self.layout_changed_in_transaction(ino) {
            return Ok(None);
        }
        let result = self.dirty_data_plan(Some(ino));
        if let Err(e) = &result {
            self.read_only = Some(format!("after an I/O failure: {e}"));
        }
        result.map(Some)
    }

    /// Records that a data write or flush failed: nothing more is written.
    pub(crate) fn poison(&mut self, e: &FsError) {
        self.read_only
            .get_or_insert_with(|| format!("after an I/O failure: {e}"));
    }

    /// Starts streaming `len` bytes from `offset` (clamped to the end of the file): `None` when
    /// there is nothing to read. The stream then goes a window at a time
    /// ([`Mounted::stream_window`]), each read from the device in order, straight into engine
    /// buffers, with `stream_depth` commands in flight ([`Stream`]).
    pub(crate) fn stream_begin(
        &mut self,
        ino: u64,
        offset: u64,
        len: u64,
    ) -> Result<Option<Stream>, FsError> {
        self.file_node(ino)?;
        let size = self.node(ino)?.inode.size;
        if offset >= size || len == 0 {
            return Ok(None);
        }
        let n = (size - offset).min(len);
        let bs = self.bs as u64;
        let first = offset / bs;
        Ok(Some(Stream {
            ino,
            offset,
            n,
            start: first,
            last: (offset + n - 1) / bs,
            skip: (offset - first * bs) as usize,
            left: n,
            depth: self.opts.stream_depth,
        }))
    }

    /// The pieces of the stream's next window (`None` when it is done), planned from the file
    /// as it is now: its dirty cached blocks are written first, so the device holds its newest
    /// data, and the journal is checkpointed if it holds a newer copy of a block to read. The
    /// caller reads them holding the disk lock, which it must take before releasing the state
    /// lock: then no block of the window can be freed, reused and rewritten by another file
    /// until the window has been read (every device write needs the disk lock).
    pub(crate) fn stream_window(
        &mut self,
        s: &mut Stream,
    ) -> Result<Option<Vec<StreamPart>>, FsError> {
        let ino = s.ino;
        if s.start > s.last || s.left == 0 {
            return Ok(None);
        }
        self.file_node(ino)?;
        if self.read_only.is_none() {
            let plan = self.dirty_data_plan(Some(ino))?;
            if !plan.is_empty() {
                self.disk.lock().dev.batch(plan.into_ops())?;
            }
        } else if self.cache.has_dirty(ino) {
            return Err(FsError::ReadOnly(
                "cannot stream a file whose newest data could not be written".into(),
            ));
        }
        let max_blocks = (self.opts.max_command_bytes / self.bs).max(1) as u64;
        // A window at a time, so a long read (a sparse file may be terabytes of holes) holds a
        // bounded list of pieces, not one per MiB of the file.
        let window = max_blocks * STREAM_WINDOW_COMMANDS;
        let end = (s.start + window - 1).min(s.last);
        let bs = self.bs;
        let map = &self.node(ino)?.map;
        let mut pieces = Vec::new();
        let mut b = s.start;
        while b <= end {
            let rest = end - b + 1;
            // File blocks are u32 (format §5) and b ≤ last < 2^32.
            match map.lookup(b as u32) {
                Some((p, run)) => {
                    let take = u64::from(run).min(rest).min(max_blocks);
                    pieces.push(StreamPart::Device {
                        block: p,
                        bytes: take as usize * bs,
                    });
                    b += take;
                }
                None => {
                    let next = map.next_mapped_after(b as u32).unwrap_or(u64::MAX);
                    let take = (next - b).min(rest).min(max_blocks);
                    pieces.push(StreamPart::Zero {
                        bytes: take as usize * bs,
                    });
                    b += take;
                }
            }
        }
        let device: Vec<(u64, u64)> = pieces
            .iter()
            .filter_map(|p| match *p {
                StreamPart::Device { block, bytes } => Some((block, (bytes / self.bs) as u64)),
                StreamPart::Zero { .. } => None,
            })
            .collect();
        self.before_device_reads(&device)?;
        s.start = end + 1;
        Ok(Some(pieces))
    }

    /// The stream is done: counts it and returns the bytes it delivered.
    pub(crate) fn stream_end(&mut self, s: &Stream) -> u64 {
        let n = s.n - s.left;
        self.cache.stats.bypass_bytes += n;
        self.set_next_sequential(s.ino, s.offset + n);
        n
    }

    /// Reads file blocks (with their device blocks) at queue depth, merging contiguous runs.
    fn fetch(&mut self, blocks: &[(u32, u64)]) -> Result<BTreeMap<u32, IoBuf>, FsError> {
        let runs = self.fetch_runs(blocks);
        let device: Vec<(u64, u64)> = runs.iter().map(|&(_, p, n)| (p, n as u64)).collect();
        self.before_device_reads(&device)?;
        read_runs(&mut self.disk.lock().dev, &runs, self.bs)
    }

    /// File blocks (with their device blocks, in file order) merged into device runs of at
    /// most `max_command_bytes`: (first file block, first device block, blocks).
    fn fetch_runs(&self, blocks: &[(u32, u64)]) -> Vec<(u32, u64, usize)> {
        let max_blocks = (self.opts.max_command_bytes / self.bs).max(1);
        let mut runs: Vec<(u32, u64, usize)> = Vec::new();
        for &(b, p) in blocks {
            match runs.last_mut() {
                Some((lb, lp, len))
                    if *lb + *len as u32 == b && *lp + *len as u64 == p && *len < max_blocks =>
                {
                    *len += 1
                }
                _ => runs.push((b, p, 1)),
            }
        }
        runs
    }

    /// Writes `data` at `offset`, growing the file as needed. All or nothing per step: space
    /// is checked before anything changes.
    pub(crate) fn write_at(
        &mut self,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<usize, FsError> {
        self.writable()?;
        self.file_node(ino)?;
        self.write_data(ino, offset, data)
    }

    /// [`Mounted::write_at`] without the check that `ino` is a regular file (a slow symbolic
    /// link's target is written this way).
    pub(super) fn write_data(
        &mut self,
        ino: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<usize, FsError> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= self.max_file_bytes())
            .ok_or_else(|| FsError::FileTooLarge(format!("inode {ino}")))?;
        if data.is_empty() {
            return Ok(0);
        }
        let mut done = 0;
        while done < data.len() {
            let step = (data.len() - done).min(WRITE_STEP);
            self.make_transaction_room()?;
            let large = data.len() >= self.opts.bypass_bytes;
            self.write_step(ino, offset + done as u64, &data[done..done + step], large)?;
            done += step;
        }
        self.write_done(ino, end)?;
        Ok(data.len())
    }

    /// Where a write of `len` bytes at `offset` of file `ino` ends; fails past the largest
    /// file.
    pub(crate) fn write_end(&self, ino: u64, offset: u64, len: usize) -> Result<u64, FsError> {
        offset
            .checked_add(len as u64)
            .filter(|&e| e <= self.max_file_bytes())
            .ok_or_else(|| FsError::FileTooLarge(format!("inode {ino}")))
    }

    /// Whether a write of `len` bytes bypasses the cache (its whole blocks go to the device).
    pub(crate) fn write_is_large(&self, len: usize) -> bool {
        len >= self.opts.bypass_bytes
    }

    /// A write that ended at `end` is done: size (if it grew), times.
    pub(crate) fn write_done(&mut self, ino: u64, end: u64) -> Result<(), FsError> {
        let now = crate::mkfs::now_ns();
        let node = self.node(ino)?;
        let grew = end > node.inode.size;
        if grew {
            node.inode.size = end;
        }
        node.inode.mtime_ns = now;
        node.inode.ctime_ns = now;
        if grew {
            self.mark_layout_changed(ino);
        }
        self.touch(ino);
        Ok(())
    }

    pub(super) fn write_step(
        &mut self,
        ino: u64,
        offset: u64,
        data: &[u8],
        large: bool,
    ) -> Result<(), FsError> {
        let (plan, _) = self.write_step_plan(ino, offset, data, large)?;
        if !plan.is_empty() {
            self.disk.lock().dev.batch(plan.into_ops())?;
        }
        Ok(())
    }

    /// One step of a write (at most [`WRITE_STEP`] bytes) as far as it goes under the state
    /// lock: blocks for the holes, partial and small writes into the cache. Returns the planned
    /// device writes of a large write's whole blocks (the journal already checkpointed if it
    /// held an image of one of them), still pointing into `data`: the caller copies them into
    /// commands (`into_ops`) once the state lock is released and issues them holding the disk
    /// lock, taken before it releases the state lock, so that they reach the device before
    /// anything planned later (a commit whose metadata points at them, a read of them). The
    /// flag says whether any of them fills a hole: such a block is mapped from now on but holds
    /// whatever was on the device (another file's old data) until the write lands, so the
    /// caller must hold the disk lock exclusively for them (a reader takes it shared to fetch,
    /// and would otherwise read the block before the write reached it; the size does not
    /// protect it, since another writer or a truncation may grow the file over it meanwhile).
    pub(crate) fn write_step_plan<'d>(
        &mut self,
        ino: u64,
        offset: u64,
        data: &'d [u8],
        large: bool,
    ) -> Result<(PlannedWrites<&'d [u8]>, bool), FsError> {
        self.data_changed(ino);
        let bs = self.bs as u64;
        let first = (offset / bs) as u32;
        let last = ((offset + data.len() as u64 - 1) / bs) as u32;
        let fresh = self.map_holes(ino, first, last)?;
        let map = self.node(ino)?.map.clone();
        let mut direct: Vec<(u64, &[u8])> = Vec::new();
        let mut fills_holes = false;
        for b in first..=last {
            let block_start = u64::from(b) * bs;
            let lo = block_start.max(offset);
            let hi = (block_start + bs).min(offset + data.len() as u64);
            let src = &data[(lo - offset) as usize..(hi - offset) as usize];
            let within = (lo - block_start) as usize;
            let whole = src.len() == self.bs;
            if large && whole {
                fills_holes |= fresh.contains(&b);
                self.cache.remove(ino, b);
                let (p, _) = map.lookup(b).ok_or_else(|| {
                    corrupt(format!("inode {ino}: block {b} unmapped after allocation"))
                })?;
                direct.push((p, src));
                continue;
            }
            if let Some(slot) = self.cache.get(ino, b) {
                slot.bytes_mut()[within..within + src.len()].copy_from_slice(src);
                self.cache.mark_dirty(ino, b);
                continue;
            }
            let mut buf = if whole || fresh.contains(&b) {
                IoBuf::zeroed(self.bs)
            } else {
                let (p, _) = map.lookup(b).ok_or_else(|| {
                    corrupt(format!("inode {ino}: block {b} unmapped after allocation"))
                })?;
                self.fetch(&[(b, p)])?
                    .remove(&b)
                    .ok_or_else(|| corrupt(format!("inode {ino}: block {b} was not read")))?
            };
            buf[within..within + src.len()].copy_from_slice(src);
            let victims = self.cache.make_room(1);
            self.write_victims(victims)?;
            self.cache.insert(ino, b, buf, true);
        }
        if direct.is_empty() {
            return Ok((PlannedWrites::none(self.bs), false));
        }
        let plan = PlannedWrites::of_blocks(direct, self.bs, self.opts.max_command_bytes);
        self.cache.stats.bypass_bytes += plan.bytes();
        self.before_direct_writes(&plan.targets())?;
        Ok((plan, fills_holes))
    }

    /// Allocates device blocks for every hole in file blocks `first..=last`; returns the file
    /// blocks that were holes. Fails before changing anything when the space is not there.
    fn map_holes(&mut self, ino: u64, first: u32, last: u32) -> Result<HashSet<u32>, FsError> {
        let node = self.node(ino)?;
        let holes: Vec<u32> = (first..=last)
            .filter(|&b| node.map.lookup(b).is_none())
            .collect();
        if holes.is_empty() {
            return Ok(HashSet::new());
        }
        self.mark_layout_changed(ino);
        // Extent blocks may be needed too; keep a small reserve for them.
        if self.alloc.free_block_count() < holes.len() as u64 + 4 {
            return Err(FsError::NoSpace(format!(
                "{} blocks needed, {} free",
                holes.len(),
                self.alloc.free_block_count()
            )));
        }
        let mut i = 0;
        while i < holes.len() {
            let mut run = 1;
            while i + run < holes.len() && holes[i + run] == holes[i] + run as u32 {
                run += 1;
            }
            let logical = holes[i];
            let node = self.node(ino)?;
            let goal = logical
                .checked_sub(1)
                .and_then(|p| node.map.lookup(p))
                .map(|(p, _)| p + 1)
                .or_else(|| {
                    node.map
                        .extents()
                        .last()
                        .map(|e| e.physical + u64::from(e.length))
                })
                .unwrap_or(0);
            let (start, got) = self
                .alloc
                .alloc_blocks(goal, run as u64)
                .ok_or_else(|| FsError::NoSpace("the device is full".into()))?;
            let node = self.node(ino)?;
            node.map.insert(logical, got as u32, start);
            node.map_dirty = true;
            i += got as usize;
            // At once, so that a later run failing to allocate leaves the node counted.
            self.touch(ino);
        }
        self.touch(ino);
        Ok(holes.into_iter().collect())
    }

    /// Sets the file's size; blocks past the new end are freed and the tail of the last block
    /// is zeroed so that growing the file again reads zeroes.
    pub(crate) fn set_len(&mut self, ino: u64, size: u64) -> Result<(), FsError> {
        self.writable()?;
        self.file_node(ino)?;
        if size > self.max_file_bytes() {
            return Err(FsError::FileTooLarge(format!("inode {ino}")));
        }
        self.make_transaction_room()?;
        self.data_changed(ino);
        let bs = self.bs as u64;
        let old = self.node(ino)?.inode.size;
        if size < old {
            let keep = size.div_ceil(bs) as u32;
            let node = self.node(ino)?;
            let freed = node.map.truncate(keep);
            if !freed.is_empty() {
                node.map_dirty = true;
            }
            for (start, len) in freed {
                self.alloc.free_blocks(start, u64::from(len));
            }
            // Before the tail's read, which may fail: the map changed (`touch` counts it).
            self.touch(ino);
            self.cache.remove_from(ino, keep);
            let tail = (size % bs) as usize;
            if tail != 0 {
                let b = (size / bs) as u32;
                let mapped = self.node(ino)?.map.lookup(b);
                if let Some((p, _)) = mapped {
                    if self.cache.get(ino, b).is_none() {
                        let buf = self.fetch(&[(b, p)])?.remove(&b).ok_or_else(|| {
                            corrupt(format!("inode {ino}: block {b} was not read"))
                        })?;
                        let victims = self.cache.make_room(1);
                        self.write_victims(victims)?;
                        self.cache.insert(ino, b, buf, false);
                    }
                    if let Some(slot) = self.cache.get(ino, b) {
                        slot.bytes_mut()[tail..].fill(0);
                        self.cache.mark_dirty(ino, b);
                    }
                }
            }
        }
        self.mark_layout_changed(ino);
        let now = crate::mkfs::now_ns();
        let node = self.node(ino)?;
        node.inode.size = size;
        node.inode.mtime_ns = now;
        node.inode.ctime_ns = now;
        self.touch(ino);
        self.next_sequential.remove(&ino);
        Ok(())
    }

    /// `fallocate` of `len` bytes at `offset` ([`Fallocate`], format §6 "Preallocation").
    pub(crate) fn fallocate(
        &mut self,
        ino: u64,
        offset: u64,
        len: u64,
        mode: Fallocate,
    ) -> Result<(), FsError> {
        self.writable()?;
        self.file_node(ino)?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.max_file_bytes())
            .ok_or_else(|| FsError::FileTooLarge(format!("inode {ino}")))?;
        if len == 0 {
            return Err(FsError::Invalid("fallocate of 0 bytes".into()));
        }
        match mode {
            Fallocate::Allocate { keep_size } => self.preallocate(ino, offset, end, keep_size),
            Fallocate::PunchHole => self.punch_hole(ino, offset, end),
        }
    }

    fn preallocate(
        &mut self,
        ino: u64,
        offset: u64,
        end: u64,
        keep_size: bool,
    ) -> Result<(), FsError> {
        let bs = self.bs as u64;
        let first = (offset / bs) as u32;
        let last = ((end - 1) / bs) as u32;
        let step = (WRITE_STEP / self.bs) as u32;
        let mut at = first;
        loop {
            let upto = at.saturating_add(step - 1).min(last);
            self.make_transaction_room()?;
            self.data_changed(ino);
            let fresh = self.map_holes(ino, at, upto)?;
            if !fresh.is_empty() {
                // The new blocks read as zeroes: write zeroes to them now (ordered data, before
                // the commit that makes them part of the file).
                let map = self.node(ino)?.map.clone();
                let mut blocks: Vec<u32> = fresh.into_iter().collect();
                blocks.sort_unstable();
                let mut runs: Vec<(u64, usize)> = Vec::new();
                for b in blocks {
                    self.cache.remove(ino, b);
                    let (p, _) = map.lookup(b).ok_or_else(|| {
                        corrupt(format!("inode {ino}: block {b} unmapped after allocation"))
                    })?;
                    match runs.last_mut() {
                        Some((start, n))
                            if *start + *n as u64 == p
                                && (*n + 1) * self.bs <= self.opts.max_command_bytes =>
                        {
                            *n += 1
                        }
                        _ => runs.push((p, 1)),
                    }
                }
                let targets: Vec<u64> = runs.iter().flat_map(|&(p, n)| p..p + n as u64).collect();
                self.before_direct_writes(&targets)?;
                let ops: Vec<BatchOp> = runs
                    .into_iter()
                    .map(|(p, n)| {
                        let mut buf = command_buffer(n * self.bs);
                        buf.fill(0);
                        BatchOp {
                            write: true,
                            block: p,
                            buf,
                        }
                    })
                    .collect();
                self.disk.lock().dev.batch(ops)?;
            }
            if upto == last {
                break;
            }
            at = upto + 1;
        }
        let node = self.node(ino)?;
        if !keep_size && end > node.inode.size {
            node.inode.size = end;
            node.inode.mtime_ns = crate::mkfs::now_ns();
        }
        node.inode.ctime_ns = crate::mkfs::now_ns();
        self.mark_layout_changed(ino);
        self.touch(ino);
        Ok(())
    }

    fn punch_hole(&mut self, ino: u64, offset: u64, end: u64) -> Result<(), FsError> {
        let bs = self.bs as u64;
        let size = self.node(ino)?.inode.size;
        let end = end.min(size);
        if offset >= end {
            return Ok(());
        }
        self.make_transaction_room()?;
        self.data_changed(ino);
        // Partial blocks at the edges are zeroed in place (only where they hold data).
        let whole_from = offset.div_ceil(bs);
        let whole_to = end / bs;
        let mut edges = Vec::new();
        if !offset.is_multiple_of(bs) {
            edges.push((offset, end.min((offset / bs + 1) * bs)));
        }
        if !end.is_multiple_of(bs) && (offset.is_multiple_of(bs) || end / bs != offset / bs) {
            edges.push(((end / bs) * bs, end));
        }
        for (lo, hi) in edges {
            let b = (lo / bs) as u32;
            if self.node(ino)?.map.lookup(b).is_some() {
                let zeroes = vec![0u8; (hi - lo) as usize];
                self.write_step(ino, lo, &zeroes, false)?;
            }
        }
        if whole_to > whole_from {
            let node = self.node(ino)?;
            let freed = node.map.punch(whole_from as u32, whole_to as u32);
            if !freed.is_empty() {
                node.map_dirty = true;
            }
            for e in freed {
                for b in e.logical..e.logical + e.length {
                    self.cache.remove(ino, b);
                }
                self.alloc.free_blocks(e.physical, u64::from(e.length));
            }
        }
        let now = crate::mkfs::now_ns();
        let node = self.node(ino)?;
        node.inode.mtime_ns = now;
        node.inode.ctime_ns = now;
        self.mark_layout_changed(ino);
        self.touch(ino);
        self.next_sequential.remove(&ino);
        Ok(())
    }

    /// Drops the cached blocks and read-ahead state of file `ino` (its inode was freed).
    pub(super) fn forget_data(&mut self, ino: u64) {
        self.data_changed(ino);
        self.cache.remove_from(ino, 0);
        self.next_sequential.remove(&ino);
    }

    /// The dirty cached blocks of file `only` (or of every file) as (file, file block,
    /// contents), marked clean.
    pub(super) fn take_dirty_data(&mut self, only: Option<u64>) -> Vec<Victim> {
        self.cache.take_dirty(only)
    }

    /// Dirty cached blocks (of one file or all) as planned writes, marked clean.
    pub(super) fn dirty_data_plan(
        &mut self,
        only: Option<u64>,
    ) -> Result<PlannedWrites<Arc<IoBuf>>, FsError> {
        let dirty = self.cache.take_dirty(only);
        self.placed(dirty)
    }

    /// Maps (file, file block, data) to device writes, merging physically contiguous blocks
    /// into commands; the caller turns the plan into commands (copies the data) when it no
    /// longer holds the state lock, where it can.
    pub(super) fn placed(
        &mut self,
        blocks: Vec<Victim>,
    ) -> Result<PlannedWrites<Arc<IoBuf>>, FsError> {
        let (plan, unsettled) = self.placed_unchecked(blocks)?;
        if let Some(targets) = unsettled {
            self.before_direct_writes(&targets)?;
        }
        Ok(plan)
    }

    /// [`Mounted::placed`] without the journal check: also returns the home blocks when some
    /// may hold a committed image in the journal, for whoever issues the plan to check under
    /// the disk lock before it does ([`Prepared`](super::disk::Prepared)'s `home_unsettled`).
    pub(super) fn placed_unchecked(
        &mut self,
        blocks: Vec<Victim>,
    ) -> Result<UncheckedHomeWrites, FsError> {
        let located = self.locate(blocks)?;
        let targets: Vec<u64> = located.iter().map(|(p, _)| *p).collect();
        let unsettled = self.may_have_images(&targets);
        let plan = PlannedWrites::of_blocks(located, self.bs, self.opts.max_command_bytes);
        Ok((plan, unsettled.then_some(targets)))
    }

    /// Dirty cached blocks as (device block, contents) for the journal, which writes them with
    /// the metadata when they are few (format §7); blocks of freed files are dropped.
    pub(super) fn journaled(
        &mut self,
        blocks: Vec<Victim>,
    ) -> Result<Vec<(u64, Vec<u8>)>, FsError> {
        Ok(self
            .locate(blocks)?
            .into_iter()
            .map(|(p, buf)| (p, buf.to_vec()))
            .collect())
    }

    /// (file, file block, data) as (device block, data); blocks of freed files are dropped.
    fn locate(&mut self, blocks: Vec<Victim>) -> Result<Vec<(u64, Arc<IoBuf>)>, FsError> {
        let mut located = Vec::with_capacity(blocks.len());
        for (ino, b, buf) in blocks {
            let node = self.node(ino)?;
            if node.inode.kind == Kind::Free {
                continue;
            }
            let (p, _) = node.map.lookup(b).ok_or_else(|| {
                corrupt(format!("inode {ino}: cached block {b} has no device block"))
            })?;
            located.push((p, buf));
        }
        Ok(located)
    }

    /// A block whose newest committed contents sit in the journal (a journaled data block) may
    /// not be written home directly: replay, or the next checkpoint, would put the older image
    /// back over the newer data. Such writes first checkpoint the journal, which writes every
    /// pending image home and retires it.
    /// Targets outside the unsettled blocks (see [`Mounted::unsettle`]) cannot have an image:
    /// then the disk lock is not taken at all.
    pub(super) fn before_direct_writes(&mut self, targets: &[u64]) -> Result<(), FsError> {
        if !self.may_have_images(targets) {
            return Ok(());
        }
        let mut d = self.disk.lock();
        if targets.iter().any(|&b| d.journal.image(b).is_some()) {
            let super::disk::Disk { dev, journal, .. } = &mut *d;
            journal.checkpoint(dev)?;
        }
        // Both locks held exclusively: as in `before_device_reads`, the images are exact now.
        self.unsettled = d.journal.image_blocks(UNSETTLED_MAX);
        Ok(())
    }

    /// The read-side twin of [`Mounted::before_direct_writes`]: a file block whose newest committed
    /// contents sit in the journal (small fsync'd data is journaled, and its cached copy may have
    /// been evicted since) has a stale home copy, so reading it from the device would return old
    /// data. Such reads first checkpoint the journal. `runs` are (first device block, blocks).
    ///
    /// Runs outside the unsettled blocks (see [`Mounted::unsettle`]) cannot have an image, so
    /// the disk lock is not taken for them: a commit holds it through its log write and flush,
    /// and this thread holds the state lock, so every other thread would wait too.
    pub(super) fn before_device_reads(&mut self, runs: &[(u64, u64)]) -> Result<(), FsError> {
        // Nothing to read from the device (a large read found every block cached): nothing to
        // look up, and no reason to wait for a commit.
        if runs.iter().all(|&(_, count)| count == 0) {
            return Ok(());
        }
        if self.unsettled.as_ref().is_some_and(|u| settled(u, runs)) {
            return Ok(());
        }
        let mut d = self.disk.lock();
        if runs
            .iter()
            .any(|&(start, count)| d.journal.has_image_in(start, count))
        {
            let super::disk::Disk { dev, journal, .. } = &mut *d;
            journal.checkpoint(dev)?;
        }
        // Holding the state lock and the disk lock exclusively: every commit prepared so far has
        // written its log (its leader took the disk lock before letting the state lock go), so
        // the journal's images are exactly the blocks whose home copy is old.
        self.unsettled = d.journal.image_blocks(UNSETTLED_MAX);
        Ok(())
    }

    /// Whether any of `targets` may have a committed image in the journal (it is among the
    /// unsettled blocks, or those are not tracked just now); `false` is exact.
    fn may_have_images(&self, targets: &[u64]) -> bool {
        self.unsettled
            .as_ref()
            .is_none_or(|u| targets.iter().any(|t| u.contains(t)))
    }

    /// Records that these device blocks may get committed contents newer than their home copy
    /// (a commit's log images), until the next exact look ([`Mounted::before_device_reads`]).
    /// Called under the state lock when the commit is prepared, before its leader writes it.
    pub(super) fn unsettle(&mut self, blocks: impl IntoIterator<Item = u64>) {
        if let Some(u) = &mut self.unsettled {
            u.extend(blocks);
            if u.len() > UNSETTLED_MAX {
                self.unsettled = None;
            }
        }
    }

    /// Queues the writes of dirty blocks evicted from the cache: done by the next holder of
    /// the disk lock, before anything else it does (`disk.rs`, "Write-back of evicted blocks").
    pub(super) fn write_victims(&mut self, victims: Vec<Victim>) -> Result<(), FsError> {
        if victims.is_empty() {
            return Ok(());
        }
        let plan = self.placed(victims)?;
        self.disk.queue_writeback(plan);
        Ok(())
    }
}

/// A streaming read in progress ([`Mounted::stream_begin`]).
pub(crate) struct Stream {
    ino: u64,
    offset: u64,
    /// Bytes the stream covers.
    n: u64,
    /// The next window's first file block.
    start: u64,
    last: u64,
    /// Bytes of the first block before `offset`, still to skip.
    skip: usize,
    /// Bytes still to deliver.
    left: u64,
    depth: usize,
}

impl Stream {
    /// Reads a window's `pieces` (the caller holds the disk lock) and hands each buffer to
    /// `deliver` with the part of it inside the stream's range.
    pub(crate) fn read(
        &mut self,
        dev: &mut FsDevice,
        pieces: &[StreamPart],
        deliver: &mut dyn FnMut(IoBuf, std::ops::Range<usize>),
    ) -> Result<(), FsError> {
        let (skip, left) = (&mut self.skip, &mut self.left);
        dev.stream_read_owned(pieces, self.depth, |buf: IoBuf| {
            let skipped = (*skip).min(buf.len());
            *skip -= skipped;
            let take = ((buf.len() - skipped) as u64).min(*left) as usize;
            if take > 0 {
                *left -= take as u64;
                deliver(buf, skipped..skipped + take);
            }
        })
    }
}

/// Writes of dirty blocks home, with the home blocks when some may still have a committed
/// image in the journal ([`Mounted::placed_unchecked`]).
pub(super) type UncheckedHomeWrites = (PlannedWrites<Arc<IoBuf>>, Option<Vec<u64>>);

/// What a read found under the state lock ([`Mounted::read_begin`]).
pub(crate) enum ReadStep {
    /// Served: this many bytes were read.
    Done(usize),
    /// These blocks must come from the device first.
    Fetch(FetchPlan),
}

/// Blocks a read must fetch from the device, planned under the state lock; the fetch itself
/// ([`FetchPlan::read`]) needs only the disk lock.
pub(crate) struct FetchPlan {
    ino: u64,
    offset: u64,
    /// The file's data stamp when planned.
    version: u64,
    /// (first file block, first device block, blocks)
    runs: Vec<(u32, u64, usize)>,
    bs: usize,
    /// A large read of this many bytes, read by the device straight into the caller's buffer
    /// (cached blocks and holes already copied there); `None`: blocks for the cache.
    direct: Option<usize>,
}

impl FetchPlan {
    /// Reads the planned blocks (the caller holds the disk lock, and need not hold the state
    /// lock): into `out` for a large read (returning nothing), else as blocks to cache.
    pub(crate) fn read(
        &self,
        dev: &mut FsDevice,
        out: &mut [u8],
    ) -> Result<BTreeMap<u32, IoBuf>, FsError> {
        let Some(n) = self.direct else {
            return read_runs(dev, &self.runs, self.bs);
        };
        let (bs, offset) = (self.bs as u64, self.offset);
        let out = &mut out[..n];
        let end = offset + n as u64;
        let ops = self
            .runs
            .iter()
            .map(|&(_, p, len)| BatchOp {
                write: false,
                block: p,
                buf: command_buffer(len * self.bs),
            })
            .collect();
        dev.batch_each(ops, |i, buf| {
            let (b, _, len) = self.runs[i];
            let run_lo = u64::from(b) * bs;
            let lo = run_lo.max(offset);
            let hi = (run_lo + len as u64 * bs).min(end);
            out[(lo - offset) as usize..(hi - offset) as usize]
                .copy_from_slice(&buf[(lo - run_lo) as usize..(hi - run_lo) as usize]);
        })?;
        Ok(BTreeMap::new())
    }
}

/// Whether none of `runs` (first device block, blocks) holds a block of `unsettled`.
fn settled(unsettled: &BTreeSet<u64>, runs: &[(u64, u64)]) -> bool {
    !runs.iter().any(|&(start, count)| {
        count > 0
            && unsettled
                .range(start..start.saturating_add(count))
                .next()
                .is_some()
    })
}

/// Reads `runs` (first file block, first device block, blocks) at queue depth; returns each
/// file block's contents.
fn read_runs(
    dev: &mut FsDevice,
    runs: &[(u32, u64, usize)],
    bs: usize,
) -> Result<BTreeMap<u32, IoBuf>, FsError> {
    let ops = runs
        .iter()
        .map(|&(_, p, len)| BatchOp {
            write: false,
            block: p,
            buf: command_buffer(len * bs),
        })
        .collect();
    let done = dev.batch(ops)?;
    let mut out = BTreeMap::new();
    for (&(b, _, len), op) in runs.iter().zip(done) {
        if len == 1 {
            out.insert(b, op.buf);
        } else {
            for i in 0..len {
                out.insert(
                    b + i as u32,
                    IoBuf::from_slice(&op.buf[i * bs..(i + 1) * bs]),
                );
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::{FileSystem, MkfsOptions, MountOptions, OpenOptions};
    use kura_engine::backend::common::QueueOptions;
    use kura_engine::backend::mem::MemDevice;
    use std::time::Duration;

    const BLOCK: usize = 4096;

    fn block(b: u8) -> Vec<u8> {
        vec![b.wrapping_mul(37) | 1; BLOCK]
    }

    /// A 16-block file `/f`, committed, on a file system mounted again (nothing cached).
    fn mounted_with_file() -> FileSystem {
        let dev = MemDevice::new(64 << 20, QueueOptions::default());
        let storage = dev.storage();
        let opts = MountOptions {
            cache_bytes: 256 << 10,
            ..MountOptions::default()
        };
        let fs = FileSystem::format(Box::new(dev), MkfsOptions::default(), opts).expect("format");
        let data: Vec<u8> = (0..16).flat_map(block).collect();
        fs.write("/f", &data).expect("write");
        fs.unmount().expect("unmount");
        let dev = MemDevice::with_storage(storage, QueueOptions::default());
        FileSystem::mount(Box::new(dev), opts).expect("mount")
    }

    /// Device block holding byte `offset` of file `ino` (the file system's blocks may be
    /// larger than the 4 KiB pieces the tests write).
    fn home(fs: &FileSystem, ino: u64, offset: u64) -> u64 {
        let mut g = fs.lock();
        let b = (offset / g.bs as u64) as u32;
        let node = g.node(ino).expect("node");
        node.map.lookup(b).expect("mapped").0
    }

    /// A read miss of blocks no commit logged is planned while another thread holds the disk
    /// lock exclusively, as a group commit's leader does through its log write and flush: the
    /// look at the journal does not wait for it while holding the state lock (which would stop
    /// every other thread too). Were it to wait, it would finish only when the lock is let go,
    /// after the generous wait below, and the test fails.
    #[test]
    fn a_read_miss_is_planned_while_a_commit_holds_the_disk_lock() {
        let fs = mounted_with_file();
        let f = fs.open("/f").expect("open");
        let mut buf = vec![0u8; BLOCK];
        // The first device read looks under the disk lock: the unsettled blocks are known (none).
        f.read_at(0, &mut buf).expect("read block 0");
        assert_eq!(buf, block(0));
        assert_eq!(fs.lock().unsettled.as_ref().map(|u| u.len()), Some(0));
        let home9 = home(&fs, f.ino(), 9 * BLOCK as u64);
        let disk = fs.lock().disk();
        let held = disk.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let looked = fs.lock().before_device_reads(&[(home9, 1)]).is_ok();
                let _ = tx.send(looked);
            });
            let got = rx.recv_timeout(Duration::from_secs(60));
            drop(held);
            assert_eq!(got, Ok(true), "the read miss waited for the disk lock");
        });
        f.read_at(9 * BLOCK as u64, &mut buf).expect("read block 9");
        assert_eq!(buf, block(9));
        drop(f);
        fs.unmount().expect("unmount");
    }

    /// A large read (over `bypass_bytes`) whose blocks are all cached is a copy under the shared
    /// state lock: it completes while another thread holds the lock shared (as every cached
    /// reader does), where the exclusive lock would wait for that reader to finish and the
    /// read would not complete before the generous wait below.
    #[test]
    fn a_large_read_of_cached_blocks_runs_beside_other_readers() {
        let fs = FileSystem::format(
            Box::new(MemDevice::new(64 << 20, QueueOptions::default())),
            MkfsOptions::default(),
            MountOptions {
                cache_bytes: 8 << 20,
                ..MountOptions::default()
            },
        )
        .expect("format");
        let f = fs
            .open_with("/f", OpenOptions::new().read(true).write(true).create(true))
            .expect("create");
        // Written in pieces below the bypass threshold, so every block lands in the cache.
        let piece = 64 << 10;
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 251) as u8).collect();
        for (k, chunk) in data.chunks(piece).enumerate() {
            f.write_at((k * piece) as u64, chunk).expect("write");
        }
        let large = 512 << 10;
        assert!(large >= MountOptions::default().bypass_bytes);
        let held = fs.read_lock();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut out = vec![0u8; large];
                let n = f.read_at(256 << 10, &mut out).expect("read");
                let _ = tx.send((n, out));
            });
            let got = rx.recv_timeout(Duration::from_secs(60));
            drop(held);
            let (n, out) = got.expect("the large cached read waited for the exclusive lock");
            assert_eq!(n, large);
            assert!(out == data[256 << 10..(256 << 10) + large], "wrong bytes");
        });
        drop(f);
        fs.unmount().expect("unmount");
    }

    /// An fdatasync that finds another thread's flush holding the disk lock waits for it with
    /// the state lock released: meanwhile another thread creates a file, which needs the state
    /// lock exclusively. The wait is counted (`disk_waits`), which is how the test knows the
    /// fdatasync has reached it.
    #[test]
    fn an_fdatasync_waits_for_a_busy_disk_without_the_state_lock() {
        let fs = mounted_with_file();
        let f = fs
            .open_with("/f", OpenOptions::new().read(true).write(true))
            .expect("open");
        // An overwrite: no size or map change, so fdatasync writes the block home and flushes.
        f.write_at(0, &block(200)).expect("overwrite");
        let disk = fs.lock().disk();
        let held = disk.lock();
        std::thread::scope(|s| {
            let syncing = s.spawn(|| f.sync_data());
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while fs.disk_waits() == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if fs.disk_waits() != 1 {
                drop(held);
                panic!("the fdatasync waited for the disk holding the state lock");
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let creator = fs.clone();
            s.spawn(move || {
                let _ = tx.send(creator.create("/g").map(|_| ()));
            });
            let created = rx.recv_timeout(Duration::from_secs(60));
            drop(held);
            assert!(
                matches!(created, Ok(Ok(()))),
                "a create waited for the fdatasync's state lock: {created:?}"
            );
            syncing.join().expect("join").expect("fdatasync");
        });
        let mut buf = vec![0u8; BLOCK];
        f.read_at(0, &mut buf).expect("read");
        assert_eq!(buf, block(200));
        drop(f);
        fs.unmount().expect("unmount");
    }

    /// Every block a commit logged is unsettled, so a device read of it looks at the journal
    /// under the disk lock and checkpoints first; that look makes the set exact (empty) again.
    #[test]
    fn a_logged_block_is_unsettled_until_a_read_of_it_checkpoints_the_journal() {
        let fs = mounted_with_file();
        let f = fs
            .open_with("/f", OpenOptions::new().read(true).write(true))
            .expect("open");
        let mut buf = vec![0u8; BLOCK];
        f.read_at(0, &mut buf).expect("read block 0");
        // A small write, fsync'd: its data goes into the log with the inode (format §7).
        f.write_at(2 * BLOCK as u64, &block(100)).expect("write");
        f.sync_all().expect("fsync");
        let home2 = home(&fs, f.ino(), 2 * BLOCK as u64);
        let mut g = fs.lock();
        let logged = g
            .disk()
            .lock()
            .journal
            .image_blocks(usize::MAX)
            .expect("every block");
        assert!(
            logged.contains(&home2),
            "block 2's home {home2} not logged: {logged:?}"
        );
        let unsettled = g.unsettled.clone().expect("known");
        assert!(
            logged.is_subset(&unsettled),
            "logged {logged:?}, unsettled {unsettled:?}"
        );
        g.before_device_reads(&[(home2, 1)]).expect("checkpoint");
        assert!(!g.disk().lock().journal.has_image_in(home2, 1));
        assert_eq!(g.unsettled.as_ref().map(|u| u.len()), Some(0));
        drop(g);
        f.read_at(2 * BLOCK as u64, &mut buf).expect("read block 2");
        assert_eq!(buf, block(100));
        drop(f);
        fs.unmount().expect("unmount");
    }
}
