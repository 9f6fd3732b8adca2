//! The index below the memtable: runs by level, lookups and merged walks over the memtable and
//! the runs (newest version wins, a tombstone hides older values, a snapshot sees only versions
//! at or below its LSN), and writing sorted versions out as new runs (memtable flush and
//! compaction).
//!
//! Order within a level is lookup order: level 0 holds flushes newest first (the runs of one
//! flush in key order), every other level its runs in key order. Two neighbouring runs of one
//! output may share a boundary key, the first holding its newer versions; so a lookup takes the
//! first run, in that order, holding a version at or below the LSN sought.

use crate::cache::Page;
use crate::error::StoreError;
use crate::format::frame::ValuePointer;
use crate::format::manifest::RunMeta;
use crate::format::page::{LeafEntry, LeafValue};
use crate::format::{FormatError, SegRef};
use crate::memtable::Memtable;
use crate::reads::Dev;
use crate::run::{Run, RunBuilder};
use crate::space::Space;
use crate::store::lock;
use std::cmp::Reverse;
use std::iter::Peekable;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Levels of the tree (level 0 and seven sorted levels).
pub(crate) const MAX_LEVELS: usize = 8;
/// Bloom filter bits per key of every run.
pub(crate) const BITS_PER_KEY: u32 = 10;

/// One run: what the manifest records of it and its in-memory part.
pub(crate) struct RunHandle {
    pub(crate) meta: RunMeta,
    pub(crate) run: Run,
}

/// The runs, by level.
#[derive(Clone)]
pub(crate) struct Tree {
    pub(crate) levels: Vec<Vec<Arc<RunHandle>>>,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            levels: vec![Vec::new(); MAX_LEVELS],
        }
    }
}

/// Reads single pages of the run in segment `seg`, through the page cache (keeping the pages
/// it reads from the device there when `fill`).
fn page_reader(
    dev: Dev<'_>,
    seg: SegRef,
    fill: bool,
) -> impl FnMut(u32) -> Result<Page, StoreError> + '_ {
    move |page| dev.page(seg, page, fill)
}

fn corrupt_manifest(what: &'static str, value: u64) -> StoreError {
    StoreError::Corrupt {
        place: "manifest".into(),
        source: FormatError::BadField { what, value },
    }
}

impl Tree {
    /// Bytes the open runs keep in memory (bloom filters and footers).
    pub(crate) fn memory(&self) -> usize {
        self.runs().map(|h| h.run.memory()).sum()
    }

    /// Opens the runs the manifest lists (footers and bloom filters are read and checked).
    pub(crate) fn open(metas: Vec<RunMeta>, dev: Dev<'_>) -> Result<Tree, StoreError> {
        let mut tree = Tree::default();
        for meta in metas {
            let level = meta.level as usize;
            if level >= MAX_LEVELS {
                return Err(corrupt_manifest("run level", level as u64));
            }
            let run = Run::open(
                meta.run.seg_seq,
                meta.pages,
                &mut page_reader(dev, meta.run, false),
            )?;
            let f = run.footer();
            // The manifest's smallest key may lie above the run's first (see `live_from`).
            if f.entries != meta.entries
                || meta.smallest < f.smallest
                || meta.smallest > f.largest
                || f.largest != meta.largest
            {
                return Err(corrupt_manifest(
                    "run footer disagreeing with the manifest",
                    meta.run.slot,
                ));
            }
            tree.levels[level].push(Arc::new(RunHandle { meta, run }));
        }
        Ok(tree)
    }

    /// Every run's record, in lookup order level by level (what the manifest stores).
    pub(crate) fn metas(&self) -> Vec<RunMeta> {
        self.levels
            .iter()
            .flatten()
            .map(|h| h.meta.clone())
            .collect()
    }

    pub(crate) fn runs(&self) -> impl Iterator<Item = &Arc<RunHandle>> {
        self.levels.iter().flatten()
    }

