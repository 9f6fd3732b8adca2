//! The atomic drive: groups are all or nothing across power cuts at many points of the write
//! stream (torn log records dropped, committed ones replayed), acknowledged groups survive, the
//! log shrinks the capacity, and bad groups and options get typed errors.

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::fault::{materialize, FaultDevice, FaultPlan};
use kura_engine::{BlockDevice, BlockingIo, DeviceError};
use kura_vdrive::{AtomicDrive, AtomicError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BS: usize = 4096;
const CHILD_BLOCKS: u64 = 96;
const LOG: u64 = 32 * BS as u64;
const VISIBLE: u64 = CHILD_BLOCKS - 32;

/// A block whose every 8 bytes hold `id`.
fn block_of(id: u64) -> Vec<u8> {
    id.to_le_bytes().repeat(BS / 8)
}

fn id_of(block: &[u8]) -> u64 {
    let id = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
    assert!(block == block_of(id), "a block is whole, never torn");
    id
}

fn ids(dev: &mut dyn BlockDevice) -> Vec<u64> {
    let mut all = vec![0u8; VISIBLE as usize * BS];
    dev.read_blocks(0, &mut all).expect("read the whole drive");
    all.chunks(BS).map(id_of).collect()
}

/// A random group: 1 to 4 writes of 1 to 6 blocks, each block holding a fresh id.
fn random_group(rng: &mut SmallRng, next_id: &mut u64) -> Vec<(u64, Vec<u8>)> {
    let n = rng.gen_range(1..=4);
    (0..n)
        .map(|_| {
            let blocks = rng.gen_range(1..=6u64);
            let lba = rng.gen_range(0..=VISIBLE - blocks);
            let mut data = Vec::new();
            for _ in 0..blocks {
                data.extend(block_of(*next_id));
                *next_id += 1;
            }
            (lba, data)
        })
        .collect()
}

fn applied(image: &[u64], group: &[(u64, Vec<u8>)]) -> Vec<u64> {
    let mut next = image.to_vec();
    for (lba, data) in group {
        for (i, b) in data.chunks(BS).enumerate() {
            next[*lba as usize + i] = id_of(b);
        }
    }
    next
}

#[test]
fn groups_are_all_or_nothing_across_power_cuts() {
    let (mut replayed, mut torn, mut cuts) = (0, 0, 0);
    for seed in 0..80u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mem = MemDevice::new(CHILD_BLOCKS * BS as u64, QueueOptions::default());
        let storage = mem.storage();
        let fault = FaultDevice::new(
            Box::new(mem),
            FaultPlan {
                cut_after_writes: Some(rng.gen_range(1..=110)),
                keep_probability: 0.5,
                seed,
                ..FaultPlan::default()
            },
        );
        let control = fault.control();
        let mut drive = AtomicDrive::new(Box::new(fault), LOG).expect("open over a blank child");
        let mut acked = vec![0u64; VISIBLE as usize];
        let mut in_progress = None;
        let mut next_id = 1;
        for g in 0..20 {
            let group = if g % 2 == 0 {
                random_group(&mut rng, &mut next_id)
            } else {
                // Through the block interface: one multi-block write is one group.
                let blocks = rng.gen_range(2..=12u64);
                let lba = rng.gen_range(0..=VISIBLE - blocks);
                let data = (0..blocks)
                    .flat_map(|i| block_of(next_id + i))
                    .collect::<Vec<u8>>();
                next_id += blocks;
                vec![(lba, data)]
            };
            let next = applied(&acked, &group);
            let done = if g % 2 == 0 {
                let writes: Vec<(u64, &[u8])> =
                    group.iter().map(|(l, d)| (*l, d.as_slice())).collect();
                drive.write_atomic(&writes).map_err(|e| e.to_string())
            } else {
                drive
                    .write_blocks(group[0].0, &group[0].1)
                    .map_err(|e| e.to_string())
            };
            match done {
                Ok(()) => acked = next,
                Err(_) => {
                    in_progress = Some(next);
                    break;
                }
            }
        }
        if in_progress.is_some() {
            cuts += 1;
        }
        control.power_cut();
        drop(drive);
        assert!(control.is_offline());
        let reboot = MemDevice::with_storage(storage, QueueOptions::default());
        let mut drive = AtomicDrive::new(Box::new(reboot), LOG).expect("recover after the cut");
        replayed += drive.stats().replayed;
        torn += drive.stats().torn;
        let now = ids(&mut drive);
        assert!(
            now == acked || in_progress.as_ref() == Some(&now),
            "seed {seed}: the image is neither every acknowledged group nor those plus the one in progress"
        );
    }
    assert!(cuts > 40, "most runs are cut inside a group ({cuts})");
    assert!(
        replayed > 0,
        "some cuts fall after a commit, so a group is replayed"
    );
    assert!(torn > 0, "some cuts tear a log record, which is dropped");
}

