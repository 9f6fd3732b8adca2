//! `spill(LOCAL,REMOTE)?local=SIZE&chunk=SIZE` — a drive as large as REMOTE whose first written
//! chunks live on a smaller, faster LOCAL device; the rest stays on REMOTE.
//!
//! It owns the placement of chunks and the on-disk chunk map that records it.
//!
//! **Semantics.** The drive's capacity is REMOTE's. Its address space is cut into chunks (1 MiB
//! by default). Every chunk starts out on REMOTE, at its own offset. The first *write* into a
//! chunk that is not yet local places it in the next free slot of LOCAL, while free slots last:
//! the chunk's current contents are read from REMOTE, the new data is laid over them, the whole
//! chunk is written into the slot, and from then on every command on that chunk goes to LOCAL
//! only (REMOTE's copy is stale and never read again). Once LOCAL is full, later chunks stay on
//! REMOTE for good. Write-zeroes and discards never place a chunk; they go where the chunk lives.
//! A flush flushes both devices.
//!
//! **Layout of LOCAL** (only its first `local=SIZE` bytes are used; all of it by default):
//! block 0 is a header (magic `KURASPIL`, version, block size, chunk size, slot count, REMOTE's
//! size, and a checksum); the next blocks hold the chunk map, one little-endian `u64` per slot
//! (0 = free, else chunk index + 1); the slots follow, one chunk each.
//!
//! **Crash consistency.** A map entry must never be durable before the slot data it points to,
//! or a crash would leave a chunk mapped onto garbage. So placing a chunk writes the slot, flushes
//! LOCAL, and only then writes the map block (which the next flush makes durable). If the map
//! write is lost in a crash, the chunk reads from REMOTE again, which still holds everything that
//! was flushed before the placement; only unflushed writes can be lost, which a crash may do
//! anyway. Map blocks are rewritten whole from memory, and one entry never straddles a sector.
//!
//! **Opening.** A LOCAL whose block 0 is all zeroes is formatted (header and empty map written
//! and flushed); one with a valid header for the same geometry is reopened and its map checked
//! (entries in range, no chunk twice); anything else is refused rather than overwritten.
//!
//! **Limits.** Each command is executed inside `submit`, one child command at a time (queue
//! depth 1 on each child), so this layer trades throughput for simplicity; it is a capacity
//! layer. Children must share one block size; `chunk` must be a multiple of it.

use kura_engine::backend::common::CompletedQueue;
use kura_engine::open::ChildOpener;
use kura_engine::{
    BlockDevice, BlockingIo, DeviceError, DeviceResult, Geometry, Opcode, OpenError, Request, Spec,
};

/// Chunk size unless `chunk=` says otherwise.
pub const DEFAULT_CHUNK: u64 = 1 << 20;
const MAGIC: &[u8; 8] = b"KURASPIL";
const VERSION: u32 = 1;
/// Bytes of one map entry.
const ENTRY: u64 = 8;

/// Where a chunk lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    Remote,
    Local(u64),
}

/// Counts of what the drive has done since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Slots on LOCAL.
    pub slots: u64,
    /// Slots holding a chunk.
    pub slots_used: u64,
    /// Chunks placed on LOCAL since opening.
    pub placements: u64,
}

/// The drive; see the module docs.
pub struct Spill {
    local: Box<dyn BlockDevice>,
    remote: Box<dyn BlockDevice>,
    geo: Geometry,
    queue: CompletedQueue,
    /// Blocks per chunk.
    chunk_blocks: u64,
    /// First block of slot 0 on LOCAL.
    data_start: u64,
    /// Slot of each chunk, if it has one (`u64::MAX` = on REMOTE).
    slot_of: Vec<u64>,
    /// Chunk index + 1 per slot, exactly as on disk.
    map: Vec<u64>,
    next_free: u64,
    placements: u64,
}

/// The header fields that must match on reopen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    block_size: u32,
    chunk_bytes: u64,
    slots: u64,
    remote_bytes: u64,
}

