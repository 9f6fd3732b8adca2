//! Every drive, alone and composed, against a flat `Vec<u8>` model: seeded random batches of
//! mixed reads, writes, flushes, write-zeroes and discards of mixed sizes at queue depth, over
//! children that complete out of order (`shuffle=SEED`) and have small queues (`qd=4`), so
//! requests are cut, backlogged and retired in any order.

mod common;

use common::Model;
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::{BlockDevice, BlockingIo, DeviceError, IoBuf, Request};

fn check(spec: &str, seed: u64) {
    let mut dev = kura_vdrive::open(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let mut model = Model::of(&*dev, seed);
    model.run(&mut *dev, 24);
    model.check_image(&mut *dev);
}

#[test]
fn split_matches_the_model() {
    check("split(mem:2M?qd=4&shuffle=1)?offset=256K&len=1M", 1);
}

#[test]
fn concat_matches_the_model() {
    check(
        "concat(mem:512K?qd=4&shuffle=1,mem:256K?qd=4&shuffle=2,mem:768K?qd=4&shuffle=3)",
        2,
    );
}

#[test]
fn stripe_matches_the_model() {
    check(
        "stripe(mem:512K?qd=4&shuffle=1,mem:512K?qd=4&shuffle=2,mem:512K?qd=4&shuffle=3)?chunk=8K",
        3,
    );
    check("stripe(mem:1M?shuffle=4,mem:1M?shuffle=5)", 4);
}

#[test]
fn mirror_matches_the_model() {
    check("mirror(mem:1M?qd=4&shuffle=1,mem:1M?qd=4&shuffle=2)", 5);
    check("mirror(mem:1M?shuffle=3,mem:1M?qd=2,mem:768K?shuffle=4)", 6);
}

#[test]
fn cache_matches_the_model_in_both_modes() {
    check("cache(mem:1M?shuffle=1)?size=64K", 7);
    check("cache(mem:1M?shuffle=2)?size=64K&mode=wb", 8);
    check("cache(mem:1M?shuffle=3)", 9);
}

#[test]
fn coalesce_matches_the_model() {
    check("coalesce(mem:1M?shuffle=1)", 21);
    check("coalesce(mem:1M?qd=4&shuffle=2)?max=16K", 22);
    check(
        "coalesce(cache(mem:1M?shuffle=3)?size=64K&mode=wb)?max=64K",
        23,
    );
}

#[test]
fn priority_class_zero_matches_the_model() {
    check("priority(mem:1M?shuffle=1)", 31);
    check(
        "priority(mem:1M?qd=4&shuffle=2)?weights=1:4:2&bgdepth=1&bgchunk=8K",
        32,
    );
}

#[test]
fn atomic_matches_the_model() {
    check("atomic(mem:1M?shuffle=1)?log=256K", 33);
    check("atomic(mem:1M?qd=4&shuffle=2)?log=64K", 34);
    check(
        "atomic(stripe(mem:512K?shuffle=3,mem:512K?shuffle=4)?chunk=8K)?log=128K",
        35,
    );
}

#[test]
fn compositions_match_the_model() {
    for (i, spec) in [
        "mirror(stripe(mem:512K?qd=4&shuffle=1,mem:512K?qd=4&shuffle=2)?chunk=16K,cache(concat(mem:512K?shuffle=3,mem:512K?shuffle=4))?size=128K&mode=wb)",
        "fault(stripe(mem:512K?shuffle=1,mem:512K?shuffle=2)?chunk=8K)",
        "stripe(split(mem:2M?shuffle=5)?len=512K,split(mem:2M?shuffle=6)?offset=1M&len=512K)?chunk=4K",
        "concat(mirror(mem:512K?shuffle=1,mem:512K?shuffle=2),stripe(mem:256K?qd=2,mem:256K?qd=2)?chunk=4K)",
        "cache(stripe(mirror(mem:256K,mem:256K?shuffle=7),mem:256K?shuffle=8)?chunk=8K)?size=32K&mode=wb",
    ]
    .into_iter()
    .enumerate()
    {
        check(spec, 10 + i as u64);
    }
}

fn mem(bytes: u64) -> MemDevice {
    MemDevice::new(bytes, QueueOptions::default())
}

fn pattern(blocks: usize) -> Vec<u8> {
    (0..blocks * 4096).map(|i| (i / 4096) as u8 + 1).collect()
}

#[test]
fn split_maps_onto_the_childs_window() {
    let child = mem(1 << 20);
    let storage = child.storage();
    let mut dev = kura_vdrive::partition::new(Box::new(child), 64 << 10, Some(128 << 10)).unwrap();
    assert_eq!(dev.geometry().num_blocks, 32);
    dev.write_blocks(0, &pattern(32)).unwrap();
    let disk = storage.lock().unwrap();
    assert_eq!(disk[(64 << 10) - 1], 0, "nothing before the window");
    assert_eq!(disk[64 << 10], 1);
    assert_eq!(disk[(192 << 10) - 1], 32);
    assert_eq!(disk[192 << 10], 0, "nothing after the window");
    drop(disk);
    let err = dev
        .submit(Request::read(1, 32, 1, IoBuf::zeroed(4096)))
        .unwrap_err();
    assert!(
        matches!(err.error, DeviceError::OutOfRange { .. }),
        "{}",
        err.error
    );
}

#[test]
fn concat_places_children_end_to_end() {
    let (a, b) = (mem(16 << 10), mem(32 << 10));
    let (sa, sb) = (a.storage(), b.storage());
    let mut dev = kura_vdrive::concat::new(vec![Box::new(a), Box::new(b)]).unwrap();
    assert_eq!(dev.geometry().num_blocks, 12);
    dev.write_blocks(0, &pattern(12)).unwrap();
    assert_eq!(sa.lock().unwrap()[..], pattern(4)[..]);
    assert_eq!(sb.lock().unwrap()[0], 5);
    assert_eq!(sb.lock().unwrap()[7 * 4096], 12);
}

#[test]
fn stripe_places_chunks_round_robin() {
    let (a, b) = (mem(64 << 10), mem(64 << 10));
    let (sa, sb) = (a.storage(), b.storage());
    let mut dev = kura_vdrive::stripe::new(vec![Box::new(a), Box::new(b)], 8 << 10).unwrap();
    assert_eq!(dev.geometry().num_blocks, 32);
    dev.write_blocks(0, &pattern(32)).unwrap();
    let (da, db) = (sa.lock().unwrap(), sb.lock().unwrap());
    let block = |d: &[u8], b: usize| d[b * 4096];
    // Chunks of two blocks: 0 and 2 on leg A, 1 and 3 on leg B.
    assert_eq!(
        [block(&da, 0), block(&da, 1), block(&da, 2), block(&da, 3)],
        [1, 2, 5, 6]
    );
    assert_eq!(
        [block(&db, 0), block(&db, 1), block(&db, 2), block(&db, 3)],
        [3, 4, 7, 8]
    );
    drop((da, db));
    let mut back = vec![0u8; 32 * 4096];
    dev.read_blocks(0, &mut back).unwrap();
    assert_eq!(
        back,
        pattern(32),
        "a read across every chunk reassembles the data"
    );
}

#[test]
fn describe_names_the_whole_stack() {
    let dev = kura_vdrive::open("stripe(mem:64K,split(mem:128K)?offset=64K)?chunk=8K").unwrap();
    assert_eq!(
        dev.describe(),
        "stripe(mem:65536,split(mem:131072)?offset=65536&len=65536)?chunk=8192"
    );
}

#[test]
fn a_mirror_of_a_stripe_and_a_cached_file_matches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!(
        "mirror(stripe(mem:32M?shuffle=1,mem:32M?shuffle=2),cache(file:{}/x.img?size=64M))",
        dir.path().display()
    );
    let mut dev = kura_vdrive::open(&spec).unwrap();
    assert_eq!(dev.geometry().capacity_bytes(), 64 << 20);
    let mut model = Model::of(&*dev, 21);
    model.run(&mut *dev, 12);
    model.check_image(&mut *dev);
}
