//! kura's upper layers on a Ceph RBD image (`rbd:`), on a real cluster started once for this
//! binary (`kura_rbd::testing`, `scripts/ceph/start.sh`): AccelFS (`kura mkfs`, `fs put|cat`,
//! `fsck`) and the genome pipeline on it, the LevelDB port, and DeLiBA's stack served over NBD
//! (`kura serve` of `cache(coalesce(rbd:…))`, written and read with nbdcopy, sized by nbdinfo,
//! then checked with `rbd export`), ext4 on that stack through `nbdfuse` + a loop device (the
//! host kernel has no NBD driver; `kura_nbd`'s kernel_fs test does the same on `mem:`), with
//! `e2fsck` clean on the device and on the `rbd export` of the image afterwards, and a short
//! `kura bench rbd` on the same cluster.
//!
//! As in `crates/rbd/tests/cluster.rs`, every check runs inside one `#[test]` so the cluster is
//! stopped by its guard when the test ends, passes or fails.

mod common;

use common::{fresh_db, index_and_map_on, kura, ok, simulate, text, Serving};
use kura_engine::Registry;
use kura_kv::Db;
use kura_rbd::testing::{missing, run_checks, Check, TestCluster};
use kura_testkit::{run_tool, NbdLoop};
use std::process::Command;
use std::time::Duration;

#[test]
fn kura_layers_on_rbd() {
    if let Some(why) = missing() {
        kura_testkit::skip("kura_layers_on_rbd", "ceph", why);
        return;
    }
    let checks: &[(&str, Check)] = &[
        ("AccelFS and the genome pipeline", accelfs_and_genome),
        ("LevelDB on AccelFS", leveldb),
        ("DeLiBA's stack served over NBD", deliba_stack_over_nbd),
        ("ext4 on DeLiBA's stack via nbdfuse", ext4_via_nbdfuse),
        ("kura bench rbd --quick", bench_rbd_quick),
    ];
    if let Err(e) = run_checks(checks) {
        panic!("{e}");
    }
}

