//! Reading and writing a `placed` leg's metadata (header + slot table, A/B copies; see
//! [`super::layout`]) with blocking I/O, and `kura drive rebalance`: moving the chunks whose
//! replica set a new CRUSH map changes, crash-safely (the on-leg tables are the only state, so a
//! rerun after a crash resumes where the tables say).

use super::layout::{self, Entry, Geometry, Header, LayoutError, FLAG_REBALANCING};
use super::{crush_sets, invalid, PlacedOptions};
use kura_crush::CrushMap;
use kura_engine::blocking::BlockingIo;
use kura_engine::{BlockDevice, DeviceError, OpenError};
use std::collections::BTreeSet;

/// One leg's metadata as read or about to be written.
#[derive(Debug, Clone)]
pub struct LegMeta {
    pub geo: Geometry,
    pub header: Header,
    /// One entry per slot; `None` is a free slot.
    pub entries: Vec<Option<Entry>>,
}

/// Why a leg's metadata could not be read.
#[derive(Debug)]
pub enum ReadMeta {
    Io(DeviceError),
    Layout(LayoutError),
}

/// Reads and checks `leg`'s newest valid metadata copy.
pub fn read_meta(leg: &mut dyn BlockDevice) -> Result<LegMeta, ReadMeta> {
    let g = leg.geometry();
    let (bs, leg_bytes) = (u64::from(g.block_size), g.capacity_bytes());
    let hb = layout::HEADER_BYTES.div_ceil(bs) * bs;
    if leg_bytes < 2 * hb {
        return Err(ReadMeta::Layout(LayoutError::Damaged(format!(
            "the leg ({leg_bytes} bytes) is smaller than two header copies"
        ))));
    }
    let mut heads = vec![0u8; 2 * hb as usize];
    leg.read_blocks(0, &mut heads).map_err(ReadMeta::Io)?;
    let (h0, h1) = heads.split_at(hb as usize);
    // The table's size comes from whichever header decodes.
    let decoded = [h0, h1]
        .iter()
        .find_map(|h| layout::decode_header(h, leg_bytes, g.block_size).ok());
    let mut tables = Vec::new();
    let geo = match &decoded {
        Some(h) => Geometry::of(leg_bytes, bs, h.chunk_bytes),
        None => None,
    };
    if let Some(geo) = geo {
        tables = vec![0u8; 2 * geo.table as usize];
        leg.read_blocks(geo.table_at(0) / bs, &mut tables)
            .map_err(ReadMeta::Io)?;
    }
    let half = tables.len() / 2;
    let (t0, t1) = tables.split_at(half);
    let (header, entries) =
        layout::pick([h0, h1], [t0, t1], leg_bytes, g.block_size).map_err(ReadMeta::Layout)?;
    let geo = Geometry::of(leg_bytes, bs, header.chunk_bytes).ok_or_else(|| {
        ReadMeta::Layout(LayoutError::Damaged("no geometry for the header".into()))
    })?;
    Ok(LegMeta {
        geo,
        header,
        entries,
    })
}

/// Writes `meta` as the next generation (bumping `meta.header.generation`) into the copy that
/// does not hold the current one, then flushes the leg.
pub fn write_meta(leg: &mut dyn BlockDevice, meta: &mut LegMeta) -> Result<(), DeviceError> {
    let bs = u64::from(leg.geometry().block_size);
    meta.header.generation += 1;
    let copy = meta.header.generation % 2;
    let table = layout::encode_table(&meta.entries, meta.geo.table);
    meta.header.table_crc = kura_engine::crc32c::crc32c(&table);
    let header = layout::encode_header(&meta.header, meta.geo.header);
    leg.write_blocks(meta.geo.table_at(copy) / bs, &table)?;
    leg.write_blocks(meta.geo.header_at(copy) / bs, &header)?;
    leg.flush_all()
}

