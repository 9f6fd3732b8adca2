//! The block cache's durability: write-through reaches the child before the ack, write-back holds
//! dirty blocks until eviction or flush, and after a power cut everything flushed has survived.

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{BlockDevice, BlockingIo};
use kura_vdrive::{Cache, CacheMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BS: usize = 4096;
const BLOCKS: u64 = 256;

fn mem() -> (MemDevice, MemStorage) {
    let dev = MemDevice::new(BLOCKS * BS as u64, QueueOptions::default());
    let storage = dev.storage();
    (dev, storage)
}

/// A block whose every 8 bytes hold `id`.
fn block_of(id: u64) -> Vec<u8> {
    id.to_le_bytes().repeat(BS / 8)
}

fn id_of(block: &[u8]) -> u64 {
    let id = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
    assert!(block == block_of(id), "a block is whole, never torn");
    id
}

#[test]
fn write_through_reaches_the_child_before_the_ack() {
    let (child, disk) = mem();
    let mut c = Cache::new(Box::new(child), 64 << 10, CacheMode::WriteThrough).unwrap();
    c.write_blocks(5, &block_of(9)).unwrap();
    assert_eq!(id_of(&disk.lock().unwrap()[5 * BS..6 * BS]), 9);
    assert_eq!(c.dirty_blocks(), 0);
    let mut out = vec![0u8; BS];
    c.read_blocks(5, &mut out).unwrap();
    assert_eq!(id_of(&out), 9);
    assert_eq!(
        c.stats().hits,
        1,
        "the written block is served from the cache"
    );
}

#[test]
fn write_back_holds_dirty_blocks_until_eviction_or_flush() {
    let (child, disk) = mem();
    let mut c = Cache::new(Box::new(child), 4 * BS as u64, CacheMode::WriteBack).unwrap();
    c.write_blocks(0, &[block_of(1), block_of(2)].concat())
        .unwrap();
    assert_eq!(c.dirty_blocks(), 2);
    assert_eq!(
        id_of(&disk.lock().unwrap()[..BS]),
        0,
        "not on the child yet"
    );
    c.flush_all().unwrap();
    assert_eq!(c.dirty_blocks(), 0);
    assert_eq!(id_of(&disk.lock().unwrap()[BS..2 * BS]), 2);
    c.write_blocks(10, &block_of(3)).unwrap();
    for lba in 20..24 {
        c.write_blocks(lba, &block_of(lba)).unwrap();
    }
    assert!(c.cached_blocks() <= 4);
    assert_eq!(
        id_of(&disk.lock().unwrap()[10 * BS..11 * BS]),
        3,
        "evicted dirty block was written back"
    );
    let mut out = vec![0u8; 24 * BS];
    c.read_blocks(0, &mut out).unwrap();
    assert_eq!(id_of(&out[10 * BS..11 * BS]), 3);
    assert_eq!(id_of(&out[23 * BS..]), 23);
}

#[test]
fn write_back_power_cut_keeps_everything_flushed() {
    for seed in 0..6 {
        let (child, disk) = mem();
        let fault = FaultDevice::new(
            Box::new(child),
            FaultPlan {
                seed,
                ..FaultPlan::default()
            },
        );
        let control = fault.control();
        let mut c = Cache::new(Box::new(fault), 16 * BS as u64, CacheMode::WriteBack).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut flushed = vec![0u64; BLOCKS as usize];
        let mut current = flushed.clone();
        let mut since: Vec<Vec<u64>> = vec![Vec::new(); BLOCKS as usize];
        let mut next_id = 1u64;
        for _ in 0..300 {
            if rng.gen_bool(0.08) {
                c.flush_all().unwrap();
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
            c.write_blocks(lba, &data).unwrap();
        }
        control.power_cut();
        drop(c);
        assert!(control.is_offline());
        let image = disk.lock().unwrap();
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
fn a_cache_opened_from_a_spec_names_its_mode() {
    let dev = kura_vdrive::open("cache(mem:1M)?size=64K&mode=wb").unwrap();
    assert_eq!(dev.describe(), "cache(mem:1048576)?size=65536&mode=wb");
    let dev = kura_vdrive::open("cache(mem:1M)").unwrap();
    assert_eq!(dev.describe(), "cache(mem:1048576)?size=33554432&mode=wt");
}

/// A read miss and a write of the same block in flight together (and a third request whose fill
/// evicts): whatever order the child completes them in, the cache must end up holding what the
/// child holds (the write), never the data the read fetched before it.
#[test]
fn a_read_racing_a_write_never_leaves_stale_data_cached() {
    use kura_engine::{Completion, IoBuf, Request};
    for mode in [CacheMode::WriteThrough, CacheMode::WriteBack] {
        for seed in 0..32u64 {
            let child = MemDevice::new(BLOCKS * BS as u64, QueueOptions::default()).shuffled(seed);
            // One block of cache, so a third request's fill can evict the write's block between
            // the two racing completions.
            let mut c = Cache::new(Box::new(child), BS as u64, mode).unwrap();
            c.write_blocks(3, &block_of(1)).unwrap();
            c.flush_all().unwrap();
            // Evict block 3 so the next read misses.
            for b in 10..16 {
                c.write_blocks(b, &block_of(100 + b)).unwrap();
            }
            c.submit(Request::read(1, 3, 1, IoBuf::zeroed(BS))).unwrap();
            let mut w = IoBuf::zeroed(BS);
            w.copy_from_slice(&block_of(2));
            c.submit(Request::write(2, 3, 1, w)).unwrap();
            c.submit(Request::read(3, 5, 1, IoBuf::zeroed(BS))).unwrap();
            c.ring_doorbell().unwrap();
            let mut done: Vec<Completion> = Vec::new();
            while c.in_flight() > 0 {
                c.poll(&mut done, 1).unwrap();
            }
            assert!(done.iter().all(|d| d.status.is_ok()));
            let got = done.iter().find(|d| d.tag == 1).unwrap();
            let id = id_of(got.buf.as_ref().unwrap());
            assert!(
                id == 1 || id == 2,
                "the racing read sees old or new data, got {id}"
            );
            let mut now = vec![0u8; BS];
            c.read_blocks(3, &mut now).unwrap();
            assert_eq!(
                id_of(&now),
                2,
                "{mode:?} seed {seed}: a later read sees the write"
            );
        }
    }
}

#[test]
fn a_large_read_of_uncached_blocks_streams_past_the_cache() {
    let (child, disk) = mem();
    for b in 0..128u64 {
        disk.lock().unwrap()[b as usize * BS..(b as usize + 1) * BS].copy_from_slice(&block_of(b));
    }
    let mut c = Cache::new(Box::new(child), 64 * BS as u64, CacheMode::WriteBack)
        .unwrap()
        .with_stream_bytes(16 * BS as u64);
    let mut out = vec![0u8; 64 * BS];
    c.read_blocks(0, &mut out).unwrap();
    for (k, block) in out.chunks(BS).enumerate() {
        assert_eq!(id_of(block), k as u64);
    }
    let s = c.stats();
    assert_eq!((s.streamed, s.misses, s.hits), (64, 0, 0));
    assert_eq!(c.cached_blocks(), 0, "a stream is not kept");

    // A small read is cached as before, and a large read over it is no longer a stream, so
    // write-back data the child has not seen yet is part of the answer.
    c.read_blocks(70, &mut out[..BS]).unwrap();
    c.write_blocks(72, &block_of(999)).unwrap();
    c.read_blocks(64, &mut out[..32 * BS]).unwrap();
    assert_eq!(id_of(&out[6 * BS..7 * BS]), 70);
    assert_eq!(
        id_of(&out[8 * BS..9 * BS]),
        999,
        "the dirty block, not the child's"
    );
    assert_eq!(id_of(&out[31 * BS..32 * BS]), 95);
    assert_eq!(
        c.stats().streamed,
        64,
        "the second large read went through the cache"
    );

    // stream=0: every read is kept.
    let (child, _) = mem();
    let mut c = Cache::new(Box::new(child), 64 * BS as u64, CacheMode::WriteThrough)
        .unwrap()
        .with_stream_bytes(0);
    c.read_blocks(0, &mut out).unwrap();
    assert_eq!((c.stats().streamed, c.cached_blocks()), (0, 64));
}
