//! The snapshot drive: the head against a flat model through random I/O interleaved with
//! snapshot, rollback, clone and delete, every snapshot view against a copy of the model taken
//! when it was made (also after reopening); power cuts at many points of the recorded write
//! stream; a full data area; damaged metadata; random bytes as metadata.
//!
//! `KURA_SNAPSHOT_CUTS=N` sets how many cut points the crash test tries (default 200), and
//! `KURA_SNAPSHOT_SEED=S` its workload's seed (default 77).

mod common;

use common::Model;
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::fault::{materialize, FaultDevice, FaultPlan, TraceEvent};
use kura_engine::{BlockDevice, BlockingIo, DeviceError, Request};
use kura_vdrive::snapshot::format::{Meta, Superblock};
use kura_vdrive::snapshot::{FormatOptions, VersionKind};
use kura_vdrive::{SnapshotError, SnapshotVolume};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap, HashSet};

const BS: usize = 4096;

/// Versions of `size` bytes on a child large enough that the head, its snapshots and clones
/// never fill the data area.
fn opts(chunk: u32, size: u64) -> FormatOptions {
    FormatOptions {
        chunk_bytes: chunk,
        virtual_bytes: Some(size),
        maps: 12,
    }
}

fn mem(bytes: u64) -> MemDevice {
    MemDevice::new(bytes, QueueOptions::default())
}

fn read_all(dev: &mut dyn BlockDevice) -> Vec<u8> {
    let mut all = vec![0u8; dev.geometry().capacity_bytes() as usize];
    dev.read_blocks(0, &mut all)
        .expect("read the whole version");
    all
}

fn check_views(vol: &SnapshotVolume, saved: &BTreeMap<String, Vec<u8>>, when: &str) {
    let listed: HashSet<String> = vol
        .list()
        .into_iter()
        .filter(|v| v.kind == VersionKind::Snapshot)
        .map(|v| v.name)
        .collect();
    let want: HashSet<String> = saved.keys().cloned().collect();
    assert_eq!(listed, want, "{when}: the snapshots listed");
    for (name, data) in saved {
        let mut view = vol.reader(name).expect("open a snapshot view");
        assert!(
            read_all(&mut view) == *data,
            "{when}: snapshot `{name}` differs from the model when it was taken"
        );
    }
}

#[test]
fn head_and_snapshots_follow_the_model_through_snapshot_rollback_clone_delete() {
    for (seed, chunk) in [(1u64, 16 << 10), (2, 64 << 10), (3, 4096)] {
        let child = mem(40 << 20);
        let storage = child.storage();
        let vol = SnapshotVolume::format(Box::new(child), opts(chunk, 1536 << 10)).unwrap();
        let mut head = vol.head().unwrap();
        let mut model = Model::of(&head, seed);
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut saved: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut clones: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for round in 0..24 {
            model.run(&mut head, 12);
            let mut pick = rng.gen_range(0..10);
            if pick <= 3 && saved.len() >= 8 {
                pick = 7;
            }
            match pick {
                0..=3 => {
                    let name = format!("s{round}");
                    vol.take_snapshot(&name).unwrap();
                    saved.insert(name, model.data.clone());
                }
                4 | 5 if !saved.is_empty() => {
                    let i = rng.gen_range(0..saved.len());
                    let (name, data) = saved.iter().nth(i).expect("in range");
                    vol.rollback(name).unwrap();
                    model.data = data.clone();
                }
                6 if !saved.is_empty() => {
                    let i = rng.gen_range(0..saved.len());
                    let (name, data) = saved.iter().nth(i).expect("in range");
                    let clone = format!("c{round}");
                    vol.clone_version(name, &clone).unwrap();
                    let mut w = vol.writer(&clone).unwrap();
                    let mut cm = Model::of(&w, seed + round);
                    cm.data = data.clone();
                    cm.check_image(&mut w);
                    cm.run(&mut w, 6);
                    w.flush_all().unwrap();
                    clones.insert(clone, cm.data.clone());
                }
                7 if !saved.is_empty() => {
                    let i = rng.gen_range(0..saved.len());
                    let name = saved.keys().nth(i).expect("in range").clone();
                    vol.delete(&name).unwrap();
                    saved.remove(&name);
                }
                _ => head.flush_all().unwrap(),
            }
            model.check_image(&mut head);
            check_views(&vol, &saved, &format!("seed {seed} round {round}"));
        }
        head.flush_all().unwrap();
        let before = vol.space();
        drop(head);
        drop(vol);
        let vol = SnapshotVolume::open(Box::new(MemDevice::with_storage(
            storage,
            QueueOptions::default(),
        )))
        .unwrap();
        assert_eq!(
            vol.space().free_chunks,
            before.free_chunks,
            "the allocator is rebuilt"
        );
        let mut head = vol.head().unwrap();
        model.check_image(&mut head);
        check_views(&vol, &saved, &format!("seed {seed} after reopen"));
        for (name, data) in &clones {
            let mut w = vol.writer(name).unwrap();
            assert!(read_all(&mut w) == *data, "clone `{name}` after reopen");
        }
        assert!(
            !saved.is_empty() || !clones.is_empty(),
            "the run made versions"
        );
    }
}