    /// The newest version of `key` at or below `at` in the runs: `Some(None)` for a tombstone.
    pub(crate) fn get(
        &self,
        key: &[u8],
        at: u64,
        dev: Dev<'_>,
        segment_bytes: u64,
    ) -> Result<Option<Option<Vec<u8>>>, StoreError> {
        // Level 0's runs overlap: each is asked. A deeper level is in key order, so only the
        // runs from the first whose largest key is at or above `key` can hold it (more than
        // one when they share `key` as a boundary).
        let candidates = self.levels.iter().enumerate().flat_map(|(l, runs)| {
            let first = if l == 0 {
                0
            } else {
                runs.partition_point(|h| h.meta.largest.as_slice() < key)
            };
            runs[first..]
                .iter()
                .take_while(move |h| l == 0 || h.meta.smallest.as_slice() <= key)
        });
        for h in candidates {
            if key < h.meta.smallest.as_slice() || key > h.meta.largest.as_slice() {
                continue;
            }
            let found = h
                .run
                .get(key, at, &mut page_reader(dev, h.meta.run, true))?;
            if let Some(entry) = found {
                let value = match entry.value {
                    LeafValue::Inline(v) => Some(v),
                    LeafValue::Pointer(p) => Some(read_value(h, &p, dev, segment_bytes)?),
                    LeafValue::Tombstone => None,
                };
                return Ok(Some(value));
            }
        }
        Ok(None)
    }
}

/// The value a pointer of run `h` names.
pub(crate) fn read_value(
    h: &RunHandle,
    pointer: &ValuePointer,
    dev: Dev<'_>,
    segment_bytes: u64,
) -> Result<Vec<u8>, StoreError> {
    let slot = h.meta.run.slot;
    h.run
        .read_value(slot, segment_bytes, pointer, &mut |at, len| {
            dev.bytes(slot, at, len)
        })
}

/// A version's value as a merge sees it; separated values are read only when needed.
pub(crate) enum Val<'a> {
    Bytes(Vec<u8>),
    Pointer(&'a RunHandle, ValuePointer),
    Tombstone,
}

/// Bytes of a run's value area one merge read fetches: with block rounding the read stays
/// within the 256 KiB buffer a read queue keeps.
const VALUE_WINDOW: u64 = 248 << 10;

/// Windows held at most; past this many input runs a merge starts over (it reads again).
const MAX_WINDOWS: usize = 64;

/// The separated values a merge reads, one window of each input run's value area at a time.
/// A merge visits a run's keys in ascending order, and a run's values lie one below the
/// other from its segment's end down ([`RunBuilder::add_separated`]), so one read of up to
/// [`VALUE_WINDOW`] bytes ending at a value holds the values of the keys after it. Reading
/// each value on its own cost one device round trip per version and was most of a merge's
/// time. Every value is still checked against its pointer's CRC.
#[derive(Default)]
pub(crate) struct ValueWindows {
    /// (slot, seg_seq) -> the window's first byte within the segment and its bytes.
    windows: std::collections::HashMap<(u64, u64), (u64, Vec<u8>)>,
}

/// A version's value as [`ValueWindows::load`] hands it to an [`Output`].
pub(crate) enum Loaded<'w> {
    Tombstone,
    /// An inline value.
    Owned(Vec<u8>),
    /// A separated value inside a window, checked against this CRC.
    Window(&'w [u8], u32),
}

impl Loaded<'_> {
    /// The value's bytes (`None` for a tombstone) and its CRC32C when already known.
    pub(crate) fn parts(&self) -> (Option<&[u8]>, Option<u32>) {
        match self {
            Loaded::Tombstone => (None, None),
            Loaded::Owned(v) => (Some(v), None),
            Loaded::Window(v, crc) => (Some(v), Some(*crc)),
        }
    }
}

impl ValueWindows {
    /// A version's value through the windows, without copying a separated value out of its
    /// window.
    pub(crate) fn load<'w>(
        &'w mut self,
        val: Val<'_>,
        dev: Dev<'_>,
        segment_bytes: u64,
    ) -> Result<Loaded<'w>, StoreError> {
        let (h, p) = match val {
            Val::Pointer(h, p) => (h, p),
            Val::Bytes(v) => return Ok(Loaded::Owned(v)),
            Val::Tombstone => return Ok(Loaded::Tombstone),
        };
        let seg = h.meta.run;
        let at = h.run.value_offset(seg.slot, segment_bytes, &p)?;
        let len = p.len as usize;
        let end = at + len as u64;
        let key = (seg.slot, seg.seg_seq);
        let hit = self
            .windows
            .get(&key)
            .is_some_and(|(start, bytes)| at >= *start && end <= *start + bytes.len() as u64);
        if !hit {
            // `value_offset` has checked that the value lies within the segment; the window
            // may reach below the value area into the run's pages, which is harmless.
            let start = end.saturating_sub(VALUE_WINDOW.max(len as u64));
            let bytes = dev.bytes(seg.slot, start, (end - start) as usize)?;
            if self.windows.len() >= MAX_WINDOWS {
                self.windows.clear();
            }
            self.windows.insert(key, (start, bytes));
        }
        let (start, bytes) = &self.windows[&key];
        let from = (at - start) as usize;
        let value = &bytes[from..from + len];
        h.run.check_value(&p, value)?;
        Ok(Loaded::Window(value, p.crc))
    }
}

