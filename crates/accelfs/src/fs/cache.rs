//! The buffer cache: a hash table of cached blocks per file (as in the paper), with dirty
//! tracking, under one global budget with least-recently-used eviction.
//!
//! Blocks live in engine buffers (`IoBuf`, from the registered pool when it has room), so the
//! device reads straight into the cache. The cache never does I/O itself: making room hands the
//! dirty victims back to the caller, which queues their writes for the next holder of the disk
//! lock (`state/disk.rs`), to go out at queue depth in one batch.
//!
//! The cache lives in the mounted state, behind the state lock. Everything that changes it takes
//! that lock exclusively, except one thing: a read of cached blocks under the *shared* state
//! lock (`Cache::peek`), which many threads do at once. Such a hit cannot move the block in
//! the LRU order (that needs the exclusive lock); it sets the slot's `referenced` flag instead,
//! and eviction gives a referenced block a second chance (moves it to the most recent end and
//! clears the flag) rather than evicting it, so the order is LRU for exclusive hits and
//! second-chance (CLOCK) for shared ones. Shared hits are counted in per-thread stripes
//! (`StripedCounter`) so readers never write one shared cache line.

use kura_engine::IoBuf;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of the buffer cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// The budget in bytes.
    pub budget_bytes: u64,
    /// Bytes cached now.
    pub cached_bytes: u64,
    /// Most bytes ever cached at once (never above the budget).
    pub peak_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// Blocks read ahead of a sequential reader.
    pub readahead_blocks: u64,
    pub evictions: u64,
    /// Dirty blocks written back because they were evicted.
    pub evicted_dirty: u64,
    /// Bytes moved by reads and writes that bypassed the cache (large sequential I/O).
    pub bypass_bytes: u64,
}

pub(crate) struct Slot {
    /// Shared with the writes planned from it (a commit's or an fdatasync's, see
    /// `planned.rs`) until they are issued; changed through [`Slot::bytes_mut`] only.
    buf: Arc<IoBuf>,
    dirty: bool,
    tick: u64,
    /// Read under the shared state lock since it last moved in the LRU order.
    referenced: AtomicBool,
}

impl Slot {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The block's bytes, to change. When a planned write still holds them, the slot gets a
    /// copy first, so that write sends the block as it was when it was planned.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        Arc::<IoBuf>::make_mut(&mut self.buf)
    }
}

/// Stripes of [`StripedCounter`], each on its own cache line.
const STRIPES: usize = 16;

#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicU64);

/// A counter that many threads add to at once without sharing a cache line: each thread adds
/// to its own stripe (threads are numbered when they first count), the total is the sum.
#[derive(Default)]
pub(crate) struct StripedCounter {
    stripes: [Stripe; STRIPES],
}

impl StripedCounter {
    pub(crate) fn add(&self, n: u64) {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
        }
        let i = STRIPE.with(|s| *s);
        self.stripes[i].0.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn total(&self) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }
}

/// A dirty block handed back for writing: file, file block, contents.
pub(crate) type Victim = (u64, u32, Arc<IoBuf>);

pub(crate) struct Cache {
    block_size: usize,
    budget_blocks: usize,
    files: HashMap<u64, HashMap<u32, Slot>>,
    lru: BTreeMap<u64, (u64, u32)>,
    /// Every dirty block, so write-back never scans clean ones.
    dirty: BTreeSet<(u64, u32)>,
    tick: u64,
    count: usize,
    /// Counters changed under the exclusive state lock.
    pub(crate) stats: CacheStats,
    /// Hits of reads under the shared state lock ([`Cache::peek`]).
    pub(crate) shared_hits: StripedCounter,
    /// Buffers of blocks dropped from the cache in bulk, freed later without the state lock.
    retired: Retired,
}

/// Most buffers [`Retired`] holds; past it, removed blocks free their buffers at once.
const RETIRED_MAX: usize = 8192;

/// Buffers of blocks the cache dropped in bulk (a removed or truncated file), handed to the
/// file system to free once it has let the state lock go: freeing a 4 MiB table's 512 pool
/// buffers took about 90 µs here, which every other operation would otherwise wait out.
/// Shared between the cache and the mount (`FileSystem::drop_retired`), bounded by
/// [`RETIRED_MAX`].
#[derive(Clone, Default)]
pub(crate) struct Retired(Arc<RetiredInner>);

