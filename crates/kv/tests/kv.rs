//! The key-value store on AccelFS and on a host directory: a model test against a `BTreeMap`
//! with reopens, crash consistency of synced writes through the `fault` device, bad input, and
//! format interoperability with Google LevelDB through plyvel.

mod common;

use kura_accelfs::testing::{formatted_storage, mount_storage};
use kura_accelfs::{FileSystem, MountOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_engine::fault::{materialize, FaultDevice, FaultPlan};
use kura_kv::{Db, DbOptions, KvError, Location, WriteBatch};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

fn small_opts() -> DbOptions {
    DbOptions {
        write_buffer_bytes: 64 << 10,
        block_cache_bytes: 1 << 20,
        ..DbOptions::default()
    }
}

fn open_on(fs: &FileSystem) -> Db {
    open_with(fs, &small_opts())
}

fn open_with(fs: &FileSystem, opts: &DbOptions) -> Db {
    Db::open(
        Location::AccelFs {
            fs: fs.clone(),
            path: "/db".into(),
        },
        opts,
    )
    .expect("open db")
}

#[derive(Debug, Clone)]
enum Op {
    Put(u16, u16),
    Delete(u16),
    Batch(Vec<(u16, Option<u16>)>),
    Reopen,
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..400u16, 0..3000u16).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (0..400u16).prop_map(Op::Delete),
        1 => prop::collection::vec((0..400u16, prop::option::of(0..3000u16)), 1..20).prop_map(Op::Batch),
        1 => Just(Op::Reopen),
        1 => Just(Op::Compact),
    ]
}

fn key(k: u16) -> Vec<u8> {
    format!("key{k:05}").into_bytes()
}

fn value(k: u16, v: u16) -> Vec<u8> {
    let len = usize::from(v) % 2000 + 1;
    (0..len)
        .map(|i| (i as u8) ^ (k as u8) ^ (v >> 3) as u8)
        .collect()
}

/// Runs `ops` against a store and a model; `reopen` closes and reopens the store.
fn run_model(ops: Vec<Op>, mut open: impl FnMut(bool) -> Db) -> Result<(), TestCaseError> {
    let mut db = open(false);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                db.put(&key(k), &value(k, v)).expect("put");
                model.insert(key(k), value(k, v));
            }
            Op::Delete(k) => {
                db.delete(&key(k)).expect("delete");
                model.remove(&key(k));
            }
            Op::Batch(items) => {
                let mut b = WriteBatch::default();
                for (k, v) in items {
                    match v {
                        Some(v) => {
                            b.put(&key(k), &value(k, v));
                            model.insert(key(k), value(k, v));
                        }
                        None => {
                            b.delete(&key(k));
                            model.remove(&key(k));
                        }
                    }
                }
                db.write(b, true).expect("batch");
            }
            Op::Reopen => {
                db.close().expect("close");
                db = open(true);
            }
            Op::Compact => db.compact().expect("compact"),
        }
    }
    let all = db.scan_all().expect("scan");
    let want: Vec<(Vec<u8>, Vec<u8>)> = model.clone().into_iter().collect();
    prop_assert!(
        all == want,
        "scan differs from the model ({} vs {} pairs)",
        all.len(),
        want.len()
    );
    for (k, v) in &model {
        let got = db.get(k).expect("get");
        prop_assert_eq!(got.as_ref(), Some(v), "get {}", String::from_utf8_lossy(k));
    }
    prop_assert_eq!(db.get(b"absent").expect("get"), None);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    fn accelfs_model(ops in prop::collection::vec(op(), 1..120)) {
        let storage = formatted_storage(64 << 20);
        let fs = std::cell::RefCell::new(mount_storage(&storage));
        run_model(ops, |again| {
            if again {
                fs.borrow().clone().unmount().expect("unmount");
                *fs.borrow_mut() = mount_storage(&storage);
            }
            open_on(&fs.borrow())
        })?;
    }

    fn host_model(ops in prop::collection::vec(op(), 1..120)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        run_model(ops, |_| Db::open(Location::Dir(path.clone()), &small_opts()).expect("open"))?;
    }
}

