//! A raw-device ingest target (`docs/ingest-protocol.md` §5–§8): format, open with recovery,
//! append batches of records durably, read records back.
//!
//! A batch is stored in the documented order: every record's bytes (commands of at most the
//! device's `max_transfer`, up to `qd` in flight), a flush, the index units holding the batch's
//! entries, a flush. Only after [`Store::commit`] returns may the caller acknowledge. Opening
//! for writing bumps the superblock generation first, so entries a crash left beyond the
//! recovered prefix can never join the index later.

use crate::layout::{
    data_start_for, Entry, LayoutError, Superblock, ENTRIES_PER_UNIT, ENTRY_LEN, INDEX_START,
    NO_LABEL, UNIT,
};
use kura_engine::blocking::BlockingIo;
use kura_engine::buffer::POOL_ALIGN;
use kura_engine::crc32c::crc32c;
use kura_engine::{BlockDevice, BufferPool, Completion, DeviceError, IoBuf, Request};

/// Index entries read per command during recovery (1 MiB of index).
const RECOVERY_CHUNK_ENTRIES: u64 = 16 * 1024;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("device block size {0} does not divide the 4096-byte unit")]
    BlockSize(u32),
    #[error("device of {capacity} bytes is too small for an index of {slots} entries")]
    TooSmall { capacity: u64, slots: u64 },
    #[error("device full: {0}")]
    Full(String),
    #[error("damaged index: {0}")]
    Damaged(String),
    #[error("no record with id {0}")]
    NoSuchRecord(u64),
    #[error("record {id} fails its CRC (stored {stored:#010x}, read {read:#010x})")]
    RecordCrc { id: u64, stored: u32, read: u32 },
    #[error("the target is open read-only")]
    ReadOnly,
    #[error("record of {len} bytes given {chunks} bytes of chunks")]
    ChunkSize { len: u64, chunks: u64 },
}

/// Options for [`Store::format`].
#[derive(Debug, Clone, Copy, Default)]
pub struct FormatOptions {
    /// Index entries; default one per 4096-byte unit of the data region's share (capacity/4160).
    pub index_slots: Option<u64>,
    /// Identifies this format in both superblocks; random when `None`.
    pub format_id: Option<u64>,
}

/// A record to store: its bytes as chunks (each a whole number of 4096-byte units except the
/// last, in pool buffers so they go to the device as they are) and its index fields.
#[derive(Debug)]
pub struct NewRecord {
    pub chunks: Vec<IoBuf>,
    /// Bytes stored (the chunks' payload adds up to this).
    pub stored_len: u64,
    /// The record's size as sent.
    pub orig_len: u64,
    pub stage: u8,
    pub label: u8,
    pub seq: u64,
}

impl NewRecord {
    /// A record copied from `data` into pool buffers of at most `chunk` bytes (a multiple of
    /// 4096), the tail padded with zeroes to a unit.
    pub fn copied(data: &[u8], chunk: usize, seq: u64) -> NewRecord {
        let chunk = chunk.max(POOL_ALIGN) / POOL_ALIGN * POOL_ALIGN;
        let chunks = data
            .chunks(chunk)
            .map(|piece| {
                let len = piece.len().div_ceil(POOL_ALIGN) * POOL_ALIGN;
                let mut buf = unit_buffer(len);
                buf[..piece.len()].copy_from_slice(piece);
                buf[piece.len()..].fill(0);
                buf
            })
            .collect();
        NewRecord {
            chunks,
            stored_len: data.len() as u64,
            orig_len: data.len() as u64,
            stage: 0,
            label: NO_LABEL,
            seq,
        }
    }
}

/// A record whose bytes the caller wrote at an offset from [`Store::reserve`], with the fields
/// of its index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub offset: u64,
    pub stored_len: u64,
    pub orig_len: u64,
    /// CRC32C of the stored bytes.
    pub crc: u32,
    pub stage: u8,
    pub label: u8,
    pub seq: u64,
}

/// The index write of a batch being committed ([`Store::prepare_index`]).
#[derive(Debug)]
pub struct PendingIndex {
    /// The batch's entries, ids assigned.
    pub entries: Vec<Entry>,
    /// Where the index units go, in device blocks.
    pub lba: u64,
    pub blocks: u64,
    buf: Option<IoBuf>,
}

impl PendingIndex {
    /// The index units' bytes, to write at `lba` (once; an empty buffer after).
    pub fn take_buf(&mut self) -> IoBuf {
        self.buf
            .take()
            .unwrap_or_else(|| IoBuf::heap(0, POOL_ALIGN))
    }
}

