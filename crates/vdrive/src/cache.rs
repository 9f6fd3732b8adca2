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
//!
//! **Streaming reads** (`stream=SIZE`, 256 KiB by default, 0 turns it off): a read of at least
//! that size of which the cache holds no block goes straight to the child into the caller's
//! buffer and is not kept. A sequential scan would otherwise pay a copy and an insertion per
//! block only to push the hot set out (DeLiBA's cache is for the hot set of small requests);
//! with no block of the range cached there is nothing dirty to merge, so the child's data is
//! the answer.
//!
//! The child is driven asynchronously at the caller's queue depth: read misses (one child command
//! per run of missing blocks), write-through writes, write-zeroes, discards and flushes are all
//! in flight on the child together, and a caller request completes when its last child command
//! does. Write-back evictions and the write-back at a flush are the exceptions: they run on the
//! child one at a time, so a failed write-back keeps its blocks dirty and fails the request that
//! needed the room. A block range that had a mutation in flight on the child while a command on
//! it was out is never filled into the cache from that command, because the child may have
//! carried the two out in either order: the cache only ever holds what the child holds.

use kura_engine::backend::common::hand_over;
use kura_engine::open::ChildOpener;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, BlockingIo, Completion, DeviceError, DeviceResult, Geometry, IoBuf, Opcode,
    OpenError, Rejected, Request, Spec,
};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Options of `cache(...)`.
pub const CACHE_OPTIONS: &[&str] = &["size", "mode", "stream"];
/// Cache size when none is given (DeLiBA's default).
pub const DEFAULT_CACHE_BYTES: u64 = 32 << 20;
/// Reads at least this large with no cached block pass by the cache (`stream=`).
pub const DEFAULT_STREAM_BYTES: u64 = 256 << 10;
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
    /// Blocks of streaming reads sent past the cache (neither hits nor kept).
    pub streamed: u64,
}

struct Entry {
    data: Box<[u8]>,
    dirty: bool,
    tick: u64,
}

/// A caller request waiting for its child commands.
struct Waiting {
    req: Request,
    /// Child commands still out for it.
    left: usize,
    status: DeviceResult<()>,
}

/// What a child command in flight is for.
enum Job {
    /// Missing blocks read for caller request `owner`, landing `at` blocks into its buffer.
    Fill {
        owner: u64,
        lba: u64,
        blocks: u64,
        at: u64,
        tainted: bool,
    },
    /// A caller's write in write-through mode, carrying the caller's buffer.
    WriteThrough {
        owner: u64,
        lba: u64,
        blocks: u64,
        tainted: bool,
    },
    /// A write-zeroes, discard or flush passed through.
    Pass {
        owner: u64,
        op: Opcode,
        lba: u64,
        blocks: u64,
    },
    /// A caller's streaming read sent past the cache, carrying the caller's buffer.
    Stream { owner: u64 },
    /// A command of the cache's own (a write-back), waited for where it was issued.
    Own,
}

impl Job {
    fn covers(&self, first: u64, n: u64) -> bool {
        let (lba, blocks) = match *self {
            Job::Fill { lba, blocks, .. }
            | Job::WriteThrough { lba, blocks, .. }
            | Job::Pass { lba, blocks, .. } => (lba, blocks),
            Job::Stream { .. } | Job::Own => return false,
        };
        lba < first + n && first < lba + blocks
    }

    fn is_mutation(&self) -> bool {
        match self {
            Job::WriteThrough { .. } => true,
            Job::Pass { op, .. } => op.is_mutation(),
            Job::Fill { .. } | Job::Stream { .. } | Job::Own => false,
        }
    }
}

/// The block cache.
pub struct Cache {
    child: Box<dyn BlockDevice>,
    geo: Geometry,
    mode: CacheMode,
    capacity: usize,
    /// Reads of at least this many blocks with none cached go past the cache; 0: never.
    stream_blocks: u64,
    entries: BTreeMap<u64, Entry>,
    /// Use order: tick of last use to block.
    lru: BTreeMap<u64, u64>,
    tick: u64,
    /// Child commands in flight by child tag.
    jobs: HashMap<u64, Job>,
    next_tag: u64,
    /// Completions of the cache's own commands, until their issuer picks them up.
    own_done: HashMap<u64, (Option<IoBuf>, DeviceResult<()>)>,
    waiting: HashMap<u64, Waiting>,
    next_owner: u64,
    ready: VecDeque<Completion>,
    /// Caller requests accepted and not yet handed back by `poll`.
    accepted: usize,
    poison: FlushPoison,
    stats: CacheStats,
}

