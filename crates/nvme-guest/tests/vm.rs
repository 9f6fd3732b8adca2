//! The guest test: boots QEMU (TCG, q35, emulated Intel IOMMU, emulated NVMe controller) with
//! Debian's kernel and an initramfs holding busybox and `kura-nvme-guest`, which runs the
//! passthrough tests on `/dev/ng0n1`, then rebinds the controller to vfio-pci and runs the
//! user-space driver's tests (see `src/main.rs` and `scripts/nvme-vm/`).
//! Afterwards the host reads the marker blocks both backends wrote from the disk image, and finds
//! the AccelFS files' data on the second namespace's image (`common::check`).
//!
//! Skips visibly where QEMU, a kernel with modules, busybox-static or cpio are missing. The
//! guest is bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 240).

mod common;

use std::path::Path;

#[test]
fn guest_runs_passthrough_and_vfio_driver() {
    let limit = kura_nvme_guest::time_limit(240);
    let guest_bin = Path::new(env!("CARGO_BIN_EXE_kura-nvme-guest"));
    let run = match kura_nvme_guest::boot_passing("init", &[guest_bin], limit, "", common::passed) {
        Ok(run) => run,
        // `boot` fails with "cannot start run.sh: ..." when the script itself cannot run: that
        // is a failure. Any other Err is run.sh's exit 77: QEMU, a kernel, busybox-static or cpio
        // is not installed.
        Err(why) if why.starts_with("cannot start") => panic!("{why}"),
        Err(why) => {
            return kura_testkit::skip("guest_runs_passthrough_and_vfio_driver", "nvme-guest", &why)
        }
    };
    eprintln!("{}", run.summary());
    eprintln!("guest run took {:.1} s on the host", run.took.as_secs_f64());
    common::check(&run);
    let _ = std::fs::remove_dir_all(&run.dir);
}