#[test]
fn accelfs_store_behaves_like_a_sorted_map() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("accelfs_store_behaves_like_a_sorted_map");
    }
    accelfs_model();
}

#[test]
fn host_store_behaves_like_a_sorted_map() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("host_store_behaves_like_a_sorted_map");
    }
    host_model();
}

#[test]
fn host_directory_store_and_snapshots_and_ranges() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("host_directory_store_and_snapshots_and_ranges");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db");
    let db = Db::open(Location::Dir(path.clone()), &small_opts()).expect("open");
    for i in 0..2000u16 {
        db.put(&key(i), &value(i, 1)).expect("put");
    }
    let snap = db.snapshot().expect("snapshot");
    db.put(&key(5), b"changed").expect("put");
    db.delete(&key(6)).expect("delete");
    assert_eq!(db.get_at(&snap, &key(5)).expect("get"), Some(value(5, 1)));
    assert_eq!(db.get_at(&snap, &key(6)).expect("get"), Some(value(6, 1)));
    assert_eq!(db.get(&key(5)).expect("get"), Some(b"changed".to_vec()));
    assert_eq!(db.get(&key(6)).expect("get"), None);
    let range = db.scan(&key(100), Some(&key(110)), 100).expect("scan");
    assert_eq!(range.len(), 10);
    assert_eq!(range[0].0, key(100));
    assert_eq!(
        db.scan_at(&snap, &key(6), None, 1).expect("scan")[0].0,
        key(6)
    );
    drop(snap);
    db.close().expect("close");
    let db = Db::open(Location::Dir(path), &small_opts()).expect("reopen");
    assert_eq!(db.get(&key(5)).expect("get"), Some(b"changed".to_vec()));
    assert_eq!(db.scan_all().expect("scan").len(), 1999);
}

