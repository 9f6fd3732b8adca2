//! No C++ exception crosses into Rust: the bridge is made to throw (the `test-hooks` fault
//! injection) at its entry points, in the Env methods LevelDB calls, and in the callback Rust
//! calls while listing a directory, with `std::bad_alloc`, another `std::exception` and a
//! non-`std::exception`. Each time the caller gets a typed `KvError`, the process goes on, and
//! the database still answers correctly afterwards.

mod common;

use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_kv::test_hooks::{throw_once, Site, Throw};
use kura_kv::{Db, DbOptions, KvError, Location, WriteBatch};

fn file_system() -> FileSystem {
    FileSystem::format(
        Box::new(MemDevice::new(64 << 20, QueueOptions::default())),
        MkfsOptions {
            block_size: 4096,
            inodes: None,
        },
        MountOptions::default(),
    )
    .expect("format")
}

fn opts() -> DbOptions {
    DbOptions {
        write_buffer_bytes: 64 << 10,
        block_cache_bytes: 1 << 20,
        ..DbOptions::default()
    }
}

fn open(fs: &FileSystem) -> Result<Db, KvError> {
    Db::open(
        Location::AccelFs {
            fs: fs.clone(),
            path: "/db".into(),
        },
        &opts(),
    )
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:06}").into_bytes()
}

fn value(i: u32) -> Vec<u8> {
    format!("value-{i}-").repeat(20).into_bytes()
}

/// Checks that `e` is the typed error for `what` (and names where it was caught).
fn assert_typed(e: &KvError, what: Throw, place: &str) {
    match (what, e) {
        (Throw::BadAlloc, KvError::OutOfMemory(m)) => assert!(m.contains("bad_alloc"), "{m}"),
        (Throw::RuntimeError, KvError::CppException(m)) => {
            assert!(m.contains("injected by kura_test_throw"), "{m}")
        }
        (Throw::NotStdException, KvError::CppException(m)) => {
            assert!(m.contains("not a std::exception"), "{m}")
        }
        _ => panic!("{what:?} at {place}: wrong error {e:?}"),
    }
    assert!(e.to_string().contains(place), "{place} named in: {e}");
}

#[test]
fn every_bridge_entry_point_turns_an_exception_into_a_typed_error() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("every_bridge_entry_point_turns_an_exception_into_a_typed_error");
    }
    let fs = file_system();
    let db = open(&fs).expect("open");
    for i in 0..500 {
        db.put(&key(i), &value(i)).expect("put");
    }
    for what in [Throw::BadAlloc, Throw::RuntimeError, Throw::NotStdException] {
        throw_once(Site::BridgeCall, what);
        let e = db.put(&key(1), b"lost").expect_err("put throws");
        assert_typed(&e, what, "kura_db_put");

        throw_once(Site::BridgeCall, what);
        assert_typed(&db.get(&key(1)).expect_err("get"), what, "kura_db_get");

        throw_once(Site::BridgeCall, what);
        assert_typed(
            &db.delete(&key(2)).expect_err("delete"),
            what,
            "kura_db_delete",
        );

        throw_once(Site::BridgeCall, what);
        let e = db.snapshot().err().expect("snapshot throws");
        assert_typed(&e, what, "kura_db_snapshot");

        throw_once(Site::BridgeCall, what);
        assert_typed(&db.scan_all().expect_err("scan"), what, "kura_db_iter");

        throw_once(Site::BridgeCall, what);
        assert_typed(&db.compact().expect_err("compact"), what, "kura_db_compact");

        throw_once(Site::BridgeCall, what);
        let e = db.property("leveldb.stats").expect_err("property");
        assert_typed(&e, what, "kura_db_property");

        // A batch that could not be made fails at write.
        throw_once(Site::BridgeCall, what);
        let mut b = WriteBatch::new();
        b.put(&key(3), b"lost");
        assert_typed(
            &db.write(b, true).expect_err("write"),
            what,
            "kura_batch_new",
        );

        // A put that failed inside a batch (no error out-parameter) is reported by write,
        // which then applies none of the batch.
        let mut b = WriteBatch::new();
        b.put(&key(4), b"lost");
        throw_once(Site::BridgeCall, what);
        b.put(&key(5), b"lost");
        b.delete(&key(6));
        assert_typed(
            &db.write(b, true).expect_err("write"),
            what,
            "kura_batch_put",
        );

        // Opening (with an open database on the same path: must not disturb it).
        throw_once(Site::BridgeCall, what);
        assert_typed(&open(&fs).err().expect("open"), what, "kura_db_open");
    }
    // Nothing of the failed calls took effect, everything else is intact, and the handle works.
    for i in 0..500 {
        assert_eq!(db.get(&key(i)).expect("get"), Some(value(i)), "key {i}");
    }
    db.put(&key(1), b"after").expect("put after");
    assert_eq!(db.get(&key(1)).expect("get"), Some(b"after".to_vec()));
    let snap = db.snapshot().expect("snapshot after");
    assert_eq!(db.scan_at(&snap, &[], None, 10).expect("scan").len(), 10);
    drop(snap);
    assert!(db.property("leveldb.stats").expect("stats").is_some());
    db.close().expect("close");
}

/// The example: `std::bad_alloc` while GetChildren collects the names Rust lists, i.e.
/// inside a C++ callback called from a Rust frame. Open fails with OutOfMemory; the next open
/// finds every key.
#[test]
fn an_exception_in_the_listing_callback_fails_open_with_a_typed_error() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("an_exception_in_the_listing_callback_fails_open_with_a_typed_error");
    }
    let fs = file_system();
    let db = open(&fs).expect("open");
    for i in 0..200 {
        db.put(&key(i), &value(i)).expect("put");
    }
    db.close().expect("close");
    for what in [Throw::BadAlloc, Throw::RuntimeError, Throw::NotStdException] {
        throw_once(Site::ListedName, what);
        let e = open(&fs).err().expect("open fails");
        assert_typed(&e, what, "Env::GetChildren");
    }
    let db = open(&fs).expect("open after");
    for i in 0..200 {
        assert_eq!(db.get(&key(i)).expect("get"), Some(value(i)), "key {i}");
    }
}

/// An exception in an Env method becomes an IOError inside LevelDB, which fails that one call:
/// here opening a table file during a get.
#[test]
fn an_exception_in_an_env_method_fails_only_that_call() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("an_exception_in_an_env_method_fails_only_that_call");
    }
    let fs = file_system();
    let db = open(&fs).expect("open");
    for i in 0..2000 {
        db.put(&key(i), &value(i)).expect("put");
    }
    db.compact().expect("compact");
    db.close().expect("close");
    for what in [Throw::BadAlloc, Throw::RuntimeError, Throw::NotStdException] {
        // A fresh handle has no table open, so the get must open one on this thread.
        let db = open(&fs).expect("reopen");
        throw_once(Site::EnvCall, what);
        let e = db.get(&key(7)).expect_err("get throws in the Env");
        assert_typed(&e, what, "Env::NewRandomAccessFile");
        assert_eq!(db.get(&key(7)).expect("get again"), Some(value(7)));
        db.close().expect("close");
    }
}
