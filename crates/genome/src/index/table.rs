//! The minimizer table as it lives in memory: one 8-byte slot per distinct hash, most holding
//! their minimizer's only position inline, and the positions of the few repeated hashes apart.
//!
//! The file keeps three flat arrays (hashes, start offsets, positions: 8 + 4 + 8 bytes a hash
//! plus 8 a position); kept that way in memory they were most of `kura genome map`'s resident
//! size. Here a hash's bits above the prefix table's cut are implied by its bucket, so a slot
//! needs only the bits below the cut (the remainder) and a value: the position itself when the
//! hash occurs once (nearly all of them), else the number of a repeated hash whose positions
//! are in `multi`. Remainder and value share one `u64` whenever their widths fit (k = 19 at the
//! usual minimizer density, up to about 2^48 bases); otherwise each slot is two words. Lookups return exactly the
//! positions the file holds, in the same order.

use std::ops::Deref;

/// The positions of one minimizer hash, each `global_position << 1 | reverse`, in index order.
#[derive(Debug, Clone, Copy)]
pub enum Hits<'a> {
    /// The hash occurs once: its position, kept inline in the table.
    One([u64; 1]),
    /// The hash occurs several times (or not at all: empty).
    Many(&'a [u64]),
}

impl Deref for Hits<'_> {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        match self {
            Hits::One(v) => v,
            Hits::Many(s) => s,
        }
    }
}

impl PartialEq for Hits<'_> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Hits<'_> {}

/// The slots, sorted by hash.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slots {
    /// `remainder << val_bits | value` in one word.
    Packed(Vec<u64>),
    /// `[remainder, value]` when the two do not fit one word.
    Wide(Vec<[u64; 2]>),
}

/// A slot's value: `position << 1` for a hash seen once, `multi_number << 1 | 1` otherwise.
const REPEATED: u64 = 1;

/// The in-memory table, built from the file's arrays (or the builder's, which are the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Table {
    /// Bits of a hash below the prefix table's cut (a slot's remainder).
    shift: u32,
    /// `lookup[t]..lookup[t + 1]` are the slots whose hash has prefix `t`.
    lookup: Vec<u32>,
    /// Width of a packed slot's value.
    val_bits: u32,
    slots: Slots,
    /// `multi[multi_starts[m]..multi_starts[m + 1]]` are repeated hash `m`'s positions.
    multi_starts: Vec<u32>,
    multi: Vec<u64>,
    /// Positions over all hashes, as in the file.
    n_positions: usize,
}

/// Bits needed to write `x`.
fn bits(x: u64) -> u32 {
    u64::BITS - x.leading_zeros()
}

impl Table {
    /// Starts a table over `keys` (sorted, distinct, below `2^hash_bits`) on a reference of
    /// `total_len` bases; each key's position count follows through [`Self::set_count`] and the
    /// positions through [`Filler`]. `keys` becomes the packed slots in place, so loading never
    /// holds two copies of the hashes.
    pub(super) fn new(mut keys: Vec<u64>, hash_bits: u32, total_len: u64) -> Self {
        let n = keys.len();
        // Two to four keys per prefix: a lookup searches a few slots within one or two cache
        // lines, and the prefix table costs 1-2 bytes a key (4 bytes a prefix).
        let table_bits = bits(n as u64).saturating_sub(2).clamp(1, 24).min(hash_bits);
        let shift = hash_bits - table_bits;
        let mut lookup = Vec::with_capacity((1 << table_bits) + 1);
        let mut i = 0usize;
        for t in 0..=(1u64 << table_bits) {
            while i < n && (keys[i] >> shift) < t {
                i += 1;
            }
            lookup.push(i as u32);
        }
        // A value holds a position (below 2 * total_len) or a repeated hash's number (below n).
        let val_bits = 1 + bits(total_len.saturating_mul(2)).max(bits(n as u64));
        let rem_mask = (1u64 << shift) - 1;
        let slots = if shift + val_bits <= 64 && val_bits < 64 {
            for k in keys.iter_mut() {
                *k = (*k & rem_mask) << val_bits;
            }
            Slots::Packed(keys)
        } else {
            let wide = keys.iter().map(|&k| [k & rem_mask, 0]).collect();
            drop(keys);
            Slots::Wide(wide)
        };
        Self {
            shift,
            lookup,
            val_bits,
            slots,
            multi_starts: vec![0],
            multi: Vec::new(),
            n_positions: 0,
        }
    }

