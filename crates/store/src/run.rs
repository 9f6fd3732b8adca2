//! Sorted runs (format section 6): [`RunBuilder`] lays entries sorted by key (then LSN
//! descending) out as leaf, index, filter and footer pages; [`Run`] finds the newest version of
//! a key at or below an LSN. Pages are read through the caller's closure, so a run works the
//! same on any segment storage; every page read is checked, and a bad one is an error, never
//! another key's data. Not yet used by the store (plan step 3 wires it in: memtable flush and
//! lookups below the memtable).

use crate::error::StoreError;
use crate::format::page::{
    bloom_add, bloom_hash, bloom_may_contain, decode_filter, decode_index, decode_leaf,
    encode_filter, encode_index, encode_leaf, Footer, IndexEntry, LeafEntry, PagePlace, ENTRY_ROOM,
    FILTER_BYTES_PER_PAGE, MAX_PROBES,
};
use crate::format::{FormatError, PAGE_SIZE};
use std::cmp::Reverse;

/// Reads page `n` of the run's segment.
pub type ReadPage<'a> = dyn FnMut(u32) -> Result<Vec<u8>, StoreError> + 'a;

/// Bloom probes that minimise false positives for `bits_per_key`: about `bits_per_key * ln 2`.
fn probes_for(bits_per_key: u32) -> u8 {
    ((f64::from(bits_per_key) * std::f64::consts::LN_2).round() as u32)
        .clamp(1, u32::from(MAX_PROBES)) as u8
}

/// Builds one run in memory, page by page.
pub struct RunBuilder {
    seg_seq: u64,
    segment_pages: u32,
    pages: Vec<u8>,
    leaf: Vec<LeafEntry>,
    leaf_bytes: usize,
    /// The largest key of each finished leaf, and its page.
    children: Vec<IndexEntry>,
    /// One bloom hash per distinct key.
    hashes: Vec<u32>,
    entries: u64,
    min_lsn: u64,
    max_lsn: u64,
    smallest: Option<Vec<u8>>,
    last: Option<(Vec<u8>, u64)>,
}

impl RunBuilder {
    /// A run for the segment allocated as `seg_seq`, which holds `segment_pages` pages.
    pub fn new(seg_seq: u64, segment_pages: u32) -> Self {
        RunBuilder {
            seg_seq,
            segment_pages,
            pages: Vec::new(),
            leaf: Vec::new(),
            leaf_bytes: 0,
            children: Vec::new(),
            hashes: Vec::new(),
            entries: 0,
            min_lsn: u64::MAX,
            max_lsn: 0,
            smallest: None,
            last: None,
        }
    }

    fn page_count(&self) -> u32 {
        (self.pages.len() / PAGE_SIZE) as u32
    }

    fn place(&self) -> PagePlace {
        PagePlace {
            seg_seq: self.seg_seq,
            page: self.page_count(),
        }
    }

    fn push_page(&mut self, page: &[u8; PAGE_SIZE]) -> Result<(), FormatError> {
        self.pages.extend_from_slice(page);
        if self.page_count() > self.segment_pages {
            return Err(FormatError::TooLarge {
                what: "run",
                need: self.pages.len(),
                room: self.segment_pages as usize * PAGE_SIZE,
            });
        }
        Ok(())
    }

