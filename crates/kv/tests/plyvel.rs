//! Format compatibility with Google LevelDB as Python applications use it (plyvel): a database
//! written on AccelFS and copied out opens in plyvel with every key intact, and one written by
//! plyvel and copied in opens here. Skipped visibly when python3 or plyvel is missing.

mod common;

use kura_accelfs::{FileSystem, MkfsOptions, MountOptions};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_kv::{Db, DbOptions, Location, WriteBatch};
use std::path::Path;
use std::process::Command;

fn plyvel_missing() -> Option<kura_testkit::Missing> {
    kura_testkit::python_module_missing("plyvel", "plyvel")
}

fn pairs() -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..1500u32)
        .map(|i| {
            let k = format!("user{:08}", i.wrapping_mul(2654435761) % 100_000_000).into_bytes();
            let v: Vec<u8> = (0..(i % 700 + 1)).map(|j| (j * 7 + i) as u8).collect();
            (k, v)
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn python(script: &str, dir: &Path) -> String {
    let o = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "python: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn mounted() -> FileSystem {
    FileSystem::format(
        Box::new(MemDevice::new(64 << 20, QueueOptions::default())),
        MkfsOptions::default(),
        MountOptions::default(),
    )
    .expect("format")
}

#[test]
fn accelfs_database_opens_in_plyvel_and_back() {
    if let Some(m) = common::leveldb_missing() {
        return m.skip("accelfs_database_opens_in_plyvel_and_back");
    }
    if let Some(m) = plyvel_missing() {
        return m.skip("accelfs_database_opens_in_plyvel_and_back");
    }
    let fs = mounted();
    let opts = DbOptions {
        write_buffer_bytes: 128 << 10,
        ..DbOptions::default()
    };
    let db = Db::open(
        Location::AccelFs {
            fs: fs.clone(),
            path: "/db".into(),
        },
        &opts,
    )
    .expect("open");
    let want = pairs();
    for chunk in want.chunks(100) {
        let mut b = WriteBatch::new();
        for (k, v) in chunk {
            b.put(k, v);
        }
        db.write(b, false).expect("write");
    }
    db.delete(&want[0].0).expect("delete");
    db.close().expect("close");

    // Copy the database directory out, as `kura fs get -r` does.
    let host = tempfile::tempdir().expect("tempdir");
    let out = host.path().join("db");
    std::fs::create_dir(&out).expect("mkdir");
    let names: Vec<String> = fs
        .read_dir("/db")
        .expect("ls")
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    assert!(
        names.iter().any(|n| n == "CURRENT") && names.iter().any(|n| n.starts_with("MANIFEST"))
    );
    assert!(
        names.iter().any(|n| n == "LOG"),
        "LevelDB's LOG is on AccelFS too: {names:?}"
    );
    for n in &names {
        std::fs::write(out.join(n), fs.read(&format!("/db/{n}")).expect("read")).expect("copy");
    }
    let dump = python(
        "import sys, plyvel\n\
         db = plyvel.DB(sys.argv[1], paranoid_checks=True)\n\
         for k, v in db: print(k.hex(), v.hex())\n\
         db.close()\n",
        &out,
    );
    let mut expected: Vec<(String, String)> =
        want[1..].iter().map(|(k, v)| (hex(k), hex(v))).collect();
    expected.sort();
    expected.dedup_by(|a, b| a.0 == b.0);
    let got: Vec<(String, String)> = dump
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("two fields");
            (k.to_string(), v.to_string())
        })
        .collect();
    assert_eq!(got.len(), expected.len(), "plyvel sees every key");
    assert!(got == expected, "plyvel reads the same pairs");

    // And the reverse: plyvel writes, the database is copied in, kura-kv reads it.
    let theirs = host.path().join("theirs");
    python(
        "import sys, plyvel\n\
         db = plyvel.DB(sys.argv[1], create_if_missing=True)\n\
         wb = db.write_batch()\n\
         for i in range(2000): wb.put(b'py%06d' % i, (b'value-%d-' % i) * (i % 50 + 1))\n\
         wb.write()\n\
         db.close()\n",
        &theirs,
    );
    fs.mkdir("/theirs").expect("mkdir");
    for e in std::fs::read_dir(&theirs).expect("ls") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        fs.write(
            &format!("/theirs/{name}"),
            &std::fs::read(e.path()).expect("read"),
        )
        .expect("copy in");
    }
    let db = Db::open(
        Location::AccelFs {
            fs: fs.clone(),
            path: "/theirs".into(),
        },
        &DbOptions::default(),
    )
    .expect("open plyvel's database");
    let all = db.scan_all().expect("scan");
    assert_eq!(all.len(), 2000);
    for i in [0usize, 1, 999, 1999] {
        let k = format!("py{i:06}").into_bytes();
        let v: Vec<u8> = format!("value-{i}-").into_bytes().repeat(i % 50 + 1);
        assert_eq!(db.get(&k).expect("get"), Some(v));
    }
}