#[derive(Default)]
struct RetiredInner {
    bufs: Mutex<Vec<Arc<IoBuf>>>,
    /// `bufs.len()`, stored under its lock, so that the common empty case takes no lock.
    count: AtomicUsize,
}

impl Retired {
    /// Takes every retired buffer, for the caller to drop (without the state lock).
    pub(crate) fn take(&self) -> Vec<Arc<IoBuf>> {
        if self.0.count.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut bufs = self.0.bufs.lock().unwrap_or_else(|p| p.into_inner());
        self.0.count.store(0, Ordering::Release);
        std::mem::take(&mut *bufs)
    }

    /// Keeps `bufs` for [`Retired::take`], or gives them back when that would pass the bound.
    fn keep(&self, bufs: Vec<Arc<IoBuf>>) -> Option<Vec<Arc<IoBuf>>> {
        let mut held = self.0.bufs.lock().unwrap_or_else(|p| p.into_inner());
        if held.len() + bufs.len() > RETIRED_MAX {
            return Some(bufs);
        }
        held.extend(bufs);
        self.0.count.store(held.len(), Ordering::Release);
        None
    }
}

impl Cache {
    pub(crate) fn new(block_size: usize, budget_bytes: u64) -> Self {
        let budget_blocks = (budget_bytes / block_size as u64).max(16) as usize;
        Cache {
            block_size,
            budget_blocks,
            files: HashMap::new(),
            lru: BTreeMap::new(),
            dirty: BTreeSet::new(),
            tick: 0,
            count: 0,
            stats: CacheStats {
                budget_bytes: (budget_blocks * block_size) as u64,
                ..CacheStats::default()
            },
            shared_hits: StripedCounter::default(),
            retired: Retired::default(),
        }
    }

    /// Where the buffers of blocks dropped in bulk wait to be freed.
    pub(crate) fn retired(&self) -> Retired {
        self.retired.clone()
    }

