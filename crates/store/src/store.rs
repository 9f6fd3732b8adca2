//! The store handle: group commit of write batches into the log, the memtables and the runs
//! readers look in, memtable flush and compaction on the background worker, the memory budget's
//! split, and open (superblock, lease, manifest, log replay).
//!
//! Writers queue their batch; the first writer to find no leader becomes the leader, takes the
//! queued batches (up to [`StoreOptions::max_group_bytes`]), writes them as one log frame,
//! flushes once if any of them asked for sync, applies them to the memtable and answers every
//! writer in the group. Unsynced groups gather in memory (up to 256 KiB) and reach the log as one
//! frame with the next sync or when the memtable is swapped. When the memtable has grown past
//! its limit the leader makes it immutable (readers still look in it) and starts an empty one;
//! the background worker writes it as level-0 runs, records them and the new log start in the
//! manifest (only then are the log segments before it freed) and merges levels over their
//! limits, one merge at a time. A leader waits for the worker only when the memtable is full
//! while the previous one still waits for its flush.
//!
//! Locks are taken in the order `work` (the worker's, or [`Store::compact`]'s: the tree changes
//! only under it), `io` (the leader's), `view` (memtables and runs; readers take it shared),
//! `space` (the device's own queue and the slot map, held per I/O), the page cache's rings and
//! the readers' queue pool (each held only for one lookup or one pop/push), `snapshots`; `bg`
//! (the worker's mailbox) before `view` (a stalled leader looks at the memtables under it) and
//! never while `view`, `space` or `snapshots` is held.

use crate::error::StoreError;
use crate::format::frame::Op;
use crate::format::{FormatError, MAX_KEY, MAX_SEGMENT_SHIFT, MIN_SEGMENT_SHIFT, PAGE_SIZE};
use crate::log::{self, LogPos, LogStart, LogWriter};
use crate::manifest::{self, ManifestWriter};
use crate::memtable::{Memtable, Pair};
use crate::reads::{Dev, Reads};
use crate::segments::RawSegments;
use crate::space::Space;
use crate::tree::{self, Merge, Output, RunHandle, Tree, MAX_LEVELS};
use kura_engine::BlockDevice;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;

/// Settings fixed when a store is created, and the write path's grouping limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// log2 of the segment size (20 to 30).
    pub segment_shift: u32,
    /// Values up to this size stay inline in the index once runs exist (format section 6).
    pub inline_threshold: u32,
    /// Most encoded bytes one commit group writes (one batch is never split).
    pub max_group_bytes: usize,
    /// The memtable is flushed into runs once it holds more than this (keys, values and about
    /// 48 bytes per version): the write-buffer part of the memory budget.
    pub memtable_bytes: usize,
    /// Level 0 is merged into level 1 once it holds more runs than this.
    pub l0_runs: usize,
    /// Level 1 passes a run down once it holds more runs than this; each deeper level holds ten
    /// times as many as the one above. A run takes one segment. A level-0 merge rewrites all
    /// of level 1, so a smaller level 1 makes writes cheaper, but measured with `kura bench kv`
    /// (4 MiB memtable, 8 MiB segments) read-mostly workloads slowed as it shrank (YCSB-B over
    /// RocksDB 1.34-1.40x at 2 runs, 1.40-1.43x at 5, 1.53-1.71x at 10) while overwrite sped
    /// up (0.84-0.87x, 0.81x, 0.56-0.58x); the default stays at 10.
    pub l1_runs: usize,
    /// The memory budget in bytes: memtables, the page cache of run pages and the runs' bloom
    /// filters and footers together. With a budget the memtable limit is at most a quarter of
    /// it (the full memtable waiting for its flush and the next one take half at most) and the
    /// page cache gets what the memtables and the runs' in-memory parts leave. 0: no budget;
    /// the memtables are limited by `memtable_bytes` alone and the page cache holds
    /// [`DEFAULT_CACHE_BYTES`].
    pub memory_budget: usize,
    /// Threads one merge runs on, each writing the runs of one key range of its output: 0 for
    /// as many as the host has cores, at most [`MAX_MERGE_PARTS`]. A merge runs on one thread
    /// when slots are short (it then frees inputs as it passes them, which needs one output in
    /// key order) or when its output level has fewer input runs than parts to cut it into.
    pub merge_threads: usize,
}

/// The page cache's size when [`StoreOptions::memory_budget`] is 0.
pub const DEFAULT_CACHE_BYTES: usize = 8 << 20;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            segment_shift: 23,
            inline_threshold: 128,
            max_group_bytes: 1 << 20,
            memtable_bytes: 16 << 20,
            l0_runs: 4,
            l1_runs: 10,
            memory_budget: 0,
            merge_threads: 0,
        }
    }
}

/// Most threads one merge runs on ([`StoreOptions::merge_threads`]).
pub const MAX_MERGE_PARTS: usize = 4;
/// Each level below level 1 holds this many times the runs of the one above.
const LEVEL_FANOUT: usize = 10;
/// The memtable is also flushed once the log chain spans more segments than this (or a quarter
/// of the device's slots, if fewer): every open continues the log in a fresh segment, so many
/// short sessions (one `kura kv put` each) would otherwise fill the device with log segments of
/// a small memtable, and replay at open would grow without bound.
const MAX_LOG_SEGMENTS: u64 = 8;
/// Flushes go on during a merge until level 0 holds this many times `l0_runs` runs; past that,
/// writers wait for the merge (reads look in every level-0 run, so it must stay bounded).
const L0_STOP_FACTOR: usize = 5;
/// Free slots a flush during a merge leaves beyond the merge's inputs: the flush's own run
/// and the log's next segments.
const FLUSH_ROOM_SLOTS: u64 = 4;

/// A scan gathers this many entries before it fetches their separated values together.
const SCAN_BATCH: usize = 256;
/// Unsynced groups gather in memory up to this many payload bytes before they are written:
/// each write is a device round trip the committing writer waits for (32 KiB was measured
/// slower by a fifth to a third, `docs/kvstore-design.md` section 6).
const LOG_BUFFER: usize = 256 << 10;

/// Operations applied atomically: all are durable and visible together, or none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<Op>,
    bytes: usize,
}

impl WriteBatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn put(&mut self, key: &[u8], value: &[u8]) {
        self.push(Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
        });
    }

    pub fn delete(&mut self, key: &[u8]) {
        self.push(Op::Delete { key: key.to_vec() });
    }

    fn push(&mut self, op: Op) {
        self.bytes += op.encoded_len();
        self.ops.push(op);
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// A consistent read-only view: the store as it was when [`Store::snapshot`] was called.
/// Not kept across reopen.
pub struct Snapshot<'a> {
    store: &'a Store,
    lsn: u64,
}

impl Snapshot<'_> {
    /// The LSN of the last write the snapshot sees.
    pub fn lsn(&self) -> u64 {
        self.lsn
    }
}

impl Drop for Snapshot<'_> {
    fn drop(&mut self) {
        self.store.shared.release(self.lsn);
    }
}

/// Counters since open, and the shape of the store now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Batches written (a single put or delete is a batch of one).
    pub batches: u64,
    /// Log frames written: one per commit group.
    pub groups: u64,
    /// Flushes issued for sync writes.
    pub syncs: u64,
    /// Log frames replayed at open.
    pub replayed_frames: u64,
    /// Live keys in the memtable.
    pub memtable_keys: u64,
    /// Versions the memtable holds (the newest of each key, and older ones snapshots need).
    pub memtable_versions: u64,
    /// Approximate bytes the memtable holds (what [`StoreOptions::memtable_bytes`] limits).
    pub memtable_bytes: u64,
    /// Approximate bytes of the full memtable waiting for its flush (0 when none waits).
    pub immutable_bytes: u64,
    /// Memtable flushes into level-0 runs.
    pub flushes: u64,
    /// Of those, flushes done in the middle of a merge (so the writers did not wait for it).
    pub flushes_in_merges: u64,
    /// Commit groups that waited for the background worker: the memtable was full while the
    /// previous one still waited for its flush.
    pub write_stalls: u64,
    /// Compactions (merges of one level into the next, or of everything by
    /// [`Store::compact`]).
    pub compactions: u64,
    /// Installs of part of a merge's output before the merge ended, each freeing the inputs
    /// the merge had passed.
    pub merge_steps: u64,
    /// Merges written on more than one thread, each part a key range of the output
    /// ([`StoreOptions::merge_threads`]).
    pub merges_in_parts: u64,
    /// Runs passed down a level without a rewrite: nothing in the level below overlapped them.
    pub runs_moved: u64,
    /// Runs per level now (level 0 first).
    pub runs_per_level: [u32; MAX_LEVELS],
    /// Encoded bytes of the operations written by users (keys, values, op headers).
    pub user_bytes: u64,
    /// Bytes written to the device: log frames, runs (flush and compaction), manifest.
    pub log_bytes_written: u64,
    pub run_bytes_written: u64,
    pub manifest_bytes_written: u64,
    /// Segment slots in use now, and on the device.
    pub slots_used: u64,
    pub slot_count: u64,
    /// The memory budget ([`StoreOptions::memory_budget`], 0 for none) and its parts now:
    /// the memtables' bytes are `memtable_bytes` + `immutable_bytes`; the page cache's pages and the most it may
    /// hold; the runs' bloom filters and footers (about 1.25 bytes per key, 10 bits, plus the
    /// smallest and largest key of each run).
    pub memory_budget: u64,
    pub cache_bytes: u64,
    pub cache_capacity_bytes: u64,
    pub index_bytes: u64,
    /// Run page reads answered by the page cache, and those that went to the device.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Device queues opened for readers beside the store's own (0 on a device with one queue,
    /// whose reads then share the store's queue).
    pub reader_queues: u64,
}

