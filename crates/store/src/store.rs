//! The store handle: group commit of write batches into the log, the memtable readers look in,
//! and open (superblock, lease, log replay).
//!
//! Writers queue their batch; the first writer to find no leader becomes the leader, takes the
//! queued batches (up to [`StoreOptions::max_group_bytes`]), writes them as one log frame,
//! flushes once if any of them asked for sync, applies them to the memtable and answers every
//! writer in the group. Readers only take the memtable's read lock.

use crate::error::StoreError;
use crate::format::frame::Op;
use crate::format::{FormatError, MAX_KEY, MAX_SEGMENT_SHIFT, MIN_SEGMENT_SHIFT};
use crate::log::{self, LogWriter};
use crate::memtable::{Memtable, Pair};
use crate::segments::RawSegments;
use crate::space::Space;
use kura_engine::BlockDevice;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, RwLock};

/// Settings fixed when a store is created, and the write path's grouping limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// log2 of the segment size (20 to 30).
    pub segment_shift: u32,
    /// Values up to this size stay inline in the index once runs exist (format section 6).
    pub inline_threshold: u32,
    /// Most encoded bytes one commit group writes (one batch is never split).
    pub max_group_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            segment_shift: 23,
            inline_threshold: 128,
            max_group_bytes: 1 << 20,
        }
    }
}

/// Operations applied atomically: all are durable and visible together, or none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<Op>,
    bytes: usize,
}

impl WriteBatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.push(Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
        });
    }

    pub fn delete(&mut self, key: &[u8]) {
        self.push(Op::Delete { key: key.to_vec() });
    }

    fn push(&mut self, op: Op) {
        self.bytes += op.encoded_len();
        self.ops.push(op);
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A consistent read-only view: the store as it was when [`Store::snapshot`] was called.
/// Not kept across reopen.
pub struct Snapshot<'a> {
    store: &'a Store,
    lsn: u64,
}

impl Snapshot<'_> {
    /// The LSN of the last write the snapshot sees.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        self.store.release(self.lsn);
    }
}

/// Counters since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Batches written (a single put or delete is a batch of one).
    pub batches: u64,
    /// Log frames written: one per commit group.
    pub groups: u64,
    /// Flushes issued for sync writes.
    pub syncs: u64,
    /// Log frames replayed at open.
    pub replayed_frames: u64,
    /// Live keys in the memtable.
    pub memtable_keys: u64,
    /// Versions the memtable holds (the newest of each key, and older ones snapshots need).
    pub memtable_versions: u64,
}

struct Pending {
    ticket: u64,
    ops: Vec<Op>,
    bytes: usize,
    sync: bool,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    pending: Vec<Pending>,
    leader: bool,
    done: HashMap<u64, Result<(), StoreError>>,
}

/// What the leader of a commit group holds while it writes.
struct Io {
    space: Space,
    log: LogWriter,
    next_lsn: u64,
    /// Set by the first failed log write or flush; later writes get it back.
    stopped: Option<StoreError>,
}

/// An open store.
pub struct Store {
    queue: Mutex<Queue>,
    queue_changed: Condvar,
    io: Mutex<Io>,
    mem: RwLock<Memtable>,
    /// Live snapshots: LSN -> how many handles hold it. Taken with `mem` held (read or write),
    /// so a snapshot is never created between a write's pruning and its publication.
    snapshots: Mutex<BTreeMap<u64, usize>>,
    max_group_bytes: usize,
    max_payload: usize,
    damage: Option<String>,
    replay_stop: FormatError,
    batches: AtomicU64,
    groups: AtomicU64,
    syncs: AtomicU64,
    replayed_frames: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking writer cannot leave the queue or the log half-updated in a way later users
    // could misread: the log is checked on replay, so the poisoned state is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Formats `dev` as an empty store (whatever it held is lost) and opens it.
    pub fn create(dev: Box<dyn BlockDevice>, opts: &StoreOptions) -> Result<Store, StoreError> {
        if !(MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT).contains(&opts.segment_shift) {
            return Err(StoreError::Invalid(format!(
                "segment_shift {} is outside {MIN_SEGMENT_SHIFT}..={MAX_SEGMENT_SHIFT}",
                opts.segment_shift
            )));
        }
        if opts.inline_threshold as usize > MAX_KEY {
            return Err(StoreError::Invalid(format!(
                "inline_threshold {} is above {MAX_KEY}",
                opts.inline_threshold
            )));
        }
        let segs = RawSegments::new(dev, opts.segment_shift)?;
        let space = Space::format(segs, opts.segment_shift, opts.inline_threshold)?;
        Self::start(space, None, opts.max_group_bytes)
    }

