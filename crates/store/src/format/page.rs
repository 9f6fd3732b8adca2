//! Run pages (format section 6): leaf, index, filter and footer pages, each one checksummed
//! 4 KiB page stamped with its segment's seg_seq and its page number, and the bloom filter
//! probes the filter pages serve.

use super::frame::ValuePointer;
use super::{check_crc, narrow, seal_crc, FormatError, Reader, MAX_KEY, PAGE_SIZE};
use kura_engine::crc32c::crc32c;

const CRC_AT: usize = 0;
/// Bytes of the common page header; bodies start here.
pub const PAGE_HEADER: usize = 24;
/// Bytes of filter bits one filter page holds.
pub const FILTER_BYTES_PER_PAGE: usize = PAGE_SIZE - PAGE_HEADER;
/// Largest bloom probe count.
pub const MAX_PROBES: u8 = 30;

/// What a run page holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    Leaf = 1,
    Index = 2,
    Filter = 3,
    Footer = 4,
}

/// Where a page was read from, which its header must name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagePlace {
    pub seg_seq: u64,
    pub page: u32,
}

/// The value part of a leaf entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafValue {
    Inline(Vec<u8>),
    Pointer(ValuePointer),
    Tombstone,
}

/// One version of one key in a leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafEntry {
    pub key: Vec<u8>,
    pub lsn: u64,
    pub value: LeafValue,
}

impl LeafEntry {
    /// Bytes the entry takes in a leaf, its offset slot included.
    pub fn page_bytes(&self) -> usize {
        let value = match &self.value {
            LeafValue::Inline(v) => v.len(),
            LeafValue::Pointer(_) => ValuePointer::ENCODED_LEN,
            LeafValue::Tombstone => 0,
        };
        2 + 13 + self.key.len() + value
    }
}

/// One child of an index page: the largest key of the child page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub key: Vec<u8>,
    pub child: u32,
}

impl IndexEntry {
    /// Bytes the entry takes in an index page, its offset slot included.
    pub fn page_bytes(&self) -> usize {
        2 + 6 + self.key.len()
    }
}

/// Entry bytes one leaf or index page can hold, offset slots included.
pub const ENTRY_ROOM: usize = PAGE_SIZE - PAGE_HEADER;

fn header(kind: PageKind, count: u16, place: PagePlace, end: u16) -> [u8; PAGE_SIZE] {
    let mut page = [0u8; PAGE_SIZE];
    page[4] = kind as u8;
    page[6..8].copy_from_slice(&count.to_le_bytes());
    page[8..16].copy_from_slice(&place.seg_seq.to_le_bytes());
    page[16..20].copy_from_slice(&place.page.to_le_bytes());
    page[20..22].copy_from_slice(&end.to_le_bytes());
    page
}

/// Checks CRC, kind and place; returns the entry count and the end of the entry area.
fn check_header(page: &[u8], kind: PageKind, place: PagePlace) -> Result<(u16, u16), FormatError> {
    const WHAT: &str = "run page";
    if page.len() != PAGE_SIZE {
        return Err(FormatError::Truncated {
            what: WHAT,
            need: PAGE_SIZE,
            have: page.len(),
        });
    }
    check_crc(WHAT, page, CRC_AT)?;
    let mut r = Reader::new(WHAT, page);
    r.u32()?;
    let found = r.u8()?;
    if found != kind as u8 {
        return Err(FormatError::BadField {
            what: "run page kind",
            value: found.into(),
        });
    }
    r.u8()?;
    let count = r.u16()?;
    let seg_seq = r.u64()?;
    if seg_seq != place.seg_seq {
        return Err(FormatError::WrongSegment {
            what: WHAT,
            expected: place.seg_seq,
            found: seg_seq,
        });
    }
    let number = r.u32()?;
    if number != place.page {
        return Err(FormatError::BadField {
            what: "run page number",
            value: number.into(),
        });
    }
    let end = r.u16()?;
    Ok((count, end))
}

