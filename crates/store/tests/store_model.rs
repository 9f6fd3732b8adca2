//! The store against a `BTreeMap` model: random puts, deletes, batches, compactions and reopens
//! (clean and without close) on a RAM disk with a memtable small enough that it is flushed into
//! runs every few writes, every get and scan compared; snapshots across flushes and
//! compactions; group commit under concurrent sync writers; damaged superblocks and log frames;
//! a store many times larger than its memtable, overwritten until its space must be reclaimed.

mod common;

use common::{options, ram_disk, reopen, reopen_with, small_memtable};
use kura_engine::backend::mem::MemStorage;
use kura_engine::{BlockDevice, Completion, DriveStats, Geometry, Opcode, Rejected, Request};
use kura_store::format::{FormatError, MAX_KEY, PAGE_SIZE};
use kura_store::{Store, StoreError, WriteBatch};
use proptest::collection::vec;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
enum Action {
    Put(u8, Vec<u8>, bool),
    Delete(u8, bool),
    Batch(Vec<(u8, Option<Vec<u8>>)>, bool),
    Get(u8),
    Scan(Option<u8>, Option<u8>, usize, bool),
    Reopen,
    DropAndReopen,
    Compact,
}

fn key(k: u8) -> Vec<u8> {
    format!("key-{k:03}").into_bytes()
}

fn action() -> impl Strategy<Value = Action> {
    let value = vec(any::<u8>(), 0..3000);
    prop_oneof![
        6 => (0u8..40, value.clone(), any::<bool>()).prop_map(|(k, v, s)| Action::Put(k, v, s)),
        2 => (0u8..40, any::<bool>()).prop_map(|(k, s)| Action::Delete(k, s)),
        2 => (vec((0u8..40, proptest::option::of(vec(any::<u8>(), 0..500))), 0..8), any::<bool>())
            .prop_map(|(ops, s)| Action::Batch(ops, s)),
        4 => (0u8..40).prop_map(Action::Get),
        2 => (proptest::option::of(0u8..42), proptest::option::of(0u8..42), 0usize..50, any::<bool>())
            .prop_map(|(f, t, n, r)| Action::Scan(f, t, n, r)),
        1 => Just(Action::Reopen),
        1 => Just(Action::DropAndReopen),
        1 => Just(Action::Compact),
    ]
}

/// A batch of `ops` (a value puts, `None` deletes), applied to `model` as it is built.
fn batch_into(
    ops: Vec<(u8, Option<Vec<u8>>)>,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
) -> WriteBatch {
    let mut b = WriteBatch::new();
    for (k, v) in ops {
        match v {
            Some(v) => {
                b.put(&key(k), &v);
                model.insert(key(k), v);
            }
            None => {
                b.delete(&key(k));
                model.remove(&key(k));
            }
        }
    }
    b
}

