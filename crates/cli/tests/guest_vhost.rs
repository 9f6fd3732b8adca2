//! kura as the disks of an unmodified virtual machine (issue 24): `kura serve --vhost-user` runs on
//! the host, and one QEMU guest (`scripts/nvme-vm/init-vhost`, guest RAM in a shared memfd) sees
//! six virtio-blk disks through `vhost-user-blk-pci`, each found by its serial (the export name):
//!
//! - `file` (`file:`), `mirror` (`mirror(file:,file:)`), `snap` (the head of a
//!   `snapshot(file:)` drive) and `remote` (`remote:` to a kura NBD export served by a second
//!   `kura serve` on the host): in the guest, in parallel, mkfs.ext4, a tree written, read back
//!   after a remount, files removed and fstrim'd, fsck.ext4 -f -n; on the host after power-off
//!   and SIGTERM (kura flushes and exits 0): each image (both legs of the mirror, which must be
//!   equal; the snapshot head read back through kura) is a clean ext4 holding the files with the
//!   checksums the guest printed.
//! - `golden`, a read-only export (`:ro`) of an ext4 made on the host: the guest sees ro=1, a
//!   direct write fails, it mounts read-only with the host's files; the image is unchanged.
//! - `stream`, served by a third `kura serve`: the guest writes numbered 4 KiB records with
//!   O_DIRECT, one at a time, printing `ACK N` for each one acknowledged; the test kills that
//!   `kura serve` (SIGKILL) in the middle of the stream and starts another on the same socket,
//!   QEMU reconnects (`reconnect=1`), the stream goes on; after power-off every acknowledged
//!   record is in the image.
//!
//! Skips visibly where the host cannot boot a guest (see `kura_nvme_guest`) or lacks e2fsprogs.
//! The guest is bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 300).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TEST: &str = "vhost_user_blk_disks_serve_an_unmodified_guest";

/// Records the guest's write stream has; the backend is restarted after `KILL_AT`.
const RECORDS: usize = 400;
const KILL_AT: usize = 120;

/// The disks that get an ext4 round trip in the guest.
const FS_DISKS: [&str; 4] = ["file", "mirror", "snap", "remote"];

/// `tool` on PATH or in /usr/sbin and /sbin.
fn find_tool(tool: &str) -> Result<PathBuf, kura_testkit::Missing> {
    kura_testkit::which(tool)
        .or_else(|| {
            ["/usr/sbin", "/sbin"]
                .iter()
                .map(|d| Path::new(d).join(tool))
                .find(|p| p.exists())
        })
        .ok_or_else(|| {
            kura_testkit::Missing::new(
                tool,
                format!("{tool} not found (apt-get install e2fsprogs)"),
            )
        })
}

