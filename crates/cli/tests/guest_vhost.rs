//! kura as the disk of an unmodified virtual machine (issue 24): `kura serve --vhost-user` runs on
//! the host serving an image file, and a QEMU guest (`scripts/nvme-vm/init-vhost`, guest RAM in
//! a shared memfd) sees it as the virtio-blk disk `/dev/vda` through `vhost-user-blk-pci`.
//!
//! - `file:` and `mirror(file:,file:)`: in the guest, mkfs.ext4, a tree written, read back after
//!   a remount, files removed and fstrim'd, fsck.ext4 -f -n; on the host after power-off and
//!   SIGTERM (kura flushes and exits 0): the image (each leg of the mirror, which must be equal)
//!   is a clean ext4 holding the files with the checksums the guest printed.
//! - A backend restart: the guest writes numbered 4 KiB records with O_DIRECT, one at a time,
//!   printing `ACK N` for each one acknowledged; the test kills `kura serve` (SIGKILL) in the
//!   middle of the stream and starts another on the same socket, QEMU reconnects
//!   (`reconnect=1`), the stream goes on; after power-off every acknowledged record is in the
//!   image.
//!
//! Skips visibly where the host cannot boot a guest (see `kura_nvme_guest`) or lacks e2fsprogs.
//! Each guest is bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 120).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TEST: &str = "vhost_user_blk_disk_serves_an_unmodified_guest";

/// Records the guest's write stream has; the backend is restarted after `KILL_AT`.
const RECORDS: usize = 400;
const KILL_AT: usize = 120;

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

/// A running `kura serve --vhost-user disk=SPEC`, its stderr in a file; killed when dropped.
struct Backend {
    child: Child,
    log: PathBuf,
}