fn accelfs_and_genome(c: &TestCluster) {
    let spec = c.spec("fs", "create=128M");
    ok(&["mkfs", &spec]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path();
    let tree = d.join("tree");
    std::fs::create_dir_all(tree.join("sub")).expect("mkdir");
    std::fs::write(tree.join("hello.txt"), b"hello from ceph\n").expect("write");
    let big: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write(tree.join("sub/big.bin"), &big).expect("write");
    ok(&["fs", "put", &spec, tree.to_str().expect("utf-8"), "/", "-r"]);
    assert_eq!(
        ok(&["fs", "cat", &spec, "/tree/hello.txt"]),
        "hello from ceph\n"
    );
    let back = d.join("big.back");
    ok(&[
        "fs",
        "get",
        &spec,
        "/tree/sub/big.bin",
        back.to_str().expect("utf-8"),
    ]);
    assert!(
        std::fs::read(&back).expect("read") == big,
        "big.bin differs"
    );

    // The paper's application on the same image.
    simulate(d, "500", false);
    let correct = index_and_map_on(&spec, d);
    assert!(correct >= 475, "{correct} of 500 placed correctly");
    let o = kura(&["fsck", &spec]);
    assert!(
        o.status.success() && text(&o).contains("clean"),
        "fsck: {}",
        text(&o)
    );
}

fn registry() -> Registry {
    let mut registry = Registry::engine();
    kura_vdrive::register(&mut registry);
    kura_rbd::register(&mut registry);
    registry
}

fn leveldb(c: &TestCluster) {
    let registry = registry();
    let spec = c.spec("kv", "create=64M");
    let (store, opts) = fresh_db(&registry, &spec).unwrap_or_else(|e| panic!("{e}"));
    let db = Db::open(store.clone(), &opts).expect("open the store");
    for i in 0..2000u32 {
        db.put(
            format!("key{i:05}").as_bytes(),
            format!("value {i}").as_bytes(),
        )
        .expect("put");
    }
    db.close().expect("close");
    let db = Db::open(store, &opts).expect("reopen");
    for i in (0..2000u32).step_by(97) {
        assert_eq!(
            db.get(format!("key{i:05}").as_bytes())
                .expect("get")
                .as_deref(),
            Some(format!("value {i}").as_bytes())
        );
    }
    db.close().expect("close");
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn deliba_stack_over_nbd(c: &TestCluster) {
    for tool in ["nbdcopy", "nbdinfo"] {
        if kura_testkit::which(tool).is_none() {
            kura_testkit::skip(
                "kura_layers_on_rbd (DeLiBA stack over NBD)",
                tool,
                "not installed (apt-get install libnbd-bin)",
            );
            return;
        }
    }
    // DeLiBA's order: NBD → LRU cache → coalescing scheduler → librbd, so cache hits never wait
    // in the scheduler and only misses are merged on their way to the cluster.
    let rbd = c.spec("served", "create=24M");
    let export = format!("disk=cache(coalesce({rbd}))?size=32M");
    let server = Serving::start(&[&export, "--listen", "127.0.0.1:0"]);
    let url = format!("{}/disk", server.url);
    let info = run("nbdinfo", &["--size", &url]);
    assert_eq!(info.trim(), (24u64 << 20).to_string(), "nbdinfo --size");
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.bin");
    let data: Vec<u8> = (0..24u32 << 20).map(|i| (i ^ (i >> 11)) as u8).collect();
    std::fs::write(&input, &data).expect("write");
    run("nbdcopy", &[input.to_str().expect("utf-8"), &url]);
    let output = tmp.path().join("out.bin");
    run("nbdcopy", &[&url, output.to_str().expect("utf-8")]);
    assert!(
        std::fs::read(&output).expect("read") == data,
        "nbdcopy read back differs"
    );
    let status = server.stop();
    assert!(status.success(), "kura serve after SIGTERM: {status:?}");
    let exported = c.rbd_ok(&["export", "rbd/served", "-"]).expect("export");
    assert!(
        exported == data,
        "rbd export differs from what nbdcopy wrote"
    );
}

fn bench_rbd_quick(c: &TestCluster) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let json = tmp.path().join("rbd.json");
    let conf = c.conf().to_str().expect("utf-8");
    ok(&[
        "bench",
        "rbd",
        "--quick",
        "--conf",
        conf,
        "--size",
        "32M",
        "--hot",
        "8M",
        "--ops",
        "1024",
        "--json",
        json.to_str().expect("utf-8"),
        "--plot",
        tmp.path().join("rbd.png").to_str().expect("utf-8"),
    ]);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("read JSON")).expect("parse JSON");
    let points = |part: &str| report[part].as_array().cloned().unwrap_or_default();
    assert_eq!(points("interface").len(), 5, "{report}");
    assert_eq!(points("deliba").len(), 6, "{report}");
    for p in points("interface").iter().chain(&points("deliba")) {
        let kura = p["compared"]["kura"]["median"].as_f64().unwrap_or(0.0);
        let peer = p["compared"]["peer"]["median"].as_f64().unwrap_or(0.0);
        assert!(kura > 0.0 && peer > 0.0, "{p}");
    }
    assert!(report["cache_hits"].as_u64().unwrap_or(0) > 0, "{report}");
    assert!(
        report["coalesce_merged"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );
    // The bench removes its image.
    let images = c.rbd_ok(&["ls", "rbd"]).expect("rbd ls");
    assert!(!String::from_utf8_lossy(&images).contains("kura-bench"));
}

fn ext4_via_nbdfuse(c: &TestCluster) {
    let missing = kura_testkit::loop_unavailable()
        .or_else(kura_testkit::fuse_unavailable)
        .or_else(|| kura_testkit::missing_tool("nbdfuse", "apt-get install libnbd-bin"))
        .or_else(|| kura_testkit::missing_tool("mkfs.ext4", "apt-get install e2fsprogs"))
        .or_else(|| kura_testkit::missing_tool("e2fsck", "apt-get install e2fsprogs"));
    if let Some(m) = missing {
        m.skip("kura_layers_on_rbd (ext4 via nbdfuse)");
        return;
    }
    let rbd = c.spec("ext4", "create=64M");
    // Served in this process, byte-granular, as crates/nbd/tests/kernel_fs.rs does: mkfs.ext4
    // picks 1 KiB blocks for 64 MiB, below the 4 KiB minimum `kura serve` advertises unless
    // given --byte-granular, and nbdfuse then fails the journal's 1 KiB writes.
    let listener = kura_nbd::bind_loopback(0).expect("bind");
    let url = format!("nbd://{}", listener.local_addr().expect("addr"));
    let stack = registry()
        .open(&format!("cache(coalesce({rbd}))?size=32M"))
        .expect("open the stack");
    let server = kura_nbd::serve(
        listener,
        vec![kura_nbd::Export::new("disk", stack)],
        kura_nbd::ServeOptions::default(),
    )
    .expect("serve");
    let tmp = tempfile::tempdir().expect("tempdir");
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let attached = NbdLoop::attach(tmp.path(), &format!("{url}/disk"), Duration::from_secs(30));
    let loopdev = attached.device.clone();
    let m = mnt.to_str().expect("utf-8");
    let outcome = (|| -> Result<String, String> {
        run_tool("mkfs.ext4", &["-q", "-F", &loopdev])?;
        run_tool("mount", &[&loopdev, m])?;
        let filled = (|| -> std::io::Result<()> {
            for d in 0..4 {
                let sub = mnt.join(format!("d{d}"));
                std::fs::create_dir(&sub)?;
                for f in 0..16 {
                    std::fs::write(
                        sub.join(format!("f{f}")),
                        vec![(d * 16 + f) as u8; 4096 * (f + 1)],
                    )?;
                }
            }
            Ok(())
        })();
        let back = std::fs::read(mnt.join("d3/f15")).map_err(|e| e.to_string());
        run_tool("sync", &[])?;
        run_tool("umount", &[m])?;
        filled.map_err(|e| e.to_string())?;
        if back? != vec![63u8; 4096 * 16] {
            return Err("d3/f15 reads back wrong".into());
        }
        run_tool("e2fsck", &["-f", "-n", &loopdev])
    })();
    drop(attached);
    let report = outcome.expect("ext4 round trip");
    assert!(
        report.contains("clean") || report.contains("files"),
        "e2fsck: {report}"
    );
    // Stopping the server flushes the stack and closes the image.
    drop(server.stop());
    // What reached the cluster is the same clean file system.
    let exported = tmp.path().join("exported.img");
    c.rbd_ok(&["export", "rbd/ext4", exported.to_str().expect("utf-8")])
        .expect("rbd export");
    let report = run_tool("e2fsck", &["-f", "-n", exported.to_str().expect("utf-8")])
        .unwrap_or_else(|e| panic!("e2fsck of rbd export: {e}"));
    assert!(
        report.contains("clean") || report.contains("files"),
        "e2fsck: {report}"
    );
}
