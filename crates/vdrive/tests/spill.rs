//! `spill`: against the flat model with mem children and with a real NBD export on loopback as
//! REMOTE; placement of first-written chunks on LOCAL until it is full; reopening keeps the data;
//! after a power cut of both devices every flushed write is still there; bad layouts refused.

mod common;

use common::Model;
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{BlockDevice, BlockingIo, OpenError};
use kura_vdrive::spill::Spill;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BS: usize = 4096;
const CHUNK: u64 = 64 << 10;

fn mem(bytes: u64) -> (MemDevice, MemStorage) {
    let dev = MemDevice::new(bytes, QueueOptions::default());
    let storage = dev.storage();
    (dev, storage)
}

fn block_of(id: u64) -> Vec<u8> {
    let mut b = vec![(id % 251) as u8; BS];
    b[..8].copy_from_slice(&id.to_le_bytes());
    b
}

fn id_of(block: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&block[..8]);
    u64::from_le_bytes(b)
}

#[test]
fn spill_matches_the_model_with_mem_children() {
    for (seed, spec) in [
        "spill(mem:256K?qd=4&shuffle=1,mem:1M?qd=4&shuffle=2)?chunk=64K",
        "spill(mem:1M?shuffle=3,mem:2M)?local=512K&chunk=16K",
        "spill(mem:4M,mem:2M?shuffle=4)?chunk=8K",
        "spill(mem:2M,mem:1M)",
    ]
    .into_iter()
    .enumerate()
    {
        let mut dev = kura_vdrive::open(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let mut model = Model::of(&*dev, 40 + seed as u64);
        model.run(&mut *dev, 24);
        model.check_image(&mut *dev);
    }
}

#[test]
fn first_written_chunks_go_local_until_it_is_full() {
    // 256 KiB of LOCAL: header + map block, then 3 slots of 64 KiB.
    let (local, ls) = mem(256 << 10);
    let (remote, rs) = mem(1 << 20);
    let mut dev = Spill::new(Box::new(local), Box::new(remote), None, CHUNK).unwrap();
    assert_eq!(
        dev.geometry().capacity_bytes(),
        1 << 20,
        "REMOTE's capacity"
    );
    assert_eq!(dev.stats().slots, 3);
    let per_chunk = CHUNK / BS as u64;
    // Write chunks 5, 2, 9, 7 in that order: the first three take slots 0, 1, 2.
    for (i, chunk) in [5u64, 2, 9, 7].into_iter().enumerate() {
        dev.write_blocks(chunk * per_chunk + 1, &block_of(100 + i as u64))
            .unwrap();
    }
    dev.flush_all().unwrap();
    let s = dev.stats();
    assert_eq!((s.slots_used, s.placements), (3, 3));
    let data_start = 2 * BS; // header block + one map block
    let slot_block = |slot: usize, block: usize| {
        let at = data_start + slot * CHUNK as usize + block * BS;
        id_of(&ls.lock().unwrap()[at..at + BS])
    };
    assert_eq!(slot_block(0, 1), 100, "chunk 5 in slot 0");
    assert_eq!(slot_block(1, 1), 101, "chunk 2 in slot 1");
    assert_eq!(slot_block(2, 1), 102, "chunk 9 in slot 2");
    let remote_block = |lba: u64| {
        let at = lba as usize * BS;
        id_of(&rs.lock().unwrap()[at..at + BS])
    };
    assert_eq!(
        remote_block(5 * per_chunk + 1),
        0,
        "placed chunks never reach REMOTE"
    );
    assert_eq!(
        remote_block(7 * per_chunk + 1),
        103,
        "LOCAL full: chunk 7 stays remote"
    );
    let map = ls.lock().unwrap()[BS..BS + 24].to_vec();
    let entries: Vec<u64> = map.chunks(8).map(id_of).collect();
    assert_eq!(entries, [6, 3, 10], "map entries are chunk + 1 per slot");
}

#[test]
fn placing_a_chunk_keeps_its_earlier_remote_data() {
    let (local, _) = mem(256 << 10);
    let (remote, rs) = mem(1 << 20);
    {
        let mut r = rs.lock().unwrap();
        for b in 0..256usize {
            r[b * BS..(b + 1) * BS].copy_from_slice(&block_of(1000 + b as u64));
        }
    }
    let mut dev = Spill::new(Box::new(local), Box::new(remote), None, CHUNK).unwrap();
    // A one-block write into chunk 3 places it; its other 15 blocks come from REMOTE.
    dev.write_blocks(3 * 16 + 4, &block_of(7)).unwrap();
    let mut back = vec![0u8; 16 * BS];
    dev.read_blocks(3 * 16, &mut back).unwrap();
    for (i, b) in back.chunks(BS).enumerate() {
        let want = if i == 4 { 7 } else { 1000 + 48 + i as u64 };
        assert_eq!(id_of(b), want, "block {i} of chunk 3");
    }
}

#[test]
fn reopening_keeps_the_data_and_the_map() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!(
        "spill(file:{0}/local.img?size=512K,file:{0}/remote.img?size=2M)?chunk=32K",
        dir.path().display()
    );
    let mut dev = kura_vdrive::open(&spec).unwrap();
    let mut model = Model::of(&*dev, 77);
    model.run(&mut *dev, 16);
    dev.flush_all().unwrap();
    drop(dev);
    let mut dev = kura_vdrive::open(&spec).unwrap();
    model.check_image(&mut *dev);
    model.run(&mut *dev, 8);
    model.check_image(&mut *dev);
    // The images are locked while a drive has them open.
    drop(dev);

    let other = format!(
        "spill(file:{0}/local.img?size=512K,file:{0}/remote.img?size=2M)?chunk=64K",
        dir.path().display()
    );
    let err = kura_vdrive::open(&other).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("formatted for"), "{err}");
}

