//! POSIX through a real `kura mount` (issue 14 item 1), with the ordinary tools a user would
//! reach for: `ln -s`, `ln`, `mkfifo`, `mknod`, `setfattr`/`getfattr`, `renameat2` with
//! `RENAME_EXCHANGE` and `RENAME_NOREPLACE` (through Python's ctypes: coreutils here has no
//! `mv --exchange`), `fallocate` and `fallocate -p`, `touch -d` with nanoseconds, `chown`, `>>`
//! and `>` (O_APPEND, O_TRUNC), `df`; then `/usr/share/doc` (symlinks included) through tar
//! into the mount and `tar --compare` against the archive, after a remount too; after unmount
//! `kura fsck` is clean.

mod common;

use common::{ok, start_mount, MountGuard};
use std::path::Path;
use std::process::Command;

/// Runs `script` with `sh -e` in `dir`; it must succeed; its stdout.
fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "`{script}` failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn unmount(server: &mut std::process::Child, mnt: &Path) {
    let status = common::unmount(server, mnt);
    assert!(status.success(), "kura mount exit {status}");
}

/// Python that calls `renameat2(AT_FDCWD, a, AT_FDCWD, b, flags)` and prints 0 or the errno.
const RENAMEAT2: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
r = libc.renameat2(-100, sys.argv[1].encode(), -100, sys.argv[2].encode(), int(sys.argv[3]))
print(0 if r == 0 else ctypes.get_errno())
"#;