#[test]
fn every_synced_write_survives_a_crash_and_nothing_is_invented() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("every_synced_write_survives_a_crash_and_nothing_is_invented");
    }
    let points: usize = std::env::var("KURA_KV_CRASH_POINTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let storage = formatted_storage(32 << 20);
    let base = storage.lock().expect("storage").clone();
    let dev = FaultDevice::new(
        Box::new(MemDevice::with_storage(
            storage.clone(),
            QueueOptions::default(),
        )),
        FaultPlan {
            record: true,
            ..FaultPlan::default()
        },
    );
    let control = dev.control();
    let fs = FileSystem::mount(Box::new(dev), MountOptions::default()).expect("mount");
    let db = open_on(&fs);
    let mut rng = SmallRng::seed_from_u64(4);
    // Every value ever written per key, and the synced state with its trace position.
    let mut written: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    let mut current: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut synced: Vec<(usize, Map)> = vec![(control.trace().len(), BTreeMap::new())];
    for step in 0..1500u16 {
        let k = key(rng.gen_range(0..300));
        let v = value(step, rng.gen());
        written.entry(k.clone()).or_default().push(v.clone());
        current.insert(k.clone(), v.clone());
        if step % 10 == 9 {
            db.put_sync(&k, &v).expect("sync put");
            synced.push((control.trace().len(), current.clone()));
        } else {
            db.put(&k, &v).expect("put");
        }
    }
    let trace = control.trace();
    drop(db);
    drop(fs);
    let first = synced[0].0;
    let mut rng = SmallRng::seed_from_u64(9);
    for p in 0..points {
        let cut = rng.gen_range(first..=trace.len());
        let image = materialize(&base, &trace, cut, 4096, 0.5, p as u64);
        let crashed: MemStorage = Arc::new(Mutex::new(image));
        let fs = mount_storage(&crashed);
        let db = Db::open(
            Location::AccelFs {
                fs: fs.clone(),
                path: "/db".into(),
            },
            &small_opts(),
        )
        .unwrap_or_else(|e| panic!("cut {cut}: the database does not open: {e}"));
        let (_, promised) = synced
            .iter()
            .rev()
            .find(|(at, _)| *at <= cut)
            .expect("first");
        let found: BTreeMap<Vec<u8>, Vec<u8>> = db.scan_all().expect("scan").into_iter().collect();
        for (k, v) in &found {
            assert!(
                written.get(k).is_some_and(|vs| vs.contains(v)),
                "cut {cut}: {} holds a value that was never written",
                String::from_utf8_lossy(k)
            );
        }
        for k in promised.keys() {
            assert!(
                found.contains_key(k),
                "cut {cut}: synced key {} lost",
                String::from_utf8_lossy(k)
            );
        }
        // The newest synced write of each key, or something written after it, is what is read.
        for (k, v) in promised {
            let history = &written[k];
            let at = history.iter().rposition(|h| h == v).expect("in history");
            let got = &found[k];
            assert!(
                history[at..].contains(got),
                "cut {cut}: {} went back to a value older than its synced one",
                String::from_utf8_lossy(k)
            );
        }
        drop(db);
        drop(fs);
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("bad_input_is_a_clear_error");
    }
    // No database there, and not allowed to create one.
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = DbOptions {
        create_if_missing: false,
        ..small_opts()
    };
    let e = Db::open(Location::Dir(dir.path().join("nothing")), &opts)
        .err()
        .expect("refused");
    assert!(
        matches!(
            e,
            KvError::NotFound(_) | KvError::Invalid(_) | KvError::Io(_)
        ),
        "{e}"
    );

    // A corrupted table: paranoid checks report it instead of returning wrong data.
    let storage = formatted_storage(64 << 20);
    let fs = mount_storage(&storage);
    let db = open_on(&fs);
    for i in 0..3000u16 {
        db.put(&key(i), &value(i, 7)).expect("put");
    }
    db.compact().expect("compact");
    db.close().expect("close");
    let tables: Vec<String> = fs
        .read_dir("/db")
        .expect("ls")
        .into_iter()
        .map(|e| e.name_lossy())
        .filter(|n| n.ends_with(".ldb"))
        .collect();
    assert!(!tables.is_empty(), "compaction wrote tables");
    for t in &tables {
        let path = format!("/db/{t}");
        let mut bytes = fs.read(&path).expect("read table");
        for i in (100..bytes.len().saturating_sub(100)).step_by(97) {
            bytes[i] ^= 0x5a;
        }
        fs.write(&path, &bytes).expect("rewrite table");
    }
    let mut errors = 0;
    match Db::open(
        Location::AccelFs {
            fs: fs.clone(),
            path: "/db".into(),
        },
        &small_opts(),
    ) {
        Err(_) => errors += 1,
        Ok(db) => {
            for i in (0..3000u16).step_by(37) {
                match db.get(&key(i)) {
                    Ok(Some(v)) => assert_eq!(v, value(i, 7), "damaged table read silently wrong"),
                    Ok(None) => panic!("key {i} silently missing from a damaged table"),
                    Err(_) => errors += 1,
                }
            }
        }
    }
    assert!(errors > 0, "the damage was reported");

    // A full device: writes fail with an error, and what was synced before is still there.
    let storage = formatted_storage(6 << 20);
    let fs = mount_storage(&storage);
    let db = open_on(&fs);
    db.put_sync(b"first", b"kept").expect("put");
    let big = vec![7u8; 64 << 10];
    let mut failed = None;
    for i in 0..400u32 {
        if let Err(e) = db.put_sync(format!("big{i}").as_bytes(), &big) {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("the device filled up");
    assert!(!e.to_string().is_empty());
    drop(db);
    drop(fs);
    // Reopening needs room for recovery's new files: it either works and finds the synced
    // write, or says the device is full. Either way the file system stays consistent.
    let fs = mount_storage(&storage);
    match Db::open(
        Location::AccelFs {
            fs: fs.clone(),
            path: "/db".into(),
        },
        &small_opts(),
    ) {
        Ok(db) => assert_eq!(db.get(b"first").expect("get"), Some(b"kept".to_vec())),
        Err(e) => assert!(matches!(e, KvError::NoSpace(_)), "{e}"),
    }
    fs.unmount().expect("unmount");
    let report = kura_accelfs::fsck(Box::new(MemDevice::with_storage(
        storage.clone(),
        QueueOptions::default(),
    )))
    .expect("fsck");
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Table files read over and over are loaded whole (within the budget) and then served from
/// memory: the answers stay the same under concurrent readers, and the file system sees almost
/// no more reads; with no budget, every read still goes to the file system. Loads run on
/// threads of their own, so the loaded case passes over the keys until a pass finds them done
/// (a bounded number of times) rather than assuming they finished by some pass.
#[test]
fn tables_read_often_are_served_from_memory_with_the_same_answers() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("tables_read_often_are_served_from_memory_with_the_same_answers");
    }
    let fs_reads = |fs: &FileSystem| {
        let c = fs.statfs().cache;
        c.hits + c.misses + c.bypass_bytes / 4096
    };
    let mut without = 0;
    let mut with = 0;
    for resident in [0, 64usize << 20] {
        let storage = formatted_storage(64 << 20);
        let fs = mount_storage(&storage);
        // Uncompressed values well beyond the block cache, so gets keep reading tables.
        let opts = DbOptions {
            resident_table_bytes: resident,
            compression: false,
            ..small_opts()
        };
        let db = open_with(&fs, &opts);
        let log = fs.read("/db/LOG").expect("LevelDB's LOG is on AccelFS");
        assert!(
            !log.is_empty(),
            "LOG messages reach the file system while the database is open"
        );
        for i in 0..4000u16 {
            db.put(&key(i), &value(i, 1999)).expect("put");
        }
        db.compact().expect("compact");
        let db = Arc::new(db);
        let pass = |db: &Arc<Db>| {
            let readers: Vec<_> = (0..4u16)
                .map(|t| {
                    let db = Arc::clone(db);
                    std::thread::spawn(move || {
                        for i in (t..4000).step_by(3) {
                            let got = db.get(&key(i)).expect("get");
                            assert_eq!(got, Some(value(i, 1999)), "key {i}");
                        }
                    })
                })
                .collect();
            for r in readers {
                r.join().expect("reader");
            }
        };
        // A table is loaded after it has been read a number of times.
        for _ in 0..3 {
            pass(&db);
        }
        let measured = || {
            let before = fs_reads(&fs);
            pass(&db);
            fs_reads(&fs) - before
        };
        if resident == 0 {
            without = measured();
            continue;
        }
        for _ in 0..50 {
            with = measured();
            if with * 20 < without {
                break;
            }
        }
    }
    assert!(
        without > 1000,
        "without a budget the reads reach AccelFS ({without})"
    );
    assert!(
        with * 20 < without,
        "loaded tables answer from memory ({with} file-system reads vs {without})"
    );
}

/// Runs in both builds: with LevelDB the store opens on every kind of location; without it
/// every open fails with the typed `Unavailable` error saying how to get LevelDB, before it
/// mounts or creates anything.
#[test]
fn a_store_says_clearly_whether_this_build_has_leveldb() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db");
    let storage = formatted_storage(16 << 20);
    let fs = mount_storage(&storage);
    let locations = [
        Location::Dir(path.clone()),
        Location::AccelFs {
            fs: fs.clone(),
            path: "/db".into(),
        },
    ];
    for location in locations {
        let what = format!("{location:?}");
        match Db::open(location, &small_opts()) {
            Ok(db) => {
                assert!(
                    kura_kv::leveldb_available(),
                    "{what}: opened without LevelDB"
                );
                db.put(b"k", b"v").expect("put");
                assert_eq!(db.get(b"k").expect("get"), Some(b"v".to_vec()));
                db.close().expect("close");
            }
            Err(KvError::Unavailable(msg)) => {
                assert!(!kura_kv::leveldb_available(), "{what}: {msg}");
                assert!(
                    msg.contains("built without Google LevelDB") && msg.contains("libleveldb-dev"),
                    "{what}: {msg}"
                );
            }
            Err(e) => panic!("{what}: {e:?}"),
        }
    }
    if !kura_kv::leveldb_available() {
        assert!(
            !path.exists(),
            "a build without LevelDB created {}",
            path.display()
        );
        assert!(
            !fs.exists("/db"),
            "a build without LevelDB created /db on AccelFS"
        );
    }
    fs.unmount().expect("unmount");
}