    /// Opens the store on `dev`: picks the current superblock copy, takes a seg_seq lease and
    /// replays the log into the memtable.
    pub fn open(dev: Box<dyn BlockDevice>, max_group_bytes: usize) -> Result<Store, StoreError> {
        let (space, damage) = Space::open(dev)?;
        Self::start(space, damage, max_group_bytes)
    }

    fn start(
        mut space: Space,
        damage: Option<String>,
        max_group_bytes: usize,
    ) -> Result<Store, StoreError> {
        let mut mem = Memtable::default();
        let no_snapshots = BTreeMap::new();
        let replayed = log::replay(&mut space, |lsn, op| mem.apply(lsn, op, &no_snapshots))?;
        let sb = space.superblock();
        let log = LogWriter::new(replayed.end, sb.store_tag(), sb.segment_pages());
        let max_payload = log::max_payload(sb.segment_pages());
        Ok(Store {
            queue: Mutex::new(Queue::default()),
            queue_changed: Condvar::new(),
            io: Mutex::new(Io {
                space,
                log,
                next_lsn: replayed.next_lsn,
                stopped: None,
            }),
            mem: RwLock::new(mem),
            snapshots: Mutex::new(BTreeMap::new()),
            max_group_bytes,
            max_payload,
            damage,
            replay_stop: replayed.stop,
            batches: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            replayed_frames: replayed.frames,
        })
    }

    /// A superblock copy that was found damaged at open, if any (the other was used).
    pub fn damage(&self) -> Option<&str> {
        self.damage.as_deref()
    }

    /// Why log replay at open ended where it did: the first page after the log's last frame
    /// (never written: bad magic or another seg_seq; torn by a crash: a checksum).
    pub fn replay_stop(&self) -> &FormatError {
        &self.replay_stop
    }

    pub fn put(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), StoreError> {
        let mut b = WriteBatch::new();
        b.put(key, value);
        self.write(b, sync)
    }

    pub fn delete(&self, key: &[u8], sync: bool) -> Result<(), StoreError> {
        let mut b = WriteBatch::new();
        b.delete(key);
        self.write(b, sync)
    }

