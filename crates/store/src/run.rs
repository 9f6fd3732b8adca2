//! Sorted runs (format section 6): [`RunBuilder`] lays entries sorted by key (then LSN
//! descending) out as leaf, index, filter and footer pages, and values above the inline
//! threshold in the run's value area at the end of its segment; [`Run`] finds the newest version
//! of a key at or below an LSN and [`RunIter`] walks a key range forward or backward. Pages are
//! read through the caller's closure, so a run works the same on any segment storage; every page
//! read is checked, and a bad one is an error, never another key's data. The store writes runs
//! at memtable flush and compaction.

use crate::error::StoreError;
use crate::format::frame::ValuePointer;
use crate::format::page::{
    bloom_add, bloom_hash, bloom_may_contain, decode_filter, encode_filter, encode_index,
    encode_leaf, index_child, leaf_find, Footer, IndexEntry, LeafEntry, LeafFind, LeafReader,
    LeafValue, PagePlace, ENTRY_ROOM, FILTER_BYTES_PER_PAGE, MAX_PROBES,
};
use crate::format::{FormatError, SegRef, MAX_KEY, PAGE_SIZE};
use std::cmp::Reverse;
use std::sync::Arc;

/// Reads page `n` of the run's segment: its bytes, shared with the page cache that may hold
/// them (a cache hit is not copied).
pub type ReadPage<'a> = dyn FnMut(u32) -> Result<Arc<[u8]>, StoreError> + 'a;

/// Bloom probes that minimise false positives for `bits_per_key`: about `bits_per_key * ln 2`.
fn probes_for(bits_per_key: u32) -> u8 {
    ((f64::from(bits_per_key) * std::f64::consts::LN_2).round() as u32)
        .clamp(1, u32::from(MAX_PROBES)) as u8
}

/// A run's value area as [`RunBuilder::take_values`] hands it over.
pub struct ValueArea {
    /// The area's first page in the segment.
    pub first_page: u32,
    buffer: Vec<u8>,
    start: usize,
}

impl ValueArea {
    /// The bytes to write at `first_page` (empty when the run has no separated value).
    pub fn bytes(&self) -> &[u8] {
        &self.buffer[self.start..]
    }

    /// The buffer, for the next run's builder ([`RunBuilder::reusing`]).
    pub fn into_buffer(self) -> Vec<u8> {
        self.buffer
    }
}