/// Separated values closer than this in one run are fetched by one read, the bytes between
/// them read and dropped.
const SCAN_READ_GAP: u64 = 4 << 10;

/// The values of a walk's entries (`None` for a tombstone), separated values fetched together:
/// the values of a run's neighbouring keys lie side by side in its value area, so the values
/// of one run that a scan meets are read in reads of up to [`VALUE_WINDOW`] bytes instead of
/// one device round trip each. Every value is checked against its pointer's CRC.
pub(crate) fn load_all(
    vals: Vec<Val<'_>>,
    dev: Dev<'_>,
    segment_bytes: u64,
) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(vals.len());
    // (slot, seg_seq, offset, index in `out`) of every separated value.
    let mut wanted = Vec::new();
    let mut pointers = Vec::new();
    for (i, val) in vals.into_iter().enumerate() {
        match val {
            Val::Bytes(v) => out.push(Some(v)),
            Val::Tombstone => out.push(None),
            Val::Pointer(h, p) => {
                let seg = h.meta.run;
                let at = h.run.value_offset(seg.slot, segment_bytes, &p)?;
                wanted.push((seg.slot, seg.seg_seq, at, i));
                pointers.push((h, p));
                out.push(None);
            }
        }
    }
    // Pointers in the order of `wanted` before sorting.
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_by_key(|&w| (wanted[w].0, wanted[w].1, wanted[w].2));
    let mut next = 0;
    while next < order.len() {
        let (slot, seq, start, _) = wanted[order[next]];
        let mut end = start + u64::from(pointers[order[next]].1.len);
        let mut last = next + 1;
        while let Some(&w) = order.get(last) {
            let (s, q, at, _) = wanted[w];
            let value_end = at + u64::from(pointers[w].1.len);
            if (s, q) != (slot, seq) || at > end + SCAN_READ_GAP || value_end - start > VALUE_WINDOW
            {
                break;
            }
            end = end.max(value_end);
            last += 1;
        }
        let bytes = dev.bytes(slot, start, (end - start) as usize)?;
        for &w in &order[next..last] {
            let (h, p) = &pointers[w];
            let from = (wanted[w].2 - start) as usize;
            let value = &bytes[from..from + p.len as usize];
            h.run.check_value(p, value)?;
            out[wanted[w].3] = Some(value.to_vec());
        }
        next = last;
    }
    Ok(out)
}

type Item<'a> = Result<(Vec<u8>, u64, Val<'a>), StoreError>;
type Source<'a> = Peekable<Box<dyn Iterator<Item = Item<'a>> + 'a>>;

/// The memtable's versions in a range, as a merge source.
pub(crate) fn mem_source<'a>(
    mem: &'a Memtable,
    from: Option<&'a [u8]>,
    to: Option<&'a [u8]>,
    reverse: bool,
) -> Source<'a> {
    let it = mem.range(from, to, reverse).flat_map(|(k, versions)| {
        versions.iter().rev().map(move |(lsn, v)| {
            Ok((
                k.clone(),
                *lsn,
                v.clone().map_or(Val::Tombstone, Val::Bytes),
            ))
        })
    });
    (Box::new(it) as Box<dyn Iterator<Item = Item<'a>> + 'a>).peekable()
}

/// Where a walk from `from` starts in run `h`: not below the run's live lower bound. A merge
/// that frees its inputs as it goes leaves the input it is inside of with a lower bound
/// (`RunMeta::smallest`) above the run's first key; the entries below it are superseded by
/// the merge's runs already installed.
fn live_from<'a>(h: &'a RunHandle, from: Option<&'a [u8]>) -> Option<&'a [u8]> {
    let live = h.meta.smallest.as_slice();
    if live <= h.run.footer().smallest.as_slice() {
        return from;
    }
    Some(from.map_or(live, |f| f.max(live)))
}