/// A buffer of `len` bytes from the global pool, or the heap (page-aligned) when it is full.
pub fn unit_buffer(len: usize) -> IoBuf {
    BufferPool::global()
        .alloc(len)
        .unwrap_or_else(|_| IoBuf::heap(len, POOL_ALIGN))
}

/// An opened raw-device target.
pub struct Store {
    dev: Box<dyn BlockDevice>,
    sb: Superblock,
    entries: Vec<Entry>,
    /// Where the next record's bytes go.
    next_offset: u64,
    writable: bool,
    qd: usize,
    /// Index slots promised to reservations not yet committed or abandoned.
    reserved: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("device", &self.dev.describe())
            .field("superblock", &self.sb)
            .field("records", &self.entries.len())
            .field("next_offset", &self.next_offset)
            .finish()
    }
}

impl Store {
    /// Formats `dev` (§5.1: zeroed index, superblocks A and B, flush), then opens it for writing.
    pub fn format(mut dev: Box<dyn BlockDevice>, opts: FormatOptions) -> Result<Store, StoreError> {
        let geo = dev.geometry();
        check_block_size(geo.block_size)?;
        let capacity = geo.capacity_bytes() / UNIT * UNIT;
        let slots = opts
            .index_slots
            .unwrap_or((capacity / (UNIT + ENTRY_LEN as u64)).max(ENTRIES_PER_UNIT));
        let data_start = data_start_for(slots);
        if slots == 0 || data_start + UNIT > capacity {
            return Err(StoreError::TooSmall { capacity, slots });
        }
        let format_id = opts.format_id.unwrap_or_else(rand::random);
        let bs = u64::from(geo.block_size);
        dev.zero_blocks(INDEX_START / bs, (data_start - INDEX_START) / bs)?;
        let sb = Superblock {
            capacity,
            index_slots: slots,
            data_start,
            generation: 1,
            format_id,
        };
        dev.write_blocks(0, &sb.encode())?;
        let b = Superblock {
            generation: 0,
            ..sb
        };
        dev.write_blocks(UNIT / bs, &b.encode())?;
        dev.flush_all()?;
        Store::open(dev)
    }

    /// Opens a target for writing: recovery (§7), then the next generation written to the
    /// older superblock copy and flushed before anything else.
    pub fn open(dev: Box<dyn BlockDevice>) -> Result<Store, StoreError> {
        let mut store = Store::recover(dev)?;
        let bs = u64::from(store.dev.geometry().block_size);
        let mut a = vec![0u8; UNIT as usize];
        store.dev.read_blocks(0, &mut a)?;
        let a_is_current =
            Superblock::decode(&a).is_ok_and(|x| x.generation == store.sb.generation);
        let next = Superblock {
            generation: store.sb.generation + 1,
            ..store.sb
        };
        let other = if a_is_current { UNIT } else { 0 };
        store.dev.write_blocks(other / bs, &next.encode())?;
        store.dev.flush_all()?;
        store.sb = next;
        store.writable = true;
        Ok(store)
    }

    /// Opens a target to read: recovery in memory, nothing written.
    pub fn open_read_only(dev: Box<dyn BlockDevice>) -> Result<Store, StoreError> {
        Store::recover(dev)
    }

