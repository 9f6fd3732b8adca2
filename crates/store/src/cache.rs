//! The page cache: run pages (index, leaf, filter and footer pages) that lookups and walks read,
//! kept in CLOCK rings of at most `capacity` pages in all (the page-cache share of the memory
//! budget).
//!
//! Pages are keyed by the seg_seq of the segment they belong to and their page number: a slot
//! freed and reused gets a new seg_seq, so a page cached for the old run is never returned for
//! the new one; it only ages out. Cached pages are the bytes the device returned and are checked
//! by their reader every time, as a device read would be.
//!
//! A page is held as a shared [`Page`] (`Arc<[u8]>`): a hit hands out another reference, not a
//! copy. The cache is split into [`SHARDS`] rings by page key, each under its own lock, so
//! readers on many threads rarely wait for one another; the capacity is split between them.

use crate::format::PAGE_SIZE;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One page's bytes, shared by the cache and its readers.
pub(crate) type Page = Arc<[u8]>;

/// Rings the cache is split into (a power of two).
const SHARDS: usize = 16;

/// A multiplicative hash of the (seg_seq, page) keys: they are not chosen by anyone who could
/// aim collisions at the table, so SipHash's protection is not needed and its cost is.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type Key = (u64, u32);

fn shard_of(key: Key) -> usize {
    let h = (key.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(key.1))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 59) as usize % SHARDS
}

struct Entry {
    key: Key,
    page: Page,
    referenced: bool,
}

/// One CLOCK ring.
#[derive(Default)]
struct Ring {
    entries: Vec<Entry>,
    index: HashMap<Key, usize, BuildHasherDefault<KeyHasher>>,
    hand: usize,
    capacity: usize,
}

impl Ring {
    fn get(&mut self, key: Key) -> Option<Page> {
        let &i = self.index.get(&key)?;
        let e = &mut self.entries[i];
        e.referenced = true;
        Some(Arc::clone(&e.page))
    }

    /// Keeps `page`, evicting the first entry the clock hand finds not used since its last
    /// pass once the ring is full.
    fn insert(&mut self, key: Key, page: &Page) {
        if self.capacity == 0 || self.index.contains_key(&key) {
            return;
        }
        let entry = Entry {
            key,
            page: Arc::clone(page),
            referenced: false,
        };
        if self.entries.len() < self.capacity {
            self.index.insert(key, self.entries.len());
            self.entries.push(entry);
            return;
        }
        loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % self.entries.len();
            if std::mem::take(&mut self.entries[i].referenced) {
                continue;
            }
            self.index.remove(&self.entries[i].key);
            self.index.insert(key, i);
            self.entries[i] = entry;
            return;
        }
    }

    fn set_capacity(&mut self, pages: usize) {
        self.capacity = pages;
        if self.entries.len() > pages {
            for e in self.entries.drain(pages..) {
                self.index.remove(&e.key);
            }
            self.hand = 0;
        }
    }
}

pub(crate) struct PageCache {
    rings: Vec<Mutex<Ring>>,
    capacity: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Default for PageCache {
    fn default() -> Self {
        PageCache {
            rings: (0..SHARDS).map(|_| Mutex::default()).collect(),
            capacity: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

impl PageCache {
    fn ring(&self, key: Key) -> std::sync::MutexGuard<'_, Ring> {
        crate::store::lock(&self.rings[shard_of(key)])
    }

    /// The cached page `page` of segment `seg_seq` (shared, not copied), marked recently used.
    pub(crate) fn get(&self, seg_seq: u64, page: u32) -> Option<Page> {
        let found = self.ring((seg_seq, page)).get((seg_seq, page));
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Keeps `page` (another reference to it), evicting a page not used lately once its ring
    /// is full.
    pub(crate) fn insert(&self, seg_seq: u64, page: u32, bytes: &Page) {
        self.ring((seg_seq, page)).insert((seg_seq, page), bytes);
    }

    /// Sets the most pages kept in all, dropping pages beyond it.
    pub(crate) fn set_capacity(&self, pages: usize) {
        self.capacity.store(pages, Ordering::Relaxed);
        for (i, ring) in self.rings.iter().enumerate() {
            let share = pages / SHARDS + usize::from(i < pages % SHARDS);
            crate::store::lock(ring).set_capacity(share);
        }
    }

    /// Bytes of page data held.
    pub(crate) fn bytes(&self) -> usize {
        let pages: usize = self
            .rings
            .iter()
            .map(|r| crate::store::lock(r).entries.len())
            .sum();
        pages * PAGE_SIZE
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.capacity.load(Ordering::Relaxed) * PAGE_SIZE
    }

    /// Page reads answered by the cache, and those that were not, since open.
    pub(crate) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub(crate) fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(b: u8) -> Page {
        vec![b; 8].into()
    }

    fn held(c: &PageCache) -> usize {
        c.rings
            .iter()
            .map(|r| r.lock().unwrap().entries.len())
            .sum()
    }

    #[test]
    fn the_cache_never_holds_more_than_its_capacity_and_keeps_used_pages() {
        let c = PageCache::default();
        c.set_capacity(4 * SHARDS);
        for p in 0..4 {
            c.insert(1, p, &page(p as u8));
        }
        assert!(c.get(1, 0).is_some());
        for p in 4..400 {
            c.insert(1, p, &page(p as u8));
            assert!(held(&c) <= 4 * SHARDS);
            for r in &c.rings {
                let r = r.lock().unwrap();
                assert!(r.entries.len() <= r.capacity);
                assert_eq!(r.index.len(), r.entries.len());
            }
            // Page 0 is read between inserts, so the clock always passes it over.
            assert_eq!(c.get(1, 0).as_deref(), Some(&[0u8; 8][..]));
        }
        assert_eq!(
            c.get(2, 0),
            None,
            "another seg_seq's page 0 is another page"
        );
        assert!(c.hits() > 0 && c.misses() > 0);
        c.set_capacity(2);
        assert!(held(&c) <= 2);
        assert!(c.bytes() <= 2 * PAGE_SIZE);
        c.set_capacity(0);
        c.insert(1, 99, &page(1));
        assert_eq!(c.bytes(), 0);
    }

    #[test]
    fn a_hit_shares_the_cached_bytes() {
        let c = PageCache::default();
        c.set_capacity(SHARDS);
        let p = page(7);
        c.insert(3, 9, &p);
        let got = c.get(3, 9).expect("cached");
        assert!(Arc::ptr_eq(&got, &p));
    }
}