fn entry_item(h: &RunHandle, e: Result<LeafEntry, StoreError>) -> Item<'_> {
    let e = e?;
    let v = match e.value {
        LeafValue::Inline(v) => Val::Bytes(v),
        LeafValue::Pointer(p) => Val::Pointer(h, p),
        LeafValue::Tombstone => Val::Tombstone,
    };
    Ok((e.key, e.lsn, v))
}

/// The entries of consecutive runs (one level, or one run) in a range, as one merge source.
pub(crate) fn runs_source<'a>(
    runs: &'a [Arc<RunHandle>],
    from: Option<&'a [u8]>,
    to: Option<&'a [u8]>,
    reverse: bool,
    dev: Dev<'a>,
    fill: bool,
) -> Source<'a> {
    let overlapping = runs.iter().filter(move |h| {
        from.is_none_or(|f| h.meta.largest.as_slice() >= f)
            && to.is_none_or(|t| h.meta.smallest.as_slice() < t)
    });
    let each = move |h: &'a Arc<RunHandle>| {
        let read: Box<crate::run::ReadPage<'a>> = Box::new(page_reader(dev, h.meta.run, fill));
        let h: &'a RunHandle = h;
        h.run
            .iter(
                live_from(h, from).map(<[u8]>::to_vec),
                to.map(<[u8]>::to_vec),
                reverse,
                read,
            )
            .map(move |e| entry_item(h, e))
    };
    let it: Box<dyn Iterator<Item = Item<'a>> + 'a> = if reverse {
        Box::new(overlapping.rev().flat_map(each))
    } else {
        Box::new(overlapping.flat_map(each))
    };
    it.peekable()
}

/// The sources of a walk over the memtables `mems` (newest first) and every run of `tree`
/// (pages read from the device kept in the page cache when `fill`).
pub(crate) fn sources<'a>(
    mems: &[&'a Memtable],
    tree: &'a Tree,
    from: Option<&'a [u8]>,
    to: Option<&'a [u8]>,
    reverse: bool,
    dev: Dev<'a>,
    fill: bool,
) -> Vec<Source<'a>> {
    let mut out = Vec::new();
    for mem in mems {
        out.push(mem_source(mem, from, to, reverse));
    }
    for h in &tree.levels[0] {
        out.push(runs_source(
            std::slice::from_ref(h),
            from,
            to,
            reverse,
            dev,
            fill,
        ));
    }
    for level in &tree.levels[1..] {
        if !level.is_empty() {
            out.push(runs_source(level, from, to, reverse, dev, fill));
        }
    }
    out
}

/// `range` of a level's runs widened until no run outside it shares a boundary key with one
/// inside: the versions of one key may span neighbouring runs, and they must move together.
pub(crate) fn widen(level: &[Arc<RunHandle>], range: Range<usize>) -> Range<usize> {
    let (mut i, mut j) = (range.start, range.end);
    if i >= j {
        return range;
    }
    while i > 0 && level[i - 1].meta.largest == level[i].meta.smallest {
        i -= 1;
    }
    while j < level.len() && level[j - 1].meta.largest == level[j].meta.smallest {
        j += 1;
    }
    i..j
}

/// The runs of a sorted level whose keys meet `[lo, hi]`, widened (see [`widen`]); when none
/// do, the empty range where runs of that key range would go.
pub(crate) fn overlapping(level: &[Arc<RunHandle>], lo: &[u8], hi: &[u8]) -> Range<usize> {
    let i = level.partition_point(|h| h.meta.largest.as_slice() < lo);
    let j = level.partition_point(|h| h.meta.smallest.as_slice() <= hi);
    if i >= j {
        return i..i;
    }
    widen(level, i..j)
}

/// Merges sources key by key.
pub(crate) struct Merge<'a> {
    sources: Vec<Source<'a>>,
    /// Each source's next entry, taken out of it: keys are compared where they lie, and the
    /// key of the first source holding the next key is the one returned, so a key is never
    /// copied (a merge or a scan meets every key once).
    heads: Vec<Option<Head<'a>>>,
    started: bool,
    reverse: bool,
}

type Head<'a> = (Vec<u8>, u64, Val<'a>);

/// One key and its versions from every source, newest first.
pub(crate) type Versions<'a> = (Vec<u8>, Vec<(u64, Val<'a>)>);