impl StoreStats {
    /// Device bytes written per byte of user operations (log, runs and manifest together).
    pub fn write_amplification(&self) -> f64 {
        let device = self.log_bytes_written + self.run_bytes_written + self.manifest_bytes_written;
        if self.user_bytes == 0 {
            0.0
        } else {
            device as f64 / self.user_bytes as f64
        }
    }
}

struct Pending {
    ticket: u64,
    ops: Vec<Op>,
    bytes: usize,
    sync: bool,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    pending: Vec<Pending>,
    leader: bool,
    /// Writers waiting for a leader's group to end: a leader wakes them only when there are
    /// any (a wake is a system call, on every commit of a lone writer otherwise).
    waiting: usize,
    done: HashMap<u64, Result<(), StoreError>>,
}

/// What the leader of a commit group (or a compaction) holds while it writes.
struct Io {
    log: LogWriter,
    manifest: ManifestWriter,
    /// The log start the manifest records (or the superblock, before the first flush).
    log_start: LogStart,
    next_lsn: u64,
    /// Set by the first failed log write or flush; later writes get it back.
    stopped: Option<StoreError>,
    run_bytes: u64,
    /// Unsynced groups not yet in the log: one frame's payload, its first LSN, its op count.
    pending: Vec<u8>,
    pending_first: u64,
    pending_count: u32,
}

/// What readers look in: the memtable, the full one waiting for its flush (with the log start
/// after it), and the runs below them, swapped together.
struct View {
    mem: Memtable,
    imm: Option<(Arc<Memtable>, LogStart)>,
    tree: Arc<Tree>,
}

/// The background worker's mailbox: asked for work, asked to stop, and the error of its last
/// step, which the next foreground call reports.
#[derive(Default)]
struct Bg {
    kicked: bool,
    stop: bool,
    error: Option<StoreError>,
}

/// An open store: the shared state and the background thread that flushes and compacts it.
pub struct Store {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

struct Shared {
    /// The background worker's: flushes and merges (and [`Store::compact`]) hold it, one at a
    /// time, so the tree changes only under it; per level, the largest key of the last run
    /// passed down from it.
    work: Mutex<Vec<Option<Vec<u8>>>>,
    bg: Mutex<Bg>,
    /// Set while `bg` holds an error not yet reported, so writers need not lock `bg` to look.
    bg_failed: AtomicBool,
    /// Whether a full memtable waits for its flush (`View::imm` is set): what a merge checks
    /// after every key, without taking the view's lock.
    imm_waiting: AtomicBool,
    stalls: AtomicU64,
    flushes_in_merges: AtomicU64,
    merge_steps: AtomicU64,
    merges_in_parts: AtomicU64,
    runs_moved: AtomicU64,
    /// Wakes the worker.
    bg_wake: Condvar,
    /// Tells stalled writers the worker finished a step.
    bg_done: Condvar,
    queue: Mutex<Queue>,
    queue_changed: Condvar,
    io: Mutex<Io>,
    view: RwLock<View>,
    space: Mutex<Space>,
    /// The page cache and the readers' own device queues (see `reads.rs`).
    reads: Reads,
    /// Live snapshots: LSN -> how many handles hold it. Taken with `view` held (read or write),
    /// so a snapshot is never created between a write's pruning and its publication.
    snapshots: Mutex<BTreeMap<u64, usize>>,
    max_group_bytes: usize,
    max_payload: usize,
    /// Largest value: one must fit a run's segment with the run's four smallest pages.
    max_value: usize,
    memtable_bytes: usize,
    memory_budget: usize,
    l0_runs: usize,
    l1_runs: usize,
    /// Key ranges a merge is cut into, each written on a thread of its own (see
    /// [`Shared::merge_cuts`]).
    merge_parts: usize,
    max_log_segments: usize,
    segment_bytes: u64,
    segment_pages: u32,
    inline_threshold: usize,
    slot_count: u64,
    damage: Option<String>,
    replay_stop: FormatError,
    batches: AtomicU64,
    groups: AtomicU64,
    syncs: AtomicU64,
    user_bytes: AtomicU64,
    flushes: AtomicU64,
    compactions: AtomicU64,
    replayed_frames: u64,
}

/// The page cache's share of the memory budget, in pages: what two memtables and the runs'
/// in-memory parts (`index_bytes`) leave.
fn cache_pages(budget: usize, memtable_bytes: usize, index_bytes: usize) -> usize {
    let bytes = match budget {
        0 => DEFAULT_CACHE_BYTES,
        budget => budget.saturating_sub(2 * memtable_bytes + index_bytes),
    };
    bytes / PAGE_SIZE
}
/// A merge's inputs in its output level not yet replaced by its output, in key order, and
/// where they sit in that level (the merge's runs installed so far lie just before them).
struct Unmerged {
    at: usize,
    runs: Vec<Arc<RunHandle>>,
}

impl Unmerged {
    fn span(&self) -> Range<usize> {
        self.at..self.at + self.runs.len()
    }

    /// How many of the runs left hold only keys below `key`.
    fn passed(&self, key: &[u8]) -> usize {
        self.runs
            .iter()
            .take_while(|h| h.meta.largest.as_slice() < key)
            .count()
    }
}

/// A merge part's key range: from its first key (inclusive) to its end (exclusive).
type KeyRange<'k> = (Option<&'k [u8]>, Option<&'k [u8]>);
/// Runs a merge wrote and not installed yet, and their device bytes.
type MergedRuns = (Vec<RunHandle>, u64);

/// What a merge reads: the picked input runs (the output level's last), whether nothing lies
/// below the output level (tombstones then go), and the live snapshots.
struct MergeInputs<'a> {
    picked: &'a Tree,
    last: usize,
    bottom: bool,
    snapshots: &'a [u64],
}

/// A merge that frees the output level's inputs as it passes them when slots run short.
struct Stepping<'u> {
    unmerged: &'u mut Unmerged,
    /// Input runs in the levels above the output level.
    other_inputs: u64,
}

