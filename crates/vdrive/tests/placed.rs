//! `placed(...)`: the device contract and the model over CRUSH maps built here (encoded with
//! kura-crush), every chunk on exactly the legs CRUSH names (legs read directly), a leg failing
//! mid-stream losing nothing acknowledged, and clear errors for maps that do not fit the legs.

mod common;
mod placed_crush;

use common::Model;
use kura_crush::map::{op, Bucket, BucketKind, Rule, Step, Tunables};
use kura_crush::CrushMap;
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{FaultDevice, FaultPlan};
use kura_engine::{conformance, BlockDevice, BlockingIo};
use kura_vdrive::{LegHealth, Placed, PlacedOptions};
use placed_crush::crush_legs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `hosts` straw2 hosts of `per_host` devices each (device weights `weight(osd)`, 16.16) under
/// a straw2 root; rule 0 puts replicas on distinct hosts (`chooseleaf firstn 0 type host`),
/// rule 1 on distinct devices (`choose firstn 0 type osd` from the root).
fn host_map(hosts: i32, per_host: i32, weight: impl Fn(i32) -> u32) -> CrushMap {
    let mut buckets = Vec::new();
    let mut names = BTreeMap::new();
    let mut host_weights = Vec::new();
    for h in 0..hosts {
        let items: Vec<i32> = (h * per_host..(h + 1) * per_host).collect();
        let ws: Vec<u32> = items.iter().map(|&d| weight(d)).collect();
        let total = ws.iter().sum();
        host_weights.push(total);
        for &d in &items {
            names.insert(d, format!("osd.{d}"));
        }
        names.insert(-1 - h, format!("host{h}"));
        buckets.push(Some(Bucket {
            id: -1 - h,
            bucket_type: 1,
            hash: 0,
            weight: total,
            items,
            kind: BucketKind::Straw2 { item_weights: ws },
        }));
    }
    let root = -1 - hosts;
    names.insert(root, "root".into());
    buckets.push(Some(Bucket {
        id: root,
        bucket_type: 2,
        hash: 0,
        weight: host_weights.iter().sum(),
        items: (0..hosts).map(|h| -1 - h).collect(),
        kind: BucketKind::Straw2 {
            item_weights: host_weights,
        },
    }));
    let step = |op: u32, arg1: i32, arg2: i32| Step { op, arg1, arg2 };
    let rule = |id: u8, choose: Step| Rule {
        ruleset: id,
        rule_type: 1,
        min_size: 1,
        max_size: 10,
        steps: vec![step(op::TAKE, root, 0), choose, step(op::EMIT, 0, 0)],
    };
    let map = CrushMap {
        buckets,
        rules: vec![
            Some(rule(0, step(op::CHOOSELEAF_FIRSTN, 0, 1))),
            Some(rule(1, step(op::CHOOSE_FIRSTN, 0, 0))),
        ],
        max_devices: hosts * per_host,
        tunables: Tunables::jewel(),
        type_names: [(0, "osd"), (1, "host"), (2, "root")]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect(),
        item_names: names,
        rule_names: [(0, "by-host"), (1, "by-osd")]
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect(),
        class_map: BTreeMap::new(),
        class_names: BTreeMap::new(),
        class_buckets: BTreeMap::new(),
        choose_args: BTreeMap::new(),
    };
    map.validate().expect("the test map is valid");
    map
}

fn write_map(dir: &Path, name: &str, map: &CrushMap) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, kura_crush::encode(map)).expect("write the map");
    path
}

fn mem(bytes: u64, seed: u64) -> (MemDevice, MemStorage) {
    let dev = MemDevice::new(bytes, QueueOptions::default()).shuffled(seed);
    let storage = dev.storage();
    (dev, storage)
}