impl<'a> Merge<'a> {
    pub(crate) fn new(sources: Vec<Source<'a>>, reverse: bool) -> Self {
        let heads = sources.iter().map(|_| None).collect();
        Merge {
            sources,
            heads,
            started: false,
            reverse,
        }
    }

    fn pull(&mut self, i: usize) -> Result<(), StoreError> {
        self.heads[i] = self.sources[i].next().transpose()?;
        Ok(())
    }

    /// The next key in the walk's direction with all its versions.
    pub(crate) fn next_key(&mut self) -> Result<Option<Versions<'a>>, StoreError> {
        if !self.started {
            for i in 0..self.sources.len() {
                self.pull(i)?;
            }
            self.started = true;
        }
        let mut best: Option<usize> = None;
        for (i, head) in self.heads.iter().enumerate() {
            let Some((k, _, _)) = head else {
                continue;
            };
            let better = match best.and_then(|b| self.heads[b].as_ref()) {
                None => true,
                Some((b, _, _)) => {
                    if self.reverse {
                        k > b
                    } else {
                        k < b
                    }
                }
            };
            if better {
                best = Some(i);
            }
        }
        let Some(first) = best else {
            return Ok(None);
        };
        let Some((key, lsn, value)) = self.heads[first].take() else {
            return Ok(None);
        };
        let mut versions = vec![(lsn, value)];
        self.pull(first)?;
        // Sources before `first` hold keys past this one: it is the first holding it.
        for i in first..self.heads.len() {
            while matches!(&self.heads[i], Some((k, _, _)) if *k == key) {
                if let Some((_, lsn, value)) = self.heads[i].take() {
                    versions.push((lsn, value));
                }
                self.pull(i)?;
            }
        }
        if versions.len() > 1 {
            versions.sort_by_key(|(lsn, _)| Reverse(*lsn));
            versions.dedup_by_key(|(lsn, _)| *lsn);
        }
        Ok(Some((key, versions)))
    }
}

/// The versions a compaction keeps: the newest, and for each live snapshot the newest at or
/// below it; at the last level, tombstones with nothing older kept below them go too.
pub(crate) fn retain<'a>(
    versions: Vec<(u64, Val<'a>)>,
    snapshots: &[u64],
    bottom: bool,
) -> Vec<(u64, Val<'a>)> {
    let mut keep = vec![false; versions.len()];
    if let Some(first) = keep.first_mut() {
        *first = true;
    }
    for &s in snapshots {
        if let Some(i) = versions.iter().position(|(lsn, _)| *lsn <= s) {
            keep[i] = true;
        }
    }
    let mut out: Vec<_> = versions
        .into_iter()
        .zip(keep)
        .filter_map(|(v, k)| k.then_some(v))
        .collect();
    if bottom {
        while matches!(out.last(), Some((_, Val::Tombstone))) {
            out.pop();
        }
    }
    out
}

/// Writes sorted versions as runs of one level, cutting a new run when a segment is full.
pub(crate) struct Output<'a> {
    space: &'a Mutex<Space>,
    dev: Dev<'a>,
    level: u8,
    segment_pages: u32,
    inline_threshold: usize,
    current: Option<(SegRef, RunBuilder)>,
    /// The value-area buffer of the last finished run, for the next.
    spare_area: Vec<u8>,
    done: Vec<RunHandle>,
    allocated: Vec<SegRef>,
    /// Device bytes written so far.
    pub(crate) written: u64,
}

impl<'a> Output<'a> {
    pub(crate) fn new(
        dev: Dev<'a>,
        level: u8,
        segment_pages: u32,
        inline_threshold: usize,
    ) -> Self {
        Output {
            space: dev.space,
            dev,
            level,
            segment_pages,
            inline_threshold,
            current: None,
            spare_area: Vec::new(),
            done: Vec::new(),
            allocated: Vec::new(),
            written: 0,
        }
    }

