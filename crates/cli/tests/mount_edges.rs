//! `kura mount` at its edges: SIGTERM commits what was written and leaves no stale mount (also
//! while a program still has a file open there), and a second process cannot write the mounted
//! image.

mod common;

use common::{kura, mounted, ok, signal, start_mount, stderr_of, wait_exit, MountGuard};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Deterministic bytes that differ per MiB, so a lost or misplaced chunk shows.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i >> 20) as u8).wrapping_mul(37) ^ (i as u8).wrapping_mul(13))
        .collect()
}

fn fs_image(dir: &Path, size: &str) -> String {
    let img = dir.join("fs.img");
    ok(&["mkfs", &format!("file:{}?size={size}", img.display())]);
    format!("file:{}", img.display())
}

#[test]
fn sigterm_commits_a_closed_file_and_leaves_no_stale_mount() {
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip("sigterm_commits_a_closed_file_and_leaves_no_stale_mount");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = fs_image(dir.path(), "256M");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &[]);
    let _guard = MountGuard(&mnt);
    let data = pattern(100 << 20);
    // Written and closed, never fsync'd: the signal's commit is what makes it durable.
    std::fs::write(mnt.join("big.bin"), &data).expect("write through FUSE");
    signal(&server, "TERM");
    let status = wait_exit(&mut server, Duration::from_secs(60));
    assert!(status.success(), "kura mount exit {status}");
    assert!(!mounted(&mnt), "no stale mount after SIGTERM");
    let out = kura(&["fs", "cat", &spec, "/big.bin"]);
    assert!(out.status.success());
    assert!(out.stdout == data, "the file is complete after remount");
    assert!(ok(&["fsck", &spec]).contains("clean"));
}

#[test]
fn sigterm_with_a_file_still_open_detaches_and_keeps_every_write() {
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip("sigterm_with_a_file_still_open_detaches_and_keeps_every_write");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = fs_image(dir.path(), "64M");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &[]);
    let _guard = MountGuard(&mnt);
    let data = pattern(6 << 20);
    let mut f = std::fs::File::create(mnt.join("open.bin")).expect("create");
    f.write_all(&data[..3 << 20]).expect("write");
    signal(&server, "TERM");
    // Busy, so the mount is detached lazily: the name goes, the open file keeps working.
    let start = Instant::now();
    while mounted(&mnt) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "still mounted after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    f.write_all(&data[3 << 20..])
        .expect("write after the signal");
    drop(f);
    let status = wait_exit(&mut server, Duration::from_secs(60));
    assert!(
        status.success(),
        "kura mount exit {status}: {}",
        stderr_of(&mut server)
    );
    let out = kura(&["fs", "cat", &spec, "/open.bin"]);
    assert!(out.status.success());
    assert!(out.stdout == data, "both halves are in the file");
    assert!(ok(&["fsck", &spec]).contains("clean"));
}

#[test]
fn a_second_process_cannot_change_a_mounted_image() {
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip("a_second_process_cannot_change_a_mounted_image");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = fs_image(dir.path(), "64M");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let src = dir.path().join("tree");
    std::fs::create_dir_all(src.join("a/b")).expect("mkdir");
    for i in 0..50 {
        std::fs::write(src.join(format!("a/b/f{i}")), pattern(10_000 + i)).expect("write");
    }
    let mut server = start_mount(&spec, &mnt, &[]);
    let _guard = MountGuard(&mnt);
    let mut mine = std::fs::File::create(mnt.join("mine.txt")).expect("create");
    mine.write_all(b"written through the mount\n")
        .expect("write");
    // Committed now, so the image has no reason to change while the others are refused.
    mine.sync_all().expect("fsync");
    drop(mine);
    let img = dir.path().join("fs.img");
    let before = std::fs::read(&img).expect("read image");
    for args in [
        vec!["fs", "put", &spec, src.to_str().expect("utf8"), "/x", "-r"],
        vec!["mkfs", &spec],
        vec!["fsck", "--repair", &spec],
    ] {
        let out = kura(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "kura {args:?} succeeded on a mounted image"
        );
        assert!(
            err.contains("in use by process") && err.contains("fs.img"),
            "kura {args:?}: {err}"
        );
    }
    assert!(
        std::fs::read(&img).expect("read image") == before,
        "refused commands changed nothing"
    );
    signal(&server, "INT");
    let status = wait_exit(&mut server, Duration::from_secs(60));
    assert!(status.success(), "kura mount exit {status}");
    assert!(ok(&["fsck", &spec]).contains("clean"));
    assert_eq!(
        ok(&["fs", "cat", &spec, "/mine.txt"]),
        "written through the mount\n"
    );
}

#[test]
fn a_read_only_mount_shares_the_image_with_readers_and_never_writes() {
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip("a_read_only_mount_shares_the_image_with_readers_and_never_writes");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = fs_image(dir.path(), "64M");
    let src = dir.path().join("hello.txt");
    std::fs::write(&src, b"read me\n").expect("write");
    ok(&[
        "fs",
        "put",
        &spec,
        src.to_str().expect("utf8"),
        "/hello.txt",
    ]);
    let img = dir.path().join("fs.img");
    let before = std::fs::read(&img).expect("read image");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &["--read-only"]);
    let _guard = MountGuard(&mnt);
    assert_eq!(
        std::fs::read(mnt.join("hello.txt")).expect("read through FUSE"),
        b"read me\n"
    );
    let err = std::fs::write(mnt.join("new.txt"), b"x").expect_err("a read-only mount refuses");
    assert_eq!(err.raw_os_error(), Some(30), "EROFS: {err}");
    // Other readers share the image; a writer is refused.
    assert!(ok(&["fs", "ls", &spec]).contains("hello.txt"));
    assert!(!kura(&["fs", "mkdir", &spec, "/x"]).status.success());
    signal(&server, "TERM");
    let status = wait_exit(&mut server, Duration::from_secs(60));
    assert!(status.success(), "kura mount exit {status}");
    assert!(
        std::fs::read(&img).expect("read image") == before,
        "the image changed"
    );
}