impl Backend {
    fn start(spec: &str, socket: &Path, log: &Path) -> Backend {
        let _ = std::fs::remove_file(socket);
        let child = Command::new(env!("CARGO_BIN_EXE_kura"))
            .args(["serve", "--vhost-user"])
            .arg(format!("disk={spec}"))
            .arg("--socket")
            .arg(socket)
            .stderr(std::fs::File::create(log).expect("create the serve log"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start kura serve");
        let mut backend = Backend {
            child,
            log: log.to_path_buf(),
        };
        let start = Instant::now();
        while !socket.exists() {
            if let Ok(Some(st)) = backend.child.try_wait() {
                panic!("kura serve exited ({st}): {}", backend.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "kura serve made no socket: {}",
                backend.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        backend
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

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// QEMU's arguments for the vhost-user-blk disk: guest RAM (run.sh's 1 GiB) in a shared memfd,
/// so kura can map the virtqueues, and a chardev that reconnects when the backend restarts.
fn qemu_args(socket: &Path) -> String {
    format!(
        "-object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
         -chardev socket,id=vhu,path={},reconnect=1 \
         -device vhost-user-blk-pci,chardev=vhu,num-queues=2",
        socket.display()
    )
}

fn boot(bins: &[&Path], append: &str) -> Result<kura_nvme_guest::GuestRun, String> {
    let limit = kura_nvme_guest::time_limit(120);
    let passed = |run: &kura_nvme_guest::GuestRun| {
        run.status == Some(0)
            && !run.console.contains("FAIL ")
            && run.console.contains("GUEST-RESULT vhost pass")
    };
    kura_nvme_guest::boot_passing("init-vhost", bins, limit, append, passed)
}

/// The guest's verdict: it passed, and the disk it saw was kura's (GET_ID answered the export's
/// name), with the discard and write-zeroes support kura offers.
fn check_guest(run: &kura_nvme_guest::GuestRun, what: &str) {
    let log_at = run.dir.join("console.log");
    assert_eq!(
        run.status,
        Some(0),
        "{what}: QEMU failed or timed out; log in {}",
        log_at.display()
    );
    assert!(
        !run.console.contains("FAIL ") && run.console.contains("GUEST-RESULT vhost pass"),
        "{what}: a guest step failed; log in {}",
        log_at.display()
    );
    let line = run
        .console
        .lines()
        .find(|l| l.starts_with("GUEST vda "))
        .expect("the guest described its disk");
    for want in ["serial=disk", "ro=0", "hwq=2", "lbs=4096"] {
        assert!(line.contains(want), "{what}: {want} in {line}");
    }
    assert!(
        !line.contains("discard_max=0 "),
        "{what}: discard offered: {line}"
    );
    assert!(
        !line.contains("write_zeroes_max=0 "),
        "{what}: write-zeroes offered: {line}"
    );
}

/// The guest's `sha256sum` lines for the tree.
fn guest_sums(run: &kura_nvme_guest::GuestRun) -> String {
    run.between("GUEST-SUMS-BEGIN", "GUEST-SUMS-END")
        .expect("the guest printed the tree's checksums")
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The image is a clean ext4 holding the files with the checksums the guest printed.
fn check_image(image: &Path, sums: &str, work: &Path, fsck: &Path, debugfs: &Path) {
    let out = Command::new(fsck)
        .args(["-f", "-n"])
        .arg(image)
        .output()
        .expect("run fsck.ext4 on the host");
    assert!(
        out.status.success(),
        "host fsck.ext4 -f -n {}: {}{}",
        image.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = work.join("tree");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree).expect("make the dump directory");
    let dump = Command::new(debugfs)
        .arg("-R")
        .arg(format!("rdump / {}", tree.display()))
        .arg(image)
        .output()
        .expect("run debugfs");
    assert!(dump.status.success(), "debugfs rdump failed: {dump:?}");
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

#[test]
fn vhost_user_blk_disk_serves_an_unmodified_guest() {
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
    let work = tempfile::tempdir().expect("tempdir");
    let socket = work.path().join("vhu.sock");
    // run.sh reads QEMU's extra arguments from the environment; this is the only test here.
    std::env::set_var("KURA_VM_QEMU_ARGS", qemu_args(&socket));
    let bins: [&Path; 2] = [&mkfs, &fsck];

    let a = work.path().join("a.img");
    let b = work.path().join("b.img");
    let runs = [
        (format!("file:{}?size=64M", a.display()), vec![a.clone()]),
        (
            format!(
                "mirror(file:{}?size=64M,file:{}?size=64M)",
                a.display(),
                b.display()
            ),
            vec![a.clone(), b.clone()],
        ),
    ];
    for (spec, images) in &runs {
        for image in images {
            let _ = std::fs::remove_file(image);
        }
        let backend = Backend::start(spec, &socket, &work.path().join("serve.log"));
        let run = match boot(&bins, "kura_vhost_mode=fs") {
            Ok(run) => run,
            Err(why) if why.starts_with("cannot start") => panic!("{why}"),
            Err(why) => return kura_testkit::skip(TEST, "nvme-guest", &why),
        };
        eprintln!("{}", run.summary());
        eprintln!("{spec}: guest run took {:.1} s", run.took.as_secs_f64());
        let log = backend.stop();
        eprintln!("{log}");
        check_guest(&run, spec);
        let sums = guest_sums(&run);
        for image in images {
            check_image(image, &sums, work.path(), &fsck, &debugfs);
        }
        if images.len() == 2 {
            let (x, y) = (std::fs::read(&images[0]), std::fs::read(&images[1]));
            assert!(
                x.expect("leg a") == y.expect("leg b"),
                "the mirror's legs are equal"
            );
        }
    }

    // The backend restarted in the middle of a write stream.
    let image = work.path().join("stream.img");
    let spec = format!("file:{}?size=64M", image.display());
    let serve_log = work.path().join("serve-1.log");
    let first = Backend::start(&spec, &socket, &serve_log);
    let console = std::env::temp_dir()
        .join(format!("kura-nvme-vm-init-vhost-{}", std::process::id()))
        .join("console.log");
    let _ = std::fs::remove_file(&console);
    let guest = {
        let bins: Vec<PathBuf> = bins.iter().map(|p| p.to_path_buf()).collect();
        std::thread::spawn(move || {
            let bins: Vec<&Path> = bins.iter().map(PathBuf::as_path).collect();
            boot(
                &bins,
                &format!("kura_vhost_mode=stream kura_vhost_records={RECORDS}"),
            )
        })
    };
    let start = Instant::now();
    let acked_before_kill = loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        let acked = acknowledged(&text);
        if acked.len() > KILL_AT || guest.is_finished() {
            break acked.len();
        }
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "the guest's stream did not start; console: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut first = first;
    first.child.kill().expect("kill kura serve");
    let _ = first.child.wait();
    std::thread::sleep(Duration::from_millis(500));
    eprintln!("kura serve killed after {acked_before_kill} acknowledged records");
    let second = Backend::start(&spec, &socket, &work.path().join("serve-2.log"));
    let run = match guest.join().expect("the guest thread") {
        Ok(run) => run,
        Err(why) if why.starts_with("cannot start") => panic!("{why}"),
        Err(why) => return kura_testkit::skip(TEST, "nvme-guest", &why),
    };
    let log = second.stop();
    eprintln!(
        "{}",
        run.summary()
            .lines()
            .filter(|l| !l.starts_with("ACK"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("second kura serve: {log}");
    assert!(
        acked_before_kill > KILL_AT && acked_before_kill < RECORDS,
        "the backend was killed in the middle of the stream ({acked_before_kill} acknowledged)"
    );
    assert!(
        log.contains("hypervisor connected"),
        "QEMU reconnected to the restarted kura serve: {log}"
    );
    check_guest(&run, "stream");
    let acked = acknowledged(&run.console);
    assert_eq!(
        acked,
        (0..RECORDS).collect::<Vec<_>>(),
        "every record acknowledged in order"
    );
    let data = std::fs::read(&image).expect("read the image");
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
