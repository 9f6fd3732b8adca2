//! The snapshot drive's metadata decoders on untrusted bytes. The first byte picks the mode:
//! even — the rest is a superblock, decoded on its own and written over the current slot of a
//! real image, which is then opened; odd — the rest is a metadata blob, decoded on its own and
//! written as the current blob of a real image whose superblock is resealed (length and CRC
//! made to match, so the decoder behind the checksum is reached), then opened, listed, read and
//! written. Typed errors are fine; panics are bugs.
#![no_main]

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::crc32c::crc32c as crc;
use kura_engine::BlockingIo;
use kura_vdrive::snapshot::format::{Meta, Superblock};
use kura_vdrive::snapshot::FormatOptions;
use kura_vdrive::SnapshotVolume;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const SIZE: u64 = 1 << 20;
const BS: usize = 4096;

/// A formatted image with a snapshot and some data, and its current superblock.
fn pristine() -> &'static (Vec<u8>, Superblock) {
    static IMAGE: OnceLock<(Vec<u8>, Superblock)> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dev = MemDevice::new(SIZE, QueueOptions::default());
        let storage = dev.storage();
        let opts = FormatOptions {
            chunk_bytes: 16 << 10,
            virtual_bytes: Some(256 << 10),
            maps: 4,
        };
        let vol = SnapshotVolume::format(Box::new(dev), opts).expect("format");
        let mut head = vol.head().expect("head");
        head.write_blocks(0, &vec![1u8; 20 * BS]).expect("write");
        head.flush_all().expect("flush");
        vol.take_snapshot("s").expect("snapshot");
        head.write_blocks(8, &vec![2u8; 8 * BS]).expect("write");
        head.flush_all().expect("flush");
        let generation = vol.space().generation;
        drop(head);
        drop(vol);
        let image = storage.lock().expect("lock").clone();
        let at = (generation % 2) as usize * BS;
        let sb = Superblock::decode(&image[at..at + BS], BS as u32, SIZE / BS as u64)
            .expect("valid")
            .expect("present");
        (image, sb)
    })
}

fuzz_target!(|input: &[u8]| {
    let Some((&mode, data)) = input.split_first() else {
        return;
    };
    let (image, sb) = pristine();
    let mut img = image.clone();
    let slot = (sb.generation % 2) as usize * BS;
    if mode % 2 == 0 {
        let _ = Superblock::decode(data, BS as u32, SIZE / BS as u64);
        let n = data.len().min(BS);
        img[slot..slot + n].copy_from_slice(&data[..n]);
    } else {
        if let Ok(meta) = Meta::decode(data, sb) {
            assert_eq!(Meta::decode(&meta.encode(), sb).as_ref(), Ok(&meta));
        }
        let room = sb.meta_blocks as usize * BS;
        let n = data.len().min(room);
        let half = sb.meta_lba(sb.generation % 2) as usize * BS;
        img[half..half + room].fill(0);
        img[half..half + n].copy_from_slice(&data[..n]);
        let mut resealed = *sb;
        resealed.blob_len = n as u32;
        resealed.blob_crc = crc(&data[..n]);
        img[slot..slot + BS].copy_from_slice(&resealed.encode());
    }
    let dev = MemDevice::new(SIZE, QueueOptions::default());
    dev.storage().lock().expect("lock").copy_from_slice(&img);
    if let Ok(vol) = SnapshotVolume::open(Box::new(dev)) {
        for v in vol.list() {
            if let Ok(mut r) = vol.reader(&v.name) {
                let mut buf = vec![0u8; 4 * BS];
                let _ = r.read_blocks(0, &mut buf);
            }
        }
        if let Ok(mut head) = vol.head() {
            let _ = head.write_blocks(3, &vec![3u8; BS]);
            let _ = head.flush_all();
        }
        let _ = vol.take_snapshot("fuzz");
        let _ = vol.delete("s");
    }
});
