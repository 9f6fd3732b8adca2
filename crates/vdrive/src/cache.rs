//! `cache(CHILD)?size=SIZE&mode=wt|wb` — an LRU block cache in front of one child (32 MiB by
//! default), as DeLiBA puts in front of its block stack.
//!
//! It owns the cached blocks and their order of use. Reads are served from the cache where it has
//! the blocks; each run of missing blocks is read from the child in one command and kept.
//! - **Write-through** (`mode=wt`, the default): a write goes to the child first and is
//!   acknowledged when the child acknowledges it; the cache then holds the new data. When the
//!   child fails it, the cache forgets those blocks and the caller gets the child's error.
//! - **Write-back** (`mode=wb`): a write only updates the cache and marks its blocks dirty. Dirty
//!   blocks go to the child when they are evicted (with the dirty blocks next to them, in one
//!   command) or at a flush, which writes every dirty block back and then flushes the child, so a
//!   successful flush means everything acknowledged before it is durable on the child. A
//!   write-back that fails leaves its blocks dirty in the cache and fails the request that
//!   caused it; a failed flush poisons the drive. Dropping the drive writes dirty blocks back
//!   (best effort; flush to know).
//!
//! Write-zeroes and discards drop the cached blocks they cover (dirty or not) and go to the child.
//! Each command is carried out against the child while it is submitted (the child sees one
//! command at a time) and completes at the next poll.

use kura_engine::backend::common::CompletedQueue;
use kura_engine::open::ChildOpener;
use kura_engine::{
    BlockDevice, BlockingIo, Completion, DeviceError, DeviceResult, Geometry, IoBuf, Opcode,
    OpenError, Rejected, Request, Spec,
};
use std::collections::BTreeMap;

/// Options of `cache(...)`.
pub const CACHE_OPTIONS: &[&str] = &["size", "mode"];
/// Cache size when none is given (DeLiBA's default).
pub const DEFAULT_CACHE_BYTES: u64 = 32 << 20;
/// Most blocks moved to or from the child in one command.
const MAX_RUN_BLOCKS: u64 = 256;

/// When writes reach the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Before they are acknowledged.
    WriteThrough,
    /// On eviction or flush.
    WriteBack,
}

/// Counts of what the cache did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Blocks read from the cache.
    pub hits: u64,
    /// Blocks read from the child.
    pub misses: u64,
    /// Blocks dropped to make room.
    pub evictions: u64,
    /// Dirty blocks written to the child.
    pub written_back: u64,
}

struct Entry {
    data: Box<[u8]>,
    dirty: bool,
    tick: u64,
}

/// The block cache.
pub struct Cache {
    child: Box<dyn BlockDevice>,
    geo: Geometry,
    mode: CacheMode,
    capacity: usize,
    entries: BTreeMap<u64, Entry>,
    /// Use order: tick of last use to block.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    queue: CompletedQueue,
    stats: CacheStats,
}

impl Cache {
    /// A cache of `size` bytes (at least one block of the child) in front of `child`, which must
    /// be idle and is driven one command at a time from now on.
    pub fn new(child: Box<dyn BlockDevice>, size: u64, mode: CacheMode) -> Result<Self, OpenError> {
        let geo = child.geometry();
        let bs = u64::from(geo.block_size);
        if size < bs {
            return Err(OpenError::Invalid(format!(
                "cache({}): size {size} is smaller than one {bs}-byte block",
                child.describe()
            )));
        }
        Ok(Cache {
            capacity: usize::try_from(size / bs).unwrap_or(usize::MAX),
            child,
            geo,
            mode,
            entries: BTreeMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            queue: CompletedQueue::default(),
            stats: CacheStats::default(),
        })
    }

