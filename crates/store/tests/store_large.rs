//! A store many times larger than its memtable: 50k keys through a 256 KiB memtable (so dozens
//! of flushes and several compactions), some deleted and overwritten, every key checked against
//! a `BTreeMap` before and after reopening; then the same keys overwritten round after round,
//! writing several times the device's size, which only works if flushes free log segments and
//! compactions free the runs they replace.

mod common;

use common::{ram_disk, reopen_with, SHIFT};
use kura_store::{Store, StoreOptions, WriteBatch};
use std::collections::BTreeMap;

const KEYS: u32 = 50_000;

fn opts() -> StoreOptions {
    StoreOptions {
        segment_shift: SHIFT,
        memtable_bytes: 256 << 10,
        // Level 1 passes runs down one at a time once it holds more than two, so level 2
        // fills and merges from level 1 take one run and the level-2 runs it overlaps.
        l1_runs: 2,
        // Merges whose output level holds two runs or more are cut into key ranges written
        // on threads of their own, whatever the host's cores.
        merge_threads: 4,
        ..StoreOptions::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key{:08}", i.wrapping_mul(2_654_435_761) % 1_000_000_007).into_bytes()
}

/// Mostly 100-byte values (inline in runs), every 97th 3000 bytes (in the run's value area).
fn value(i: u32, round: u32) -> Vec<u8> {
    let len = if i.is_multiple_of(97) { 3000 } else { 100 };
    (0..len)
        .map(|b| (b as u32 ^ i ^ round.wrapping_mul(31)) as u8)
        .collect()
}

/// Every key by a full scan; by `get`, every `step`th live key and deleted key.
fn check(store: &Store, model: &BTreeMap<Vec<u8>, Vec<u8>>, deleted: &[Vec<u8>], step: usize) {
    for (k, v) in model.iter().step_by(step) {
        assert_eq!(store.get(k).expect("get").as_ref(), Some(v), "{k:?}");
    }
    for k in deleted.iter().step_by(step) {
        assert_eq!(store.get(k).expect("get"), None, "deleted {k:?}");
    }
    let all = store.scan(None, None, usize::MAX, false).expect("scan");
    assert_eq!(all.len(), model.len());
    assert!(all
        .iter()
        .zip(model)
        .all(|(a, (k, v))| a.0 == *k && a.1 == *v));
    let tail = store.scan(None, None, 100, true).expect("reverse scan");
    assert!(tail
        .iter()
        .zip(model.iter().rev())
        .all(|(a, (k, v))| a.0 == *k && a.1 == *v));
}

#[test]
fn fifty_thousand_keys_through_a_small_memtable() {
    let dev = ram_disk(48, 4096);
    let storage = dev.storage();
    let store = Store::create(Box::new(dev), &opts()).expect("create");
    let mut model = BTreeMap::new();
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(50) {
        let mut batch = WriteBatch::new();
        for &i in chunk {
            batch.put(&key(i), &value(i, 0));
            model.insert(key(i), value(i, 0));
        }
        store.write(batch, false).expect("write");
    }
    let mut deleted = Vec::new();
    for i in (0..KEYS).step_by(7) {
        store.delete(&key(i), false).expect("delete");
        model.remove(&key(i));
        deleted.push(key(i));
    }
    for i in (0..KEYS).step_by(5) {
        if model.contains_key(&key(i)) {
            store.put(&key(i), &value(i, 1), false).expect("overwrite");
            model.insert(key(i), value(i, 1));
        }
    }
    // Flushes go on while a merge runs, so how far the merges got is up to the schedule.
    store.settle().expect("settle");
    let stats = store.stats();
    assert!(stats.flushes >= 20, "{stats:?}");
    assert!(stats.compactions >= 2, "{stats:?}");
    assert!(stats.runs_per_level[2] > 2, "{stats:?}");
    assert!(stats.merges_in_parts > 0, "{stats:?}");
    assert!(stats.memtable_bytes <= 256 << 10, "{stats:?}");
    check(&store, &model, &deleted, 10);
    store.close().expect("close");

    let store = reopen_with(&storage, &opts());
    check(&store, &model, &deleted, 10);

    // Overwrite 10k keys round after round until more than the device's size was written,
    // while a snapshot taken before keeps seeing the old values through every flush and merge.
    let snap = store.snapshot();
    let frozen = model.clone();
    let hot: Vec<u32> = (0..KEYS)
        .filter(|i| !i.is_multiple_of(7))
        .take(10_000)
        .collect();
    for round in 2.. {
        for chunk in hot.chunks(100) {
            let mut batch = WriteBatch::new();
            for &i in chunk {
                batch.put(&key(i), &value(i, round));
                model.insert(key(i), value(i, round));
            }
            store.write(batch, false).expect("overwrite round");
        }
        let stats = store.stats();
        let written = stats.log_bytes_written + stats.run_bytes_written;
        if round >= 9 && written > 2 * (stats.slot_count << SHIFT) {
            break;
        }
        assert!(
            round < 60,
            "wrote {written} bytes to a {}-slot device in {round} rounds",
            stats.slot_count
        );
    }
    let stats = store.stats();
    assert!(stats.slots_used < stats.slot_count, "{stats:?}");
    assert!(stats.write_amplification() > 1.0);
    // The snapshot's versions went through merges in parts too.
    assert!(stats.merges_in_parts > 1, "{stats:?}");
    store.compact().expect("compact");
    let after = store.stats();
    assert_eq!(after.runs_per_level[0], 0);
    check(&store, &model, &deleted, 10);
    for (k, v) in frozen.iter().step_by(10) {
        assert_eq!(store.get_at(&snap, k).expect("get_at").as_ref(), Some(v));
    }
    let seen = store
        .scan_at(&snap, None, None, usize::MAX, false)
        .expect("scan_at");
    assert!(
        seen.len() == frozen.len()
            && seen
                .iter()
                .zip(&frozen)
                .all(|(a, (k, v))| a.0 == *k && a.1 == *v)
    );
    drop(snap);
    store.close().expect("close");
    check(&reopen_with(&storage, &opts()), &model, &deleted, 10);
}

/// Merges free the runs they have passed as they go, so a device well under three times the
/// live data takes that data written twice: 12 MiB of 1 KiB values in scrambled order through
/// a memtable of half a segment, on a 32 MiB device (31 one-MiB slots for runs, log and
/// manifest). Before merges freed their inputs as they went, a level-0 merge needed room for
/// its whole output beside all of level 1, and this store filled during the second pass (34
/// MiB too; 30 MiB works now, 28 does not).
#[test]
fn a_device_under_three_times_its_data_takes_every_overwrite() {
    const SMALL_KEYS: u32 = 12_288;
    let opts = StoreOptions {
        segment_shift: SHIFT,
        memtable_bytes: 512 << 10,
        ..StoreOptions::default()
    };
    let dev = ram_disk(32, 4096);
    let storage = dev.storage();
    let store = Store::create(Box::new(dev), &opts).expect("create");
    let mut model = BTreeMap::new();
    let value = |i: u32, round: u32| -> Vec<u8> {
        (0..1024u32)
            .map(|b| (b ^ i ^ round.wrapping_mul(131)) as u8)
            .collect()
    };
    for round in 0..2 {
        for chunk in (0..SMALL_KEYS).collect::<Vec<_>>().chunks(50) {
            let mut batch = WriteBatch::new();
            for &i in chunk {
                batch.put(&key(i), &value(i, round));
                model.insert(key(i), value(i, round));
            }
            if let Err(e) = store.write(batch, false) {
                panic!("round {round}: {e}: {:?}", store.stats());
            }
        }
    }
    store.settle().expect("settle");
    let stats = store.stats();
    assert!(stats.merge_steps > 0, "{stats:?}");
    check(&store, &model, &[], 7);
    store.close().expect("close");
    check(&reopen_with(&storage, &opts), &model, &[], 7);
}

/// Keys written in order leave level-1 runs that no level-2 run overlaps: they are passed down
/// as they are (a manifest change, no rewrite), interleaved with keys written out of order
/// that overlap them later, and every key reads back, before and after reopening.
#[test]
fn runs_nothing_overlaps_move_down_without_a_rewrite() {
    let dev = ram_disk(64, 4096);
    let storage = dev.storage();
    let store = Store::create(Box::new(dev), &opts()).expect("create");
    let mut model = BTreeMap::new();
    let ordered = |i: u32| format!("seq{i:08}").into_bytes();
    for chunk in (0..30_000u32).collect::<Vec<_>>().chunks(100) {
        let mut batch = WriteBatch::new();
        for &i in chunk {
            batch.put(&ordered(i), &value(i, 0));
            model.insert(ordered(i), value(i, 0));
        }
        store.write(batch, false).expect("write");
    }
    store.settle().expect("settle");
    let moved = store.stats();
    assert!(moved.runs_moved > 0, "{moved:?}");
    check(&store, &model, &[], 7);
    // Keys inside the moved runs' ranges, so later merges meet them in level 2.
    let mut deleted = Vec::new();
    for i in (0..30_000u32).step_by(3) {
        store
            .put(&ordered(i), &value(i, 1), false)
            .expect("overwrite");
        model.insert(ordered(i), value(i, 1));
    }
    for i in (1..30_000u32).step_by(11) {
        store.delete(&ordered(i), false).expect("delete");
        model.remove(&ordered(i));
        deleted.push(ordered(i));
    }
    store.settle().expect("settle");
    let stats = store.stats();
    assert!(stats.compactions > moved.compactions, "{stats:?}");
    check(&store, &model, &deleted, 7);
    store.close().expect("close");
    check(&reopen_with(&storage, &opts()), &model, &deleted, 7);
}