/// Builds one run in memory, page by page.
pub struct RunBuilder {
    seg_seq: u64,
    slot: u64,
    segment_pages: u32,
    /// Byte offset of the lowest value in the value area (the segment size when it is empty):
    /// values are packed from the segment's end downward, and run pages must stay below it.
    value_low: u64,
    /// The segment's image for the value area: values are copied to their offsets as they are
    /// added; what lies below `value_low` is stale (a reused buffer) and never written.
    /// Empty until the first separated value.
    area: Vec<u8>,
    /// Bytes of the index entries of the finished leaves.
    index_bytes: usize,
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
        Self::for_segment(SegRef { slot: 0, seg_seq }, segment_pages)
    }

    /// A run for the segment `seg`: values placed with [`RunBuilder::add_separated`] get
    /// pointers naming it.
    pub fn for_segment(seg: SegRef, segment_pages: u32) -> Self {
        Self::reusing(seg, segment_pages, Vec::new())
    }

    /// Like [`RunBuilder::for_segment`], placing values in `area`, the buffer an earlier
    /// builder gave back ([`ValueArea::into_buffer`]): a merge writing many runs then
    /// allocates (and the kernel zeroes) one segment-sized buffer, not one per run.
    pub fn reusing(seg: SegRef, segment_pages: u32, area: Vec<u8>) -> Self {
        RunBuilder {
            seg_seq: seg.seg_seq,
            slot: seg.slot,
            segment_pages,
            value_low: u64::from(segment_pages) * PAGE_SIZE as u64,
            area,
            index_bytes: 0,
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

    /// Pages below the value area.
    fn page_room(&self) -> u32 {
        (self.value_low / PAGE_SIZE as u64) as u32
    }

    fn push_page(&mut self, page: &[u8; PAGE_SIZE]) -> Result<(), FormatError> {
        self.pages.extend_from_slice(page);
        if self.page_count() > self.page_room() {
            return Err(FormatError::TooLarge {
                what: "run",
                need: self.pages.len(),
                room: self.page_room() as usize * PAGE_SIZE,
            });
        }
        Ok(())
    }

    /// The first key added, if any.
    pub fn first_key(&self) -> Option<&[u8]> {
        self.smallest.as_deref()
    }

    /// Whether one more entry of `key_len` key bytes, holding `inline` value bytes in its leaf
    /// and `separated` bytes in the value area, surely fits in the segment with everything the
    /// run still has to write (index and filter pages at `bits_per_key`, footer). Generous:
    /// index pages are counted at half fill.
    pub fn fits(&self, key_len: usize, inline: usize, separated: usize, bits_per_key: u32) -> bool {
        let entry = 2 + 13 + key_len + inline;
        let leaves = (self.pages.len() / PAGE_SIZE)
            + if self.leaf_bytes + entry > ENTRY_ROOM {
                2
            } else {
                1
            };
        let last = self.last.as_ref().map_or(0, |(k, _)| k.len());
        // Level-1 index pages at half fill, and as many again for the levels above (each
        // index page holds at least three children, as keys are at most MAX_KEY).
        let level1 = (self.index_bytes + 16 + last + key_len).div_ceil(ENTRY_ROOM / 2);
        let index = if level1 <= 1 { 1 } else { 2 * level1 + 1 };
        debug_assert!(key_len <= MAX_KEY);
        let bits = ((self.hashes.len() + 1) as u64 * u64::from(bits_per_key.max(1))).max(64);
        let filter = (bits.div_ceil(8) as usize).div_ceil(FILTER_BYTES_PER_PAGE);
        let Some(low) = self.value_low.checked_sub(separated as u64) else {
            return false;
        };
        let room = (low / PAGE_SIZE as u64) as usize;
        let footer = 1;
        entry <= ENTRY_ROOM && leaves + index + filter + footer <= room
    }

    /// Adds the next entry with its value in the run's value area (a pointer in the leaf).
    pub fn add_separated(
        &mut self,
        key: Vec<u8>,
        lsn: u64,
        value: &[u8],
    ) -> Result<(), FormatError> {
        let crc = kura_engine::crc32c::crc32c(value);
        self.add_separated_with_crc(key, lsn, value, crc)
    }

    /// [`RunBuilder::add_separated`] for a value whose CRC32C the caller has: a merge copying
    /// a value it has just checked against its old pointer's CRC.
    pub fn add_separated_with_crc(
        &mut self,
        key: Vec<u8>,
        lsn: u64,
        value: &[u8],
        crc: u32,
    ) -> Result<(), FormatError> {
        let len = value.len() as u64;
        let low = self
            .value_low
            .checked_sub(len)
            .filter(|&low| low >= self.pages.len() as u64 + PAGE_SIZE as u64)
            .ok_or(FormatError::TooLarge {
                what: "run value area",
                need: value.len(),
                room: (self.value_low as usize).saturating_sub(self.pages.len() + PAGE_SIZE),
            })?;
        let pointer = ValuePointer {
            segment: SegRef {
                slot: self.slot,
                seg_seq: self.seg_seq,
            },
            offset: narrow_u32(low)?,
            len: narrow_u32(len)?,
            crc,
        };
        self.add(LeafEntry {
            key,
            lsn,
            value: LeafValue::Pointer(pointer),
        })?;
        let segment_bytes = self.segment_pages as usize * PAGE_SIZE;
        if self.area.len() != segment_bytes {
            // A zeroed allocation, not a resize: the allocator hands back fresh pages the
            // kernel zeroes as they are first touched, so a run that fills half its segment
            // (a memtable flush) neither zeroes nor faults in the other half. The resize wrote
            // all of it, and with the page faults that was about 40 % of a flush's time.
            self.area = vec![0u8; segment_bytes];
        }
        self.area[low as usize..(low + len) as usize].copy_from_slice(value);
        self.value_low = low;
        Ok(())
    }

    /// The value area to write: from its first page to the segment's end (empty when no value
    /// was separated). Taken before [`RunBuilder::finish`].
    pub fn take_values(&mut self) -> ValueArea {
        let first_page = self.page_room();
        let base = first_page as usize * PAGE_SIZE;
        let mut buffer = std::mem::take(&mut self.area);
        if buffer.is_empty() {
            return ValueArea {
                first_page,
                buffer,
                start: 0,
            };
        }
        // Below the lowest value, within its page: stale bytes of a reused buffer.
        buffer[base..self.value_low as usize].fill(0);
        ValueArea {
            first_page,
            buffer,
            start: base,
        }
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
        let child = IndexEntry {
            key: largest,
            child: self.page_count(),
        };
        self.index_bytes += child.page_bytes();
        self.children.push(child);
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

fn narrow_u32(v: u64) -> Result<u32, FormatError> {
    u32::try_from(v).map_err(|_| FormatError::TooLarge {
        what: "value offset",
        need: v as usize,
        room: u32::MAX as usize,
    })
}

/// Reads `len` bytes from byte `at` of the run's segment (a reader reads only the device
/// blocks holding them and copies out only them).
pub type ReadBytes<'a> = dyn FnMut(u64, usize) -> Result<Vec<u8>, StoreError> + 'a;

/// An open run: its footer and its bloom filter, the part of a run kept in memory.
#[derive(Clone)]
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

    /// Bytes this open run keeps in memory: its bloom filter and footer (with the smallest and
    /// largest keys).
    pub fn memory(&self) -> usize {
        self.bloom.len()
            + self.footer.smallest.len()
            + self.footer.largest.len()
            + std::mem::size_of::<Run>()
    }

    pub fn footer(&self) -> &Footer {
        &self.footer
    }

    /// The value a pointer of this run names, read from the value area of its segment (slot
    /// `slot`, `segment_bytes` long) and checked against the pointer's CRC.
    pub fn read_value(
        &self,
        slot: u64,
        segment_bytes: u64,
        pointer: &ValuePointer,
        read: &mut ReadBytes<'_>,
    ) -> Result<Vec<u8>, StoreError> {
        let start = self.value_offset(slot, segment_bytes, pointer)?;
        let value = read(start, pointer.len as usize)?;
        self.check_value(pointer, &value)?;
        Ok(value)
    }

    /// Where in the segment (slot `slot`, `segment_bytes` long) the value `pointer` names
    /// starts, after checking that it names this run's value area.
    pub fn value_offset(
        &self,
        slot: u64,
        segment_bytes: u64,
        pointer: &ValuePointer,
    ) -> Result<u64, StoreError> {
        let start = u64::from(pointer.offset);
        let end = start + u64::from(pointer.len);
        let below = u64::from(self.footer.total_pages) * PAGE_SIZE as u64;
        if pointer.segment
            != (SegRef {
                slot,
                seg_seq: self.seg_seq,
            })
            || start < below
            || end > segment_bytes
        {
            return Err(self.corrupt(self.footer.total_pages)(
                FormatError::BadField {
                    what: "value pointer outside its run's value area",
                    value: start,
                },
            ));
        }
        Ok(start)
    }

    /// Checks `value`, read where [`Run::value_offset`] says `pointer` points, against the
    /// pointer's CRC.
    pub fn check_value(&self, pointer: &ValuePointer, value: &[u8]) -> Result<(), StoreError> {
        let first = pointer.offset / PAGE_SIZE as u32;
        pointer
            .check(value)
            .map_err(self.corrupt(first))
            .map(|_| ())
    }

    /// The first leaf whose largest key is at or above `key` (where the versions of `key` would
    /// start), or `None` when every key of the run is below it.
    fn seek_leaf(&self, key: &[u8], read: &mut ReadPage<'_>) -> Result<Option<u32>, StoreError> {
        let mut page = self.footer.index_root;
        for _ in 0..self.footer.index_levels {
            let child =
                index_child(&read(page)?, self.place(page), key).map_err(self.corrupt(page))?;
            let Some(child) = child else {
                return Ok(None);
            };
            page = child;
        }
        Ok(Some(page))
    }

    /// The entries with `from <= key < to` (absent bounds are open), in key order (versions of
    /// a key newest first) or, with `reverse`, from the largest key down (versions oldest
    /// first), reading one leaf at a time.
    pub fn iter<'a>(
        &'a self,
        from: Option<Vec<u8>>,
        to: Option<Vec<u8>>,
        reverse: bool,
        read: Box<ReadPage<'a>>,
    ) -> RunIter<'a> {
        RunIter {
            run: self,
            read,
            from,
            to,
            reverse,
            page: None,
            leaf: None,
            rest: 0,
            last: None,
            done: false,
        }
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
        let Some(mut page) = self.seek_leaf(key, read)? else {
            return Ok(None);
        };
        // The versions of `key` start in this leaf and may go on in the following ones.
        while page < f.leaf_pages {
            match leaf_find(&read(page)?, self.place(page), key, max_lsn)
                .map_err(self.corrupt(page))?
            {
                LeafFind::Found(e) => return Ok(Some(e)),
                LeafFind::Absent => return Ok(None),
                LeafFind::Continue => page += 1,
            }
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

/// A walk over one run's entries in a key range; see [`Run::iter`].
pub struct RunIter<'a> {
    run: &'a Run,
    read: Box<ReadPage<'a>>,
    from: Option<Vec<u8>>,
    to: Option<Vec<u8>>,
    reverse: bool,
    /// The leaf being walked; `None` before the first.
    page: Option<u32>,
    leaf: Option<LeafReader>,
    /// Entries of `leaf` not yet visited: the next is `rest - 1` in reverse walks, else
    /// `len - rest`.
    rest: usize,
    /// The index in `leaf` of the entry visited last, whose key the next must follow.
    last: Option<usize>,
    done: bool,
}

impl RunIter<'_> {
    /// Loads the next leaf in the walk's direction; false at the end of the run.
    fn load(&mut self) -> Result<bool, StoreError> {
        let leaves = self.run.footer.leaf_pages;
        let next = match (self.page, self.reverse) {
            (None, false) => match &self.from {
                Some(from) => self.run.seek_leaf(from, &mut *self.read)?,
                None => Some(0),
            },
            (None, true) => match &self.to {
                Some(to) => Some(
                    self.run
                        .seek_leaf(to, &mut *self.read)?
                        .unwrap_or(leaves.saturating_sub(1)),
                ),
                None => Some(leaves.saturating_sub(1)),
            },
            (Some(p), false) => Some(p + 1).filter(|&p| p < leaves),
            (Some(p), true) => p.checked_sub(1),
        };
        let Some(page) = next else {
            return Ok(false);
        };
        if page >= leaves {
            return Err(self.run.corrupt(page)(FormatError::BadField {
                what: "index child outside the leaves",
                value: page.into(),
            }));
        }
        let leaf = LeafReader::new((self.read)(page)?, self.run.place(page))
            .map_err(self.run.corrupt(page))?;
        self.rest = leaf.len();
        self.leaf = Some(leaf);
        self.last = None;
        self.page = Some(page);
        Ok(true)
    }

    fn step(&mut self) -> Result<Option<LeafEntry>, StoreError> {
        loop {
            let Some(leaf) = self.leaf.as_ref().filter(|_| self.rest > 0) else {
                if !self.load()? {
                    return Ok(None);
                }
                continue;
            };
            let page = self.page.unwrap_or_default();
            let i = if self.reverse {
                self.rest - 1
            } else {
                leaf.len() - self.rest
            };
            self.rest -= 1;
            let (key, lsn) = leaf.key(i).map_err(self.run.corrupt(page))?;
            if let Some(prev) = self.last {
                let (prev_key, prev_lsn) = leaf.key(prev).map_err(self.run.corrupt(page))?;
                let (a, b) = if self.reverse {
                    ((key, Reverse(lsn)), (prev_key, Reverse(prev_lsn)))
                } else {
                    ((prev_key, Reverse(prev_lsn)), (key, Reverse(lsn)))
                };
                if a >= b {
                    return Err(self.run.corrupt(page)(FormatError::BadField {
                        what: "leaf entry order",
                        value: lsn,
                    }));
                }
            }
            self.last = Some(i);
            let below_from = self.from.as_deref().is_some_and(|f| key < f);
            let above_to = self.to.as_deref().is_some_and(|t| key >= t);
            match (self.reverse, below_from, above_to) {
                (false, true, _) | (true, _, true) => continue,
                (false, _, true) | (true, true, _) => return Ok(None),
                _ => return leaf.entry(i).map(Some).map_err(self.run.corrupt(page)),
            }
        }
    }
}

impl Iterator for RunIter<'_> {
    type Item = Result<LeafEntry, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.step().transpose();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}
