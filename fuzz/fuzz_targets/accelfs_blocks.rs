//! Every on-disk block decoder on arbitrary bytes: errors are fine, panics are bugs.
#![no_main]

use kura_accelfs::bitmap::Bitmap;
use kura_accelfs::dir;
use kura_accelfs::extent::ExtentMap;
use kura_accelfs::header::BlockKind;
use kura_accelfs::inode::Inode;
use kura_accelfs::journal::{self, JournalArea, JournalSuper};
use kura_accelfs::layout::Superblock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Superblock::decode(data, 0);
    let _ = Inode::decode(1, data);
    let _ = dir::decode_block(data, 3);
    let _ = ExtentMap::decode_block(data, 3);
    let _ = kura_accelfs::xattr::decode_block(data, 3);
    let _ = JournalSuper::decode(data, 1);
    if data.len() >= 4096 {
        let mut b = Bitmap::new(40_000);
        let _ = b.decode_block(0, &data[..4096], BlockKind::BlockBitmap, 5);
        // A log made of the input, block by block.
        let blocks: Vec<&[u8]> = data.chunks(4096).collect();
        let area = JournalArea {
            start: 0,
            len: blocks.len() as u64 + 1,
        };
        let _ = journal::scan(
            JournalSuper {
                oldest_seq: 1,
                oldest_pos: 0,
                generation: 1,
            },
            area,
            4096,
            |n| {
                Ok::<_, ()>(blocks.get(n as usize - 1).map_or_else(
                    || vec![0; 4096],
                    |b| {
                        let mut v = b.to_vec();
                        v.resize(4096, 0);
                        v
                    },
                ))
            },
        );
    }
});