#[test]
fn power_cut_keeps_every_flushed_write() {
    const BLOCKS: u64 = 512;
    for seed in 0..32u64 {
        let (lmem, ls) = mem(256 << 10);
        let (rmem, rs) = mem(BLOCKS * BS as u64);
        // REMOTE starts out holding durable data, so that placing a chunk must carry it over.
        {
            let mut r = rs.lock().unwrap();
            for b in 0..BLOCKS {
                let at = b as usize * BS;
                r[at..at + BS].copy_from_slice(&block_of(1_000_000 + b));
            }
        }
        let plan = |s| FaultPlan {
            seed: s,
            ..FaultPlan::default()
        };
        let lf = FaultDevice::new(Box::new(lmem), plan(seed));
        let rf = FaultDevice::new(Box::new(rmem), plan(seed + 100));
        let (lc, rc) = (lf.control(), rf.control());
        let mut dev = Spill::new(Box::new(lf), Box::new(rf), None, 16 << 10).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut flushed: Vec<u64> = (0..BLOCKS).map(|b| 1_000_000 + b).collect();
        let mut current = flushed.clone();
        let mut since: Vec<Vec<u64>> = vec![Vec::new(); BLOCKS as usize];
        let mut next_id = 1u64;
        for _ in 0..rng.gen_range(3..120) {
            if rng.gen_bool(0.1) {
                dev.flush_all().unwrap();
                flushed.clone_from(&current);
                since.iter_mut().for_each(Vec::clear);
                continue;
            }
            let blocks = rng.gen_range(1..=6u64);
            let lba = rng.gen_range(0..=BLOCKS - blocks);
            let mut data = Vec::new();
            for b in lba..lba + blocks {
                data.extend(block_of(next_id));
                current[b as usize] = next_id;
                since[b as usize].push(next_id);
                next_id += 1;
            }
            dev.write_blocks(lba, &data).unwrap();
        }
        lc.power_cut();
        rc.power_cut();
        drop(dev);
        let local = MemDevice::with_storage(ls, QueueOptions::default());
        let remote = MemDevice::with_storage(rs, QueueOptions::default());
        let mut dev = Spill::new(Box::new(local), Box::new(remote), None, 16 << 10)
            .unwrap_or_else(|e| panic!("seed {seed}: reopen after the cut: {e}"));
        let mut image = vec![0u8; (BLOCKS as usize) * BS];
        dev.read_blocks(0, &mut image).unwrap();
        for b in 0..BLOCKS as usize {
            let id = id_of(&image[b * BS..(b + 1) * BS]);
            assert!(
                id == flushed[b] || since[b].contains(&id),
                "seed {seed} block {b}: holds write {id}, flushed {}, written since {:?}",
                flushed[b],
                since[b]
            );
        }
    }
}