impl Header {
    fn encode(&self, block: &mut [u8]) {
        block.fill(0);
        block[..8].copy_from_slice(MAGIC);
        block[8..12].copy_from_slice(&VERSION.to_le_bytes());
        block[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        block[16..24].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        block[24..32].copy_from_slice(&self.slots.to_le_bytes());
        block[32..40].copy_from_slice(&self.remote_bytes.to_le_bytes());
        let sum = checksum(&block[..40]);
        block[40..48].copy_from_slice(&sum.to_le_bytes());
    }

    /// `Ok(None)` for an all-zero block (a fresh LOCAL).
    fn decode(block: &[u8]) -> Result<Option<Header>, String> {
        if block.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let field = |r: std::ops::Range<usize>| -> u64 {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&block[r]);
            u64::from_le_bytes(b)
        };
        if &block[..8] != MAGIC {
            return Err(
                "LOCAL holds data that is not a spill header; refusing to overwrite it \
                 (zero its first block to format it)"
                    .into(),
            );
        }
        if field(40..48) != checksum(&block[..40]) {
            return Err("the spill header's checksum does not match (damaged header)".into());
        }
        let version = field(8..12);
        if version != u64::from(VERSION) {
            return Err(format!("spill header version {version} is not {VERSION}"));
        }
        Ok(Some(Header {
            block_size: field(12..16) as u32,
            chunk_bytes: field(16..24),
            slots: field(24..32),
            remote_bytes: field(32..40),
        }))
    }
}

/// FNV-1a, enough to tell a damaged header from a good one.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn invalid(msg: impl Into<String>) -> OpenError {
    OpenError::Invalid(msg.into())
}

fn device_err(what: &str, e: DeviceError) -> OpenError {
    invalid(format!("{what}: {e}"))
}

/// Slots that fit in `local_blocks` blocks after the header and map.
fn slots_for(local_blocks: u64, bs: u64, chunk_blocks: u64, chunks: u64) -> u64 {
    let per_map_block = bs / ENTRY;
    let mut n = local_blocks.saturating_sub(1) / (chunk_blocks + 1);
    while n > 0 && 1 + n.div_ceil(per_map_block) + n * chunk_blocks > local_blocks {
        n -= 1;
    }
    n.min(chunks)
}

