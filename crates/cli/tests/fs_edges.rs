//! `kura fs` at its edges: inspecting an image (even one whose journal still needs replaying)
//! never changes a byte of it, `put` and `get` keep holes as holes, and a `put` stopped by
//! SIGTERM keeps only complete files, commits them, says so and exits 143.

mod common;

use common::{kura, ok, start_mount};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ ((i >> 12) as u8) ^ salt)
        .collect()
}

/// An image whose last transactions are committed in the journal but not checkpointed: a mount
/// that fsync'd a file was killed with SIGKILL.
fn image_needing_replay(dir: &Path) -> Option<(String, Vec<u8>)> {
    if let Some(m) = kura_testkit::fuse_unavailable() {
        m.skip("image_needing_replay");
        return None;
    }
    let img = dir.join("fs.img");
    ok(&["mkfs", &format!("file:{}?size=64M", img.display())]);
    let spec = format!("file:{}", img.display());
    ok(&["fs", "mkdir", &spec, "/d"]);
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &[]);
    let data = pattern(300_000, 5);
    let mut f = std::fs::File::create(mnt.join("d/journaled.bin")).expect("create");
    f.write_all(&data).expect("write");
    f.sync_all().expect("fsync commits to the journal");
    drop(f);
    server.kill().expect("SIGKILL the mount");
    server.wait().expect("reap");
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(&mnt)
        .status();
    Some((spec, data))
}

#[test]
fn inspecting_an_image_changes_no_byte_even_when_its_journal_needs_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((spec, data)) = image_needing_replay(dir.path()) else {
        return;
    };
    let img = dir.path().join("fs.img");
    let before = std::fs::read(&img).expect("read image");
    let listing = ok(&["fs", "ls", &spec, "/d", "-l"]);
    assert!(listing.contains("journaled.bin"), "{listing}");
    let cat = kura(&["fs", "cat", &spec, "/d/journaled.bin"]);
    assert!(cat.status.success());
    assert!(cat.stdout == data, "the replayed file reads back");
    assert!(ok(&["fs", "stat", &spec, "/d/journaled.bin"]).contains("300000 bytes"));
    ok(&["fs", "df", &spec]);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    ok(&["fs", "get", &spec, "/d", out.to_str().expect("utf8"), "-r"]);
    assert!(std::fs::read(out.join("d/journaled.bin")).expect("got") == data);
    let fsck = kura(&["fsck", &spec]);
    assert!(
        fsck.status.success(),
        "fsck: {}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    let after = std::fs::read(&img).expect("read image");
    assert!(before == after, "inspection (or fsck) changed the image");
    // A change still works, and replays for real.
    ok(&["fs", "rm", &spec, "/d/journaled.bin"]);
    assert!(ok(&["fsck", &spec]).contains("clean"));
}