#[test]
fn spill_over_a_real_nbd_export_matches_the_model_and_reopens() {
    let (export_dev, _) = mem(2 << 20);
    let listener = kura_nbd::bind_loopback(0).unwrap();
    let server = kura_nbd::serve(
        listener,
        vec![kura_nbd::Export::new("far", Box::new(export_dev))],
        kura_nbd::ServeOptions::default(),
    )
    .unwrap();
    let addr = server.local_addr();
    let dir = tempfile::tempdir().unwrap();
    let local_path = dir.path().join("near.img");
    let open = || {
        let local = kura_engine::open(&format!("file:{}?size=512K", local_path.display()))
            .expect("local file");
        let remote = kura_nbd::connect(addr, "far").expect("connect to the export");
        Spill::new(local, Box::new(remote), None, 32 << 10).expect("spill over nbd")
    };
    let mut dev = open();
    assert_eq!(dev.geometry().capacity_bytes(), 2 << 20);
    let mut model = Model::of(&dev, 91);
    model.run(&mut dev, 16);
    model.check_image(&mut dev);
    assert!(dev.stats().slots_used > 0, "some chunks went local");
    dev.flush_all().unwrap();
    drop(dev);
    let mut dev = open();
    model.check_image(&mut dev);
    drop(dev);
    drop(server.stop());
}

#[test]
fn bad_layouts_are_refused() {
    let err = |spec: &str| match kura_vdrive::open(spec) {
        Ok(_) => panic!("{spec} opened"),
        Err(e) => e,
    };
    let e = err("spill(mem:64K,mem:1M)?chunk=64K");
    assert!(
        matches!(e, OpenError::Invalid(_)) && e.to_string().contains("no"),
        "{e}"
    );
    let e = err("spill(mem:1M,mem:1M)?chunk=6K");
    assert!(e.to_string().contains("multiple"), "{e}");
    let e = err("spill(mem:1M,mem:1M)?local=2M");
    assert!(e.to_string().contains("larger"), "{e}");
    let e = err("spill(mem:1M)");
    assert!(e.to_string().contains("exactly 2"), "{e}");
    let e = err("spill(mem:1M?bs=512,mem:1M)");
    assert!(e.to_string().contains("block"), "{e}");

    let (local, ls) = mem(1 << 20);
    ls.lock().unwrap()[..4].copy_from_slice(b"ext4");
    let (remote, _) = mem(1 << 20);
    let e = Spill::new(Box::new(local), Box::new(remote), None, CHUNK)
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("refusing to overwrite"), "{e}");

    // A damaged map (a chunk in two slots) is refused on reopen.
    let (local, ls) = mem(1 << 20);
    let (remote, rs) = mem(1 << 20);
    let mut dev = Spill::new(Box::new(local), Box::new(remote), None, CHUNK).unwrap();
    dev.write_blocks(0, &block_of(1)).unwrap();
    dev.write_blocks(16, &block_of(2)).unwrap();
    dev.flush_all().unwrap();
    drop(dev);
    ls.lock().unwrap()[BS + 8..BS + 16].copy_from_slice(&1u64.to_le_bytes());
    let e = Spill::new(
        Box::new(MemDevice::with_storage(ls, QueueOptions::default())),
        Box::new(MemDevice::with_storage(rs, QueueOptions::default())),
        None,
        CHUNK,
    )
    .map(|_| ())
    .unwrap_err();
    assert!(e.to_string().contains("two slots"), "{e}");
}