#[test]
fn a_view_stays_pinned_while_another_thread_writes_the_head() {
    let vol = SnapshotVolume::format(Box::new(mem(16 << 20)), opts(64 << 10, 1 << 20)).unwrap();
    let mut head = vol.head().unwrap();
    let blocks = head.geometry().num_blocks;
    let old: Vec<u8> = (0..blocks as usize * BS).map(|i| (i / BS) as u8).collect();
    head.write_blocks(0, &old).unwrap();
    vol.take_snapshot("frozen").unwrap();
    let mut view = vol.reader("frozen").unwrap();
    let writer = std::thread::spawn(move || {
        let mut rng = SmallRng::seed_from_u64(9);
        for i in 0..300u64 {
            let n = rng.gen_range(1..=16u64);
            let lba = rng.gen_range(0..=blocks - n);
            head.write_blocks(lba, &vec![0xA0 | (i as u8 & 0xF); n as usize * BS])
                .unwrap();
            if i % 50 == 0 {
                head.flush_all().unwrap();
            }
        }
        head
    });
    let mut rng = SmallRng::seed_from_u64(10);
    let mut reads = 0;
    while !writer.is_finished() || reads < 50 {
        let n = rng.gen_range(1..=32u64);
        let lba = rng.gen_range(0..=blocks - n);
        let mut got = vec![0u8; n as usize * BS];
        view.read_blocks(lba, &mut got).unwrap();
        let at = lba as usize * BS;
        assert!(
            got == old[at..at + got.len()],
            "the view moved at LBA {lba}"
        );
        reads += 1;
    }
    let mut head = writer.join().unwrap();
    assert!(read_all(&mut head) != old, "the head moved on");
    assert!(read_all(&mut view) == old, "the view did not");
    assert!(matches!(
        view.write_blocks(0, &old[..BS]),
        Err(DeviceError::Unsupported { .. })
    ));
    assert!(matches!(
        vol.delete("frozen"),
        Err(SnapshotError::Busy { .. })
    ));
    drop(view);
    vol.delete("frozen").unwrap();
}

/// A block filled with its id (zero for a block never written).
fn block_of(id: u64) -> Vec<u8> {
    id.to_le_bytes().repeat(BS / 8)
}

fn ids(data: &[u8]) -> Vec<u64> {
    data.chunks(BS)
        .map(|b| {
            let id = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
            assert!(b == block_of(id), "a block holds a torn or foreign value");
            id
        })
        .collect()
}

/// What the crash harness knows at one point of the trace.
struct Commit {
    /// Trace length when the commit returned.
    at: usize,
    head: Vec<u64>,
    snapshots: Vec<String>,
}