    /// The newest value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.read_mem().get(key, u64::MAX))
    }

    /// The value of `key` as `snapshot` saw it.
    pub fn get_at(
        &self,
        snapshot: &Snapshot<'_>,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.read_mem().get(key, snapshot.lsn))
    }

    /// A consistent view of the store as it is now, kept until the handle is dropped.
    pub fn snapshot(&self) -> Snapshot<'_> {
        let mem = self.read_mem();
        let lsn = mem.visible();
        *lock(&self.snapshots).entry(lsn).or_insert(0) += 1;
        Snapshot { store: self, lsn }
    }

    fn release(&self, lsn: u64) {
        let mut snapshots = lock(&self.snapshots);
        if let Some(holders) = snapshots.get_mut(&lsn) {
            *holders -= 1;
            if *holders == 0 {
                snapshots.remove(&lsn);
            }
        }
    }

    fn read_mem(&self) -> std::sync::RwLockReadGuard<'_, Memtable> {
        self.mem.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `limit` live pairs with `from <= key < to` (an absent bound is open), in key order
    /// or, with `reverse`, from the largest key down. A consistent view: a batch committed
    /// meanwhile is in it entirely or not at all.
    pub fn scan(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<Pair>, StoreError> {
        Ok(self.read_mem().scan(from, to, u64::MAX, limit, reverse))
    }

    /// [`Store::scan`] as `snapshot` saw the store.
    pub fn scan_at(
        &self,
        snapshot: &Snapshot<'_>,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<Pair>, StoreError> {
        Ok(self.read_mem().scan(from, to, snapshot.lsn, limit, reverse))
    }

    /// Writes `batch` atomically; with `sync`, returns only once it is durable.
    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        if let Some(op) = batch.ops.iter().find(|op| op.key().len() > MAX_KEY) {
            return Err(StoreError::Refused(FormatError::TooLarge {
                what: "key",
                need: op.key().len(),
                room: MAX_KEY,
            }));
        }
        if batch.bytes > self.max_payload {
            return Err(StoreError::Refused(FormatError::TooLarge {
                what: "write batch",
                need: batch.bytes,
                room: self.max_payload,
            }));
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        let mut q = lock(&self.queue);
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.pending.push(Pending {
            ticket,
            ops: batch.ops,
            bytes: batch.bytes,
            sync,
        });
        loop {
            if let Some(result) = q.done.remove(&ticket) {
                return result;
            }
            if q.leader {
                q = self
                    .queue_changed
                    .wait(q)
                    .unwrap_or_else(|p| p.into_inner());
                continue;
            }
            q.leader = true;
            let group = self.take_group(&mut q.pending);
            drop(q);
            let result = self.commit(&group);
            q = lock(&self.queue);
            for p in &group {
                q.done.insert(p.ticket, result.clone());
            }
            q.leader = false;
            self.queue_changed.notify_all();
        }
    }

    /// The oldest queued batches, as many as fit in one group (at least one).
    fn take_group(&self, pending: &mut Vec<Pending>) -> Vec<Pending> {
        let limit = self.max_group_bytes.min(self.max_payload);
        let mut bytes = 0;
        let n = pending
            .iter()
            .take_while(|p| {
                bytes += p.bytes;
                bytes <= limit
            })
            .count()
            .max(1);
        pending.drain(..n).collect()
    }

    /// Writes a group as one frame, flushes when any batch asked for sync, then makes it
    /// visible.
    fn commit(&self, group: &[Pending]) -> Result<(), StoreError> {
        let mut io = lock(&self.io);
        if let Some(e) = &io.stopped {
            return Err(StoreError::Stopped(e.to_string()));
        }
        let count: usize = group.iter().map(|p| p.ops.len()).sum();
        let count = u32::try_from(count).map_err(|_| {
            StoreError::Refused(FormatError::TooLarge {
                what: "operations in one commit group",
                need: count,
                room: u32::MAX as usize,
            })
        })?;
        let mut payload = Vec::with_capacity(group.iter().map(|p| p.bytes).sum());
        for op in group.iter().flat_map(|p| &p.ops) {
            op.encode(&mut payload).map_err(StoreError::Refused)?;
        }
        let first_lsn = io.next_lsn;
        let sync = group.iter().any(|p| p.sync);
        let io = &mut *io;
        let written = io
            .log
            .append(&mut io.space, first_lsn, count, &payload)
            .and_then(|()| if sync { io.space.segs.flush() } else { Ok(()) });
        if let Err(e) = written {
            // A refused batch left nothing behind; a device failure leaves the log's tail
            // unknown, so no later frame may follow it.
            if !matches!(e, StoreError::Refused(_) | StoreError::Full { .. }) {
                io.stopped = Some(e.clone());
            }
            return Err(e);
        }
        io.next_lsn += u64::from(count);
        self.groups.fetch_add(1, Ordering::Relaxed);
        if sync {
            self.syncs.fetch_add(1, Ordering::Relaxed);
        }
        let mut mem = self.mem.write().unwrap_or_else(|p| p.into_inner());
        let snapshots = lock(&self.snapshots);
        for (i, op) in group.iter().flat_map(|p| &p.ops).enumerate() {
            mem.apply(first_lsn + i as u64, op.clone(), &snapshots);
        }
        Ok(())
    }

    /// Makes every write so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        let mut io = lock(&self.io);
        if let Some(e) = &io.stopped {
            return Err(StoreError::Stopped(e.to_string()));
        }
        io.space.segs.flush()?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Makes every write durable and closes the store.
    pub fn close(self) -> Result<(), StoreError> {
        self.sync()
    }

    pub fn stats(&self) -> StoreStats {
        let mem = self.read_mem();
        StoreStats {
            batches: self.batches.load(Ordering::Relaxed),
            groups: self.groups.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            replayed_frames: self.replayed_frames,
            memtable_keys: mem.live_keys(),
            memtable_versions: mem.versions(),
        }
    }
}
