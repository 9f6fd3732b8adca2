//! `BlockDevice::stats` through stacks of drives: every layer reports its counters top-down, with
//! its depth, and nothing in the middle (single-child drives, multi-child drives, the priority
//! drive's shared child, the snapshot volume) hides the layers below it.

use kura_engine::device::stats_of;
use kura_engine::{BlockingIo, DriveStats};

const BS: usize = 4096;

/// Each entry's kind and depth, top-down.
fn shape(stats: &[DriveStats]) -> Vec<(&str, usize)> {
    stats.iter().map(|s| (s.kind.as_str(), s.depth)).collect()
}

fn counter(stats: &DriveStats, name: &str) -> u64 {
    stats
        .counter(name)
        .unwrap_or_else(|| panic!("{} has no counter {name}: {stats}", stats.kind))
}

#[test]
fn coalesce_over_cache_reports_both_in_order_with_their_counts() {
    let mut dev = kura_vdrive::open("coalesce(cache(mem:1M)?size=64K)").unwrap();
    for lba in 0..4u64 {
        dev.write_blocks(lba, &vec![lba as u8 + 1; BS]).unwrap();
    }
    let mut buf = vec![0; 4 * BS];
    dev.read_blocks(0, &mut buf).unwrap();
    let before = stats_of(&dev);
    dev.read_blocks(0, &mut buf).unwrap();
    assert_eq!(buf[3 * BS], 4, "the data read back");
    let after = stats_of(&dev);

    assert_eq!(shape(&after), [("coalesce", 0), ("cache", 1), ("mem", 2)]);
    // One caller request per blocking call, one at a time: four writes and two reads.
    let coalesce = &after[0];
    assert_eq!(counter(coalesce, "requests"), 6);
    assert!(counter(coalesce, "child_commands") >= 1);
    assert!(counter(coalesce, "merged") <= counter(coalesce, "requests"));
    // The cache holds 16 blocks, so the second read of the same four blocks hits on each.
    let cache = &after[1];
    assert_eq!(counter(cache, "hits") - counter(&before[1], "hits"), 4);
    assert_eq!(counter(cache, "misses"), counter(&before[1], "misses"));
    assert_eq!(counter(cache, "hits") + counter(cache, "misses"), 8);
    assert_eq!(counter(cache, "evictions"), 0);
    assert!(counter(cache, "cached_blocks") >= 4);
    assert!(
        after[2].counters.is_empty(),
        "mem counts nothing: {}",
        after[2]
    );
    assert!(
        after[1].to_string().starts_with("cache hits="),
        "{}",
        after[1]
    );
}

#[test]
fn multi_child_drives_report_every_leg_below_them() {
    let spec = "mirror(fault(mem:256K),stripe(mem:128K,mem:128K)?chunk=4K)";
    let mut dev = kura_vdrive::open(spec).unwrap();
    dev.write_blocks(0, &vec![7; 2 * BS]).unwrap();
    dev.flush_all().unwrap();
    let stats = stats_of(&dev);
    assert_eq!(
        shape(&stats),
        [
            ("mirror", 0),
            ("fault", 1),
            ("mem", 2),
            ("stripe", 1),
            ("mem", 2),
            ("mem", 2),
        ]
    );
    let mirror = &stats[0];
    assert_eq!(counter(mirror, "requests"), 2, "a write and a flush");
    assert_eq!(counter(mirror, "pieces"), 4, "each to both legs");
    assert_eq!(counter(mirror, "read_errors"), 0);
    assert_eq!(counter(mirror, "degraded_legs"), 0);
    let fault = &stats[1];
    assert_eq!(counter(fault, "writes"), 1);
    assert_eq!(counter(fault, "flushes"), 1);
    // The stripe cut the 2-block write into one piece per leg, plus a flush to each.
    assert_eq!(counter(&stats[3], "requests"), 2);
    assert_eq!(counter(&stats[3], "pieces"), 4);

    // `placed` takes its kind from its description.
    let dev = kura_vdrive::open("placed(mem:1M,mem:1M,mem:1M)?replicas=2&chunk=4K").unwrap();
    assert_eq!(
        shape(&stats_of(&dev)),
        [("placed", 0), ("mem", 1), ("mem", 1), ("mem", 1)]
    );
}

#[test]
fn spill_atomic_priority_and_snapshot_forward_to_their_children() {
    let mut dev =
        kura_vdrive::open("spill(atomic(mem:1M)?log=64K,cache(mem:2M))?local=256K&chunk=64K")
            .unwrap();
    dev.write_blocks(0, &vec![1; 2 * BS]).unwrap();
    let stats = stats_of(&dev);
    assert_eq!(
        shape(&stats),
        [
            ("spill", 0),
            ("atomic", 1),
            ("mem", 2),
            ("cache", 1),
            ("mem", 2)
        ]
    );
    assert_eq!(
        counter(&stats[0], "placements"),
        1,
        "the first chunk went local"
    );
    assert_eq!(counter(&stats[0], "slots_used"), 1);
    // atomic makes every multi-block write all-or-nothing through its log.
    assert_eq!(counter(&stats[1], "groups"), 1, "the 2-block write");
    assert_eq!(counter(&stats[1], "group_writes"), 1);

    let mut dev = kura_vdrive::open("priority(coalesce(mem:1M))?weights=4:1").unwrap();
    dev.write_blocks(3, &vec![2; BS]).unwrap();
    let stats = stats_of(&dev);
    assert_eq!(
        shape(&stats),
        [("priority", 0), ("coalesce", 1), ("mem", 2)]
    );
    assert_eq!(counter(&stats[0], "class"), 0);
    assert_eq!(counter(&stats[0], "weight"), 4);
    assert_eq!(counter(&stats[0], "requests"), 1);
    assert_eq!(counter(&stats[0], "dispatched_bytes"), BS as u64);
    assert_eq!(counter(&stats[1], "requests"), 1);

    let dev = kura_vdrive::open("snapshot(mem:4M)?format=1&chunk=32K").unwrap();
    let stats = stats_of(&dev);
    assert_eq!(shape(&stats), [("snapshot", 0), ("mem", 1)]);
    assert_eq!(counter(&stats[0], "versions"), 1);
    assert!(counter(&stats[0], "free_chunks") > 0);
}