    /// The counters, shared hits included.
    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.stats.hits + self.shared_hits.total(),
            ..self.stats
        }
    }

    pub(crate) fn budget_blocks(&self) -> usize {
        self.budget_blocks
    }

    /// The cached block, marked as just used.
    pub(crate) fn get(&mut self, ino: u64, block: u32) -> Option<&mut Slot> {
        let slot = self.files.get_mut(&ino)?.get_mut(&block)?;
        self.lru.remove(&slot.tick);
        self.tick += 1;
        slot.tick = self.tick;
        self.lru.insert(self.tick, (ino, block));
        Some(slot)
    }

    /// The cached block, for a reader holding the state lock shared: marks it referenced (see
    /// the module documentation) instead of moving it in the LRU order.
    pub(crate) fn peek(&self, ino: u64, block: u32) -> Option<&IoBuf> {
        let slot = self.files.get(&ino)?.get(&block)?;
        // Only the first reader after a move writes the flag; later ones only read it.
        if !slot.referenced.load(Ordering::Relaxed) {
            slot.referenced.store(true, Ordering::Relaxed);
        }
        Some(&*slot.buf)
    }

    pub(crate) fn contains(&self, ino: u64, block: u32) -> bool {
        self.files.get(&ino).is_some_and(|m| m.contains_key(&block))
    }

    /// Evicts least-recently-used blocks until `incoming` more fit in the budget; returns the
    /// dirty ones, which the caller must write.
    pub(crate) fn make_room(&mut self, incoming: usize) -> Vec<Victim> {
        let mut victims = Vec::new();
        while self.count + incoming > self.budget_blocks {
            let Some((_, (ino, block))) = self.lru.pop_first() else {
                break;
            };
            // A block read under the shared lock since it last moved gets a second chance:
            // it goes to the most recent end, unreferenced (each block at most once per call,
            // since nothing sets the flag while the caller holds the exclusive lock).
            if let Some(slot) = self.files.get_mut(&ino).and_then(|m| m.get_mut(&block)) {
                if std::mem::take(slot.referenced.get_mut()) {
                    self.tick += 1;
                    slot.tick = self.tick;
                    self.lru.insert(self.tick, (ino, block));
                    continue;
                }
            }
            if let Some(slot) = self.remove(ino, block) {
                self.stats.evictions += 1;
                if slot.dirty {
                    self.stats.evicted_dirty += 1;
                    victims.push((ino, block, slot.buf));
                }
            }
        }
        victims
    }

    /// Caches `buf` as block `block` of `ino`. Call [`Cache::make_room`] first.
    pub(crate) fn insert(&mut self, ino: u64, block: u32, buf: IoBuf, dirty: bool) {
        debug_assert_eq!(buf.len(), self.block_size);
        self.tick += 1;
        let slot = Slot {
            buf: Arc::new(buf),
            dirty,
            tick: self.tick,
            referenced: AtomicBool::new(false),
        };
        if dirty {
            self.dirty.insert((ino, block));
        } else {
            self.dirty.remove(&(ino, block));
        }
        if let Some(old) = self.files.entry(ino).or_default().insert(block, slot) {
            self.lru.remove(&old.tick);
        } else {
            self.count += 1;
        }
        self.lru.insert(self.tick, (ino, block));
        let bytes = (self.count * self.block_size) as u64;
        self.stats.cached_bytes = bytes;
        self.stats.peak_bytes = self.stats.peak_bytes.max(bytes);
    }

    /// Drops a block whether or not it is dirty (the file range was truncated or overwritten
    /// past the cache).
    pub(crate) fn remove(&mut self, ino: u64, block: u32) -> Option<Slot> {
        let map = self.files.get_mut(&ino)?;
        let slot = map.remove(&block)?;
        if map.is_empty() {
            self.files.remove(&ino);
        }
        self.lru.remove(&slot.tick);
        self.dirty.remove(&(ino, block));
        self.count -= 1;
        self.stats.cached_bytes = (self.count * self.block_size) as u64;
        Some(slot)
    }

    /// Drops every block of `ino` at or after `from`; their buffers wait in [`Retired`].
    pub(crate) fn remove_from(&mut self, ino: u64, from: u32) {
        let bufs: Vec<Arc<IoBuf>> = if from == 0 {
            // The whole file (it was removed): its table goes at once, and only its dirty
            // blocks are looked up in the dirty set.
            let Some(map) = self.files.remove(&ino) else {
                return;
            };
            self.count -= map.len();
            self.stats.cached_bytes = (self.count * self.block_size) as u64;
            map.into_iter()
                .map(|(block, slot)| {
                    self.lru.remove(&slot.tick);
                    if slot.dirty {
                        self.dirty.remove(&(ino, block));
                    }
                    slot.buf
                })
                .collect::<Vec<_>>()
        } else {
            let blocks: Vec<u32> = match self.files.get(&ino) {
                Some(m) => m.keys().copied().filter(|&b| b >= from).collect(),
                None => return,
            };
            blocks
                .into_iter()
                .filter_map(|b| self.remove(ino, b))
                .map(|slot| slot.buf)
                .collect()
        };
        debug_assert!(
            from > 0
                || self
                    .dirty
                    .range((ino, 0)..=(ino, u32::MAX))
                    .next()
                    .is_none()
        );
        // Freed here, under the state lock, only past the bound.
        drop(self.retired.keep(bufs));
    }

    /// Records that the caller changed cached block `block` of `ino`.
    pub(crate) fn mark_dirty(&mut self, ino: u64, block: u32) {
        if let Some(slot) = self.files.get_mut(&ino).and_then(|m| m.get_mut(&block)) {
            slot.dirty = true;
            self.dirty.insert((ino, block));
        }
    }

    /// The dirty blocks (all files, or one), marking them clean: shared with the cache, which
    /// copies a block before changing it while the caller still holds it.
    pub(crate) fn take_dirty(&mut self, only: Option<u64>) -> Vec<Victim> {
        let keys: Vec<(u64, u32)> = match only {
            Some(ino) => self
                .dirty
                .range((ino, 0)..=(ino, u32::MAX))
                .copied()
                .collect(),
            None => self.dirty.iter().copied().collect(),
        };
        let mut out = Vec::with_capacity(keys.len());
        for (ino, block) in keys {
            self.dirty.remove(&(ino, block));
            if let Some(slot) = self.files.get_mut(&ino).and_then(|m| m.get_mut(&block)) {
                slot.dirty = false;
                out.push((ino, block, Arc::clone(&slot.buf)));
            }
        }
        out
    }

    pub(crate) fn has_dirty(&self, ino: u64) -> bool {
        self.dirty
            .range((ino, 0)..=(ino, u32::MAX))
            .next()
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_is_least_recently_used_and_returns_dirty_victims() {
        let mut c = Cache::new(4096, 16 * 4096);
        for b in 0..16u32 {
            c.insert(1, b, IoBuf::zeroed(4096), b % 2 == 0);
        }
        assert!(c.make_room(0).is_empty());
        assert!(c.get(1, 0).is_some()); // block 0 is now the most recent
        let victims = c.make_room(2);
        let evicted: Vec<u32> = victims.iter().map(|v| v.1).collect();
        assert_eq!(evicted, vec![2], "block 1 (clean) and 2 (dirty) go first");
        assert!(!c.contains(1, 1) && c.contains(1, 0));
        assert_eq!(c.stats.evictions, 2);
        assert!(c.stats.peak_bytes <= c.stats.budget_bytes);
    }

    #[test]
    fn a_block_peeked_under_the_shared_lock_gets_a_second_chance() {
        let mut c = Cache::new(4096, 16 * 4096);
        for b in 0..16u32 {
            c.insert(1, b, IoBuf::zeroed(4096), false);
        }
        assert!(c.peek(1, 0).is_some() && c.peek(1, 1).is_some());
        assert!(c.peek(2, 0).is_none());
        c.shared_hits.add(2);
        c.make_room(3);
        // 0 and 1 (the oldest, but referenced) moved to the recent end; 2, 3, 4 went.
        assert!(c.contains(1, 0) && c.contains(1, 1));
        assert!(!c.contains(1, 2) && !c.contains(1, 3) && !c.contains(1, 4));
        assert!(c.contains(1, 5));
        assert_eq!(c.stats().hits, 2);
        // The second chance is used up: without a new reference, 0 and 1 age again (after
        // 5..=15, which were inserted before they moved).
        c.make_room(3 + 11);
        assert!(!c.contains(1, 15) && c.contains(1, 0) && c.contains(1, 1));
        c.make_room(3 + 12);
        assert!(!c.contains(1, 0) && c.contains(1, 1));
    }

    #[test]
    fn take_dirty_cleans_and_truncation_drops() {
        let mut c = Cache::new(4096, 64 * 4096);
        c.insert(7, 3, IoBuf::zeroed(4096), true);
        c.insert(7, 9, IoBuf::zeroed(4096), true);
        c.insert(8, 1, IoBuf::zeroed(4096), true);
        assert_eq!(c.take_dirty(Some(7)).len(), 2);
        c.remove_from(7, 5);
        assert!(c.contains(7, 3) && !c.contains(7, 9));
        assert_eq!(c.take_dirty(None).len(), 1);
        assert!(c.take_dirty(None).is_empty());
    }

    #[test]
    fn removed_blocks_wait_in_retired_up_to_its_bound() {
        let mut c = Cache::new(4096, 2 * RETIRED_MAX as u64 * 4096);
        let retired = c.retired();
        for b in 0..10 {
            c.insert(7, b, IoBuf::zeroed(4096), b % 2 == 0);
        }
        c.remove_from(7, 4);
        assert_eq!(c.stats().cached_bytes, 4 * 4096);
        let held = retired.take();
        assert_eq!(held.len(), 6);
        assert!(
            held.iter().all(|b| Arc::strong_count(b) == 1),
            "only Retired held them"
        );
        assert!(retired.take().is_empty());
        // Past the bound, a removal frees its buffers at once instead of holding more.
        for b in 0..RETIRED_MAX as u32 {
            c.insert(8, b, IoBuf::heap(4096, 4096), false);
        }
        c.remove_from(8, 0);
        assert_eq!(retired.0.count.load(Ordering::Acquire), RETIRED_MAX);
        c.insert(9, 0, IoBuf::zeroed(4096), false);
        c.remove_from(9, 0);
        assert_eq!(retired.take().len(), RETIRED_MAX);
        assert_eq!(
            c.stats().cached_bytes,
            4 * 4096,
            "file 7's first four blocks stay"
        );
        // A whole file's removal takes its dirty blocks out of the dirty set too.
        c.insert(10, 0, IoBuf::zeroed(4096), true);
        c.remove_from(7, 0);
        assert_eq!(retired.take().len(), 4);
        let dirty = c.take_dirty(None);
        assert!(
            dirty.len() == 1 && dirty[0].0 == 10,
            "dirty blocks left: {}",
            dirty.len()
        );
        assert!(!c.contains(7, 0) && c.contains(10, 0));
        assert_eq!(c.stats().cached_bytes, 4096);
    }
}