/// Records one run's write stream, then rebuilds the image a crash at every position of it would
/// leave (unflushed blocks kept or lost at random, three seeds each) and recovers from it.
#[test]
fn recovery_at_every_point_of_a_recorded_write_stream() {
    let mem = MemDevice::new(CHILD_BLOCKS * BS as u64, QueueOptions::default());
    let fault = FaultDevice::new(
        Box::new(mem),
        FaultPlan {
            record: true,
            ..FaultPlan::default()
        },
    );
    let control = fault.control();
    let mut drive = AtomicDrive::new(Box::new(fault), LOG).expect("open over a blank child");
    let mut rng = SmallRng::seed_from_u64(99);
    let mut next_id = 1;
    // States after each acknowledged step, and the trace length when it was acknowledged. Steps
    // are groups and flushed single-block ordinary writes, which often land on a block of the
    // group before, so replaying an old group over them would show.
    let mut states = vec![vec![0u64; VISIBLE as usize]];
    let mut acked_at = Vec::new();
    for _ in 0..24 {
        let group = random_group(&mut rng, &mut next_id);
        let writes: Vec<(u64, &[u8])> = group.iter().map(|(l, d)| (*l, d.as_slice())).collect();
        drive.write_atomic(&writes).expect("no faults injected");
        let last = states.last().expect("the initial state");
        states.push(applied(last, &group));
        acked_at.push(control.trace().len());
        let lba = group[0].0;
        let single = vec![(lba, block_of(next_id))];
        next_id += 1;
        drive
            .write_blocks(lba, &single[0].1)
            .expect("no faults injected");
        drive.flush_all().expect("no faults injected");
        let last = states.last().expect("the group's state");
        states.push(applied(last, &single));
        acked_at.push(control.trace().len());
    }
    let trace = control.trace();
    let base = vec![0u8; CHILD_BLOCKS as usize * BS];
    for cut in 0..=trace.len() {
        let acked = acked_at.iter().filter(|&&at| at <= cut).count();
        for seed in 0..3 {
            let image = materialize(&base, &trace, cut, BS, 0.5, seed + cut as u64 * 7);
            let dev = MemDevice::with_storage(
                std::sync::Arc::new(std::sync::Mutex::new(image)),
                QueueOptions::default(),
            );
            let mut drive = AtomicDrive::new(Box::new(dev), LOG).expect("recover");
            let now = ids(&mut drive);
            assert!(
                now == states[acked] || states.get(acked + 1) == Some(&now),
                "cut at {cut} of {}: {acked} groups acknowledged, the image is neither that state nor the next",
                trace.len()
            );
        }
    }
}

