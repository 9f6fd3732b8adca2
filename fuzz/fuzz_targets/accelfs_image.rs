//! Mounting-side parsing of an untrusted image: the fuzzer's bytes replace the metadata of a
//! freshly made AccelFS (so most inputs get past the superblock) and fsck must report, never panic.
#![no_main]

use kura_accelfs::fsdevice::FsDevice;
use kura_accelfs::{fsck, mkfs, MkfsOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const SIZE: u64 = 2 << 20;

fn pristine() -> &'static Vec<u8> {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = MemDevice::new(SIZE, QueueOptions::default());
        let storage = dev.storage();
        let mut io = FsDevice::new(Box::new(dev), 4096).expect("block io");
        mkfs(
            &mut io,
            MkfsOptions {
                block_size: 4096,
                inodes: Some(64),
            },
        )
        .expect("mkfs");
        let image = storage.lock().expect("lock").clone();
        image
    })
}

fuzz_target!(|data: &[u8]| {
    // First 4 bytes pick where the rest lands, so the fuzzer can reach every structure.
    if data.len() < 4 {
        return;
    }
    let mut image = pristine().clone();
    let at = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize % image.len();
    let rest = &data[4..];
    let end = (at + rest.len()).min(image.len());
    image[at..end].copy_from_slice(&rest[..end - at]);
    let dev = MemDevice::with_storage(
        std::sync::Arc::new(std::sync::Mutex::new(image)),
        QueueOptions::default(),
    );
    let _ = fsck(Box::new(dev));
});
