//! The device and the journal of a mounted file system, behind their own lock ([`Disk`]),
//! separate from the mounted state's: a journal commit's log writes and flush, and a cache
//! miss's device read, run holding only this lock, so other threads keep using the state
//! (cached reads, writes into the cache, names) meanwhile.
//!
//! The journal lives here with the device because every change to it is device I/O (commit,
//! checkpoint) and because the in-memory images it serves ([`crate::wal::Journal::image`]) must
//! change atomically with the log write that makes them durable: whoever checks for an image
//! (before a direct write, before a device read) takes this lock and so sees either the state
//! before a commit's I/O or the state after it, never the middle.
//!
//! A commit is prepared under the state lock ([`Prepared`]: the transaction's block images and
//! its ordered data), which then takes this lock *before* releasing the state lock, so nothing
//! can slip between the snapshot and its log write; the write and the flush run under this lock
//! alone ([`Prepared::write`]). A failed commit poisons the disk: no later commit may be written
//! after a transaction that is missing from the log.
//!
//! The disk lock is a read-write lock. **Exclusive** ([`SharedDisk::lock`]: the `Disk`
//! itself) for whatever writes the journal, flushes, or rewrites or frees blocks: commits,
//! checkpoints, fdatasync, everything done under the state lock. **Shared**
//! ([`SharedDisk::io`]) for I/O that needs only that no block be freed, reused and rewritten
//! meanwhile: a read miss's fetch, a streaming window, a large write's whole blocks. Each
//! shared holder gets a queue pair of its own from a small pool of siblings of the mount's
//! device ([`FsDevice::sibling`]), so threads drive the device side by side, never sharing a
//! submission queue under a lock; a device with a single queue (or that refused another) is
//! shared instead, one holder at a time, as before.
//!
//! **Write-back of evicted blocks.** Making room in the cache evicts dirty blocks under the
//! state lock; their writes are queued here ([`SharedDisk::queue_writeback`]) rather than done
//! there, so the threads waiting for the state lock do not wait for the device. The queue is
//! written by whoever next takes the disk lock, exclusively ([`SharedDisk::lock`]) or shared
//! ([`SharedDisk::io`], which first takes it exclusively to do so), before anything else: so a
//! read planned after the eviction fetches the block after its write, a commit or checkpoint
//! that may write the block (or free it for reuse) comes after it, and a flush covers it. A
//! `FileSystem` call empties the queue before it takes the state lock, so the thread that next
//! changes something writes the queue with no lock held. The queue is bounded
//! ([`WRITEBACK_MAX_BLOCKS`]): beyond that the evicting thread writes it at once. A failed
//! write-back poisons the disk like a failed commit: the next commit, fsync or sync fails and
//! the file system goes read-only (the evicted data is lost, as a page-cache write-back error
//! loses it and reports it at the next fsync).

use crate::error::FsError;
use crate::fs::planned::PlannedWrites;
use crate::fsdevice::{BatchOp, FsDevice};
use crate::wal::Journal;
use kura_engine::IoBuf;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// Most sibling queues a mount opens: beyond this many threads doing I/O at once, the extra
/// ones share the mount's own queue (each queue pins its own kernel resources).
const MAX_SIBLINGS: usize = 16;

/// Most evicted blocks queued for write-back (module documentation): 8 MiB of 8 KiB blocks.
pub(crate) const WRITEBACK_MAX_BLOCKS: usize = 1024;

/// The device and the journal (see the module documentation).
pub(crate) struct Disk {
    pub(crate) dev: FsDevice,
    pub(crate) journal: Journal,
    /// Set when a commit's writes or flush failed: every later commit is refused.
    poisoned: Option<String>,
    /// The error of a failed write-back of evicted blocks, given to the next commit or
    /// fdatasync (as a page-cache write-back error is reported by the next fsync); later ones
    /// are refused as after any failure.
    writeback_error: Option<FsError>,
}

/// A shared handle on the [`Disk`] of a mount.
#[derive(Clone)]
pub(crate) struct SharedDisk(Arc<DiskLock>);