impl Spill {
    /// A drive over `local` and `remote` using the first `local_bytes` of LOCAL (all of it when
    /// `None`), with `chunk_bytes` chunks. Formats a zeroed LOCAL, reopens a formatted one.
    pub fn new(
        mut local: Box<dyn BlockDevice>,
        remote: Box<dyn BlockDevice>,
        local_bytes: Option<u64>,
        chunk_bytes: u64,
    ) -> Result<Spill, OpenError> {
        let (lg, rg) = (local.geometry(), remote.geometry());
        if lg.block_size != rg.block_size {
            return Err(invalid(format!(
                "LOCAL ({}) has {}-byte blocks but REMOTE ({}) has {}-byte blocks",
                local.describe(),
                lg.block_size,
                remote.describe(),
                rg.block_size
            )));
        }
        let bs = u64::from(lg.block_size);
        if chunk_bytes == 0 || !chunk_bytes.is_multiple_of(bs) {
            return Err(invalid(format!(
                "chunk={chunk_bytes} is not a non-zero multiple of the {bs}-byte block size"
            )));
        }
        let local_cap = lg.capacity_bytes();
        let use_bytes = local_bytes.unwrap_or(local_cap);
        if use_bytes > local_cap {
            return Err(invalid(format!(
                "local={use_bytes} is larger than LOCAL ({}, {local_cap} bytes)",
                local.describe()
            )));
        }
        let chunk_blocks = chunk_bytes / bs;
        let chunks = rg.num_blocks.div_ceil(chunk_blocks);
        let slots = slots_for(use_bytes / bs, bs, chunk_blocks, chunks);
        if slots == 0 {
            return Err(invalid(format!(
                "LOCAL's {use_bytes} bytes hold no {chunk_bytes}-byte chunk after the header"
            )));
        }
        let map_blocks = slots.div_ceil(bs / ENTRY);
        let want = Header {
            block_size: lg.block_size,
            chunk_bytes,
            slots,
            remote_bytes: rg.capacity_bytes(),
        };

        let mut block0 = vec![0u8; bs as usize];
        local
            .read_blocks(0, &mut block0)
            .map_err(|e| device_err("reading the spill header", e))?;
        let mut map = vec![0u64; slots as usize];
        match Header::decode(&block0).map_err(invalid)? {
            None => {
                let zero = vec![0u8; (map_blocks * bs) as usize];
                local
                    .write_blocks(1, &zero)
                    .map_err(|e| device_err("writing the empty chunk map", e))?;
                want.encode(&mut block0);
                local
                    .write_blocks(0, &block0)
                    .and_then(|()| local.flush_all())
                    .map_err(|e| device_err("writing the spill header", e))?;
            }
            Some(found) if found != want => {
                return Err(invalid(format!(
                    "LOCAL was formatted for {found:?}, but these devices and options give \
                     {want:?}"
                )));
            }
            Some(_) => {
                let mut raw = vec![0u8; (map_blocks * bs) as usize];
                local
                    .read_blocks(1, &mut raw)
                    .map_err(|e| device_err("reading the chunk map", e))?;
                for (slot, e) in map.iter_mut().enumerate() {
                    let at = slot * ENTRY as usize;
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&raw[at..at + 8]);
                    *e = u64::from_le_bytes(b);
                }
            }
        }
        let mut slot_of = vec![u64::MAX; chunks as usize];
        for (slot, &e) in map.iter().enumerate() {
            if e == 0 {
                continue;
            }
            let chunk = e - 1;
            match slot_of.get_mut(chunk as usize) {
                Some(s) if *s == u64::MAX => *s = slot as u64,
                Some(_) => {
                    return Err(invalid(format!(
                        "damaged chunk map: chunk {chunk} is in two slots"
                    )))
                }
                None => {
                    return Err(invalid(format!(
                        "damaged chunk map: slot {slot} names chunk {chunk}, past the last \
                         ({chunks})"
                    )))
                }
            }
        }
        let geo = Geometry {
            block_size: lg.block_size,
            num_blocks: rg.num_blocks,
            max_transfer: lg.max_transfer.min(rg.max_transfer),
            queue_depth: lg.queue_depth.min(rg.queue_depth).max(1),
            buffer_alignment: lg.buffer_alignment.max(rg.buffer_alignment),
        };
        let mut drive = Spill {
            local,
            remote,
            geo,
            queue: CompletedQueue::default(),
            chunk_blocks,
            data_start: 1 + map_blocks,
            slot_of,
            map,
            next_free: 0,
            placements: 0,
        };
        drive.advance_free();
        Ok(drive)
    }

    /// Slots, slots in use, placements since opening.
    pub fn stats(&self) -> SpillStats {
        SpillStats {
            slots: self.map.len() as u64,
            slots_used: self.map.iter().filter(|&&e| e != 0).count() as u64,
            placements: self.placements,
        }
    }

    fn advance_free(&mut self) {
        while (self.next_free as usize) < self.map.len() && self.map[self.next_free as usize] != 0 {
            self.next_free += 1;
        }
    }

    fn home(&self, chunk: u64) -> Home {
        match self.slot_of.get(chunk as usize) {
            Some(&s) if s != u64::MAX => Home::Local(s),
            _ => Home::Remote,
        }
    }

    /// Blocks of chunk `chunk` that exist on the drive (the last chunk may be short).
    fn chunk_len(&self, chunk: u64) -> u64 {
        (self.geo.num_blocks - chunk * self.chunk_blocks).min(self.chunk_blocks)
    }

    /// Places `chunk` in the next free slot; `Ok(false)` when LOCAL is full.
    fn place(&mut self, chunk: u64) -> DeviceResult<bool> {
        if self.next_free as usize >= self.map.len() {
            return Ok(false);
        }
        let slot = self.next_free;
        let bs = u64::from(self.geo.block_size);
        let len = self.chunk_len(chunk);
        let mut data = vec![0u8; (len * bs) as usize];
        self.remote
            .read_blocks(chunk * self.chunk_blocks, &mut data)?;
        self.local
            .write_blocks(self.data_start + slot * self.chunk_blocks, &data)?;
        // The slot must be durable before the map entry that points at it can be.
        self.local.flush_all()?;
        self.map[slot as usize] = chunk + 1;
        let per_block = bs / ENTRY;
        let map_block = slot / per_block;
        let first = (map_block * per_block) as usize;
        let last = (first + per_block as usize).min(self.map.len());
        let mut raw = vec![0u8; bs as usize];
        for (i, e) in self.map[first..last].iter().enumerate() {
            raw[i * 8..i * 8 + 8].copy_from_slice(&e.to_le_bytes());
        }
        if let Err(e) = self.local.write_blocks(1 + map_block, &raw) {
            self.map[slot as usize] = 0;
            return Err(e);
        }
        self.slot_of[chunk as usize] = slot;
        self.placements += 1;
        self.advance_free();
        Ok(true)
    }

    /// Runs one admitted command against the children, a chunk-homed run at a time.
    fn execute(&mut self, req: &mut Request) -> DeviceResult<()> {
        if req.op == Opcode::Flush {
            let l = self.local.flush_all();
            let r = self.remote.flush_all();
            return l.and(r);
        }
        let bs = u64::from(self.geo.block_size);
        let (start, end) = (req.lba, req.lba + req.blocks);
        let mut at = start;
        while at < end {
            let chunk = at / self.chunk_blocks;
            let chunk_end = ((chunk + 1) * self.chunk_blocks).min(end);
            let mut home = self.home(chunk);
            if home == Home::Remote && req.op == Opcode::Write && self.place(chunk)? {
                home = self.home(chunk);
            }
            // Extend the run over following chunks that are contiguous on the same device.
            let mut run_end = chunk_end;
            while run_end < end {
                let next = run_end / self.chunk_blocks;
                let contiguous = match (home, self.home(next)) {
                    (Home::Remote, Home::Remote) => {
                        req.op != Opcode::Write || self.next_free as usize >= self.map.len()
                    }
                    (Home::Local(a), Home::Local(b)) => b == a + (next - chunk),
                    _ => false,
                };
                if !contiguous {
                    break;
                }
                run_end = ((next + 1) * self.chunk_blocks).min(end);
            }
            let (dev, lba) = match home {
                Home::Remote => (&mut self.remote, at),
                Home::Local(slot) => (
                    &mut self.local,
                    self.data_start + slot * self.chunk_blocks + (at - chunk * self.chunk_blocks),
                ),
            };
            let blocks = run_end - at;
            let range = ((at - start) * bs) as usize..((run_end - start) * bs) as usize;
            let (op, all) = (req.op, req.blocks);
            let no_buffer = || DeviceError::BadBuffer {
                op,
                blocks: all,
                need: all * bs,
                have: 0,
            };
            match op {
                Opcode::Read => {
                    let buf = req.buf.as_mut().ok_or_else(no_buffer)?;
                    dev.read_blocks(lba, &mut buf[range])?;
                }
                Opcode::Write => {
                    let buf = req.buf.as_ref().ok_or_else(no_buffer)?;
                    dev.write_blocks(lba, &buf[range])?;
                }
                Opcode::WriteZeroes => dev.zero_blocks(lba, blocks)?,
                Opcode::Discard => dev.discard_blocks(lba, blocks)?,
                Opcode::Flush => {}
            }
            at = run_end;
        }
        Ok(())
    }
}

