//! `placed(LEG0,LEG1,...)?map=PATH&rule=0&replicas=2&chunk=4M&size=SIZE&read=primary|balanced&layout=1|dense` — fixed-size chunks
//! placed on legs by a CRUSH map and rule, each kept as `replicas` copies on distinct legs.
//!
//! It owns the placement table, the legs' health and (in [`layout`] and [`mod@rebalance`]) the
//! on-leg format and its rebalance.
//!
//! **Placement.** Leg `i` is OSD id `i` of the map. Chunk `c` (the drive's bytes
//! `c*chunk..(c+1)*chunk`) is mapped with CRUSH input `x = c`, the given rule and `replicas`
//! results, every device weighted 1.0 and the map's test `choose_args` (exactly what
//! `crushtool --test --rule R --num-rep N --x c --show-mappings` prints for it). Without `map=`
//! the map is [`flat_map`]: one straw2 bucket holding every leg with equal weight and rule 0
//! choosing distinct legs.
//!
//! **Format 1 (the default, `docs/placed-format.md`).** Every leg carries a header and a slot
//! table (chunk and rank per slot, A/B copies with CRC-32C; [`layout`]) before its chunk-aligned
//! data area. Opening a drive whose legs are all blank (zero in both header copies) formats
//! it: CRUSH's legs for each chunk, slots packed densely, written to every leg's table. Later
//! opens read the tables, so where a chunk lives is what the legs say, not what the map would
//! compute; the spec's map must be the one the legs record (by CRC), its chunk, replicas and
//! rule those of the header. [`rebalance()`](fn@rebalance) (`kura drive rebalance`) moves the chunks a new map
//! places elsewhere. A leg with data but no header (a drive from before format 1) is refused;
//! `layout=dense` opens such a drive the old way: no metadata, chunk `c`'s copy on leg `l` in
//! slot `s` = the number of chunks before `c` that CRUSH also placed on `l`, a pure function of
//! the spec.
//!
//! **Capacity.** `size=` (a multiple of `chunk`) when given, and it is an error if some leg has no
//! room for the chunks CRUSH puts on it. Otherwise the nominal `smallest leg × legs / replicas`
//! (rounded down to whole chunks), cut down to the longest run of chunks `0..n` whose copies all
//! fit their legs, since CRUSH fills legs unevenly.
//!
//! **Checks at open.** The map decodes, the rule exists, every OSD id the rule can emit (every
//! device under the buckets its `take` steps name) has a leg, and every chunk gets `replicas`
//! distinct legs (a map with too few failure domains is refused, never silently under-replicated).
//!
//! **I/O.** Requests are cut at chunk boundaries. A read goes to the chunk's first replica in
//! CRUSH order whose leg is in service (Ceph's primary), or with `read=balanced` to the
//! in-service replica whose leg has the fewest commands in flight; on an error it is retried on
//! the next untried one in CRUSH order, and the leg that failed is taken out of service. Writes, write-zeroes and discards go to every in-service
//! replica of each chunk and complete when all of them have; a flush goes to every in-service leg.
//!
//! **Failure rule.** A chunk's write is acknowledged when at least one in-service replica took
//! it; the replicas that failed it are taken out of service, so they never serve the stale copy.
//! A leg is only taken out while every chunk keeps at least one replica in service: when taking
//! it out would leave some chunk with none, the command that failed on it fails instead and the
//! leg stays (the last copy is never thrown away). So with `replicas = N`, any N-1 legs may fail,
//! at any point of the stream, and every acknowledged write stays readable. A leg out of service
//! gets no more I/O while the drive is open ([`Placed::status`] and `describe()` say why);
//! bringing it back (rebalance, resync) is not done here. A failed flush poisons the drive.
//!
//! **Stale marks (format 1).** That a leg went out is persisted before any flush completes:
//! a caller's flush first writes the set of out-of-service legs into the header (stale bitmap,
//! next generation) of every in-service leg, then flushes the legs, and repeats both if
//! another leg went out meanwhile; so whatever a flush acknowledged is never shadowed by a
//! stale copy after a crash. At open a leg any header marks stale opens out of service (a chunk
//! with copies only on marked legs is an error); `kura drive rebalance` refills marked legs as
//! with `--resync` and clears the marks.

use crate::child_request;
use crate::fanout::{combined_geometry, fanout_methods, scratch, Done, Fanout};
use crate::mirror::{unhealthy_legs, LegHealth, LegStatus};
use kura_crush::map::{op, Bucket, BucketKind, Rule, Step, Tunables};
use kura_crush::{CrushMap, Mapper, ITEM_NONE};
use kura_engine::open::ChildOpener;
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Geometry, Opcode, OpenError, Spec,
};
use layout::Geometry as LegGeometry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub mod layout;
pub mod rebalance;

pub use rebalance::{rebalance, RebalanceReport};

/// Chunk size when the spec names none.
pub const DEFAULT_CHUNK: u64 = 4 << 20;
/// Most legs a placed drive may have.
pub const MAX_LEGS: usize = 1024;
/// Most copies of a chunk.
pub const MAX_REPLICAS: usize = 16;
/// Most `(chunk, replica)` entries in the placement table (8 bytes each): with 4 MiB chunks and
/// 2 replicas, 8 TiB of drive (a 32 MiB table).
pub const MAX_TABLE_ENTRIES: u64 = 1 << 22;
/// Device weight given to every leg (1.0 in CRUSH's 16.16 fixed point).
const IN: u32 = 0x10000;

/// How a placed drive lays chunks out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedOptions {
    /// The CRUSH rule id.
    pub rule: u32,
    /// Copies of each chunk, on distinct legs.
    pub replicas: usize,
    /// Chunk size in bytes, a multiple of the legs' block size.
    pub chunk: u64,
    /// Capacity in bytes, a multiple of `chunk`; `None` for the default (see the module docs).
    pub size: Option<u64>,
    /// Reads go to the in-service replica with the least load instead of the first one.
    pub balanced_reads: bool,
    /// The layout before format 1: no metadata, slots a function of the spec (`layout=dense`).
    pub dense: bool,
}

impl Default for PlacedOptions {
    fn default() -> Self {
        PlacedOptions {
            rule: 0,
            replicas: 2,
            chunk: DEFAULT_CHUNK,
            size: None,
            balanced_reads: false,
            dense: false,
        }
    }
}

