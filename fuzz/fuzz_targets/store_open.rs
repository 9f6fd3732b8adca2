//! Opening a damaged kura-store: the fuzzer's bytes overwrite part of a small store image whose
//! log spans several segments; open, reading every key, writing a batch, closing and opening
//! again must each succeed or return an error — never panic or loop. The first 4 bytes choose
//! where the damage goes, the rest is written there.
#![no_main]

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_store::{Store, StoreOptions, WriteBatch};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex, OnceLock};

const SIZE: u64 = 6 << 20;
const KEYS: u32 = 40;

fn pristine() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = MemDevice::new(SIZE, QueueOptions::default());
        let storage = dev.storage();
        let opts = StoreOptions {
            segment_shift: 20,
            ..StoreOptions::default()
        };
        let store = Store::create(Box::new(dev), &opts).expect("create");
        for i in 0..KEYS {
            // Some values large enough that the log seals into a second and third segment.
            let len = if i % 10 == 3 { 300_000 } else { 100 + i as usize };
            store.put(&i.to_le_bytes(), &vec![i as u8; len], i % 3 == 0).expect("put");
        }
        let mut batch = WriteBatch::new();
        batch.delete(&1u32.to_le_bytes());
        batch.put(b"batch", b"value");
        store.write(batch, true).expect("batch");
        store.close().expect("close");
        let image = storage.lock().expect("lock").clone();
        image
    })
}

fn open(image: &Arc<Mutex<Vec<u8>>>) -> Option<Store> {
    let dev = MemDevice::with_storage(Arc::clone(image), QueueOptions::default());
    Store::open(Box::new(dev), 1 << 20).ok()
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
    let _ = store.put(b"after", b"damage", true);
    let _ = store.stats();
    let _ = store.close();
    if let Some(store) = open(&image) {
        let _ = store.get(b"after");
    }
});