#[test]
fn placed_drives_pass_the_device_contract_and_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), "hosts.bin", &host_map(3, 2, |_| 0x10000));
    let legs = |n: usize, qd: &str| -> String {
        (0..n)
            .map(|i| format!("mem:1M?{qd}shuffle={}", i + 1))
            .collect::<Vec<_>>()
            .join(",")
    };
    let specs = [
        format!(
            "placed({})?map={}&replicas=2&chunk=16K",
            legs(6, "qd=4&"),
            map.display()
        ),
        format!(
            "placed({})?map={}&rule=by-osd&replicas=3&chunk=8K",
            legs(6, ""),
            map.display()
        ),
        format!("placed({})?replicas=2&chunk=4K", legs(3, "qd=2&")),
        format!(
            "placed({})?map={}&replicas=3&chunk=16K&read=balanced",
            legs(6, "qd=4&"),
            map.display()
        ),
        format!(
            "placed({})?map={}&replicas=1&chunk=64K&size=1M",
            legs(6, ""),
            map.display()
        ),
    ];
    for (i, spec) in specs.iter().enumerate() {
        let mut dev = kura_vdrive::open(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let mut model = Model::of(&*dev, 40 + i as u64);
        model.run(&mut *dev, 24);
        model.check_image(&mut *dev);
        let blocks = dev.geometry().num_blocks;
        for (check, outcome) in conformance::suite(&mut *dev, 0, blocks, 7 + i as u64) {
            if let Err(e) = outcome {
                panic!("{spec}: {check}: {e}");
            }
        }
    }
}

#[test]
fn every_chunk_lands_on_exactly_the_legs_crush_names() {
    // Uneven weights, so legs fill unevenly and slots differ from leg to leg.
    let map = host_map(4, 2, |d| 0x8000 + 0x4000 * (d as u32 % 3));
    let (bs, chunk_blocks, replicas) = (4096usize, 4usize, 3usize);
    let mut devs = Vec::new();
    let mut disks = Vec::new();
    for i in 0..8 {
        let (d, s) = mem(512 << 10, i + 1);
        devs.push(Box::new(d) as Box<dyn BlockDevice>);
        disks.push(s);
    }
    let opts = PlacedOptions {
        rule: 0,
        replicas,
        chunk: (chunk_blocks * bs) as u64,
        size: None,
        balanced_reads: false,
        // The pre-format-1 layout, whose slots this test computes by hand.
        dense: true,
    };
    let mut dev = Placed::new(devs, &map, "test", &opts).unwrap();
    let blocks = dev.geometry().num_blocks as usize;
    let chunks = blocks / chunk_blocks;
    assert_eq!(dev.chunks() as usize, chunks);
    // Nominal capacity is smallest leg × legs / replicas; CRUSH's uneven fill may cut it.
    let nominal = (512 << 10) / (chunk_blocks * bs) * 8 / replicas;
    assert!(
        chunks <= nominal && chunks >= nominal / 2,
        "{chunks} of {nominal}"
    );
    // Every block gets its own stamp: its number in each 8-byte word.
    let mut data = vec![0u8; blocks * bs];
    for (b, block) in data.chunks_mut(bs).enumerate() {
        for w in block.chunks_mut(8) {
            w.copy_from_slice(&(b as u64 + 1).to_le_bytes());
        }
    }
    dev.write_blocks(0, &data).unwrap();
    dev.flush_all().unwrap();
    // Slots: the chunk's rank among the earlier chunks CRUSH put on the same leg.
    let mut used = [0usize; 8];
    let mut expected: Vec<Vec<u8>> = disks
        .iter()
        .map(|s| vec![0u8; s.lock().unwrap().len()])
        .collect();
    for c in 0..chunks {
        let legs = crush_legs(&map, 0, replicas, c as u64);
        assert_eq!(legs.len(), replicas);
        let want: Vec<(usize, u64)> = legs
            .iter()
            .map(|&l| (l, (used[l] * chunk_blocks) as u64))
            .collect();
        assert_eq!(dev.placement(c as u64), Some(want), "chunk {c}");
        let bytes = chunk_blocks * bs;
        for &l in &legs {
            let at = used[l] * bytes;
            expected[l][at..at + bytes].copy_from_slice(&data[c * bytes..(c + 1) * bytes]);
            used[l] += 1;
        }
    }
    for (l, disk) in disks.iter().enumerate() {
        let disk = disk.lock().unwrap();
        if let Some(i) = (0..disk.len()).find(|&i| disk[i] != expected[l][i]) {
            panic!(
                "leg {l} differs at byte {i} (slot {}): it holds exactly the chunks CRUSH puts on it, nothing else",
                i / (chunk_blocks * bs)
            );
        }
    }
    let mut back = vec![0u8; blocks * bs];
    dev.read_blocks(0, &mut back).unwrap();
    assert!(back == data);
}