#[test]
fn power_cuts_keep_flushed_writes_and_every_snapshot() {
    let cuts: usize = std::env::var("KURA_SNAPSHOT_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let child_bytes: u64 = 3 << 20;
    let format_opts = FormatOptions {
        chunk_bytes: 16 << 10,
        virtual_bytes: Some(512 << 10),
        maps: 16,
    };
    let base_dev = mem(child_bytes);
    let base_storage = base_dev.storage();
    drop(SnapshotVolume::format(Box::new(base_dev), format_opts).unwrap());
    let base = base_storage.lock().unwrap().clone();

    let inner = MemDevice::with_storage(base_storage, QueueOptions::default());
    let fault = FaultDevice::new(
        Box::new(inner),
        FaultPlan {
            record: true,
            ..FaultPlan::default()
        },
    );
    let control = fault.control();
    let vol = SnapshotVolume::open(Box::new(fault)).unwrap();
    let mut head = vol.head().unwrap();
    let blocks = head.geometry().num_blocks as usize;
    let seed: u64 = std::env::var("KURA_SNAPSHOT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(77);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model = vec![0u64; blocks];
    // Every value each block of the head has taken, with the trace length when it did, and
    // what each snapshot holds.
    let mut history: Vec<Vec<(usize, u64)>> = vec![Vec::new(); blocks];
    let mut snaps: HashMap<String, Vec<u64>> = HashMap::new();
    let mut live: Vec<String> = Vec::new();
    let mut commits = vec![Commit {
        at: 0,
        head: model.clone(),
        snapshots: Vec::new(),
    }];
    let mut next_id = 1u64;
    // Where each deleted snapshot's delete began: a cut after that may have dropped it.
    let mut deleted: HashMap<String, usize> = HashMap::new();
    for step in 0..160 {
        let op = rng.gen_range(0..20);
        let mut changed: Vec<usize> = Vec::new();
        match op {
            0..=13 => {
                let n = rng.gen_range(1..=10usize);
                let lba = rng.gen_range(0..=blocks - n);
                let mut data = Vec::new();
                for (b, slot) in model.iter_mut().enumerate().skip(lba).take(n) {
                    data.extend(block_of(next_id));
                    *slot = next_id;
                    changed.push(b);
                    next_id += 1;
                }
                head.write_blocks(lba as u64, &data).unwrap();
            }
            14 => {
                let n = rng.gen_range(1..=8usize);
                let lba = rng.gen_range(0..=blocks - n);
                let done = head
                    .run(Request::write_zeroes(0, lba as u64, n as u64))
                    .unwrap();
                done.status.unwrap();
                model[lba..lba + n].fill(0);
                changed.extend(lba..lba + n);
            }
            15 | 16 => {
                let name = format!("s{step}");
                vol.take_snapshot(&name).unwrap();
                snaps.insert(name.clone(), model.clone());
                live.push(name);
            }
            17 if !live.is_empty() => {
                let name = live.remove(rng.gen_range(0..live.len()));
                deleted.insert(name.clone(), control.trace().len());
                vol.delete(&name).unwrap();
            }
            18 if !live.is_empty() => {
                let name = &live[rng.gen_range(0..live.len())];
                vol.rollback(name).unwrap();
                model = snaps[name].clone();
                changed.extend(0..blocks);
            }
            _ => head.flush_all().unwrap(),
        }
        let now = control.trace().len();
        for b in changed {
            history[b].push((now, model[b]));
        }
        if op >= 15 {
            commits.push(Commit {
                at: now,
                head: model.clone(),
                snapshots: live.clone(),
            });
        }
    }
    head.flush_all().unwrap();
    commits.push(Commit {
        at: control.trace().len(),
        head: model.clone(),
        snapshots: live.clone(),
    });
    let trace = control.trace();
    assert!(trace.iter().filter(|e| **e == TraceEvent::Flush).count() > 50);

    for i in 0..cuts {
        let cut = if i == 0 {
            trace.len()
        } else {
            rng.gen_range(0..=trace.len())
        };
        let image = materialize(&base, &trace, cut, BS, 0.5, i as u64);
        let dev = MemDevice::new(child_bytes, QueueOptions::default());
        dev.storage().lock().unwrap().copy_from_slice(&image);
        let vol = SnapshotVolume::open(Box::new(dev)).unwrap_or_else(|e| {
            panic!("cut at {cut}/{}: the drive does not open: {e}", trace.len())
        });
        // The last state whose commit returned before the last flush the cut keeps.
        let durable = trace[..cut]
            .iter()
            .rposition(|e| *e == TraceEvent::Flush)
            .map_or(0, |p| p + 1);
        let sure = commits
            .iter()
            .rev()
            .find(|c| c.at <= durable)
            .expect("the format commit");
        let listed: Vec<String> = vol
            .list()
            .into_iter()
            .filter(|v| v.kind == VersionKind::Snapshot)
            .map(|v| v.name)
            .collect();
        for name in &sure.snapshots {
            assert!(
                listed.contains(name) || deleted.get(name).is_some_and(|&at| at >= sure.at),
                "cut at {cut}: snapshot `{name}` committed before the cut is gone"
            );
        }
        for name in &listed {
            let mut view = vol.reader(name).unwrap();
            assert!(
                ids(&read_all(&mut view)) == snaps[name],
                "cut at {cut}: snapshot `{name}` is not what it was when taken"
            );
        }
        let mut head = vol.head().unwrap();
        let now = ids(&read_all(&mut head));
        for (b, &id) in now.iter().enumerate() {
            // `>=`: an op right after a commit that writes nothing to the child (zeroing whole
            // chunks only drops them from the map) shares the commit's trace position, while
            // every op before a commit ends strictly before it (a commit always flushes).
            let written_since = history[b].iter().any(|&(at, v)| at >= sure.at && v == id);
            assert!(
                id == sure.head[b] || written_since,
                "cut at {cut}: head block {b} holds {id}: neither its flushed value {} nor written since",
                sure.head[b]
            );
        }
        if cut == trace.len() {
            assert_eq!(now, model, "with nothing cut, the head is the model");
        }
    }
}

#[test]
fn a_chunk_freed_since_the_last_flush_is_not_reused_before_a_crash() {
    let inner = mem(4 << 20);
    let storage = inner.storage();
    drop(SnapshotVolume::format(Box::new(inner), opts(16 << 10, 1 << 20)).unwrap());
    let fault = FaultDevice::new(
        Box::new(MemDevice::with_storage(
            storage.clone(),
            QueueOptions::default(),
        )),
        FaultPlan {
            keep_probability: 1.0,
            ..FaultPlan::default()
        },
    );
    let control = fault.control();
    let vol = SnapshotVolume::open(Box::new(fault)).unwrap();
    let mut head = vol.head().unwrap();
    let a: Vec<u8> = (0..4).flat_map(|i| block_of(100 + i)).collect();
    head.write_blocks(0, &a).unwrap();
    head.flush_all().unwrap();
    // Zeroing the whole chunk frees its physical chunk in memory only; the committed map still
    // names it, so it must not take the next write's data before the next flush.
    let done = head.run(Request::write_zeroes(0, 0, 4)).unwrap();
    done.status.unwrap();
    let b: Vec<u8> = (0..4).flat_map(|i| block_of(200 + i)).collect();
    head.write_blocks(8, &b).unwrap();
    control.power_cut();
    drop(head);
    drop(vol);
    let vol = SnapshotVolume::open(Box::new(MemDevice::with_storage(
        storage,
        QueueOptions::default(),
    )))
    .unwrap();
    let mut head = vol.head().unwrap();
    let mut got = vec![0u8; 4 * BS];
    head.read_blocks(0, &mut got).unwrap();
    assert!(
        got == a || got.iter().all(|&x| x == 0),
        "chunk 0 holds {:?}",
        ids(&got)
    );
}

#[test]
fn a_full_data_area_fails_writes_with_enospc_and_loses_nothing() {
    let vol = SnapshotVolume::format(
        Box::new(mem(4 << 20)),
        FormatOptions {
            chunk_bytes: 64 << 10,
            virtual_bytes: None,
            maps: 4,
        },
    )
    .unwrap();
    let mut head = vol.head().unwrap();
    let bytes = head.geometry().capacity_bytes() as usize;
    let first: Vec<u8> = (0..bytes).map(|i| (i / BS) as u8 ^ 0x5A).collect();
    head.write_blocks(0, &first).unwrap();
    head.flush_all().unwrap();
    assert_eq!(vol.space().free_chunks, 0, "the head fills the data area");
    vol.take_snapshot("all").unwrap();
    let err = head.write_blocks(0, &vec![1u8; BS]).unwrap_err();
    assert!(
        matches!(err, DeviceError::Io { errno, .. } if errno.0 == libc_enospc()),
        "{err}"
    );
    assert_eq!(err.errno(), libc_enospc());
    head.flush_all().unwrap();
    assert!(read_all(&mut head) == first, "the head is unchanged");
    let mut view = vol.reader("all").unwrap();
    assert!(read_all(&mut view) == first, "the snapshot is unchanged");
    drop(view);
    vol.delete("all").unwrap();
    head.write_blocks(0, &vec![1u8; BS]).unwrap();
    head.flush_all().unwrap();
}

fn libc_enospc() -> i32 {
    28
}

#[test]
fn control_operations_give_typed_errors() {
    let vol = SnapshotVolume::format(Box::new(mem(4 << 20)), opts(64 << 10, 1 << 20)).unwrap();
    vol.take_snapshot("a").unwrap();
    assert!(matches!(
        vol.take_snapshot("a"),
        Err(SnapshotError::NameExists { .. })
    ));
    assert!(matches!(
        vol.take_snapshot("head"),
        Err(SnapshotError::NameExists { .. })
    ));
    assert!(matches!(
        vol.take_snapshot("a b"),
        Err(SnapshotError::BadName { .. })
    ));
    assert!(matches!(
        vol.take_snapshot(""),
        Err(SnapshotError::BadName { .. })
    ));
    assert!(matches!(
        vol.rollback("zz"),
        Err(SnapshotError::NoSuchSnapshot { .. })
    ));
    assert!(matches!(
        vol.delete("head"),
        Err(SnapshotError::HeadReserved { .. })
    ));
    assert!(matches!(
        vol.reader("head"),
        Err(SnapshotError::WrongKind { .. })
    ));
    assert!(matches!(
        vol.writer("a"),
        Err(SnapshotError::WrongKind { .. })
    ));
    let head = vol.head().unwrap();
    assert!(matches!(vol.head(), Err(SnapshotError::Busy { .. })));
    drop(head);
    vol.clone_version("a", "b").unwrap();
    let kinds: Vec<(String, VersionKind)> =
        vol.list().into_iter().map(|v| (v.name, v.kind)).collect();
    assert_eq!(
        kinds,
        [
            ("head".to_string(), VersionKind::Head),
            ("a".to_string(), VersionKind::Snapshot),
            ("b".to_string(), VersionKind::Clone),
        ]
    );
    // Each writable version reserves a full map; the area holds at least `maps` of them
    // (more with names shorter than the longest allowed).
    let mut made = 0;
    let err = loop {
        match vol.clone_version("a", &format!("x{made}")) {
            Ok(()) => made += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, SnapshotError::MetadataFull { .. }), "{err}");
    assert!(
        made >= 10,
        "head and b hold two of at least twelve maps, {made} more fit"
    );
}

#[test]
fn specs_open_head_views_branches_and_refuse_mistakes() {
    let dir = tempfile::tempdir().unwrap();
    let img = format!("file:{}/s.img?size=8M", dir.path().display());
    let mut head = kura_vdrive::open(&format!("snapshot({img})?format=1&chunk=32K")).unwrap();
    let name = head.describe();
    assert!(
        name.starts_with("snapshot(") && name.ends_with(')'),
        "{name}"
    );
    head.write_blocks(3, &block_of(3)).unwrap();
    head.flush_all().unwrap();
    drop(head);
    let vol = SnapshotVolume::open(kura_engine::open(&img).unwrap()).unwrap();
    assert_eq!(vol.space().chunk_bytes, 32 << 10);
    vol.take_snapshot("one").unwrap();
    drop(vol);
    let mut view = kura_vdrive::open(&format!("snapshot({img})?at=one")).unwrap();
    assert!(view.describe().ends_with("?at=one"));
    let mut got = vec![0u8; BS];
    view.read_blocks(3, &mut got).unwrap();
    assert_eq!(got, block_of(3));
    drop(view);
    for (spec, says) in [
        (
            format!("snapshot({img})?format=1"),
            "already holds a snapshot drive",
        ),
        ("snapshot(mem:8M)".to_string(), "not a snapshot drive"),
        (format!("snapshot({img})?chunk=32K"), "only when formatting"),
        (
            format!("snapshot({img})?at=nope"),
            "no snapshot or clone named `nope`",
        ),
        (format!("snapshot({img})?at=one&branch=one"), "not both"),
        (format!("snapshot({img})?branch=one"), "is a snapshot"),
        (format!("snapshot({img})?at=head"), "not a snapshot"),
        (
            "snapshot(mem:8M)?format=1&chunk=3000".to_string(),
            "power of two",
        ),
        ("snapshot(mem:64K)?format=1".to_string(), "data chunks"),
        ("snapshot(mem:8M,mem:8M)".to_string(), "exactly 1 device"),
        ("snapshot(mem:8M)?colour=red".to_string(), "colour"),
    ] {
        let err = kura_vdrive::open(&spec)
            .err()
            .unwrap_or_else(|| panic!("{spec} opened"));
        assert!(err.to_string().contains(says), "{spec}: {err}");
    }
}

fn formatted_image() -> (Vec<u8>, u64) {
    let dev = mem(4 << 20);
    let storage = dev.storage();
    let vol = SnapshotVolume::format(Box::new(dev), opts(64 << 10, 1 << 20))
        .expect("build the test image");
    let mut head = vol.head().expect("build the test image");
    head.write_blocks(0, &vec![7u8; 40 * BS])
        .expect("build the test image");
    head.flush_all().expect("build the test image");
    vol.take_snapshot("a").expect("build the test image");
    head.write_blocks(20, &vec![8u8; 40 * BS])
        .expect("build the test image");
    head.flush_all().expect("build the test image");
    let generation = vol.space().generation;
    drop(head);
    drop(vol);
    let image = storage.lock().expect("build the test image").clone();
    (image, generation)
}

fn open_image(image: &[u8]) -> Result<SnapshotVolume, SnapshotError> {
    let dev = mem(image.len() as u64);
    dev.storage()
        .lock()
        .expect("build the test image")
        .copy_from_slice(image);
    SnapshotVolume::open(Box::new(dev))
}

#[test]
fn damaged_metadata_gets_typed_errors_and_a_torn_superblock_falls_back() {
    let (image, generation) = formatted_image();
    assert!(open_image(&image).is_ok());
    let current = (generation % 2) as usize;
    let sb = Superblock::decode(&image[current * BS..], BS as u32, (image.len() / BS) as u64)
        .unwrap()
        .unwrap();

    // A torn newest superblock (a crash while writing it) leaves the previous commit.
    let mut torn = image.clone();
    torn[current * BS + 30] ^= 0xFF;
    let vol = open_image(&torn).expect("falls back to the other slot");
    assert_eq!(vol.space().generation, generation - 1);

    let mut both = image.clone();
    both[30] ^= 1;
    both[BS + 30] ^= 1;
    assert!(matches!(
        open_image(&both),
        Err(SnapshotError::Corrupt { .. })
    ));

    let mut blob = image.clone();
    let at = sb.meta_lba(generation % 2) as usize * BS + 40;
    blob[at] ^= 0x10;
    let err = open_image(&blob).err().expect("a damaged blob is refused");
    assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("checksum"), "{err}");

    let zeroed = vec![0u8; image.len()];
    assert!(matches!(
        open_image(&zeroed),
        Err(SnapshotError::NotSnapshotDrive { .. })
    ));
    let tiny = MemDevice::new(BS as u64, QueueOptions::default());
    assert!(SnapshotVolume::open(Box::new(tiny)).is_err());
}

#[test]
fn random_bytes_as_metadata_never_panic() {
    let (image, generation) = formatted_image();
    let current = (generation % 2) as usize;
    let child_blocks = (image.len() / BS) as u64;
    let sb = Superblock::decode(&image[current * BS..], BS as u32, child_blocks)
        .unwrap()
        .unwrap();
    let start = sb.meta_lba(generation % 2) as usize * BS;
    let good = image[start..start + sb.blob_len as usize].to_vec();
    let meta = Meta::decode(&good, &sb).unwrap();
    assert_eq!(meta.encode(), good, "decode and encode round-trip");
    let mut rng = SmallRng::seed_from_u64(5);
    let mut accepted = 0;
    for i in 0..20_000 {
        let bytes: Vec<u8> = if i % 2 == 0 {
            let mut b = good.clone();
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..b.len());
                b[at] = rng.gen();
            }
            if rng.gen_bool(0.1) {
                b.truncate(rng.gen_range(0..b.len()));
            }
            b
        } else {
            let mut b: Vec<u8> = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect();
            if b.len() >= 8 && rng.gen_bool(0.5) {
                b[..8].copy_from_slice(b"KSNPMETA");
            }
            b
        };
        if let Ok(m) = Meta::decode(&bytes, &sb) {
            accepted += 1;
            assert_eq!(Meta::decode(&m.encode(), &sb).unwrap(), m);
        }
        let mut block = bytes.clone();
        block.resize(BS, 0);
        if i % 3 == 0 && block.len() >= 8 {
            block[..8].copy_from_slice(b"KURASNAP");
        }
        let _ = Superblock::decode(&block, BS as u32, child_blocks);
        // Whole images with random metadata blocks open or fail, never panic.
        if i % 500 == 0 {
            let mut img = image.clone();
            img[start..start + bytes.len().min(4 * BS)]
                .copy_from_slice(&bytes[..bytes.len().min(4 * BS)]);
            let _ = open_image(&img).map(|v| v.list());
        }
    }
    assert!(
        accepted > 0,
        "some mutations (e.g. of map entries) still decode"
    );
}
