//! The kernel's NBD driver as kura's client, as in DeLiBA (issue 15, item 5): the NVMe guest
//! (`scripts/nvme-vm/init-nbd`) runs `kura serve` with DeLiBA's layers (`coalesce` and
//! `cache`) over its emulated NVMe namespace (`uring:/dev/nvme0n1`) on the guest's
//! loopback, and the guest kernel's own NBD driver, set up by `nbd-client` over netlink, attaches
//! `/dev/nbd0` to it. The guest boots twice, once per order of the two layers: the issue's
//! `coalesce(cache(..))` and DeLiBA's pipeline order (NBD, cache, coalescing, storage),
//! `cache(coalesce(..))`, the second with two connections. In the guest: mkfs.ext4, a tree of
//! random files written, read back after a remount, three files removed and fstrim'd (NBD trims),
//! `kura serve` restarted (its cache cold), fsck.ext4 -f -n, the tree read back again.
//! Each time `kura serve` stops it prints every layer's counters (`BlockDevice::stats`): the
//! layers come out in the spec's order, the cache hit when a file was read again after the
//! guest dropped its page cache and missed after the restart, and the coalescer counted the
//! requests it merged or passed on (how many merged depends on timing, so only that it counted
//! them consistently is checked).
//! On the host afterwards: the namespace image itself is a clean ext4 (`e2fsck -f -n`) holding
//! files with the checksums the guest printed (`debugfs rdump`, `sha256sum -c`), so everything
//! acknowledged went through the cache and the coalescer to the device.
//!
//! This host's kernel has no NBD driver; the guest's Debian kernel has `nbd.ko`. The host's
//! `nbd-client`, `mkfs.ext4` and `fsck.ext4` go into the guest with their shared libraries.
//! Skips visibly where the host cannot boot a guest (see `kura_nvme_guest`) or lacks nbd-client
//! or e2fsprogs. The guest is bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 150) per boot.

use std::path::{Path, PathBuf};
use std::process::Command;

const TEST: &str = "kernel_nbd_client_runs_ext4_on_the_deliba_stack_in_the_guest";

/// The two orders of DeLiBA's layers over namespace 1 with a 4 MiB cache (the tree written is
/// 10 MiB, so the cache also evicts), each with the number of connections the kernel's NBD
/// driver opens to `kura serve`: a write-back cache on one connection, then a write-through
/// cache (the default) on two (the guest has two virtual CPUs, so the kernel uses both).
const RUNS: [(&str, u32); 2] = [
    ("coalesce(cache(uring:/dev/nvme0n1)?size=4M&mode=wb)", 1),
    ("cache(coalesce(uring:/dev/nvme0n1))?size=4M", 2),
];

/// Files in the guest's tree (`init-nbd`), and those left after it removes three.
const FILES: usize = 22;
const KEPT: usize = 19;

/// The host programs the test needs: the first three go into the guest.
struct Tools {
    nbd_client: PathBuf,
    mkfs: PathBuf,
    fsck: PathBuf,
    debugfs: PathBuf,
}