struct DiskLock {
    /// The disk lock proper (see the module documentation).
    gate: RwLock<()>,
    /// Taken by exclusive holders, and by a shared one only when it must use the mount's own
    /// queue (no sibling to be had); so always after `gate`.
    disk: Mutex<Disk>,
    /// Sibling queues not in use; a leaf lock, held only to take or return one.
    queues: Mutex<Queues>,
    /// Evicted blocks to write before any other use of the device (module documentation); a
    /// leaf lock, held only to add to it or take it.
    writeback: Mutex<Vec<PlannedWrites<Arc<IoBuf>>>>,
    /// Blocks in `writeback`, so that taking the disk lock costs one load when it is empty.
    writeback_blocks: AtomicUsize,
}

struct Queues {
    idle: Vec<FsDevice>,
    /// Siblings opened so far (idle or in use).
    opened: usize,
    /// The device has one queue, or refused another: shared holders use the mount's own.
    single: bool,
}

/// The disk lock held exclusively: the device and the journal.
pub(crate) struct DiskGuard<'a> {
    // Declared first so it is released first: the inner lock before the gate.
    disk: MutexGuard<'a, Disk>,
    _gate: RwLockWriteGuard<'a, ()>,
}

impl Deref for DiskGuard<'_> {
    type Target = Disk;
    fn deref(&self) -> &Disk {
        &self.disk
    }
}

impl DerefMut for DiskGuard<'_> {
    fn deref_mut(&mut self) -> &mut Disk {
        &mut self.disk
    }
}

/// The disk lock held shared, with a queue to do I/O on: a sibling of its own, given back to
/// the pool when this is dropped, or the mount's own queue.
pub(crate) struct IoGuard<'a> {
    queue: Queue<'a>,
    lock: &'a DiskLock,
    _gate: RwLockReadGuard<'a, ()>,
}

enum Queue<'a> {
    Own(Option<FsDevice>),
    Shared(MutexGuard<'a, Disk>),
}

impl Deref for IoGuard<'_> {
    type Target = FsDevice;
    fn deref(&self) -> &FsDevice {
        match &self.queue {
            Queue::Own(Some(dev)) => dev,
            Queue::Own(None) => unreachable!("a sibling is only taken out when dropped"),
            Queue::Shared(disk) => &disk.dev,
        }
    }
}

impl DerefMut for IoGuard<'_> {
    fn deref_mut(&mut self) -> &mut FsDevice {
        match &mut self.queue {
            Queue::Own(Some(dev)) => dev,
            Queue::Own(None) => unreachable!("a sibling is only taken out when dropped"),
            Queue::Shared(disk) => &mut disk.dev,
        }
    }
}

impl Drop for IoGuard<'_> {
    fn drop(&mut self) {
        if let Queue::Own(dev) = &mut self.queue {
            if let Some(dev) = dev.take() {
                self.lock.queues().idle.push(dev);
            }
        }
    }
}

impl SharedDisk {
    pub(crate) fn new(dev: FsDevice, journal: Journal) -> Self {
        SharedDisk(Arc::new(DiskLock {
            gate: RwLock::new(()),
            disk: Mutex::new(Disk {
                dev,
                journal,
                poisoned: None,
                writeback_error: None,
            }),
            queues: Mutex::new(Queues {
                idle: Vec::new(),
                opened: 0,
                single: false,
            }),
            writeback: Mutex::new(Vec::new()),
            writeback_blocks: AtomicUsize::new(0),
        }))
    }