    /// Adds the next entry; entries must come sorted by key, then by LSN descending.
    pub fn add(&mut self, entry: LeafEntry) -> Result<(), FormatError> {
        if let Some((key, lsn)) = &self.last {
            if (key.as_slice(), Reverse(*lsn)) >= (entry.key.as_slice(), Reverse(entry.lsn)) {
                return Err(FormatError::BadField {
                    what: "run entry order",
                    value: entry.lsn,
                });
            }
        }
        if entry.page_bytes() > ENTRY_ROOM {
            return Err(FormatError::TooLarge {
                what: "run entry",
                need: entry.page_bytes(),
                room: ENTRY_ROOM,
            });
        }
        if self.leaf_bytes + entry.page_bytes() > ENTRY_ROOM {
            self.finish_leaf()?;
        }
        if self.last.as_ref().is_none_or(|(key, _)| *key != entry.key) {
            self.hashes.push(bloom_hash(&entry.key));
        }
        self.entries += 1;
        self.min_lsn = self.min_lsn.min(entry.lsn);
        self.max_lsn = self.max_lsn.max(entry.lsn);
        if self.smallest.is_none() {
            self.smallest = Some(entry.key.clone());
        }
        self.last = Some((entry.key.clone(), entry.lsn));
        self.leaf_bytes += entry.page_bytes();
        self.leaf.push(entry);
        Ok(())
    }

    fn finish_leaf(&mut self) -> Result<(), FormatError> {
        let Some(largest) = self.leaf.last().map(|e| e.key.clone()) else {
            return Ok(());
        };
        let page = encode_leaf(self.place(), &self.leaf)?;
        self.children.push(IndexEntry {
            key: largest,
            child: self.page_count(),
        });
        self.push_page(&page)?;
        self.leaf.clear();
        self.leaf_bytes = 0;
        Ok(())
    }

    /// Writes one index page over `group` and returns its entry for the level above.
    fn index_page(&mut self, group: &[IndexEntry]) -> Result<IndexEntry, FormatError> {
        let page = encode_index(self.place(), group)?;
        let entry = IndexEntry {
            key: group.last().map(|e| e.key.clone()).unwrap_or_default(),
            child: self.page_count(),
        };
        self.push_page(&page)?;
        Ok(entry)
    }

    /// The run's pages (to be written from page 0 of its segment) and its footer, with a bloom
    /// filter of `bits_per_key` bits per distinct key. An empty run is refused.
    pub fn finish(mut self, bits_per_key: u32) -> Result<(Vec<u8>, Footer), FormatError> {
        self.finish_leaf()?;
        let (Some(smallest), Some((largest, _))) = (self.smallest.take(), self.last.take()) else {
            return Err(FormatError::BadField {
                what: "run without entries",
                value: 0,
            });
        };
        let leaf_pages = self.page_count();
        let mut level = std::mem::take(&mut self.children);
        let mut levels = 0u8;
        let root = loop {
            levels += 1;
            let mut above = Vec::new();
            let mut group: Vec<IndexEntry> = Vec::new();
            let mut bytes = 0;
            for entry in level {
                if bytes + entry.page_bytes() > ENTRY_ROOM {
                    above.push(self.index_page(&group)?);
                    group.clear();
                    bytes = 0;
                }
                bytes += entry.page_bytes();
                group.push(entry);
            }
            above.push(self.index_page(&group)?);
            if let [root] = above.as_slice() {
                break root.child;
            }
            level = above;
        };
        let m = (self.hashes.len() as u64 * u64::from(bits_per_key.max(1)))
            .clamp(64, u64::from(u32::MAX)) as u32;
        let k = probes_for(bits_per_key);
        let mut bits = vec![0u8; (m as usize).div_ceil(8)];
        for &h in &self.hashes {
            bloom_add(&mut bits, m, k, h);
        }
        let filter_first = self.page_count();
        for chunk in bits.chunks(FILTER_BYTES_PER_PAGE) {
            let page = encode_filter(self.place(), chunk)?;
            self.push_page(&page)?;
        }
        let footer = Footer {
            entries: self.entries,
            leaf_pages,
            index_root: root,
            index_levels: levels,
            bloom_probes: k,
            filter_first,
            filter_pages: self.page_count() - filter_first,
            filter_bits: u64::from(m),
            min_lsn: self.min_lsn,
            max_lsn: self.max_lsn,
            total_pages: self.page_count() + 1,
            smallest,
            largest,
        };
        let page = footer.encode(self.seg_seq)?;
        self.push_page(&page)?;
        Ok((self.pages, footer))
    }
}