/// One copy of a chunk: its leg and slot there.
#[derive(Debug, Clone, Copy)]
struct Replica {
    leg: u16,
    slot: u32,
}

/// What a finished piece means to its parent.
enum Piece {
    /// A read of blocks `at..at+blocks` of the request from one replica of `chunk` (at block
    /// `off` of the chunk); `whole` when it carries the caller's buffer, else a scratch buffer to
    /// copy into the caller's at `at`.
    Read {
        chunk: u64,
        off: u64,
        at: u64,
        blocks: u64,
        /// Replicas tried so far, a bit per index.
        tried: u32,
        whole: bool,
    },
    /// One replica's share of a chunk's mutation (group `group`); `whole` when it carries the
    /// caller's buffer.
    Mutation { group: u64, whole: bool },
    /// A flush of one leg.
    Flush,
    /// Part of a write of one leg's metadata (the stale marks), ahead of a flush.
    Meta,
}

/// Where a caller's flush is: writing the stale marks `set` into the in-service legs'
/// metadata, or flushing the legs (the marks `set` then become durable).
enum FlushStage {
    Meta(Vec<bool>),
    Flush(Vec<bool>),
}

/// The replicas of one chunk's mutation still in flight and what the finished ones did.
struct Group {
    left: usize,
    ok: Vec<usize>,
    failed: Vec<(usize, DeviceError)>,
}

/// Chunks placed on legs by CRUSH, replicated.
pub struct Placed {
    fan: Fanout<Piece>,
    geo: Geometry,
    /// Every chunk's copies, by rank (CRUSH order) then leg; chunk `c`'s are
    /// `table[starts[c]..starts[c + 1]]`.
    table: Vec<Replica>,
    starts: Vec<u32>,
    /// Each leg's data area, in blocks from its start (0 with `layout=dense`).
    base: Vec<u64>,
    replicas: usize,
    chunk_blocks: u64,
    rule: u32,
    /// Where the map came from, for `describe()`; empty for the flat map.
    source: String,
    balanced: bool,
    health: Vec<LegHealth>,
    read_errors: Vec<u64>,
    groups: HashMap<u64, Group>,
    next_group: u64,
    /// Each leg's metadata as last written (format 1; empty with `layout=dense`), for writing
    /// the stale marks.
    metas: Vec<rebalance::LegMeta>,
    /// Legs whose stale mark is durable on every in-service leg (as of the last flush that
    /// wrote marks), by leg.
    marked: Vec<bool>,
    /// The caller flush writing marks now (one at a time: A/B copies must not be raced).
    meta_owner: Option<usize>,
    /// Caller flushes waiting for `meta_owner` to finish.
    meta_waiting: Vec<usize>,
    flushes: HashMap<usize, FlushStage>,
}

/// The map used when a spec names none: one straw2 bucket (id -1, type 1 `root`) holding
/// devices `0..legs` with weight 1.0 each, and rule 0 (`replicated`) taking it and choosing
/// distinct devices (`choose firstn 0 type osd`), with the jewel (optimal) tunables.
pub fn flat_map(legs: usize) -> CrushMap {
    let items: Vec<i32> = (0..legs as i32).collect();
    let names = |v: Vec<(i32, String)>| -> BTreeMap<i32, String> { v.into_iter().collect() };
    let step = |op: u32, arg1: i32, arg2: i32| Step { op, arg1, arg2 };
    CrushMap {
        buckets: vec![Some(Bucket {
            id: -1,
            bucket_type: 1,
            hash: 0,
            weight: IN.saturating_mul(legs as u32),
            kind: BucketKind::Straw2 {
                item_weights: vec![IN; legs],
            },
            items: items.clone(),
        })],
        rules: vec![Some(Rule {
            ruleset: 0,
            rule_type: 1,
            min_size: 1,
            max_size: 10,
            steps: vec![
                step(op::TAKE, -1, 0),
                step(op::CHOOSE_FIRSTN, 0, 0),
                step(op::EMIT, 0, 0),
            ],
        })],
        max_devices: legs as i32,
        tunables: Tunables::jewel(),
        type_names: names(vec![(0, "osd".into()), (1, "root".into())]),
        item_names: names(
            items
                .iter()
                .map(|&i| (i, format!("osd.{i}")))
                .chain([(-1, "root".to_string())])
                .collect(),
        ),
        rule_names: names(vec![(0, "replicated".into())]),
        class_map: BTreeMap::new(),
        class_names: BTreeMap::new(),
        class_buckets: BTreeMap::new(),
        choose_args: BTreeMap::new(),
    }
}

/// Every device under the items the rule's `take` steps name.
fn reachable_devices(map: &CrushMap, rule: &Rule) -> BTreeSet<i32> {
    let mut devices = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for step in rule.steps.iter().filter(|s| s.op == op::TAKE) {
        let mut stack = vec![step.arg1];
        while let Some(item) = stack.pop() {
            if item >= 0 {
                devices.insert(item);
            } else if let Some(b) = map.bucket(item) {
                if seen.insert(item) {
                    stack.extend(&b.items);
                }
            }
        }
    }
    devices
}

pub(crate) fn invalid(m: String) -> OpenError {
    OpenError::Invalid(format!("placed: {m}"))
}