/// Lays entries out from the header on, with their offsets at the end of the page.
fn pack(
    kind: PageKind,
    place: PagePlace,
    entries: &[Vec<u8>],
) -> Result<[u8; PAGE_SIZE], FormatError> {
    let need: usize = entries.iter().map(|e| e.len() + 2).sum();
    if need > ENTRY_ROOM {
        return Err(FormatError::TooLarge {
            what: "run page entries",
            need,
            room: ENTRY_ROOM,
        });
    }
    let count: u16 = narrow("run page entry count", entries.len(), ENTRY_ROOM / 2)?;
    let end = PAGE_HEADER + need - 2 * entries.len();
    let mut page = header(kind, count, place, end as u16);
    let table = PAGE_SIZE - 2 * entries.len();
    let mut at = PAGE_HEADER;
    for (i, e) in entries.iter().enumerate() {
        page[at..at + e.len()].copy_from_slice(e);
        page[table + 2 * i..table + 2 * i + 2].copy_from_slice(&(at as u16).to_le_bytes());
        at += e.len();
    }
    seal_crc(&mut page, CRC_AT);
    Ok(page)
}

/// A page's entries, found through its offset table one at a time: a lookup's binary search
/// touches a few entries of a page, so only those are located and checked (that each lies in
/// the entry area, after the one before it), with no table built.
struct Entries<'p> {
    page: &'p [u8],
    table: usize,
    count: usize,
    end: usize,
}

impl<'p> Entries<'p> {
    fn new(page: &'p [u8], count: u16, end: u16) -> Result<Self, FormatError> {
        let (count, end) = (count as usize, end as usize);
        let table = PAGE_SIZE
            .checked_sub(2 * count)
            .filter(|&t| t >= PAGE_HEADER);
        let Some(table) = table.filter(|&t| (PAGE_HEADER..=t).contains(&end)) else {
            return Err(FormatError::BadField {
                what: "run page entry area",
                value: end as u64,
            });
        };
        if (count == 0 && end != PAGE_HEADER) || page.len() < PAGE_SIZE {
            return Err(FormatError::BadField {
                what: "run page entry area",
                value: end as u64,
            });
        }
        Ok(Entries {
            page,
            table,
            count,
            end,
        })
    }

    fn len(&self) -> usize {
        self.count
    }

    fn offset(&self, i: usize) -> usize {
        let at = self.table + 2 * i;
        u16::from_le_bytes([self.page[at], self.page[at + 1]]) as usize
    }

    /// Entry `i` (below [`Entries::len`]), checked as [`unpack`] checks it.
    fn get(&self, i: usize) -> Result<&'p [u8], FormatError> {
        let start = self.offset(i);
        let stop = if i + 1 < self.count {
            self.offset(i + 1)
        } else {
            self.end
        };
        if (i == 0 && start != PAGE_HEADER)
            || start < PAGE_HEADER
            || start >= stop
            || stop > self.end
        {
            return Err(FormatError::BadField {
                what: "run page entry offset",
                value: start as u64,
            });
        }
        Ok(&self.page[start..stop])
    }
}

/// The entries' byte ranges after checking that the offsets tile the entry area in order.
fn unpack(page: &[u8], count: u16, end: u16) -> Result<Vec<&[u8]>, FormatError> {
    let entries = Entries::new(page, count, end)?;
    (0..entries.len()).map(|i| entries.get(i)).collect()
}

fn check_key_len(len: usize) -> Result<(), FormatError> {
    if len > MAX_KEY {
        return Err(FormatError::TooLarge {
            what: "key",
            need: len,
            room: MAX_KEY,
        });
    }
    Ok(())
}

