//! The page cache: run pages (index, leaf, filter and footer pages) that lookups and walks read,
//! kept in a CLOCK ring of at most `capacity` pages (the page-cache share of the memory budget).
//!
//! Pages are keyed by the seg_seq of the segment they belong to and their page number: a slot
//! freed and reused gets a new seg_seq, so a page cached for the old run is never returned for
//! the new one; it only ages out. Cached pages are the bytes the device returned and are checked
//! by their reader every time, as a device read would be.

use crate::format::PAGE_SIZE;
use std::collections::HashMap;

struct Entry {
    key: (u64, u32),
    page: Vec<u8>,
    referenced: bool,
}

#[derive(Default)]
pub(crate) struct PageCache {
    entries: Vec<Entry>,
    index: HashMap<(u64, u32), usize>,
    hand: usize,
    capacity: usize,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl PageCache {
    /// A copy of the cached page `page` of segment `seg_seq`, marked recently used.
    pub(crate) fn get(&mut self, seg_seq: u64, page: u32) -> Option<Vec<u8>> {
        match self.index.get(&(seg_seq, page)) {
            Some(&i) => {
                self.hits += 1;
                let e = &mut self.entries[i];
                e.referenced = true;
                Some(e.page.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Keeps `page`, evicting the first entry the clock hand finds not used since its last
    /// pass once the cache is full.
    pub(crate) fn insert(&mut self, seg_seq: u64, page: u32, bytes: &[u8]) {
        let key = (seg_seq, page);
        if self.capacity == 0 || self.index.contains_key(&key) {
            return;
        }
        let entry = Entry {
            key,
            page: bytes.to_vec(),
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

    /// Sets the most pages kept, dropping pages beyond it.
    pub(crate) fn set_capacity(&mut self, pages: usize) {
        self.capacity = pages;
        if self.entries.len() > pages {
            for e in self.entries.drain(pages..) {
                self.index.remove(&e.key);
            }
            self.hand = 0;
        }
    }

    /// Bytes of page data held.
    pub(crate) fn bytes(&self) -> usize {
        self.entries.len() * PAGE_SIZE
    }

    pub(crate) fn capacity_bytes(&self) -> usize {
        self.capacity * PAGE_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_never_holds_more_than_its_capacity_and_keeps_used_pages() {
        let mut c = PageCache::default();
        c.set_capacity(4);
        for p in 0..4 {
            c.insert(1, p, &[p as u8; 8]);
        }
        assert!(c.get(1, 0).is_some());
        for p in 4..40 {
            c.insert(1, p, &[p as u8; 8]);
            assert!(c.entries.len() <= 4);
            assert_eq!(c.index.len(), c.entries.len());
            // Page 0 is read between inserts, so the clock always passes it over.
            assert_eq!(c.get(1, 0), Some(vec![0; 8]));
        }
        assert_eq!(
            c.get(2, 0),
            None,
            "another seg_seq's page 0 is another page"
        );
        c.set_capacity(2);
        assert_eq!(c.bytes(), 2 * PAGE_SIZE);
        assert_eq!(c.index.len(), 2);
        c.set_capacity(0);
        c.insert(1, 99, &[1]);
        assert_eq!(c.bytes(), 0);
    }
}
