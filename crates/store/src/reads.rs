//! How readers reach run pages and values: through the page cache, then on a queue of their
//! own (a sibling of the store's device from `BlockDevice::new_queue`, pooled), so gets on many
//! threads, and gets while the background worker writes a flush or a merge, do not wait for
//! one another on the device. Devices with one queue (the fault device of the crash tests,
//! `redirect`) are read on the store's own queue under the `space` lock, as before.
//!
//! # Why a reader never sees a freed and reused segment
//!
//! Readers find runs only through the store's view (`Shared::view`), and hold it (shared) for
//! the whole get or scan, every device read included. A run's pages and values are written on
//! a queue of this pool (or the store's own) and flushed (each write completed) before the run
//! is installed in the view; a read on any sibling queue submitted after a write completed
//! sees it, and a flush on the store's queue covers writes completed on its siblings (the
//! engine's "More queue pairs" rules), so every read of an installed run sees its pages and
//! the manifest never names a run that a crash could lose. A run's slot is
//! freed only after the view without it was installed under the view's write lock (see
//! `Shared::install`), which waits for every reader of the old view to finish: by the time the
//! slot can be allocated and written again, no read of the old run is in flight or can start.
//! Cached pages are keyed by seg_seq, which a reused slot never repeats, so a stale cached
//! page is never returned either. Log and manifest segments are read only at open, on the
//! store's own queue.

use crate::cache::{Page, PageCache};
use crate::error::StoreError;
use crate::format::SegRef;
use crate::segments::{DevQueue, Placement};
use crate::space::Space;
use crate::store::lock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Most sibling queues the store opens for readers; a reader finding them all busy reads on
/// the store's own queue.
const MAX_QUEUES: usize = 8;

/// The page cache and the readers' pool of queues.
pub(crate) struct Reads {
    pub(crate) cache: PageCache,
    at: Placement,
    idle: Mutex<Vec<DevQueue>>,
    /// Sibling queues open now (idle or in use).
    opened: AtomicUsize,
    /// Set once the device said it has no more queues.
    single: AtomicBool,
}

impl Reads {
    pub(crate) fn new(at: Placement) -> Self {
        Reads {
            cache: PageCache::default(),
            at,
            idle: Mutex::new(Vec::new()),
            opened: AtomicUsize::new(0),
            single: AtomicBool::new(false),
        }
    }

    /// Sibling queues opened for readers (for tests and statistics).
    pub(crate) fn queues(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }
}

/// The state a read needs: the store's device (for the fallback and for opening siblings) and
/// the readers' cache and queues.
#[derive(Clone, Copy)]
pub(crate) struct Dev<'a> {
    pub(crate) space: &'a Mutex<Space>,
    pub(crate) reads: &'a Reads,
}

impl Dev<'_> {
    /// Runs `f` on an idle sibling queue (opening one when none is idle and fewer than
    /// [`MAX_QUEUES`] are open), or on the store's own queue under the `space` lock.
    fn with_queue<R>(
        self,
        f: impl FnOnce(&mut DevQueue, Placement) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let at = self.reads.at;
        let idle = lock(&self.reads.idle).pop();
        let Some(mut q) = idle.or_else(|| self.open_queue()) else {
            let mut space = lock(self.space);
            return f(space.segs.queue(), at);
        };
        let result = f(&mut q, at);
        if result.is_ok() {
            lock(&self.reads.idle).push(q);
        } else {
            // A failed read may leave the queue in an unknown state: it is closed, and the
            // next reader opens a fresh one.
            self.reads.opened.fetch_sub(1, Ordering::Relaxed);
        }
        result
    }

    /// Writes whole pages at `page` of `slot` on a queue of [`Dev::with_queue`]'s: the worker's
    /// run writes do not hold the `space` lock, so commits writing the log do not wait for them.
    /// Not durable until a flush (on any queue: the engine's flush covers every queue).
    pub(crate) fn write(self, slot: u64, page: u32, data: &[u8]) -> Result<(), StoreError> {
        self.with_queue(|q, at| q.write(at, slot, page, data))
    }

    fn open_queue(self) -> Option<DevQueue> {
        let reads = self.reads;
        if reads.single.load(Ordering::Relaxed) {
            return None;
        }
        if reads.opened.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUES {
            reads.opened.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let sibling = lock(self.space).segs.queue().sibling();
        match sibling {
            Some(Ok(q)) => Some(q),
            // No siblings (or none now): readers share the store's queue from here on.
            None | Some(Err(_)) => {
                reads.single.store(true, Ordering::Relaxed);
                reads.opened.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Page `page` of the run in segment `seg`, from the page cache or the device; a page
    /// read from the device is kept in the cache when `fill` (merges read their inputs once
    /// and do not fill it, so they do not push out the pages lookups use).
    pub(crate) fn page(self, seg: SegRef, page: u32, fill: bool) -> Result<Page, StoreError> {
        if let Some(cached) = self.reads.cache.get(seg.seg_seq, page) {
            return Ok(cached);
        }
        let read: Page =
            self.with_queue(|q, at| q.read_with(at, seg.slot, page, 1, |b| Page::from(b)))?;
        if fill {
            self.reads.cache.insert(seg.seg_seq, page, &read);
        }
        Ok(read)
    }

    /// `len` bytes from byte `byte` of segment slot `slot`: only the device blocks holding
    /// them are read, and they are copied once out of the queue's buffer.
    pub(crate) fn bytes(self, slot: u64, byte: u64, len: usize) -> Result<Vec<u8>, StoreError> {
        self.with_queue(|q, at| q.read_bytes(at, slot, byte, len))
    }
}