    pub fn mode(&self) -> CacheMode {
        self.mode
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Blocks held.
    pub fn cached_blocks(&self) -> usize {
        self.entries.len()
    }

    /// Blocks written by the caller and not yet on the child.
    pub fn dirty_blocks(&self) -> usize {
        self.entries.values().filter(|e| e.dirty).count()
    }

    fn bs(&self) -> usize {
        self.geo.block_size as usize
    }

    /// Runs one command on the idle child, always handing its buffer back.
    fn child_run(&mut self, req: Request) -> (Option<IoBuf>, DeviceResult<()>) {
        if let Err(r) = self.child.submit(req) {
            return (r.request.buf, Err(r.error));
        }
        let mut out = Vec::with_capacity(1);
        while out.is_empty() {
            if let Err(e) = self.child.poll(&mut out, 1) {
                return (None, Err(e));
            }
        }
        match out.pop() {
            Some(c) => (c.buf, c.status),
            None => (
                None,
                Err(DeviceError::Offline {
                    reason: "cache child lost a completion".into(),
                }),
            ),
        }
    }

    fn touch(&mut self, lba: u64) {
        if let Some(e) = self.entries.get_mut(&lba) {
            self.lru.remove(&e.tick);
            self.tick += 1;
            e.tick = self.tick;
            self.lru.insert(self.tick, lba);
        }
    }

    fn forget(&mut self, lba: u64) -> Option<Entry> {
        let e = self.entries.remove(&lba)?;
        self.lru.remove(&e.tick);
        Some(e)
    }

    /// Writes the dirty run of blocks around `lba` (up to [`MAX_RUN_BLOCKS`]) to the child and
    /// marks it clean; on failure the blocks stay dirty.
    fn write_back_around(&mut self, lba: u64) -> DeviceResult<()> {
        let dirty = |c: &Self, l: u64| c.entries.get(&l).is_some_and(|e| e.dirty);
        let mut first = lba;
        while first > 0 && lba - first + 1 < MAX_RUN_BLOCKS / 2 && dirty(self, first - 1) {
            first -= 1;
        }
        let mut end = lba + 1;
        while end - first < MAX_RUN_BLOCKS && dirty(self, end) {
            end += 1;
        }
        self.write_back_run(first, end)
    }

    fn write_back_run(&mut self, first: u64, end: u64) -> DeviceResult<()> {
        let bs = self.bs();
        let mut buf = crate::fanout::scratch((end - first) as usize * bs);
        for (i, l) in (first..end).enumerate() {
            if let Some(e) = self.entries.get(&l) {
                buf[i * bs..(i + 1) * bs].copy_from_slice(&e.data);
            }
        }
        let (_, status) = self.child_run(Request::write(0, first, end - first, buf));
        status?;
        for l in first..end {
            if let Some(e) = self.entries.get_mut(&l) {
                e.dirty = false;
            }
        }
        self.stats.written_back += end - first;
        Ok(())
    }

    /// Evicts least recently used blocks until one more fits, writing dirty ones back first.
    fn make_room(&mut self) -> DeviceResult<()> {
        while self.entries.len() >= self.capacity {
            let Some((_, &lba)) = self.lru.iter().next() else {
                return Ok(());
            };
            if self.entries.get(&lba).is_some_and(|e| e.dirty) {
                self.write_back_around(lba)?;
            }
            self.forget(lba);
            self.stats.evictions += 1;
        }
        Ok(())
    }

    /// Puts `data` in the cache as block `lba`.
    fn store(&mut self, lba: u64, data: &[u8], dirty: bool) -> DeviceResult<()> {
        if let Some(e) = self.entries.get_mut(&lba) {
            e.data.copy_from_slice(data);
            e.dirty |= dirty;
            self.touch(lba);
            return Ok(());
        }
        self.make_room()?;
        self.tick += 1;
        self.entries.insert(
            lba,
            Entry {
                data: data.into(),
                dirty,
                tick: self.tick,
            },
        );
        self.lru.insert(self.tick, lba);
        Ok(())
    }

    fn forget_range(&mut self, lba: u64, blocks: u64) {
        let keys: Vec<u64> = self
            .entries
            .range(lba..lba + blocks)
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            self.forget(k);
        }
    }

    fn read(&mut self, req: &mut Request) -> DeviceResult<()> {
        let bs = self.bs();
        let Some(mut out) = req.buf.take() else {
            return Err(DeviceError::BadBuffer {
                op: Opcode::Read,
                blocks: req.blocks,
                need: req.blocks * bs as u64,
                have: 0,
            });
        };
        let result = self.read_into(req.lba, req.blocks, &mut out);
        req.buf = Some(out);
        result
    }

    fn read_into(&mut self, lba: u64, blocks: u64, out: &mut IoBuf) -> DeviceResult<()> {
        let bs = self.bs();
        let mut i = 0;
        while i < blocks {
            let at = lba + i;
            if let Some(e) = self.entries.get(&at) {
                out[i as usize * bs..(i as usize + 1) * bs].copy_from_slice(&e.data);
                self.touch(at);
                self.stats.hits += 1;
                i += 1;
                continue;
            }
            let mut n = 1;
            while i + n < blocks && n < MAX_RUN_BLOCKS && !self.entries.contains_key(&(at + n)) {
                n += 1;
            }
            let buf = crate::fanout::scratch(n as usize * bs);
            let (buf, status) = self.child_run(Request::read(0, at, n, buf));
            status?;
            let Some(buf) = buf else {
                return Err(DeviceError::Offline {
                    reason: "cache child lost a buffer".into(),
                });
            };
            let dst = i as usize * bs;
            out[dst..dst + n as usize * bs].copy_from_slice(&buf[..n as usize * bs]);
            self.stats.misses += n;
            for k in 0..n as usize {
                self.store(at + k as u64, &buf[k * bs..(k + 1) * bs], false)?;
            }
            i += n;
        }
        Ok(())
    }

