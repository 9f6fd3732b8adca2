//! `BlockDevice::allocation` through the drives that answer it (`split`, `concat`, `stripe`,
//! `spill`, `snapshot`, `throttle`) over sparse `file:` images and RAM disks: the extents cover
//! the range asked about, every block written since is data, and every block reported as a
//! hole reads as zeroes.

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::{Allocation, BlockDevice, BlockingIo};
use kura_vdrive::snapshot::{FormatOptions, SnapshotVolume};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;

/// Writes a few random runs of non-zero blocks, then checks the whole device and random
/// sub-ranges against what was written. Returns the data blocks reported for the whole device.
fn check(dev: &mut dyn BlockDevice, seed: u64, what: &str) -> u64 {
    let geo = dev.geometry();
    let bs = geo.block_size as usize;
    let n = geo.num_blocks;
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut written = BTreeSet::new();
    for _ in 0..6 {
        let len = rng.gen_range(1..=8u64).min(n);
        let lba = rng.gen_range(0..=n - len);
        dev.write_blocks(lba, &vec![0x5a; len as usize * bs])
            .expect("write");
        written.extend(lba..lba + len);
    }
    let mut whole = 0;
    for round in 0..20 {
        let (lba, blocks) = if round == 0 {
            (0, n)
        } else {
            let lba = rng.gen_range(0..n);
            (lba, rng.gen_range(1..=n - lba))
        };
        let extents = dev
            .allocation(lba, blocks)
            .expect("allocation")
            .unwrap_or_else(|| panic!("{what}: no answer"));
        assert_eq!(
            extents.iter().map(|e| e.blocks).sum::<u64>(),
            blocks,
            "{what}: {extents:?}"
        );
        let mut at = lba;
        for e in &extents {
            if e.state == Allocation::Hole {
                assert!(
                    !(at..at + e.blocks).any(|b| written.contains(&b)),
                    "{what}: a written block in hole {at}+{}",
                    e.blocks
                );
                let mut buf = vec![1u8; e.blocks as usize * bs];
                dev.read_blocks(at, &mut buf).expect("read");
                assert!(buf.iter().all(|&b| b == 0), "{what}: hole {at} not zero");
            } else if round == 0 {
                whole += e.blocks;
            }
            at += e.blocks;
        }
    }
    assert!(dev.allocation(n, 1).is_err(), "{what}: past the end");
    assert!(dev.allocation(0, 0).is_err(), "{what}: empty");
    whole
}

#[test]
fn layered_drives_report_holes_that_read_as_zeroes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let specs = [
        format!("split(file:{d}/a.img?size=4M)?offset=1M&len=2M"),
        format!("concat(file:{d}/b.img?size=1M,file:{d}/c.img?size=2M)"),
        format!("stripe(file:{d}/e.img?size=2M,file:{d}/f.img?size=2M)?chunk=16K"),
        format!("spill(file:{d}/l.img?size=512K,file:{d}/r.img?size=4M)?chunk=64K"),
        format!("throttle(file:{d}/t.img?size=2M)"),
        format!("snapshot(file:{d}/s.img?size=8M)?format=1&size=4M&chunk=64K"),
    ];
    for (i, spec) in specs.iter().enumerate() {
        let mut dev = kura_vdrive::open(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let data = check(dev.as_mut(), i as u64, spec);
        // At most 6 runs of 8 written blocks (and spill's 64 KiB chunks, the snapshot's
        // chunks) can be data; the rest of a sparse image must show as holes.
        let n = dev.geometry().num_blocks;
        assert!(
            data < n / 2,
            "{spec}: {data} of {n} blocks reported as data"
        );
    }
}

#[test]
fn snapshot_views_report_their_own_map() {
    let child = MemDevice::new(16 << 20, QueueOptions::default());
    let opts = FormatOptions {
        chunk_bytes: 64 << 10,
        virtual_bytes: Some(4 << 20),
        maps: 4,
    };
    let vol = SnapshotVolume::format(Box::new(child), opts).unwrap();
    let mut head = vol.head().unwrap();
    let bs = head.geometry().block_size as usize;
    head.write_blocks(0, &vec![3u8; bs]).unwrap();
    head.flush_all().unwrap();
    vol.take_snapshot("s").unwrap();
    // The head grows past the snapshot; the view still sees only its own chunk.
    let far = head.geometry().num_blocks - 1;
    head.write_blocks(far, &vec![4u8; bs]).unwrap();
    let mut view = vol.reader("s").unwrap();
    let n = view.geometry().num_blocks;
    let extents = view.allocation(0, n).unwrap().unwrap();
    assert_eq!(extents.first().map(|e| e.state), Some(Allocation::Data));
    assert_eq!(extents.last().map(|e| e.state), Some(Allocation::Hole));
    let head_extents = head.allocation(0, n).unwrap().unwrap();
    assert_eq!(head_extents.last().map(|e| e.state), Some(Allocation::Data));
    check(&mut head, 9, "snapshot head on a RAM disk");
}