/// A leaf page of `entries` (sorted by key, then LSN descending; the caller's job).
pub fn encode_leaf(
    place: PagePlace,
    entries: &[LeafEntry],
) -> Result<[u8; PAGE_SIZE], FormatError> {
    let mut raw = Vec::with_capacity(entries.len());
    for e in entries {
        check_key_len(e.key.len())?;
        let mut v = Vec::with_capacity(e.page_bytes());
        v.extend_from_slice(&(e.key.len() as u16).to_le_bytes());
        let (kind, value) = match &e.value {
            LeafValue::Inline(value) => (1u8, value.clone()),
            LeafValue::Pointer(p) => {
                let mut b = Vec::with_capacity(ValuePointer::ENCODED_LEN);
                p.encode(&mut b);
                (2, b)
            }
            LeafValue::Tombstone => (3, Vec::new()),
        };
        let value_len: u16 = narrow("inline value", value.len(), ENTRY_ROOM)?;
        v.extend_from_slice(&value_len.to_le_bytes());
        v.push(kind);
        v.extend_from_slice(&e.lsn.to_le_bytes());
        v.extend_from_slice(&e.key);
        v.extend_from_slice(&value);
        raw.push(v);
    }
    pack(PageKind::Leaf, place, &raw)
}

/// The entries of a leaf page read from `place`, checked for order.
pub fn decode_leaf(page: &[u8], place: PagePlace) -> Result<Vec<LeafEntry>, FormatError> {
    let (count, end) = check_header(page, PageKind::Leaf, place)?;
    let mut out: Vec<LeafEntry> = Vec::with_capacity(count as usize);
    for raw in unpack(page, count, end)? {
        let LeafEntry { key, lsn, value } = parse_leaf_entry(raw)?;
        if let Some(prev) = out.last() {
            if (prev.key.as_slice(), std::cmp::Reverse(prev.lsn))
                >= (key.as_slice(), std::cmp::Reverse(lsn))
            {
                return Err(FormatError::BadField {
                    what: "leaf entry order",
                    value: lsn,
                });
            }
        }
        out.push(LeafEntry { key, lsn, value });
    }
    Ok(out)
}

/// A leaf page's entries taken one at a time, for walks: a short scan touches a few entries of
/// each run's leaf, so only those are parsed and copied (the header and CRC are checked once,
/// when the reader is made; each entry's offsets when it is read). Order is the caller's to
/// check between the entries it visits ([`LeafReader::key`] gives keys without copying).
pub struct LeafReader {
    page: std::sync::Arc<[u8]>,
    count: u16,
    end: u16,
}