/// What a rebalance did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RebalanceReport {
    /// Chunks of the drive.
    pub chunks: u64,
    /// Copies the new map wants (chunks × replicas).
    pub placements: u64,
    /// Chunks that got at least one new copy.
    pub chunks_moved: u64,
    /// Chunk copies made.
    pub copies: u64,
    /// Copies dropped from legs the new map no longer uses for their chunk.
    pub dropped: u64,
    /// The fewest copies any rebalance must make: the sum over legs of how many more copies
    /// the leg holds under the new map than it held before (the count bound of `kura crush diff`).
    pub minimum: u64,
    /// Legs that were blank and got formatted.
    pub formatted: usize,
    /// Copies forgotten on the legs named for resync (refilled from the other copies).
    pub forgotten: u64,
    /// Times a chunk waited for a later pass because a leg it moves to was full.
    pub deferred: u64,
    /// Legs resynced: those named, and those a header marked stale.
    pub resynced: Vec<usize>,
}

impl RebalanceReport {
    /// Copies made over the placements of the new map.
    pub fn moved_fraction(&self) -> f64 {
        self.copies as f64 / self.placements.max(1) as f64
    }
    /// The minimum over the placements of the new map.
    pub fn minimum_fraction(&self) -> f64 {
        self.minimum as f64 / self.placements.max(1) as f64
    }
}

/// Chunks per batch: their copies are made, flushed, then the tables updated.
const BATCH: u64 = 32;

fn io(leg: usize, what: &str, e: DeviceError) -> OpenError {
    invalid(format!("rebalance: {what} on leg {leg}: {e}"))
}

