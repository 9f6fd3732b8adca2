//! The memtable: the versions of every key written since open that a reader may still need —
//! the newest, and for each live snapshot the newest at or below it — in key order. Versions a
//! released snapshot pinned are dropped at the key's next write (and, once runs exist, at flush).

use crate::format::frame::Op;
use std::collections::BTreeMap;
use std::ops::Bound;

/// A key and its value, as scans return them.
pub type Pair = (Vec<u8>, Vec<u8>);

/// One version: its LSN and its value (`None`: deleted).
type Version = (u64, Option<Vec<u8>>);

#[derive(Default)]
pub(crate) struct Memtable {
    /// Each key's versions, oldest first.
    map: BTreeMap<Vec<u8>, Vec<Version>>,
    /// The LSN of the last operation applied: what a new snapshot sees.
    visible: u64,
}

impl Memtable {
    pub(crate) fn visible(&self) -> u64 {
        self.visible
    }

    /// Applies `op` as LSN `lsn`, keeping only the versions `snapshots` (LSN -> holders) need.
    pub(crate) fn apply(&mut self, lsn: u64, op: Op, snapshots: &BTreeMap<u64, usize>) {
        let (key, value) = match op {
            Op::Put { key, value } => (key, Some(value)),
            Op::Delete { key } => (key, None),
        };
        let versions = self.map.entry(key).or_default();
        versions.push((lsn, value));
        // A version is needed if it is the newest, or a snapshot falls between it and the next.
        let keep: Vec<bool> = (0..versions.len())
            .map(|w| {
                w + 1 == versions.len()
                    || snapshots
                        .range(versions[w].0..versions[w + 1].0)
                        .next()
                        .is_some()
            })
            .collect();
        let mut flags = keep.into_iter();
        versions.retain(|_| flags.next().unwrap_or(true));
        self.visible = self.visible.max(lsn);
    }

    /// The value of `key` as of LSN `at`.
    pub(crate) fn get(&self, key: &[u8], at: u64) -> Option<Vec<u8>> {
        self.map
            .get(key)?
            .iter()
            .rev()
            .find(|(lsn, _)| *lsn <= at)
            .and_then(|(_, v)| v.clone())
    }

    /// Up to `limit` live pairs in `[from, to)` as of LSN `at`, ascending or descending.
    pub(crate) fn scan(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        at: u64,
        limit: usize,
        reverse: bool,
    ) -> Vec<Pair> {
        if from.zip(to).is_some_and(|(f, t)| f >= t) {
            return Vec::new();
        }
        let lower = from.map_or(Bound::Unbounded, Bound::Included);
        let upper = to.map_or(Bound::Unbounded, Bound::Excluded);
        let range = self.map.range::<[u8], _>((lower, upper));
        let live = |(k, versions): (&Vec<u8>, &Vec<Version>)| {
            let (_, value) = versions.iter().rev().find(|(lsn, _)| *lsn <= at)?;
            value.as_ref().map(|v| (k.clone(), v.clone()))
        };
        if reverse {
            range.rev().filter_map(live).take(limit).collect()
        } else {
            range.filter_map(live).take(limit).collect()
        }
    }

    /// Keys with a live newest version.
    pub(crate) fn live_keys(&self) -> u64 {
        self.map
            .values()
            .filter(|v| v.last().is_some_and(|(_, value)| value.is_some()))
            .count() as u64
    }

    /// Versions held, over all keys (more than the keys while snapshots pin old ones).
    pub(crate) fn versions(&self) -> u64 {
        self.map.values().map(|v| v.len() as u64).sum()
    }
}
