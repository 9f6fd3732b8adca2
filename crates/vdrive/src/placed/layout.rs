//! The persistent per-leg layout of a `placed` drive (format 1, see `docs/placed-format.md`):
//! where the header copies, slot-table copies and data area sit on a leg, and the encoding and
//! checked decoding of one header + slot-table copy. It owns no I/O; `placed` and its
//! rebalance read and write the bytes it describes.

use kura_engine::crc32c::crc32c_skipping;

/// Magic at byte 0 of every header copy.
pub const MAGIC: &[u8; 8] = b"KURAPLCD";
/// Format version written and accepted.
pub const VERSION: u32 = 1;
/// Size of one header copy before rounding up to the block size.
pub const HEADER_BYTES: u64 = 4096;
/// Bytes per slot-table entry.
pub const ENTRY_BYTES: u64 = 8;
/// Offset of the header CRC (over the header copy's bytes with this field skipped).
const CRC_AT: usize = 4092;
/// Most copies one chunk may have on all legs together (the read path keeps one bit each).
pub const MAX_COPIES: usize = 32;
/// Header flag: a rebalance started and has not finished.
pub const FLAG_REBALANCING: u32 = 1;
/// Offset and size of the stale-leg bitmap in a header copy: bit `l` (byte `l / 8`, bit
/// `l % 8`) set means leg `l` missed acknowledged writes and must not serve reads.
const STALE_AT: usize = 128;
/// Words of the stale bitmap (one bit per possible leg).
pub const STALE_WORDS: usize = super::MAX_LEGS / 64;

/// Where things sit on one leg, a pure function of the leg's size, block size and chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of one header copy (4 KiB or the block size if larger); copy `g % 2` of
    /// generation `g` is at byte `(g % 2) * header`.
    pub header: u64,
    /// Bytes of one slot-table copy; copy `i` at byte `2 * header + i * table`.
    pub table: u64,
    /// Byte offset of the data area (chunk aligned).
    pub data: u64,
    /// Slots (chunks) the leg holds.
    pub slots: u64,
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl Geometry {
    /// The layout of a leg of `leg_bytes` with block size `bs` and chunks of `chunk` bytes
    /// (a multiple of `bs`); `None` when not even the metadata and one chunk fit.
    pub fn of(leg_bytes: u64, bs: u64, chunk: u64) -> Option<Geometry> {
        if bs == 0 || chunk == 0 || !chunk.is_multiple_of(bs) {
            return None;
        }
        let header = round_up(HEADER_BYTES, bs);
        let place = |slots: u64| -> Option<(u64, u64)> {
            let table = round_up(slots.checked_mul(ENTRY_BYTES)?.max(1), header);
            let data = round_up(2 * header + 2 * table, chunk);
            Some((table, data))
        };
        // Shrink the slot count until metadata plus slots fit; metadata grows with slots, so
        // the count settles after a few rounds.
        let mut slots = leg_bytes / chunk;
        loop {
            let (table, data) = place(slots)?;
            let fit = leg_bytes.saturating_sub(data) / chunk;
            if fit >= slots {
                return (slots > 0).then_some(Geometry {
                    header,
                    table,
                    data,
                    slots,
                });
            }
            slots = fit;
        }
    }

    /// Byte offset of header copy `copy` (0 or 1).
    pub fn header_at(&self, copy: u64) -> u64 {
        copy * self.header
    }

    /// Byte offset of table copy `copy` (0 or 1).
    pub fn table_at(&self, copy: u64) -> u64 {
        2 * self.header + copy * self.table
    }
}