    /// Records that key `i` has `count` positions; called for every key in order. The counts
    /// may still be unchecked (the reader checks them after their section's checksum): a wrong
    /// one gives a wrong table, never a panic, and the reader then refuses the index.
    pub(super) fn set_count(&mut self, i: usize, count: u32) {
        if i >= self.len() {
            return;
        }
        self.n_positions = self.n_positions.saturating_add(count as usize);
        if count == 1 {
            return;
        }
        let last = self.multi_starts.last().copied().unwrap_or(0);
        self.multi_starts.push(last.saturating_add(count));
        let m = self.multi_starts.len() as u64 - 2;
        self.set_value(i, (m << 1) | REPEATED);
    }

    /// Builds a table from the arrays the file holds (the builder's are the same).
    pub(super) fn from_arrays(
        keys: Vec<u64>,
        starts: &[u32],
        positions: &[u64],
        hash_bits: u32,
        total_len: u64,
    ) -> Self {
        let mut table = Self::new(keys, hash_bits, total_len);
        for (i, p) in starts.windows(2).enumerate() {
            table.set_count(i, p[1] - p[0]);
        }
        let mut fill = Filler::default();
        for &v in positions {
            fill.push(&mut table, v);
        }
        table
    }

    /// Number of distinct hashes.
    pub(super) fn len(&self) -> usize {
        match &self.slots {
            Slots::Packed(s) => s.len(),
            Slots::Wide(s) => s.len(),
        }
    }

    /// Number of positions over all hashes.
    pub(super) fn positions(&self) -> usize {
        self.n_positions
    }

    fn value(&self, i: usize) -> u64 {
        match &self.slots {
            Slots::Packed(s) => s[i] & ((1 << self.val_bits) - 1),
            Slots::Wide(s) => s[i][1],
        }
    }

    fn set_value(&mut self, i: usize, v: u64) {
        match &mut self.slots {
            Slots::Packed(s) => {
                let mask = (1u64 << self.val_bits) - 1;
                s[i] = (s[i] & !mask) | (v & mask);
            }
            Slots::Wide(s) => s[i][1] = v,
        }
    }

    fn hits(&self, value: u64) -> Hits<'_> {
        if value & REPEATED == 0 {
            return Hits::One([value >> 1]);
        }
        let m = (value >> 1) as usize;
        let (Some(&a), Some(&b)) = (self.multi_starts.get(m), self.multi_starts.get(m + 1)) else {
            return Hits::Many(&[]);
        };
        Hits::Many(self.multi.get(a as usize..b as usize).unwrap_or(&[]))
    }

    /// Positions of `hash`, empty when it is not in the table.
    #[inline]
    pub(super) fn get(&self, hash: u64) -> Hits<'_> {
        let t = (hash >> self.shift) as usize;
        let (Some(&lo), Some(&hi)) = (self.lookup.get(t), self.lookup.get(t + 1)) else {
            return Hits::Many(&[]);
        };
        let rem = hash & ((1u64 << self.shift) - 1);
        let (lo, hi) = (lo as usize, hi as usize);
        let value = match &self.slots {
            Slots::Packed(s) => {
                let vb = self.val_bits;
                let range = &s[lo..hi];
                match range.binary_search_by_key(&rem, |&x| x >> vb) {
                    Ok(j) => range[j] & ((1 << vb) - 1),
                    Err(_) => return Hits::Many(&[]),
                }
            }
            Slots::Wide(s) => {
                let range = &s[lo..hi];
                match range.binary_search_by_key(&rem, |x| x[0]) {
                    Ok(j) => range[j][1],
                    Err(_) => return Hits::Many(&[]),
                }
            }
        };
        self.hits(value)
    }

    /// The hashes in order, as the file stores them.
    pub(super) fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        let mut t = 0usize;
        (0..self.len()).map(move |i| {
            while self.lookup[t + 1] as usize <= i {
                t += 1;
            }
            let rem = match &self.slots {
                Slots::Packed(s) => s[i] >> self.val_bits,
                Slots::Wide(s) => s[i][0],
            };
            ((t as u64) << self.shift) | rem
        })
    }

    /// The file's offsets: `starts[i]` positions come before hash `i`'s; one more at the end.
    pub(super) fn starts(&self) -> impl Iterator<Item = u32> + '_ {
        let mut next = 0u32;
        std::iter::once(0).chain((0..self.len()).map(move |i| {
            next += self.hits(self.value(i)).len() as u32;
            next
        }))
    }

    /// Every position in the file's order (hash by hash).
    pub(super) fn all_positions(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len()).flat_map(move |i| self.hits(self.value(i)).to_vec())
    }
}