    fn recover(mut dev: Box<dyn BlockDevice>) -> Result<Store, StoreError> {
        let geo = dev.geometry();
        check_block_size(geo.block_size)?;
        let bs = u64::from(geo.block_size);
        let mut two = vec![0u8; 2 * UNIT as usize];
        dev.read_blocks(0, &mut two)?;
        let sb = Superblock::pick(&two[..UNIT as usize], &two[UNIT as usize..])?;
        let capacity = sb.capacity.min(geo.capacity_bytes() / UNIT * UNIT);
        if sb.data_start >= capacity {
            return Err(StoreError::Damaged(format!(
                "data region starts at {} but the device holds {} bytes",
                sb.data_start,
                geo.capacity_bytes()
            )));
        }
        let mut entries: Vec<Entry> = Vec::new();
        let mut slot = 0u64;
        'scan: while slot < sb.index_slots {
            let n = RECOVERY_CHUNK_ENTRIES.min(sb.index_slots - slot);
            let bytes = (n * ENTRY_LEN as u64).div_ceil(bs) * bs;
            let mut buf = vec![0u8; bytes as usize];
            dev.read_blocks((INDEX_START + slot * ENTRY_LEN as u64) / bs, &mut buf)?;
            for raw in buf.chunks_exact(ENTRY_LEN).take(n as usize) {
                let prev_gen = entries.last().map_or(0, |e| e.generation);
                match Entry::decode(raw) {
                    Some(e)
                        if e.id == slot
                            && e.generation >= prev_gen.max(1)
                            && e.generation <= sb.generation
                            && placed(&e, sb.data_start, capacity) =>
                    {
                        entries.push(e);
                        slot += 1;
                    }
                    _ => break 'scan,
                }
            }
        }
        // Extents of valid entries were allocated disjointly; an overlap means the image was
        // damaged or forged, and reading it as records would hand out wrong bytes.
        let mut extents: Vec<(u64, u64, u64)> =
            entries.iter().map(|e| (e.offset, e.end(), e.id)).collect();
        extents.sort_unstable();
        for w in extents.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(StoreError::Damaged(format!(
                    "records {} and {} overlap",
                    w[0].2, w[1].2
                )));
            }
        }
        let next_offset = extents.last().map_or(sb.data_start, |x| x.1);
        Ok(Store {
            dev,
            sb,
            entries,
            next_offset,
            writable: false,
            qd: 64,
            reserved: 0,
        })
    }

    /// Commands kept in flight while writing record bytes (default 64).
    pub fn set_queue_depth(&mut self, qd: usize) {
        self.qd = qd.max(1);
    }

    /// The current superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Every record in the index, in id order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The index entry of record `id`.
    pub fn entry(&self, id: u64) -> Result<&Entry, StoreError> {
        self.entries
            .get(usize::try_from(id).unwrap_or(usize::MAX))
            .ok_or(StoreError::NoSuchRecord(id))
    }

    /// The device's block size.
    pub fn block_size(&self) -> u32 {
        self.dev.geometry().block_size
    }

    /// Bytes of the data region not yet allocated.
    pub fn free_bytes(&self) -> u64 {
        self.sb.capacity.saturating_sub(self.next_offset)
    }

    /// The device, for callers that drive it between batches (it must be idle at each call).
    pub fn device_mut(&mut self) -> &mut dyn BlockDevice {
        &mut *self.dev
    }

    /// Gives the device back.
    pub fn into_device(self) -> Box<dyn BlockDevice> {
        self.dev
    }

    /// Reads record `id`'s stored bytes and checks them against its entry's CRC.
    pub fn read(&mut self, id: u64) -> Result<Vec<u8>, StoreError> {
        let e = *self.entry(id)?;
        let bs = u64::from(self.dev.geometry().block_size);
        let mut buf = vec![0u8; (e.end() - e.offset) as usize];
        if !buf.is_empty() {
            self.dev.read_blocks(e.offset / bs, &mut buf)?;
        }
        buf.truncate(e.stored_len as usize);
        let read = crc32c(&buf);
        if read != e.crc {
            return Err(StoreError::RecordCrc {
                id,
                stored: e.crc,
                read,
            });
        }
        Ok(buf)
    }

    /// Allocates the extent for a record of `stored_len` bytes and one index slot for it:
    /// the byte offset its bytes go to. Every reservation ends in [`Store::commit_placed`] or
    /// [`Store::abandon`]; an abandoned extent stays unused until the next open.
    pub fn reserve(&mut self, stored_len: u64) -> Result<u64, StoreError> {
        if !self.writable {
            return Err(StoreError::ReadOnly);
        }
        if self.entries.len() as u64 + self.reserved >= self.sb.index_slots {
            return Err(StoreError::Full(format!(
                "the index holds {} entries",
                self.sb.index_slots
            )));
        }
        let units = stored_len.max(1).div_ceil(UNIT) * UNIT;
        if units > self.free_bytes() {
            return Err(StoreError::Full(format!(
                "{} bytes free, record needs {units}",
                self.free_bytes()
            )));
        }
        let offset = self.next_offset;
        self.next_offset += units;
        self.reserved += 1;
        Ok(offset)
    }

    /// Gives back the index slot of a reservation that will never be committed.
    pub fn abandon(&mut self) {
        self.reserved = self.reserved.saturating_sub(1);
    }

    /// Makes records whose bytes the caller wrote at their reserved offsets durable and
    /// visible (§8 steps 1–2: flush, index units, flush), ids in the order given. The device
    /// must be idle. On an error the reservations are released and nothing is in the index of
    /// this open.
    pub fn commit_placed(&mut self, placed: &[Placed]) -> Result<Vec<Entry>, StoreError> {
        if placed.is_empty() {
            return Ok(Vec::new());
        }
        let mut index = self.prepare_index(placed)?;
        let done = (|| {
            self.dev.flush_all()?;
            let (lba, blocks) = (index.lba, index.blocks);
            let buf = index.take_buf();
            self.dev.run(Request::write(0, lba, blocks, buf))?.status?;
            self.dev.flush_all()
        })();
        match done {
            Ok(()) => Ok(self.index_durable(index)),
            Err(e) => {
                self.index_failed(index);
                Err(e.into())
            }
        }
    }

    /// Step 2 of §8 for callers that keep the device busy meanwhile: the entries for `placed`
    /// (ids in the order given) and the index write holding them. The caller flushes (after
    /// the records' writes completed), writes [`PendingIndex::take_buf`] at `lba`, flushes,
    /// then calls [`Store::index_durable`] — or [`Store::index_failed`] on any error. One
    /// pending index at a time.
    pub fn prepare_index(&mut self, placed: &[Placed]) -> Result<PendingIndex, StoreError> {
        if !self.writable {
            return Err(StoreError::ReadOnly);
        }
        let first = self.entries.len() as u64;
        let entries: Vec<Entry> = placed
            .iter()
            .enumerate()
            .map(|(i, p)| Entry {
                id: first + i as u64,
                generation: self.sb.generation,
                offset: p.offset,
                stored_len: p.stored_len,
                orig_len: p.orig_len,
                crc: p.crc,
                stage: p.stage,
                label: p.label,
                seq: p.seq,
            })
            .collect();
        let (Some(head), Some(tail)) = (entries.first(), entries.last()) else {
            return Ok(PendingIndex {
                entries,
                lba: 0,
                blocks: 0,
                buf: None,
            });
        };
        let first_unit = head.id / ENTRIES_PER_UNIT;
        let units = (tail.id / ENTRIES_PER_UNIT - first_unit + 1) as usize;
        let mut buf = unit_buffer(units * UNIT as usize);
        buf.fill(0);
        let base = first_unit * ENTRIES_PER_UNIT;
        for e in self.entries[base as usize..].iter().chain(&entries) {
            let at = (e.id - base) as usize * ENTRY_LEN;
            buf[at..at + ENTRY_LEN].copy_from_slice(&e.encode());
        }
        let bs = u64::from(self.dev.geometry().block_size);
        Ok(PendingIndex {
            entries,
            lba: (INDEX_START + first_unit * UNIT) / bs,
            blocks: (units as u64 * UNIT) / bs,
            buf: Some(buf),
        })
    }

    /// The pending index is durable: its records join the index. Returns their entries.
    pub fn index_durable(&mut self, index: PendingIndex) -> Vec<Entry> {
        self.reserved = self.reserved.saturating_sub(index.entries.len() as u64);
        self.entries.extend_from_slice(&index.entries);
        index.entries
    }

    /// The pending index could not be made durable: its records stay out of the index and
    /// their reservations are released.
    pub fn index_failed(&mut self, index: PendingIndex) {
        self.reserved = self.reserved.saturating_sub(index.entries.len() as u64);
    }

    /// Record `id` as it was sent: [`Store::read`], then undone `zstd` when that stage stored
    /// it, checked against the entry's original length.
    pub fn read_original(&mut self, id: u64) -> Result<Vec<u8>, StoreError> {
        let e = *self.entry(id)?;
        let stored = self.read(id)?;
        if e.stage == crate::session::Stage::Zstd as u8 {
            return crate::stage::decompress(&stored, e.orig_len as usize)
                .map_err(|err| StoreError::Damaged(format!("record {id}: {err}")));
        }
        Ok(stored)
    }

    /// Stores a batch durably (§8) and returns the new entries, ids in batch order. On an error
    /// no record of the batch is in the index of this open (a crash may still have made a prefix
    /// of them durable, each complete).
    pub fn commit(&mut self, batch: Vec<NewRecord>) -> Result<Vec<Entry>, StoreError> {
        if !self.writable {
            return Err(StoreError::ReadOnly);
        }
        let slots_left = self.sb.index_slots - self.entries.len() as u64 - self.reserved;
        if batch.len() as u64 > slots_left {
            return Err(StoreError::Full(format!(
                "the index holds {} entries",
                self.sb.index_slots
            )));
        }
        let need: u64 = batch
            .iter()
            .map(|r| r.stored_len.max(1).div_ceil(UNIT) * UNIT)
            .sum();
        if need > self.free_bytes() {
            return Err(StoreError::Full(format!(
                "{} bytes free, the batch needs {need}",
                self.free_bytes()
            )));
        }
        let mut placed = Vec::with_capacity(batch.len());
        let mut writes = Vec::new();
        let mut bad = None;
        for rec in batch {
            let units = rec.stored_len.div_ceil(UNIT) * UNIT;
            let chunk_bytes: u64 = rec.chunks.iter().map(|c| c.len() as u64).sum();
            if chunk_bytes < rec.stored_len
                || chunk_bytes > units
                || rec
                    .chunks
                    .iter()
                    .rev()
                    .skip(1)
                    .any(|c| !(c.len() as u64).is_multiple_of(UNIT))
            {
                bad = Some(StoreError::ChunkSize {
                    len: rec.stored_len,
                    chunks: chunk_bytes,
                });
                break;
            }
            let offset = self.reserve(rec.stored_len)?;
            let mut digest = kura_engine::crc32c::Crc32c::new();
            let mut left = rec.stored_len as usize;
            let mut at = offset;
            for c in rec.chunks {
                digest.update(&c[..left.min(c.len())]);
                left = left.saturating_sub(c.len());
                let len = c.len() as u64;
                writes.push((at, c));
                at += len;
            }
            placed.push(Placed {
                offset,
                stored_len: rec.stored_len,
                orig_len: rec.orig_len,
                crc: digest.finalize(),
                stage: rec.stage,
                label: rec.label,
                seq: rec.seq,
            });
        }
        let written = match bad {
            Some(e) => Err(e),
            None => self.write_at_depth(writes),
        };
        if let Err(e) = written {
            self.reserved = self.reserved.saturating_sub(placed.len() as u64);
            return Err(e);
        }
        self.commit_placed(&placed)
    }

    /// Writes every `(byte offset, buffer)` with at most `qd` commands in flight, each buffer
    /// padded to whole device blocks (pool buffers have the room) and split at `max_transfer`
    /// by the backend.
    fn write_at_depth(&mut self, writes: Vec<(u64, IoBuf)>) -> Result<(), StoreError> {
        let geo = self.dev.geometry();
        let bs = u64::from(geo.block_size);
        let qd = self.qd.min(geo.queue_depth as usize).max(1);
        let mut pending = writes.into_iter();
        let mut done: Vec<Completion> = Vec::with_capacity(qd);
        let mut failed: Option<DeviceError> = None;
        loop {
            while failed.is_none() && self.dev.in_flight() < qd {
                let Some((at, buf)) = pending.next() else {
                    break;
                };
                let blocks = (buf.len() as u64).div_ceil(bs);
                let buf = pad_to(buf, (blocks * bs) as usize);
                if let Err(r) = self.dev.submit(Request::write(0, at / bs, blocks, buf)) {
                    failed = Some(r.error);
                }
            }
            if self.dev.in_flight() == 0 {
                break;
            }
            done.clear();
            self.dev.poll(&mut done, 1)?;
            for c in done.drain(..) {
                if let Err(e) = c.status {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(()), |e| Err(e.into()))
    }
}

/// True when an entry's extent lies in the data region as §7 requires.
fn placed(e: &Entry, data_start: u64, capacity: u64) -> bool {
    e.offset.is_multiple_of(UNIT)
        && e.offset >= data_start
        && e.stored_len > 0
        && e.orig_len > 0
        && e.stage <= 3
        && e.offset
            .checked_add(e.stored_len.div_ceil(UNIT) * UNIT)
            .is_some_and(|end| end <= capacity)
}

fn check_block_size(bs: u32) -> Result<(), StoreError> {
    if bs == 0 || u64::from(bs) > UNIT || !UNIT.is_multiple_of(u64::from(bs)) {
        return Err(StoreError::BlockSize(bs));
    }
    Ok(())
}

/// `buf` with at least `len` bytes, the added ones zero: the same buffer when its capacity
/// allows (pool buffers are whole pages), else a copy.
fn pad_to(mut buf: IoBuf, len: usize) -> IoBuf {
    let had = buf.len();
    if had >= len {
        return buf;
    }
    if buf.set_len(len) {
        buf[had..].fill(0);
        return buf;
    }
    let mut bigger = unit_buffer(len);
    bigger[..buf.len()].copy_from_slice(&buf);
    bigger[buf.len()..].fill(0);
    bigger
}
