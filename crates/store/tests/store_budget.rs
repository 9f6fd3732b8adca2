//! One memory budget: a store holding several times its budget works (every key read back,
//! before and after reopen), the memtables stay within their share, and the page cache never
//! holds more than what the memtables and the runs' in-memory parts leave it.

mod common;

use common::{options, ram_disk};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_store::{Store, StoreOptions, StoreStats};

const BUDGET: usize = 1 << 20;

fn key(i: u32) -> Vec<u8> {
    // Spread over the key space so flushes overlap and merges happen at every level.
    format!("k{:08}", i.wrapping_mul(2_654_435_761) % 1_000_003).into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    let mut v = format!("{i:06}").into_bytes();
    v.resize(500, (i % 251) as u8);
    v
}

fn within_budget(s: &StoreStats) {
    let memtable_share = (BUDGET / 4) as u64;
    // Each memtable may pass its limit by the commit group that crossed it (one small put).
    assert!(
        s.memtable_bytes + s.immutable_bytes <= 2 * memtable_share + 4096,
        "{s:?}"
    );
    assert!(s.cache_bytes <= s.cache_capacity_bytes, "{s:?}");
    assert!(
        s.cache_capacity_bytes + s.index_bytes + 2 * memtable_share <= BUDGET as u64,
        "{s:?}"
    );
}

#[test]
fn a_store_many_times_its_budget_works_and_the_cache_keeps_to_its_share() {
    let dev = ram_disk(64, 4096);
    let storage = dev.storage();
    let opts = StoreOptions {
        memory_budget: BUDGET,
        memtable_bytes: 16 << 20,
        ..options()
    };
    let n = 12_000u32;
    let store = Store::create(Box::new(dev), &opts).expect("create");
    for i in 0..n {
        store.put(&key(i), &value(i), false).expect("put");
        if i % 500 == 0 {
            within_budget(&store.stats());
        }
    }
    let stats = store.stats();
    assert_eq!(stats.memory_budget, BUDGET as u64);
    // About 6 MB of user data: more than five times the budget.
    assert!(stats.user_bytes > 5 * BUDGET as u64, "{stats:?}");
    assert!(stats.flushes >= 10, "{stats:?}");
    for round in 0..2 {
        for i in (0..n).rev() {
            assert_eq!(
                store.get(&key(i)).expect("get"),
                Some(value(i)),
                "key {i}, round {round}"
            );
            if i % 1000 == 0 {
                within_budget(&store.stats());
            }
        }
    }
    let stats = store.stats();
    assert!(stats.cache_capacity_bytes > 0, "{stats:?}");
    assert!(stats.cache_hits > 0 && stats.cache_misses > 0, "{stats:?}");
    let all = store.scan(None, None, usize::MAX, false).expect("scan");
    assert_eq!(all.len(), n as usize);
    within_budget(&store.stats());
    store.close().expect("close");

    let store = Store::open_with(
        Box::new(MemDevice::with_storage(storage, QueueOptions::default())),
        &opts,
    )
    .expect("reopen");
    for i in (0..n).step_by(7) {
        assert_eq!(store.get(&key(i)).expect("get"), Some(value(i)));
    }
    within_budget(&store.stats());
}