/// `tool` on PATH or in /usr/sbin and /sbin (not on every user's PATH).
fn find_tool(tool: &str) -> Option<PathBuf> {
    kura_testkit::which(tool).or_else(|| {
        ["/usr/sbin", "/sbin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| kura_testkit::which(&p.to_string_lossy()).is_some())
    })
}

/// The tools, or the missing one's capability and how to install it.
fn tools() -> Result<Tools, kura_testkit::Missing> {
    let find = |tool: &str, package: &str| {
        find_tool(tool).ok_or_else(|| {
            kura_testkit::Missing::new(
                tool,
                format!("{tool} not found (apt-get install {package})"),
            )
        })
    };
    Ok(Tools {
        nbd_client: find("nbd-client", "nbd-client")?,
        mkfs: find("mkfs.ext4", "e2fsprogs")?,
        fsck: find("fsck.ext4", "e2fsprogs")?,
        debugfs: find("debugfs", "e2fsprogs")?,
    })
}

/// The guest's `sha256sum` lines for the tree, `\r` from the serial console removed.
fn guest_sums(run: &kura_nvme_guest::GuestRun) -> String {
    let sums = run
        .between("GUEST-SUMS-BEGIN", "GUEST-SUMS-END")
        .expect("the guest printed the tree's checksums");
    sums.lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

/// What the guest reported: every step passed, on `spec` with `connections` connections, with
/// the kernel's netlink interface, and fstrim trimmed something.
fn check_guest(run: &kura_nvme_guest::GuestRun, spec: &str, connections: u32) {
    let log_at = run.dir.join("console.log");
    assert_eq!(
        run.status,
        Some(0),
        "{spec}: QEMU failed or timed out; log in {}",
        log_at.display()
    );
    assert!(
        !run.console.contains("FAIL "),
        "{spec}: a guest step failed; log in {}",
        log_at.display()
    );
    assert!(
        run.console.contains(&format!("GUEST spec {spec}")),
        "the guest served {spec}; log in {}",
        log_at.display()
    );
    let tree = format!("write a tree of {FILES} files");
    let conns = format!("{connections} connection(s) from the kernel to kura serve");
    let conns_again = format!("{connections} connection(s) again");
    for step in [
        "loopback up",
        "attach /dev/nbd0 to kura serve",
        &conns,
        "mkfs.ext4",
        "mount",
        &tree,
        "read back after remount (cache warm)",
        "read a file again from kura's cache",
        "remove files and fstrim",
        "read back after trimming",
        "disconnect and stop kura serve",
        "attach again to a restarted kura serve",
        "fsck.ext4 -f -n",
        &conns_again,
        "read back after restart (cache cold)",
        "removed files stay removed",
        "symlink kept",
        "stop kura serve at the end",
    ] {
        assert!(
            run.console.contains(&format!("PASS {step}")),
            "{spec}: step `{step}` did not pass; log in {}",
            log_at.display()
        );
    }
    assert!(run.console.contains("GUEST-RESULT nbd pass"));
    // nbd-client handed the socket to the kernel over netlink and exited (the ioctl interface
    // would have kept one process in NBD_DO_IT).
    assert!(
        run.console
            .contains("GUEST nbd-client processes left: none"),
        "nbd-client used the kernel's netlink interface"
    );
    let trimmed: u64 = run
        .between("GUEST /mnt: ", " bytes trimmed")
        .and_then(|n| n.parse().ok())
        .expect("fstrim said how much it trimmed");
    assert!(trimmed > 0, "fstrim trimmed nothing through kura");
}

/// One layer as `kura serve` printed it when it stopped: kind, depth and counters.
struct Layer {
    kind: String,
    depth: usize,
    counters: Vec<(String, u64)>,
}

impl Layer {
    fn get(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("{} has no counter {name}", self.kind))
    }
}

/// The layers `kura serve` printed for export `disk` when session `session` (`warm`, `end`)
/// stopped: `GUEST serve[SESSION]: kura serve: export disk: ` then two spaces per level, the
/// kind and `name=value` counters.
fn served_layers(run: &kura_nvme_guest::GuestRun, session: &str) -> Vec<Layer> {
    let prefix = format!("GUEST serve[{session}]: kura serve: export disk: ");
    run.console
        .lines()
        .filter_map(|l| Some(&l[l.find(&prefix)? + prefix.len()..]))
        .map(|l| {
            let l = l.trim_end_matches('\r');
            let body = l.trim_start_matches(' ');
            let mut words = body.split_whitespace();
            Layer {
                kind: words.next().unwrap_or("").to_string(),
                depth: (l.len() - body.len()) / 2,
                counters: words
                    .filter_map(|w| {
                        let (n, v) = w.split_once('=')?;
                        Some((n.to_string(), v.parse().ok()?))
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The kinds of a spec's layers, outermost first: `coalesce(cache(uring:..)?..)` gives
/// coalesce, cache, uring.
fn spec_kinds(spec: &str) -> Vec<&str> {
    spec.split('(')
        .map(|p| p.split([':', ')', '?']).next().unwrap_or(p))
        .collect()
}

/// What `kura serve` counted in each session: every layer of the spec in order, the cache hit on
/// the file read again (session `warm`) and missed with its cache cold (session `end`), and the
/// coalescer sent a child command for each request it did not merge (and no more).
fn check_counters(run: &kura_nvme_guest::GuestRun, spec: &str) {
    let log_at = run.dir.join("console.log");
    for session in ["warm", "end"] {
        let layers = served_layers(run, session);
        for l in &layers {
            let counters: Vec<String> =
                l.counters.iter().map(|(n, v)| format!("{n}={v}")).collect();
            eprintln!(
                "{spec} [{session}]: {}{} {}",
                "  ".repeat(l.depth),
                l.kind,
                counters.join(" ")
            );
        }
        let shape: Vec<(&str, usize)> = layers.iter().map(|l| (l.kind.as_str(), l.depth)).collect();
        let want: Vec<(&str, usize)> = spec_kinds(spec).into_iter().zip(0..).collect();
        assert_eq!(
            shape,
            want,
            "{spec} [{session}]: the layers kura serve printed; log in {}",
            log_at.display()
        );
        let layer = |kind: &str| layers.iter().find(|l| l.kind == kind).expect("the layer");
        let cache = layer("cache");
        if session == "warm" {
            assert!(
                cache.get("hits") > 0,
                "{spec}: the file read again hit kura's cache"
            );
        } else {
            assert!(
                cache.get("misses") > 0,
                "{spec}: a restarted kura's cache starts cold"
            );
        }
        let coalesce = layer("coalesce");
        let requests = coalesce.get("requests");
        let sent = coalesce.get("child_commands");
        let merged = coalesce.get("merged");
        assert!(
            requests > 0 && sent > 0,
            "{spec} [{session}]: the coalescer saw the traffic"
        );
        assert!(
            sent + merged <= requests,
            "{spec} [{session}]: each request merged or sent once: {sent} sent + {merged} merged > {requests}"
        );
    }
}

/// The namespace image, written only through kura's stack, is a clean ext4 holding the files
/// with the checksums the guest printed.
fn check_image(run: &kura_nvme_guest::GuestRun, tools: &Tools, spec: &str) {
    let image = run.dir.join("disk.img");
    let fsck = Command::new(&tools.fsck)
        .args(["-f", "-n"])
        .arg(&image)
        .output()
        .expect("run fsck.ext4 on the host");
    assert!(
        fsck.status.success(),
        "{spec}: host fsck.ext4 -f -n on the namespace image: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let sums = guest_sums(run);
    assert_eq!(sums.lines().count(), KEPT, "checksums of every file kept");
    let tree = run.dir.join("tree");
    std::fs::create_dir_all(&tree).expect("make the dump directory");
    let dump = Command::new(&tools.debugfs)
        .arg("-R")
        .arg(format!("rdump / {}", tree.display()))
        .arg(&image)
        .output()
        .expect("run debugfs");
    assert!(dump.status.success(), "debugfs rdump failed: {dump:?}");
    std::fs::write(run.dir.join("sums"), &sums).expect("write the checksums");
    let check = Command::new("sha256sum")
        .args(["-c", "--strict", "--quiet"])
        .arg(run.dir.join("sums"))
        .current_dir(&tree)
        .output()
        .expect("run sha256sum");
    assert!(
        check.status.success(),
        "{spec}: the files on the namespace image differ from what the guest wrote: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn kernel_nbd_client_runs_ext4_on_the_deliba_stack_in_the_guest() {
    let tools = match tools() {
        Ok(tools) => tools,
        Err(missing) => return missing.skip(TEST),
    };
    let kura = PathBuf::from(env!("CARGO_BIN_EXE_kura"));
    let bins: [&Path; 4] = [&kura, &tools.nbd_client, &tools.mkfs, &tools.fsck];
    let limit = kura_nvme_guest::time_limit(150);
    for (spec, connections) in RUNS {
        let append = format!("kura_nbd_spec=\"{spec}\" kura_nbd_connections={connections}");
        let guest_served = |run: &kura_nvme_guest::GuestRun| {
            run.status == Some(0)
                && !run.console.contains("FAIL ")
                && run.console.contains("GUEST-RESULT nbd pass")
        };
        let run =
            match kura_nvme_guest::boot_passing("init-nbd", &bins, limit, &append, guest_served) {
                Ok(run) => run,
                // "cannot start run.sh: ..." is a failure; any other Err is run.sh's exit 77 (QEMU,
                // a kernel, busybox-static or cpio not installed).
                Err(why) if why.starts_with("cannot start") => panic!("{why}"),
                Err(why) => return kura_testkit::skip(TEST, "nvme-guest", &why),
            };
        eprintln!("{}", run.summary());
        eprintln!(
            "{spec}: guest run took {:.1} s on the host",
            run.took.as_secs_f64()
        );
        check_guest(&run, spec, connections);
        check_counters(&run, spec);
        check_image(&run, &tools, spec);
        let _ = std::fs::remove_dir_all(&run.dir);
    }
}