#[test]
fn the_log_comes_off_the_capacity_and_data_lands_in_place() {
    let mem = MemDevice::new(1 << 20, QueueOptions::default());
    let storage = mem.storage();
    let mut drive = AtomicDrive::new(Box::new(mem), 256 << 10).unwrap();
    assert_eq!(drive.geometry().capacity_bytes(), 768 << 10);
    let a = [block_of(1), block_of(2)].concat();
    let b = block_of(3);
    drive.write_atomic(&[(10, &a), (100, &b)]).unwrap();
    let disk = storage.lock().unwrap();
    assert_eq!(id_of(&disk[10 * BS..11 * BS]), 1);
    assert_eq!(id_of(&disk[11 * BS..12 * BS]), 2);
    assert_eq!(id_of(&disk[100 * BS..101 * BS]), 3);
    assert!(
        disk[(768 << 10)..(768 << 10) + 8].iter().all(|&b| b == 0),
        "the record is checkpointed away"
    );
    drop(disk);
    assert_eq!(drive.stats().groups, 1);
    assert_eq!(drive.stats().group_writes, 2);
    let dev = kura_vdrive::open("atomic(mem:1M)?log=128K").unwrap();
    assert_eq!(dev.geometry().capacity_bytes(), 896 << 10);
    assert_eq!(dev.describe(), "atomic(mem:1048576)?log=131072");
}

#[test]
fn writes_larger_than_the_log_pass_through() {
    let mut drive = AtomicDrive::new(
        Box::new(MemDevice::new(1 << 20, QueueOptions::default())),
        64 << 10,
    )
    .unwrap();
    let big: Vec<u8> = (0..20).flat_map(block_of).collect();
    drive.write_blocks(0, &big).unwrap();
    drive.write_blocks(40, &big[..4 * BS]).unwrap();
    let stats = drive.stats();
    assert_eq!(stats.large_passthrough, 1);
    assert_eq!(stats.groups, 1);
    let mut back = vec![0u8; 20 * BS];
    drive.read_blocks(0, &mut back).unwrap();
    assert_eq!(back, big);
}

#[test]
fn bad_groups_get_typed_errors() {
    let mut drive = AtomicDrive::new(
        Box::new(MemDevice::new(1 << 20, QueueOptions::default())),
        64 << 10,
    )
    .unwrap();
    let one = block_of(1);
    assert_eq!(drive.write_atomic(&[]), Err(AtomicError::Empty));
    assert!(matches!(
        drive.write_atomic(&[(0, &one[..100])]),
        Err(AtomicError::BadLength { len: 100, .. })
    ));
    assert!(matches!(
        drive.write_atomic(&[(0, &one), (239, &[one.clone(), one.clone()].concat())]),
        Err(AtomicError::OutOfRange { lba: 239, .. })
    ));
    let big = vec![0u8; 16 * BS];
    assert!(matches!(
        drive.write_atomic(&[(0, &big)]),
        Err(AtomicError::TooLarge { blocks: 16, .. })
    ));
    let err = drive.write_atomic(&[(0, &big[..15 * BS])]);
    assert_eq!(
        err,
        Ok(()),
        "15 data blocks and a header fill the 16-block log exactly"
    );
}

#[test]
fn bad_options_are_refused_clearly() {
    for (spec, says) in [
        ("atomic(mem:1M)?log=0", "at least two blocks"),
        ("atomic(mem:1M)?log=5000", "multiple of the block size"),
        ("atomic(mem:1M)?log=1M", "leaves no room"),
        ("atomic(mem:1M,mem:1M)", "exactly 1 device"),
        ("atomic(mem:1M)?size=4", "no option `size`"),
        ("atomic(mem:1M)?log=lots", "log"),
    ] {
        let err = kura_vdrive::open(spec)
            .err()
            .unwrap_or_else(|| panic!("{spec} opened"));
        assert!(err.to_string().contains(says), "{spec}: {err}");
    }
}

#[test]
fn a_failed_commit_flush_poisons_the_drive() {
    let fault = FaultDevice::new(
        Box::new(MemDevice::new(1 << 20, QueueOptions::default())),
        FaultPlan {
            flush_eio: Some(1),
            ..FaultPlan::default()
        },
    );
    let mut drive = AtomicDrive::new(Box::new(fault), 64 << 10).unwrap();
    let two = [block_of(1), block_of(2)].concat();
    assert!(drive.write_atomic(&[(0, &two)]).is_err());
    let err = drive.write_blocks(0, &block_of(3)).unwrap_err();
    assert!(matches!(err, DeviceError::Poisoned { .. }), "{err}");
}