/// Runs a host tool and fails the test with its output when it fails.
fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("run a host tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A running `kura serve`, its stderr in a file; killed when dropped.
struct Serve {
    child: Child,
    log: PathBuf,
}

impl Serve {
    /// Starts `kura serve ARGS` and waits until `ready` says it serves.
    fn start(args: &[String], log: &Path, ready: impl Fn() -> bool) -> Serve {
        let child = Command::new(env!("CARGO_BIN_EXE_kura"))
            .arg("serve")
            .args(args)
            .stderr(std::fs::File::create(log).expect("create the serve log"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start kura serve");
        let mut serve = Serve {
            child,
            log: log.to_path_buf(),
        };
        let start = Instant::now();
        while !ready() {
            if let Ok(Some(st)) = serve.child.try_wait() {
                panic!("kura serve {args:?} exited ({st}): {}", serve.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "kura serve {args:?} is not serving: {}",
                serve.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        serve
    }

    /// `kura serve --vhost-user NAME=SPEC ...` with one socket per export in `dir`.
    fn vhost(exports: &[(&str, String)], dir: &Path, log: &Path) -> Serve {
        let mut args = Vec::new();
        for (name, spec) in exports {
            let _ = std::fs::remove_file(socket(dir, name));
            args.push("--vhost-user".to_string());
            args.push(format!("{name}={spec}"));
        }
        args.push("--socket".into());
        args.push(dir.join("{name}.sock").display().to_string());
        args.push("--vhost-queues".into());
        args.push("2".into());
        Serve::start(&args, log, || {
            exports.iter().all(|(name, _)| socket(dir, name).exists())
        })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM and a bounded wait: kura answers what is in flight, flushes and exits 0.
    fn stop(mut self) -> String {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
        let start = Instant::now();
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                break st;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "kura serve did not stop: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = self.log_text();
        assert!(status.success(), "kura serve exited {status}: {log}");
        assert!(log.contains("kura: stopped; every export flushed"), "{log}");
        log
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn socket(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.sock"))
}

/// QEMU's arguments for the vhost-user-blk disks: guest RAM (run.sh's 1 GiB) in a shared memfd,
/// so kura can map the virtqueues, and per disk a chardev that reconnects when its backend
/// restarts.
fn qemu_args(dir: &Path, names: &[&str]) -> String {
    let mut args =
        "-object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem".to_string();
    for (i, name) in names.iter().enumerate() {
        args.push_str(&format!(
            " -chardev socket,id=vhu{i},path={},reconnect=1 \
             -device vhost-user-blk-pci,chardev=vhu{i},num-queues=2",
            socket(dir, name).display()
        ));
    }
    args
}

/// The `GUEST disk NAME ...` line the guest printed for a disk.
fn disk_line<'a>(run: &'a kura_nvme_guest::GuestRun, name: &str) -> &'a str {
    let prefix = format!("GUEST disk {name} ");
    run.console
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("the guest described disk {name}"))
}

/// A `key=value` field of a disk line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("{key} in {line}"))
}

/// The `sha256sum` lines the guest printed between two markers.
fn guest_sums(run: &kura_nvme_guest::GuestRun, begin: &str, end: &str) -> String {
    run.between(begin, end)
        .unwrap_or_else(|| panic!("the guest printed {begin}"))
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The image is a clean ext4 holding the files with the checksums the guest printed.
fn check_image(image: &Path, sums: &str, work: &Path, fsck: &Path, debugfs: &Path) {
    run_ok(Command::new(fsck).args(["-f", "-n"]).arg(image));
    let tree = work.join("tree");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree).expect("make the dump directory");
    run_ok(
        Command::new(debugfs)
            .arg("-R")
            .arg(format!("rdump / {}", tree.display()))
            .arg(image),
    );
    std::fs::write(work.join("sums"), sums).expect("write the checksums");
    let check = Command::new("sha256sum")
        .args(["-c", "--strict", "--quiet"])
        .arg(work.join("sums"))
        .current_dir(&tree)
        .output()
        .expect("run sha256sum");
    assert!(
        check.status.success(),
        "{}: the files differ from what the guest wrote: {}{}",
        image.display(),
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

/// The `ACK N` lines the guest printed, in order.
fn acknowledged(console: &str) -> Vec<usize> {
    console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("ACK "))
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

/// sha256 of a file, by the host's sha256sum.
fn sha256(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A loopback TCP port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

#[test]
fn vhost_user_blk_disks_serve_an_unmodified_guest() {
    let (mkfs, fsck, debugfs) = match (
        find_tool("mkfs.ext4"),
        find_tool("fsck.ext4"),
        find_tool("debugfs"),
    ) {
        (Ok(m), Ok(f), Ok(d)) => (m, f, d),
        (Err(missing), _, _) | (_, Err(missing), _) | (_, _, Err(missing)) => {
            return missing.skip(TEST)
        }
    };
    let kura = env!("CARGO_BIN_EXE_kura");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let img = |name: &str| w.join(format!("{name}.img"));
    let file = |name: &str| format!("file:{}?size=64M", img(name).display());

    // The read-only disk: an ext4 made on the host from a small tree.
    let golden_tree = w.join("golden-tree");
    std::fs::create_dir_all(&golden_tree).expect("golden tree");
    for (i, len) in [1usize, 5000, 300_000].iter().enumerate() {
        let data: Vec<u8> = (0..*len).map(|j| (j * 31 + i * 7) as u8).collect();
        std::fs::write(golden_tree.join(format!("g{i}")), data).expect("golden file");
    }
    run_ok(
        Command::new(&mkfs)
            .args(["-q", "-F", "-b", "4096", "-d"])
            .arg(&golden_tree)
            .arg(img("golden"))
            .arg("16M"),
    );
    let golden_sha = sha256(&img("golden"));
    // The snapshot drive is formatted before it is served, as `kura drive` documents.
    run_ok(Command::new(kura).args(["drive", "format", &file("snap")]));

    // A second kura serve exports an image over NBD for the `remote:` disk.
    let port = free_port();
    let nbd = Serve::start(
        &[
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            format!("r={}", file("remote")),
        ],
        &w.join("nbd.log"),
        || TcpStream::connect(("127.0.0.1", port)).is_ok(),
    );
    let exports = [
        ("file", file("file")),
        (
            "mirror",
            format!("mirror({},{})", file("mirror-a"), file("mirror-b")),
        ),
        ("snap", format!("snapshot(file:{})", img("snap").display())),
        ("remote", format!("remote:127.0.0.1:{port}/r")),
        ("golden", format!("file:{}:ro", img("golden").display())),
    ];
    let main = Serve::vhost(&exports, w, &w.join("vhost.log"));
    let stream_export = [("stream", file("stream"))];
    let first = Serve::vhost(&stream_export, w, &w.join("stream-1.log"));

    let mut names: Vec<&str> = exports.iter().map(|(n, _)| *n).collect();
    names.push("stream");
    // run.sh reads QEMU's extra arguments from the environment; this is the only test here.
    std::env::set_var("KURA_VM_QEMU_ARGS", qemu_args(w, &names));
    let console = std::env::temp_dir()
        .join(format!("kura-nvme-vm-init-vhost-{}", std::process::id()))
        .join("console.log");
    let _ = std::fs::remove_file(&console);
    let guest = {
        let bins: Vec<PathBuf> = vec![mkfs.clone(), fsck.clone()];
        std::thread::spawn(move || {
            let bins: Vec<&Path> = bins.iter().map(PathBuf::as_path).collect();
            // no_timer_check: the kernel's check of the timer through the remapped IO-APIC
            // times out now and then under TCG on a busy host and panics the boot.
            let append = format!(
                "no_timer_check kura_vhost_fs={} kura_vhost_ro=golden kura_vhost_stream=stream \
                 kura_vhost_records={RECORDS}",
                FS_DISKS.join(",")
            );
            let limit = kura_nvme_guest::time_limit(300);
            kura_nvme_guest::boot("init-vhost", &bins, limit, &append)
        })
    };

    // The stream's backend is killed in the middle and restarted.
    let start = Instant::now();
    let acked_before_kill = loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        let acked = acknowledged(&text);
        if acked.len() > KILL_AT || guest.is_finished() {
            break acked.len();
        }
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "the guest's stream did not start; console: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut first = first;
    first.child.kill().expect("kill kura serve");
    let _ = first.child.wait();
    std::thread::sleep(Duration::from_millis(500));
    eprintln!("stream's kura serve killed after {acked_before_kill} acknowledged records");
    let second = Serve::vhost(&stream_export, w, &w.join("stream-2.log"));

    let run = match guest.join().expect("the guest thread") {
        Ok(run) => run,
        Err(why) if why.starts_with("cannot start") => panic!("{why}"),
        Err(why) => return kura_testkit::skip(TEST, "nvme-guest", &why),
    };
    eprintln!(
        "{}",
        run.summary()
            .lines()
            .filter(|l| !l.starts_with("ACK"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("guest run took {:.1} s", run.took.as_secs_f64());
    let main_log = main.stop();
    eprintln!("kura serve --vhost-user: {main_log}");
    let nbd_log = nbd.stop();
    eprintln!("kura serve (NBD for remote:): {nbd_log}");
    let stream_log = second.stop();
    eprintln!("second stream kura serve: {stream_log}");

    // The guest's verdict.
    let log_at = run.dir.join("console.log");
    assert_eq!(
        run.status,
        Some(0),
        "QEMU failed or timed out; log in {}",
        log_at.display()
    );
    assert!(
        !run.console.contains("FAIL ") && run.console.contains("GUEST-RESULT vhost pass"),
        "a guest step failed; log in {}",
        log_at.display()
    );
    for name in &names {
        let line = disk_line(&run, name);
        // GET_ID answered the export's name: the disk is kura's.
        assert_eq!(field(line, "serial"), *name, "{line}");
        assert_eq!(field(line, "hwq"), "2", "{line}");
        assert_eq!(field(line, "lbs"), "4096", "{line}");
        let ro = *name == "golden";
        assert_eq!(field(line, "ro"), if ro { "1" } else { "0" }, "{line}");
        if !ro {
            assert_ne!(field(line, "discard_max"), "0", "discard offered: {line}");
            assert_ne!(field(line, "write_zeroes_max"), "0", "{line}");
            assert_eq!(field(line, "max_discard_segments"), "32", "{line}");
        }
    }
    // Zero copy is on by default: the ext4 round trip on `file` moved requests whose data is one
    // page in place in guest memory (so the checksums compared below are of data that went
    // both ways with no copy), and the rest through pool buffers.
    let vhost_layer = main_log
        .lines()
        .find(|l| l.contains("export file: vhost "))
        .unwrap_or_else(|| panic!("no vhost counters for export file: {main_log}"));
    let counter = |name: &str| -> u64 {
        vhost_layer
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {vhost_layer}"))
    };
    assert_eq!(counter("zero_copy"), 1, "{vhost_layer}");
    assert!(counter("zero_copy_reads") > 0, "{vhost_layer}");
    assert!(counter("zero_copy_writes") > 0, "{vhost_layer}");
    let refused = run
        .console
        .lines()
        .find(|l| l.starts_with("PASS golden: a direct write is refused"))
        .expect("the guest tried to write the read-only disk");
    assert!(
        [
            "Operation not permitted",
            "Read-only file system",
            "I/O error"
        ]
        .iter()
        .any(|e| refused.contains(e)),
        "the write failed with EPERM, EROFS or EIO: {refused}"
    );

    // Every fs disk's image is a clean ext4 with the guest's files.
    for name in FS_DISKS {
        let sums = guest_sums(
            &run,
            &format!("GUEST-SUMS-BEGIN {name}"),
            &format!("GUEST-SUMS-END {name}"),
        );
        let images = match name {
            "mirror" => vec![img("mirror-a"), img("mirror-b")],
            // The snapshot head, read back through kura.
            "snap" => {
                let sectors: u64 = field(disk_line(&run, name), "sectors")
                    .parse()
                    .expect("sectors");
                let head = w.join("snap-head.img");
                run_ok(
                    Command::new(kura)
                        .args(["dev", "read"])
                        .arg(format!("snapshot(file:{})", img("snap").display()))
                        .args(["--blocks", &(sectors / 8).to_string(), "--out"])
                        .arg(&head),
                );
                vec![head]
            }
            _ => vec![img(name)],
        };
        for image in &images {
            check_image(image, &sums, w, &fsck, &debugfs);
        }
        if images.len() == 2 {
            let (x, y) = (std::fs::read(&images[0]), std::fs::read(&images[1]));
            assert!(
                x.expect("leg a") == y.expect("leg b"),
                "the mirror's legs are equal"
            );
        }
    }

    // The read-only disk: the guest read the host's files, and nothing changed the image.
    let ro_sums = guest_sums(&run, "GUEST-RO-SUMS-BEGIN", "GUEST-RO-SUMS-END");
    let check = Command::new("sha256sum")
        .args(["-c", "--strict", "--quiet"])
        .current_dir(&golden_tree)
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .expect("stdin")
                .write_all(ro_sums.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run sha256sum");
    assert!(
        check.status.success() && ro_sums.lines().count() == 3,
        "the guest read the read-only disk's files: {ro_sums} {check:?}"
    );
    assert_eq!(
        sha256(&img("golden")),
        golden_sha,
        "the read-only image is unchanged"
    );
    run_ok(Command::new(&fsck).args(["-f", "-n"]).arg(img("golden")));

    // The restarted stream.
    assert!(
        acked_before_kill > KILL_AT && acked_before_kill < RECORDS,
        "the backend was killed in the middle of the stream ({acked_before_kill} acknowledged)"
    );
    assert!(
        stream_log.contains("hypervisor connected"),
        "QEMU reconnected to the restarted kura serve: {stream_log}"
    );
    let acked = acknowledged(&run.console);
    assert_eq!(
        acked,
        (0..RECORDS).collect::<Vec<_>>(),
        "every record acknowledged in order"
    );
    let data = std::fs::read(img("stream")).expect("read the image");
    for n in acked {
        let want = format!("KURA-REC {n:08}\n");
        let got = &data[n * 4096..n * 4096 + want.len()];
        assert_eq!(
            got,
            want.as_bytes(),
            "acknowledged record {n} is in the image (restart after {acked_before_kill})"
        );
    }
}
