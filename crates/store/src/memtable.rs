//! The memtable: the versions of every key written since the last flush that a reader may still
//! need — the newest, and for each live snapshot the newest at or below it — in key order, and
//! the bytes they take, which decide when the store flushes it into a run. Versions a released
//! snapshot pinned are dropped at the key's next write or at flush.

use crate::format::frame::Op;
use smallvec::SmallVec;
use std::collections::BTreeMap;
use std::ops::Bound;

/// A key and its value, as scans return them.
pub type Pair = (Vec<u8>, Vec<u8>);

/// One version: its LSN and its value (`None`: deleted).
pub(crate) type Version = (u64, Option<Vec<u8>>);

/// A key's versions, oldest first. Nearly every key has one (older ones are kept only while a
/// snapshot needs them), and it is held in place: a put then allocates its key and value, not
/// also a vector for one version.
type Versions = SmallVec<[Version; 1]>;

/// Bytes counted per version besides its key and value: the map's and the vector's share.
const VERSION_OVERHEAD: usize = 48;

fn cost(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + VERSION_OVERHEAD
}

#[derive(Default)]
pub(crate) struct Memtable {
    /// Each key's versions, oldest first.
    map: BTreeMap<Vec<u8>, Versions>,
    /// The LSN of the last operation applied: what a new snapshot sees.
    visible: u64,
    /// Approximate memory held: keys, values and per-version overhead.
    bytes: usize,
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
        self.bytes += cost(&key, &value);
        let key_len = key.len();
        let versions = self.map.entry(key).or_default();
        versions.push((lsn, value));
        if versions.len() == 1 {
            self.visible = self.visible.max(lsn);
            return;
        }
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
        let mut freed = 0;
        versions.retain(|(_, v)| {
            let kept = flags.next().unwrap_or(true);
            if !kept {
                freed += key_len + v.as_ref().map_or(0, Vec::len) + VERSION_OVERHEAD;
            }
            kept
        });
        self.bytes -= freed;
        self.visible = self.visible.max(lsn);
    }

    /// The version of `key` as of LSN `at`: `Some(None)` when it is deleted there, `None` when
    /// the memtable holds no version at or below `at` (older runs may).
    pub(crate) fn lookup(&self, key: &[u8], at: u64) -> Option<Option<Vec<u8>>> {
        self.map
            .get(key)?
            .iter()
            .rev()
            .find(|(lsn, _)| *lsn <= at)
            .map(|(_, v)| v.clone())
    }

    /// The keys in `[from, to)` with their versions (oldest first), ascending or descending.
    pub(crate) fn range<'a>(
        &'a self,
        from: Option<&'a [u8]>,
        to: Option<&'a [u8]>,
        reverse: bool,
    ) -> Box<dyn Iterator<Item = (&'a Vec<u8>, &'a [Version])> + 'a> {
        if from.zip(to).is_some_and(|(f, t)| f >= t) {
            return Box::new(std::iter::empty());
        }
        let lower = from.map_or(Bound::Unbounded, Bound::Included);
        let upper = to.map_or(Bound::Unbounded, Bound::Excluded);
        let range = self
            .map
            .range::<[u8], _>((lower, upper))
            .map(|(k, v)| (k, v.as_slice()));
        if reverse {
            Box::new(range.rev())
        } else {
            Box::new(range)
        }
    }

    /// Makes `lsn` (and everything before it, held in runs) what a new snapshot sees.
    pub(crate) fn see(&mut self, lsn: u64) {
        self.visible = self.visible.max(lsn);
    }

    /// Approximate bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
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