/// Fails (stopping the store) unless `level` of `tree` holds exactly `runs` at `span`: only
/// the merge holding the `work` lock changes those runs.
fn check_unchanged(
    tree: &Tree,
    level: usize,
    span: Range<usize>,
    runs: &[Arc<RunHandle>],
) -> Result<(), StoreError> {
    let same = tree.levels[level].get(span).is_some_and(|now| {
        now.len() == runs.len() && now.iter().zip(runs).all(|(a, b)| Arc::ptr_eq(a, b))
    });
    if same {
        Ok(())
    } else {
        Err(StoreError::Stopped(format!(
            "internal: level {level} changed under a merge of its runs"
        )))
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking writer cannot leave the queue or the log half-updated in a way later users
    // could misread: the log is checked on replay, so the poisoned state is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Formats `dev` as an empty store (whatever it held is lost) and opens it.
    pub fn create(dev: Box<dyn BlockDevice>, opts: &StoreOptions) -> Result<Store, StoreError> {
        if !(MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT).contains(&opts.segment_shift) {
            return Err(StoreError::Invalid(format!(
                "segment_shift {} is outside {MIN_SEGMENT_SHIFT}..={MAX_SEGMENT_SHIFT}",
                opts.segment_shift
            )));
        }
        if opts.inline_threshold as usize > MAX_KEY {
            return Err(StoreError::Invalid(format!(
                "inline_threshold {} is above {MAX_KEY}",
                opts.inline_threshold
            )));
        }
        let segs = RawSegments::new(dev, opts.segment_shift)?;
        let space = Space::format(segs, opts.segment_shift, opts.inline_threshold)?;
        Self::spawn(Shared::start(space, None, opts)?)
    }

    /// Opens the store on `dev`: picks the current superblock copy, takes a seg_seq lease, reads
    /// the manifest and replays the log after its log start into the memtable. The memtable
    /// limit and level-0 trigger are the defaults; [`Store::open_with`] sets them.
    pub fn open(dev: Box<dyn BlockDevice>, max_group_bytes: usize) -> Result<Store, StoreError> {
        Self::open_with(
            dev,
            &StoreOptions {
                max_group_bytes,
                ..StoreOptions::default()
            },
        )
    }

    /// [`Store::open`] with the run-time settings of `opts` (its format settings,
    /// `segment_shift` and `inline_threshold`, come from the superblock instead).
    pub fn open_with(dev: Box<dyn BlockDevice>, opts: &StoreOptions) -> Result<Store, StoreError> {
        let (space, damage) = Space::open(dev)?;
        Self::spawn(Shared::start(space, damage, opts)?)
    }

    /// Starts the background worker of `shared`.
    fn spawn(shared: Shared) -> Result<Store, StoreError> {
        lock(&shared.bg).kicked = true;
        let shared = Arc::new(shared);
        let mine = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("kura-store-bg".into())
            .spawn(move || mine.background())
            .map_err(|e| StoreError::Invalid(format!("cannot start the background worker: {e}")))?;
        Ok(Store {
            shared,
            worker: Some(worker),
        })
    }

    /// A superblock copy that was found damaged at open, if any (the other was used).
    pub fn damage(&self) -> Option<&str> {
        self.shared.damage.as_deref()
    }

    /// Why log replay at open ended where it did: the first page after the log's last frame
    /// (never written: bad magic or another seg_seq; torn by a crash: a checksum).
    pub fn replay_stop(&self) -> &FormatError {
        &self.shared.replay_stop
    }

    pub fn put(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), StoreError> {
        self.shared.put(key, value, sync)
    }

    pub fn delete(&self, key: &[u8], sync: bool) -> Result<(), StoreError> {
        self.shared.delete(key, sync)
    }

    /// The newest value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.shared.get_as_of(key, u64::MAX)
    }

    /// The value of `key` as `snapshot` saw it.
    pub fn get_at(
        &self,
        snapshot: &Snapshot<'_>,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.shared.get_as_of(key, snapshot.lsn)
    }

    /// A consistent view of the store as it is now, kept until the handle is dropped.
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot {
            store: self,
            lsn: self.shared.take_snapshot(),
        }
    }

    /// Up to `limit` live pairs with `from <= key < to` (an absent bound is open), in key order
    /// or, with `reverse`, from the largest key down. A consistent view: a batch committed
    /// meanwhile is in it entirely or not at all.
    pub fn scan(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<Pair>, StoreError> {
        self.shared.scan_as_of(from, to, u64::MAX, limit, reverse)
    }

    /// [`Store::scan`] without gathering the pairs: hands each to `visit` (key, value) until
    /// it returns false, and returns how many it handed over. Memory stays at one batch of
    /// pairs however many the walk meets. `visit` runs while the walk holds the store's view,
    /// and commits wait for that (they update the memtable under it), so it should be quick:
    /// count, copy or write to a buffer, not wait on a pipe.
    pub fn scan_each(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        limit: usize,
        reverse: bool,
        mut visit: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<usize, StoreError> {
        self.shared
            .visit_as_of(from, to, u64::MAX, limit, reverse, &mut |k, v| {
                visit(&k, &v)
            })
    }

    /// [`Store::scan`] as `snapshot` saw the store.
    pub fn scan_at(
        &self,
        snapshot: &Snapshot<'_>,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<Pair>, StoreError> {
        self.shared
            .scan_as_of(from, to, snapshot.lsn, limit, reverse)
    }

    /// Writes `batch` atomically; with `sync`, returns only once it is durable. Waits for the
    /// background worker only when the memtable is full while the previous one still waits
    /// for its flush (then for at most that flush and the merge step under way).
    pub fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), StoreError> {
        self.shared.write(batch, sync)
    }

    /// Flushes the memtable and merges every run into one sorted level (the deepest one in
    /// use, at least level 1), dropping versions no live snapshot needs and every tombstone;
    /// frees the segments of the runs it replaced. Waits for the background step under way.
    pub fn compact(&self) -> Result<(), StoreError> {
        self.shared.compact()
    }

    /// Does the background work due now in this thread: flushes a full memtable and runs
    /// every merge due, so afterwards no level is over its limit. Writers go on meanwhile (and
    /// may make more work due). For tests and measurements that look at the tree's shape;
    /// reports a background failure not yet reported.
    pub fn settle(&self) -> Result<(), StoreError> {
        self.shared.report()?;
        let result = self.shared.background_step();
        self.shared.bg_done.notify_all();
        result
    }

    /// Makes every write so far durable; reports a background failure not yet reported.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.shared.sync()
    }

    /// Stops the background worker (after the flush and merges due), makes every write durable
    /// and closes the store; reports a background failure not yet reported.
    pub fn close(mut self) -> Result<(), StoreError> {
        self.stop_worker();
        self.shared.sync()
    }

    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }

    /// Segments the log chain holds now (from the log start to its end).
    pub fn log_segments(&self) -> usize {
        lock(&self.shared.io).log.segments()
    }

    fn stop_worker(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        lock(&self.shared.bg).stop = true;
        self.shared.bg_wake.notify_all();
        // A worker that panicked has nothing more to report than its missing step.
        let _ = worker.join();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_worker();
    }
}

impl Shared {
    fn start(
        mut space: Space,
        damage: Option<String>,
        opts: &StoreOptions,
    ) -> Result<Shared, StoreError> {
        let recorded = manifest::read(&mut space)?;
        let sb = space.superblock().clone();
        let start = recorded
            .as_ref()
            .and_then(|m| m.log_start)
            .unwrap_or(LogStart {
                pos: LogPos {
                    seg: sb.log_start,
                    page: sb.log_start_page,
                },
                lsn: sb.log_start_lsn,
            });
        let reads = Reads::new(space.segs.placement());
        let space = Mutex::new(space);
        let tree = Tree::open(
            recorded
                .as_ref()
                .map(|m| m.runs.clone())
                .unwrap_or_default(),
            Dev {
                space: &space,
                reads: &reads,
            },
        )?;
        let mut space = space.into_inner().unwrap_or_else(|p| p.into_inner());
        let memtable_bytes = match opts.memory_budget {
            0 => opts.memtable_bytes,
            budget => opts.memtable_bytes.min(budget / 4),
        };
        reads.cache.set_capacity(cache_pages(
            opts.memory_budget,
            memtable_bytes,
            tree.memory(),
        ));
        let mut mem = Memtable::default();
        let no_snapshots = BTreeMap::new();
        let replayed = log::replay(&mut space, start, |lsn, op| {
            mem.apply(lsn, op, &no_snapshots)
        })?;
        // A snapshot taken now must see what the runs hold even if the log added nothing.
        mem.see(replayed.next_lsn.saturating_sub(1));
        let mut log = LogWriter::new(
            replayed.end,
            replayed.chain,
            sb.store_tag(),
            sb.segment_pages(),
        );
        // The log gets a queue of its own where the device has more than one, so a commit does
        // not wait for its frame's write (a sync waits, before its flush).
        if let Some(Ok(frames)) = space.segs.queue().frame_writer() {
            log.write_on(frames);
        }
        let manifest_head = recorded.is_some().then_some(sb.manifest_head);
        let max_payload = log::max_payload(sb.segment_pages());
        Ok(Shared {
            work: Mutex::new(vec![None; MAX_LEVELS]),
            bg: Mutex::new(Bg::default()),
            bg_failed: AtomicBool::new(false),
            imm_waiting: AtomicBool::new(false),
            stalls: AtomicU64::new(0),
            flushes_in_merges: AtomicU64::new(0),
            merge_steps: AtomicU64::new(0),
            merges_in_parts: AtomicU64::new(0),
            runs_moved: AtomicU64::new(0),
            bg_wake: Condvar::new(),
            bg_done: Condvar::new(),
            queue: Mutex::new(Queue::default()),
            queue_changed: Condvar::new(),
            io: Mutex::new(Io {
                log,
                manifest: ManifestWriter::new(manifest_head, sb.store_tag(), sb.segment_pages()),
                log_start: start,
                next_lsn: replayed.next_lsn,
                stopped: None,
                run_bytes: 0,
                pending: Vec::new(),
                pending_first: 0,
                pending_count: 0,
            }),
            view: RwLock::new(View {
                mem,
                imm: None,
                tree: Arc::new(tree),
            }),
            snapshots: Mutex::new(BTreeMap::new()),
            max_group_bytes: opts.max_group_bytes,
            max_payload,
            max_value: sb.segment_size() as usize - 4 * PAGE_SIZE,
            memtable_bytes,
            memory_budget: opts.memory_budget,
            l0_runs: opts.l0_runs.max(1),
            l1_runs: opts.l1_runs.max(1),
            merge_parts: match opts.merge_threads {
                0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                n => n,
            }
            .clamp(1, MAX_MERGE_PARTS),
            max_log_segments: MAX_LOG_SEGMENTS.min(sb.slot_count / 4).max(1) as usize,
            segment_bytes: sb.segment_size(),
            segment_pages: sb.segment_pages(),
            inline_threshold: sb.inline_threshold as usize,
            slot_count: sb.slot_count,
            space: Mutex::new(space),
            reads,
            damage,
            replay_stop: replayed.stop,
            batches: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            user_bytes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            replayed_frames: replayed.frames,
        })
    }

