//! Opening a damaged kura-store: the fuzzer's bytes overwrite part of a small store image whose
//! log spans several segments and whose 4 KiB memtable was flushed into runs and merged into
//! level 1 (so the manifest, run footers, filters, index and leaf pages are all in the image);
//! open, reading every key, a scan, writing a batch, compacting, closing and opening again
//! must each succeed or return an error — never panic or loop. The first 4 bytes choose
//! where the damage goes, the rest is written there.
#![no_main]

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_store::{Store, StoreOptions, WriteBatch};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex, OnceLock};

const SIZE: u64 = 16 << 20;
const KEYS: u32 = 40;

fn pristine() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = MemDevice::new(SIZE, QueueOptions::default());
        let storage = dev.storage();
        let store = Store::create(Box::new(dev), &options()).expect("create");
        for i in 0..KEYS {
            // Some values large enough that the log seals into a second and third segment.
            let len = if i % 10 == 3 {
                300_000
            } else {
                100 + i as usize
            };
            store
                .put(&i.to_le_bytes(), &vec![i as u8; len], i % 3 == 0)
                .expect("put");
        }
        let mut batch = WriteBatch::new();
        batch.delete(&1u32.to_le_bytes());
        batch.put(b"batch", b"value");
        store.write(batch, true).expect("batch");
        store.close().expect("close");
        let image = storage.lock().expect("lock").clone();
        // close waited for the background flush and the merges due: runs in levels 0 and 1.
        let copy = Arc::new(Mutex::new(image.clone()));
        let stats = open(&copy).expect("the seed image opens").stats();
        assert!(stats.runs_per_level[1] > 0, "{stats:?}");
        image
    })
}

/// 1 MiB segments, a 4 KiB memtable and level 0 merged above two runs: the seed image has runs
/// in two levels, and writes after the damage flush and merge again.
fn options() -> StoreOptions {
    StoreOptions {
        segment_shift: 20,
        memtable_bytes: 4 << 10,
        l0_runs: 2,
        ..StoreOptions::default()
    }
}

fn open(image: &Arc<Mutex<Vec<u8>>>) -> Option<Store> {
    let dev = MemDevice::with_storage(Arc::clone(image), QueueOptions::default());
    Store::open_with(Box::new(dev), &options()).ok()
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let mut image = pristine().clone();
    let at = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize % image.len();
    let rest = &data[4..];
    let end = (at + rest.len()).min(image.len());
    image[at..end].copy_from_slice(&rest[..end - at]);
    let image = Arc::new(Mutex::new(image));
    let Some(store) = open(&image) else { return };
    for i in 0..KEYS {
        let _ = store.get(&i.to_le_bytes());
    }
    let _ = store.scan(None, None, usize::MAX, false);
    let _ = store.put(b"after", b"damage", true);
    let _ = store.compact();
    let _ = store.stats();
    let _ = store.close();
    if let Some(store) = open(&image) {
        let _ = store.get(b"after");
    }
});