    /// Takes the disk lock exclusively, and writes the queued write-back first. A panic while
    /// it was held cannot have left a half-written transaction counted as durable (the
    /// journal's state changes only after a flush), so the disk stays usable.
    pub(crate) fn lock(&self) -> DiskGuard<'_> {
        let gate = self.0.gate.write().unwrap_or_else(|p| p.into_inner());
        let mut guard = DiskGuard {
            disk: self.0.disk(),
            _gate: gate,
        };
        self.0.write_back(&mut guard);
        guard
    }

    /// Queues the writes of dirty blocks evicted from the cache (module documentation). Called
    /// under the state lock; when the queue is over its bound, writes it at once.
    pub(crate) fn queue_writeback(&self, plan: PlannedWrites<Arc<IoBuf>>) {
        if plan.is_empty() {
            return;
        }
        let blocks = plan.block_count();
        let mut queue = self.0.writeback();
        queue.push(plan);
        // Changed only with the queue locked, so it always counts what the queue holds.
        let queued = self.0.writeback_blocks.fetch_add(blocks, Ordering::AcqRel) + blocks;
        drop(queue);
        if queued > WRITEBACK_MAX_BLOCKS {
            drop(self.lock());
        }
    }

    /// Writes the queued write-back, if any, holding the disk lock only meanwhile. Called with
    /// no lock held (before a `FileSystem` call takes the state lock).
    pub(crate) fn write_back_now(&self) {
        if self.0.writeback_blocks.load(Ordering::Acquire) > 0 {
            drop(self.lock());
        }
    }

    /// Whether another thread holds the disk lock now (exclusively or shared): a caller holding
    /// the state lock that would otherwise wait for it there (stopping every other thread)
    /// can let the state lock go and [`SharedDisk::wait_idle`] instead.
    pub(crate) fn busy(&self) -> bool {
        matches!(self.0.gate.try_write(), Err(TryLockError::WouldBlock))
    }

    /// Waits until the present holders of the disk lock let it go. Taken without the state
    /// lock (lock order: state, disk; this holds neither afterwards).
    pub(crate) fn wait_idle(&self) {
        drop(self.0.gate.write());
    }

    /// Takes the disk lock shared, with a queue of its own when the device has more than one
    /// (module documentation). Opening a sibling the first time costs a system call or two
    /// (a new io_uring); after that they are reused.
    pub(crate) fn io(&self) -> IoGuard<'_> {
        let lock = &*self.0;
        let gate = loop {
            let gate = lock.gate.read().unwrap_or_else(|p| p.into_inner());
            if lock.writeback_blocks.load(Ordering::Acquire) == 0 {
                break gate;
            }
            // Evicted blocks wait to be written, and this I/O may read them: write them first.
            drop(gate);
            drop(self.lock());
        };
        let queue = match lock.take_sibling() {
            Some(dev) => Queue::Own(Some(dev)),
            None => Queue::Shared(lock.disk()),
        };
        IoGuard {
            queue,
            lock,
            _gate: gate,
        }
    }
}

impl DiskLock {
    fn disk(&self) -> MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn queues(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn writeback(&self) -> MutexGuard<'_, Vec<PlannedWrites<Arc<IoBuf>>>> {
        self.writeback.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the queued write-back; the caller holds the disk lock exclusively (`disk`). A
    /// failure poisons the disk (module documentation).
    fn write_back(&self, disk: &mut Disk) {
        if self.writeback_blocks.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut queue = self.writeback();
        let plans = std::mem::take(&mut *queue);
        self.writeback_blocks.store(0, Ordering::Release);
        drop(queue);
        let ops: Vec<BatchOp> = plans
            .into_iter()
            .flat_map(PlannedWrites::into_ops)
            .collect();
        if ops.is_empty() {
            return;
        }
        if let Err(e) = disk.dev.batch(ops) {
            disk.poison(&e);
            disk.writeback_error.get_or_insert(e);
        }
    }

    /// An idle sibling, or a new one while fewer than [`MAX_SIBLINGS`] are open; `None` when
    /// the mount's own queue must be shared. The caller holds the gate shared, so no exclusive
    /// holder has `disk`, which is taken only for the moment of opening a sibling from it.
    fn take_sibling(&self) -> Option<FsDevice> {
        let mut queues = self.queues();
        if let Some(dev) = queues.idle.pop() {
            return Some(dev);
        }
        if queues.single || queues.opened >= MAX_SIBLINGS {
            return None;
        }
        match self.disk().dev.sibling() {
            Some(Ok(dev)) => {
                queues.opened += 1;
                Some(dev)
            }
            // A single-queue device, or one that cannot open more now (the controller's queues
            // are taken, the kernel refused a ring): sharing the mount's queue is correct,
            // only slower, so it is not an error.
            None | Some(Err(_)) => {
                queues.single = true;
                None
            }
        }
    }
}

impl Disk {
    /// Fails when an earlier commit or write-back failed (see [`Disk::poison`]): the first
    /// caller after a failed write-back gets its error.
    pub(crate) fn check_poison(&mut self) -> Result<(), FsError> {
        if let Some(e) = self.writeback_error.take() {
            return Err(e);
        }
        match &self.poisoned {
            Some(why) => Err(FsError::ReadOnly(why.clone())),
            None => Ok(()),
        }
    }