    /// Adds the next version (keys ascending, LSNs descending within a key): `value` `None`
    /// for a tombstone, with the value's CRC32C when the caller has it.
    pub(crate) fn add(
        &mut self,
        key: &[u8],
        lsn: u64,
        value: Option<&[u8]>,
        crc: Option<u32>,
    ) -> Result<(), StoreError> {
        let (inline, separated) = match value {
            None => (0, 0),
            Some(v) if v.len() <= self.inline_threshold => (v.len(), 0),
            Some(v) => (ValuePointer::ENCODED_LEN, v.len()),
        };
        let full = self
            .current
            .as_ref()
            .is_some_and(|(_, b)| !b.fits(key.len(), inline, separated, BITS_PER_KEY));
        if full {
            self.finish_current()?;
        }
        let builder = match &mut self.current {
            Some((_, b)) => b,
            None => {
                let seg = lock(self.space).allocate()?;
                self.allocated.push(seg);
                let area = std::mem::take(&mut self.spare_area);
                let b = RunBuilder::reusing(seg, self.segment_pages, area);
                if !b.fits(key.len(), inline, separated, BITS_PER_KEY) {
                    return Err(StoreError::Refused(FormatError::TooLarge {
                        what: "version in an empty run",
                        need: separated + inline + key.len(),
                        room: self.segment_pages as usize * crate::format::PAGE_SIZE,
                    }));
                }
                &mut self.current.insert((seg, b)).1
            }
        };
        let added = match value {
            Some(v) if separated > 0 => match crc {
                Some(crc) => builder.add_separated_with_crc(key.to_vec(), lsn, v, crc),
                None => builder.add_separated(key.to_vec(), lsn, v),
            },
            value => builder.add(LeafEntry {
                key: key.to_vec(),
                lsn,
                value: value.map_or(LeafValue::Tombstone, |v| LeafValue::Inline(v.to_vec())),
            }),
        };
        added.map_err(StoreError::Refused)
    }

    fn finish_current(&mut self) -> Result<(), StoreError> {
        let Some((seg, mut b)) = self.current.take() else {
            return Ok(());
        };
        let area = b.take_values();
        let (pages, footer) = b.finish(BITS_PER_KEY).map_err(StoreError::Refused)?;
        self.dev.write(seg.slot, 0, &pages)?;
        if !area.bytes().is_empty() {
            self.dev.write(seg.slot, area.first_page, area.bytes())?;
        }
        self.written += (pages.len() + area.bytes().len()) as u64;
        self.spare_area = area.into_buffer();
        let run = Run::open(
            seg.seg_seq,
            footer.total_pages,
            &mut page_reader(self.dev, seg, false),
        )?;
        let meta = RunMeta {
            level: self.level,
            run: seg,
            pages: footer.total_pages,
            entries: footer.entries,
            min_lsn: footer.min_lsn,
            max_lsn: footer.max_lsn,
            smallest: footer.smallest,
            largest: footer.largest,
        };
        self.done.push(RunHandle { meta, run });
        Ok(())
    }

    /// When runs were finished since the last [`Output::take_finished`]: the first key of the
    /// run being written. Every version of every key below it is in the finished runs.
    pub(crate) fn finished_below(&self) -> Option<&[u8]> {
        if self.done.is_empty() {
            return None;
        }
        self.current.as_ref().and_then(|(_, b)| b.first_key())
    }

    /// Runs finished and not taken yet.
    pub(crate) fn finished_runs(&self) -> usize {
        self.done.len()
    }

    /// The runs finished so far (a run is finished when the next version did not fit it),
    /// made durable and no longer this output's to give back: the caller names them in the
    /// manifest.
    pub(crate) fn take_finished(&mut self) -> Result<Vec<RunHandle>, StoreError> {
        if self.done.is_empty() {
            return Ok(Vec::new());
        }
        lock(self.space).segs.flush()?;
        let done = std::mem::take(&mut self.done);
        self.allocated
            .retain(|seg| !done.iter().any(|h| h.meta.run.slot == seg.slot));
        Ok(done)
    }

    /// The runs written, made durable (empty when nothing was added).
    pub(crate) fn finish(mut self) -> Result<(Vec<RunHandle>, u64), StoreError> {
        let result = self.finish_current().and_then(|()| {
            if self.done.is_empty() {
                Ok(())
            } else {
                lock(self.space).segs.flush()
            }
        });
        result?;
        self.allocated.clear();
        Ok((std::mem::take(&mut self.done), self.written))
    }
}

impl Drop for Output<'_> {
    /// An output dropped before [`Output::finish`] succeeded gives back every segment it
    /// took: nothing durable names them.
    fn drop(&mut self) {
        if self.allocated.is_empty() {
            return;
        }
        let mut space = lock(self.space);
        for seg in self.allocated.drain(..) {
            space.free(seg.slot);
        }
    }
}