#[test]
fn crushtool_names_the_same_legs() {
    if let Some(missing) = kura_testkit::missing_tool("crushtool", "apt-get install ceph-base") {
        missing.skip("crushtool_names_the_same_legs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let map = host_map(3, 3, |d| 0x10000 + 0x2000 * d as u32);
    let path = write_map(dir.path(), "m.bin", &map);
    let legs = (0..9)
        .map(|i| format!("mem:1M?shuffle={i}"))
        .collect::<Vec<_>>()
        .join(",");
    let spec = kura_engine::Spec::parse(&format!(
        "placed({legs})?map={}&replicas=3&chunk=64K",
        path.display()
    ))
    .unwrap();
    let registry = kura_vdrive::registry();
    let dev = kura_vdrive::placed::open(&spec, &|s| registry.open_spec(s)).unwrap();
    let chunks = dev.chunks();
    let out = std::process::Command::new("crushtool")
        .args(["-i", path.to_str().unwrap(), "--test", "--rule", "0"])
        .args(["--num-rep", "3", "--min-x", "0", "--max-x"])
        .arg((chunks - 1).to_string())
        .arg("--show-mappings")
        .output()
        .expect("run crushtool");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = 0;
    for line in text.lines() {
        // "CRUSH rule 0 x 5 [3,7,1]"
        let (head, list) = line.split_once(" [").expect("a mapping line");
        let x: u64 = head.rsplit(' ').next().unwrap().parse().unwrap();
        let want: Vec<usize> = list
            .trim_end_matches(']')
            .split(',')
            .map(|d| d.parse().unwrap())
            .collect();
        let got: Vec<usize> = dev
            .placement(x)
            .unwrap()
            .into_iter()
            .map(|(l, _)| l)
            .collect();
        assert_eq!(got, want, "chunk {x}");
        lines += 1;
    }
    assert_eq!(lines as u64, chunks);
}

/// Six legs on three hosts, two replicas on distinct hosts; leg `bad` wrapped in a fault device.
fn drive_with_fault(
    plan: FaultPlan,
    bad: usize,
    balanced_reads: bool,
) -> (Placed, kura_engine::fault::FaultControl) {
    let map = host_map(3, 2, |_| 0x10000);
    let mut control = None;
    let legs = (0..6)
        .map(|i| {
            let (d, _) = mem(1 << 20, i as u64 + 1);
            if i == bad {
                let f = FaultDevice::new(Box::new(d), plan.clone());
                control = Some(f.control());
                Box::new(f) as Box<dyn BlockDevice>
            } else {
                Box::new(d) as Box<dyn BlockDevice>
            }
        })
        .collect();
    // Dense layout: the fault plans count this test's I/O, not the metadata's at open.
    let opts = PlacedOptions {
        chunk: 16 << 10,
        balanced_reads,
        dense: true,
        ..PlacedOptions::default()
    };
    let dev = Placed::new(legs, &map, "test", &opts).expect("open the drive");
    (dev, control.expect("a faulty leg"))
}

#[test]
fn a_leg_dying_mid_stream_loses_nothing_acknowledged() {
    for balanced in [false, true] {
        dying_leg(balanced);
    }
}

fn dying_leg(balanced: bool) {
    // The leg loses power at its 40th write, inside a batch with commands in flight on every
    // leg: everything unflushed on it is gone, and it answers nothing from then on.
    let plan = FaultPlan {
        cut_after_writes: Some(40),
        ..FaultPlan::default()
    };
    let (mut dev, control) = drive_with_fault(plan, 2, balanced);
    let mut model = Model::of(&dev, 5);
    model.run(&mut dev, 30);
    assert!(control.is_offline(), "the leg's power was cut");
    model.check_image(&mut dev);
    let status = dev.status();
    assert!(
        matches!(&status[2].health, LegHealth::Degraded { .. }),
        "{status:?}"
    );
    assert!(
        status
            .iter()
            .filter(|s| s.index != 2)
            .all(|s| s.health == LegHealth::Healthy),
        "{status:?}"
    );
    assert!(
        dev.describe().contains("leg 2 out of service"),
        "{}",
        dev.describe()
    );
    // Every chunk with a copy on the dead leg is read from its other replica.
    let on_dead: Vec<u64> = (0..dev.chunks())
        .filter(|&c| {
            dev.placement(c)
                .expect("a chunk of the drive")
                .iter()
                .any(|&(l, _)| l == 2)
        })
        .collect();
    assert!(!on_dead.is_empty());
    let cb = dev.chunk_blocks() as usize;
    for c in on_dead {
        let mut out = vec![0u8; cb * 4096];
        dev.read_blocks(c * cb as u64, &mut out)
            .expect("read a chunk that had a copy on the dead leg");
        let at = c as usize * cb * 4096;
        assert!(out == model.data[at..at + out.len()], "chunk {c}");
    }
}

#[test]
fn a_leg_failing_a_write_goes_out_of_service_and_the_write_succeeds() {
    let plan = FaultPlan {
        write_eio: Some(6),
        ..FaultPlan::default()
    };
    let (mut dev, _control) = drive_with_fault(plan, 4, false);
    let mut model = Model::of(&dev, 9);
    model.run(&mut dev, 30);
    model.check_image(&mut dev);
    assert!(
        matches!(&dev.status()[4].health, LegHealth::Degraded { reason } if reason.contains("write")),
        "{:?}",
        dev.status()
    );
}

#[test]
fn a_read_error_is_served_by_the_next_replica_and_takes_the_leg_out() {
    let plan = FaultPlan {
        read_eio: Some(1),
        ..FaultPlan::default()
    };
    let (mut dev, _control) = drive_with_fault(plan, 0, true);
    let data: Vec<u8> = (0..dev.geometry().capacity_bytes() as usize)
        .map(|i| (i / 4096 % 251) as u8)
        .collect();
    dev.write_blocks(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read_blocks(0, &mut back).unwrap();
    assert!(back == data);
    let status = dev.status();
    assert_eq!(status[0].read_errors, 1, "{status:?}");
    assert!(
        matches!(&status[0].health, LegHealth::Degraded { reason } if reason.contains("read")),
        "{status:?}"
    );
}

#[test]
fn the_last_copy_of_a_chunk_is_never_taken_out() {
    // One replica: a failed write cannot be acknowledged and the leg stays in service.
    let map = host_map(2, 1, |_| 0x10000);
    let (a, _) = mem(256 << 10, 1);
    let b = FaultDevice::new(
        Box::new(mem(256 << 10, 2).0),
        FaultPlan {
            write_eio: Some(1),
            ..FaultPlan::default()
        },
    );
    let opts = PlacedOptions {
        replicas: 1,
        chunk: 4096,
        dense: true,
        ..PlacedOptions::default()
    };
    let mut dev = Placed::new(vec![Box::new(a), Box::new(b)], &map, "test", &opts).unwrap();
    let on_b = (0..dev.chunks())
        .find(|&c| dev.placement(c).unwrap()[0].0 == 1)
        .unwrap();
    let err = dev.write_blocks(on_b, &[1u8; 4096]).unwrap_err();
    assert!(matches!(err, kura_engine::DeviceError::Io { .. }), "{err}");
    assert!(dev.status().iter().all(|s| s.health == LegHealth::Healthy));
    dev.write_blocks(on_b, &[2u8; 4096]).unwrap();
    let mut out = vec![0u8; 4096];
    dev.read_blocks(on_b, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 2));
}

#[test]
fn maps_that_do_not_fit_the_legs_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let six = write_map(dir.path(), "six.bin", &host_map(3, 2, |_| 0x10000));
    let two_hosts = write_map(dir.path(), "two.bin", &host_map(2, 2, |_| 0x10000));
    let garbage = dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"not a crush map").unwrap();
    let legs = |n: usize| vec!["mem:1M"; n].join(",");
    for (spec, want) in [
        (
            format!("placed({})?map={}", legs(4), six.display()),
            "can place chunks on OSD id 4 (osd.4), 5 (osd.5), but only 4 legs are given",
        ),
        (
            format!("placed({})?map={}&rule=7", legs(6), six.display()),
            "has no rule 7 (it has: 0 (by-host), 1 (by-osd))",
        ),
        (
            format!("placed({})?map={}&rule=nope", legs(6), six.display()),
            "rule `nope` is neither",
        ),
        (
            format!(
                "placed({})?map={}&replicas=3&chunk=64K",
                legs(4),
                two_hosts.display()
            ),
            "not 3 distinct legs; the map has too few failure domains",
        ),
        (
            format!("placed({})?map={}", legs(6), garbage.display()),
            "is not a compiled CRUSH map",
        ),
        (
            format!(
                "placed({})?map={}/missing.bin",
                legs(6),
                dir.path().display()
            ),
            "cannot read the CRUSH map",
        ),
        (
            format!("placed({})?replicas=3", legs(2)),
            "replicas=3 must be 1 to 2",
        ),
        (
            format!("placed({})?chunk=6K", legs(2)),
            "not a non-zero multiple",
        ),
        (
            format!("placed({})?chunk=64K&size=100K", legs(2)),
            "not a non-zero multiple of chunk",
        ),
        (
            format!("placed({})?replicas=1&chunk=64K&size=2M", legs(2)),
            "does not fit",
        ),
        (
            format!("placed({})?chunk=2M", legs(2)),
            "less than one chunk",
        ),
        (
            format!("placed({})?replica=2", legs(2)),
            "did you mean `replicas`",
        ),
        (
            "placed(mem:1M,mem:1M?bs=512)".to_string(),
            "different block sizes",
        ),
    ] {
        let err = match kura_vdrive::open(&spec) {
            Ok(dev) => panic!("{spec} opened as {}", dev.describe()),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{spec}: `{err}` does not say `{want}`");
    }
}

#[test]
fn describe_gives_a_spec_that_opens_the_same_drive() {
    let dir = tempfile::tempdir().unwrap();
    let map = write_map(dir.path(), "m.bin", &host_map(2, 2, |_| 0x10000));
    for spec in [
        "placed(mem:1M,mem:1M,mem:1M)?replicas=2&chunk=64K".to_string(),
        "placed(mem:1M,mem:1M,mem:1M)?replicas=3&chunk=64K&read=balanced".to_string(),
        format!(
            "placed(mem:1M,mem:1M,mem:1M,mem:1M)?map={}&rule=by-osd&replicas=3&chunk=32K",
            map.display()
        ),
    ] {
        let dev = kura_vdrive::open(&spec).unwrap();
        let described = dev.describe();
        assert!(described.starts_with("placed(mem:1048576,"), "{described}");
        let again = kura_vdrive::open(&described).unwrap();
        assert_eq!(again.describe(), described);
        assert_eq!(again.geometry(), dev.geometry(), "{described}");
    }
}

/// The rebalance target on placed's own default map: adding one leg to N moves at most
/// 1.2x the theoretical minimum of chunk copies (the share of weight the new leg takes), for
/// 2 and 3 replicas, measured over 10000 chunks with `kura_crush::diff::movement`. (What a
/// rebalance would copy once legs carry a slot table; see docs/placed-format.md.)
#[test]
fn adding_a_leg_to_the_flat_map_moves_within_1_2x_of_the_minimum() {
    for replicas in [2usize, 3] {
        for legs in [replicas + 1, 5, 8, 12] {
            let old = kura_vdrive::placed::flat_map(legs);
            let new = kura_vdrive::placed::flat_map(legs + 1);
            let m =
                kura_crush::diff::movement(&old, &new, 0, replicas, 0..=9_999).expect("movement");
            let bound = 1.0 / (legs + 1) as f64;
            assert!(
                (m.ideal_fraction() - bound).abs() < 1e-9,
                "{legs}+1 legs: weight bound {}",
                m.ideal_fraction()
            );
            assert!(m.moved >= m.min_moves, "{m:?}");
            assert!(
                m.moved_fraction() <= 1.2 * bound,
                "{legs} -> {} legs, {replicas} replicas: moved {:.4} > 1.2 x {bound:.4}",
                legs + 1,
                m.moved_fraction()
            );
        }
    }
}