#[test]
fn readers_share_an_image_and_writers_wait_for_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    let spec = format!("file:{}", img.display());
    ok(&["mkfs", &format!("{spec}?size=64M")]);
    // Another reader holds a shared lock (flock(1), as a second `kura fs ls` would).
    if kura_testkit::which("flock").is_none() {
        return kura_testkit::skip(
            "readers_share_an_image_and_writers_wait_for_them",
            "flock",
            "flock(1) from util-linux is not installed",
        );
    }
    let mut reader = Command::new("flock")
        .args(["--shared", "--no-fork"])
        .arg(&img)
        .args(["sleep", "30"])
        .spawn()
        .expect("flock");
    std::thread::sleep(Duration::from_millis(200));
    ok(&["fs", "ls", &spec]);
    let refused = kura(&["fs", "mkdir", &spec, "/x"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a writer beside a reader");
    assert!(err.contains("in use by process"), "{err}");
    reader.kill().expect("kill");
    reader.wait().expect("reap");
    ok(&["fs", "mkdir", &spec, "/x"]);
}

#[test]
fn get_writes_holes_as_holes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    let spec = format!("file:{}", img.display());
    ok(&["mkfs", &format!("{spec}?size=64M")]);
    // A host file with a 40 MiB hole between two small runs of data.
    let src = dir.path().join("sparse.bin");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&src).expect("create");
        f.write_all_at(&pattern(8192, 1), 0).expect("write");
        f.write_all_at(&pattern(8192, 2), 40 << 20).expect("write");
    }
    ok(&[
        "fs",
        "put",
        &spec,
        src.to_str().expect("utf8"),
        "/sparse.bin",
    ]);
    let back = dir.path().join("back.bin");
    ok(&[
        "fs",
        "get",
        &spec,
        "/sparse.bin",
        back.to_str().expect("utf8"),
    ]);
    assert!(std::fs::read(&back).expect("read") == std::fs::read(&src).expect("read"));
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(&back).expect("stat").blocks() * 512;
    // `put` keeps the hole (it skips chunks of zeroes), so `get` must not turn it into 40 MiB of
    // written zeroes on the host.
    let held: u64 = ok(&["fs", "stat", &spec, "/sparse.bin"])
        .lines()
        .find_map(|l| l.trim().strip_prefix("blocks: "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .expect("blocks line");
    let fs_bytes = held * 8192;
    assert!(
        fs_bytes < 16 << 20,
        "put filled the 40 MiB hole: the file holds {fs_bytes} bytes"
    );
    assert!(
        allocated <= fs_bytes + (1 << 20),
        "get wrote {allocated} bytes for a file holding {fs_bytes}"
    );
}

#[test]
fn a_put_stopped_by_sigterm_keeps_complete_files_and_exits_143() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    let spec = format!("file:{}", img.display());
    ok(&["mkfs", &format!("{spec}?size=1G")]);
    let src = dir.path().join("tree");
    std::fs::create_dir(&src).expect("mkdir");
    let files = 96;
    for i in 0..files {
        std::fs::write(src.join(format!("f{i:03}")), pattern(4 << 20, i as u8)).expect("write");
    }
    let mut put = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(["fs", "put", &spec, src.to_str().expect("utf8"), "/t", "-r"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start put");
    // Signal once a sixth of the tree has been read, so the handler is installed and most of the
    // copy is still ahead; if the copy wins anyway, everything must simply be there.
    let io = format!("/proc/{}/io", put.id());
    let start = Instant::now();
    loop {
        let read: u64 = std::fs::read_to_string(&io)
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("rchar: ")?.trim().parse().ok())
            })
            .unwrap_or(0);
        if read > (64 << 20) || put.try_wait().expect("wait").is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "put made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &put.id().to_string()])
        .status();
    let out = put.wait_with_output().expect("put exits");
    let err = String::from_utf8_lossy(&out.stderr);
    let listing = ok(&["fs", "ls", &spec, "/t"]);
    let kept: Vec<&str> = listing
        .split_whitespace()
        .filter(|n| n.starts_with('f'))
        .collect();
    match out.status.code() {
        Some(143) => {
            assert!(err.contains("interrupted by signal 15"), "{err}");
            assert!(err.contains("copied completely and committed"), "{err}");
            assert!(
                kept.len() < files,
                "stopped early, yet all {files} files are there"
            );
            eprintln!("stopped after {} of {files} files", kept.len());
        }
        Some(0) => assert_eq!(kept.len(), files, "finished before the signal"),
        other => panic!("put exited {other:?}: {err}"),
    }
    for name in kept {
        let i: usize = name[1..].parse().expect("name");
        let cat = kura(&["fs", "cat", &spec, &format!("/t/{name}")]);
        assert!(
            cat.stdout == pattern(4 << 20, i as u8),
            "{name} is incomplete"
        );
    }
    assert!(ok(&["fsck", &spec]).contains("clean"));
}

#[test]
fn a_fill_stopped_by_sigterm_flushes_what_it_wrote_and_says_where_it_stopped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fill.img");
    let spec = format!("file:{}?size=2G", img.display());
    let mut fill = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(["dev", "create", &spec, "--fill", "--seed", "7"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fill");
    // Signal once 128 MiB are on the disk, so the handler is installed and most is ahead.
    let start = Instant::now();
    loop {
        use std::os::unix::fs::MetadataExt;
        let written = std::fs::metadata(&img).map_or(0, |m| m.blocks() * 512);
        if written > (128 << 20) || fill.try_wait().expect("wait").is_some() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "fill made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &fill.id().to_string()])
        .status();
    let out = fill.wait_with_output().expect("fill exits");
    let err = String::from_utf8_lossy(&out.stderr);
    let blocks = (2u64 << 30) / 4096;
    let done = match out.status.code() {
        Some(143) => {
            // "... written to LBA 0..N (...) and flushed; the rest is untouched"
            let at: u64 = err
                .split("LBA 0..")
                .nth(1)
                .and_then(|t| t.split(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no stopping point in: {err}"));
            assert!(err.contains("and flushed"), "{err}");
            assert!(at < blocks, "stopped at the end: {err}");
            eprintln!("stopped at block {at} of {blocks}");
            at
        }
        Some(0) => blocks,
        other => panic!("fill exited {other:?}: {err}"),
    };
    assert!(done > 0);
    ok(&[
        "dev",
        "verify",
        &format!("file:{}", img.display()),
        "--seed",
        "7",
        "--blocks",
        &done.to_string(),
    ]);
}
