//! A real kernel file system on a kura NBD export: the export is exposed as a file by
//! `nbdfuse`, attached with `losetup`, formatted with `mkfs.ext4`, mounted, filled with a tree,
//! unmounted, and `e2fsck -f` must find it clean. The kernel here has no NBD driver, hence
//! nbdfuse + loop. Needs root, /dev/fuse, loop devices and the tools; skipped visibly
//! (`kura_testkit::skip`) only when one of them is missing.

use kura_nbd::{serve, Export, ServeOptions};
use kura_testkit::{run_tool as run, NbdLoop};
use std::net::TcpListener;
use std::time::Duration;

/// What this test cannot run without, if this machine lacks it: root, loop devices, FUSE and the
/// tools. With all of them present, any failure below is a test failure.
fn missing() -> Option<kura_testkit::Missing> {
    kura_testkit::loop_unavailable()
        .or_else(kura_testkit::fuse_unavailable)
        .or_else(|| kura_testkit::missing_tool("nbdfuse", "apt-get install libnbd-bin"))
        .or_else(|| kura_testkit::missing_tool("mkfs.ext4", "apt-get install e2fsprogs"))
        .or_else(|| kura_testkit::missing_tool("e2fsck", "apt-get install e2fsprogs"))
        .or_else(|| kura_testkit::missing_tool("mount", "apt-get install mount"))
}

#[test]
fn ext4_on_a_kura_export_through_nbdfuse_and_a_loop_device_is_fsck_clean() {
    if let Some(m) = missing() {
        return m.skip("ext4_on_a_kura_export_through_nbdfuse_and_a_loop_device_is_fsck_clean");
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let dev = kura_engine::open("mem:128M").expect("mem device");
    let server = serve(
        listener,
        vec![Export::new("disk", dev)],
        ServeOptions::default(),
    )
    .expect("serve");
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let attached = NbdLoop::attach(
        dir.path(),
        &format!("nbd://127.0.0.1:{port}/disk"),
        Duration::from_secs(20),
    );
    let loopdev = attached.device.clone();
    let outcome = (|| -> Result<String, String> {
        run("mkfs.ext4", &["-q", "-F", &loopdev])?;
        let m = mnt.to_str().expect("utf8");
        run("mount", &[&loopdev, m])?;
        let filled = (|| -> std::io::Result<()> {
            for d in 0..5 {
                let sub = mnt.join(format!("d{d}"));
                std::fs::create_dir(&sub)?;
                for f in 0..20 {
                    std::fs::write(
                        sub.join(format!("f{f}")),
                        vec![(d * 20 + f) as u8; 4096 * (f + 1)],
                    )?;
                }
            }
            Ok(())
        })();
        run("sync", &[])?;
        run("umount", &[m])?;
        filled.map_err(|e| e.to_string())?;
        run("e2fsck", &["-f", "-n", &loopdev])
    })();
    drop(attached);
    let report = outcome.expect("ext4 round trip");
    assert!(
        report.contains("clean") || report.contains("files"),
        "e2fsck: {report}"
    );
    let stats = server.stats();
    server.stop();
    assert!(
        stats.requests > 100,
        "the kernel file system went through the export: {stats:?}"
    );
}