#[test]
fn posix_tools_and_a_tar_round_trip_work_on_a_mount() {
    const TEST: &str = "posix_tools_and_a_tar_round_trip_work_on_a_mount";
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip(TEST);
    }
    for (tool, pkg) in [
        ("setfattr", "attr"),
        ("getfattr", "attr"),
        ("tar", "tar"),
        ("python3", "python3"),
        ("fallocate", "util-linux"),
    ] {
        if let Some(m) = kura_testkit::missing_tool(tool, pkg) {
            return m.skip(TEST);
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    ok(&["mkfs", &format!("file:{}?size=1G", img.display())]);
    let spec = format!("file:{}", img.display());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &[]);
    let _guard = MountGuard(&mnt);

    // Symbolic links (fast and slow), hard links, FIFOs, device nodes.
    let long = "t".repeat(300);
    sh(
        &mnt,
        &format!(
            "echo hello > f; ln -s f short; ln -s {long} long; mkdir d; ln f d/hard; \
             mkfifo fifo; mknod chr c 1 3"
        ),
    );
    assert_eq!(sh(&mnt, "readlink short"), "f\n");
    assert_eq!(sh(&mnt, "readlink long"), format!("{long}\n"));
    assert_eq!(sh(&mnt, "cat short"), "hello\n", "the kernel follows it");
    assert_eq!(
        sh(&mnt, "stat -c %h f; stat -c %i f d/hard | uniq | wc -l"),
        "2\n1\n"
    );
    assert_eq!(
        sh(&mnt, "stat -c %F fifo chr short"),
        "fifo\ncharacter special file\nsymbolic link\n"
    );
    assert_eq!(sh(&mnt, "stat -c %t,%T chr"), "1,3\n");
    // Extended attributes.
    sh(
        &mnt,
        "setfattr -n user.color -v blue f; setfattr -n trusted.t -v 0x0102 f; \
         setfattr -n user.gone -v x f; setfattr -x user.gone f",
    );
    assert_eq!(sh(&mnt, "getfattr --only-values -n user.color f"), "blue");
    let dump = sh(&mnt, "getfattr -d -m - f");
    assert!(
        dump.contains("user.color=\"blue\"") && dump.contains("trusted.t=0sAQI="),
        "{dump}"
    );
    assert!(!dump.contains("user.gone"), "{dump}");
    let missing = Command::new("getfattr")
        .args(["-n", "user.none", "f"])
        .current_dir(&mnt)
        .output()
        .expect("getfattr");
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("No such attribute"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );
    // renameat2: exchange, then noreplace refused.
    std::fs::write(dir.path().join("renameat2.py"), RENAMEAT2).expect("write script");
    let py = dir.path().join("renameat2.py");
    let py = py.display();
    sh(&mnt, "echo other > g");
    assert_eq!(sh(&mnt, &format!("python3 {py} f g 2")), "0\n");
    assert_eq!(sh(&mnt, "cat f g"), "other\nhello\n");
    assert_eq!(
        sh(&mnt, &format!("python3 {py} f g 1")),
        format!("{}\n", 17),
        "RENAME_NOREPLACE onto an existing name is EEXIST"
    );
    assert_eq!(sh(&mnt, &format!("python3 {py} f fresh 1")), "0\n");
    // fallocate and punch hole.
    sh(
        &mnt,
        "fallocate -l 1M pre; head -c 1048576 /dev/zero | tr '\\0' 'z' > punched",
    );
    assert_eq!(sh(&mnt, "stat -c %s pre"), "1048576\n");
    sh(&mnt, "fallocate -p -o 65536 -l 131072 punched");
    let punched = std::fs::read(mnt.join("punched")).expect("read");
    assert_eq!(punched.len(), 1 << 20);
    assert!(
        punched[65536..196608].iter().all(|&b| b == 0),
        "hole reads zero"
    );
    assert!(punched[..65536].iter().all(|&b| b == b'z'));
    assert!(punched[196608..].iter().all(|&b| b == b'z'));
    let blocks: u64 = sh(&mnt, "stat -c %b punched")
        .trim()
        .parse()
        .expect("blocks");
    assert_eq!(
        blocks,
        (1 << 20) / 512 - 131072 / 512,
        "the hole holds no blocks"
    );
    // Times with nanoseconds, owners, O_APPEND, O_TRUNC, statfs.
    sh(
        &mnt,
        "touch -d '2001-02-03 04:05:06.123456789' g; chown 1234:5678 g",
    );
    assert_eq!(
        sh(&mnt, "stat -c '%y|%x|%u:%g' g"),
        "2001-02-03 04:05:06.123456789 +0000|2001-02-03 04:05:06.123456789 +0000|1234:5678\n"
    );
    assert_eq!(sh(&mnt, "echo a > t; echo b >> t; cat t"), "a\nb\n");
    assert_eq!(sh(&mnt, "echo c > t; cat t"), "c\n");
    let df = sh(&mnt, "df -P . | tail -1");
    assert!(df.contains("kura:"), "{df}");

    // A tree with symlinks, through tar, compared against the archive.
    let archive = dir.path().join("doc.tar");
    let archive = archive.display();
    sh(dir.path(), &format!("tar -cf {archive} -C /usr/share doc"));
    sh(&mnt, &format!("tar -xpf {archive}"));
    sh(&mnt, &format!("tar --compare -f {archive}"));
    let links = sh(&mnt, "find doc -type l | wc -l");
    let want = sh(Path::new("/usr/share"), "find doc -type l | wc -l");
    assert_eq!(links, want, "every symlink arrived");
    unmount(&mut server, &mnt);
    let report = ok(&["fsck", &spec]);
    assert!(report.contains("clean"), "{report}");

    // Everything is still there after a remount.
    let mut server = start_mount(&spec, &mnt, &[]);
    sh(&mnt, &format!("tar --compare -f {archive}"));
    assert_eq!(sh(&mnt, "readlink long"), format!("{long}\n"));
    assert_eq!(sh(&mnt, "getfattr --only-values -n user.color g"), "blue");
    assert_eq!(sh(&mnt, "stat -c '%u:%g' g"), "1234:5678\n");
    sh(&mnt, "rm fresh d/hard short long fifo chr");
    unmount(&mut server, &mnt);
    let report = ok(&["fsck", &spec]);
    assert!(report.contains("clean"), "{report}");
}