    /// fdatasync's device part: writes `ops` (dirty data going home) and flushes. Refused after
    /// a failed commit (which may have held the file's block map); poisons on failure.
    pub(crate) fn write_and_flush(&mut self, ops: Vec<BatchOp>) -> Result<(), FsError> {
        self.check_poison()?;
        let result = (|| {
            if !ops.is_empty() {
                self.dev.batch(ops)?;
            }
            self.dev.flush()
        })();
        if let Err(e) = &result {
            self.poison(e);
        }
        result
    }

    /// Records that a commit or data flush failed: nothing more is committed.
    pub(crate) fn poison(&mut self, e: &FsError) {
        self.poisoned
            .get_or_insert_with(|| format!("after an I/O failure: {e}"));
    }
}

/// A snapshot of the running transaction, taken under the state lock, to be written under the
/// disk lock alone.
pub(crate) struct Prepared {
    /// Metadata (and journaled data) block images.
    pub(crate) images: Vec<(u64, Vec<u8>)>,
    /// Ordered data written home in the same batch: copied into commands by [`Prepared::write`],
    /// with the state lock released.
    pub(crate) data: PlannedWrites<Arc<IoBuf>>,
    /// Blocks the transaction freed: reusable once it is durable.
    pub(crate) freed: Vec<(u64, u64)>,
    /// The transaction's sequence in this mount (the running transaction's when prepared).
    pub(crate) seq: u64,
    /// The home blocks of `data` when some may still have a committed image in the journal,
    /// checked (and the journal checkpointed if one has) by [`Prepared::write`] before `data`
    /// goes out, so that no older image can later land over it. Checked there, with only the
    /// disk lock held, rather than when prepared: a checkpoint is writes and two flushes, and
    /// measured 0.5-0.9 ms of the state lock each time LevelDB's table syncs needed one.
    pub(crate) home_unsettled: Option<Vec<u64>>,
}

/// A transaction that is durable: what [`Mounted::commit_done`](super::Mounted) needs to know.
pub(crate) struct Written {
    pub(crate) freed: Vec<(u64, u64)>,
    pub(crate) seq: u64,
    pub(crate) transaction: bool,
}

impl Prepared {
    /// Writes the transaction (log and ordered data in one batch) and flushes: format §7
    /// steps 1–3. Poisons the disk on failure.
    pub(crate) fn write(self, disk: &mut Disk) -> Result<Written, FsError> {
        disk.check_poison()?;
        let Prepared {
            images,
            data,
            freed,
            seq,
            home_unsettled,
        } = self;
        let transaction = !images.is_empty();
        let data = data.into_ops();
        let Disk { dev, journal, .. } = disk;
        let home_has_image = home_unsettled
            .is_some_and(|targets| targets.iter().any(|&b| journal.image(b).is_some()));
        let result = if home_has_image {
            journal.checkpoint(dev)
        } else {
            Ok(())
        };
        let result = result.and_then(|()| {
            if images.is_empty() {
                (|| {
                    if !data.is_empty() {
                        dev.batch(data)?;
                    }
                    dev.flush()
                })()
            } else {
                journal.commit_with_data(dev, &images, data).map(|_| ())
            }
        });
        match result {
            Ok(()) => Ok(Written {
                freed,
                seq,
                transaction,
            }),
            Err(e) => {
                disk.poison(&e);
                Err(e)
            }
        }
    }
}