    fn put(&self, key: &[u8], value: &[u8], sync: bool) -> Result<(), StoreError> {
        let mut b = WriteBatch::new();
        b.put(key, value);
        self.write(b, sync)
    }

    fn delete(&self, key: &[u8], sync: bool) -> Result<(), StoreError> {
        let mut b = WriteBatch::new();
        b.delete(key);
        self.write(b, sync)
    }

    fn get_as_of(&self, key: &[u8], at: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let view = self.read_view();
        if let Some(found) = view.mem.lookup(key, at) {
            return Ok(found);
        }
        if let Some(found) = view.imm.as_ref().and_then(|(imm, _)| imm.lookup(key, at)) {
            return Ok(found);
        }
        Ok(view
            .tree
            .get(key, at, self.dev(), self.segment_bytes)?
            .flatten())
    }

    /// Registers a snapshot of what is visible now and returns its LSN.
    fn take_snapshot(&self) -> u64 {
        let view = self.read_view();
        let lsn = view.mem.visible();
        *lock(&self.snapshots).entry(lsn).or_insert(0) += 1;
        lsn
    }

    fn release(&self, lsn: u64) {
        let mut snapshots = lock(&self.snapshots);
        if let Some(holders) = snapshots.get_mut(&lsn) {
            *holders -= 1;
            if *holders == 0 {
                snapshots.remove(&lsn);
            }
        }
    }