impl LeafReader {
    pub fn new(page: std::sync::Arc<[u8]>, place: PagePlace) -> Result<Self, FormatError> {
        let (count, end) = check_header(&page, PageKind::Leaf, place)?;
        Entries::new(&page, count, end)?;
        Ok(LeafReader { page, count, end })
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn raw(&self, i: usize) -> Result<&[u8], FormatError> {
        Entries::new(&self.page, self.count, self.end)?.get(i)
    }

    /// The key and LSN of entry `i` (below [`LeafReader::len`]), not copied.
    pub fn key(&self, i: usize) -> Result<(&[u8], u64), FormatError> {
        leaf_key(self.raw(i)?)
    }

    /// Entry `i` (below [`LeafReader::len`]).
    pub fn entry(&self, i: usize) -> Result<LeafEntry, FormatError> {
        parse_leaf_entry(self.raw(i)?)
    }
}

/// The key and LSN of a raw leaf entry, without copying.
fn leaf_key(raw: &[u8]) -> Result<(&[u8], u64), FormatError> {
    let mut r = Reader::new("leaf entry", raw);
    let key_len = r.u16()? as usize;
    r.u16()?;
    r.u8()?;
    let lsn = r.u64()?;
    if key_len > MAX_KEY {
        return Err(FormatError::BadField {
            what: "leaf key length",
            value: key_len as u64,
        });
    }
    Ok((r.bytes(key_len)?, lsn))
}

fn parse_leaf_entry(raw: &[u8]) -> Result<LeafEntry, FormatError> {
    let (key, lsn) = leaf_key(raw)?;
    let value_len = u16::from_le_bytes([raw[2], raw[3]]) as usize;
    let kind = raw[4];
    let mut r = Reader::new("leaf entry", raw);
    r.bytes(13 + key.len())?;
    let value = r.bytes(value_len)?;
    let value = match kind {
        1 => LeafValue::Inline(value.to_vec()),
        2 => LeafValue::Pointer(ValuePointer::decode(value)?),
        3 if value.is_empty() => LeafValue::Tombstone,
        _ => {
            return Err(FormatError::BadField {
                what: "leaf entry kind",
                value: kind.into(),
            })
        }
    };
    r.finish()?;
    Ok(LeafEntry {
        key: key.to_vec(),
        lsn,
        value,
    })
}

/// The first position in `0..n` where `before(i)` is false (`before` must be true, then
/// false), with a fallible test.
fn partition(
    n: usize,
    mut before: impl FnMut(usize) -> Result<bool, FormatError>,
) -> Result<usize, FormatError> {
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if before(mid)? {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// What a leaf holds of one key at or below an LSN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafFind {
    /// The newest version of the key at or below the LSN.
    Found(LeafEntry),
    /// The key's versions end in this page without one at or below the LSN (or it has none).
    Absent,
    /// Every entry from the key's place on is a newer version of it: the next leaf may go on.
    Continue,
}

/// Looks for `key` at or below `max_lsn` in the leaf page read from `place`, decoding only the
/// entries the binary search touches and the one found (the header and CRC are checked as
/// [`decode_leaf`] does, and the offsets of the entries touched; entry order is trusted as far
/// as the search goes, and a found entry always has the key sought).
pub fn leaf_find(
    page: &[u8],
    place: PagePlace,
    key: &[u8],
    max_lsn: u64,
) -> Result<LeafFind, FormatError> {
    let (count, end) = check_header(page, PageKind::Leaf, place)?;
    let raws = Entries::new(page, count, end)?;
    let start = partition(raws.len(), |i| Ok(leaf_key(raws.get(i)?)?.0 < key))?;
    for i in start..raws.len() {
        let raw = raws.get(i)?;
        let (k, lsn) = leaf_key(raw)?;
        if k != key {
            return Ok(LeafFind::Absent);
        }
        if lsn <= max_lsn {
            return parse_leaf_entry(raw).map(LeafFind::Found);
        }
    }
    Ok(LeafFind::Continue)
}

/// The child of the index page read from `place` that holds the first key at or above `key`
/// (`None` when every key of the page is below it), decoding only the entries the binary search
/// touches.
pub fn index_child(page: &[u8], place: PagePlace, key: &[u8]) -> Result<Option<u32>, FormatError> {
    let (count, end) = check_header(page, PageKind::Index, place)?;
    let raws = Entries::new(page, count, end)?;
    let entry = |raw: &[u8]| -> Result<(u32, usize), FormatError> {
        let mut r = Reader::new("index entry", raw);
        let key_len = r.u16()? as usize;
        let child = r.u32()?;
        if key_len > MAX_KEY || 6 + key_len != raw.len() {
            return Err(FormatError::BadField {
                what: "index key length",
                value: key_len as u64,
            });
        }
        Ok((child, key_len))
    };
    let i = partition(raws.len(), |i| {
        let raw = raws.get(i)?;
        let (_, len) = entry(raw)?;
        Ok(&raw[6..6 + len] < key)
    })?;
    if i == raws.len() {
        return Ok(None);
    }
    entry(raws.get(i)?).map(|(c, _)| Some(c))
}

/// An index page of `entries` (keys non-decreasing; the caller's job).
pub fn encode_index(
    place: PagePlace,
    entries: &[IndexEntry],
) -> Result<[u8; PAGE_SIZE], FormatError> {
    let mut raw = Vec::with_capacity(entries.len());
    for e in entries {
        check_key_len(e.key.len())?;
        let mut v = Vec::with_capacity(e.page_bytes());
        v.extend_from_slice(&(e.key.len() as u16).to_le_bytes());
        v.extend_from_slice(&e.child.to_le_bytes());
        v.extend_from_slice(&e.key);
        raw.push(v);
    }
    pack(PageKind::Index, place, &raw)
}

/// The entries of an index page read from `place`, checked for order.
pub fn decode_index(page: &[u8], place: PagePlace) -> Result<Vec<IndexEntry>, FormatError> {
    let (count, end) = check_header(page, PageKind::Index, place)?;
    let mut out: Vec<IndexEntry> = Vec::with_capacity(count as usize);
    for raw in unpack(page, count, end)? {
        let mut r = Reader::new("index entry", raw);
        let key_len = r.u16()? as usize;
        let child = r.u32()?;
        if key_len > MAX_KEY {
            return Err(FormatError::BadField {
                what: "index key length",
                value: key_len as u64,
            });
        }
        let key = r.bytes(key_len)?.to_vec();
        r.finish()?;
        // Non-decreasing: the versions of one key may span leaves, so two children can end
        // with the same key.
        if out.last().is_some_and(|prev| prev.key > key) {
            return Err(FormatError::BadField {
                what: "index entry order",
                value: child.into(),
            });
        }
        out.push(IndexEntry { key, child });
    }
    Ok(out)
}

/// A filter page holding `bits` (at most [`FILTER_BYTES_PER_PAGE`] bytes; the rest is zero).
pub fn encode_filter(place: PagePlace, bits: &[u8]) -> Result<[u8; PAGE_SIZE], FormatError> {
    if bits.len() > FILTER_BYTES_PER_PAGE {
        return Err(FormatError::TooLarge {
            what: "filter page bits",
            need: bits.len(),
            room: FILTER_BYTES_PER_PAGE,
        });
    }
    let mut page = header(PageKind::Filter, 0, place, PAGE_HEADER as u16);
    page[PAGE_HEADER..PAGE_HEADER + bits.len()].copy_from_slice(bits);
    seal_crc(&mut page, CRC_AT);
    Ok(page)
}

/// The filter bytes of a filter page read from `place`.
pub fn decode_filter(page: &[u8], place: PagePlace) -> Result<&[u8], FormatError> {
    check_header(page, PageKind::Filter, place)?;
    Ok(&page[PAGE_HEADER..])
}

/// The run's summary, in its last page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub entries: u64,
    pub leaf_pages: u32,
    pub index_root: u32,
    pub index_levels: u8,
    pub bloom_probes: u8,
    pub filter_first: u32,
    pub filter_pages: u32,
    pub filter_bits: u64,
    pub min_lsn: u64,
    pub max_lsn: u64,
    pub total_pages: u32,
    pub smallest: Vec<u8>,
    pub largest: Vec<u8>,
}

impl Footer {
    pub fn encode(&self, seg_seq: u64) -> Result<[u8; PAGE_SIZE], FormatError> {
        check_key_len(self.smallest.len())?;
        check_key_len(self.largest.len())?;
        let place = PagePlace {
            seg_seq,
            page: self.total_pages.saturating_sub(1),
        };
        let mut page = header(PageKind::Footer, 0, place, PAGE_HEADER as u16);
        let mut v = Vec::with_capacity(60 + self.smallest.len() + self.largest.len());
        v.extend_from_slice(&self.entries.to_le_bytes());
        v.extend_from_slice(&self.leaf_pages.to_le_bytes());
        v.extend_from_slice(&self.index_root.to_le_bytes());
        v.push(self.index_levels);
        v.push(self.bloom_probes);
        v.extend_from_slice(&[0; 2]);
        v.extend_from_slice(&self.filter_first.to_le_bytes());
        v.extend_from_slice(&self.filter_pages.to_le_bytes());
        v.extend_from_slice(&self.filter_bits.to_le_bytes());
        v.extend_from_slice(&self.min_lsn.to_le_bytes());
        v.extend_from_slice(&self.max_lsn.to_le_bytes());
        v.extend_from_slice(&self.total_pages.to_le_bytes());
        v.extend_from_slice(&(self.smallest.len() as u16).to_le_bytes());
        v.extend_from_slice(&(self.largest.len() as u16).to_le_bytes());
        v.extend_from_slice(&self.smallest);
        v.extend_from_slice(&self.largest);
        page[PAGE_HEADER..PAGE_HEADER + v.len()].copy_from_slice(&v);
        seal_crc(&mut page, CRC_AT);
        Ok(page)
    }