/// The header fields (one copy; see the doc for offsets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub block_size: u32,
    pub drive_id: [u8; 16],
    pub leg: u32,
    pub legs: u32,
    pub generation: u64,
    pub chunk_bytes: u64,
    pub replicas: u32,
    pub rule: u32,
    pub chunks: u64,
    pub slots: u64,
    pub data: u64,
    pub table_bytes: u64,
    pub map_crc: u32,
    pub flags: u32,
    pub map_epoch: u64,
    pub target_crc: u32,
    pub table_crc: u32,
    /// Legs this leg's header marks stale (taken out of service while the drive took writes),
    /// a bit per leg: bit `l % 64` of word `l / 64`.
    pub stale: [u64; STALE_WORDS],
}

impl Header {
    /// Whether this header marks leg `l` stale.
    pub fn marks_stale(&self, l: usize) -> bool {
        self.stale
            .get(l / 64)
            .is_some_and(|w| w >> (l % 64) & 1 == 1)
    }

    /// Sets (or clears) the stale mark of leg `l` (ignored past the bitmap).
    pub fn set_stale(&mut self, l: usize, stale: bool) {
        if let Some(w) = self.stale.get_mut(l / 64) {
            if stale {
                *w |= 1 << (l % 64);
            } else {
                *w &= !(1 << (l % 64));
            }
        }
    }
}

/// One slot's entry: the chunk it holds and the copy's rank in CRUSH order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub chunk: u32,
    pub rank: u16,
}

/// Why a leg's metadata was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("no placed header (the first bytes are zero: a blank leg)")]
    Blank,
    #[error("no placed header but data at the start: a dense-layout leg (written before format 1) or a foreign device")]
    Foreign,
    #[error("both header copies are damaged ({0})")]
    Damaged(String),
    #[error("header field {field} is {value}, {why}")]
    Field {
        field: &'static str,
        value: u64,
        why: String,
    },
    #[error("slot {slot}: {why}")]
    Slot { slot: u64, why: String },
}

fn field(field: &'static str, value: u64, why: impl Into<String>) -> LayoutError {
    LayoutError::Field {
        field,
        value,
        why: why.into(),
    }
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}
fn get64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Encodes `entries` (one per slot, `None` free) as a table copy of `len` bytes.
pub fn encode_table(entries: &[Option<Entry>], len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    for (s, e) in entries.iter().enumerate() {
        if let Some(e) = e {
            let at = s * ENTRY_BYTES as usize;
            put32(&mut b, at, e.chunk + 1);
            b[at + 4..at + 6].copy_from_slice(&e.rank.to_le_bytes());
        }
    }
    b
}

/// Encodes a header copy of `len` bytes (`h.table_crc` must be the CRC of the table copy).
pub fn encode_header(h: &Header, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    b[0..8].copy_from_slice(MAGIC);
    put32(&mut b, 8, VERSION);
    put32(&mut b, 12, h.block_size);
    b[16..32].copy_from_slice(&h.drive_id);
    put32(&mut b, 32, h.leg);
    put32(&mut b, 36, h.legs);
    put64(&mut b, 40, h.generation);
    put64(&mut b, 48, h.chunk_bytes);
    put32(&mut b, 56, h.replicas);
    put32(&mut b, 60, h.rule);
    put64(&mut b, 64, h.chunks);
    put64(&mut b, 72, h.slots);
    put64(&mut b, 80, h.data);
    put64(&mut b, 88, h.table_bytes);
    put32(&mut b, 96, h.map_crc);
    put32(&mut b, 100, h.flags);
    put64(&mut b, 104, h.map_epoch);
    put32(&mut b, 112, h.target_crc);
    put32(&mut b, 116, h.table_crc);
    for (i, w) in h.stale.iter().enumerate() {
        put64(&mut b, STALE_AT + 8 * i, *w);
    }
    let crc = crc32c_skipping(&b[..HEADER_BYTES as usize], CRC_AT);
    put32(&mut b, CRC_AT, crc);
    b
}

