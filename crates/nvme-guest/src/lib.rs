//! kura-nvme-guest: the QEMU guest harness for the user-space NVMe driver (`kura-nvme`), kept
//! out of the driver crate so the driver depends on the engine only.
//!
//! This library is the host side: it boots `scripts/nvme-vm/run.sh` (QEMU with TCG, q35, an
//! emulated Intel IOMMU and an emulated NVMe controller) with a given `/init` and programs, and
//! hands back the console log and images. The guest test of this crate (`tests/vm.rs`, which puts
//! the `kura-nvme-guest` program of `src/main.rs` in the guest) and the CLI's
//! (`crates/cli/tests/nvme_guest_bench.rs`, `kura bench io` in the guest) both start guests
//! through it. `boot_on`/`boot_passing_on` name another harness script: `run-aarch64.sh` boots
//! the arm64 guest (`tests/vm_aarch64.rs`, run by `scripts/aarch64.sh`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The exit status `run.sh` uses when the host cannot boot a guest.
const SKIP_STATUS: i32 = 77;

/// What one guest boot left.
#[derive(Debug)]
pub struct GuestRun {
    /// `run.sh`'s exit status: QEMU's, or 124 when the guest ran past its time limit.
    pub status: Option<i32>,
    /// Everything the guest printed on its console.
    pub console: String,
    /// Where the console log and the namespace images (`disk.img`, `fs.img`) are.
    pub dir: PathBuf,
    pub took: Duration,
}

impl GuestRun {
    /// Lines a test reports: results, costs and the guest's own milestones.
    pub fn summary(&self) -> String {
        self.console
            .lines()
            .filter(|l| {
                ["PASS", "FAIL", "COST", "GUEST", "qemu rc"]
                    .iter()
                    .any(|p| l.contains(p))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The text the guest printed between two marker lines.
    pub fn between(&self, begin: &str, end: &str) -> Option<&str> {
        let start = self.console.find(begin)? + begin.len();
        let len = self.console[start..].find(end)?;
        Some(self.console[start..start + len].trim())
    }
}

/// The guest's time limit: `KURA_NVME_VM_TIMEOUT` seconds, else `default_secs`.
pub fn time_limit(default_secs: u64) -> Duration {
    let secs = std::env::var("KURA_NVME_VM_TIMEOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_secs);
    Duration::from_secs(secs)
}

/// The first line where the guest kernel's NVMe driver reports that the emulated controller did
/// not complete a command in time (`nvme nvme0: I/O 400 QID 1 timeout, aborting`). Under TCG,
/// QEMU 7.2's emulated controller now and then never posts a completion for a command the
/// kernel driver queued; the runs that hit it fail with nothing wrong in kura. The guest
/// kernel's warnings reach the console (run.sh sets `loglevel=5`) and each `/init` prints the
/// matching dmesg lines, so the line is there whether the guest finished or hung.
pub fn lost_command(console: &str) -> Option<&str> {
    console
        .lines()
        .find(|l| l.contains("nvme nvme0: I/O") && l.contains("timeout"))
}

/// `boot`, and once more where the first run did not `pass` and the guest kernel saw the
/// emulated controller lose a command (`lost_command`): that run says nothing about kura, so it
/// is booted again, visibly (the first console log is kept as `console-lost.log`). A run that
/// fails for any other reason, or fails twice, is returned as it is for the test to report.
pub fn boot_passing(
    init: &str,
    bins: &[&Path],
    limit: Duration,
    append: &str,
    pass: impl Fn(&GuestRun) -> bool,
) -> Result<GuestRun, String> {
    boot_passing_on("run.sh", init, bins, limit, append, pass)
}

/// `boot_passing` with another harness script of `scripts/nvme-vm/` (`run-aarch64.sh`: the
/// arm64 guest, whose `bins` must be aarch64 programs).
pub fn boot_passing_on(
    runner: &str,
    init: &str,
    bins: &[&Path],
    limit: Duration,
    append: &str,
    pass: impl Fn(&GuestRun) -> bool,
) -> Result<GuestRun, String> {
    let first = boot_on(runner, init, bins, limit, append)?;
    if pass(&first) {
        return Ok(first);
    }
    let Some(line) = lost_command(&first.console) else {
        return Ok(first);
    };
    eprintln!(
        "RETRY {init}: the emulated NVMe controller lost a command ({}); booting the guest once more",
        line.trim()
    );
    let _ = std::fs::rename(
        first.dir.join("console.log"),
        first.dir.join("console-lost.log"),
    );
    boot_on(runner, init, bins, limit, append)
}

/// Boots a guest whose `/init` is `init` (a path relative to `scripts/nvme-vm/`), with `bins` in
/// its `/bin`, for at most `limit`; `append` goes on the kernel command line. `Err` holds why
/// this host cannot boot one (no QEMU, kernel, busybox-static or cpio), for a visible skip.
pub fn boot(init: &str, bins: &[&Path], limit: Duration, append: &str) -> Result<GuestRun, String> {
    boot_on("run.sh", init, bins, limit, append)
}

/// `boot` with another harness script of `scripts/nvme-vm/` (see `boot_passing_on`).
pub fn boot_on(
    runner: &str,
    init: &str,
    bins: &[&Path],
    limit: Duration,
    append: &str,
) -> Result<GuestRun, String> {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/nvme-vm");
    let dir = std::env::temp_dir().join(format!(
        "kura-nvme-vm-{}-{}",
        init.replace('/', "-"),
        std::process::id()
    ));
    let started = Instant::now();
    let status = Command::new(scripts.join(runner))
        .arg(&dir)
        .arg(scripts.join(init))
        .arg(limit.as_secs().max(1).to_string())
        .args(bins)
        .env("KURA_VM_APPEND", append)
        .status()
        .map_err(|e| format!("cannot start {runner}: {e}"))?;
    if status.code() == Some(SKIP_STATUS) {
        let why = std::fs::read_to_string(dir.join("skipped")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        return Err(why.trim().to_string());
    }
    Ok(GuestRun {
        status: status.code(),
        console: std::fs::read_to_string(dir.join("console.log")).unwrap_or_default(),
        dir,
        took: started.elapsed(),
    })
}