    /// Decodes the footer read from `place` (the run's last page) and checks that every page
    /// range it names lies inside the run.
    pub fn decode(page: &[u8], place: PagePlace) -> Result<Footer, FormatError> {
        check_header(page, PageKind::Footer, place)?;
        let mut r = Reader::new("run footer", &page[PAGE_HEADER..]);
        let entries = r.u64()?;
        let leaf_pages = r.u32()?;
        let index_root = r.u32()?;
        let index_levels = r.u8()?;
        let bloom_probes = r.u8()?;
        r.u16()?;
        let f = Footer {
            entries,
            leaf_pages,
            index_root,
            index_levels,
            bloom_probes,
            filter_first: r.u32()?,
            filter_pages: r.u32()?,
            filter_bits: r.u64()?,
            min_lsn: r.u64()?,
            max_lsn: r.u64()?,
            total_pages: r.u32()?,
            smallest: Vec::new(),
            largest: Vec::new(),
        };
        let (small_len, large_len) = (r.u16()? as usize, r.u16()? as usize);
        if small_len > MAX_KEY || large_len > MAX_KEY {
            return Err(FormatError::BadField {
                what: "run footer key length",
                value: small_len.max(large_len) as u64,
            });
        }
        let smallest = r.bytes(small_len)?.to_vec();
        let largest = r.bytes(large_len)?.to_vec();
        let f = Footer {
            smallest,
            largest,
            ..f
        };
        let bad = |what: &'static str, value: u64| Err(FormatError::BadField { what, value });
        if f.total_pages != place.page.wrapping_add(1) {
            return bad("run footer total pages", f.total_pages.into());
        }
        let filter_end = u64::from(f.filter_first) + u64::from(f.filter_pages);
        if f.leaf_pages == 0
            || f.leaf_pages > place.page
            || filter_end > u64::from(place.page)
            || f.filter_first < f.leaf_pages
        {
            return bad("run footer page ranges", f.leaf_pages.into());
        }
        if f.index_root < f.leaf_pages || f.index_root >= place.page || f.index_levels == 0 {
            return bad("run footer index root", f.index_root.into());
        }
        if f.filter_bits > u64::from(f.filter_pages) * 8 * FILTER_BYTES_PER_PAGE as u64
            || f.filter_bits > u64::from(u32::MAX)
        {
            return bad("run footer filter bits", f.filter_bits);
        }
        if f.bloom_probes == 0
            || f.bloom_probes > MAX_PROBES
            || f.min_lsn > f.max_lsn
            || f.smallest > f.largest
        {
            return bad("run footer summary", f.bloom_probes.into());
        }
        Ok(f)
    }
}

/// The hash a key's bloom probes derive from: its CRC32C.
pub fn bloom_hash(key: &[u8]) -> u32 {
    crc32c(key)
}

/// The bit positions the bloom filter probes for a key of hash `h` (see [`bloom_hash`]) in a
/// filter of `m` bits with `k` probes.
pub fn bloom_probes(h: u32, m: u32, k: u8) -> impl Iterator<Item = u32> {
    let d = h.rotate_right(17);
    (0..u32::from(k)).map(move |j| h.wrapping_add(j.wrapping_mul(d)) % m.max(1))
}

/// Sets the bits of a key of hash `h` in the `m`-bit filter `bits` (at least `m` bits long).
pub fn bloom_add(bits: &mut [u8], m: u32, k: u8, h: u32) {
    for bit in bloom_probes(h, m, k) {
        if let Some(byte) = bits.get_mut((bit / 8) as usize) {
            *byte |= 1 << (bit % 8);
        }
    }
}

/// False only when no key of hash `h` was ever added to the `m`-bit filter `bits`.
pub fn bloom_may_contain(bits: &[u8], m: u32, k: u8, h: u32) -> bool {
    bloom_probes(h, m, k).all(|bit| {
        bits.get((bit / 8) as usize)
            .is_some_and(|b| b & (1 << (bit % 8)) != 0)
    })
}