impl Cache {
    /// A cache of `size` bytes (at least one block of the child) in front of `child`, which must
    /// be idle and is driven by the cache from now on.
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
            stream_blocks: DEFAULT_STREAM_BYTES.div_ceil(bs),
            child,
            geo,
            mode,
            entries: BTreeMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            jobs: HashMap::new(),
            next_tag: 1,
            own_done: HashMap::new(),
            waiting: HashMap::new(),
            next_owner: 1,
            ready: VecDeque::new(),
            accepted: 0,
            poison: FlushPoison::default(),
            stats: CacheStats::default(),
        })
    }

    /// Sends reads of at least `bytes` of which no block is cached straight to the child
    /// without keeping them (0: every read goes through the cache).
    pub fn with_stream_bytes(mut self, bytes: u64) -> Self {
        self.stream_blocks = bytes.div_ceil(u64::from(self.geo.block_size));
        self
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

    fn tag(&mut self) -> u64 {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        tag
    }

    /// Polls the child once (waiting for one completion when `wait`) and handles what came back.
    fn pump(&mut self, wait: bool) -> DeviceResult<()> {
        let mut got = Vec::new();
        self.child.poll(&mut got, usize::from(wait))?;
        for c in got {
            self.on_child(c);
        }
        Ok(())
    }

    /// Submits `req` (already registered in `jobs`) to the child, waiting for room while the
    /// child's queue is full. On failure the request's buffer comes back with the error.
    fn child_submit(&mut self, req: Request) -> Result<(), (Option<IoBuf>, DeviceError)> {
        let mut req = req;
        loop {
            match self.child.submit(req) {
                Ok(()) => return Ok(()),
                Err(r)
                    if matches!(r.error, DeviceError::QueueFull { .. })
                        && self.child.in_flight() > 0 =>
                {
                    req = r.request;
                    let room = self.child.ring_doorbell().and_then(|()| self.pump(true));
                    if let Err(e) = room {
                        return Err((req.buf.take(), e));
                    }
                }
                Err(r) => return Err((r.request.buf, r.error)),
            }
        }
    }

    /// Sends `req` for `job`; a refusal finishes the job's share of its caller request, handing a
    /// write-through caller its buffer back.
    fn send(&mut self, job: Job, mut req: Request) {
        let tag = self.tag();
        req.tag = tag;
        let owner = match job {
            Job::Fill { owner, .. }
            | Job::WriteThrough { owner, .. }
            | Job::Pass { owner, .. }
            | Job::Stream { owner } => Some(owner),
            Job::Own => None,
        };
        self.jobs.insert(tag, job);
        if let Err((buf, e)) = self.child_submit(req) {
            self.jobs.remove(&tag);
            if let Some(owner) = owner {
                if let Some(w) = self.waiting.get_mut(&owner) {
                    if w.req.buf.is_none() {
                        w.req.buf = buf;
                    }
                }
                self.finish_part(owner, Err(e));
            }
        }
    }

    /// Runs one command of the cache's own on the child and waits for it, handling every other
    /// completion that arrives meanwhile.
    fn child_run(&mut self, req: Request) -> (Option<IoBuf>, DeviceResult<()>) {
        let tag = self.tag();
        let mut req = req;
        req.tag = tag;
        self.jobs.insert(tag, Job::Own);
        if let Err((buf, e)) = self.child_submit(req) {
            self.jobs.remove(&tag);
            return (buf, Err(e));
        }
        if let Err(e) = self.child.ring_doorbell() {
            return (None, Err(e));
        }
        loop {
            if let Some(done) = self.own_done.remove(&tag) {
                return done;
            }
            if let Err(e) = self.pump(true) {
                return (None, Err(e));
            }
        }
    }

    /// A child command came back: finish its share of the caller request it served.
    fn on_child(&mut self, c: Completion) {
        let bs = self.bs();
        let Some(job) = self.jobs.remove(&c.tag) else {
            return;
        };
        match job {
            Job::Own => {
                self.own_done.insert(c.tag, (c.buf, c.status));
            }
            Job::Pass { owner, .. } => self.finish_part(owner, c.status),
            Job::Stream { owner } => {
                if let Some(w) = self.waiting.get_mut(&owner) {
                    w.req.buf = c.buf;
                }
                self.finish_part(owner, c.status);
            }
            Job::WriteThrough {
                owner,
                lba,
                blocks,
                tainted,
            } => {
                match (&c.status, &c.buf) {
                    (Ok(()), Some(data)) if !tainted => {
                        for k in 0..blocks as usize {
                            // Write-through never holds dirty blocks, so making room cannot fail.
                            let _ = self.store(lba + k as u64, &data[k * bs..(k + 1) * bs], false);
                        }
                    }
                    (Ok(()), _) => {}
                    (Err(_), _) => self.forget_range(lba, blocks),
                }
                if let Some(w) = self.waiting.get_mut(&owner) {
                    w.req.buf = c.buf;
                }
                self.finish_part(owner, c.status);
            }
            Job::Fill {
                owner,
                lba,
                blocks,
                at,
                tainted,
            } => {
                let len = blocks as usize * bs;
                let data = match (c.status, c.buf) {
                    (Ok(()), Some(data)) => data,
                    (Ok(()), None) => {
                        let lost = DeviceError::Offline {
                            reason: "cache child lost a read buffer".into(),
                        };
                        return self.finish_part(owner, Err(lost));
                    }
                    (Err(e), _) => return self.finish_part(owner, Err(e)),
                };
                if let Some(out) = self
                    .waiting
                    .get_mut(&owner)
                    .and_then(|w| w.req.buf.as_mut())
                {
                    let dst = at as usize * bs;
                    out[dst..dst + len].copy_from_slice(&data[..len]);
                }
                self.stats.misses += blocks;
                self.finish_part(owner, Ok(()));
                if !tainted {
                    for k in 0..blocks {
                        if self.entries.contains_key(&(lba + k)) {
                            continue;
                        }
                        let at = k as usize * bs;
                        // A write-back that fails while making room only costs this fill.
                        if self.store(lba + k, &data[at..at + bs], false).is_err() {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Parks caller request `req` until `children` child commands sent for it have completed.
    fn wait_for(&mut self, owner: u64, req: Request, children: usize) {
        self.waiting.insert(
            owner,
            Waiting {
                req,
                left: children,
                status: Ok(()),
            },
        );
    }

    fn finish_part(&mut self, owner: u64, status: DeviceResult<()>) {
        let Some(w) = self.waiting.get_mut(&owner) else {
            return;
        };
        if w.status.is_ok() {
            w.status = status;
        }
        w.left = w.left.saturating_sub(1);
        if w.left == 0 {
            if let Some(w) = self.waiting.remove(&owner) {
                self.complete(w.req, w.status);
            }
        }
    }

    fn complete(&mut self, req: Request, status: DeviceResult<()>) {
        self.poison.observe(req.op, &status);
        self.ready.push_back(Completion::of(req, status));
    }

    /// Whether a mutation covering any of these blocks is in flight on the child.
    fn mutation_in_flight(&self, lba: u64, blocks: u64) -> bool {
        self.jobs
            .values()
            .any(|j| j.is_mutation() && j.covers(lba, blocks))
    }

    /// Keeps every command in flight over these blocks from filling the cache when it returns.
    fn taint(&mut self, first: u64, n: u64) {
        for job in self.jobs.values_mut() {
            let covered = job.covers(first, n);
            if let Job::Fill { tainted, .. } | Job::WriteThrough { tainted, .. } = job {
                *tainted |= covered;
            }
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

    /// Serves what the cache holds and sends one child read per run of missing blocks.
    fn start_read(&mut self, owner: u64, mut req: Request) {
        let bs = self.bs();
        let (lba, blocks) = (req.lba, req.blocks);
        if self.stream_blocks > 0
            && blocks >= self.stream_blocks
            && self.entries.range(lba..lba + blocks).next().is_none()
        {
            self.stats.streamed += blocks;
            let buf = req.buf.take();
            self.wait_for(owner, req, 1);
            return self.send(
                Job::Stream { owner },
                crate::child_request(Opcode::Read, lba, blocks, buf),
            );
        }
        let mut misses = Vec::new();
        if let Some(out) = req.buf.as_mut() {
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
                while i + n < blocks && n < MAX_RUN_BLOCKS && !self.entries.contains_key(&(at + n))
                {
                    n += 1;
                }
                misses.push((i, n));
                i += n;
            }
        }
        if misses.is_empty() {
            return self.complete(req, Ok(()));
        }
        self.wait_for(owner, req, misses.len());
        for (at, n) in misses {
            let tainted = self.mutation_in_flight(lba + at, n);
            let job = Job::Fill {
                owner,
                lba: lba + at,
                blocks: n,
                at,
                tainted,
            };
            let buf = crate::fanout::scratch(n as usize * bs);
            self.send(job, Request::read(0, lba + at, n, buf));
        }
    }

    fn start_write(&mut self, owner: u64, mut req: Request) {
        let bs = self.bs();
        let (lba, blocks) = (req.lba, req.blocks);
        self.taint(lba, blocks);
        if self.mode == CacheMode::WriteBack {
            let mut result = Ok(());
            if let Some(data) = req.buf.take() {
                for k in 0..blocks as usize {
                    if let Err(e) = self.store(lba + k as u64, &data[k * bs..(k + 1) * bs], true) {
                        result = Err(e);
                        break;
                    }
                }
                req.buf = Some(data);
            }
            return self.complete(req, result);
        }
        let tainted = self.mutation_in_flight(lba, blocks);
        self.forget_range(lba, blocks);
        let buf = req.buf.take();
        self.wait_for(owner, req, 1);
        let job = Job::WriteThrough {
            owner,
            lba,
            blocks,
            tainted,
        };
        self.send(job, crate::child_request(Opcode::Write, lba, blocks, buf));
    }

    fn start_pass(&mut self, owner: u64, req: Request) {
        let (op, lba, blocks) = (req.op, req.lba, req.blocks);
        if op == Opcode::Flush && self.mode == CacheMode::WriteBack {
            if let Err(e) = self.write_back_all() {
                return self.complete(req, Err(e));
            }
        }
        if op != Opcode::Flush {
            self.taint(lba, blocks);
            self.forget_range(lba, blocks);
        }
        self.wait_for(owner, req, 1);
        let job = Job::Pass {
            owner,
            op,
            lba,
            blocks,
        };
        self.send(job, crate::child_request(op, lba, blocks, None));
    }

    /// Writes every dirty block back in LBA order, in runs of contiguous blocks. Each run is found
    /// afresh, because completions handled while a run is out may evict (and write back) blocks.
    fn write_back_all(&mut self) -> DeviceResult<()> {
        let mut from = 0;
        loop {
            let Some(first) = self
                .entries
                .range(from..)
                .find(|(_, e)| e.dirty)
                .map(|(&l, _)| l)
            else {
                return Ok(());
            };
            let mut end = first + 1;
            while end - first < MAX_RUN_BLOCKS && self.entries.get(&end).is_some_and(|e| e.dirty) {
                end += 1;
            }
            self.write_back_run(first, end)?;
            from = end;
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
        let bs = u64::from(self.geo.block_size);
        let stream = if self.stream_blocks == DEFAULT_STREAM_BYTES.div_ceil(bs) {
            String::new()
        } else {
            format!("&stream={}", self.stream_blocks * bs)
        };
        format!(
            "cache({})?size={}&mode={mode}{stream}",
            self.child.describe(),
            self.capacity as u64 * bs
        )
    }

    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = self.stats;
        out.push(
            kura_engine::DriveStats::new("cache")
                .with("hits", s.hits)
                .with("misses", s.misses)
                .with("evictions", s.evictions)
                .with("written_back", s.written_back)
                .with("streamed", s.streamed)
                .with("cached_blocks", self.cached_blocks() as u64)
                .with("dirty_blocks", self.dirty_blocks() as u64),
        );
        kura_engine::device::child_stats(&*self.child, out);
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.in_flight())?;
        self.accepted += 1;
        if let Err(e) = self.poison.check(req.op) {
            self.complete(req, Err(e));
            return Ok(());
        }
        let owner = self.next_owner;
        self.next_owner = self.next_owner.wrapping_add(1);
        match req.op {
            Opcode::Read => self.start_read(owner, req),
            Opcode::Write => self.start_write(owner, req),
            Opcode::Flush | Opcode::WriteZeroes | Opcode::Discard => self.start_pass(owner, req),
        }
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        crate::ring_if_busy(self.child.as_mut())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let target = min_complete.min(self.in_flight());
        let mut n = 0;
        loop {
            if self.ready.is_empty() && !self.jobs.is_empty() {
                self.pump(n < target)?;
            }
            n += hand_over(self.ready.drain(..), out, &mut self.accepted);
            if n >= target || self.jobs.is_empty() {
                return Ok(n);
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.accepted
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        // Best effort: an error here has nowhere to go; callers who need to know flush first.
        while !self.jobs.is_empty() {
            if self.pump(true).is_err() {
                return;
            }
        }
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
    let stream = spec.size_option("stream")?.unwrap_or(DEFAULT_STREAM_BYTES);
    let mut kids = crate::open_children(spec, children, 1, Some(1))?;
    Cache::new(kids.remove(0), size, mode)
        .map(|c| c.with_stream_bytes(stream))
        .map_err(|e| crate::in_spec(spec, e))
}
