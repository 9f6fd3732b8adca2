//! The guest test on aarch64: the same steps as tests/vm.rs (conformance suite on `nvme-pt:`,
//! `uring:` and the user-space driver `nvme:` over VFIO, rebinding, AccelFS mkfs/fsck/tree
//! round trip, the genome pipeline on 1,000 reads) in an arm64 guest: `qemu-system-aarch64 -M
//! virt` under TCG with Debian's arm64 kernel, the controller behind the machine's emulated
//! SMMUv3 (`scripts/nvme-vm/run-aarch64.sh`, `init-aarch64`).
//!
//! The guest needs `kura-nvme-guest` built for aarch64-unknown-linux-gnu, which this test's own
//! (native) build does not make: scripts/aarch64.sh builds it and runs this test with
//! `--ignored` and `KURA_AARCH64_GUEST_BIN` set to it. Skips visibly (capability
//! `aarch64-guest`) where qemu-system-aarch64, the arm64 kernel and busybox, or the cross tools
//! are missing. The guest is bounded by `KURA_NVME_VM_TIMEOUT` seconds (default 420: TCG
//! emulating arm64 on x86-64 is slower than emulating x86-64).

mod common;

use std::path::PathBuf;

#[test]
#[ignore = "needs kura-nvme-guest built for aarch64: scripts/aarch64.sh builds it and runs this"]
fn aarch64_guest_runs_passthrough_and_vfio_driver() {
    let name = "aarch64_guest_runs_passthrough_and_vfio_driver";
    let guest_bin = PathBuf::from(std::env::var_os("KURA_AARCH64_GUEST_BIN").expect(
        "KURA_AARCH64_GUEST_BIN: the aarch64 kura-nvme-guest (scripts/aarch64.sh sets it)",
    ));
    assert!(
        guest_bin.is_file(),
        "KURA_AARCH64_GUEST_BIN={} is not a file",
        guest_bin.display()
    );
    let limit = kura_nvme_guest::time_limit(420);
    let run = match kura_nvme_guest::boot_passing_on(
        "run-aarch64.sh",
        "init-aarch64",
        &[&guest_bin],
        limit,
        "",
        common::passed,
    ) {
        Ok(run) => run,
        // "cannot start run-aarch64.sh: ..." is a failure; any other Err is its exit 77: a
        // tool, the arm64 kernel or busybox is not installed.
        Err(why) if why.starts_with("cannot start") => panic!("{why}"),
        Err(why) => return kura_testkit::skip(name, "aarch64-guest", &why),
    };
    eprintln!("{}", run.summary());
    eprintln!(
        "aarch64 guest run took {:.1} s on the host",
        run.took.as_secs_f64()
    );
    assert!(
        run.console.contains("GUEST arch aarch64"),
        "the guest did not run an aarch64 kernel; log in {}",
        run.dir.display()
    );
    common::check(&run);
    let _ = std::fs::remove_dir_all(&run.dir);
}
