//! The `kura` binary as a user runs it: device tools round-trip data, mistakes get clear errors.

mod common;

use common::{kura, text};

#[test]
fn create_write_verify_read_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("file:{}/a.img?size=4M", dir.path().display());
    let o = kura(&["dev", "create", &spec, "--fill", "--seed", "5"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("1024 blocks of 4096 bytes"),
        "{}",
        text(&o)
    );
    let o = kura(&["dev", "verify", &spec, "--seed", "5"]);
    assert!(
        o.status.success() && text(&o).contains("all hold pattern 5"),
        "{}",
        text(&o)
    );

    let o = kura(&["dev", "verify", &spec, "--seed", "6"]);
    assert!(
        !o.status.success() && text(&o).contains("MISMATCH"),
        "wrong seed must fail: {}",
        text(&o)
    );

    let o = kura(&[
        "dev",
        "write",
        &spec,
        "--lba",
        "10",
        "--blocks",
        "3",
        "--pattern",
        "9",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = kura(&["dev", "verify", &spec, "--seed", "5"]);
    assert!(
        text(&o).contains("3 of 1024 block(s) differ") && text(&o).contains("first at LBA 10"),
        "{}",
        text(&o)
    );

    let input = dir.path().join("in.bin");
    std::fs::write(&input, vec![0xabu8; 8192]).unwrap();
    let o = kura(&[
        "dev",
        "write",
        &spec,
        "--lba",
        "2",
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = dir.path().join("out.bin");
    let o = kura(&[
        "dev",
        "read",
        &spec,
        "--lba",
        "2",
        "--blocks",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&out).unwrap(), vec![0xabu8; 8192]);
    let o = kura(&["dev", "read", &spec, "--lba", "2"]);
    assert!(text(&o).contains("ab ab ab ab"), "hex dump: {}", text(&o));
}

#[test]
fn mistakes_get_clear_errors_and_a_failing_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, [1u8; 100]).unwrap();
    let img = format!("file:{}/b.img?size=1M", dir.path().display());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["dev".into(), "info".into(), "mme:4M".into()],
            "did you mean `mem`",
        ),
        (
            vec!["dev".into(), "info".into(), "mem:4M?qdd=1".into()],
            "did you mean `qd`",
        ),
        (
            vec![
                "dev".into(),
                "read".into(),
                "mem:4M".into(),
                "--lba".into(),
                "5000".into(),
            ],
            "out of range",
        ),
        (
            vec!["dev".into(), "write".into(), img.clone()],
            "--input FILE or --pattern SEED",
        ),
        (
            vec![
                "dev".into(),
                "write".into(),
                img.clone(),
                "--input".into(),
                odd.display().to_string(),
            ],
            "not a whole number",
        ),
        (
            vec![
                "dev".into(),
                "verify".into(),
                img,
                "--lba".into(),
                "300".into(),
            ],
            "does not fit",
        ),
        (
            vec![
                "dev".into(),
                "info".into(),
                format!("sync:{}/missing.img", dir.path().display()),
            ],
            "No such file",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = kura(&args);
        assert!(!o.status.success(), "{args:?} should fail");
        assert!(
            text(&o).contains(want),
            "{args:?}: `{}` should mention `{want}`",
            text(&o)
        );
        assert!(!text(&o).contains("panicked"), "{args:?} panicked");
    }
}

#[test]
fn every_subcommand_explains_itself() {
    for args in [
        vec!["--help"],
        vec!["dev", "--help"],
        vec!["dev", "write", "--help"],
        vec!["bench", "io", "--help"],
        vec!["demo", "--help"],
        vec!["fs", "--help"],
        vec!["fs", "put", "--help"],
        vec!["mount", "--help"],
        vec!["mkfs", "--help"],
    ] {
        let o = kura(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("Usage"), "{args:?}");
    }
    let o = kura(&["specs"]);
    assert!(text(&o).contains("redirect:PATH") && text(&o).contains("fault(SPEC)"));
}

#[test]
fn demo_runs_end_to_end_on_a_small_image() {
    let o = kura(&[
        "demo",
        "--size",
        "8M",
        "--reads",
        "200",
        "--genome-reads",
        "2000",
        "--genome-paths",
        "accelfs,redirect",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("all hold pattern 42"), "{t}");
    assert!(t.contains("system calls"), "{t}");
    // The genome pipeline ran on both paths, printed every stage and scored its placements.
    for needle in [
        "path accelfs",
        "path redirect",
        "load index",
        "match",
        "reduction",
    ] {
        assert!(t.contains(needle), "missing `{needle}`: {t}");
    }
    let line = t
        .lines()
        .find(|l| l.contains("placed correctly"))
        .unwrap_or_else(|| panic!("no accuracy line: {t}"));
    let correct: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        correct >= 1900,
        "2000 simulated reads, {correct} placed correctly: {line}"
    );
}

#[test]
fn mkfs_then_fsck_is_clean_and_damage_fails_fsck() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let spec = format!("file:{}?size=32M", img.display());
    let o = kura(&["mkfs", &spec]);
    assert!(o.status.success(), "{}", text(&o));
    let o = kura(&["fsck", &spec]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("clean"), "{}", text(&o));
    // Damage the inode table (right after the superblock, journal and bitmaps).
    let mut bytes = std::fs::read(&img).unwrap();
    let journal_blocks = 64; // 32 MiB / 8 KiB / 64, clamped to at least 64
    let at = (1 + journal_blocks + 2) * 8192 + 500;
    bytes[at] ^= 0xff;
    std::fs::write(&img, &bytes).unwrap();
    let o = kura(&["fsck", &spec]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("PROBLEM"), "{}", text(&o));
    let o = kura(&["fsck", "--repair", &spec]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("FIXED"), "{}", text(&o));
    let o = kura(&["fsck", &spec]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "repaired image is clean: {}",
        text(&o)
    );
    let o = kura(&["fsck", "mem:16M"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no AccelFS"), "{}", text(&o));
    let o = kura(&["mkfs", "mem:16M", "--block-size", "3K"]);
    assert!(
        !o.status.success() && text(&o).contains("power of two"),
        "{}",
        text(&o)
    );
}

#[test]
fn nvme_kinds_open_through_the_cli() {
    let o = kura(&["dev", "info", "nvme-sim:16M"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("nvme:sim"), "{}", text(&o));
    let o = kura(&["dev", "info", "nvme:0000:ff:1f.7"]);
    assert!(
        !o.status.success(),
        "no such controller must fail: {}",
        text(&o)
    );
    let o = kura(&["specs"]);
    assert!(text(&o).contains("nvme-pt:/dev/ngXnY"), "{}", text(&o));
}

#[test]
fn nvme_tools_list_identify_and_refuse_a_mounted_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let sys = tmp.path().join("sys");
    let dev = sys.join("bus/pci/devices/0000:00:04.0");
    std::fs::create_dir_all(dev.join("nvme/nvme0/nvme0n1")).unwrap();
    std::fs::create_dir_all(sys.join("bus/pci/drivers/nvme")).unwrap();
    std::fs::write(dev.join("class"), "0x010802\n").unwrap();
    std::fs::write(dev.join("vendor"), "0x1b36\n").unwrap();
    std::fs::write(dev.join("device"), "0x0010\n").unwrap();
    std::os::unix::fs::symlink(sys.join("bus/pci/drivers/nvme"), dev.join("driver")).unwrap();
    let mounts = tmp.path().join("mounts");
    std::fs::write(&mounts, "/dev/nvme0n1p1 /data ext4 rw 0 0\n").unwrap();
    let (s, m) = (sys.to_str().unwrap(), mounts.to_str().unwrap());
    let o = kura(&["nvme", "list", "--sysfs", s, "--mounts", m]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains("0000:00:04.0") && t.contains("0x1b36:0x0010") && t.contains("nvme0n1"),
        "{t}"
    );
    let o = kura(&["nvme", "bind", "0000:00:04.0", "--sysfs", s, "--mounts", m]);
    assert!(!o.status.success());
    assert!(text(&o).contains("mounted"), "{}", text(&o));
    let o = kura(&["nvme", "bind", "0000:00:09.0", "--sysfs", s, "--mounts", m]);
    assert!(!o.status.success());
    assert!(text(&o).contains("no NVMe controller"), "{}", text(&o));
    let o = kura(&["nvme", "identify", "nvme-sim:16M"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("32768 blocks of 512 bytes"),
        "{}",
        text(&o)
    );
    let o = kura(&["nvme", "identify", "mem:1M"]);
    assert!(!o.status.success());
}
