//! Damaged stores: a store with runs on two levels, a manifest and a log tail gets one byte
//! flipped (in a superblock copy, a log frame, a manifest checkpoint, a run page or a run's
//! value area); opening it, reading every key, scanning and compacting must then give either
//! a typed error or values that were once written under that key (a damaged log frame ends the
//! log early, so an older version may come back) — never a panic, never bytes that were not
//! the key's.

mod common;

use common::{ram_disk, small_memtable, SHIFT};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_store::format::PAGE_SIZE;
use kura_store::{Store, StoreOptions};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};

type Written = BTreeMap<Vec<u8>, BTreeSet<Vec<u8>>>;

fn key(k: u32) -> Vec<u8> {
    format!("key-{k:04}").into_bytes()
}

/// The image of a store built once, and every value each key ever had.
fn image() -> &'static (Vec<u8>, Written) {
    static IMAGE: OnceLock<(Vec<u8>, Written)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = ram_disk(16, 4096);
        let storage = dev.storage();
        let opts = StoreOptions {
            l0_runs: 8,
            ..small_memtable(8 << 10)
        };
        let store = Store::create(Box::new(dev), &opts).expect("create");
        let mut written = Written::new();
        for i in 0..600u32 {
            let k = key(i % 150);
            // Inline values and, every 9th, one in the run's value area.
            let len = if i % 9 == 0 { 700 } else { 40 };
            let v: Vec<u8> = (0..len).map(|b| (b as u32 ^ i) as u8).collect();
            store.put(&k, &v, false).expect("put");
            written.entry(k).or_default().insert(v);
            if i % 13 == 0 {
                store.delete(&key(i % 150 + 1), false).expect("delete");
            }
            if i == 400 {
                store.compact().expect("compact");
            }
        }
        let stats = store.stats();
        assert!(
            stats.runs_per_level[0] > 0 && stats.runs_per_level[1] > 0,
            "{stats:?}"
        );
        store.close().expect("close");
        let bytes = storage.lock().expect("storage").clone();
        (bytes, written)
    })
}

fn check_reads(store: &Store, written: &Written) {
    for k in 0..151u32 {
        if let Ok(Some(v)) = store.get(&key(k)) {
            assert!(
                written.get(&key(k)).is_some_and(|vs| vs.contains(&v)),
                "key {k}: a value never written under it"
            );
        }
    }
    if let Ok(pairs) = store.scan(None, None, usize::MAX, false) {
        for (k, v) in pairs {
            assert!(
                written.get(&k).is_some_and(|vs| vs.contains(&v)),
                "scan: a value never written under {k:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn one_flipped_byte_gives_errors_or_written_values(
        slot in 0u64..15,
        from_end in any::<bool>(),
        page in 0usize..24,
        byte in 0usize..PAGE_SIZE,
        mask in 1u8..=255,
        superblock in proptest::bool::weighted(0.05),
    ) {
        let (base, written) = image();
        let mut bytes = base.clone();
        let segment = 1usize << SHIFT;
        let at = if superblock {
            (page % 2) * PAGE_SIZE + byte
        } else {
            let pages = segment / PAGE_SIZE;
            let page = if from_end { pages - 1 - page } else { page };
            (slot as usize + 1) * segment + page * PAGE_SIZE + byte
        };
        bytes[at] ^= mask;
        let dev = MemDevice::with_storage(Arc::new(Mutex::new(bytes)), QueueOptions::default());
        let Ok(store) = Store::open(Box::new(dev), 1 << 20) else {
            return Ok(());
        };
        check_reads(&store, written);
        if store.compact().is_ok() {
            check_reads(&store, written);
        }
    }
}