/// Hands the positions, in the file's order, to a [`Table`] made by [`Table::new`].
#[derive(Debug, Default)]
pub(super) struct Filler {
    /// The slot whose positions come next.
    slot: usize,
    /// Positions of that slot still to come (0: not started).
    left: u32,
}

impl Filler {
    /// Takes the next position. Extra positions (more than the offsets promised) are ignored;
    /// the reader has checked the counts agree before any position arrives.
    pub(super) fn push(&mut self, table: &mut Table, v: u64) {
        if self.slot >= table.len() {
            return;
        }
        let value = table.value(self.slot);
        if value & REPEATED == 0 {
            table.set_value(self.slot, v << 1);
            self.slot += 1;
            return;
        }
        if self.left == 0 {
            let m = (value >> 1) as usize;
            let (Some(&a), Some(&b)) = (table.multi_starts.get(m), table.multi_starts.get(m + 1))
            else {
                return;
            };
            // Counts are at least 2 here once checked; a zero would only stall the filler.
            self.left = b.saturating_sub(a).max(1);
            table.multi.reserve(self.left.min(1 << 20) as usize);
        }
        table.multi.push(v);
        self.left -= 1;
        if self.left == 0 {
            self.slot += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    /// Random sorted distinct keys below `2^hash_bits`, each with 1-4 positions (mostly one).
    fn arrays(seed: u64, n: usize, hash_bits: u32, total_len: u64) -> BTreeMap<u64, Vec<u64>> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut m = BTreeMap::new();
        while m.len() < n {
            let k = rng.gen_range(0..1u64 << hash_bits);
            let count = if rng.gen_bool(0.9) {
                1
            } else {
                rng.gen_range(2..5)
            };
            let pos = (0..count)
                .map(|_| rng.gen_range(0..total_len * 2))
                .collect();
            m.insert(k, pos);
        }
        m
    }

    fn table(m: &BTreeMap<u64, Vec<u64>>, hash_bits: u32, total_len: u64) -> Table {
        let keys: Vec<u64> = m.keys().copied().collect();
        let mut starts = vec![0u32];
        let mut positions = Vec::new();
        for p in m.values() {
            positions.extend_from_slice(p);
            starts.push(positions.len() as u32);
        }
        Table::from_arrays(keys, &starts, &positions, hash_bits, total_len)
    }

    fn check(seed: u64, n: usize, hash_bits: u32, total_len: u64, packed: bool) {
        let m = arrays(seed, n, hash_bits, total_len);
        let t = table(&m, hash_bits, total_len);
        assert_eq!(matches!(t.slots, Slots::Packed(_)), packed, "layout");
        assert_eq!(t.len(), m.len());
        assert_eq!(t.positions(), m.values().map(Vec::len).sum::<usize>());
        for (k, p) in &m {
            assert_eq!(&*t.get(*k), p.as_slice(), "key {k:#x}");
            // A neighbour that is not a key finds nothing.
            for probe in [k.wrapping_add(1), k.wrapping_sub(1)] {
                if !m.contains_key(&probe) {
                    assert!(t.get(probe).is_empty(), "probe {probe:#x}");
                }
            }
        }
        assert!(t.get(u64::MAX).is_empty());
        // The file's arrays come back exactly.
        assert!(t.keys().eq(m.keys().copied()));
        let mut at = 0u32;
        let starts = std::iter::once(0).chain(m.values().map(|p| {
            at += p.len() as u32;
            at
        }));
        assert!(t.starts().eq(starts));
        assert!(t.all_positions().eq(m.values().flatten().copied()));
    }

    #[test]
    fn packed_slots_give_every_key_its_positions() {
        // k = 19 on a 5 Mbp reference: remainder and value share one word.
        check(1, 20_000, 38, 5_000_000, true);
        check(2, 1, 38, 100, true);
    }

    #[test]
    fn wide_slots_give_every_key_its_positions() {
        // k = 31 on a small reference: 54 remainder bits and a 25-bit value do not fit a word.
        check(3, 300, 62, 5_000_000, false);
        check(4, 20_000, 62, 1 << 40, false);
    }
}