    fn write(&mut self, req: &mut Request) -> DeviceResult<()> {
        let bs = self.bs();
        let (lba, blocks) = (req.lba, req.blocks);
        if self.mode == CacheMode::WriteThrough {
            let (buf, status) = self.child_run(Request {
                tag: 0,
                op: Opcode::Write,
                lba,
                blocks,
                buf: req.buf.take(),
            });
            req.buf = buf;
            if status.is_err() {
                self.forget_range(lba, blocks);
                return status;
            }
        }
        let dirty = self.mode == CacheMode::WriteBack;
        let Some(data) = req.buf.take() else {
            self.forget_range(lba, blocks);
            return Ok(());
        };
        let mut result = Ok(());
        for k in 0..blocks as usize {
            if let Err(e) = self.store(lba + k as u64, &data[k * bs..(k + 1) * bs], dirty) {
                result = Err(e);
                break;
            }
        }
        req.buf = Some(data);
        result
    }

    /// Writes every dirty block back in LBA order, in runs of contiguous blocks.
    fn write_back_all(&mut self) -> DeviceResult<()> {
        let dirty: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.dirty)
            .map(|(&l, _)| l)
            .collect();
        let mut i = 0;
        while i < dirty.len() {
            let first = dirty[i];
            let mut end = first + 1;
            i += 1;
            while i < dirty.len() && dirty[i] == end && end - first < MAX_RUN_BLOCKS {
                end += 1;
                i += 1;
            }
            self.write_back_run(first, end)?;
        }
        Ok(())
    }

    fn execute(&mut self, req: &mut Request) -> DeviceResult<()> {
        match req.op {
            Opcode::Read => self.read(req),
            Opcode::Write => self.write(req),
            Opcode::WriteZeroes | Opcode::Discard => {
                self.forget_range(req.lba, req.blocks);
                let (_, status) = self.child_run(Request {
                    tag: 0,
                    op: req.op,
                    lba: req.lba,
                    blocks: req.blocks,
                    buf: None,
                });
                status
            }
            Opcode::Flush => {
                self.write_back_all()?;
                let (_, status) = self.child_run(Request::flush(0));
                status
            }
        }
    }
}

impl BlockDevice for Cache {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        let mode = match self.mode {
            CacheMode::WriteThrough => "wt",
            CacheMode::WriteBack => "wb",
        };
        format!(
            "cache({})?size={}&mode={mode}",
            self.child.describe(),
            self.capacity as u64 * u64::from(self.geo.block_size)
        )
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let mut queue = std::mem::take(&mut self.queue);
        let geo = self.geo;
        let result = queue.submit(&geo, req, |r| self.execute(r));
        self.queue = queue;
        result
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, _min_complete: usize) -> DeviceResult<usize> {
        Ok(self.queue.drain(out))
    }

    fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // Best effort: an error here has nowhere to go; callers who need to know flush first.
        if self.mode == CacheMode::WriteBack
            && self.entries.values().any(|e| e.dirty)
            && self.write_back_all().is_ok()
        {
            let _ = self.child.flush_all();
        }
    }
}

/// Opens `cache(CHILD)?size=SIZE&mode=wt|wb`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Cache, OpenError> {
    spec.check_options(CACHE_OPTIONS)?;
    let size = spec.size_option("size")?.unwrap_or(DEFAULT_CACHE_BYTES);
    let mode = match spec.option("mode") {
        None | Some("wt") | Some("write-through") => CacheMode::WriteThrough,
        Some("wb") | Some("write-back") => CacheMode::WriteBack,
        Some(other) => {
            return Err(OpenError::Invalid(format!(
                "{spec}: mode `{other}` is not a cache mode (use wt for write-through or wb for write-back)"
            )))
        }
    };
    let mut kids = crate::open_children(spec, children, 1, Some(1))?;
    Cache::new(kids.remove(0), size, mode).map_err(|e| crate::in_spec(spec, e))
}