/// Decodes one header copy and checks it against the leg it was read from (`leg_bytes`,
/// block size `bs`); the table CRC is checked later against the table copy.
pub fn decode_header(b: &[u8], leg_bytes: u64, bs: u32) -> Result<Header, LayoutError> {
    if b.len() < HEADER_BYTES as usize {
        return Err(LayoutError::Damaged(format!("{} bytes read", b.len())));
    }
    if &b[0..8] != MAGIC {
        return Err(LayoutError::Damaged("no magic".into()));
    }
    let crc = get32(b, CRC_AT);
    let want = crc32c_skipping(&b[..HEADER_BYTES as usize], CRC_AT);
    if crc != want {
        return Err(LayoutError::Damaged(format!(
            "header CRC {crc:#010x}, computed {want:#010x}"
        )));
    }
    let version = get32(b, 8);
    if version != VERSION {
        return Err(field(
            "version",
            version.into(),
            format!("this kura reads version {VERSION}"),
        ));
    }
    let h = Header {
        block_size: get32(b, 12),
        drive_id: b[16..32].try_into().unwrap_or([0; 16]),
        leg: get32(b, 32),
        legs: get32(b, 36),
        generation: get64(b, 40),
        chunk_bytes: get64(b, 48),
        replicas: get32(b, 56),
        rule: get32(b, 60),
        chunks: get64(b, 64),
        slots: get64(b, 72),
        data: get64(b, 80),
        table_bytes: get64(b, 88),
        map_crc: get32(b, 96),
        flags: get32(b, 100),
        map_epoch: get64(b, 104),
        target_crc: get32(b, 112),
        table_crc: get32(b, 116),
        stale: std::array::from_fn(|i| get64(b, STALE_AT + 8 * i)),
    };
    if h.block_size != bs {
        return Err(field(
            "block size",
            h.block_size.into(),
            format!("but the leg's block size is {bs}"),
        ));
    }
    if h.legs == 0 || h.legs as usize > super::MAX_LEGS || h.leg >= h.legs {
        return Err(field(
            "leg index",
            h.leg.into(),
            format!(
                "not below the leg count {} (1 to {})",
                h.legs,
                super::MAX_LEGS
            ),
        ));
    }
    if h.replicas == 0 || h.replicas as usize > super::MAX_REPLICAS {
        return Err(field(
            "replicas",
            h.replicas.into(),
            format!("not 1 to {}", super::MAX_REPLICAS),
        ));
    }
    let Some(geo) = Geometry::of(leg_bytes, bs.into(), h.chunk_bytes) else {
        return Err(field(
            "chunk bytes",
            h.chunk_bytes,
            format!("not a multiple of the block size {bs} that fits the leg of {leg_bytes} bytes"),
        ));
    };
    if (h.slots, h.data, h.table_bytes) != (geo.slots, geo.data, geo.table) {
        return Err(field(
            "slots",
            h.slots,
            format!(
                "with data at {} and tables of {} bytes, but a leg of {leg_bytes} bytes holds {} slots, data at {}, tables of {}",
                h.data, h.table_bytes, geo.slots, geo.data, geo.table
            ),
        ));
    }
    if h.chunks == 0 || h.chunks > u64::from(u32::MAX - 1) {
        return Err(field("chunks", h.chunks, "not 1 to 2^32-2"));
    }
    if h.flags & !FLAG_REBALANCING != 0 {
        return Err(field("flags", h.flags.into(), "unknown bits set"));
    }
    if let Some(l) = (0..STALE_WORDS * 64).find(|&l| h.marks_stale(l) && l >= h.legs as usize) {
        return Err(field(
            "stale bitmap",
            l as u64,
            format!("marks leg {l} stale, but the drive has {} legs", h.legs),
        ));
    }
    if h.marks_stale(h.leg as usize) {
        return Err(field(
            "stale bitmap",
            h.leg.into(),
            "marks the leg that carries it stale (a leg never marks itself)",
        ));
    }
    // Bytes between the fields and the CRC are zero in a valid copy.
    if b[STALE_AT + 8 * STALE_WORDS..CRC_AT]
        .iter()
        .any(|&x| x != 0)
        || b[120..STALE_AT].iter().any(|&x| x != 0)
    {
        return Err(LayoutError::Damaged(
            "reserved header bytes are not zero".into(),
        ));
    }
    Ok(h)
}