    /// What reads of run pages and values go through.
    fn dev(&self) -> Dev<'_> {
        Dev {
            space: &self.space,
            reads: &self.reads,
        }
    }

    fn read_view(&self) -> RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    fn scan_as_of(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        at: u64,
        limit: usize,
        reverse: bool,
    ) -> Result<Vec<Pair>, StoreError> {
        let mut out = Vec::new();
        self.visit_as_of(from, to, at, limit, reverse, &mut |k, v| {
            out.push((k, v));
            true
        })?;
        Ok(out)
    }

    /// Hands up to `limit` live pairs with `from <= key < to` as of `at` to `visit`, in the
    /// walk's order, until it returns false; returns how many it was handed. Live entries are
    /// gathered a batch at a time and their separated values fetched together
    /// (`tree::load_all`), so a walk holds one batch of values, however long it is.
    fn visit_as_of(
        &self,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        at: u64,
        limit: usize,
        reverse: bool,
        visit: &mut dyn FnMut(Vec<u8>, Vec<u8>) -> bool,
    ) -> Result<usize, StoreError> {
        let mut visited = 0;
        if limit == 0 || from.zip(to).is_some_and(|(f, t)| f >= t) {
            return Ok(visited);
        }
        let view = self.read_view();
        let mut mems = vec![&view.mem];
        mems.extend(view.imm.as_ref().map(|(imm, _)| &**imm));
        let sources = tree::sources(&mems, &view.tree, from, to, reverse, self.dev(), true);
        let mut merge = Merge::new(sources, reverse);
        let mut done = false;
        while !done && visited < limit {
            let want = (limit - visited).min(SCAN_BATCH);
            let mut keys = Vec::with_capacity(want);
            let mut vals = Vec::with_capacity(want);
            while keys.len() < want {
                let Some((key, versions)) = merge.next_key()? else {
                    done = true;
                    break;
                };
                if let Some((_, value)) = versions.into_iter().find(|(lsn, _)| *lsn <= at) {
                    if !matches!(value, tree::Val::Tombstone) {
                        keys.push(key);
                        vals.push(value);
                    }
                }
            }
            let values = tree::load_all(vals, self.dev(), self.segment_bytes)?;
            for (key, value) in keys.into_iter().zip(values) {
                let Some(value) = value else {
                    continue;
                };
                visited += 1;
                if !visit(key, value) {
                    return Ok(visited);
                }
            }
        }
        Ok(visited)
    }

    fn write(&self, batch: WriteBatch, sync: bool) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        if let Some(op) = batch.ops.iter().find(|op| op.key().len() > MAX_KEY) {
            return Err(StoreError::Refused(FormatError::TooLarge {
                what: "key",
                need: op.key().len(),
                room: MAX_KEY,
            }));
        }
        let largest = batch.ops.iter().map(|op| match op {
            Op::Put { value, .. } => value.len(),
            Op::Delete { .. } => 0,
        });
        if let Some(len) = largest.max().filter(|&len| len > self.max_value) {
            return Err(StoreError::Refused(FormatError::TooLarge {
                what: "value",
                need: len,
                room: self.max_value,
            }));
        }
        if batch.bytes > self.max_payload {
            return Err(StoreError::Refused(FormatError::TooLarge {
                what: "write batch",
                need: batch.bytes,
                room: self.max_payload,
            }));
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        let mut q = lock(&self.queue);
        let ticket = q.next_ticket;
        q.next_ticket += 1;
        q.pending.push(Pending {
            ticket,
            ops: batch.ops,
            bytes: batch.bytes,
            sync,
        });
        loop {
            if let Some(result) = q.done.remove(&ticket) {
                return result;
            }
            if q.leader {
                q.waiting += 1;
                q = self
                    .queue_changed
                    .wait(q)
                    .unwrap_or_else(|p| p.into_inner());
                q.waiting -= 1;
                continue;
            }
            q.leader = true;
            let mut group = self.take_group(&mut q.pending);
            drop(q);
            let result = self.wait_for_room().and_then(|()| self.commit(&mut group));
            q = lock(&self.queue);
            for p in &group {
                q.done.insert(p.ticket, result.clone());
            }
            q.leader = false;
            if q.waiting > 0 {
                self.queue_changed.notify_all();
            }
        }
    }

    /// The oldest queued batches, as many as fit in one group (at least one).
    fn take_group(&self, pending: &mut Vec<Pending>) -> Vec<Pending> {
        let limit = self.max_group_bytes.min(self.max_payload);
        let mut bytes = 0;
        let n = pending
            .iter()
            .take_while(|p| {
                bytes += p.bytes;
                bytes <= limit
            })
            .count()
            .max(1);
        pending.drain(..n).collect()
    }

    /// Writes a group as one frame, flushes when any batch asked for sync, then makes it
    /// visible; flushes the memtable into runs when it has grown past its limit.
    fn commit(&self, group: &mut [Pending]) -> Result<(), StoreError> {
        let mut io = lock(&self.io);
        if let Some(e) = &io.stopped {
            return Err(StoreError::Stopped(e.to_string()));
        }
        let count: usize = group.iter().map(|p| p.ops.len()).sum();
        let count = u32::try_from(count).map_err(|_| {
            StoreError::Refused(FormatError::TooLarge {
                what: "operations in one commit group",
                need: count,
                room: u32::MAX as usize,
            })
        })?;
        // The ops are encoded straight into the gathered payload (no buffer of the group's
        // own to allocate and copy), after the room for them was made.
        let payload_len: usize = group.iter().map(|p| p.bytes).sum();
        let first_lsn = io.next_lsn;
        let sync = group.iter().any(|p| p.sync);
        // Unsynced groups gather in one frame: a frame takes whole pages, so a small write of
        // its own would cost a page of log. They go out with the next sync, when LOG_BUFFER
        // bytes have gathered, or when the memtable is swapped; a crash may lose
        // them, as it may lose any write not synced.
        let mut written = Ok(());
        if io.pending.len() + payload_len > self.max_payload {
            written = self.write_pending(&mut io, false);
        }
        let before = (io.pending.len(), io.pending_count);
        if written.is_ok() {
            if io.pending_count == 0 {
                io.pending_first = first_lsn;
            }
            let pending = &mut io.pending;
            written = group
                .iter()
                .flat_map(|p| &p.ops)
                .try_for_each(|op| op.encode(pending))
                .map_err(StoreError::Refused);
            if written.is_ok() {
                io.pending_count += count;
                if sync || io.pending.len() >= LOG_BUFFER {
                    written = self.write_pending(&mut io, sync);
                }
            }
        }
        if let Err(e) = written {
            // A refused or unplaced group leaves nothing behind; a device failure leaves the
            // log's tail unknown, so no later frame may follow it.
            io.pending.truncate(before.0);
            io.pending_count = before.1;
            if !matches!(e, StoreError::Refused(_) | StoreError::Full { .. }) {
                io.stopped = Some(e.clone());
            }
            return Err(e);
        }
        io.next_lsn += u64::from(count);
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.user_bytes
            .fetch_add(payload_len as u64, Ordering::Relaxed);
        if sync {
            self.syncs.fetch_add(1, Ordering::Relaxed);
        }
        let full = {
            let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
            let snapshots = lock(&self.snapshots);
            // The ops move into the memtable: the log frame holds their bytes already.
            for (i, op) in group.iter_mut().flat_map(|p| p.ops.drain(..)).enumerate() {
                view.mem.apply(first_lsn + i as u64, op, &snapshots);
            }
            view.imm.is_none()
                && (view.mem.bytes() > self.memtable_bytes
                    || io.log.segments() > self.max_log_segments)
        };
        if full {
            // The group is durable (if asked) and visible whatever the swap does: one that
            // finds no room for the log frame is retried at the next write.
            if let Err(e) = self.swap(&mut io) {
                if !matches!(e, StoreError::Full { .. } | StoreError::Refused(_)) {
                    io.stopped = Some(e);
                }
            }
        }
        Ok(())
    }

    /// A leader's wait before it commits: while the memtable is over its limit and the full
    /// one before it still waits for its flush, the group waits for the background worker
    /// (which flushes before it starts another merge step). A failure of the worker's last
    /// step is reported here, once, and the worker asked to try again.
    fn wait_for_room(&self) -> Result<(), StoreError> {
        let stalled = || {
            let view = self.read_view();
            view.imm.is_some() && view.mem.bytes() > self.memtable_bytes
        };
        // The common case takes no lock but the view's, shared.
        if !self.bg_failed.load(Ordering::Acquire) && !stalled() {
            return Ok(());
        }
        let mut bg = lock(&self.bg);
        let mut counted = false;
        loop {
            if let Some(e) = bg.error.take() {
                self.bg_failed.store(false, Ordering::Release);
                bg.kicked = true;
                self.bg_wake.notify_all();
                return Err(e);
            }
            if !stalled() || bg.stop {
                return Ok(());
            }
            if !counted {
                counted = true;
                self.stalls.fetch_add(1, Ordering::Relaxed);
            }
            bg = self.bg_done.wait(bg).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Makes the memtable the immutable one the background worker flushes, and starts an
    /// empty one. Gathered unsynced groups are written to the log first, so the log from the
    /// current log start holds every write the immutable memtable has until its flush is
    /// recorded.
    fn swap(&self, io: &mut Io) -> Result<(), StoreError> {
        self.write_pending(io, false)?;
        let start = LogStart {
            pos: io.log.pos(),
            lsn: io.next_lsn,
        };
        {
            let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
            if view.mem.is_empty() || view.imm.is_some() {
                return Ok(());
            }
            let visible = view.mem.visible();
            let full = std::mem::take(&mut view.mem);
            view.mem.see(visible);
            view.imm = Some((Arc::new(full), start));
            self.imm_waiting.store(true, Ordering::Release);
        }
        lock(&self.bg).kicked = true;
        self.bg_wake.notify_all();
        Ok(())
    }

    /// The background worker: waits to be asked, then flushes the immutable memtable and
    /// merges levels over their limits, one merge at a time with a flush check before each, so
    /// a stalled writer waits for at most one merge step and one flush. It starts with a look
    /// for merges a previous session left due. Asked to stop, it first finishes the flush and
    /// the merges due (so the log segments of a waiting memtable are freed and level 0 stays
    /// within its limit: many short sessions would otherwise fill the device).
    fn background(&self) {
        loop {
            {
                let mut bg = lock(&self.bg);
                while !bg.stop && !bg.kicked {
                    bg = self.bg_wake.wait(bg).unwrap_or_else(|p| p.into_inner());
                }
                bg.kicked = false;
            }
            let result =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.background_step()))
                    .unwrap_or_else(|panic| Err(self.worker_panicked(panic.as_ref())));
            let mut bg = lock(&self.bg);
            if let Err(e) = result {
                bg.error = Some(e);
                self.bg_failed.store(true, Ordering::Release);
            }
            let stop = bg.stop;
            drop(bg);
            self.bg_done.notify_all();
            if stop {
                return;
            }
        }
    }

    /// A panic in a flush or merge is a bug, and what it left half done is unknown: like a
    /// failed log write, it stops later writes (reads go on), and stalled writers are told
    /// instead of waiting for a worker step that will not come.
    fn worker_panicked(&self, panic: &(dyn std::any::Any + Send)) -> StoreError {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        let e = StoreError::Stopped(format!("the background worker panicked: {why}"));
        let mut io = lock(&self.io);
        if io.stopped.is_none() {
            io.stopped = Some(e.clone());
        }
        e
    }

    fn background_step(&self) -> Result<(), StoreError> {
        let mut work = lock(&self.work);
        loop {
            self.guard(self.flush_imm())?;
            self.bg_done.notify_all();
            if !self.guard(self.compact_one(&mut work))? {
                return Ok(());
            }
        }
    }

    /// Stops later writes after a failure that leaves the device's state unknown; a full
    /// device or a refused input leaves it as it was.
    fn guard<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &result {
            if !matches!(e, StoreError::Full { .. } | StoreError::Refused(_)) {
                let mut io = lock(&self.io);
                if io.stopped.is_none() {
                    io.stopped = Some(e.clone());
                }
            }
        }
        result
    }

    /// Writes the gathered unsynced groups as one log frame, then flushes the device if `sync`.
    fn write_pending(&self, io: &mut Io, sync: bool) -> Result<(), StoreError> {
        let mut space = lock(&self.space);
        if io.pending_count > 0 {
            io.log
                .append(&mut space, io.pending_first, io.pending_count, &io.pending)?;
            io.pending.clear();
            io.pending_count = 0;
        }
        if sync {
            io.log.settle()?;
            space.segs.flush()?;
        }
        Ok(())
    }

    /// Writes the immutable memtable as level-0 runs (without the `io` lock: writers go on),
    /// records them with the log start after it, then frees the log segments before that
    /// start: the log is trimmed only once the manifest checkpoint naming the runs is durable.
    /// Called with the `work` lock held, so the tree changes under nobody else.
    fn flush_imm(&self) -> Result<(), StoreError> {
        let Some((imm, start)) = self.read_view().imm.clone() else {
            return Ok(());
        };
        let (handles, written) = {
            let mut out = Output::new(self.dev(), 0, self.segment_pages, self.inline_threshold);
            for (key, versions) in imm.range(None, None, false) {
                for (lsn, value) in versions.iter().rev() {
                    out.add(key, *lsn, value.as_deref(), None)?;
                }
            }
            out.finish()?
        };
        let mut io = lock(&self.io);
        if let Some(e) = &io.stopped {
            return Err(StoreError::Stopped(e.to_string()));
        }
        let mut tree = Tree::clone(&*self.read_view().tree);
        let new: Vec<Arc<RunHandle>> = handles.into_iter().map(Arc::new).collect();
        tree.levels[0].splice(0..0, new);
        self.install(&mut io, tree, start, written, &[], true)?;
        let mut space = lock(&self.space);
        for seg in io.log.trim_before(start.pos) {
            space.free(seg.slot);
        }
        drop(space);
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn cache_pages(&self, index_bytes: usize) -> usize {
        cache_pages(self.memory_budget, self.memtable_bytes, index_bytes)
    }

    /// Records `tree` and `start` in the manifest, then makes them what readers see (without
    /// the immutable memtable after a flush) and frees the segments of `dropped` runs.
    fn install(
        &self,
        io: &mut Io,
        tree: Tree,
        start: LogStart,
        written: u64,
        dropped: &[Arc<RunHandle>],
        flushed: bool,
    ) -> Result<(), StoreError> {
        let recorded = {
            let mut space = lock(&self.space);
            io.manifest
                .record(&mut space, io.next_lsn, &tree.metas(), start)
        };
        if let Err(e) = recorded {
            // The new runs are not named by anything durable: give their segments back.
            let old = Arc::clone(&self.read_view().tree);
            let mut space = lock(&self.space);
            for h in tree.runs() {
                if !old.runs().any(|o| o.meta.run == h.meta.run) {
                    space.free(h.meta.run.slot);
                }
            }
            return Err(e);
        }
        io.run_bytes += written;
        {
            let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
            if flushed {
                view.imm = None;
                self.imm_waiting.store(false, Ordering::Release);
            }
            view.tree = Arc::new(tree);
        }
        io.log_start = start;
        let index = self.read_view().tree.memory();
        self.reads.cache.set_capacity(self.cache_pages(index));
        let mut space = lock(&self.space);
        for h in dropped {
            space.free(h.meta.run.slot);
        }
        Ok(())
    }

    /// Merges a level over its limit into the next, the one furthest over it first: all of
    /// level 0 (so its half-filled flush runs are packed into full ones) with the level-1 runs
    /// its key range meets and one more on each side: all of them for random keys, the last
    /// one for keys written in order, whose merged runs then go in beside level 1 without
    /// rewriting the rest of it; from a deeper level,
    /// one run (the next after the last one taken there, in key order) with the runs of the
    /// next level it overlaps. One merge a call; false when no level is over its limit. `compact_after` holds, per level, the largest key of the last
    /// run passed down from it: the next one taken there is the one after it (wrapping), so
    /// every part of a level is merged down in turn.
    fn compact_one(&self, compact_after: &mut [Option<Vec<u8>>]) -> Result<bool, StoreError> {
        {
            let tree = Arc::clone(&self.read_view().tree);
            // The level furthest over its limit goes first (RocksDB's score): flushes go on
            // during merges, so level 0 is often over its limit again when a merge ends, and
            // taking it first every time would leave level 1 to grow without bound, with every
            // level-0 merge rewriting all of it.
            let limit = |l: usize| {
                if l == 0 {
                    self.l0_runs
                } else {
                    self.l1_runs
                        .saturating_mul(LEVEL_FANOUT.saturating_pow(l as u32 - 1))
                }
            };
            let due = (0..MAX_LEVELS - 1)
                .filter(|&l| tree.levels[l].len() > limit(l))
                .max_by(|&a, &b| {
                    let over = |l: usize| tree.levels[l].len() as f64 / limit(l) as f64;
                    over(a).total_cmp(&over(b)).then(b.cmp(&a))
                });
            let Some(level) = due else {
                return Ok(false);
            };
            let runs = &tree.levels[level];
            let picked = if level == 0 {
                0..runs.len()
            } else {
                let after = compact_after[level].as_deref();
                let i = after.map_or(0, |a| {
                    runs.partition_point(|h| h.meta.smallest.as_slice() <= a)
                });
                let i = if i == runs.len() { 0 } else { i };
                tree::widen(runs, i..i + 1)
            };
            let lo = picked.clone().map(|i| &runs[i].meta.smallest).min();
            let hi = picked.clone().map(|i| &runs[i].meta.largest).max();
            let (Some(lo), Some(hi)) = (lo, hi) else {
                return Ok(false);
            };
            let next_level = &tree.levels[level + 1];
            let mut below = tree::overlapping(next_level, lo, hi);
            if level == 0 {
                // Also the level-1 run on each side: level-0 runs of keys written in order
                // meet no level-1 run, and small flushes (short sessions) would otherwise
                // each leave a small run in level 1, a segment apiece.
                below = tree::widen(
                    next_level,
                    below.start.saturating_sub(1)..(below.end + 1).min(next_level.len()),
                );
            }
            compact_after[level] = Some(hi.clone());
            if level > 0 && below.is_empty() {
                self.move_runs(&tree, level, picked, below.start)?;
            } else {
                self.merge_runs(&tree, &[(level, picked), (level + 1, below)])?;
            }
            Ok(true)
        }
    }

    /// Passes the runs `picked` of `level` down to `at` in the next level without rewriting
    /// them: nothing there overlaps them. Only runs below level 0 are moved: those are merge
    /// output, full but for a merge's last run, while level 0's flush runs fill about half of
    /// their segment and are always merged, to pack them.
    fn move_runs(
        &self,
        tree: &Tree,
        level: usize,
        picked: Range<usize>,
        at: usize,
    ) -> Result<(), StoreError> {
        let runs = &tree.levels[level][picked.clone()];
        let mut io = lock(&self.io);
        if let Some(e) = &io.stopped {
            return Err(StoreError::Stopped(e.to_string()));
        }
        let mut next = Tree::clone(&self.read_view().tree);
        check_unchanged(&next, level, picked.clone(), runs)?;
        next.levels[level].drain(picked);
        let moved = runs.iter().map(|h| {
            let mut meta = h.meta.clone();
            meta.level = (level + 1) as u8;
            Arc::new(RunHandle {
                meta,
                run: h.run.clone(),
            })
        });
        next.levels[level + 1].splice(at..at, moved);
        let start = io.log_start;
        self.install(&mut io, next, start, 0, &[], false)?;
        self.runs_moved
            .fetch_add(runs.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Merges the runs `inputs` names (a range of runs per level, the output level's last) into
    /// new runs that take the place of the output level's range, keeping the versions live
    /// snapshots need and dropping tombstones when nothing lies below the output level.
    ///
    /// When free slots run short, the output level's inputs are freed as the merge passes
    /// them: once a finished output run is followed by a key above an input's largest, and
    /// fewer slots are free than the rest of the merge could write (a run per input left) plus
    /// [`FLUSH_ROOM_SLOTS`], the finished runs are installed in front of the inputs left and
    /// the passed ones are freed ([`Shared::install_merged_part`]). So the merge needs free
    /// slots for about its other inputs' data, not for all of its output on top of all of its
    /// input. With room to spare it installs once, at its end: each step is a device flush and
    /// a manifest checkpoint under the writers' lock. With room for all of its output beside
    /// all of its input, it is cut into key ranges written at once on threads of their own
    /// ([`Shared::merge_cuts`], [`Shared::merge_in_parts`]): one thread of the worker could
    /// not keep up with one writer (`examples/writepath`: the writer waited for it most of
    /// the time), and RocksDB gets a flush thread beside its compactions.
    fn merge_runs(&self, tree: &Tree, inputs: &[(usize, Range<usize>)]) -> Result<(), StoreError> {
        let Some((last, last_range)) = inputs.last().cloned() else {
            return Ok(());
        };
        let mut picked = Tree::default();
        for (l, r) in inputs {
            picked.levels[*l] = tree.levels[*l][r.clone()].to_vec();
        }
        let snapshots: Vec<u64> = lock(&self.snapshots).keys().copied().collect();
        let merged = MergeInputs {
            bottom: tree.levels[last + 1..].iter().all(Vec::is_empty),
            picked: &picked,
            last,
            snapshots: &snapshots,
        };
        let mut unmerged = Unmerged {
            at: last_range.start,
            runs: picked.levels[last].clone(),
        };
        let cuts = self.merge_cuts(&merged);
        let (handles, written) = if cuts.is_empty() {
            let other_inputs = (picked.runs().count() - unmerged.runs.len()) as u64;
            let stepping = Stepping {
                unmerged: &mut unmerged,
                other_inputs,
            };
            self.merge_range(&merged, None, None, Some(stepping), true)?
        } else {
            self.merges_in_parts.fetch_add(1, Ordering::Relaxed);
            self.merge_in_parts(&merged, &cuts)?
        };
        let mut io = lock(&self.io);
        if let Some(e) = &io.stopped {
            return Err(StoreError::Stopped(e.to_string()));
        }
        // Flushes during the merge put new runs in front of level 0; nothing else changed the
        // tree, since only the holder of the `work` lock does.
        let current = Arc::clone(&self.read_view().tree);
        let flushed_meanwhile = current.levels[0].len().saturating_sub(tree.levels[0].len());
        let mut next = Tree::clone(&current);
        let mut dropped: Vec<Arc<RunHandle>> = Vec::new();
        for (l, r) in inputs.iter().filter(|(l, _)| *l != last) {
            let shift = if *l == 0 { flushed_meanwhile } else { 0 };
            let now = r.start + shift..r.end + shift;
            check_unchanged(&next, *l, now.clone(), &tree.levels[*l][r.clone()])?;
            dropped.extend(next.levels[*l].splice(now, Vec::new()));
        }
        check_unchanged(&next, last, unmerged.span(), &unmerged.runs)?;
        next.levels[last].splice(unmerged.span(), handles.into_iter().map(Arc::new));
        dropped.extend(unmerged.runs);
        let start = io.log_start;
        self.install(&mut io, next, start, written, &dropped, false)?;
        self.compactions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Where to cut the merge of `merged` into key ranges written on threads of their own, at
    /// most `merge_parts - 1` keys: the smallest keys of the output level's inputs spread
    /// evenly, or of the level above's when those do not overlap one another (keys written in
    /// order, whose level-0 runs meet at most one run below). None (one thread, in key order)
    /// when neither level has two runs to cut between, or when slots are short: parts cannot free
    /// inputs as they pass them, so all of the output (each part may end in a partly filled
    /// run) must fit beside all of the input.
    fn merge_cuts(&self, merged: &MergeInputs<'_>) -> Vec<Vec<u8>> {
        let smallest_keys = |runs: &[Arc<RunHandle>]| -> Vec<Vec<u8>> {
            let mut keys: Vec<Vec<u8>> = runs.iter().map(|h| h.meta.smallest.clone()).collect();
            keys.sort();
            keys
        };
        let below = &merged.picked.levels[merged.last];
        let above = merged.picked.levels[..merged.last]
            .iter()
            .rev()
            .find(|runs| !runs.is_empty());
        let firsts = if below.len() >= 2 {
            smallest_keys(below)
        } else if let Some(above) = above.filter(|runs| runs.len() >= 2) {
            let mut ranges: Vec<(&[u8], &[u8])> = above
                .iter()
                .map(|h| (h.meta.smallest.as_slice(), h.meta.largest.as_slice()))
                .collect();
            ranges.sort();
            if ranges.windows(2).any(|w| w[0].1 >= w[1].0) {
                return Vec::new();
            }
            smallest_keys(above)
        } else {
            return Vec::new();
        };
        let parts = self.merge_parts.min(firsts.len());
        let inputs = merged.picked.runs().count() as u64;
        if parts < 2 || self.free_slots() < inputs + parts as u64 + FLUSH_ROOM_SLOTS {
            return Vec::new();
        }
        let mut cuts: Vec<Vec<u8>> = Vec::new();
        for i in 1..parts {
            let key = &firsts[i * firsts.len() / parts];
            if key > &firsts[0] && cuts.last().is_none_or(|c| c < key) {
                cuts.push(key.clone());
            }
        }
        cuts
    }

    /// Merges the key ranges between `cuts` at once, the first on this thread (which also
    /// flushes a waiting memtable between keys) and each other on a scoped thread of its own;
    /// their runs, in key order, are the merge's output. A failed part gives back the slots
    /// of every part that finished.
    fn merge_in_parts(
        &self,
        merged: &MergeInputs<'_>,
        cuts: &[Vec<u8>],
    ) -> Result<MergedRuns, StoreError> {
        let bounds: Vec<KeyRange<'_>> = (0..=cuts.len())
            .map(|i| {
                let from = i.checked_sub(1).map(|j| cuts[j].as_slice());
                (from, cuts.get(i).map(Vec::as_slice))
            })
            .collect();
        let results: Vec<Result<MergedRuns, StoreError>> = std::thread::scope(|s| {
            let others: Vec<_> = bounds[1..]
                .iter()
                .map(|&(from, to)| s.spawn(move || self.merge_range(merged, from, to, None, false)))
                .collect();
            let (from, to) = bounds[0];
            let mut results = vec![self.merge_range(merged, from, to, None, true)];
            for part in others {
                results.push(
                    part.join()
                        .unwrap_or_else(|panic| Err(self.worker_panicked(panic.as_ref()))),
                );
            }
            results
        });
        let mut handles = Vec::new();
        let mut written = 0;
        let mut failed = None;
        for result in results {
            match result {
                Ok((runs, bytes)) => {
                    handles.extend(runs);
                    written += bytes;
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            // The finished parts' runs are durable but named by nothing: give them back.
            let mut space = lock(&self.space);
            for h in &handles {
                space.free(h.meta.run.slot);
            }
            return Err(e);
        }
        Ok((handles, written))
    }

    /// Merges the versions of `merged` with keys in `from..to` into runs of its output level.
    /// With `stepping`, the output level's inputs are freed as the merge passes them when
    /// slots run short ([`Shared::merge_runs`]); with `flushes`, a waiting memtable is flushed
    /// between keys ([`Shared::flush_during_merge`]). Returns the runs not installed yet and
    /// their bytes.
    fn merge_range(
        &self,
        merged: &MergeInputs<'_>,
        from: Option<&[u8]>,
        to: Option<&[u8]>,
        mut stepping: Option<Stepping<'_>>,
        flushes: bool,
    ) -> Result<MergedRuns, StoreError> {
        let all_inputs = merged.picked.runs().count() as u64;
        // A merge reads each input page once: it does not fill the page cache.
        let sources = tree::sources(&[], merged.picked, from, to, false, self.dev(), false);
        let mut merge = Merge::new(sources, false);
        let mut out = Output::new(
            self.dev(),
            merged.last as u8,
            self.segment_pages,
            self.inline_threshold,
        );
        let mut values = tree::ValueWindows::default();
        let mut installed_bytes = 0;
        let mut room_asked_at = 0;
        let mut may_flush = flushes;
        while let Some((key, versions)) = merge.next_key()? {
            for (lsn, value) in tree::retain(versions, merged.snapshots, merged.bottom) {
                let value = values.load(value, self.dev(), self.segment_bytes)?;
                let (bytes, crc) = value.parts();
                out.add(&key, lsn, bytes, crc)?;
            }
            // Whether slots are short is asked once per finished run (the space lock is
            // not taken per key): slots are allocated mostly as runs are started.
            if let (Some(step), Some(below)) = (stepping.as_mut(), out.finished_below()) {
                let left = step.other_inputs + step.unmerged.runs.len() as u64;
                if out.finished_runs() != room_asked_at && step.unmerged.passed(below) > 0 {
                    room_asked_at = out.finished_runs();
                    if self.free_slots() < left + FLUSH_ROOM_SLOTS {
                        let below = below.to_vec();
                        let runs = out.take_finished()?;
                        let bytes = out.written - installed_bytes;
                        self.install_merged_part(merged.last, step.unmerged, runs, &below, bytes)?;
                        installed_bytes = out.written;
                        room_asked_at = 0;
                        may_flush = true;
                    }
                }
            }
            if may_flush && self.imm_waiting.load(Ordering::Acquire) {
                let input_runs = stepping.as_ref().map_or(all_inputs, |step| {
                    step.other_inputs + step.unmerged.runs.len() as u64
                });
                may_flush = self.flush_during_merge(input_runs)?;
            }
        }
        let (handles, written) = out.finish()?;
        Ok((handles, written - installed_bytes))
    }

    fn free_slots(&self) -> u64 {
        let space = lock(&self.space);
        space.superblock().slot_count - space.used()
    }

    /// Installs the merge's finished output `runs` (every version of every key below `below`
    /// is in them or in runs installed before) in front of the output level's inputs left,
    /// dropping the inputs whose keys all lie below `below` and raising the smallest key of
    /// the one `below` falls in to `below` (format section 5: its entries below that are in
    /// the new runs). The freed inputs' slots are free for the rest of the merge.
    fn install_merged_part(
        &self,
        last: usize,
        unmerged: &mut Unmerged,
        runs: Vec<RunHandle>,
        below: &[u8],
        written: u64,
    ) -> Result<(), StoreError> {
        let passed = unmerged.passed(below);
        let new_runs = runs.len();
        let mut left = unmerged.runs[passed..].to_vec();
        if let Some(first) = left.first_mut() {
            if first.meta.smallest.as_slice() < below {
                let mut meta = first.meta.clone();
                meta.smallest = below.to_vec();
                *first = Arc::new(RunHandle {
                    meta,
                    run: first.run.clone(),
                });
            }
        }
        let mut replacement: Vec<Arc<RunHandle>> = runs.into_iter().map(Arc::new).collect();
        replacement.extend(left.iter().cloned());
        let mut io = lock(&self.io);
        let current = Arc::clone(&self.read_view().tree);
        let refused = match &io.stopped {
            Some(e) => Err(StoreError::Stopped(e.to_string())),
            None => check_unchanged(&current, last, unmerged.span(), &unmerged.runs),
        };
        if let Err(e) = refused {
            let mut space = lock(&self.space);
            for h in &replacement[..new_runs] {
                space.free(h.meta.run.slot);
            }
            return Err(e);
        }
        let mut next = Tree::clone(&current);
        next.levels[last].splice(unmerged.span(), replacement);
        let dropped = unmerged.runs[..passed].to_vec();
        let start = io.log_start;
        self.install(&mut io, next, start, written, &dropped, false)?;
        unmerged.at += new_runs;
        unmerged.runs = left;
        self.merge_steps.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Called by a merge after a key while a full memtable waits: flushes it if level 0 stays
    /// below [`L0_STOP_FACTOR`] times its merge limit and the device keeps room for the merges
    /// to come. So a writer waits for a merge only when level 0 is that far behind (RocksDB's
    /// stop trigger) or space is short, not for every merge that happens to run when the
    /// memtable fills.
    ///
    /// Room: this merge may write up to `input_runs` more slots (its inputs not yet freed);
    /// the next merge of level 0 takes every level-0 run (the flush's included) and the
    /// level-1 runs they meet (at most all of level 1, counted here), and may write as many.
    /// The two do not run at once: this merge frees its inputs when it ends, before the next
    /// starts, and its output takes about their place. So the flush asks for the larger of
    /// the two, free now, plus its own run, a partly filled last run per merge part and
    /// [`FLUSH_ROOM_SLOTS`]. It asked for their sum before, which made flushes inside merges
    /// wait on an image of 4x the data, the writers with them: `kura bench kv` overwrite
    /// measured 0.81x RocksDB there against 0.99x on an image of 8x (same build, run back to back).
    /// Merges also free passed inputs when slots run short, so less would do for space; but
    /// asking only for the larger of this merge's other inputs and the next level-0 merge's
    /// level 0 let level 0 reach 9-10 runs by the end of a load, and the reads that followed
    /// paid for it (`kura bench kv`: YCSB-B, C, D at 1.27, 1.44, 1.05x RocksDB against 1.66,
    /// 1.58, 1.54 with the sum). Asking for whole merges keeps writers in step with them.
    ///
    /// False when it declined; the merge asks again after a step freed slots.
    fn flush_during_merge(&self, input_runs: u64) -> Result<bool, StoreError> {
        let view = self.read_view();
        if view.imm.is_none() {
            return Ok(true);
        }
        let l0 = view.tree.levels[0].len();
        let next_l0_merge = (l0 + view.tree.levels[1].len()) as u64;
        drop(view);
        let free = self.free_slots();
        if l0 + 1 >= self.l0_runs * L0_STOP_FACTOR
            || free < input_runs.max(next_l0_merge) + self.merge_parts as u64 + FLUSH_ROOM_SLOTS
        {
            return Ok(false);
        }
        self.flush_imm()?;
        self.flushes_in_merges.fetch_add(1, Ordering::Relaxed);
        self.bg_done.notify_all();
        Ok(true)
    }

    fn compact(&self) -> Result<(), StoreError> {
        self.report()?;
        let _work = lock(&self.work);
        self.guard(self.flush_imm())?;
        {
            let mut io = lock(&self.io);
            if let Some(e) = &io.stopped {
                return Err(StoreError::Stopped(e.to_string()));
            }
            if let Err(e) = self.swap(&mut io) {
                if !matches!(e, StoreError::Full { .. } | StoreError::Refused(_)) {
                    io.stopped = Some(e.clone());
                }
                return Err(e);
            }
        }
        self.guard(self.flush_imm())?;
        self.bg_done.notify_all();
        let tree = Arc::clone(&self.read_view().tree);
        if tree.runs().next().is_none() {
            return Ok(());
        }
        let last = (1..MAX_LEVELS)
            .rev()
            .find(|&l| !tree.levels[l].is_empty())
            .unwrap_or(1);
        let all: Vec<(usize, Range<usize>)> =
            (0..=last).map(|l| (l, 0..tree.levels[l].len())).collect();
        self.guard(self.merge_runs(&tree, &all))
    }

    /// The background worker's failure not yet reported, if any (the worker is asked to try
    /// its step again).
    fn report(&self) -> Result<(), StoreError> {
        let mut bg = lock(&self.bg);
        match bg.error.take() {
            Some(e) => {
                self.bg_failed.store(false, Ordering::Release);
                bg.kicked = true;
                self.bg_wake.notify_all();
                Err(e)
            }
            None => Ok(()),
        }
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.report()?;
        let mut io = lock(&self.io);
        if let Some(e) = &io.stopped {
            return Err(StoreError::Stopped(e.to_string()));
        }
        if let Err(e) = self.write_pending(&mut io, true) {
            io.stopped = Some(e.clone());
            return Err(e);
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        let io = lock(&self.io);
        let view = self.read_view();
        let space = lock(&self.space);
        let mut runs_per_level = [0u32; MAX_LEVELS];
        for (n, level) in runs_per_level.iter_mut().zip(&view.tree.levels) {
            *n = level.len() as u32;
        }
        StoreStats {
            batches: self.batches.load(Ordering::Relaxed),
            groups: self.groups.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            replayed_frames: self.replayed_frames,
            memtable_keys: view.mem.live_keys(),
            memtable_versions: view.mem.versions(),
            memtable_bytes: view.mem.bytes() as u64,
            immutable_bytes: view.imm.as_ref().map_or(0, |(imm, _)| imm.bytes()) as u64,
            flushes: self.flushes.load(Ordering::Relaxed),
            write_stalls: self.stalls.load(Ordering::Relaxed),
            flushes_in_merges: self.flushes_in_merges.load(Ordering::Relaxed),
            merge_steps: self.merge_steps.load(Ordering::Relaxed),
            merges_in_parts: self.merges_in_parts.load(Ordering::Relaxed),
            runs_moved: self.runs_moved.load(Ordering::Relaxed),
            compactions: self.compactions.load(Ordering::Relaxed),
            runs_per_level,
            user_bytes: self.user_bytes.load(Ordering::Relaxed),
            log_bytes_written: io.log.written(),
            run_bytes_written: io.run_bytes,
            manifest_bytes_written: io.manifest.written(),
            slots_used: space.used(),
            slot_count: self.slot_count,
            memory_budget: self.memory_budget as u64,
            cache_bytes: self.reads.cache.bytes() as u64,
            cache_capacity_bytes: self.reads.cache.capacity_bytes() as u64,
            index_bytes: view.tree.memory() as u64,
            cache_hits: self.reads.cache.hits(),
            cache_misses: self.reads.cache.misses(),
            reader_queues: self.reads.queues() as u64,
        }
    }
}

impl Drop for Shared {
    /// Writes what unsynced groups gathered (without a device flush: dropping is not a sync),
    /// so a store dropped without [`Store::close`] loses no more than its device cache holds.
    fn drop(&mut self) {
        let io = self.io.get_mut().unwrap_or_else(|p| p.into_inner());
        if io.pending_count == 0 || io.stopped.is_some() {
            return;
        }
        let space = self.space.get_mut().unwrap_or_else(|p| p.into_inner());
        // Nothing to report to: a failure here loses only unsynced writes, as a crash would.
        let _ = io
            .log
            .append(space, io.pending_first, io.pending_count, &io.pending)
            .and_then(|()| io.log.settle());
    }
}