fn check_all(store: &Store, model: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<(), TestCaseError> {
    for k in 0..40u8 {
        prop_assert_eq!(
            store.get(&key(k)).expect("get"),
            model.get(&key(k)).cloned(),
            "key {}",
            k
        );
    }
    let all = store.scan(None, None, usize::MAX, false).expect("scan");
    prop_assert_eq!(all.len(), model.len());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn store_matches_a_btreemap_across_reopens(actions in vec(action(), 1..120)) {
        // A 16 KiB memtable: values average 1.5 KiB, so a flush every ten puts or so, and
        // level 0 merged into level 1 every third flush.
        let opts = small_memtable(16 << 10);
        let dev = ram_disk(40, 4096);
        let storage: MemStorage = dev.storage();
        let mut store = Store::create(Box::new(dev), &opts).expect("create");
        let mut model = BTreeMap::new();
        for a in actions {
            match a {
                Action::Put(k, v, sync) => {
                    store.put(&key(k), &v, sync).expect("put");
                    model.insert(key(k), v);
                }
                Action::Delete(k, sync) => {
                    store.delete(&key(k), sync).expect("delete");
                    model.remove(&key(k));
                }
                Action::Batch(ops, sync) => {
                    store.write(batch_into(ops, &mut model), sync).expect("batch");
                }
                Action::Get(k) => prop_assert_eq!(store.get(&key(k)).expect("get"), model.get(&key(k)).cloned()),
                Action::Scan(from, to, limit, reverse) => {
                    let (from, to) = (from.map(key), to.map(key));
                    let got = store.scan(from.as_deref(), to.as_deref(), limit, reverse).expect("scan");
                    let in_range = |k: &&Vec<u8>| from.as_ref().is_none_or(|f| *k >= f) && to.as_ref().is_none_or(|t| *k < t);
                    let pairs = model.iter().filter(|(k, _)| in_range(k)).map(|(k, v)| (k.clone(), v.clone()));
                    let expected: Vec<_> = if reverse { pairs.rev().take(limit).collect() } else { pairs.take(limit).collect() };
                    prop_assert_eq!(&got, &expected);
                    // The same walk handed over pair by pair, and stopped by its visitor
                    // after the first half.
                    let mut seen = Vec::new();
                    let stop = expected.len().div_ceil(2);
                    let handed = store.scan_each(from.as_deref(), to.as_deref(), limit, reverse, |k, v| {
                        seen.push((k.to_vec(), v.to_vec()));
                        seen.len() < stop
                    }).expect("scan_each");
                    prop_assert_eq!(handed, seen.len());
                    prop_assert_eq!(&seen[..], &expected[..stop.max(1).min(expected.len())]);
                }
                Action::Reopen => {
                    store.close().expect("close");
                    store = reopen_with(&storage, &opts);
                    check_all(&store, &model)?;
                }
                // The RAM disk has no volatile cache, so even unsynced writes are on it.
                Action::DropAndReopen => {
                    drop(store);
                    store = reopen_with(&storage, &opts);
                    check_all(&store, &model)?;
                }
                Action::Compact => {
                    store.compact().expect("compact");
                    let stats = store.stats();
                    prop_assert_eq!(stats.runs_per_level[0], 0);
                    prop_assert!(stats.runs_per_level.iter().filter(|&&n| n > 0).count() <= 1, "{:?}", stats.runs_per_level);
                    check_all(&store, &model)?;
                }
            }
        }
        check_all(&store, &model)?;
        store.close().expect("close");
        check_all(&reopen(&storage), &model)?;
    }
}

/// A device whose flushes take a while, as the measured ~5 ms fdatasync does, so concurrent
/// sync writers pile up behind the one flushing.
struct SlowFlush<D>(D);

impl<D: BlockDevice> BlockDevice for SlowFlush<D> {
    fn geometry(&self) -> Geometry {
        self.0.geometry()
    }
    fn describe(&self) -> String {
        format!("slow-flush({})", self.0.describe())
    }
    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        if req.op == Opcode::Flush {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.0.submit(req)
    }
    fn ring_doorbell(&mut self) -> kura_engine::DeviceResult<()> {
        self.0.ring_doorbell()
    }
    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
    ) -> kura_engine::DeviceResult<usize> {
        self.0.poll(out, min_complete)
    }
    fn in_flight(&self) -> usize {
        self.0.in_flight()
    }
    fn stats(&self, out: &mut Vec<DriveStats>) {
        self.0.stats(out)
    }
}

#[test]
fn concurrent_sync_writers_share_flushes_and_all_survive() {
    let dev = ram_disk(24, 4096);
    let storage = dev.storage();
    let store = Arc::new(Store::create(Box::new(SlowFlush(dev)), &options()).expect("create"));
    let (threads, each) = (8, 25);
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = Arc::clone(&store);
            s.spawn(move || {
                for i in 0..each {
                    let k = format!("t{t}-{i:03}");
                    store
                        .put(k.as_bytes(), k.repeat(10).as_bytes(), true)
                        .expect("put");
                }
            });
        }
    });
    let stats = store.stats();
    assert_eq!(stats.batches, threads * each);
    assert!(
        stats.groups < stats.batches / 2,
        "group commit: {} groups for {} sync batches",
        stats.groups,
        stats.batches
    );
    assert_eq!(stats.syncs, stats.groups);
    drop(store);
    let store = reopen(&storage);
    for t in 0..threads {
        for i in 0..each {
            let k = format!("t{t}-{i:03}");
            assert_eq!(
                store.get(k.as_bytes()).expect("get"),
                Some(k.repeat(10).into_bytes())
            );
        }
    }
}