/// Decodes a table copy for `h`: one entry per slot. Checks its CRC, that every chunk is below
/// `h.chunks`, that no chunk sits in two slots of the leg and that ranks are below
/// [`MAX_COPIES`].
pub fn decode_table(b: &[u8], h: &Header) -> Result<Vec<Option<Entry>>, LayoutError> {
    if b.len() as u64 != h.table_bytes {
        return Err(LayoutError::Damaged(format!(
            "table copy of {} bytes, expected {}",
            b.len(),
            h.table_bytes
        )));
    }
    let crc = kura_engine::crc32c::crc32c(b);
    if crc != h.table_crc {
        return Err(LayoutError::Damaged(format!(
            "table CRC {crc:#010x}, header says {:#010x}",
            h.table_crc
        )));
    }
    let mut seen = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(h.slots as usize);
    for s in 0..h.slots {
        let at = (s * ENTRY_BYTES) as usize;
        let raw = get32(b, at);
        let rank = u16::from_le_bytes([b[at + 4], b[at + 5]]);
        if raw == 0 {
            out.push(None);
            continue;
        }
        let chunk = raw - 1;
        if u64::from(chunk) >= h.chunks {
            return Err(LayoutError::Slot {
                slot: s,
                why: format!("chunk {chunk} is beyond the drive's {} chunks", h.chunks),
            });
        }
        if rank as usize >= MAX_COPIES {
            return Err(LayoutError::Slot {
                slot: s,
                why: format!("rank {rank} is not below {MAX_COPIES}"),
            });
        }
        if let Some(other) = seen.insert(chunk, s) {
            return Err(LayoutError::Slot {
                slot: s,
                why: format!("chunk {chunk} is also in slot {other} of this leg"),
            });
        }
        out.push(Some(Entry { chunk, rank }));
    }
    // Bytes past the entries are zero in a valid copy.
    if b[(h.slots * ENTRY_BYTES) as usize..]
        .iter()
        .any(|&x| x != 0)
    {
        return Err(LayoutError::Slot {
            slot: h.slots,
            why: "bytes after the last entry are not zero".into(),
        });
    }
    Ok(out)
}

/// Picks the newest valid (header, table) copy from the raw bytes of both header copies and
/// both table copies (`tables[i]` may be empty when header `i` did not decode). Returns the
/// error of copy 0 when neither is valid, or [`LayoutError::Blank`] / [`LayoutError::Foreign`]
/// when neither copy carries the magic.
pub fn pick(
    headers: [&[u8]; 2],
    tables: [&[u8]; 2],
    leg_bytes: u64,
    bs: u32,
) -> Result<(Header, Vec<Option<Entry>>), LayoutError> {
    if headers.iter().all(|h| h.get(..8) != Some(MAGIC.as_slice())) {
        return Err(if headers.iter().all(|h| h.iter().all(|&b| b == 0)) {
            LayoutError::Blank
        } else {
            LayoutError::Foreign
        });
    }
    let mut best: Option<(Header, Vec<Option<Entry>>)> = None;
    let mut errors = Vec::new();
    for i in 0..2 {
        let got = decode_header(headers[i], leg_bytes, bs)
            .and_then(|h| decode_table(tables[i], &h).map(|t| (h, t)));
        match got {
            Ok((h, t)) => {
                if best
                    .as_ref()
                    .is_none_or(|(b, _)| h.generation > b.generation)
                {
                    best = Some((h, t));
                }
            }
            Err(e) => errors.push(format!("copy {i}: {e}")),
        }
    }
    best.ok_or_else(|| {
        // A field error in one copy is the more useful report when both fail.
        LayoutError::Damaged(errors.join("; "))
    })
}