impl BlockDevice for Spill {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        let bs = u64::from(self.geo.block_size);
        format!(
            "spill({},{})?local={}&chunk={}",
            self.local.describe(),
            self.remote.describe(),
            (self.data_start + self.map.len() as u64 * self.chunk_blocks) * bs,
            self.chunk_blocks * bs
        )
    }

    /// From the chunk map: each run of chunks on REMOTE is REMOTE's answer for it, each placed
    /// chunk LOCAL's answer for its slot (a device that cannot tell counts as data).
    fn allocation(
        &mut self,
        lba: u64,
        blocks: u64,
    ) -> DeviceResult<Option<Vec<kura_engine::Extent>>> {
        kura_engine::device::check_range(&self.geo, lba, blocks)?;
        let mut out = Vec::new();
        let end = lba + blocks;
        let mut at = lba;
        while at < end {
            let chunk = at / self.chunk_blocks;
            let home = self.home(chunk);
            // Consecutive chunks on REMOTE are one question to it.
            let mut run_end = ((chunk + 1) * self.chunk_blocks).min(end);
            while home == Home::Remote
                && run_end < end
                && self.home(run_end / self.chunk_blocks) == Home::Remote
            {
                run_end = ((run_end / self.chunk_blocks + 1) * self.chunk_blocks).min(end);
            }
            let n = run_end - at;
            let answer = match home {
                Home::Remote => self.remote.allocation(at, n)?,
                Home::Local(slot) => {
                    let local = self.data_start
                        + slot * self.chunk_blocks
                        + (at - chunk * self.chunk_blocks);
                    self.local.allocation(local, n)?
                }
            };
            kura_engine::device::push_child_extents(&mut out, answer, n);
            at = run_end;
        }
        Ok(Some(out))
    }

    /// The drive, then LOCAL, then REMOTE.
    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let s = Spill::stats(self);
        out.push(
            kura_engine::DriveStats::new("spill")
                .with("slots", s.slots)
                .with("slots_used", s.slots_used)
                .with("placements", s.placements),
        );
        kura_engine::device::child_stats(&*self.local, out);
        kura_engine::device::child_stats(&*self.remote, out);
    }

    kura_engine::completed_queue_methods!(queue, execute);
}

/// Opens `spill(LOCAL,REMOTE)?local=SIZE&chunk=SIZE`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Spill, OpenError> {
    spec.check_options(&["local", "chunk"])?;
    let local_bytes = spec.size_option("local")?;
    let chunk = spec.size_option("chunk")?.unwrap_or(DEFAULT_CHUNK);
    let mut kids = crate::open_children(spec, children, 2, Some(2))?;
    let remote = kids.pop().ok_or_else(|| invalid("spill: no REMOTE"))?;
    let local = kids.pop().ok_or_else(|| invalid("spill: no LOCAL"))?;
    Spill::new(local, remote, local_bytes, chunk).map_err(|e| crate::in_spec(spec, e))
}