/// Checks that `rule` exists and that every OSD id it can emit has one of the `n` legs.
fn check_rule(map: &CrushMap, rule_id: u32, n: usize) -> Result<(), OpenError> {
    let Some(rule) = map.rule(rule_id) else {
        let have: Vec<String> = (0..map.rules.len() as u32)
            .filter(|&i| map.rule(i).is_some())
            .map(|i| format!("{i} ({})", map.rule_name(i)))
            .collect();
        return Err(invalid(format!(
            "the CRUSH map has no rule {rule_id} (it has: {})",
            if have.is_empty() {
                "none".to_string()
            } else {
                have.join(", ")
            }
        )));
    };
    let missing: Vec<String> = reachable_devices(map, rule)
        .into_iter()
        .filter(|&d| d as usize >= n)
        .map(|d| match map.item_names.get(&d) {
            Some(name) => format!("{d} ({name})"),
            None => d.to_string(),
        })
        .collect();
    if !missing.is_empty() {
        return Err(invalid(format!(
            "rule {rule_id} can place chunks on OSD id {}, but only {n} legs are given (leg i is OSD id i)",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// CRUSH's legs for chunks `0..chunks` (`replicas` per chunk, in CRUSH order), every leg at
/// weight 1.0; refuses a chunk that does not get `replicas` distinct legs.
pub(crate) fn crush_sets(
    map: &CrushMap,
    rule: u32,
    r: usize,
    n: usize,
    chunks: u64,
) -> Result<Vec<u16>, OpenError> {
    check_rule(map, rule, n)?;
    if chunks == 0 {
        return Ok(Vec::new());
    }
    if chunks.saturating_mul(r as u64) > MAX_TABLE_ENTRIES || chunks > i32::MAX as u64 {
        return Err(invalid(format!(
            "{chunks} chunks with {r} replicas is more than the {MAX_TABLE_ENTRIES} placements kept in memory; use a larger chunk"
        )));
    }
    let mapper = Mapper::for_test(map);
    let weights = vec![IN; n];
    let mapped = kura_crush::map_range(&mapper, rule, 0..=(chunks - 1) as i32, r, &weights, 0)
        .map_err(|e| invalid(format!("mapping with rule {rule}: {e}")))?;
    let mut out = Vec::with_capacity(chunks as usize * r);
    for c in 0..chunks as usize {
        let got = &mapped.items[c * r..c * r + mapped.lens[c] as usize];
        let distinct: BTreeSet<i32> = got.iter().copied().collect();
        let bad = got
            .iter()
            .any(|&d| d == ITEM_NONE || d < 0 || d as usize >= n);
        if got.len() != r || distinct.len() != r || bad {
            return Err(invalid(format!(
                "rule {rule} gives chunk {c} (x={c}) the OSDs {got:?}, not {r} distinct legs; the map has too few failure domains for replicas={r}"
            )));
        }
        out.extend(got.iter().map(|&d| d as u16));
    }
    Ok(out)
}

/// Dense assignment: each chunk's copies in CRUSH order, slot = rank among the chunks CRUSH
/// put on that leg. Returns the rows and the chunk count (`size=`, or the longest run of
/// chunks that fits when no size is given).
fn assign(
    map: &CrushMap,
    opts: &PlacedOptions,
    slots: &[u64],
    legs: &[Box<dyn BlockDevice>],
) -> Result<(Vec<Vec<Replica>>, u64), OpenError> {
    let (n, r) = (slots.len(), opts.replicas);
    let smallest = slots.iter().copied().min().unwrap_or(0);
    let chunks = match opts.size {
        Some(size) => {
            if size == 0 || !size.is_multiple_of(opts.chunk) {
                return Err(invalid(format!(
                    "size {size} is not a non-zero multiple of chunk {}",
                    opts.chunk
                )));
            }
            size / opts.chunk
        }
        None => smallest.saturating_mul(n as u64) / r as u64,
    };
    if chunks == 0 {
        return Err(invalid(format!(
            "the smallest leg holds {smallest} chunks of {}, less than one chunk",
            opts.chunk
        )));
    }
    let sets = crush_sets(map, opts.rule, r, n, chunks)?;
    let mut rows = Vec::with_capacity(chunks as usize);
    let mut used = vec![0u64; n];
    for c in 0..chunks as usize {
        let got = &sets[c * r..c * r + r];
        if let Some(&d) = got.iter().find(|&&d| used[d as usize] >= slots[d as usize]) {
            if opts.size.is_some() {
                return Err(invalid(format!(
                    "size {} does not fit: CRUSH puts more than {} chunks on leg {d} ({}), which holds {}; use a smaller size",
                    opts.size.unwrap_or(0),
                    used[d as usize],
                    legs[d as usize].describe(),
                    slots[d as usize]
                )));
            }
            break;
        }
        rows.push(
            got.iter()
                .map(|&d| {
                    used[d as usize] += 1;
                    Replica {
                        leg: d,
                        slot: (used[d as usize] - 1) as u32,
                    }
                })
                .collect(),
        );
    }
    if rows.is_empty() {
        return Err(invalid(format!(
            "no chunk of {} fits: leg {} is full before chunk 0",
            opts.chunk,
            slots.iter().position(|&s| s == 0).unwrap_or(0)
        )));
    }
    let chunks = rows.len() as u64;
    Ok((rows, chunks))
}

/// Copies per chunk (by rank, then leg), each leg's data offset in blocks, the chunk count and
/// each leg's metadata.
type Layout = (Vec<Vec<Replica>>, Vec<u64>, u64, Vec<rebalance::LegMeta>);

/// A spec's legs, map, map source (empty for the flat map) and options.
pub type Parsed = (Vec<Box<dyn BlockDevice>>, CrushMap, String, PlacedOptions);

/// CRC-32C of the map's compiled encoding: what the legs record as the map they follow.
pub(crate) fn map_crc(map: &CrushMap) -> u32 {
    kura_engine::crc32c::crc32c(&kura_crush::encode(map))
}

/// Checks that every leg with a header belongs to the same drive, at its position, as `first`.
pub(crate) fn check_agree(
    metas: &[Option<rebalance::LegMeta>],
    legs: &[Box<dyn BlockDevice>],
    first: &layout::Header,
) -> Result<(), OpenError> {
    for (i, m) in metas.iter().enumerate() {
        let Some(m) = m else { continue };
        let h = &m.header;
        let differs = [
            ("drive id", h.drive_id != first.drive_id),
            ("chunk bytes", h.chunk_bytes != first.chunk_bytes),
            ("chunks", h.chunks != first.chunks),
            ("replicas", h.replicas != first.replicas),
            ("leg index", h.leg as usize != i),
        ];
        if let Some((what, _)) = differs.iter().find(|(_, d)| *d) {
            return Err(invalid(format!(
                "leg {i} ({}) does not belong here: its header's {what} differs (leg index {}, {} chunks of {}, drive id {}); legs must be listed in their order, all from one drive",
                legs[i].describe(),
                h.leg,
                h.chunks,
                h.chunk_bytes,
                hex(&h.drive_id)
            )));
        }
    }
    Ok(())
}

/// A random drive id (from the standard library's per-process random hash keys, without a
/// dependency on a random-number crate).
fn drive_id() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut id = [0u8; 16];
    for half in id.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    id
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The persistent layout (format 1): formats blank legs, or reads every leg's header and
/// table. Returns the rows (copies per chunk, by rank then leg), each leg's data offset in
/// blocks and the chunk count.
fn persistent(
    legs: &mut [Box<dyn BlockDevice>],
    map: &CrushMap,
    opts: &PlacedOptions,
    bs: u64,
) -> Result<Layout, OpenError> {
    let n = legs.len();
    let crc = map_crc(map);
    let mut metas = Vec::with_capacity(n);
    let mut blank = Vec::new();
    for (i, leg) in legs.iter_mut().enumerate() {
        match rebalance::read_meta(leg.as_mut()) {
            Ok(m) => metas.push(Some(m)),
            Err(rebalance::ReadMeta::Layout(layout::LayoutError::Blank)) => {
                blank.push(i);
                metas.push(None);
            }
            Err(rebalance::ReadMeta::Io(e)) => {
                return Err(invalid(format!(
                    "leg {i} ({}): reading its header: {e}",
                    leg.describe()
                )))
            }
            Err(rebalance::ReadMeta::Layout(e @ layout::LayoutError::Foreign)) => {
                return Err(invalid(format!(
                    "leg {i} ({}): {e}. Open a drive written before format 1 with `layout=dense`, and copy its data to a new placed drive",
                    leg.describe()
                )))
            }
            Err(rebalance::ReadMeta::Layout(e)) => {
                return Err(invalid(format!("leg {i} ({}): {e}", leg.describe())))
            }
        }
    }
    if blank.len() == n {
        return format(legs, map, opts, bs, crc);
    }
    if let Some(&i) = blank.first() {
        return Err(invalid(format!(
            "leg {i} ({}) is blank but the other legs carry a placed drive; a new leg joins with `kura drive rebalance`",
            legs[i].describe()
        )));
    }
    let metas: Vec<Option<rebalance::LegMeta>> = metas;
    let first = metas
        .iter()
        .flatten()
        .next()
        .map(|m| m.header.clone())
        .ok_or_else(|| invalid("no leg".into()))?;
    check_agree(&metas, legs, &first)?;
    let given = [
        ("chunk", opts.chunk, first.chunk_bytes),
        ("replicas", opts.replicas as u64, first.replicas.into()),
        ("rule", opts.rule.into(), first.rule.into()),
    ];
    if let Some((what, spec, legs_say)) = given.iter().find(|(_, a, b)| a != b) {
        return Err(invalid(format!(
            "the legs were formatted with {what}={legs_say}, the spec says {what}={spec}"
        )));
    }
    if let Some(size) = opts.size {
        if size != first.chunks * first.chunk_bytes {
            return Err(invalid(format!(
                "size={size} differs from the drive's {} bytes recorded on the legs",
                first.chunks * first.chunk_bytes
            )));
        }
    }
    let all: Vec<&rebalance::LegMeta> = metas.iter().flatten().collect();
    if let Some(m) = all
        .iter()
        .find(|m| m.header.flags & layout::FLAG_REBALANCING != 0)
    {
        let whose = if m.header.target_crc == crc {
            "to this spec's map"
        } else {
            "to another map"
        };
        return Err(invalid(format!(
            "a rebalance {whose} was interrupted (leg {}); rerun `kura drive rebalance` with the new spec to finish it",
            m.header.leg
        )));
    }
    if let Some(m) = all.iter().find(|m| m.header.map_crc != crc) {
        return Err(invalid(format!(
            "the legs follow a CRUSH map with CRC {:#010x} (leg {}), this spec's map has CRC {crc:#010x}; open with the map the drive was formatted or rebalanced to, or move the data with `kura drive rebalance`",
            m.header.map_crc, m.header.leg
        )));
    }
    if all.iter().any(|m| m.header.legs as usize != n) {
        return Err(invalid(format!(
            "the legs record {} legs, the spec lists {n}",
            all[0].header.legs
        )));
    }
    let chunks = first.chunks;
    let mut rows: Vec<Vec<(u16, Replica)>> = vec![Vec::new(); chunks as usize];
    for (l, m) in all.iter().enumerate() {
        for (s, e) in m.entries.iter().enumerate() {
            if let Some(e) = e {
                rows[e.chunk as usize].push((
                    e.rank,
                    Replica {
                        leg: l as u16,
                        slot: s as u32,
                    },
                ));
            }
        }
    }
    let mut out = Vec::with_capacity(rows.len());
    for (c, mut row) in rows.into_iter().enumerate() {
        if row.is_empty() {
            return Err(invalid(format!(
                "chunk {c} has no copy in any leg's slot table"
            )));
        }
        if row.len() > layout::MAX_COPIES {
            return Err(invalid(format!(
                "chunk {c} has {} copies, more than {}",
                row.len(),
                layout::MAX_COPIES
            )));
        }
        row.sort_by_key(|&(rank, p)| (rank, p.leg));
        out.push(row.into_iter().map(|(_, p)| p).collect());
    }
    let base = all.iter().map(|m| m.geo.data / bs).collect();
    let metas = metas.into_iter().flatten().collect();
    Ok((out, base, chunks, metas))
}

/// Formats blank legs: CRUSH places chunks densely on the slots each leg has after its
/// metadata, and every leg gets a header and slot table saying so.
fn format(
    legs: &mut [Box<dyn BlockDevice>],
    map: &CrushMap,
    opts: &PlacedOptions,
    bs: u64,
    crc: u32,
) -> Result<Layout, OpenError> {
    let n = legs.len();
    let mut geos = Vec::with_capacity(n);
    for (i, leg) in legs.iter().enumerate() {
        let g = leg.geometry();
        geos.push(
            LegGeometry::of(g.capacity_bytes(), bs, opts.chunk).ok_or_else(|| {
                invalid(format!(
                    "leg {i} ({}) of {} bytes holds less than one chunk of {} after its metadata",
                    leg.describe(),
                    g.capacity_bytes(),
                    opts.chunk
                ))
            })?,
        );
    }
    let slots: Vec<u64> = geos.iter().map(|g| g.slots).collect();
    let (rows, chunks) = assign(map, opts, &slots, legs)?;
    let id = drive_id();
    let mut metas = Vec::with_capacity(n);
    for (l, leg) in legs.iter_mut().enumerate() {
        let geo = geos[l];
        let mut entries = vec![None; geo.slots as usize];
        for (c, row) in rows.iter().enumerate() {
            for (rank, p) in row.iter().enumerate() {
                if p.leg as usize == l {
                    entries[p.slot as usize] = Some(layout::Entry {
                        chunk: c as u32,
                        rank: rank as u16,
                    });
                }
            }
        }
        let mut meta = rebalance::LegMeta {
            geo,
            header: layout::Header {
                block_size: bs as u32,
                drive_id: id,
                leg: l as u32,
                legs: n as u32,
                generation: 0,
                chunk_bytes: opts.chunk,
                replicas: opts.replicas as u32,
                rule: opts.rule,
                chunks,
                slots: geo.slots,
                data: geo.data,
                table_bytes: geo.table,
                map_crc: crc,
                flags: 0,
                map_epoch: 0,
                target_crc: 0,
                table_crc: 0,
                stale: [0; layout::STALE_WORDS],
            },
            entries,
        };
        rebalance::write_meta(leg.as_mut(), &mut meta).map_err(|e| {
            invalid(format!(
                "leg {l} ({}): writing its header: {e}",
                leg.describe()
            ))
        })?;
        metas.push(meta);
    }
    let base = geos.iter().map(|g| g.data / bs).collect();
    Ok((rows, base, chunks, metas))
}

impl Placed {
    /// A placed drive over `legs` (leg `i` is OSD id `i` of `map`); see the module docs for the
    /// checks and the layout. `source` names the map in `describe()` (its path; empty for
    /// [`flat_map`], which a spec gets by naming no map).
    pub fn new(
        mut legs: Vec<Box<dyn BlockDevice>>,
        map: &CrushMap,
        source: &str,
        opts: &PlacedOptions,
    ) -> Result<Self, OpenError> {
        let n = legs.len();
        if !(1..=MAX_LEGS).contains(&n) {
            return Err(invalid(format!("needs 1 to {MAX_LEGS} legs, got {n}")));
        }
        crate::mapped::check_block_sizes("placed", &legs)?;
        let geos: Vec<Geometry> = legs.iter().map(|l| l.geometry()).collect();
        let bs = u64::from(geos[0].block_size);
        let r = opts.replicas;
        if r == 0 || r > MAX_REPLICAS || r > n {
            return Err(invalid(format!(
                "replicas={r} must be 1 to {} (at most one copy per leg, {n} legs given)",
                MAX_REPLICAS.min(n)
            )));
        }
        if opts.chunk == 0 || !opts.chunk.is_multiple_of(bs) {
            return Err(invalid(format!(
                "chunk {} is not a non-zero multiple of the block size {bs}",
                opts.chunk
            )));
        }
        let chunk_blocks = opts.chunk / bs;
        check_rule(map, opts.rule, n)?;
        let (rows, base, chunks, metas) = if opts.dense {
            let slots: Vec<u64> = geos.iter().map(|g| g.num_blocks / chunk_blocks).collect();
            let (rows, chunks) = assign(map, opts, &slots, &legs)?;
            (rows, vec![0; n], chunks, Vec::new())
        } else {
            persistent(&mut legs, map, opts, bs)?
        };
        // A leg any header marks stale missed acknowledged writes: it opens out of service.
        let marked: Vec<bool> = (0..n)
            .map(|l| metas.iter().any(|m| m.header.marks_stale(l)))
            .collect();
        let health: Vec<LegHealth> = marked
            .iter()
            .enumerate()
            .map(|(l, &m)| {
                if m {
                    LegHealth::Degraded {
                        reason: format!(
                            "marked stale in the other legs' headers (it missed writes); refill it with `kura drive rebalance SPEC --resync {l}`"
                        ),
                    }
                } else {
                    LegHealth::Healthy
                }
            })
            .collect();
        if let Some((c, row)) = rows
            .iter()
            .enumerate()
            .find(|(_, row)| row.iter().all(|p| marked[p.leg as usize]))
        {
            let on: Vec<String> = row.iter().map(|p| p.leg.to_string()).collect();
            return Err(invalid(format!(
                "chunk {c} has copies only on legs marked stale ({}); its acknowledged data is on no leg in service",
                on.join(", ")
            )));
        }
        let mut table = Vec::new();
        let mut starts = Vec::with_capacity(rows.len() + 1);
        for row in rows {
            starts.push(table.len() as u32);
            table.extend(row);
        }
        starts.push(table.len() as u32);
        Ok(Placed {
            fan: Fanout::new(legs),
            geo: combined_geometry(&geos, chunks * chunk_blocks),
            table,
            starts,
            base,
            replicas: r,
            chunk_blocks,
            rule: opts.rule,
            source: source.to_string(),
            balanced: opts.balanced_reads,
            health,
            read_errors: vec![0; n],
            groups: HashMap::new(),
            next_group: 0,
            metas,
            marked,
            meta_owner: None,
            meta_waiting: Vec::new(),
            flushes: HashMap::new(),
        })
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        (self.starts.len() - 1) as u64
    }

    /// Chunk size in blocks.
    pub fn chunk_blocks(&self) -> u64 {
        self.chunk_blocks
    }

    /// Where chunk `chunk`'s copies live: `(leg, first block on the leg)` in CRUSH order.
    pub fn placement(&self, chunk: u64) -> Option<Vec<(usize, u64)>> {
        let c = usize::try_from(chunk).ok()?;
        let row = self.row(c)?;
        Some(
            row.iter()
                .map(|p| {
                    (
                        p.leg as usize,
                        self.base[p.leg as usize] + u64::from(p.slot) * self.chunk_blocks,
                    )
                })
                .collect(),
        )
    }

    /// Every leg's device, health and read errors.
    pub fn status(&self) -> Vec<LegStatus> {
        self.fan.leg_status(&self.health, &self.read_errors)
    }

    /// Direct access to one leg's device, for inspection; only while the drive is idle.
    pub fn leg_mut(&mut self, leg: usize) -> Option<&mut (dyn BlockDevice + 'static)> {
        self.fan.idle_leg_mut(leg)
    }

    fn dispatch(&mut self, id: usize) {
        let Some(parent) = self.fan.parent_mut(id) else {
            return;
        };
        let (op, lba, blocks) = (parent.req.op, parent.req.lba, parent.req.blocks);
        if op == Opcode::Flush {
            self.start_flush(id);
            return;
        }
        // Runs of the request within one chunk: (chunk, block in chunk, block in request,
        // blocks), computed as they are walked (twice), so no request allocates for them.
        let cb = self.chunk_blocks;
        let runs = move || {
            let mut at = 0;
            std::iter::from_fn(move || {
                (at < blocks).then(|| {
                    let b = lba + at;
                    let (chunk, off) = (b / cb, b % cb);
                    let n = (cb - off).min(blocks - at);
                    let run = (chunk, off, at, n);
                    at += n;
                    run
                })
            })
        };
        // Health changes only when pieces finish, so checking every run first means a request
        // is either refused whole or sent whole.
        if let Some((chunk, ..)) = runs().find(|&(chunk, ..)| self.next_replica(chunk, 0).is_none())
        {
            let e = offline(format!(
                "every replica of chunk {chunk} is out of service: {}",
                self.describe_health()
            ));
            self.fan.complete_parent(id, Err(e));
            return;
        }
        let single = blocks <= cb - lba % cb;
        let bs = self.geo.block_size as usize;
        for (chunk, off, at, n) in runs() {
            if op == Opcode::Read {
                let idx = self.read_replica(chunk).unwrap_or(0);
                let buf = if single {
                    self.fan.parent_mut(id).and_then(|p| p.req.buf.take())
                } else {
                    Some(scratch(n as usize * bs))
                };
                let (leg, leg_lba) = self.locate(chunk, idx, off);
                let req = child_request(op, leg_lba, n, buf);
                let meta = Piece::Read {
                    chunk,
                    off,
                    at,
                    blocks: n,
                    tried: 1 << idx,
                    whole: single,
                };
                self.fan.send(id, leg, req, meta);
                continue;
            }
            let targets: Vec<usize> = (0..self.copies(chunk))
                .filter(|&i| self.in_service(self.replica(chunk, i).leg as usize))
                .collect();
            let group = self.next_group;
            self.next_group = self.next_group.wrapping_add(1);
            self.groups.insert(
                group,
                Group {
                    left: targets.len(),
                    ok: Vec::new(),
                    failed: Vec::new(),
                },
            );
            // Copies first; the first target then takes the caller's own buffer when the
            // request is one run.
            for (k, &i) in targets.iter().enumerate() {
                let whole = single && k == 0 && op == Opcode::Write;
                if whole {
                    continue;
                }
                let buf = (op == Opcode::Write).then(|| {
                    let mut b = scratch(n as usize * bs);
                    if let Some(src) = self.fan.parent_mut(id).and_then(|p| p.req.buf.as_ref()) {
                        let from = at as usize * bs;
                        b.copy_from_slice(&src[from..from + n as usize * bs]);
                    }
                    b
                });
                let (leg, leg_lba) = self.locate(chunk, i, off);
                let req = child_request(op, leg_lba, n, buf);
                self.fan.send(
                    id,
                    leg,
                    req,
                    Piece::Mutation {
                        group,
                        whole: false,
                    },
                );
            }
            if single && op == Opcode::Write {
                if let Some(&i) = targets.first() {
                    let (leg, leg_lba) = self.locate(chunk, i, off);
                    self.fan.send_whole(
                        id,
                        leg,
                        leg_lba,
                        Piece::Mutation { group, whole: true },
                        Piece::Mutation {
                            group,
                            whole: false,
                        },
                    );
                }
            }
        }
    }

    /// Which legs are out of service now.
    fn out_set(&self) -> Vec<bool> {
        self.health
            .iter()
            .map(|h| *h != LegHealth::Healthy)
            .collect()
    }

    /// Starts (or restarts) caller flush `id`. When a leg went out of service since the marks
    /// last became durable, the in-service legs' metadata first records it (so a reopen never
    /// serves the stale leg's copies of writes this flush acknowledges); then every in-service
    /// leg is flushed.
    fn start_flush(&mut self, id: usize) {
        let now = self.out_set();
        let Some(legs) = self.flush_legs(id) else {
            return;
        };
        if self.metas.is_empty() || now == self.marked {
            self.send_flushes(id, now, legs);
            return;
        }
        if self.meta_owner.is_some_and(|o| o != id) {
            self.meta_waiting.push(id);
            return;
        }
        self.meta_owner = Some(id);
        let bs = u64::from(self.geo.block_size);
        for leg in legs {
            let max = u64::from(self.fan.legs[leg].dev.geometry().max_transfer)
                .max(bs)
                .div_ceil(bs)
                * bs;
            let m = &mut self.metas[leg];
            for (l, &out) in now.iter().enumerate() {
                m.header.set_stale(l, out);
            }
            m.header.generation += 1;
            let copy = m.header.generation % 2;
            let table = layout::encode_table(&m.entries, m.geo.table);
            m.header.table_crc = kura_engine::crc32c::crc32c(&table);
            let header = layout::encode_header(&m.header, m.geo.header);
            let (table_at, header_at) = (m.geo.table_at(copy), m.geo.header_at(copy));
            for (at, bytes) in [(table_at, table), (header_at, header)] {
                for (i, part) in bytes.chunks(max as usize).enumerate() {
                    let mut buf = scratch(part.len());
                    buf.copy_from_slice(part);
                    let lba = (at + i as u64 * max) / bs;
                    let req = child_request(Opcode::Write, lba, part.len() as u64 / bs, Some(buf));
                    self.fan.send(id, leg, req, Piece::Meta);
                }
            }
        }
        self.flushes.insert(id, FlushStage::Meta(now));
    }

    /// The in-service legs caller flush `id` goes to; when there are none the flush ends with
    /// an offline error and this is `None`.
    fn flush_legs(&mut self, id: usize) -> Option<Vec<usize>> {
        let legs: Vec<usize> = (0..self.health.len())
            .filter(|&l| self.in_service(l))
            .collect();
        if legs.is_empty() {
            let e = offline("every leg is out of service".into());
            self.end_flush(id, Err(e));
            return None;
        }
        Some(legs)
    }

    /// Enters caller flush `id`'s flush stage (out-of-service set `set`) and flushes `legs`.
    fn send_flushes(&mut self, id: usize, set: Vec<bool>, legs: Vec<usize>) {
        self.flushes.insert(id, FlushStage::Flush(set));
        for leg in legs {
            self.fan
                .send(id, leg, kura_engine::Request::flush(0), Piece::Flush);
        }
    }

    /// Every piece of caller flush `id`'s current stage is in.
    fn flush_stage_done(&mut self, id: usize) {
        let failed = self
            .fan
            .parent_mut(id)
            .is_none_or(|p| !p.failures.is_empty());
        let stage = self.flushes.remove(&id);
        if failed {
            let status = self.fan.parent_mut(id).map_or(Ok(()), |p| p.first_status());
            self.end_flush(id, status);
            return;
        }
        match stage {
            Some(FlushStage::Meta(set)) => {
                // The marks are written; the flush makes them (and the data) durable.
                if let Some(legs) = self.flush_legs(id) {
                    self.send_flushes(id, set, legs);
                }
            }
            Some(FlushStage::Flush(set)) => {
                if set == self.out_set() {
                    if self.meta_owner == Some(id) {
                        self.marked = set;
                    }
                    self.end_flush(id, Ok(()));
                } else {
                    // A leg went out during this flush: record it before acknowledging.
                    self.start_flush(id);
                }
            }
            None => self.end_flush(id, Ok(())),
        }
    }

    /// Completes caller flush `id` and lets the flushes that waited for its marks go on.
    fn end_flush(&mut self, id: usize, status: DeviceResult<()>) {
        self.flushes.remove(&id);
        if let Some(p) = self.fan.take_parent(id) {
            self.fan.complete(p.req, status);
        }
        if self.meta_owner == Some(id) {
            self.meta_owner = None;
            for w in std::mem::take(&mut self.meta_waiting) {
                self.start_flush(w);
            }
        }
    }

    fn row(&self, c: usize) -> Option<&[Replica]> {
        let (a, b) = (*self.starts.get(c)?, *self.starts.get(c + 1)?);
        self.table.get(a as usize..b as usize)
    }

    /// Copies of `chunk` (usually `replicas`; more while a rebalance is half done).
    fn copies(&self, chunk: u64) -> usize {
        self.row(chunk as usize).map_or(0, <[Replica]>::len)
    }

    fn replica(&self, chunk: u64, idx: usize) -> Replica {
        self.table[self.starts[chunk as usize] as usize + idx]
    }

    /// Leg and LBA there of block `off` of replica `idx` of `chunk`.
    fn locate(&self, chunk: u64, idx: usize, off: u64) -> (usize, u64) {
        let p = self.replica(chunk, idx);
        (
            p.leg as usize,
            self.base[p.leg as usize] + u64::from(p.slot) * self.chunk_blocks + off,
        )
    }

    fn in_service(&self, leg: usize) -> bool {
        self.health[leg] == LegHealth::Healthy
    }

    /// The first replica of `chunk` whose leg is in service.
    fn next_replica(&self, chunk: u64, from: usize) -> Option<usize> {
        (from..self.copies(chunk)).find(|&i| self.in_service(self.replica(chunk, i).leg as usize))
    }

    /// The replica of `chunk` a read goes to first: the first in service in CRUSH order, or
    /// with `read=balanced` the in-service one whose leg has the fewest commands in flight (the
    /// first of equals in CRUSH order).
    fn read_replica(&self, chunk: u64) -> Option<usize> {
        if !self.balanced {
            return self.next_replica(chunk, 0);
        }
        (0..self.copies(chunk))
            .filter(|&i| self.in_service(self.replica(chunk, i).leg as usize))
            .min_by_key(|&i| self.fan.legs[self.replica(chunk, i).leg as usize].load())
    }

    /// The first in-service replica of `chunk`, in CRUSH order, not in `tried`.
    fn untried_replica(&self, chunk: u64, tried: u32) -> Option<usize> {
        (0..self.copies(chunk)).find(|&i| {
            tried & (1 << i) == 0 && self.in_service(self.replica(chunk, i).leg as usize)
        })
    }

    fn describe_health(&self) -> String {
        describe_health(&self.health)
    }

    fn on_done(&mut self, done: Done<Piece>) {
        let Done {
            parent,
            leg,
            meta,
            completion,
        } = done;
        let bs = self.geo.block_size as usize;
        let status = match meta {
            Piece::Read {
                chunk,
                off,
                at,
                blocks,
                tried,
                whole,
            } => {
                let mut status = completion.status;
                if let Err(e) = &status {
                    self.read_errors[leg] += 1;
                    let retry = self.untried_replica(chunk, tried);
                    if retry.is_some() {
                        self.take_out(leg, &format!("read failed: {e}"));
                    }
                    if let (Some(next), true) = (retry, self.fan.parent_mut(parent).is_some()) {
                        let (to, to_lba) = self.locate(chunk, next, off);
                        let req = child_request(Opcode::Read, to_lba, blocks, completion.buf);
                        let meta = Piece::Read {
                            chunk,
                            off,
                            at,
                            blocks,
                            tried: tried | 1 << next,
                            whole,
                        };
                        self.fan.send(parent, to, req, meta);
                        // This attempt is over; the retry now carries the piece.
                        status = Ok(());
                        self.finish_piece(parent, leg, status);
                        return;
                    }
                }
                if let Some(p) = self.fan.parent_mut(parent) {
                    if whole {
                        p.req.buf = completion.buf;
                    } else if let (Ok(()), Some(src), Some(dst)) =
                        (&status, completion.buf.as_ref(), p.req.buf.as_mut())
                    {
                        let (to, len) = (at as usize * bs, blocks as usize * bs);
                        dst[to..to + len].copy_from_slice(&src[..len]);
                    }
                }
                status
            }
            Piece::Mutation { group, whole } => {
                if whole {
                    if let Some(p) = self.fan.parent_mut(parent) {
                        p.req.buf = completion.buf;
                    }
                }
                let Some(g) = self.groups.get_mut(&group) else {
                    // Every piece belongs to a group that lives until its last replica is in.
                    self.finish_piece(parent, leg, completion.status);
                    return;
                };
                match completion.status {
                    Ok(()) => g.ok.push(leg),
                    Err(e) => g.failed.push((leg, e)),
                }
                g.left = g.left.saturating_sub(1);
                if g.left > 0 {
                    Ok(())
                } else {
                    match self.groups.remove(&group) {
                        Some(g) => self.verdict(g),
                        None => Ok(()),
                    }
                }
            }
            Piece::Flush | Piece::Meta => {
                let what = match meta {
                    Piece::Meta => "writing the stale marks",
                    _ => "flush",
                };
                let status = match completion.status {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        if self.take_out(leg, &format!("{what} failed: {e}")) {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    }
                };
                if self.fan.piece_done(parent, leg, status) {
                    self.flush_stage_done(parent);
                }
                return;
            }
        };
        self.finish_piece(parent, leg, status);
    }

    /// A chunk's mutation is acknowledged when a replica still in service took it and every
    /// replica that failed it could be taken out of service.
    fn verdict(&mut self, g: Group) -> DeviceResult<()> {
        let mut failed = g.failed.into_iter();
        if !g.ok.iter().any(|&l| self.in_service(l)) {
            return match failed.next() {
                Some((_, e)) => Err(e),
                None => Err(offline(format!(
                    "no replica in service took the write: {}",
                    self.describe_health()
                ))),
            };
        }
        let mut status = Ok(());
        for (leg, e) in failed {
            if !self.take_out(leg, &format!("write failed: {e}")) && status.is_ok() {
                status = Err(e);
            }
        }
        status
    }

    /// Takes `leg` out of service unless that would leave some chunk with no replica in
    /// service; true when the leg is out (now or already).
    fn take_out(&mut self, leg: usize, reason: &str) -> bool {
        if !self.in_service(leg) {
            return true;
        }
        let orphans = self.starts.windows(2).any(|w| {
            self.table[w[0] as usize..w[1] as usize]
                .iter()
                .all(|p| p.leg as usize == leg || !self.in_service(p.leg as usize))
        });
        if orphans {
            return false;
        }
        self.health[leg] = LegHealth::Degraded {
            reason: reason.to_string(),
        };
        true
    }

    fn finish_piece(&mut self, parent: usize, leg: usize, status: DeviceResult<()>) {
        if !self.fan.piece_done(parent, leg, status) {
            return;
        }
        if let Some(mut p) = self.fan.take_parent(parent) {
            let status = p.first_status();
            self.fan.complete(p.req, status);
        }
    }
}

fn describe_health(health: &[LegHealth]) -> String {
    unhealthy_legs(health, "out of service").join("; ")
}

fn offline(reason: String) -> DeviceError {
    DeviceError::Offline {
        reason: format!("placed: {reason}"),
    }
}

impl BlockDevice for Placed {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        let legs: Vec<String> = self.fan.legs.iter().map(|l| l.dev.describe()).collect();
        let chunk = self.chunk_blocks * u64::from(self.geo.block_size);
        let map = if self.source.is_empty() {
            String::new()
        } else {
            format!("map={}&", self.source)
        };
        let mut s = format!(
            "placed({})?{map}rule={}&replicas={}&chunk={chunk}{}{}",
            legs.join(","),
            self.rule,
            self.replicas,
            if self.balanced { "&read=balanced" } else { "" },
            if self.base.iter().all(|&b| b == 0) {
                "&layout=dense"
            } else {
                ""
            }
        );
        let health = self.describe_health();
        if !health.is_empty() {
            s.push_str(&format!(" [{health}]"));
        }
        s
    }

    fanout_methods!();

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        // The handler needs the whole drive (health, table, groups) beside the fanout, so the
        // fanout is moved out for the call and put back after.
        let mut fan = std::mem::replace(&mut self.fan, Fanout::new(Vec::new()));
        let result = fan.poll_with(out, min_complete, |fan, done| {
            std::mem::swap(&mut self.fan, fan);
            self.on_done(done);
            std::mem::swap(&mut self.fan, fan);
        });
        self.fan = fan;
        result
    }
}

/// Opens `placed(LEG0,LEG1,...)?map=PATH&rule=R&replicas=N&chunk=SIZE&size=SIZE&read=POLICY`.
pub fn open(spec: &Spec, children: ChildOpener<'_>) -> Result<Placed, OpenError> {
    let (legs, map, source, opts) = parse(spec, children)?;
    Placed::new(legs, &map, &source, &opts).map_err(|e| crate::in_spec(spec, e))
}

/// `kura drive rebalance SPEC`: opens the legs of the `placed(...)` spec `spec` through
/// `children` and moves the drive's chunks to where the spec's map places them (see
/// [`rebalance()`](fn@rebalance)); legs listed after the drive's present ones must be blank.
pub fn rebalance_spec(
    spec: &Spec,
    children: ChildOpener<'_>,
    resync: &[usize],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RebalanceReport, OpenError> {
    if spec.kind != "placed" {
        return Err(OpenError::Invalid(format!(
            "{spec}: not a placed(...) spec"
        )));
    }
    let (mut legs, map, _, opts) = parse(spec, children)?;
    if opts.dense {
        return Err(crate::in_spec(
            spec,
            invalid(
                "layout=dense keeps no slot tables, so it cannot be rebalanced; copy its data to a format-1 drive".into(),
            ),
        ));
    }
    rebalance(&mut legs, &map, &opts, resync, progress).map_err(|e| crate::in_spec(spec, e))
}

/// Opens the legs of a `placed(...)` spec and reads its map and options.
pub fn parse(spec: &Spec, children: ChildOpener<'_>) -> Result<Parsed, OpenError> {
    spec.check_options(&["map", "rule", "replicas", "chunk", "size", "read", "layout"])?;
    let dense = match spec.option("layout") {
        None | Some("1") => false,
        Some("dense") => true,
        Some(other) => {
            return Err(invalid(format!(
                "layout `{other}` is not a layout (1, the default, or dense)"
            )))
        }
    };
    let balanced_reads = match spec.option("read") {
        None | Some("primary") => false,
        Some("balanced") => true,
        Some(other) => {
            return Err(invalid(format!(
                "read `{other}` is not a read policy (primary or balanced)"
            )))
        }
    };
    let legs = crate::open_children(spec, children, 1, Some(MAX_LEGS))?;
    let (map, source) = match spec.option("map") {
        Some(path) => {
            let bytes = std::fs::read(path)
                .map_err(|e| invalid(format!("cannot read the CRUSH map {path}: {e}")))?;
            let map = kura_crush::decode(&bytes)
                .map_err(|e| invalid(format!("{path} is not a compiled CRUSH map: {e}")))?;
            (map, path.to_string())
        }
        None => (flat_map(legs.len()), String::new()),
    };
    let rule = match spec.option("rule") {
        None => 0,
        Some(v) => match v.parse::<u32>() {
            Ok(id) => id,
            Err(_) => map.rule_by_name(v).ok_or_else(|| {
                invalid(format!(
                    "rule `{v}` is neither a rule id nor a rule name of the map"
                ))
            })?,
        },
    };
    let opts = PlacedOptions {
        rule,
        replicas: spec.num_option("replicas")?.unwrap_or(2),
        chunk: spec.size_option("chunk")?.unwrap_or(DEFAULT_CHUNK),
        size: spec.size_option("size")?,
        balanced_reads,
        dense,
    };
    Ok((legs, map, source, opts))
}