/// Moves `legs`' chunks to where `map` (rule and replicas from `opts`) places them. Legs past
/// those carrying a header must be blank (all zero at the start) and are formatted. The map's
/// CRC becomes the one the legs follow. `progress(done, total)` is called as chunks are done.
///
/// `resync` names legs whose copies may be stale (a host that was out of service while the
/// drive took writes): their tables are emptied first — refused unless every chunk keeps a copy
/// on another leg — so the chunks CRUSH puts there are copied back from the other legs.
pub fn rebalance(
    legs: &mut [Box<dyn BlockDevice>],
    map: &CrushMap,
    opts: &PlacedOptions,
    resync: &[usize],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RebalanceReport, OpenError> {
    let n = legs.len();
    let target_crc = super::map_crc(map);
    let mut metas: Vec<Option<LegMeta>> = Vec::with_capacity(n);
    for (i, leg) in legs.iter_mut().enumerate() {
        match read_meta(leg.as_mut()) {
            Ok(m) => metas.push(Some(m)),
            Err(ReadMeta::Layout(LayoutError::Blank)) => metas.push(None),
            Err(ReadMeta::Io(e)) => return Err(io(i, "reading the metadata", e)),
            Err(ReadMeta::Layout(e)) => {
                return Err(invalid(format!(
                    "leg {i} ({}): {e}; refusing to rebalance",
                    leg.describe()
                )))
            }
        }
    }
    let Some(first) = metas.iter().flatten().next().map(|m| m.header.clone()) else {
        return Err(invalid(
            "rebalance: no leg carries a placed header; open the drive once to format it".into(),
        ));
    };
    super::check_agree(&metas, legs, &first)?;
    if opts.chunk != first.chunk_bytes || opts.replicas != first.replicas as usize {
        return Err(invalid(format!(
            "rebalance: the legs hold chunk={} replicas={}; the spec says chunk={} replicas={} (changing them is not supported)",
            first.chunk_bytes, first.replicas, opts.chunk, opts.replicas
        )));
    }
    let chunks = first.chunks;
    let bs = u64::from(legs[0].geometry().block_size);
    let chunk_blocks = first.chunk_bytes / bs;
    let r = opts.replicas;
    // The new sets.
    let sets = crush_sets(map, opts.rule, r, n, chunks)?;
    // Format blank legs, with empty tables.
    let mut report = RebalanceReport {
        chunks,
        placements: chunks * r as u64,
        ..Default::default()
    };
    let mut metas: Vec<LegMeta> = {
        let mut out = Vec::with_capacity(n);
        for (i, m) in metas.into_iter().enumerate() {
            out.push(match m {
                Some(m) => m,
                None => {
                    let g = legs[i].geometry();
                    let geo = Geometry::of(g.capacity_bytes(), bs, first.chunk_bytes).ok_or_else(
                        || {
                            invalid(format!(
                                "rebalance: leg {i} ({}) is too small for one chunk of {}",
                                legs[i].describe(),
                                first.chunk_bytes
                            ))
                        },
                    )?;
                    report.formatted += 1;
                    LegMeta {
                        geo,
                        header: Header {
                            leg: i as u32,
                            generation: 0,
                            slots: geo.slots,
                            data: geo.data,
                            table_bytes: geo.table,
                            ..first.clone()
                        },
                        entries: vec![None; geo.slots as usize],
                    }
                }
            });
        }
        out
    };
    // Legs a header marks stale (taken out of service while the drive took writes) are
    // resynced whether named or not: their copies must not be the source of any copy.
    let mut resync: Vec<usize> = resync.to_vec();
    for l in 0..n {
        if metas.iter().any(|m| m.header.marks_stale(l)) && !resync.contains(&l) {
            resync.push(l);
        }
    }
    resync.sort_unstable();
    report.resynced = resync.clone();
    let resync = &resync[..];
    for &l in resync {
        let Some(m) = metas.get_mut(l) else {
            return Err(invalid(format!(
                "rebalance: resync of leg {l}, but the drive has legs 0 to {}",
                n - 1
            )));
        };
        for e in m.entries.iter_mut() {
            report.forgotten += u64::from(e.take().is_some());
        }
    }
    // Current copies per chunk: (leg, slot).
    let mut where_: Vec<Vec<(usize, u64)>> = vec![Vec::new(); chunks as usize];
    for (l, m) in metas.iter().enumerate() {
        for (s, e) in m.entries.iter().enumerate() {
            if let Some(e) = e {
                where_[e.chunk as usize].push((l, s as u64));
            }
        }
    }
    if let Some(c) = where_.iter().position(Vec::is_empty) {
        return Err(invalid(format!(
            "rebalance: chunk {c} has no copy outside the legs to resync ({resync:?}); nothing was changed"
        )));
    }
    // The count bound, and whether every leg has room for what it will hold.
    let mut before = vec![0u64; n];
    let mut after = vec![0u64; n];
    for c in 0..chunks as usize {
        for &(l, _) in &where_[c] {
            before[l] += 1;
        }
        for &l in &sets[c * r..c * r + r] {
            after[l as usize] += 1;
        }
    }
    report.minimum = (0..n).map(|l| after[l].saturating_sub(before[l])).sum();
    for l in 0..n {
        if after[l] > metas[l].geo.slots {
            return Err(invalid(format!(
                "rebalance: the new map puts {} chunks on leg {l} ({}), which holds {}",
                after[l],
                legs[l].describe(),
                metas[l].geo.slots
            )));
        }
    }
    // Start: every leg records the target and the new leg count (blank legs get formatted).
    for (l, m) in metas.iter_mut().enumerate() {
        m.header.legs = n as u32;
        m.header.flags |= FLAG_REBALANCING;
        m.header.target_crc = target_crc;
        write_meta(legs[l].as_mut(), m).map_err(|e| io(l, "writing the header", e))?;
    }
    let mut free: Vec<Vec<u64>> = metas
        .iter()
        .map(|m| {
            (0..m.geo.slots)
                .rev()
                .filter(|&s| m.entries[s as usize].is_none())
                .collect()
        })
        .collect();
    let mut buf = vec![0u8; first.chunk_bytes as usize];
    progress(0, chunks);
    // Chunks in order; one that needs a slot on a leg with none free waits for a later pass,
    // after other chunks' old copies left that leg (a full leg gains before it loses).
    let mut pending: Vec<u64> = (0..chunks).collect();
    let mut done = 0u64;
    while !pending.is_empty() {
        let mut deferred = Vec::new();
        let mut progressed = false;
        let mut next = 0usize;
        while next < pending.len() {
            let mut gained = BTreeSet::new();
            let mut removals: Vec<(usize, u64)> = Vec::new();
            let mut in_batch = 0u64;
            while next < pending.len() && in_batch < BATCH {
                let c = pending[next];
                next += 1;
                let want = &sets[c as usize * r..c as usize * r + r];
                let have = where_[c as usize].clone();
                let short = want.iter().any(|&l| {
                    !have.iter().any(|&(hl, _)| hl == l as usize) && free[l as usize].is_empty()
                });
                if short {
                    deferred.push(c);
                    continue;
                }
                in_batch += 1;
                let mut copied = false;
                for (rank, &l) in want.iter().enumerate() {
                    let l = l as usize;
                    let entry = Some(Entry {
                        chunk: c as u32,
                        rank: rank as u16,
                    });
                    if let Some(&(_, s)) = have.iter().find(|&&(hl, _)| hl == l) {
                        if metas[l].entries[s as usize] != entry {
                            metas[l].entries[s as usize] = entry;
                            gained.insert(l);
                        }
                        continue;
                    }
                    // A new copy: read from a current one (lowest rank first), write to a free
                    // slot.
                    let mut src = have.clone();
                    src.sort_by_key(|&(hl, s)| metas[hl].entries[s as usize].map(|e| e.rank));
                    let Some(&(sl, ss)) = src.first() else {
                        return Err(invalid(format!(
                            "rebalance: chunk {c} has no copy on any leg"
                        )));
                    };
                    let at = (metas[sl].geo.data / bs) + ss * chunk_blocks;
                    legs[sl]
                        .read_blocks(at, &mut buf)
                        .map_err(|e| io(sl, "reading a chunk", e))?;
                    let Some(slot) = free[l].pop() else {
                        return Err(invalid(format!(
                            "rebalance: leg {l} ({}) has no free slot for chunk {c}",
                            legs[l].describe()
                        )));
                    };
                    let to = (metas[l].geo.data / bs) + slot * chunk_blocks;
                    legs[l]
                        .write_blocks(to, &buf)
                        .map_err(|e| io(l, "writing a chunk", e))?;
                    metas[l].entries[slot as usize] = entry;
                    where_[c as usize].push((l, slot));
                    gained.insert(l);
                    report.copies += 1;
                    copied = true;
                }
                for &(l, s) in &have {
                    if !want.contains(&(l as u16)) {
                        removals.push((l, s));
                    }
                }
                report.chunks_moved += u64::from(copied);
            }
            progressed |= in_batch > 0;
            // The copies are durable before any table names them...
            for &l in &gained {
                legs[l]
                    .flush_all()
                    .map_err(|e| io(l, "flushing copies", e))?;
            }
            // ...the tables name the new copies (the old ones still valid) ...
            for &l in &gained {
                write_meta(legs[l].as_mut(), &mut metas[l])
                    .map_err(|e| io(l, "writing the table", e))?;
            }
            // ... and only then drop the old copies; their slots are reused after that write.
            let losing: BTreeSet<usize> = removals.iter().map(|&(l, _)| l).collect();
            for &(l, s) in &removals {
                if let Some(e) = metas[l].entries[s as usize].take() {
                    where_[e.chunk as usize].retain(|&(wl, ws)| (wl, ws) != (l, s));
                }
            }
            for &l in &losing {
                write_meta(legs[l].as_mut(), &mut metas[l])
                    .map_err(|e| io(l, "writing the table", e))?;
            }
            for &(l, s) in &removals {
                free[l].push(s);
                report.dropped += 1;
            }
            done += in_batch;
            progress(done, chunks);
        }
        if !progressed {
            return Err(invalid(format!(
                "rebalance: {} chunks wait for a slot on full legs that only they would free (a cycle); give the legs room for one more chunk each, or move in two steps",
                deferred.len()
            )));
        }
        report.deferred += deferred.len() as u64;
        pending = deferred;
    }
    // Done: the target map is the current one everywhere.
    for (l, m) in metas.iter_mut().enumerate() {
        m.header.flags &= !FLAG_REBALANCING;
        m.header.map_crc = target_crc;
        m.header.target_crc = 0;
        m.header.map_epoch += 1;
        m.header.rule = opts.rule;
        // Every chunk is now where the tables say with current data: no leg is stale.
        m.header.stale = [0; layout::STALE_WORDS];
        write_meta(legs[l].as_mut(), m).map_err(|e| io(l, "writing the header", e))?;
    }
    Ok(report)
}
