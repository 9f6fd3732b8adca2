//! `kura fs …` and `kura mount` end to end on file-backed images: a directory tree goes in and
//! comes back out identical, through the tools and through a real FUSE mount (`cp -r`, `diff -r`),
//! and the image is fsck-clean afterwards.

mod common;

use common::{kura, ok, start_mount};
use std::path::Path;
use std::process::{Command, Stdio};

/// A small tree with an empty file, a multi-megabyte file (takes the cache bypass) and nesting.
fn make_tree(root: &Path) {
    std::fs::create_dir_all(root.join("sub/deeper")).expect("mkdir");
    std::fs::create_dir_all(root.join("empty-dir")).expect("mkdir");
    std::fs::write(root.join("empty"), b"").expect("write");
    std::fs::write(root.join("hello.txt"), b"hello, AccelFS\n").expect("write");
    let big: Vec<u8> = (0..3_000_003u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write(root.join("sub/big.bin"), big).expect("write");
    for i in 0..40 {
        std::fs::write(
            root.join(format!("sub/deeper/f{i}")),
            vec![i as u8; i * 997],
        )
        .expect("write");
    }
}

fn diff_r(a: &Path, b: &Path) {
    let o = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .expect("run diff");
    assert!(
        o.status.success(),
        "diff -r: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn put_get_ls_cat_stat_rm_df_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    let spec = format!("file:{}?size=64M", img.display());
    ok(&["mkfs", &spec, "--block-size", "4K"]);
    let spec = format!("file:{}", img.display());
    let src = dir.path().join("tree");
    make_tree(&src);
    ok(&["fs", "put", &spec, src.to_str().expect("utf8"), "/", "-r"]);
    let listing = ok(&["fs", "ls", &spec, "/tree", "-l"]);
    assert!(
        listing.contains("hello.txt") && listing.contains("sub/"),
        "{listing}"
    );
    assert_eq!(
        ok(&["fs", "cat", &spec, "/tree/hello.txt"]),
        "hello, AccelFS\n"
    );
    let stat = ok(&["fs", "stat", &spec, "/tree/sub/big.bin"]);
    assert!(stat.contains("3000003 bytes"), "{stat}");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    ok(&[
        "fs",
        "get",
        &spec,
        "/tree",
        out.to_str().expect("utf8"),
        "-r",
    ]);
    diff_r(&src, &out.join("tree"));
    let refused = kura(&["fs", "rm", &spec, "/tree"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not empty"));
    ok(&["fs", "rm", &spec, "/tree", "-r"]);
    assert_eq!(ok(&["fs", "ls", &spec]), "");
    ok(&["fs", "mkdir", &spec, "/a/b", "-p"]);
    let df = ok(&["fs", "df", &spec]);
    assert!(df.contains("inodes"), "{df}");
    let missing = kura(&["fs", "cat", &spec, "/nope"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such file"));
    assert!(ok(&["fsck", &spec]).contains("clean"));
}

/// What `cp -a` keeps of a host path: type, permission bits, owner, mtime in ns, a symlink's
/// target, and (for a file with several names) which of the other paths share its inode.
fn attributes(root: &Path, rel: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let p = root.join(rel);
    let m = std::fs::symlink_metadata(&p).expect("lstat");
    let t = m.file_type();
    let target = if t.is_symlink() {
        std::fs::read_link(&p)
            .expect("readlink")
            .display()
            .to_string()
    } else {
        String::new()
    };
    // Times of a symlink itself are not kept (std cannot set them on the host).
    let mtime = if t.is_symlink() {
        0
    } else {
        m.mtime() * 1_000_000_000 + m.mtime_nsec()
    };
    format!(
        "{rel}: {t:?} mode {:o} owner {}:{} mtime {mtime} links {} -> {target}",
        if t.is_symlink() { 0 } else { m.mode() & 0o7777 },
        m.uid(),
        m.gid(),
        m.nlink()
    )
}

#[test]
fn put_r_and_get_r_keep_links_modes_owners_and_times_like_cp_a() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    ok(&["mkfs", &format!("file:{}?size=64M", img.display())]);
    let spec = format!("file:{}", img.display());
    let src = dir.path().join("tree");
    make_tree(&src);
    let long = "x".repeat(200);
    let script = format!(
        "chmod 640 hello.txt; chmod 711 sub; ln -s hello.txt short; ln -s {long} dangling; \
         ln sub/big.bin sub/deeper/big-again; ln -s ../hello.txt sub/up; mkfifo fifo; \
         touch -d '2001-02-03 04:05:06.123456789' hello.txt sub/deeper/f3 empty-dir; \
         if [ \"$(id -u)\" = 0 ]; then chown 1234:5678 hello.txt; chown -h 99:98 short; fi"
    );
    let st = Command::new("sh")
        .args(["-ec", &script])
        .current_dir(&src)
        .status()
        .expect("sh");
    assert!(st.success());
    ok(&["fs", "put", &spec, src.to_str().expect("utf8"), "/", "-r"]);
    let listing = ok(&["fs", "ls", &spec, "/tree", "-l"]);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with('l') && l.ends_with("short"))
            && listing
                .lines()
                .any(|l| l.starts_with('p') && l.ends_with("fifo")),
        "{listing}"
    );
    let stat = ok(&["fs", "stat", &spec, "/tree/sub/big.bin"]);
    assert!(stat.contains("links: 2"), "{stat}");
    let stat = ok(&["fs", "stat", &spec, "/tree/short"]);
    assert!(stat.contains("target: hello.txt"), "{stat}");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    let got = kura(&[
        "fs",
        "get",
        &spec,
        "/tree",
        out.to_str().expect("utf8"),
        "-r",
    ]);
    assert!(got.status.success());
    assert!(
        String::from_utf8_lossy(&got.stderr).contains("skipping /tree/fifo (FIFO"),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    std::fs::remove_file(src.join("fifo")).expect("rm fifo");
    let back = out.join("tree");
    diff_r(&src, &back);
    for rel in [
        "hello.txt",
        "short",
        "dangling",
        "sub",
        "sub/up",
        "sub/big.bin",
        "sub/deeper/big-again",
        "sub/deeper/f3",
        "empty-dir",
        "empty",
    ] {
        assert_eq!(attributes(&src, rel), attributes(&back, rel));
    }
    let ino = |p: &str| std::fs::metadata(back.join(p)).expect("stat").ino();
    assert_eq!(
        ino("sub/big.bin"),
        ino("sub/deeper/big-again"),
        "the hard link came back as one"
    );
    assert!(ok(&["fsck", &spec]).contains("clean"));
}

/// Every extended attribute of `path` (not following a symlink), names to values, sorted.
fn host_xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![0u8; 1 << 16];
    let n = rustix::fs::llistxattr(path, &mut names[..]).expect("llistxattr");
    let mut out: Vec<(String, Vec<u8>)> = names[..n]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|name| {
            let name = String::from_utf8_lossy(name).into_owned();
            let mut v = vec![0u8; 1 << 16];
            let len = rustix::fs::lgetxattr(path, name.as_str(), &mut v[..]).expect("lgetxattr");
            v.truncate(len);
            (name, v)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn put_r_and_get_r_copy_extended_attributes() {
    const TEST: &str = "put_r_and_get_r_copy_extended_attributes";
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    ok(&["mkfs", &format!("file:{}?size=64M", img.display())]);
    let spec = format!("file:{}", img.display());
    let src = dir.path().join("x");
    std::fs::create_dir_all(src.join("d")).expect("mkdir");
    std::fs::write(src.join("f"), b"with attributes").expect("write");
    std::fs::write(src.join("d/plain"), b"none").expect("write");
    std::fs::write(src.join("ro"), b"read-only file").expect("write");
    std::os::unix::fs::symlink("f", src.join("link")).expect("symlink");
    let set = |rel: &str, name: &str, value: &[u8]| {
        rustix::fs::lsetxattr(src.join(rel), name, value, rustix::fs::XattrFlags::empty())
    };
    if let Err(e) = set("f", "user.probe", b"") {
        return kura_testkit::Missing::new(
            "user-xattrs",
            format!("the temporary directory's file system refuses user xattrs: {e}"),
        )
        .skip(TEST);
    }
    let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    set("f", "user.color", b"blue").expect("setxattr");
    set("f", "user.binary", &binary).expect("setxattr");
    set("d", "user.on.a.directory", b"dir value").expect("setxattr");
    set("ro", "user.kept", b"even though the mode is 0444").expect("setxattr");
    let root = kura_testkit::is_root();
    if root {
        // Only root may read or write trusted.*; a symlink may carry it (user.* it may not).
        set("f", "trusted.t", b"\x01\x02").expect("setxattr trusted");
        set("link", "trusted.on.link", b"l").expect("setxattr trusted on a symlink");
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(src.join("ro"), std::fs::Permissions::from_mode(0o444))
            .expect("chmod");
    }
    ok(&["fs", "put", &spec, src.to_str().expect("utf8"), "/", "-r"]);
    // The image holds them (kura fs stat lists names and sizes).
    let stat = ok(&["fs", "stat", &spec, "/x/f"]);
    for line in [
        "xattr: user.color (4 bytes)",
        "xattr: user.binary (3000 bytes)",
        "xattr: user.probe (0 bytes)",
    ] {
        assert!(stat.contains(line), "{line} missing from: {stat}");
    }
    let stat = ok(&["fs", "stat", &spec, "/x/d/plain"]);
    assert!(!stat.contains("xattr:"), "{stat}");
    // And back out: every file carries exactly what the source did.
    let out = dir.path().join("out");
    std::fs::create_dir(&out).expect("mkdir");
    ok(&["fs", "get", &spec, "/x", out.to_str().expect("utf8"), "-r"]);
    let back = out.join("x");
    for rel in ["f", "d", "d/plain", "ro", "link"] {
        assert_eq!(
            host_xattrs(&src.join(rel)),
            host_xattrs(&back.join(rel)),
            "xattrs of {rel}"
        );
    }
    assert_eq!(host_xattrs(&back.join("f")).len(), if root { 4 } else { 3 });
    assert!(ok(&["fsck", &spec]).contains("clean"));
}

#[test]
fn fuse_mount_copies_a_tree_in_and_out_unchanged() {
    // /dev/fuse opens and fusermount3 is installed: from here on, a mount that fails is a failure.
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip("fuse_mount_copies_a_tree_in_and_out_unchanged");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    ok(&["mkfs", &format!("file:{}?size=64M", img.display())]);
    let spec = format!("file:{}", img.display());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &[]);
    let src = dir.path().join("tree");
    make_tree(&src);
    let cp = Command::new("cp")
        .arg("-r")
        .arg(&src)
        .arg(&mnt)
        .status()
        .expect("cp");
    assert!(cp.success());
    diff_r(&src, &mnt.join("tree"));
    let sums = Command::new("sha256sum")
        .arg(src.join("sub/big.bin"))
        .arg(mnt.join("tree/sub/big.bin"))
        .output()
        .expect("sha256sum");
    let text = String::from_utf8_lossy(&sums.stdout).into_owned();
    let hashes: Vec<&str> = text.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(hashes.len(), 2);
    assert_eq!(hashes[0], hashes[1]);
    std::fs::rename(mnt.join("tree/hello.txt"), mnt.join("moved.txt")).expect("mv");
    std::fs::remove_file(mnt.join("tree/empty")).expect("rm");
    let back = dir.path().join("back");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(mnt.join("tree"))
        .arg(&back)
        .status()
        .expect("cp out");
    assert!(cp.success());
    std::fs::remove_file(src.join("hello.txt")).expect("rm");
    std::fs::remove_file(src.join("empty")).expect("rm");
    diff_r(&src, &back);
    let um = Command::new("fusermount3")
        .arg("-u")
        .arg(&mnt)
        .status()
        .expect("fusermount3");
    assert!(um.success());
    let status = server.wait().expect("kura mount exits");
    assert!(status.success(), "kura mount exit {status}");
    assert!(ok(&["fsck", &spec]).contains("clean"));
    assert_eq!(ok(&["fs", "cat", &spec, "/moved.txt"]), "hello, AccelFS\n");
}

#[test]
fn bench_fs_quick_reports_every_system_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("fs.json");
    let out = ok(&[
        "bench",
        "fs",
        "--quick",
        "--dir",
        dir.path().to_str().expect("utf8"),
        "--json",
        json.to_str().expect("utf8"),
        "--plot",
        dir.path().join("fs.png").to_str().expect("utf8"),
    ]);
    assert!(out.contains("fsync'd 4 KiB appends/s"), "{out}");
    let report = std::fs::read_to_string(&json).expect("json written");
    // The host row is named after the file system --dir is on, found by statfs as the bench does.
    let fs = kura_bench::stats::fs_name(dir.path());
    assert!(
        report.contains(&format!("\"file_system\": \"{fs}\"")),
        "{fs} not named in the report"
    );
    let host = format!("{fs} syscalls");
    for system in ["raw engine", "AccelFS", host.as_str(), "AccelFS/redirect"] {
        assert!(
            report.contains(&format!("\"system\": \"{system}\"")),
            "{system} missing from the report"
        );
    }
    assert!(report.contains("seq_read_mib_s"));
    // The work directory is cleaned up: only what we asked for is left.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("kura-bench-fs"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn bench_kv_quick_runs_leveldb_on_accelfs_and_ext4() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("kv.json");
    let out = ok(&[
        "bench",
        "kv",
        "--quick",
        "--systems",
        "accelfs,posix",
        "--workloads",
        "fillrandom,readrandom,ycsb-a",
        "--records",
        "500",
        "--ops",
        "500",
        "--dir",
        dir.path().to_str().expect("utf8"),
        "--json",
        json.to_str().expect("utf8"),
        "--plot",
        dir.path().join("kv.png").to_str().expect("utf8"),
    ]);
    assert!(out.contains("ycsb-a"), "{out}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let points = report["points"].as_array().expect("points");
    // The host store is named after the file system --dir is on (statfs), as the bench does.
    let fs = kura_bench::stats::fs_name(dir.path());
    assert_eq!(report["file_system"], fs.as_str());
    let host = format!("LevelDB/{fs}");
    for system in ["LevelDB/AccelFS", host.as_str()] {
        assert_eq!(
            points.iter().filter(|p| p["system"] == system).count(),
            3,
            "{system} ran every workload"
        );
    }
}

#[test]
fn serve_exports_a_device_to_nbdinfo_and_stops_cleanly_on_sigint() {
    let refused = kura(&["serve", "disk=mem:8M", "--listen", "0.0.0.0:0"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--insecure"));
    if let Some(m) = kura_testkit::missing_tool("nbdinfo", "apt-get install libnbd-bin") {
        return m.skip("serve_exports_a_device_to_nbdinfo_and_stops_cleanly_on_sigint");
    }
    let mut server = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args([
            "serve",
            "disk=mem:64M",
            "golden=mem:8M:ro",
            "--listen",
            "127.0.0.1:0",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kura serve");
    let mut stderr = std::io::BufReader::new(server.stderr.take().expect("stderr"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut line).expect("banner");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("nbd://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let list = Command::new("nbdinfo")
        .args(["--list", "--json", &url])
        .output()
        .expect("nbdinfo");
    let text = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(
        text.contains("\"disk\"") && text.contains("\"golden\""),
        "{text}"
    );
    assert!(text.contains("67108864"), "size of disk: {text}");
    // The export is a kura device for kura itself: write a pattern through NBD and verify it.
    let disk = format!("{url}/disk");
    ok(&["dev", "write", &disk, "--pattern", "5"]);
    ok(&["dev", "verify", &disk, "--seed", "5"]);
    let wrong = kura(&["dev", "verify", &disk, "--seed", "6"]);
    assert!(
        !wrong.status.success(),
        "a different pattern does not verify"
    );
    let ro = kura(&["dev", "write", &format!("{url}/golden"), "--pattern", "1"]);
    assert!(!ro.status.success(), "the read-only export refuses writes");
    let kill = Command::new("kill")
        .args(["-INT", &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = server.wait().expect("exit");
    assert!(status.success(), "kura serve exit {status}");
}

#[test]
fn composite_specs_work_in_every_command() {
    // A mirror of a stripe and a write-back cache: write a pattern, verify it, and see the
    // layers named.
    let spec = "mirror(stripe(mem:16M,mem:16M),cache(mem:32M)?mode=wb)";
    ok(&["dev", "write", spec, "--pattern", "9"]);
    let info = ok(&["dev", "info", spec]);
    assert!(info.contains("mirror") && info.contains("stripe"), "{info}");
    let bad = kura(&["dev", "info", "strip(mem:16M,mem:16M)"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("stripe"),
        "did-you-mean names the right kind"
    );
}