/// An open run: its footer and its bloom filter, the part of a run kept in memory.
pub struct Run {
    seg_seq: u64,
    footer: Footer,
    bloom: Vec<u8>,
}

impl Run {
    fn corrupt(&self, page: u32) -> impl Fn(FormatError) -> StoreError + '_ {
        move |source| StoreError::Corrupt {
            place: format!("run segment {} page {page}", self.seg_seq),
            source,
        }
    }

    fn place(&self, page: u32) -> PagePlace {
        PagePlace {
            seg_seq: self.seg_seq,
            page,
        }
    }

    /// Opens the run of `pages` pages in the segment allocated as `seg_seq`: reads and checks
    /// its footer and filter pages.
    pub fn open(seg_seq: u64, pages: u32, read: &mut ReadPage<'_>) -> Result<Run, StoreError> {
        let mut run = Run {
            seg_seq,
            footer: Footer {
                entries: 0,
                leaf_pages: 0,
                index_root: 0,
                index_levels: 0,
                bloom_probes: 0,
                filter_first: 0,
                filter_pages: 0,
                filter_bits: 0,
                min_lsn: 0,
                max_lsn: 0,
                total_pages: 0,
                smallest: Vec::new(),
                largest: Vec::new(),
            },
            bloom: Vec::new(),
        };
        let last = pages.checked_sub(1).ok_or_else(|| {
            run.corrupt(0)(FormatError::BadField {
                what: "run page count",
                value: 0,
            })
        })?;
        run.footer = Footer::decode(&read(last)?, run.place(last)).map_err(run.corrupt(last))?;
        let mut bloom =
            Vec::with_capacity(run.footer.filter_pages as usize * FILTER_BYTES_PER_PAGE);
        for p in run.footer.filter_first..run.footer.filter_first + run.footer.filter_pages {
            let page = read(p)?;
            bloom.extend_from_slice(decode_filter(&page, run.place(p)).map_err(run.corrupt(p))?);
        }
        bloom.truncate((run.footer.filter_bits as usize).div_ceil(8));
        run.bloom = bloom;
        Ok(run)
    }

    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    /// The newest version of `key` with an LSN at or below `max_lsn` (a tombstone is a
    /// version), or `None`.
    pub fn get(
        &self,
        key: &[u8],
        max_lsn: u64,
        read: &mut ReadPage<'_>,
    ) -> Result<Option<LeafEntry>, StoreError> {
        let f = &self.footer;
        if key < f.smallest.as_slice()
            || key > f.largest.as_slice()
            || !bloom_may_contain(
                &self.bloom,
                f.filter_bits as u32,
                f.bloom_probes,
                bloom_hash(key),
            )
        {
            return Ok(None);
        }
        let mut page = f.index_root;
        for _ in 0..f.index_levels {
            let entries =
                decode_index(&read(page)?, self.place(page)).map_err(self.corrupt(page))?;
            let i = entries.partition_point(|e| e.key.as_slice() < key);
            let Some(entry) = entries.get(i) else {
                return Ok(None);
            };
            page = entry.child;
        }
        // The versions of `key` start in this leaf and may go on in the following ones.
        while page < f.leaf_pages {
            let entries =
                decode_leaf(&read(page)?, self.place(page)).map_err(self.corrupt(page))?;
            let start = entries.partition_point(|e| e.key.as_slice() < key);
            for e in entries.into_iter().skip(start) {
                if e.key != key {
                    return Ok(None);
                }
                if e.lsn <= max_lsn {
                    return Ok(Some(e));
                }
            }
            page += 1;
        }
        if page == f.leaf_pages {
            return Ok(None);
        }
        Err(self.corrupt(page)(FormatError::BadField {
            what: "index child outside the leaves",
            value: page.into(),
        }))
    }
}