#[test]
fn a_damaged_superblock_copy_falls_back_to_the_other() {
    let dev = ram_disk(8, 4096);
    let storage = dev.storage();
    let store = Store::create(Box::new(dev), &options()).expect("create");
    store.put(b"k", b"v", true).expect("put");
    store.close().expect("close");
    for copy in 0..2 {
        let saved = storage.lock().expect("storage").clone();
        storage.lock().expect("storage")[copy * PAGE_SIZE + 100] ^= 1;
        let store = reopen(&storage);
        assert!(store.damage().is_some_and(|d| d.contains(if copy == 0 {
            "copy A"
        } else {
            "copy B"
        })));
        assert_eq!(store.get(b"k").expect("get"), Some(b"v".to_vec()));
        store.close().expect("close");
        // Reopening rewrote the damaged copy, so both are valid again.
        let store = reopen(&storage);
        assert_eq!(store.damage(), None);
        drop(store);
        *storage.lock().expect("storage") = saved;
    }
    {
        let mut disk = storage.lock().expect("storage");
        disk[10] ^= 1;
        disk[PAGE_SIZE + 10] ^= 1;
    }
    let dev = kura_engine::backend::mem::MemDevice::with_storage(storage, Default::default());
    let refused = Store::open(Box::new(dev), 1 << 20).err();
    assert!(
        matches!(refused, Some(StoreError::NoSuperblock { .. })),
        "{refused:?}"
    );
}

#[test]
fn a_damaged_frame_ends_the_log_before_it() {
    let dev = ram_disk(8, 4096);
    let storage = dev.storage();
    let store = Store::create(Box::new(dev), &options()).expect("create");
    for i in 0..10u32 {
        store
            .put(&i.to_le_bytes(), &[i as u8; 100], true)
            .expect("put");
    }
    store.close().expect("close");
    // The log starts at slot 0, whose first page holds the seal open writes; each put is then
    // one page of slot 1 (byte 2 MiB). Damage the payload of the 7th put's frame.
    storage.lock().expect("storage")[(2 << 20) + 6 * PAGE_SIZE + 70] ^= 0x40;
    let store = reopen(&storage);
    assert!(
        matches!(store.replay_stop(), FormatError::BadChecksum { .. }),
        "{:?}",
        store.replay_stop()
    );
    for i in 0..10u32 {
        let expected = (i < 6).then(|| vec![i as u8; 100]);
        assert_eq!(
            store.get(&i.to_le_bytes()).expect("get"),
            expected,
            "key {i}"
        );
    }
    // Writing goes on in a fresh segment, and the damaged frame's successors never come back.
    store.put(b"after", b"x", true).expect("put");
    store.close().expect("close");
    let store = reopen(&storage);
    assert_eq!(store.get(b"after").expect("get"), Some(b"x".to_vec()));
    assert_eq!(store.get(&7u32.to_le_bytes()).expect("get"), None);
}

#[test]
fn oversized_input_is_refused_and_the_store_goes_on() {
    let store = Store::create(Box::new(ram_disk(8, 4096)), &options()).expect("create");
    let refused = store.put(&vec![1; MAX_KEY + 1], b"v", true);
    assert!(
        matches!(refused, Err(StoreError::Refused(_))),
        "{refused:?}"
    );
    let refused = store.put(b"k", &vec![0; 1 << 20], true);
    assert!(
        matches!(refused, Err(StoreError::Refused(_))),
        "{refused:?}"
    );
    // The largest value leaves a run's segment its four smallest pages (format section 1).
    let largest = (1 << 20) - 4 * PAGE_SIZE;
    let refused = store.put(b"k", &vec![0; largest + 1], true);
    assert!(
        matches!(refused, Err(StoreError::Refused(_))),
        "{refused:?}"
    );
    store
        .put(&[7; MAX_KEY], &vec![5; largest], true)
        .expect("largest value fits");
    // ... in the log and, after a flush, in a run.
    store.compact().expect("compact");
    assert_eq!(store.stats().runs_per_level[1], 1);
    assert_eq!(
        store.get(&[7; MAX_KEY]).expect("get").map(|v| v.len()),
        Some(largest)
    );
}

#[test]
fn a_full_device_says_so() {
    let store = Store::create(Box::new(ram_disk(4, 4096)), &options()).expect("create");
    let value = vec![9u8; 600 << 10];
    let mut result = Ok(());
    for i in 0..10u32 {
        result = store.put(&i.to_le_bytes(), &value, false);
        if result.is_err() {
            break;
        }
    }
    assert!(
        matches!(result, Err(StoreError::Full { slots: 3 })),
        "{result:?}"
    );
    // What was written before stays readable.
    assert_eq!(store.get(&0u32.to_le_bytes()).expect("get"), Some(value));
}

#[derive(Debug, Clone)]
enum SnapAction {
    Put(u8, Vec<u8>),
    Delete(u8),
    Batch(Vec<(u8, Option<Vec<u8>>)>),
    Take,
    Release(prop::sample::Index),
    Check(prop::sample::Index, Option<u8>, Option<u8>, bool),
    Compact,
}

fn snap_action() -> impl Strategy<Value = SnapAction> {
    prop_oneof![
        5 => (0u8..20, vec(any::<u8>(), 0..64)).prop_map(|(k, v)| SnapAction::Put(k, v)),
        2 => (0u8..20).prop_map(SnapAction::Delete),
        2 => vec((0u8..20, proptest::option::of(vec(any::<u8>(), 0..64))), 0..6).prop_map(SnapAction::Batch),
        2 => Just(SnapAction::Take),
        1 => any::<prop::sample::Index>().prop_map(SnapAction::Release),
        3 => (any::<prop::sample::Index>(), proptest::option::of(0u8..22), proptest::option::of(0u8..22), any::<bool>())
            .prop_map(|(i, f, t, r)| SnapAction::Check(i, f, t, r)),
        1 => Just(SnapAction::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Every snapshot keeps answering gets and scans as the store was when it was taken, while
    /// writes, flushes (a 2 KiB memtable) and compactions go on; the present state matches the
    /// model throughout.
    #[test]
    fn snapshots_keep_their_view(actions in vec(snap_action(), 1..150)) {
        let store = Store::create(Box::new(ram_disk(24, 4096)), &small_memtable(2 << 10)).expect("create");
        let mut model = BTreeMap::new();
        let mut snaps = Vec::new();
        for a in actions {
            match a {
                SnapAction::Put(k, v) => {
                    store.put(&key(k), &v, false).expect("put");
                    model.insert(key(k), v);
                }
                SnapAction::Delete(k) => {
                    store.delete(&key(k), false).expect("delete");
                    model.remove(&key(k));
                }
                SnapAction::Batch(ops) => {
                    store.write(batch_into(ops, &mut model), false).expect("batch");
                }
                SnapAction::Take => snaps.push((store.snapshot(), model.clone())),
                SnapAction::Compact => store.compact().expect("compact"),
                SnapAction::Release(i) => {
                    if !snaps.is_empty() {
                        snaps.remove(i.index(snaps.len()));
                    }
                }
                SnapAction::Check(i, from, to, reverse) => {
                    if snaps.is_empty() {
                        continue;
                    }
                    let (snap, seen) = &snaps[i.index(snaps.len())];
                    for k in 0..20u8 {
                        prop_assert_eq!(store.get_at(snap, &key(k)).expect("get_at"), seen.get(&key(k)).cloned());
                    }
                    let (from, to) = (from.map(key), to.map(key));
                    let got = store.scan_at(snap, from.as_deref(), to.as_deref(), usize::MAX, reverse).expect("scan_at");
                    let in_range = |k: &&Vec<u8>| from.as_ref().is_none_or(|f| *k >= f) && to.as_ref().is_none_or(|t| *k < t);
                    let pairs = seen.iter().filter(|(k, _)| in_range(k)).map(|(k, v)| (k.clone(), v.clone()));
                    let expected: Vec<_> = if reverse { pairs.rev().collect() } else { pairs.collect() };
                    prop_assert_eq!(got, expected);
                }
            }
        }
        check_all(&store, &model)?;
    }
}

#[test]
fn versions_are_kept_only_while_a_snapshot_needs_them() {
    let store = Store::create(Box::new(ram_disk(8, 4096)), &options()).expect("create");
    for v in 0..3u8 {
        store.put(b"k", &[v], false).expect("put");
    }
    assert_eq!(store.stats().memtable_versions, 1);
    let snap = store.snapshot();
    store.put(b"k", b"new", false).expect("put");
    store.put(b"k", b"newer", false).expect("put");
    assert_eq!(
        store.stats().memtable_versions,
        2,
        "the snapshot's version and the newest"
    );
    assert_eq!(store.get_at(&snap, b"k").expect("get_at"), Some(vec![2]));
    drop(snap);
    store.put(b"k", b"newest", false).expect("put");
    assert_eq!(store.stats().memtable_versions, 1);
    assert_eq!(store.get(b"k").expect("get"), Some(b"newest".to_vec()));
}

/// Every open continues the log in a fresh segment; many short sessions (as `kura kv put`
/// makes) must not fill the device with log segments of a memtable that never reaches its limit.
#[test]
fn many_short_sessions_do_not_fill_the_device() {
    let dev = ram_disk(16, 4096);
    let storage = dev.storage();
    Store::create(Box::new(dev), &options())
        .expect("create")
        .close()
        .expect("close");
    for i in 0..200u32 {
        let store = reopen(&storage);
        store
            .put(&i.to_be_bytes(), &i.to_le_bytes(), true)
            .expect("put in a short session");
        let stats = store.stats();
        assert!(stats.slots_used < stats.slot_count, "{stats:?}");
        store.close().expect("close");
    }
    let store = reopen(&storage);
    assert!(store.log_segments() <= 4, "{}", store.log_segments());
    let all = store.scan(None, None, usize::MAX, false).expect("scan");
    let expected: Vec<_> = (0..200u32)
        .map(|i| (i.to_be_bytes().to_vec(), i.to_le_bytes().to_vec()))
        .collect();
    assert_eq!(all, expected);
}

/// Readers (gets, scans, snapshot reads) run while two writers fill a 4 KiB memtable, so
/// flushes and merges swap the runs under them: every value read is one written under that key,
/// a snapshot's scan is sorted and stable, and the final state is every writer's last value.
#[test]
fn readers_run_while_flushes_and_merges_swap_the_runs() {
    let opts = small_memtable(4 << 10);
    let dev = ram_disk(48, 4096);
    let storage = dev.storage();
    let store = Arc::new(Store::create(Box::new(dev), &opts).expect("create"));
    let value = |t: u32, k: u32, round: u32| format!("w{t}-k{k:03}-r{round}").repeat(3);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        for r in 0..3u32 {
            let (store, stop) = (Arc::clone(&store), Arc::clone(&stop));
            s.spawn(move || {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n = n.wrapping_add(7919);
                    let (t, k) = (n % 2, (n / 2 + r) % 300);
                    let key = format!("w{t}-k{k:03}");
                    if let Some(v) = store.get(key.as_bytes()).expect("get") {
                        assert!(String::from_utf8_lossy(&v).starts_with(&format!("{key}-r")));
                    }
                    let snap = store.snapshot();
                    let a = store
                        .scan_at(&snap, Some(key.as_bytes()), None, 40, false)
                        .expect("scan_at");
                    assert!(a.windows(2).all(|w| w[0].0 < w[1].0));
                    for (k, v) in &a {
                        assert!(v.starts_with(k), "{k:?}");
                    }
                    let b = store
                        .scan_at(&snap, Some(key.as_bytes()), None, 40, false)
                        .expect("scan_at");
                    assert_eq!(a, b, "a snapshot's view changed");
                }
            });
        }
        let writers: Vec<_> = (0..2u32)
            .map(|t| {
                let store = Arc::clone(&store);
                s.spawn(move || {
                    for round in 0..8u32 {
                        for k in 0..300u32 {
                            let key = format!("w{t}-k{k:03}");
                            store
                                .put(key.as_bytes(), value(t, k, round).as_bytes(), k % 50 == 0)
                                .expect("put");
                        }
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().expect("writer");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let stats = store.stats();
    assert!(stats.flushes > 20 && stats.compactions > 5, "{stats:?}");
    drop(store);
    let store = reopen(&storage);
    for t in 0..2 {
        for k in 0..300 {
            let key = format!("w{t}-k{k:03}");
            assert_eq!(
                store.get(key.as_bytes()).expect("get"),
                Some(value(t, k, 7).into_bytes())
            );
        }
    }
}
